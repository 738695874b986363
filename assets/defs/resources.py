"""Resources, chosen in one place and configured from environment variables with defaults.

The defaults come from `envforge.config.Settings.from_env()`, read when the code location
loads: a fresh checkout works with no configuration, and production overrides are env vars
(ENVFORGE_DATA_DIR, MLFLOW_TRACKING_URI, DOCKER_HOST, ...).
"""

from dataclasses import replace
from pathlib import Path
from typing import Optional

import dagster as dg
import docker

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.sandbox.engine import docker_client


class CatalogResource(dg.ConfigurableResource):
    """The DuckDB catalog and the data directory it lives in."""

    data_dir: str

    def catalog(self) -> Catalog:
        return Catalog(Path(self.data_dir) / "catalog.duckdb")


class DockerResource(dg.ConfigurableResource):
    """The Docker engine sandboxes and images live on (None: the local socket)."""

    docker_host: Optional[str] = None

    def client(self) -> docker.DockerClient:
        return docker_client(replace(Settings.from_env(), docker_host=self.docker_host))


class MlflowResource(dg.ConfigurableResource):
    tracking_uri: str
    experiment: str = "envforge"


def settings_from(catalog: CatalogResource, docker_res: DockerResource, mlflow: MlflowResource) -> Settings:
    """The library's Settings as configured by the resources."""
    base = Settings.from_env().with_data_dir(Path(catalog.data_dir))
    return replace(base, mlflow_tracking_uri=mlflow.tracking_uri, mlflow_experiment=mlflow.experiment,
                   docker_host=docker_res.docker_host)


def default_resources(settings: Optional[Settings] = None) -> dict[str, dg.ConfigurableResource]:
    settings = settings or Settings.from_env()
    return {
        "catalog": CatalogResource(data_dir=str(settings.data_dir)),
        "docker": DockerResource(docker_host=settings.docker_host),
        "mlflow": MlflowResource(tracking_uri=settings.mlflow_tracking_uri, experiment=settings.mlflow_experiment),
    }
