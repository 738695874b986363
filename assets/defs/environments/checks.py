"""Checks on the images: recorded rows satisfy their schema and every image of the run's set exists."""

import dagster as dg

from assets.defs.environments.assets import environment_images
from assets.defs.metadata import upstream
from assets.defs.resources import CatalogResource, DockerResource
from envforge.catalog import Catalog
from envforge.sandbox.images import image_exists
from envforge.stages.images import ImageSet


@dg.asset_check(asset=environment_images, blocking=True,
                description="Image rows satisfy the pandera ImageRow schema; every clean task version of the run has "
                            "an image in the recorded image set, and that image exists in the Docker engine.")
def environment_images_complete(context: dg.AssetCheckExecutionContext, catalog: CatalogResource,
                                docker: DockerResource) -> dg.AssetCheckResult:
    cat = catalog.catalog()
    problems = Catalog.validate("images", cat.query("SELECT * FROM images"))
    images = ImageSet.from_json(upstream(context, "environment_images")["image_set"])
    tasks = cat.load_versions(upstream(context, "decontaminated_tasks")["clean_versions"])
    client = docker.client()
    missing = [t.id for t in images.missing(tasks)] + [t.id for t, tag in images.items(tasks)
                                                        if not image_exists(client, tag)]
    return dg.AssetCheckResult(
        passed=not problems and not missing,
        metadata={"schema_problems": dg.MetadataValue.json([str(p) for p in problems]),
                  "tasks_without_image": dg.MetadataValue.json(missing)},
    )
