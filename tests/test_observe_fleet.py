"""The fleet's metrics reach a real Prometheus: on a real one-node Ray cluster on this machine, the
node agent (a detached Ray actor, in its own process) serves its pool's metrics and registers them
in the file_sd directory; Prometheus, given only that directory, scrapes them labelled with the
node, while the driver counts the fleet's own figures (alive nodes, acquire waits)."""

from __future__ import annotations

import pytest

from envforge.errors import InfraError
from envforge.fleet.config import FleetConfig
from envforge.fleet.node import NODE_LABEL
from envforge.observe import metrics as live
from envforge.observe.discovery import prometheus_config
from tests.conftest import REPO
from tests.prometheus import query, running_prometheus, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]
RULES = REPO / "platform" / "deploy" / "observability" / "envforge-alerts.yml"


def _by(prom: str, expr: str) -> dict[tuple[str, ...], float]:
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in query(prom, expr)}


def test_a_fleet_node_agents_pool_metrics_reach_prometheus_through_its_target(docker_client, task_image, tmp_path,
                                                                             monkeypatch):
    import ray

    from envforge.fleet.dispatcher import FleetDispatcher
    from envforge.fleet.local import LocalCluster
    from envforge.fleet.pool import FleetSandboxPool

    targets = tmp_path / "targets"
    targets.mkdir()
    monkeypatch.setenv("ENVFORGE_METRICS_TARGETS_DIR", str(targets))  # the node's processes inherit it
    monkeypatch.delenv("ENVFORGE_METRICS_PORT", raising=False)
    config = FleetConfig(discovery_interval_s=1.0, max_idle_per_image=1)
    waits0 = live.REGISTRY.get_sample_value("envforge_fleet_acquire_wait_seconds_count") or 0.0
    with running_prometheus(tmp_path / "prometheus", prometheus_config(targets, RULES, scrape_interval_s=1)) as prom, \
            LocalCluster(config, object_store_mb=200) as cluster:
        cluster.add_node("node-a", None, 2)
        dispatcher = FleetDispatcher(config).start()
        [node] = dispatcher.alive_nodes()
        [target] = list(targets.glob("envforge-fleet_node-*.json"))  # registered by the actor, in its process
        assert node.info["metrics_url"] and str(node.info["pid"]) in target.name
        pool = FleetSandboxPool(dispatcher)
        for _ in range(2):  # a cold start, then (released, reset, kept warm) a hit
            sandbox = pool.acquire(task_image)
            assert sandbox.exec("true").exit_code == 0
            pool.release(sandbox)
        assert pool.stats.misses == 1 and pool.stats.hits == 1
        acquires = wait_for("the node's acquires in Prometheus", lambda: (lambda got: got if sum(got.values()) >= 2
                                                                          else None)(_by(
            prom, 'sum by (node, result) (envforge_pool_acquires_total{job="envforge", role="fleet_node"})')))
        assert {dict(k)["result"]: v for k, v in acquires.items()} == {"hit": 1.0, "miss": 1.0}
        assert {dict(k)["node"] for k in acquires} == {node.name}  # labelled with the node it counts
        for expr in ('envforge_pool_start_seconds_count{role="fleet_node"}',
                     'envforge_pool_reset_seconds_count{role="fleet_node"}',
                     'envforge_sandbox_command_seconds_count{role="fleet_node"}'):
            assert wait_for(expr, lambda: [r for r in query(prom, expr) if float(r["value"][1]) >= 1]), expr
        assert wait_for("one warm sandbox, none leased", lambda: [r for r in query(
            prom, 'envforge_pool_idle_sandboxes{role="fleet_node"} == 1 and on (instance) '
                  'envforge_fleet_leased_sandboxes{role="fleet_node"} == 0')])
        # a sandbox whose container dies under its lease is tainted and destroyed on its node, by cause
        sandbox = pool.acquire(task_image)
        [container] = docker_client.containers.list(filters={"label": f"{NODE_LABEL}={node.name}"})
        container.kill()
        with pytest.raises(InfraError):
            sandbox.exec("true")
        pool.release(sandbox)
        destroyed = wait_for("the tainted sandbox's destruction in Prometheus", lambda: _by(
            prom, 'sum by (node, cause) (envforge_pool_destroyed_total{role="fleet_node"})'))
        assert {dict(k)["node"] for k in destroyed} == {node.name} and sum(destroyed.values()) == 1, destroyed
        # the driver's side, in this process: the node it sees and its acquires' waits for room
        assert live.REGISTRY.get_sample_value("envforge_fleet_alive_nodes") == 1
        assert live.REGISTRY.get_sample_value("envforge_fleet_acquire_wait_seconds_count") == waits0 + 3
        ray.get(node.handle.close.remote(), timeout=120)  # the agent closes: its warm sandbox and its target go
        assert not target.exists()
        cluster.kill_node("node-a")
