"""A warm pool of started sandboxes per (image, options).

Starting a container costs ~0.4 s here; resetting a used one costs ~20 ms. The pool keeps
started sandboxes ready, hands one out on `acquire`, and on `release` resets it and keeps it,
or destroys it when it is tainted (agent dead, reset failed, OOM, infrastructure error).
Container starts are capped (`max_starting`) because the Docker daemon overloads under
bursts of creates (SkyRL #9). Idle sandboxes are health-checked before they are handed out,
so a daemon restart or a container killed from outside costs a replacement, not an error.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import uuid
from collections import defaultdict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping

import docker

from envforge.errors import InfraError
from envforge.observe import metrics as live
from envforge.sandbox.container import INITIAL, Sandbox, SandboxOptions, run_blocking
from envforge.sandbox.engine import ENGINE_ERRORS, engine_answers, remove_orphans, wait_for_engine

POOL_LABEL = "envforge.pool"  # which pool started a container: what it sweeps when it closes

PoolKey = tuple[str, str]  # (image, SandboxOptions.key())


@dataclass
class PoolStats:
    """Counters for logging: how often the pool saved a container start, and what it cost."""

    hits: int = 0
    misses: int = 0
    resets: int = 0
    destroyed: int = 0
    destroyed_reasons: dict[str, int] = field(default_factory=dict)
    started: int = 0
    start_failures: int = 0
    unhealthy_idle: int = 0
    engine_waits: int = 0
    engine_wait_s: float = 0.0
    swept: int = 0  # containers removed late: their removal failed while the engine was away
    start_latency_s: list[float] = field(default_factory=list)
    reset_latency_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        def p50(xs: list[float]) -> float | None:
            return round(statistics.median(xs) * 1000, 2) if xs else None

        total = self.hits + self.misses
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hits / total, 4) if total else None,
            "resets": self.resets,
            "destroyed": self.destroyed,
            "destroyed_reasons": dict(self.destroyed_reasons),
            "started": self.started,
            "start_failures": self.start_failures,
            "unhealthy_idle": self.unhealthy_idle,
            "engine_waits": self.engine_waits,
            "engine_wait_s": round(self.engine_wait_s, 3),
            "swept": self.swept,
            "start_p50_ms": p50(self.start_latency_s),
            "reset_p50_ms": p50(self.reset_latency_s),
        }


class SandboxPool:
    """Thread-safe; the `a*` methods are the asyncio face of the same pool."""

    def __init__(
        self,
        client: docker.DockerClient,
        max_idle_per_key: int = 8,
        max_starting: int = 4,
        labels: Mapping[str, str] | None = None,
        clean_orphans: bool = True,
    ):
        self.client = client
        self.max_idle_per_key = max_idle_per_key
        self.id = uuid.uuid4().hex[:12]
        self.labels = {**(labels or {}), POOL_LABEL: self.id}
        self.stats = PoolStats()
        self._idle: dict[PoolKey, deque[Sandbox]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._starting = threading.BoundedSemaphore(max_starting)
        self._closed = False
        self._unremoved: set[str] = set()  # container ids whose removal the engine refused for now
        if clean_orphans:
            remove_orphans(client)

    # -- acquire / release -------------------------------------------------------------

    def acquire(self, image: str, options: SandboxOptions | None = None) -> Sandbox:
        """A sandbox of `image` in the task's initial state: a warm one if healthy, else a new one."""
        options = options or SandboxOptions()
        key = (image, options.key())
        while True:
            with self._lock:
                if self._closed:
                    raise RuntimeError("pool is closed")
                sandbox = self._idle[key].popleft() if self._idle[key] else None
            if sandbox is None:
                break
            if sandbox.ping():
                with self._lock:
                    self.stats.hits += 1
                live.pool_acquired(hit=True)
                return sandbox
            live.pool_idle_changed(-1)
            self.stats.unhealthy_idle += 1
            self._destroy(sandbox, "unhealthy while idle")
        with self._lock:
            self.stats.misses += 1
        sandbox = self._start(image, options)
        live.pool_acquired(hit=False)
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """Reset the sandbox and keep it warm, or destroy it if it is tainted or the pool is full."""
        if sandbox.tainted:
            live.pool_released(kept=False)
            self._destroy(sandbox, _reason_key(sandbox.tainted))
            return
        try:
            took = sandbox.reset(INITIAL)
        except InfraError as exc:
            live.pool_released(kept=False)
            self._destroy(sandbox, f"reset failed: {exc.cause}")
            return
        key = (sandbox.image, sandbox.options.key())
        with self._lock:
            self.stats.resets += 1
            self.stats.reset_latency_s.append(took)
            kept = not self._closed and len(self._idle[key]) < self.max_idle_per_key
            if kept:
                self._idle[key].append(sandbox)
        live.pool_released(kept=kept, reset_s=took)
        if not kept:
            self._destroy(sandbox, "pool full")

    def preheat(self, image: str, options: SandboxOptions | None = None, count: int = 1) -> int:
        """Start sandboxes until `count` are idle for this key; returns how many were started."""
        options = options or SandboxOptions()
        key = (image, options.key())
        with self._lock:
            need = max(0, min(count, self.max_idle_per_key) - len(self._idle[key]))
        if need == 0:
            return 0
        with ThreadPoolExecutor(max_workers=need) as ex:
            started = list(ex.map(lambda _: self._start(image, options), range(need)))
        with self._lock:
            self._idle[key].extend(started)
        live.pool_idle_changed(len(started))
        return len(started)

    def trim(self, image: str | None = None, keep: int = 0) -> int:
        """Destroy idle sandboxes (of one image, or of every image) beyond `keep` per key; returns how many.

        Elastic pools shrink with this when the queue no longer asks for an image.
        """
        doomed: list[Sandbox] = []
        with self._lock:
            for (img, _), q in self._idle.items():
                if image is None or img == image:
                    while len(q) > keep:
                        doomed.append(q.pop())
        live.pool_idle_changed(-len(doomed))
        for sb in doomed:
            self._destroy(sb, "trimmed")
        return len(doomed)

    def idle_by_image(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for (img, _), q in self._idle.items():
                if q:
                    counts[img] = counts.get(img, 0) + len(q)
            return counts

    def idle_count(self, image: str | None = None) -> int:
        with self._lock:
            return sum(len(q) for (img, _), q in self._idle.items() if image is None or img == image)

    def close(self) -> None:
        """Destroy every idle sandbox, and every container of this pool left dead by an engine
        restart; sandboxes still acquired are the caller's to release."""
        with self._lock:
            self._closed = True
            idle = [sb for q in self._idle.values() for sb in q]
            self._idle.clear()
        live.pool_idle_changed(-len(idle))
        for sb in idle:
            self._destroy(sb, "pool closed")
        self.sweep(include_created=True)

    # -- engine faults -----------------------------------------------------------------

    def wait_for_engine(self, timeout_s: float = 120.0) -> float:
        """After an infrastructure fault: block until the engine answers (a dockerd restart takes
        seconds), then remove what the outage left behind. Returns the seconds waited; raises
        InfraError('engine_unavailable') when it stays away."""
        if engine_answers(self.client):
            return 0.0
        waited = wait_for_engine(self.client, timeout_s)
        with self._lock:
            self.stats.engine_waits += 1
            self.stats.engine_wait_s += waited
        self.sweep()
        return waited

    def sweep(self, include_created: bool = False) -> int:
        """Remove containers whose removal failed earlier, and this pool's containers that a
        dockerd restart left exited or dead (never a running one: it may be in use). With
        include_created (when the pool closes, so no start is in flight), also the ones created
        but never started: a start the restart cut short, whose cleanup failed with it."""
        with self._lock:
            pending = set(self._unremoved)
        states = ["exited", "dead", *(["created"] if include_created else [])]
        try:
            listed = self.client.containers.list(
                all=True, sparse=True, filters={"label": f"{POOL_LABEL}={self.id}", "status": states}
            )
            pending |= {c.id for c in listed}
        except ENGINE_ERRORS:
            return 0
        removed = 0
        for cid in pending:
            try:
                self.client.api.remove_container(cid, force=True, v=True)
            except ENGINE_ERRORS as exc:
                if getattr(exc, "status_code", None) != 404:
                    continue  # still unreachable: next sweep
            removed += 1
            with self._lock:
                self._unremoved.discard(cid)
        with self._lock:
            self.stats.swept += removed
        return removed

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- async ---------------------------------------------------------------------------

    async def aacquire(self, image: str, options: SandboxOptions | None = None) -> Sandbox:
        return await run_blocking(self.acquire, image, options)

    async def arelease(self, sandbox: Sandbox) -> None:
        await run_blocking(self.release, sandbox)

    async def apreheat(self, image: str, options: SandboxOptions | None = None, count: int = 1) -> int:
        return await run_blocking(self.preheat, image, options, count)

    # -- internals -----------------------------------------------------------------------

    def _start(self, image: str, options: SandboxOptions) -> Sandbox:
        with self._starting:
            started = time.perf_counter()
            try:
                sandbox = Sandbox.start(self.client, image, options, self.labels)
            except InfraError as exc:
                with self._lock:
                    self.stats.start_failures += 1
                live.pool_started(None, failure_cause=exc.cause)
                raise
        took = time.perf_counter() - started
        with self._lock:
            self.stats.started += 1
            self.stats.start_latency_s.append(took)
        live.pool_started(took)
        return sandbox

    def _destroy(self, sandbox: Sandbox, reason: str) -> None:
        if not sandbox.close():
            with self._lock:
                self._unremoved.add(sandbox.id)
        with self._lock:
            self.stats.destroyed += 1
            self.stats.destroyed_reasons[reason] = self.stats.destroyed_reasons.get(reason, 0) + 1
        live.pool_destroyed(reason)


def _reason_key(tainted: str) -> str:
    """Group taint reasons for stats ('agent died: ...' -> 'agent died')."""
    return tainted.split(":", 1)[0]


async def gather_limited(coros, limit: int):
    """Run coroutines with at most `limit` in flight (a small helper for benchmarks and schedulers)."""
    sem = asyncio.Semaphore(limit)

    async def one(c):
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))
