"""The task catalog: one DuckDB file holding tasks, rejects, verdicts, images, runs, task-set
versions, rollout batches and service sessions.

Frames go in and out as polars; every frame is validated against its pandera schema before it is
written, and each public write is one transaction, so a batch is either stored whole or not at all.

The package is a storage layer: it imports the schemas, the task model, errors and hashing,
never the packages that produce what it stores (sources, sandbox, verify take their results in
as plain objects with the fields stored). One module per table group, each a class over the one
connection of `base.CatalogBase`, composed here into `Catalog`:

- `tasks`: tasks, rejects, source loads (`TaskStore`)
- `verdicts`: gate verdicts and verifier strength, quality verdicts, images, runs (`VerdictStore`)
- `task_sets`: task sets, members, lineage, tiers (`TaskSetStore`)
- `rollouts`: rollout batches (`RolloutStore`)
- `sessions`: environment-service sessions (`SessionStore`)

A group that reads another group's rows derives from its class (verdicts and task sets load
tasks), so each module says what it depends on.
"""

from __future__ import annotations

from envforge.catalog.rollouts import RolloutStore
from envforge.catalog.sessions import SessionStore
from envforge.catalog.task_sets import TaskSetStore, UnknownTaskSetError
from envforge.catalog.tasks import IngestSummary, SourceLoad, StoredLoad, TaskStore, task_rows
from envforge.catalog.verdicts import VerdictStore


class Catalog(VerdictStore, TaskSetStore, RolloutStore, SessionStore):
    """Handle on the catalog file: every table group over one connection. Cheap to create; opens a
    connection per operation."""


__all__ = [
    "Catalog",
    "IngestSummary",
    "RolloutStore",
    "SessionStore",
    "SourceLoad",
    "StoredLoad",
    "TaskSetStore",
    "TaskStore",
    "UnknownTaskSetError",
    "VerdictStore",
    "task_rows",
]
