"""Benchmark the sandbox fleet on a Ray cluster simulated on this machine.

    .venv/bin/python bench/fleet.py [--steps N] [--samples N] [--derive N] [--with-base-build] [--out FILE]

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
- `derivation`: ticket test derivation (the ingest stage's, `derive_tasks`) of the bundled
  ledger project's first N ticket candidates on this process's engine vs on the fleet (found
  from ENVFORGE_RAY_ADDRESS, as the ingest stage finds it): first with the candidates' images
  new to the node (built there from their recipes, their env layer received), then again with
  them present; each run with an empty derivation cache;
- `footprint` and `capacity_model`: measured memory and CPU per sandbox (idle, and while a
  trajectory's grading runs) and the engine's overhead per container, and from them sandboxes
  per 32-core/128 GiB node and nodes for 1,000 and 10,000 concurrent sandboxes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
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
sys.path.insert(0, str(REPO))  # bench.bundled

from bench.bundled import rollout_items  # noqa: E402
from envforge.catalog import Catalog  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.fleet.config import FleetConfig  # noqa: E402
from envforge.fleet.dispatcher import FleetDispatcher  # noqa: E402
from envforge.fleet.images import ImageRecipe, export_image, parent_of  # noqa: E402
from envforge.fleet.local import LocalCluster, own_engines, stop_engine  # noqa: E402
from envforge.fleet.pool import FleetSandboxPool, seed_images  # noqa: E402
from envforge.fleet.provider import FleetSandboxProvider  # noqa: E402
from envforge.rollout.batch import run_batch  # noqa: E402
from envforge.rollout.config import RolloutConfig  # noqa: E402
from envforge.rollout.policies.replay import ReplayPolicy  # noqa: E402
from envforge.runtime import sandbox_provider  # noqa: E402
from envforge.sandbox.container import Sandbox, SandboxOptions  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.envlayer import ENV_REPO_PREFIX  # noqa: E402
from envforge.sandbox.images import TASK_REPO_PREFIX, build_base_image  # noqa: E402
from envforge.sources.derive import derive_tasks  # noqa: E402
from envforge.sources.tickets import load_ticket_source  # noqa: E402
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
    """`client` is the engine of the node the fleet sandbox lands on: both paths drive the same engine."""
    local = Sandbox.start(client, image, SandboxOptions())
    pool = FleetSandboxPool(dispatcher)
    remote = pool.acquire(image, SandboxOptions())
    try:
        for sb in (local, remote):  # warm both paths
            asyncio.run(_timed_async(lambda sb=sb: sb.aexec("true"), 10))
        # Interleaved (one local step, one fleet step, ...), so load from elsewhere hits both alike.
        inproc, fleet = [], []
        for _ in range(steps):
            inproc += asyncio.run(_timed_async(lambda: local.aexec("true"), 1))
            fleet += asyncio.run(_timed_async(lambda: remote.aexec("true"), 1))
    finally:
        local.close()
        pool.release(remote)
    assert local.stats.fallback_execs == 0, "the in-process sandbox lost its agent: the comparison would be unfair"
    return {"steps": steps, "in_process_p50_ms": ms(statistics.median(inproc)), "in_process_p90_ms": ms(pct(inproc, .9)),
            "fleet_p50_ms": ms(statistics.median(fleet)), "fleet_p90_ms": ms(pct(fleet, .9)),
            "added_p50_ms": ms(statistics.median(fleet) - statistics.median(inproc)), "target_added_p50_ms": 5.0}


def batch(settings, dispatcher, items, samples: int, concurrency: int, client, label: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    result = run_batch(settings, items, ReplayPolicy(),
                       RolloutConfig(n_samples=samples, concurrency=concurrency, max_infra_retries=4, backoff_s=0.1,
                                     seed=1),
                       "bench", f"bench-fleet-{label}-{time.time_ns()}", client=client,
                       sandboxes=FleetSandboxProvider(dispatcher),
                       register=Catalog(settings.catalog_path).record_rollout_batch)
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
        t0 = time.perf_counter()
        tdata = export_image(client, task_image)
        target.images.load(tdata)
        out["task_transfer_s"] = round(time.perf_counter() - t0, 2)  # save + load, as for the base
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


def bench_derivation(driver_client, node_engine, cluster: LocalCluster, n: int) -> dict:
    """Seconds to derive n candidates' FAIL_TO_PASS / PASS_TO_PASS on the fleet (found from
    ENVFORGE_RAY_ADDRESS; the driver builds the images on its engine) vs in process on the node's
    own engine (`node_engine`: both paths drive the same engine, as in `bench_dispatch`; the
    driver's engine is shared with everything else on the machine). First on the fleet with the
    images new to the node, then interleaved; every run with an empty derivation cache, and the
    lists must be the same in every run."""
    candidates = load_ticket_source(REPO / "task_sources" / "projects" / "ledger" / "tickets" /
                                    "tickets.yaml").candidates[:n]

    def run(label: str, client, fleet: bool) -> tuple[float, dict]:
        settings = Settings.from_env().with_data_dir(Path(tempfile.mkdtemp(prefix=f"bench-derive-{label}-")))
        settings.ensure_dirs()
        if fleet:
            os.environ["ENVFORGE_RAY_ADDRESS"] = cluster.address
        t0 = time.perf_counter()
        try:
            result = derive_tasks(settings, candidates, client=client, sandboxes=sandbox_provider())
        finally:
            os.environ.pop("ENVFORGE_RAY_ADDRESS", None)
        wall = time.perf_counter() - t0
        log(f"derivation {label}: {len(result.tasks)} tasks, {len(result.rejects)} rejects in {wall:.1f} s")
        lists = {t.id: (t.spec.verification.tests.fail_to_pass, t.spec.verification.tests.pass_to_pass)
                 for t in result.tasks}
        return wall, {"lists": lists, "rejects": sorted(p.reason[:80] for p in result.rejects)}

    first_wall, reference = run("fleet-new-images", driver_client, True)
    local_walls, fleet_walls, outcomes = [], [], []
    for i in range(2):  # interleaved: the machine's load drifts
        for walls, client, fleet, label in ((local_walls, node_engine, False, "local"),
                                            (fleet_walls, driver_client, True, "fleet")):
            wall, outcome = run(f"{label}-{i}", client, fleet)
            walls.append(wall)
            outcomes.append(outcome)
    local_wall, fleet_wall = statistics.median(local_walls), statistics.median(fleet_walls)
    return {"candidates": len(candidates), "tasks": len(reference["lists"]), "rejects": len(reference["rejects"]),
            "fleet_images_new_to_node_wall_s": round(first_wall, 1),
            "local_median_wall_s": round(local_wall, 1), "fleet_median_wall_s": round(fleet_wall, 1),
            "local_walls_s": [round(w, 1) for w in local_walls], "fleet_walls_s": [round(w, 1) for w in fleet_walls],
            "ratio_fleet_vs_local": round(fleet_wall / local_wall, 2),
            "same_lists_everywhere": all(o == reference for o in outcomes),
            "note": "one node; both on the node's own engine, on this machine's 2 cores: the fleet's overhead, "
                    "not scaling (the first fleet run includes the driver's image builds on a fresh machine)"}


def _remove_images(client, prefixes: tuple[str, ...]) -> int:
    """Remove a node engine's images whose tags start with one of `prefixes` (task and env layers)."""
    removed = 0
    for image in client.images.list():
        if any(t.startswith(prefixes) for t in image.tags):
            client.images.remove(image.id, force=True)
            removed += 1
    return removed


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


def _shim_pids(container_ids: list[str]) -> list[int]:
    """The containerd shims serving these containers (the engine's per-container processes)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in cmd and any(cid in cmd for cid in container_ids):
            pids.append(int(proc.name))
    return pids


def _container_mem_mb(client, container_id: str) -> float:
    stats = client.api.stats(container_id, stream=False)
    mem = stats.get("memory_stats", {})
    usage = mem.get("usage", 0) - mem.get("stats", {}).get("cache", 0)
    return usage / 2**20


def bench_footprint(client, task, image: str, n: int = 6) -> dict:
    """Memory and CPU of sandboxes: idle (agent + waiting shells), and while grading runs pytest."""
    boxes = [Sandbox.start(client, image, SandboxOptions(limits=task.spec.environment.limits)) for _ in range(n)]
    try:
        time.sleep(1.0)
        idle = [_container_mem_mb(client, sb.id) for sb in boxes]
        shims = _shim_pids([sb.id for sb in boxes])
        engine_kb = _rss_kb(shims) / max(1, len(shims))
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


def capacity_model(fp: dict, core_s_per_trajectory: float, trajectory_wall_s: float = 120.0) -> dict:
    """Sandboxes per 32-core / 128 GiB node, from measured footprints.

    Memory, two ways: by the measured peak working set of a grading run (what this workload used)
    and by the task's configured memory limit (what Docker lets one sandbox take: the safe plan),
    each plus the engine's per-container processes; 10% of the node stays for the OS, dockerd
    and the node agent. CPU: the core-seconds a trajectory cost here (replay policy: commands and
    grading, measured over a whole batch, so an upper bound) spread over a trajectory's wall time
    with a served policy thinking between turns (`trajectory_wall_s`, an assumption).
    """
    engine = max(0.0, fp["engine_overhead_mb_per_container"])
    by_peak = math.floor(0.9 * 128 * 1024 / (fp["working_mem_mb_peak_p50"] + engine))
    by_limit = math.floor(0.9 * 128 * 1024 / (fp["limits"]["memory_mb"] + engine))
    cores_per_sandbox = core_s_per_trajectory / trajectory_wall_s
    by_cpu = math.floor(0.9 * 32 / cores_per_sandbox)
    per_node = min(by_limit, by_cpu)
    return {"sandboxes_per_node_by_measured_memory": by_peak, "sandboxes_per_node_by_memory_limit": by_limit,
            "core_s_per_trajectory_measured": round(core_s_per_trajectory, 2),
            "trajectory_wall_s_assumed": trajectory_wall_s, "cores_per_sandbox": round(cores_per_sandbox, 4),
            "sandboxes_per_node_by_cpu": by_cpu, "sandboxes_per_node": per_node,
            "nodes_for_1000": math.ceil(1000 / per_node), "nodes_for_10000": math.ceil(10000 / per_node)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--with-base-build", action="store_true")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only-dispatch", action="store_true", help="measure only the dispatch overhead")
    ap.add_argument("--derive", type=int, default=4, help="ledger ticket candidates to derive (0: skip)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["images", "footprint", "throughput", "recovery"],
                    help="sections to leave out (a partial rerun)")
    args = ap.parse_args()
    settings = Settings.from_env().with_data_dir(Path(tempfile.mkdtemp(prefix="bench-fleet-data-")))
    settings.ensure_dirs()
    client = docker_client(settings)
    base = build_base_image(client, settings).tag
    items = rollout_items(client, settings)
    inventory = next((t, img) for t, img in items if t.id == "inventory-median-even")
    doc: dict = {"machine": "2 cores, shared; all nodes on this one machine", "tasks": len(items),
                 "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    wanted = set() if args.only_dispatch else {"images", "footprint", "throughput", "recovery"} - set(args.skip)
    if "images" in wanted:
        log("images: transfer vs build on an empty engine")
        doc["images"] = bench_images(client, settings, base, inventory[1], inventory[0], args.with_base_build)
    if "footprint" in wanted:
        log("footprint per sandbox")
        doc["footprint"] = bench_footprint(client, inventory[0], inventory[1])
    two_nodes = bool(wanted & {"throughput", "recovery"})
    engines = own_engines(["node-a", "node-b"] if two_nodes else ["node-a"])
    if args.derive:  # node-a's engine keeps its data root between runs: the candidates' images must be new to it
        import docker

        node_a_engine = docker.DockerClient(base_url=engines["node-a"], timeout=300)
        _remove_images(node_a_engine, (TASK_REPO_PREFIX, ENV_REPO_PREFIX))
    config = FleetConfig(idle_shrink_after_s=60, discovery_interval_s=1.0)
    cluster = LocalCluster(config)
    try:
        cluster.start()
        cluster.add_node("node-a", engines["node-a"], 8)
        dispatcher = FleetDispatcher(config).start()
        seed_images(FleetSandboxPool(dispatcher), client, [base])
        log("dispatch overhead per step")
        node_a = dispatcher.alive_nodes()[0]
        FleetSandboxPool(dispatcher).register([inventory], 1, local_client=client)
        dispatcher.distribution.ensure(node_a, inventory[1])
        import docker

        doc["dispatch"] = bench_dispatch(docker.DockerClient(base_url=engines["node-a"], timeout=300), dispatcher,
                                         inventory[1], args.steps)
        if args.only_dispatch:
            return _emit(doc, args.out)
        if args.derive:
            log("derivation: local engine vs the fleet")
            doc["derivation"] = bench_derivation(client, node_a_engine, cluster, args.derive)
        two_wall = None
        if "throughput" in wanted:
            log("throughput, 1 node")
            batch(settings, dispatcher, items, 1, 8, client, "warm1")  # builds the task images on node-a once
            one_wall, one = batch(settings, dispatcher, items, args.samples, 8, client, "one")
        if two_nodes:
            cluster.add_node("node-b", engines["node-b"], 8)
            dispatcher.discover()
            seed_images(FleetSandboxPool(dispatcher), client, [base])
            batch(settings, dispatcher, items, 1, 8, client, "warm2")
        if "throughput" in wanted:
            log("throughput, 2 nodes")
            two_wall, two = batch(settings, dispatcher, items, args.samples, 8, client, "two")
            if "footprint" in doc:
                # Core-seconds per trajectory: this machine's 2 cores over the 1-node batch (everything
                # included: sandboxes, grading, Ray, the driver): an upper bound.
                doc["capacity_model"] = capacity_model(doc["footprint"], 2 * one_wall / one["trajectories"])
            doc["throughput"] = {"one_node": one, "two_nodes": two,
                                 "ratio_two_vs_one": round(one_wall / two_wall, 2),
                                 "note": "both nodes share this machine's 2 cores: a mechanics check"}
        if "recovery" in wanted:
            if two_wall is None:
                two_wall, _ = batch(settings, dispatcher, items, args.samples, 8, client, "two")
            log("recovery after a node kill")
            node_b = next(n for n in dispatcher.alive_nodes() if n.name.startswith("node-b"))
            kill: dict = {}
            lost_at: dict = {}
            dispatcher.on_event = lambda msg: lost_at.setdefault("t", time.perf_counter()) if "lost" in msg else None

            def killer() -> None:
                # two leases out: a replay episode is short, one can end between this look and the kill
                while node_b.leased < 2 or dispatcher.stats.placements.get(node_b.name, 0) < 4:
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
        doc["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        cluster.shutdown()
        for name in engines:
            stop_engine(name)
    _emit(doc, args.out)


def _emit(doc: dict, out: Path | None) -> None:
    text = json.dumps(doc, indent=2)
    print(text)
    if out:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
