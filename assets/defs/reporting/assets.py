"""The run report: one self-contained HTML page per pipeline run, written to the data directory and MLflow."""

import dagster as dg

from assets.defs.metadata import mlflow_run
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from envforge.report import build_run_report


@dg.asset(
    group_name="reporting", kinds={"html", "mlflow"}, owners=["team:envforge"], deps=["evaluation_report", "rollout_batch"],
    description="A static HTML report of the newest task set: its card (sources, tiers, splits), the gates "
                "(ingest rejects, decontamination, images, flakiness gate), its rollout batches, and training "
                "(SFT loss, GRPO reward per round, pass@1 before / after SFT / after RL per tier and source), with "
                "the PNG charts inlined. Written to <data dir>/reports (and reports/latest.html) and logged to "
                "MLflow; stages that have not run are shown as 'not run yet'.",
)
def run_report(context: dg.AssetExecutionContext, catalog: CatalogResource, docker: DockerResource,
               mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    report = build_run_report(settings, "latest", dagster_run_id=context.run.run_id)
    not_run = sorted(k for k, ran in report.sections.items() if not ran)
    if not_run:
        context.log.info(f"sections not run yet: {', '.join(not_run)}")
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(report.path)), "latest": dg.MetadataValue.path(str(report.latest)),
        "task_set_version": report.task_set_version or "", "sections": dg.MetadataValue.json(report.sections),
        **report.counts, "mlflow_run": mlflow_run(settings, report.mlflow_run_id),
    })
