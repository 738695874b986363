"""The flakiness gate: each task's verifier proven by repeated runs and hack probes."""

import os

import dagster as dg
from pydantic import Field

from assets.defs.metadata import log_progress, mlflow_run, png, problems_table
from assets.defs.resources import SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, settings_from
from envforge import stages
from envforge.verify.gate import GateConfig


class GateRunConfig(dg.Config):
    runs: int = Field(int(os.environ.get("ENVFORGE_GATE_RUNS", "5")),
                      description="gradings of the empty and of the reference solution, each")
    shuffle: bool = Field(True, description="the order check: the reference once more, whole suite, reversed")
    probes: bool = Field(True, description="the reward-hacking probes that apply to each task")
    full_suite: bool = Field(False, description="the exhaustive gate: whole suite every grading, no early stop")
    workers: int = Field(2, ge=1, description="gradings of one task in parallel")
    force: bool = Field(False, description="re-gate tasks whose content, image and gate parameters are unchanged")


@dg.asset(
    group_name="verification", kinds={"docker", "duckdb"}, owners=["team:envforge"], deps=["environment_images"],
    description="Every current task through the flakiness gate: empty and reference solutions graded N times on "
                "pristine copies (the test files that decide the verdict), the whole suite once in reversed order, "
                "and every reward-hacking probe that applies. Tasks that disagree are quarantined with the exact "
                "disagreement; unchanged tasks (content, image, gate parameters) keep their verdict.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def validated_tasks(context: dg.AssetExecutionContext, config: GateRunConfig, catalog: CatalogResource,
                    docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    cat = catalog.catalog()
    tasks = cat.clean_tasks()

    progress = log_progress(context)

    report, run_id, chart = stages.validate(settings, tasks, cat.latest_images(),
                                            GateConfig(config.runs, config.shuffle, config.probes, config.full_suite,
                                                       config.workers),
                                            dagster_run_id=context.run.run_id, progress=progress, force=config.force)
    rows = report.rows()
    quarantined = [r for r in rows if r["verdict"] != "accepted"]
    return dg.MaterializeResult(metadata={
        "tasks": len(tasks), "accepted": len(rows) - len(quarantined), "quarantined": len(quarantined),
        "quarantine_rate": len(quarantined) / max(1, len(rows)), "kept": len(report.kept),
        "flake_report": dg.MetadataValue.json(rows), "infra_failures": problems_table(report.infra_failures),
        "chart": png(chart), "mlflow_run": mlflow_run(settings, run_id),
    })
