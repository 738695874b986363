"""FAIL_TO_PASS / PASS_TO_PASS by running a candidate's test suite before and after its change.

For each candidate, in sandboxes of its own image (the workspace before the change):

- *before*: the held-back test change only, in file order;
- *after*: the source change and the test change, twice: in file order, then again in reverse
  order (every pair of tests runs the other way round, as in the gate's order check). The
  reversed run is left out when the first two runs already show no FAIL_TO_PASS candidate (no
  test passes after the change that did not pass before): a second after-run can only take ids
  away, so the candidate is rejected either way, one run sooner.

What the runs cover follows PASS_TO_PASS's scope. By default (`tests.pass_to_pass: test-files`)
they run the test files the change touches, as the SWE-bench harness does: those are the files
a task built from the change grades, and a suite whose whole run takes minutes (filelock's: 130 s
for 1,306 tests, mostly waiting on locks) would otherwise cost minutes per candidate for tests
that cannot enter the task. If those files collect no test at all (the change touched only
fixtures, helpers or a conftest.py), the runs fall back to the whole suite. With
`tests.pass_to_pass: suite` they run the whole suite, which also finds FAIL_TO_PASS tests in
files the change does not touch.

A test is kept only if both runs of the after state agree on it. Ids that are not found again (they
change between runs: memory addresses, timestamps, random parametrization) and tests whose
outcome changes with the order are excluded and named in the task's metadata with the reason.
FAIL_TO_PASS pass after and did not pass before (failed, errored, or did not exist or
collect); PASS_TO_PASS pass in both and, by default, sit in a test file the change touches or
that holds a FAIL_TO_PASS test (the SWE-bench harness's scope: grading runs only those files;
how many passing tests lie elsewhere goes to the task's metadata, and a source's
`tests.pass_to_pass: suite` keeps them all). A test that passed before and fails after was
broken by the fix: it is left out of both lists and recorded (`broken_by_change`). Ids that
could never match a report (control characters, tabs, a space at either end: `task.valid_test_id`)
are left out and listed as `unselectable_tests`.

Then the derived ids are graded by the grader itself, the reference solution and the empty
one, once each; ids that do not reproduce are dropped and the check runs once more. The first check
grades the ids of the file-order runs while the reversed run goes, since that run can only take ids
away; it counts when the final ids lie in the test files it graded (else a check of the final ids
runs after). A candidate with
no FAIL_TO_PASS left is rejected with the reason: the counts, the excluded tests, and the
first lines of any collection error (`ModuleNotFoundError: No module named 'freezegun'`).

Every run loads the pytest plugins the candidate's env layer installed and recorded (`-p`, after
the source's own `tests.plugins`; `sandbox/envlayer.py`), and the task keeps that list.

Results are cached by (image, patches, test command) under the data directory, so
re-ingesting an unchanged source (the sensor, the nightly refresh) costs no sandbox time. A
derivation in which any run hit the test timeout is used but not cached: a timeout may be the
machine's load rather than the change, and a cached one would reject the record for good.
Infrastructure faults (a sandbox or an image build killed from outside, a fleet node lost
mid-run) are retried: an image build once, a derivation from its start up to
DERIVATION_ATTEMPTS times, on a fresh sandbox (on the fleet, a surviving node); nothing of a
failed attempt is used or cached. A candidate whose retries run out is reported as a reject with
an `infra:` reason, never as a verdict on the record (the next ingest tries again).

The sandboxes come from the provider the caller hands down (`sandboxes`: the fleet when the
process chose it, docs/fleet.md), else from a warm pool on this process's engine. Images are
built here either way; a node that lacks a candidate's image builds it from the same recipe,
after receiving its parent (the base, or the repository's env layer) from a holder.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence, TypeVar

import docker
from requests.exceptions import RequestException

from envforge import gitstore
from envforge.config import Settings
from envforge.errors import ImageBuildError, InfraError, Problem, SpecError
from envforge.hashing import digest_parts
from envforge.progress import Progress, no_progress
from envforge.safefs import write_atomic
from envforge.sandbox.admission import admission_for, admitted
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import ImageBuild, build_base_image, build_task_image
from envforge.sandbox.provider import Pool, SandboxProvider, or_local
from envforge.settings import read_env
from envforge.sources.candidate import Candidate, derivable_ids
from envforge.sources.result import LoadResult
from envforge.task import Task
from envforge.verify.checkpoints import SuiteRun, install_verifier_files, run_suite
from envforge.verify.grader import PURGE_CACHES, Grader
from envforge.verify.parsers import error_summary
from envforge.verify.selection import TestRun

CACHE_VERSION = "derive-v8"  # v8: runs cover the test files the change touches (the suite with pass_to_pass: suite)
# The suite runs start fresh interpreters: they are compared with each other to find what varies
# between runs (ids with an object's address or a time in them, order dependence), and forks of one
# preloaded interpreter share its memory layout and hash seed (sandbox/forkserver.py).
WHOLE_SUITE = TestRun("suite", fresh_interpreter=True)
REVERSED_SUITE = TestRun("suite", "reverse", fresh_interpreter=True)
GRADER_CHECKS = 2
DERIVATION_ATTEMPTS = 3  # as the gate's: a lost node costs one; a second fault in a row is still not a verdict
# The sandboxes one derivation acquires at most: three suite runs, the lone before-run or a first check
# alongside the reversed run (two grades; it is not counted when the final ids moved to other files), and
# GRADER_CHECKS grader-way checks of two grades each (what a sandbox provider is told to expect).
SANDBOXES_PER_DERIVATION = 3 + 2 + 2 * GRADER_CHECKS
T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Run:
    """One run of the suite (or of selected ids), as cached."""

    statuses: dict[str, str]
    reasons: list[str] = field(default_factory=list)
    collect_errors: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # failed test -> its one-line failure

    @classmethod
    def of(cls, run: SuiteRun) -> "Run":
        return cls(dict(run.statuses), list(run.reasons), dict(run.collect_errors), dict(run.messages))


@dataclass(frozen=True)
class Classified:
    """What the four suite runs say about each test."""

    fail_to_pass: list[str]
    pass_to_pass: list[str]
    broken_by_change: list[str]
    excluded: dict[str, str]


def _stable(first: Run, second: Run, state: str) -> tuple[dict[str, str], dict[str, str]]:
    """(status of each test both runs of a state agree on, excluded test -> reason)."""
    stable, excluded = {}, {}
    for test_id, status in first.statuses.items():
        again = second.statuses.get(test_id)
        if again is None:
            excluded[test_id] = (
                f"its id was not found again in the reversed {state} run (an id that changes between "
                f"runs: a memory address, a timestamp, random parametrization)"
            )
        elif again != status:
            excluded[test_id] = f"its outcome depends on the order ({state}: {status} in file order, {again} reversed)"
        else:
            stable[test_id] = status
    return stable, excluded


def classify(before: Sequence[Run], after: Sequence[Run]) -> Classified:
    """FAIL_TO_PASS / PASS_TO_PASS from the runs of both states (file order, then reversed, where a
    state ran twice); what a single run of a state cannot tell, the grader-way check settles."""
    b, b_excluded = _stable(before[0], before[1], "before") if len(before) > 1 else (dict(before[0].statuses), {})
    a, a_excluded = _stable(after[0], after[1], "after") if len(after) > 1 else (dict(after[0].statuses), {})
    excluded = {**b_excluded, **a_excluded}
    f2p = sorted(t for t, s in a.items() if s == "passed" and t not in excluded and b.get(t) != "passed")
    p2p = sorted(t for t, s in a.items() if s == "passed" and t not in excluded and b.get(t) == "passed")
    broken = sorted(t for t, s in b.items() if s == "passed" and t not in excluded and a.get(t, "missing") != "passed")
    relevant = {t: r for t, r in excluded.items() if t in a or t in after[0].statuses}
    return Classified(f2p, p2p, broken, dict(sorted(relevant.items())))


@dataclass(frozen=True)
class Derivation:
    """Every run made for one candidate, and the grader-way checks of the derived ids."""

    before: list[Run]
    after: list[Run]
    checks: list[dict[str, Run]] = field(default_factory=list)  # [{"after": Run, "before": Run}, ...]
    alone: Run | None = None  # before the change, only the FAIL_TO_PASS candidates outside the test change
    files: list[str] | None = None  # the test files the runs covered; None: the whole suite

    def out_of_memory(self) -> bool:
        """Whether any run was killed for memory: the sandbox's limit, not the commit, decided it."""
        runs = [*self.before, *self.after, *(r for c in self.checks for r in c.values())]
        return any("oom" in r.reasons for r in [*runs, *([self.alone] if self.alone else [])])

    def as_json(self) -> dict:
        return {
            "before": [asdict(r) for r in self.before],
            "after": [asdict(r) for r in self.after],
            "checks": [{k: asdict(v) for k, v in c.items()} for c in self.checks],
            "alone": asdict(self.alone) if self.alone else None,
            "files": self.files,
        }

    def timed_out(self) -> bool:
        """Whether any run of it hit the test timeout (then it is not cached: see the module's docstring)."""
        runs = [*self.before, *self.after, *(r for c in self.checks for r in c.values())]
        return any("timeout" in r.reasons for r in [*runs, *([self.alone] if self.alone else [])])

    @classmethod
    def from_json(cls, doc: dict) -> "Derivation":
        return cls(
            [Run(**r) for r in doc["before"]],
            [Run(**r) for r in doc["after"]],
            [{k: Run(**v) for k, v in c.items()} for c in doc.get("checks", [])],
            Run(**doc["alone"]) if doc.get("alone") else None,
            doc.get("files"),
        )


