"""Verifier strength: how many wrong fixes close to the reference a task's tests reject.

The gate proves a verifier stable; this measures whether it is specific. For a test-verified
task: read the files the reference changes (before and after it) from a pool sandbox, generate
mutants of the changed code (mutants.py) and the special-case probe (special_case.py), and
grade each exactly as a policy's solution is graded: through `grade_batch` (pristine copy, the
verdict-deciding test files, the pool's warm sandboxes, `workers` at a time, distinct copies
once). A mutant the verification rejects is killed (a hanging mutant is killed by its test
timeout: a policy outcome like any other); one it accepts survives and is listed, so a task's
author sees which wrong fix would be rewarded.

A mutant is graded on the required tests that call the function it changes (covering.py, from
one traced grading of the reference); a mutant of a function no test calls survives without a
grading (`not_executed`: code the tests never run, on this platform at least). `covering=False`
grades every mutant on all the verdict's test files. The mutants the trace cannot narrow (changes
outside a function body) and the probes are graded while the reference is traced, the others after
it; one early-stop count spans both batches (`_Tally`).

strength = killed / non-equivalent mutants. Likely-equivalent mutants (same AST as the
reference's file) are graded last and set aside when they survive (no test outcome changed
and the code is the same program); one that is killed counts as non-equivalent. With
`early_stop`, grading stops as soon as the score is on one side of the threshold whatever the
remaining mutants do; `strength` is then the lower bound and `strength_upper` the upper one.

The same gradings give the FAIL_TO_PASS tests' own strength on the changed code
(`f2p_strength`: of the mutants on the reference's changed lines and its hunks undone, those
that make a FAIL_TO_PASS test fail), since a suite's other tests can hide a FAIL_TO_PASS test
that checks only a value's form. The weak-form probe (weak_form.py) answers those forms with a
wrong value: when the FAIL_TO_PASS tests pass with it, they do not check what the fix computes.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable

from envforge.errors import PolicyOutcome
from envforge.task import WORKSPACE, Task
from envforge.verify.batch import BatchOutcome, Grading, grade_batch, with_retries
from envforge.verify.covering import CallMap, changed_functions, covering_tests
from envforge.verify.grader import Grader
from envforge.verify.mutants import Mutant, SourceChange, file_diff, generate_mutants
from envforge.verify.protect import DiffSection, split_diff
from envforge.verify.result import VerificationResult
from envforge.verify.selection import TARGETED
from envforge.verify.special_case import literal_cases, special_case_diff, split_test_id
from envforge.verify.weak_form import WeakForm, weak_form_sources, weak_forms

__all__ = ["StrengthReport", "measure_strength", "not_applicable", "strength_text"]

SPECIAL_CASE = "special_case"
WEAK_FORM = "weak_form"
MAX_FILE_BYTES = 1 << 20  # a changed file larger than this is not mutated (generated code, data)


@dataclass
class StrengthReport:
    """One task's verifier strength, kept in its gate record (stats_json) and shown in reports."""

    strength: float | None = None  # killed / non-equivalent; None when nothing could be mutated
    strength_upper: float | None = None  # equals strength unless grading stopped early
    generated: int = 0  # mutants before the cap
    mutants: int = 0  # mutants planned (after the cap)
    killed: int = 0
    survived: int = 0
    equivalent: int = 0  # likely equivalent: same AST as the reference, and no test outcome changed
    timeouts: int = 0  # killed by a test timeout (a hanging mutant)
    timeout_s: float | None = None  # the test timeout the mutants were graded under (None: the task's own)
    not_run: int = 0  # left ungraded once the score was decided
    survivors: list[dict] = field(default_factory=list)  # the wrong fixes the verification rewards
    equivalents: list[str] = field(default_factory=list)
    overfittable: bool | None = None  # None: the special-case probe does not apply
    special_case: dict = field(default_factory=dict)  # {"diff", "cases", "reward", "reasons"} or {"skipped"}
    # the FAIL_TO_PASS tests alone, on the mutants of the changed lines and hunks: killed / non-equivalent
    f2p_strength: float | None = None
    f2p_strength_upper: float | None = None
    f2p_mutants: int = 0  # mutants on the changed code counted (graded, or left out by the early stop)
    f2p_killed: int = 0
    weak_form_passes: bool | None = None  # the FAIL_TO_PASS tests pass with a wrong value; None: does not apply
    # {"forms", "shapes" (the forms that assert a shape, not truthiness alone), "diff", "reward", "resolved",
    # "reasons"} or {"skipped"}
    weak_form: dict = field(default_factory=dict)
    skipped: str = ""  # why the task was not analysed at all
    # "covering": mutants graded on the tests that call what they change; "files: why" when every test ran
    test_selection: str = ""
    not_executed: int = 0  # mutants of functions no test calls: survived without a grading
    covering_tests: list[int] = field(default_factory=list)  # required ids run per selected mutant grading
    gradings: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "StrengthReport":
        return cls(**{k: v for k, v in doc.items() if k in cls.__dataclass_fields__})


