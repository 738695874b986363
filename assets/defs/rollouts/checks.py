"""Checks on the task set and its rollouts: complete tiers, a split without near-duplicate leaks, and
no batch whose infrastructure failed too often feeding training."""

import dagster as dg

from assets.defs.metadata import upstream
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from assets.defs.rollouts.assets import rollout_batch, tiered_task_set
from envforge.rollout.health import batch_verdict
from envforge.settings import read_env
from envforge.stages.tiers import split_leaks

MAX_DROPPED_GROUP_RATE = read_env().max_dropped_group_rate


@dg.asset_check(asset=rollout_batch, blocking=True,
                description=f"The share of groups dropped after exhausted infrastructure retries is at most "
                            f"ENVFORGE_MAX_DROPPED_GROUP_RATE ({MAX_DROPPED_GROUP_RATE:.0%}) in every registered "
                            f"batch, and every batch stored at least one trajectory.")
def rollout_infra_failure_rate(catalog: CatalogResource) -> dg.AssetCheckResult:
    frame = catalog.catalog().rollout_batches()
    rows = frame.to_dicts()
    rates = {r["batch_id"]: r["n_dropped_groups"] / max(1, r["n_tasks"]) for r in rows}
    bad = {b: rate for b, rate in rates.items() if rate > MAX_DROPPED_GROUP_RATE}
    empty = [r["batch_id"] for r in rows if r["n_trajectories"] == 0]
    return dg.AssetCheckResult(passed=bool(rows) and not bad and not empty, metadata={
        "batches": len(rows), "dropped_group_rates": dg.MetadataValue.json(rates), "over_threshold": dg.MetadataValue.json(bad),
        "empty_batches": dg.MetadataValue.json(empty), "threshold": MAX_DROPPED_GROUP_RATE})


@dg.asset_check(asset=rollout_batch,
                description="Infrastructure anomaly or policy regression? The batch this run materialized against the "
                            "batch registered before it on the same task-set version: fault, retry and drop rates and "
                            "sandbox latency versus reward and pass@1 on the cleanly-run tasks both share "
                            "(envforge.observe.health; thresholds ENVFORGE_HEALTH_*, docs/observability.md). Passes "
                            "when the verdict is healthy.")
def rollout_batch_health(context: dg.AssetCheckExecutionContext, catalog: CatalogResource) -> dg.AssetCheckResult:
    batch_id = upstream(context, "rollout_batch")["batch_id"]
    verdict = batch_verdict(catalog.catalog().rollout_batches().to_dicts(), batch_id)
    return dg.AssetCheckResult(passed=verdict.healthy, severity=dg.AssetCheckSeverity.WARN, metadata={
        "verdict": verdict.verdict, "baseline_batch_id": verdict.baseline_batch_id or "-",
        "findings": dg.MetadataValue.md("\n".join(f"- {f}" for f in verdict.infra_findings + verdict.policy_findings)
                                        or "no rule fired"),
        "figures": dg.MetadataValue.json(verdict.figures)})


@dg.asset_check(asset=tiered_task_set, description="Every task of the task set this asset produced has a tier and "
                                                   "a split, and the eval split is not empty when there are 5 or "
                                                   "more tasks.")
def tiers_complete(context: dg.AssetCheckExecutionContext, catalog: CatalogResource) -> dg.AssetCheckResult:
    cat = catalog.catalog()
    version = upstream(context, "tiered_task_set")["version"]
    tiers = cat.tiers(version)
    members = {t.id for t in cat.load_task_set(version)}
    missing = sorted(members - set(tiers["task_id"]))
    n_eval = int((tiers["split"] == "eval").sum())
    return dg.AssetCheckResult(passed=not missing and (n_eval > 0 or len(members) < 5), metadata={
        "version": version, "tasks": len(members), "missing": dg.MetadataValue.json(missing), "eval": n_eval})


@dg.asset_check(asset=tiered_task_set, blocking=True,
                description="The split training and evaluation use has no near-duplicate pair (by the task set's "
                            "dedup params) with one task in train and the other in eval.")
def splits_leak_free(context: dg.AssetCheckExecutionContext, catalog: CatalogResource, docker: DockerResource,
                     mlflow: MlflowResource) -> dg.AssetCheckResult:
    version = upstream(context, "tiered_task_set")["version"]
    pairs, leaks = split_leaks(settings_from(catalog, docker, mlflow), version)
    return dg.AssetCheckResult(passed=not leaks, metadata={
        "version": version, "pairs": len(pairs), "straddling_pairs": dg.MetadataValue.json([[p.a, p.b] for p in leaks])})
