"""The DuckDB catalog: atomic batches, schema checks, versions, task sets and parquet export."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

from envforge.catalog import Catalog, task_rows
from envforge.errors import BatchRejectedError, Problem
from envforge.sources import LoadResult, load_specs
from tests.conftest import BUNDLED_SPECS


@pytest.fixture
def catalog(settings) -> Catalog:
    return Catalog(settings.catalog_path)


@pytest.fixture
def bundled() -> LoadResult:
    return load_specs([BUNDLED_SPECS])


def count(catalog: Catalog, table: str) -> int:
    return catalog.counts()[table]


def test_ingest_stores_tasks_and_is_idempotent(catalog, bundled):
    first = catalog.ingest(bundled)
    assert first.added == len(bundled.tasks) and first.rejected == 0
    again = catalog.ingest(bundled)
    assert again.added == 0 and again.unchanged == len(bundled.tasks)
    assert catalog.tasks().height == len(bundled.tasks)
    loaded = {t.id: t for t in catalog.load_tasks()}
    for t in bundled.tasks:
        assert loaded[t.id] == t  # the stored JSON round-trips to the same resolved task


def test_strict_batch_with_a_bad_spec_writes_nothing(catalog, bundled):
    bad = LoadResult(tasks=bundled.tasks, rejects=[
        Problem("specs/a/task.yaml", "id", "should match pattern"),
        Problem("specs/b/task.yaml", "verification", "needs 'tests' or at least one entry in 'checkpoints'"),
    ])
    with pytest.raises(BatchRejectedError) as info:
        catalog.ingest(bad, strict=True)
    assert len(info.value.problems) == 2  # every problem at once
    assert "specs/a/task.yaml: id" in str(info.value) and "specs/b/task.yaml: verification" in str(info.value)
    assert count(catalog, "tasks") == 0 and count(catalog, "rejects") == 0


def test_lenient_batch_keeps_good_tasks_and_rejects_together(catalog, bundled):
    mixed = LoadResult(tasks=bundled.tasks, rejects=[Problem("specs/x/task.yaml", "max_turns", "not an int")])
    summary = catalog.ingest(mixed)
    assert summary.added == len(bundled.tasks) and summary.rejected == 1
    assert catalog.rejects().select("source", "field", "reason").row(0) == ("specs/x/task.yaml", "max_turns",
                                                                          "not an int")


def test_schema_violation_rejects_the_whole_write(catalog, bundled):
    rows = task_rows(bundled.tasks, "b1")
    broken = rows.with_columns(
        pl.when(pl.col("task_id") == bundled.tasks[-1].id).then(pl.lit(0)).otherwise(pl.col("max_turns"))
        .alias("max_turns"))
    with pytest.raises(BatchRejectedError) as info:
        catalog.write({"tasks": broken})
    assert any(p.field == "max_turns" for p in info.value.problems)
    assert count(catalog, "tasks") == 0


def test_failure_mid_transaction_rolls_back(catalog, bundled, monkeypatch):
    """A crash after the first table is inserted leaves no trace of the batch."""
    real_insert = Catalog._insert

    def insert_then_crash(self, con, table, frame):
        real_insert(self, con, table, frame)
        if table == "rejects":
            raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(Catalog, "_insert", insert_then_crash)
    mixed = LoadResult(tasks=bundled.tasks, rejects=[Problem("x.yaml", "id", "bad")])
    with pytest.raises(RuntimeError):
        catalog.ingest(mixed)
    monkeypatch.undo()
    assert count(catalog, "tasks") == 0 and count(catalog, "rejects") == 0


def test_changed_task_is_a_new_version_and_old_is_kept(catalog, copy_spec):
    from envforge.sources.specs import load_spec_file

    spec_dir = copy_spec("orders-daily-summary")
    v1 = load_spec_file(spec_dir / "task.yaml")
    catalog.ingest(LoadResult(tasks=[v1]))
    (spec_dir / "workspace" / "CONTRACT.md").write_text("changed contract\n")
    v2 = load_spec_file(spec_dir / "task.yaml")
    catalog.ingest(LoadResult(tasks=[v2]))
    assert count(catalog, "tasks") == 2
    assert catalog.tasks()["content_hash"].to_list() == [v2.content_hash]


def test_task_set_version_is_content_addressed_and_exports(catalog, bundled, tmp_path):
    catalog.ingest(bundled)
    v1 = catalog.create_task_set("examples", bundled.tasks, {"gate": "x"})
    assert catalog.create_task_set("examples", list(reversed(bundled.tasks)), {"gate": "x"}) == v1
    assert catalog.create_task_set("examples", bundled.tasks, {"gate": "y"}) != v1
    assert catalog.create_task_set("examples", bundled.tasks[:1], {"gate": "x"}) != v1
    path = catalog.export_task_set(v1, tmp_path / "set.parquet")
    frame = pl.read_parquet(path)
    assert sorted(frame["task_id"]) == sorted(t.id for t in bundled.tasks)
    assert set(frame["task_set_version"]) == {v1}
    with pytest.raises(KeyError):
        catalog.export_task_set("0" * 64, tmp_path / "none.parquet")


def test_catalog_file_is_plain_duckdb(catalog, bundled):
    catalog.ingest(bundled)
    con = duckdb.connect(str(catalog.path), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM tasks").fetchone()[0] == len(bundled.tasks)
    finally:
        con.close()


def test_each_table_is_defined_once_by_its_pandera_model(catalog):
    """The DuckDB tables are created from the pandera models: same columns in the same order, same types,
    NOT NULL exactly where the model says not nullable, and the model's unique columns as the primary key."""
    from envforge.schemas import TABLE_SCHEMAS, duckdb_type, primary_key

    con = duckdb.connect(str(catalog.path), read_only=True)
    try:
        for table, model in TABLE_SCHEMAS.items():
            schema = model.to_schema()
            columns = con.execute("SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
                                  "WHERE table_name = ? ORDER BY column_index", [table]).fetchall()
            assert columns == [(name, duckdb_type(col.dtype.type), col.nullable)
                               for name, col in schema.columns.items()], table
            keys = con.execute("SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = ? "
                               "AND constraint_type = 'PRIMARY KEY'", [table]).fetchall()
            assert [k[0] for k in keys] == ([primary_key(table)] if primary_key(table) else []), table
    finally:
        con.close()
    assert primary_key("task_set_members") == ["version", "task_id"] and primary_key("tasks") == ["content_hash"]


def test_threads_of_one_process_open_and_close_the_catalog_at_once(catalog):
    """DuckDB's per-process instance cache fails a connect that races another thread's closing of the last
    connection ("Unique file handle conflict"), and two handles created at once replace the schema's views
    at once ("write-write conflict"); the service resolves tasks in threads, one per new session."""
    import threading

    errors: list[str] = []

    def work() -> None:
        for n in range(300):
            try:
                catalog.query("SELECT 1") if n % 10 else Catalog(catalog.path)
            except duckdb.Error as exc:
                errors.append(str(exc)[:200])

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
