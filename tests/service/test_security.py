"""Abuse and failure cases of the environment service: sandbox abuses stay contained while other
tenants keep being served; a service killed mid-session leaks no sandbox and its clients get a
clear "session lost"; idle sessions are reaped and their sandboxes returned to the pool."""

from __future__ import annotations

import signal
import socket
import threading
import time

import httpx
import pytest

from envforge.sandbox.engine import OWNER_LABEL
from envforge.service.client import EnvforgeClient, SessionLost
from tests.service.conftest import LiveServer

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_sandbox_abuses_stay_contained_and_others_are_served(live_server, service_data):
    url = live_server.url
    with EnvforgeClient(url, service_data.keys["team-a"]) as attacker, \
            EnvforgeClient(url, service_data.keys["team-b"]) as neighbour:
        abuse = attacker.create_session(task_set="main", index=0)  # inventory: 128 MiB workspace, 128 pids
        other = neighbour.create_session(task_set="main", index=1)
        try:
            results: dict[str, object] = {}

            def fork_bomb() -> None:
                results["bomb"] = abuse.step(name="run", arguments={
                    "command": "bomb() { bomb | bomb & }; bomb; sleep 6", "timeout_s": 6})

            thread = threading.Thread(target=fork_bomb)
            thread.start()
            time.sleep(1.0)
            served = []
            while thread.is_alive() and len(served) < 5:
                t0 = time.monotonic()
                out = other.step(name="run", arguments={"command": "echo still-here"})
                served.append(time.monotonic() - t0)
                assert out.observation.text.endswith("still-here\n")
            thread.join(60)
            assert served, "the neighbour got no step in while the fork bomb ran"
            assert max(served) < 5, served
            # The bomb hit the process limit instead of the host.
            bomb = results["bomb"]
            assert "fork" in bomb.observation.text.lower() or "resource" in bomb.observation.text.lower() or \
                bomb.observation.exit_code != 0

            fill = abuse.step(name="run", arguments={
                "command": "dd if=/dev/zero of=fill.bin bs=1M count=1024 2>&1 | grep -o 'No space left on device'; "
                           "df -m . | tail -n 1"})
            assert "No space left on device" in fill.observation.text and "100% /workspace" in fill.observation.text
            net = abuse.step(name="run", arguments={"command": (
                "python3 -c \"import socket; print(sorted(n for _, n in socket.if_nameindex()))\"; "
                "python3 -c \"import socket; socket.getaddrinfo('example.com', 80)\" 2>&1 | tail -n 1")})
            assert "['lo']" in net.observation.text and "gaierror" in net.observation.text
            # The abused session still answers (a tainted sandbox would be a clean "session lost").
            try:
                out = abuse.step(name="run", arguments={"command": "rm -f fill.bin; echo recovered"})
                assert out.observation.text.endswith("recovered\n")
            except SessionLost:
                pass
            assert other.step(name="submit").done
        finally:
            abuse.close()
            other.close()
    assert httpx.get(url + "/healthz").json()["status"] == "ok"


def _containers_of(docker_client, pid: int) -> list:
    owner = f"{socket.gethostname()}:{pid}"
    return docker_client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner}"})


def test_a_restart_loses_sessions_clearly_leaks_no_sandbox_and_idle_sessions_are_reaped(service_data, docker_client):
    env = {"ENVFORGE_SERVICE_IDLE_TIMEOUT_S": "2", "ENVFORGE_SERVICE_REAP_INTERVAL_S": "0.3"}
    first = LiveServer(service_data, env=env).start()
    try:
        client = EnvforgeClient(first.url, service_data.keys["team-b"])
        session = client.create_session(task_set="main", index=1)
        session.step(name="run", arguments={"command": "echo before > note.txt"})
        old_pid = first.proc.pid
        assert _containers_of(docker_client, old_pid), "the session's sandbox should belong to the server process"
        first.stop(signal.SIGKILL)
        with pytest.raises(Exception) as down:
            session.step(name="run", arguments={"command": "true"})
        assert "cannot reach the envforge service" in str(down.value)
        second = LiveServer(service_data, port=first.port, env=env).start()
    except BaseException:
        first.stop(signal.SIGKILL)
        raise
    try:
        with pytest.raises(SessionLost) as lost:
            session.step(name="run", arguments={"command": "cat note.txt"})
        assert lost.value.status == 410 and "the service restarted" in lost.value.message
        # The new instance removed the killed one's sandboxes when its pool started.
        assert _containers_of(docker_client, old_pid) == []
        # Idle sessions are reaped: their sandbox is reset and returned to the warm pool.
        idle = client.create_session(task_set="main", index=1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and httpx.get(second.url + "/healthz").json()["sessions_open"]:
            time.sleep(0.3)
        with pytest.raises(SessionLost) as reaped:
            idle.step(name="run", arguments={"command": "true"})
        assert "reaped after 2 s without a request" in reaped.value.message
        # Its sandbox (the only one this fresh instance started) was reset and kept warm.
        backend = httpx.get(second.url + "/healthz").json()["backend"]
        assert backend["idle_sandboxes"] == 1 and backend["resets"] >= 1
        client.close()
    finally:
        output = second.stop()
        assert "Traceback" not in output, output
    assert _containers_of(docker_client, second.proc.pid if second.proc else 0) == []
