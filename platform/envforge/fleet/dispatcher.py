"""The cluster-level dispatcher: which node a sandbox (so a trajectory, a grade, a gate run) goes to.

It finds the sandbox nodes of the Ray cluster (alive nodes that advertise `node_resource`),
makes sure each has its node agent, and places every acquire on the best node with room:

    score = 4 if the node has a warm sandbox of the image
          + 2 if the node has the image at all (no transfer or build)
          + its free fraction (spread the load)

When no node has room, acquires wait (backpressure) until a release or a new node frees
some, up to `acquire_timeout_s`. Nodes that join are picked up at the next discovery
(`discovery_interval_s`); a node or agent that dies makes every call on it raise
`InfraError('node_lost')`, which schedulers already treat as an infrastructure fault: the
trajectory restarts on a fresh sandbox, which this dispatcher places on a surviving node.

Getting the image onto the chosen node (build from a recipe, or transfer) is
`distribution.ImageDistribution`'s, which the dispatcher asks before each acquire.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from envforge.errors import InfraError
from envforge.fleet.config import ADDRESS_ENV, FleetConfig, FleetConfigError
from envforge.fleet.distribution import ImageDistribution
from envforge.fleet.images import ImageRecipe
from envforge.fleet.node import FULL, NodeAgent
from envforge.fleet.raycalls import lost_errors, node_gone, ray_module, root_message, unwrap
from envforge.observe import metrics as live
from envforge.sandbox.container import SandboxOptions

log = logging.getLogger(__name__)
AGENT_PREFIX = "envforge-node-"
# Faults that say the node's engine, not the sandbox, is broken; such a node cools down before reuse.
ENGINE_CAUSES = frozenset(
    {
        "engine_unavailable",
        "engine_error",
        "container_create_failed",
        "image_build_failed",
        "image_transfer_failed",
        "node_timeout",
        "node_error",
    }
)
ENGINE_COOLDOWN_S = 15.0
# How often a driver tells the nodes it holds leases on that it is alive (FleetConfig.driver_timeout_s,
# at least three beats, is when a node gives a silent driver up for dead).
HEARTBEAT_INTERVAL_S = 5.0


def check_address(address: str, timeout_s: float) -> None:
    """Fail in seconds, naming the setting, when nothing answers at the Ray head's address."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise FleetConfigError(
            f"{ADDRESS_ENV}={address!r}: expected HOST:PORT (the GCS port, e.g. "
            f"ray-head:6379) or ray://HOST:PORT (Ray Client, e.g. ray://ray-head:10001)"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise FleetConfigError(
            f"{ADDRESS_ENV}={address}: nothing answers at {host}:{port} ({exc.strerror or exc}); "
            "start the Ray head there (ray start --head) or fix the address"
        ) from None


