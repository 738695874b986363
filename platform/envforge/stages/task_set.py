"""Task set: the accepted tasks as a content-addressed version, with its lineage, exported as parquet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from envforge import objectstore
from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.configs import TaskSetConfig
from envforge.task import Task


@dataclass(frozen=True)
class Lineage:
    """Why a task-set version holds what it holds.

    `removed`: the tasks the run's stages took out, each with the stage and the reason;
    `params`: the settings those stages ran with (`{"dedup": ..., "gate": ...}`), part of the
    version hash, so the same tasks gated differently are a different version. The sources a
    version came from are looked up from the catalog's source loads when it is published.
    """

    removed: list[dict] = field(default_factory=list)
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"removed": list(self.removed), "params": dict(self.params)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Lineage":
        return cls(list(doc.get("removed") or []), dict(doc.get("params") or {}))


@dataclass
class TaskSetResult(StageResult):
    version: str
    name: str
    n_tasks: int
    parquet: Path
    new_version: bool
    lineage: dict[str, Any]
    published: str | None = None  # the parquet's copy under ENVFORGE_STORE_URL, when one is set

    def params(self) -> dict[str, Any]:
        return {"n_tasks": self.n_tasks, "task_set_version": self.version}

    def metrics(self) -> dict[str, float]:
        return {"task_set_size": self.n_tasks}

    def artifacts(self) -> dict[str, Any]:
        return {
            "task_set.json": {
                "name": self.name,
                "version": self.version,
                "parquet": str(self.parquet),
                "published": self.published,
            },
            "lineage.json": self.lineage,
        }


@stage("task_set")
def publish_task_set(
    settings: Settings,
    config: TaskSetConfig,
    tasks: Sequence[Task],
    lineage: Lineage,
    context: StageContext = StageContext(),
) -> TaskSetResult:
    """A task-set version of the given tasks (unchanged tasks and params give the same version), with
    its lineage: the sources its tasks and the removed ones came from, what was removed and why, the
    params, and the parent version."""
    catalog = Catalog(settings.catalog_path)
    hashes = [t.content_hash for t in tasks] + [r["content_hash"] for r in lineage.removed if r.get("content_hash")]
    version = catalog.task_set_version(tasks, dict(lineage.params))
    new = not catalog.has_task_set(version)
    catalog.create_task_set(
        config.name, tasks, dict(lineage.params), sources=catalog.sources_of(hashes), removed=lineage.removed
    )
    path = catalog.export_task_set(version, settings.data_dir / "task_sets" / f"{config.name}-{version[:12]}.parquet")
    return TaskSetResult(
        version,
        config.name,
        len(tasks),
        path,
        new,
        catalog.lineage(version),
        published=objectstore.publish(settings.store_url, "task_sets", path),
    )
