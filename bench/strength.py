"""Benchmark verifier strength (mutation analysis) on bundled test-verified tasks.

    .venv/bin/python bench/strength.py [--quick] [--task ID ...] [--real-repo NAME ...] [--max-mutants N]
                                       [--data-dir DIR] [--out FILE]

Tasks: the ledger project's tickets, reviews and SWE-bench instances (all test-verified), and with
`--real-repo NAME` a bundled real repository's tickets (task_sources/examples/real-repos).

Per task, one after the other on one warm pool, each measured in the same run:
- `gate`: the default gate without mutation (what a task costs today);
- `gate_mutation`: the default gate with mutation on (cap, 2 gradings at a time, early stop at the
  default minimum strength): its wall time minus `gate`'s is what mutation adds per task;
- `full`: every capped mutant graded, 2 at a time (no early stop): the exact score, for the
  distribution, the survivors and the equivalents;
- `naive`: the same mutants graded one at a time without early stop (the naive alternative).

Prints one JSON document: mutants per task (generated before the cap, graded), seconds per task
(each mode: median, p90), ratios naive/full and naive/added (what mutation adds to the gate), the score distribution and a
PNG histogram of it (envforge.charts.strength_chart), overfittable tasks, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))
sys.path.insert(0, str(REPO))  # bench.gate's helpers

from bench.gate import log, p90, print_json  # noqa: E402
from envforge.catalog import Catalog  # noqa: E402
from envforge.charts import strength_chart  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.pool import SandboxPool  # noqa: E402
from envforge.stages.configs import ImagesConfig, IngestConfig  # noqa: E402
from envforge.stages.images import build_images  # noqa: E402
from envforge.stages.ingest import ingest  # noqa: E402
from envforge.verify.config import GateConfig  # noqa: E402
from envforge.errors import InfraError  # noqa: E402
from envforge.verify.gate import mutant_timeout_s, validate_task  # noqa: E402
from envforge.verify.grader import Grader  # noqa: E402
from envforge.verify.strength import measure_strength, not_applicable  # noqa: E402

EXAMPLES = REPO / "task_sources" / "examples"
SOURCES = [REPO / "task_sources" / "projects" / "ledger"]
REAL_REPOS = ("humanize", "parse", "marshmallow")
QUICK = {"ledger-led-118", "ledger-gh-3", "ledger-review-pr-22-c1", "acme__ledger-31"}


def spread(xs: list[float]) -> dict:
    if not xs:
        return {}
    return {"median": round(statistics.median(xs), 2), "p90": round(p90(xs), 2), "total": round(sum(xs), 1)}


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, round(time.perf_counter() - started, 2)


def measure_task(args, grader: Grader, task, image: str, base: GateConfig, with_mutation: GateConfig) -> dict | None:
    """One task's row (None: the flakiness gate quarantines it, so mutation would not run)."""
    seconds, gated = {}, None
    if not args.strength_only:
        plain, seconds["gate"] = timed(lambda: validate_task(grader, task, image, base))
        if not plain.accepted:
            log(f"{task.id}: quarantined by the flakiness gate, skipped ({plain.disagreements[:2]})")
            return None
        gated, seconds["gate_mutation"] = timed(lambda: validate_task(grader, task, image, with_mutation))
        seconds["added"] = round(seconds["gate_mutation"] - seconds["gate"], 2)
    ref = task.reference_patch or grader.solution_diff(task, image, "reference")[0]
    # the mutant timeout the gate would use (10x the reference's grading, at least the config's floor)
    reference_s = grader.grade(task, image, ref).duration_s
    timeout_s = mutant_timeout_s(base, [reference_s])
    full, seconds["full"] = timed(lambda: measure_strength(
        grader, task, image, ref, max_mutants=args.max_mutants, threshold=base.min_strength, early_stop=False,
        timeout_s=timeout_s))
    row = {"task_id": task.id, "load_avg_1m": round(os.getloadavg()[0], 2),
           "generated": full.generated, "mutants": full.mutants, "strength": full.strength,
           "killed": full.killed, "survived": full.survived, "equivalent": full.equivalent,
           "timeouts": full.timeouts, "overfittable": full.overfittable,
           "special_case": {k: v for k, v in full.special_case.items() if k != "diff"},
           "survivors": [f"{v['path']}:{v['line']} {v['operator']}: {v['change']}" for v in full.survivors],
           "seconds": seconds}
    if gated is not None:
        row["gate_mutation"] = {"verdict": gated.verdict, "admission": gated.admission,
                                "graded": gated.strength.killed + gated.strength.survived
                                + gated.strength.equivalent if gated.strength else 0,
                                "disagreements": gated.disagreements[:2]}
    if not args.no_naive:
        _, seconds["naive"] = timed(lambda: measure_strength(
            grader, task, image, ref, max_mutants=args.max_mutants, early_stop=False, workers=1, timeout_s=timeout_s))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} ledger tasks")
    ap.add_argument("--task", action="append", default=[], help="only these task ids")
    ap.add_argument("--real-repo", action="append", default=[], choices=REAL_REPOS)
    ap.add_argument("--no-ledger", action="store_true", help="only the --real-repo tasks")
    ap.add_argument("--max-mutants", type=int, default=GateConfig().max_mutants)
    ap.add_argument("--no-naive", action="store_true", help="skip the serial no-early-stop run")
    ap.add_argument("--strength-only", action="store_true",
                    help="skip the two gate runs per task (only the exact score and its cost: `full`)")
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load_avg = {"start": round(os.getloadavg()[0], 2)}
    base = GateConfig(max_mutants=args.max_mutants, mutation=False)  # the gate without mutation
    with_mutation = replace(base, mutation=True)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env().with_data_dir(args.data_dir or Path(tmp))
        settings.ensure_dirs()
        client = docker_client(settings)
        sources = ([] if args.no_ledger else SOURCES) + [EXAMPLES / "real-repos" / name / "tickets.yaml"
                                                         for name in args.real_repo]
        loaded = ingest(settings, IngestConfig(), sources, client=client)
        log(f"{len(loaded.result.tasks)} tasks ingested")
        wanted = set(args.task) or (QUICK if args.quick else None)
        tasks = [t for t in Catalog(settings.catalog_path).load_tasks()
                 if (wanted is None or t.id in wanted) and not_applicable(t) is None]
        image_set = build_images(settings, ImagesConfig(), tasks, client=client).image_set
        images = {t.content_hash: image for t, image in image_set.items(tasks)}
        tasks = [t for t in tasks if t.content_hash in images]
        log(f"{len(tasks)} test-verified tasks")
        rows, infra = [], []
        with SandboxPool(client, max_idle_per_key=2) as pool:
            grader = Grader(client, pool)
            for i, task in enumerate(tasks, start=1):
                image = images[task.content_hash]
                try:
                    pool.preheat(image, count=2)
                    row = measure_task(args, grader, task, image, base, with_mutation)
                except InfraError as exc:  # the engine went away: recorded, never a score
                    log(f"{task.id}: infrastructure fault, not measured: {exc}")
                    infra.append({"task_id": task.id, "fault": str(exc)[:300]})
                    continue
                if row is None:
                    continue
                rows.append(row)
                log(f"[{i}/{len(tasks)}] {task.id}: strength {row['strength']} ({row['killed']}/"
                    f"{row['killed'] + row['survived']}, {row['equivalent']} equivalent, {row['generated']} generated), "
                    f"{row['seconds']}")
                log("row " + json.dumps(row))
        load_avg["end"] = round(os.getloadavg()[0], 2)
        scores = [r["strength"] for r in rows if r["strength"] is not None]
        chart = strength_chart(scores, base.min_strength, (args.out.parent if args.out else settings.charts_dir)
                               / "strength-bench.png") if scores else None
        secs = {mode: [r["seconds"][mode] for r in rows if mode in r["seconds"]]
                for mode in ("gate", "gate_mutation", "added", "full", "naive")}
        doc = {
            "benchmark": "strength", "tasks": len(rows), "cpus": os.cpu_count(), "load_avg_1m": load_avg,
            "settings": with_mutation.as_params(),
            "mutants_per_task": {"generated": spread([r["generated"] for r in rows]),
                                 "graded_full": spread([r["mutants"] for r in rows]),
                                 **({"graded_gate": spread([r["gate_mutation"]["graded"] for r in rows
                                                            if "gate_mutation" in r])}
                                    if any("gate_mutation" in r for r in rows) else {})},
            "seconds_per_task": {mode: spread(v) for mode, v in secs.items() if v},
            "ratio_naive_vs_full": round(sum(secs["naive"]) / sum(secs["full"]), 2) if secs["naive"] else None,
            "ratio_naive_vs_added": round(sum(secs["naive"]) / sum(secs["added"]), 2)
            if secs["naive"] and secs["added"] and sum(secs["added"]) > 0 else None,
            "strength": {"median": round(statistics.median(scores), 3) if scores else None,
                         "histogram": {f"{b / 10:.1f}": sum(1 for s in scores if b / 10 <= s < (b + 1) / 10 or
                                                            (b == 9 and s == 1.0)) for b in range(10)},
                         "below_min": sum(s < base.min_strength for s in scores)},
            "overfittable": [r["task_id"] for r in rows if r["overfittable"]],
            "chart": str(chart) if chart else None,
            "infra_faults": infra,
            "per_task": rows,
        }
    print_json(doc, args.out)


if __name__ == "__main__":
    main()
