"""Training: SFT and GRPO checkpoints on the tiered task set, and the before/after evaluation."""

import dagster as dg

from assets.defs.metadata import log_progress, mlflow_run, png
from assets.defs.resources import SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, settings_from
from envforge import stages


class SFTRunConfig(dg.Config):
    """`base_model`: `tiny`, `tiny:<hidden>x<layers>`, or a local Hugging Face directory (nothing is downloaded)."""

    base_model: str = "tiny"
    epochs: int = 5
    lr: float = 3e-3
    seed: int = 0


@dg.asset(
    group_name="training", kinds={"pytorch", "mlflow"}, owners=["team:envforge"], deps=["tiered_task_set"],
    description="Supervised fine-tuning on the teacher's demonstrations (reference solutions rendered through the "
                "tools, tokenized as the policy sees them) of the newest task set's train split; eval loss on the "
                "eval split. A Hugging Face checkpoint, registered in the MLflow model registry.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def sft_checkpoint(context: dg.AssetExecutionContext, config: SFTRunConfig, catalog: CatalogResource,
                   docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    path, result, chart, run_id = stages.sft_stage(settings, "latest", config.base_model, config.epochs, config.lr,
                                                   config.seed, context.run.run_id, log_progress(context))
    return dg.MaterializeResult(metadata={
        "checkpoint": str(path), "steps": result.total_steps, "first_loss": result.losses[0] if result.losses else 0.0,
        "final_loss": result.losses[-1] if result.losses else 0.0,
        "eval_loss": result.eval_losses[-1][1] if result.eval_losses else 0.0,
        "tokens_per_s": round(result.tokens_per_s, 1), "loss_curve": png(chart), "mlflow_run": mlflow_run(settings, run_id),
    })


class RLRunConfig(dg.Config):
    """`tasks_per_round`: train-split tasks sampled (seeded) per round, each rolled out `group_size` times;
    0 means every task every round."""

    rounds: int = 2
    group_size: int = 4
    tasks_per_round: int = 4
    lr: float = 1e-4
    seed: int = 0


@dg.asset(
    group_name="training", kinds={"pytorch", "mlflow"}, owners=["team:envforge"], deps=[sft_checkpoint],
    description="GRPO from the SFT checkpoint: rounds of on-policy rollouts on the train split (complete groups "
                "only), group-normalized advantages, clipped ratio against the recorded behaviour log-probs. The "
                "checkpoint is registered with the alias `best`.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def rl_checkpoint(context: dg.AssetExecutionContext, config: RLRunConfig, catalog: CatalogResource,
                  docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    path, history, run_id = stages.rl_stage(settings, "latest", config.rounds, config.group_size, config.lr,
                                            config.seed, context.run.run_id, log_progress(context),
                                            tasks_per_round=config.tasks_per_round or None)
    return dg.MaterializeResult(metadata={
        "checkpoint": str(path), "rounds": len(history),
        "rollout_mean_reward": dg.MetadataValue.json([m["rollout_mean_reward"] for m in history]),
        "history": dg.MetadataValue.json(history), "mlflow_run": mlflow_run(settings, run_id),
    })


class EvalRunConfig(dg.Config):
    base_model: str = "tiny"
    seed: int = 0


@dg.asset(
    group_name="training", kinds={"mlflow"}, owners=["team:envforge"], deps=[rl_checkpoint],
    description="Eval-split pass@1 before training (the base model), after SFT and after RL, per tier and per "
                "source, graded by the sandbox verifier, with PNG charts.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def evaluation_report(context: dg.AssetExecutionContext, config: EvalRunConfig, catalog: CatalogResource,
                      docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    report, charts, run_id = stages.evaluation_stage(settings, "latest", config.base_model, config.seed,
                                                     context.run.run_id, log_progress(context))
    return dg.MaterializeResult(metadata={
        "eval_tasks": report["eval_tasks"],
        "pass_at_1": dg.MetadataValue.json({p: v["pass_at_1"] for p, v in report["phases"].items()}),
        "report": dg.MetadataValue.json(report), "by_tier": png(charts["by_tier"]),
        "by_source": png(charts["by_source"]), "mlflow_run": mlflow_run(settings, run_id),
    })