@dataclass(frozen=True)
class Settled:
    """The lists after every check made so far, and whether the last grader-way check confirmed them."""

    fail_to_pass: list[str]
    pass_to_pass: list[str]
    excluded: dict[str, str]
    confirmed: bool
    classified: Classified
    unselectable: list[str] = field(default_factory=list)  # ids a task cannot require (whitespace)
    pass_to_pass_elsewhere: int = 0  # passing tests outside the scoped test files


def outside_test_change(f2p: list[str], test_files: Sequence[str]) -> list[str]:
    """FAIL_TO_PASS candidates in files the test change does not touch: they may fail before only
    because a failing new test ran first and left state behind, so they are run alone once."""
    return [t for t in f2p if t.split("::", 1)[0] not in set(test_files)]


def settle(derivation: Derivation, test_files: Sequence[str], pass_to_pass: str = "suite") -> Settled:
    """Apply every run of the derivation in order: stability, the lone before-run, which ids a task
    can require and PASS_TO_PASS's scope (`test-files` or `suite`), grader-way checks."""
    cls = classify(derivation.before, derivation.after)
    f2p, p2p, excluded = list(cls.fail_to_pass), list(cls.pass_to_pass), dict(cls.excluded)
    if derivation.alone is not None:
        for t in outside_test_change(f2p, test_files):
            if derivation.alone.statuses.get(t) == "passed":
                excluded[t] = "fails before the change only when other tests ran first (order-dependent)"
        f2p = [t for t in f2p if t not in excluded]
    f2p, odd_f2p = derivable_ids(f2p)
    p2p, odd_p2p = derivable_ids(p2p)
    elsewhere = 0
    if pass_to_pass == "test-files":
        files = {t.split("::", 1)[0] for t in f2p} | set(test_files)
        scoped = [t for t in p2p if t.split("::", 1)[0] in files]
        elsewhere, p2p = len(p2p) - len(scoped), scoped
    confirmed = False
    for check in derivation.checks:
        bad = not_reproduced(f2p, p2p, check)
        excluded.update(bad)
        f2p, p2p = [t for t in f2p if t not in bad], [t for t in p2p if t not in bad]
        confirmed = not bad
    return Settled(f2p, p2p, excluded, confirmed, cls, odd_f2p + odd_p2p, elsewhere)


