"""Settings shared by the CLI, the Dagster resources and Python callers.

One typed object built from environment variables (declared, with their defaults, in
envforge.settings; docs/configuration.md lists them), so that a fresh checkout works with no
configuration and production overrides are plain env vars.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping, TypeVar

from envforge.checkout import checkout_root  # noqa: F401  (callers import it from here)

C = TypeVar("C")

CATALOG_FILE = "catalog.duckdb"  # the catalog's file in a data directory (Settings.catalog_path)


def config_from_dict(cls: type[C], values: Mapping[str, Any]) -> C:
    """A (nested) config dataclass from plain values: what JSON, a CLI or a Dagster run config holds.
    Nested configs come as mappings, tuples as lists; keys the class does not know are left out (a
    config recorded by an older version still reads), fields without a value keep their defaults."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            continue
        value, tp = values[f.name], hints[f.name]
        nested = next((a for a in (tp, *typing.get_args(tp)) if is_dataclass(a)), None)
        if nested is not None and isinstance(value, Mapping):
            value = config_from_dict(nested, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


@dataclass(frozen=True)
class Settings:
    """Where envforge keeps its data and which services it talks to."""

    data_dir: Path
    mlflow_tracking_uri: str
    sandboxes_dir: Path
    task_sources_dir: Path
    docker_host: str | None = None
    mlflow_experiment: str = "envforge"
    store_url: str | None = None  # s3://bucket/prefix for rollouts, task-set parquet and reports

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """The settings `environ` (default: the process's) sets; envforge.settings declares each variable."""
        from envforge.settings import read_env

        env = read_env(environ)
        data_dir = env.data_dir.resolve()
        return cls(
            data_dir=data_dir,
            mlflow_tracking_uri=env.mlflow_tracking_uri or f"sqlite:///{data_dir / 'mlflow.db'}",
            sandboxes_dir=env.sandboxes_dir.resolve(),
            task_sources_dir=env.task_sources_dir.resolve(),
            docker_host=env.docker_host,
            mlflow_experiment=env.mlflow_experiment,
            store_url=(env.store_url or "").rstrip("/") or None,
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
        return self.data_dir / CATALOG_FILE

    @property
    def mlflow_artifacts_dir(self) -> Path:
        return self.data_dir / "mlartifacts"

    def artifact_root(self, kind: str) -> str:
        """Where artifacts of a kind (`rollouts`, `task_sets`, `reports`) go: under ENVFORGE_STORE_URL
        when it is set (object storage), else under the data directory."""
        return f"{self.store_url}/{kind}" if self.store_url else str(self.data_dir / kind)

    @property
    def build_dir(self) -> Path:
        return self.data_dir / "build"

    @property
    def dedup_dir(self) -> Path:
        """Decontamination's state: the registered corpora and the reference index."""
        return self.data_dir / "dedup"

    @property
    def reference_index_dir(self) -> Path:
        """The persisted index over the reference corpora (MinHash LSH + exact n-grams; kept in step with them)."""
        return self.dedup_dir / "reference-index"

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
        return sorted(
            p
            for p in self.task_sources_dir.iterdir()
            if p.is_dir() and p.name != "examples" and not p.name.startswith(".")
        )

    def source_path(self, key: str) -> Path:
        """The file a source key (a Dagster partition key) names: relative to the task-sources directory."""
        path = Path(key)
        return path if path.is_absolute() else self.task_sources_dir / path

    def ensure_dirs(self) -> None:
        for d in (self.data_dir, self.build_dir, self.mlflow_artifacts_dir):
            d.mkdir(parents=True, exist_ok=True)
