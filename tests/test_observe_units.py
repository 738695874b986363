"""Observability without sandboxes: the verdict's rules on constructed batches, JSON log lines and
their context across threads, metric hooks and label bounds, and the shipped Grafana dashboard
and alert rules checked against the real registry and Debian's promtool."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from envforge.observe import health, metrics
from envforge.observe.health import BOTH, HEALTHY, INFRA, POLICY, BatchFigures, HealthThresholds, judge
from envforge.observe.logs import CONTEXT_FIELDS, configure_logging, log_context
from envforge.rollout.health import batch_figures
from envforge.rollout.trajectory import DroppedGroup, Trajectory, Turn
from envforge.sandbox.container import run_blocking
from tests.conftest import REPO

OBSERVABILITY = REPO / "platform" / "deploy" / "observability"


def _traj(task: str, sample: int, reward: float, retries: int = 0, reset_s: float = 0.05,
          env_s: float = 0.02) -> Trajectory:
    t = Trajectory(batch_id="b", task_id=task, content_hash="h" + task, task_set_version="v", policy_id="p",
                   policy_version=0, sample_index=sample, seed=sample, instruction="")
    t.turns = [Turn(0, "", [], {"name": "submit"}, None, "submitted", 0, 0.0, env_s)]
    t.reward, t.resolved, t.infra_retries = reward, reward == 1.0, retries
    t.timings = {"reset_s": reset_s, "env_s": env_s}
    return t


def _batch(name: str, rewards: dict[str, list[float]], retried: set[str] = frozenset(), dropped: int = 0,
           **timing) -> BatchFigures:
    trajs = [_traj(task, n, r, 1 if task in retried else 0, **timing) for task, rs in rewards.items()
             for n, r in enumerate(rs)]
    groups = [DroppedGroup(name, f"gone-{i}", "retry budget exhausted", {0: 3, 1: 1}, [1]) for i in range(dropped)]
    return batch_figures(name, trajs, groups, n_tasks=len(rewards) + dropped)


SOLVED = {f"t{i}": [1.0, 1.0] for i in range(8)}


def test_the_same_batch_twice_is_healthy_and_a_first_batch_is_judged_on_its_own_fault_rate():
    assert judge(_batch("b2", SOLVED), _batch("b1", SOLVED)).verdict == HEALTHY
    first = judge(_batch("b1", SOLVED), None)
    assert first.verdict == HEALTHY and first.baseline_batch_id is None
    faulty = _batch("b1", SOLVED, retried={"t0", "t1", "t2", "t3", "t4"})  # 5 faults in 21 attempts
    verdict = judge(faulty, None)
    assert verdict.verdict == INFRA and "ceiling" in verdict.infra_findings[0]


def test_faults_on_some_tasks_are_an_infrastructure_anomaly_and_leave_the_policy_side_alone():
    # The retried tasks even lost reward: they are left out of the policy side, so this is no regression.
    rewards = {**SOLVED, "t0": [0.0, 0.0], "t1": [0.0, 1.0]}
    verdict = judge(_batch("b2", rewards, retried={"t0", "t1"}), _batch("b1", SOLVED))
    assert verdict.verdict == INFRA, verdict.summary()
    assert verdict.figures["shared_clean_tasks"] == 6
    assert verdict.figures["clean_reward"] == verdict.figures["clean_reward_baseline"] == 1.0
    assert any("fault rate" in f for f in verdict.infra_findings)


def test_a_dropped_group_or_a_slower_engine_is_an_infrastructure_anomaly():
    dropped = judge(_batch("b2", SOLVED, dropped=1), _batch("b1", SOLVED))
    assert dropped.verdict == INFRA and any("dropped groups" in f for f in dropped.infra_findings)
    assert dropped.figures["current"]["infra_faults"] == 3  # sample 0's three attempts; sample 1 finished
    slow = judge(_batch("b2", SOLVED, reset_s=0.6, env_s=0.3), _batch("b1", SOLVED))
    assert slow.verdict == INFRA and len(slow.infra_findings) == 2, slow.infra_findings
    # Twice as slow but only by 20 ms: under the noise floor.
    assert judge(_batch("b2", SOLVED, env_s=0.04), _batch("b1", SOLVED)).verdict == HEALTHY


def test_lower_reward_on_clean_tasks_is_a_policy_regression_and_with_faults_both():
    worse = {task: [1.0, 0.0] if i % 2 else [0.0, 1.0] for i, task in enumerate(SOLVED)}
    verdict = judge(_batch("b2", worse), _batch("b1", SOLVED))
    assert verdict.verdict == POLICY, verdict.summary()
    assert verdict.figures["clean_pass_at_1"] == 0.5 and verdict.figures["clean_pass_at_1_baseline"] == 1.0
    both = judge(_batch("b2", worse, retried={"t0"}), _batch("b1", SOLVED))
    assert both.verdict == BOTH and both.infra_findings and both.policy_findings
    # Too few shared clean tasks: the policy side is not judged.
    few = judge(_batch("b2", {"t0": [0.0]}), _batch("b1", {"t0": [1.0]}))
    assert few.verdict == HEALTHY and few.figures["policy_judged"] is False


def test_thresholds_are_checked_and_overridable_from_the_environment():
    with pytest.raises(ValueError, match="HealthThresholds.max_reward_drop: must be >= 0"):
        HealthThresholds(max_reward_drop=-1)
    th = health.thresholds_from_env({"ENVFORGE_HEALTH_MAX_REWARD_DROP": "0.5", "ENVFORGE_HEALTH_MIN_CLEAN_TASKS": "4",
                                     "ENVFORGE_HEALTH_MAX_PASS_AT_1_DROP": "1"})
    assert th.max_reward_drop == 0.5 and th.min_clean_tasks == 4 and th.max_fault_rate == 0.2
    with pytest.raises(ValueError, match="ENVFORGE_HEALTH_MAX_FAULT_RATE: expected a number, got 'lots'"):
        health.thresholds_from_env({"ENVFORGE_HEALTH_MAX_FAULT_RATE": "lots"})
    worse = {task: [0.5, 0.5] for task in SOLVED}
    assert judge(_batch("b2", worse), _batch("b1", SOLVED), th).verdict == HEALTHY  # a 0.5 drop is allowed now
    assert judge(_batch("b2", worse), _batch("b1", SOLVED)).verdict == POLICY


def test_json_log_lines_carry_the_context_ids_also_in_worker_threads():
    out = io.StringIO()
    handler = configure_logging(out)
    logger = logging.getLogger("envforge.test")
    try:
        async def episode() -> None:
            with log_context(batch_id="b1", trajectory_id="b1/t/0", task_id="t", mlflow_run_id=None):
                await run_blocking(logger.info, "in a sandbox thread", extra={"reward": 1.0})
            logger.info("outside")

        asyncio.run(episode())
    finally:
        logging.getLogger("envforge").removeHandler(handler)
    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    assert set(CONTEXT_FIELDS) <= set(inside)
    assert (inside["batch_id"], inside["trajectory_id"], inside["task_id"], inside["reward"]) == ("b1", "b1/t/0", "t", 1.0)
    assert inside["mlflow_run_id"] is None and inside["event"] == "in a sandbox thread"
    assert outside["trajectory_id"] is None


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_hooks_count_with_bounded_labels_and_do_nothing_when_switched_off():
    before = _value("envforge_verifier_gradings_total", {"outcome": "unresolved", "reason": "protected_path_modified"})
    metrics.graded(0.2, False, ["protected_path_modified:tests/test_x.py", "test_failed:t::a"])
    after = _value("envforge_verifier_gradings_total", {"outcome": "unresolved", "reason": "protected_path_modified"})
    assert after == before + 1  # the path is not a label value
    assert len(metrics.reason_kind("x" * 500)) == metrics.MAX_LABEL_CHARS
    metrics.set_enabled(False)
    try:
        metrics.graded(0.2, False, ["protected_path_modified:a"])
    finally:
        metrics.set_enabled(True)
    assert _value("envforge_verifier_gradings_total", {"outcome": "unresolved",
                                                        "reason": "protected_path_modified"}) == after
    names = {f.name for f in metrics.REGISTRY.collect()}
    assert all(re.fullmatch(r"envforge_[a-z_]+", n) for n in names)
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            assert not {"task_id", "trajectory_id", "container_id"} & set(sample.labels), sample


def _expr_metric_names(text: str) -> set[str]:
    return set(re.findall(r"\benvforge_[a-z_]+\b", text))


def test_the_dashboard_and_the_alert_rules_only_use_metrics_envforge_exposes():
    known = metrics.metric_names()
    dashboard = json.loads((OBSERVABILITY / "grafana-dashboard.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Sandbox pool", "Rollout scheduler", "Verifier and gate", "Training", "Sandbox fleet"]
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    used = _expr_metric_names(exprs) | _expr_metric_names((OBSERVABILITY / "envforge-alerts.yml").read_text())
    assert used and used <= known, sorted(used - known)


def test_promtool_accepts_the_alert_rules():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run platform/deploy/host-packages.sh (Debian's prometheus package)"
    proc = subprocess.run([promtool, "check", "rules", str(OBSERVABILITY / "envforge-alerts.yml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 15 rules found" in proc.stdout


def test_log_and_trace_settings_from_the_environment_are_checked(monkeypatch):
    from envforge.observe.logs import configure_logging_from_env
    from envforge.observe.traces import exporter_from_env

    monkeypatch.setenv("ENVFORGE_LOG_FORMAT", "yaml")
    with pytest.raises(ValueError, match="ENVFORGE_LOG_FORMAT: expected 'json' or 'text', got 'yaml'"):
        configure_logging_from_env()
    monkeypatch.setenv("ENVFORGE_TRACES", "jaeger")
    with pytest.raises(ValueError, match="ENVFORGE_TRACES: expected off, console or otlp, got 'jaeger'"):
        exporter_from_env()
    monkeypatch.setenv("ENVFORGE_TRACES", "off")
    assert exporter_from_env() is None


def test_spans_reach_an_otlp_http_receiver_when_configured(monkeypatch):
    """ENVFORGE_TRACES=otlp: the SDK's OTLP/HTTP exporter posts protobuf to OTEL_EXPORTER_OTLP_ENDPOINT
    (here a loopback receiver that decodes what it gets)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from envforge.observe import traces

    received: list[tuple[str, str, bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("ENVFORGE_TRACES", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    try:
        provider = traces.configure_tracing(traces.exporter_from_env())
        with traces.span("rollout.trajectory", **{"envforge.trajectory_id": "b/t/0"}):
            with traces.span("rollout.step", **{"envforge.turn": 0}):
                pass
        provider.force_flush()
    finally:
        traces.configure_tracing(None)
        server.shutdown()
    path, content_type, body = received[0]
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    request = ExportTraceServiceRequest.FromString(body)
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert {s.name for s in spans} == {"rollout.trajectory", "rollout.step"}
    step = next(s for s in spans if s.name == "rollout.step")
    assert step.parent_span_id == next(s for s in spans if s.name == "rollout.trajectory").span_id


def test_a_grpo_update_sets_the_training_metrics():
    """GRPOTrainer.step on a tiny model: the update's loss, tokens and reward land in the registry."""
    import torch

    from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model
    from envforge.train.grpo import GRPOConfig, GRPOTrainer
    from envforge.train.samples import TurnSample

    model, tokenizer = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, heads=2, kv_heads=1,
                                                        intermediate=64, seed=0))
    prompt = tokenizer.encode("hello there")
    samples = []
    for g in range(2):
        for i, reward in enumerate((0.0, 1.0)):
            completion = tokenizer.encode(" yes" if reward else " no")
            with torch.no_grad():
                logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].log_softmax(-1)
            lps = [float(logits[j, t]) for j, t in enumerate(completion)]
            samples.append(TurnSample(prompt_ids=prompt, completion_ids=completion, reward=reward,
                                      group_id=f"g{g}", trajectory_id=f"g{g}/{i}", behaviour_logprobs=lps))
    steps0 = _value("envforge_train_steps_total", {"algorithm": "grpo"})
    tokens0 = _value("envforge_train_tokens_total", {"algorithm": "grpo"})
    out = GRPOTrainer(model, GRPOConfig(lr=1e-3), tokenizer=tokenizer).step(samples)
    assert _value("envforge_train_steps_total", {"algorithm": "grpo"}) == steps0 + 1
    assert _value("envforge_train_tokens_total", {"algorithm": "grpo"}) == tokens0 + out["tokens"] > tokens0
    assert _value("envforge_train_loss", {"algorithm": "grpo"}) == out["loss"]
    assert _value("envforge_train_reward_mean", {"algorithm": "grpo"}) == out["reward_mean"] == 0.5


