"""OpenEnv 0.3 against a real `envforge service serve` with real sandboxes: openenv-core's own clients
(the typed EnvforgeEnv, the stock GenericEnvClient and MCPToolClient over /openenv/ws, MCPToolClient
over HTTP MCP at /openenv/mcp), the HTTP routes OpenEnv's server has (/reset, /step, /state,
/health, /schema, /metadata), `mcp` messages on the WebSocket, and openenv.core.harness driving
episodes (a scripted model to the verified reward, the tiny model through the TRL rollout_func)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest
from openenv.core import GenericEnvClient
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.harness import HarnessRunLimits, MCPHarnessAdapter, ModelStepResult, build_harness_rollout_func
from openenv.core.llm_client import LLMResponse, ToolCall
from openenv.core.mcp_client import MCPToolClient
from websockets.sync.client import connect as ws_connect

from envforge_client.adapters.openenv import EnvforgeAction, EnvforgeEnv, EnvforgeMCPClient, EnvforgeSessionFactory

pytestmark = [pytest.mark.docker, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openenv_envforge.py"
BAD_KEY = "efk_000000000000_" + "x" * 43


def test_openenv_clients_play_an_episode_to_the_verified_reward(live_server, service_data):
    task = service_data.tasks["inventory-median-even"]
    with EnvforgeEnv(live_server.url, service_data.keys["team-a"]).sync() as env:
        result = env.reset(task_id=task.id, seed=3, episode_id="ep-7")
        assert not result.done and result.reward is None and "inventory/stats.py" in result.observation.text
        assert {t["function"]["name"] for t in result.observation.tools} >= {"run", "submit"}
        assert result.observation.episode_id == "ep-7"
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step(EnvforgeAction())  # neither a tool nor text
        result = env.step(EnvforgeAction(name="apply_patch", arguments={"patch": task.reference_patch}))
        assert result.observation.text.startswith("patch applied") and not result.done
        state = env.state()
        assert state["turn"] == state["step_count"] == 1 and state["episode_id"] == "ep-7"
        result = env.step(EnvforgeAction(text='<tool_call>{"name": "submit", "arguments": {}}</tool_call>'))
        assert result.done and result.reward == 1.0 and result.observation.result["resolved"]
        with pytest.raises(RuntimeError, match="has ended"):
            env.step(EnvforgeAction(name="run", arguments={"command": "true"}))
    # The stock generic client: no headers, so the key rides in the reset.
    with GenericEnvClient(base_url=live_server.url + "/openenv").sync() as generic:
        with pytest.raises(RuntimeError, match="UNAUTHORIZED"):
            generic.reset(task_set="main", index=1)
        result = generic.reset(task_set="main", index=1, api_key=service_data.keys["team-b"], max_turns=1)
        result = generic.step({"name": "run", "arguments": {"command": "echo hi"}})
        assert result.done and result.reward == 0.0 and result.observation["end_reason"] == "max_turns"
    with EnvforgeEnv(live_server.url, BAD_KEY).sync() as env:
        with pytest.raises(RuntimeError, match="UNAUTHORIZED"):
            env.reset(task_set="main", index=0)
    with EnvforgeEnv(live_server.url, service_data.keys["team-a"]).sync() as env:
        with pytest.raises(RuntimeError, match="NOT_FOUND"):
            env.reset(task_set="private", index=0)


def test_the_stock_mcp_tool_client_plays_over_websocket(live_server, service_data):
    task = service_data.tasks["inventory-median-even"]
    with MCPToolClient(base_url=live_server.url + "/openenv").sync() as env:
        env.reset(task_id=task.id, api_key=service_data.keys["team-a"])
        assert {t.name for t in env.list_tools()} >= {"run", "apply_patch", "submit"}
        out = env.call_tool("apply_patch", patch=task.reference_patch)
        assert out["text"].startswith("patch applied") and out["turn"] == 1 and not out["done"]
        result = env.step(CallToolAction(tool_name="submit"))
        assert result.done and result.reward == 1.0
        assert result.observation.result["data"]["verification"]["resolved"]


def test_mcp_messages_on_the_websocket(live_server, service_data):
    task = service_data.tasks["inventory-median-even"]
    headers = {"Authorization": f"Bearer {service_data.keys['team-a']}"}

    def rpc(ws, method, **params):
        ws.send(json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}}))
        answer = json.loads(ws.recv(timeout=120))
        assert answer["type"] == "mcp"
        return answer["data"]

    with ws_connect(live_server.url.replace("http", "ws") + "/openenv/ws", additional_headers=headers) as ws:
        assert {t["name"] for t in rpc(ws, "tools/list")["result"]["tools"]} >= {"run", "submit"}
        assert "reset" in rpc(ws, "tools/call", name="run", arguments={"command": "ls"})["error"]["message"]
        ws.send(json.dumps({"type": "reset", "data": {"task_id": task.id}}))
        assert json.loads(ws.recv(timeout=120))["type"] == "observation"
        out = rpc(ws, "tools/call", name="apply_patch", arguments={"patch": task.reference_patch})["result"]
        assert out["content"][0]["text"].startswith("patch applied") and not out["isError"]
        out = rpc(ws, "tools/call", name="submit")["result"]
        assert out["data"]["done"] and out["data"]["reward"] == 1.0
        assert rpc(ws, "no/such")["error"]["code"] == -32601


def test_mcp_over_http_plays_an_episode(live_server, service_data):
    task = service_data.tasks["inventory-median-even"]
    key = service_data.keys["team-a"]
    env = EnvforgeMCPClient(live_server.url, key, {"task_id": task.id}).sync()
    try:
        assert {t.name for t in env.list_tools()} >= {"run", "apply_patch", "submit"}
        assert env.call_tool("apply_patch", patch=task.reference_patch)["text"].startswith("patch applied")
        out = env.call_tool("submit")
        assert out["done"] and out["reward"] == 1.0 and out["verification"]["resolved"]
        session_id = env.async_client._production_session_id
    finally:
        env.close()
    gone = httpx.get(f"{live_server.url}/sessions/{session_id}", headers={"Authorization": f"Bearer {key}"})
    assert gone.status_code in (404, 410)  # openenv/session/close deleted it
    with pytest.raises(httpx.HTTPStatusError, match="401"):
        EnvforgeMCPClient(live_server.url, BAD_KEY, {"task_id": task.id}).sync().call_tool("submit")
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "run", "arguments": {}, "session_id": "nope"}}
    answer = httpx.post(f"{live_server.url}/openenv/mcp", json=call, headers={"Authorization": f"Bearer {key}"})
    assert answer.json()["error"]["code"] == -32602 and "no session nope" in answer.json()["error"]["message"]


def test_the_openenv_http_routes(live_server, service_data):
    task = service_data.tasks["inventory-median-even"]
    base = live_server.url + "/openenv"
    with httpx.Client(base_url=base, timeout=120) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        assert http.get("/metadata").json()["name"] == "envforge"
        schema = http.get("/schema").json()
        assert {"name", "arguments", "text", "tool_call", "type", "tool_name"} <= set(schema["action"]["properties"])
        assert set(EnvforgeAction.model_fields) <= set(schema["action"]["properties"])
        assert {"episode_id", "step_count"} <= set(schema["state"]["properties"])
        assert http.post("/reset", json={"task_id": task.id}).status_code == 401
        http.headers["Authorization"] = f"Bearer {service_data.keys['team-a']}"
        assert http.post("/reset", json={"task_set": "private", "index": 0}).status_code == 404
        reset = http.post("/reset", json={"task_id": task.id, "seed": 1})
        assert reset.status_code == 200 and reset.json()["done"] is False
        sid = reset.json()["observation"]["session_id"]
        assert http.post("/step", json={"action": {"bogus": 1}, "session_id": sid}).status_code == 422
        assert http.post("/step", json={"action": {"name": "run"}, "session_id": "nope"}).status_code == 404
        tools = http.post("/step", json={"action": {"type": "list_tools"}}).json()["observation"]["tools"]
        assert {t["name"] for t in tools} >= {"submit"}
        step = http.post("/step", json={"action": {"name": "apply_patch", "arguments": {"patch": task.reference_patch}},
                                        "session_id": sid}).json()
        assert step["observation"]["text"].startswith("patch applied") and step["done"] is False
        state = http.get("/state", params={"session_id": sid}).json()
        assert state["episode_id"] == sid and state["step_count"] == 1
        step = http.post("/step", json={"action": {"name": "submit"}, "session_id": sid}).json()
        assert step["done"] and step["reward"] == 1.0 and step["observation"]["result"]["resolved"]
        again = http.post("/step", json={"action": {"name": "submit"}, "session_id": sid})
        assert again.status_code == 400 and "has ended" in again.json()["error"]["message"]
        assert http.delete(f"{live_server.url}/sessions/{sid}").status_code == 200


def _scripted(patch: str):
    """A ModelStep that applies the reference patch, then submits."""
    replies = iter([("apply_patch", {"patch": patch}), ("submit", {})])

    def model_step(messages, tools, sampling):
        name, args = next(replies)
        return ModelStepResult(response=LLMResponse(content="", tool_calls=[ToolCall(id=name, name=name, args=args)]),
                               prompt_ids=[1], completion_ids=[2], logprobs=[0.0])

    return model_step


def test_openenv_harness_drives_envforge_sessions(live_server, service_data):
    task = service_data.tasks["inventory-median-even"]
    factory = EnvforgeSessionFactory(live_server.url, service_data.keys["team-a"])
    rollout = build_harness_rollout_func(
        session_factory=factory,
        harness_adapter=MCPHarnessAdapter(),
        model_step_builder=lambda trainer, session: _scripted(task.reference_patch),
        limits=HarnessRunLimits(max_turns=4),
    )
    out = rollout([{"task_id": task.id}], None)
    assert out["env_reward"] == [1.0] and out["completion_ids"] == [[2, 2]]
    # A model that stops without submitting still gets the verifier's reward (verify submits).
    silent = lambda trainer, session: (lambda m, t, s: ModelStepResult(response=LLMResponse(content="done")))  # noqa: E731
    out = build_harness_rollout_func(session_factory=factory, harness_adapter=MCPHarnessAdapter(),
                                     model_step_builder=silent)([task.id], None)
    assert out["env_reward"] == [0.0]


def test_the_openenv_example_runs_the_tiny_model(live_server, service_data, monkeypatch):
    monkeypatch.setenv("ENVFORGE_API_KEY", service_data.keys["team-b"])
    spec = importlib.util.spec_from_file_location("openenv_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    episodes = example.main(["--url", live_server.url, "--episodes", "1", "--max-turns", "2"])
    assert [e["task_id"] for e in episodes] == ["inventory-median-even"]
    assert episodes[0]["reward"] == 0.0 and 1 <= episodes[0]["turns"] <= 2 and episodes[0]["session_id"]


def test_the_example_through_the_openenv_harness(live_server, service_data, monkeypatch):
    monkeypatch.setenv("ENVFORGE_API_KEY", service_data.keys["team-b"])
    spec = importlib.util.spec_from_file_location("openenv_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    episodes = example.main(["--url", live_server.url, "--episodes", "1", "--max-turns", "2", "--harness"])
    assert len(episodes) == 1 and episodes[0]["reward"] == 0.0  # the random tiny model does not solve it
    assert episodes[0]["completion_tokens"] > 0 and episodes[0]["completion_tokens"] == episodes[0]["logprobs"]
