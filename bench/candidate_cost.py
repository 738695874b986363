"""Seconds per history candidate, end to end (ingest + gate), before vs after issue #30's cost cuts.

    .venv/bin/python bench/candidate_cost.py --source DIR [--cuts forks|scope|covering] [--pairs N] [--out FILE]

`DIR` is one source folder (a history.yaml over a repository, e.g. /tmp/bundles-c/src/tomli with
ENVFORGE_SOURCE_ROOTS=/tmp/bundles-c). Each side of a pair ingests it into a fresh data directory
(images come from the Docker cache, the derivation cache starts empty) and gates every task it
derived with the default gate (mutation on), in this process, one side after the other:

`--cuts forks` (the default; the cuts of 3 December):

- `before`: the code path as it was: every derivation runs the reversed after-run
  (`run_derivation(always_reverse=True)`), every mutant's tests run in full
  (`GateConfig(mutant_fail_fast=False)`), every test command starts a fresh interpreter
  (`checkpoints.launcher_program` answers None: no fork server) and every reset is a full one
  (`Sandbox.trust_until_reset` does nothing);
- `after`: the defaults (the reversed run is left out when the first two runs already reject;
  mutants graded fail-fast; test commands forked from a preloaded interpreter where they can be;
  the gate's and the derivation's sandboxes reset by restoring only what changed).

`--cuts scope` (the cuts of 4 December, for suites that are slow or that wait):

- `before`: every derivation runs the whole suite (`derive.scoped_runs` answers None), the gate's
  order check reverses the whole suite (`GateConfig(order_check="suite")`), and the derivation and
  the gate run a fixed number of sandboxes at once (`ENVFORGE_SANDBOX_CEILING=1`: the floor);
- `after`: the defaults (the derivation runs the test files the change touches, the order check
  reverses the verdict's files, more sandboxes start while the CPUs have room).

`--cuts covering` (the cut of 5 December, for suites whose verdict files are slow):

- `before`: every mutant is graded on all the verdict's test files (`GateConfig(mutant_tests="files")`);
- `after`: the default, each mutant runs the required tests that call the function it changes, and
  a mutant of a function no required test calls survives ungraded (verify/covering.py).

The derivation is the same on both sides; only the gate's mutant gradings differ.

The derived tasks' content differs between these sides by design (their metadata says what the
runs covered), so tasks are compared by id and FAIL_TO_PASS / PASS_TO_PASS lists
(`same_test_lists`); a whole-suite derivation may find FAIL_TO_PASS tests outside the change's files.

Pairs alternate which side goes first, so load drift on the shared machine falls on both sides; the
figure to quote is the median of the per-pair ratios. Per run it counts where the time went: suite
runs of the derivation, graded copies, probe scripts, container starts, resets, and the seconds of
the test commands themselves against the whole of each grading (the rest is sandbox overhead:
acquire, reset, patches, cache purge, verifier files). Then it checks that both sides reached the
same verdicts: the same derived tasks (content hashes), the same rejects, the same verdict and kinds
of disagreement per task, and strength bounds that agree (with the mutation early stop a bound
depends on which gradings were in flight when the score was decided, so equal bounds are reported
apart from consistent ones: overlapping, on the same side of `min_strength`).

Prints one JSON document (and writes it to --out).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from envforge.catalog import Catalog  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.sandbox import pool as pool_mod  # noqa: E402
from envforge.sandbox.container import Sandbox  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sources import derive  # noqa: E402
from envforge.stages.configs import ImagesConfig, IngestConfig  # noqa: E402
from envforge.stages.gate import gate as gate_stage  # noqa: E402
from envforge.stages.images import build_images  # noqa: E402
from envforge.stages.ingest import ingest  # noqa: E402
from envforge.verify import checkpoints  # noqa: E402
from envforge.verify import gate as gate_mod  # noqa: E402
from envforge.verify.config import GateConfig  # noqa: E402
from envforge.verify.grader import Grader  # noqa: E402

CUTS = {
    "forks": {
        "before": {"always_reverse": True, "gate": GateConfig(force=True, mutant_fail_fast=False), "cuts": False},
        "after": {"always_reverse": False, "gate": GateConfig(force=True), "cuts": True},
    },
    "scope": {
        "before": {"always_reverse": False, "gate": GateConfig(force=True, order_check="suite"), "cuts": True,
                   "whole_suite": True, "ceiling": "1"},
        "after": {"always_reverse": False, "gate": GateConfig(force=True), "cuts": True},
    },
    "covering": {
        "before": {"always_reverse": False, "gate": GateConfig(force=True, mutant_tests="files"), "cuts": True},
        "after": {"always_reverse": False, "gate": GateConfig(force=True), "cuts": True},
    },
}
SIDES = CUTS["forks"]
ORIGINAL_SCOPED_RUNS = derive.scoped_runs
ORIGINAL_LAUNCHER_PROGRAM = checkpoints.launcher_program
ORIGINAL_TRUST = Sandbox.trust_until_reset


def use_cuts(on: bool) -> None:
    """The fork server and the changed-only resets on (the defaults) or off (the code path before them)."""
    checkpoints.launcher_program = ORIGINAL_LAUNCHER_PROGRAM if on else (lambda command: None)
    Sandbox.trust_until_reset = ORIGINAL_TRUST if on else (lambda self: None)  # type: ignore[method-assign]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class Ops:
    """Counts and seconds of the sandbox operations a run makes (wrapped where they are looked up)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def wrap(self, owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.ops[label][0] += 1
                    self.ops[label][1] += time.perf_counter() - started

        setattr(owner, name, timed)

    def take(self) -> dict:
        with self.lock:
            out = {k: {"n": int(n), "s": round(s, 2)} for k, (n, s) in sorted(self.ops.items())}
            self.ops.clear()
        return out


OPS = Ops()
OPS.wrap(derive, "_run", "derivation_suite_runs")
OPS.wrap(Grader, "run_copy", "graded_copies")
OPS.wrap(gate_mod, "probe_diff", "probe_scripts")
OPS.wrap(checkpoints, "_run_reported", "test_commands")
OPS.wrap(pool_mod.SandboxPool, "_start", "container_starts")
OPS.wrap(pool_mod.SandboxPool, "release", "releases_with_reset")
ORIGINAL_RUN_DERIVATION = derive.run_derivation


def load() -> float:
    return round(os.getloadavg()[0], 2)


def one_side(side: str, source: Path, tmp: Path, run_no: int) -> dict:
    derive.run_derivation = functools.partial(ORIGINAL_RUN_DERIVATION, always_reverse=SIDES[side]["always_reverse"])
    use_cuts(SIDES[side]["cuts"])
    derive.scoped_runs = (lambda candidate: None) if SIDES[side].get("whole_suite") else ORIGINAL_SCOPED_RUNS
    if SIDES[side].get("ceiling"):
        os.environ["ENVFORGE_SANDBOX_CEILING"] = SIDES[side]["ceiling"]
    else:
        os.environ.pop("ENVFORGE_SANDBOX_CEILING", None)
    settings = Settings.from_env().with_data_dir(tmp / f"{side}-{run_no}")
    settings.ensure_dirs()
    client = docker_client(settings)
    load_start = load()
    OPS.take()
    started = time.perf_counter()
    loaded = ingest(settings, IngestConfig(), [source], client=client)
    ingest_s = time.perf_counter() - started
    ingest_ops = OPS.take()
    tasks = Catalog(settings.catalog_path).load_tasks()
    started = time.perf_counter()
    image_set = build_images(settings, ImagesConfig(), tasks, client=client).image_set
    gated = gate_stage(settings, SIDES[side]["gate"], tasks, image_set, client=client)
    gate_s = time.perf_counter() - started
    gate_ops = OPS.take()
    records = len(loaded.result.tasks) + len(loaded.result.rejects)
    verdicts = {}
    for r in gated.reports:
        s = r.strength
        verdicts[r.task_id] = {
            "verdict": r.verdict,
            "disagreements": r.disagreements,
            "kinds": sorted(d.split(" ", 1)[0] for d in r.disagreements),
            "admission": r.admission,
            "strength": None if s is None else [s.strength, s.strength_upper],
            "f2p_strength": None if s is None else [s.f2p_strength, s.f2p_strength_upper],
            "mutant_gradings": None if s is None else s.gradings,
            "strength_s": None if s is None else s.seconds,
            "gate_s": round(r.wall_s, 2),
        }
    row = {
        "side": side,
        "run": run_no,
        "records": records,
        "tasks": sorted(t.id for t in loaded.result.tasks),
        "test_lists": {t.id: [t.spec.verification.tests.fail_to_pass, t.spec.verification.tests.pass_to_pass]
                       for t in loaded.result.tasks if t.spec.verification.tests is not None},
        "content_hashes": sorted(t.content_hash for t in loaded.result.tasks),
        "rejects": sorted(f"{p.source}|{p.reason}" for p in loaded.result.rejects),
        "ingest_s": round(ingest_s, 2),
        "gate_s": round(gate_s, 2),
        "s_per_candidate": round((ingest_s + gate_s) / max(1, records), 2),
        "load": {"start": load_start, "end": load()},
        "ops": {"ingest": ingest_ops, "gate": gate_ops},
        "verdicts": verdicts,
    }
    derive.run_derivation = ORIGINAL_RUN_DERIVATION
    derive.scoped_runs = ORIGINAL_SCOPED_RUNS
    os.environ.pop("ENVFORGE_SANDBOX_CEILING", None)
    use_cuts(True)
    return row


def _overlap(a: list | None, b: list | None) -> bool:
    if a is None or b is None or a[0] is None or b[0] is None:
        return a == b
    return max(a[0], b[0]) <= min(a[1], b[1])


def compare(before: dict, after: dict, threshold: float) -> dict:
    """Whether two runs reached the same verdicts (see the module docstring)."""
    out = {
        "same_tasks": before["content_hashes"] == after["content_hashes"],
        "same_task_ids": before["tasks"] == after["tasks"],
        "same_test_lists": before.get("test_lists") == after.get("test_lists"),
        "same_rejects": [r.split("|")[0] for r in before["rejects"]] == [r.split("|")[0] for r in after["rejects"]],
        "same_reject_reasons": before["rejects"] == after["rejects"],
        "tasks": {},
    }
    for task_id in sorted(set(before["verdicts"]) | set(after["verdicts"])):
        b, a = before["verdicts"].get(task_id), after["verdicts"].get(task_id)
        if b is None or a is None:
            out["tasks"][task_id] = {"same_verdict": False}
            continue
        side = [None if v["strength"] is None or v["strength"][0] is None
                else (v["strength"][0] >= threshold, v["strength"][1] >= threshold) for v in (b, a)]
        out["tasks"][task_id] = {
            "same_verdict": b["verdict"] == a["verdict"] and b["kinds"] == a["kinds"] and b["admission"] == a["admission"],
            "strength_bounds_equal": b["strength"] == a["strength"] and b["f2p_strength"] == a["f2p_strength"],
            "strength_bounds_consistent": _overlap(b["strength"], a["strength"])
            and _overlap(b["f2p_strength"], a["f2p_strength"]) and side[0] == side[1],
        }
    out["all_same_verdicts"] = out["same_task_ids"] and out["same_test_lists"] and out["same_rejects"] and all(
        t["same_verdict"] for t in out["tasks"].values())
    out["all_bounds_consistent"] = all(t.get("strength_bounds_consistent") for t in out["tasks"].values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="one source folder (history.yaml)")
    ap.add_argument("--cuts", choices=sorted(CUTS), default="forks",
                    help="which cuts the sides differ by (see the module docstring)")
    ap.add_argument("--pairs", type=int, default=1, help="before/after pairs, alternating which goes first")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args()
    global SIDES
    SIDES = CUTS[args.cuts]
    threshold = GateConfig().min_strength
    runs = []
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="candidate-cost-") as tmp:
        for pair in range(args.pairs):
            order = ("before", "after") if pair % 2 == 0 else ("after", "before")
            for side in order:
                log(f"pair {pair + 1}: {side} (load {load()})")
                row = one_side(side, args.source.resolve(), Path(tmp), pair)
                log(f"pair {pair + 1}: {side}: ingest {row['ingest_s']} s, gate {row['gate_s']} s, "
                    f"{row['s_per_candidate']} s per candidate, load {row['load']}")
                runs.append(row)
                if args.out:  # an interrupted run still leaves what it measured
                    args.out.write_text(json.dumps({"runs": runs}, indent=1))
    by_pair = [(runs[2 * i], runs[2 * i + 1]) for i in range(len(runs) // 2)]
    by_pair = [(x, y) if x["side"] == "before" else (y, x) for x, y in by_pair]
    per_side = {side: [r["s_per_candidate"] for r in runs if r["side"] == side] for side in SIDES}
    doc = {
        "bench": "candidate_cost",
        "source": str(args.source),
        "cuts": args.cuts,
        "started": started_at,
        "ended": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "s_per_candidate": {side: {"median": round(statistics.median(v), 2), "runs": v} for side, v in per_side.items()},
        "ingest_s": {side: statistics.median(r["ingest_s"] for r in runs if r["side"] == side) for side in SIDES},
        "gate_s": {side: statistics.median(r["gate_s"] for r in runs if r["side"] == side) for side in SIDES},
        "ratio_before_over_after": round(statistics.median(b["s_per_candidate"] / a["s_per_candidate"]
                                                           for b, a in by_pair), 2),
        "verdicts": [compare(b, a, threshold) for b, a in by_pair],
        "runs": runs,
    }
    doc["all_same_verdicts"] = all(v["all_same_verdicts"] for v in doc["verdicts"])
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
