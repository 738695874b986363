"""The trajectory store: complete groups as parquet parts, written atomically, resumable.

Layout under the root (a local path or any fsspec URL), one folder per batch:

    <batch_id>/batch.json                 what the batch is (task set, policy, samples, seed)
    <batch_id>/part-<seq>-<id>.parquet    complete groups, validated by the pandera schema
    <batch_id>/pending/<task>__<n>.json   finished trajectories whose group is not complete yet
    <batch_id>/dropped/<task>.json        groups dropped after an exhausted retry budget

Every file appears whole (rename of a finished temporary file on disk, one PUT on S3-compatible
storage: `envforge.objectstore`), so a reader (or a resumed run) never sees half a trajectory,
and a group, being one parquet object, is committed all at once. A trajectory is in exactly one of pending/ or a part: parts are
written before their pending files are removed, and readers prefer the part. A resumed
run skips every trajectory already in a part or in pending/, so none is redone or duplicated.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any, Iterable

import pandera.errors
import polars as pl

from envforge.errors import BatchRejectedError, Problem
from envforge.objectstore import open_store, write_atomic, write_url
from envforge.rollout.trajectory import DroppedGroup, Trajectory, dumps, trajectory_id
from envforge.schemas import TrajectoryRow


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def trajectory_row(t: Trajectory) -> dict[str, Any]:
    return {
        "trajectory_id": t.trajectory_id,
        "batch_id": t.batch_id,
        "group_id": t.group_id,
        "task_id": t.task_id,
        "content_hash": t.content_hash,
        "task_set_version": t.task_set_version,
        "policy_id": t.policy_id,
        "policy_version": t.policy_version,
        "sample_index": t.sample_index,
        "seed": t.seed,
        "source": t.source,
        "instruction": t.instruction,
        "turns_json": dumps([t.__dict__ for t in t.turns]),
        "n_turns": len(t.turns),
        "n_tokens": t.n_tokens,
        "end_reason": t.end_reason,
        "final_diff": t.final_diff,
        "reward": float(t.reward),
        "resolved": bool(t.resolved),
        "verification_json": dumps(t.verification),
        "failure_reasons": list(t.failure_reasons),
        "infra_retries": t.infra_retries,
        "sandbox_json": dumps(t.sandbox),
        "timings_json": dumps(t.timings),
        "started_at": float(t.started_at),
        "duration_s": float(t.duration_s),
    }


def row_to_trajectory(row: dict[str, Any]) -> Trajectory:
    from envforge.rollout.trajectory import Turn

    return Trajectory(
        batch_id=row["batch_id"],
        task_id=row["task_id"],
        content_hash=row["content_hash"],
        task_set_version=row["task_set_version"],
        policy_id=row["policy_id"],
        policy_version=row["policy_version"],
        sample_index=row["sample_index"],
        seed=row["seed"],
        instruction=row["instruction"],
        turns=[Turn(**t) for t in json.loads(row["turns_json"])],
        end_reason=row["end_reason"],
        final_diff=row["final_diff"],
        reward=row["reward"],
        resolved=row["resolved"],
        verification=json.loads(row["verification_json"]),
        failure_reasons=list(row["failure_reasons"]),
        infra_retries=row["infra_retries"],
        sandbox=json.loads(row["sandbox_json"]),
        timings=json.loads(row["timings_json"]),
        started_at=row["started_at"],
        duration_s=row["duration_s"],
        source=row["source"],
    )


def trajectory_frame(trajectories: Iterable[Trajectory]) -> pl.DataFrame:
    schema = TrajectoryRow.to_schema()
    dtypes = {name: col.dtype.type for name, col in schema.columns.items()}
    return pl.DataFrame([trajectory_row(t) for t in trajectories], schema=dtypes)


class TrajectoryStore:
    """One batch's trajectories under `root` (path or fsspec URL)."""

    def __init__(self, root: str | Path, batch_id: str):
        self.root = str(root).rstrip("/")
        self.batch_id = batch_id
        self.fs, base = open_store(self.root)
        self.dir = f"{base}/{_safe(batch_id)}"  # folders appear with the first write

    # -- atomic files ----------------------------------------------------------------------

    def _write(self, path: str, data: bytes) -> None:
        write_atomic(self.fs, path, data)

    def _read_json(self, path: str) -> Any:
        with self.fs.open(path, "rb") as fh:
            return json.loads(fh.read())

    def _ls(self, sub: str, suffix: str) -> list[str]:
        try:
            names = self.fs.ls(self.dir + sub, detail=False)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.endswith(suffix))

    # -- manifest --------------------------------------------------------------------------

    def manifest(self) -> dict[str, Any] | None:
        path = f"{self.dir}/batch.json"
        return self._read_json(path) if self.fs.exists(path) else None

    def ensure_manifest(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Write the batch's manifest, or check a resumed run matches the one on disk."""
        existing = self.manifest()
        if existing is None:
            self._write(f"{self.dir}/batch.json", dumps(manifest).encode())
            return manifest
        fixed = ("task_set_version", "policy_id", "n_samples", "seed")
        clash = {k: (existing.get(k), manifest.get(k)) for k in fixed if existing.get(k) != manifest.get(k)}
        if clash:
            raise ValueError(f"batch {self.batch_id} exists with different settings {clash}; use a new batch id")
        return existing

    # -- writing ---------------------------------------------------------------------------

    def _pending_path(self, task_id: str, sample: int) -> str:
        return f"{self.dir}/pending/{_safe(task_id)}__{sample}.json"

    def save_pending(self, t: Trajectory) -> None:
        self._write(self._pending_path(t.task_id, t.sample_index), dumps(t.to_json()).encode())

    def write_group(self, trajectories: list[Trajectory]) -> str:
        """Validate and write one or more complete groups as a parquet part; returns its path."""
        frame = trajectory_frame(trajectories)
        try:
            TrajectoryRow.validate(frame, lazy=True)
        except pandera.errors.SchemaErrors as err:
            raise BatchRejectedError(
                [
                    Problem(f"trajectories of {self.batch_id}", str(r.get("column") or ""), str(r.get("check")))
                    for r in err.failure_cases.to_dicts()
                ]
            ) from None
        buf = io.BytesIO()
        frame.write_parquet(buf)
        seq = len(self._ls("", ".parquet"))
        path = f"{self.dir}/part-{seq:05d}-{uuid.uuid4().hex[:8]}.parquet"
        self._write(path, buf.getvalue())
        for t in trajectories:
            self.fs.rm(self._pending_path(t.task_id, t.sample_index)) if self.fs.exists(
                self._pending_path(t.task_id, t.sample_index)
            ) else None
        return path

    def record_dropped(self, group: DroppedGroup) -> None:
        self._write(f"{self.dir}/dropped/{_safe(group.task_id)}.json", dumps(group.to_json()).encode())
        for n in group.completed_samples:
            path = self._pending_path(group.task_id, n)
            if self.fs.exists(path):
                self.fs.rm(path)

    # -- reading ---------------------------------------------------------------------------

    def frame(self) -> pl.DataFrame:
        """Every stored trajectory (complete groups only), one row each."""
        parts = self._ls("", ".parquet")
        if not parts:
            return trajectory_frame([])
        frames = []
        for p in parts:
            with self.fs.open(p, "rb") as fh:
                frames.append(pl.read_parquet(fh.read()))
        return pl.concat(frames).unique("trajectory_id", keep="first", maintain_order=True)

    def trajectories(self) -> list[Trajectory]:
        return [row_to_trajectory(r) for r in self.frame().iter_rows(named=True)]

    def pending(self) -> list[Trajectory]:
        stored = set(self.frame()["trajectory_id"])
        out = []
        for p in self._ls("/pending", ".json"):
            t = Trajectory.from_json(self._read_json(p))
            if t.trajectory_id not in stored:
                out.append(t)
        return out

    def dropped(self) -> list[DroppedGroup]:
        return [DroppedGroup(**self._read_json(p)) for p in self._ls("/dropped", ".json")]

    def finished_ids(self) -> set[str]:
        """Trajectory ids a resumed run must not redo: stored, pending, or in a dropped group."""
        ids = set(self.frame()["trajectory_id"]) | {t.trajectory_id for t in self.pending()}
        manifest = self.manifest() or {}
        for g in self.dropped():
            ids |= {trajectory_id(self.batch_id, g.task_id, n) for n in range(int(manifest.get("n_samples", 0)))}
        return ids

    # -- export ----------------------------------------------------------------------------

    def export_jsonl(self, path: str | Path) -> int:
        rows = self.trajectories()
        text = "".join(dumps({"trajectory_id": t.trajectory_id, **t.to_json()}) + "\n" for t in rows)
        write_url(str(path), text.encode("utf-8"))
        return len(rows)

    def export_verl(
        self,
        path: str | Path,
        service_url: str = "",
        splits: dict[str, str] | None = None,
        max_turns: dict[str, int] | None = None,
    ) -> int:  # splits by task id, max_turns by content hash
        """verl's multi-turn RL data, one row per task of the batch (see `envforge.rollout.verl_export`);
        returns the number of rows."""
        from envforge.rollout.verl_export import verl_rows, write_verl_parquet

        return write_verl_parquet(verl_rows(self.trajectories(), service_url, splits, max_turns), path)
