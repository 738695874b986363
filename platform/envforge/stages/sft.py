"""SFT: supervised fine-tuning on the teacher's demonstrations of a task set's train split."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.stages.base import CheckpointRecord, StageContext, StageResult, stage
from envforge.stages.images import ImageSet, ensure_images
from envforge.train.config import TrainingConfig

SFT_MODEL = "envforge-policy-sft"  # the registered model SFT checkpoints become versions of
LINEAGE_TAGS = ("task_set_version", "rollout_batches", "start_checkpoint")


@dataclass
class SFTStageResult(StageResult):
    version: str
    checkpoint: Path
    result: Any  # envforge.train.sft.SFTResult
    chart: Path
    train_tasks: int
    eval_tasks: int
    lineage: dict[str, str] = field(default_factory=dict)

    @property
    def eval_loss(self) -> float:
        return self.result.eval_losses[-1][1] if self.result.eval_losses else 0.0

    def params(self) -> dict[str, Any]:
        return {"task_set_version": self.version, "train_tasks": self.train_tasks, "eval_tasks": self.eval_tasks}

    def charts(self) -> list[Path]:
        return [self.chart]

    def checkpoints(self) -> list[CheckpointRecord]:
        return [
            CheckpointRecord(
                self.checkpoint,
                {"eval_loss": self.eval_loss},
                SFT_MODEL,
                tags={k: v for k, v in self.lineage.items() if k in LINEAGE_TAGS},
            )
        ]


@stage("sft")
def sft(
    settings: Settings,
    config: TrainingConfig,
    version: str,
    images: ImageSet | None = None,
    context: StageContext = StageContext(),
) -> SFTStageResult:
    """SFT of `config.base_model` on the train split's demonstrations (eval loss on the eval split's),
    saved to <data dir>/checkpoints/sft-<version>."""
    from envforge.charts import learning_curve
    from envforge.train.checkpoint import save_checkpoint
    from envforge.train.loop import demonstrations, load_model
    from envforge.train.sft import steps_per_epoch, train_sft

    catalog = Catalog(settings.catalog_path)
    train_tasks, eval_tasks = catalog.load_split(version, "train"), catalog.load_split(version, "eval")
    images = ensure_images(settings, train_tasks + eval_tasks, images, context)
    train_items, eval_items = images.items(train_tasks), images.items(eval_tasks)
    model, tokenizer = load_model(config.base_model, config.seed)
    sft_config = config.sft_config(tokenizer.pad_token_id or 0)
    batches = (f"sft-{version[:12]}-teacher-train", f"sft-{version[:12]}-teacher-eval")
    train = demonstrations(
        settings, train_items, tokenizer, batches[0], config.concurrency, version, sandboxes=context.sandboxes
    )
    evals = demonstrations(
        settings, eval_items, tokenizer, batches[1], config.concurrency, version, sandboxes=context.sandboxes
    )
    total_steps = steps_per_epoch(len(train), sft_config, train) * sft_config.epochs

    def on_metrics(step: int, metrics: dict) -> None:
        context.log_metrics({f"sft_{k}": v for k, v in metrics.items()}, step)
        context.progress("sft", f"step {step}: loss {metrics.get('loss', float('nan')):.4f}", step, total_steps)

    result = train_sft(model, train, evals, sft_config, tokenizer=tokenizer, on_metrics=on_metrics)
    lineage = {
        "task_set_version": version,
        "rollout_batches": ",".join(batches),
        "start_checkpoint": config.base_model,
        "mlflow_run_id": context.mlflow_run_id or "",
        "dagster_run_id": context.dagster_run_id or "",
        "stage": "sft",
    }
    path = save_checkpoint(
        settings.checkpoint_dir("sft", version),
        model,
        tokenizer,
        step=result.total_steps,
        extra={"base_model": config.base_model, "task_set_version": version, "lineage": lineage},
    )
    chart = learning_curve(
        list(zip(result.steps, result.losses)),
        result.eval_losses,
        [],
        [],
        settings.charts_dir / f"sft-{version[:12]}.png",
        title="SFT",
    )
    return SFTStageResult(version, path, result, chart, len(train_items), len(eval_items), lineage)
