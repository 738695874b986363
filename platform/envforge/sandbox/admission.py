"""How many sandboxes run at once: as many as the host's CPUs have room for, not a fixed count.

A stage that runs test suites (a derivation, the gate) used to run a fixed number of sandboxes at
once, about one per core. That is right for a suite that computes (more-itertools' test file: 9 s
of CPU per run) and leaves the machine idle for one that waits (filelock's suite: 11 s of CPU in a
130 s run, its tests sleeping on lock timeouts; tenacity's retry waits). So a stage starts
`floor` sandboxes at once as before, and more, up to `ceiling`, while the host's CPUs were less
than `busy` used over the last `settle_s` and memory is available. Waiting suites fill the idle
time; computing ones hold the count at the floor, where a test that needs the CPU gets it.

One extra sandbox is admitted per `settle_s` at most, so the load of the last one shows before the
next is let in. Busy time is read from /proc/stat (every process on the host, the sandboxes'
included); where it cannot be read, nothing beyond the floor is admitted.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from envforge.sandbox.container import SandboxOptions

BUSY = 0.8  # share of the host's CPU time in use above which no sandbox beyond the floor starts
SETTLE_S = 1.0
MIN_FREE_MB = 2048  # memory that must stay available for a sandbox beyond the floor to start


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of every CPU since boot, from /proc/stat; None where it cannot be read."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields)  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return total - idle, total


def available_memory_mb() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        return None
    return None


@dataclass
class CpuAdmission:
    """Admits sandbox work: always up to `floor` at once, up to `ceiling` while the CPUs have room."""

    floor: int
    ceiling: int
    busy: float = BUSY
    settle_s: float = SETTLE_S
    min_free_mb: int = MIN_FREE_MB
    sample: Callable[[], tuple[int, int] | None] = cpu_times
    free_mb: Callable[[], int | None] = available_memory_mb
    clock: Callable[[], float] = time.monotonic
    active: int = field(default=0, init=False)
    peak: int = field(default=0, init=False)  # the most admitted at once
    beyond_floor: int = field(default=0, init=False)  # admissions the CPUs' room allowed past the floor

    def __post_init__(self) -> None:
        if self.floor < 1 or self.ceiling < self.floor:
            raise ValueError(
                f"CpuAdmission: need 1 <= floor <= ceiling, got floor={self.floor}, ceiling={self.ceiling}"
            )
        self._cond = threading.Condition()
        self._window = (self.clock(), self.sample())

    def acquire(self) -> None:
        with self._cond:
            while not self._admit():
                self._cond.wait(timeout=self.settle_s / 4)
            self.active += 1
            self.peak = max(self.peak, self.active)

    def release(self) -> None:
        with self._cond:
            self.active -= 1
            self._cond.notify_all()

    @contextmanager
    def slot(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def _admit(self) -> bool:
        if self.active < self.floor:
            return True
        if self.active >= self.ceiling:
            return False
        now = self.clock()
        since, before = self._window
        if now - since < self.settle_s:
            return False
        after = self.sample()
        self._window = (now, after)
        if before is None or after is None or after[1] <= before[1]:
            return False
        used = (after[0] - before[0]) / (after[1] - before[1])
        free = self.free_mb()
        if used >= self.busy or (free is not None and free < self.min_free_mb):
            return False
        self.beyond_floor += 1
        return True


def host_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def admission_for(floor: int, ceiling: int | None = None) -> CpuAdmission:
    """The admission of a stage on this engine that runs `floor` sandboxes at once at least: up to
    ENVFORGE_SANDBOX_CEILING (0: four per core) while the CPUs have room; never below the floor."""
    if ceiling is None:
        from envforge.settings import read_env

        ceiling = read_env().sandbox_ceiling or 4 * host_cpus()
    return CpuAdmission(floor=max(1, floor), ceiling=max(1, floor, ceiling))


def admitted(pool: Any, admission: CpuAdmission | None) -> Any:
    """The pool, its acquisitions admitted when there is an admission (a local lease), else as it is."""
    return AdmittedPool(pool, admission) if admission else pool


class AdmittedPool:
    """A sandbox pool whose `acquire` waits for admission and whose `release` gives the slot back;
    everything else is the pool's own (the `Pool` protocol's face, by delegation)."""

    def __init__(self, pool: Any, admission: CpuAdmission):
        self._pool = pool
        self.admission = admission

    def acquire(self, image: str, options: SandboxOptions | None = None) -> Any:
        self.admission.acquire()
        try:
            return self._pool.acquire(image, options)
        except BaseException:
            self.admission.release()
            raise

    def release(self, sandbox: Any) -> None:
        try:
            self._pool.release(sandbox)
        finally:
            self.admission.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)
