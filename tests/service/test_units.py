"""Units of the environment service without sandboxes: keys, quotas, configuration, request models,
the recorder (real catalog and MLflow store), and the body-size cap."""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from envforge.catalog import Catalog
from envforge.errors import EnvforgeError
from envforge.service import models as m
from envforge.service.config import ServiceConfig, TenantLimits
from envforge.service.quotas import QuotaExceeded, QuotaTracker, seconds_to_utc_midnight
from envforge.service.recorder import SessionRecord, SessionRecorder
from envforge.service.tenants import TenantStore, tenants_path


@pytest.fixture
def store(settings):
    s = TenantStore(tenants_path(settings))
    yield s
    s.close()


def test_keys_are_stored_hashed_checked_and_revocable(store, settings):
    store.upsert_tenant("team-a", ["main"], TenantLimits(max_sessions=2))
    key, info = store.create_key("team-a", "ci")
    assert key.startswith(f"efk_{info.key_id}_")
    raw = tenants_path(settings).read_bytes() + (tenants_path(settings).with_suffix(".sqlite-wal").read_bytes()
                                                 if tenants_path(settings).with_suffix(".sqlite-wal").exists() else b"")
    assert key.split("_", 2)[2].encode() not in raw  # only the hash is on disk
    tenant = store.authenticate(key)
    assert tenant.name == "team-a" and tenant.task_sets == ("main",) and tenant.limits.max_sessions == 2
    assert tenant.may_use("main", "abc") and not tenant.may_use("other", "def")
    for wrong in ("", "efk_", key[:-1] + ("A" if key[-1] != "A" else "B"), key + "x", "Bearer " + key):
        assert store.authenticate(wrong) is None
    assert store.revoke(info.key_id) and not store.revoke(info.key_id)
    assert store.authenticate(key) is None
    assert store.keys("team-a")[0].revoked_at is not None
    with pytest.raises(EnvforgeError, match="no tenant"):
        store.create_key("nobody")
    with pytest.raises(EnvforgeError, match="tenant 'Bad Name'"):
        store.upsert_tenant("Bad Name")
    # Changing only the limits keeps the scopes.
    assert store.upsert_tenant("team-a", None, TenantLimits(max_sessions=5)).task_sets == ("main",)


def test_step_rate_is_a_sliding_window_with_retry_after(store):
    tenant = store.upsert_tenant("t", limits=TenantLimits(steps_per_minute=2))
    quotas = QuotaTracker(store)
    quotas.take_step(tenant, now=100.0)
    quotas.take_step(tenant, now=130.0)
    with pytest.raises(QuotaExceeded) as exc:
        quotas.take_step(tenant, now=131.0)
    assert exc.value.quota == "steps_per_minute" and exc.value.retry_after_s == 29
    quotas.take_step(tenant, now=160.5)  # the first step left the window


def test_sandbox_seconds_are_charged_persisted_and_refused_until_midnight(store):
    tenant = store.upsert_tenant("t", limits=TenantLimits(sandbox_seconds_per_day=10))
    quotas = QuotaTracker(store)
    quotas.charge("t", 6)
    quotas.check_sandbox_time(tenant)
    with pytest.raises(QuotaExceeded) as exc:
        quotas.check_sandbox_time(tenant, live_s=4.5)  # an open session's unflushed time counts
    assert exc.value.quota == "sandbox_seconds_per_day"
    assert abs(exc.value.retry_after_s - seconds_to_utc_midnight()) <= 2
    quotas.flush({"t": 1})
    assert store.usage("t") == pytest.approx(6)
    again = QuotaTracker(store)  # a restarted service knows what was used today
    assert again.used_today("t") == pytest.approx(6)
    with pytest.raises(QuotaExceeded):
        again.check_sessions(store.upsert_tenant("t", limits=TenantLimits(max_sessions=1)), open_now=1)


