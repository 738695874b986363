"""RL: GRPO rounds from the SFT checkpoint on a task set's train split."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.stages.base import CheckpointRecord, StageContext, StageResult, stage
from envforge.stages.images import ImageSet, ensure_images
from envforge.train.config import TrainingConfig

POLICY_MODEL = "envforge-policy"  # the registered model RL checkpoints become versions of (alias `best`)


@dataclass
class RLStageResult(StageResult):
    version: str
    checkpoint: Path
    start: Path
    history: list[dict[str, float]] = field(default_factory=list)
    batch_ids: list[str] = field(default_factory=list)  # the rollout batches the updates trained on
    timing: dict[str, float] = field(default_factory=dict)  # wall time, trainer idle fraction, stale groups

    def params(self) -> dict[str, Any]:
        return {"task_set_version": self.version, "from": str(self.start), "rollout_batches": self.batch_ids}

    def metrics(self) -> dict[str, float]:
        return dict(self.timing)

    def checkpoints(self) -> list[CheckpointRecord]:
        """Registered, but `best` is not moved here: the evaluation stage moves it on eval-split evidence."""
        return [
            CheckpointRecord(
                self.checkpoint,
                self.history[-1] if self.history else {},
                POLICY_MODEL,
                alias="best",
                is_best=False,
                tags=lineage_tags(self.version, self.batch_ids, self.start),
            )
        ]


def lineage_tags(version: str, batch_ids: list[str], start: Path | str) -> dict[str, str]:
    """What a registered checkpoint was made from (read back by `envforge lineage`)."""
    return {"task_set_version": version, "rollout_batches": ",".join(batch_ids), "start_checkpoint": str(start)}


@stage("grpo", tag="rl")
def rl(
    settings: Settings,
    config: TrainingConfig,
    version: str,
    start: Path,
    images: ImageSet | None = None,
    context: StageContext = StageContext(),
) -> RLStageResult:
    """GRPO rounds from checkpoint `start` (the SFT checkpoint) on the train split, saved to
    <data dir>/checkpoints/rl-<version>."""
    from envforge.train.loop import GRPORounds, grpo_rounds, load_model

    train_tasks = Catalog(settings.catalog_path).load_split(version, "train")
    train_items = ensure_images(settings, train_tasks, images, context).items(train_tasks)
    model, tokenizer = load_model(str(start), config.seed)
    rounds = GRPORounds.from_training(config, tokenizer.pad_token_id or 0)

    def on_round(r: int, metrics: dict) -> None:
        context.log_metrics(metrics, r)
        context.progress(
            "grpo", f"round {r}: rollout reward {metrics['rollout_mean_reward']:.3f}", r + 1, rounds.rounds
        )

    run = grpo_rounds(
        settings,
        model,
        tokenizer,
        train_items,
        rounds,
        f"rl-{version[:12]}",
        on_round=on_round,
        task_set_version=version,
        progress=context.progress,
        sandboxes=context.sandboxes,
    )
    lineage = {
        **lineage_tags(version, run.batch_ids, start),
        "mlflow_run_id": context.mlflow_run_id or "",
        "dagster_run_id": context.dagster_run_id or "",
        "stage": "rl",
    }
    path = run.trainer.save(settings.checkpoint_dir("rl", version), extra={"lineage": lineage})
    return RLStageResult(version, path, Path(start), run.history, run.batch_ids, run.timing())
