"""Grading on a pristine copy: only the policy's diff reaches the sandbox that is graded.

1. split the diff per file and drop every section that touches a protected path;
2. apply the rest to a fresh (or freshly reset) sandbox of the task image: `git apply`, then
   `--reject`, then `patch --fuzz`; the method that worked is recorded;
3. apply the held-back test patch, purge bytecode and caches;
4. install the verifier's files and runners outside the workspace, run the test checkpoint
   (reports over the agent's fd-3 pipe; by default only the test files that hold the task's
   required ids, see selection.py) and the shell checkpoints.

Infrastructure faults raise InfraError: they are retried by callers, never scored.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

import docker

from envforge.errors import InfraError, PolicyOutcome
from envforge.observe import metrics as live
from envforge.observe.traces import annotate, set_attributes, span
from envforge.sandbox.container import Sandbox, SandboxOptions
from envforge.sandbox.pool import SandboxPool
from envforge.task import WORKSPACE, Task
from envforge.verify.checkpoints import install_verifier_files, run_shell_checkpoint, run_tests
from envforge.verify.protect import filter_diff, matches, protected_globs
from envforge.verify.result import CheckpointResult, VerificationResult
from envforge.verify.selection import TARGETED, TRACE_OUT, TestRun

PURGE_CACHES = (
    "find . -name __pycache__ -type d -prune -exec rm -rf {} + ; "
    "find . \\( -name '*.py[co]' -o -name .pytest_cache \\) -prune -exec rm -rf {} + ; true"
)


def options_for(task: Task) -> SandboxOptions:
    return SandboxOptions(limits=task.spec.environment.limits, network=task.spec.environment.network)


@dataclass(frozen=True)
class PreparedDiff:
    """A solution's diff as it reaches the graded copy: sections touching protected paths dropped.

    Two solutions with equal `kept` text are graded on identical copies, so they get the same
    outcome; the gate grades each distinct copy once (see gate.py).
    """

    kept: str
    touched: tuple[str, ...] = ()


@dataclass(frozen=True)
class GradedCopy:
    """What the task's checks gave on one graded copy (before protected-change and reward rules)."""

    method: str | None
    tests: dict[str, str]
    checkpoints: list[CheckpointResult]
    failures: list[str]
    duration_s: float


