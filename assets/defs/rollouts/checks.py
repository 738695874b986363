"""Checks on rollouts: a batch whose infrastructure failed too often must not feed training."""

import os

import dagster as dg

from assets.defs.resources import CatalogResource
from assets.defs.rollouts.assets import rollout_batch, tiered_task_set

MAX_DROPPED_GROUP_RATE = float(os.environ.get("ENVFORGE_MAX_DROPPED_GROUP_RATE", "0.05"))


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


@dg.asset_check(asset=tiered_task_set, description="Every task of the newest task set has a tier and a split, and "
                                                   "the eval split is not empty when there are 5 or more tasks.")
def tiers_complete(catalog: CatalogResource) -> dg.AssetCheckResult:
    cat = catalog.catalog()
    version = cat.resolve_task_set("latest")
    tiers = cat.tiers(version)
    members = {t.id for t in cat.load_task_set(version)}
    missing = sorted(members - set(tiers["task_id"]))
    n_eval = int((tiers["split"] == "eval").sum())
    return dg.AssetCheckResult(passed=not missing and (n_eval > 0 or len(members) < 5), metadata={
        "version": version, "tasks": len(members), "missing": dg.MetadataValue.json(missing), "eval": n_eval})
