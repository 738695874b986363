"""Task sources: hand-written YAML specs into the catalog."""

import dagster as dg

from assets.defs.metadata import mlflow_run, problems_table
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from envforge import stages


@dg.asset(
    group_name="sources", kinds={"python", "duckdb"}, owners=["team:envforge"],
    description="Hand-written task specs (task_sources/specs/**/task.yaml) and runbooks (task_sources/runbooks/"
                "*.md) parsed, validated and stored in the catalog; bad records are kept as rejects with the "
                "file, field and reason.",
)
def task_specs(context: dg.AssetExecutionContext, catalog: CatalogResource, docker: DockerResource,
               mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    tracked = stages.ingest(settings, settings.bundled_sources(), dagster_run_id=context.run.run_id)
    res, summ = tracked.result, tracked.summary
    context.log.info(f"{len(res.tasks)} valid spec(s), {len(res.rejects)} rejected, {summ.added} new")
    return dg.MaterializeResult(metadata={
        "valid": len(res.tasks), "rejected": len(res.rejects), "added": summ.added, "unchanged": summ.unchanged,
        "batch_id": summ.batch_id, "tasks": dg.MetadataValue.json(sorted(t.id for t in res.tasks)),
        "rejects": problems_table(res.rejects), "mlflow_run": mlflow_run(tracked.mlflow_run_id),
    })
