"""FAIL_TO_PASS / PASS_TO_PASS by running a candidate's test suite before and after its change.

For each candidate, in a sandbox of its own image (the workspace before the change):

- *before*: apply the held-back test change only, run the whole suite;
- *after*: apply the source change and the test change, run the whole suite.

FAIL_TO_PASS are the tests that pass after and did not pass before (failed, errored, or did
not exist or collect); PASS_TO_PASS pass in both and, by default, sit in a test file the
change touches or that holds a FAIL_TO_PASS test (the SWE-bench harness's scope: grading runs
only those files; how many passing tests lie elsewhere goes to the task's metadata, and a
source's `tests.pass_to_pass: suite` keeps them all). A test that passed before and fails after
was broken by the fix: it is left out of both lists and recorded in the task's metadata. A
candidate whose change makes no test go from failing to passing is rejected with the counts,
since nothing could tell a solution from an empty diff.

Results are cached by (image, patches, test command) under the data directory, so
re-ingesting an unchanged source (the sensor, the nightly refresh) costs no sandbox time.
Infrastructure faults are retried once on a fresh sandbox, then reported as rejects with
an `infra:` reason (the next ingest tries again: nothing is cached for them).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Callable, Sequence

import docker

from envforge.config import Settings
from envforge.errors import ImageBuildError, InfraError, Problem, SpecError
from envforge.hashing import digest_parts
from envforge.progress import Progress, no_progress
from envforge.sandbox.engine import docker_client
from envforge.sandbox.images import build_base_image, build_task_image
from envforge.sandbox.pool import SandboxPool
from envforge.sources.candidate import Candidate, derivable_ids
from envforge.sources.result import LoadResult
from envforge.task import Task
from envforge.verify.checkpoints import install_verifier_files, run_suite
from envforge.verify.grader import PURGE_CACHES, options_for

@dataclass(frozen=True)
class SuiteRuns:
    """Statuses of every collected test before and after the change."""

    before: dict[str, str]
    after: dict[str, str]
    before_reasons: list[str]
    after_reasons: list[str]

    @property
    def fail_to_pass(self) -> list[str]:
        return sorted(t for t, s in self.after.items() if s == "passed" and self.before.get(t) != "passed")

    @property
    def pass_to_pass(self) -> list[str]:
        return sorted(t for t, s in self.after.items() if s == "passed" and self.before.get(t) == "passed")

    @property
    def broken_by_change(self) -> list[str]:
        return sorted(t for t, s in self.before.items() if s == "passed" and self.after.get(t) != "passed")

    def as_json(self) -> dict:
        return {"before": self.before, "after": self.after, "before_reasons": self.before_reasons,
                "after_reasons": self.after_reasons}


def _run(pool: SandboxPool, task: Task, image: str, patches: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    check = task.spec.verification.tests
    assert check is not None
    sandbox = pool.acquire(image, options_for(task))
    try:
        for patch in patches:
            if patch.strip():
                sandbox.apply_patch(patch)  # ValueError: the candidate's own patch does not apply
        sandbox.exec(PURGE_CACHES, timeout_s=120)
        install_verifier_files(sandbox, task)
        return run_suite(sandbox, check)
    finally:
        pool.release(sandbox)


def run_before_after(pool: SandboxPool, candidate: Candidate, image: str) -> SuiteRuns:
    task = candidate.provisional_task()
    before, before_reasons = _run(pool, task, image, [candidate.change.test_patch])
    after, after_reasons = _run(pool, task, image, [candidate.change.source_patch, candidate.change.test_patch])
    return SuiteRuns(before, after, before_reasons, after_reasons)


def cache_key(candidate: Candidate, image: str) -> str:
    # The runs do not depend on how PASS_TO_PASS is scoped afterwards.
    return digest_parts(image, candidate.change.source_patch, candidate.change.test_patch,
                        candidate.config.tests.model_dump_json(exclude={"pass_to_pass"}))[:32]


def task_from_runs(candidate: Candidate, runs: SuiteRuns) -> Task:
    """The derived task, or SpecError naming the record's change field and what the runs showed."""
    if runs.after_reasons and not runs.after:
        raise SpecError([Problem(candidate.origin, candidate.field,
                                 f"the test suite produced no results after the change "
                                 f"({', '.join(runs.after_reasons)}); check the `tests.command` of the source")])
    fail_to_pass, odd_f2p = derivable_ids(runs.fail_to_pass)
    pass_to_pass, odd_p2p = derivable_ids(runs.pass_to_pass)
    if not fail_to_pass:
        failing_after = sorted(t for t, s in runs.after.items() if s != "passed")
        detail = f"{len(runs.after)} tests ran after the change, {len(runs.pass_to_pass)} already passed before"
        if failing_after:
            detail += f", {len(failing_after)} still fail ({', '.join(failing_after[:3])})"
        if odd_f2p:
            detail += f", {len(odd_f2p)} cannot be required (ids with whitespace or control characters)"
        raise SpecError([Problem(candidate.origin, candidate.field,
                                 f"the change has no failing-then-passing test: {detail}")])
    metadata: dict = {"broken_by_change": runs.broken_by_change} if runs.broken_by_change else {}
    if odd_f2p or odd_p2p:
        metadata["unselectable_tests"] = odd_f2p + odd_p2p
    if candidate.config.tests.pass_to_pass == "test-files":
        files = {t.split("::", 1)[0] for t in fail_to_pass} | set(candidate.change.test_files)
        scoped = [t for t in pass_to_pass if t.split("::", 1)[0] in files]
        metadata["pass_to_pass_elsewhere"] = len(pass_to_pass) - len(scoped)
        pass_to_pass = scoped
    return candidate.to_task(fail_to_pass, pass_to_pass, metadata or None)


