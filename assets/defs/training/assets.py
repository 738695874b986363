"""Training: SFT and GRPO checkpoints on the run's tiered task set, and the before/after evaluation.

All three read one `training` resource (envforge.train.config.TrainingConfig), and the task-set
version, images and checkpoints the assets before them recorded.
"""

from pathlib import Path

import dagster as dg

from assets.defs.config import TrainingResource, training_config
from assets.defs.metadata import mlflow_run, png, stage_context, upstream
from assets.defs.resources import SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, settings_from
from envforge.stages.evaluate import evaluate
from envforge.stages.images import ImageSet
from envforge.stages.rl import rl
from envforge.stages.sft import sft


def _inputs(context: dg.AssetExecutionContext) -> tuple[str, ImageSet]:
    """The task-set version and the images of the run (or of their latest materializations)."""
    return (upstream(context, "tiered_task_set")["version"],
            ImageSet.from_json(upstream(context, "environment_images")["image_set"]))


@dg.asset(
    group_name="training", kinds={"pytorch", "mlflow"}, owners=["team:envforge"], deps=["tiered_task_set"],
    description="Supervised fine-tuning on the teacher's demonstrations (reference solutions rendered through the "
                "tools, tokenized as the policy sees them) of the task set's train split; eval loss on the eval "
                "split. A Hugging Face checkpoint, registered in the MLflow model registry.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def sft_checkpoint(context: dg.AssetExecutionContext, training: TrainingResource, catalog: CatalogResource,
                   docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    version, images = _inputs(context)
    result = sft.tracked(settings, training_config(training), version, images, context=stage_context(context))
    losses = result.result.losses
    return dg.MaterializeResult(metadata={
        "task_set_version": version, "checkpoint": str(result.checkpoint), "steps": result.result.total_steps,
        "first_loss": losses[0] if losses else 0.0, "final_loss": losses[-1] if losses else 0.0,
        "eval_loss": result.eval_loss, "tokens_per_s": round(result.result.tokens_per_s, 1),
        "loss_curve": png(result.chart), "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
    })


@dg.asset(
    group_name="training", kinds={"pytorch", "mlflow"}, owners=["team:envforge"], deps=[sft_checkpoint],
    description="GRPO from the SFT checkpoint: rounds of on-policy rollouts on the train split (complete groups "
                "only), group-normalized advantages, clipped ratio against the recorded behaviour log-probs. The "
                "checkpoint is registered with the alias `best`.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def rl_checkpoint(context: dg.AssetExecutionContext, training: TrainingResource, catalog: CatalogResource,
                  docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    version, images = _inputs(context)
    start = Path(upstream(context, "sft_checkpoint")["checkpoint"])
    result = rl.tracked(settings, training_config(training), version, start, images, context=stage_context(context))
    return dg.MaterializeResult(metadata={
        "task_set_version": version, "checkpoint": str(result.checkpoint), "rounds": len(result.history),
        "rollout_mean_reward": dg.MetadataValue.json([m["rollout_mean_reward"] for m in result.history]),
        "history": dg.MetadataValue.json(result.history), "rollout_batches": dg.MetadataValue.json(result.batch_ids),
        "timing": dg.MetadataValue.json(result.timing), "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
    })


@dg.asset(
    group_name="training", kinds={"mlflow"}, owners=["team:envforge"], deps=[rl_checkpoint],
    description="Eval-split pass@1 before training (the base model), after SFT and after RL, per tier and per "
                "source, graded by the sandbox verifier, with PNG charts.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def evaluation_report(context: dg.AssetExecutionContext, training: TrainingResource, catalog: CatalogResource,
                      docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    version, images = _inputs(context)
    checkpoints = {"after SFT": Path(upstream(context, "sft_checkpoint")["checkpoint"]),
                   "after RL": Path(upstream(context, "rl_checkpoint")["checkpoint"])}
    result = evaluate.tracked(settings, training_config(training), version, checkpoints, images,
                              context=stage_context(context))
    return dg.MaterializeResult(metadata={
        "task_set_version": version, "eval_tasks": result.report["eval_tasks"],
        "pass_at_1": dg.MetadataValue.json(result.pass_at_1()), "report": dg.MetadataValue.json(result.report),
        "by_tier": png(result.charts_by["by_tier"]), "by_source": png(result.charts_by["by_source"]),
        "promotion": dg.MetadataValue.json(result.report.get("promotion", {})),
        "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
    })
