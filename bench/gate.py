"""Benchmark the flakiness gate: the default gate against the full-suite gate, on the same tasks.

    .venv/bin/python bench/gate.py [--quick] [--task ID ...] [--real-repo NAME ...] [--data-dir DIR] [--out FILE]
                                   [--pairs N --pair-task ID ...] [--no-pipeline]

Since 4 December the default gate's order check reverses the verdict's files, not the whole suite,
so on order-dependent-exporters (a test that fails only after another file's tests) the two gates
disagree by design: the full-suite gate quarantines it, the default accepts it (its targeted verdict
never varies; `GateConfig(order_check="suite")` quarantines it as before).

Tasks: the ledger project's tickets, reviews and SWE-bench instances, the geokit project (the
slow suite: about 19 s of CPU per whole-suite run, 14 s of it tests/test_hull.py, which holds
geokit-geo-3's FAIL_TO_PASS test: the case where grading only the task's files does not help),
the two flaky examples (a flaky test, a test that fails after another file), so that verdict
agreement covers quarantines too, and with `--real-repo NAME` the tickets of a bundled real
repository (task_sources/examples/real-repos: humanize, parse, marshmallow). Derivations and
images are cached in the data directory.

Per task, one after the other on one warm pool, each measured in the same run:
- the full-suite gate (the naive alternative): every grading runs the whole suite, every run
  and probe is graded whatever happens, one grading at a time;
- the default gate: the test files that decide the verdict, 2 gradings at a time, early stop,
  shared graded copies.
Both with 5+5 runs, the order check and every probe that applies. On a shared machine the load
changes from one gate to the next, so `--pairs N --pair-task ID` measures those tasks N times,
alternating which gate goes first (full then default, default then full, ...): the median of the
per-pair ratios (`interleaved`) is the figure that load drift affects least.

Prints one JSON document: per-task wall time, sandbox-seconds and gradings of both; per group
(all, ledger, geokit) median and p90 wall time; `ratio_vs_full` (total full-suite wall time
over total default wall time) and the median per-task ratio; `verdict_agreement`; tasks gated
per hour by the pipeline (2 tasks at a time, default gate, measured) and serially (both
gates); and the wall time to re-gate the unchanged tasks (`regate_unchanged_s`; `--no-pipeline`
leaves out these last two, which gate every task once more). Per task, `grading_s` says where the
time went: seconds of graded copies by kind (reference and empty runs, the order check, probes);
`timeline` when each grading ran (start and end, seconds on the batch's clock) and `idle_worker_s`
the worker-seconds with nothing to grade between the first start and the last end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from envforge.catalog import Catalog  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.sandbox.engine import OWNER_LABEL, docker_client, owner_id  # noqa: E402
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
# The flakiness gate itself, as issue 17 measures it: mutation analysis (on by default in the
# gate) is measured on its own by bench/strength.py.
FULL = GateConfig(full_suite=True, workers=1, mutation=False)
DEFAULT = GateConfig(mutation=False)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


SLOW_SUITE_TARGET_S = 90  # the target for a slow-suite task, default gate, every probe, 2 cores


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
    cpu = [(r["full"]["sandbox_cpu_s"], r["default"]["sandbox_cpu_s"]) for r in rows]
    cpu = [(f, n) for f, n in cpu if f is not None and n]
    return {"tasks": len(rows),
            "full_wall_s": {"median": round(statistics.median(full), 2), "p90": round(p90(full), 2)},
            "default_wall_s": {"median": round(statistics.median(new), 2), "p90": round(p90(new), 2)},
            "ratio_vs_full": round(sum(full) / sum(new), 2),
            "ratio_median_per_task": round(statistics.median(f / n for f, n in zip(full, new)), 2),
            "sandbox_s_per_task": {"full": round(statistics.median(r["full"]["sandbox_s"] for r in rows), 2),
                                   "default": round(statistics.median(r["default"]["sandbox_s"] for r in rows), 2)},
            "sandbox_cpu_s_per_task": {"full": round(statistics.median(f for f, _ in cpu), 2),
                                       "default": round(statistics.median(n for _, n in cpu), 2),
                                       "ratio_total": round(sum(f for f, _ in cpu) / sum(n for _, n in cpu), 2)}
            if cpu else None,
            "verdict_agreement": round(sum(r["agree"] for r in rows) / len(rows), 4)}


def gate(grader: Grader, task, image: str, config: GateConfig) -> tuple[GateReport, float]:
    started = time.perf_counter()
    report = validate_task(grader, task, image, config)
    return report, time.perf_counter() - started


CGROUP_CPU = Path("/sys/fs/cgroup/cpuacct/docker")  # cgroup v1, as the engine here runs (docs/sandbox.md)


class SandboxCpu:
    """CPU seconds used by this process's sandboxes, read from their cgroups every 0.2 s.

    Wall time on a shared machine says as much about the neighbours as about the gate; CPU time
    is the gate's own work, and on a quiet machine with 2 gradings at a time the default gate
    takes about half of it in wall time. A container that ends between two samples loses at
    most 0.2 s of what it used after the last one. None (`available` false) where the engine's
    cgroups are not readable as cgroup v1 from here.
    """

    def __init__(self, client) -> None:
        self.client, self.available = client, CGROUP_CPU.is_dir()
        self._owner = owner_id()
        self._mine: dict[str, bool] = {}
        self._used: dict[str, int] = {}  # container id -> last cpuacct.usage (ns)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        if self.available:
            self._thread.start()

    def _is_mine(self, cid: str) -> bool:
        if cid not in self._mine:
            try:
                labels = self.client.api.inspect_container(cid)["Config"]["Labels"] or {}
                self._mine[cid] = labels.get(OWNER_LABEL) == self._owner
            except Exception:  # gone already: it can no longer be counted
                self._mine[cid] = False
        return self._mine[cid]

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def sample(self) -> None:
        for entry in CGROUP_CPU.iterdir():
            if entry.is_dir() and self._is_mine(entry.name):
                try:
                    self._used[entry.name] = max(self._used.get(entry.name, 0),
                                                 int((entry / "cpuacct.usage").read_text()))
                except (OSError, ValueError):
                    pass

    def total_s(self) -> float | None:
        if not self.available:
            return None
        self.sample()
        return sum(self._used.values()) / 1e9

    def close(self) -> None:
        self._stop.set()


def time_by_kind(report: GateReport) -> dict:
    """Seconds of graded copies by kind of grading: where a gate's time goes."""
    kinds: dict[str, float] = {}
    for name, seconds in report.grading_s.items():
        kind = "order_check" if name == "reference:order" else name.split(":", 1)[0]
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    return {k: round(v, 2) for k, v in sorted(kinds.items())}


