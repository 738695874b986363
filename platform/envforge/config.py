"""Settings shared by the CLI, the Dagster resources and Python callers.

One typed object read from environment variables with embedded defaults, so that a fresh
checkout works with no configuration and production overrides are plain env vars.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

# The repository root when envforge runs from a checkout (platform/envforge/config.py).
_CHECKOUT_ROOT = Path(__file__).resolve().parents[2]


def checkout_root() -> Path:
    """The repository checkout envforge runs from (or the working directory for an installed package)."""
    return _CHECKOUT_ROOT if (_CHECKOUT_ROOT / "sandboxes").is_dir() else Path.cwd()


@dataclass(frozen=True)
class Settings:
    """Where envforge keeps its data and which services it talks to."""

    data_dir: Path = field(metadata={"env": "ENVFORGE_DATA_DIR", "help": "catalog, MLflow store, build scratch"})
    mlflow_tracking_uri: str = field(metadata={"env": "MLFLOW_TRACKING_URI", "help": "default: SQLite in data_dir"})
    sandboxes_dir: Path = field(metadata={"env": "ENVFORGE_SANDBOXES_DIR", "help": "base image recipe and families"})
    task_sources_dir: Path = field(metadata={"env": "ENVFORGE_TASK_SOURCES", "help": "bundled/user task sources"})
    docker_host: str | None = field(default=None, metadata={"env": "DOCKER_HOST", "help": "default: local socket"})
    mlflow_experiment: str = field(default="envforge", metadata={"env": "ENVFORGE_MLFLOW_EXPERIMENT", "help": ""})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        root = checkout_root()
        data_dir = Path(env.get("ENVFORGE_DATA_DIR") or root / ".envforge").resolve()
        return cls(
            data_dir=data_dir,
            mlflow_tracking_uri=env.get("MLFLOW_TRACKING_URI") or f"sqlite:///{data_dir / 'mlflow.db'}",
            sandboxes_dir=Path(env.get("ENVFORGE_SANDBOXES_DIR") or root / "sandboxes").resolve(),
            task_sources_dir=Path(env.get("ENVFORGE_TASK_SOURCES") or root / "task_sources").resolve(),
            docker_host=env.get("DOCKER_HOST") or None,
            mlflow_experiment=env.get("ENVFORGE_MLFLOW_EXPERIMENT") or "envforge",
        )

    def with_data_dir(self, data_dir: Path) -> "Settings":
        """A copy pointing every data-dir-derived default at another directory (tests use it)."""
        data_dir = data_dir.resolve()
        uri = self.mlflow_tracking_uri
        if uri == f"sqlite:///{self.data_dir / 'mlflow.db'}":
            uri = f"sqlite:///{data_dir / 'mlflow.db'}"
        return replace(self, data_dir=data_dir, mlflow_tracking_uri=uri)

    @property
    def catalog_path(self) -> Path:
        return self.data_dir / "catalog.duckdb"

    @property
    def mlflow_artifacts_dir(self) -> Path:
        return self.data_dir / "mlartifacts"

    @property
    def build_dir(self) -> Path:
        return self.data_dir / "build"

    @property
    def reference_index_dir(self) -> Path:
        """The persisted LSH index over the reference corpora (updated incrementally)."""
        return self.data_dir / "dedup" / "reference-index"

    @property
    def charts_dir(self) -> Path:
        return self.data_dir / "charts"

    def checkpoint_dir(self, kind: str, task_set_version: str) -> Path:
        """Where the pipeline keeps a task set's `sft` or `rl` checkpoint."""
        return self.data_dir / "checkpoints" / f"{kind}-{task_set_version[:12]}"

    @property
    def specs_dir(self) -> Path:
        return self.task_sources_dir / "specs"

    @property
    def runbooks_dir(self) -> Path:
        return self.task_sources_dir / "runbooks"

    def bundled_sources(self) -> list[Path]:
        """The source folders the main job ingests and the sensor watches: every folder under the
        task-sources directory except `examples/` (fixtures for tests, e.g. a deliberately flaky task)."""
        if not self.task_sources_dir.is_dir():
            return []
        return sorted(p for p in self.task_sources_dir.iterdir() if p.is_dir() and p.name != "examples"
                      and not p.name.startswith("."))

    def source_path(self, key: str) -> Path:
        """The file a source key (a Dagster partition key) names: relative to the task-sources directory."""
        path = Path(key)
        return path if path.is_absolute() else self.task_sources_dir / path

    def ensure_dirs(self) -> None:
        for d in (self.data_dir, self.build_dir, self.mlflow_artifacts_dir):
            d.mkdir(parents=True, exist_ok=True)
