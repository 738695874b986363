"""Environment images: the sandbox base image and one content-hash-tagged image per task, once per run."""

import dagster as dg

from assets.defs.config import run_config, to_library
from assets.defs.metadata import mlflow_run, problems_table, stage_context, upstream
from assets.defs.resources import SANDBOX_POOL, CatalogResource, DockerResource, MlflowResource, settings_from
from envforge.stages.configs import ImagesConfig
from envforge.stages.images import build_images

ImagesRunConfig = run_config(ImagesConfig, "ImagesRunConfig")


@dg.asset(
    group_name="environments", kinds={"docker"}, owners=["team:envforge"], deps=["decontaminated_tasks"],
    pool=SANDBOX_POOL,  # image builds (debootstrap, docker build) load the same engine sandboxes run on
    description="The debootstrapped sandbox base image and an image for each clean task version (base + the "
                "repository's env layer, if any + workspace + setup + initial commit). Tags are content hashes: "
                "unchanged tasks are cache hits. The image set (tags and digests) is recorded here; the assets after it "
                "run tasks in exactly these images.",
)
def environment_images(context: dg.AssetExecutionContext, config: ImagesRunConfig, catalog: CatalogResource,
                       docker: DockerResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    settings = settings_from(catalog, docker, mlflow)
    tasks = catalog.catalog().load_versions(upstream(context, "decontaminated_tasks")["clean_versions"])
    result = build_images.tracked(settings, to_library(config, ImagesConfig), tasks, context=stage_context(context))
    if result.failures:
        context.log.error(f"{len(result.failures)} image(s) failed to build")
    return dg.MaterializeResult(metadata={
        "base_image": result.base.tag, "base_cache_hit": result.base.cache_hit,
        "images": dg.MetadataValue.json({t.id: b.tag for t, b in result.builds}),
        "built": sum(not b.cache_hit for _, b in result.builds), "cache_hits": result.cache_hits,
        "env_layers": dg.MetadataValue.json(result.env_layers()),
        "failures": problems_table(result.failures), "mlflow_run": mlflow_run(settings, result.mlflow_run_id),
        "image_set": dg.MetadataValue.json(result.image_set.to_json()),
    })
