"""Engine faults are infrastructure faults, and envforge survives them: errors of the docker SDK
and of the HTTP stack under it map to InfraError, two envforge processes share one engine
without touching each other's containers, and a rollout survives a dockerd restart (the
shared engine is restarted by the project's own script: slow, and it disturbs everything else
using the engine for a few seconds)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import docker
import pytest

from envforge.config import Settings
from envforge.errors import InfraError
from envforge.sandbox.container import Sandbox
from envforge.sandbox.engine import OWNER_LABEL, engine_answers, wait_for_engine
from envforge.sandbox.pool import SandboxPool
from tests.conftest import REPO

ENVFORGE = str(Path(sys.executable).with_name("envforge"))
ENGINE_SCRIPT = REPO / "platform" / "deploy" / "docker-engine.sh"


@pytest.fixture
def dead_client(tmp_path):
    return docker.DockerClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.41", timeout=5)


def test_an_engine_that_does_not_answer_is_an_infra_fault(dead_client):
    assert not engine_answers(dead_client)
    with pytest.raises(InfraError) as err:
        Sandbox.start(dead_client, "envforge/any:tag")
    assert err.value.cause == "container_create_failed" and "ConnectionError" in err.value.detail
    pool = SandboxPool(dead_client)  # orphan cleanup tolerates it
    with pytest.raises(InfraError):
        pool.acquire("envforge/any:tag")
    assert pool.sweep() == 0
    pool.close()
    with pytest.raises(InfraError, match="engine_unavailable"):
        wait_for_engine(dead_client, timeout_s=1)


@pytest.mark.docker
def test_a_connection_error_in_the_middle_of_a_command_is_an_infra_fault(docker_client, task_image, dead_client):
    """requests' ConnectionError is no DockerException: it used to escape as itself."""
    sb = Sandbox.start(docker_client, task_image)
    try:
        sb.client = sb.container.client = dead_client  # the engine goes away under the sandbox
        sb._channel.close()
        with pytest.raises(InfraError) as err:
            sb.exec("true")
        assert err.value.cause in ("engine_error", "agent_died") and sb.tainted
        assert sb.close() is False  # the removal is left to the pool's sweep
    finally:
        docker_client.containers.get(sb.id).remove(force=True)


_CHURN = textwrap.dedent("""
    import json, sys, time
    from envforge.sandbox.engine import docker_client, remove_orphans
    from envforge.sandbox.pool import SandboxPool
    from envforge.sandbox.container import Sandbox
    image, seconds = sys.argv[1], float(sys.argv[2])
    client = docker_client()
    ops, errors, ids = 0, [], set()
    with SandboxPool(client, max_idle_per_key=1, max_starting=2) as pool:
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                sb = pool.acquire(image)
                ids.add(sb.id)
                assert sb.exec("echo ok").text() == "ok\\n"
                pool.release(sb)
                with Sandbox.start(client, image) as own:  # a container that is created and removed at once
                    ids.add(own.id)
                remove_orphans(client)  # what every pool does at start, racing the other process's churn
                ops += 1
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"ops": ops, "errors": errors, "ids": sorted(ids)}))
""")


