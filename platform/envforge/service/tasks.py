"""What the service can serve: the catalog's task sets, their tasks, tiers and splits.

A task-set *version* never changes, so its tasks are read once and kept; the list of
versions is re-read when a lookup misses or every `refresh_s`, so a task set published by the
pipeline is servable without a restart. Every lookup goes through the tenant's scopes:
a task set the tenant may not use does not exist for it (404, not 403).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from envforge.catalog import Catalog
from envforge.errors import EnvforgeError
from envforge.service.tenants import Tenant
from envforge.task import Task

MIN_PREFIX = 6


class NotFound(EnvforgeError):
    """A task set or task the caller cannot see (unknown, or outside its scopes)."""


@dataclass(frozen=True)
class TaskSetInfo:
    version: str
    name: str
    n_tasks: int
    created_at: str


@dataclass
class ServedTask:
    task: Task
    index: int  # position in the task set (ordered by task id)
    tier: str | None = None
    split: str | None = None


@dataclass
class _Version:
    info: TaskSetInfo
    tasks: list[ServedTask] = field(default_factory=list)
    by_id: dict[str, ServedTask] = field(default_factory=dict)


class TaskDirectory:
    def __init__(self, catalog: Catalog, refresh_s: float = 10.0):
        self.catalog = catalog
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._infos: list[TaskSetInfo] = []  # newest first
        self._loaded_at = 0.0
        self._versions: dict[str, _Version] = {}

    # -- catalog reads -------------------------------------------------------------------------

    def _refresh(self, force: bool = False) -> list[TaskSetInfo]:
        with self._lock:
            if not force and self._infos and time.monotonic() - self._loaded_at < self.refresh_s:
                return self._infos
        frame = self.catalog.task_sets()
        infos = [
            TaskSetInfo(r["version"], r["name"], int(r["n_tasks"]), str(r["created_at"]))
            for r in frame.iter_rows(named=True)
        ][::-1]
        with self._lock:
            self._infos, self._loaded_at = infos, time.monotonic()
        return infos

    def _version(self, info: TaskSetInfo) -> _Version:
        with self._lock:
            cached = self._versions.get(info.version)
        if cached is not None:
            return cached
        tasks = self.catalog.load_task_set(info.version)
        tiers = {r["task_id"]: r for r in self.catalog.tiers(info.version).iter_rows(named=True)}
        v = _Version(info)
        for i, t in enumerate(sorted(tasks, key=lambda t: t.id)):
            tier = tiers.get(t.id, {})
            served = ServedTask(t, i, tier.get("tier"), tier.get("split"))
            v.tasks.append(served)
            v.by_id[t.id] = served
        with self._lock:
            self._versions[info.version] = v
        return v

    # -- lookups (always scoped to a tenant) -------------------------------------------------

    def task_sets(self, tenant: Tenant) -> list[TaskSetInfo]:
        return [i for i in self._refresh() if tenant.may_use(i.name, i.version)]

    def resolve_task_set(self, tenant: Tenant, ref: str) -> TaskSetInfo:
        """A full version, a unique prefix of at least 6 characters, or a name (its newest version).

        Not `Catalog.resolve_task_set`: this resolves among the task sets the tenant may use only,
        so a prefix that is ambiguous with, or names, another tenant's set reveals nothing."""
        for force in (False, True):
            infos = (
                self.task_sets(tenant)
                if not force
                else [i for i in self._refresh(force=True) if tenant.may_use(i.name, i.version)]
            )
            exact = [i for i in infos if i.version == ref]
            named = [i for i in infos if i.name == ref]
            prefixed = [i for i in infos if len(ref) >= MIN_PREFIX and i.version.startswith(ref)]
            for matches in (exact, named[:1], prefixed):
                if len(matches) == 1:
                    return matches[0]
            if len(prefixed) > 1:
                raise NotFound(f"task-set version prefix {ref!r} is ambiguous ({len(prefixed)} versions)")
        raise NotFound(f"no task set {ref!r}")

    def tasks(self, tenant: Tenant, ref: str) -> tuple[TaskSetInfo, list[ServedTask]]:
        info = self.resolve_task_set(tenant, ref)
        return info, self._version(info).tasks

    def resolve_task(
        self,
        tenant: Tenant,
        task_id: str | None = None,
        task_set: str | None = None,
        index: int | None = None,
        content_hash: str | None = None,
    ) -> tuple[TaskSetInfo, ServedTask]:
        """(task set, task) for a task id (newest visible set holding it, unless `task_set` is given),
        a task set + index, or a content hash (the exact task version, in any visible set)."""
        if task_set is not None:
            info = self.resolve_task_set(tenant, task_set)
            version = self._version(info)
            if index is not None:
                if not 0 <= index < len(version.tasks):
                    raise NotFound(f"task set {info.version[:12]} has {len(version.tasks)} tasks; no index {index}")
                served = version.tasks[index]
            elif task_id is not None:
                served = version.by_id.get(task_id)
                if served is None:
                    raise NotFound(f"no task {task_id!r} in task set {info.version[:12]}")
            else:
                raise NotFound("give task_id or index with task_set")
            if content_hash and served.task.content_hash != content_hash:
                raise NotFound(f"task {served.task.id!r} of task set {info.version[:12]} has another content hash")
            return info, served
        if task_id is None and content_hash is None:
            raise NotFound("give task_id, task_set + index, or content_hash")
        for force in (False, True):
            infos = (
                self.task_sets(tenant)
                if not force
                else [i for i in self._refresh(force=True) if tenant.may_use(i.name, i.version)]
            )
            for info in infos:
                version = self._version(info)
                if task_id is None:
                    candidates = version.tasks
                else:
                    candidates = [version.by_id[task_id]] if task_id in version.by_id else []
                for served in candidates:
                    if content_hash is None or served.task.content_hash == content_hash:
                        return info, served
        what = f"task {task_id!r}" if task_id else "task"
        raise NotFound(
            f"no {what}"
            + (f" with content hash {content_hash[:12]}" if content_hash else "")
            + " in a task set this key may use"
        )


def task_summary(served: ServedTask) -> dict[str, Any]:
    t = served.task
    lim = t.spec.environment.limits
    return {
        "task_id": t.id,
        "content_hash": t.content_hash,
        "index": served.index,
        "instruction": t.spec.instruction,
        "source": t.spec.source,
        "tags": list(t.spec.tags),
        "max_turns": t.spec.max_turns,
        "tier": served.tier,
        "split": served.split,
        "limits": {
            "cpus": lim.cpus,
            "memory_mb": lim.memory_mb,
            "pids": lim.pids,
            "command_timeout_s": lim.command_timeout_s,
            "trajectory_timeout_s": lim.trajectory_timeout_s,
        },
    }
