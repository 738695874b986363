"""The sandbox fleet on a real Ray cluster on this machine: a head and two worker nodes, node-a on
the main Docker engine and node-b on its own (platform/deploy/fleet-engine.sh). A rollout batch
(trajectories on S3) loses node-b mid-run and completes on node-a; a node joins and takes gate
work; a killed dispatcher's batch resumes; bad nodes fail at start naming the setting; ticket
test derivation loses its node mid-run and derives the same lists on a survivor; a node's engine
dies under `run_batch` (the rollouts of tiering, training and evaluation) handed the provider the
address chooses (`envforge.runtime.sandbox_provider`, as the CLI and the Dagster assets hand it).

The CI-sized version of `make fleet-demo` (which runs two nodes with their own engines)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from envforge.config import Settings
from envforge.fleet.config import FleetConfig, FleetConfigError
from envforge.fleet.dispatcher import FleetDispatcher
from envforge.fleet.local import LocalCluster, start_engine, stop_engine
from envforge.fleet.pool import FleetSandboxPool, seed_images
from envforge.fleet.provider import FleetSandboxProvider, dispatcher_from_env
from envforge.rollout.batch import run_batch
from envforge.rollout.config import RolloutConfig
from envforge.rollout.policies.replay import ReplayPolicy
from envforge.rollout.store import TrajectoryStore
from envforge.runtime import sandbox_provider
from envforge.sandbox.images import build_task_image
from envforge.sources import load_sources
from envforge.stages.base import StageContext
from envforge.stages.gate import gate
from envforge.stages.images import ImageSet
from envforge.verify.config import GateConfig
from tests.conftest import REPO

pytestmark = [pytest.mark.docker, pytest.mark.slow]
CONFIG = FleetConfig(idle_shrink_after_s=20, discovery_interval_s=1.0, driver_timeout_s=15)


@pytest.fixture(scope="module")
def fleet(docker_client, base_image, tmp_path_factory):
    """(cluster, dispatcher, items, node-b's DOCKER_HOST): two sandbox nodes of capacity 3."""
    settings = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("fleet-images"))
    tasks = [t for r in load_sources([REPO / "task_sources" / "specs"]).values() for t in r.tasks]
    items = [(t, build_task_image(docker_client, t, base_image, settings).tag) for t in tasks]
    host_b = start_engine("node-b")
    import docker

    engine_b = docker.DockerClient(base_url=host_b)
    for image in engine_b.images.list():  # task images from an earlier run: node-b must build them
        if any(t.startswith("envforge/task-") for t in image.tags):
            engine_b.images.remove(image.id, force=True)
    cluster = LocalCluster(CONFIG)
    cluster.start()
    try:
        cluster.add_node("node-a", None, 3)
        cluster.add_node("node-b", host_b, 3)
        dispatcher = FleetDispatcher(CONFIG).start()
        assert sorted(n.name.split("/")[0] for n in dispatcher.alive_nodes()) == ["node-a", "node-b"]
        # node-b's engine starts empty: the base image is loaded from this driver's engine once;
        # task images are then built on it from their recipes.
        seed_images(FleetSandboxPool(dispatcher), docker_client, [base_image])
        yield cluster, dispatcher, items, host_b
    finally:
        cluster.shutdown()
        stop_engine("node-b")


class ThinkingReplay(ReplayPolicy):
    """Replay that thinks 0.4 s before each turn, as a served policy does: an episode holds its
    sandbox long enough that a node killed while it has leases dies with episodes on it (a bare
    replay episode can finish between the killer's look and the kill on a quiet machine)."""

    def episode(self, task):
        inner = super().episode(task)

        class Episode:
            policy_id, version = inner.policy_id, inner.version

            async def act(self, *args, **kwargs):
                await asyncio.sleep(0.4)
                return await inner.act(*args, **kwargs)

            async def aclose(self):
                await inner.aclose()

        return Episode()


