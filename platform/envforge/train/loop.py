"""The training loop's building blocks, shared by the learning demo, the CLI and the Dagster assets.

A model source is `tiny` (or `tiny:<hidden>x<layers>`: a small Qwen2 built from a config,
with the tokenizer built locally) or a local Hugging Face directory. Nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.observe import metrics as live_metrics
from envforge.progress import Progress
from envforge.rollout.batch import BatchResult, record_batch, rollout_sandboxes_per_task, run_batch
from envforge.rollout.config import RolloutConfig
from envforge.rollout.health import round_health
from envforge.rollout.policies.hf import HFPolicy
from envforge.rollout.policies.server_process import PolicyServerProcess
from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model
from envforge.rollout.scheduler import RolloutScheduler
from envforge.rollout.store import TrajectoryStore
from envforge.rollout.stream import GroupStream
from envforge.sandbox.engine import docker_client
from envforge.sandbox.provider import SandboxProvider, or_local
from envforge.task import Task
from envforge.train.checkpoint import save_checkpoint, weights_snapshot
from envforge.train.config import ROLLOUT_POLICIES, TRAINING_DEFAULTS, TrainingConfig
from envforge.train.data import TeacherPolicy, rl_groups, turn_samples
from envforge.train.grpo import GRPOConfig, GRPOTrainer
from envforge.train.samples import TurnSample
from envforge.verify.grader import Grader

Items = Sequence[tuple[Task, str]]


def load_model(source: str, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) from `tiny`, `tiny:<hidden>x<layers>`, or a local checkpoint directory."""
    m = re.fullmatch(r"tiny(?::(\d+)x(\d+))?", source)
    if m:
        hidden, layers = int(m.group(1) or 128), int(m.group(2) or 4)
        torch.manual_seed(seed)
        return build_tiny_model(
            TinyModelConfig(
                hidden_size=hidden, num_layers=layers, heads=4, kv_heads=2, intermediate=2 * hidden, seed=seed
            )
        )
    path = Path(source)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model source {source!r}: expected 'tiny', 'tiny:<hidden>x<layers>' or a local "
            f"Hugging Face directory with config.json"
        )
    return (
        AutoModelForCausalLM.from_pretrained(path, local_files_only=True),
        AutoTokenizer.from_pretrained(path, local_files_only=True),
    )


def demonstrations(
    settings: Settings,
    items: Items,
    tokenizer: Any,
    batch_id: str,
    concurrency: int = 4,
    task_set_version: str = "",
    only_resolved: bool = True,
    sandboxes: SandboxProvider | None = None,
) -> list[TurnSample]:
    """SFT samples: the teacher's rollouts (reference solutions through the tools), by default the
    resolved ones only; `only_resolved=False` keeps every demonstration as recorded (operator logs).
    Every rollout batch of training is registered in the catalog; its sandboxes come from
    `sandboxes` (the provider the stage was handed; none: this process's engine)."""
    result = run_batch(
        settings,
        items,
        TeacherPolicy(tokenizer),
        RolloutConfig(n_samples=1, concurrency=concurrency),
        task_set_version,
        batch_id=batch_id,
        sandboxes=sandboxes,
        register=Catalog(settings.catalog_path).record_rollout_batch,
    )
    return turn_samples(result.store.trajectories(), only_resolved=only_resolved)


def evaluate(
    settings: Settings,
    model: Any,
    tokenizer: Any,
    items: Items,
    batch_id: str,
    label: str,
    concurrency: int = 4,
    max_tokens: int = 64,
    task_set_version: str = "",
    progress: Progress | None = None,
    sandboxes: SandboxProvider | None = None,
) -> BatchResult:
    """One greedy rollout per task, graded by the sandbox verifier: pass@1."""
    policy = HFPolicy((model, tokenizer), policy_id=f"eval@{label}")
    return run_batch(
        settings,
        items,
        policy,
        RolloutConfig(n_samples=1, concurrency=concurrency, temperature=0.0, max_tokens=max_tokens),
        task_set_version,
        batch_id=batch_id,
        progress=progress,
        sandboxes=sandboxes,
        register=Catalog(settings.catalog_path).record_rollout_batch,
    )


