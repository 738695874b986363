"""The run report: one self-contained HTML page per pipeline run, written to the data directory and MLflow."""

import dagster as dg

from assets.defs.metadata import mlflow_run, stage_context, upstream
from assets.defs.resources import CatalogResource, DockerResource, MlflowResource, settings_from
from envforge.stages.configs import ReportConfig
from envforge.stages.report import report


@dg.asset(
    group_name="reporting", kinds={"html", "mlflow"}, owners=["team:envforge"],
    deps=["tiered_task_set", "evaluation_report", "rollout_batch"],
    description="A static HTML report of the run's task set (or, on its own, of tiered_task_set's latest): its card "
                "(sources, lineage, tiers, splits), the gates (ingest rejects, decontamination, images, flakiness "
                "gate), its rollout batches, and training (SFT loss, GRPO reward per round, pass@1 before / after SFT "
                "/ after RL per tier and source), with the PNG charts inlined. Written to <data dir>/reports (and "
                "reports/latest.html) and logged to MLflow; stages that have not run are shown as 'not run yet'.",
)
def run_report(context: dg.AssetExecutionContext, catalog: CatalogResource, docker: DockerResource,
               mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    version = upstream(context, "tiered_task_set", required=False).get("version")
    result = report.tracked(settings, ReportConfig(), version, context=stage_context(context)).report
    not_run = sorted(k for k, ran in result.sections.items() if not ran)
    if not_run:
        context.log.info(f"sections not run yet: {', '.join(not_run)}")
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(result.path)), "latest": dg.MetadataValue.path(str(result.latest)),
        "task_set_version": result.task_set_version or "", "sections": dg.MetadataValue.json(result.sections),
        **result.counts, "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
    })
