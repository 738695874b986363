"""Rollout: a policy acting on a task set's tasks in sandboxes, every trajectory graded and stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.rollout.batch import BatchResult
from envforge.rollout.config import RolloutConfig
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.images import ImageSet, ensure_images
from envforge.task import Task


@dataclass
class RolloutResult(StageResult):
    batch: BatchResult
    policy: str
    task_set_version: str

    @property
    def dropped_fraction(self) -> float:
        """The share of the batch's groups dropped (this run's and earlier runs' of a resumed batch)."""
        n = self.batch.report.n_tasks
        return len(self.batch.store.dropped()) / n if n else 0.0

    def location(self) -> str:
        return f"{self.batch.store.root}/{self.batch.store.batch_id}"

    def params(self) -> dict[str, Any]:
        return {"policy": self.policy, "task_set_version": self.task_set_version, "n_tasks": self.batch.report.n_tasks}

    def metrics(self) -> dict[str, float]:
        return {**self.batch.metrics, "dropped_fraction": round(self.dropped_fraction, 4)}

    def artifacts(self) -> dict[str, Any]:
        return {
            "rollout_batch.json": {
                "batch_id": self.batch.store.batch_id,
                "location": self.location(),
                "dropped_groups": [g.to_json() for g in self.batch.report.dropped_groups],
            }
        }


@stage("rollout")
def rollout(
    settings: Settings,
    config: RolloutConfig,
    tasks: Sequence[Task],
    policy: str,
    task_set_version: str = "",
    images: ImageSet | None = None,
    batch_id: str | None = None,
    root: str | None = None,
    context: StageContext = StageContext(),
) -> RolloutResult:
    """`config.n_samples` trajectories per task with `policy` (a policy spec), stored under `root`
    (default `<ENVFORGE_STORE_URL or data dir>/rollouts`); rerunning with the same batch id resumes.

    The sandboxes come from `context.sandboxes` (the provider the process chose: the fleet,
    docs/fleet.md; none: a warm pool on this process's engine); the batch is registered in the catalog."""
    from envforge.rollout.batch import run_batch
    from envforge.rollout.policies.factory import make_policy

    items = ensure_images(settings, tasks, images, context).items(tasks)
    batch = run_batch(
        settings,
        items,
        make_policy(policy),
        config,
        task_set_version=task_set_version,
        batch_id=batch_id,
        root=root,
        progress=context.progress,
        sandboxes=context.sandboxes,
        register=Catalog(settings.catalog_path).record_rollout_batch,
    )
    return RolloutResult(batch, policy, task_set_version)
