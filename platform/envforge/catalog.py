"""The task catalog: one DuckDB file holding tasks, rejects, images, runs and task-set versions.

Frames go in and out as polars; every frame is validated against its pandera schema before
it is written, and each public write is one transaction, so a batch is either stored whole
or not at all. Connections are short-lived because DuckDB allows one writer process at a
time and Dagster runs steps in separate processes.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import duckdb
import pandera.errors
import polars as pl

from envforge.errors import BatchRejectedError, EnvforgeError, Problem
from envforge.hashing import digest_parts
from envforge.sandbox.images import ImageBuild
from envforge.schemas import TABLE_SCHEMAS, ddl
from envforge.sources.result import LoadResult
from envforge.task import Task
from envforge.verify.result import VerificationResult

# The tables come from their pandera models (envforge.schemas.ddl); the views are queries over them.
_VIEWS = """
CREATE OR REPLACE VIEW latest_source_loads AS
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY source_key ORDER BY loaded_at DESC, batch_id) AS rn
        FROM source_loads) WHERE rn = 1;
-- A task version is live when its source's latest load yielded it; versions stored without a
-- source load (direct catalog ingests) are live as before.
CREATE OR REPLACE VIEW current_tasks AS
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY task_id ORDER BY ingested_at DESC, content_hash) AS rn
        FROM tasks
        WHERE content_hash IN (SELECT unnest(task_hashes) FROM latest_source_loads)
           OR content_hash NOT IN (SELECT unnest(task_hashes) FROM source_loads)) WHERE rn = 1;
CREATE OR REPLACE VIEW current_rejects AS
    SELECT r.*, l.source_key FROM rejects r LEFT JOIN source_loads l USING (batch_id)
    WHERE l.batch_id IS NULL OR r.batch_id IN (SELECT batch_id FROM latest_source_loads);
"""
# Columns added to tables after catalogs were written: older catalogs get them (NULL in old rows).
_MIGRATIONS = """
ALTER TABLE validations ADD COLUMN IF NOT EXISTS image_digest VARCHAR;
ALTER TABLE validations ADD COLUMN IF NOT EXISTS gate_key VARCHAR;
ALTER TABLE validations ADD COLUMN IF NOT EXISTS stats_json VARCHAR;
ALTER TABLE validations ADD COLUMN IF NOT EXISTS strength DOUBLE;
ALTER TABLE validations ADD COLUMN IF NOT EXISTS admission VARCHAR;
"""
_DDL = "\n".join(ddl(table) for table in TABLE_SCHEMAS) + _MIGRATIONS + _VIEWS


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class UnknownTaskSetError(EnvforgeError, ValueError):
    """A task-set version (or prefix) that names no task set, or several."""


@dataclass(frozen=True)
class IngestSummary:
    batch_id: str
    added: int
    unchanged: int
    rejected: int


def task_rows(tasks: Iterable[Task], batch_id: str, at: datetime | None = None) -> pl.DataFrame:
    at = at or _now()
    rows = []
    for t in tasks:
        s = t.spec
        rows.append({
            "content_hash": t.content_hash, "task_id": s.id, "source": s.source, "origin": t.origin,
            "instruction": s.instruction, "tags": list(s.tags), "max_turns": s.max_turns,
            "reference_kind": "patch" if t.reference_patch is not None else "commands",
            "n_fail_to_pass": len(s.verification.tests.fail_to_pass) if s.verification.tests else 0,
            "n_pass_to_pass": len(s.verification.tests.pass_to_pass) if s.verification.tests else 0,
            "n_checkpoints": len(s.verification.checkpoints), "task_json": t.model_dump_json(),
            "ingested_at": at, "batch_id": batch_id,
        })
    return _frame("tasks", rows)


def _frame(table: str, rows: list[dict]) -> pl.DataFrame:
    """A frame with the table's exact column types, even when there are no rows."""
    schema = TABLE_SCHEMAS[table].to_schema()
    dtypes = {name: col.dtype.type for name, col in schema.columns.items()}
    return pl.DataFrame(rows, schema=dtypes)


