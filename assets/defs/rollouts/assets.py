"""Rollouts: the tiered task set, and rollout batches per (task-set version, policy)."""

import dagster as dg
import polars as pl

from assets.defs.metadata import log_progress, mlflow_run, png
from assets.defs.resources import (SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, PolicyResource,
                                   settings_from)
from envforge import stages

TASK_SET_VERSIONS = dg.DynamicPartitionsDefinition(name="task_set_versions")
POLICIES = dg.DynamicPartitionsDefinition(name="rollout_policies")
ROLLOUT_PARTITIONS = dg.MultiPartitionsDefinition({"task_set": TASK_SET_VERSIONS, "policy": POLICIES})


class TierConfig(dg.Config):
    """`policy`: the reference policy for pass@k (e.g. openai:http://host:8000/v1); empty: the environment's
    default (the `policy` resource's tier_policy: the served vLLM policy in production, static features locally)."""

    policy: str = ""
    k: int = 8
    eval_fraction: float = 0.2
    seed: int = 0


@dg.asset(
    group_name="rollouts", kinds={"duckdb", "python"}, owners=["team:envforge"], deps=["validated_tasks"],
    pool=SANDBOX_POOL,  # pass@k tiering rolls the reference policy out in sandboxes (production's default)
    description="The accepted tasks as a versioned task set, each with a difficulty tier (pass@k of a reference "
                "policy over k samples, or static features when no policy is configured) and a train/eval split "
                "stratified by tier and source; unsolved tasks go to an audit split. Registers the version as a "
                "partition of rollout_batch.",
)
def tiered_task_set(context: dg.AssetExecutionContext, config: TierConfig, catalog: CatalogResource,
                    docker: DockerResource, mlflow: MlflowResource, policy: PolicyResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    cat = catalog.catalog()
    tasks = cat.accepted_tasks()
    if not tasks:
        raise dg.Failure("no accepted tasks: materialize validated_tasks first")
    previous = cat.task_sets()
    version, _ = stages.publish_task_set(settings, "main", tasks, {"source": "dagster"}, context.run.run_id)
    changed = version not in set(previous["version"])
    context.log.info(f"task set {version[:12]}: {'new version' if changed else 'unchanged, same version'}")
    rows, chart, run_id = stages.tier_task_set(settings, version, config.policy or policy.tier_policy or None,
                                               config.k, config.eval_fraction, config.seed,
                                               dagster_run_id=context.run.run_id)
    key = version[:12]
    context.instance.add_dynamic_partitions(TASK_SET_VERSIONS.name, [key])
    known = set(context.instance.get_dynamic_partitions(POLICIES.name))
    context.instance.add_dynamic_partitions(POLICIES.name, [p for p in policy.partition_keys() if p not in known])
    counts = {t: sum(1 for r in rows if r["tier"] == t) for t in ("unsolved", "hard", "medium", "easy", "trivial")}
    splits = {s: sum(1 for r in rows if r["split"] == s) for s in ("train", "eval", "audit")}
    return dg.MaterializeResult(metadata={
        "version": version, "new_version": changed, "partition_key": key, "tasks": len(rows), "method": rows[0]["method"] if rows else "",
        "tiers": dg.MetadataValue.json(counts), "splits": dg.MetadataValue.json(splits),
        "histogram": png(chart), "mlflow_run": mlflow_run(settings, run_id),
    })


class RolloutRunConfig(dg.Config):
    samples: int = 4
    concurrency: int = 8
    seed: int = 0
    temperature: float = 1.0
    max_tokens: int = 512
    max_infra_retries: int = 3
    split: str = "all"  # train | eval | audit | all


@dg.asset(
    group_name="rollouts", kinds={"docker", "parquet"}, owners=["team:envforge"], deps=[tiered_task_set],
    partitions_def=ROLLOUT_PARTITIONS, op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
    description="n samples per task of one task-set version with one policy: every trajectory graded on a pristine "
                "copy and stored as parquet (complete groups only; infra faults retried, exhausted groups dropped "
                "and recorded). Resumes where a killed run stopped.",
)
def rollout_batch(context: dg.AssetExecutionContext, config: RolloutRunConfig, catalog: CatalogResource,
                  docker: DockerResource, mlflow: MlflowResource, policy: PolicyResource) -> dg.MaterializeResult:
    from envforge.rollout.scheduler import RolloutConfig

    settings = settings_from(catalog, docker, mlflow)
    keys = context.partition_key.keys_by_dimension
    cat = catalog.catalog()
    version = cat.resolve_task_set(keys["task_set"])
    tasks = cat.load_task_set(version)
    if config.split != "all":
        wanted = set(cat.tiers(version).filter(pl.col("split") == config.split)["task_id"])
        tasks = [t for t in tasks if t.id in wanted]

    progress = log_progress(context)

    rc = RolloutConfig(n_samples=config.samples, concurrency=config.concurrency, seed=config.seed,
                       temperature=config.temperature, max_tokens=config.max_tokens,
                       max_infra_retries=config.max_infra_retries)
    result = stages.rollout(settings, tasks, policy.spec_for(keys["policy"]), rc, task_set_version=version,
                            dagster_run_id=context.run.run_id, progress=progress)
    m = result.metrics
    return dg.MaterializeResult(metadata={
        "batch_id": result.store.batch_id, "location": f"{result.store.root}/{result.store.batch_id}",
        "trajectories": int(m["trajectories"]), "pass_at_1": m["pass_at_1"],
        "dropped_groups": dg.MetadataValue.json([g.to_json() for g in result.report.dropped_groups]),
        "infra_retries": int(m["infra_retries"]), "steps_per_s": m["steps_per_s"],
        "pool_hit_rate": m["pool_hit_rate"], "metrics": dg.MetadataValue.json(m),
        "mlflow_run": mlflow_run(settings, result.mlflow_run_id or ""),
    })

