"""The learning demo: a small model gets measurably better at a task family, on CPU, in minutes,
and GRPO has something to add over SFT.

1. A small Qwen2-shaped model is built from a config, with the locally built tokenizer.
2. Its held-out pass@1 is measured *before*: greedy rollouts and sampled rollouts (at the
   training temperature), graded by the real sandbox verifier.
3. Demonstrations are *operator logs* of the training chores (`chores.operator_logs`):
   recorded sessions that hold slips next to the fixes, imitated as recorded. SFT learns
   which command each chore takes, slips included, so a sampled rollout after SFT is a
   fix or a slip about as often as the logs are: headroom that more imitation cannot close.
4. Held-out pass@1 is measured *after SFT*.
5. GRPO rounds follow (synchronous or asynchronous, `TrainingConfig.max_staleness`): the
   policy's own samples per training task, graded by the verifier; a slip gets reward 0
   and the fix 1 within the same group, so the advantage pushes the policy from the slips
   to the fixes. Held-out pass@1 is measured *after GRPO*.

Seeds run one after the other (the task sample, the logs, the model init, the rollouts all
follow the seed); `learning_demo.json` holds the mean over seeds of every pass@1 figure, its
spread (min, max, std) and every seed's figures. Everything is logged to MLflow (one run per
seed, nested in the demo's run): params, per-step SFT and GRPO metrics, the learning curve
PNG, the final checkpoint registered, with the alias `best` moved only if its held-out pass@1
beats the current holder's (`train.registry.promote_if_better`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Iterator

from envforge import track
from envforge.catalog import Catalog
from envforge.charts import learning_curve
from envforge.config import Settings
from envforge.demos.chores import CHORES, OUTCOMES, chore_family, first_command_outcome, operator_logs
from envforge.progress import Progress, no_progress
from envforge.rollout.batch import run_batch
from envforge.rollout.config import RolloutConfig
from envforge.rollout.policies.hf import HFPolicy
from envforge.stages.base import StageContext
from envforge.stages.images import ensure_images
from envforge.task import Task
from envforge.train.checkpoint import log_checkpoint
from envforge.train.config import DEMO_TRAINING, TrainingConfig
from envforge.train.loop import GRPORounds, demonstrations, evaluate, grpo_rounds, load_model
from envforge.train.registry import promote_if_better
from envforge.train.samples import TurnSample
from envforge.train.sft import train_sft

FIXES = {c.command for c in CHORES}

PHASES = ("before", "after_sft", "after_grpo")


@dataclass(frozen=True)
class LearningDemoConfig:
    """The demo's task family and measurements; how it trains is `training` (the pipeline's TrainingConfig)."""

    training: TrainingConfig = DEMO_TRAINING
    seeds: tuple[int, ...] = (0, 1, 2)
    train_per_chore: int = 4
    held_out_per_chore: int = 2
    slip_rate: float = 0.5  # share of the operator logs that record a slip instead of the fix
    logs_per_task: int = 3  # logged sessions per training task, each a fix or a slip (drawn independently)
    eval_samples: int = 4  # held-out samples per task for the sampled pass@1
    registered_model: str = "envforge-learning-demo"

    @classmethod
    def quick(cls, training: TrainingConfig = DEMO_TRAINING) -> "LearningDemoConfig":
        """A shortened run for tests: one seed, fewer tasks, SFT epochs, GRPO rounds and samples."""
        return cls(
            replace(training, sft_epochs=4, rl_rounds=2, group_size=2, tasks_per_round=4),
            seeds=(training.seed,),
            train_per_chore=2,
            held_out_per_chore=1,
            logs_per_task=1,
            eval_samples=2,
        )


class PhaseClock:
    """Wall and CPU seconds per phase of a seed. The CPU seconds (this process, every thread) barely
    depend on how loaded the machine is, so they say what a quiet run would take when the wall
    seconds were measured on a shared one; sandbox work in the Docker engine is not in them."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[phase] = {
                "wall": round(time.perf_counter() - wall, 1),
                "cpu": round(time.process_time() - cpu, 1),
            }


def seed_spread(values: list[float]) -> dict[str, float]:
    """Mean, min, max and population std of per-seed figures."""
    mean = statistics.fmean(values)
    return {
        "mean": mean,
        "min": min(values),
        "max": max(values),
        "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
    }


