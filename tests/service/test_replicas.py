"""The service as two replicas behind a real nginx on loopback (`envforge service serve --replicas 2`):
sessions spread over the replicas and each is served by its own; a tenant's quotas hold across
replicas; a replica killed with SIGKILL mid-episode loses its sessions clearly (410, `SessionLost`),
new sessions go to the live replica, and neither its quota leases nor its sandboxes leak."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from envforge.sandbox.engine import OWNER_LABEL
from envforge.service.client import EnvforgeClient, QuotaExceededError, RetryPolicy, SessionLost
from envforge.service.config import TenantLimits
from envforge.service.replicas import nginx_binary
from envforge.service.tenants import TenantStore, tenants_path
from tests.service.conftest import create_key, free_port

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _containers_of(docker_client, pid: int) -> list:
    owner = f"{socket.gethostname()}:{pid}"
    return docker_client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})


def _leases(settings) -> list[tuple]:
    with sqlite3.connect(tenants_path(settings)) as con:
        return con.execute("SELECT session_id, tenant FROM session_leases ORDER BY session_id").fetchall()


def _set_limits(settings, tenant: str, **limits) -> None:
    store = TenantStore(tenants_path(settings))
    try:
        store.upsert_tenant(tenant, None, TenantLimits(**limits))
    finally:
        store.close()


def _listed(url: str, key: str) -> set[str]:
    resp = httpx.get(url + "/sessions", headers={"X-API-Key": key}, timeout=30)
    assert resp.status_code == 200, resp.text
    return {s["session_id"] for s in resp.json()["sessions"]}


def _replica(session_id: str) -> str:
    return session_id.split(".", 1)[0]


@pytest.fixture
def replica_set(service_data):
    try:
        nginx_binary()
    except Exception as exc:  # the host-packages script installs it; say what is missing
        pytest.fail(str(exc))
    port = free_port()
    run_dir = service_data.settings.data_dir / "service" / "replicas"
    (run_dir / "replicas.json").unlink(missing_ok=True)
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(service_data.settings.data_dir), "ENVFORGE_SERVICE_MLFLOW": "false",
           "ENVFORGE_SERVICE_REAP_INTERVAL_S": "0.5", "ENVFORGE_SERVICE_POOL_IDLE": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "envforge.cli", "service", "serve", "--replicas", "2",
                             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not (run_dir / "replicas.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the replica set did not start:\n{proc.communicate()[0]}")
        time.sleep(0.3)
    state = json.loads((run_dir / "replicas.json").read_text())
    yield f"http://127.0.0.1:{port}", state, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, output
    assert "Traceback" not in output, output


def test_two_replicas_share_quotas_and_survive_one_killed_mid_episode(replica_set, service_data, docker_client):
    url, state, proc = replica_set
    pids = {r["name"]: r["pid"] for r in state["replicas"]}
    assert set(pids) == {"r0", "r1"} and all(r["alive"] for r in state["replicas"])
    key = create_key(service_data.settings, "spread", ["main"], max_sessions=2, steps_per_minute=5)
    with EnvforgeClient(url, key, retries=RetryPolicy.never()) as client:
        # New sessions go round-robin: the tenant's two sessions land on both replicas.
        first = client.create_session(task_set="main", index=1)
        second = client.create_session(task_set="main", index=1)
        assert {_replica(first.id), _replica(second.id)} == {"r0", "r1"}, (first.id, second.id)
        for _ in range(2):  # whichever replica answers lists the tenant's sessions on both
            assert _listed(url, key) == {first.id, second.id}
        # Each replica holds one session, yet the tenant's limit of 2 holds across both.
        with pytest.raises(QuotaExceededError) as over:
            client.create_session(task_set="main", index=1)
        assert over.value.code == "quota_exceeded" and "has 2 sessions open" in over.value.message
        # Steps per minute are counted across replicas too (5 in all, 3 on one and 2 on the other).
        first.step(name="run", arguments={"command": "echo kept > note.txt"})
        second.step(name="run", arguments={"command": "true"})
        assert first.step(name="run", arguments={"command": "cat note.txt"}).observation.text.endswith("kept\n")
        second.step(name="run", arguments={"command": "true"})
        first.step(name="run", arguments={"command": "true"})
        with pytest.raises(QuotaExceededError) as rate:
            second.step(name="run", arguments={"command": "true"})
        assert "made 5 steps in the last minute" in rate.value.message
        assert sorted(t for _, t in _leases(service_data.settings) if t == "spread") == ["spread", "spread"]

        # Kill the replica of the first session mid-episode.
        dead, live = _replica(first.id), _replica(second.id)
        assert _containers_of(docker_client, pids[dead]), "the session's sandbox belongs to its replica"
        os.kill(pids[dead], signal.SIGKILL)
        with pytest.raises(SessionLost) as lost:
            first.step(name="run", arguments={"command": "true"})
        assert lost.value.status == 410 and lost.value.code == "session_lost"
        assert "the replica of the service that held it is gone" in lost.value.message and first.id in lost.value.message
        assert httpx.get(f"{url}/sessions/{first.id}", headers={"X-API-Key": key}).status_code == 410
        assert _listed(url, key) == {second.id}

        # Its lease is freed (the tenant may open a second session again), new sessions go to the live
        # replica, and the live replica's reaper removes the dead one's sandboxes.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (_containers_of(docker_client, pids[dead])
                                               or any(s.startswith(dead + ".") for s, _ in _leases(service_data.settings))):
            time.sleep(0.5)
        assert _containers_of(docker_client, pids[dead]) == []
        assert [s for s, _ in _leases(service_data.settings) if s.startswith(dead + ".")] == []
        _set_limits(service_data.settings, "spread", max_sessions=2, steps_per_minute=600)  # read on every request
        replacement = [client.create_session(task_set="main", index=1)]
        assert _replica(replacement[0].id) == live
        assert replacement[0].step(name="run", arguments={"command": "echo again"}).observation.text.endswith("again\n")
        assert second.step(name="submit").done  # the live replica's session goes on to its verified end
        replacement[0].close()
        second.close()
        health = httpx.get(url + "/healthz").json()
        assert health["boot_id"].startswith(live + ".") and health["sessions_open"] == 0
    assert proc.poll() is None  # the set keeps serving with one replica
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    # A graceful stop leaves no lease and no sandbox of any replica.
    assert [s for s, _ in _leases(service_data.settings) if _replica(s) in pids] == []
    for pid in pids.values():
        assert _containers_of(docker_client, pid) == []