def not_reproduced(f2p: list[str], p2p: list[str], check: dict[str, Run]) -> dict[str, str]:
    """Derived ids the grader-way runs contradict, with what they showed."""
    bad = {}
    for t in [*f2p, *p2p]:
        after = check["after"].statuses.get(t, "missing")
        if after != "passed":
            bad[t] = f"{after} after the change when run the way the grader runs it"
    for t in f2p:
        if check["before"].statuses.get(t) == "passed":
            bad.setdefault(t, "passed before the change when run the way the grader runs it")
    for t in p2p:
        before = check["before"].statuses.get(t, "missing")
        if before != "passed":
            bad.setdefault(t, f"{before} before the change when run the way the grader runs it")
    return bad


def _trusted_grader(pool: Pool) -> Grader:
    """Derivation runs the candidate's own code and tests, no policy's: its sandboxes are reset by
    restoring only what changed (`Sandbox.trust_until_reset`)."""
    return Grader(pool.client, pool, trusted=True)


def _run(pool: Pool, task: Task, image: str, patches: Sequence[str], run: TestRun = WHOLE_SUITE) -> Run:
    """One run of the whole suite (in collection order, or reversed) after applying the patches."""
    check = task.spec.verification.tests
    assert check is not None
    sandbox = _trusted_grader(pool).acquire(task, image)
    try:
        for patch in patches:
            if patch.strip():
                sandbox.apply_patch(patch)  # ValueError: the candidate's own patch does not apply
        sandbox.exec(PURGE_CACHES, timeout_s=120)
        install_verifier_files(sandbox, task)
        return Run.of(run_suite(sandbox, check, task.spec.environment, run))
    finally:
        pool.release(sandbox)


