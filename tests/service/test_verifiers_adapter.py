"""verifiers' own evaluation entry point (`vf-eval`, verifiers 0.4) plays envforge tasks: the
`envforge-verifiers` environment against a real `envforge service serve` (real sandboxes), in the
verifiers venv (tools/trainer_venv.py: built once, ~4 min here, reused while its requirements hold).

Every rollout is one service session, and the trace's reward is the service's recorded grade of it:
with `envforge policy serve` on a tiny random model (text replies, cut at the turn cap) the grades name
the same failing tests as a grade of the untouched task; with a scripted model that answers with
native tool calls (the reference patch, then submit) the task with a reference patch is resolved (1.0)
and the other is not. Nothing is left open."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from envforge_client import Client as EnvforgeClient
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from envforge.catalog import Catalog
from tests.service.conftest import LiveServer, ServiceData, create_key
from tests.service.test_security import _containers_of
from tests.serving import running_server
from tests.test_policy_serve import KEY as POLICY_KEY
from tests.test_policy_serve import ckpt, server  # noqa: F401  (fixtures: the tiny model and its server)
from tools.trainer_venv import ensure, isolated_env

pytestmark = [pytest.mark.docker, pytest.mark.slow]
MAX_TURNS = 2


@pytest.fixture(scope="module")
def vf_bin() -> Path:
    return ensure("verifiers").parent


def _vf_eval(
    vf_bin: Path,
    live: LiveServer,
    policy_url: str,
    api_key: str,
    out: Path,
    max_turns: int = MAX_TURNS,
    check: bool = True,
) -> list[dict[str, Any]]:
    """`vf-eval envforge-verifiers` over the task set "main"; the episodes of its traces.jsonl."""
    env = isolated_env()
    # the venv's bin first: verifiers' subprocess runtime finds `uv` on PATH to run its chat program
    env |= {"PATH": f"{vf_bin}:{env.get('PATH', '')}", "ENVFORGE_API_KEY": api_key, "POLICY_KEY": POLICY_KEY}
    cmd = [str(vf_bin / "vf-eval"), "envforge-verifiers",
           "--env.taskset.url", live.url, "--env.taskset.task-set", "main",
           "-m", "tiny", "--client.base-url", policy_url, "--client.api-key-var", "POLICY_KEY",
           "--env.agent.max-turns", str(max_turns), "--sampling.max-tokens", "48", "-c", "2",
           "--no-push", "-o", str(out)]  # fmt: skip
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, check=False)
    print(f"vf-eval: {time.monotonic() - started:.1f} s")
    assert run.returncode == 0 or not check, (run.stdout + run.stderr)[-6000:]
    [traces] = out.glob("*/traces.jsonl")
    return [json.loads(line) for line in traces.read_text().splitlines()]


def _nothing_open(live: LiveServer) -> None:
    health = httpx.get(live.url + "/healthz").json()
    assert health["sessions_open"] == 0
    backend = health["backend"]  # every sandbox the sessions took is back in the warm pool
    assert backend["idle_sandboxes"] == backend["started"] - backend["destroyed"]


def _stop(live: LiveServer, docker_client) -> None:
    pid = live.proc.pid if live.proc else 0
    output = live.stop()
    assert "Traceback" not in output, output[output.find("Traceback") - 500 :][:6000]
    assert _containers_of(docker_client, pid) == []


def _played(episodes: list[dict[str, Any]], data: ServiceData, tenant: str) -> list[tuple[dict, dict, dict]]:
    """(trace, its envforge info, the service's record of its session) per episode, each checked to
    carry the recorded grade as its reward."""
    assert sorted(e["task"]["data"]["task_id"] for e in episodes) == sorted(data.tasks)
    by_id = {r["session_id"]: r for r in Catalog(data.settings.catalog_path).service_sessions(tenant).iter_rows(named=True)}
    out = []
    for episode in episodes:
        assert episode["ok"] and not episode["errors"], episode["errors"]
        [trace] = episode["traces"]
        played = trace["info"]["envforge"]
        row = by_id[played["session_id"]]
        assert row["task_id"] == played["task_id"] and row["end_reason"] == played["end_reason"]
        assert trace["rewards"]["envforge_reward"]["score"] == row["reward"] == played["reward"]
        assert played["resolved"] == row["resolved"] and trace["metrics"]["envforge_turns"] == row["turns"]
        out.append((trace, played, row))
    return out


def test_vf_eval_against_policy_serve_scores_with_the_service_verifier(vf_bin, server, service_data, docker_client, tmp_path):  # noqa: F811
    tenant = "verifiers-team"
    key = create_key(service_data.settings, tenant, ["main"], max_sessions=4)
    live = LiveServer(service_data).start()
    try:
        episodes = _vf_eval(vf_bin, live, server, key, tmp_path / "out")
        _nothing_open(live)
        # What the verifier says of each task untouched (the random model changes nothing).
        with EnvforgeClient(live.url, key) as client:
            untouched = {}
            for task_id in service_data.tasks:
                with client.create_session(task_id=task_id) as session:
                    untouched[task_id] = session.verify().result
    finally:
        _stop(live, docker_client)

    for trace, played, row in _played(episodes, service_data, tenant):
        # cut at the turn cap, which the env gave the session too: the service ended and graded it
        assert row["end_reason"] == "max_turns" and row["turns"] == MAX_TURNS
        assert trace["stop_condition"] == "user_closed"  # the env closed the exchange: its session had ended
        # the verifier's grade: the same failing tests / checkpoints as the untouched task
        assert played["reasons"] and played["reasons"] == untouched[played["task_id"]].reasons
        assert played["reward"] == untouched[played["task_id"]].reward
    # the reference grades were the tenant's only other sessions
    assert len(Catalog(service_data.settings.catalog_path).service_sessions(tenant)) == 2 * len(service_data.tasks)


def _scripted_policy(patches: dict[str, str], before_answer: Callable[[], None] = lambda: None) -> FastAPI:
    """An OpenAI chat endpoint (plain and streamed) that solves each task with native tool calls: `apply_patch` with the task's
    reference patch, then `submit` (the model's side scripted; everything else is real)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        before_answer()
        body = await request.json()
        prompt = json.dumps(body["messages"])
        [patch] = [p for instruction, p in patches.items() if json.dumps(instruction.strip())[1:-1] in prompt]
        answered = sum(m["role"] == "tool" for m in body["messages"])
        name, arguments = ("apply_patch", {"patch": patch}) if answered == 0 else ("submit", {})
        call = {"id": f"call_{answered}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        head = {"id": f"chatcmpl-{answered}", "created": int(time.time()), "model": body["model"]}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage})
        delta = {"role": "assistant", "tool_calls": [{"index": 0, **call}]}
        chunks = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
                  {"choices": [], "usage": usage}]  # fmt: skip
        events = [f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', **c})}\n\n" for c in chunks]
        return StreamingResponse(iter([*events, "data: [DONE]\n\n"]), media_type="text/event-stream")

    return app


def test_native_tool_calls_run_on_the_session_and_a_solved_task_scores_1(vf_bin, service_data, docker_client, tmp_path):
    tenant = "verifiers-solver"
    key = create_key(service_data.settings, tenant, ["main"], max_sessions=4)
    patches = {t.spec.instruction: t.reference_patch or "" for t in service_data.tasks.values()}
    live = LiveServer(service_data).start()
    try:
        with running_server(_scripted_policy(patches)) as policy:
            episodes = _vf_eval(vf_bin, live, policy + "/v1", key, tmp_path / "out", max_turns=4)
        _nothing_open(live)
    finally:
        _stop(live, docker_client)

    solved = {task_id for task_id, task in service_data.tasks.items() if task.reference_patch}
    assert solved == {"inventory-median-even"}  # ops-service-config has none: its empty patch fails to apply
    for trace, played, row in _played(episodes, service_data, tenant):
        assert row["end_reason"] == "submitted" and row["turns"] == 2 and trace["stop_condition"] == "envforge_done"
        resolved = played["task_id"] in solved
        assert played["resolved"] == resolved and played["reward"] == float(resolved)
        assert (played["reasons"] == []) == resolved
        # the model saw the session's observation as its tool call's result
        [result] = [n["message"] for n in trace["nodes"] if n["message"]["role"] == "tool"]
        assert result["name"] == "apply_patch"
        assert ("patch applied" if resolved else "patch_failed") in result["content"]


def test_a_service_fault_mid_episode_errors_the_episode_instead_of_scoring_it(vf_bin, service_data, docker_client, tmp_path):
    """The service dies (SIGKILL) when the model is first asked: no rollout is scored, each episode
    carries the fault; a restarted service sweeps the dead one's sandboxes."""
    tenant = "verifiers-fault"
    key = create_key(service_data.settings, tenant, ["main"], max_sessions=4)
    patches = {t.spec.instruction: t.reference_patch or "" for t in service_data.tasks.values()}
    live = LiveServer(service_data).start()
    assert live.proc is not None
    pid, once = live.proc.pid, threading.Lock()

    def kill_the_service() -> None:
        if once.acquire(blocking=False):
            live.proc.send_signal(signal.SIGKILL)
            live.proc.wait(30)

    try:
        with running_server(_scripted_policy(patches, before_answer=kill_the_service)) as policy:
            episodes = _vf_eval(vf_bin, live, policy + "/v1", key, tmp_path / "out", max_turns=4, check=False)
    finally:
        live.stop()
        restarted = LiveServer(service_data, port=live.port).start()  # removes the killed one's sandboxes
        restarted.stop()
    assert _containers_of(docker_client, pid) == []

    assert len(episodes) == len(service_data.tasks)
    for episode in episodes:
        assert not episode["ok"]
        [trace] = episode["traces"]
        assert not trace["rewards"].get("envforge_reward"), trace["rewards"]  # not scored, not 0
        errors = [e["message"] for e in episode["errors"] + trace["errors"]]
        assert any("cannot reach the envforge service" in m for m in errors), errors
