"""The fleet's sandbox pool for one rollout batch or one gate, told the queue ahead.

`run_batch` and the gate stage (`envforge.stages.gate`) take a sandbox pool; these helpers
build a `FleetSandboxPool` for their work after telling it the queue (recipes to build images on
nodes, demand to pre-heat), so where the work runs is the only difference from the
single-machine path. The stages get theirs from `backend.fleet_pool_from_env` when `ENVFORGE_RAY_ADDRESS` is set, and
run on this process's engine otherwise; the `*_sandboxes_per_task` counts below are what they tell it.
"""

from __future__ import annotations

from typing import Any, Sequence

from envforge.config import Settings
from envforge.fleet.dispatcher import FleetDispatcher
from envforge.fleet.pool import FleetSandboxPool
from envforge.progress import Progress
from envforge.rollout.batch import BatchResult, run_batch
from envforge.rollout.config import RolloutConfig
from envforge.task import Task
from envforge.verify.config import GateConfig
from envforge.verify.probes import STANDARD_PROBES


def fleet_pool(dispatcher: FleetDispatcher, items: Sequence[tuple[Task, str]], sandboxes_per_task: int,
               local_client: Any = None, settings: Settings | None = None) -> FleetSandboxPool:
    pool = FleetSandboxPool(dispatcher)
    pool.register(items, sandboxes_per_task, local_client=local_client, settings=settings)
    return pool


def rollout_sandboxes_per_task(config: RolloutConfig) -> int:
    """Each trajectory takes an episode sandbox and then its grade's."""
    return config.n_samples * 2


def gate_sandboxes_per_task(config: GateConfig) -> int:
    """The reference and the empty solution graded `runs` times each, the reference diff and a shuffled
    run, and each hack probe with its grade."""
    return 2 * config.runs + 2 + (2 * len(STANDARD_PROBES) if config.probes else 0)


def rollout_pool(dispatcher: FleetDispatcher, items: Sequence[tuple[Task, str]], config: RolloutConfig,
                 local_client: Any = None) -> FleetSandboxPool:
    """The pool a rollout batch runs in."""
    return fleet_pool(dispatcher, items, rollout_sandboxes_per_task(config), local_client)


def gate_pool(dispatcher: FleetDispatcher, items: Sequence[tuple[Task, str]], config: GateConfig,
              local_client: Any = None) -> FleetSandboxPool:
    """The pool a gate runs in (tasks placed by image locality)."""
    return fleet_pool(dispatcher, items, gate_sandboxes_per_task(config), local_client)


def run_batch_on_fleet(settings: Settings, dispatcher: FleetDispatcher, items: Sequence[tuple[Task, str]],
                       policy: Any, config: RolloutConfig, task_set_version: str = "", batch_id: str | None = None,
                       root: str | None = None, progress: Progress | None = None,
                       local_client: Any = None) -> BatchResult:
    """A rollout batch whose sandboxes (episodes and grading) run on the fleet's nodes.

    The trajectory store is the source of truth, as on one machine: rerun with the same batch id
    after a dispatcher restart and the batch resumes, nothing redone or duplicated.
    """
    return run_batch(settings, items, policy, config, task_set_version, batch_id, root, progress=progress,
                     pool=rollout_pool(dispatcher, items, config, local_client))

