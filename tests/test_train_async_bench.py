"""bench/train_async.py --preset demo, in its shortest form: the paired comparison of the GRPO schedules
on the learning demo runs end to end on real sandboxes, and every mode starts from the same SFT weights.

It asserts the document's structure and the pairing, not a score or a timing (the full preset's
figures are in docs/training.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[1]
MODES = ("sync", "async")  # the served policy's loop is tested in test_train_async.py; here it would add ~20 s


def test_demo_preset_pairs_every_mode_on_the_same_sft_weights(tmp_path, docker_client):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "train_async.py"), "--preset", "demo", "--quick",
                           "--seeds", "0", "--modes", ",".join(MODES), "--demo-rl-epochs-per-batch", "2",
                           "--demo-rl-lr", "1e-4", "--demo-eval-samples", "1", "--data-dir", str(tmp_path / "data"),
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == doc
    training = doc["config"]["learning_demo"]["training"]
    assert training["rl_epochs_per_batch"] == 2 and training["rl_lr"] == 1e-4  # the update's cost, for every mode
    assert doc["config"]["learning_demo"]["eval_samples"] == 1  # not quick()'s 2: the option reaches the run
    assert doc["preset"] == "demo" and len(doc["load_average_before"]) == 3 and len(doc["load_average_after"]) == 3
    (seed,) = doc["per_seed"]
    assert seed["seed"] == 0 and seed["train_tasks"] == 8 and seed["held_out_tasks"] == 4
    assert 0 < seed["operator_slips"] < seed["operator_logs"] == 8
    assert set(seed["runs"]) == set(MODES)
    # the pairing: every mode started from the SFT weights, bit for bit (restored after the previous mode)
    assert len(seed["sft_weights_sha256"]) == 64
    assert {r["start_weights_sha256"] for r in seed["runs"].values()} == {seed["sft_weights_sha256"]}
    assert all(len(r["end_weights_sha256"]) == 64 for r in seed["runs"].values())
    after_sft = seed["held_out_after_sft"]
    assert 0.0 <= after_sft["pass_at_1_sampled"] <= 1.0 and 0.0 <= after_sft["pass_at_1"] <= 1.0
    held_out_samples = seed["held_out_tasks"] * doc["config"]["learning_demo"]["eval_samples"]
    assert sum(after_sft["sampled_outcomes"].values()) == held_out_samples
    for mode, run in seed["runs"].items():
        assert run["max_staleness"] == (0 if mode == "sync" else 1)
        assert run["rollout_policy"] == ("served" if mode == "async-served" else "in-process")
        assert run["updates"] == 2.0 and len(run["rollout_mean_reward"]) == 2 and len(run["profile"]["rounds"]) == 2
        assert 0.0 <= run["trainer_idle_fraction"] <= 1.0 and run["wall_s"] > run["trainer_busy_s"] > 0
        assert 0.0 <= run["held_out_sampled_pass_at_1_after_grpo"] <= 1.0
        assert run["sampled_gain_over_sft"] == pytest.approx(
            run["held_out_sampled_pass_at_1_after_grpo"] - after_sft["pass_at_1_sampled"])
        assert sum(run["sampled_outcomes_after_grpo"].values()) == held_out_samples
    summary = doc["summary"]
    assert set(summary["per_mode"]) == set(MODES) and set(summary["paired_vs_sync"]) == set(MODES) - {"sync"}
    for mode in set(MODES) - {"sync"}:
        paired = summary["paired_vs_sync"][mode]
        diff = paired["held_out_sampled_pass_at_1_after_grpo_minus_sync"]
        assert diff["per_seed"] == [pytest.approx(seed["runs"][mode]["held_out_sampled_pass_at_1_after_grpo"]
                                                  - seed["runs"]["sync"]["held_out_sampled_pass_at_1_after_grpo"])]
        assert diff["min"] <= diff["mean"] <= diff["max"]
        assert paired["wall_over_sync"]["median"] == pytest.approx(
            seed["runs"][mode]["wall_s"] / seed["runs"]["sync"]["wall_s"], abs=1e-4)
        assert paired["idle_fraction_over_sync"]["median"] is not None


def test_demo_preset_refuses_the_schedule_presets_training_options():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "train_async.py"), "--preset", "demo",
                           "--rounds", "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--rounds" in proc.stderr and "DEMO_TRAINING" in proc.stderr


def test_sft_weights_snapshot_restores_bit_identical_weights_after_an_update():
    """The bench's restore between modes (`weights_snapshot`, then `load_state_dict`), checked by the
    digest it records: an optimizer step changes the digest, the restore brings it back exactly."""
    import torch

    from envforge.train.checkpoint import weights_digest, weights_snapshot
    from envforge.train.loop import load_model

    model, _ = load_model("tiny:64x2", 0)
    snapshot, digest = weights_snapshot(model), weights_digest(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert weights_digest(model) != digest
    model.load_state_dict(snapshot)
    assert weights_digest(model) == digest
    assert weights_digest(load_model("tiny:64x2", 1)[0]) != digest  # another init, another digest


def test_each_mode_trains_with_its_schedule_and_the_null_mode_only_changes_the_rollout_seeds():
    """sync-reseed is the null the schedules are compared against: synchronous like sync, same everything
    but the seed its rollouts (and task sample) follow."""
    import argparse
    import importlib.util
    from dataclasses import replace

    from envforge.train.config import DEMO_TRAINING

    spec = importlib.util.spec_from_file_location("bench_train_async", REPO / "bench" / "train_async.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    a = argparse.Namespace(max_staleness=1, policy_threads=0, trainer_threads=0)
    training = replace(DEMO_TRAINING, seed=2)
    assert bench.mode_training(training, "sync", a) == training
    assert bench.mode_training(training, "sync-reseed", a) == replace(training, seed=2 + bench.RESEED)
    assert bench.mode_training(training, "async", a) == replace(training, max_staleness=1)
    assert bench.mode_training(training, "async-served", a) == replace(training, max_staleness=1,
                                                                       rollout_policy="served")
