"""The flakiness gate: a task enters a task set only when its verifier has proven itself.

For each task: grade the empty and the reference solution N times each in fresh (reset)
sandboxes, optionally once more with the test order shuffled, and run every standard hack
probe. Accept only if the reference passes every time, the empty solution fails every
FAIL_TO_PASS test (or, for checkpoint-only tasks, fails) every time while PASS_TO_PASS
passes every time, and every probe scores 0. Otherwise quarantine, with the disagreement.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from envforge.errors import InfraError, PolicyOutcome
from envforge.sandbox.container import Sandbox
from envforge.task import Task
from envforge.verify.config import GateConfig
from envforge.verify.grader import Grader, options_for
from envforge.verify.probes import STANDARD_PROBES, Probe, guard_for
from envforge.verify.result import VerificationResult

INFRA_RETRIES = 2


@dataclass
class GateReport:
    task_id: str
    content_hash: str
    accepted: bool
    disagreements: list[str] = field(default_factory=list)
    reference_passes: int = 0
    empty_fails: int = 0
    runs: int = 0
    probe_results: dict[str, dict] = field(default_factory=dict)
    verifier_seconds: list[float] = field(default_factory=list)
    infra_retries: int = 0

    @property
    def verdict(self) -> str:
        return "accepted" if self.accepted else "quarantined"

    @property
    def median_verifier_s(self) -> float:
        return statistics.median(self.verifier_seconds) if self.verifier_seconds else 0.0


def _with_retries(fn: Callable[[], VerificationResult], report: GateReport) -> VerificationResult:
    for attempt in range(INFRA_RETRIES + 1):
        try:
            return fn()
        except InfraError:
            if attempt == INFRA_RETRIES:
                raise
            report.infra_retries += 1
    raise AssertionError("unreachable")


def probe_diff(grader: Grader, task: Task, image: str, probe: Probe) -> str:
    sandbox: Sandbox = grader.pool.acquire(image, options_for(task))
    try:
        sandbox.exec(probe.script(task), timeout_s=120)
        return sandbox.diff()
    except PolicyOutcome:
        return ""  # a probe whose workspace cannot be diffed scores what the empty diff scores
    finally:
        grader.pool.release(sandbox)


def validate_task(grader: Grader, task: Task, image: str, config: GateConfig = GateConfig()) -> GateReport:
    report = GateReport(task.id, task.content_hash, accepted=False, runs=config.runs)
    tests = task.spec.verification.tests
    ref_diff, ref_failures = grader.solution_diff(task, image, "reference")
    if ref_failures:
        report.disagreements += [f"reference_{f}" for f in ref_failures]
    for run in range(1, config.runs + 1):
        ref = _with_retries(lambda: grader.grade(task, image, ref_diff, "reference"), report)
        report.verifier_seconds.append(ref.duration_s)
        if ref.resolved:
            report.reference_passes += 1
        else:
            report.disagreements.append(f"reference_failed:run{run}:{','.join(ref.reasons)}")
        empty = _with_retries(lambda: grader.grade(task, image, "", "empty"), report)
        report.verifier_seconds.append(empty.duration_s)
        empty_ok = not empty.resolved
        if tests is not None:
            passed_f2p = [t for t in tests.fail_to_pass if empty.tests.get(t) == "passed"]
            failed_p2p = [t for t in tests.pass_to_pass if empty.tests.get(t) != "passed"]
            empty_ok = not passed_f2p and not failed_p2p
            report.disagreements += [f"empty_passed_fail_to_pass:{t}:run{run}" for t in passed_f2p]
            report.disagreements += [f"empty_failed_pass_to_pass:{t}:run{run}" for t in failed_p2p]
        elif not empty_ok:
            report.disagreements.append(f"empty_resolved:run{run}")
        report.empty_fails += int(empty_ok)
    if config.shuffle:
        shuffled = _with_retries(lambda: grader.grade(task, image, ref_diff, "reference", shuffle_seed=1), report)
        if not shuffled.resolved:
            report.disagreements.append(f"reference_failed_shuffled:{','.join(shuffled.reasons)}")
    if config.probes and tests is not None:
        for probe in STANDARD_PROBES:
            diff = probe_diff(grader, task, image, probe)
            res = _with_retries(lambda: grader.grade(task, image, diff, f"probe:{probe.name}"), report)
            report.probe_results[probe.name] = {"reward": res.reward, "guard": guard_for(res),
                                                "reasons": res.reasons[:6]}
            if res.reward > 0:
                report.disagreements.append(f"probe_scored:{probe.name}:{res.reward}")
    report.accepted = not report.disagreements
    return report
