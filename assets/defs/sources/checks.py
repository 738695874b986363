"""Checks on ingestion: reject rates per source kind (warn), a schema-valid candidate set (blocking), and
task statements that neither leak the fix nor say too little (warn)."""

import dagster as dg
import polars as pl

from assets.defs.resources import CatalogResource
from assets.defs.sources.assets import candidate_tasks, source_assets
from envforge.catalog import Catalog
from envforge.quality.statement_policy import statement_verdicts
from envforge.settings import read_env

# Bundled examples carry deliberately bad records (about a quarter to two fifths per kind).
MAX_REJECT_RATE = read_env().max_reject_rate


def _reject_rate_check(asset: dg.AssetsDefinition) -> dg.AssetChecksDefinition:
    kind = asset.key.to_user_string().removesuffix("_tasks")

    @dg.asset_check(asset=asset, name="reject_rate",
                    description=f"Share of {kind} records rejected across the latest load of every {kind} source; "
                                f"warns above ENVFORGE_MAX_REJECT_RATE ({MAX_REJECT_RATE:.0%}).")
    def _check(catalog: CatalogResource) -> dg.AssetCheckResult:
        loads = catalog.catalog().source_loads().filter(pl.col("source_kind") == kind)
        tasks, rejects = int(loads["n_tasks"].sum() or 0), int(loads["n_rejects"].sum() or 0)
        rate = rejects / (tasks + rejects) if tasks + rejects else 0.0
        return dg.AssetCheckResult(
            passed=rate <= MAX_REJECT_RATE, severity=dg.AssetCheckSeverity.WARN,
            metadata={"reject_rate": round(rate, 4), "threshold": MAX_REJECT_RATE, "tasks": tasks,
                      "rejects": rejects, "sources": loads.height,
                      "worst_sources": dg.MetadataValue.json(
                          loads.sort("n_rejects", descending=True).head(5)
                          .select("source_key", "n_tasks", "n_rejects").to_dicts())})

    return _check


reject_rate_checks = [_reject_rate_check(a) for a in source_assets]


@dg.asset_check(asset=candidate_tasks, blocking=True,
                description="Every current task row satisfies the pandera TaskRow schema and ids are unique.")
def candidate_tasks_schema(catalog: CatalogResource) -> dg.AssetCheckResult:
    frame = catalog.catalog().tasks()
    problems = Catalog.validate("tasks", frame)
    dupes = frame.height - frame["task_id"].n_unique() if frame.height else 0
    return dg.AssetCheckResult(
        passed=not problems and dupes == 0 and frame.height > 0,
        metadata={"rows": frame.height, "schema_problems": dg.MetadataValue.json([str(p) for p in problems]),
                  "duplicate_ids": dupes},
    )


@dg.asset_check(asset=candidate_tasks, name="statements",
                description="Every current task's statement was checked at ingest (leaks of the fix or the hidden "
                            "tests, too little to act on) and none is still flagged after its deterministic repair; "
                            "warns with the flagged tasks and their findings. Ingest's `statements` policy decides "
                            "whether flagged tasks are kept (flag) or kept out (strict).")
def candidate_statements(catalog: CatalogResource) -> dg.AssetCheckResult:
    verdicts = statement_verdicts(catalog.catalog().load_tasks())
    flagged = {task_id: v["findings"] for task_id, v in verdicts.items() if v["verdict"] == "flagged"}
    counts: dict[str, int] = {}
    for v in verdicts.values():
        counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
    return dg.AssetCheckResult(
        passed=not flagged, severity=dg.AssetCheckSeverity.WARN,
        metadata={"verdicts": dg.MetadataValue.json(counts), "flagged": len(flagged),
                  "flagged_tasks": dg.MetadataValue.json(dict(list(flagged.items())[:20]))})
