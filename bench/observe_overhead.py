"""What metrics and tracing cost a rollout: the same replay batch with observability on, off, and
(when --base-rev is given) on the code before it existed, run interleaved in fresh processes.

    .venv/bin/python bench/observe_overhead.py [--samples 4] [--concurrency 8] [--repeats 3] [--base-rev REV]

Arms (each run is its own process, so imports and registries start clean; runs are interleaved
arm by arm, repeat by repeat, in an order rotated each repeat, so a change in the machine's load
hits every arm alike):
- `on`: Prometheus hooks on (ENVFORGE_METRICS=1), the registry served on a loopback port, and
  OpenTelemetry spans (per batch, trajectory, step, reset, grade) through the SDK's batch
  processor into an in-memory exporter: everything but the network hop to a collector;
- `off`: ENVFORGE_METRICS=0 and tracing off (the default): the hooks return at once;
- `base`: `git archive` of REV's platform/ (the naive alternative: no instrumentation code at all).

Prints JSON: per arm the steps/s and the rollout process's CPU ms per step of every run and their
medians, the ratios on/off and on/base, the load average before and after (the machine is
shared), and `hooks`: the CPU microseconds observability spends per trajectory measured in a
tight loop (on and off), a figure the load barely moves.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def worker(arm: str, samples: int, concurrency: int, data_dir: str) -> None:
    """One batch in this process; prints {"steps_per_s", "wall_s", ...}."""
    sys.path.insert(0, os.environ.get("BENCH_PLATFORM", str(REPO / "platform")))
    sys.path.insert(0, str(REPO))  # bench.bundled (it imports envforge from the path above)
    import inspect

    import envforge
    from bench.bundled import rollout_items
    from envforge.catalog import Catalog
    from envforge.config import Settings
    from envforge.rollout.batch import run_batch
    from envforge.rollout.policies.replay import ReplayPolicy
    from envforge.rollout.scheduler import RolloutConfig
    from envforge.sandbox.engine import docker_client

    exporter = server = None
    if arm == "on":
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from envforge.observe.http import MetricsServer
        from envforge.observe.traces import configure_tracing

        exporter = InMemorySpanExporter()
        provider = configure_tracing(exporter)
        server = MetricsServer(0)
    settings = Settings.from_env().with_data_dir(Path(data_dir))
    settings.ensure_dirs()
    client = docker_client(settings)
    items = rollout_items(client, settings)
    config = RolloutConfig(n_samples=samples, concurrency=concurrency, seed=1)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    started = time.perf_counter()
    # registered in the catalog as every batch is (a base commit's run_batch, without `register`, does it itself)
    register = ({"register": Catalog(settings.catalog_path).record_rollout_batch}
                if "register" in inspect.signature(run_batch).parameters else {})
    result = run_batch(settings, items, ReplayPolicy(), config, "bench", batch_id=f"obs-{arm}-{time.time_ns()}",
                       client=client, **register)
    wall = time.perf_counter() - started
    assert result.metrics["pass_at_1"] == 1.0, result.metrics
    spans = 0
    if exporter is not None:
        provider.force_flush()
        spans = len(exporter.get_finished_spans())
        server.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu0
    print(json.dumps({"arm": arm, "envforge": envforge.__file__, "steps": result.report.steps,
                      "trajectories": int(result.metrics["trajectories"]), "wall_s": round(wall, 3),
                      "steps_per_s": round(result.report.steps / wall, 3), "spans": spans,
                      "cpu_s": round(cpu, 3), "cpu_ms_per_step": round(1000 * cpu / result.report.steps, 3)}))


def hook_cost(iterations: int = 3000) -> dict:
    """CPU time of what observability does for one trajectory (the hooks, spans, log calls and context
    of a 2-step replay trajectory with its grading), on and off, in a tight loop: a figure the
    machine's load barely moves, unlike wall-clock throughput."""
    sys.path.insert(0, str(REPO / "platform"))
    import logging

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from envforge.observe import metrics as live
    from envforge.observe.logs import bind, log_context
    from envforge.observe.traces import configure_tracing, set_attributes, span

    log = logging.getLogger("envforge.rollout")

    def trajectory(i: int) -> None:
        live.scheduler_queued(-1)
        live.scheduler_in_flight(1)
        with log_context(trajectory_id=f"b/t/{i}", task_id="t", task_version="h"), \
                span("rollout.trajectory", **{"envforge.trajectory_id": f"b/t/{i}", "envforge.task_id": "t"}) as cur:
            with span("sandbox.reset", **{"envforge.image": "img"}) as rs:
                live.pool_acquired(True)
                live.sandbox_command(0.002, "agent")
                set_attributes(rs, **{"envforge.container_id": "c" * 64, "envforge.warm": True})
            set_attributes(cur, **{"envforge.container_id": "c" * 64})
            bind(container_id="c" * 64)
            log.debug("sandbox ready", extra={"warm": True})
            for turn in range(2):
                with span("rollout.step", **{"envforge.turn": turn}) as st:
                    live.sandbox_command(0.002, "agent")
                    set_attributes(st, **{"envforge.action": "submit", "envforge.exit_code": 0})
            with span("rollout.verify"):
                live.pool_released(True, 0.02)
                with span("verify.grade", **{"envforge.task_id": "t"}) as gr:
                    live.pool_acquired(True)
                    for _ in range(4):
                        live.sandbox_command(0.002, "agent")
                    live.pool_released(True, 0.02)
                    set_attributes(gr, **{"envforge.reward": 1.0})
                live.graded(0.3, True, [])
            set_attributes(cur, **{"envforge.reward": 1.0})
            log.info("trajectory graded", extra={"reward": 1.0})
        live.trajectory_finished("submitted", 2, 0.5, 1.0)
        live.scheduler_in_flight(-1)

    out = {}
    for arm in ("off", "metrics_only", "traces_only", "on"):
        live.set_enabled(arm in ("on", "metrics_only"))
        provider = configure_tracing(InMemorySpanExporter() if arm in ("on", "traces_only") else None)
        t0 = time.process_time()
        for i in range(iterations):
            trajectory(i)
        if provider is not None:
            provider.force_flush()
        out[f"{arm}_us_per_trajectory"] = round(1e6 * (time.process_time() - t0) / iterations, 1)
        configure_tracing(None)
    live.set_enabled(True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base-rev", default="", help="also run the code of this git revision (no instrumentation)")
    ap.add_argument("--worker", default="")
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.samples, args.concurrency, args.data_dir)
        return
    arms = ["on", "off"] + (["base"] if args.base_rev else [])
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        base_platform = ""
        if args.base_rev:
            archive = Path(tmp) / "base.tar"
            subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), args.base_rev, "platform"],
                           check=True)
            with tarfile.open(archive) as tar:
                tar.extractall(Path(tmp) / "base", filter="data")
            base_platform = str(Path(tmp) / "base" / "platform")
        data = Path(tmp) / "data"
        for r in range(args.repeats + 1):  # repeat 0 warms the image cache and the engine: not counted
            for arm in arms[r % len(arms):] + arms[:r % len(arms)]:  # rotated: no arm always runs first
                env = {**os.environ, "ENVFORGE_METRICS": "0" if arm == "off" else "1", "ENVFORGE_TRACES": "off"}
                env["PYTHONPATH"] = base_platform if arm == "base" else str(REPO / "platform")
                if arm == "base":
                    env["BENCH_PLATFORM"] = base_platform
                cmd = [sys.executable, __file__, "--worker", arm, "--samples", str(args.samples), "--concurrency",
                       str(args.concurrency), "--data-dir", str(data)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{arm} run failed:\n{proc.stderr[-3000:]}")
                doc = json.loads(proc.stdout.strip().splitlines()[-1])
                if arm == "base":
                    assert doc["envforge"].startswith(base_platform), doc["envforge"]
                log(f"repeat {r} {arm}: {doc['steps_per_s']} steps/s ({doc['wall_s']} s, {doc['spans']} spans), "
                    f"load {os.getloadavg()[0]:.1f}")
                if r:
                    runs[arm].append(doc)
    med = {a: statistics.median(d["steps_per_s"] for d in runs[a]) for a in arms}
    cpu = {a: statistics.median(d["cpu_ms_per_step"] for d in runs[a]) for a in arms}
    hooks = hook_cost()
    traj_per_s = med["on"] * runs["on"][0]["trajectories"] / runs["on"][0]["steps"]
    out = {
        "tasks": 8, "samples_per_task": args.samples, "concurrency": args.concurrency, "repeats": args.repeats,
        "arms": {a: {"steps_per_s": [d["steps_per_s"] for d in runs[a]], "median_steps_per_s": med[a],
                     "cpu_ms_per_step": [d["cpu_ms_per_step"] for d in runs[a]], "median_cpu_ms_per_step": cpu[a],
                     "spans_per_run": runs[a][0]["spans"] if runs[a] else 0} for a in arms},
        "throughput_on_vs_off": round(med["on"] / med["off"], 4),
        "cpu_per_step_on_vs_off": round(cpu["on"] / cpu["off"], 4),
        "hooks": hooks,
        # the hooks' CPU per trajectory, at the measured throughput, as a share of one core's second
        "hooks_share_of_a_core_at_measured_throughput": round(
            (hooks["on_us_per_trajectory"] - hooks["off_us_per_trajectory"]) * 1e-6 * traj_per_s, 5),
        **({"throughput_on_vs_base": round(med["on"] / med["base"], 4),
            "throughput_off_vs_base": round(med["off"] / med["base"], 4)} if "base" in med else {}),
        "target_min_throughput_ratio": 0.97,
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
