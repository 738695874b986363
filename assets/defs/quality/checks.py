"""Checks on decontamination: nothing contaminated stays in the pipeline."""

import json

import dagster as dg

from assets.defs.quality.assets import decontaminated_tasks
from assets.defs.resources import CatalogResource
from envforge.catalog import Catalog


@dg.asset_check(asset=decontaminated_tasks, blocking=True,
                description="Quality rows satisfy the pandera QualityRow schema, and no task left in the pipeline "
                            "matches a reference corpus at or above its threshold.")
def no_contaminated_task_remains(catalog: CatalogResource) -> dg.AssetCheckResult:
    cat = catalog.catalog()
    latest = cat.latest_quality()
    problems = Catalog.validate("quality", cat.query("SELECT * FROM quality"))
    bad = []
    for r in latest.filter(latest["status"] == "clean").iter_rows(named=True):
        threshold = json.loads(r["params_json"])["dedup"]["threshold"]
        if r["exact_jaccard"] >= threshold:
            bad.append(r["task_id"])
    return dg.AssetCheckResult(passed=not problems and not bad,
                               metadata={"clean_tasks_above_threshold": dg.MetadataValue.json(bad),
                                         "schema_problems": dg.MetadataValue.json([str(p) for p in problems])})
