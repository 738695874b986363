"""OpenEnv: openenv-core's clients (the typed EnvforgeEnv and the stock GenericEnvClient) play
envforge episodes over the service's /openenv/ws, and the example runs the tiny model through it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from openenv.core import GenericEnvClient

from envforge_client.adapters.openenv import EnvforgeAction, EnvforgeEnv

pytestmark = [pytest.mark.docker, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openenv_envforge.py"


def test_openenv_clients_play_an_episode_to_the_verified_reward(live_server, service_data):
    task = service_data.tasks["inventory-median-even"]
    with EnvforgeEnv(live_server.url, service_data.keys["team-a"]) as env:
        result = env.reset(task_id=task.id, seed=3)
        assert not result.done and result.reward is None and "inventory/stats.py" in result.observation.text
        assert {t["function"]["name"] for t in result.observation.tools} >= {"run", "submit"}
        result = env.step(EnvforgeAction(name="apply_patch", arguments={"patch": task.reference_patch}))
        assert result.observation.text.startswith("patch applied") and not result.done
        assert env.state()["turn"] == 1
        result = env.step(EnvforgeAction(text='<tool_call>{"name": "submit", "arguments": {}}</tool_call>'))
        assert result.done and result.reward == 1.0 and result.observation.result["resolved"]
        with pytest.raises(RuntimeError, match="has ended"):
            env.step(EnvforgeAction(name="run", arguments={"command": "true"}))
    # The stock generic client: no headers, so the key rides in the reset.
    with GenericEnvClient(base_url=live_server.url + "/openenv") as generic:
        with pytest.raises(RuntimeError, match="UNAUTHORIZED"):
            generic.reset(task_set="main", index=1)
        result = generic.reset(task_set="main", index=1, api_key=service_data.keys["team-b"], max_turns=1)
        result = generic.step({"name": "run", "arguments": {"command": "echo hi"}})
        assert result.done and result.reward == 0.0 and result.observation["end_reason"] == "max_turns"
    with EnvforgeEnv(live_server.url, "efk_000000000000_" + "x" * 43) as env:
        with pytest.raises(RuntimeError, match="UNAUTHORIZED"):
            env.reset(task_set="main", index=0)
    with EnvforgeEnv(live_server.url, service_data.keys["team-a"]) as env:
        with pytest.raises(RuntimeError, match="NOT_FOUND"):
            env.reset(task_set="private", index=0)


def test_the_openenv_example_runs_the_tiny_model(live_server, service_data, monkeypatch):
    monkeypatch.setenv("ENVFORGE_API_KEY", service_data.keys["team-b"])
    spec = importlib.util.spec_from_file_location("openenv_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    episodes = example.main(["--url", live_server.url, "--episodes", "1", "--max-turns", "2"])
    assert [e["task_id"] for e in episodes] == ["inventory-median-even"]
    assert episodes[0]["reward"] == 0.0 and 1 <= episodes[0]["turns"] <= 2 and episodes[0]["session_id"]