@dataclass
class GRPORounds:
    """Rounds of (rollouts, GRPO update). Rollouts sample at `grpo.temperature`, the temperature the
    update takes behaviour log-probs at: one setting, so they cannot differ.

    `max_staleness` (policy versions) chooses the schedule: 0 is synchronous (round r is rolled
    out by the weights after update r-1, the trainer waits for it); s > 0 lets the rollouts of
    round r start as soon as the rollout policy has reached version r - s, so they run while the
    trainer updates on earlier rounds, from a policy that is reloaded with each new checkpoint
    (`rollout_policy`: a copy of the weights in this process, or an `envforge policy serve`
    process this loop starts and stops)."""

    rounds: int = TRAINING_DEFAULTS.rl_rounds
    group_size: int = TRAINING_DEFAULTS.group_size
    max_tokens: int = TRAINING_DEFAULTS.max_tokens
    concurrency: int = TRAINING_DEFAULTS.concurrency
    seed: int = TRAINING_DEFAULTS.seed
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    # Tasks sampled per round (the prompt batch); None: every task every round. Sampling keeps a round's
    # cost fixed as the task set grows, and a different seeded sample per round still covers the split.
    tasks_per_round: int | None = TRAINING_DEFAULTS.tasks_per_round or None
    max_staleness: int = TRAINING_DEFAULTS.max_staleness
    rollout_policy: str = TRAINING_DEFAULTS.rollout_policy  # asynchronous rollouts: "in-process" | "served"
    policy_threads: int = TRAINING_DEFAULTS.policy_threads  # torch threads of the served policy (0: torch's)
    trainer_threads: int = TRAINING_DEFAULTS.trainer_threads  # of this process while the loop runs (0: as is)

    @classmethod
    def from_training(cls, config: TrainingConfig, pad_id: int) -> "GRPORounds":
        """The rounds of the pipeline's one training configuration (`tasks_per_round` 0 there: every task)."""
        return cls(
            rounds=config.rl_rounds,
            group_size=config.group_size,
            max_tokens=config.max_tokens,
            concurrency=config.concurrency,
            seed=config.seed,
            tasks_per_round=config.tasks_per_round or None,
            max_staleness=config.max_staleness,
            rollout_policy=config.rollout_policy,
            policy_threads=config.policy_threads,
            trainer_threads=config.trainer_threads,
            grpo=GRPOConfig.from_training(config, pad_id),
        )


@dataclass
class GRPORun:
    """What a GRPO run did: the trainer, per-update metrics, and how the trainer spent its time.

    `wall_s` runs from the start to the end of the last update. `trainer_busy_s` is the trainer's
    own work (updates; in asynchronous mode also the weight snapshot it hands to the publisher,
    which saves the checkpoint and reloads the rollout policy off the trainer's path);
    `trainer_wait_s` is measured separately: the time it sat waiting for a round's groups (or,
    synchronous, for the round it had to wait for). `timeline` holds every event (seconds from
    the start): rollout rounds, groups arriving, waits, updates, publications."""

    trainer: GRPOTrainer
    history: list[dict[str, float]]
    batch_ids: list[str]  # the rollout batches it trained on, in order
    checkpoints: list[str]  # checkpoints the rollout policy was reloaded from (asynchronous mode)
    wall_s: float = 0.0
    trainer_busy_s: float = 0.0
    trainer_wait_s: float = 0.0
    publish_s: float = 0.0  # checkpoint saves + policy reloads (asynchronous: in the background)
    stale_groups: list[dict[str, Any]] = field(default_factory=list)  # dropped beyond max_staleness
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trainer_idle_fraction(self) -> float:
        """Share of the run's wall time the trainer was not working (waiting for rollouts)."""
        return max(0.0, 1.0 - self.trainer_busy_s / self.wall_s) if self.wall_s else 0.0

    def timing(self) -> dict[str, float]:
        return {
            "wall_s": round(self.wall_s, 3),
            "trainer_busy_s": round(self.trainer_busy_s, 3),
            "trainer_wait_s": round(self.trainer_wait_s, 3),
            "publish_s": round(self.publish_s, 3),
            "trainer_idle_fraction": round(self.trainer_idle_fraction, 4),
            "updates": float(len(self.history)),
            "stale_groups": float(len(self.stale_groups)),
        }


def round_items(items: Items, cfg: GRPORounds, round_index: int) -> Items:
    """The tasks of one round: all of them, or a seeded sample of `tasks_per_round`."""
    if cfg.tasks_per_round is None or cfg.tasks_per_round >= len(items):
        return list(items)
    return random.Random(cfg.seed * 1_000_003 + round_index).sample(list(items), cfg.tasks_per_round)


class LivePolicy(Protocol):
    """The rollout side of asynchronous training: a policy and how to give it a new checkpoint."""

    policy: Any

    def reload(self, checkpoint: Path) -> int: ...