def test_configuration_reads_env_vars_and_names_bad_ones():
    cfg = ServiceConfig.from_env({"ENVFORGE_SERVICE_PORT": "9000", "ENVFORGE_SERVICE_IDLE_TIMEOUT_S": "30",
                                  "ENVFORGE_SERVICE_MLFLOW": "off"})
    assert cfg.port == 9000 and cfg.idle_timeout_s == 30 and cfg.mlflow is False
    with pytest.raises(EnvforgeError, match="ENVFORGE_SERVICE_PORT='eighty'"):
        ServiceConfig.from_env({"ENVFORGE_SERVICE_PORT": "eighty"})
    with pytest.raises(EnvforgeError, match="ENVFORGE_SERVICE_MLFLOW"):
        ServiceConfig.from_env({"ENVFORGE_SERVICE_MLFLOW": "maybe"})
    with pytest.raises(EnvforgeError, match="idle_timeout_s must be > 0"):
        ServiceConfig(idle_timeout_s=0)
    with pytest.raises(ValueError, match="max_sessions must be > 0"):
        TenantLimits(max_sessions=0)


def test_request_models_refuse_ambiguous_requests():
    with pytest.raises(ValidationError, match="name a task"):
        m.CreateSession()
    with pytest.raises(ValidationError, match="index needs task_set"):
        m.CreateSession(task_id="x", index=1)
    with pytest.raises(ValidationError):
        m.CreateSession(content_hash="not-a-hash")
    with pytest.raises(ValidationError, match="exactly one"):
        m.StepRequest(text="a", tool_call={"function": {"name": "run"}})
    with pytest.raises(ValidationError, match="exactly one"):
        m.StepRequest()
    assert m.StepRequest(tool_call={"id": "1", "function": {"name": "run", "arguments": {"command": "ls"}}})


def _record(i: int, tenant: str, reward: float | None) -> SessionRecord:
    now = time.time()
    return SessionRecord(f"boot-{i}", tenant, "inventory-median-even", "a" * 64, "b" * 64, 0, 3, 1, reward,
                         None if reward is None else reward == 1.0, "submitted" if reward is not None else "deleted",
                         1.5, now - 2, now)


def test_the_recorder_writes_batches_to_the_catalog_and_one_mlflow_run_each(settings):
    import mlflow

    recorder = SessionRecorder(settings, every_sessions=3, every_s=3600, boot_id="cafe0001")
    assert not recorder.add(_record(1, "team-a", 1.0)) and not recorder.add(_record(2, "team-b", 0.0))
    assert recorder.add(_record(3, "team-a", None))  # a batch is due
    run_id = recorder.flush()
    rows = Catalog(settings.catalog_path).service_sessions()
    assert rows.height == 3 and set(rows["mlflow_run_id"]) == {run_id}
    assert Catalog(settings.catalog_path).service_sessions("team-b")["reward"].to_list() == [0.0]
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    run = mlflow.get_run(run_id)
    assert run.data.metrics["sessions"] == 3 and run.data.metrics["sessions.team-a"] == 2
    assert run.data.metrics["mean_reward"] == 0.5 and run.data.metrics["ended.deleted"] == 1
    assert run.data.tags["envforge.stage"] == "service" and run.data.params["boot_id"] == "cafe0001"
    assert recorder.flush() is None  # nothing buffered


def test_the_body_cap_refuses_declared_and_streamed_bodies():
    from envforge.service.app import BodySizeLimit

    seen = {}

    async def app(scope, receive, send):
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        seen["body"] = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def call(headers, chunks):
        sent = []
        queue = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

        async def receive():
            return queue.pop(0)

        async def send(msg):
            sent.append(msg)

        await BodySizeLimit(app, 10)({"type": "http", "method": "POST", "headers": headers}, receive, send)
        return sent[0]["status"]

    assert asyncio.run(call([(b"content-length", b"11")], [b"x" * 11])) == 413
    assert asyncio.run(call([], [b"x" * 6, b"x" * 6])) == 413
    assert asyncio.run(call([], [b"x" * 5, b"x" * 5])) == 200 and seen["body"] == b"x" * 10


