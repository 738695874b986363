"""pandera (polars) schemas for every catalog table: the one definition of each table.

Frames are checked against them before they are written, and the DuckDB tables are created
from them (`ddl`): column order, types and NOT NULL come from the model, and the primary key is
what the model declares unique (a column's `unique=True`, or `Config.unique` for several). So
`INSERT ... SELECT *` from a validated frame cannot shift columns, and the two cannot drift.
"""

from __future__ import annotations

from datetime import datetime

import pandera.polars as pa
import polars as pl

from envforge.task import TASK_ID_PATTERN as TASK_ID
from envforge.tier_names import SPLITS, TIERS

SHA256 = r"^[0-9a-f]{64}$"


class _Table(pa.DataFrameModel):
    """Every catalog table: exactly these columns, in this order."""

    class Config:
        strict = True
        ordered = True


class TaskRow(_Table):
    content_hash: str = pa.Field(str_matches=SHA256, unique=True)
    task_id: str = pa.Field(str_matches=TASK_ID)
    source: str = pa.Field(str_length={"min_value": 1})
    origin: str
    instruction: str = pa.Field(str_length={"min_value": 1})
    tags: list[str]
    max_turns: int = pa.Field(ge=1)
    reference_kind: str = pa.Field(isin=["patch", "commands"])
    n_fail_to_pass: int = pa.Field(ge=0)
    n_pass_to_pass: int = pa.Field(ge=0)
    n_checkpoints: int = pa.Field(ge=0)
    task_json: str
    ingested_at: datetime
    batch_id: str


class RejectRow(_Table):
    batch_id: str
    source_kind: str
    source: str = pa.Field(str_length={"min_value": 1})
    field: str
    reason: str = pa.Field(str_length={"min_value": 1})
    rejected_at: datetime


class ImageRow(_Table):
    task_id: str = pa.Field(str_matches=TASK_ID)
    content_hash: str = pa.Field(str_matches=SHA256)
    image: str = pa.Field(str_matches=r"^[a-z0-9./_-]+:[A-Za-z0-9._-]+$")
    cache_hit: bool
    seconds: float = pa.Field(ge=0)
    size_mb: float = pa.Field(ge=0, nullable=True)
    built_at: datetime


class RunRow(_Table):
    """One graded solution (reference, empty, or a policy's) of one task."""

    run_id: str = pa.Field(unique=True)
    task_id: str = pa.Field(str_matches=TASK_ID)
    content_hash: str = pa.Field(str_matches=SHA256)
    solution: str = pa.Field(str_length={"min_value": 1})
    reward: float = pa.Field(ge=0, le=1)
    resolved: bool
    reasons: list[str]
    tests_json: str
    checkpoints_json: str
    patch_method: str = pa.Field(nullable=True)
    duration_s: float = pa.Field(ge=0)
    image: str
    mlflow_run_id: str = pa.Field(nullable=True)
    dagster_run_id: str = pa.Field(nullable=True)
    created_at: datetime


class ValidationRow(_Table):
    """One flakiness-gate verdict for one task version."""

    content_hash: str = pa.Field(str_matches=SHA256)
    task_id: str = pa.Field(str_matches=TASK_ID)
    verdict: str = pa.Field(isin=["accepted", "quarantined"])
    disagreements: list[str]
    runs: int = pa.Field(ge=0)  # reference runs graded: 0 when its own commands failed
    reference_passes: int = pa.Field(ge=0)
    empty_fails: int = pa.Field(ge=0)
    probes_json: str
    verifier_median_s: float = pa.Field(ge=0)
    infra_retries: int = pa.Field(ge=0)
    params_json: str
    mlflow_run_id: str = pa.Field(nullable=True)
    dagster_run_id: str = pa.Field(nullable=True)
    created_at: datetime
    image_digest: str = pa.Field(nullable=True)  # the task image's id when it was gated
    gate_key: str = pa.Field(nullable=True)  # content hash + image digest + gate params + verifier code
    stats_json: str = pa.Field(nullable=True)  # gradings run, skipped probes, sandbox and wall seconds, strength
    strength: float = pa.Field(nullable=True, ge=0, le=1)  # killed / non-equivalent mutants (None: not measured)
    admission: str = pa.Field(nullable=True, isin=["audit"])  # "audit": the audit split only (a weak verifier)


