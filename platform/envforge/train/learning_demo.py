"""The learning demo: a small model gets measurably better at a task family, on CPU, in minutes.

1. A small Qwen2-shaped model is built from a config, with the locally built tokenizer.
2. Its held-out pass@1 is measured *before*: greedy rollouts, graded by the real sandbox
   verifier.
3. Demonstrations are rollouts of the teacher (reference solutions through the tools,
   tokenized as the student sees them). SFT trains on the training tasks' demonstrations; eval
   loss comes from the held-out tasks' demonstrations.
4. Held-out pass@1 is measured *after SFT*.
5. Rounds of GRPO follow: sample `group_size` rollouts per training task at temperature 1,
   turn complete groups into advantages, update, repeat. Held-out pass@1 is measured
   *after GRPO*.

Everything is logged to one MLflow run: params, per-step SFT and GRPO metrics, the learning
curve PNG, the final checkpoint registered with the alias `best`. `learning_demo.json` in
the data directory holds the figures.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from envforge import track
from envforge.charts import learning_curve
from envforge.config import Settings
from envforge.progress import Progress, no_progress
from envforge.rollout.batch import run_batch
from envforge.rollout.policies.hf import HFPolicy
from envforge.rollout.config import RolloutConfig
from envforge.stages.base import StageContext
from envforge.stages.images import ensure_images
from envforge.train.checkpoint import log_checkpoint
from envforge.train.config import TrainingConfig
from envforge.train.demo_tasks import chore_family
from envforge.train.loop import demonstrations, evaluate, grpo_rounds, load_model
from envforge.train.sft import train_sft

# A model small enough to learn the chores on CPU in minutes: many SFT epochs over few demonstrations,
# every training task in every GRPO round, short completions.
DEMO_TRAINING = TrainingConfig(base_model="tiny:128x4", sft_epochs=40, rl_rounds=3, tasks_per_round=0, max_tokens=48)


@dataclass(frozen=True)
class LearningDemoConfig:
    """The demo's task family and measurements; how it trains is `training` (the pipeline's TrainingConfig)."""

    training: TrainingConfig = DEMO_TRAINING
    train_per_chore: int = 4
    held_out_per_chore: int = 2
    eval_samples: int = 4  # held-out samples per task for the sampled pass@1
    registered_model: str = "envforge-learning-demo"

    @classmethod
    def quick(cls, training: TrainingConfig = DEMO_TRAINING) -> "LearningDemoConfig":
        """A shortened run for tests: fewer tasks, SFT epochs, GRPO rounds and samples."""
        return cls(replace(training, sft_epochs=10, rl_rounds=1, group_size=2), train_per_chore=2,
                   held_out_per_chore=1, eval_samples=2)


def run_learning_demo(settings: Settings, config: LearningDemoConfig = LearningDemoConfig(),
                      progress: Progress = no_progress, dagster_run_id: str | None = None) -> dict[str, Any]:
    out_dir = settings.data_dir / "learning_demo"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    training = config.training
    train_tasks, held_out = chore_family(training.seed, config.train_per_chore, config.held_out_per_chore)
    images = ensure_images(settings, train_tasks + held_out, context=StageContext(progress=progress))
    train_items, held_items = images.items(train_tasks), images.items(held_out)
    model, tokenizer = load_model(training.base_model, training.seed)
    tag = f"demo-s{training.seed}-{int(time.time())}"
    conc, max_tokens = training.concurrency, training.max_tokens

    def held_out_pass_at_1(label: str) -> float:
        """Greedy decoding, one rollout per held-out task."""
        result = evaluate(settings, model, tokenizer, held_items, f"{tag}-eval-{label}", label, conc, max_tokens)
        return float(result.metrics["pass_at_1"])

    def held_out_sampled(label: str) -> float:
        """pass@1 sampled at the training temperature (the policy GRPO trains), averaged over samples per task."""
        policy = HFPolicy((model, tokenizer), policy_id=f"eval-sampled@{label}")
        result = run_batch(settings, held_items, policy,
                           RolloutConfig(n_samples=config.eval_samples, concurrency=conc,
                                         temperature=training.temperature, max_tokens=max_tokens,
                                         seed=10_000 + training.seed), "learning-demo",
                           batch_id=f"{tag}-eval-sampled-{label}")
        return float(result.metrics["pass_at_1"])

    params = {**training.as_params(), **{k: v for k, v in asdict(config).items() if k != "training"},
              "train_tasks": len(train_tasks), "held_out_tasks": len(held_out),
              "parameters": sum(p.numel() for p in model.parameters())}
    with track.mlflow_run(settings, "learning_demo", "train", params, dagster_run_id) as run:
        progress("demo", "held-out pass@1 before training", 0, 5)
        before = held_out_pass_at_1("before")
        sampled = {"before": held_out_sampled("before")}
        track.log_metrics({"pass_at_1_before": before, "pass_at_1_sampled_before": sampled["before"]})

        progress("demo", "teacher demonstrations", 1, 5)
        sft_train = demonstrations(settings, train_items, tokenizer, f"{tag}-teacher-train", conc)
        sft_eval = demonstrations(settings, held_items, tokenizer, f"{tag}-teacher-eval", conc)

        progress("demo", f"SFT on {len(sft_train)} demonstration turns", 2, 5)
        sft = train_sft(model, sft_train, sft_eval, training.sft_config(tokenizer.pad_token_id or 0),
                        out_dir=out_dir / "sft", tokenizer=tokenizer,
                        on_metrics=lambda step, m: track.log_metrics({f"sft_{k}": v for k, v in m.items()}, step=step))
        after_sft = held_out_pass_at_1("after-sft")
        sampled["after_sft"] = held_out_sampled("after-sft")
        track.log_metrics({"pass_at_1_after_sft": after_sft, "pass_at_1_sampled_after_sft": sampled["after_sft"]})

        progress("demo", f"GRPO: {training.rl_rounds} rounds x {training.group_size} samples per task", 3, 5)
        rounds = training.grpo_rounds(tokenizer.pad_token_id or 0)
        trainer, grpo_history = grpo_rounds(
            settings, model, tokenizer, train_items, rounds, f"{tag}-grpo",
            on_round=lambda r, m: track.log_metrics({f"grpo_{k}": v for k, v in m.items()}, step=r))
        rewards = [m["rollout_mean_reward"] for m in grpo_history]
        progress("demo", "held-out pass@1 after GRPO", 4, 5)
        after_grpo = held_out_pass_at_1("after-grpo")
        sampled["after_grpo"] = held_out_sampled("after-grpo")
        track.log_metrics({"pass_at_1_after_grpo": after_grpo, "pass_at_1_sampled_after_grpo": sampled["after_grpo"]})

        final = trainer.save(out_dir / "final")
        log_checkpoint(final, {"pass_at_1": after_grpo}, config.registered_model, alias="best",
                       is_best=after_grpo >= after_sft)
        chart = learning_curve(list(zip(sft.steps, sft.losses)), sft.eval_losses, rewards,
                               [("before\ngreedy", before), ("before\nT=1", sampled["before"]),
                                ("SFT\ngreedy", after_sft), ("SFT\nT=1", sampled["after_sft"]),
                                ("GRPO\ngreedy", after_grpo), ("GRPO\nT=1", sampled["after_grpo"])],
                               out_dir / "learning_curve.png",
                               title=f"Learning demo: {len(train_tasks)} train / {len(held_out)} held-out chores")
        track.log_png(chart)
        doc = {
            "pass_at_1_before": before, "pass_at_1_after_sft": after_sft, "pass_at_1_after_grpo": after_grpo,
            "pass_at_1_sampled_before": sampled["before"], "pass_at_1_sampled_after_sft": sampled["after_sft"],
            "pass_at_1_sampled_after_grpo": sampled["after_grpo"], "eval_samples": config.eval_samples,
            "train_tasks": len(train_tasks), "held_out_tasks": len(held_out),
            "sft_turns": len(sft_train), "sft_eval_turns": len(sft_eval), "sft_steps": sft.total_steps,
            "sft_first_loss": sft.losses[0] if sft.losses else None,
            "sft_final_loss": sft.losses[-1] if sft.losses else None,
            "sft_eval_loss": sft.eval_losses[-1][1] if sft.eval_losses else None,
            "sft_tokens_per_s": sft.tokens_per_s,
            "grpo_rounds": training.rl_rounds, "group_size": training.group_size, "grpo_mean_rewards": rewards,
            "grpo_metrics": grpo_history, "parameters": params["parameters"], "checkpoint": str(final),
            "chart": str(chart), "mlflow_run_id": run.info.run_id, "seconds": round(time.perf_counter() - started, 1),
            "config": asdict(config),
        }
        (settings.data_dir / "learning_demo.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        track.log_json(doc, "learning_demo.json")
        progress("demo", "done", 5, 5)
        return doc
