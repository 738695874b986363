"""The catalog package's seams: a storage layer that imports no producer, one schema mechanism
(the DDL generated from the pandera models brings older catalogs up to date), and one `Catalog`."""

from __future__ import annotations

import ast
from datetime import datetime
from pathlib import Path

import duckdb
import pytest

import envforge.catalog
from envforge.catalog import Catalog
from envforge.catalog.base import CatalogBase
from envforge.schemas import TABLE_SCHEMAS, added_columns, duckdb_type

PACKAGE = Path(envforge.catalog.__file__).parent
# What a storage layer may build on; never the packages whose results it stores.
ALLOWED = {"envforge.catalog", "envforge.schemas", "envforge.task", "envforge.errors", "envforge.hashing",
           "envforge.config", "envforge.safefs"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_catalog_imports_only_the_storage_layer():
    modules = sorted(PACKAGE.glob("*.py"))
    assert {m.stem for m in modules} >= {"base", "tasks", "verdicts", "task_sets", "rollouts", "sessions"}
    for module in modules:
        own = {m for m in _imports(module) if m.startswith("envforge")}
        outside = {m for m in own if not any(m == a or m.startswith(a + ".") for a in ALLOWED)}
        assert not outside, f"{module.name} imports {sorted(outside)}"


def test_schema_sql_is_generated_only():
    """No hand-written migration beside the DDL: the models (schemas.ddl) are the one mechanism."""
    for module in PACKAGE.glob("*.py"):
        assert "ALTER TABLE" not in module.read_text().upper(), module.name


def test_every_group_method_is_on_the_one_catalog_class():
    groups = [cls for cls in Catalog.__mro__ if cls not in (Catalog, object)]
    public = {name for cls in groups for name in vars(cls) if not name.startswith("_")}
    assert public <= set(dir(Catalog))
    assert {"ingest", "record_validations", "create_task_set", "record_tiers", "record_rollout_batch",
            "record_service_sessions", "query", "write", "counts"} <= public
    assert all(issubclass(cls, CatalogBase) for cls in groups if cls is not CatalogBase)


def _older_table(table: str) -> tuple[str, list[str]]:
    """The CREATE TABLE of a catalog made before the table's trailing nullable columns existed."""
    schema = TABLE_SCHEMAS[table].to_schema()
    newer = {name for name, _ in added_columns(table)}
    old = [(n, c) for n, c in schema.columns.items() if n not in newer]
    cols = [f"{n} {duckdb_type(c.dtype.type)}{'' if c.nullable else ' NOT NULL'}" for n, c in old]
    return f"CREATE TABLE {table} ({', '.join(cols)})", [n for n, _ in old]


def test_an_older_catalog_is_brought_up_to_date_by_the_generated_ddl(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    for table in TABLE_SCHEMAS:
        if len(added_columns(table)) < len(TABLE_SCHEMAS[table].to_schema().columns):
            con.execute(_older_table(table)[0])
    sql, old_columns = _older_table("validations")
    assert "strength" not in old_columns and "admission" not in old_columns  # the columns that came later
    old_row = {"content_hash": "a" * 64, "task_id": "old-task", "verdict": "accepted", "disagreements": [],
               "runs": 3, "reference_passes": 3, "empty_fails": 3, "probes_json": "{}", "verifier_median_s": 0.5,
               "infra_retries": 0, "params_json": "{}", "mlflow_run_id": None, "dagster_run_id": None,
               "created_at": datetime(2026, 1, 1)}
    assert list(old_row) == old_columns
    con.execute(f"INSERT INTO validations VALUES ({', '.join('?' * len(old_row))})", list(old_row.values()))
    con.close()

    catalog = Catalog(path)

    con = duckdb.connect(str(path), read_only=True)
    try:
        for table, model in TABLE_SCHEMAS.items():
            columns = con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? "
                                  "ORDER BY column_index", [table]).fetchall()
            assert columns == [(n, duckdb_type(c.dtype.type)) for n, c in model.to_schema().columns.items()], table
    finally:
        con.close()
    row = catalog.query("SELECT * FROM validations").row(0, named=True)
    assert row["task_id"] == "old-task" and row["strength"] is None and row["admission"] is None
    assert catalog.audit_only(["a" * 64]) == set()
    Catalog(path)  # opening an up-to-date catalog again changes nothing
    assert catalog.counts()["validations"] == 1


def test_rows_written_after_the_upgrade_land_in_their_columns(tmp_path):
    """Inserts are positional: after the upgrade a frame of the model's columns lands in the right places."""
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute(_older_table("service_sessions")[0])
    con.close()
    catalog = Catalog(path)
    at = datetime(2026, 1, 1)
    catalog.record_service_sessions([{
        "session_id": "s1", "tenant": "t", "task_id": "a-task", "content_hash": "b" * 64,
        "task_set_version": "c" * 64, "seed": 0, "turns": 1, "verifies": 1, "reward": 1.0, "resolved": True,
        "end_reason": "submitted", "sandbox_seconds": 1.0, "started_at": at, "ended_at": at,
        "mlflow_run_id": "run-1"}])
    assert catalog.service_sessions("t").row(0, named=True)["mlflow_run_id"] == "run-1"


@pytest.mark.parametrize("name", ["Catalog", "IngestSummary", "UnknownTaskSetError", "task_rows"])
def test_public_names_stay_importable_from_the_package(name):
    assert hasattr(envforge.catalog, name)
