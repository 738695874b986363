"""`envforge policy serve` as a vLLM stand-in, driven by the official openai SDK.

A real server process (the CLI, on a tiny checkpoint, with an API key) answers chat and
legacy completions, streamed and not, with n > 1, stop strings, top_p and log-probs; refuses
what it cannot honour with a 400 naming the parameter and a missing key with a 401; and
samples concurrent requests together. Tool-call deltas need a model that calls a tool,
which the random tiny model does not, so that stream runs in-process with the sampler
scripted. The batched sampler itself is checked against lone sampling and a forward pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from envforge.rollout.actions import TOOLS
from envforge.rollout.policies.base import IM_END
from envforge.rollout.policies.hf import HFPolicy, SamplingRow, _Generation
from envforge.rollout.policies.serve import make_app
from envforge.rollout.policies.tiny import TinyModelConfig, build_tiny_model, save_pretrained_dir
from tests.serving import free_port, running_server

KEY = "sk-test-key"
MESSAGES: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."},
                                  {"role": "user", "content": "The tests fail. Fix them."}]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    return save_pretrained_dir(model, tok, tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory) -> str:
    """`envforge policy serve CKPT --api-key ...` in its own process; its base URL (`.../v1`)."""
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "server.log"
    cmd = [str(Path(sys.executable).parent / "envforge"), "policy", "serve", str(ckpt), "--port", str(port),
           "--threads", "1", "--max-batch", "8"]
    env = {**os.environ, "ENVFORGE_POLICY_API_KEY": KEY, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not start: " + log.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=60)


def health(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=10) as resp:
        return json.loads(resp.read())


# -- chat --------------------------------------------------------------------------------------------


def test_chat_n_logprobs_and_seed(client):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "seed": 7, "n": 2, "logprobs": True,
          "top_logprobs": 3}
    first = client.chat.completions.create(**kw)
    again = client.chat.completions.create(**kw)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert first.choices[0].logprobs.content != first.choices[1].logprobs.content  # seed + j per choice
    for choice in first.choices:
        entries = choice.logprobs.content
        assert 0 < len(entries) <= 12 and choice.finish_reason in ("stop", "length")
        for e in entries:
            assert len(e.top_logprobs) == 3 and e.logprob <= 0
            tops = [t.logprob for t in e.top_logprobs]
            assert tops == sorted(tops, reverse=True) and e.logprob <= tops[0]
    assert first.usage.completion_tokens == sum(len(c.logprobs.content) for c in first.choices)


def test_stop_strings_cut_the_text(client):
    greedy = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0)
    text = greedy.choices[0].message.content
    assert len(text) >= 6, text
    stop = text[3:5]
    cut = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_top_p_tiny_is_greedy(client):
    greedy = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    nucleus = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=1.0,
                                             top_p=1e-6, seed=3)
    assert nucleus.choices[0].message.content == greedy.choices[0].message.content


def test_chat_stream_matches_the_non_streamed_answer(client):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 16, "seed": 11, "n": 2, "logprobs": True}
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text, roles, finish, logprobs = {0: "", 1: ""}, {}, {}, {0: [], 1: []}
    for chunk in chunks[:-1]:
        for c in chunk.choices:
            roles.setdefault(c.index, c.delta.role)
            text[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish.get(c.index)
            if c.logprobs and c.logprobs.content:
                logprobs[c.index] += [e.logprob for e in c.logprobs.content]
    assert roles == {0: "assistant", 1: "assistant"}
    for j, choice in enumerate(whole.choices):
        assert text[j] == choice.message.content
        assert finish[j] == choice.finish_reason
        assert logprobs[j] == pytest.approx([e.logprob for e in choice.logprobs.content], abs=1e-4)
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == whole.usage.completion_tokens


# -- completions -------------------------------------------------------------------------------------


def test_completions_prompts_n_and_legacy_logprobs(client):
    out = client.completions.create(model="tiny", prompt=["def total(values):", "exit code 1"], n=2, max_tokens=8,
                                    seed=5, logprobs=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for c in out.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
        assert lp.text_offset[0] == 0 and all(a <= b for a, b in zip(lp.text_offset, lp.text_offset[1:]))
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            # the top 2 and the sampled token, keyed by text (tokens that decode alike share a key, as in vLLM)
            assert 1 <= len(top) <= 3 and token in top and logprob <= 0
    assert out.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in out.choices)
    streamed = list(client.completions.create(model="tiny", prompt="def total(values):", max_tokens=8, seed=5,
                                              stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == out.choices[0].text
    assert streamed[-1].choices[0].finish_reason == out.choices[0].finish_reason


# -- refusals and auth -------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, named", [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "run"}}, "tools": TOOLS}, "tool_choice"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
    ({"extra_body": {"repetition_penalty": 1.2}}, "repetition_penalty"),
    ({"parallel_tool_calls": False, "tools": TOOLS}, "parallel_tool_calls"),
])
def test_unsupported_parameters_are_refused_by_name(client, kw, named):
    with pytest.raises(openai.BadRequestError, match=named):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, **kw)


def test_completions_refusals(client):
    for kw, named in (({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"), ({"best_of": 3}, "best_of")):
        with pytest.raises(openai.BadRequestError, match=named):
            client.completions.create(model="tiny", prompt="x", max_tokens=2, **kw)


def test_api_key_is_required_on_v1_routes(server):
    for key in ("wrong", "sk-test-key-but-longer"):
        bad = openai.OpenAI(base_url=server, api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    assert health(server)["status"] == "ok"  # health and metrics stay open, as with vLLM
    good = openai.OpenAI(base_url=server, api_key=KEY, max_retries=0)
    assert [m.id for m in good.models.list().data] and good.models.list().data[0].id.startswith("hf:")


# -- batching ----------------------------------------------------------------------------------------


def test_concurrent_requests_are_batched(server):
    before = health(server)["batching"]

    async def many() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=24, seed=s) for s in range(8)))
        finally:
            await client.close()

    outs = asyncio.run(many())
    assert all(o.choices[0].message.content is not None for o in outs)
    after = health(server)["batching"]
    assert after["seen_rows"] - before["seen_rows"] == 8
    batches = after["seen_batches"] - before["seen_batches"]
    assert batches < 8 and after["seen_max_rows"] > 1, after  # 8 requests in fewer generate calls


# -- tool-call deltas (in-process, scripted sampler) -------------------------------------------------


def test_stream_carries_tool_call_deltas(monkeypatch):
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    policy = HFPolicy(model, tok)
    text = 'Checking.\n<tool_call>{"name": "read_file", "arguments": {"path": "src/app/main.py"}}</tool_call>'
    script = tok.encode(text) + [tok.convert_tokens_to_ids(IM_END)]

    def scripted(self, rows, on_token=None):
        gens = []
        for i, row in enumerate(rows):
            for t in script:
                if on_token is not None:
                    on_token(i, t, -0.5, None)
            gens.append(_Generation(row.prompt_ids, list(script), [-0.5] * len(script), "stop"))
        return gens

    monkeypatch.setattr(HFPolicy, "_sample_batch", scripted)
    with running_server(make_app(policy)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        whole = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=64)
        assert whole.choices[0].finish_reason == "tool_calls"
        content, calls, finish, names = "", {}, None, []
        for chunk in client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=64,
                                                    stream=True):
            delta = chunk.choices[0].delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    entry["id"] = tc.id
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                    entry["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    entry["arguments"] += tc.function.arguments
            finish = chunk.choices[0].finish_reason or finish
        assert content == whole.choices[0].message.content == "Checking."
        want = whole.choices[0].message.tool_calls[0]
        assert calls == {0: {"id": want.id, "name": "read_file", "arguments": want.function.arguments}}
        assert json.loads(calls[0]["arguments"]) == {"path": "src/app/main.py"}
        assert names == ["read_file"] and finish == "tool_calls"
        none = client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                              max_tokens=64)
        assert none.choices[0].message.tool_calls is None and "<tool_call>" in none.choices[0].message.content


# -- the batched sampler -----------------------------------------------------------------------------


def test_batched_rows_sample_what_they_would_alone():
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    policy = HFPolicy(model, tok)
    prompts = [tok.encode("hello world"), tok.encode("def total(values): return sum(values) if values else 0"),
               tok.encode("x")]
    rows = [SamplingRow(p, seed=i, temperature=0.8, max_tokens=12, top_logprobs=2) for i, p in enumerate(prompts)]
    batch, version = policy.generate_batch(rows)
    assert version == policy.version
    for row, gen in zip(rows, batch):
        alone = policy.generate_batch([row])[0][0]
        assert alone.token_ids == gen.token_ids
        assert alone.logprobs == pytest.approx(gen.logprobs, abs=1e-4)
        assert [t for t, _ in gen.top_logprobs[0]] == [t for t, _ in alone.top_logprobs[0]]


def test_penalized_logprobs_match_a_forward_pass():
    """Penalties are honoured: the reported log-probs are those of the penalized, tempered distribution."""
    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    policy = HFPolicy(model, tok)
    row = SamplingRow(tok.encode("exit code 1 FAILED"), seed=2, temperature=0.7, max_tokens=12,
                      presence_penalty=0.5, frequency_penalty=1.5)
    gen = policy.generate_batch([row])[0][0]
    ids = torch.tensor([row.prompt_ids + gen.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    n = len(row.prompt_ids)
    counts = torch.zeros(logits.shape[-1])
    for step, tok_id in enumerate(gen.token_ids):
        adjusted = logits[n - 1 + step] - 1.5 * counts - 0.5 * (counts > 0).float()
        expected = torch.log_softmax(adjusted / 0.7, dim=-1)[tok_id]
        assert float(expected) == pytest.approx(gen.logprobs[step], abs=1e-4)
        counts[tok_id] += 1


def test_reload_waits_for_the_running_batch(tmp_path, monkeypatch):
    """`/v1/reload` during a batch lands after it: every row of the batch reports the old version, the next
    request the new one (what the asynchronous training loop relies on)."""
    import threading

    model, tok = build_tiny_model(TinyModelConfig(seed=0))
    other = save_pretrained_dir(*build_tiny_model(TinyModelConfig(seed=1)), tmp_path / "b")
    policy = HFPolicy(model, tok)
    inside, release = threading.Event(), threading.Event()
    real = HFPolicy._sample_batch

    def held(self, rows, on_token=None):
        if not release.is_set():
            inside.set()
            assert release.wait(60)
        return real(self, rows, on_token)

    monkeypatch.setattr(HFPolicy, "_sample_batch", held)
    with running_server(make_app(policy)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        answers: list[Any] = []
        turn = threading.Thread(target=lambda: answers.append(client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, max_tokens=4, n=3).http_response.json()))
        turn.start()
        assert inside.wait(30)  # the batch holds the policy's lock
        reloaded: list[Any] = []
        reload = threading.Thread(target=lambda: reloaded.append(client.post(
            "/reload", body={"path": str(other)}, cast_to=object)))
        reload.start()
        reload.join(3)
        assert reload.is_alive() and policy.version == 0  # waiting for the batch to end
        release.set()
        turn.join(60)
        reload.join(60)
        assert answers[0]["policy_version"] == 0 and len(answers[0]["choices"]) == 3
        assert reloaded[0]["version"] == 1
        after = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES, max_tokens=2)
        assert after.http_response.json()["policy_version"] == 1