class QualityRow(_Table):
    """A task version's decontamination and dedup verdict."""

    content_hash: str = pa.Field(str_matches=SHA256)
    task_id: str = pa.Field(str_matches=TASK_ID)
    status: str = pa.Field(isin=["clean", "contaminated", "duplicate"])
    corpus: str = pa.Field(nullable=True)
    doc_id: str = pa.Field(nullable=True)
    est_jaccard: float = pa.Field(ge=0, le=1)
    exact_jaccard: float = pa.Field(ge=0, le=1)
    longest_shared_ngram: int = pa.Field(ge=0)
    duplicate_of: str = pa.Field(nullable=True)
    nearest_task_jaccard: float = pa.Field(ge=0, le=1)
    reason: str
    params_json: str
    created_at: datetime
    field: str = pa.Field(nullable=True)  # the task field of the strongest evidence
    evidence_json: str = pa.Field(nullable=True)  # every field's evidence, the workspace scan, the semantic stage


class TaskSetLineageRow(_Table):
    version: str = pa.Field(str_matches=SHA256, unique=True)
    parent_version: str = pa.Field(nullable=True)
    sources_json: str
    gates_json: str
    removed_json: str


class TaskSetRow(_Table):
    version: str = pa.Field(str_matches=SHA256, unique=True)
    name: str = pa.Field(str_length={"min_value": 1})
    n_tasks: int = pa.Field(ge=0)
    params_json: str
    created_at: datetime


class TaskSetMemberRow(_Table):
    version: str = pa.Field(str_matches=SHA256)
    task_id: str = pa.Field(str_matches=TASK_ID)
    content_hash: str = pa.Field(str_matches=SHA256)

    class Config:
        unique = ["version", "task_id"]


class SourceLoadRow(_Table):
    """One ingest of one source: which task versions it yielded. A source's latest load is what is live."""

    source_key: str = pa.Field(str_length={"min_value": 1})
    source_kind: str = pa.Field(isin=["spec", "runbook", "swebench", "ticket", "review", "history"])
    batch_id: str
    fingerprint: str
    task_hashes: list[str]
    n_rejects: int = pa.Field(ge=0)
    loaded_at: datetime
    cursor: str = pa.Field(nullable=True)  # a history source's branch head at this load (where the next one starts)
    statements: str = pa.Field(nullable=True)  # the statement policy the load applied (strict | flag | off)


class TrajectoryRow(_Table):
    """One stored rollout trajectory (rollout/store.py parquet parts, not a catalog table)."""

    trajectory_id: str = pa.Field(unique=True)
    batch_id: str = pa.Field(str_length={"min_value": 1})
    group_id: str
    task_id: str = pa.Field(str_matches=TASK_ID)
    content_hash: str = pa.Field(str_matches=SHA256)
    task_set_version: str
    policy_id: str = pa.Field(str_length={"min_value": 1})
    policy_version: int = pa.Field(ge=0)
    sample_index: int = pa.Field(ge=0)
    seed: int = pa.Field(ge=0)
    source: str
    instruction: str
    turns_json: str
    n_turns: int = pa.Field(ge=0)
    n_tokens: int = pa.Field(ge=0)
    end_reason: str = pa.Field(isin=["submitted", "max_turns", "trajectory_timeout", "no_action"])
    final_diff: str
    reward: float = pa.Field(ge=0, le=1)
    resolved: bool
    verification_json: str
    failure_reasons: list[str]
    infra_retries: int = pa.Field(ge=0)
    sandbox_json: str
    timings_json: str
    started_at: float
    duration_s: float = pa.Field(ge=0)


class RolloutBatchRow(_Table):
    """A rollout batch registered in the catalog: where its trajectories are and what it holds."""

    batch_id: str = pa.Field(str_length={"min_value": 1})
    task_set_version: str
    policy_id: str
    location: str
    n_tasks: int = pa.Field(ge=0)
    n_samples: int = pa.Field(ge=1)
    n_trajectories: int = pa.Field(ge=0)
    n_dropped_groups: int = pa.Field(ge=0)
    pass_at_1: float = pa.Field(ge=0, le=1)
    metrics_json: str
    created_at: datetime


