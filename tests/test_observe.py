"""Observability on the real thing: Debian's Prometheus scrapes a real rollout's /metrics, one
trajectory is followed through its spans (scheduler -> container -> grade) and its JSON log lines,
and the infra-vs-policy verdict is proven on the real engine: containers killed mid-batch ->
infrastructure anomaly with clean-task reward unchanged, and so is an engine slowed by a proxy on its
socket; a replay policy that drops its solution
half the time -> policy regression; both at once -> both."""

from __future__ import annotations

import io
import json
import subprocess
import logging
import random
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.observe import metrics as live
from envforge.observe.health import BOTH, HEALTHY, INFRA, POLICY
from envforge.rollout.health import batch_verdict, judge_stores, round_health
from envforge.observe.http import MetricsServer
from envforge.observe.logs import configure_logging
from envforge.observe.traces import configure_tracing
from envforge.rollout.batch import run_batch
from envforge.rollout.policies.replay import ReplayPolicy
from envforge.rollout.scheduler import RolloutConfig
from envforge.sandbox.engine import OWNER_LABEL, owner_id
from envforge.sandbox.images import build_task_image
from envforge.sources import load_sources
from tests.conftest import REPO
from tests.prometheus import query as _query, running_prometheus

pytestmark = pytest.mark.docker
SOURCES = [REPO / "task_sources" / "specs", REPO / "task_sources" / "runbooks"]
CONFIG = RolloutConfig(n_samples=2, concurrency=4, seed=7)


@pytest.fixture(scope="module")
def items(docker_client, base_image, tmp_path_factory):
    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("observe-images"))
    tasks = [t for r in load_sources(SOURCES).values() for t in r.tasks]
    return [(t, build_task_image(docker_client, t, base_image, settings).tag) for t in tasks]


@pytest.fixture(scope="module")
def batches(items, docker_client, tmp_path_factory):
    """One settings (one catalog) for the verdict tests, and the healthy baseline batch in it."""
    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("observe-data"))
    settings.ensure_dirs()
    baseline = run_batch(settings, items, ReplayPolicy(), CONFIG, "v-observe", batch_id="baseline",
                         client=docker_client, register=Catalog(settings.catalog_path).record_rollout_batch)
    assert baseline.metrics["pass_at_1"] == 1.0 and baseline.report.infra_retries == 0
    return settings, baseline


