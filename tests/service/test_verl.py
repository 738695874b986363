"""verl: the export is read the way verl's RLHFDataset reads it (datasets' parquet loader, the chat
template over `prompt`, `extra_info` lookups), and verl's reward function grades responses on the
live service. verl itself does not install beside this stack (it pins its own torch/vLLM)."""

from __future__ import annotations

import json

import datasets
import pytest

from envforge.rollout.store import TrajectoryStore
from envforge.rollout.trajectory import Trajectory
from envforge.rollout.actions import TOOLS
from envforge.rollout.policies.tiny import build_tokenizer

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _batch(tmp_path, service_data) -> TrajectoryStore:
    store = TrajectoryStore(tmp_path / "rollouts", "b-verl")
    group = []
    for task in service_data.tasks.values():
        for n, resolved in enumerate((True, False)):
            group.append(Trajectory(batch_id="b-verl", task_id=task.id, content_hash=task.content_hash,
                                    task_set_version=service_data.main_version, policy_id="replay", policy_version=0,
                                    sample_index=n, seed=n, instruction=task.spec.instruction, source="spec",
                                    reward=float(resolved), resolved=resolved))
    store.write_group(group)
    return store


def test_the_export_loads_like_verl_and_the_reward_function_grades_on_the_service(tmp_path, live_server,
                                                                                  service_data, monkeypatch):
    store = _batch(tmp_path, service_data)
    path = tmp_path / "train.parquet"
    assert store.export_verl(path, live_server.url, {"inventory-median-even": "eval"}) == 2

    # verl: datasets.load_dataset("parquet", data_files=...)["train"], then per row doc["prompt"] through
    # the chat template, extra_info.get("index"/"tools_kwargs"/...), reward_model["ground_truth"].
    frame = datasets.load_dataset("parquet", data_files=str(path), cache_dir=str(tmp_path / "hf"))["train"]
    assert len(frame) == 2
    assert set(frame.column_names) >= {"data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"}
    row = frame[0]
    assert row["data_source"] == "envforge/spec" and row["agent_name"] == "tool_agent"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert "<tool_call>" in row["prompt"][0]["content"] and '"apply_patch"' in row["prompt"][0]["content"]
    assert row["prompt"][1]["content"].startswith("The reorder report")
    assert json.loads(row["tools"]) == TOOLS
    tokenizer = build_tokenizer()
    enc = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
    assert len(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc) > 50
    info = row["extra_info"]
    assert info["index"] == 0 and info["split"] == "eval" and info.get("tools_kwargs", {}) == {}
    assert info["service_url"] == live_server.url and info["batch_pass_rate"] == 0.5 and info["batch_samples"] == 2
    truth = json.loads(row["reward_model"]["ground_truth"])
    task = service_data.tasks["inventory-median-even"]
    assert truth == {"task_id": task.id, "content_hash": task.content_hash,
                     "task_set_version": service_data.main_version}

    from envforge_client.adapters.verl_reward import compute_score

    monkeypatch.setenv("ENVFORGE_API_KEY", service_data.keys["team-a"])
    call = json.dumps({"name": "apply_patch", "arguments": {"patch": task.reference_patch}})
    solved = compute_score(row["data_source"], f"Fixing it.<tool_call>{call}</tool_call>\n<tool_response>\npatch "
                           "applied\n</tool_response>\n<tool_call>{\"name\": \"submit\", \"arguments\": {}}"
                           "</tool_call>", row["reward_model"]["ground_truth"], info)
    assert solved == {"score": 1.0, "resolved": True, "steps": 2, "submitted": True, "reasons": ""}
    unsolved = compute_score(row["data_source"], "I give up.", row["reward_model"]["ground_truth"], info)
    assert unsolved["score"] == 0.0 and not unsolved["submitted"] and "test_failed" in unsolved["reasons"]
    monkeypatch.setenv("ENVFORGE_API_KEY", "")
    with pytest.raises(RuntimeError, match="ENVFORGE_API_KEY"):
        compute_score(row["data_source"], "", row["reward_model"]["ground_truth"], info)
