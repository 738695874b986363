"""Benchmark the sandbox fleet on a Ray cluster simulated on this machine.

    .venv/bin/python bench/fleet.py [--steps N] [--samples N] [--with-base-build] [--out FILE]

Prints one JSON document:
- `dispatch`: one command (`true`) per step through the fleet (driver -> Ray actor call -> node
  agent -> sandbox agent) vs in-process (driver -> sandbox agent), p50/p90 and the added p50;
- `throughput`: trajectories/min of the same replay batch with 1 node vs 2 nodes (all nodes
  share this machine's 2 cores: a mechanics check, not a scaling figure);
- `recovery`: a node killed mid-batch: seconds from the kill to the dispatcher marking it lost,
  and the batch's wall time against the same batch without a kill;
- `images`: getting the bundled images onto an empty engine: the base image by transfer
  (docker save/load through the object store) vs by build (debootstrap, only with
  --with-base-build, ~80 s), a task image by build from its recipe vs by transfer;
- `footprint` and `capacity_model`: measured memory and CPU per sandbox (idle, and while a
  trajectory's grading runs) and the engine's overhead per container, and from them sandboxes
  per 32-core/128 GiB node and nodes for 1,000 and 10,000 concurrent sandboxes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from envforge.config import Settings  # noqa: E402
from envforge.fleet.config import FleetConfig  # noqa: E402
from envforge.fleet.dispatcher import FleetDispatcher  # noqa: E402
from envforge.fleet.images import ImageRecipe, export_image, parent_of  # noqa: E402
from envforge.fleet.local import LocalCluster, own_engines, stop_engine  # noqa: E402
from envforge.fleet.pool import FleetSandboxPool, seed_images  # noqa: E402
from envforge.fleet.run import run_batch_on_fleet  # noqa: E402
from envforge.rollout.policies.replay import ReplayPolicy  # noqa: E402
from envforge.rollout.scheduler import RolloutConfig  # noqa: E402
from envforge.sandbox.container import Sandbox, SandboxOptions  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.images import build_base_image, build_task_image  # noqa: E402
from envforge.sources import load_sources  # noqa: E402
from envforge.verify.grader import Grader  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1)))]


def ms(x: float) -> float:
    return round(1000 * x, 3)


async def _timed_async(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(0.005)  # think time between steps, as a policy has
    return out


def bench_dispatch(client, dispatcher: FleetDispatcher, image: str, steps: int) -> dict:
    local = Sandbox.start(client, image, SandboxOptions())
    pool = FleetSandboxPool(dispatcher)
    remote = pool.acquire(image, SandboxOptions())
    try:
        for sb in (local, remote):  # warm both paths
            asyncio.run(_timed_async(lambda sb=sb: sb.aexec("true"), 10))
        inproc = asyncio.run(_timed_async(lambda: local.aexec("true"), steps))
        fleet = asyncio.run(_timed_async(lambda: remote.aexec("true"), steps))
    finally:
        local.close()
        pool.release(remote)
    return {"steps": steps, "in_process_p50_ms": ms(statistics.median(inproc)), "in_process_p90_ms": ms(pct(inproc, .9)),
            "fleet_p50_ms": ms(statistics.median(fleet)), "fleet_p90_ms": ms(pct(fleet, .9)),
            "added_p50_ms": ms(statistics.median(fleet) - statistics.median(inproc)), "target_added_p50_ms": 5.0}


def batch(settings, dispatcher, items, samples: int, concurrency: int, client, label: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    result = run_batch_on_fleet(settings, dispatcher, items, ReplayPolicy(),
                                RolloutConfig(n_samples=samples, concurrency=concurrency, max_infra_retries=4,
                                              backoff_s=0.1, seed=1),
                                "bench", f"bench-fleet-{label}-{time.time_ns()}", local_client=client)
    wall = time.perf_counter() - t0
    n = int(result.metrics["trajectories"])
    assert n == len(items) * samples and result.metrics["pass_at_1"] == 1.0, result.metrics
    return wall, {"trajectories": n, "wall_s": round(wall, 1), "trajectories_per_min": round(60 * n / wall, 1),
                  "infra_retries": result.report.infra_retries}


def bench_images(client, settings, base: str, task_image: str, task, with_base_build: bool) -> dict:
    """An empty engine of its own: base by transfer (and by debootstrap if asked), a task image by
    build from its recipe vs by transfer (docker save carries every layer, base included)."""
    name = "bench-images"
    host = own_engines([name])[name]
    import docker

    target = docker.DockerClient(base_url=host, timeout=600)
    out: dict = {}
    try:
        data = export_image(client, base)
        t0 = time.perf_counter()
        target.images.load(export_image(client, base))
        out["base_transfer_s"] = round(time.perf_counter() - t0, 2)
        out["base_image_mb"] = round(len(data) / 2**20, 1)
        recipe = ImageRecipe.for_task(task, task_image, parent_of(client, task_image) or base)
        from envforge.fleet.images import build_image
        t0 = time.perf_counter()
        build_image(target, recipe)
        out["task_build_s"] = round(time.perf_counter() - t0, 2)
        target.images.remove(task_image, force=True)
        tdata = export_image(client, task_image)
        t0 = time.perf_counter()
        target.images.load(tdata)
        out["task_transfer_s"] = round(time.perf_counter() - t0, 2)
        out["task_image_save_mb"] = round(len(tdata) / 2**20, 1)
        if with_base_build:
            target.images.remove(task_image, force=True)
            target.images.remove(base, force=True)
            for img in target.images.list():
                target.images.remove(img.id, force=True)
            s2 = Settings.from_env().with_data_dir(Path(tempfile.mkdtemp(prefix="bench-fleet-")))
            s2.ensure_dirs()
            t0 = time.perf_counter()
            build_base_image(target, s2)
            out["base_build_s"] = round(time.perf_counter() - t0, 2)
            shutil.rmtree(s2.data_dir, ignore_errors=True)
        out["faster_for_base"] = "transfer" if out.get("base_build_s", 78.0) > out["base_transfer_s"] else "build"
        out["faster_for_task"] = "build" if out["task_build_s"] < out["task_transfer_s"] else "transfer"
        if "base_build_s" not in out:
            out["base_build_s_note"] = "not measured in this run (--with-base-build); docs/architecture.md: 78 s"
    finally:
        stop_engine(name)
        subprocess.run(["umount", "-l", f"/var/lib/envforge-fleet/{name}"], capture_output=True, check=False)
        subprocess.run(["rm", "-rf", f"/var/lib/envforge-fleet/{name}"], check=False)
    return out


def _rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def _shim_pids() -> list[int]:
    out = subprocess.run(["pgrep", "-f", "containerd-shim"], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def _container_mem_mb(client, container_id: str) -> float:
    stats = client.api.stats(container_id, stream=False)
    mem = stats.get("memory_stats", {})
    usage = mem.get("usage", 0) - mem.get("stats", {}).get("cache", 0)
    return usage / 2**20


def bench_footprint(client, task, image: str, n: int = 6) -> dict:
    """Memory and CPU of sandboxes: idle (agent + waiting shells), and while grading runs pytest."""
    shims_before = _rss_kb(_shim_pids())
    boxes = [Sandbox.start(client, image, SandboxOptions(limits=task.spec.environment.limits)) for _ in range(n)]
    try:
        time.sleep(1.0)
        idle = [_container_mem_mb(client, sb.id) for sb in boxes]
        engine_kb = (_rss_kb(_shim_pids()) - shims_before) / n
        peaks, cpu_s = [], []
        grader = Grader(client)
        for sb in boxes[:3]:
            t0 = time.process_time()
            stop = threading.Event()
            seen = [0.0]

            def sample(sb=sb) -> None:
                while not stop.is_set():
                    seen[0] = max(seen[0], _container_mem_mb(client, sb.id))
                    time.sleep(0.05)

            th = threading.Thread(target=sample)
            th.start()
            before = client.api.stats(sb.id, stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]
            res = sb.exec(task.spec.verification.tests.command if task.spec.verification.tests else "true",
                          timeout_s=120)
            after = client.api.stats(sb.id, stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]
            stop.set()
            th.join()
            peaks.append(seen[0])
            cpu_s.append((after - before) / 1e9)
            del res, t0
        grader.close()
    finally:
        for sb in boxes:
            sb.close()
    return {"sandboxes": n, "idle_mem_mb_p50": round(statistics.median(idle), 1),
            "working_mem_mb_peak_p50": round(statistics.median(peaks), 1),
            "cpu_s_per_test_run_p50": round(statistics.median(cpu_s), 3),
            "engine_overhead_mb_per_container": round(engine_kb / 1024, 1),
            "limits": {"memory_mb": task.spec.environment.limits.memory_mb, "cpus": task.spec.environment.limits.cpus}}


def capacity_model(fp: dict, steps_cpu_share: float = 0.25) -> dict:
    """Sandboxes per 32-core / 128 GiB node, from measured footprints.

    Memory: each sandbox holds its working set plus the engine's per-container overhead; 10% of
    the node stays for the OS, dockerd and the node agent. CPU: a sandbox is busy only while a
    command runs (the policy thinks the rest of the time); `steps_cpu_share` is the fraction of a
    core an agentic trajectory keeps busy on average (a test run per few turns), an assumption
    stated here, not measured on a GPU-served policy.
    """
    mem_per = fp["working_mem_mb_peak_p50"] + fp["engine_overhead_mb_per_container"]
    by_mem = math.floor(0.9 * 128 * 1024 / mem_per)
    by_cpu = math.floor(0.9 * 32 / steps_cpu_share)
    per_node = min(by_mem, by_cpu)
    return {"mem_per_sandbox_mb": round(mem_per, 1), "sandboxes_per_node_by_memory": by_mem,
            "sandboxes_per_node_by_cpu": by_cpu, "cpu_share_per_sandbox_assumed": steps_cpu_share,
            "sandboxes_per_node": per_node, "nodes_for_1000": math.ceil(1000 / per_node),
            "nodes_for_10000": math.ceil(10000 / per_node)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--with-base-build", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    settings = Settings.from_env().with_data_dir(Path(tempfile.mkdtemp(prefix="bench-fleet-data-")))
    settings.ensure_dirs()
    client = docker_client(settings)
    base = build_base_image(client, settings).tag
    tasks = [t for r in load_sources([REPO / "task_sources" / "specs", REPO / "task_sources" / "runbooks"]).values()
             for t in r.tasks]
    items = [(t, build_task_image(client, t, base, settings).tag) for t in tasks]
    inventory = next((t, img) for t, img in items if t.id == "inventory-median-even")
    doc: dict = {"machine": "2 cores, shared; all nodes on this one machine", "tasks": len(items)}
    log("images: transfer vs build on an empty engine")
    doc["images"] = bench_images(client, settings, base, inventory[1], inventory[0], args.with_base_build)
    log("footprint per sandbox")
    doc["footprint"] = bench_footprint(client, inventory[0], inventory[1])
    doc["capacity_model"] = capacity_model(doc["footprint"])
    engines = own_engines(["node-a", "node-b"])
    config = FleetConfig(idle_shrink_after_s=60, discovery_interval_s=1.0)
    cluster = LocalCluster(config)
    try:
        cluster.start()
        cluster.add_node("node-a", engines["node-a"], 8)
        dispatcher = FleetDispatcher(config).start()
        seed_images(FleetSandboxPool(dispatcher), client, [base])
        log("dispatch overhead per step")
        node_a = dispatcher.alive_nodes()[0]
        dispatcher.ensure_image(node_a, inventory[1]) if inventory[1] in dispatcher.recipes else None
        FleetSandboxPool(dispatcher).register([inventory], 1, local_client=client)
        dispatcher.ensure_image(node_a, inventory[1])
        doc["dispatch"] = bench_dispatch(client, dispatcher, inventory[1], args.steps)
        log("throughput, 1 node")
        batch(settings, dispatcher, items, 1, 8, client, "warm1")  # builds the task images on node-a once
        one_wall, one = batch(settings, dispatcher, items, args.samples, 8, client, "one")
        cluster.add_node("node-b", engines["node-b"], 8)
        dispatcher.discover()
        seed_images(FleetSandboxPool(dispatcher), client, [base])
        log("throughput, 2 nodes")
        batch(settings, dispatcher, items, 1, 8, client, "warm2")
        two_wall, two = batch(settings, dispatcher, items, args.samples, 8, client, "two")
        doc["throughput"] = {"one_node": one, "two_nodes": two,
                             "ratio_two_vs_one": round(one_wall / two_wall, 2),
                             "note": "both nodes share this machine's 2 cores: a mechanics check"}
        log("recovery after a node kill")
        node_b = next(n for n in dispatcher.alive_nodes() if n.name.startswith("node-b"))
        kill: dict = {}
        lost_at: dict = {}
        dispatcher.on_event = lambda msg: lost_at.setdefault("t", time.perf_counter()) if "lost" in msg else None

        def killer() -> None:
            while not node_b.leased or dispatcher.stats.placements.get(node_b.name, 0) < 4:
                time.sleep(0.02)
            kill["t"] = time.perf_counter()
            cluster.kill_node("node-b")

        th = threading.Thread(target=killer, daemon=True)
        th.start()
        kill_wall, killed = batch(settings, dispatcher, items, args.samples, 8, client, "kill")
        th.join(timeout=1)
        doc["recovery"] = {"detect_s": round(lost_at["t"] - kill["t"], 2) if kill and lost_at else None,
                           "batch_with_kill": killed, "batch_without_kill_wall_s": round(two_wall, 1),
                           "extra_wall_s": round(kill_wall - two_wall, 1)}
    finally:
        cluster.shutdown()
        for name in engines:
            stop_engine(name)
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
