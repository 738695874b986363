"""The fleet's parts without a Ray cluster: settings, placement, and the node agent driven
directly on the real Docker engine (leases, capacity, reclaiming, elastic warm pool, faults)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from envforge.errors import InfraError
from envforge.fleet.config import FleetConfig, FleetConfigError
from envforge.fleet.dispatcher import NodeState, check_address
from envforge.fleet.node import FULL, Fault, NodeAgent, engine_check
from envforge.sandbox.container import SandboxOptions


def test_settings_come_from_the_environment_and_bad_values_name_the_variable():
    cfg = FleetConfig.from_env({"ENVFORGE_RAY_ADDRESS": "ray-head:6379", "ENVFORGE_FLEET_MAX_IDLE_PER_IMAGE": "2",
                                "ENVFORGE_FLEET_IMAGE_DISTRIBUTION": "transfer"})
    assert (cfg.ray_address, cfg.max_idle_per_image, cfg.image_distribution) == ("ray-head:6379", 2, "transfer")
    with pytest.raises(FleetConfigError, match=r"max_idle_per_image \(ENVFORGE_FLEET_MAX_IDLE_PER_IMAGE\)"):
        FleetConfig.from_env({"ENVFORGE_FLEET_MAX_IDLE_PER_IMAGE": "-1"})
    with pytest.raises(FleetConfigError, match="ENVFORGE_FLEET_IMAGE_DISTRIBUTION"):
        FleetConfig.from_env({"ENVFORGE_FLEET_IMAGE_DISTRIBUTION": "ftp"})


def test_an_address_that_does_not_answer_is_an_error_naming_the_setting():
    with pytest.raises(FleetConfigError, match=r"ENVFORGE_RAY_ADDRESS=127.0.0.1:9: nothing answers"):
        check_address("127.0.0.1:9", 2)
    with pytest.raises(FleetConfigError, match="expected HOST:PORT"):
        check_address("ray-head", 2)


def test_placement_prefers_a_warm_sandbox_then_the_image_then_room():
    warm = NodeState("a", "a", None, 4, leased=3, images={"img"}, idle={"img": 1})
    cached = NodeState("b", "b", None, 4, leased=0, images={"img"})
    empty = NodeState("c", "c", None, 4, leased=0)
    assert max([empty, cached, warm], key=lambda n: n.score("img")) is warm
    assert max([empty, cached], key=lambda n: n.score("img")) is cached
    assert max([empty, cached], key=lambda n: n.score("other")) in (empty, cached)
    full = NodeState("d", "d", None, 2, leased=2)
    assert full.free == 0


def test_faults_cross_back_as_the_same_kinds():
    assert isinstance(Fault("infra", "node_lost", "x").rebuild(), InfraError)
    assert Fault("infra", "node_lost", "x").rebuild().cause == "node_lost"
    assert isinstance(Fault("ValueError", "ValueError", "patch does not apply").rebuild(), ValueError)
    assert isinstance(Fault("FileNotFoundError", "FileNotFoundError", "nope").rebuild(), FileNotFoundError)


class _NodeCalls:
    """A dispatcher as image distribution uses it: node calls answered from `held` (tag sets per node)."""

    def __init__(self, held: dict[str, set[str]]):
        from envforge.fleet.dispatcher import DispatchStats

        self.config, self.stats, self.held = FleetConfig(), DispatchStats(), held
        self.calls: list[tuple[str, str, str]] = []
        self.events: list[str] = []
        self.on_event = self.events.append

    def call(self, node, method, arg, timeout_s=None):
        tag = arg.tag if method == "build_image" else arg
        self.calls.append((node.name, method, tag))
        if method == "has_image":
            return tag in self.held[node.node_id]
        self.held[node.node_id].add(tag)
        return None


def test_a_node_lacking_a_task_image_builds_it_from_its_recipe_over_its_parent_once():
    from envforge.fleet.distribution import ImageDistribution
    from envforge.fleet.images import ImageRecipe

    node = NodeState("a", "a", None, 4)
    calls = _NodeCalls({"a": {"base"}})
    distribution = ImageDistribution(calls)
    distribution.register_recipe(ImageRecipe("task", "base", b""))
    distribution.ensure(node, "task")
    assert calls.calls == [("a", "has_image", "task"), ("a", "has_image", "base"), ("a", "build_image", "task")]
    assert node.images == {"base", "task"} and calls.stats.builds == 1 and calls.events == ["node a: built task"]
    distribution.ensure(node, "task")  # known to be there now: no call at all
    assert len(calls.calls) == 3


class _OldEngine:
    def version(self):
        return {"Version": "19.03.12"}


def test_an_engine_older_than_the_minimum_is_refused_naming_both_versions_and_the_setting():
    with pytest.raises(InfraError, match=r"19.03.12 .* older than 20.10 \(ENVFORGE_FLEET_MIN_ENGINE_VERSION\)"):
        engine_check(_OldEngine(), "20.10")


@pytest.mark.docker
def test_node_agent_leases_up_to_capacity_reclaims_abandoned_leases_and_follows_demand(docker_client, task_image):
    # Warm sandboxes nobody takes go cold after idle_shrink_after_s: long enough to see them on a busy engine.
    cfg = FleetConfig(max_idle_per_image=2, max_idle_per_node=3, idle_shrink_after_s=8.0, lease_idle_timeout_s=5.0)
    agent = NodeAgent(cfg, capacity=2, node_name="unit")
    try:
        opts = SandboxOptions()
        lease1, warm1 = agent.acquire("driver-1", task_image, opts)
        lease2, _ = agent.acquire("driver-1", task_image, opts)
        assert not warm1 and agent.acquire("driver-2", task_image, opts) == FULL
        res = agent.call(lease1, "exec", ("echo hi",))
        assert res.exit_code == 0 and res.stdout == b"hi\n"
        assert isinstance(agent.call(lease1, "apply_patch", ("not a patch",)), Fault)
        assert agent.call(lease1, "__class__").kind == "ValueError"  # only sandbox methods cross
        agent.release(lease1)
        # lease2's driver went away: the lease is reclaimed after lease_idle_timeout_s.
        deadline = time.monotonic() + 15
        while agent.info()["leased"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert agent.info()["leased"] == 0 and agent.stats.reclaimed == 1
        fault = agent.call(lease2, "exec", ("true",))
        assert isinstance(fault, Fault) and fault.cause == "lease_lost"
        # The queue asks for 5 of this image: the node pre-heats up to its per-image limit (2) ...
        agent.set_demand({task_image: (opts, 5)})
        deadline = time.monotonic() + 60
        while agent.info()["idle"].get(task_image, 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert agent.info()["idle"].get(task_image) == 2
        lease3, warm3 = agent.acquire("driver-1", task_image, opts)
        assert warm3
        agent.release(lease3)
        # ... and when nobody asks for it any more, it goes cold.
        deadline = time.monotonic() + 30  # idle drops when a trim pops them, `trimmed` once they are removed
        while (agent.info()["idle"].get(task_image, 0) or agent.stats.trimmed < 2) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert agent.info()["idle"].get(task_image, 0) == 0 and agent.stats.trimmed >= 2
    finally:
        agent.close()


# -- where a stage's sandboxes run: a provider, chosen once by `envforge.runtime.sandbox_provider` --------

def test_without_an_address_every_stage_keeps_its_local_pool_and_neither_ray_nor_the_fleet_is_imported():
    code = ("import sys\n"
            "import envforge.rollout.batch, envforge.sources.derive, envforge.stages.gate, envforge.stages.tiers\n"
            "import envforge.stages.evaluate, envforge.stages.rollout, envforge.stages.ingest\n"
            "import envforge.service.backend\n"
            "from envforge.runtime import sandbox_provider\n"
            "assert sandbox_provider().kind == 'local'\n"
            "assert 'ray' not in sys.modules, 'the single-machine path imported Ray'\n"
            "fleet = [m for m in sys.modules if m.startswith('envforge.fleet')]\n"
            "assert not fleet, f'the single-machine path imported {fleet}'\n")
    env = {k: v for k, v in os.environ.items() if k != "ENVFORGE_RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


class _Dispatcher:
    """What a FleetSandboxPool asks of its dispatcher when it is told the work ahead."""

    def __init__(self):
        self.origin, self.recipes, self.announced = None, {}, []

    def announce(self, demand):
        self.announced.append(demand)

    def register_recipe(self, recipe):
        self.recipes[recipe.tag] = recipe


def test_with_an_address_the_provider_is_the_fleet_joined_lazily_and_its_pool_is_told_each_images_demand(
        monkeypatch):
    """The choice reads the address only: Ray is joined at the first unit of work (the process's dispatcher,
    started once), whose pool is told the work ahead; withdrawing announces its images as wanted no more."""
    from envforge.fleet import provider as fleet_provider
    from envforge.fleet.pool import FleetSandboxPool
    from envforge.runtime import sandbox_provider
    from envforge.sources import load_sources
    from tests.conftest import REPO

    task = next(t for r in load_sources([REPO / "task_sources" / "specs"]).values() for t in r.tasks)
    monkeypatch.setattr(fleet_provider, "_dispatcher", None)  # this process has joined no cluster yet
    chosen = sandbox_provider({"ENVFORGE_RAY_ADDRESS": "ray-head:6379"})
    assert isinstance(chosen, fleet_provider.FleetSandboxProvider) and chosen.kind == "fleet"
    assert fleet_provider._dispatcher is None  # nothing joined by choosing
    fake = _Dispatcher()
    monkeypatch.setattr(fleet_provider, "_dispatcher", fake)  # the process's dispatcher, already started
    lease = chosen.lease([(task, "envforge/task-x:1")], 5)
    assert isinstance(lease.pool, FleetSandboxPool) and lease.pool.dispatcher is fake and not lease.owned
    [demand] = fake.announced
    assert list(demand) == ["envforge/task-x:1"] and demand["envforge/task-x:1"][1] == 5
    lease.withdraw()
    assert fake.announced[-1]["envforge/task-x:1"][1] == 0
    assert sandbox_provider({}).kind == "local"


class _Chosen(Exception):
    pass


class _AskedProvider:
    """A provider that records what it was told and stops the caller there."""

    kind = "test"

    def __init__(self):
        self.calls = []

    def start(self):
        return self

    def lease(self, items, sandboxes_per_task, *, client=None, settings=None, max_idle_per_key=8, max_starting=4):
        self.calls.append((list(items), sandboxes_per_task, settings))
        raise _Chosen


@pytest.mark.docker
def test_run_batch_and_derivation_lease_from_the_provider_handed_down_telling_it_their_demand(settings,
                                                                                             docker_client):
    """run_batch (under the rollout stage, tiering, training and evaluation rollouts) and derive_tasks (the
    ingest stage's ticket and review derivation) take their pool from the provider they are handed, as
    the gate stage does, telling it what each task will acquire; `tests/test_fleet.py` runs them on a
    real cluster."""
    from envforge.rollout import batch
    from envforge.rollout.config import RolloutConfig
    from envforge.rollout.policies.replay import ReplayPolicy
    from envforge.sources import derive

    provider = _AskedProvider()
    items = [(object(), "envforge/task-x:1")]
    with pytest.raises(_Chosen):
        batch.run_batch(settings, items, ReplayPolicy(), RolloutConfig(n_samples=3), sandboxes=provider)
    assert provider.calls[-1][:2] == (items, 6) and provider.calls[-1][2] is settings  # an episode and a grade each
    with pytest.raises(_Chosen):  # chosen before any candidate is read
        derive.derive_tasks(settings, [object()], client=docker_client, sandboxes=provider)
    assert provider.calls[-1][:2] == ([], derive.SANDBOXES_PER_DERIVATION)  # images are told as they are built
    assert provider.calls[-1][2] is settings


@pytest.mark.docker
def test_a_silent_drivers_leases_are_reclaimed_while_a_beating_drivers_idle_lease_stays(docker_client, task_image):
    """A driver that died stops beating: after driver_timeout_s its leases go back, long before
    lease_idle_timeout_s; a live driver's lease, untouched while its policy thinks, stays."""
    agent = NodeAgent(FleetConfig(driver_timeout_s=15, lease_idle_timeout_s=900), capacity=2, node_name="unit")
    try:
        alive, _ = agent.acquire("driver-alive", task_image, SandboxOptions())
        dead, _ = agent.acquire("driver-dead", task_image, SandboxOptions())
        started = time.monotonic()
        while agent.info()["leased"] == 2 and time.monotonic() - started < 60:
            agent.heartbeat("driver-alive")
            time.sleep(1.0)
        assert agent.info()["leased"] == 1 and agent.stats.reclaimed == 1
        assert agent.call(dead, "exec", ("true",)).cause == "lease_lost"
        assert agent.call(alive, "exec", ("true",)).exit_code == 0
    finally:
        agent.close()
