"""Benchmark the rollout scheduler with the replay policy on the bundled specs and runbooks.

    .venv/bin/python bench/rollout.py [--samples N] [--out FILE]

Prints one JSON document:
- for 1, 8, 16 and 32 concurrent trajectories (same tasks, same samples): wall time, steps
  per second, trajectories per minute, pool hit rate, and the scheduler's own time per step
  (median; everything but the policy, the sandbox commands, grading and pool calls);
- the naive alternative, measured in the same run: the same trajectories one after another,
  each on a cold container (a pool that keeps nothing warm, so every sandbox and every
  grading copy is started fresh and destroyed after);
- `ratio_vs_sequential`: best concurrent throughput over the sequential cold throughput, and
  `scheduler_overhead_ms_per_step` (median over all concurrent runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))
sys.path.insert(0, str(REPO))  # bench.bundled

from bench.bundled import rollout_items  # noqa: E402
from envforge.catalog import Catalog  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.rollout.batch import run_batch  # noqa: E402
from envforge.rollout.policies.replay import ReplayPolicy  # noqa: E402
from envforge.rollout.scheduler import RolloutConfig  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.pool import SandboxPool  # noqa: E402


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def measure(settings, items, concurrency: int, samples: int, client, pool=None, label: str = "") -> dict:
    config = RolloutConfig(n_samples=samples, concurrency=concurrency, seed=1)
    started = time.perf_counter()
    result = run_batch(settings, items, ReplayPolicy(), config, "bench", batch_id=f"bench-{label}-{time.time_ns()}",
                       client=client, pool=pool, register=Catalog(settings.catalog_path).record_rollout_batch)
    wall = time.perf_counter() - started
    rep = result.report
    n = int(result.metrics["trajectories"])
    assert result.metrics["pass_at_1"] == 1.0, "the replay policy must solve every bundled task"
    overhead = sorted(rep.step_overhead_s)
    return {"concurrency": concurrency, "trajectories": n, "steps": rep.steps, "wall_s": round(wall, 2),
            "steps_per_s": round(rep.steps / wall, 3), "trajectories_per_min": round(60 * n / wall, 1),
            "pool_hit_rate": round(rep.pool_hit_rate, 3), "infra_retries": rep.infra_retries,
            "scheduler_overhead_ms_per_step_p50": round(1000 * statistics.median(overhead), 3) if overhead else None,
            "scheduler_overhead_ms_per_step_p90": round(1000 * overhead[int(0.9 * (len(overhead) - 1))], 3)
            if overhead else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8, help="samples per task (8 tasks); 8 is a typical GRPO group")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    base_settings = Settings.from_env()
    client = docker_client(base_settings)
    with tempfile.TemporaryDirectory() as tmp:
        settings = base_settings.with_data_dir(Path(tmp))
        settings.ensure_dirs()
        items = rollout_items(client, settings)
        log(f"{len(items)} tasks x {args.samples} samples")
        log("sequential, cold container per trajectory (naive)")
        with SandboxPool(client, max_idle_per_key=0) as cold:
            sequential = measure(settings, items, 1, args.samples, client, pool=cold, label="seq")
        runs = []
        for c in (1, 8, 16, 32):
            log(f"concurrency {c}, warm pool")
            runs.append(measure(settings, items, c, args.samples, client, label=f"c{c}"))
    best = max(runs, key=lambda r: r["steps_per_s"])
    overheads = [r["scheduler_overhead_ms_per_step_p50"] for r in runs if r["scheduler_overhead_ms_per_step_p50"]]
    doc = {
        "tasks": len(items), "samples_per_task": args.samples, "sequential_cold": sequential, "concurrent": runs,
        "best_concurrency": best["concurrency"],
        "ratio_vs_sequential": round(best["steps_per_s"] / sequential["steps_per_s"], 2),
        "scheduler_overhead_ms_per_step": round(statistics.median(overheads), 3) if overheads else None,
        "targets": {"scheduler_overhead_ms_per_step_max": 2.0, "ratio_vs_sequential_min": 4.0},
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