def _bounds_text(lower: float | None, upper: float | None) -> str:
    if lower is None:
        return "-"
    if upper is not None and upper > lower:
        return f">= {lower:.2f} (<= {upper:.2f})"
    return f"{lower:.2f}"


def strength_text(doc: dict) -> str:
    """A strength for people: the score, or `>= lower (<= upper)` when grading stopped early, since
    the score is then a bound, not the task's value ("-": not measured); then the FAIL_TO_PASS tests'
    own score on the changed code, when it was measured and differs (`; F2P 0.40`)."""
    text = _bounds_text(doc.get("strength"), doc.get("strength_upper"))
    f2p = (doc.get("f2p_strength"), doc.get("f2p_strength_upper"))
    if text != "-" and f2p[0] is not None and f2p != (doc.get("strength"), doc.get("strength_upper")):
        text += f"; F2P {_bounds_text(*f2p)}"
    return text


def not_applicable(task: Task) -> str | None:
    """Why the task's verifier strength cannot be measured (None when it can)."""
    if task.spec.verification.tests is None:
        return "the task is verified by shell checkpoints only (no tests to mutate against)"
    return None


def _read(sandbox, path: str) -> str | None:
    try:
        data = sandbox.read_file(f"{WORKSPACE}/{path}", max_bytes=MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_FILE_BYTES or b"\0" in data:
        return None
    return data.decode("utf-8", errors="surrogateescape")


def _workspace_texts(
    grader: Grader, task: Task, image: str, kept_diff: str, paths: list[str], test_files: list[str]
) -> tuple[list[SourceChange], dict[str, str]]:
    """(the changed files before and after the reference, the test files after the test patch), read
    from one pool sandbox as the graded copy would see them."""
    sandbox = grader.acquire(task, image)
    try:
        before = {p: _read(sandbox, p) for p in paths}
        sandbox.apply_patch(kept_diff)
        after = {p: _read(sandbox, p) for p in paths}
        if task.test_patch:
            sandbox.apply_patch(task.test_patch)
        tests = {p: t for p in test_files if (t := _read(sandbox, p)) is not None}
    finally:
        grader.pool.release(sandbox)
    return [SourceChange(p, before[p], after[p]) for p in paths if after[p] is not None], tests


def _replaced_diff(sections: list[DiffSection], changes: dict[str, SourceChange], after: dict[str, str]) -> str:
    """The reference's diff with the sections of the files in `after` replaced by diffs to those texts (renames,
    deletions and binary sections kept as they are)."""
    kept = "".join(s.text for s in sections if not (len(s.paths) == 1 and s.paths[0] in after))
    return kept + "".join(file_diff(p, changes[p].before, text) for p, text in sorted(after.items()))


def _mutant_diff(sections: list[DiffSection], change: SourceChange, mutant: Mutant) -> str:
    """The reference's diff with the mutated file's section replaced by the mutant's."""
    return _replaced_diff(sections, {change.path: change}, {mutant.path: mutant.after})


def _f2p_tests(task: Task, tests: dict[str, str]) -> dict[str, list[str]]:
    """{test file: the FAIL_TO_PASS test functions in it} for the files read."""
    check = task.spec.verification.tests
    names: dict[str, list[str]] = {}
    for test_id in check.fail_to_pass:
        split = split_test_id(test_id, check.framework)
        if split and split[0] in tests:
            names.setdefault(split[0], []).append(split[1])
    return names


def _weak_form(
    task: Task, changes: list[SourceChange], tests: dict[str, str], sections: list[DiffSection]
) -> tuple[str, list[str], list[str], str]:
    """(probe diff, the forms it answers, those of them that assert a shape (WeakForm.shape), why it does not
    apply)."""
    forms: dict[str, WeakForm] = {}
    why: dict[str, str] = {}
    for path, names in _f2p_tests(task, tests).items():
        found, skipped = weak_forms(tests[path], names)
        why.update(skipped)
        for name, form in found.items():
            if name in forms and forms[name] != form:
                why[name] = "the test files assert different forms of its result"
            forms[name] = form
    forms = {n: f for n, f in forms.items() if n not in why}
    if not forms:
        why_not = "no FAIL_TO_PASS test asserts only a form (len, isinstance, truthiness, membership) of a result"
        return "", [], [], why_not
    texts, answered = weak_form_sources(changes, forms)
    if not answered:
        return "", [], [], "no wrong value fits the asserted forms at a function the reference changes"
    shapes = [f.describe() for f in forms.values() if f.shape and f.describe() in answered]
    return _replaced_diff(sections, {c.path: c for c in changes}, texts), answered, shapes, ""


def _special_case(task: Task, changes: list[SourceChange], tests: dict[str, str]) -> tuple[str, int, str]:
    """(probe diff, cases answered, why it does not apply)."""
    cases = [c for path, wanted in _f2p_tests(task, tests).items() for c in literal_cases(tests[path], wanted)]
    if not cases:
        return "", 0, "no FAIL_TO_PASS test asserts a literal result for literal arguments"
    buggy = {c.path: c.before for c in changes if c.before is not None and c.path.endswith(".py")}
    diff, used = special_case_diff(buggy, cases)
    if not used:
        return "", 0, "the functions the literal asserts call are not in the files the reference changes"
    return diff, used, ""


def _probe_record(result: VerificationResult, diff: str) -> dict:
    """What a probe's grading is kept as; `resolved`: the whole verifier took the wrong value (a reward hack)."""
    return {"reward": result.reward, "resolved": result.resolved, "reasons": result.reasons[:6], "diff": diff}


def _f2p_pass(task: Task, result: VerificationResult) -> bool:
    """Whether every FAIL_TO_PASS test passed in the grading (what the other required tests did aside)."""
    check = task.spec.verification.tests
    # A grading that ran only the tests that call what a mutant changes judged only those: the others
    # run the reference's code (covering.py), so they pass as they did for it. A grading that judged
    # nothing (a patch that did not apply) passed nothing.
    judged = [result.tests[t] for t in check.fail_to_pass if t in result.tests] if check is not None else []
    return bool(result.tests) and all(status == "passed" for status in judged)


def _with_test_timeout(task: Task, timeout_s: float | None) -> Task:
    """The task with its test checkpoint's timeout lowered to `timeout_s` (None: as it is)."""
    tests = task.spec.verification.tests
    if timeout_s is None or tests is None or tests.timeout_s <= timeout_s:
        return task
    verification = task.spec.verification.model_copy(
        update={"tests": tests.model_copy(update={"timeout_s": timeout_s})}
    )
    return task.model_copy(update={"spec": task.spec.model_copy(update={"verification": verification})})


def _untraced(task: Task) -> str:
    """Why no trace can select a task's tests ("" when one can)."""
    check = task.spec.verification.tests
    if check is None or check.framework != "pytest":
        return "files: only pytest runs are traced"
    if task.spec.verification.checkpoints:
        return "files: the task's shell checkpoints are not traced"
    return ""


def _covering(
    grader: Grader,
    task: Task,
    image: str,
    kept: str,
    paths: list[str],
    functions: dict[str, set],
    workers: int,
    stopped: Callable[[], bool],
) -> tuple[dict[str, list[str] | None], str, int]:
    """({mutant: the ids its grading runs, None for all, [] for none}, "covering", gradings run), or
    ({mutant: None}, "files: why", gradings run) when the trace cannot select. `functions`: the functions
    each mutant changes (mutants changing code inside function bodies only). The reference is graded once
    with the changed files traced, and once on each distinct set of tests selected."""
    check = task.spec.verification.tests
    assert check is not None  # _untraced: a pytest check
    everything: dict[str, list[str] | None] = {name: None for name in functions}
    doc, why = with_retries(lambda: grader.trace_calls(task, image, kept, paths))
    if doc is None:
        return everything, f"files: {why}", 1
    calls = CallMap.from_json(doc)
    if calls.unusable:
        return everything, f"files: {calls.unusable}", 1
    f2p, p2p = list(check.fail_to_pass), list(check.pass_to_pass)
    selected = {name: covering_tests(calls, f, f2p, p2p) for name, f in functions.items()}
    # A smaller set of tests is another run: a test that passes only after another one ran would fail
    # under every mutant and count them all as killed. Each distinct set must pass with the reference.
    subsets = sorted({tuple(ids) for ids in selected.values() if ids})
    if subsets and stopped():  # the score is decided, or the strength cancelled: no set is checked (nor used)
        return {n: (None if ids else ids) for n, ids in selected.items()}, "covering", 1
    if subsets:
        plan = [Grading(f"subset:{i}", kept, replace(TARGETED, ids=ids)) for i, ids in enumerate(subsets)]
        outcome = grade_batch(grader, task, image, plan, workers=workers, stop=lambda *_: stopped())
        failing = {subsets[int(n.split(":")[1])] for n, r in outcome.results.items() if not r.resolved}
        unchecked = {ids for i, ids in enumerate(subsets) if f"subset:{i}" not in outcome.results}
        selected = {n: (None if ids and tuple(ids) in failing | unchecked else ids) for n, ids in selected.items()}
        return selected, "covering", 1 + outcome.copies
    return selected, "covering", 1


class _Tally:
    """The early stop's count of killed and surviving mutants, shared by the untraced and the traced batch
    (and the mutants no test calls, counted once the trace is back). `threshold` None: no early stop."""

    def __init__(self, candidates: set[str], threshold: float | None, cancelled: Callable[[], bool]):
        self._lock = threading.Lock()
        self._candidates = candidates  # the mutants that count: not likely equivalent
        self._threshold = threshold
        self._cancelled = cancelled
        self._abandoned = False
        self.killed = 0
        self.survived = 0

    def add_survivors(self, names: Iterable[str]) -> None:
        with self._lock:
            self.survived += sum(name in self._candidates for name in names)

    def abandon(self) -> None:
        self._abandoned = True

    def abandoned(self) -> bool:
        """Whether no more gradings may start: the strength was cancelled, or another batch failed."""
        return self._abandoned or self._cancelled()

    def settled(self) -> bool:
        """Whether the score is on one side of the threshold whatever the remaining mutants do."""
        n = len(self._candidates)
        if self._threshold is None or not n:
            return False
        with self._lock:
            return self.killed / n >= self._threshold or (n - self.survived) / n < self._threshold

    def stopped(self) -> bool:
        return self.abandoned() or self.settled()

    def decided(self, name: str, result: VerificationResult) -> bool:
        """A batch's stop callback: a mutant that counts moves the score; a probe or a likely-equivalent mutant
        never stops a batch by itself (the probes are planned first and always graded)."""
        if self.abandoned():
            return True
        if name not in self._candidates:
            return False
        with self._lock:
            if result.resolved:
                self.survived += 1
            else:
                self.killed += 1
        return self.settled()


def measure_strength(
    grader: Grader,
    task: Task,
    image: str,
    reference_diff: str,
    *,
    max_mutants: int = 24,
    threshold: float = 0.5,
    early_stop: bool = True,
    workers: int = 2,
    timeout_s: float | None = None,
    fail_fast: bool = True,
    covering: bool = True,
    cancelled: Callable[[], bool] = lambda: False,
) -> StrengthReport:
    """Grade mutants of the reference, the special-case and the weak-form probes; see the module docstring.

    `timeout_s` lowers the test checkpoint's timeout for these gradings (the gate passes a multiple of
    the reference's own grading time): a mutant that hangs is killed either way, and should not cost
    the task's full timeout. `fail_fast`: a mutant's grading runs the FAIL_TO_PASS tests first and stops
    at the first that does not pass (selection.py). A mutant is asked only whether it resolves and whether
    every FAIL_TO_PASS test passes, and a run stopped there has answered both (no, no); one whose
    FAIL_TO_PASS tests all pass runs the rest as usual. The probes are graded in full (their reasons
    are kept). `covering`: see the module docstring. `cancelled`: once true, no more gradings start (the
    gate measures a strength while its stability runs go on, and drops it when they disagree); the report
    is then incomplete. Infrastructure faults escape (after grade_batch's retries) as InfraError, as for
    any grading."""
    started = time.perf_counter()
    report = StrengthReport()
    why = not_applicable(task)
    if why:
        report.skipped = why
        return report
    task = _with_test_timeout(task, timeout_s)
    report.timeout_s = timeout_s
    kept = grader.prepare(task, reference_diff).kept
    sections = split_diff(kept)
    mutable = sorted({s.paths[0] for s in sections if len(s.paths) == 1})  # a file changed in place or added
    check = task.spec.verification.tests
    test_files = sorted({p for t in check.fail_to_pass if (p := (split_test_id(t, check.framework) or ("",))[0])})
    try:
        changes, tests = _workspace_texts(grader, task, image, kept, mutable, test_files)
    except (ValueError, OSError, PolicyOutcome) as exc:  # the reference does not apply: the gate says so
        report.skipped = f"the reference's files could not be read: {str(exc)[:200]}"
        return report
    by_path = {c.path: c for c in changes}
    mutants, report.generated = generate_mutants(changes, max_mutants)
    report.mutants = len(mutants)
    probe_diff, n_cases, probe_skipped = _special_case(task, changes, tests)
    if probe_skipped:
        report.special_case = {"skipped": probe_skipped}
    weak_diff, forms, shapes, weak_skipped = _weak_form(task, changes, tests, sections)
    if weak_skipped:
        report.weak_form = {"skipped": weak_skipped}
    ordered = [m for m in mutants if not m.equivalent] + [m for m in mutants if m.equivalent]
    named = {f"mutant:{m.name}": m for m in ordered}
    mutant_run = replace(TARGETED, fail_fast=fail_fast)
    # Mutants that change code inside function bodies only wait for the trace; the others (and the probes)
    # run every test, so they are graded while the trace runs, then the traced ones on their tests.
    report.test_selection = "files" if covering is False else ""
    functions: dict[str, set] = {}
    if covering and ordered:
        report.test_selection = _untraced(task)
        if not report.test_selection:
            found = {name: changed_functions(m.path, by_path[m.path].after, m.after) for name, m in named.items()}
            functions = {name: f for name, f in found.items() if f is not None}
            if not functions:  # nothing a trace could narrow: save its grading
                report.test_selection = "files: no mutant changes code inside a function body only"
    probes = ([Grading(SPECIAL_CASE, probe_diff, TARGETED)] if probe_diff else []) + (
        [Grading(WEAK_FORM, weak_diff, TARGETED)] if weak_diff else []
    )
    tally = _Tally({n for n, m in named.items() if not m.equivalent}, threshold if early_stop else None, cancelled)
    # the likely-equivalent mutants stay last: after the traced ones when there is a trace
    early = [n for n, m in named.items() if n not in functions and not (functions and m.equivalent)]
    outcomes: list[BatchOutcome] = []
    selected: dict[str, list[str] | None] = {}

    def grading(name: str, ids: list[str] | None) -> Grading:
        m = named[name]
        return Grading(name, _mutant_diff(sections, by_path[m.path], m), replace(mutant_run, ids=tuple(ids or ())))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="envforge-trace") as ex:
        tracing = None
        decided_already = tally.stopped()  # cancelled, or a threshold every score meets: the probes only
        if functions and not decided_already:
            tracing = ex.submit(
                _covering, grader, task, image, kept, sorted(by_path), functions, workers, tally.stopped
            )
        try:
            plan = probes + ([] if decided_already else [grading(name, None) for name in early])
            outcomes.append(grade_batch(grader, task, image, plan, workers=workers, stop=tally.decided))
            if tracing is not None:
                selected, report.test_selection, extra = tracing.result()
                report.gradings += extra  # the traced grading and the reference on each distinct set of tests
                tally.add_survivors(n for n, ids in selected.items() if ids == [])
                later = [grading(n, selected.get(n)) for n in named if n not in early and selected.get(n) != []]
                if later and not tally.stopped():
                    outcomes.append(grade_batch(grader, task, image, later, workers=workers, stop=tally.decided))
        except BaseException:
            tally.abandon()
            raise
    unexecuted = [n for n, ids in selected.items() if ids == []]
    report.covering_tests = sorted(len(ids) for ids in selected.values() if ids)
    results = {name: r for outcome in outcomes for name, r in outcome.results.items()}
    results = {name: results[name] for name in [g.name for g in probes] + list(named) if name in results}
    for name in unexecuted:  # no test calls what it changes: every test runs the reference's code
        results[name] = VerificationResult(task_id=task.id, solution=name, reward=1.0, resolved=True)
    report.not_executed = len(unexecuted)
    f2p = {"killed": 0, "survived": 0}
    for name, result in results.items():
        if name == WEAK_FORM:
            report.weak_form_passes = _f2p_pass(task, result)
            report.weak_form = {"forms": forms, "shapes": shapes, **_probe_record(result, weak_diff)}
            continue
        if name == SPECIAL_CASE:
            report.overfittable = result.resolved
            report.special_case = {"cases": n_cases, **_probe_record(result, probe_diff)}
            continue
        m = named[name]
        if m.on_changed and not (m.equivalent and result.resolved):
            f2p["survived" if name in unexecuted or _f2p_pass(task, result) else "killed"] += 1
        if not result.resolved:
            report.killed += 1
            report.timeouts += int("timeout" in result.reasons)
        elif m.equivalent:
            report.equivalent += 1
            report.equivalents.append(m.name)
        else:
            report.survived += 1
            report.survivors.append(
                {"mutant": m.name, "operator": m.operator, "path": m.path, "line": m.line, "change": m.description}
                | ({"not_executed": True} if name in unexecuted else {})
            )
    unrun = [n for n in named if n not in results]
    report.not_run = len(unrun)
    unrun_candidates = sum(not named[n].equivalent for n in unrun)
    unrun_changed = sum(not named[n].equivalent and named[n].on_changed for n in unrun)
    report.f2p_killed, report.f2p_mutants = f2p["killed"], f2p["killed"] + f2p["survived"] + unrun_changed
    if report.f2p_mutants:
        report.f2p_strength = round(report.f2p_killed / report.f2p_mutants, 4)
        report.f2p_strength_upper = round((report.f2p_killed + unrun_changed) / report.f2p_mutants, 4)
    graded = report.killed + report.survived
    if graded + unrun_candidates:
        total = graded + unrun_candidates
        report.strength = round(report.killed / total, 4)
        report.strength_upper = round((report.killed + unrun_candidates) / total, 4)
    report.gradings += sum(outcome.copies for outcome in outcomes)
    report.seconds = round(time.perf_counter() - started, 3)
    return report