@pytest.mark.docker
def test_two_envforge_processes_share_one_engine(task_image):
    procs = [subprocess.Popen([sys.executable, "-c", _CHURN, task_image, "15"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    docs = []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        docs.append(json.loads(out))
    for doc in docs:
        assert doc["ops"] >= 2 and doc["errors"] == [], doc["errors"][:5]
    assert not set(docs[0]["ids"]) & set(docs[1]["ids"])
    client = docker.from_env()
    for p in procs:  # each removed its own
        owner = f"{socket.gethostname()}:{p.pid}"
        assert client.containers.list(all=True, sparse=True, filters={"label": f"{OWNER_LABEL}={owner}"}) == []


def test_the_rollout_cli_exits_3_when_too_many_groups_were_dropped(tmp_path, monkeypatch):
    """The exit-code rule on its own (a batch with 2 of 3 groups dropped); the dockerd-restart test
    below runs the real thing."""
    from typer.testing import CliRunner

    import envforge.stages.rollout as rollout_stage
    from envforge.cli import app
    from envforge.cli.common import EXIT_TOO_MANY_DROPPED
    from envforge.rollout import batch
    from envforge.rollout.scheduler import BatchReport
    from envforge.rollout.store import TrajectoryStore
    from envforge.rollout.trajectory import DroppedGroup
    from envforge.stages.configs import IngestConfig
    from envforge.stages.images import ImageSet
    from envforge.stages.ingest import ingest

    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    tasks = ingest(settings, IngestConfig(), [REPO / "task_sources" / "specs"]).result.tasks
    assert len(tasks) == 3

    def run_batch(settings, items, policy, config, **kwargs):
        store = TrajectoryStore(str(tmp_path / "rollouts"), "b")
        for t, _ in items[:2]:
            store.record_dropped(DroppedGroup("b", t.id, "retry budget exhausted", {}, []))
        report = BatchReport("b", len(items), 1, dropped_groups=store.dropped())
        return batch.BatchResult(report, store, {"trajectories": 0.0, "pass_at_1": 0.0, "infra_retries": 6.0,
                                                 "steps_per_s": 0.0})

    monkeypatch.setattr(batch, "run_batch", run_batch)
    monkeypatch.setattr(rollout_stage.rollout, "tracked", rollout_stage.rollout)  # MLflow is tested elsewhere
    monkeypatch.setattr(rollout_stage, "ensure_images", lambda settings, tasks, images, context: ImageSet(
        "not-built", {t.content_hash: "not-built" for t in tasks}))
    args = ["rollout", "--task-set", "current", "--json", "--data-dir", str(settings.data_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_TOO_MANY_DROPPED == 3, result.output
    assert json.loads(result.stdout.splitlines()[0])["dropped_fraction"] == round(2 / 3, 4)
    assert CliRunner().invoke(app, [*args, "--max-dropped-fraction", "0.7"]).exit_code == 0


def _restart_engine() -> float:
    """Kill dockerd as a crash would, start it again with the project's script; seconds until it answers."""
    started = time.perf_counter()
    subprocess.run(["pkill", "-9", "-x", "dockerd"], check=True)
    time.sleep(0.5)
    proc = subprocess.run([str(ENGINE_SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return time.perf_counter() - started


@pytest.mark.docker
@pytest.mark.slow
def test_a_rollout_survives_a_dockerd_restart(tmp_path, docker_client, base_image):
    from envforge.rollout.store import TrajectoryStore
    from envforge.stages.configs import IngestConfig
    from envforge.stages.ingest import ingest

    data = tmp_path / "data"
    settings = Settings.from_env().with_data_dir(data)
    tasks = ingest(settings, IngestConfig(), [REPO / "task_sources" / "specs",
                                              REPO / "task_sources" / "runbooks"]).result.tasks
    samples = 4
    total = len(tasks) * samples
    cmd = [ENVFORGE, "rollout", "--task-set", "current", "--samples", str(samples), "--concurrency", "6",
           "--max-infra-retries", "3", "--batch-id", "restart-1", "--json", "--data-dir", str(data)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    batch_dir = data / "rollouts" / "restart-1"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        if len(list(batch_dir.glob("pending/*.json"))) + samples * len(list(batch_dir.glob("*.parquet"))) >= 6:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    restart_s = _restart_engine()
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode in (0, 3), err[-3000:]
    doc = json.loads(out)
    store = TrajectoryStore(str(data / "rollouts"), "restart-1")
    frame = store.frame()
    dropped = {g.task_id for g in store.dropped()}
    counts = frame.group_by("task_id").len()
    assert all(n == samples for n in counts["len"]) and not dropped & set(counts["task_id"])
    assert frame.height + samples * len(dropped) == total and frame["trajectory_id"].n_unique() == frame.height
    assert frame["resolved"].all()  # replay solves everything: a stored failure would be an infra fault scored
    assert store.pending() == []
    assert (proc.returncode == 3) == (doc["dropped_fraction"] > 0.1)
    owner = f"{socket.gethostname()}:{proc.pid}"
    left = docker_client.containers.list(all=True, sparse=True, filters={"label": f"{OWNER_LABEL}={owner}"})
    assert left == [], [c.id for c in left]  # nothing leaked by the restart
    figures = {"restart_s": round(restart_s, 1), "trajectories": total, "stored": frame.height,
               "dropped_groups": len(dropped), "infra_retries": doc["metrics"]["infra_retries"],
               "exit_code": proc.returncode}
    print("dockerd restart during a rollout:", json.dumps(figures))
    (Path(os.environ.get("ENVFORGE_FIGURES_DIR", tmp_path)) / "dockerd_restart.json").write_text(json.dumps(figures))
    wait_for_engine(docker_client, 60)  # the engine is back for the next tests