class Grader:
    """Grades diffs for tasks; owns (or borrows) a sandbox pool so graders reuse warm sandboxes.

    `trusted`: what this grader grades is the task's own reference and envforge's mutants and probes
    (the gate), never a policy's diff; its sandboxes are then reset by restoring only what changed
    (`Sandbox.trust_until_reset`).
    """

    def __init__(self, client: docker.DockerClient, pool: SandboxPool | None = None, trusted: bool = False):
        self.client = client
        self._own_pool = pool is None
        self.pool = pool or SandboxPool(client, max_idle_per_key=4)
        self.trusted = trusted

    def acquire(self, task: Task, image: str) -> Sandbox:
        """A pristine sandbox of the task's image from the pool (release it to the pool)."""
        sandbox = self.pool.acquire(image, options_for(task))
        if self.trusted and isinstance(sandbox, Sandbox):
            sandbox.trust_until_reset()
        return sandbox

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()

    def __enter__(self) -> "Grader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def grade(
        self, task: Task, image: str, diff: str, solution: str = "diff", run: TestRun = TARGETED
    ) -> VerificationResult:
        """Grade one solution on a pristine copy. `run` says which tests run: by default the files that
        hold the task's required ids, in collection order."""
        started = time.perf_counter()
        with span("verify.grade", **{"envforge.task_id": task.id, "envforge.solution": solution}) as current:
            try:
                prepared = self.prepare(task, diff)
                result = self.result(task, image, solution, prepared, self.run_copy(task, image, prepared.kept, run))
            except InfraError as exc:
                live.graded(time.perf_counter() - started, False, [], infra_error=exc.cause)
                raise
            set_attributes(current, **{"envforge.reward": result.reward, "envforge.resolved": result.resolved})
        live.graded(time.perf_counter() - started, result.resolved, result.reasons, result.infra_error)
        return result

    def prepare(self, task: Task, diff: str) -> PreparedDiff:
        kept, touched = filter_diff(diff, protected_globs(task))
        return PreparedDiff(kept, tuple(touched))

    def run_copy(self, task: Task, image: str, kept: str, run: TestRun = TARGETED) -> GradedCopy:
        """Apply an already filtered diff to a fresh (or freshly reset) sandbox and run the task's checks."""
        started = time.perf_counter()
        sandbox = self.acquire(task, image)
        annotate(**{"envforge.grading_container_id": sandbox.id})
        try:
            method, tests, checkpoints, failures = self._grade_in(sandbox, task, kept, run)
        finally:
            self.pool.release(sandbox)
        return GradedCopy(method, tests, checkpoints, failures, time.perf_counter() - started)

    def result(
        self, task: Task, image: str, solution: str, prepared: PreparedDiff, copy: GradedCopy
    ) -> VerificationResult:
        """The reward and reasons of a solution whose filtered diff gave `copy`."""
        verification = task.spec.verification
        reasons = [f"protected_path_modified:{p}" for p in prepared.touched]
        late = [f for f in copy.failures if f.startswith("protected_path_modified:")]
        failures = [f for f in copy.failures if not f.startswith("protected_path_modified:")]
        reasons += [r for r in late if r not in reasons] + failures
        touched = list(prepared.touched) or [r.split(":", 1)[1] for r in late]
        zeroed = bool(touched) and verification.zero_reward_on_protected_change
        resolved = not failures and not zeroed
        if verification.partial_credit and not zeroed and copy.method is not None:
            parts = [s == "passed" for s in copy.tests.values()] + [c.passed for c in copy.checkpoints]
            reward = round(sum(parts) / len(parts), 6) if parts else 0.0
        else:
            reward = 1.0 if resolved else 0.0
        return VerificationResult(
            task_id=task.id,
            solution=solution,
            reward=reward,
            resolved=resolved,
            tests=dict(copy.tests),
            checkpoints=list(copy.checkpoints),
            reasons=reasons,
            patch_method=copy.method,
            duration_s=copy.duration_s,
            image=image,
        )

    def _grade_in(self, sb: Sandbox, task: Task, diff: str, run: TestRun):
        method = "empty"
        failures: list[str] = []
        if diff.strip():
            try:
                method = sb.apply_patch(diff)
            except (ValueError, OSError):  # OSError: a diff too large to stage in the sandbox's /tmp
                return None, {}, [], ["patch_failed"]
            # The guard that does not depend on parsing the diff: whatever the applied diff
            # changed in the tree, protected paths go back to their initial state, and so
            # does .git when the `patch` fallback applied it (`git apply` refuses paths in .git).
            if method == "patch_fuzz":
                sb.restore_git_dir()
            touched = [p for p in sb.changed_paths(patched_copy=True) if matches(p, protected_globs(task))]
            if touched:
                sb.restore_paths(touched)
                failures += [f"protected_path_modified:{p}" for p in touched]
        if task.test_patch:
            try:
                sb.apply_patch(task.test_patch)
            except (ValueError, OSError):
                return method, {}, [], ["test_patch_failed"]
        sb.exec(PURGE_CACHES, timeout_s=120)
        install_verifier_files(sb, task)
        tests: dict[str, str] = {}
        check = task.spec.verification.tests
        environment = task.spec.environment
        if check is not None:
            tests, test_failures = run_tests(sb, check, run, environment)
            failures += test_failures
        ordered = list(task.spec.verification.checkpoints)
        if run.order == "reverse":
            ordered.reverse()
        checkpoints = [run_shell_checkpoint(sb, c, environment) for c in ordered]
        checkpoints.sort(key=lambda c: [x.name for x in task.spec.verification.checkpoints].index(c.name))
        for c in checkpoints:
            if not c.passed:
                failures.append(f"checkpoint_failed:{c.name}")
            if c.timed_out and "timeout" not in failures:
                failures.append("timeout")
        return method, tests, checkpoints, failures

    def trace_calls(self, task: Task, image: str, kept: str, paths: list[str]) -> tuple[dict | None, str]:
        """(what the reporter recorded, "") for one fresh grading of an already filtered diff with the
        functions of `paths` traced (covering.py), or (None, why) when the grading failed or left no
        record: a trace stands for the tests only when every required test passed under it."""
        run = replace(TARGETED, fresh_interpreter=True, trace=tuple(f"{WORKSPACE}/{p}" for p in paths))
        sandbox = self.acquire(task, image)
        try:
            _, _, _, failures = self._grade_in(sandbox, task, kept, run)
            if failures:
                return None, f"the traced grading failed ({', '.join(failures[:3])})"
            try:
                return json.loads(sandbox.read_file(TRACE_OUT, max_bytes=64 << 20)), ""
            except FileNotFoundError:
                return None, "the traced grading left no record"
            except ValueError:
                return None, "the traced grading's record is not JSON"
        finally:
            self.pool.release(sandbox)

    def commands_diff(self, task: Task, image: str, commands: list[str]) -> tuple[str, list[str]]:
        """Run commands as a policy would (fresh sandbox, workspace as cwd); returns (diff, failures).

        Raises PolicyOutcome when the commands leave a workspace that cannot be diffed."""
        sandbox = self.acquire(task, image)
        try:
            failures = []
            env = task.spec.environment
            for i, cmd in enumerate(commands):
                res = sandbox.exec(cmd, env=env.command_env(), workdir=env.command_workdir())
                if res.exit_code != 0 or res.timed_out:
                    failures.append(f"solution_command_failed:{i}")
            return sandbox.diff(), failures
        finally:
            self.pool.release(sandbox)

    def solution_diff(self, task: Task, image: str, kind: str) -> tuple[str, list[str]]:
        """The diff of a known solution: 'reference' or 'empty'."""
        if kind == "empty":
            return "", []
        if task.reference_patch is not None:
            return task.reference_patch, []
        try:
            return self.commands_diff(task, image, list(task.spec.reference_solution.commands or []))
        except PolicyOutcome as exc:  # the reference itself cannot be graded: the gate quarantines the task
            return "", [exc.reason]
