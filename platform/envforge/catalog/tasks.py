"""Tasks, rejects and source loads: which task versions exist, which are current, and why records
were refused.

A source's load is stored whole (its good tasks, its rejects and, with a source key, the load
itself) in one transaction. Loads come in as anything with `tasks` and `rejects` (a
`sources.result.LoadResult`), so the catalog does not depend on the source parsers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, NamedTuple, Protocol, Sequence

import polars as pl

from envforge.catalog.base import CatalogBase, frame, now
from envforge.errors import BatchRejectedError, Problem
from envforge.task import Task


class StoredLoad(NamedTuple):
    """A source's latest load as stored: its task versions, rejects, cursor and statement policy."""

    tasks: list[Task]
    rejects: list[Problem]
    cursor: str | None
    statements: str | None  # None: stored before loads recorded their policy


class SourceLoad(Protocol):
    """What a source load hands the catalog: its good tasks and its rejected records."""

    @property
    def tasks(self) -> Sequence[Task]: ...

    @property
    def rejects(self) -> Sequence[Problem]: ...


@dataclass(frozen=True)
class IngestSummary:
    batch_id: str
    added: int
    unchanged: int
    rejected: int


def task_rows(tasks: Iterable[Task], batch_id: str, at: datetime | None = None) -> pl.DataFrame:
    at = at or now()
    rows = []
    for t in tasks:
        s = t.spec
        rows.append(
            {
                "content_hash": t.content_hash,
                "task_id": s.id,
                "source": s.source,
                "origin": t.origin,
                "instruction": s.instruction,
                "tags": list(s.tags),
                "max_turns": s.max_turns,
                "reference_kind": "patch" if t.reference_patch is not None else "commands",
                "n_fail_to_pass": len(s.verification.tests.fail_to_pass) if s.verification.tests else 0,
                "n_pass_to_pass": len(s.verification.tests.pass_to_pass) if s.verification.tests else 0,
                "n_checkpoints": len(s.verification.checkpoints),
                "task_json": t.model_dump_json(),
                "ingested_at": at,
                "batch_id": batch_id,
            }
        )
    return frame("tasks", rows)