def idle_worker_s(report: GateReport, workers: int) -> float:
    """Worker-seconds with nothing to grade between the batch's first start and its last end: the
    tail a better order could fill (0 when every worker was busy throughout)."""
    if not report.timeline:
        return 0.0
    span = max(e for _, e in report.timeline.values()) - min(s for s, _ in report.timeline.values())
    return round(max(0.0, workers * span - sum(e - s for s, e in report.timeline.values())), 2)


def describe(report: GateReport, wall: float, load_before: float, cpu_s: float | None,
             workers: int = 1) -> dict:
    return {"verdict": report.verdict, "wall_s": round(wall, 2), "sandbox_s": round(report.sandbox_s, 2),
            "sandbox_cpu_s": None if cpu_s is None else round(cpu_s, 2),
            "gradings": report.gradings, "stopped_early": report.stopped_early,
            "probes": len(report.probe_results), "probes_skipped": len(report.probes_skipped),
            "per_grading_s": round(report.median_verifier_s, 2), "grading_s": time_by_kind(report),
            "load_avg_1m": [load_before, round(os.getloadavg()[0], 2)], "disagreements": report.disagreements[:3],
            "idle_worker_s": idle_worker_s(report, workers),
            "timeline": {name: list(span) for name, span in report.timeline.items()}}


