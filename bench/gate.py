"""Benchmark the flakiness gate: the default gate against the full-suite gate, on the same tasks.

    .venv/bin/python bench/gate.py [--quick] [--task ID ...] [--real-repo NAME ...] [--data-dir DIR] [--out FILE]

Tasks: the ledger project's tickets, reviews and SWE-bench instances, the geokit project (the
slowest suite: ~5 s per run on a quiet machine), the two flaky examples (a flaky test, a test that fails after another
file), so that verdict agreement covers quarantines too, and with `--real-repo NAME` the tickets
of a bundled real repository (task_sources/examples/real-repos: humanize, parse, marshmallow).
Derivations and images are cached in the data directory.

Per task, one after the other on one warm pool, each measured in the same run:
- the full-suite gate (the naive alternative): every grading runs the whole suite, every run
  and probe is graded whatever happens, one grading at a time;
- the default gate: the test files that decide the verdict, 2 gradings at a time, early stop,
  shared graded copies.
Both with 5+5 runs, the order check and every probe that applies.

Prints one JSON document: per-task wall time, sandbox-seconds and gradings of both; per group
(all, ledger, geokit) median and p90 wall time; `ratio_vs_full` (total full-suite wall time
over total default wall time) and the median per-task ratio; `verdict_agreement`; tasks gated
per hour by the pipeline (2 tasks at a time, default gate, measured) and serially (both
gates); and the wall time to re-gate the unchanged tasks (`regate_unchanged_s`).
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

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from envforge.catalog import Catalog  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.pool import SandboxPool  # noqa: E402
from envforge.stages.configs import ImagesConfig, IngestConfig  # noqa: E402
from envforge.stages.gate import gate as gate_stage  # noqa: E402
from envforge.stages.images import build_images  # noqa: E402
from envforge.stages.ingest import ingest  # noqa: E402
from envforge.verify.config import GateConfig  # noqa: E402
from envforge.verify.gate import GateReport, validate_task  # noqa: E402
from envforge.verify.grader import Grader  # noqa: E402

EXAMPLES = REPO / "task_sources" / "examples"
SOURCES = [REPO / "task_sources" / "projects" / "ledger", EXAMPLES / "geokit", EXAMPLES / "flaky-ttl-cache",
           EXAMPLES / "order-dependent-exporters"]
REAL_REPOS = ("humanize", "parse", "marshmallow")  # task_sources/examples/real-repos/<name>, on request
QUICK = {"ledger-led-118", "ledger-gh-3", "ledger-review-pr-22-c1", "acme__ledger-31", "geokit-geo-3",
         "flaky-ttl-cache", "order-dependent-exporters"}
FULL = GateConfig(full_suite=True, workers=1)
DEFAULT = GateConfig()


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def group_of(task_id: str) -> str:
    if task_id.startswith("geokit-"):
        return "geokit"
    if task_id.startswith(tuple(f"{name}-" for name in REAL_REPOS)):
        return "real-repos"
    return "ledger" if "ledger" in task_id else "flaky"


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))]


def summary(rows: list[dict]) -> dict:
    full, new = [r["full"]["wall_s"] for r in rows], [r["default"]["wall_s"] for r in rows]
    return {"tasks": len(rows),
            "full_wall_s": {"median": round(statistics.median(full), 2), "p90": round(p90(full), 2)},
            "default_wall_s": {"median": round(statistics.median(new), 2), "p90": round(p90(new), 2)},
            "ratio_vs_full": round(sum(full) / sum(new), 2),
            "ratio_median_per_task": round(statistics.median(f / n for f, n in zip(full, new)), 2),
            "sandbox_s_per_task": {"full": round(statistics.median(r["full"]["sandbox_s"] for r in rows), 2),
                                   "default": round(statistics.median(r["default"]["sandbox_s"] for r in rows), 2)},
            "verdict_agreement": round(sum(r["agree"] for r in rows) / len(rows), 4)}


def gate(grader: Grader, task, image: str, config: GateConfig) -> tuple[GateReport, float]:
    started = time.perf_counter()
    report = validate_task(grader, task, image, config)
    return report, time.perf_counter() - started


def describe(report: GateReport, wall: float) -> dict:
    return {"verdict": report.verdict, "wall_s": round(wall, 2), "sandbox_s": round(report.sandbox_s, 2),
            "gradings": report.gradings, "stopped_early": report.stopped_early,
            "probes": len(report.probe_results), "probes_skipped": len(report.probes_skipped),
            "per_grading_s": round(report.median_verifier_s, 2), "disagreements": report.disagreements[:3]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} tasks (a few minutes)")
    ap.add_argument("--task", action="append", default=[], help="only these task ids")
    ap.add_argument("--real-repo", action="append", default=[], choices=REAL_REPOS,
                    help="also this real repository's tickets (its derivation takes minutes; cached in --data-dir)")
    ap.add_argument("--data-dir", type=Path, help="keep derivations, images and verdicts here (default: a temp dir)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load_avg = {"start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env().with_data_dir(args.data_dir or Path(tmp))
        settings.ensure_dirs()
        client = docker_client(settings)
        sources = SOURCES + [EXAMPLES / "real-repos" / name for name in args.real_repo]
        log(f"ingesting {', '.join(s.name for s in sources)} (derivations are cached in the data dir)")
        loaded = ingest(settings, IngestConfig(), sources, client=client)
        log(f"{len(loaded.result.tasks)} tasks, {len(loaded.result.rejects)} rejects (the bundled bad records)")
        tasks = Catalog(settings.catalog_path).load_tasks()
        wanted = set(args.task) or (QUICK if args.quick else None)
        tasks = [t for t in tasks if wanted is None or t.id in wanted]
        image_set = build_images(settings, ImagesConfig(), tasks, client=client).image_set
        images = {t.content_hash: image for t, image in image_set.items(tasks)}
        tasks = [t for t in tasks if t.content_hash in images]
        log(f"{len(tasks)} tasks")
        rows = []
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with SandboxPool(client, max_idle_per_key=2) as pool, Progress(*columns, transient=True) as bar:
            grader = Grader(client, pool)
            progress = bar.add_task("gating", total=len(tasks))
            for task in tasks:
                image = images[task.content_hash]
                pool.preheat(image, count=2)
                bar.update(progress, description=f"{task.id}: full-suite gate")
                full, full_s = gate(grader, task, image, FULL)
                bar.update(progress, description=f"{task.id}: default gate")
                new, new_s = gate(grader, task, image, DEFAULT)
                row = {"task_id": task.id, "group": group_of(task.id), "full": describe(full, full_s),
                       "default": describe(new, new_s), "agree": full.accepted == new.accepted,
                       "load_avg_1m": round(os.getloadavg()[0], 2)}
                rows.append(row)
                log(f"{task.id}: full {full.verdict} {full_s:.1f}s, default {new.verdict} {new_s:.1f}s")
                log("row " + json.dumps(row))  # an interrupted run still leaves what it measured
                bar.advance(progress)
        log("the pipeline's default gate over every task, 2 tasks at a time")
        started = time.perf_counter()
        report = gate_stage(settings, replace(DEFAULT, force=True), tasks, image_set, client=client)
        pipeline_s = time.perf_counter() - started
        started = time.perf_counter()
        again = gate_stage(settings, DEFAULT, tasks, image_set, client=client)
        regate_s = time.perf_counter() - started
        assert len(again.kept) == len(report.reports), "unchanged tasks must keep their verdicts"
        load_avg["end"] = round(os.getloadavg()[0], 2)
        groups = {g: summary([r for r in rows if r["group"] == g]) for g in sorted({r["group"] for r in rows})}
        doc = {
            "benchmark": "gate", "tasks": len(rows), "cpus": os.cpu_count(), "load_avg_1m": load_avg,
            "settings": {"full": FULL.as_params() | {"workers": FULL.workers},
                         "default": DEFAULT.as_params() | {"workers": DEFAULT.workers}},
            **summary(rows), "groups": groups,
            "tasks_per_hour": {"pipeline_default_2_at_a_time": round(3600 * len(tasks) / pipeline_s, 1),
                               "serial_default": round(3600 * len(rows) / sum(r["default"]["wall_s"] for r in rows), 1),
                               "serial_full": round(3600 * len(rows) / sum(r["full"]["wall_s"] for r in rows), 1)},
            "pipeline_wall_s": round(pipeline_s, 1), "regate_unchanged_s": round(regate_s, 3),
            "suite_s_per_run": {g: round(statistics.median(r["full"]["per_grading_s"] for r in rows
                                                           if r["group"] == g), 2) for g in groups},
            "per_task": rows,
        }
    print_json(doc, args.out)


def print_json(doc: dict, out: Path | None) -> None:
    """The benchmark's JSON document on stdout, and in `out` when given."""
    text = json.dumps(doc, indent=1)
    if out:
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
