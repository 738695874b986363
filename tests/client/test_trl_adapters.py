"""The TRL adapters without a service: the environment_factory class as TRL discovers and drives it, and
the rollout_func's generation (sampling from trainer.args, one batched call per turn, the vLLM path),
against a scripted client (the live-service GRPOTrainer steps are tests/service/test_trl_adapter.py)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from envforge_client import models as m
from envforge_client.adapters.trl_env import EnvforgeEnvironments, EnvforgeToolEnv, EpisodeFault
from envforge_client.adapters.trl_grpo import EnvforgeRollout, TaskRef, cut_turn, generation_kwargs, left_pad
from envforge_client.errors import RequestTooLarge, SessionLost
from envforge_client.prompts import TOOLS, system_message, user_message


def _result(reward: float) -> m.VerifyResult:
    return m.VerifyResult(task_id="t", reward=reward, resolved=reward == 1.0, tests={}, checkpoints=[],
                          reasons=[], duration_s=0.1, logs={})


class ScriptedSession:
    """A session that ends after `ends_after` steps (graded `reward`), or fails a step with `fault`."""

    def __init__(self, sid: str, task_id: str, ends_after: int = 99, reward: float = 0.0, fault: Exception | None = None):
        self.id, self.ends_after, self.reward, self.fault = sid, ends_after, reward, fault
        self.info = SimpleNamespace(task_id=task_id)
        self.observation = m.Observation(text=f"first observation of {task_id}")
        self.done, self.result, self.steps, self.closed, self.verifies = False, None, [], 0, 0

    def step(self, **body: Any) -> m.StepOut:
        if self.fault is not None:
            raise self.fault
        self.steps.append(body)
        self.done = len(self.steps) >= self.ends_after
        self.result = _result(self.reward) if self.done else None
        return m.StepOut(observation=m.Observation(text=f"observation {len(self.steps)}"), done=self.done,
                         turn=len(self.steps), result=self.result)

    def verify(self) -> m.VerifyOut:
        self.verifies += 1
        return m.VerifyOut(result=_result(self.reward), done=self.done)

    def close(self) -> None:
        self.closed += 1


class ScriptedClient:
    def __init__(self, **per_task: dict[str, Any]):
        self.per_task, self.sessions = per_task, []

    def create_session(self, task_id: str, **kwargs: Any) -> ScriptedSession:
        session = ScriptedSession(f"s{len(self.sessions)}", task_id, **self.per_task.get(task_id, {}))
        session.create_kwargs = kwargs
        self.sessions.append(session)
        return session


# -- environment_factory ------------------------------------------------------------------------------


def test_trl_discovers_exactly_the_five_actions_as_tools_with_their_schemas():
    from transformers.utils import get_json_schema

    # TRL's discovery: public functions of the class, less reset and get_reward.
    public = {n for n, _ in inspect.getmembers(EnvforgeToolEnv, predicate=inspect.isfunction) if not n.startswith("_")}
    tools = public - {"reset", "get_reward"}
    assert tools == {t["function"]["name"] for t in TOOLS}
    env = EnvforgeToolEnv(ScriptedClient())
    for spec in TOOLS:
        schema = get_json_schema(getattr(env, spec["function"]["name"]))["function"]
        assert set(schema["parameters"]["properties"]) == set(spec["function"]["parameters"]["properties"])
        assert schema["parameters"].get("required", []) == spec["function"]["parameters"].get("required", [])


def test_an_episode_is_one_session_its_tools_are_steps_and_the_reward_is_the_verifiers():
    client = ScriptedClient(t1={"reward": 1.0, "ends_after": 2})
    environments = EnvforgeEnvironments(client, max_turns=5)
    env = environments()
    assert env.reset(prompt=[], task_id="t1", content_hash="h", task_set_version="v") == "first observation of t1"
    session = client.sessions[0]
    assert session.create_kwargs == {"task_set": "v", "content_hash": "h", "max_turns": 5}
    assert env.run(command="ls") == "observation 1"
    assert env.submit() == "observation 2"
    assert env.write_file(path="a", content="b").startswith("The episode has ended")  # nothing sent
    assert session.steps == [{"name": "run", "arguments": {"command": "ls"}}, {"name": "submit", "arguments": {}}]
    assert env.get_reward() == 1.0 and session.verifies == 0 and session.closed == 1  # the terminal grade
    assert environments.episodes == [{"session_id": "s0", "task_id": "t1", "turns": 2, "submitted": True,
                                      "reward": 1.0, "resolved": True, "reasons": []}]


def test_an_unsubmitted_episode_is_verified_and_a_reset_closes_what_was_left_open():
    client = ScriptedClient(t1={"reward": 0.5})
    environments = EnvforgeEnvironments(client)
    env = environments()
    env.reset(task_id="t1")
    env.reset(task_id="t1")  # the previous episode never reached get_reward
    assert client.sessions[0].closed == 1
    env.apply_patch(patch="--- a\n+++ b\n")
    assert env.get_reward() == 0.5 and client.sessions[1].verifies == 1 and client.sessions[1].closed == 1
    env.reset(task_id="t1")
    environments.close()  # training stopped before get_reward: nothing is left open
    assert [s.closed for s in client.sessions] == [1, 1, 1]


def test_an_infrastructure_fault_is_never_scored():
    lost = SessionLost(410, "session_lost", "the sandbox is gone")
    client = ScriptedClient(t1={"fault": lost})
    env = EnvforgeEnvironments(client)()
    env.reset(task_id="t1")
    with pytest.raises(SessionLost):  # TRL shows the model the error ...
        env.run(command="ls")
    with pytest.raises(EpisodeFault, match="infrastructure fault"):  # ... and the step fails instead of a 0
        env.get_reward()
    assert client.sessions[0].closed == 1


def test_a_request_the_model_made_too_large_is_its_answer_not_a_fault():
    client = ScriptedClient(t1={"fault": RequestTooLarge(413, "request_too_large", "the body is over 1 MiB")})
    env = EnvforgeEnvironments(client)()
    env.reset(task_id="t1")
    assert env.write_file(path="big", content="x") == "error: the body is over 1 MiB"
    assert env.get_reward() == 0.0 and client.sessions[0].verifies == 1


# -- rollout_func ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from envforge.rollout.policies.tiny import build_tiny_model

    return build_tiny_model()


def _trainer(tiny, tmp_path, **config: Any) -> SimpleNamespace:
    from accelerate import Accelerator
    from trl import GRPOConfig

    model, tokenizer = tiny
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **config)
    return SimpleNamespace(args=args, processing_class=tokenizer, accelerator=Accelerator(cpu=True),
                           model_wrapped=model, eos_token_ids=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")])


def _prompt(instruction: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system_message()}, {"role": "user", "content": user_message(instruction)}]


def test_generation_settings_are_the_trainers(tiny, tmp_path):
    trainer = _trainer(tiny, tmp_path, temperature=0.7, top_p=0.9, top_k=7, min_p=0.05, repetition_penalty=1.1,
                       generation_kwargs={"no_repeat_ngram_size": 3})
    kwargs = generation_kwargs(trainer, 12)
    assert {k: kwargs[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 7, "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 12}
    assert kwargs["do_sample"] and kwargs["no_repeat_ngram_size"] == 3 and kwargs["eos_token_id"] == trainer.eos_token_ids


def test_left_pad_and_cut_turn():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert cut_turn([4, 2, 9], [-1.0, -2.0, -3.0], stops=[2], limit=10) == ([4, 2], [-1.0, -2.0])
    assert cut_turn([4, 5, 9], [-1.0, -2.0, -3.0], stops=[2], limit=2) == ([4, 5], [-1.0, -2.0])


def test_each_turn_is_one_batched_generation_over_the_running_episodes(tiny, tmp_path):
    model, tokenizer = tiny
    forced = '<tool_call>{"name": "run", "arguments": {"command": "ls"}}</tool_call><|im_end|>'
    forced_ids = tokenizer(forced, add_special_tokens=False)["input_ids"]
    bias = [[forced_ids[: k + 1], 50.0 * (k + 1)] for k in range(len(forced_ids))]
    trainer = _trainer(tiny, tmp_path, temperature=0.9, top_k=50, max_completion_length=512,
                       generation_kwargs={"sequence_bias": bias})
    calls: list[dict[str, Any]] = []
    generate = model.generate

    def recording_generate(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return generate(**kwargs)

    model.generate = recording_generate
    try:
        client = ScriptedClient(a={"ends_after": 1, "reward": 1.0}, b={"reward": 0.0})
        prompts = [_prompt("Fix the median."), _prompt("Fix the service config, which is a longer instruction."),
                   _prompt("Fix the service config, which is a longer instruction.")]
        tasks = {prompts[0][1]["content"]: TaskRef("a", "h", "v"), prompts[1][1]["content"]: TaskRef("b", "h", "v")}
        rollout = EnvforgeRollout(client, tasks, max_turns=3, max_new_tokens=64)
        out = rollout(prompts, trainer)
    finally:
        del model.generate
    # Turn 1: all three episodes; a's session ends there, so turns 2 and 3 generate for the two b's only.
    assert rollout.generate_calls == [3, 2, 2] and [c["input_ids"].shape[0] for c in calls] == [3, 2, 2]
    first = calls[0]["attention_mask"]
    assert first[0, 0] == 0 and first[1, 0] == 1 and bool((first.diff(dim=1) >= 0).all())  # left-padded
    config = calls[0]["generation_config"]
    assert (config.temperature, config.top_k, config.do_sample) == (0.9, 50, True)
    # The trainer's generation_kwargs reached the sampler: every turn wrote the biased text, tool call and stop.
    reply = {"text": forced.removesuffix("<|im_end|>")}  # decoded without special tokens
    assert [s.steps for s in client.sessions] == [[reply], [reply] * 3, [reply] * 3]
    assert out["envforge_reward"] == [1.0, 0.0, 0.0] and all(s.closed == 1 for s in client.sessions)
    assert [s.verifies for s in client.sessions] == [0, 1, 1]  # a's grade came with its terminal step
    for ids, mask, lps in zip(out["completion_ids"], out["env_mask"], out["logprobs"], strict=True):
        assert len(ids) == len(mask) == len(lps)
        model_tokens = [t for t, keep in zip(ids, mask, strict=True) if keep]
        assert sum(mask) == len(model_tokens) and model_tokens[: len(forced_ids)] == forced_ids
        assert all(lp == 0.0 for lp, keep in zip(lps, mask, strict=True) if not keep)
        assert all(lp <= 0.0 for lp, keep in zip(lps, mask, strict=True) if keep)
    assert out["env_mask"][0] == [1] * len(forced_ids)  # one turn, no observation after the last
    assert out["env_mask"][1].count(0) > 0 and sum(out["env_mask"][1]) == 3 * len(forced_ids)


def test_with_use_vllm_turns_go_through_trls_vllm_backend(tiny, tmp_path):
    _, tokenizer = tiny
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    class RecordingVLLM:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, images, num_generations, profiler=None):
            self.calls.append((len(prompts), images, num_generations))
            completions = [[11, 12, stop, 13] for _ in prompts]
            return prompts, completions, [[[-0.5]] * 4 for _ in prompts], None

    trainer = _trainer(tiny, tmp_path, max_completion_length=64)
    trainer.args.use_vllm = True
    trainer.vllm_generation, trainer.model_wrapped = RecordingVLLM(), None  # the model is never used
    client = ScriptedClient(a={"ends_after": 2})
    prompts = [_prompt("Fix the median.")] * 2
    rollout = EnvforgeRollout(client, {prompts[0][1]["content"]: TaskRef("a", "h", "v")}, max_turns=4)
    out = rollout(prompts, trainer)
    assert trainer.vllm_generation.calls == [(2, None, 1), (2, None, 1)]
    model_tokens = [t for t, keep in zip(out["completion_ids"][0], out["env_mask"][0], strict=True) if keep]
    assert model_tokens == [11, 12, stop, 11, 12, stop]  # each turn cut at its stop token
    assert [lp for lp, keep in zip(out["logprobs"][0], out["env_mask"][0], strict=True) if keep] == [-0.5] * 6


def test_an_episode_stops_when_its_observations_fill_the_completion_budget(tiny, tmp_path):
    _, tokenizer = tiny
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")

    class FixedVLLM:
        def generate(self, prompts, images, num_generations, profiler=None):
            return prompts, [[11, 12, stop] for _ in prompts], [[[-0.5]] * 3 for _ in prompts], None

    trainer = _trainer(tiny, tmp_path, max_completion_length=5)
    trainer.args.use_vllm, trainer.vllm_generation = True, FixedVLLM()
    client = ScriptedClient()
    prompts = [_prompt("Fix the median.")]
    rollout = EnvforgeRollout(client, {prompts[0][1]["content"]: TaskRef("a", "h", "v")}, max_turns=4)
    out = rollout(prompts, trainer)
    # The first observation already passes 5 tokens: no second turn, and the completion is cut to the budget.
    assert rollout.generate_calls == [1] and len(client.sessions[0].steps) == 1
    assert len(out["completion_ids"][0]) == 5 and out["env_mask"][0] == [1, 1, 1, 0, 0]
