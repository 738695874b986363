"""Twin tasks for verifier strength (issue #30 item 7): the same fix, one FAIL_TO_PASS test checking the merged
values, the other only `len(result) == 1`, graded on the real engine.

    .venv/bin/python bench/strength_twins.py [--out FILE]

Per twin: the exact strength (every capped mutant graded, no early stop) and the FAIL_TO_PASS tests' own
score, the survivors, the weak-form probe's outcome, and the default gate's verdict (early stop on) with
its gradings and seconds. The tasks are the ones tests/test_strength.py builds (the same texts).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))
sys.path.insert(0, str(REPO))

from bench.gate import log, print_json  # noqa: E402
from envforge.config import Settings  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.images import build_base_image, build_task_image  # noqa: E402
from envforge.sources.specs import load_spec_file  # noqa: E402
from envforge.verify.config import GateConfig  # noqa: E402
from envforge.verify.gate import validate_task  # noqa: E402
from envforge.verify.grader import Grader  # noqa: E402
from envforge.verify.mutants import file_diff  # noqa: E402
from envforge.verify.strength import measure_strength  # noqa: E402
from tests.test_strength import MERGE_P2P  # noqa: E402
from tests.test_strength_units import MERGE_BUGGY, MERGE_FIXED, STRONG_MERGE_TEST, WEAK_MERGE_TEST  # noqa: E402


def twin(root: Path, name: str, tests: str):
    """A pytest task: records.py (buggy), its tests, the reference patch."""
    (root / "workspace" / "tests").mkdir(parents=True)
    (root / "workspace" / "records.py").write_text(MERGE_BUGGY)
    (root / "workspace" / "tests" / "test_records.py").write_text(tests + MERGE_P2P)
    (root / "solution.patch").write_text(file_diff("records.py", MERGE_BUGGY, MERGE_FIXED))
    ids = "tests/test_records.py::"
    spec = {"id": f"twin-{name}", "instruction": "Merge records with the same id.",
            "environment": {"image": "base", "files": "workspace"},
            "verification": {"tests": {"framework": "pytest", "timeout_s": 60, "fail_to_pass": [ids + "test_merge"],
                                       "pass_to_pass": [ids + "test_distinct_ids_are_kept"]}},
            "reference_solution": {"patch": "solution.patch"}}
    (root / "task.yaml").write_text(yaml.safe_dump(spec))
    return load_spec_file(root / "task.yaml")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    load = {"start": round(os.getloadavg()[0], 2)}
    settings = Settings.from_env()
    client = docker_client(settings)
    base = build_base_image(client, settings).tag
    rows = {}
    with tempfile.TemporaryDirectory() as tmp, Grader(client) as grader:
        for name, tests in (("strong", STRONG_MERGE_TEST), ("weak", WEAK_MERGE_TEST)):
            task = twin(Path(tmp) / name, name, tests)
            image = build_task_image(client, task, base, settings).tag
            try:
                started = time.perf_counter()
                s = measure_strength(grader, task, image, task.reference_patch, early_stop=False)
                exact_s = round(time.perf_counter() - started, 1)
                started = time.perf_counter()
                gate = validate_task(grader, task, image, GateConfig(runs=1, shuffle=False, probes=False))
                gate_s = round(time.perf_counter() - started, 1)
            finally:
                client.images.remove(image, force=True)
            rows[name] = {
                "exact": {"strength": s.strength, "f2p_strength": s.f2p_strength, "mutants": s.mutants,
                          "killed": s.killed, "survived": s.survived, "f2p_killed": s.f2p_killed,
                          "f2p_mutants": s.f2p_mutants, "survivors": [v["change"] for v in s.survivors],
                          "weak_form_passes": s.weak_form_passes,
                          "weak_form": s.weak_form.get("forms") or s.weak_form.get("skipped"),
                          "gradings": s.gradings, "seconds": exact_s},
                "gate": {"accepted": gate.accepted, "disagreements": gate.disagreements,
                         "strength": gate.strength.strength if gate.strength else None,
                         "strength_upper": gate.strength.strength_upper if gate.strength else None,
                         "not_run": gate.strength.not_run if gate.strength else None,
                         "gradings": gate.gradings, "seconds": gate_s},
            }
            log(f"{name}: {rows[name]}")
    load["end"] = round(os.getloadavg()[0], 2)
    print_json({"benchmark": "strength_twins", "load_avg_1m": load, "twins": rows}, args.out)


if __name__ == "__main__":
    main()