def test_a_node_killed_mid_batch_costs_retries_on_the_survivor_not_trajectories(fleet, s3_bucket, docker_client,
                                                                                settings):
    cluster, dispatcher, items, _ = fleet
    node_b = next(n for n in dispatcher.alive_nodes() if n.name.startswith("node-b"))
    killed = threading.Event()

    def kill_node_b_once_it_works() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if dispatcher.stats.placements.get(node_b.name, 0) >= 3 and node_b.leased > 0:
                cluster.kill_node("node-b")
                killed.set()
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_node_b_once_it_works, daemon=True)
    killer.start()
    root = f"s3://{s3_bucket}/rollouts"
    config = RolloutConfig(n_samples=3, concurrency=6, max_infra_retries=4, backoff_s=0.05)
    result = run_batch(settings, items, ThinkingReplay(), config, "v-fleet", "fleet-kill", root=root,
                       client=docker_client, sandboxes=FleetSandboxProvider(dispatcher))
    killer.join()
    assert killed.is_set()
    frame = TrajectoryStore(root, "fleet-kill").frame()
    # Batch complete: every group whole, none dropped, nothing stored twice, every replay resolved.
    assert frame.height == len(items) * 3 and frame["trajectory_id"].n_unique() == frame.height
    assert result.store.dropped() == [] and result.store.pending() == []
    assert frame["resolved"].all()
    assert result.report.infra_retries >= 1  # what ran on node-b when it died ran again on node-a
    assert [n.split("/")[0] for n in dispatcher.stats.nodes_lost] == ["node-b"]
    assert sorted(n.name.split("/")[0] for n in dispatcher.alive_nodes()) == ["node-a"]
    assert dispatcher.stats.builds >= 1  # node-b built task images from their recipes before it died


def test_a_node_that_joins_takes_gate_work_of_the_gate_stage_configured_by_address(fleet, settings, docker_client,
                                                                                     monkeypatch):
    """The gate stage runs on the fleet handed down as the provider ENVFORGE_RAY_ADDRESS chooses (as the CLI
    and Dagster run it)."""
    cluster, dispatcher, items, host_b = fleet
    if "node-b" in cluster.nodes:
        pytest.fail("runs after the node-kill test (node-b is gone)")
    # The host comes back as a new node (same engine: its images are still there).
    cluster.add_node("node-c", host_b, 3)
    dispatcher.discover()
    assert "node-c" in [n.name.split("/")[0] for n in dispatcher.alive_nodes()]
    monkeypatch.setenv("ENVFORGE_RAY_ADDRESS", cluster.address)
    configured = dispatcher_from_env()  # the process's dispatcher: the one the stage uses
    assert configured is not None and configured is dispatcher_from_env()
    node_a = next(n for n in configured.alive_nodes() if n.name.startswith("node-a"))
    node_a.full_until = time.monotonic() + 120  # make node-a look full: the gate must go to node-c
    before = dict(configured.stats.placements)
    tasks = [t for t, _ in items]
    images = ImageSet("", {t.content_hash: img for t, img in items})
    try:
        result = gate(settings, GateConfig(runs=1, shuffle=False, probes=False, concurrency=2), tasks, images,
                      context=StageContext(sandboxes=sandbox_provider()))
    finally:
        node_a.full_until = 0.0
    assert [r.verdict for r in result.reports] == ["accepted"] * len(tasks)
    assert not result.infra_failures
    grew = {k: v - before.get(k, 0) for k, v in configured.stats.placements.items()}
    assert any(k.startswith("node-c") and v > 0 for k, v in grew.items())