def register_batches(settings, root: Path, version: str = "v1") -> None:
    """Two real stores in the catalog on `version`: `before` solves 3 of 3 tasks, `after` 1 of 3."""
    from envforge.catalog import Catalog
    from envforge.rollout.store import TrajectoryStore

    for batch_id, rewards in (("before", [1.0, 1.0, 1.0]), ("after", [1.0, 0.0, 0.0])):
        store = TrajectoryStore(str(root), batch_id)
        store.ensure_manifest({"batch_id": batch_id, "tasks": ["t0", "t1", "t2"], "policy_id": "p"})
        for i, reward in enumerate(rewards):
            t = _traj(f"t{i}", 0, reward)
            t.batch_id, t.content_hash = batch_id, f"{i}" * 64
            store.write_group([t])
        Catalog(settings.catalog_path).record_rollout_batch({
            "batch_id": batch_id, "task_set_version": version, "policy_id": "p", "location": f"{root}/{batch_id}",
            "n_tasks": 3, "n_samples": 1, "n_trajectories": 3, "n_dropped_groups": 0, "pass_at_1": 0.0,
            "metrics_json": "{}"})


def test_the_dagster_check_judges_the_batch_the_run_materialized(settings, tmp_path):
    """`rollout_batch_health` on an ephemeral instance: the materialized batch against the one registered
    before it on the same task-set version (stores and catalog are real files)."""
    import dagster as dg

    from assets.defs.resources import default_resources
    from assets.defs.rollouts.assets import rollout_batch
    from assets.defs.rollouts.checks import rollout_batch_health

    register_batches(settings, tmp_path / "rollouts")
    instance = dg.DagsterInstance.ephemeral()
    instance.report_runless_asset_event(dg.AssetMaterialization("rollout_batch", metadata={"batch_id": "after"}))
    result = dg.materialize([rollout_batch, rollout_batch_health], instance=instance,
                            resources=default_resources(settings),
                            selection=dg.AssetSelection.checks(rollout_batch_health))
    [evaluation] = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN
    assert evaluation.metadata["verdict"].value == POLICY
    assert evaluation.metadata["baseline_batch_id"].value == "before"
    assert evaluation.metadata["figures"].value["clean_pass_at_1"] == round(1 / 3, 4)


