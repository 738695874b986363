"""The node agent: one per Ray node, owning that node's Docker engine, image cache and warm pool.

It runs as a detached, named Ray actor pinned to its node (the dispatcher creates it), so
every driver in the namespace shares it and its warm sandboxes outlive any one batch. The
engine is whatever `DOCKER_HOST` says in the node's environment (the local socket if unset):
each node brings its own engine.

Drivers lease sandboxes (`acquire` -> lease id), drive them (`call(lease, "exec", ...)`), and
hand them back (`release`). A driver that holds leases beats (`heartbeat`, every few seconds);
one not heard from for `driver_timeout_s` has died, and its leases are reclaimed, as is any
lease nobody touches for `lease_idle_timeout_s`. At most `capacity` leases are out at once: a
full node answers `FULL` and the dispatcher looks elsewhere or waits. Nothing here imports Ray:
the class is plain Python (tests drive it directly) and `ray.remote` wraps it.

Faults travel as values, not exceptions (`Fault`): an InfraError stays an InfraError on the
driver, and a ValueError from a patch that does not apply stays a ValueError.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from docker.errors import DockerException
from requests.exceptions import RequestException

from envforge.config import Settings
from envforge.errors import InfraError
from envforge.fleet.config import FleetConfig
from envforge.fleet.images import ImageRecipe, build_image, export_image, import_image
from envforge.observe import metrics as live
from envforge.sandbox.container import Sandbox, SandboxOptions
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import image_exists
from envforge.sandbox.pool import SandboxPool

FULL = "full"
NODE_LABEL = "envforge.fleet-node"
# What a driver may ask a leased sandbox to do (no callbacks: output streams are not remoted).
SANDBOX_METHODS = frozenset(
    {
        "exec",
        "write_file",
        "put_files",
        "read_file",
        "apply_patch",
        "diff",
        "changed_paths",
        "restore_paths",
        "restore_git_dir",
        "install_files",
        "kill_processes",
        "snapshot",
        "reset",
        "ping",
    }
)
_PASSED_THROUGH = (ValueError, OSError, KeyError)


@dataclass(frozen=True)
class Fault:
    """An exception raised on the node, carried back as a value and raised again on the driver."""

    kind: str  # "infra" or the builtin exception's name
    cause: str
    detail: str = ""

    def rebuild(self) -> Exception:
        if self.kind == "infra":
            return InfraError(self.cause, self.detail)
        exc_type = {
            "ValueError": ValueError,
            "FileNotFoundError": FileNotFoundError,
            "OSError": OSError,
            "KeyError": KeyError,
            "PermissionError": PermissionError,
        }.get(self.kind, RuntimeError)
        return exc_type(self.detail)


def _fault(exc: BaseException) -> Fault:
    if isinstance(exc, InfraError):
        return Fault("infra", exc.cause, exc.detail)
    if isinstance(exc, (DockerException, RequestException)):
        # The engine went away or broke mid-call (the SDK lets connection errors through unwrapped).
        return Fault("infra", "engine_error", f"{type(exc).__name__}: {str(exc)[:300]}")
    return Fault(type(exc).__name__, type(exc).__name__, str(exc))


@dataclass
class _Lease:
    sandbox: Sandbox
    client_id: str
    last_used: float
    in_flight: int = 0


@dataclass
class NodeStats:
    leases: int = 0
    reclaimed: int = 0
    images_built: int = 0
    images_loaded: int = 0
    image_seconds: list[float] = field(default_factory=list)
    preheated: int = 0
    trimmed: int = 0


def engine_check(client, min_version: str) -> str:
    """The engine's version; an engine older than `min_version` is refused with both versions named."""
    version = str(client.version().get("Version", "0"))

    def parts(v: str) -> tuple[int, ...]:
        out = []
        for p in v.split("+")[0].split("-")[0].split(".")[:3]:
            out.append(int("".join(ch for ch in p if ch.isdigit()) or 0))
        return tuple(out)

    if parts(version) < parts(min_version):
        from envforge.settings import read_env

        raise InfraError(
            "engine_unsupported",
            f"Docker engine {version} at "
            f"DOCKER_HOST={read_env().docker_host or '(local socket)'} "
            f"is older than {min_version} (ENVFORGE_FLEET_MIN_ENGINE_VERSION)",
        )
    return version


