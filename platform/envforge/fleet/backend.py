"""Where a stage's sandboxes run: on this process's engine (the default) or on the fleet.

`ENVFORGE_RAY_ADDRESS` set means the fleet: the sandbox work of every stage (rollout episodes and
their grading, so also tiering, training and evaluation rollouts; gate runs; ticket and review
test derivation; the service's sessions) goes to the Ray cluster there, while images are still
built on the stage's own engine (`DOCKER_HOST`), which the nodes receive base and env images from
and build task layers like. Unset, nothing here imports Ray and the single-machine path runs as
before. `fleet_pool_from_env` is the one place that rule is applied.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from envforge.fleet.config import FleetConfig
from envforge.fleet.dispatcher import FleetDispatcher

if TYPE_CHECKING:
    from envforge.config import Settings
    from envforge.fleet.pool import FleetSandboxPool
    from envforge.task import Task

_lock = threading.Lock()
_dispatcher: FleetDispatcher | None = None


def fleet_enabled(environ: Mapping[str, str] | None = None) -> bool:
    from envforge.settings import read_env

    return bool(read_env(environ).ray_address)


def dispatcher_from_env(environ: Mapping[str, str] | None = None) -> FleetDispatcher | None:
    """The process's dispatcher when the fleet is configured (started once, checked at start), else None."""
    global _dispatcher
    if not fleet_enabled(environ):
        return None
    with _lock:
        if _dispatcher is None:
            _dispatcher = FleetDispatcher(FleetConfig.from_env(environ)).start()
        return _dispatcher


def fleet_pool_from_env(items: Sequence[tuple["Task", str]], sandboxes_per_task: int, local_client: Any = None,
                        settings: "Settings | None" = None) -> "FleetSandboxPool | None":
    """The pool a stage's sandboxes come from when the fleet is configured, told the work ahead
    (`items`: task and image; `sandboxes_per_task`: what each will acquire), else None: the caller
    runs its own pool on this process's engine. `local_client` is that engine (image parents and
    the images nodes receive); `settings` say where history tasks' commits are (their recipes)."""
    dispatcher = dispatcher_from_env()
    if dispatcher is None:
        return None
    from envforge.fleet.run import fleet_pool

    return fleet_pool(dispatcher, items, sandboxes_per_task, local_client, settings)