@pytest.fixture
def prometheus(tmp_path):
    """Prometheus on a random loopback port scraping this process's registry (a static target)."""
    server = MetricsServer(0)
    try:
        with running_prometheus(tmp_path / "prometheus", {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(REPO / "platform" / "deploy" / "observability" / "envforge-alerts.yml")],
            "scrape_configs": [{"job_name": "envforge-rollout",
                                "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}]}],
        }) as base:
            yield base
    finally:
        server.close()


def test_prometheus_scrapes_a_real_rollout_and_one_trajectory_is_followed_end_to_end(items, settings, docker_client,
                                                                                      prometheus):
    exporter = InMemorySpanExporter()
    provider = configure_tracing(exporter, batch=False)
    out = io.StringIO()
    handler = configure_logging(out)
    from envforge.observe.logs import log_context
    try:
        with log_context(dagster_run_id="dagster-run-1", mlflow_run_id="mlflow-run-1"):
            result = run_batch(settings, items[:4], ReplayPolicy(), RolloutConfig(n_samples=2, concurrency=4),
                               "v-prom", batch_id="prom", client=docker_client)
    finally:
        logging.getLogger("envforge").removeHandler(handler)
        configure_tracing(None)
    assert result.metrics["trajectories"] == 8

    # Prometheus: the run's series, scraped over HTTP (the counters are process-wide: compare with >=).
    deadline = time.monotonic() + 30
    while True:
        got = _query(prometheus, 'sum(envforge_scheduler_trajectories_total{job="envforge-rollout"})')
        if got and float(got[0]["value"][1]) >= 8:
            break
        assert time.monotonic() < deadline, f"no scrape counted the 8 trajectories: {got}"
        time.sleep(0.5)
    for expr in ("envforge_pool_acquires_total", "envforge_pool_start_seconds_count", "envforge_pool_reset_seconds_count",
                 "envforge_sandbox_command_seconds_count", "envforge_scheduler_steps_total",
                 "envforge_scheduler_in_flight_trajectories", "envforge_scheduler_queued_trajectories",
                 "envforge_verifier_gradings_total", "envforge_verifier_grading_seconds_bucket"):
        assert _query(prometheus, expr), f"Prometheus has no series {expr}"
    hits = _query(prometheus, 'sum by (result) (envforge_pool_acquires_total)')
    assert {r["metric"]["result"] for r in hits} <= {"hit", "miss"}
    assert float(_query(prometheus, "sum(envforge_scheduler_in_flight_trajectories)")[0]["value"][1]) == 0
    rules = json.load(urllib.request.urlopen(f"{prometheus}/api/v1/rules", timeout=10))["data"]["groups"]
    assert sum(len(g["rules"]) for g in rules) == 15  # the shipped alert rules load into the real server

    # Traces: every span of one trajectory in one trace, from the scheduler to the grade.
    spans = exporter.get_finished_spans()
    trajectory = next(s for s in spans if s.name == "rollout.trajectory"
                      and s.attributes["envforge.trajectory_id"] == "prom/" + items[0][0].id + "/0")
    batch_span = next(s for s in spans if s.name == "rollout.batch" and s.attributes["envforge.batch_id"] == "prom")
    assert trajectory.parent.span_id == batch_span.context.span_id
    mine, frontier = [], {trajectory.context.span_id}  # the trajectory's subtree
    while frontier:
        children = [s for s in spans if s.parent is not None and s.parent.span_id in frontier]
        mine += children
        frontier = {s.context.span_id for s in children}
    names = {s.name for s in mine}
    assert {"sandbox.reset", "rollout.step", "rollout.verify", "verify.grade"} <= names, names
    container = trajectory.attributes["envforge.container_id"]
    reset = next(s for s in mine if s.name == "sandbox.reset" and s.parent.span_id == trajectory.context.span_id)
    assert reset.attributes["envforge.container_id"] == container and len(container) == 64
    grade = next(s for s in mine if s.name == "verify.grade")
    verify = next(s for s in mine if s.name == "rollout.verify" and s.parent.span_id == trajectory.context.span_id)
    assert grade.parent.span_id == verify.context.span_id and grade.attributes["envforge.reward"] == 1.0
    assert len(grade.attributes["envforge.grading_container_id"]) == 64  # the pristine copy it graded on
    steps = [s for s in mine if s.name == "rollout.step" and s.parent.span_id == trajectory.context.span_id]
    assert [s.attributes["envforge.action"] for s in sorted(steps, key=lambda s: s.start_time)][-1] == "submit"

    # Logs: the trajectory's lines carry every id, the container's too.
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    graded = [d for d in lines if d["event"] == "trajectory graded"
              and d["trajectory_id"] == trajectory.attributes["envforge.trajectory_id"]]
    assert len(graded) == 1
    assert {k: graded[0][k] for k in ("task_id", "task_version", "batch_id", "container_id", "dagster_run_id",
                                      "mlflow_run_id")} == {
        "task_id": items[0][0].id, "task_version": items[0][0].content_hash, "batch_id": "prom",
        "container_id": container, "dagster_run_id": "dagster-run-1", "mlflow_run_id": "mlflow-run-1"}
    provider.shutdown()


_STAGE_RUN = """
import sys
from pathlib import Path
from envforge.config import Settings
from envforge.rollout.config import RolloutConfig
from envforge.sources import load_sources
from envforge.stages.base import StageContext
from envforge.stages.rollout import rollout

settings = Settings.from_env()
settings.ensure_dirs()
tasks = [t for r in load_sources([Path(sys.argv[1])]).values() for t in r.tasks][:2]
# a Dagster run's stage: no ENVFORGE_METRICS_PORT, so the default applies (a free port, registered)
rollout(settings, RolloutConfig(n_samples=2, concurrency=2), tasks, "replay", batch_id=sys.argv[2],
        context=StageContext(dagster_run_id=sys.argv[2]))
"""


def test_two_overlapping_dagster_stage_runs_on_free_ports_are_both_found_and_scraped(tmp_path, base_image):
    """Two processes run the rollout stage at once as Dagster run workers do (a Dagster run id, no port
    set): each serves on a free port and registers in the file_sd directory; the real Prometheus,
    configured only with that directory, scrapes both at the same time, and both targets go when
    the runs end."""
    import os
    import sys

    from envforge.observe.discovery import prometheus_config
    from tests.prometheus import active_targets, wait_for

    targets = tmp_path / "targets"
    targets.mkdir()  # watched from Prometheus' start (as `envforge observe prometheus-config` leaves it)
    rules = REPO / "platform" / "deploy" / "observability" / "envforge-alerts.yml"
    with running_prometheus(tmp_path / "prometheus", prometheus_config(targets, rules, scrape_interval_s=1)) as prom:
        procs = []
        for run in ("dagster-run-a", "dagster-run-b"):
            env = {**os.environ, "ENVFORGE_DATA_DIR": str(tmp_path / run), "ENVFORGE_METRICS_TARGETS_DIR": str(targets),
                   "ENVFORGE_METRICS_LINGER_S": "6"}
            env.pop("ENVFORGE_METRICS_PORT", None)
            procs.append(subprocess.Popen([sys.executable, "-c", _STAGE_RUN, str(SOURCES[0]), run], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        try:
            both_up = wait_for("both runs scraped at once", lambda: [
                r for r in _query(prom, 'count(up{job="envforge", role="run", stage="rollout"} == 1)')
                if float(r["value"][1]) == 2], timeout_s=180)
            assert both_up
            per_run = wait_for("each run's 4 trajectories", lambda: (lambda got: got if len(got) == 2 and all(
                float(r["value"][1]) >= 4 for r in got) else None)(_query(
                    prom, 'sum by (dagster_run_id) (envforge_scheduler_trajectories_total{role="run"})')), timeout_s=180)
            assert {r["metric"]["dagster_run_id"] for r in per_run} == {"dagster-run-a", "dagster-run-b"}
            instances = {r["metric"]["instance"] for r in _query(prom, 'up{role="run"}')}
            assert len(instances) == 2 and all(i.startswith("127.0.0.1:") for i in instances)
        finally:
            outputs = [p.communicate(timeout=300)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        assert not list(targets.glob("*.json"))  # each run removed its registration on the way out
        wait_for("the ended runs' targets dropped", lambda: not [t for t in active_targets(prom)
                                                                if t["labels"].get("role") == "run"], timeout_s=60)


def _retries() -> float:
    return sum(s.value for f in live.REGISTRY.collect() if f.name == "envforge_scheduler_retries"
               for s in f.samples if s.name.endswith("_total"))


class ContainerKiller:
    """Kills this process's running sandboxes, one every few tenths of a second, until `faults`
    more retries were counted (or `max_kills`): a flaky engine injected into a real batch."""

    def __init__(self, docker_client, faults: int = 3, max_kills: int = 8, seed: int = 0):
        self.client, self.faults, self.max_kills = docker_client, faults, max_kills
        self.rng = random.Random(seed)
        self.killed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _mine(self) -> list:
        return self.client.containers.list(sparse=True, filters={
            "label": f"{OWNER_LABEL}={owner_id()}", "status": "running"})

    def _run(self) -> None:
        start = _retries()
        time.sleep(1.0)  # let the batch get going
        while not self._stop.is_set() and len(self.killed) < self.max_kills and _retries() - start < self.faults:
            # only the batch's: in a whole-suite run this process also holds other tests' idle warm sandboxes
            running = [c for c in self._mine() if c.id not in self._before]
            if running:
                victim = self.rng.choice(running)
                try:
                    victim.kill()
                    self.killed.append(victim.id)
                except Exception:  # noqa: BLE001 - it may have been removed in between
                    pass
            self._stop.wait(0.4)

    def __enter__(self) -> "ContainerKiller":
        self._before = {c.id for c in self._mine()}
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class SlowEngine:
    """A unix-socket proxy in front of the real engine that holds every request chunk (API calls and
    the agent channel's commands) for `delay_s`: a slowed engine for a real batch."""

    def __init__(self, path: Path, delay_s: float, upstream: str = "/var/run/docker.sock"):
        import asyncio

        self.path, self.delay_s, self.upstream = path, delay_s, upstream
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pump(self, src, dst, slowed: bool) -> None:
        import asyncio

        try:
            while data := await src.read(65536):
                if slowed and self.delay_s:  # read per chunk: the delay can change under open connections
                    await asyncio.sleep(self.delay_s)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    async def _handle(self, reader, writer) -> None:
        import asyncio

        up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        await asyncio.gather(self._pump(reader, up_writer, True), self._pump(up_reader, writer, False))

    def __enter__(self) -> str:
        import asyncio

        self._thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(self._handle, path=str(self.path)), self.loop).result(timeout=10)
        return f"unix://{self.path}"

    async def _shutdown(self) -> None:
        import asyncio

        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each pump closes its writer on the way out

    def __exit__(self, *exc) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def test_a_slowed_engine_is_an_infrastructure_anomaly(items, batches, tmp_path):
    import docker

    settings, baseline = batches
    with SlowEngine(tmp_path / "slow-docker.sock", delay_s=0.3) as url:
        client = docker.DockerClient(base_url=url, timeout=120)
        try:
            result = run_batch(settings, items[:4], ReplayPolicy(), CONFIG, "v-slow", batch_id="slow", client=client,
                               register=Catalog(settings.catalog_path).record_rollout_batch)
        finally:
            client.close()
    verdict = judge_stores(result.store, baseline.store)
    assert verdict.verdict == INFRA, verdict.summary()
    assert any("sandbox reset p50" in f for f in verdict.infra_findings), verdict.infra_findings
    assert verdict.figures["clean_reward"] == verdict.figures["clean_reward_baseline"] == 1.0


def _verdict(settings, batch_id: str):
    from envforge.catalog import Catalog

    return batch_verdict(Catalog(settings.catalog_path).rollout_batches().to_dicts(), batch_id)


def test_containers_killed_mid_batch_are_an_infrastructure_anomaly_with_clean_reward_unchanged(items, batches,
                                                                                               docker_client):
    settings, baseline = batches
    with ContainerKiller(docker_client, seed=1) as killer:
        result = run_batch(settings, items, ReplayPolicy(), CONFIG, "v-observe", batch_id="killed",
                           client=docker_client, register=Catalog(settings.catalog_path).record_rollout_batch)
    assert killer.killed and result.report.infra_retries >= 1
    verdict = _verdict(settings, "killed")
    assert verdict.verdict == INFRA, verdict.summary()
    assert verdict.baseline_batch_id == "baseline"
    assert verdict.figures["policy_judged"] and verdict.figures["shared_clean_tasks"] >= 2
    assert verdict.figures["clean_reward"] == verdict.figures["clean_reward_baseline"] == 1.0
    assert verdict.figures["current"]["fault_rate"] > 0 == verdict.figures["baseline"]["fault_rate"]
    # a training round reads the same verdict as flags in its MLflow history
    flags = round_health(result, baseline)
    assert flags["health_infra_anomaly"] == 1.0 and flags["health_policy_regression"] == 0.0


def test_a_worse_policy_on_a_healthy_engine_is_a_policy_regression(items, batches, docker_client):
    settings, baseline = batches
    result = run_batch(settings, items, ReplayPolicy(skip_rate=0.5), CONFIG, "v-observe", batch_id="worse",
                       client=docker_client, register=Catalog(settings.catalog_path).record_rollout_batch)
    assert result.report.infra_retries == 0
    verdict = judge_stores(result.store, baseline.store)
    assert verdict.verdict == POLICY, verdict.summary()
    assert verdict.figures["clean_pass_at_1"] < verdict.figures["clean_pass_at_1_baseline"] - 0.1
    assert not verdict.infra_findings
    # And the same batch again is healthy against itself: the rules fire on change, not on level.
    assert judge_stores(result.store, result.store).verdict == HEALTHY


def test_a_worse_policy_on_a_faulty_engine_is_both(items, batches, docker_client):
    settings, baseline = batches
    with ContainerKiller(docker_client, seed=2):
        result = run_batch(settings, items, ReplayPolicy(skip_rate=0.5), CONFIG, "v-observe", batch_id="both",
                           client=docker_client, register=Catalog(settings.catalog_path).record_rollout_batch)
    verdict = judge_stores(result.store, baseline.store)
    assert verdict.verdict == BOTH, verdict.summary()
    assert verdict.infra_findings and verdict.policy_findings


def test_the_run_report_shows_each_batch_verdict(batches):
    from envforge.catalog import Catalog
    from envforge.report import _rollouts_section

    settings, _ = batches
    section = _rollouts_section(Catalog(settings.catalog_path), "v-observe")
    verdicts = {b["batch_id"]: b["health"]["verdict"] for b in section["batches"]}
    assert verdicts["baseline"] == HEALTHY
    assert verdicts.get("killed", INFRA) == INFRA  # present when the tests above ran in this session


class CheckpointedReplay:
    """The live policy of a GRPO run whose checkpoints change what it does: after update u the replay
    skips its solution at `plan[u][0]` and the engine proxy holds each request `plan[u][1]` s, as if a
    checkpoint had made the policy worse and, later, the engine had slowed down."""

    def __init__(self, engine: SlowEngine, plan: list[tuple[float, float]]):
        self.policy, self.engine, self.plan, self.reloads = ReplayPolicy(), engine, plan, 0

    def reload(self, checkpoint: Path) -> int:
        assert checkpoint.is_dir()  # the trainer saved a real checkpoint for it
        skip, delay = self.plan[min(self.reloads, len(self.plan) - 1)]
        self.policy.skip_rate, self.engine.delay_s = skip, delay
        self.reloads += 1
        return self.reloads


def test_grpo_rounds_tell_a_policy_regression_from_an_infrastructure_anomaly_round_by_round(tmp_path):
    """The training-round verdict through the real GRPO rounds path (`train.loop.grpo_rounds`: tiny model,
    trainer updates and checkpoints, rollouts graded in real sandboxes): round 0 healthy; round 1 rolled
    out by a checkpoint that drops the solution -> policy regression; round 2 good again on a slowed
    engine -> infrastructure anomaly; each round's flags in its history, its verdict in a log line."""
    import dataclasses

    from envforge.stages.base import StageContext
    from envforge.stages.images import ensure_images
    from envforge.demos.chores import chore_family
    from envforge.train.config import TrainingConfig
    from envforge.train.loop import GRPORounds, grpo_rounds, load_model

    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    train, _ = chore_family(0, train_per_chore=1, held_out_per_chore=0)
    items = ensure_images(settings, train[:3], context=StageContext()).items(train[:3])
    cfg = GRPORounds.from_training(TrainingConfig(base_model="tiny:64x2", rl_rounds=3, group_size=2, tasks_per_round=0,
                                                  max_tokens=16, rl_lr=1e-3, max_staleness=0, concurrency=6), pad_id=0)
    model, tok = load_model("tiny:64x2", 0)
    out = io.StringIO()
    handler = configure_logging(out)
    engine = SlowEngine(tmp_path / "docker.sock", delay_s=0.0)
    try:
        with engine as url:
            live_policy = CheckpointedReplay(engine, [(1.0, 0.0), (0.0, 0.25)])
            run = grpo_rounds(dataclasses.replace(settings, docker_host=url), model, tok, items, cfg, "health-rounds",
                              live=live_policy)
    finally:
        logging.getLogger("envforge").removeHandler(handler)
    flags = [(m["health_infra_anomaly"], m["health_policy_regression"]) for m in run.history]
    assert flags == [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0)], run.history
    verdicts = [json.loads(line)["verdict"] for line in out.getvalue().splitlines()
                if json.loads(line)["event"] == "round health"]
    assert verdicts == [HEALTHY, POLICY, INFRA]
    assert [m["rollout_pass_at_1"] for m in run.history] == [1.0, 0.0, 1.0]
    # the regression is judged on clean tasks: none of the first two rounds' was touched by a fault
    assert all(m["health_fault_rate"] == 0.0 and m["health_clean_tasks"] == 3.0 for m in run.history[:2])
    assert len(run.checkpoints) == 3
