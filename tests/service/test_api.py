"""The environment service end to end on loopback: a real `envforge service serve`, real sandboxes,
real grading, the catalog and MLflow. One module-scoped server; each test uses its own sessions."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from envforge.catalog import Catalog
from envforge.service.client import (AuthenticationError, EnvforgeClient, NotFoundError, QuotaExceededError,
                                     RequestTooLarge)

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_task_listing_is_scoped_to_the_tenant(live_server, service_data):
    with EnvforgeClient(live_server.url, service_data.keys["team-a"]) as a, \
            EnvforgeClient(live_server.url, service_data.keys["team-b"]) as b:
        assert [s.name for s in a.task_sets()] == ["main"]
        assert sorted(s.name for s in b.task_sets()) == ["main", "private"]
        listing = a.tasks("main")
        assert [t.task_id for t in listing.tasks] == ["inventory-median-even", "ops-service-config"]
        task = listing.tasks[0]
        assert task.instruction.startswith("The reorder report") and task.max_turns == 20
        assert task.limits.memory_mb == 512 and task.content_hash == service_data.tasks[task.task_id].content_hash
        assert {t.function.name for t in listing.tools} == {"run", "read_file", "write_file", "apply_patch", "submit"}
        assert "submit" in listing.system_prompt
        assert a.tasks(service_data.main_version[:8]).task_set.version == service_data.main_version
        # Another tenant's task set does not exist for this key (404, never 403).
        with pytest.raises(NotFoundError):
            a.tasks("private")
        with pytest.raises(NotFoundError):
            a.tasks(service_data.private_version)
        with pytest.raises(NotFoundError):
            a.create_session(task_set="private", index=0)
        with pytest.raises(NotFoundError):
            a.create_session(task_id="no-such-task")
        with pytest.raises(NotFoundError):
            a.create_session(task_set="main", index=7)


def test_an_episode_steps_verifies_and_is_recorded(live_server, service_data):
    patch = (service_data.tasks["inventory-median-even"].reference_patch or "")
    with EnvforgeClient(live_server.url, service_data.keys["team-a"]) as client:
        session = client.create_session(task_set="main", index=0, seed=7)
        assert session.info.task_id == "inventory-median-even" and session.info.seed == 7
        assert session.info.task_set_version == service_data.main_version
        assert "inventory/stats.py" in session.observation.text and not session.done
        out = session.step(name="run", arguments={"command": "python3 -m pytest -q tests 2>&1 | tail -n 1"})
        assert out.observation.exit_code == 0 and "failed" in out.observation.text and not out.done
        # Malformed actions are observations for the model, as in envforge's own rollouts.
        bad = session.step(text="I think I should look around first.")
        assert bad.observation.error and "no action found" in bad.observation.text and not bad.done
        bad = session.step(name="rm_rf", arguments={})
        assert "unknown tool" in bad.observation.text
        # The plain-text tool-call form works too.
        out = session.step(text='Reading.<tool_call>{"name": "read_file", "arguments": '
                                '{"path": "inventory/stats.py"}}</tool_call>')
        assert "def median" in out.observation.text
        out = session.step(name="apply_patch", arguments={"patch": patch})
        assert out.observation.text.startswith("patch applied")
        # Grade now, on a pristine copy: the episode goes on.
        mid = session.verify()
        assert mid.result.reward == 1.0 and mid.result.resolved and not mid.done
        out = session.step(tool_call={"id": "c9", "type": "function",
                                      "function": {"name": "submit", "arguments": "{}"}})
        assert out.done and out.end_reason == "submitted" and out.result.reward == 1.0
        assert out.result.tests["tests/test_stats.py::test_median_even_length"] == "passed"
        state = session.state()
        assert state.done and state.turn == 6 and state.result.reward == 1.0
        assert session.verify().done and session.verify().result.reward == 1.0
        with pytest.raises(Exception) as ended:
            session.step(name="run", arguments={"command": "true"})
        assert "has ended" in str(ended.value)
        closed = session.close()
        assert closed.turns == 6 and closed.reward == 1.0
        with pytest.raises(NotFoundError):
            session.state()
    catalog = Catalog(service_data.settings.catalog_path)
    deadline = time.monotonic() + 60
    rows = []
    while time.monotonic() < deadline:
        rows = [r for r in catalog.service_sessions("team-a").iter_rows(named=True)
                if r["session_id"] == session.id]
        if rows:
            break
        time.sleep(0.5)
    assert rows, "the finished session never reached the catalog"
    row = rows[0]
    assert row["turns"] == 6 and row["reward"] == 1.0 and row["resolved"] and row["end_reason"] == "submitted"
    assert row["task_set_version"] == service_data.main_version and row["seed"] == 7 and row["verifies"] == 2
    assert row["sandbox_seconds"] > 0 and row["mlflow_run_id"] is None  # MLflow is off for this server


def test_sessions_pin_a_task_version_by_content_hash(live_server, service_data):
    task = service_data.tasks["ops-service-config"]
    with EnvforgeClient(live_server.url, service_data.keys["team-b"]) as client:
        with client.create_session(content_hash=task.content_hash, max_turns=2) as session:
            assert session.info.task_id == task.id and session.info.max_turns == 2
            session.step(name="run", arguments={"command": "true"})
            out = session.step(name="run", arguments={"command": "true"})
            assert out.done and out.end_reason == "max_turns" and out.result.reward == 0.0
        with pytest.raises(NotFoundError):
            client.create_session(task_id=task.id, content_hash="0" * 64)


def test_keys_are_checked_on_every_request_and_revocation_is_immediate(live_server, service_data):
    from tests.service.conftest import create_key

    url = live_server.url
    assert httpx.get(url + "/task-sets").status_code == 401
    wrong = httpx.get(url + "/task-sets", headers=auth("efk_000000000000_" + "x" * 43))
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    assert wrong.headers["www-authenticate"] == "Bearer"
    assert httpx.get(url + "/task-sets", headers=auth("not a key")).status_code == 401
    key = create_key(service_data.settings, "revokee", ["main"])
    assert httpx.get(url + "/task-sets", headers={"X-API-Key": key}).status_code == 200
    with EnvforgeClient(url, key) as client:
        session = client.create_session(task_set="main", index=1)
        env = {"ENVFORGE_DATA_DIR": str(service_data.settings.data_dir)}
        listed = subprocess.run([sys.executable, "-m", "envforge.cli", "service", "keys", "list", "--json",
                                 "--tenant", "revokee"], capture_output=True, text=True, env=env, check=True)
        doc = json.loads(listed.stdout)
        assert key not in listed.stdout and doc["keys"][0]["revoked_at"] is None
        subprocess.run([sys.executable, "-m", "envforge.cli", "service", "keys", "revoke", doc["keys"][0]["key_id"]],
                       capture_output=True, text=True, env=env, check=True)
        with pytest.raises(AuthenticationError):
            session.step(name="run", arguments={"command": "true"})
        with pytest.raises(AuthenticationError):
            client.task_sets()


def test_another_tenants_session_is_not_found(live_server, service_data):
    with EnvforgeClient(live_server.url, service_data.keys["team-a"]) as a:
        with a.create_session(task_set="main", index=1) as mine:
            for method, path in (("GET", ""), ("POST", "/step"), ("POST", "/verify"), ("DELETE", "")):
                body = {"text": "<tool_call>{\"name\": \"submit\"}</tool_call>"} if path == "/step" else None
                resp = httpx.request(method, f"{live_server.url}/sessions/{mine.id}{path}", json=body,
                                     headers=auth(service_data.keys["team-b"]))
                assert resp.status_code == 404, (method, path, resp.text)
                assert resp.json()["error"]["code"] == "not_found"
            assert not mine.state().done  # untouched by the other tenant
            listed = httpx.get(live_server.url + "/sessions", headers=auth(service_data.keys["team-b"])).json()
            assert mine.id not in {s["session_id"] for s in listed["sessions"]}


def test_quotas_answer_429_with_retry_after(live_server, service_data):
    key = service_data.keys["tiny"]  # 1 session, 3 steps a minute
    with EnvforgeClient(live_server.url, key) as client:
        with client.create_session(task_set="main", index=1) as session:
            resp = httpx.post(live_server.url + "/sessions", json={"task_set": "main", "index": 1}, headers=auth(key))
            assert resp.status_code == 429 and resp.json()["error"]["code"] == "quota_exceeded"
            assert int(resp.headers["retry-after"]) >= 1
            for _ in range(3):
                session.step(name="run", arguments={"command": "true"})
            with pytest.raises(QuotaExceededError) as exc:
                session.step(name="run", arguments={"command": "true"})
            assert 1 <= exc.value.retry_after_s <= 60
    metrics = httpx.get(live_server.url + "/metrics").text
    assert 'envforge_service_quota_rejections_total{quota="sessions",tenant="tiny"} 1.0' in metrics
    assert 'envforge_service_quota_rejections_total{quota="steps_per_minute",tenant="tiny"} 1.0' in metrics


def test_oversized_requests_are_refused_with_413(live_server, service_data):
    with EnvforgeClient(live_server.url, service_data.keys["team-a"]) as client:
        with client.create_session(task_set="main", index=1) as session:
            with pytest.raises(RequestTooLarge):
                session.step(name="write_file", arguments={"path": "big.txt", "content": "x" * (1 << 20)})
            # Streamed without a declared length: counted as it arrives.
            def chunks():
                for _ in range(64):
                    yield b"x" * 16384

            resp = httpx.post(f"{live_server.url}/sessions/{session.id}/step", content=chunks(),
                              headers={**auth(service_data.keys["team-a"]), "content-type": "application/json"})
            assert resp.status_code == 413
            # An action under the request cap but over the action cap is the model's error, as in rollouts.
            out = session.step(name="write_file", arguments={"path": "big.txt", "content": "x" * 300_000})
            assert out.observation.error and "over the 262144-byte limit" in out.observation.text
            assert session.step(name="run", arguments={"command": "echo alive"}).observation.text.endswith("alive\n")


def test_health_and_metrics(live_server):
    health = httpx.get(live_server.url + "/healthz").json()
    assert health["status"] == "ok" and len(health["boot_id"]) == 8 and health["backend"]["backend"] == "local-pool"
    metrics = httpx.get(live_server.url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in ("envforge_service_request_seconds_bucket", "envforge_service_sessions_open",
                 "envforge_service_steps_total", "envforge_service_auth_failures_total"):
        assert name in metrics.text
    assert 'route="/sessions/{session_id}/step"' in metrics.text
    # and the process registry: the sandboxes, scheduler and graders behind the sessions (envforge.observe)
    for name in ("envforge_pool_idle_sandboxes", "envforge_pool_acquires_total", "envforge_verifier_grading_seconds"):
        assert name in metrics.text


def test_the_async_client_runs_concurrent_sessions(live_server, service_data):
    import asyncio

    from envforge.service.client import AsyncEnvforgeClient

    async def one(client, n: int) -> tuple[str, str, bool]:
        async with await client.create_session(task_set="main", index=1, seed=n) as session:
            await session.step(name="write_file", arguments={"path": f"note-{n}.txt", "content": str(n)})
            out = await session.step(name="run", arguments={"command": f"cat note-{n}.txt; echo; ls note-*"})
            state = await session.state()
            return session.id, out.observation.text, state.done

    async def main():
        async with AsyncEnvforgeClient(live_server.url, service_data.keys["team-b"]) as client:
            assert sorted(s.name for s in await client.task_sets()) == ["main", "private"]
            return await asyncio.gather(*(one(client, n) for n in range(3)))

    results = asyncio.run(main())
    assert len({sid for sid, _, _ in results}) == 3
    for n, (_, text, done) in enumerate(results):
        assert text == f"exit code: 0\nstdout:\n{n}\nnote-{n}.txt\n" and not done  # its own workspace only


def test_a_task_version_without_an_image_is_built_by_the_images_stage_and_recorded(settings, docker_client,
                                                                                    base_image):
    import asyncio

    from envforge.service.backend import SandboxBackend
    from envforge.sources.result import LoadResult
    from envforge.sources.specs import load_spec_file
    from tests.service.conftest import SERVED, SPECS

    task = load_spec_file(SPECS / SERVED[0] / "task.yaml")
    cat = Catalog(settings.catalog_path)
    cat.ingest(LoadResult(tasks=[task]))
    assert task.content_hash not in cat.latest_images()
    backend = SandboxBackend(settings, docker_client)
    try:
        image = asyncio.run(backend.image_for(task))
    finally:
        backend.close()
    assert cat.latest_images()[task.content_hash] == image and docker_client.images.get(image).tags


def test_the_service_registers_its_metrics_for_prometheus_while_it_serves(live_server, service_data):
    """`envforge service serve` writes its file_sd target (role env_service) under its data dir."""
    directory = service_data.settings.data_dir / "observe" / "targets"
    [target] = [json.loads(p.read_text())[0] for p in directory.glob("envforge-env_service-*.json")
                if json.loads(p.read_text())[0]["labels"]["pid"] == str(live_server.proc.pid)]
    assert target["targets"] == [f"127.0.0.1:{live_server.port}"]
    assert "envforge_service" in httpx.get(f"http://{target['targets'][0]}/metrics").text
