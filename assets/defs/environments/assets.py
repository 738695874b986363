"""Environment images: the sandbox base image and one content-hash-tagged image per task."""

import dagster as dg

from assets.defs.metadata import log_progress, mlflow_run, problems_table
from assets.defs.resources import SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, settings_from
from envforge import stages


@dg.asset(
    group_name="environments", kinds={"docker"}, owners=["team:envforge"], deps=["decontaminated_tasks"],
    pool=SANDBOX_POOL,  # image builds (debootstrap, docker build) load the same engine sandboxes run on
    description="The debootstrapped sandbox base image and each clean task's image (base + workspace + "
                "setup + initial commit). Tags are content hashes: unchanged tasks are cache hits.",
)
def environment_images(context: dg.AssetExecutionContext, catalog: CatalogResource, docker: DockerResource,
                       mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    tasks = catalog.catalog().clean_tasks()

    progress = log_progress(context)

    report, run_id = stages.build_images(settings, tasks, dagster_run_id=context.run.run_id, progress=progress)
    if report.failures:
        context.log.error(f"{len(report.failures)} image(s) failed to build")
    return dg.MaterializeResult(metadata={
        "base_image": report.base.tag, "base_cache_hit": report.base.cache_hit,
        "images": dg.MetadataValue.json({t.id: b.tag for t, b in report.builds}),
        "built": sum(not b.cache_hit for _, b in report.builds), "cache_hits": report.cache_hits,
        "failures": problems_table(report.failures), "mlflow_run": mlflow_run(settings, run_id),
    })
