"""An OpenEnv client playing envforge tasks over the service, with envforge's tiny model as the agent (CPU).

    envforge service keys create --tenant demo            # prints a key
    envforge service serve &                              # http://127.0.0.1:8080
    ENVFORGE_API_KEY=efk_... python examples/openenv_envforge.py --task-set main --episodes 2

Each episode is one OpenEnv connection (`EnvforgeEnv`, an `openenv-core` 0.3 `EnvClient`, used through
its `.sync()` wrapper): reset on a
task, the model's replies sent as actions, the verified reward on the terminal step. The tiny model
has random weights (built in code, nothing downloaded), so its actions are mostly malformed and the
rewards 0; `--model DIR` loads a real checkpoint.

`--harness` runs the episodes through OpenEnv's harness instead (`openenv.core.harness`:
`EnvforgeSessionFactory`, `MCPHarnessAdapter`, `build_harness_rollout_func`, the `rollout_func` a
trainer calls): the model's turns come back with their prompt and completion token ids and
log-probabilities, and the reward is the verifier's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from envforge_client.adapters.openenv import EnvforgeAction, EnvforgeEnv


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("ENVFORGE_SERVICE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--task-set", default="main")
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--harness", action="store_true", help="through openenv.core.harness (a rollout_func)")
    args = parser.parse_args(argv)

    from envforge.rollout.policies.hf import HFPolicy
    from envforge.rollout.policies.tiny import build_tiny_model

    policy = HFPolicy(args.model) if args.model else HFPolicy(build_tiny_model())
    if args.harness:
        return harness_rollouts(args, policy)
    episodes = []
    for n in range(args.episodes):
        with EnvforgeEnv(args.url, os.environ["ENVFORGE_API_KEY"]).sync() as env:
            result = env.reset(task_set=args.task_set, index=n % 2, seed=n, max_turns=args.max_turns)
            first = result.observation
            messages = [{"role": "system", "content": first.system_prompt},
                        {"role": "user", "content": first.text}]
            while not result.done:
                out = asyncio.run(policy.act(messages, first.tools, seed=n * 100 + len(messages), max_tokens=32))
                action = (EnvforgeAction(name=out.tool_calls[0]["function"]["name"],
                                         arguments=json.loads(out.tool_calls[0]["function"]["arguments"] or "{}"))
                          if out.tool_calls else EnvforgeAction(text=out.text))
                result = env.step(action)
                messages += [{"role": "assistant", "content": out.text},
                             {"role": "user", "content": result.observation.text}]
            episodes.append({"session_id": first.session_id, "task_id": first.task_id, "reward": result.reward,
                             "turns": result.observation.turn, "end_reason": result.observation.end_reason})
    print(json.dumps(episodes))
    return episodes


def harness_rollouts(args: argparse.Namespace, policy) -> list[dict]:
    from openenv.core.harness import HarnessRunLimits, MCPHarnessAdapter, ModelStepResult, build_harness_rollout_func
    from openenv.core.llm_client import LLMResponse, ToolCall

    from envforge_client.adapters.openenv import EnvforgeSessionFactory
    from envforge_client.prompts import TOOLS

    def model_step(messages, tools, sampling):
        out = asyncio.run(policy.act(messages, TOOLS, seed=len(messages), max_tokens=sampling.get("max_tokens", 32)))
        calls = []
        for i, call in enumerate(out.tool_calls):
            try:
                arguments = json.loads(call["function"].get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {}
            calls.append(ToolCall(id=call.get("id") or f"call_{i}", name=call["function"]["name"], args=arguments))
        return ModelStepResult(response=LLMResponse(content=out.text, tool_calls=calls),
                               prompt_ids=out.prompt_token_ids or [], completion_ids=out.token_ids or [],
                               logprobs=out.logprobs or [])

    rollout_func = build_harness_rollout_func(
        session_factory=EnvforgeSessionFactory(args.url, os.environ["ENVFORGE_API_KEY"], max_turns=args.max_turns),
        harness_adapter=MCPHarnessAdapter(),
        model_step_builder=lambda trainer, session: model_step,
        limits=HarnessRunLimits(max_turns=args.max_turns, sampling={"max_tokens": 32}),
    )
    out = rollout_func([{"task_set": args.task_set, "index": n % 2} for n in range(args.episodes)], None)
    episodes = [{"reward": reward, "completion_tokens": len(ids), "logprobs": len(lps), "turns": m.get("turns")}
                for reward, ids, lps, m in zip(out["env_reward"], out["completion_ids"], out["logprobs"],
                                               out["verify_metrics"])]
    print(json.dumps(episodes))
    return episodes


if __name__ == "__main__":
    main()