def test_the_service_configured_by_address_runs_sessions_on_a_fleet_node(fleet, settings, docker_client, base_image,
                                                                        monkeypatch):
    """`create_app` with no backend picks the fleet from ENVFORGE_RAY_ADDRESS: an episode's sandbox
    (and its mid-episode grade's, after which the episode goes on) run on the second engine's node,
    and /healthz says the fleet serves."""
    import docker
    from fastapi.testclient import TestClient

    from envforge.catalog import Catalog
    from envforge.service.app import create_app
    from envforge.service.config import ServiceConfig
    from envforge.sources.result import LoadResult
    from tests.service.conftest import create_key

    cluster, _, items, host_b = fleet
    task, image = next((t, img) for t, img in items if t.id == "inventory-median-even")
    catalog = Catalog(settings.catalog_path)
    catalog.ingest(LoadResult(tasks=[task]))
    catalog.record_images([(task, build_task_image(docker_client, task, base_image, settings))])
    catalog.create_task_set("main", [task])
    key = {"Authorization": f"Bearer {create_key(settings, 'team-a', ['main'])}"}
    monkeypatch.setenv("ENVFORGE_RAY_ADDRESS", cluster.address)
    configured = dispatcher_from_env()  # the process's dispatcher: the one the service's backend uses
    node_a = next(n for n in configured.alive_nodes() if n.name.startswith("node-a"))
    other = next(n for n in configured.alive_nodes() if not n.name.startswith("node-a"))  # on host_b's engine
    node_a.full_until = time.monotonic() + 120  # node-a shares this process's engine: send the work elsewhere
    engine_b = docker.DockerClient(base_url=host_b)
    app = create_app(settings, ServiceConfig(mlflow=False, record_every_sessions=1))
    try:
        with TestClient(app) as http:
            health = http.get("/healthz").json()["backend"]
            assert health["backend"] == "fleet" and health["ray_address"] == cluster.address
            assert {n["name"] for n in health["nodes"]} >= {node_a.name, other.name}
            created = http.post("/sessions", json={"task_set": "main", "index": 0}, headers=key)
            assert created.status_code == 201, created.text
            sid = created.json()["session_id"]
            busy = {n["name"]: n["in_use"] for n in http.get("/healthz").json()["backend"]["nodes"]}
            assert busy[other.name] == 1 and busy[node_a.name] == 0
            assert engine_b.containers.list(filters={"ancestor": image}), "no sandbox of the image on the second engine"
            out = http.post(f"/sessions/{sid}/step", headers=key, json={"tool_call": {
                "type": "function", "function": {"name": "run", "arguments": {"command": "ls inventory"}}}})
            assert out.status_code == 200 and "stats.py" in out.json()["observation"]["text"], out.text
            patch = {"name": "apply_patch", "arguments": {"patch": task.reference_patch}}
            out = http.post(f"/sessions/{sid}/step", headers=key, json={"tool_call": {"type": "function",
                                                                                     "function": patch}})
            assert out.json()["observation"]["text"].startswith("patch applied"), out.text
            verified = http.post(f"/sessions/{sid}/verify", headers=key).json()
            assert verified["result"]["reward"] == 1.0 and verified["result"]["resolved"] and not verified["done"]
            out = http.post(f"/sessions/{sid}/step", headers=key, json={"tool_call": {  # the episode goes on
                "type": "function", "function": {"name": "run", "arguments": {"command": "echo still-here"}}}})
            assert out.status_code == 200 and out.json()["observation"]["text"].endswith("still-here\n"), out.text
            assert http.delete(f"/sessions/{sid}", headers=key).status_code == 200
            after = http.get("/healthz").json()["backend"]
            assert after["in_use"] == 0 and after["hits"] + after["misses"] >= 2  # the episode's and the grade's
    finally:
        node_a.full_until = 0.0
    assert Catalog(settings.catalog_path).service_sessions("team-a").height == 1  # recorded as on one machine


_DRIVER = """
import sys
from envforge.config import Settings
from envforge.fleet.config import FleetConfig
from envforge.fleet.dispatcher import FleetDispatcher
from envforge.fleet.provider import FleetSandboxProvider
from envforge.rollout.batch import run_batch
from envforge.rollout.config import RolloutConfig
from envforge.rollout.policies.replay import ReplayPolicy
from envforge.sources import load_sources
images = dict(line.split(" ", 1) for line in open(sys.argv[3]).read().splitlines())
tasks = [t for r in load_sources([sys.argv[4]]).values() for t in r.tasks]
items = [(t, images[t.id]) for t in tasks]
settings = Settings.from_env()
dispatcher = FleetDispatcher(FleetConfig(ray_address=sys.argv[1])).start()
run_batch(settings, items, ReplayPolicy(), RolloutConfig(n_samples=4, concurrency=2), "v-fleet", "fleet-resume",
          root=sys.argv[2], sandboxes=FleetSandboxProvider(dispatcher))
"""


