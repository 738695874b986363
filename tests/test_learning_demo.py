"""The learning demo, shortened: the whole loop runs on CPU with real sandboxes and writes its figures.

The test asserts the mechanics (figures present and in range, SFT loss going down, a
checkpoint that loads, the curve, the registered model), not a tuned score: the full demo's
figures are reported in docs/training.md whatever they are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]  # about 70 s


def test_learning_demo_runs_end_to_end(tmp_path, docker_client):
    data = tmp_path / "data"
    envforge = os.path.join(os.path.dirname(sys.executable), "envforge")
    proc = subprocess.run([envforge, "train", "demo", "--quick", "--json", "--data-dir", str(data)],
                          capture_output=True, text=True, timeout=1200, env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    on_disk = json.loads((data / "learning_demo.json").read_text())
    assert on_disk["pass_at_1_before"] == doc["pass_at_1_before"]
    for key in ("pass_at_1_before", "pass_at_1_after_sft", "pass_at_1_after_grpo", "pass_at_1_sampled_before",
                "pass_at_1_sampled_after_sft", "pass_at_1_sampled_after_grpo"):
        assert 0.0 <= doc[key] <= 1.0 and doc["spread"][key]["min"] <= doc[key] <= doc["spread"][key]["max"]
    assert doc["seeds"] == [0] and len(doc["per_seed"]) == 1
    seed = doc["per_seed"][0]
    assert doc["train_tasks"] == 8 and doc["held_out_tasks"] == 4 and doc["sft_turns"] == 16
    assert seed["operator_logs"] == 8 and 0 < seed["operator_slips"] < 8  # the logs hold slips, kept as recorded
    assert doc["sft_final_loss"] < doc["sft_first_loss"]
    assert len(seed["grpo_metrics"]) == 2 and seed["grpo_timing"]["updates"] == 2.0
    assert doc["complete"] and len(seed["grpo_mixed_group_fraction"]) == 2
    assert all(0.0 <= f <= 1.0 for f in seed["grpo_mixed_group_fraction"])
    # the diagnosis: what every sampled held-out rollout's first command was, per phase
    for phase in ("before", "after_sft", "after_grpo"):
        assert sum(seed["sampled_outcomes"][phase].values()) == doc["held_out_tasks"] * doc["eval_samples"]
    assert {"sft", "grpo", "eval_before"} <= set(seed["phase_seconds"])
    assert seed["promotion"]["promoted"]  # the first registered version takes `best`
    assert os.path.getsize(doc["chart"]) > 10_000
    from envforge.rollout.policies.hf import HFPolicy
    policy = HFPolicy(doc["checkpoint"])  # the final checkpoint serves
    assert policy.generate([{"role": "user", "content": "hi"}], None, seed=0, max_tokens=4).token_ids
