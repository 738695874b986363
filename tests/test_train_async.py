"""Asynchronous GRPO: rollouts stream into the trainer through GroupStream while it updates.

Real sandboxes grade the chores; the policy is the tiny model, in-process (a copy reloaded from
each checkpoint) or behind `envforge policy serve` (reloaded through POST /v1/reload)."""

from __future__ import annotations

import asyncio
import os

import pytest

from envforge.rollout.trajectory import Trajectory

pytestmark = pytest.mark.docker


def _items(settings, n_tasks: int = 2):
    from envforge.demos.chores import chore_family
    from envforge.stages.base import StageContext
    from envforge.stages.images import ensure_images

    train, _ = chore_family(0, train_per_chore=1, held_out_per_chore=0)
    train = train[:n_tasks]
    return ensure_images(settings, train, context=StageContext()).items(train)


def _rounds(max_staleness: int):
    from envforge.train.config import TrainingConfig
    from envforge.train.loop import GRPORounds

    return GRPORounds.from_training(TrainingConfig(base_model="tiny:64x2", rl_rounds=3, group_size=2, tasks_per_round=0,
                                                   max_tokens=24, rl_lr=1e-3, max_staleness=max_staleness,
                                                   concurrency=4), pad_id=0)


def _check_versions(run, settings, rounds: int, max_staleness: int) -> None:
    from envforge.rollout.store import TrajectoryStore

    assert len(run.history) == rounds and len(run.batch_ids) == rounds
    for update, batch_id in enumerate(run.batch_ids):
        store = TrajectoryStore(settings.artifact_root("rollouts"), batch_id)
        versions = {t.policy_version for t in store.trajectories()}
        assert versions, batch_id
        # update u trains on groups sampled by versions u - max_staleness .. u, each recorded on the trajectory
        assert all(update - max_staleness <= v <= update for v in versions), (update, versions)
    assert 0.0 <= run.trainer_idle_fraction <= 1.0 and run.wall_s > run.trainer_busy_s > 0


def test_async_grpo_reloads_the_policy_per_update_and_bounds_staleness(settings):
    from envforge.train.loop import grpo_rounds, load_model

    items = _items(settings)
    model, tok = load_model("tiny:64x2", 0)
    run = grpo_rounds(settings, model, tok, items, _rounds(1), "async-test")
    _check_versions(run, settings, 3, 1)
    assert len(run.checkpoints) == 3 and all(os.path.isdir(p) for p in run.checkpoints)
    assert not run.stale_groups  # the producer's gate keeps every round within the bound
    assert any(m["policy_lag_mean"] > 0 for m in run.history[1:])  # some groups were sampled one version back
    assert all("ratio_mean" in m for m in run.history if m.get("samples", 0))
    # saving and reloading ran beside the trainer: update u's checkpoint is published after the update ended
    ends = [e["t"] for e in run.timeline if e["event"] == "update_end"]
    published = [e["t"] for e in run.timeline if e["event"] == "published"]
    assert len(published) == 3 and all(p >= u for p, u in zip(published, ends)) and run.publish_s > 0


def test_sync_grpo_samples_from_the_training_weights_and_waits_for_each_round(settings):
    """The naive schedule stays available and unchanged: every round is sampled by the current weights
    (policy version = update index), nothing is published, and each update starts after its round ended."""
    from dataclasses import replace

    from envforge.train.loop import grpo_rounds, load_model

    items = _items(settings, n_tasks=1)
    model, tok = load_model("tiny:64x2", 0)
    run = grpo_rounds(settings, model, tok, items, replace(_rounds(0), rounds=2), "sync-test")
    _check_versions(run, settings, 2, 0)
    assert not run.checkpoints and not [e for e in run.timeline if e["side"] == "publisher"]
    ends = {e["round"]: e["t"] for e in run.timeline if e["event"] == "round_end"}
    starts = {e["round"]: e["t"] for e in run.timeline if e["event"] == "round_start"}
    updates = {e["update"]: e["t"] for e in run.timeline if e["event"] == "update_start"}
    updated = {e["update"]: e["t"] for e in run.timeline if e["event"] == "update_end"}
    assert updates[0] >= ends[0] and starts[1] >= updated[0] and run.trainer_wait_s > 0


def test_async_grpo_through_a_served_policy_from_the_training_config(settings):
    """`TrainingConfig(rollout_policy="served")`, what `envforge train rl --rollout-policy served` and the
    Dagster training resource set: the loop starts an `envforge policy serve` process on the start weights
    (its own torch threads), pushes each update's checkpoint with /v1/reload, and the versions the server
    reports are the ones the trajectories record; the process is gone afterwards."""
    from dataclasses import replace

    from envforge.train.loop import grpo_rounds, load_model

    items = _items(settings)
    model, tok = load_model("tiny:64x2", 0)
    cfg = replace(_rounds(1), rollout_policy="served")
    run = grpo_rounds(settings, model, tok, items, cfg, "served-test")
    _check_versions(run, settings, 3, 1)
    published = [e["policy_version"] for e in run.timeline if e["event"] == "published"]
    assert published == [1, 2, 3]  # one /v1/reload per update, versions as the server counts them
    from envforge.rollout.store import TrajectoryStore

    trajs = TrajectoryStore(settings.artifact_root("rollouts"), run.batch_ids[-1]).trajectories()
    assert trajs and all(t.policy_id == "served-test@served" for t in trajs)
    log = settings.data_dir / "checkpoints" / "live-served-test-start.server.log"
    assert "POST /v1/reload" in log.read_text()


def test_stream_hands_over_each_rounds_fresh_groups():
    """Unit: `batches()` yields a round's groups once its end is marked, judging staleness against the
    trainer's version at hand-over (max_staleness 0: strictly on-policy)."""
    from envforge.rollout.stream import GroupStream

    version = {"v": 0}
    stream = GroupStream(max_staleness=0, current_version=lambda: version["v"])

    def traj(task: str, v: int) -> Trajectory:
        return Trajectory("b", task, "h", "", "p", v, 0, 0, "")

    async def go() -> list[tuple[str, list[str]]]:
        async def produce() -> None:
            await stream.put([traj("fresh", 0)])
            await stream.put([traj("old", 0)])
            await stream.end_batch("round-0")
            await stream.put([traj("stale", 0)])
            await stream.put([traj("current", 1)])
            await stream.end_batch("round-1")

        out = []
        producer = asyncio.create_task(stream.run(produce()))
        async for batch_id, groups in stream.batches():
            out.append((batch_id, [g[0].task_id for g in groups]))
            version["v"] += 1  # the trainer updates on each batch
        await producer
        return out

    assert asyncio.run(go()) == [("round-0", ["fresh", "old"]), ("round-1", ["current"])]
    assert [s["task_id"] for s in stream.stale] == ["stale"]
