"""Known-solution runs: each task's reference and empty solution graded in fresh sandboxes."""

import dagster as dg

from assets.defs.metadata import mlflow_run, png, problems_table
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from envforge import stages


@dg.asset(
    group_name="verification", kinds={"docker", "duckdb"}, owners=["team:envforge"], deps=["environment_images"],
    description="Runs every current task's reference solution and the empty solution in fresh sandboxes; "
                "a task is verified when the reference resolves and the empty solution does not.",
    op_tags={"envforge/sandbox-heavy": "true"},
)
def solution_runs(context: dg.AssetExecutionContext, catalog: CatalogResource, docker: DockerResource,
                  mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    cat = catalog.catalog()
    tasks = cat.load_tasks()

    def progress(stage: str, detail: str, done: int, total: int) -> None:
        context.log.info(f"[{stage}] {done}/{total} {detail}")

    report, run_id, chart = stages.verify_solutions(settings, tasks, cat.latest_images(),
                                                    dagster_run_id=context.run.run_id, progress=progress)
    verified = report.verified_tasks()
    return dg.MaterializeResult(metadata={
        "tasks": len(tasks), "verified": len(verified),
        "not_verified": dg.MetadataValue.json(sorted({t.id for t in tasks} - {t.id for t in verified})),
        "results": dg.MetadataValue.json(report.rows()), "infra_failures": problems_table(report.infra_failures),
        "chart": png(chart), "mlflow_run": mlflow_run(run_id),
    })