def _grade(
    pool: Pool, candidate: Candidate, image: str, f2p: list[str], p2p: list[str], only: list[str] | None = None
) -> dict[str, Run]:
    """The derived ids graded by the grader itself: the reference solution ('after', through the same
    protected-path filter) and the empty one ('before'). `only`: grade these ids alone, before only."""
    grader = _trusted_grader(pool)
    if only is not None:
        result = grader.grade(candidate.to_task(only, []), image, "", "empty")
        return {"before": Run({t: s for t, s in result.tests.items() if s != "missing"}, result.reasons)}
    task = candidate.to_task(f2p, p2p)

    def graded(diff: str) -> Run:
        result = grader.grade(task, image, diff, "reference" if diff else "empty")
        return Run({t: s for t, s in result.tests.items() if s != "missing"}, result.reasons)

    after, before = both(lambda: graded(task.reference_patch or ""), lambda: graded(""))
    return {"after": after, "before": before}


def both(first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
    """Two independent runs at once (each in its own sandbox, admitted like any other): a derivation's
    runs are sequential only where one needs the other's outcome."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="envforge-derive-run") as ex:
        later = ex.submit(second)
        return first(), later.result()


def has_fail_to_pass_candidate(before: Run, after: Run) -> bool:
    """Whether some test passes after the change that did not pass before. Without one, no further run
    can give the candidate a FAIL_TO_PASS test: the reversed run and the checks only take ids away."""
    return any(s == "passed" and before.statuses.get(t) != "passed" for t, s in after.statuses.items())


def scoped_runs(candidate: Candidate) -> tuple[TestRun, TestRun] | None:
    """The derivation's (file order, reversed) runs over the test files the change touches, or None
    when they cover the whole suite (`tests.pass_to_pass: suite`)."""
    if candidate.config.tests.pass_to_pass == "suite":
        return None
    files = tuple(sorted({f for f in candidate.change.test_files if f.endswith(".py")}))
    if not files:
        return None
    return (
        TestRun("targeted", fresh_interpreter=True, files=files),
        TestRun("targeted", "reverse", fresh_interpreter=True, files=files),
    )


def run_derivation(pool: Pool, candidate: Candidate, image: str, always_reverse: bool = False) -> Derivation:
    """The before/after runs (file order, reversed) and up to GRADER_CHECKS grader-way checks.

    The runs cover the test files the change touches, or the whole suite (see the module's docstring).
    The first before and after runs go at once, and so do each check's two gradings; the reversed after-run
    and the first check go at once too when no FAIL_TO_PASS candidate lies outside the test change. The
    reversed after-run is skipped when the first two runs decide the reject already (see
    `has_fail_to_pass_candidate`; `always_reverse` runs it anyway, the derivation as it was)."""
    task = candidate.provisional_task()
    before_patches = [candidate.change.test_patch]
    after_patches = [candidate.change.source_patch, candidate.change.test_patch]
    scoped = scoped_runs(candidate)
    forward, reverse = scoped or (WHOLE_SUITE, REVERSED_SUITE)

    def before_and_after(run: TestRun) -> tuple[list[Run], list[Run]]:
        first, second = both(
            lambda: _run(pool, task, image, after_patches, run), lambda: _run(pool, task, image, before_patches, run)
        )
        return [second], [first]

    before, after = before_and_after(forward)
    if scoped and not (after[0].statuses or after[0].reasons or after[0].collect_errors):
        forward, reverse = WHOLE_SUITE, REVERSED_SUITE  # the files the change touches hold no test
        before, after = before_and_after(forward)
    files = list(forward.files) or None
    if not always_reverse and not has_fail_to_pass_candidate(before[0], after[0]):
        return Derivation(before, after, files=files)
    scope = candidate.config.tests.pass_to_pass
    test_files = candidate.change.test_files
    forward_only = settle(Derivation(before, after, files=files), test_files, scope)
    if forward_only.fail_to_pass and not outside_test_change(forward_only.fail_to_pass, test_files):
        # The reversed run can only take ids away, so the first check grades the ids of the first runs while
        # it runs (a suite that waits paid one more run's time in a row). The check counts only if it
        # graded the test files the final ids are in, as a check of those ids would have.
        reversed_run, check = both(
            lambda: _run(pool, task, image, after_patches, reverse),
            lambda: _grade(pool, candidate, image, forward_only.fail_to_pass, forward_only.pass_to_pass),
        )
        after.append(reversed_run)
        derivation = Derivation(before, after, files=files)
        final = settle(derivation, test_files, scope)
        if final.fail_to_pass and _test_files(final.fail_to_pass + final.pass_to_pass) == _test_files(
            forward_only.fail_to_pass + forward_only.pass_to_pass
        ):
            derivation.checks.append(check)
    else:
        after.append(_run(pool, task, image, after_patches, reverse))
        derivation = Derivation(before, after, files=files)
        suspects = outside_test_change(settle(derivation, test_files, scope).fail_to_pass, test_files)
        if suspects:
            alone = _grade(pool, candidate, image, [], [], only=suspects)["before"]
            derivation = Derivation(before, after, [], alone, files)
    while len(derivation.checks) < GRADER_CHECKS:
        settled = settle(derivation, test_files, scope)
        if not settled.fail_to_pass or (derivation.checks and settled.confirmed):
            break
        derivation.checks.append(_grade(pool, candidate, image, settled.fail_to_pass, settled.pass_to_pass))
    return derivation


def _test_files(ids: Sequence[str]) -> set[str]:
    return {test_id.split("::", 1)[0] for test_id in ids}


def cache_key(candidate: Candidate, image: str) -> str:
    # The runs depend on PASS_TO_PASS's scope only through what they cover (`scoped_runs`). They depend on
    # the variables the tests run with and on the sandbox's limits (a suite killed for memory): each
    # is kept out of the key while the source leaves it unset, so the keys of earlier results hold.
    # The project's modules decide where its imports resolve (verify/runners/pytest_launcher.py).
    variables = candidate.environment.fields.get("env") or {}
    limits = candidate.config.limits
    modules = candidate.modules
    return digest_parts(
        CACHE_VERSION,
        image,
        candidate.change.source_patch,
        candidate.change.test_patch,
        candidate.config.tests.model_dump_json(exclude={"pass_to_pass"}),
        json.dumps([list(r.files) for r in scoped_runs(candidate) or ()]),
        *([json.dumps(variables, sort_keys=True)] if variables else []),
        *([limits.model_dump_json()] if limits.model_fields_set else []),
        *([",".join(modules)] if modules else []),
    )[:32]


def _collection_note(run: Run, state: str) -> str:
    if not run.collect_errors:
        return ""
    quoted = "; ".join(f"{where}: {error_summary(msg)}" for where, msg in list(run.collect_errors.items())[:3])
    return f"; tests could not be collected {state} the change: {quoted}"


def with_memory_ceiling(candidate: Candidate, ceiling_mb: int) -> Candidate | None:
    """The candidate with its sandboxes' memory raised to the ceiling (ENVFORGE_DERIVE_MEMORY_CEILING_MB),
    or None when that is no more than it has: a suite killed for memory is the limit's fault, not the
    commit's (xopen's zstd tests need 2 GiB, the default limit is 1 GiB)."""
    limits = candidate.config.limits
    if ceiling_mb <= limits.memory_mb:
        return None
    config = candidate.config.model_copy(update={"limits": limits.model_copy(update={"memory_mb": ceiling_mb})})
    return replace(candidate, config=config)


def _out_of_memory(candidate: Candidate) -> SpecError:
    return SpecError(
        [
            Problem(
                candidate.origin,
                candidate.field,
                f"the sandbox ran out of memory while the tests ran (limits.memory_mb: "
                f"{candidate.config.limits.memory_mb}): raise the source's limits.memory_mb "
                f"(or ENVFORGE_DERIVE_MEMORY_CEILING_MB)",
            )
        ]
    )


def recorded_images_of(base: str, build: ImageBuild) -> dict[str, Any]:
    """What a task records of the images it was built on at ingest (`metadata.images`): a rebuild elsewhere
    installs the same versions (`env_freeze`) and loads the same plugins (`env_plugins`)."""
    images: dict[str, Any] = {"base": base, "env": build.env.tag if build.env else None}
    if build.env:
        images["env_freeze"] = build.env.freeze
        images["env_plugins"] = build.env.plugins
    return images


def task_from_derivation(candidate: Candidate, derivation: Derivation, extra_metadata: dict | None = None) -> Task:
    """The derived task, or SpecError naming the record's change field and what the runs showed."""
    first_after = derivation.after[0]
    settled = settle(derivation, candidate.change.test_files, candidate.config.tests.pass_to_pass)
    if derivation.out_of_memory() and not (settled.confirmed and settled.fail_to_pass):
        raise _out_of_memory(candidate)
    if first_after.reasons and not first_after.statuses:
        raise SpecError(
            [
                Problem(
                    candidate.origin,
                    candidate.field,
                    f"the test suite produced no results after the change "
                    f"({', '.join(first_after.reasons)}); check the `tests.command` of the source"
                    + _collection_note(first_after, "after"),
                )
            ]
        )
    cls, p2p, excluded = settled.classified, settled.pass_to_pass, settled.excluded
    f2p = settled.fail_to_pass if settled.confirmed else []  # else never run the way the grader runs it
    odd_f2p = [t for t in settled.unselectable if t in cls.fail_to_pass]
    if not f2p:
        after = first_after.statuses
        failing = sorted(t for t, s in after.items() if s != "passed")
        detail = f"{len(after)} tests ran after the change, {len(cls.pass_to_pass)} already passed before"
        if failing:
            detail += f", {len(failing)} still fail ({', '.join(failing[:3])})"
        if odd_f2p:
            detail += (
                f", {len(odd_f2p)} cannot be required (ids with control characters, tabs or a space at either end)"
            )
        candidates = [t for t in excluded if after.get(t) == "passed"]
        if candidates:
            detail += "; excluded: " + "; ".join(f"{t}: {excluded[t]}" for t in candidates[:3])
        raise SpecError(
            [
                Problem(
                    candidate.origin,
                    candidate.field,
                    f"the change has no failing-then-passing test: {detail}" + _collection_note(first_after, "after"),
                )
            ]
        )
    metadata = dict(extra_metadata or {})
    if cls.broken_by_change:
        metadata["broken_by_change"] = cls.broken_by_change
    if excluded:
        metadata["excluded_tests"] = excluded
    if settled.unselectable:
        metadata["unselectable_tests"] = settled.unselectable
    if candidate.config.tests.pass_to_pass == "test-files" and derivation.files is None:
        metadata["pass_to_pass_elsewhere"] = settled.pass_to_pass_elsewhere
    before = derivation.before[0]
    failures = {t: before.messages[t] for t in f2p if before.messages.get(t)}
    for t in f2p:  # a test whose module could not even be imported before the fix: that error is the failure
        error = before.collect_errors.get(t.split("::", 1)[0])
        if t not in failures and error:
            failures[t] = error_summary(error, lines=1)
    if failures:  # the observable failure, for describing the problem as a reporter would (quality.statements)
        metadata["failure_messages"] = failures
    metadata["derivation"] = {
        "suite_runs": len(derivation.before) + len(derivation.after),
        "grader_checks": len(derivation.checks),
        "ran_alone": derivation.alone is not None,
        "files": derivation.files or "suite",
    }
    return candidate.to_task(f2p, p2p, metadata)


def derive_tasks(
    settings: Settings,
    candidates: Sequence[Candidate],
    client: docker.DockerClient | None = None,
    concurrency: int = 2,
    progress: Progress = no_progress,
    sandboxes: SandboxProvider | None = None,
    memory_ceiling_mb: int | None = None,
) -> LoadResult:
    """Run every candidate's suite before and after its change; derived tasks or rejects with reasons.
    The sandboxes come from a pool leased from `sandboxes` (none: this process's engine), told each
    candidate's image as it is built."""
    result = LoadResult()
    if not candidates:
        return result
    if memory_ceiling_mb is None:
        memory_ceiling_mb = read_env().derive_memory_ceiling_mb
    client = client or docker_client(settings)
    cache_dir = settings.data_dir / "derived"
    cache_dir.mkdir(parents=True, exist_ok=True)
    base = build_base_image(client, settings).tag
    total = len(candidates)
    progress("derive", "building images", 0, total)
    lease = or_local(sandboxes).lease(
        [], SANDBOXES_PER_DERIVATION, client=client, settings=settings, max_idle_per_key=1, max_starting=concurrency
    )
    # On this engine, `concurrency` candidates at once, and more while the CPUs have room (suites that
    # wait: sandbox/admission.py); a fleet's nodes are admitted by the fleet.
    admission = admission_for(concurrency) if lease.owned else None

    def one(candidate: Candidate, pool: Pool) -> Task:
        try:
            gitstore.keep_commit(settings.data_dir, candidate.git_dir, candidate.workspace_commit)
        except ValueError as exc:
            raise SpecError([Problem(candidate.origin, candidate.field, str(exc))]) from None
        try:
            with admission.slot() if admission else nullcontext():  # a build computes: it takes a slot too
                build = with_retry(lambda: build_task_image(client, candidate.provisional_task(), base, settings))
        except ImageBuildError as exc:
            raise SpecError([Problem(candidate.origin, "environment", str(exc))]) from None
        images = recorded_images_of(base, build)
        if build.env:
            candidate = replace(candidate, env_plugins=tuple(build.env.plugins))

        def derived(candidate: Candidate) -> Derivation:
            cached = cache_dir / f"{cache_key(candidate, build.tag)}.json"
            if cached.exists():
                return Derivation.from_json(json.loads(cached.read_text()))
            try:
                # a fleet learns the image's recipe and the demand for it; a local pool needs nothing
                lease.expect([(candidate.provisional_task(), build.tag)], SANDBOXES_PER_DERIVATION)
                derivation = with_retry(lambda: run_derivation(pool, candidate, build.tag), DERIVATION_ATTEMPTS)
            except ValueError as exc:
                raise SpecError(
                    [Problem(candidate.origin, candidate.field, f"the change does not apply to its own parent: {exc}")]
                ) from None
            if not derivation.timed_out():
                write_atomic(cached, json.dumps(derivation.as_json(), sort_keys=True))
            return derivation

        derivation = derived(candidate)
        roomier = with_memory_ceiling(candidate, memory_ceiling_mb) if derivation.out_of_memory() else None
        if roomier is not None:  # killed for memory: once more at the ceiling, and the task keeps it
            candidate, derivation = roomier, derived(roomier)
        return task_from_derivation(candidate, derivation, {"images": images})

    with lease as leased:
        pool = admitted(leased, admission)
        with ThreadPoolExecutor(max_workers=admission.ceiling if admission else max(1, concurrency)) as ex:
            futures = {ex.submit(one, c, pool): c for c in candidates}
            done = 0
            for fut in as_completed(futures):
                cand = futures[fut]
                try:
                    result.tasks.append(fut.result())
                except SpecError as exc:
                    result.rejects.extend(exc.problems)
                except InfraError as exc:
                    result.rejects.append(
                        Problem(cand.origin, cand.field, f"infra: {exc} (not cached; retried on the next ingest)")
                    )
                done += 1
                progress("derive", cand.id, done, total)
    order = {c.id: i for i, c in enumerate(candidates)}
    result.tasks.sort(key=lambda t: order.get(t.id, 0))
    result.rejects.sort(key=lambda p: (p.source, p.field))
    return result


def with_retry(fn: Callable[[], T], attempts: int = 2) -> T:
    """fn(), tried again when the infrastructure failed (never for a bad recipe or record). An engine
    error that escaped as a raw client exception (a restarted daemon) is an infrastructure fault too."""
    for attempt in range(attempts):
        try:
            try:
                return fn()
            except (docker.errors.DockerException, RequestException) as exc:
                raise InfraError("engine_error", str(exc)[:300]) from None
        except InfraError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def build_or_problem(build: Callable[[], ImageBuild], origin: str) -> ImageBuild | Problem:
    """The image `build()` makes (retried once for an infrastructure fault), or why it could not be made,
    as the task's `environment` problem: one task's image never fails its batch."""
    try:
        return with_retry(build)
    except ImageBuildError as exc:
        return Problem(origin, "environment", str(exc))
    except InfraError as exc:
        return Problem(origin, "environment", f"infra: cannot build the environment: {exc}")


__all__ = [
    "Classified",
    "Derivation",
    "Run",
    "Settled",
    "build_or_problem",
    "cache_key",
    "classify",
    "derive_tasks",
    "has_fail_to_pass_candidate",
    "outside_test_change",
    "run_derivation",
    "settle",
    "task_from_derivation",
    "with_retry",
]
