"""Checks on the gate: schema-valid verdicts, and a quarantine rate below the threshold."""

import dagster as dg
import polars as pl

from assets.defs.metadata import upstream
from assets.defs.resources import CatalogResource
from assets.defs.verification.assets import validated_tasks
from envforge.catalog import Catalog
from envforge.settings import read_env

MAX_QUARANTINE_RATE = read_env().max_quarantine_rate


@dg.asset_check(asset=validated_tasks, blocking=True,
                description=f"Verdict rows satisfy the pandera ValidationRow schema; every clean task version of the "
                            f"run has a verdict; the quarantine rate is at most ENVFORGE_MAX_QUARANTINE_RATE "
                            f"({MAX_QUARANTINE_RATE:.0%}).")
def quarantine_rate(context: dg.AssetCheckExecutionContext, catalog: CatalogResource) -> dg.AssetCheckResult:
    cat = catalog.catalog()
    clean = upstream(context, "decontaminated_tasks")["clean_versions"]
    latest = cat.latest_validations().filter(pl.col("content_hash").is_in(clean))
    problems = Catalog.validate("validations", cat.query("SELECT * FROM validations"))
    missing = sorted({t.id for t in cat.load_versions(clean)} - set(latest["task_id"]))
    rate = (latest["verdict"] != "accepted").sum() / max(1, latest.height)
    return dg.AssetCheckResult(
        passed=not problems and not missing and rate <= MAX_QUARANTINE_RATE,
        metadata={"quarantine_rate": float(rate), "threshold": MAX_QUARANTINE_RATE,
                  "quarantined": dg.MetadataValue.json(
                      latest.filter(latest["verdict"] != "accepted").select("task_id", "disagreements").to_dicts()),
                  "tasks_without_verdict": dg.MetadataValue.json(missing),
                  "schema_problems": dg.MetadataValue.json([str(p) for p in problems])},
    )
