"""Rollout pieces without Docker: action parsing, seeds, the trajectory store's atomic parts,
pending files, dropped groups, resume bookkeeping and exports."""

from __future__ import annotations

import json

import polars as pl
import pytest

from envforge.rollout.actions import (MAX_ACTION_BYTES, ActionError, ApplyPatch, ReadFile, Run, Submit, WriteFile,
                                      parse_text, parse_tool_call, to_text, to_tool_call)
from envforge.rollout.store import TrajectoryStore
from envforge.rollout.trajectory import DroppedGroup, Trajectory, Turn, sample_seed


@pytest.mark.parametrize("action", [Run("ls -la"), Run("sleep 1", timeout_s=5), ReadFile("a/b.py"),
                                    WriteFile("x.txt", "hi\n"), ApplyPatch("--- a/x\n+++ b/x\n"), Submit()])
def test_actions_round_trip_as_tool_calls_and_text(action):
    assert parse_tool_call(to_tool_call(action, "call_1")) == action
    assert parse_text("thinking...\n" + to_text(action) + "\ntrailing") == action


@pytest.mark.parametrize("bad, words", [
    ("I will just fix it.", "no action found"),
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    ('<tool_call>["run"]</tool_call>', "JSON object"),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool"),
    ('<tool_call>{"name": "run", "arguments": {}}</tool_call>', "needs argument"),
    ('<tool_call>{"name": "run", "arguments": {"command": 3}}</tool_call>', "wrong type"),
    ('<tool_call>{"name": "run", "arguments": {"command": "ls", "sudo": true}}</tool_call>', "does not take"),
    ('<tool_call>{"name": "run", "arguments": {"command": "ls", "timeout_s": true}}</tool_call>', "wrong type"),
    ('<tool_call>{"name": "run", "arguments": {"command": "ls", "timeout_s": -1}}</tool_call>', "timeout_s"),
    ('<tool_call>{"name": "read_file", "arguments": {"path": ""}}</tool_call>', "non-empty"),
    ('<tool_call>{"name": "run", "arguments": {"command": "  "}}</tool_call>', "non-empty command"),
])
def test_malformed_text_actions_are_errors_for_the_model(bad, words):
    with pytest.raises(ActionError, match=words):
        parse_text(bad)


def test_malformed_and_oversized_tool_calls():
    with pytest.raises(ActionError, match="'function' member"):
        parse_tool_call({"name": "run"})
    with pytest.raises(ActionError, match="not valid JSON"):
        parse_tool_call({"type": "function", "function": {"name": "run", "arguments": "{oops"}})
    huge = {"type": "function", "function": {"name": "write_file",
                                             "arguments": json.dumps({"path": "x", "content": "a" * (MAX_ACTION_BYTES + 1)})}}
    with pytest.raises(ActionError, match="byte limit"):
        parse_tool_call(huge)
    with pytest.raises(ActionError, match="too long"):
        parse_text("x" * (4 * MAX_ACTION_BYTES + 1))


def test_sample_seeds_do_not_depend_on_order():
    assert sample_seed(0, "t", 1) == sample_seed(0, "t", 1)
    assert len({sample_seed(0, "t", n) for n in range(100)}) == 100
    assert sample_seed(1, "t", 0) != sample_seed(0, "t", 0)


def _traj(task: str, n: int, batch: str = "b1", reward: float = 1.0) -> Trajectory:
    return Trajectory(batch_id=batch, task_id=task, content_hash="a" * 64, task_set_version="v1", policy_id="replay",
                      policy_version=0, sample_index=n, seed=sample_seed(0, task, n), instruction="do it",
                      turns=[Turn(0, "", [], {"name": "submit"}, None, "submitted", None, 0.001, 0.002,
                                  token_ids=[1, 2], logprobs=[-0.1, -0.2])],
                      reward=reward, resolved=reward == 1.0, source="spec")


def test_store_writes_groups_atomically_and_resumes_without_duplicates(tmp_path):
    store = TrajectoryStore(tmp_path / "rollouts", "b1")
    store.ensure_manifest({"task_set_version": "v1", "policy_id": "replay", "n_samples": 2, "seed": 0})
    store.save_pending(_traj("task-a", 0))
    assert [t.trajectory_id for t in store.pending()] == ["b1/task-a/0"]
    assert store.frame().height == 0
    store.write_group([_traj("task-a", 0), _traj("task-a", 1)])
    assert store.pending() == [] and store.frame().height == 2
    # A crash between writing the part and removing pending files: the part wins, no duplicates.
    store.save_pending(_traj("task-a", 1))
    assert store.pending() == [] and store.frame().height == 2
    store.record_dropped(DroppedGroup("b1", "task-b", "sample 1: retry budget exhausted", {0: 1, 1: 4}, [0]))
    assert store.finished_ids() == {"b1/task-a/0", "b1/task-a/1", "b1/task-b/0", "b1/task-b/1"}
    # Nothing temporary is left, and every part validates.
    files = sorted(p.name for p in (tmp_path / "rollouts" / "b1").rglob("*") if p.is_file())
    assert not [f for f in files if ".tmp-" in f]
    again = TrajectoryStore(tmp_path / "rollouts", "b1")
    [t0, t1] = again.trajectories()
    assert t0.turns[0].logprobs == [-0.1, -0.2] and t1.sample_index == 1
    with pytest.raises(ValueError, match="different settings"):
        again.ensure_manifest({"task_set_version": "v2", "policy_id": "replay", "n_samples": 2, "seed": 0})