class TaskTierRow(_Table):
    """A task's difficulty tier and split within a tiered task set."""

    version: str = pa.Field(str_matches=SHA256)
    task_id: str = pa.Field(str_matches=TASK_ID)
    content_hash: str = pa.Field(str_matches=SHA256)
    source: str
    tier: str = pa.Field(isin=list(TIERS))
    method: str = pa.Field(isin=["pass@k", "static"])
    solved: int = pa.Field(ge=0)
    k: int = pa.Field(ge=0)
    score: float
    split: str = pa.Field(isin=list(SPLITS))
    policy_id: str


class ServiceSessionRow(_Table):
    """One finished session of the environment service (envforge.service)."""

    session_id: str = pa.Field(unique=True)
    tenant: str
    task_id: str = pa.Field(str_matches=TASK_ID)
    content_hash: str = pa.Field(str_matches=SHA256)
    task_set_version: str = pa.Field(str_matches=SHA256)
    seed: int = pa.Field(ge=0)
    turns: int = pa.Field(ge=0)
    verifies: int = pa.Field(ge=0)
    reward: float = pa.Field(nullable=True)
    resolved: bool = pa.Field(nullable=True)
    end_reason: str = pa.Field(
        isin=["submitted", "max_turns", "trajectory_timeout", "deleted", "idle_timeout", "lost", "shutdown"]
    )
    sandbox_seconds: float = pa.Field(ge=0)
    started_at: datetime
    ended_at: datetime
    mlflow_run_id: str = pa.Field(nullable=True)


TABLE_SCHEMAS: dict[str, type[pa.DataFrameModel]] = {
    "tasks": TaskRow,
    "rejects": RejectRow,
    "images": ImageRow,
    "runs": RunRow,
    "validations": ValidationRow,
    "quality": QualityRow,
    "task_set_lineage": TaskSetLineageRow,
    "task_sets": TaskSetRow,
    "task_set_members": TaskSetMemberRow,
    "source_loads": SourceLoadRow,
    "rollout_batches": RolloutBatchRow,
    "task_tiers": TaskTierRow,
    "service_sessions": ServiceSessionRow,
}

_DUCKDB_TYPES = {
    pl.String: "VARCHAR",
    pl.Int64: "BIGINT",
    pl.Float64: "DOUBLE",
    pl.Boolean: "BOOLEAN",
    pl.Datetime: "TIMESTAMP",
}


def duckdb_type(dtype: pl.DataType) -> str:
    """The DuckDB column type of a polars dtype (lists of a type become that type's array)."""
    if isinstance(dtype, pl.List):
        return duckdb_type(dtype.inner) + "[]"
    for polars_type, sql in _DUCKDB_TYPES.items():
        if dtype == polars_type or isinstance(dtype, polars_type):
            return sql
    raise TypeError(f"no DuckDB type for {dtype!r}")


def primary_key(table: str) -> list[str]:
    schema = TABLE_SCHEMAS[table].to_schema()
    return list(schema.unique or []) or [name for name, col in schema.columns.items() if col.unique]


def ddl(table: str) -> str:
    """CREATE TABLE IF NOT EXISTS for a catalog table, from its pandera model (and ADD COLUMN for the
    columns it gained since, `added_columns`)."""
    schema = TABLE_SCHEMAS[table].to_schema()
    columns = [
        f"{name} {duckdb_type(col.dtype.type)}{'' if col.nullable else ' NOT NULL'}"
        for name, col in schema.columns.items()
    ]
    key = primary_key(table)
    if key:
        columns.append(f"PRIMARY KEY ({', '.join(key)})")
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (\n    "
        + ",\n    ".join(columns)
        + ");"
        + "".join(
            f"\nALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {duckdb_type(col.dtype.type)};"
            for name, col in added_columns(table)
        )
    )


def added_columns(table: str) -> list[tuple[str, pa.Column]]:
    """The nullable columns at the end of a model: how a table gains columns. A catalog made before
    them gets them appended (inserts are positional, so new columns only ever go at the end)."""
    columns = list(TABLE_SCHEMAS[table].to_schema().columns.items())
    n = len(columns)
    while n and columns[n - 1][1].nullable:
        n -= 1
    return columns[n:]
