"""The fleet as a sandbox provider (`envforge.sandbox.provider`): sandboxes on the Ray cluster's nodes.

A process that runs on the fleet (`ENVFORGE_RAY_ADDRESS` set: `envforge.runtime.sandbox_provider`
chooses) hands a `FleetSandboxProvider` down to its stages. Each unit of work (a rollout batch, a
gate, a derivation, the service) gets a `FleetSandboxPool` told the work ahead: build recipes of
its images (so a node lacking one builds it, after receiving its parent from a holder) and its
demand per image (so nodes pre-heat). Images are still built on the process's own engine
(`DOCKER_HOST`), which is what the nodes receive base and env images from. The dispatcher and
its node agents are the process's, shared by every unit of work: a lease never closes them.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Mapping

from envforge.fleet.config import ADDRESS_ENV, FleetConfig, FleetConfigError
from envforge.fleet.dispatcher import FleetDispatcher
from envforge.fleet.pool import FleetSandboxPool
from envforge.sandbox.container import SandboxOptions
from envforge.sandbox.provider import Items

if TYPE_CHECKING:
    import docker

    from envforge.config import Settings

_lock = threading.Lock()
_dispatcher: FleetDispatcher | None = None


def fleet_enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool((env.get(ADDRESS_ENV) or "").strip())


def dispatcher_from_env(environ: Mapping[str, str] | None = None) -> FleetDispatcher | None:
    """The process's dispatcher when the fleet is configured (started once, checked at start), else None."""
    global _dispatcher
    if not fleet_enabled(environ):
        return None
    with _lock:
        if _dispatcher is None:
            _dispatcher = FleetDispatcher(FleetConfig.from_env(environ)).start()
        return _dispatcher


class FleetLease:
    """A fleet pool for one unit of work. Closing it leaves the dispatcher and the nodes' warm pools
    running: the process's other work shares them."""

    owned = False

    def __init__(self, pool: FleetSandboxPool, client: Any, settings: "Settings | None"):
        self.pool, self._client, self._settings = pool, client, settings
        self._expected: dict[str, SandboxOptions] = {}  # image -> the options its sandboxes start with
        self._lock = threading.Lock()

    def expect(self, items: Items, sandboxes_per_task: int) -> None:
        from envforge.verify.grader import options_for

        items = list(items)
        with self._lock:
            self.pool.register(items, sandboxes_per_task, local_client=self._client, settings=self._settings)
            self._expected.update({image: options_for(task) for task, image in items})

    def describe(self) -> dict[str, Any]:
        dispatcher = self.pool.dispatcher
        nodes = [
            {
                "name": n.name,
                "capacity": n.capacity,
                "in_use": n.leased,
                "idle": sum(n.idle.values()),
                "images": len(n.images),
            }
            for n in dispatcher.alive_nodes()
        ]
        return {
            "backend": "fleet",
            "ray_address": dispatcher.config.ray_address,
            "nodes": nodes,
            "in_use": sum(n["in_use"] for n in nodes),
            "nodes_lost": list(dispatcher.stats.nodes_lost),
        }

    def withdraw(self) -> None:
        """Tell the nodes this work wants none of its images any more, so they let its warm sandboxes go."""
        with self._lock:
            withdrawn = {image: (options, 0) for image, options in self._expected.items()}
        if withdrawn:
            self.pool.dispatcher.announce(withdrawn)

    def close(self) -> None:
        return None  # the dispatcher and the nodes are the process's: nothing of theirs ends with this work

    def __enter__(self) -> FleetSandboxPool:
        return self.pool

    def __exit__(self, *exc: Any) -> None:
        self.close()


class FleetSandboxProvider:
    """Sandboxes on the fleet: `dispatcher` given (the demo's, a test's), or the process's, joined from
    `ENVFORGE_RAY_ADDRESS` at the first lease (or at `start`)."""

    kind = "fleet"

    def __init__(self, dispatcher: FleetDispatcher | None = None, environ: Mapping[str, str] | None = None):
        self._dispatcher, self._environ = dispatcher, environ

    @property
    def dispatcher(self) -> FleetDispatcher:
        if self._dispatcher is None:
            dispatcher = dispatcher_from_env(self._environ)
            if dispatcher is None:
                raise FleetConfigError(
                    f"no fleet to join: {ADDRESS_ENV} is not set (or give the provider a dispatcher)"
                )
            self._dispatcher = dispatcher
        return self._dispatcher

    def start(self) -> "FleetSandboxProvider":
        self.dispatcher  # noqa: B018 - joins the cluster now: a bad address fails here, naming the setting
        return self

    def lease(
        self,
        items: Items,
        sandboxes_per_task: int,
        *,
        client: "docker.DockerClient | None" = None,
        settings: "Settings | None" = None,
        max_idle_per_key: int = 8,
        max_starting: int = 4,
    ) -> FleetLease:
        lease = FleetLease(FleetSandboxPool(self.dispatcher), client, settings)
        lease.expect(items, sandboxes_per_task)
        return lease