def test_store_rejects_invalid_rows_and_exports(tmp_path):
    from envforge.errors import BatchRejectedError

    store = TrajectoryStore(tmp_path, "b2")
    with pytest.raises(BatchRejectedError):
        store.write_group([_traj("task-a", 0, batch="b2", reward=3.0)])
    assert store.frame().height == 0
    store.write_group([_traj("task-a", 0, batch="b2"), _traj("task-a", 1, batch="b2", reward=0.0)])
    assert store.export_jsonl(tmp_path / "out.jsonl") == 2
    assert json.loads((tmp_path / "out.jsonl").read_text().splitlines()[1])["reward"] == 0.0
    assert store.export_verl(tmp_path / "verl.parquet") == 1  # one row per task (verl samples its own rollouts)
    verl = pl.read_parquet(tmp_path / "verl.parquet")
    assert verl.columns == ["data_source", "agent_name", "prompt", "tools", "ability", "reward_model", "extra_info"]
    assert verl["reward_model"][0]["style"] == "rule" and verl["extra_info"][0]["batch_pass_rate"] == 0.5


def test_store_works_on_an_fsspec_url(tmp_path):
    store = TrajectoryStore(f"file://{tmp_path}/remote", "b3")
    store.write_group([_traj("task-a", 0, batch="b3")])
    assert TrajectoryStore(f"file://{tmp_path}/remote", "b3").frame().height == 1


def test_group_stream_yields_complete_groups_and_skips_stale_ones():
    import asyncio

    from envforge.rollout.stream import GroupStream

    version = {"v": 0}
    stream = GroupStream(max_staleness=1, current_version=lambda: version["v"])

    def group(task: str, policy_version: int) -> list[Trajectory]:
        out = [_traj(task, n) for n in range(2)]
        for t in out:
            t.policy_version = policy_version
        return out

    async def produce() -> str:
        for i in range(4):
            await stream.put(group(f"task-{i}", policy_version=0))
            await asyncio.sleep(0)
        return "done"

    async def consume() -> tuple[list[str], str]:
        seen = []
        producer = asyncio.create_task(stream.run(produce()))
        async for g in stream:
            seen.append(g[0].task_id)
            version["v"] += 1  # the trainer steps after every group
        return seen, await producer

    seen, result = asyncio.run(consume())
    assert result == "done"
    assert seen == ["task-0", "task-1"]  # after two updates, version-0 groups are 2 behind
    assert [s["task_id"] for s in stream.stale] == ["task-2", "task-3"]
    with pytest.raises(ValueError):
        GroupStream(max_staleness=-1)


def test_pass_at_k_and_tiers():
    from envforge.rollout.tiers import pass_at_k, tier_for

    assert pass_at_k(8, 0, 1) == 0.0 and pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    assert pass_at_k(8, 2, 8) == 1.0 and pass_at_k(8, 1, 4) == pytest.approx(0.5)
    assert [tier_for(c, 8) for c in range(9)] == ["unsolved", "hard", "hard", "medium", "medium", "medium",
                                                  "easy", "easy", "trivial"]
    with pytest.raises(ValueError):
        tier_for(0, 0)


def test_static_tiers_and_stratified_split_keep_every_stratum_on_both_sides():
    from envforge.rollout.tiers import TierRow, static_tiers, stratified_split
    from envforge.sources import load_sources
    from tests.conftest import REPO

    tasks = [t for r in load_sources([REPO / "task_sources" / "specs", REPO / "task_sources" / "runbooks"]).values()
             for t in r.tasks]
    rows = static_tiers(tasks)
    assert {r.method for r in rows} == {"static"} and {r.tier for r in rows} <= {"easy", "medium", "hard"}
    assert len(rows) == len(tasks) == 8
    synthetic = [TierRow(f"t{i:02d}", "a" * 64, src, tier, "pass@k", 2, 8, 0.25)
                 for i, (src, tier) in enumerate([(s, t) for s in ("spec", "ticket") for t in ("hard", "easy")
                                                  for _ in range(5)])]
    synthetic.append(TierRow("t99", "a" * 64, "spec", "unsolved", "pass@k", 0, 8, 0.0))
    split = stratified_split(synthetic, eval_fraction=0.2, seed=3)
    assert {r.split for r in split if r.tier == "unsolved"} == {"audit"}
    for src in ("spec", "ticket"):
        for tier in ("hard", "easy"):
            members = [r for r in split if r.source == src and r.tier == tier]
            assert sorted(r.split for r in members) == ["eval", "train", "train", "train", "train"]
    assert split == stratified_split(synthetic, eval_fraction=0.2, seed=3)  # deterministic
    assert split != stratified_split(synthetic, eval_fraction=0.2, seed=4)


def test_opening_a_missing_batch_creates_nothing(tmp_path):
    store = TrajectoryStore(tmp_path / "rollouts", "no-such-batch")
    assert store.manifest() is None and store.frame().height == 0 and store.pending() == []
    assert not (tmp_path / "rollouts").exists()
