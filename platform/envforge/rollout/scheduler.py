"""The async rollout scheduler: tasks x n samples (GRPO groups), bounded concurrency on the
warm pool, infrastructure faults retried on a fresh sandbox, resumable at any moment.

Rules it keeps:
- a model outcome (malformed actions, out of turns or time, a wrong answer) is kept and scored;
- an infrastructure fault (`InfraError`, or a `PolicyError` from the policy's transport)
  restarts the trajectory on a fresh sandbox after a backoff, up to `max_infra_retries`;
  nothing of the failed attempt is kept. When the engine itself stopped answering (a dockerd
  restart), the retry first waits for it (`engine_wait_s`), and the pool sweeps away the
  containers the restart left dead;
- when a sample's retry budget runs out, its whole group is dropped and recorded: a group is
  stored complete or not at all;
- each sample's seed depends only on (seed, task, sample), so reruns sample the same way;
- finished trajectories are saved as they finish (pending/), complete groups as parquet
  parts: a killed run resumed with the same batch id redoes nothing and duplicates nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from envforge.errors import InfraError
from envforge.observe import metrics as live
from envforge.observe.logs import bind, log_context
from envforge.observe.traces import set_attributes, span
from envforge.progress import Progress
from envforge.rollout.actions import SYSTEM_PROMPT, TOOLS, ActionError, parse_text, parse_tool_call
from envforge.rollout.config import RolloutConfig
from envforge.rollout.env import EnvLimits, RolloutEnv
from envforge.rollout.policies.base import PolicyError, PolicyOutput
from envforge.rollout.store import TrajectoryStore
from envforge.rollout.trajectory import DroppedGroup, Trajectory, Turn, sample_seed, trajectory_id
from envforge.sandbox.container import run_blocking
from envforge.sandbox.pool import SandboxPool
from envforge.task import Task
from envforge.verify.grader import Grader

log = logging.getLogger("envforge.rollout")


@dataclass
class BatchReport:
    batch_id: str
    n_tasks: int
    n_samples: int
    stored: int = 0  # trajectories stored by this run
    resumed: int = 0  # trajectories found finished from an earlier run
    dropped_groups: list[DroppedGroup] = field(default_factory=list)
    infra_retries: int = 0
    steps: int = 0
    tokens: int = 0
    duration_s: float = 0.0
    pool_hits: int = 0
    pool_misses: int = 0
    step_overhead_s: list[float] = field(default_factory=list)  # scheduler time per step, not policy/env

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.duration_s if self.duration_s else 0.0

    @property
    def pool_hit_rate(self) -> float:
        total = self.pool_hits + self.pool_misses
        return self.pool_hits / total if total else 0.0


def _policy_message(out: PolicyOutput) -> tuple[dict[str, Any], Any]:
    """(assistant message to append, the action or ActionError)."""
    if out.tool_calls:
        call = out.tool_calls[0]
        try:
            action: Any = parse_tool_call(call)
        except ActionError as exc:
            action = exc
        call = {**call, "id": call.get("id") or "call_0"}
        return {"role": "assistant", "content": out.text or "", "tool_calls": [call]}, action
    try:
        action = parse_text(out.text)
    except ActionError as exc:
        action = exc
    return {"role": "assistant", "content": out.text}, action


def _action_dict(action: Any) -> dict[str, Any] | None:
    if isinstance(action, ActionError):
        return None
    return {"name": action.name, **{k: v for k, v in action.__dict__.items() if k != "name" and v is not None}}


class RolloutScheduler:
    def __init__(
        self,
        pool: SandboxPool,
        grader: Grader,
        policy: Any,
        store: TrajectoryStore,
        config: RolloutConfig = RolloutConfig(),
        progress: Progress | None = None,
        on_group: Callable[[list[Trajectory]], Awaitable[None]] | None = None,
    ):
        self.pool, self.grader, self.policy, self.store, self.config = pool, grader, policy, store, config
        self.progress = progress
        self.on_group = on_group
        self._rng = random.Random(config.seed)

    # -- one episode ---------------------------------------------------------------------

    async def episode(self, task: Task, image: str, sample: int, task_set_version: str) -> Trajectory:
        """Run one trajectory to its end and grade it. Raises InfraError/PolicyError on faults.

        Its log lines carry the trajectory's ids, and its span (with children per step and for the
        grade) the container's, so one trajectory can be followed end to end (envforge.observe)."""
        tid = trajectory_id(self.store.batch_id, task.id, sample)
        with (
            log_context(trajectory_id=tid, task_id=task.id, task_version=task.content_hash),
            span(
                "rollout.trajectory",
                **{
                    "envforge.trajectory_id": tid,
                    "envforge.task_id": task.id,
                    "envforge.task_version": task.content_hash,
                    "envforge.batch_id": self.store.batch_id,
                },
            ) as current,
        ):
            traj = await self._episode(task, image, sample, task_set_version, current)
            set_attributes(current, **{"envforge.reward": traj.reward, "envforge.end_reason": traj.end_reason})
            log.info(
                "trajectory graded",
                extra={
                    "reward": traj.reward,
                    "resolved": traj.resolved,
                    "end_reason": traj.end_reason,
                    "turns": len(traj.turns),
                    "duration_s": traj.duration_s,
                },
            )
        live.trajectory_finished(traj.end_reason, len(traj.turns), traj.duration_s, traj.reward)
        return traj

    async def _episode(self, task: Task, image: str, sample: int, task_set_version: str, current: Any) -> Trajectory:
        cfg = self.config
        actor = self.policy.episode(task) if hasattr(self.policy, "episode") else self.policy
        seed = sample_seed(cfg.seed, task.id, sample)
        traj = Trajectory(
            batch_id=self.store.batch_id,
            task_id=task.id,
            content_hash=task.content_hash,
            task_set_version=task_set_version,
            policy_id=actor.policy_id,
            policy_version=int(getattr(actor, "version", 0)),
            sample_index=sample,
            seed=seed,
            instruction=task.spec.instruction,
            source=task.spec.source,
            started_at=time.time(),
        )
        started = time.perf_counter()
        timings = {"reset_s": 0.0, "policy_s": 0.0, "env_s": 0.0, "verify_s": 0.0, "close_s": 0.0}
        env = RolloutEnv(self.pool, self.grader, task, image, EnvLimits.for_task(task, cfg.max_turns))
        try:
            with span("sandbox.reset", **{"envforge.image": image}) as reset_span:
                obs = await env.reset()
                container = env.sandbox.id if env.sandbox is not None else None
                set_attributes(
                    reset_span, **{"envforge.container_id": container, "envforge.warm": env.stats.get("warm")}
                )
            set_attributes(current, **{"envforge.container_id": container})
            bind(container_id=container)
            timings["reset_s"] = time.perf_counter() - started
            traj.sandbox = dict(env.stats)
            log.debug("sandbox ready", extra={"warm": env.stats.get("warm"), "acquire_s": env.stats.get("acquire_s")})
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": obs.text},
            ]
            done = False
            while not done:
                with span("rollout.step", **{"envforge.turn": len(traj.turns)}) as step_span:
                    t0 = time.perf_counter()
                    out = await actor.act(
                        messages,
                        TOOLS,
                        seed=seed + len(traj.turns),
                        temperature=cfg.temperature,
                        max_tokens=cfg.max_tokens,
                    )
                    t1 = time.perf_counter()
                    message, action = _policy_message(out)
                    obs, done, _ = await env.step(action)
                    t2 = time.perf_counter()
                    set_attributes(
                        step_span,
                        **{
                            "envforge.action": getattr(action, "name", "malformed"),
                            "envforge.exit_code": obs.exit_code,
                        },
                    )
                timings["policy_s"] += t1 - t0
                timings["env_s"] += t2 - t1
                messages.append(message)
                if "tool_calls" in message:
                    messages.append(
                        {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": obs.text}
                    )
                else:
                    messages.append({"role": "user", "content": obs.text})
                traj.turns.append(
                    Turn(
                        index=len(traj.turns),
                        text=out.text,
                        tool_calls=list(out.tool_calls),
                        action=_action_dict(action),
                        parse_error=str(action) if isinstance(action, ActionError) else None,
                        observation=obs.text,
                        exit_code=obs.exit_code,
                        policy_s=round(t1 - t0, 6),
                        env_s=round(t2 - t1, 6),
                        prompt_token_ids=out.prompt_token_ids,
                        token_ids=out.token_ids,
                        logprobs=out.logprobs,
                        finish_reason=out.finish_reason,
                    )
                )
            traj.end_reason = env.end_reason or "submitted"
            t0 = time.perf_counter()
            with span("rollout.verify"):
                traj.final_diff, result = await env.verify()
            timings["verify_s"] = time.perf_counter() - t0
        finally:
            t0 = time.perf_counter()
            await env.close()
            timings["close_s"] = time.perf_counter() - t0
        traj.reward, traj.resolved = float(result.reward), bool(result.resolved)
        traj.verification = result.as_json()
        traj.failure_reasons = list(result.reasons)
        if traj.end_reason != "submitted":
            traj.failure_reasons.append(f"ended:{traj.end_reason}")
        parse_errors = sum(1 for t in traj.turns if t.parse_error)
        if parse_errors:
            traj.failure_reasons.append(f"malformed_actions:{parse_errors}")
        traj.duration_s = round(time.perf_counter() - started, 6)
        timings["work_s"] = sum(timings.values())
        traj.timings = {k: round(v, 6) for k, v in timings.items()}
        return traj

    async def _with_retries(
        self, task: Task, image: str, sample: int, task_set_version: str, report: BatchReport
    ) -> Trajectory | str:
        """The trajectory, or the reason the retry budget ran out."""
        cfg = self.config
        last = ""
        for attempt in range(cfg.max_infra_retries + 1):
            if attempt:
                report.infra_retries += 1
                delay = min(cfg.backoff_max_s, cfg.backoff_s * 2 ** (attempt - 1))
                await asyncio.sleep(delay * (0.5 + self._rng.random()))
            try:
                traj = await self.episode(task, image, sample, task_set_version)
                traj.infra_retries = attempt
                return traj
            except (InfraError, PolicyError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                fault = exc.cause if isinstance(exc, InfraError) else "policy_error"
                live.trajectory_retried(fault)
                log.warning(
                    "infrastructure fault, retrying on a fresh sandbox",
                    extra={
                        "fault": fault,
                        "attempt": attempt + 1,
                        "detail": str(exc)[:300],
                        "trajectory_id": trajectory_id(self.store.batch_id, task.id, sample),
                        "task_id": task.id,
                    },
                )
                if isinstance(exc, InfraError):
                    # A dockerd restart fails everything in flight within a second: wait for the
                    # engine instead of spending the retry budget while it is away.
                    try:
                        await run_blocking(self.pool.wait_for_engine, cfg.engine_wait_s)
                    except InfraError as down:
                        last = f"{last}; then {down}"
        return f"retry budget exhausted after {cfg.max_infra_retries + 1} attempts; last: {last}"

    # -- a batch -------------------------------------------------------------------------

    async def run(self, items: Sequence[tuple[Task, str]], task_set_version: str = "") -> BatchReport:
        """Roll out every (task, image) n_samples times; returns what this run did."""
        with (
            log_context(batch_id=self.store.batch_id),
            span(
                "rollout.batch",
                **{"envforge.batch_id": self.store.batch_id, "envforge.task_set_version": task_set_version},
            ),
        ):
            return await self._run(items, task_set_version)

    async def _run(self, items: Sequence[tuple[Task, str]], task_set_version: str) -> BatchReport:
        cfg = self.config
        started = time.perf_counter()
        hits0, misses0 = self.pool.stats.hits, self.pool.stats.misses
        self.store.ensure_manifest(
            {
                "batch_id": self.store.batch_id,
                "task_set_version": task_set_version,
                "policy_id": getattr(self.policy, "policy_id", "?"),
                "n_samples": cfg.n_samples,
                "seed": cfg.seed,
                "config": cfg.as_params(),
                "tasks": sorted(t.id for t, _ in items),
            }
        )
        report = BatchReport(self.store.batch_id, len(items), cfg.n_samples)
        stored_ids = set(self.store.frame()["trajectory_id"])
        dropped = {g.task_id for g in self.store.dropped()}
        groups: dict[str, dict[int, Trajectory]] = {t.id: {} for t, _ in items}
        for t in self.store.pending():
            if t.task_id in groups and t.task_id not in dropped:
                groups[t.task_id][t.sample_index] = t
                report.resumed += 1
        fresh: set[str] = set()  # trajectories produced by this run (not resumed)
        failed: dict[str, dict[int, str]] = {}
        attempts: dict[str, dict[int, int]] = {}
        closed: set[str] = set(dropped)
        todo = []
        # Sample-major order (every task's sample 0, then every task's sample 1, ...): samples of
        # one image rarely run at the same time, so each finds the previous one's warm sandbox.
        for n in range(cfg.n_samples):
            for task, image in items:
                if task.id in dropped or task.id in closed:
                    continue
                done_here = {
                    m for m in range(cfg.n_samples) if trajectory_id(self.store.batch_id, task.id, m) in stored_ids
                }
                if n == 0:
                    report.resumed += len(done_here)
                    if len(done_here) == cfg.n_samples:
                        closed.add(task.id)
                        continue
                if n not in done_here and n not in groups[task.id]:
                    todo.append((task, image, n))
        total = len(todo)
        finished = 0
        sem = asyncio.Semaphore(max(1, cfg.concurrency))

        async def close_group(task_id: str) -> None:
            if task_id in closed:
                return
            got, bad = groups[task_id], failed.get(task_id, {})
            if len(got) + len(bad) < cfg.n_samples:
                return
            closed.add(task_id)
            if bad:
                group = DroppedGroup(
                    self.store.batch_id,
                    task_id,
                    "; ".join(f"sample {n}: {r}" for n, r in bad.items()),
                    attempts.get(task_id, {}),
                    sorted(got),
                )
                await run_blocking(self.store.record_dropped, group)
                report.dropped_groups.append(group)
                live.group_dropped()
                log.warning("group dropped", extra={"task_id": task_id, "reason": group.reason[:300]})
                return
            members = [got[n] for n in sorted(got)]
            await run_blocking(self.store.write_group, members)
            report.stored += sum(1 for m in members if m.trajectory_id in fresh)
            if self.on_group is not None:
                await self.on_group(members)

        async def one(task: Task, image: str, n: int) -> None:
            nonlocal finished
            async with sem:
                live.scheduler_queued(-1)
                if task.id in closed:
                    return
                t0 = time.perf_counter()
                live.scheduler_in_flight(1)
                try:
                    outcome = await self._with_retries(task, image, n, task_set_version, report)
                finally:
                    live.scheduler_in_flight(-1)
            attempts.setdefault(task.id, {})[n] = 1 + (
                outcome.infra_retries if isinstance(outcome, Trajectory) else cfg.max_infra_retries
            )
            if isinstance(outcome, Trajectory):
                report.steps += len(outcome.turns)
                report.tokens += outcome.n_tokens
                if task.id not in closed:
                    await run_blocking(self.store.save_pending, outcome)
                    groups[task.id][n] = outcome
                    fresh.add(outcome.trajectory_id)
                if outcome.turns and outcome.infra_retries == 0:
                    # Everything the scheduler itself spent on this trajectory: the episode loop's own
                    # work (messages, parsing, records) and saving it, but not the policy, the
                    # sandbox or grading.
                    overhead = max(0.0, (time.perf_counter() - t0) - outcome.timings["work_s"])
                    report.step_overhead_s.append(overhead / len(outcome.turns))
            else:
                failed.setdefault(task.id, {})[n] = outcome
            await close_group(task.id)
            finished += 1
            if self.progress:
                self.progress("rollout", f"{task.id}#{n}", finished, total)

        for task_id in list(groups):
            await close_group(task_id)  # groups completed entirely by an earlier run's pending files
        live.scheduler_queued(len(todo))
        await asyncio.gather(*(one(*item) for item in todo))
        for task_id in groups:
            await close_group(task_id)
        report.duration_s = time.perf_counter() - started
        report.pool_hits = self.pool.stats.hits - hits0
        report.pool_misses = self.pool.stats.misses - misses0
        return report