class Catalog:
    """Handle on the catalog file. Cheap to create; opens a connection per operation."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as con:
            con.execute(_DDL)

    @contextmanager
    def _connect(self, retries: int = 50) -> Iterator[duckdb.DuckDBPyConnection]:
        delay = 0.05
        for attempt in range(retries):
            try:
                con = duckdb.connect(str(self.path))
                break
            except duckdb.IOException as exc:  # another process holds the write lock
                if "lock" not in str(exc).lower() or attempt == retries - 1:
                    raise
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)
        try:
            yield con
        finally:
            con.close()

    @staticmethod
    def validate(table: str, frame: pl.DataFrame) -> list[Problem]:
        """Every schema violation in the frame, as problems naming the table and column."""
        try:
            TABLE_SCHEMAS[table].validate(frame, lazy=True)
        except pandera.errors.SchemaErrors as exc:
            out = []
            for err in exc.schema_errors:
                col = getattr(err, "column_name", None) or ""
                cases = getattr(err, "failure_cases", None)
                detail = f" (failure cases: {cases.head(5).to_dicts()})" if isinstance(cases, pl.DataFrame) else ""
                out.append(Problem(f"catalog table {table}", str(col), f"{err}".splitlines()[0] + detail))
            return out
        return []

    def _insert(self, con: duckdb.DuckDBPyConnection, table: str, frame: pl.DataFrame) -> None:
        if frame.height:
            con.register("_frame", frame.to_arrow())
            con.execute(f"INSERT INTO {table} SELECT * FROM _frame")
            con.unregister("_frame")

    def write(self, frames: dict[str, pl.DataFrame]) -> None:
        """Validate all frames, then insert them in one transaction; all or nothing."""
        problems = [p for table, frame in frames.items() for p in self.validate(table, frame)]
        if problems:
            raise BatchRejectedError(problems)
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                for table, frame in frames.items():
                    self._insert(con, table, frame)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    # -- tasks ---------------------------------------------------------------------------

    def ingest(self, result: LoadResult, source_kind: str = "spec", strict: bool = False,
               source_key: str | None = None, fingerprint: str = "") -> IngestSummary:
        """Store a source's good tasks and its rejects in one transaction.

        strict=True refuses the whole batch when any record was rejected, reporting every
        problem at once and writing nothing. Tasks already stored with the same content hash
        are unchanged; a changed task is a new version (the old one is kept). With a
        source_key the batch is also that source's latest load: tasks it no longer yields
        (a ticket removed from an export) stop being current, and its older rejects stop
        being current rejects.
        """
        if strict and result.rejects:
            raise BatchRejectedError(result.rejects)
        batch_id = uuid.uuid4().hex
        at = _now()
        known = self.known_hashes()
        new = [t for t in result.tasks if t.content_hash not in known]
        rejects = _frame("rejects", [
            {"batch_id": batch_id, "source_kind": source_kind, "source": p.source, "field": p.field,
             "reason": p.reason, "rejected_at": at} for p in result.rejects])
        frames = {"tasks": task_rows(new, batch_id, at), "rejects": rejects}
        if source_key is not None:
            frames["source_loads"] = _frame("source_loads", [{
                "source_key": source_key, "source_kind": source_kind, "batch_id": batch_id,
                "fingerprint": fingerprint, "task_hashes": sorted({t.content_hash for t in result.tasks}),
                "n_rejects": len(result.rejects), "loaded_at": at}])
        self.write(frames)
        return IngestSummary(batch_id, len(new), len(result.tasks) - len(new), len(result.rejects))

    def current_owners(self, task_ids: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
        """{task id: [(source key, origin), ...]}: the sources whose latest load made each id current.

        A task id belongs to one source: a second source yielding the same id would silently
        shadow the first, so ingest rejects it instead, naming both.
        """
        ids = sorted(set(task_ids))
        if not ids:
            return {}
        frame = self.query(
            "SELECT t.task_id, l.source_key, t.origin FROM current_tasks t JOIN ("
            "  SELECT source_key, unnest(task_hashes) AS content_hash FROM latest_source_loads) l USING (content_hash)"
            " WHERE list_contains(?, t.task_id) ORDER BY l.source_key", [ids])
        owners: dict[str, list[tuple[str, str]]] = {}
        for r in frame.iter_rows(named=True):
            owners.setdefault(r["task_id"], []).append((r["source_key"], r["origin"]))
        return owners

    def known_hashes(self) -> set[str]:
        with self._connect() as con:
            return {r[0] for r in con.execute("SELECT content_hash FROM tasks").fetchall()}

    def tasks(self) -> pl.DataFrame:
        """The current version of every task."""
        return self.query("SELECT * FROM current_tasks ORDER BY task_id")

    def load_tasks(self, task_ids: Iterable[str] | None = None) -> list[Task]:
        frame = self.tasks()
        if task_ids is not None:
            frame = frame.filter(pl.col("task_id").is_in(list(task_ids)))
        return [Task.from_stored(j) for j in frame["task_json"]]

    def load_versions(self, content_hashes: Iterable[str]) -> list[Task]:
        """Exactly these task versions (current or not), ordered by task id; unknown hashes raise KeyError."""
        wanted = list(dict.fromkeys(content_hashes))
        frame = self.query("SELECT task_json, content_hash FROM tasks WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) "
                           "ORDER BY task_id", [wanted])
        unknown = set(wanted) - set(frame["content_hash"])
        if unknown:
            raise KeyError(f"task versions not in the catalog: {sorted(unknown)[:5]}")
        return [Task.from_stored(j) for j in frame["task_json"]]

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
            self.ingest(LoadResult(), source_kind=kind, source_key=key, fingerprint="retired")
        return [k for k, _ in gone]

    def record_rollout_batch(self, row: dict) -> None:
        """Register a rollout batch (a row of RolloutBatchRow without created_at); re-registering adds a row."""
        self.write({"rollout_batches": _frame("rollout_batches", [dict(row, created_at=_now())])})

    def record_service_sessions(self, rows: list[dict]) -> None:
        """Store finished environment-service sessions (rows of ServiceSessionRow), all or none."""
        self.write({"service_sessions": _frame("service_sessions", rows)})

    def service_sessions(self, tenant: str | None = None) -> pl.DataFrame:
        if tenant is None:
            return self.query("SELECT * FROM service_sessions ORDER BY ended_at")
        return self.query("SELECT * FROM service_sessions WHERE tenant = ? ORDER BY ended_at", [tenant])

    def record_tiers(self, version: str, rows: list[dict]) -> None:
        """Store the tiers of a task set (replacing earlier tiers of the same version)."""
        frame = _frame("task_tiers", [dict(r, version=version) for r in rows])
        problems = self.validate("task_tiers", frame)
        if problems:
            raise BatchRejectedError(problems)
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute("DELETE FROM task_tiers WHERE version = ?", [version])
                self._insert(con, "task_tiers", frame)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def tiers(self, version: str) -> pl.DataFrame:
        return self.query("SELECT * FROM task_tiers WHERE version = ? ORDER BY task_id", [self.resolve_task_set(version)])

    def rollout_batches(self) -> pl.DataFrame:
        """The latest registration of every rollout batch."""
        return self.query("""SELECT * EXCLUDE (rn) FROM (SELECT *, row_number() OVER (PARTITION BY batch_id
                             ORDER BY created_at DESC) AS rn FROM rollout_batches) WHERE rn = 1
                             ORDER BY created_at""")

    def current_rejects(self) -> pl.DataFrame:
        """Rejects of each source's latest load (plus rejects not tied to a source), with source_key."""
        return self.query("SELECT * FROM current_rejects ORDER BY source_kind, source, field")

    def source_loads(self) -> pl.DataFrame:
        """The latest load of every source: key, kind, fingerprint, how many tasks and rejects."""
        return self.query("SELECT source_key, source_kind, batch_id, fingerprint, len(task_hashes) AS n_tasks, "
                          "n_rejects, loaded_at FROM latest_source_loads ORDER BY source_kind, source_key")

    # -- images and runs -----------------------------------------------------------------

    def record_images(self, builds: Iterable[tuple[Task, ImageBuild]]) -> None:
        at = _now()
        self.write({"images": _frame("images", [
            {"task_id": t.id, "content_hash": t.content_hash, "image": b.tag, "cache_hit": b.cache_hit,
             "seconds": float(b.seconds), "size_mb": b.size_mb, "built_at": at} for t, b in builds])})

    def latest_images(self) -> dict[str, str]:
        """content_hash -> image tag of the most recent build."""
        frame = self.query("SELECT content_hash, arg_max(image, built_at) AS image FROM images GROUP BY 1")
        return dict(zip(frame["content_hash"], frame["image"]))

    def record_runs(self, results: Iterable[tuple[Task, VerificationResult]], mlflow_run_id: str | None = None,
                    dagster_run_id: str | None = None) -> list[str]:
        at = _now()
        rows = []
        for task, r in results:
            rows.append({
                "run_id": uuid.uuid4().hex, "task_id": task.id, "content_hash": task.content_hash,
                "solution": r.solution, "reward": float(r.reward), "resolved": r.resolved,
                "reasons": list(r.reasons), "tests_json": json.dumps(r.tests, sort_keys=True),
                "checkpoints_json": json.dumps([c.__dict__ for c in r.checkpoints]),
                "patch_method": r.patch_method, "duration_s": float(r.duration_s), "image": r.image,
                "mlflow_run_id": mlflow_run_id, "dagster_run_id": dagster_run_id, "created_at": at,
            })
        self.write({"runs": _frame("runs", rows)})
        return [r["run_id"] for r in rows]

    def record_validations(self, reports: Iterable, params: dict, mlflow_run_id: str | None = None,
                           dagster_run_id: str | None = None) -> None:
        """Store flakiness-gate verdicts (envforge.verify.gate.GateReport)."""
        at = _now()
        params_json = json.dumps(params, sort_keys=True)
        self.write({"validations": _frame("validations", [
            {"content_hash": r.content_hash, "task_id": r.task_id, "verdict": r.verdict,
             "disagreements": list(r.disagreements), "runs": r.runs, "reference_passes": r.reference_passes,
             "empty_fails": r.empty_fails, "probes_json": json.dumps(r.probe_results, sort_keys=True),
             "verifier_median_s": float(r.median_verifier_s), "infra_retries": r.infra_retries,
             "params_json": params_json, "mlflow_run_id": mlflow_run_id, "dagster_run_id": dagster_run_id,
             "created_at": at, "image_digest": r.image_digest or None, "gate_key": r.gate_key or None,
             "stats_json": json.dumps(r.stats(), sort_keys=True), "strength": r.strength_score,
             "admission": r.admission or None} for r in reports])})

    def validations_by_key(self, keys: Iterable[str]) -> dict[str, dict]:
        """The newest verdict row stored under each of the given gate keys (see verify.gate.gate_key)."""
        keys = sorted(set(keys))
        if not keys:
            return {}
        frame = self.query("""
            SELECT * EXCLUDE (rn) FROM (
                SELECT *, row_number() OVER (PARTITION BY gate_key ORDER BY created_at DESC) AS rn
                FROM validations WHERE gate_key IN (SELECT unnest(?::VARCHAR[]))) WHERE rn = 1""", [keys])
        return {row["gate_key"]: row for row in frame.to_dicts()}

    def _latest_per_current_task(self, table: str) -> pl.DataFrame:
        """The newest row of `table` for each current task version."""
        return self.query(f"""
            SELECT x.* EXCLUDE (rn) FROM (
                SELECT *, row_number() OVER (PARTITION BY content_hash ORDER BY created_at DESC) AS rn
                FROM {table}) x JOIN current_tasks t USING (content_hash)
            WHERE rn = 1 ORDER BY x.task_id""")

    def latest_validations(self) -> pl.DataFrame:
        """The most recent verdict per current task version."""
        return self._latest_per_current_task("validations")

    def audit_only(self, content_hashes: Iterable[str]) -> set[str]:
        """The given task versions whose latest gate verdict admits them to the audit split only (a weak
        verifier gated with below_strength=audit): never train or eval."""
        hashes = sorted(set(content_hashes))
        if not hashes:
            return set()
        frame = self.query("""
            SELECT content_hash, arg_max(coalesce(admission, ''), created_at) AS admission FROM validations
            WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) GROUP BY content_hash""", [hashes])
        return {row["content_hash"] for row in frame.to_dicts() if row["admission"] == "audit"}

    def record_quality(self, rows: list[dict], params: dict) -> None:
        """Store decontamination/dedup verdicts (dicts with the QualityRow fields but params/created_at)."""
        at = _now()
        params_json = json.dumps(params, sort_keys=True)
        self.write({"quality": _frame("quality", [dict(r, params_json=params_json, created_at=at) for r in rows])})

    def latest_quality(self) -> pl.DataFrame:
        """The most recent quality verdict per current task version."""
        return self._latest_per_current_task("quality")

    def clean_tasks(self) -> list[Task]:
        """Current tasks that are neither contaminated nor a removed duplicate (unchecked ones count as clean)."""
        removed = set(self.latest_quality().filter(pl.col("status") != "clean")["content_hash"])
        return [t for t in self.load_tasks() if t.content_hash not in removed]

    def accepted_tasks(self) -> list[Task]:
        """Clean current tasks whose latest gate verdict is `accepted`: what a task set may hold."""
        latest = self.latest_validations()
        ok = set(latest.filter(pl.col("verdict") == "accepted")["content_hash"])
        return [t for t in self.clean_tasks() if t.content_hash in ok]

    def runs(self) -> pl.DataFrame:
        return self.query("SELECT * FROM runs ORDER BY created_at, task_id, solution")

    # -- task sets -----------------------------------------------------------------------

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

    def sources_of(self, content_hashes: Iterable[str]) -> list[dict]:
        """The sources these task versions came from: the newest load of each source that yielded any of
        them (key, kind, fingerprint), and for versions stored without a source load, their origin file."""
        hashes = list(dict.fromkeys(content_hashes))
        loads = self.query("""
            SELECT source_key AS key, source_kind AS kind, arg_max(fingerprint, loaded_at) AS fingerprint,
                   flatten(list(task_hashes)) AS hashes
            FROM source_loads WHERE list_has_any(task_hashes, ?::VARCHAR[]) GROUP BY 1, 2 ORDER BY 1""", [hashes])
        covered = {h for hs in loads["hashes"] for h in hs}
        loose = self.query("""SELECT DISTINCT origin AS key, source AS kind FROM tasks
                              WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) ORDER BY 1""",
                           [[h for h in hashes if h not in covered]])
        return ([{"key": r["key"], "kind": r["kind"], "fingerprint": r["fingerprint"]}
                 for r in loads.iter_rows(named=True)]
                + [{"key": r["key"], "kind": r["kind"], "fingerprint": ""} for r in loose.iter_rows(named=True)])

    def task_set_params(self, version: str) -> dict:
        """The params a task-set version was made with (part of its hash)."""
        frame = self.query("SELECT params_json FROM task_sets WHERE version = ?", [version])
        if frame.height == 0:
            raise KeyError(f"task set {version!r} does not exist")
        return json.loads(frame["params_json"][0] or "{}")

    def create_task_set(self, name: str, tasks: Iterable[Task], params: dict | None = None,
                        sources: list | None = None, removed: list[dict] | None = None) -> str:
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
            parent = con.execute("SELECT version FROM task_sets WHERE name = ? ORDER BY created_at DESC LIMIT 1",
                                 [name]).fetchone()
        if exists:
            return version
        self.write({
            "task_sets": _frame("task_sets", [{"version": version, "name": name, "n_tasks": len(members),
                                               "params_json": params_json, "created_at": _now()}]),
            "task_set_members": _frame("task_set_members", [
                {"version": version, "task_id": tid, "content_hash": h} for tid, h in members]),
            "task_set_lineage": _frame("task_set_lineage", [{
                "version": version, "parent_version": parent[0] if parent else None,
                "sources_json": json.dumps(sources or []), "gates_json": params_json,
                "removed_json": json.dumps(removed or [], sort_keys=True)}]),
        })
        return version

    def lineage(self, version: str) -> dict:
        frame = self.query("SELECT * FROM task_set_lineage WHERE version = ?", [version])
        if frame.height == 0:
            raise KeyError(f"task set {version!r} has no lineage record")
        row = frame.row(0, named=True)
        return {"version": version, "parent_version": row["parent_version"],
                "sources": json.loads(row["sources_json"]), "gates": json.loads(row["gates_json"]),
                "removed": json.loads(row["removed_json"])}

    def diff_task_sets(self, old: str, new: str) -> dict[str, list[str]]:
        """Tasks added, removed and changed (same id, other content) from version `old` to `new`."""
        def members(v: str) -> dict[str, str]:
            f = self.query("SELECT task_id, content_hash FROM task_set_members WHERE version = ?", [v])
            if f.height == 0 and self.query("SELECT 1 FROM task_sets WHERE version = ?", [v]).height == 0:
                raise KeyError(f"task set {v!r} does not exist")
            return dict(zip(f["task_id"], f["content_hash"]))

        a, b = members(old), members(new)
        return {"added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b)),
                "changed": sorted(t for t in set(a) & set(b) if a[t] != b[t])}

    def task_sets(self) -> pl.DataFrame:
        return self.query("SELECT * FROM task_sets ORDER BY created_at")

    def task_set_frame(self, version: str) -> pl.DataFrame:
        return self.query(
            "SELECT t.* FROM task_set_members m JOIN tasks t USING (content_hash) WHERE m.version = ? "
            "ORDER BY t.task_id", [version])

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

    def load_split(self, version: str, split: str) -> list[Task]:
        """A task set's members in one split (`train`, `eval`, `audit`) of its recorded tiers, or `all`."""
        tasks = self.load_task_set(version)
        if split == "all":
            return tasks
        tiers = self.tiers(version)
        wanted = set(tiers.filter(pl.col("split") == split)["task_id"])
        return [t for t in tasks if t.id in wanted]

    def load_task_set(self, version: str) -> list[Task]:
        """The exact task versions a task set holds."""
        frame = self.query("""SELECT t.task_json FROM task_set_members m JOIN tasks t USING (content_hash)
                              WHERE m.version = ? ORDER BY m.task_id""", [self.resolve_task_set(version)])
        return [Task.from_stored(j) for j in frame["task_json"]]

    def export_task_set(self, version: str, path: Path) -> Path:
        """Write a task-set version's member tasks to parquet."""
        frame = self.task_set_frame(version)
        if frame.height == 0:
            raise KeyError(f"task set {version!r} does not exist or is empty")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.with_columns(pl.lit(version).alias("task_set_version")).write_parquet(path)
        return path

    # -- reads -----------------------------------------------------------------------------

    def query(self, sql: str, params: list | None = None) -> pl.DataFrame:
        with self._connect() as con:
            return con.execute(sql, params or []).pl()

    def counts(self) -> dict[str, int]:
        with self._connect() as con:
            return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLE_SCHEMAS}
