"""Rollouts: the tiered task set, and rollout batches per (task-set version, policy)."""

import dagster as dg
import pydantic

from assets.defs.config import run_config, to_library
from assets.defs.metadata import mlflow_run, png, stage_context, upstream
from assets.defs.resources import (
    SANDBOX_POOL,
    CatalogResource,
    DockerResource,
    MlflowResource,
    PolicyResource,
    settings_from,
)
from envforge.rollout.config import RolloutConfig
from envforge.stages.configs import TaskSetConfig, TierConfig
from envforge.stages.images import ImageSet
from envforge.stages.rollout import rollout
from envforge.stages.task_set import Lineage, publish_task_set
from envforge.stages.tiers import tier_task_set

TASK_SET_VERSIONS = dg.DynamicPartitionsDefinition(name="task_set_versions")
POLICIES = dg.DynamicPartitionsDefinition(name="rollout_policies")
ROLLOUT_PARTITIONS = dg.MultiPartitionsDefinition({"task_set": TASK_SET_VERSIONS, "policy": POLICIES})

TieredTaskSetConfig = run_config(
    (TaskSetConfig, TierConfig), "TieredTaskSetConfig",
    "The task set's name and its tiers. `policy` empty: the environment's default (the `policy` resource's "
    "tier_policy: the served vLLM policy in production, static features locally).")


@dg.asset(
    group_name="rollouts", kinds={"duckdb", "python"}, owners=["team:envforge"], deps=["validated_tasks"],
    pool=SANDBOX_POOL,  # pass@k tiering rolls the reference policy out in sandboxes (production's default)
    description="The run's accepted task versions as a versioned task set (its lineage: sources, what "
                "decontamination and the gate removed and why, and their params, which are part of the version), "
                "each task with a difficulty tier (pass@k of a reference policy over k samples, or static features) "
                "and a train/eval split stratified by tier and source that keeps near duplicates on one side; "
                "unsolved tasks go to an audit split. Registers the version as a partition of rollout_batch.",
)
def tiered_task_set(context: dg.AssetExecutionContext, config: TieredTaskSetConfig, catalog: CatalogResource,
                    docker: DockerResource, mlflow: MlflowResource, policy: PolicyResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    quality, gated = upstream(context, "decontaminated_tasks"), upstream(context, "validated_tasks")
    tasks = catalog.catalog().load_versions(gated["accepted_versions"])
    if not tasks:
        raise dg.Failure("no accepted tasks: materialize validated_tasks first")
    lineage = Lineage(removed=quality["removed"] + gated["removed"], params={**quality["params"], "gate": gated["params"]})
    stage = stage_context(context)
    task_set = publish_task_set.tracked(settings, to_library(config, TaskSetConfig), tasks, lineage, context=stage)
    version = task_set.version
    context.log.info(f"task set {version[:12]}: {'new version' if task_set.new_version else 'unchanged, same version'}")
    tier_config = to_library(config, TierConfig, policy=config.policy or policy.tier_policy)
    images = ImageSet.from_json(upstream(context, "environment_images")["image_set"])
    tiers = tier_task_set.tracked(settings, tier_config, version, images, context=stage)
    key = version[:12]
    context.instance.add_dynamic_partitions(TASK_SET_VERSIONS.name, [key])
    known = set(context.instance.get_dynamic_partitions(POLICIES.name))
    context.instance.add_dynamic_partitions(POLICIES.name, [p for p in policy.partition_keys() if p not in known])
    return dg.MaterializeResult(metadata={
        "version": version, "new_version": task_set.new_version, "partition_key": key, "tasks": len(tiers.rows),
        "method": tiers.method, "tiers": dg.MetadataValue.json(tiers.tier_counts()),
        "splits": dg.MetadataValue.json(tiers.split_counts()), "duplicate_pairs": len(tiers.pairs),
        "histogram": png(tiers.chart), "lineage": dg.MetadataValue.json(task_set.lineage),
        "mlflow_run": mlflow_run(settings, tiers.mlflow_run_id),
    })


# max_dropped_fraction sets the CLI's exit code; in Dagster the blocking check rollout_infra_failure_rate judges
# every registered batch's dropped share.
RolloutRunConfig = run_config(
    RolloutConfig, "RolloutRunConfig", skip=("max_dropped_fraction",),
    **{"split": (str, pydantic.Field(default="all", description="the tasks to roll out: train | eval | audit | all"))})


@dg.asset(
    group_name="rollouts", kinds={"docker", "parquet"}, owners=["team:envforge"], deps=[tiered_task_set],
    partitions_def=ROLLOUT_PARTITIONS, op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
    description="n samples per task of one task-set version with one policy: every trajectory graded on a pristine "
                "copy and stored as parquet (complete groups only; infra faults retried, exhausted groups dropped "
                "and recorded). Resumes where a killed run stopped.",
)
def rollout_batch(context: dg.AssetExecutionContext, config: RolloutRunConfig, catalog: CatalogResource,
                  docker: DockerResource, mlflow: MlflowResource, policy: PolicyResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    keys = context.partition_key.keys_by_dimension
    cat = catalog.catalog()
    version = cat.resolve_task_set(keys["task_set"])  # the partition key is the version's 12-character prefix
    tasks = cat.load_split(version, config.split)
    built = upstream(context, "environment_images", required=False).get("image_set")  # none yet: built here
    images = ImageSet.from_json(built) if built else None
    result = rollout.tracked(settings, to_library(config, RolloutConfig), tasks, policy.spec_for(keys["policy"]),
                             task_set_version=version, images=images, context=stage_context(context))
    m = result.batch.metrics
    return dg.MaterializeResult(metadata={
        "batch_id": result.batch.store.batch_id, "location": result.location(), "task_set_version": version,
        "trajectories": int(m["trajectories"]), "pass_at_1": m["pass_at_1"],
        "dropped_groups": dg.MetadataValue.json([g.to_json() for g in result.batch.report.dropped_groups]),
        "infra_retries": int(m["infra_retries"]), "steps_per_s": m["steps_per_s"],
        "pool_hit_rate": m["pool_hit_rate"], "metrics": dg.MetadataValue.json(m),
        "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
    })
