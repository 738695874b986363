"""Checks on solution runs: schema-valid rows, and every task's verifier proven by its solutions."""

import dagster as dg

from assets.defs.resources import CatalogResource
from assets.defs.verification.assets import solution_runs
from envforge.catalog import Catalog


@dg.asset_check(asset=solution_runs, blocking=True,
                description="Run rows satisfy the pandera RunRow schema; for every current task the latest "
                            "reference run resolves and the latest empty run does not.")
def solutions_prove_verifiers(catalog: CatalogResource) -> dg.AssetCheckResult:
    cat = catalog.catalog()
    problems = Catalog.validate("runs", cat.runs())
    latest = cat.query("""
        SELECT t.task_id, r.solution, arg_max(r.resolved, r.created_at) AS resolved
        FROM current_tasks t JOIN runs r USING (content_hash) GROUP BY ALL""")
    status = {(r["task_id"], r["solution"]): r["resolved"] for r in latest.iter_rows(named=True)}
    bad = sorted(tid for tid in cat.tasks()["task_id"]
                 if status.get((tid, "reference")) is not True or status.get((tid, "empty")) is not False)
    return dg.AssetCheckResult(passed=not problems and not bad,
                               metadata={"schema_problems": dg.MetadataValue.json([str(p) for p in problems]),
                                         "unproven_tasks": dg.MetadataValue.json(bad)})
