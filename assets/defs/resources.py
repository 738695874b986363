"""Resources, chosen in one place by environment and configured from environment variables.

`ENVFORGE_ENV` picks the environment (`local`, the default, or `production`); the typed choice and
its validation live in the library (`envforge.deployment.Deployment`, on top of
`envforge.config.Settings.from_env()`), read when the code location loads. A fresh checkout works
with no configuration (DuckDB and SQLite MLflow under the data dir, the local Docker socket, the
`replay` policy); production requires MLFLOW_TRACKING_URI (http(s)), DOCKER_HOST (tcp:// or ssh://)
and ENVFORGE_POLICY_URL (a vLLM OpenAI-compatible server), and a missing or malformed one fails the
load with a message naming it. docs/deploy.md has the table.

Sandbox-heavy assets share the concurrency pool SANDBOX_POOL; its limit is instance config
(platform/deploy/dagster.yaml locally, platform/deploy/production/dagster.yaml in production).
"""

from dataclasses import replace
from pathlib import Path
from typing import Optional

import dagster as dg
import docker

from assets.defs.config import TrainingResource
from envforge.catalog import Catalog
from envforge.config import CATALOG_FILE, Settings
from envforge.deployment import Deployment
from envforge.sandbox.engine import docker_client


class CatalogResource(dg.ConfigurableResource):
    """The DuckDB catalog and the data directory it lives in."""

    data_dir: str

    def catalog(self) -> Catalog:
        return Catalog(Path(self.data_dir) / CATALOG_FILE)


class DockerResource(dg.ConfigurableResource):
    """The Docker engine sandboxes and images live on (None: the local socket)."""

    docker_host: Optional[str] = None

    def client(self) -> docker.DockerClient:
        return docker_client(replace(Settings.from_env(), docker_host=self.docker_host))


class MlflowResource(dg.ConfigurableResource):
    tracking_uri: str
    experiment: str = "envforge"


class PolicyResource(dg.ConfigurableResource):
    """Which policy the rollout and tier assets use unless their run config names one.

    `default` is the rollout_policies partition tiered_task_set registers (with the other names in
    `specs`); `specs` maps short, Dagster-safe partition keys to policy specs (`vllm` ->
    `openai:http://vllm:8000/v1#envforge`), and any other key is itself a spec (`replay`, ...).
    `tier_policy` is tiered_task_set's pass@k reference policy ("" = static features).
    """

    default: str = "replay"
    specs: dict[str, str] = {}
    tier_policy: str = ""

    def partition_keys(self) -> list[str]:
        return list(dict.fromkeys([self.default, *self.specs]))

    def spec_for(self, key: str) -> str:
        return self.specs.get(key, key)


# The pool every sandbox-heavy step claims a slot in (`pool=` on the asset); the limit is instance config.
SANDBOX_POOL = "envforge-sandbox"


def settings_from(catalog: CatalogResource, docker_res: DockerResource, mlflow: MlflowResource) -> Settings:
    """The library's Settings as configured by the resources."""
    base = Settings.from_env().with_data_dir(Path(catalog.data_dir))
    return replace(base, mlflow_tracking_uri=mlflow.tracking_uri, mlflow_experiment=mlflow.experiment,
                   docker_host=docker_res.docker_host)


def default_resources(settings: Optional[Settings] = None,
                      deployment: Optional[Deployment] = None) -> dict[str, dg.ConfigurableResource]:
    """The resources for the environment ENVFORGE_ENV names (`settings` overrides its Settings; tests use it)."""
    deployment = deployment or Deployment.from_env()
    settings = settings or deployment.settings
    return {
        "catalog": CatalogResource(data_dir=str(settings.data_dir)),
        "docker": DockerResource(docker_host=settings.docker_host),
        "mlflow": MlflowResource(tracking_uri=settings.mlflow_tracking_uri, experiment=settings.mlflow_experiment),
        "policy": PolicyResource(default=deployment.default_policy.name, specs=deployment.policy_specs,
                                 tier_policy=deployment.tier_policy or ""),
        "training": TrainingResource(),
    }
