"""Sandbox admission by the CPUs' room (sandbox/admission.py): the floor always, more only while the
host was under the busy threshold, one per settle interval, never past the ceiling."""

from __future__ import annotations

import threading

import pytest

from envforge.sandbox.admission import AdmittedPool, CpuAdmission, admission_for, cpu_times


class Host:
    """A fake clock and /proc/stat: `load` is the share of CPU time in use since the last sample."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy = 0
        self.total = 0
        self.load = 0.0
        self.free_mb: int | None = 16_000

    def sample(self) -> tuple[int, int]:
        return self.busy, self.total

    def tick(self, seconds: float) -> None:
        self.now += seconds
        jiffies = int(seconds * 100 * 2)  # two CPUs
        self.total += jiffies
        self.busy += int(jiffies * self.load)


def admission(host: Host, floor: int = 2, ceiling: int = 5) -> CpuAdmission:
    return CpuAdmission(floor=floor, ceiling=ceiling, sample=host.sample, free_mb=lambda: host.free_mb,
                        clock=lambda: host.now)


def test_the_floor_is_always_admitted_and_more_only_while_the_cpus_have_room():
    host = Host()
    gate = admission(host)
    host.load = 1.0
    assert gate._admit() and gate._admit()  # below the floor: whatever the load
    gate.active = 2
    host.tick(5)
    assert not gate._admit()  # busy: nothing beyond the floor
    host.load = 0.3
    host.tick(5)
    assert gate._admit() and gate.beyond_floor == 1
    gate.active = 3
    assert not gate._admit()  # one per settle interval: the last one's load must show first
    host.tick(0.5)
    assert not gate._admit()
    host.tick(1)
    assert gate._admit()
    gate.active = 5
    host.tick(5)
    assert not gate._admit()  # the ceiling holds whatever the load


def test_low_memory_or_an_unreadable_host_admits_only_the_floor():
    host = Host()
    gate = admission(host)
    gate.active = 2
    host.load, host.free_mb = 0.1, 1000
    host.tick(5)
    assert not gate._admit()
    blind = CpuAdmission(floor=1, ceiling=4, sample=lambda: None, free_mb=lambda: None, clock=lambda: host.now)
    blind.active = 1
    host.tick(5)
    assert not blind._admit()
    with pytest.raises(ValueError, match="floor <= ceiling"):
        CpuAdmission(floor=3, ceiling=2)


def test_acquire_waits_for_a_slot_and_release_wakes_it():
    host = Host()
    host.load = 1.0
    gate = admission(host, floor=1, ceiling=1)
    gate.acquire()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (gate.acquire(), got.set()))
    waiter.start()
    assert not got.wait(0.3)
    gate.release()
    assert got.wait(5)
    waiter.join()
    assert gate.active == 1 and gate.peak == 1


def test_the_admitted_pool_gives_the_slot_back_whatever_happens():
    class Pool:
        client = "engine"

        def acquire(self, image, options=None):
            if image == "broken":
                raise RuntimeError("no engine")
            return f"sandbox-of-{image}"

        def release(self, sandbox):
            raise RuntimeError("reset failed")

    gate = CpuAdmission(floor=1, ceiling=1)
    pool = AdmittedPool(Pool(), gate)
    assert pool.client == "engine"  # the rest of the pool's face is the pool's
    with pytest.raises(RuntimeError, match="no engine"):
        pool.acquire("broken")
    assert gate.active == 0
    sandbox = pool.acquire("img")
    assert gate.active == 1
    with pytest.raises(RuntimeError, match="reset failed"):
        pool.release(sandbox)
    assert gate.active == 0


def test_the_ceiling_comes_from_the_settings_and_never_undercuts_the_floor(monkeypatch):
    monkeypatch.setenv("ENVFORGE_SANDBOX_CEILING", "3")
    assert (admission_for(2).floor, admission_for(2).ceiling) == (2, 3)
    assert admission_for(6).ceiling == 6
    monkeypatch.setenv("ENVFORGE_SANDBOX_CEILING", "0")
    assert admission_for(2).ceiling >= 4  # four per core
    busy, total = cpu_times() or (0, 1)
    assert 0 <= busy <= total


@pytest.mark.docker
def test_sandboxes_that_wait_are_admitted_past_the_floor_on_a_real_engine(docker_client, base_image):
    """Four sandboxes of the base image whose command sleeps: the CPUs stay idle, so admission lets more
    than the floor of one run at once (read from the real /proc/stat), and never more than the ceiling."""
    from envforge.sandbox.pool import SandboxPool

    gate = CpuAdmission(floor=1, ceiling=3, settle_s=0.5)
    with SandboxPool(docker_client, max_idle_per_key=4) as raw:
        pool = AdmittedPool(raw, gate)

        def one(_: int) -> int:
            sandbox = pool.acquire(base_image)
            try:
                return sandbox.exec("sleep 4", timeout_s=30).exit_code
            finally:
                pool.release(sandbox)

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=4) as ex:
            assert list(ex.map(one, range(4))) == [0, 0, 0, 0]
    assert 2 <= gate.peak <= 3 and gate.beyond_floor >= 1 and gate.active == 0