def _summary(
    config: LearningDemoConfig, per_seed: list[dict[str, Any]], mlflow_run_id: str, seconds: float
) -> dict[str, Any]:
    """`learning_demo.json` over the seeds run so far: means, spreads, the gain, every seed's figures."""
    keys = [f"pass_at_1_{kind}{phase}" for kind in ("", "sampled_") for phase in PHASES]
    spread = {k: seed_spread([s[k] for s in per_seed]) for k in keys}
    gain = seed_spread([s["pass_at_1_sampled_after_grpo"] - s["pass_at_1_sampled_after_sft"] for s in per_seed])
    return {
        **{k: v["mean"] for k, v in spread.items()},
        "spread": spread,
        "sampled_gain_grpo_over_sft": gain,
        "seeds": [s["seed"] for s in per_seed],
        "complete": len(per_seed) == len(config.seeds),
        "per_seed": per_seed,
        **{
            k: per_seed[-1][k]
            for k in (
                "train_tasks",
                "held_out_tasks",
                "sft_turns",
                "sft_eval_turns",
                "sft_first_loss",
                "sft_final_loss",
                "checkpoint",
                "chart",
            )
        },
        "eval_samples": config.eval_samples,
        "mlflow_run_id": mlflow_run_id,
        "seconds": round(seconds, 1),
        "config": asdict(config),
    }


