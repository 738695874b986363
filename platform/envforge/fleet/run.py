"""Rollout batches and gates on the fleet: the same library functions, given a fleet pool.

`run_batch` and `pipeline.validate` take a sandbox pool; these helpers hand them a
`FleetSandboxPool` after telling it the queue (recipes to build images on nodes, demand to
pre-heat), so where the work runs is the only difference from the single-machine path.
"""

from __future__ import annotations

from typing import Any, Sequence

from envforge import pipeline
from envforge.config import Settings
from envforge.fleet.dispatcher import FleetDispatcher
from envforge.fleet.pool import FleetSandboxPool
from envforge.rollout.batch import BatchResult, run_batch
from envforge.rollout.scheduler import Progress, RolloutConfig
from envforge.task import Task


def fleet_pool(dispatcher: FleetDispatcher, items: Sequence[tuple[Task, str]], samples_per_task: int,
               local_client: Any = None) -> FleetSandboxPool:
    pool = FleetSandboxPool(dispatcher)
    pool.register(items, samples_per_task, local_client=local_client)
    return pool


def run_batch_on_fleet(settings: Settings, dispatcher: FleetDispatcher, items: Sequence[tuple[Task, str]],
                       policy: Any, config: RolloutConfig, task_set_version: str = "", batch_id: str | None = None,
                       root: str | None = None, progress: Progress | None = None,
                       local_client: Any = None) -> BatchResult:
    """A rollout batch whose sandboxes (episodes and grading) run on the fleet's nodes.

    The trajectory store is the source of truth, as on one machine: rerun with the same batch id
    after a dispatcher restart and the batch resumes, nothing redone or duplicated.
    """
    pool = fleet_pool(dispatcher, items, config.n_samples * 2, local_client)  # an episode + its grade
    return run_batch(settings, items, policy, config, task_set_version, batch_id, root, progress=progress,
                     pool=pool)


def validate_on_fleet(settings: Settings, dispatcher: FleetDispatcher, tasks: Sequence[Task], images: dict[str, str],
                      config: pipeline.GateConfig, concurrency: int, local_client: Any = None,
                      progress: pipeline.Progress = pipeline._no_progress) -> pipeline.ValidationReport:
    """The flakiness gate with its sandboxes on the fleet (tasks placed by image locality)."""
    pool = fleet_gate_pool(dispatcher, tasks, images, config, local_client)
    return pipeline.validate(settings, tasks, images, config, concurrency=concurrency, progress=progress, pool=pool)


def fleet_gate_pool(dispatcher: FleetDispatcher, tasks: Sequence[Task], images: dict[str, str],
                    config: pipeline.GateConfig, local_client: Any = None) -> FleetSandboxPool:
    items = [(t, images[t.content_hash]) for t in tasks if t.content_hash in images]
    runs = 2 * config.runs + 2 + (26 if config.probes else 0)  # sandboxes per task: grades, probes and their grades
    return fleet_pool(dispatcher, items, runs, local_client)
