"""An OpenEnv client playing envforge tasks over the service, with envforge's tiny model as the agent (CPU).

    envforge service keys create --tenant demo            # prints a key
    envforge service serve &                              # http://127.0.0.1:8080
    ENVFORGE_API_KEY=efk_... python examples/openenv_envforge.py --task-set main --episodes 2

Each episode is one OpenEnv connection (`EnvforgeEnv`, an `openenv-core` `EnvClient`): reset on a
task, the model's replies sent as actions, the verified reward on the terminal step. The tiny model
has random weights (built in code, nothing downloaded), so its actions are mostly malformed and the
rewards 0; `--model DIR` loads a real checkpoint.
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
    args = parser.parse_args(argv)

    from envforge.rollout.policies.hf import HFPolicy
    from envforge.rollout.policies.tiny import build_tiny_model

    policy = HFPolicy(args.model) if args.model else HFPolicy(build_tiny_model())
    episodes = []
    for n in range(args.episodes):
        with EnvforgeEnv(args.url, os.environ["ENVFORGE_API_KEY"]) as env:
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


if __name__ == "__main__":
    main()
