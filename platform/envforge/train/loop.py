"""The training loop's building blocks, shared by the learning demo, the CLI and the Dagster assets.

A model source is `tiny` (or `tiny:<hidden>x<layers>`: a small Qwen2 built from a config,
with the tokenizer built locally) or a local Hugging Face directory. Nothing is downloaded.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envforge.config import Settings
from envforge.observe import metrics as live
from envforge.observe.health import round_health
from envforge.rollout.batch import BatchResult, run_batch
from envforge.rollout.policies.hf import HFPolicy
from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model
from envforge.progress import Progress
from envforge.rollout.config import RolloutConfig
from envforge.task import Task
from envforge.train.data import TeacherPolicy, rl_groups, turn_samples
from envforge.train.grpo import GRPOConfig, GRPOTrainer
from envforge.train.samples import TurnSample

Items = Sequence[tuple[Task, str]]


def load_model(source: str, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) from `tiny`, `tiny:<hidden>x<layers>`, or a local checkpoint directory."""
    m = re.fullmatch(r"tiny(?::(\d+)x(\d+))?", source)
    if m:
        hidden, layers = int(m.group(1) or 128), int(m.group(2) or 4)
        torch.manual_seed(seed)
        return build_tiny_model(TinyModelConfig(hidden_size=hidden, num_layers=layers, heads=4, kv_heads=2,
                                                intermediate=2 * hidden, seed=seed))
    path = Path(source)
    if not (path / "config.json").is_file():
        raise ValueError(f"model source {source!r}: expected 'tiny', 'tiny:<hidden>x<layers>' or a local "
                         f"Hugging Face directory with config.json")
    return (AutoModelForCausalLM.from_pretrained(path, local_files_only=True),
            AutoTokenizer.from_pretrained(path, local_files_only=True))


def demonstrations(settings: Settings, items: Items, tokenizer: Any, batch_id: str, concurrency: int = 4,
                   task_set_version: str = "") -> list[TurnSample]:
    """SFT samples: the teacher's rollouts (reference solutions through the tools), resolved ones only."""
    result = run_batch(settings, items, TeacherPolicy(tokenizer), RolloutConfig(n_samples=1, concurrency=concurrency),
                       task_set_version, batch_id=batch_id)
    return turn_samples(result.store.trajectories(), only_resolved=True)


def evaluate(settings: Settings, model: Any, tokenizer: Any, items: Items, batch_id: str, label: str,
             concurrency: int = 4, max_tokens: int = 64, task_set_version: str = "",
             progress: Progress | None = None) -> BatchResult:
    """One greedy rollout per task, graded by the sandbox verifier: pass@1."""
    policy = HFPolicy((model, tokenizer), policy_id=f"eval@{label}")
    return run_batch(settings, items, policy, RolloutConfig(n_samples=1, concurrency=concurrency, temperature=0.0,
                                                            max_tokens=max_tokens), task_set_version,
                     batch_id=batch_id, progress=progress)


@dataclass
class GRPORounds:
    """Rounds of (rollouts of the current weights, GRPO update). Rollouts sample at `grpo.temperature`,
    the temperature the update takes behaviour log-probs at: one setting, so they cannot differ."""

    rounds: int = 3
    group_size: int = 4
    max_tokens: int = 64
    concurrency: int = 4
    seed: int = 0
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    # Tasks sampled per round (the prompt batch); None: every task every round. Sampling keeps a round's
    # cost fixed as the task set grows, and a different seeded sample per round still covers the split.
    tasks_per_round: int | None = None


def round_items(items: Items, cfg: GRPORounds, round_index: int) -> Items:
    """The tasks of one round: all of them, or a seeded sample of `tasks_per_round`."""
    if cfg.tasks_per_round is None or cfg.tasks_per_round >= len(items):
        return list(items)
    return random.Random(cfg.seed * 1_000_003 + round_index).sample(list(items), cfg.tasks_per_round)


def grpo_rounds(settings: Settings, model: Any, tokenizer: Any, items: Items, cfg: GRPORounds, batch_prefix: str,
                on_round: Callable[[int, dict[str, float]], None] | None = None,
                task_set_version: str = "", progress: Progress | None = None,
                ) -> tuple[GRPOTrainer, list[dict[str, float]]]:
    """Each round rolls out the current weights (on-policy: staleness 0), then updates on complete groups."""
    trainer = GRPOTrainer(model, cfg.grpo, tokenizer=tokenizer)
    history = []
    previous: BatchResult | None = None
    for r in range(cfg.rounds):
        policy = HFPolicy((model, tokenizer), policy_id=f"{batch_prefix}@round-{r}", version=r)
        batch = run_batch(settings, round_items(items, cfg, r), policy,
                          RolloutConfig(n_samples=cfg.group_size, concurrency=cfg.concurrency,
                                        temperature=cfg.grpo.temperature, max_tokens=cfg.max_tokens,
                                        seed=cfg.seed + r),
                          task_set_version, batch_id=f"{batch_prefix}-round-{r}", progress=progress)
        groups = rl_groups(batch.store.trajectories())
        samples = [s for members in groups.values() for _, turns in members for s in turns]
        metrics = trainer.step(samples) if samples else {"skipped_groups": float(len(groups))}
        if samples:
            live.train_staleness(r - min(s.policy_version for s in samples))
        metrics = {**metrics, "rollout_mean_reward": float(batch.metrics["mean_reward"]),
                   "rollout_pass_at_1": float(batch.metrics["pass_at_1"]),
                   "rollout_tokens": float(batch.metrics["tokens"]),
                   **round_health(batch, previous)}
        previous = batch
        history.append(metrics)
        if on_round:
            on_round(r, metrics)
    return trainer, history


def pass_at_1_by(result: BatchResult, tasks: Sequence[Task], key: Callable[[Task], str]) -> dict[str, float]:
    """Held-out pass@1 broken down by a task attribute (tier, source)."""
    by_task = {t.task_id: t.resolved for t in result.store.trajectories()}
    buckets: dict[str, list[bool]] = {}
    for task in tasks:
        if task.id in by_task:
            buckets.setdefault(key(task), []).append(by_task[task.id])
    return {k: sum(v) / len(v) for k, v in sorted(buckets.items())}
