"""Task sets: content-addressed versions of a group of task versions, their members, their lineage
(sources, gates, what was removed, the parent version) and their tiers and splits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import polars as pl

from envforge.catalog.base import frame, now
from envforge.catalog.tasks import TaskStore
from envforge.errors import EnvforgeError
from envforge.hashing import digest_parts
from envforge.task import Task


class UnknownTaskSetError(EnvforgeError, ValueError):
    """A task-set version (or prefix) that names no task set, or several."""


class TaskSetStore(TaskStore):
    """The `task_sets`, `task_set_members`, `task_set_lineage` and `task_tiers` tables."""

    @staticmethod
    def task_set_version(tasks: Iterable[Task], params: dict | None = None) -> str:
        """The version of a task set: the hash of its params and its members' content hashes."""
        members = sorted({(t.id, t.content_hash) for t in tasks})
        return digest_parts(json.dumps(params or {}, sort_keys=True), *[f"{tid}={h}" for tid, h in members])

    def has_task_set(self, version: str) -> bool:
        return self.query("SELECT 1 FROM task_sets WHERE version = ?", [version]).height > 0

    def published_hashes(self) -> list[str]:
        """Every task version that is a member of some task set."""
        return self.query("SELECT DISTINCT content_hash FROM task_set_members ORDER BY 1")["content_hash"].to_list()

    def task_set_params(self, version: str) -> dict:
        """The params a task-set version was made with (part of its hash)."""
        found = self.query("SELECT params_json FROM task_sets WHERE version = ?", [version])
        if found.height == 0:
            raise KeyError(f"task set {version!r} does not exist")
        return json.loads(found["params_json"][0] or "{}")

    def create_task_set(
        self,
        name: str,
        tasks: Iterable[Task],
        params: dict | None = None,
        sources: list | None = None,
        removed: list[dict] | None = None,
    ) -> str:
        """Record a task-set version: the hash of its members' content hashes and its params.

        Lineage is kept with it: the sources it came from, the gates (params), what the gates
        removed and why, and the previous version of the same name (its parent).
        """
        tasks = list(tasks)
        members = sorted({(t.id, t.content_hash) for t in tasks})
        params_json = json.dumps(params or {}, sort_keys=True)
        version = self.task_set_version(tasks, params)
        with self._connect() as con:
            exists = con.execute("SELECT 1 FROM task_sets WHERE version = ?", [version]).fetchone()
            parent = con.execute(
                "SELECT version FROM task_sets WHERE name = ? ORDER BY created_at DESC LIMIT 1", [name]
            ).fetchone()
        if exists:
            return version
        self.write(
            {
                "task_sets": frame(
                    "task_sets",
                    [
                        {
                            "version": version,
                            "name": name,
                            "n_tasks": len(members),
                            "params_json": params_json,
                            "created_at": now(),
                        }
                    ],
                ),
                "task_set_members": frame(
                    "task_set_members", [{"version": version, "task_id": tid, "content_hash": h} for tid, h in members]
                ),
                "task_set_lineage": frame(
                    "task_set_lineage",
                    [
                        {
                            "version": version,
                            "parent_version": parent[0] if parent else None,
                            "sources_json": json.dumps(sources or []),
                            "gates_json": params_json,
                            "removed_json": json.dumps(removed or [], sort_keys=True),
                        }
                    ],
                ),
            }
        )
        return version

    def lineage(self, version: str) -> dict:
        found = self.query("SELECT * FROM task_set_lineage WHERE version = ?", [version])
        if found.height == 0:
            raise KeyError(f"task set {version!r} has no lineage record")
        row = found.row(0, named=True)
        return {
            "version": version,
            "parent_version": row["parent_version"],
            "sources": json.loads(row["sources_json"]),
            "gates": json.loads(row["gates_json"]),
            "removed": json.loads(row["removed_json"]),
        }

    def diff_task_sets(self, old: str, new: str) -> dict[str, list[str]]:
        """Tasks added, removed and changed (same id, other content) from version `old` to `new`."""

        def members(v: str) -> dict[str, str]:
            f = self.query("SELECT task_id, content_hash FROM task_set_members WHERE version = ?", [v])
            if f.height == 0 and self.query("SELECT 1 FROM task_sets WHERE version = ?", [v]).height == 0:
                raise KeyError(f"task set {v!r} does not exist")
            return dict(zip(f["task_id"], f["content_hash"]))

        a, b = members(old), members(new)
        return {
            "added": sorted(set(b) - set(a)),
            "removed": sorted(set(a) - set(b)),
            "changed": sorted(t for t in set(a) & set(b) if a[t] != b[t]),
        }

    def task_sets(self) -> pl.DataFrame:
        return self.query("SELECT * FROM task_sets ORDER BY created_at")

    def task_set_frame(self, version: str) -> pl.DataFrame:
        return self.query(
            "SELECT t.* FROM task_set_members m JOIN tasks t USING (content_hash) WHERE m.version = ? "
            "ORDER BY t.task_id",
            [version],
        )

    def resolve_task_set(self, version: str) -> str:
        """The full version for a unique prefix, or for 'latest' (the newest task set): the one place a
        version a person typed becomes a version. Raises UnknownTaskSetError (a ValueError) otherwise."""
        versions = self.task_sets()["version"].to_list()
        if version == "latest":
            if not versions:
                raise UnknownTaskSetError("the catalog has no task set yet: run the demo or the main job first")
            return self.query("SELECT version FROM task_sets ORDER BY created_at DESC LIMIT 1")["version"][0]
        matches = [v for v in versions if version and v.startswith(version)]
        if len(matches) != 1:
            raise UnknownTaskSetError(f"task-set version {version!r} matches {len(matches)} versions")
        return matches[0]

    def load_task_set(self, version: str) -> list[Task]:
        """The exact task versions a task set holds."""
        found = self.query(
            """SELECT t.task_json FROM task_set_members m JOIN tasks t USING (content_hash)
                              WHERE m.version = ? ORDER BY m.task_id""",
            [self.resolve_task_set(version)],
        )
        return [Task.from_stored(j) for j in found["task_json"]]

    def export_task_set(self, version: str, path: Path) -> Path:
        """Write a task-set version's member tasks to parquet."""
        members = self.task_set_frame(version)
        if members.height == 0:
            raise KeyError(f"task set {version!r} does not exist or is empty")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        members.with_columns(pl.lit(version).alias("task_set_version")).write_parquet(path)
        return path

    # -- tiers ---------------------------------------------------------------------------

    def record_tiers(self, version: str, rows: list[dict]) -> None:
        """Store the tiers of a task set (replacing earlier tiers of the same version)."""
        self._replace(
            {"task_tiers": frame("task_tiers", [dict(r, version=version) for r in rows])},
            {"task_tiers": ("version = ?", [version])},
        )

    def tiers(self, version: str) -> pl.DataFrame:
        return self.query(
            "SELECT * FROM task_tiers WHERE version = ? ORDER BY task_id", [self.resolve_task_set(version)]
        )

    def load_split(self, version: str, split: str) -> list[Task]:
        """A task set's members in one split (`train`, `eval`, `audit`) of its recorded tiers, or `all`."""
        tasks = self.load_task_set(version)
        if split == "all":
            return tasks
        tiers = self.tiers(version)
        wanted = set(tiers.filter(pl.col("split") == split)["task_id"])
        return [t for t in tasks if t.id in wanted]
