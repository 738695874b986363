"""The fleet's parts without a Ray cluster: settings, placement, and the node agent driven
directly on the real Docker engine (leases, capacity, reclaiming, elastic warm pool, faults)."""

from __future__ import annotations

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
