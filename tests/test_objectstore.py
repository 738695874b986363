"""Trajectories, task-set parquet and reports on S3-compatible storage: a real S3 API (moto's
server mode on loopback, authentication on), reached through fsspec/s3fs as production would."""

from __future__ import annotations

import threading

import polars as pl
import pytest

from envforge.config import Settings
from envforge.objectstore import S3Settings, StoreConfigError, open_store, publish, read_url, write_url
from envforge.rollout.store import TrajectoryStore
from envforge.rollout.trajectory import DroppedGroup, Trajectory, Turn, sample_seed


def _traj(task: str, n: int, batch: str = "b1") -> Trajectory:
    return Trajectory(batch_id=batch, task_id=task, content_hash="a" * 64, task_set_version="v1", policy_id="replay",
                      policy_version=0, sample_index=n, seed=sample_seed(0, task, n), instruction="do it",
                      turns=[Turn(0, "", [], {"name": "submit"}, None, "submitted", None, 0.001, 0.002)],
                      reward=1.0, resolved=True, source="spec")


def test_trajectory_store_on_s3_commits_whole_groups_and_resumes(s3_bucket):
    root = f"s3://{s3_bucket}/rollouts"
    store = TrajectoryStore(root, "b1")
    store.ensure_manifest({"task_set_version": "v1", "policy_id": "replay", "n_samples": 2, "seed": 0})
    store.save_pending(_traj("task-a", 0))
    store.write_group([_traj("task-b", 0), _traj("task-b", 1)])
    store.record_dropped(DroppedGroup("b1", "task-c", "budget", {0: 4}, []))

    # A second process (a resumed dispatcher, a trainer) sees exactly what was committed.
    again = TrajectoryStore(root, "b1")
    assert sorted(again.frame()["trajectory_id"]) == ["b1/task-b/0", "b1/task-b/1"]
    assert [t.trajectory_id for t in again.pending()] == ["b1/task-a/0"]
    assert [g.task_id for g in again.dropped()] == ["task-c"]
    assert again.finished_ids() >= {"b1/task-a/0", "b1/task-b/0", "b1/task-c/0", "b1/task-c/1"}
    with pytest.raises(ValueError, match="different settings"):
        again.ensure_manifest({"task_set_version": "v2", "policy_id": "replay", "n_samples": 2, "seed": 0})
    # Completing task-a's group removes its pending file; no temporary object is ever left behind.
    again.write_group([again.pending()[0], _traj("task-a", 1)])
    fs, base = open_store(root)
    names = fs.find(f"{base}/b1")
    assert not [n for n in names if ".tmp" in n]
    assert not [n for n in names if "/pending/" in n]
    assert again.frame().height == 4


def test_a_concurrent_reader_never_sees_part_of_a_group(s3_bucket):
    root = f"s3://{s3_bucket}/rollouts"
    writer = TrajectoryStore(root, "big")
    group_size, groups = 4, 4
    seen: list[int] = []
    done = threading.Event()

    def read_until_done() -> None:
        reader = TrajectoryStore(root, "big")
        while not done.is_set():
            frame = reader.frame()
            seen.append(frame.height)
            if frame.height:
                sizes = frame.group_by("task_id").len()["len"].to_list()
                assert all(s == group_size for s in sizes), sizes

    thread = threading.Thread(target=read_until_done)
    thread.start()
    try:
        for g in range(groups):
            writer.write_group([_traj(f"task-{g}", n, "big") for n in range(group_size)])
    finally:
        done.set()
        thread.join()
    assert all(h % group_size == 0 for h in seen)
    assert TrajectoryStore(root, "big").frame().height == group_size * groups


def test_reports_and_task_set_parquet_are_published_to_the_store(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVFORGE_STORE_URL", f"s3://{s3_bucket}/envforge/")
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    assert settings.artifact_root("rollouts") == f"s3://{s3_bucket}/envforge/rollouts"
    local = tmp_path / "tasks-v1.parquet"
    pl.DataFrame({"task_id": ["a", "b"]}).write_parquet(local)
    url = publish(settings.store_url, "task_sets", local)
    assert url == f"s3://{s3_bucket}/envforge/task_sets/tasks-v1.parquet"
    fs, base = open_store(settings.store_url)
    with fs.open(f"{base}/task_sets/tasks-v1.parquet", "rb") as fh:
        assert pl.read_parquet(fh.read())["task_id"].to_list() == ["a", "b"]
    write_url(f"s3://{s3_bucket}/envforge/reports/latest.html", b"<html>ok</html>")
    assert read_url(f"s3://{s3_bucket}/envforge/reports/latest.html") == b"<html>ok</html>"
    assert publish(None, "reports", local) is None


def test_the_task_set_stage_publishes_its_parquet_under_the_store_url(s3_bucket, tmp_path, monkeypatch):
    from envforge.catalog import Catalog
    from envforge.sources import load_specs
    from envforge.stages.configs import TaskSetConfig
    from envforge.stages.task_set import Lineage, publish_task_set
    from tests.conftest import BUNDLED_SPECS

    monkeypatch.setenv("ENVFORGE_STORE_URL", f"s3://{s3_bucket}/envforge")
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    loaded = load_specs([BUNDLED_SPECS])
    Catalog(settings.catalog_path).ingest(loaded, source_kind="spec")
    result = publish_task_set(settings, TaskSetConfig(name="s3"), loaded.tasks, Lineage())
    assert result.published == f"s3://{s3_bucket}/envforge/task_sets/{result.parquet.name}"
    assert result.artifacts()["task_set.json"]["published"] == result.published
    assert read_url(result.published) == result.parquet.read_bytes()


def test_missing_or_wrong_credentials_and_a_missing_bucket_fail_at_start_naming_the_setting(s3_server, s3_bucket):
    endpoint, key, secret = s3_server
    url = f"s3://{s3_bucket}/rollouts"
    with pytest.raises(StoreConfigError, match="AWS_SECRET_ACCESS_KEY is not set"):
        open_store(url, S3Settings(endpoint_url=endpoint, key=key), check=True)
    with pytest.raises(StoreConfigError, match="no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        open_store(url, S3Settings(endpoint_url=endpoint), check=True)
    with pytest.raises(StoreConfigError, match="refused.*AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"):
        open_store(url, S3Settings(endpoint_url=endpoint, key="AKIAWRONGWRONGWRONG1", secret="nope"), check=True)
    with pytest.raises(StoreConfigError, match="refused"):
        open_store(url, S3Settings(endpoint_url=endpoint, key=key, secret="wrong-secret"), check=True)
    with pytest.raises(StoreConfigError, match="bucket 'no-such-bucket-20' does not exist"):
        open_store("s3://no-such-bucket-20/x", S3Settings(endpoint_url=endpoint, key=key, secret=secret), check=True)
    with pytest.raises(StoreConfigError, match="ENVFORGE_S3_ENDPOINT_URL"):
        open_store(url, S3Settings(endpoint_url="http://127.0.0.1:9", key=key, secret=secret), check=True)
    fs, path = open_store(url, S3Settings(endpoint_url=endpoint, key=key, secret=secret), check=True)
    assert path == f"{s3_bucket}/rollouts"
