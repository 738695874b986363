"""verl: the export is read the way verl's RLHFDataset reads it (datasets' parquet loader, the chat
template over `prompt`, `extra_info` lookups), and the single-turn reward function grades responses on
the live service by replay. verl itself does not install beside this stack (it pins transformers <5.11):
the multi-turn rollout through verl's own agent-loop code runs in its own venv (.venv-verl,
tools/trainer_venv.py), driven by tests/service/verl_rollout.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import datasets
import httpx
import pytest

from envforge.rollout.actions import TOOLS
from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model, build_tokenizer, save_pretrained_dir
from envforge.rollout.store import TrajectoryStore
from envforge.rollout.trajectory import Trajectory
from tests.service.conftest import LiveServer, free_port
from tools.trainer_venv import ensure, isolated_env

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
    assert row["data_source"] == "envforge/spec" and row["agent_name"] == "envforge_agent"
    loop_source = (REPO / "clients/python/src/envforge_client/adapters/verl_agent_loop.py").read_text()
    assert 'AGENT_NAME = "envforge_agent"' in loop_source  # the name the loop registers (it imports verl)
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

    from envforge_client.adapters.verl_reward import compute_score, compute_score_by_replay

    with pytest.raises(ValueError, match="no 'envforge' session result"):  # rows not rolled out by envforge_agent
        compute_score(row["data_source"], "I give up.", row["reward_model"]["ground_truth"], info)
    monkeypatch.setenv("ENVFORGE_API_KEY", service_data.keys["team-a"])
    call = json.dumps({"name": "apply_patch", "arguments": {"patch": task.reference_patch}})
    solved = compute_score_by_replay(row["data_source"], f"Fixing it.<tool_call>{call}</tool_call>\n<tool_response>"
                                     "\npatch applied\n</tool_response>\n<tool_call>{\"name\": \"submit\", "
                                     "\"arguments\": {}}</tool_call>", row["reward_model"]["ground_truth"], info)
    assert solved == {"score": 1.0, "resolved": True, "steps": 2, "submitted": True, "reasons": ""}
    unsolved = compute_score_by_replay(row["data_source"], "I give up.", row["reward_model"]["ground_truth"], info)
    assert unsolved["score"] == 0.0 and not unsolved["submitted"] and "test_failed" in unsolved["reasons"]
    monkeypatch.setenv("ENVFORGE_API_KEY", "")
    with pytest.raises(RuntimeError, match="ENVFORGE_API_KEY"):
        compute_score_by_replay(row["data_source"], "", row["reward_model"]["ground_truth"], info)


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def verl_python() -> Path:
    """The verl venv's python, built once by tools/trainer_venv.py (about 7 minutes from the network, then cached)."""
    return ensure("verl")


