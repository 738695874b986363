"""The warm pool and fault classification on the real engine, including a dockerd restart."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time

import pytest

from envforge.errors import InfraError
from envforge.sandbox.container import Sandbox, SandboxOptions
from envforge.sandbox.engine import MANAGED_LABEL, OWNER_LABEL, remove_orphans
from envforge.sandbox.pool import SandboxPool
from envforge.task import Limits
from tests.conftest import REPO

pytestmark = pytest.mark.docker


def test_acquire_release_reuses_and_resets(docker_client, task_image):
    with SandboxPool(docker_client, max_idle_per_key=2) as pool:
        assert pool.preheat(task_image, count=2) == 2
        sb = pool.acquire(task_image)
        first_id = sb.id
        sb.exec("echo dirty > dirty.txt && rm -rf tests && (sleep 100 &)")
        pool.release(sb)
        again = pool.acquire(task_image)
        other = pool.acquire(task_image)
        assert first_id in (again.id, other.id)  # reused, not recreated
        for s in (again, other):
            assert s.exec("test -e dirty.txt || echo clean; test -d tests && echo tests").text() == "clean\ntests\n"
        pool.release(again)
        pool.release(other)
        stats = pool.stats.as_dict()
        assert stats["hits"] == 3 and stats["misses"] == 0 and stats["started"] == 2
        assert stats["resets"] == 3 and stats["reset_p50_ms"] is not None
    assert docker_client.containers.list(all=True, filters={"id": first_id}) == []  # close() destroyed idle ones


def test_options_are_part_of_the_pool_key(docker_client, task_image):
    small = SandboxOptions(limits=Limits(memory_mb=256, workspace_mb=32, tmp_mb=16))
    with SandboxPool(docker_client) as pool:
        a = pool.acquire(task_image, small)
        pool.release(a)
        b = pool.acquire(task_image)  # default options: must not get the small one
        assert b.id != a.id and b.options == SandboxOptions()
        pool.release(b)
        assert pool.acquire(task_image, small).id == a.id


def test_tainted_sandboxes_are_destroyed(docker_client, task_image):
    opts = SandboxOptions(limits=Limits(memory_mb=256, workspace_mb=32, tmp_mb=16))
    with SandboxPool(docker_client) as pool:
        sb = pool.acquire(task_image, opts)
        res = sb.exec("python3 -c \"x = bytearray(600 * 1024 * 1024)\"", timeout_s=60)
        assert res.oom_killed
        pool.release(sb)
        assert pool.idle_count() == 0 and pool.stats.destroyed_reasons == {"oom": 1}


def test_container_killed_mid_command_is_an_infra_fault_and_replaced(docker_client, task_image):
    with SandboxPool(docker_client) as pool:
        sb = pool.acquire(task_image)
        killer = threading.Timer(1.0, lambda: docker_client.api.kill(sb.id))
        killer.start()
        with pytest.raises(InfraError) as info:
            sb.exec("sleep 30", timeout_s=60)
        killer.join()
        assert info.value.cause in ("agent_died", "container_not_running", "container_vanished")
        assert sb.tainted
        pool.release(sb)
        assert pool.stats.destroyed == 1
        fresh = pool.acquire(task_image)
        assert fresh.id != sb.id and fresh.exec("echo ok").text() == "ok\n"
        pool.release(fresh)


def test_concurrent_async_use_caps_starts(docker_client, task_image):
    async def scenario(pool: SandboxPool) -> list[str]:
        async def one(i: int) -> str:
            sb = await pool.aacquire(task_image)
            try:
                return (await sb.aexec(f"echo {i}")).text().strip()
            finally:
                await pool.arelease(sb)

        return await asyncio.gather(*(one(i) for i in range(6)))

    with SandboxPool(docker_client, max_starting=2) as pool:
        assert asyncio.run(scenario(pool)) == [str(i) for i in range(6)]
        assert pool.stats.started <= 6 and pool.stats.start_failures == 0


def test_orphans_of_dead_owners_are_removed(docker_client, task_image):
    host = __import__("socket").gethostname()
    run = lambda labels, cmd=("sleep", "600"): docker_client.containers.run(  # noqa: E731
        task_image, list(cmd), detach=True, network_mode="none", labels={MANAGED_LABEL: "1", **labels})
    other_host = run({OWNER_LABEL: "some-other-host-or:999999"})
    dead_owner = run({OWNER_LABEL: f"{host}:999999"})
    dead_owner_exited = run({OWNER_LABEL: f"{host}:999999"}, ("true",))
    live_owner_exited = run({OWNER_LABEL: f"{host}:{__import__('os').getpid()}"}, ("true",))
    build_container = run({})  # image builds inherit the managed label but carry no owner
    for c in (dead_owner_exited, live_owner_exited):
        c.wait()
    try:
        remove_orphans(docker_client)
        remaining = {c.id for c in docker_client.containers.list(all=True, filters={"label": MANAGED_LABEL})}
        assert dead_owner.id not in remaining and dead_owner_exited.id not in remaining
        assert other_host.id in remaining  # another host's container is not ours to judge
        assert live_owner_exited.id in remaining  # a live process's containers are its own, in any state
        assert build_container.id in remaining  # never a build's container
    finally:
        for c in (other_host, live_owner_exited, build_container):
            c.remove(force=True)


def test_pool_survives_a_dockerd_restart(docker_client, task_image):
    with SandboxPool(docker_client, max_idle_per_key=2) as pool:
        pool.preheat(task_image, count=2)
        before = {sb.id for q in pool._idle.values() for sb in q}
        subprocess.run(["pkill", "-9", "-x", "dockerd"], check=True)
        time.sleep(1)
        proc = subprocess.run([str(REPO / "platform" / "deploy" / "docker-engine.sh")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        sb = pool.acquire(task_image)  # the idle ones died with the daemon: a new one is started
        assert sb.exec("echo back").text() == "back\n"
        pool.release(sb)
        assert pool.stats.unhealthy_idle >= 1 and pool.stats.started >= 3
    # The dead sandboxes were cleaned up, not left behind as 'Exited' containers.
    remaining = {c.id for c in docker_client.containers.list(all=True, filters={"label": MANAGED_LABEL})}
    assert not (before & remaining)
