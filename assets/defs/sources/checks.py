"""Checks on the stored specs: the catalog rows must satisfy their pandera schema."""

import dagster as dg

from assets.defs.resources import CatalogResource
from assets.defs.sources.assets import task_specs
from envforge.catalog import Catalog


@dg.asset_check(asset=task_specs, blocking=True,
                description="Every current task row satisfies the pandera TaskRow schema and ids are unique.")
def task_specs_schema(catalog: CatalogResource) -> dg.AssetCheckResult:
    frame = catalog.catalog().tasks()
    problems = Catalog.validate("tasks", frame)
    dupes = frame.height - frame["task_id"].n_unique() if frame.height else 0
    return dg.AssetCheckResult(
        passed=not problems and dupes == 0 and frame.height > 0,
        metadata={"rows": frame.height, "schema_problems": dg.MetadataValue.json([str(p) for p in problems]),
                  "duplicate_ids": dupes},
    )