def test_a_run_serves_its_metrics_while_it_runs_when_a_port_is_set(monkeypatch, tmp_path):
    import urllib.error
    import urllib.request

    from envforge.observe.http import metrics_server_from_env

    monkeypatch.setenv("ENVFORGE_METRICS_TARGETS_DIR", str(tmp_path / "targets"))
    monkeypatch.delenv("ENVFORGE_METRICS_PORT", raising=False)
    with metrics_server_from_env() as none:
        assert none is None
    monkeypatch.setenv("ENVFORGE_METRICS_PORT", "0")
    with metrics_server_from_env("rollout", labels={"dagster_run_id": "r1"}) as server:
        with metrics_server_from_env("a stage inside it") as inner:
            assert inner is server  # one server per process
        [target] = (tmp_path / "targets").glob("*.json")  # registered for Prometheus' file_sd
        [group] = json.loads(target.read_text())
        assert group["targets"] == [f"127.0.0.1:{server.port}"]
        assert {k: group["labels"][k] for k in ("role", "stage", "dagster_run_id")} == {
            "role": "run", "stage": "rollout", "dagster_run_id": "r1"}
        metrics.group_dropped()
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            body = resp.read().decode()
        assert "envforge_scheduler_dropped_groups_total" in body and "envforge_pool_idle_sandboxes" in body
        monkeypatch.setenv("ENVFORGE_METRICS_PORT", str(server.port))
        import envforge.observe.http as http

        held, http._active = http._active, None  # as if another process held the port
        try:
            with metrics_server_from_env("a second run") as taken:
                assert taken is None  # the run goes on without its own server
        finally:
            http._active = held
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url, timeout=5)  # gone with the run
    assert not list((tmp_path / "targets").glob("*.json"))  # and so is its target
    monkeypatch.setenv("ENVFORGE_METRICS_PORT", "ninety")
    with pytest.raises(ValueError, match=r"ENVFORGE_METRICS_PORT: expected a port number \(0: a free one\) or 'off', "
                                         "got 'ninety'"):
        with metrics_server_from_env():
            pass
    monkeypatch.setenv("ENVFORGE_METRICS_PORT", "70000")
    with pytest.raises(ValueError, match="ENVFORGE_METRICS_PORT: 70000 is not a port"):
        with metrics_server_from_env():
            pass
    monkeypatch.setenv("ENVFORGE_METRICS_PORT", "off")
    with metrics_server_from_env("a Dagster stage", default_port=0) as off:
        assert off is None  # 'off' beats a Dagster run's default of a free port
    monkeypatch.delenv("ENVFORGE_METRICS_PORT")
    with metrics_server_from_env("a Dagster stage", default_port=0) as dagster_default:
        assert dagster_default is not None and dagster_default.port > 0


