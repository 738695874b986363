"""The flakiness gate: a task enters a task set only when its verifier has proven itself.

For each task: grade the empty and the reference solution N times each on pristine copies,
one of the reference's in reversed order (the order check: the test files that decide the
verdict, or with `order_check: suite` the whole suite; the full-suite gate grades the whole
suite once more, N + 1), and every hack probe that applies to the task. Accept only
if the reference passes every time, the empty solution fails every FAIL_TO_PASS test (or, for
checkpoint-only tasks, fails) every time while PASS_TO_PASS passes every time, and every probe
scores 0. Otherwise quarantine, with the disagreement.

The default gate spends runs where they tell something: gradings run only the test files
that decide the verdict (selection.py), in parallel on the pool's warm sandboxes, the first
disagreement stops the task (the verdict is decided), probes whose filtered diff equals
one already graded share its graded copy (batch.py), and a probe's grading runs the
FAIL_TO_PASS tests first and stops at the first that fails (`fail_fast`, selection.py: its
reward is 0 from there on, unless the task gives partial credit). `full_suite=True` is the exhaustive
gate the default is measured against: the whole suite on every grading, every run and
probe graded whatever happens.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from itertools import zip_longest
from pathlib import Path

from envforge.errors import InfraError, PolicyOutcome
from envforge.hashing import digest_parts
from envforge.observe import metrics as live
from envforge.sandbox.container import Sandbox
from envforge.task import Task
from envforge.verify.batch import INFRA_RETRIES, Grading, grade_batch, with_retries
from envforge.verify.config import GateConfig
from envforge.verify.grader import Grader
from envforge.verify.probes import STANDARD_PROBES, Probe, applicable_probes, guard_for
from envforge.verify.protect import split_diff
from envforge.verify.result import VerificationResult
from envforge.verify.selection import SUITE, TARGETED, TestRun
from envforge.verify.strength import StrengthReport, measure_strength

__all__ = [
    "INFRA_RETRIES",
    "GateReport",
    "gate_key",
    "mutant_timeout_s",
    "order_check_is_a_run",
    "probe_diff",
    "validate_task",
]

# Repeated runs start fresh interpreters: they are there to see what varies between runs (selection.py).
ORDER_CHECK = TestRun("suite", "reverse", fresh_interpreter=True)  # the whole suite, reversed
ORDER_CHECK_FILES = TestRun("targeted", "reverse", fresh_interpreter=True)  # the verdict's test files, reversed
# A mutant's tests may run this many times the slowest reference/empty grading (at least the configured
# minimum) before they count as hanging: a hanging mutant is killed either way, without the task's full timeout.
# It was 10: a suite whose tests wait (filelock's: 29 s gradings) paid 293 s per hanging mutant, two of them
# 586 s of one task's 546 s gate. A right mutant 4x slower than the slowest of the task's ten gradings would
# need the machine's load to quadruple within one task's gate (sandbox/admission.py starts no extra run
# while the CPUs are busy). Since 5 December the mutants start after the first reference and empty runs (the
# others run alongside them), so their timeout is 4x the slower of those two.
MUTANT_TIMEOUT_FACTOR = 4
# The gradings after which the strength's gradings start (alongside the remaining stability runs).
FIRST_REFERENCE, FIRST_EMPTY = "reference:run1", "empty:run1"


def mutant_timeout_s(config: GateConfig, verifier_seconds: list[float]) -> float:
    """How long a mutant's tests may run: 4x the slowest of the given gradings (the gate's first reference and
    empty runs, after which the mutants start), at least the config's floor. Each hanging mutant costs this
    much (one worker's slot), so the floor is what a hang costs a fast task."""
    return max(config.mutant_timeout_min_s, MUTANT_TIMEOUT_FACTOR * max(verifier_seconds or [0.0]))


@dataclass
class GateReport:
    task_id: str
    content_hash: str
    accepted: bool
    disagreements: list[str] = field(default_factory=list)
    reference_passes: int = 0
    empty_fails: int = 0
    runs: int = 0  # reference runs graded, the order check among them in the default gate (fewer when stopped early)
    probe_results: dict[str, dict] = field(default_factory=dict)
    verifier_seconds: list[float] = field(default_factory=list)
    infra_retries: int = 0
    empty_runs: int = 0
    probes_skipped: dict[str, str] = field(default_factory=dict)  # probe -> why it does not apply
    not_run: list[str] = field(default_factory=list)  # gradings left out once the verdict was decided
    gradings: int = 0  # graded copies actually run
    grading_s: dict[str, float] = field(default_factory=dict)  # seconds of each graded copy run, by grading
    sandbox_s: float = 0.0
    wall_s: float = 0.0
    timeline: dict[str, tuple[float, float]] = field(default_factory=dict)  # grading -> (start, end) s, batch's clock
    image_digest: str = ""
    gate_key: str = ""
    reused_from: datetime | None = None  # set when an unchanged task kept an earlier verdict
    strength: StrengthReport | None = None  # verifier strength (GateConfig.mutation), else not measured
    admission: str = ""  # "audit": accepted into the audit split only (a weak verifier, below_strength=audit)

    @property
    def verdict(self) -> str:
        return "accepted" if self.accepted else "quarantined"

    @property
    def median_verifier_s(self) -> float:
        return statistics.median(self.verifier_seconds) if self.verifier_seconds else 0.0

    @property
    def stopped_early(self) -> bool:
        return bool(self.not_run)

    def stats(self) -> dict:
        """What the verdict cost, and what it left out: kept with the verdict in the catalog."""
        return {
            "empty_runs": self.empty_runs,
            "probes_skipped": self.probes_skipped,
            "not_run": self.not_run,
            "gradings": self.gradings,
            "sandbox_s": round(self.sandbox_s, 3),
            "wall_s": round(self.wall_s, 3),
            **({"strength": self.strength.as_json()} if self.strength is not None else {}),
            **({"admission": self.admission} if self.admission else {}),
        }

    @property
    def strength_score(self) -> float | None:
        return self.strength.strength if self.strength is not None else None

    @classmethod
    def from_row(cls, row: dict) -> "GateReport":
        """A stored verdict (a `validations` row) as the report of an unchanged task that keeps it."""
        stats = json.loads(row.get("stats_json") or "{}")
        return cls(
            task_id=row["task_id"],
            content_hash=row["content_hash"],
            accepted=row["verdict"] == "accepted",
            disagreements=list(row["disagreements"]),
            reference_passes=row["reference_passes"],
            empty_fails=row["empty_fails"],
            runs=row["runs"],
            probe_results=json.loads(row["probes_json"]),
            verifier_seconds=[row["verifier_median_s"]],
            infra_retries=row["infra_retries"],
            empty_runs=stats.get("empty_runs", row["runs"]),
            probes_skipped=stats.get("probes_skipped", {}),
            not_run=stats.get("not_run", []),
            gradings=stats.get("gradings", 0),
            sandbox_s=stats.get("sandbox_s", 0.0),
            wall_s=stats.get("wall_s", 0.0),
            image_digest=row["image_digest"],
            gate_key=row["gate_key"],
            reused_from=row["created_at"],
            strength=StrengthReport.from_json(stats["strength"]) if stats.get("strength") else None,
            admission=stats.get("admission", ""),
        )


@lru_cache(maxsize=1)
def verifier_digest() -> str:
    """The grader, gate, probes and runners' code: a new envforge that grades differently re-gates."""
    root = Path(__file__).parent
    return digest_parts(*[f"{p.relative_to(root)}\0{p.read_text()}" for p in sorted(root.rglob("*.py"))])[:16]


def gate_sandboxes_per_task(config: GateConfig) -> int:
    """The sandboxes one task's gate acquires (what a sandbox provider is told to expect): the reference
    and the empty solution graded `runs` times each, the reference diff and a shuffled run, and each
    hack probe with its grade."""
    return 2 * config.runs + 2 + (2 * len(STANDARD_PROBES) if config.probes else 0)


def gate_key(task: Task, image_digest: str, config: GateConfig) -> str:
    """What a verdict depends on: the task's content, its image, the gate parameters and the verifier code.

    A task whose key is unchanged keeps its verdict (the nightly refresh re-gates only what changed).
    """
    return digest_parts(
        task.content_hash, image_digest, json.dumps(config.as_params(), sort_keys=True), verifier_digest()
    )


def probe_diff(grader: Grader, task: Task, image: str, probe: Probe, reference_paths: tuple[str, ...] = ()) -> str:
    """Run a probe's script as a policy's commands would run, and return the workspace diff it leaves."""
    sandbox: Sandbox = grader.acquire(task, image)
    try:
        env = task.spec.environment
        sandbox.exec(
            probe.script(task, reference_paths), timeout_s=120, env=env.command_env(), workdir=env.command_workdir()
        )
        return sandbox.diff()
    except PolicyOutcome:
        return ""  # a probe whose workspace cannot be diffed scores what the empty diff scores
    finally:
        grader.pool.release(sandbox)


def _judge(task: Task, name: str, result: VerificationResult) -> list[str]:
    """The disagreements one grading shows (none when it behaved as a verified task's must)."""
    kind, _, which = name.partition(":")
    if kind == "reference" and which == "order":
        return [] if result.resolved else [f"reference_failed_reversed_order:{','.join(result.reasons)}"]
    if kind == "reference":
        return [] if result.resolved else [f"reference_failed:{which}:{','.join(result.reasons)}"]
    if kind == "empty":
        tests = task.spec.verification.tests
        if tests is None:
            return [f"empty_resolved:{which}"] if result.resolved else []
        passed_f2p = [t for t in tests.fail_to_pass if result.tests.get(t) == "passed"]
        failed_p2p = [t for t in tests.pass_to_pass if result.tests.get(t) != "passed"]
        return [f"empty_passed_fail_to_pass:{t}:{which}" for t in passed_f2p] + [
            f"empty_failed_pass_to_pass:{t}:{which}" for t in failed_p2p
        ]
    return [f"probe_scored:{which}:{result.reward}"] if result.reward > 0 else []


def order_check_run(config: GateConfig) -> TestRun:
    """What the order check grades. Every grading runs the test files that decide the verdict, so the
    order within them is what a verdict can depend on: reversed, every pair of their tests runs the other
    way round. The whole suite reversed (`order_check: suite`, and the full-suite gate) also sees a test
    that fails only after another file's tests ran first, which no targeted grading meets; for a slow
    suite that costs the whole suite's time on every task (filelock's: 130 s)."""
    return ORDER_CHECK if config.full_suite or config.order_check == "suite" else ORDER_CHECK_FILES


def order_check_is_a_run(config: GateConfig) -> bool:
    """Whether the order check is one of the reference's `runs` (the default gate) rather than one more.

    The order check grades the reference on every required test (reversed), so it
    is a reference run as much as a targeted one is: the default gate grades the reference `runs - 1`
    times on its files and once in the order check, `runs` gradings of every required test in all, as
    many as the empty solution gets. At least one reference run stays targeted, the way rollouts are
    graded. The full-suite gate (the gate as it was) grades the order check once more.
    """
    return config.shuffle and not config.full_suite and config.runs > 1


def _plan(
    task: Task, ref_diff: str, config: GateConfig, grader: Grader, image: str, report: GateReport
) -> list[Grading]:
    """The gradings of one task, most telling first: the first reference and empty runs, the order
    check, the remaining runs, then the probes."""
    run = SUITE if config.full_suite else TARGETED
    share = not config.full_suite
    ref_runs = config.runs - 1 if order_check_is_a_run(config) else config.runs
    repeated = replace(run, fresh_interpreter=True)
    ref = [Grading(f"reference:run{i}", ref_diff, repeated, share=False) for i in range(1, ref_runs + 1)]
    empty = [Grading(f"empty:run{i}", "", repeated, share=False) for i in range(1, config.runs + 1)]
    plan = [ref[0], empty[0]]
    if config.shuffle:
        plan.append(Grading("reference:order", ref_diff, order_check_run(config), share=False))
    plan += [g for pair in zip_longest(ref[1:], empty[1:]) for g in pair if g is not None]
    if config.probes:
        probes, report.probes_skipped = applicable_probes(task)
        ref_paths = tuple(p for section in split_diff(ref_diff) for p in section.paths)
        probe_run = replace(run, fail_fast=share and not task.spec.verification.partial_credit)
        for probe in probes:
            plan.append(
                Grading(
                    f"probe:{probe.name}",
                    lambda probe=probe: probe_diff(grader, task, image, probe, ref_paths),
                    probe_run,
                    share,
                )
            )
    return plan


def validate_task(grader: Grader, task: Task, image: str, config: GateConfig = GateConfig()) -> GateReport:
    started = time.perf_counter()
    report = GateReport(task.id, task.content_hash, accepted=False)

    def retried() -> None:
        report.infra_retries += 1

    ref_diff, ref_failures = with_retries(lambda: grader.solution_diff(task, image, "reference"), retried)
    if task.reference_patch is None:  # the reference commands ran in a sandbox
        report.sandbox_s += time.perf_counter() - started
    report.disagreements += [f"reference_{f}" for f in ref_failures]
    plan = _plan(task, ref_diff, config, grader, image, report)
    if ref_failures and not config.full_suite:  # the reference's own commands failed: decided already
        report.not_run = [g.name for g in plan]
        report.wall_s = time.perf_counter() - started
        return report

    planned = {g.name for g in plan}
    # The strength is measured while the remaining stability runs go on (a slow task's critical path is
    # otherwise its stability runs, then its trace, then its mutants), from the moment the first reference
    # and empty runs agree; it is dropped if a later grading disagrees.
    first: dict[str, VerificationResult | None] = {n: None for n in (FIRST_REFERENCE, FIRST_EMPTY) if n in planned}
    disagreed = threading.Event()
    measuring = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envforge-strength")
    strength: Future | None = None

    def stop(name: str, result: VerificationResult) -> bool:
        nonlocal strength
        judged = bool(_judge(task, name, result))
        if judged:
            disagreed.set()
        if name in first:
            first[name] = result
            if config.mutation and strength is None and not disagreed.is_set() and None not in first.values():
                timeout_s = mutant_timeout_s(config, [r.duration_s for r in first.values() if r is not None])
                strength = measuring.submit(_strength, grader, task, image, ref_diff, config, timeout_s, disagreed)
        return not config.full_suite and judged

    if report.disagreements:  # the full-suite gate grades everything even when the reference's commands failed
        disagreed.set()
    try:
        outcome = grade_batch(grader, task, image, plan, workers=config.workers, stop=stop)
    except BaseException:
        disagreed.set()  # stop the strength's gradings; the executor waits for those running
        raise
    finally:
        measuring.shutdown(wait=True)
    for name, result in outcome.results.items():
        report.disagreements += _judge(task, name, result)
        if name not in outcome.shared_with:
            report.grading_s[name] = round(result.duration_s, 3)
        kind, _, which = name.partition(":")
        if kind in ("reference", "empty") and which != "order":
            report.verifier_seconds.append(result.duration_s)
        if kind == "reference" and (which != "order" or order_check_is_a_run(config)):
            report.runs += 1
            report.reference_passes += int(result.resolved)
        elif kind == "empty":
            report.empty_runs += 1
            report.empty_fails += int(not _judge(task, name, result))
        elif kind == "probe":
            diff = outcome.diffs.get(name)
            entry = {"reward": result.reward, "guard": guard_for(result, diff), "reasons": result.reasons[:6]}
            if name in outcome.shared_with:
                entry["graded_as"] = outcome.shared_with[name]
            report.probe_results[which] = entry
    report.not_run = outcome.not_run
    report.timeline = outcome.timeline
    report.gradings = outcome.copies
    report.sandbox_s += outcome.sandbox_s
    report.infra_retries += outcome.infra_retries
    if strength is not None:  # strength only matters for a verifier that is stable
        try:
            measured: StrengthReport = strength.result()
        except InfraError:
            if not report.disagreements:
                raise
        else:  # a strength measured for a verifier that disagreed is dropped, its gradings counted
            report.gradings += measured.gradings
            if not report.disagreements:
                _judge_strength(measured, config, report)
    report.accepted = not report.disagreements
    report.wall_s = time.perf_counter() - started
    live.gate_judged(report.accepted, report.disagreements)
    return report


def strength_findings(
    strength: StrengthReport, min_strength: float, block_overfittable: bool = True, weak_fail_to_pass: str = "shape"
) -> list[str]:
    """Why a measured verifier is too weak for training (empty when it is strong enough)."""
    out = []
    if strength.strength_upper is not None and strength.strength_upper < min_strength:
        out.append(
            f"weak_verifier:strength {strength.strength:.2f} < {min_strength:g} "
            f"({strength.survived} of {strength.killed + strength.survived} mutants survive)"
        )
    if strength.weak_form_passes and strength.weak_form.get("resolved"):
        forms = "; ".join(strength.weak_form.get("forms", []))
        out.append(f"weak_verifier:weak_form_probe is rewarded for a wrong value ({forms})")
    elif strength.weak_form_passes and weak_fail_to_pass != "report":
        # Only the FAIL_TO_PASS tests took the wrong value (a PASS_TO_PASS test refused it). A shape (`len(...) ==
        # 1`, a type, membership) checks no content; truthiness alone counts only with 'any': the demo's good
        # tickets assert predicates truthy (`assert can_charge(...)`), which is their whole value.
        taken = strength.weak_form.get("forms" if weak_fail_to_pass == "any" else "shapes") or []
        if taken:
            out.append(
                f"weak_verifier:weak_form_probe passes the FAIL_TO_PASS tests with a wrong value ({'; '.join(taken)})"
            )
    if strength.overfittable and block_overfittable:
        out.append(f"overfittable:special_case_probe answers {strength.special_case.get('cases', 0)} literal case(s)")
    return out


def _strength(
    grader: Grader,
    task: Task,
    image: str,
    ref_diff: str,
    config: GateConfig,
    timeout_s: float,
    disagreed: threading.Event,
) -> StrengthReport:
    return measure_strength(
        grader,
        task,
        image,
        ref_diff,
        max_mutants=config.max_mutants,
        threshold=config.min_strength,
        early_stop=config.mutation_early_stop,
        workers=config.workers,
        timeout_s=timeout_s,
        fail_fast=config.mutant_fail_fast,
        covering=config.mutant_tests == "covering",
        cancelled=disagreed.is_set,
    )


def _judge_strength(strength: StrengthReport, config: GateConfig, report: GateReport) -> None:
    """Keep the task's verifier strength and apply the gate's policy for weak ones."""
    report.strength = strength
    findings = strength_findings(strength, config.min_strength, config.block_overfittable, config.weak_fail_to_pass)
    if findings and config.below_strength == "audit":
        report.admission = "audit"
    else:
        report.disagreements += findings
