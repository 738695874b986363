"""Checks on the images: recorded rows satisfy their schema and every current task has a live image."""

import dagster as dg

from assets.defs.environments.assets import environment_images
from assets.defs.resources import CatalogResource, DockerResource
from envforge.catalog import Catalog
from envforge.sandbox.images import image_exists


@dg.asset_check(asset=environment_images, blocking=True,
                description="Image rows satisfy the pandera ImageRow schema; every current task's latest "
                            "image exists in the Docker engine.")
def environment_images_complete(catalog: CatalogResource, docker: DockerResource) -> dg.AssetCheckResult:
    cat = catalog.catalog()
    rows = cat.query("SELECT * FROM images")
    problems = Catalog.validate("images", rows)
    latest = cat.latest_images()
    client = docker.client()
    missing = [t.id for t in cat.clean_tasks()
               if t.content_hash not in latest or not image_exists(client, latest[t.content_hash])]
    return dg.AssetCheckResult(
        passed=not problems and not missing,
        metadata={"schema_problems": dg.MetadataValue.json([str(p) for p in problems]),
                  "tasks_without_image": dg.MetadataValue.json(missing)},
    )