def _rollout(verl_python: Path, server: LiveServer, data: Path, model: Path, key: str, *mode: str) -> dict:
    done = subprocess.run([str(verl_python), str(REPO / "tests" / "service" / "verl_rollout.py"), str(data),
                           str(model), *mode], capture_output=True, text=True, timeout=900,
                          env={**isolated_env(), "ENVFORGE_API_KEY": key}, check=False)
    if done.returncode != 0:
        pytest.fail(f"verl's rollout failed:\n{done.stderr[-6000:]}\nthe service's log:\n{server.stop()[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    return save_pretrained_dir(model, tok, tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture()
def own_server(service_data):
    """A service of this test's own, so a failure can show the service's log."""
    server = LiveServer(service_data).start()
    yield server
    server.stop()


def test_verl_runs_the_envforge_agent_loop_multi_turn_on_the_service(tmp_path, own_server, service_data,
                                                                     verl_python, tiny_checkpoint):
    """verl's AgentLoopWorker runs the exported rows through the envforge_agent loop (one session per
    trajectory); the batch reward manager scores them from the sessions' results. The model's replies
    come from a script per task: one solves its task over three turns (a command, the reference patch,
    submit), the other answers without a call."""
    store = _batch(tmp_path, service_data)
    data = tmp_path / "train.parquet"
    store.export_verl(data, own_server.url)
    solved, unsolved = (service_data.tasks[t] for t in ("inventory-median-even", "ops-service-config"))
    call = lambda name, **arguments: f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"  # noqa: E731
    script = {solved.spec.instruction.strip()[:60]: ["Let me look." + call("run", command="ls"),
                                                      call("apply_patch", patch=solved.reference_patch),
                                                      call("submit")],
              unsolved.spec.instruction.strip()[:60]: ["I give up."]}
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(script))

    out = _rollout(verl_python, own_server, data, tiny_checkpoint, service_data.keys["team-a"], "--replies", str(replies))
    rows = {r["task_id"]: r for r in out["rows"]}
    win, loss = rows[solved.id], rows[unsolved.id]
    assert win["agent_name"] == loss["agent_name"] == "envforge_agent"
    # three assistant turns and three tool turns (the last: submit's answer), one count for the prompt: the
    # model read `ls`'s output and the patch's result as tool turns, masked out of its own tokens
    assert win["num_turns"] == 7, win
    assert win["model_text"].count("<tool_call>") == 3 and "<tool_response>" not in win["model_text"]
    assert win["observation_text"].count("<tool_response>") == 3 and "inventory" in win["observation_text"]
    assert win["session"]["score"] == 1.0 and win["session"]["resolved"] and win["session"]["submitted"]
    assert win["session"]["steps"] == 3 and win["session"]["end_reason"] == "submitted" and win["reward"] == 1.0
    assert win["has_logprobs"]
    assert loss["num_turns"] == 2 and loss["session"]["steps"] == 0 and loss["session"]["end_reason"] == "unfinished"
    assert not loss["session"]["submitted"] and loss["observation_text"] == ""
    assert loss["reward"] == 0.0 and "checkpoint_failed:service-healthy" in loss["session"]["reasons"]
    # verl's reward loop scored each trajectory with compute_score (rm_scores) and logged the results; its
    # batch reward manager gets the same from compute_score_batch
    assert sorted(out["reward_extra_info"]["resolved"]) == ["False", "True"]
    assert sorted(s["score"] for s in out["batch_scores"]) == [0.0, 1.0]
    print(f"verl generate_sequences, 2 trajectories: {out['generate_s']} s")


@pytest.fixture()
def policy_server(tiny_checkpoint, tmp_path):
    """`envforge policy serve` on the tiny checkpoint: an OpenAI-compatible server taking token-id prompts."""
    port = free_port()
    log = tmp_path / "policy.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "envforge"), "policy", "serve", str(tiny_checkpoint),
                                 "--port", str(port), "--threads", "1"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(30)


def test_verl_runs_the_envforge_agent_loop_with_a_served_model(tmp_path, own_server, service_data, verl_python,
                                                              tiny_checkpoint, policy_server):
    """The same rollout with the tiny model generating on `envforge policy serve` (token ids in, token ids
    and logprobs out, as verl asks vLLM): whatever it writes, each trajectory gets a verified session
    whose score is the reward verl records."""
    store = _batch(tmp_path, service_data)
    data = tmp_path / "train.parquet"
    store.export_verl(data, own_server.url)
    out = _rollout(verl_python, own_server, data, tiny_checkpoint, service_data.keys["team-a"],
                   "--server", policy_server, "--max-tokens", "24")
    assert len(out["rows"]) == 2
    for row in out["rows"]:
        assert row["agent_name"] == "envforge_agent" and row["has_logprobs"] and row["model_text"]
        assert row["num_turns"] >= 2 and row["session"]["session_id"] and row["session"]["reasons"]
        assert row["reward"] == row["session"]["score"] == 0.0  # a random model solves nothing
    assert [s["score"] for s in out["batch_scores"]] == [0.0, 0.0]
