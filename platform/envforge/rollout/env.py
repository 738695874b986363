"""The multi-turn environment: gymnasium-like and async, over one sandbox of the task's image.

    env = RolloutEnv(pool, grader, task, image)
    obs = await env.reset()                    # instruction + the workspace's file list
    obs, done, info = await env.step(action)   # an Action, or the ActionError from parsing
    result = await env.verify()                # graded on a pristine copy (only the diff crosses)
    await env.close()                          # back to the warm pool

Limits come from the task: `max_turns`, `limits.command_timeout_s` per step, and
`limits.trajectory_timeout_s` for the episode. A malformed action is an error observation,
never an exception. Infrastructure faults (`InfraError`) do propagate: the scheduler retries
the episode on a fresh sandbox and nothing of the failed attempt is kept.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from envforge.errors import InfraError, PolicyOutcome
from envforge.rollout.actions import Action, ActionError, ApplyPatch, ReadFile, Run, Submit, WriteFile
from envforge.sandbox.container import Sandbox, run_blocking
from envforge.sandbox.pool import SandboxPool
from envforge.task import WORKSPACE, Task
from envforge.verify.grader import Grader, options_for
from envforge.verify.result import VerificationResult

MAX_OBSERVATION_CHARS = 8000
# The first observation holds the instruction (capped at ingest, 64 KiB by default) and the file list.
MAX_FIRST_OBSERVATION_CHARS = 80_000
MAX_LISTED_FILES = 200


@dataclass
class Observation:
    text: str
    exit_code: int | None = None
    error: str | None = None  # the action was malformed or the tool failed


@dataclass
class EnvLimits:
    max_turns: int
    step_timeout_s: float
    trajectory_timeout_s: float
    max_observation_chars: int = MAX_OBSERVATION_CHARS

    @classmethod
    def for_task(cls, task: Task, max_turns: int | None = None) -> "EnvLimits":
        lim = task.spec.environment.limits
        return cls(max_turns or task.spec.max_turns, lim.command_timeout_s, lim.trajectory_timeout_s)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + f"\n... [{len(text) - limit} characters cut] ...\n" + text[-(limit - head) :]


def workspace_path(path: str) -> str:
    """Relative paths are inside /workspace; absolute ones are taken as given (the sandbox confines them)."""
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(WORKSPACE, path))


@dataclass
class RolloutEnv:
    pool: SandboxPool
    grader: Grader
    task: Task
    image: str
    limits: EnvLimits | None = None
    sandbox: Sandbox | None = None
    turns: int = 0
    done: bool = False
    end_reason: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    _deadline: float = 0.0

    def __post_init__(self) -> None:
        self.limits = self.limits or EnvLimits.for_task(self.task)

    async def reset(self) -> Observation:
        started = time.perf_counter()
        hits = self.pool.stats.hits
        self.sandbox = await self.pool.aacquire(self.image, options_for(self.task))
        self.stats = {
            "acquire_s": round(time.perf_counter() - started, 4),
            "warm": self.pool.stats.hits > hits,
            "image": self.image,
        }
        self.turns, self.done, self.end_reason = 0, False, None
        self._deadline = time.monotonic() + self.limits.trajectory_timeout_s
        listing = await self.sandbox.aexec("git ls-files | head -n %d" % MAX_LISTED_FILES, timeout_s=60)
        files = listing.text().strip() or "(empty)"
        return Observation(
            _clip(
                f"{self.task.spec.instruction.strip()}\n\nThe repository is in {WORKSPACE}. Files:\n{files}",
                MAX_FIRST_OBSERVATION_CHARS,
            )
        )

    def _remaining(self) -> float:
        return self._deadline - time.monotonic()

    async def step(self, action: Action | ActionError) -> tuple[Observation, bool, dict[str, Any]]:
        if self.sandbox is None or self.done:
            raise RuntimeError("step() needs reset() first and a running episode")
        self.turns += 1
        info: dict[str, Any] = {"turn": self.turns}
        if isinstance(action, ActionError):
            obs = Observation(f"error: {action}", error=str(action))
        elif isinstance(action, Submit):
            obs = Observation("submitted")
            self.done, self.end_reason = True, "submitted"
        else:
            obs = await self._execute(action)
        if not self.done and self.turns >= self.limits.max_turns:
            self.done, self.end_reason = True, "max_turns"
        if not self.done and self._remaining() <= 0:
            self.done, self.end_reason = True, "trajectory_timeout"
        info["end_reason"] = self.end_reason
        obs.text = _clip(obs.text, self.limits.max_observation_chars)
        return obs, self.done, info

    async def _execute(self, action: Action) -> Observation:
        """The action's effect as an observation. A tool that fails for what the policy did (a full
        /tmp under apply_patch, a path that is a directory) answers with an error; only an
        infrastructure fault leaves the episode, as InfraError."""
        try:
            return await self._run_tool(action)
        except InfraError:
            raise
        except Exception as exc:  # noqa: BLE001 - a tool error is an observation, never an escape
            return Observation(
                f"error: {action.name} failed: {type(exc).__name__}: {exc}"[:2000], 1, error="tool_failed"
            )

    async def _run_tool(self, action: Action) -> Observation:
        sb = self.sandbox
        assert sb is not None
        timeout = max(1.0, min(self.limits.step_timeout_s, self._remaining()))
        if isinstance(action, Run):
            env = self.task.spec.environment
            res = await sb.aexec(
                action.command,
                timeout_s=min(timeout, action.timeout_s or timeout),
                env=env.command_env(),
                workdir=env.command_workdir(),
            )
            parts = [f"exit code: {res.exit_code}" + (" (timed out)" if res.timed_out else "")]
            if res.stdout:
                parts.append("stdout:\n" + res.text())
            if res.stderr:
                parts.append("stderr:\n" + res.err_text())
            return Observation("\n".join(parts), exit_code=res.exit_code)
        if isinstance(action, ReadFile):
            res = await sb.aexec(
                f"cat -- {shlex.quote(workspace_path(action.path))}", timeout_s=timeout, output_cap=1 << 20
            )
            if res.exit_code != 0:
                return Observation(
                    f"error: cannot read {action.path}: {res.err_text().strip()}", res.exit_code, error="read_failed"
                )
            return Observation(res.text(), 0)
        if isinstance(action, WriteFile):
            try:
                await run_blocking(sb.write_file, workspace_path(action.path), action.content)
            except OSError as exc:
                return Observation(f"error: {exc}", 1, error="write_failed")
            return Observation(f"wrote {len(action.content.encode())} bytes to {action.path}", 0)
        if isinstance(action, ApplyPatch):
            try:
                method = await run_blocking(sb.apply_patch, action.patch)
            except ValueError as exc:
                return Observation(f"error: {exc}", 1, error="patch_failed")
            return Observation(f"patch applied ({method})", 0)
        raise AssertionError(f"unhandled action {action!r}")

    async def diff(self) -> str:
        assert self.sandbox is not None
        return await self.sandbox.adiff()

    async def verify(self, keep_sandbox: bool = False) -> tuple[str, VerificationResult]:
        """(final diff, verdict): the diff is graded on a pristine sandbox, never on this one.

        The episode's sandbox goes back to the pool before grading takes one, so a trajectory never
        holds two: with a capacity-bound pool (a fleet node) nested acquires could deadlock. An
        episode that goes on after the grade (the service's mid-episode verify) keeps it
        (`keep_sandbox`); its grade then waits for room like any acquire. A workspace the policy made
        impossible to diff (too large, or its files leave no memory to diff them in) scores 0 with the
        reason: a model outcome, not a fault to retry.
        """
        try:
            diff = await self.diff()
        except PolicyOutcome as exc:
            if not keep_sandbox:
                await self.close()
            return "", VerificationResult(
                task_id=self.task.id,
                solution="rollout",
                reward=0.0,
                resolved=False,
                reasons=[f"{exc.reason}:{exc.detail}" if exc.detail else exc.reason],
                image=self.image,
            )
        if not keep_sandbox:
            await self.close()
        result = await run_blocking(self.grader.grade, self.task, self.image, diff, "rollout")
        if result.infra_error:
            raise InfraError("grading", result.infra_error)
        return diff, result

    async def close(self) -> None:
        if self.sandbox is not None:
            sb, self.sandbox = self.sandbox, None
            await self.pool.arelease(sb)