def test_keys_are_managed_from_the_cli(settings):
    import json

    from typer.testing import CliRunner

    from envforge.cli import app

    runner = CliRunner()
    base = ["--data-dir", str(settings.data_dir)]
    made = runner.invoke(app, ["service", "keys", "create", "--tenant", "team-x", "--task-set", "main",
                               "--max-sessions", "3", "--label", "ci", "--json", *base])
    assert made.exit_code == 0, made.output
    doc = json.loads(made.stdout)
    assert doc["key"].startswith("efk_") and doc["task_sets"] == ["main"] and doc["limits"]["max_sessions"] == 3
    listed = runner.invoke(app, ["service", "keys", "list", "--json", *base])
    assert doc["key"] not in listed.stdout
    assert json.loads(listed.stdout)["keys"][0]["key_id"] == doc["key_id"]
    assert runner.invoke(app, ["service", "keys", "revoke", doc["key_id"], *base]).exit_code == 0
    again = runner.invoke(app, ["service", "keys", "revoke", doc["key_id"], *base])
    assert again.exit_code == 64 and "no active key" in again.output
    bad = runner.invoke(app, ["service", "keys", "create", "--tenant", "Bad Name", *base])
    assert bad.exit_code == 64 and "tenant 'Bad Name'" in bad.output
    store = TenantStore(tenants_path(settings))
    assert store.authenticate(doc["key"]) is None
    store.close()


def test_the_service_picks_the_fleet_by_address_and_an_unreachable_one_fails_the_start(settings, monkeypatch):
    """The stages' rule: ENVFORGE_RAY_ADDRESS set means the fleet, joined at start-up, before any engine
    is touched (the fleet on a real cluster: tests/test_fleet.py)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this process already joined a Ray cluster (its dispatcher would be reused)")
    from fastapi.testclient import TestClient

    from envforge.fleet.config import FleetConfigError
    from envforge.service.app import create_app

    monkeypatch.setenv("ENVFORGE_RAY_ADDRESS", "127.0.0.1:9")
    with pytest.raises(FleetConfigError, match=r"ENVFORGE_RAY_ADDRESS=127.0.0.1:9: nothing answers"):
        with TestClient(create_app(settings, ServiceConfig(mlflow=False))):
            pass


def test_shared_quotas_hold_across_replicas_and_free_a_dead_replicas_leases(store):
    import socket
    import subprocess

    from envforge.service.shared_quotas import SharedQuotaState

    t0 = time.time()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs: a replica killed on this host
    a = SharedQuotaState(store.path, "r0.aaaa0000", ttl_s=30)
    b = SharedQuotaState(store.path, "r1.bbbb0000", ttl_s=30, owner=f"{socket.gethostname()}:{gone.pid}")
    elsewhere = None
    try:
        assert b.open_session("t", "r1.bbbb0000-1", limit=3, now=t0) == (True, 0)
        # b's process is gone: its lease is freed by the next count, and a learns that a peer died.
        assert a.open_session("t", "r0.aaaa0000-1", limit=3, now=t0) == (True, 0)
        assert a.take_peers_lost() == 1 and a.take_peers_lost() == 0
        elsewhere = SharedQuotaState(store.path, "r2.cccc0000", ttl_s=30, owner="other-host:1")
        assert elsewhere.open_session("t", "r2.cccc0000-1", limit=3, now=t0) == (True, 1)
        assert a.open_session("t", "r0.aaaa0000-2", limit=3, now=t0) == (True, 2)
        assert a.open_session("t", "r0.aaaa0000-3", limit=3, now=t0) == (False, 3)  # the limit holds across
        # A replica on another host is dead once it has not heart-beaten for the TTL ...
        a.heartbeat([("r0.aaaa0000-1", "t"), ("r0.aaaa0000-2", "t")], now=t0 + 100)
        assert a.open_session("t", "r0.aaaa0000-3", limit=3, now=t0 + 100) == (True, 2)
        # ... and one that was only stalled re-asserts its sessions' leases at its next heartbeat.
        elsewhere.heartbeat([("r2.cccc0000-1", "t")], now=t0 + 101)
        assert a.open_session("t", "r0.aaaa0000-4", limit=4, now=t0 + 101) == (False, 4)
        # Steps: one window for every replica, per tenant, by wall-clock second.
        assert a.take_step("t", 2, now=t0 + 200.2)[0] and elsewhere.take_step("t", 2, now=t0 + 201)[0]
        assert elsewhere.take_step("t", 2, now=t0 + 202) == (False, 2, int(t0 + 200.2) + 60.0)
        assert a.take_step("u", 2, now=t0 + 202)[0]  # another tenant's window
        a.close_session("r0.aaaa0000-1")
        a.retire()  # a graceful stop: its leases go
        rows = elsewhere._con.execute("SELECT session_id FROM session_leases ORDER BY session_id").fetchall()
        assert rows == [("r2.cccc0000-1",)]
    finally:
        for state in (a, b, elsewhere):
            if state is not None:
                state.close()