class TaskStore(CatalogBase):
    """The `tasks`, `rejects` and `source_loads` tables and the views over them."""

    def ingest(
        self,
        result: SourceLoad,
        source_kind: str = "spec",
        strict: bool = False,
        source_key: str | None = None,
        fingerprint: str = "",
        cursor: str | None = None,
        statements: str | None = None,
    ) -> IngestSummary:
        """Store a source's good tasks and its rejects in one transaction.

        strict=True refuses the whole batch when any record was rejected, reporting every
        problem at once and writing nothing. Tasks already stored with the same content hash
        are unchanged; a changed task is a new version (the old one is kept). With a
        source_key the batch is also that source's latest load: tasks it no longer yields
        (a ticket removed from an export) stop being current, and its older rejects stop
        being current rejects.
        """
        tasks, problems = list(result.tasks), list(result.rejects)
        if strict and problems:
            raise BatchRejectedError(problems)
        batch_id = uuid.uuid4().hex
        at = now()
        known = self.known_hashes()
        new = [t for t in tasks if t.content_hash not in known]
        rejects = frame(
            "rejects",
            [
                {
                    "batch_id": batch_id,
                    "source_kind": source_kind,
                    "source": p.source,
                    "field": p.field,
                    "reason": p.reason,
                    "rejected_at": at,
                }
                for p in problems
            ],
        )
        frames = {"tasks": task_rows(new, batch_id, at), "rejects": rejects}
        if source_key is not None:
            frames["source_loads"] = frame(
                "source_loads",
                [
                    {
                        "source_key": source_key,
                        "source_kind": source_kind,
                        "batch_id": batch_id,
                        "fingerprint": fingerprint,
                        "task_hashes": sorted({t.content_hash for t in tasks}),
                        "n_rejects": len(problems),
                        "loaded_at": at,
                        "cursor": cursor,
                        "statements": statements,
                    }
                ],
            )
        self.write(frames)
        return IngestSummary(batch_id, len(new), len(tasks) - len(new), len(problems))

    def current_owners(self, task_ids: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
        """{task id: [(source key, origin), ...]}: the sources whose latest load made each id current.

        A task id belongs to one source: a second source yielding the same id would silently
        shadow the first, so ingest rejects it instead, naming both.
        """
        ids = sorted(set(task_ids))
        if not ids:
            return {}
        found = self.query(
            "SELECT t.task_id, l.source_key, t.origin FROM current_tasks t JOIN ("
            "  SELECT source_key, unnest(task_hashes) AS content_hash FROM latest_source_loads) l USING (content_hash)"
            " WHERE list_contains(?, t.task_id) ORDER BY l.source_key",
            [ids],
        )
        owners: dict[str, list[tuple[str, str]]] = {}
        for r in found.iter_rows(named=True):
            owners.setdefault(r["task_id"], []).append((r["source_key"], r["origin"]))
        return owners

    def known_hashes(self) -> set[str]:
        with self._connect() as con:
            return {r[0] for r in con.execute("SELECT content_hash FROM tasks").fetchall()}

    def tasks(self) -> pl.DataFrame:
        """The current version of every task."""
        return self.query("SELECT * FROM current_tasks ORDER BY task_id")

    def load_tasks(self, task_ids: Iterable[str] | None = None) -> list[Task]:
        current = self.tasks()
        if task_ids is not None:
            current = current.filter(pl.col("task_id").is_in(list(task_ids)))
        return [Task.from_stored(j) for j in current["task_json"]]

    def load_versions(self, content_hashes: Iterable[str]) -> list[Task]:
        """Exactly these task versions (current or not), ordered by task id; unknown hashes raise KeyError."""
        wanted = list(dict.fromkeys(content_hashes))
        found = self.query(
            "SELECT task_json, content_hash FROM tasks WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) "
            "ORDER BY task_id",
            [wanted],
        )
        unknown = set(wanted) - set(found["content_hash"])
        if unknown:
            raise KeyError(f"task versions not in the catalog: {sorted(unknown)[:5]}")
        return [Task.from_stored(j) for j in found["task_json"]]

    def task_listing(self) -> pl.DataFrame:
        """Current tasks with their latest gate verdict, for people (`envforge catalog list`)."""
        return self.query("""
            SELECT t.task_id, t.source, substr(t.content_hash, 1, 12) AS version, t.tags,
                   arg_max(v.verdict, v.created_at) AS verdict,
                   arg_max(v.reference_passes || '/' || v.runs, v.created_at) AS reference_passed,
                   arg_max(v.empty_fails || '/' || v.runs, v.created_at) AS empty_failed,
                   arg_max(v.strength, v.created_at) AS strength,
                   arg_max(coalesce(v.admission, ''), v.created_at) AS admission
            FROM current_tasks t LEFT JOIN validations v USING (content_hash)
            GROUP BY ALL ORDER BY t.task_id""")

    def rejects(self) -> pl.DataFrame:
        """Every reject ever recorded (history)."""
        return self.query("SELECT * FROM rejects ORDER BY rejected_at, source")

    def current_rejects(self) -> pl.DataFrame:
        """Rejects of each source's latest load (plus rejects not tied to a source), with source_key."""
        return self.query("SELECT * FROM current_rejects ORDER BY source_kind, source, field")

    def source_loads(self) -> pl.DataFrame:
        """The latest load of every source: key, kind, fingerprint, how many tasks and rejects, cursor."""
        return self.query(
            "SELECT source_key, source_kind, batch_id, fingerprint, len(task_hashes) AS n_tasks, "
            "n_rejects, loaded_at, cursor FROM latest_source_loads ORDER BY source_kind, source_key"
        )

    def latest_load(self, source_key: str) -> StoredLoad | None:
        """A source's latest load as it was stored (None: never loaded). What an incremental load of a
        history source carries over."""
        load = self.query(
            "SELECT batch_id, task_hashes, cursor, statements FROM latest_source_loads WHERE source_key = ?",
            [source_key],
        )
        if load.height == 0:
            return None
        row = load.row(0, named=True)
        tasks = self.load_versions(row["task_hashes"]) if row["task_hashes"] else []
        rejects = self.query(
            "SELECT source, field, reason FROM rejects WHERE batch_id = ? ORDER BY source", [row["batch_id"]]
        )
        return StoredLoad(
            tasks,
            [Problem(r["source"], r["field"], r["reason"]) for r in rejects.iter_rows(named=True)],
            row["cursor"],
            row["statements"],
        )

    def retire_missing_sources(self, present: set[str], root: Path, under: Iterable[Path] | None = None) -> list[str]:
        """Record an empty latest load for every loaded source that is gone from disk.

        Keys are relative to root (or absolute); only sources under `under` (default: root)
        are considered, so sources ingested from elsewhere are left alone.
        """
        roots = [Path(u).resolve() for u in (under if under is not None else [root])]
        gone = []
        for row in self.source_loads().iter_rows(named=True):
            key = row["source_key"]
            path = Path(key) if Path(key).is_absolute() else Path(root).resolve() / key
            if key in present or row["n_tasks"] == 0 and row["n_rejects"] == 0:
                continue
            if any(path.is_relative_to(r) for r in roots) and not path.exists():
                gone.append((key, row["source_kind"]))
        for key, kind in gone:
            self.ingest(_NOTHING_LOADED, source_kind=kind, source_key=key, fingerprint="retired")
        return [k for k, _ in gone]

    def sources_of(self, content_hashes: Iterable[str]) -> list[dict]:
        """The sources these task versions came from: the newest load of each source that yielded any of
        them (key, kind, fingerprint), and for versions stored without a source load, their origin file."""
        hashes = list(dict.fromkeys(content_hashes))
        loads = self.query(
            """
            SELECT source_key AS key, source_kind AS kind, arg_max(fingerprint, loaded_at) AS fingerprint,
                   flatten(list(task_hashes)) AS hashes
            FROM source_loads WHERE list_has_any(task_hashes, ?::VARCHAR[]) GROUP BY 1, 2 ORDER BY 1""",
            [hashes],
        )
        covered = {h for hs in loads["hashes"] for h in hs}
        loose = self.query(
            """SELECT DISTINCT origin AS key, source AS kind FROM tasks
                              WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) ORDER BY 1""",
            [[h for h in hashes if h not in covered]],
        )
        return [
            {"key": r["key"], "kind": r["kind"], "fingerprint": r["fingerprint"]} for r in loads.iter_rows(named=True)
        ] + [{"key": r["key"], "kind": r["kind"], "fingerprint": ""} for r in loose.iter_rows(named=True)]


@dataclass(frozen=True)
class _EmptyLoad:
    """The load of a source that is gone: no tasks, no rejects."""

    tasks: tuple[Task, ...] = ()
    rejects: tuple[Problem, ...] = ()


_NOTHING_LOADED = _EmptyLoad()