def measure_pair(grader: Grader, task, image: str, default_first: bool, cpu: SandboxCpu,
                 default_only: bool = False) -> dict:
    """Both gates on one task, one after the other (in the order asked), on the same warm pool; with
    `default_only`, the default gate alone (its whole-suite order check gives the cost of one
    whole-suite grading, from which `full_estimate_s` estimates the full-suite gate: 25 of them)."""
    measured = {}
    if default_only:
        load_before, cpu_before = round(os.getloadavg()[0], 2), cpu.total_s()
        report, wall = gate(grader, task, image, DEFAULT)
        cpu_after = cpu.total_s()
        used = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        gradings = 2 * FULL.runs + 1 + len(report.probe_results)
        return {"full": None, "default": describe(report, wall, load_before, used, DEFAULT.workers), "agree": None,
                "full_estimate_s": round(gradings * report.grading_s.get("reference:order", 0.0), 1),
                "full_estimate_gradings": gradings}
    for name in (("default", "full") if default_first else ("full", "default")):
        load_before, cpu_before = round(os.getloadavg()[0], 2), cpu.total_s()
        report, wall = gate(grader, task, image, DEFAULT if name == "default" else FULL)
        cpu_after = cpu.total_s()
        used = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        config = DEFAULT if name == "default" else FULL
        measured[name] = (report, describe(report, wall, load_before, used, config.workers))
    return {"full": measured["full"][1], "default": measured["default"][1],
            "agree": measured["full"][0].accepted == measured["default"][0].accepted, "default_first": default_first}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} tasks (a few minutes)")
    ap.add_argument("--task", action="append", default=[], help="only these task ids")
    ap.add_argument("--real-repo", action="append", default=[], choices=REAL_REPOS,
                    help="also this real repository's tickets (its derivation takes minutes; cached in --data-dir)")
    ap.add_argument("--data-dir", type=Path, help="keep derivations, images and verdicts here (default: a temp dir)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--pairs", type=int, default=1, help="measure each --pair-task this many times, alternating "
                                                         "which gate goes first")
    ap.add_argument("--pair-task", action="append", default=[], help="a task measured --pairs times")
    ap.add_argument("--source", action="append", type=Path, default=[],
                    help="ingest these sources instead of the default ones (ledger, geokit, the flaky examples)")
    ap.add_argument("--default-only", action="append", default=[],
                    help="a task gated by the default gate alone (the full-suite gate is estimated, not measured)")
    ap.add_argument("--no-pipeline", action="store_true", help="leave out the pipeline run and the unchanged re-gate")
    args = ap.parse_args()
    load_avg = {"start": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.from_env().with_data_dir(args.data_dir or Path(tmp))
        settings.ensure_dirs()
        client = docker_client(settings)
        sources = (args.source or SOURCES) + [EXAMPLES / "real-repos" / name for name in args.real_repo]
        log(f"ingesting {', '.join(s.name for s in sources)} (derivations are cached in the data dir)")
        loaded = ingest(settings, IngestConfig(), sources, client=client)
        log(f"{len(loaded.result.tasks)} tasks, {len(loaded.result.rejects)} rejects (the bundled bad records)")
        tasks = Catalog(settings.catalog_path).load_tasks()
        wanted = set(args.task) or (QUICK if args.quick else None)
        tasks = [t for t in tasks if wanted is None or t.id in wanted]
        if args.task:  # in the order asked (e.g. cheap tasks first, so an interrupted run still says something)
            tasks.sort(key=lambda t: args.task.index(t.id))
        image_set = build_images(settings, ImagesConfig(), tasks, client=client).image_set
        images = {t.content_hash: image for t, image in image_set.items(tasks)}
        tasks = [t for t in tasks if t.content_hash in images]
        log(f"{len(tasks)} tasks")
        rows, pairs = [], {}
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        cpu = SandboxCpu(client)
        with SandboxPool(client, max_idle_per_key=2) as pool, Progress(*columns, transient=True) as bar:
            grader = Grader(client, pool)
            progress = bar.add_task("gating", total=len(tasks))
            for task in tasks:
                image = images[task.content_hash]
                pool.preheat(image, count=2)
                repeats = args.pairs if task.id in args.pair_task else 1
                for rep in range(repeats):
                    bar.update(progress, description=f"{task.id}: gating ({rep + 1}/{repeats})")
                    pair = measure_pair(grader, task, image, default_first=rep % 2 == 1, cpu=cpu,
                                        default_only=task.id in args.default_only)
                    if rep == 0:
                        row = {"task_id": task.id, "group": group_of(task.id), **pair}
                        rows.append(row)
                        log("row " + json.dumps(row))  # an interrupted run still leaves what it measured
                    pairs.setdefault(task.id, []).append(pair)
                    full = pair["full"] or {"verdict": "not run", "wall_s": None}
                    log(f"{task.id} pair {rep + 1}: full {full['verdict']} {full['wall_s']}s, "
                        f"default {pair['default']['verdict']} {pair['default']['wall_s']}s")
                bar.advance(progress)
        cpu.close()
        pipeline = {}
        if not args.no_pipeline:
            log("the pipeline's default gate over every task, 2 tasks at a time")
            started = time.perf_counter()
            report = gate_stage(settings, replace(DEFAULT, force=True), tasks, image_set, client=client)
            pipeline_s = time.perf_counter() - started
            started = time.perf_counter()
            again = gate_stage(settings, DEFAULT, tasks, image_set, client=client)
            regate_s = time.perf_counter() - started
            assert len(again.kept) == len(report.reports), "unchanged tasks must keep their verdicts"
            pipeline = {"pipeline_wall_s": round(pipeline_s, 1), "regate_unchanged_s": round(regate_s, 3),
                        "pipeline_default_2_at_a_time_per_hour": round(3600 * len(tasks) / pipeline_s, 1)}
        load_avg["end"] = round(os.getloadavg()[0], 2)
        both = [r for r in rows if r["full"] is not None]
        groups = {g: summary([r for r in both if r["group"] == g]) for g in sorted({r["group"] for r in both})}
        slow = [r for r in rows if r["group"] == "geokit"]
        doc = {
            "benchmark": "gate", "tasks": len(rows), "cpus": os.cpu_count(), "load_avg_1m": load_avg,
            "settings": {"full": FULL.as_params() | {"workers": FULL.workers},
                         "default": DEFAULT.as_params() | {"workers": DEFAULT.workers}},
            **(summary(both) if both else {}), "groups": groups,
            "slow_suite": {"target_s": SLOW_SUITE_TARGET_S,
                           "default_wall_s": {r["task_id"]: r["default"]["wall_s"] for r in slow},
                           "default_sandbox_cpu_s": {r["task_id"]: r["default"]["sandbox_cpu_s"] for r in slow},
                           "whole_suite_grading_s": {r["task_id"]: r["default"]["grading_s"].get("order_check")
                                                     for r in slow},
                           "full_estimate_s": {r["task_id"]: r["full_estimate_s"] for r in slow
                                               if "full_estimate_s" in r},
                           "met": all(r["default"]["wall_s"] <= SLOW_SUITE_TARGET_S for r in slow)} if slow else {},
            "interleaved": {tid: {"ratios": [round(p["full"]["wall_s"] / p["default"]["wall_s"], 2) for p in ps],
                                  "median_ratio": round(statistics.median(p["full"]["wall_s"] / p["default"]["wall_s"]
                                                                          for p in ps), 2),
                                  "default_wall_s": [p["default"]["wall_s"] for p in ps],
                                  "full_wall_s": [p["full"]["wall_s"] for p in ps],
                                  "agree": all(p["agree"] for p in ps)}
                            for tid, ps in pairs.items() if len(ps) > 1 and all(p["full"] for p in ps)},
            "tasks_per_hour": {"serial_default": round(3600 * len(rows) / sum(r["default"]["wall_s"] for r in rows), 1),
                               "serial_full": round(3600 * len(both) / sum(r["full"]["wall_s"] for r in both), 1)
                               if both else None},
            **pipeline,
            "suite_s_per_run": {g: round(statistics.median(r["full"]["per_grading_s"] for r in both
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