def test_a_killed_dispatcher_restarts_and_resumes_its_batch_from_the_store(fleet, settings, tmp_path):
    cluster, dispatcher, items, _ = fleet
    root = str(tmp_path / "rollouts")
    images = tmp_path / "images.txt"
    images.write_text("\n".join(f"{t.id} {img}" for t, img in items))
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(settings.data_dir), "MLFLOW_TRACKING_URI": ""}
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, cluster.address, root, str(images),
                             str(REPO / "task_sources" / "specs")], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    batch = tmp_path / "rollouts" / "fleet-resume"
    deadline = time.monotonic() + 300

    def held() -> int:  # leases out on the nodes: this test's dispatcher holds none, so the driver's
        return sum(dispatcher.call(n, "info", timeout_s=60)["leased"] for n in dispatcher.alive_nodes())

    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(batch.glob("pending/*.json")) + list(batch.glob("*.parquet"))) >= 2 and held() > 0:
            break
        time.sleep(0.1)
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = TrajectoryStore(root, "fleet-resume")
    finished = {t.trajectory_id: t.started_at for t in before.trajectories() + before.pending()}
    assert 0 < len(finished) < len(items) * 4
    # The killed driver stopped beating: the nodes take its leases back after driver_timeout_s.
    killed_at = time.monotonic()
    while held() and time.monotonic() - killed_at < 90:
        time.sleep(0.5)
    assert held() == 0, "the dead driver's leases were not reclaimed"
    result = run_batch(settings, items, ReplayPolicy(), RolloutConfig(n_samples=4, concurrency=4), "v-fleet",
                       "fleet-resume", root=root, sandboxes=FleetSandboxProvider(dispatcher))
    frame = result.store.frame()
    assert frame.height == len(items) * 4 and frame["trajectory_id"].n_unique() == frame.height
    assert result.report.resumed >= len(finished)
    again = {r["trajectory_id"]: r["started_at"] for r in frame.iter_rows(named=True)}
    assert all(again[tid] == started for tid, started in finished.items())  # nothing redone


def test_a_node_without_an_engine_or_with_an_old_one_fails_at_start_naming_node_and_setting(fleet):
    cluster, dispatcher, _, _ = fleet
    old = FleetConfig(namespace="envforge-test-old-engine", min_engine_version="99.0")
    with pytest.raises(FleetConfigError, match=r"node-a/.*older than 99.0 \(ENVFORGE_FLEET_MIN_ENGINE_VERSION\)"):
        FleetDispatcher(old).start()
    cluster.add_node("node-x", "unix:///run/envforge-fleet/no-such-node/docker.sock", 2)
    try:
        with pytest.raises(FleetConfigError, match=r"node-x/.*no Docker engine answers at "
                                                   r"DOCKER_HOST=unix:///run/envforge-fleet/no-such-node"):
            FleetDispatcher(FleetConfig(namespace="envforge-test-no-engine")).start()
    finally:
        cluster.kill_node("node-x")
    assert json.dumps(dispatcher.stats.placements)  # the shared dispatcher is untouched