class NodeAgent:
    """Leases sandboxes of this node's engine to drivers. Thread-safe (a threaded Ray actor).

    With `serve_metrics` (how the dispatcher starts it) the agent serves its process's metrics (its
    pool's: warm, hits, misses, start and reset latency, destroyed by cause; its leases and images)
    on a free port and registers them in Prometheus' file_sd directory of the node's environment,
    labelled with the node: the agent is detached and shared by every driver, so its counters are
    the node's, scraped from the node, never summed into one driver's."""

    def __init__(
        self, config: dict[str, Any] | FleetConfig, capacity: int, node_name: str = "", serve_metrics: bool = False
    ):
        self.config = config if isinstance(config, FleetConfig) else FleetConfig(**config)
        self.capacity = max(0, int(capacity))
        self.node_name = node_name or socket.gethostname()
        settings = Settings.from_env()
        self.docker_host = settings.docker_host or "unix:///var/run/docker.sock"
        try:
            self.client = docker_client(settings, timeout_s=300)
        except InfraError as exc:
            raise InfraError(
                "engine_unavailable",
                f"node {self.node_name}: no Docker engine answers at DOCKER_HOST="
                f"{self.docker_host} ({exc.detail[:200]}); start one there "
                f"(platform/deploy/fleet-engine.sh) or set DOCKER_HOST in the "
                f"node's environment",
            ) from None
        self.engine_version = engine_check(self.client, self.config.min_engine_version)
        self.pool = SandboxPool(
            self.client,
            max_idle_per_key=self.config.max_idle_per_image,
            max_starting=4,
            labels={NODE_LABEL: self.node_name},
        )
        self.stats = NodeStats()
        self._leases: dict[str, _Lease] = {}
        self._heard: dict[str, float] = {}  # driver (client id) -> when it last beat, acquired or called
        self._demand: dict[str, tuple[SandboxOptions, int, float]] = {}  # image -> (options, wanted, when)
        self._image_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._maintainer = threading.Thread(target=self._maintain, name="envforge-node-maintain", daemon=True)
        self._maintainer.start()
        self._metrics, self._target = (None, None)
        if serve_metrics:  # a free port unless the node's ENVFORGE_METRICS_PORT says otherwise
            from envforge.observe.http import start_registered_server

            self._metrics, self._target = start_registered_server(
                "fleet_node", f"node {self.node_name}", {"node": self.node_name}, default_port=0
            )

    # -- what the dispatcher reads ---------------------------------------------------------

    def info(self) -> dict[str, Any]:
        with self._lock:
            leased = len(self._leases)
        # One /images/json call: `images.list()` would inspect every image on the engine, one request each.
        images = sorted(
            t for img in self.client.api.images() for t in img.get("RepoTags") or [] if t.startswith("envforge/")
        )
        return {
            "node": self.node_name,
            "pid": os.getpid(),
            "docker_host": self.docker_host,
            "engine_version": self.engine_version,
            "capacity": self.capacity,
            "leased": leased,
            "idle": self.pool.idle_by_image(),
            "images": images,
            "pool": self.pool.stats.as_dict(),
            "stats": dict(self.stats.__dict__),
            "metrics_url": self._metrics.url if self._metrics else None,
        }

    # -- leases ----------------------------------------------------------------------------

    def acquire(self, client_id: str, image: str, options: SandboxOptions) -> tuple[str, bool] | str | Fault:
        """(lease id, warm) or FULL. The image must be on this node (`ImageDistribution.ensure` first)."""
        with self._lock:
            if len(self._leases) >= self.capacity:
                return FULL
            self._heard[client_id] = time.monotonic()
            placeholder = f"pending-{uuid.uuid4().hex}"
            self._leases[placeholder] = _Lease(None, client_id, time.monotonic(), 1)  # type: ignore[arg-type]
        hits = self.pool.stats.hits
        try:
            sandbox = self.pool.acquire(image, options)
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._leases.pop(placeholder, None)
            return _fault(exc)
        lease = uuid.uuid4().hex
        with self._lock:
            self._leases.pop(placeholder, None)
            self._leases[lease] = _Lease(sandbox, client_id, time.monotonic())
            self.stats.leases += 1
        live.fleet_leases(+1)
        self._touch(image, options)
        return lease, self.pool.stats.hits > hits

    def call(self, lease: str, method: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        if method not in SANDBOX_METHODS:
            return Fault("ValueError", "ValueError", f"sandbox method {method!r} cannot be called remotely")
        with self._lock:
            held = self._leases.get(lease)
            if held is None or held.sandbox is None:
                return Fault(
                    "infra",
                    "lease_lost",
                    f"lease {lease[:8]} is not held on node {self.node_name} "
                    "(reclaimed: its driver was silent for driver_timeout_s or "
                    "the lease untouched for lease_idle_timeout_s; or the agent "
                    "restarted)",
                )
            held.in_flight += 1
            held.last_used = self._heard[held.client_id] = time.monotonic()
        try:
            return getattr(held.sandbox, method)(*args, **(kwargs or {}))
        except (InfraError, DockerException, RequestException, *_PASSED_THROUGH) as exc:
            return _fault(exc)
        finally:
            with self._lock:
                held.in_flight -= 1
                held.last_used = time.monotonic()

    def heartbeat(self, client_id: str) -> None:
        """The driver `client_id` is alive: its leases here stay, however long its policy thinks."""
        with self._lock:
            self._heard[client_id] = time.monotonic()

    def release(self, lease: str) -> None:
        with self._lock:
            held = self._leases.pop(lease, None)
        if held is not None and held.sandbox is not None:
            live.fleet_leases(-1)
            self.pool.release(held.sandbox)
            self._touch(held.sandbox.image, held.sandbox.options)

    # -- images ----------------------------------------------------------------------------

    def has_image(self, tag: str) -> bool | Fault:
        try:
            return image_exists(self.client, tag)
        except (DockerException, RequestException) as exc:
            return _fault(exc)

    def export_image(self, tag: str) -> bytes | Fault:
        try:
            return export_image(self.client, tag)
        except InfraError as exc:
            return _fault(exc)

    def import_image(self, data: bytes, tag: str) -> float | Fault:
        """Load a transferred image; returns the seconds it took (or the fault)."""
        return self._image_op(tag, lambda: import_image(self.client, data, tag), "images_loaded")

    def build_image(self, recipe: ImageRecipe) -> float | Fault:
        return self._image_op(recipe.tag, lambda: build_image(self.client, recipe), "images_built")

    def _image_op(self, tag: str, op, counter: str) -> float | Fault:
        with self._lock:
            lock = self._image_locks.setdefault(tag, threading.Lock())
        with lock:  # one transfer or build per image at a time; the others find it done
            if image_exists(self.client, tag):
                return 0.0
            started = time.perf_counter()
            try:
                op()
            except (InfraError, DockerException, RequestException) as exc:
                return _fault(exc)
            took = time.perf_counter() - started
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
            live.fleet_image(counter.removeprefix("images_"))
            self.stats.image_seconds.append(round(took, 3))
            return took

    # -- elastic warm pool -----------------------------------------------------------------

    def set_demand(self, demand: dict[str, tuple[SandboxOptions, int]]) -> None:
        """What the queue will ask this node for next (image -> (options, count)); the maintainer
        pre-heats up to the limits and lets images nobody wants any more go cold."""
        now = time.monotonic()
        with self._lock:
            for image, (options, count) in demand.items():
                self._demand[image] = (options, int(count), now)

    def _touch(self, image: str, options: SandboxOptions | None) -> None:
        """An image was just used: its warm sandboxes stay for another `idle_shrink_after_s`."""
        with self._lock:
            old_options, wanted, _ = self._demand.get(image, (SandboxOptions(), 0, 0.0))
            self._demand[image] = (options or old_options, wanted, time.monotonic())

    def _maintain(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._reclaim_stale_leases()
                self._follow_demand()
            except (InfraError, DockerException, RequestException, RuntimeError):
                continue  # an engine hiccup: try again on the next tick

    def _reclaim_stale_leases(self) -> None:
        """Leases of drivers not heard from for `driver_timeout_s` (dead), or untouched for
        `lease_idle_timeout_s`; a call in flight keeps its lease either way."""
        now = time.monotonic()
        idle_cutoff, dead_cutoff = now - self.config.lease_idle_timeout_s, now - self.config.driver_timeout_s
        with self._lock:
            stale = [
                k
                for k, v in self._leases.items()
                if v.in_flight == 0
                and v.sandbox is not None
                and (v.last_used < idle_cutoff or self._heard.get(v.client_id, now) < dead_cutoff)
            ]
            doomed = [self._leases.pop(k) for k in stale]
            self.stats.reclaimed += len(doomed)  # counted as they stop being leases, before their removal
            if doomed:
                live.fleet_leases(-len(doomed), reclaimed=len(doomed))
            holders = {v.client_id for v in self._leases.values()}
            for client_id in [c for c, t in self._heard.items() if c not in holders and t < dead_cutoff]:
                del self._heard[client_id]
        for held in doomed:
            held.sandbox.close()

    def _follow_demand(self) -> None:
        now = time.monotonic()
        idle = self.pool.idle_by_image()
        with self._lock:
            demand = dict(self._demand)
            free = self.capacity - len(self._leases)
        budget = min(self.config.max_idle_per_node - sum(idle.values()), free)
        for image, (options, wanted, when) in sorted(demand.items(), key=lambda kv: -kv[1][1]):
            if now - when > self.config.idle_shrink_after_s:
                self.stats.trimmed += self.pool.trim(image, keep=0)
                with self._lock:
                    if self._demand.get(image, (None, 0, 0.0))[2] == when:
                        self._demand.pop(image, None)
                continue
            need = min(min(wanted, self.config.max_idle_per_image) - idle.get(image, 0), budget)
            if need > 0 and image_exists(self.client, image):
                self.stats.preheated += self.pool.preheat(image, options, idle.get(image, 0) + need)
                budget -= need
                self._touch(image, options)  # fresh sandboxes get the whole delay before they may go cold
        for image in idle:
            if image not in demand:  # warm from an earlier batch, never announced: cold after the same delay
                self._touch(image, None)
        over = sum(self.pool.idle_by_image().values()) - self.config.max_idle_per_node
        if over > 0:
            for image, n in sorted(self.pool.idle_by_image().items(), key=lambda kv: demand.get(kv[0], (0, 0))[1]):
                cut = min(over, n)
                self.stats.trimmed += self.pool.trim(image, keep=n - cut)
                over -= cut
                if over <= 0:
                    break

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            held = list(self._leases.values())
            self._leases.clear()
        live.fleet_leases(-sum(h.sandbox is not None for h in held))
        for h in held:
            if h.sandbox is not None:
                h.sandbox.close()
        self.pool.close()
        if self._target is not None:
            self._target.remove()
        if self._metrics is not None:
            self._metrics.close()
