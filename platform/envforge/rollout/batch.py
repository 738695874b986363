"""A rollout batch end to end: sandboxes, grader, scheduler, store, metrics and its catalog row.

The synchronous entry point the CLI, the Dagster asset and the benchmark share. Where the batch
is registered (the catalog) is the caller's to say (`register`), as is where its sandboxes come
from (`sandboxes`, a provider; none: this process's engine).
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import docker

from envforge.config import Settings
from envforge.progress import Progress
from envforge.rollout.config import RolloutConfig
from envforge.rollout.scheduler import BatchReport, RolloutScheduler
from envforge.rollout.store import TrajectoryStore
from envforge.rollout.tiers import pass_at_k
from envforge.sandbox.engine import docker_client
from envforge.sandbox.pool import SandboxPool
from envforge.sandbox.provider import SandboxProvider, or_local
from envforge.task import Task
from envforge.verify.grader import Grader

# Where a finished batch's row goes (the catalog's `record_rollout_batch`): the caller's choice.
BatchRegistry = Callable[[dict[str, Any]], None]


def default_batch_id(task_set_version: str, policy_id: str, seed: int) -> str:
    policy = re.sub(r"[^A-Za-z0-9._-]+", "_", policy_id)[-40:]
    return f"{task_set_version[:12] or 'tasks'}-{policy}-s{seed}"


@dataclass
class BatchResult:
    report: BatchReport
    store: TrajectoryStore
    metrics: dict[str, float]
    mlflow_run_id: str | None = None


def batch_metrics(store: TrajectoryStore, report: BatchReport, k: int) -> dict[str, float]:
    """pass@1, pass@k, turns, tokens, infra retries, dropped groups, pool hit rate, steps/s."""
    frame = store.frame()
    per_task = {}
    for row in frame.iter_rows(named=True):
        per_task.setdefault(row["task_id"], []).append(bool(row["resolved"]))
    p1 = statistics.fmean(pass_at_k(len(v), sum(v), 1) for v in per_task.values()) if per_task else 0.0
    kk = min(k, report.n_samples)
    pk = statistics.fmean(pass_at_k(len(v), sum(v), kk) for v in per_task.values()) if per_task else 0.0
    overhead = sorted(report.step_overhead_s)
    return {
        "trajectories": float(frame.height),
        "tasks": float(len(per_task)),
        "pass_at_1": round(p1, 6),
        f"pass_at_{kk}": round(pk, 6),
        "mean_reward": float(frame["reward"].mean() or 0.0),
        "mean_turns": float(frame["n_turns"].mean() or 0.0),
        "tokens": float(frame["n_tokens"].sum() or 0),
        "infra_retries": float(report.infra_retries),
        "dropped_groups": float(len(report.dropped_groups)),
        "pool_hit_rate": round(report.pool_hit_rate, 4),
        "steps_per_s": round(report.steps_per_s, 3),
        "scheduler_overhead_ms_per_step": round(1000 * statistics.median(overhead), 3) if overhead else 0.0,
        "malformed_turns": float(
            sum(sum(1 for turn in json.loads(t) if turn["parse_error"]) for t in frame["turns_json"])
        ),
    }


def rollout_sandboxes_per_task(config: RolloutConfig) -> int:
    """Each trajectory takes an episode sandbox and then its grade's (what a provider is told to expect)."""
    return config.n_samples * 2


def run_batch(
    settings: Settings,
    items: Sequence[tuple[Task, str]],
    policy: Any,
    config: RolloutConfig,
    task_set_version: str = "",
    batch_id: str | None = None,
    root: str | None = None,
    client: docker.DockerClient | None = None,
    progress: Progress | None = None,
    pool: SandboxPool | None = None,
    sandboxes: SandboxProvider | None = None,
    register: BatchRegistry | None = None,
) -> BatchResult:
    """Roll out every (task, image) n_samples times into the store; hand the batch's row to `register`
    (the stages pass the catalog's `record_rollout_batch`; None: the batch is not registered).

    The sandboxes run in `pool` when one is given (it is not closed here), else in a pool leased from
    `sandboxes` for this batch (the provider the process chose: the fleet, or, when none is given,
    a warm pool on this process's engine)."""
    client = client if client is not None or pool is not None else docker_client(settings)
    lease: AbstractContextManager[Any]
    if pool is not None:  # a given pool (a benchmark's cold one) is the caller's to close
        lease = nullcontext(pool)
    else:
        lease = or_local(sandboxes).lease(
            items,
            rollout_sandboxes_per_task(config),
            client=client,
            settings=settings,
            max_idle_per_key=max(2, config.concurrency),
            max_starting=4,
        )
    batch_id = batch_id or default_batch_id(task_set_version, getattr(policy, "policy_id", "policy"), config.seed)
    store = TrajectoryStore(root or settings.artifact_root("rollouts"), batch_id)
    with lease as sandbox_pool:
        grader = Grader(client, sandbox_pool)
        scheduler = RolloutScheduler(sandbox_pool, grader, policy, store, config, progress=progress)
        report = asyncio.run(scheduler.run(items, task_set_version))
    return record_batch(store, report, policy, config, task_set_version, register)


def record_batch(
    store: TrajectoryStore,
    report: BatchReport,
    policy: Any,
    config: RolloutConfig,
    task_set_version: str = "",
    register: BatchRegistry | None = None,
) -> BatchResult:
    """A finished scheduler run's metrics, its row handed to `register` (what every rollout batch gets)."""
    metrics = batch_metrics(store, report, k=config.n_samples)
    if register is not None:
        register(
            {
                "batch_id": store.batch_id,
                "task_set_version": task_set_version,
                "policy_id": getattr(policy, "policy_id", "?"),
                "location": f"{store.root}/{store.batch_id}",
                "n_tasks": report.n_tasks,
                "n_samples": config.n_samples,
                "n_trajectories": int(metrics["trajectories"]),
                "n_dropped_groups": len(store.dropped()),
                "pass_at_1": metrics["pass_at_1"],
                "metrics_json": json.dumps(metrics, sort_keys=True),
            }
        )
    return BatchResult(report, store, metrics)