@dataclass
class InProcessPolicy:
    """An `HFPolicy` over its own copy of the weights, reloaded from each checkpoint the trainer saves."""

    policy: HFPolicy

    def reload(self, checkpoint: Path) -> int:
        return self.policy.reload(checkpoint)


@dataclass
class ServedPolicy:
    """A policy server (`envforge policy serve`, which loads checkpoints from this machine's disk),
    rolled out through `OpenAIChatPolicy` and reloaded with `POST /v1/reload`.

    Start the server on the trainer's starting checkpoint, fresh (version 0): its version then
    counts this run's updates, which is what staleness is measured in."""

    policy: Any  # OpenAIChatPolicy
    base_url: str

    def reload(self, checkpoint: Path) -> int:
        import json
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            f"{self.base_url.rstrip('/')}/reload",
            method="POST",
            data=json.dumps({"path": str(checkpoint)}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                version = int(json.loads(resp.read())["version"])
        except urllib.error.HTTPError as exc:
            raise RuntimeError(
                f"policy server {self.base_url}: reload of {checkpoint} failed: HTTP {exc.code} "
                f"{exc.read()[:500].decode(errors='replace')}"
            ) from exc
        self.policy.version = version  # trajectories started from now on record the new version
        return version


def grpo_rounds(
    settings: Settings,
    model: Any,
    tokenizer: Any,
    items: Items,
    cfg: GRPORounds,
    batch_prefix: str,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    task_set_version: str = "",
    progress: Progress | None = None,
    live: LivePolicy | None = None,
    checkpoint_dir: Path | None = None,
    sandboxes: SandboxProvider | None = None,
) -> GRPORun:
    """`cfg.rounds` GRPO updates, each on one round's complete groups (see `GRPORounds`).

    Synchronous (max_staleness 0, no `live` policy): rollouts use the training model itself.
    Otherwise rollouts go through `live` (default: per `cfg.rollout_policy`, an `HFPolicy` over a
    copy of the model, or an `envforge policy serve` process started on the model's weights)
    and stream into the trainer through a `GroupStream`. After each update the trainer takes a
    CPU snapshot of its weights, bumps its version and goes on; a publisher task saves the
    snapshot as a checkpoint (to `checkpoint_dir`, default <data dir>/checkpoints/live-<prefix>)
    and reloads the live policy from it, so saving and reloading are off the trainer's path and
    the policy's version counts updates. Round r starts once the *policy* is at version
    r - max_staleness (what its samples will carry). Groups more than max_staleness versions
    older than the trainer are dropped (reported in `stale_groups`); the others are corrected by
    the clipped ratio to their stored behaviour log-probs (`GRPOConfig.off_policy` makes missing
    log-probs an error instead of "on-policy"). Every round's sandboxes come from one pool leased
    from `sandboxes` (none: this process's engine); every round's batch is registered in the catalog."""
    return asyncio.run(
        _grpo_rounds(
            settings,
            model,
            tokenizer,
            items,
            cfg,
            batch_prefix,
            on_round,
            task_set_version,
            progress,
            live,
            checkpoint_dir,
            sandboxes,
        )
    )


class PolicyVersions:
    """The trainer's version (updates taken) and the rollout policy's (checkpoints it has loaded),
    and the staleness gate between them: round r may start once the policy is at r - max_staleness,
    since that is the version its samples will carry and the trainer will be at r when it trains
    on them. Synchronous runs sample from the training weights, so the two move together."""

    def __init__(self, max_staleness: int, synchronous: bool) -> None:
        self.max_staleness, self.synchronous = max_staleness, synchronous
        self.trainer = 0
        self.policy = 0
        self._changed = asyncio.Condition()

    async def wait_for_round(self, r: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.policy >= r - self.max_staleness)

    async def trainer_updated(self) -> None:
        async with self._changed:
            self.trainer += 1
            if self.synchronous:
                self.policy = self.trainer
            self._changed.notify_all()

    async def policy_loaded(self, version: int) -> None:
        async with self._changed:
            self.policy = version
            self._changed.notify_all()


def thread_budgets(cfg: GRPORounds) -> GRPORounds:
    """A served policy beside the trainer on this machine's CPUs, neither budget given: half the cores
    (at least one) to the policy process, the rest to the trainer, instead of both taking every core
    and oversubscribing them. Given budgets, and in-process rollouts, are left as they are."""
    if cfg.rollout_policy != "served" or cfg.policy_threads or cfg.trainer_threads:
        return cfg
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    policy = max(1, cpus // 2)
    return replace(cfg, policy_threads=policy, trainer_threads=max(1, cpus - policy))


def _start_live_policy(
    model: Any, tokenizer: Any, cfg: GRPORounds, batch_prefix: str, ckpt_dir: Path
) -> tuple[LivePolicy, PolicyServerProcess | None]:
    """The rollout side of an asynchronous run, per `cfg.rollout_policy`, at version 0."""
    if cfg.rollout_policy == "in-process":
        return InProcessPolicy(HFPolicy((copy.deepcopy(model), tokenizer), policy_id=f"{batch_prefix}@live")), None
    if cfg.rollout_policy != "served":
        raise ValueError(f"rollout_policy {cfg.rollout_policy!r}: expected one of {', '.join(ROLLOUT_POLICIES)}")
    from envforge.rollout.policies.openai_client import OpenAIChatPolicy

    start = save_checkpoint(ckpt_dir.with_name(f"{ckpt_dir.name}-start"), model, tokenizer)
    server = PolicyServerProcess(start, threads=cfg.policy_threads).start()
    policy = OpenAIChatPolicy(server.base_url, "envforge", policy_id=f"{batch_prefix}@served")
    return ServedPolicy(policy, server.base_url), server


async def _grpo_rounds(
    settings: Settings,
    model: Any,
    tokenizer: Any,
    items: Items,
    cfg: GRPORounds,
    batch_prefix: str,
    on_round: Callable[[int, dict[str, float]], None] | None,
    task_set_version: str,
    progress: Progress | None,
    live: LivePolicy | None,
    checkpoint_dir: Path | None,
    sandboxes: SandboxProvider | None = None,
) -> GRPORun:
    synchronous = cfg.max_staleness == 0 and live is None
    grpo = cfg.grpo if synchronous else replace(cfg.grpo, off_policy=True)
    trainer = GRPOTrainer(model, grpo, tokenizer=tokenizer)
    ckpt_dir = Path(checkpoint_dir or settings.data_dir / "checkpoints" / f"live-{batch_prefix}")
    started = time.perf_counter()  # the clock includes starting the live policy (a served one takes seconds)
    threads_before = torch.get_num_threads()
    cfg = thread_budgets(cfg) if not synchronous and live is None else cfg
    server: PolicyServerProcess | None = None
    shared = HFPolicy((model, tokenizer), policy_id=f"{batch_prefix}@sync") if synchronous else None
    versions = PolicyVersions(cfg.max_staleness, synchronous=synchronous)
    stream = GroupStream(cfg.max_staleness, current_version=lambda: versions.trainer)
    run = GRPORun(trainer, [], [], [])
    client = docker_client(settings)
    first = RolloutConfig(n_samples=cfg.group_size, concurrency=cfg.concurrency)
    lease = or_local(sandboxes).lease(
        list(items),
        rollout_sandboxes_per_task(first),
        client=client,
        settings=settings,
        max_idle_per_key=max(2, cfg.concurrency),
        max_starting=4,
    )
    pool = lease.pool
    catalog = Catalog(settings.catalog_path)
    recorded: dict[str, asyncio.Task] = {}  # batch id -> its record_batch, run beside the next round
    publish_queue: asyncio.Queue = asyncio.Queue()
    previous: list[BatchResult] = []  # the round before, for the health verdict

    def mark(side: str, event: str, **what: Any) -> None:
        run.timeline.append({"t": round(time.perf_counter() - started, 3), "side": side, "event": event, **what})

    async def produce() -> None:
        grader = Grader(client, pool)
        last: asyncio.Task | None = None
        for r in range(cfg.rounds):
            await versions.wait_for_round(r)
            rollout = RolloutConfig(
                n_samples=cfg.group_size,
                concurrency=cfg.concurrency,
                temperature=cfg.grpo.temperature,
                max_tokens=cfg.max_tokens,
                seed=cfg.seed + r,
            )
            store = TrajectoryStore(settings.artifact_root("rollouts"), f"{batch_prefix}-round-{r}")

            async def on_group(group: list, r: int = r) -> None:
                mark(
                    "producer",
                    "group",
                    round=r,
                    task_id=group[0].task_id,
                    policy_version=min(t.policy_version for t in group),
                )
                await stream.put(group)

            scheduler = RolloutScheduler(
                pool, grader, rollout_policy, store, rollout, progress=progress, on_group=on_group
            )
            mark("producer", "round_start", round=r, policy_version=versions.policy)
            report = await scheduler.run(round_items(items, cfg, r), task_set_version)
            mark("producer", "round_end", round=r)

            async def record(
                store: TrajectoryStore = store,
                report: Any = report,
                rollout: RolloutConfig = rollout,
                before: asyncio.Task | None = last,
            ) -> BatchResult:
                if before is not None:  # one catalog writer at a time
                    await before
                return await asyncio.to_thread(
                    record_batch, store, report, rollout_policy, rollout, task_set_version, catalog.record_rollout_batch
                )

            last = recorded[store.batch_id] = asyncio.create_task(record())
            await stream.end_batch(store.batch_id)

    async def publish() -> None:
        """Save each update's snapshot and reload the live policy from it, in order, off the trainer's path."""
        while (item := await publish_queue.get()) is not None:
            step, snapshot = item
            t0 = time.perf_counter()
            mark("publisher", "publish_start", step=step)
            path = await asyncio.to_thread(save_checkpoint, ckpt_dir, model, tokenizer, step=step, state_dict=snapshot)
            policy_version = await asyncio.to_thread(live.reload, path)
            run.checkpoints.append(str(path))
            run.publish_s += time.perf_counter() - t0
            mark("publisher", "published", policy_version=policy_version)
            await versions.policy_loaded(policy_version)

    async def train() -> None:
        batches = stream.batches().__aiter__()
        try:
            while True:
                w0 = time.perf_counter()
                mark("trainer", "wait")
                try:
                    batch_id, fresh = await batches.__anext__()
                except StopAsyncIteration:
                    break
                t0 = time.perf_counter()
                run.trainer_wait_s += t0 - w0
                mark("trainer", "update_start", update=len(run.history), groups=len(fresh))
                groups = rl_groups(t for group in fresh for t in group)
                samples = [s for members in groups.values() for _, turns in members for s in turns]
                metrics = (
                    await asyncio.to_thread(trainer.step, samples)
                    if samples
                    else {"skipped_groups": float(len(groups))}
                )
                snapshot = None
                if live is not None:
                    snapshot = await asyncio.to_thread(weights_snapshot, model)
                elif shared is not None:
                    model.eval()  # the update left it in train mode; the next round samples from it
                    shared.version = versions.trainer + 1
                run.trainer_busy_s += time.perf_counter() - t0
                mark("trainer", "update_end", update=len(run.history))
                lag = [versions.trainer - t.policy_version for group in fresh for t in group]
                await versions.trainer_updated()
                if snapshot is not None:
                    await publish_queue.put((trainer.step_count, snapshot))
                w1 = time.perf_counter()
                result = await recorded.pop(batch_id)
                run.trainer_wait_s += time.perf_counter() - w1
                if lag:
                    live_metrics.train_staleness(max(lag))
                batch = result.metrics
                metrics = {
                    **metrics,
                    "rollout_mean_reward": float(batch["mean_reward"]),
                    "rollout_pass_at_1": float(batch["pass_at_1"]),
                    "rollout_tokens": float(batch["tokens"]),
                    "policy_lag_mean": sum(lag) / len(lag) if lag else 0.0,
                    "stale_groups": float(len(stream.stale)),
                    **round_health(result, previous[-1] if previous else None),
                }
                previous[:] = [result]
                run.history.append(metrics)
                run.batch_ids.append(batch_id)
                run.wall_s = time.perf_counter() - started
                if on_round:
                    on_round(len(run.history) - 1, metrics)
        finally:
            await publish_queue.put(None)

    try:
        if cfg.trainer_threads > 0:  # before any worker thread runs a torch op: they take it at their first
            torch.set_num_threads(cfg.trainer_threads)
        if not synchronous and live is None:
            live, server = await asyncio.to_thread(_start_live_policy, model, tokenizer, cfg, batch_prefix, ckpt_dir)
        rollout_policy = shared if live is None else live.policy
        await asyncio.gather(stream.run(produce()), train(), publish())
    finally:
        await asyncio.to_thread(lease.close)  # a local pool closes; the fleet's is the process's, shared
        if live is not None and hasattr(live.policy, "aclose"):
            await live.policy.aclose()
        if server is not None:
            await asyncio.to_thread(server.close)
        torch.set_num_threads(threads_before)
    run.stale_groups = list(stream.stale)
    return run


def pass_at_1_by(result: BatchResult, tasks: Sequence[Task], key: Callable[[Task], str]) -> dict[str, float]:
    """Held-out pass@1 broken down by a task attribute (tier, source)."""
    by_task = {t.task_id: t.resolved for t in result.store.trajectories()}
    buckets: dict[str, list[bool]] = {}
    for task in tasks:
        if task.id in by_task:
            buckets.setdefault(key(task), []).append(by_task[task.id])
    return {k: sum(v) / len(v) for k, v in sorted(buckets.items())}