def connect(config: FleetConfig) -> None:
    """Join the Ray cluster as a driver (once per process)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = ray_module()
    if ray.is_initialized():
        return
    if config.ray_address and config.ray_address != "auto":
        check_address(config.ray_address, config.connect_timeout_s)
    try:
        ray.init(
            address=config.ray_address or "auto",
            namespace=config.namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
    except ConnectionError as exc:
        raise FleetConfigError(
            f"{ADDRESS_ENV}={config.ray_address or '(unset: auto)'}: no Ray cluster to join "
            f"({exc}); start one (make fleet-demo starts a local one) or set {ADDRESS_ENV}"
        ) from None


@dataclass
class NodeState:
    node_id: str
    name: str
    handle: Any
    capacity: int
    leased: int = 0  # leases this dispatcher holds on it
    images: set[str] = field(default_factory=set)
    idle: dict[str, int] = field(default_factory=dict)
    alive: bool = True
    full_until: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.capacity - self.leased if time.monotonic() >= self.full_until else 0

    def score(self, image: str) -> float:
        return 4 * (self.idle.get(image, 0) > 0) + 2 * (image in self.images) + self.free / max(1, self.capacity)


@dataclass
class DispatchStats:
    acquires: int = 0
    warm: int = 0
    waits: int = 0
    wait_s: float = 0.0
    nodes_lost: list[str] = field(default_factory=list)
    nodes_joined: list[str] = field(default_factory=list)
    transfers: int = 0
    builds: int = 0
    placements: dict[str, int] = field(default_factory=dict)


class FleetDispatcher:
    """Thread-safe. `start()` joins the cluster and checks every node; `close()` lets go of leases."""

    def __init__(self, config: FleetConfig | None = None, client_id: str | None = None):
        self.config = config or FleetConfig.from_env()
        self.client_id = client_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = DispatchStats()
        self.nodes: dict[str, NodeState] = {}
        self.on_event: Callable[[str], None] = lambda msg: log.info(msg)
        self._cond = threading.Condition()
        self.distribution = ImageDistribution(self)
        self._last_discovery = 0.0
        self._remote_agent = None
        self._heartbeat: threading.Thread | None = None

    # -- membership ------------------------------------------------------------------------

    def start(self, strict: bool = True) -> "FleetDispatcher":
        """Join the cluster and bring up an agent on every sandbox node.

        With `strict`, any node whose agent cannot start (no engine, an unsupported engine) is an
        error that names the node and the setting; later joins are only logged and skipped.
        """
        connect(self.config)
        problems = self.discover(raise_on_error=strict)
        if problems and strict:
            raise FleetConfigError("sandbox nodes that cannot run sandboxes:\n  " + "\n  ".join(problems))
        if not self.nodes:
            raise FleetConfigError(
                f"the Ray cluster at {self.config.ray_address or 'auto'} has no sandbox node: start "
                f"workers with --resources='{{\"{self.config.node_resource}\": N}}' "
                "(platform/deploy/fleet-node.sh does)"
            )
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._beat, name="envforge-fleet-heartbeat", daemon=True)
            self._heartbeat.start()
        return self

    def _beat(self) -> None:
        """While this process lives, tell every node it holds leases on so (a dead driver's leases are
        reclaimed after `driver_timeout_s`, not the far longer `lease_idle_timeout_s`)."""
        while True:
            time.sleep(HEARTBEAT_INTERVAL_S)
            for node in self.alive_nodes():
                if node.leased > 0:
                    try:
                        node.handle.heartbeat.remote(self.client_id)  # fire and forget
                    except Exception:  # noqa: BLE001 - a lost node is noticed by the calls that need it
                        pass

    def _agent_class(self):
        if self._remote_agent is None:
            self._remote_agent = ray_module().remote(NodeAgent)
        return self._remote_agent

    def discover(self, raise_on_error: bool = False) -> list[str]:
        """Pick up nodes that joined and forget nodes that left; returns the problems of bad nodes."""
        ray = ray_module()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._last_discovery = time.monotonic()
        problems: list[str] = []
        alive = {
            n["NodeID"]: n
            for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get(self.config.node_resource, 0) > 0
        }
        for node_id in list(self.nodes):
            if node_id not in alive and self.nodes[node_id].alive:
                self._lost(self.nodes[node_id], "left the cluster")
        for node_id, node in alive.items():
            if node_id in self.nodes:
                continue
            capacity = int(node["Resources"][self.config.node_resource])
            name = node.get("NodeName") or node.get("NodeManagerAddress") or node_id[:8]
            label = f"{name}/{node_id[:8]}"
            handle = (
                self._agent_class()
                .options(
                    name=AGENT_PREFIX + node_id,
                    namespace=self.config.namespace,
                    lifetime="detached",
                    get_if_exists=True,
                    num_cpus=0,
                    max_concurrency=1024,
                    max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                .remote(self.config.model_dump(), capacity, label, True)
            )  # True: serve and register its metrics
            try:
                info = ray.get(handle.info.remote(), timeout=180)
            except Exception as exc:  # noqa: BLE001 - the agent's constructor failed: say why, naming the node
                if node_gone(ray, exc):
                    # The node died between Ray listing it and its agent answering (Ray marks a
                    # killed node dead only after its health checks fail): a lost node, not a bad one.
                    self.on_event(f"node {label} is unreachable, skipped until it answers: {root_message(exc)}")
                    continue
                problems.append(f"node {label}: {root_message(exc)}")
                try:
                    ray.kill(handle)
                except Exception:  # noqa: BLE001
                    pass
                continue
            state = NodeState(
                node_id, label, handle, info["capacity"], images=set(info["images"]), idle=dict(info["idle"]), info=info
            )
            with self._cond:
                self.nodes[node_id] = state
                self._cond.notify_all()
            live.fleet_nodes(len(self.alive_nodes()))
            if self.stats.acquires:
                self.stats.nodes_joined.append(label)
                self.on_event(f"node {label} joined ({state.capacity} sandboxes, engine {info['engine_version']})")
        for p in problems:
            self.on_event(p)
        return problems

    def _lost(self, node: NodeState, why: str) -> None:
        with self._cond:
            if not node.alive:
                return
            node.alive = False
            self.stats.nodes_lost.append(node.name)
            self._cond.notify_all()
            alive = sum(n.alive for n in self.nodes.values())
        live.fleet_nodes(alive, lost=1)
        self.on_event(f"node {node.name} lost: {why}")

    def alive_nodes(self) -> list[NodeState]:
        with self._cond:
            return [n for n in self.nodes.values() if n.alive]

    # -- remote calls ----------------------------------------------------------------------

    def call(self, node: NodeState, method: str, *args, timeout_s: float | None = None) -> Any:
        """Call the node's agent; a dead node or agent is InfraError('node_lost'), a Fault is re-raised."""
        ray = self._alive_or_raise(node)
        try:
            result = ray.get(getattr(node.handle, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise InfraError("node_timeout", f"node {node.name}: {method} did not answer in {timeout_s}s") from None
        except lost_errors() as exc:
            raise self._node_lost(node, exc) from None
        except ray.exceptions.RayTaskError as exc:
            raise InfraError("node_error", f"node {node.name}: {method}: {root_message(exc)}") from None
        return unwrap(result)

    async def acall(self, node: NodeState, method: str, *args) -> Any:
        """`call` for asyncio: the actor call's reference is awaited, no thread is held."""
        ray = self._alive_or_raise(node)
        try:
            result = await getattr(node.handle, method).remote(*args)
        except lost_errors() as exc:
            raise self._node_lost(node, exc) from None
        except ray.exceptions.RayTaskError as exc:
            raise InfraError("node_error", f"node {node.name}: {method}: {root_message(exc)}") from None
        return unwrap(result)

    def _alive_or_raise(self, node: NodeState):
        if not node.alive:
            raise InfraError("node_lost", f"node {node.name} is gone")
        return ray_module()

    def _node_lost(self, node: NodeState, exc: BaseException) -> InfraError:
        self._lost(node, type(exc).__name__)
        return InfraError("node_lost", f"node {node.name}: {type(exc).__name__}")

    # -- placement -------------------------------------------------------------------------

    def acquire(self, image: str, options: SandboxOptions) -> tuple[NodeState, str, bool]:
        """(node, lease, warm): a sandbox of `image` on the best node with room; waits when all are full."""
        deadline = time.monotonic() + self.config.acquire_timeout_s
        waited_from: float | None = None
        waited = 0.0
        while True:
            if time.monotonic() - self._last_discovery > self.config.discovery_interval_s:
                self.discover()
            node = self._reserve(image)
            if node is None:
                if time.monotonic() > deadline:
                    raise InfraError(
                        "fleet_full",
                        f"no sandbox node had room for {self.config.acquire_timeout_s:.0f}s "
                        f"(ENVFORGE_FLEET_ACQUIRE_TIMEOUT_S)",
                    )
                if waited_from is None:
                    waited_from = time.monotonic()
                    self.stats.waits += 1
                with self._cond:
                    self._cond.wait(timeout=min(self.config.discovery_interval_s, 0.5))
                continue
            if waited_from is not None:
                self.stats.wait_s += time.monotonic() - waited_from
                waited += time.monotonic() - waited_from
                waited_from = None
            try:
                self.distribution.ensure(node, image)
                got = self.call(node, "acquire", self.client_id, image, options)
            except InfraError as exc:
                # A node whose engine fails (dockerd died or hangs) gets no placements for a while, so
                # the retry of this trajectory lands elsewhere instead of failing there again.
                engine_fault = exc.cause in ENGINE_CAUSES
                self._unreserve(node, full_for_s=ENGINE_COOLDOWN_S if engine_fault else 0.0)
                if engine_fault:
                    self.on_event(
                        f"node {node.name}: engine fault ({exc.cause}); no placements for {ENGINE_COOLDOWN_S:.0f} s"
                    )
                raise
            except BaseException:
                self._unreserve(node)
                raise
            if got == FULL:  # another driver filled it: look again in a moment
                self._unreserve(node, full_for_s=0.5)
                continue
            lease, warm = got
            with self._cond:
                self.stats.acquires += 1
                self.stats.warm += int(warm)
                self.stats.placements[node.name] = self.stats.placements.get(node.name, 0) + 1
                if warm and node.idle.get(image):
                    node.idle[image] -= 1
            live.fleet_acquire_waited(waited)
            return node, lease, warm

    def _reserve(self, image: str) -> NodeState | None:
        with self._cond:
            candidates = [n for n in self.nodes.values() if n.alive and n.free > 0]
            if not candidates:
                return None
            best = max(candidates, key=lambda n: n.score(image))
            best.leased += 1
            return best

    def _unreserve(self, node: NodeState, full_for_s: float = 0.0) -> None:
        with self._cond:
            node.leased = max(0, node.leased - 1)
            if full_for_s:
                node.full_until = time.monotonic() + full_for_s
            self._cond.notify_all()

    def release(self, node: NodeState, lease: str) -> None:
        try:
            if node.alive:
                self.call(node, "release", lease, timeout_s=300)
        except InfraError:
            pass  # the node is gone, and its sandbox with it
        finally:
            self._unreserve(node)

    # -- images (the fleet pool's seeding; the work is ImageDistribution's) ------------------

    @property
    def recipes(self) -> dict[str, ImageRecipe]:
        return self.distribution.recipes

    @property
    def origin(self) -> Any:
        """The driver's own engine (a docker client), when it has one: images start there."""
        return self.distribution.origin

    @origin.setter
    def origin(self, client: Any) -> None:
        self.distribution.origin = client

    def register_recipe(self, recipe: ImageRecipe) -> None:
        self.distribution.register_recipe(recipe)

    def push_image(self, tag: str, data: bytes, nodes: list[NodeState] | None = None) -> int:
        """Load an image from this driver's own engine onto nodes that lack it (the first seeding)."""
        return self.distribution.push(tag, data, nodes)

    # -- elastic pools ---------------------------------------------------------------------

    def announce(self, demand: dict[str, tuple[SandboxOptions, int]]) -> None:
        """Tell nodes what the queue holds (image -> (options, sandboxes wanted)), split by where each
        image would be placed, so they pre-heat it; images no longer wanted go cold on their own."""
        nodes = self.alive_nodes()
        if not nodes:
            return
        per_node: dict[str, dict[str, tuple[SandboxOptions, int]]] = {n.node_id: {} for n in nodes}
        for image, (options, count) in demand.items():
            holders = [n for n in nodes if image in n.images] or nodes
            share, extra = divmod(count, len(holders))
            for i, n in enumerate(holders):
                per_node[n.node_id][image] = (options, share + (1 if i < extra else 0))
        for n in nodes:
            if per_node[n.node_id]:
                try:
                    n.handle.set_demand.remote(per_node[n.node_id])  # fire and forget
                except Exception:  # noqa: BLE001
                    pass

    def refresh(self) -> None:
        """Re-read every node's warm pool and images (placement uses them)."""
        for node in self.alive_nodes():
            try:
                info = self.call(node, "info", timeout_s=60)
            except InfraError:
                continue
            with self._cond:
                node.idle, node.images, node.info = dict(info["idle"]), set(info["images"]), info

    def close(self) -> None:
        """Nothing to tear down: agents are shared and keep their warm pools; leases go back on release."""
