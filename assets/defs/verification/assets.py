"""The flakiness gate: each task's verifier proven by repeated runs and hack probes."""

import dagster as dg

from assets.defs.config import run_config, to_library
from assets.defs.metadata import mlflow_run, png, problems_table, stage_context, upstream
from assets.defs.resources import SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, settings_from
from envforge.stages.gate import gate
from envforge.stages.images import ImageSet
from envforge.verify.config import GateConfig

GateRunConfig = run_config(GateConfig, "GateRunConfig")


@dg.asset(
    group_name="verification", kinds={"docker", "duckdb"}, owners=["team:envforge"], deps=["environment_images"],
    description="Every clean task version through the flakiness gate, in the run's images: empty and reference "
                "solutions graded N times on pristine copies (the test files that decide the verdict), the whole "
                "suite once in reversed order, and every reward-hacking probe that applies (and, by default, the "
                "verifier's strength against mutants of the reference). Tasks that disagree are "
                "quarantined with the exact disagreement; unchanged tasks (content, image digest, gate parameters) "
                "keep their verdict.",
    op_tags={"envforge/sandbox-heavy": "true"}, pool=SANDBOX_POOL,
)
def validated_tasks(context: dg.AssetExecutionContext, config: GateRunConfig, catalog: CatalogResource,
                    docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    tasks = catalog.catalog().load_versions(upstream(context, "decontaminated_tasks")["clean_versions"])
    images = ImageSet.from_json(upstream(context, "environment_images")["image_set"])
    gate_config = to_library(config, GateConfig)
    result = gate.tracked(settings, gate_config, tasks, images, context=stage_context(context))
    rows = result.rows()
    quarantined = [r for r in rows if r["verdict"] != "accepted"]
    strength = {"strength_chart": png(result.strength_chart),
                "strength_median": result.metrics()["strength_median"]} if result.strength_chart else {}
    return dg.MaterializeResult(metadata={**strength,
        "tasks": len(tasks), "accepted": len(rows) - len(quarantined), "quarantined": len(quarantined),
        "quarantine_rate": len(quarantined) / max(1, len(rows)), "kept": len(result.kept),
        "flake_report": dg.MetadataValue.json(rows), "infra_failures": problems_table(result.infra_failures),
        "chart": png(result.chart), "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
        # what the task set is made of: the accepted versions, and for its lineage what the gate kept out and why
        "accepted_versions": dg.MetadataValue.json(result.accepted_hashes()),
        "removed": dg.MetadataValue.json(result.removed()), "params": dg.MetadataValue.json(gate_config.as_params()),
    })
