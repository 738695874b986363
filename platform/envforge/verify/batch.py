"""Grading many solutions of one task at once: in parallel on the pool's warm sandboxes, each
distinct graded copy once, stopping early when the caller has seen enough.

The gate grades its repeated runs, its order check and its hack probes through this, and so
can anything else that grades N solutions of a task (mutants of a verifier, a policy's
samples). Two solutions whose diffs are equal once protected sections are dropped reach
identical pristine copies, and grading is deterministic (the tests check it), so a solution
marked `share=True` reuses the copy of an earlier grading with the same filtered diff and the
same test run instead of running it again; a fail-fast grading (selection.py) also reuses
the copy of a full run of the same tests, which answers its question too. A grading with
`share=False` always runs (the gate's repeated runs exist to catch flakiness), but others
may share its copy.

Infrastructure faults are retried on a fresh sandbox (INFRA_RETRIES times), then raised:
they are never a result.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence, TypeVar

from envforge.errors import InfraError
from envforge.task import Task
from envforge.verify.grader import GradedCopy, Grader, PreparedDiff
from envforge.verify.result import VerificationResult
from envforge.verify.selection import TARGETED, TestRun

INFRA_RETRIES = 2
T = TypeVar("T")


@dataclass(frozen=True)
class Grading:
    """One solution to grade: a diff, or a function that produces one in a sandbox (a probe's
    script, a policy's commands), and the tests to run on its copy."""

    name: str
    diff: str | Callable[[], str]
    run: TestRun = TARGETED
    share: bool = True


@dataclass
class BatchOutcome:
    """What grading a batch gave. `results` holds every grading that finished, in the batch's order."""

    results: dict[str, VerificationResult] = field(default_factory=dict)
    diffs: dict[str, str] = field(default_factory=dict)  # the diff each grading produced (or was given)
    shared_with: dict[str, str] = field(default_factory=dict)  # grading -> the grading whose copy it reused
    not_run: list[str] = field(default_factory=list)  # left out once the stop condition held
    copies: int = 0  # graded copies actually run
    sandbox_s: float = 0.0  # sandbox time spent: diffs produced plus copies graded
    infra_retries: int = 0
    # grading -> (start, end) in seconds since the batch started: when each ran (a diff produced, a
    # copy graded or waited for), which shows where a batch's time went and whether its workers idled
    timeline: dict[str, tuple[float, float]] = field(default_factory=dict)


def with_retries(fn: Callable[[], T], on_retry: Callable[[], None] = lambda: None) -> T:
    """fn(), retried on InfraError (each attempt gets a fresh or freshly reset sandbox from the pool)."""
    for attempt in range(INFRA_RETRIES + 1):
        try:
            return fn()
        except InfraError:
            if attempt == INFRA_RETRIES:
                raise
            on_retry()
    raise AssertionError("unreachable")


class _Copies:
    """Graded copies by (filtered diff, test run): the first grading to need one runs it, others wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, TestRun], tuple[str, Future]] = {}

    def claim(self, key: tuple[str, TestRun], name: str, share: bool) -> tuple[str, Future] | None:
        """The (owner, future) of an existing copy to reuse, or None after registering `name` as its owner.

        A fail-fast grading takes the copy of the same run in full when there is one, and a grading
        that may fork takes one graded by a fresh interpreter (it answers the same questions)."""
        kept, run = key
        with self._lock:
            if share:
                runs = [run, run.without_fail_fast()] if run.fail_fast else [run]
                runs += [replace(r, fresh_interpreter=True) for r in runs if not r.fresh_interpreter]
                for candidate in runs:
                    if (kept, candidate) in self._futures:
                        return self._futures[(kept, candidate)]
            if key not in self._futures:
                self._futures[key] = (name, Future())
            return None

    def publish(self, key: tuple[str, TestRun], name: str, outcome: GradedCopy | BaseException) -> None:
        with self._lock:
            owner, future = self._futures.get(key, (None, None))
        if owner != name or future is None:
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def grade_batch(
    grader: Grader,
    task: Task,
    image: str,
    gradings: Sequence[Grading],
    workers: int = 2,
    stop: Callable[[str, VerificationResult], bool] | None = None,
) -> BatchOutcome:
    """Grade every solution, `workers` at a time, in the given order; once `stop(name, result)` is
    true for a finished grading, start no more (those in flight finish and are kept)."""
    outcome = BatchOutcome()
    batch_started = time.perf_counter()
    copies = _Copies()
    lock = threading.Lock()

    def retried() -> None:
        with lock:
            outcome.infra_retries += 1

    def spent(seconds: float) -> None:
        with lock:
            outcome.sandbox_s += seconds

    def one(g: Grading) -> VerificationResult:
        started = time.perf_counter()
        try:
            return graded(g)
        finally:
            with lock:
                outcome.timeline[g.name] = (
                    round(started - batch_started, 3),
                    round(time.perf_counter() - batch_started, 3),
                )

    def graded(g: Grading) -> VerificationResult:
        if callable(g.diff):
            started = time.perf_counter()
            try:
                diff = with_retries(g.diff, retried)
            finally:
                spent(time.perf_counter() - started)
        else:
            diff = g.diff
        with lock:
            outcome.diffs[g.name] = diff
        prepared: PreparedDiff = grader.prepare(task, diff)
        key = (prepared.kept, g.run)
        existing = copies.claim(key, g.name, g.share)
        if existing is not None:
            owner, future = existing
            copy = future.result()
            with lock:
                outcome.shared_with[g.name] = owner
            return grader.result(task, image, g.name, prepared, copy)
        try:
            copy = with_retries(lambda: grader.run_copy(task, image, prepared.kept, g.run), retried)
        except BaseException as exc:
            copies.publish(key, g.name, exc)
            raise
        copies.publish(key, g.name, copy)
        with lock:
            outcome.copies += 1
        spent(copy.duration_s)
        return grader.result(task, image, g.name, prepared, copy)

    pending = list(gradings)
    finished: dict[str, VerificationResult] = {}
    stopped = False
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="envforge-grade") as ex:
        running: dict[Future, Grading] = {}
        while pending or running:
            while pending and not stopped and len(running) < max(1, workers):
                g = pending.pop(0)
                running[ex.submit(one, g)] = g
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                g = running.pop(fut)
                try:
                    result = fut.result()
                except BaseException:
                    stopped = True
                    for other in running:
                        other.cancel()
                    wait(running)
                    raise
                finished[g.name] = result
                if stop is not None and stop(g.name, result):
                    stopped = True
            if stopped and not running:
                break
    outcome.results = {g.name: finished[g.name] for g in gradings if g.name in finished}
    outcome.not_run = [g.name for g in gradings if g.name not in finished]
    return outcome