def derive_tasks(settings: Settings, candidates: Sequence[Candidate], client: docker.DockerClient | None = None,
                 concurrency: int = 2, progress: Progress = no_progress) -> LoadResult:
    """Run every candidate's suite before and after its change; derived tasks or rejects with reasons."""
    result = LoadResult()
    if not candidates:
        return result
    client = client or docker_client(settings)
    cache_dir = settings.data_dir / "derived"
    cache_dir.mkdir(parents=True, exist_ok=True)
    base = build_base_image(client, settings).tag
    total = len(candidates)
    progress("derive", "building images", 0, total)

    def one(candidate: Candidate, pool: SandboxPool) -> Task:
        try:
            image = build_task_image(client, candidate.provisional_task(), base, settings).tag
        except ImageBuildError as exc:
            raise SpecError([Problem(candidate.origin, "environment", str(exc))]) from None
        cached = cache_dir / f"{cache_key(candidate, image)}.json"
        if cached.exists():
            runs = SuiteRuns(**json.loads(cached.read_text()))
        else:
            try:
                runs = _with_retry(lambda: run_before_after(pool, candidate, image))
            except ValueError as exc:
                raise SpecError([Problem(candidate.origin, candidate.field,
                                         f"the change does not apply to its own parent: {exc}")]) from None
            tmp = cached.with_suffix(".tmp")
            tmp.write_text(json.dumps(runs.as_json(), sort_keys=True))
            tmp.replace(cached)
        return task_from_runs(candidate, runs)

    with SandboxPool(client, max_idle_per_key=1, max_starting=concurrency) as pool:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as ex:
            futures = {ex.submit(one, c, pool): c for c in candidates}
            done = 0
            for fut in as_completed(futures):
                cand = futures[fut]
                try:
                    result.tasks.append(fut.result())
                except SpecError as exc:
                    result.rejects.extend(exc.problems)
                except InfraError as exc:
                    result.rejects.append(Problem(cand.origin, cand.field, f"infra: {exc} (not cached; retried on "
                                                                           f"the next ingest)"))
                done += 1
                progress("derive", cand.id, done, total)
    order = {c.id: i for i, c in enumerate(candidates)}
    result.tasks.sort(key=lambda t: order.get(t.id, 0))
    result.rejects.sort(key=lambda p: (p.source, p.field))
    return result


def _with_retry(fn: Callable[[], SuiteRuns], attempts: int = 2) -> SuiteRuns:
    for attempt in range(attempts):
        try:
            return fn()
        except InfraError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


__all__ = ["SuiteRuns", "cache_key", "derive_tasks", "run_before_after", "task_from_runs"]
