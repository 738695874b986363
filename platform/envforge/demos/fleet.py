"""`make fleet-demo`: a Ray cluster on this machine (a head and two worker nodes, each with its own
Docker engine), a rollout batch and a gate across it, one worker killed mid-batch.

What it shows: the batch completes; what ran on the dead node ran again on the survivor; no
trajectory is lost or stored twice; a node that joins afterwards takes gate work. The figures
go to `<data dir>/fleet_demo.json`. Like every entry point, it runs the rollout and the gate as
their stages (tracked: one MLflow run each), handing them the fleet as their sandbox provider
(`StageContext.sandboxes`), on the cluster it starts rather than one found by address.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from envforge.config import Settings
from envforge.fleet.config import FleetConfig
from envforge.fleet.dispatcher import FleetDispatcher
from envforge.fleet.local import LocalCluster, own_engines, stop_engine
from envforge.fleet.pool import FleetSandboxPool, seed_images
from envforge.fleet.provider import FleetSandboxProvider
from envforge.rollout.config import RolloutConfig
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import build_base_image, build_task_image
from envforge.sources import load_sources
from envforge.sources.gitrepo import repository_dir
from envforge.stages.base import StageContext
from envforge.stages.gate import gate
from envforge.stages.images import ImageSet
from envforge.stages.rollout import rollout
from envforge.verify.config import GateConfig

Say = Callable[[str], None]


@dataclass
class DemoOptions:
    """What the demo runs (the test runs a smaller one)."""

    samples: int = 4
    concurrency: int = 8
    capacity: int = 4
    kill_after_placements: int = 20  # node-b dies once the fleet has placed this many sandboxes (of ~2 per trajectory)
    gate_runs: int = 2
    source_kinds: tuple[str, ...] = ("specs", "runbooks")
    extras: dict[str, Any] = field(default_factory=dict)


def run_fleet_demo(settings: Settings, options: DemoOptions = DemoOptions(), say: Say = print) -> dict[str, Any]:
    started = time.perf_counter()
    client = docker_client(settings)
    base = build_base_image(client, settings).tag
    tasks = [
        t for r in load_sources([settings.task_sources_dir / k for k in options.source_kinds]).values() for t in r.tasks
    ]
    items = [(t, build_task_image(client, t, base, settings, repository_dir=repository_dir).tag) for t in tasks]
    images = ImageSet(base, {t.content_hash: tag for t, tag in items})
    say(f"{len(items)} tasks, images built locally on the main engine")
    engines = own_engines(["node-a", "node-b"])
    say("engines: " + ", ".join(f"{k} {v}" for k, v in engines.items()))
    config = FleetConfig(idle_shrink_after_s=30, discovery_interval_s=1.0)
    summary: dict[str, Any] = {"tasks": len(items), "samples": options.samples}
    cluster = LocalCluster(config)
    try:
        t0 = time.perf_counter()
        cluster.start()
        for name, host in engines.items():
            cluster.add_node(name, host, options.capacity)
        dispatcher = FleetDispatcher(config).start()
        dispatcher.on_event = lambda msg: say(f"  fleet: {msg}")
        summary["cluster_start_s"] = round(time.perf_counter() - t0, 1)
        say(
            f"Ray cluster: head + {', '.join(n.name for n in dispatcher.alive_nodes())} "
            f"({summary['cluster_start_s']} s)"
        )
        t0 = time.perf_counter()
        seeded = seed_images(FleetSandboxPool(dispatcher), client, [base])
        summary["seed_base_s"] = round(time.perf_counter() - t0, 1)
        say(
            f"base image loaded onto {seeded} node engine(s) in {summary['seed_base_s']} s (docker save/load "
            "through Ray's object store); task images are built on the nodes from their recipes"
        )

        node_b = next(n for n in dispatcher.alive_nodes() if n.name.startswith("node-b"))
        kill: dict[str, float] = {}

        def killer() -> None:
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                placed = sum(dispatcher.stats.placements.values())
                if placed >= options.kill_after_placements and node_b.leased:
                    kill["in_flight_on_node_b"] = node_b.leased
                    kill["at"] = time.perf_counter()
                    say(
                        f"killing node-b (SIGKILL of its raylet and workers) with {node_b.leased} sandbox(es) "
                        "leased on it"
                    )
                    cluster.kill_node("node-b")
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        t0 = time.perf_counter()
        config_r = RolloutConfig(
            n_samples=options.samples, concurrency=options.concurrency, max_infra_retries=4, backoff_s=0.1
        )
        batch_id = f"fleet-demo-{int(time.time())}"
        fleet = FleetSandboxProvider(dispatcher)
        progress = StageContext(
            progress=lambda _s, what, done, total: (
                say(f"  rollout {done}/{total} {what}") if done % 8 == 0 or done == total else None
            ),
            sandboxes=fleet,
        )
        result = rollout.tracked(
            settings, config_r, tasks, "replay", "fleet-demo", images, batch_id, context=progress
        ).batch
        thread.join(timeout=1)
        frame = result.store.frame()
        summary["rollout"] = {
            "batch_id": batch_id,
            "expected": len(items) * options.samples,
            "stored": frame.height,
            "unique": frame["trajectory_id"].n_unique(),
            "dropped_groups": len(result.store.dropped()),
            "pending_left": len(result.store.pending()),
            "resolved": int(frame["resolved"].sum()),
            "infra_retries": result.report.infra_retries,
            "wall_s": round(time.perf_counter() - t0, 1),
            "node_killed": bool(kill),
            "in_flight_on_killed_node": kill.get("in_flight_on_node_b", 0),
            "placements": dict(dispatcher.stats.placements),
            "nodes_lost": list(dispatcher.stats.nodes_lost),
            "builds_on_nodes": dispatcher.stats.builds,
            "transfers": dispatcher.stats.transfers,
            "location": f"{result.store.root}/{batch_id}",
        }
        say(
            f"rollout: {frame.height}/{len(items) * options.samples} trajectories stored, "
            f"{frame['trajectory_id'].n_unique()} unique, {len(result.store.dropped())} groups dropped, "
            f"{result.report.infra_retries} infra retries, placements {dict(dispatcher.stats.placements)}"
        )

        # The host comes back as a new node (same engine): it joins and takes gate work.
        cluster.add_node("node-b2", engines["node-b"], options.capacity)
        dispatcher.discover()
        before = dict(dispatcher.stats.placements)
        spec_tasks = [t for t in tasks if t.spec.source == "spec"] or tasks[:3]
        t0 = time.perf_counter()
        config_g = GateConfig(runs=options.gate_runs, shuffle=True, probes=False, concurrency=2)
        gated = gate.tracked(settings, config_g, spec_tasks, images, context=StageContext(sandboxes=fleet))
        summary["gate"] = {
            "tasks": len(spec_tasks),
            "accepted": len(gated.accepted_hashes()),
            "infra_failures": len(gated.infra_failures),
            "wall_s": round(time.perf_counter() - t0, 1),
            "placements": {
                k: v - before.get(k, 0) for k, v in dispatcher.stats.placements.items() if v - before.get(k, 0)
            },
        }
        say(
            f"gate: {summary['gate']['accepted']}/{len(spec_tasks)} accepted, sandboxes placed "
            f"{summary['gate']['placements']}"
        )
        summary["nodes_joined"] = list(dispatcher.stats.nodes_joined)
    finally:
        cluster.shutdown()
        for name in engines:
            stop_engine(name)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    r = summary["rollout"]
    summary["ok"] = (
        r["stored"] == r["expected"] == r["unique"]
        and r["dropped_groups"] == 0
        and r["node_killed"]
        and r["pending_left"] == 0
        and summary["gate"]["accepted"] == summary["gate"]["tasks"]
    )
    return summary