def test_derivation_configured_by_address_loses_its_node_mid_run_and_still_derives_the_right_lists(
        fleet, settings, docker_client, tmp_path, monkeypatch):
    """`derive_tasks` (what the ingest stage runs for tickets and reviews), handed the provider
    ENVFORGE_RAY_ADDRESS chooses, runs its suite runs and grader-way checks on the fleet. The node it runs on
    builds the candidates' images from their recipes and is killed mid-derivation: each derivation
    is redone from its start on a surviving node, and the lists are the single machine's; the only
    reject is the record that has no failing-then-passing test, none is an infrastructure one."""
    from envforge.sources.derive import derive_tasks
    from envforge.sources.tickets import load_ticket_source
    from tests.test_history_sources import make_calc_repo, write_ticket_source

    cluster, _, _, host_b = fleet
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", str(tmp_path))  # the repository beside its source
    repo = tmp_path / "calc"
    candidates = load_ticket_source(write_ticket_source(tmp_path / "t", repo, make_calc_repo(repo))).candidates
    assert sorted(c.id for c in candidates) == ["calc-calc-1", "calc-gh-8"]
    monkeypatch.setenv("ENVFORGE_RAY_ADDRESS", cluster.address)
    configured = dispatcher_from_env()  # the process's dispatcher: the one derive_tasks uses
    cluster.add_node("node-d", host_b, 3)
    configured.discover()
    node_d = next(n for n in configured.alive_nodes() if n.name.startswith("node-d"))
    others = [n for n in configured.alive_nodes() if n is not node_d]
    for n in others:
        n.full_until = time.monotonic() + 300  # the derivations start on node-d
    builds, before = configured.stats.builds, dict(configured.stats.placements)
    killed = threading.Event()

    def kill_node_d_mid_derivation() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            # three sandboxes placed, some in use: a derivation is past its first suite run
            if configured.stats.placements.get(node_d.name, 0) >= 3 and node_d.leased > 0:
                cluster.kill_node("node-d")
                killed.set()
                for other in others:
                    other.full_until = 0.0
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_node_d_mid_derivation, daemon=True)
    killer.start()
    try:
        result = derive_tasks(settings, candidates, client=docker_client, sandboxes=sandbox_provider())
    finally:
        for n in others:
            n.full_until = 0.0
    killer.join()
    assert killed.is_set()
    assert [n.split("/")[0] for n in configured.stats.nodes_lost][-1] == "node-d"
    assert configured.stats.builds > builds  # node-d built the candidates' images from their recipes
    [task] = result.tasks
    assert task.id == "calc-calc-1"
    assert task.spec.verification.tests.fail_to_pass == ["tests/test_calc.py::test_add"]
    assert task.spec.verification.tests.pass_to_pass == ["tests/test_calc.py::test_mul"]
    [reject] = result.rejects  # the record without a failing-then-passing test; no `infra:` reject
    assert reject.reason.startswith("the change has no failing-then-passing test: 3 tests ran after the change")
    grew = {k.split("/")[0]: v - before.get(k, 0) for k, v in configured.stats.placements.items()}
    assert sum(v for k, v in grew.items() if k != "node-d") >= 1  # the redone runs, on a survivor


def test_a_node_whose_engine_dies_mid_batch_cools_down_and_its_trajectories_run_elsewhere(fleet, settings,
                                                                                           monkeypatch):
    """Last: it stops node-b's engine, which node-c (node-b's host, rejoined) runs on. `run_batch`, handed
    the provider ENVFORGE_RAY_ADDRESS chooses: the path of the rollout stage and of tiering, training and
    evaluation rollouts."""
    cluster, _, items, _ = fleet
    monkeypatch.setenv("ENVFORGE_RAY_ADDRESS", cluster.address)
    dispatcher = dispatcher_from_env()
    node_c = next(n for n in dispatcher.alive_nodes() if n.name.startswith("node-c"))
    node_a = next(n for n in dispatcher.alive_nodes() if n.name.startswith("node-a"))
    node_a.full_until = time.monotonic() + 8  # the batch starts on node-c
    stopped = threading.Event()

    def stop_engine_under_node_c() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if node_c.leased > 0:
                stop_engine("node-b")
                stopped.set()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=stop_engine_under_node_c, daemon=True)
    thread.start()
    before = sum(dispatcher.stats.placements.values())
    result = run_batch(settings, items, ReplayPolicy(),
                       RolloutConfig(n_samples=2, concurrency=4, max_infra_retries=5, backoff_s=0.2),
                       "v-fleet", "fleet-engine-dies", sandboxes=sandbox_provider())
    thread.join()
    assert stopped.is_set()
    frame = result.store.frame()
    assert frame.height == len(items) * 2 and frame["trajectory_id"].n_unique() == frame.height
    assert result.store.dropped() == [] and frame["resolved"].all()
    assert result.report.infra_retries >= 1
    assert sum(dispatcher.stats.placements.values()) - before >= len(items) * 2 * 2  # episodes and grades