_REGISTER_AND_DIE = """
import os, sys
from pathlib import Path
from envforge.observe.discovery import register
register("run", "127.0.0.1", int(sys.argv[2]), {"stage": "x"}, Path(sys.argv[1]))
if sys.argv[3] == "killed":
    os._exit(0)  # no atexit: as if SIGKILLed
"""


def test_target_files_are_written_whole_removed_at_exit_and_pruned_when_their_process_died(tmp_path):
    import os
    import socket
    import sys

    from envforge.observe.discovery import prometheus_config, prune, register

    targets = tmp_path / "targets"
    for how, port in (("exits", "9101"), ("killed", "9102")):
        subprocess.run([sys.executable, "-c", _REGISTER_AND_DIE, str(targets), port, how], check=True, timeout=120)
    [left] = [p.name for p in targets.glob("*.json")]  # the clean exit removed its own file
    assert left.startswith("envforge-run-") and left.endswith("-9102.json")
    elsewhere = targets / "envforge-run-otherhost-1-9103.json"  # another host's: not ours to judge
    elsewhere.write_text(json.dumps([{"targets": ["otherhost:9103"], "labels": {"hostname": "otherhost", "pid": "1"}}]))
    reused = targets / f"envforge-run-{socket.gethostname()}-{os.getpid()}-9104.json"  # our pid, an older process
    reused.write_text(json.dumps([{"targets": ["127.0.0.1:9104"], "labels": {
        "hostname": socket.gethostname(), "pid": str(os.getpid()), "__process_started": "1"}}]))
    (targets / "envforge-garbage.json").write_text("{not json")
    mine = register("policy_server", "0.0.0.0", 9105, directory=targets)  # registering prunes first
    names = sorted(p.name for p in targets.glob("*.json"))
    assert names == sorted([elsewhere.name, "envforge-garbage.json", mine.path.name]), names
    [group] = json.loads(mine.path.read_text())
    assert group["targets"] == [f"{socket.getfqdn()}:9105"]  # a wildcard bind is advertised by host name
    assert not list(targets.glob(".*"))  # the temporary file was renamed into place
    assert prune(targets) == []  # a live process's file stays
    mine.remove()
    mine.remove()  # twice is fine (close, then exit)
    assert not mine.path.exists()
    with pytest.raises(ValueError, match="metrics target role 'trainer'"):
        register("trainer", "127.0.0.1", 1, directory=targets)
    # the shipped config is the generated one for the repository's default data dir, and promtool takes it
    import yaml

    shipped = OBSERVABILITY / "prometheus.yml"
    assert yaml.safe_load(shipped.read_text()) == prometheus_config("../../../.envforge/observe/targets",
                                                                     "envforge-alerts.yml")
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run platform/deploy/host-packages.sh (Debian's prometheus package)"
    proc = subprocess.run([promtool, "check", "config", str(shipped)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "15 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_the_cli_writes_a_prometheus_config_for_a_data_dir_and_lists_its_targets(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from envforge.cli import app
    from envforge.observe.discovery import register

    monkeypatch.delenv("ENVFORGE_METRICS_TARGETS_DIR", raising=False)
    data = tmp_path / "data"
    out = CliRunner().invoke(app, ["observe", "prometheus-config", "--data-dir", str(data)])
    assert out.exit_code == 0, out.output
    config = json.loads(out.stdout)
    assert config["scrape_configs"][0]["file_sd_configs"][0]["files"] == [f"{data.resolve()}/observe/targets/*.json"]
    (tmp_path / "p.yml").write_text(out.stdout)
    proc = subprocess.run([shutil.which("promtool"), "check", "config", str(tmp_path / "p.yml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    target = register("env_service", "127.0.0.1", 9106, directory=data.resolve() / "observe" / "targets")
    try:
        out = CliRunner().invoke(app, ["observe", "targets", "--data-dir", str(data)])
        assert out.exit_code == 0 and "127.0.0.1:9106" in out.stdout and "'env_service'" in out.stdout, out.output
    finally:
        target.remove()


def test_sft_steps_set_the_training_metrics_under_their_own_label():
    """train_sft on a tiny model: every step lands in the registry as algorithm=sft (GRPO's stay apart)."""
    from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model
    from envforge.train.samples import TurnSample
    from envforge.train.sft import SFTConfig, train_sft

    model, tokenizer = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1, heads=2, kv_heads=1,
                                                        intermediate=64, seed=0))
    samples = [TurnSample(prompt_ids=tokenizer.encode(f"say {w}"), completion_ids=tokenizer.encode(f" {w}"))
               for w in ("yes", "no", "maybe")]
    before = {k: _value(f"envforge_train_{k}", {"algorithm": "sft"}) for k in ("steps_total", "tokens_total",
                                                                              "step_seconds_count")}
    grpo_steps = _value("envforge_train_steps_total", {"algorithm": "grpo"})
    result = train_sft(model, samples, samples[:1], SFTConfig(lr=1e-3, epochs=2, micro_batch_size=3, eval_every=2))
    assert _value("envforge_train_steps_total", {"algorithm": "sft"}) == before["steps_total"] + len(result.losses) == \
        before["steps_total"] + 2
    assert _value("envforge_train_tokens_total", {"algorithm": "sft"}) == before["tokens_total"] + result.train_tokens
    assert _value("envforge_train_step_seconds_count", {"algorithm": "sft"}) == before["step_seconds_count"] + 2
    assert _value("envforge_train_loss", {"algorithm": "sft"}) == result.losses[-1]
    assert _value("envforge_train_eval_loss", {"algorithm": "sft"}) == result.eval_losses[-1][1]
    assert _value("envforge_train_tokens_per_second", {"algorithm": "sft"}) > 0
    assert _value("envforge_train_steps_total", {"algorithm": "grpo"}) == grpo_steps
    with pytest.raises(ValueError, match="training algorithm label 'ppo'"):
        metrics.train_step({}, "ppo")


def test_a_stage_in_a_dagster_run_serves_on_a_free_port_registered_in_its_data_dir(settings, monkeypatch):
    """No ENVFORGE_METRICS_PORT: a real (in-process) Dagster run of a spec source's ingest serves its
    metrics on a free port, registered under the run's data dir (the resources' settings) with the
    run id as a label, and the registration is gone when the run ends."""
    import dagster as dg

    from assets.defs.resources import default_resources
    from assets.defs.sources.assets import source_assets
    from envforge.sources import discover_sources

    monkeypatch.delenv("ENVFORGE_METRICS_PORT", raising=False)
    monkeypatch.delenv("ENVFORGE_METRICS_TARGETS_DIR", raising=False)
    refs, _ = discover_sources([REPO / "task_sources" / "specs"])
    ref = refs[0]
    key = ref.key(REPO / "task_sources")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("spec_sources", [key])
    asset = next(a for a in source_assets if a.key.to_user_string() == "spec_tasks")
    out = io.StringIO()
    handler = configure_logging(out)
    try:
        result = dg.materialize([asset], partition_key=key, instance=instance, resources=default_resources(settings))
    finally:
        logging.getLogger("envforge").removeHandler(handler)
    assert result.success
    [registered] = [d for d in map(json.loads, out.getvalue().splitlines()) if d["event"].startswith("metrics target")]
    target = Path(registered["metrics_target"])
    assert target.parent == settings.data_dir / "observe" / "targets"
    assert registered["dagster_run_id"] == result.run_id and target.name.startswith("envforge-run-")
    assert not target.exists()  # removed when the stage ended


def test_the_policy_server_on_port_0_is_found_through_its_target_and_unregisters_on_sigterm(tmp_path):
    """`envforge policy serve --port 0` (the tiny model) picks a free port, registers it (role
    policy_server), serves /metrics there, and takes the registration away when stopped."""
    import os
    import sys
    import time
    import urllib.request

    from envforge.rollout.policies.tiny import build_tiny_model
    from envforge.train.checkpoint import save_checkpoint

    model, tok = build_tiny_model()
    start = save_checkpoint(tmp_path / "ckpt", model, tok)
    targets = tmp_path / "targets"
    env = {**os.environ, "ENVFORGE_METRICS_TARGETS_DIR": str(targets)}
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    server = subprocess.Popen([envforge, "policy", "serve", str(start), "--port", "0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            found = [json.loads(p.read_text())[0] for p in targets.glob("envforge-policy_server-*.json")]
            body = ""
            if found:
                try:
                    body = urllib.request.urlopen(f"http://{found[0]['targets'][0]}/metrics", timeout=2).read().decode()
                except OSError:
                    pass
            if "envforge_policy_request_seconds" in body:
                break
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()[-2000:]
            time.sleep(0.5)
        assert found[0]["labels"]["role"] == "policy_server" and found[0]["labels"]["pid"] == str(server.pid)
    finally:
        server.terminate()
        server.wait(60)
    assert not list(targets.glob("*.json"))
