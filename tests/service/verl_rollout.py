"""One multi-turn rollout through verl's own agent-loop code, run inside the verl venv (.venv-verl,
tools/trainer_venv.py) by tests/service/test_verl.py; it prints a JSON summary on stdout.

What verl's trainer does for a step, minus Ray and the GPU inference server: the trainer config
composed by Hydra from verl's own `ppo_trainer.yaml` (with the documented overrides), the export
read by verl's `RLHFDataset` and `collate_fn`, the generation batch cut by
`RayPPOTrainer._get_gen_batch`, an `AgentLoopWorker` (the class `AgentLoopManager` runs as a Ray
actor) built from that config and calling `generate_sequences`, which instantiates the
`envforge_agent` loop from `verl_agent_loop.yaml` per trajectory and scores each finished trajectory
with a `RewardLoopWorker` (verl's default naive reward manager over `compute_score`), and verl's
`batch` reward manager calling `compute_score_batch` on the same output. Ray actor handles are
replaced by the objects themselves in this process. The one piece replaced is the inference server behind
`LLMServerClient` (vLLM/SGLang need a GPU): a client answering from `envforge policy serve`'s
`/v1/completions` (token ids in, token ids and logprobs out, as vLLM's server does), or from a
script of replies per task.

    python verl_rollout.py DATA.parquet MODEL_DIR (--server URL/v1 | --replies replies.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import envforge_client.adapters as adapters
import envforge_client.adapters.verl_reward as verl_reward
import httpx
import numpy as np
from hydra import compose, initialize_config_module
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.workers.reward_manager.batch import BatchRewardManager
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

LOOP_CONFIG = Path(adapters.__file__).parent / "verl_agent_loop.yaml"


class InProcessActor:
    """A Ray actor handle's `.method.remote(...)` for an object in this process (awaitable, like an ObjectRef)."""

    def __init__(self, target: Any):
        self.target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)
        return type("RemoteMethod", (), {"remote": staticmethod(method)})()


class CompletionsServer(LLMServerClient):
    """Generates on an OpenAI-compatible server's `/v1/completions` with token-id prompts."""

    def __init__(self, config: Any, url: str, max_tokens: int):
        super().__init__(config, load_balancer_handle=None)
        self.url, self.max_tokens = url, max_tokens

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        body = {
            "model": "tiny",
            "prompt": list(prompt_ids),
            "max_tokens": self.max_tokens,
            "temperature": sampling_params["temperature"],
            "top_p": sampling_params["top_p"],
            "logprobs": 1,
            "return_token_ids": True,
            "seed": 0,
        }
        if sampling_params.get("stop_token_ids"):
            body["stop_token_ids"] = list(sampling_params["stop_token_ids"])
        async with httpx.AsyncClient(timeout=300) as http:
            resp = await http.post(f"{self.url}/completions", json=body)
        resp.raise_for_status()
        choice = resp.json()["choices"][0]
        return TokenOutput(
            token_ids=choice["token_ids"], log_probs=choice["logprobs"]["token_logprobs"], stop_reason="completed"
        )


class ScriptedServer(LLMServerClient):
    """Answers each trajectory from a script: {text that identifies the task in the prompt: [replies]}."""

    def __init__(self, config: Any, tokenizer: Any, script: dict[str, list[str]]):
        super().__init__(config, load_balancer_handle=None)
        self.tokenizer, self.script = tokenizer, script
        self.turns: dict[str, int] = {}
        self.replies: dict[str, list[str]] = {}

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        if request_id not in self.replies:  # verl keeps one request id per trajectory (sticky sessions)
            prompt = self.tokenizer.decode(prompt_ids)
            self.replies[request_id] = next(r for marker, r in self.script.items() if marker in prompt)
        turn = self.turns.get(request_id, 0)
        self.turns[request_id] = turn + 1
        replies = self.replies[request_id]
        text = replies[turn] if turn < len(replies) else "Done."
        ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed")


def trainer_config(data: str, model: str, response_length: int) -> Any:
    overrides = [
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.return_raw_chat=True",
        "data.max_prompt_length=4096",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.prompt_length=4096",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=6",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={LOOP_CONFIG}",
        f"reward.custom_reward_function.path={verl_reward.__file__}",
        "reward.custom_reward_function.name=compute_score",
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


async def rollout(args: argparse.Namespace) -> dict[str, Any]:
    config = trainer_config(args.data, args.model, args.response_length)
    if args.server:
        client: LLMServerClient = CompletionsServer(config, args.server, args.max_tokens)
    else:
        client = ScriptedServer(config, None, json.loads(Path(args.replies).read_text()))
    # verl's default scoring: each trajectory scored as it finishes by a reward-loop worker (a Ray actor
    # in the trainer) running the naive reward manager over custom_reward_function (compute_score)
    scorer = InProcessActor(RewardLoopWorker(config))
    worker = AgentLoopWorker(config, llm_client=client, reward_loop_worker_handles=[scorer])
    if isinstance(client, ScriptedServer):
        client.tokenizer = worker.tokenizer  # the worker's, loaded from its model config

    dataset = RLHFDataset(data_files=[args.data], tokenizer=worker.tokenizer, config=config.data, processor=None)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([str(i) for i in range(len(batch))], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # type: ignore[arg-type]  # uses no trainer state
    gen_batch.meta_info = {"global_steps": 1, "validate": False}
    started = time.perf_counter()
    output = await worker.generate_sequences(gen_batch)
    generate_s = round(time.perf_counter() - started, 2)

    output = batch.union(output)  # as the trainer does: the rows' own fields beside what was generated
    rewards = output.batch["rm_scores"].sum(dim=-1).tolist()
    # the `batch` reward manager's call of compute_score_batch, on the same rollout
    batch_scores = BatchRewardManager(worker.tokenizer, 0, verl_reward.compute_score_batch).verify(output)
    tok = worker.tokenizer
    rows = []
    for i in range(len(output)):
        mask = output.batch["response_mask"][i].tolist()
        attention = output.batch["attention_mask"][i][output.batch["prompts"].shape[1] :].tolist()
        response = output.batch["responses"][i].tolist()
        n = int(sum(attention))
        model_ids = [t for t, m in zip(response[:n], mask[:n]) if m]
        env_ids = [t for t, m in zip(response[:n], mask[:n]) if not m]
        rows.append(
            {
                "task_id": output.non_tensor_batch["extra_info"][i]["task_id"],
                "agent_name": gen_batch.non_tensor_batch["agent_name"][i],
                "num_turns": int(output.non_tensor_batch["__num_turns__"][i]),
                "reward": rewards[i],
                "session": output.non_tensor_batch["reward_scores"][i]["envforge"],
                "model_text": tok.decode(model_ids),
                "observation_text": tok.decode(env_ids),
                "has_logprobs": "rollout_log_probs" in output.batch.keys(),
            }
        )
    logged = {k: [str(x) for x in output.non_tensor_batch[k]] for k in output.meta_info["reward_extra_keys"]}
    return {"rows": rows, "reward_extra_info": logged, "batch_scores": batch_scores, "generate_s": generate_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("model")
    parser.add_argument("--server")
    parser.add_argument("--replies")
    parser.add_argument("--response-length", type=int, default=3072)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(rollout(args))))


if __name__ == "__main__":
    main()