def run_learning_demo(
    settings: Settings,
    config: LearningDemoConfig = LearningDemoConfig(),
    progress: Progress = no_progress,
    dagster_run_id: str | None = None,
) -> dict[str, Any]:
    """Every seed of the demo; writes and returns `learning_demo.json` (means, spreads, per-seed figures)."""
    started = time.perf_counter()
    params = {**config.training.as_params(), **{k: v for k, v in asdict(config).items() if k != "training"}}
    with track.mlflow_run(settings, "learning_demo", "train", params, dagster_run_id) as run:
        per_seed: list[dict[str, Any]] = []
        for n, seed in enumerate(config.seeds):
            progress("demo", f"seed {seed} ({n + 1}/{len(config.seeds)})", n, len(config.seeds))
            per_seed.append(_one_seed(settings, config, replace(config.training, seed=seed), progress))
            doc = _summary(config, per_seed, run.info.run_id, time.perf_counter() - started)
            # Written after every seed, so a run stopped midway keeps the seeds it finished (`complete` false).
            (settings.data_dir / "learning_demo.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        gain = doc["sampled_gain_grpo_over_sft"]
        track.log_metrics(
            {k: v for k, v in doc.items() if k.startswith("pass_at_1_")} | {"sampled_gain_grpo_over_sft": gain["mean"]}
        )
        track.log_json(doc, "learning_demo.json")
        progress("demo", "done", len(config.seeds), len(config.seeds))
        return doc


@dataclass(frozen=True)
class DemoSeed:
    """One seed's material, built the same way for the demo and for `bench/train_async.py --preset demo`:
    the chore family's train and held-out tasks with their images, and the operator logs of the train tasks."""

    seed: int
    train_tasks: list[Task]
    held_out: list[Task]
    train_items: list[tuple[Task, str]]
    held_items: list[tuple[Task, str]]
    log_items: list[tuple[Task, str]]  # operator logs (fixes and slips, as recorded) with their task's image

    @property
    def chore_of(self) -> dict[str, str]:
        return {t.id: t.spec.metadata["chore"] for t in self.train_tasks + self.held_out}

    @property
    def slips(self) -> int:
        """Operator logs that record a slip instead of the fix."""
        return sum(1 for log, _ in self.log_items if log.spec.reference_solution.commands[0] not in FIXES)


def demo_seed(settings: Settings, config: LearningDemoConfig, seed: int, progress: Progress = no_progress) -> DemoSeed:
    """The seed's tasks (`chore_family`), their images, and the operator logs of its training tasks."""
    train_tasks, held_out = chore_family(seed, config.train_per_chore, config.held_out_per_chore)
    images = ensure_images(settings, train_tasks + held_out, context=StageContext(progress=progress))
    train_items, held_items = images.items(train_tasks), images.items(held_out)
    image_of = {t.id: image for t, image in train_items + held_items}
    log_items = [
        (log, image_of[log.id.rsplit(".log", 1)[0]])
        for log in operator_logs([t for t, _ in train_items], seed, config.slip_rate, config.logs_per_task)
    ]
    return DemoSeed(seed, train_tasks, held_out, train_items, held_items, log_items)


def seed_demonstrations(
    settings: Settings, data: DemoSeed, tokenizer: Any, tag: str, concurrency: int
) -> tuple[list[TurnSample], list[TurnSample]]:
    """SFT's turns: the operator logs as recorded (slips included), and the held-out teacher turns (eval loss)."""
    sft_train = demonstrations(
        settings, data.log_items, tokenizer, f"{tag}-operator-logs", concurrency, only_resolved=False
    )
    sft_eval = demonstrations(settings, data.held_items, tokenizer, f"{tag}-teacher-eval", concurrency)
    return sft_train, sft_eval


def held_out_greedy(
    settings: Settings, model: Any, tokenizer: Any, data: DemoSeed, training: TrainingConfig, tag: str, label: str
) -> float:
    """Held-out pass@1, greedy decoding, one rollout per held-out task."""
    result = evaluate(
        settings,
        model,
        tokenizer,
        data.held_items,
        f"{tag}-eval-{label}",
        label,
        training.concurrency,
        training.max_tokens,
    )
    return float(result.metrics["pass_at_1"])


def held_out_sampled(
    settings: Settings,
    model: Any,
    tokenizer: Any,
    data: DemoSeed,
    config: LearningDemoConfig,
    training: TrainingConfig,
    tag: str,
    label: str,
) -> tuple[float, dict[str, int]]:
    """Held-out pass@1 sampled at the training temperature (the policy GRPO trains), averaged over
    `eval_samples` per task with a fixed sampling seed per demo seed (so two policies are compared
    on the same draws), and what the sampled rollouts' first commands were (`outcome_counts`)."""
    policy = HFPolicy((model, tokenizer), policy_id=f"eval-sampled@{label}")
    result = run_batch(
        settings,
        data.held_items,
        policy,
        RolloutConfig(
            n_samples=config.eval_samples,
            concurrency=training.concurrency,
            temperature=training.temperature,
            max_tokens=training.max_tokens,
            seed=10_000 + training.seed,
        ),
        "learning-demo",
        batch_id=f"{tag}-eval-sampled-{label}",
        register=Catalog(settings.catalog_path).record_rollout_batch,
    )
    return float(result.metrics["pass_at_1"]), outcome_counts(result.store.trajectories(), data.chore_of)


def outcome_counts(trajectories: Iterable[Any], chore_of: dict[str, str]) -> dict[str, int]:
    """How many rollouts' first commands were each outcome (`chores.first_command_outcome`)."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for t in trajectories:
        counts[first_command_outcome(chore_of[t.task_id], t.turns)] += 1
    return counts


def mixed_group_fractions(history: list[dict[str, float]]) -> list[float]:
    """Per GRPO round, the share of groups whose rewards differ: only those carry a policy gradient
    (the others are skipped)."""
    return [1.0 - m.get("skipped_groups", 0.0) / m["groups"] if m.get("groups") else 0.0 for m in history]


def _one_seed(
    settings: Settings, config: LearningDemoConfig, training: TrainingConfig, progress: Progress
) -> dict[str, Any]:
    out_dir = settings.data_dir / "learning_demo" / f"seed-{training.seed}"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    data = demo_seed(settings, config, training.seed, progress)
    train_tasks, held_out, log_items = data.train_tasks, data.held_out, data.log_items
    model, tokenizer = load_model(training.base_model, training.seed)
    tag = f"demo-s{training.seed}-{int(time.time())}"

    params = {
        **training.as_params(),
        "train_tasks": len(train_tasks),
        "held_out_tasks": len(held_out),
        "operator_logs": len(log_items),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    with track.mlflow_run(settings, f"learning_demo-s{training.seed}", "train", params, nested=True) as run:
        figures: dict[str, float] = {}
        outcomes: dict[str, dict[str, int]] = {}
        clock = PhaseClock()

        def measure(phase: str) -> None:
            with clock(f"eval_{phase}"):
                label = phase.replace("_", "-")
                figures[f"pass_at_1_{phase}"] = held_out_greedy(settings, model, tokenizer, data, training, tag, label)
                figures[f"pass_at_1_sampled_{phase}"], outcomes[phase] = held_out_sampled(
                    settings, model, tokenizer, data, config, training, tag, label
                )
            track.log_metrics({k: v for k, v in figures.items() if k.endswith(phase)})

        progress("demo", f"seed {training.seed}: held-out pass@1 before training", 0, 5)
        measure("before")
        progress("demo", f"seed {training.seed}: {len(log_items)} operator logs", 1, 5)
        with clock("demonstrations"):
            sft_train, sft_eval = seed_demonstrations(settings, data, tokenizer, tag, training.concurrency)

        progress("demo", f"seed {training.seed}: SFT on {len(sft_train)} demonstration turns", 2, 5)
        with clock("sft"):
            sft = train_sft(
                model,
                sft_train,
                sft_eval,
                training.sft_config(tokenizer.pad_token_id or 0),
                out_dir=out_dir / "sft",
                tokenizer=tokenizer,
                on_metrics=lambda step, m: track.log_metrics({f"sft_{k}": v for k, v in m.items()}, step=step),
            )
        measure("after_sft")

        progress(
            "demo",
            f"seed {training.seed}: GRPO, {training.rl_rounds} rounds x {training.group_size} samples "
            f"per task (max_staleness {training.max_staleness})",
            3,
            5,
        )
        with clock("grpo"):
            grpo = grpo_rounds(
                settings,
                model,
                tokenizer,
                data.train_items,
                GRPORounds.from_training(training, tokenizer.pad_token_id or 0),
                f"{tag}-grpo",
                on_round=lambda r, m: track.log_metrics({f"grpo_{k}": v for k, v in m.items()}, step=r),
            )
        rewards = [m["rollout_mean_reward"] for m in grpo.history]
        mixed = mixed_group_fractions(grpo.history)
        progress("demo", f"seed {training.seed}: held-out pass@1 after GRPO", 4, 5)
        measure("after_grpo")

        final = grpo.trainer.save(
            out_dir / "final",
            extra={
                "lineage": {
                    "stage": "learning-demo",
                    "task_set_version": "learning-demo",
                    "rollout_batches": ",".join(grpo.batch_ids),
                    "start_checkpoint": training.base_model,
                    "mlflow_run_id": run.info.run_id,
                }
            },
        )
        log_checkpoint(
            final,
            {"pass_at_1": figures["pass_at_1_after_grpo"]},
            config.registered_model,
            tags={
                "task_set_version": "learning-demo",
                "rollout_batches": ",".join(grpo.batch_ids),
                "start_checkpoint": training.base_model,
            },
        )
        promotion = promote_if_better(
            settings,
            config.registered_model,
            final,
            figures["pass_at_1_after_grpo"],
            "learning-demo",
            measure=lambda path: _greedy_pass_at_1(
                settings, path, data.held_items, f"{tag}-eval-current-best", training
            ),
        )
        chart = learning_curve(
            list(zip(sft.steps, sft.losses)),
            sft.eval_losses,
            rewards,
            [
                (f"{label}\n{kind}", figures[f"pass_at_1_{key}{phase}"])
                for phase, label in zip(PHASES, ("before", "SFT", "GRPO"))
                for key, kind in (("", "greedy"), ("sampled_", f"T={training.temperature:g}"))
            ],
            out_dir / "learning_curve.png",
            title=f"Learning demo, seed {training.seed}: {len(train_tasks)} train / {len(held_out)} held-out chores",
        )
        track.log_png(chart)
        return {
            "seed": training.seed,
            **figures,
            "train_tasks": len(train_tasks),
            "held_out_tasks": len(held_out),
            "operator_logs": len(log_items),
            "operator_slips": data.slips,
            "sft_turns": len(sft_train),
            "sft_eval_turns": len(sft_eval),
            "sft_steps": sft.total_steps,
            "sft_first_loss": sft.losses[0] if sft.losses else None,
            "sft_final_loss": sft.losses[-1] if sft.losses else None,
            "sft_eval_loss": sft.eval_losses[-1][1] if sft.eval_losses else None,
            "sft_tokens_per_s": sft.tokens_per_s,
            "grpo_rounds": training.rl_rounds,
            "group_size": training.group_size,
            "grpo_mean_rewards": rewards,
            "grpo_mixed_group_fraction": mixed,
            "grpo_entropy": [m.get("entropy", 0.0) for m in grpo.history],
            "grpo_metrics": grpo.history,
            "sampled_outcomes": outcomes,
            "phase_seconds": clock.seconds,
            "grpo_timing": grpo.timing(),
            "parameters": params["parameters"],
            "checkpoint": str(final),
            "promotion": promotion,
            "chart": str(chart),
            "mlflow_run_id": run.info.run_id,
            "seconds": round(time.perf_counter() - started, 1),
        }


def _greedy_pass_at_1(settings: Settings, path: str, items: Any, batch_id: str, training: TrainingConfig) -> float:
    model, tokenizer = load_model(path, training.seed)
    return float(
        evaluate(
            settings, model, tokenizer, items, batch_id, "current-best", training.concurrency, training.max_tokens
        ).metrics["pass_at_1"]
    )
