"""What metrics and tracing cost a rollout: the same replay batch with observability on, off, and
(when --base-rev is given) on the code before it existed, run interleaved in fresh processes.

    .venv/bin/python bench/observe_overhead.py [--samples 4] [--concurrency 8] [--repeats 3] [--base-rev REV]

Arms (each run is its own process, so imports and registries start clean; runs are interleaved
arm by arm, repeat by repeat, so a change in the machine's load hits every arm alike):
- `on`: Prometheus hooks on (ENVFORGE_METRICS=1), the registry served on a loopback port, and
  OpenTelemetry spans (per batch, trajectory, step, reset, grade) through the SDK's batch
  processor into an in-memory exporter: everything but the network hop to a collector;
- `off`: ENVFORGE_METRICS=0 and tracing off (the default): the hooks return at once;
- `base`: `git archive` of REV's platform/ (the naive alternative: no instrumentation code at all).

Prints JSON: per arm the steps/s of every run and their median, the ratios on/off and on/base
(throughput kept), and the load average before and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
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
    import envforge
    from envforge.config import Settings
    from envforge.rollout.batch import run_batch
    from envforge.rollout.policies.replay import ReplayPolicy
    from envforge.rollout.scheduler import RolloutConfig
    from envforge.sandbox.engine import docker_client
    from envforge.sandbox.images import build_base_image, build_task_image
    from envforge.sources import load_sources

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
    base = build_base_image(client, settings).tag
    tasks = [t for r in load_sources([REPO / "task_sources" / "specs", REPO / "task_sources" / "runbooks"]).values()
             for t in r.tasks]
    items = [(t, build_task_image(client, t, base, settings).tag) for t in tasks]
    config = RolloutConfig(n_samples=samples, concurrency=concurrency, seed=1)
    started = time.perf_counter()
    result = run_batch(settings, items, ReplayPolicy(), config, "bench", batch_id=f"obs-{arm}-{time.time_ns()}",
                       client=client)
    wall = time.perf_counter() - started
    assert result.metrics["pass_at_1"] == 1.0, result.metrics
    spans = 0
    if exporter is not None:
        provider.force_flush()
        spans = len(exporter.get_finished_spans())
        server.close()
    print(json.dumps({"arm": arm, "envforge": envforge.__file__, "steps": result.report.steps,
                      "trajectories": int(result.metrics["trajectories"]), "wall_s": round(wall, 3),
                      "steps_per_s": round(result.report.steps / wall, 3), "spans": spans}))


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
            for arm in arms:
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
    out = {
        "tasks": 8, "samples_per_task": args.samples, "concurrency": args.concurrency, "repeats": args.repeats,
        "arms": {a: {"steps_per_s": [d["steps_per_s"] for d in runs[a]], "median_steps_per_s": med[a],
                     "spans_per_run": runs[a][0]["spans"] if runs[a] else 0} for a in arms},
        "throughput_on_vs_off": round(med["on"] / med["off"], 4),
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
