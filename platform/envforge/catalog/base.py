"""The catalog's file, its schema and its one way in: connection, validation, all-or-nothing writes.

Connections are short-lived because DuckDB allows one writer process at a time and Dagster runs
steps in separate processes. The tables come from their pandera models (`envforge.schemas.ddl`,
which also appends the nullable columns a table gained since older catalogs were made); the views
below are the only SQL schema written here. Every table group module (tasks, verdicts, task_sets,
rollouts, sessions) reads and writes through this class and nothing else.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import duckdb
import pandera.errors
import polars as pl

from envforge.errors import BatchRejectedError, Problem
from envforge.schemas import TABLE_SCHEMAS, ddl

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
SCHEMA_SQL = "\n".join(ddl(table) for table in TABLE_SCHEMAS) + _VIEWS


def now() -> datetime:
    """The timestamp stored in the catalog: UTC, without a zone (DuckDB TIMESTAMP)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def frame(table: str, rows: list[dict]) -> pl.DataFrame:
    """A frame with the table's exact column types, even when there are no rows."""
    schema = TABLE_SCHEMAS[table].to_schema()
    dtypes = {name: col.dtype.type for name, col in schema.columns.items()}
    return pl.DataFrame(rows, schema=dtypes)


_SCHEMA_LOCK = threading.Lock()


class CatalogBase:
    """Handle on the catalog file. Cheap to create; opens a connection per operation."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One process's connections share one database: two threads opening a Catalog at once (the
        # service's session recorder and a new session's image lookup) conflict on the schema's DDL.
        with _SCHEMA_LOCK, self._connect() as con:
            con.execute(SCHEMA_SQL)

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
        self._replace(frames, {})

    def _replace(self, frames: dict[str, pl.DataFrame], where: dict[str, tuple[str, list]]) -> None:
        """Like `write`, deleting first, in the same transaction, the rows of each table in `where`
        that match its (SQL condition, parameters): how a group of rows is replaced as a whole."""
        problems = [p for table, frame in frames.items() for p in self.validate(table, frame)]
        if problems:
            raise BatchRejectedError(problems)
        with self._connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                for table, (condition, params) in where.items():
                    con.execute(f"DELETE FROM {table} WHERE {condition}", params)
                for table, frame in frames.items():
                    self._insert(con, table, frame)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: list | None = None) -> pl.DataFrame:
        with self._connect() as con:
            return con.execute(sql, params or []).pl()

    def counts(self) -> dict[str, int]:
        with self._connect() as con:
            return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLE_SCHEMAS}
