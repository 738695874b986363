"""TRL's GRPOTrainer training a tiny model on envforge environments over HTTP, on CPU.

    envforge service keys create --tenant demo            # prints a key
    envforge service serve &                              # http://127.0.0.1:8080
    ENVFORGE_API_KEY=efk_... python examples/trl_grpo_envforge.py --task-set main --steps 1

Sampling is the trainer's (GRPOConfig: temperature, top_p, ..., max_completion_length bounds an episode's
completion), and each turn of a step is one batched generation over the episodes still running.
The model is envforge's tiny test model (random weights, built in code: nothing is downloaded),
so the rewards stay 0; swap in a real checkpoint (`--model DIR`) to learn. Every episode is a
session on the service, graded there; the trainer sees the verified reward.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from envforge_client import Client
from envforge_client.adapters.trl_grpo import EnvforgeRollout, envforge_reward, task_dataset


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("ENVFORGE_SERVICE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--task-set", default="main")
    parser.add_argument("--model", default=None, help="a local Hugging Face checkpoint (default: the tiny model)")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=24, help="a cap on one turn")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envforge.rollout.policies.tiny import build_tiny_model

    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    else:
        model, tokenizer = build_tiny_model()
    with Client(args.url) as client:  # the key from ENVFORGE_API_KEY
        dataset, tasks = task_dataset(client, args.task_set)
        rollout = EnvforgeRollout(client, tasks, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
        config = GRPOConfig(output_dir=args.out or tempfile.mkdtemp(prefix="grpo-"), use_cpu=True, bf16=False,
                            max_steps=args.steps, per_device_train_batch_size=args.generations,
                            num_generations=args.generations, max_completion_length=4096, learning_rate=1e-4,
                            logging_steps=1, save_strategy="no", report_to="none", beta=0.0, seed=0,
                            disable_tqdm=True)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
                              reward_funcs=[envforge_reward], rollout_func=rollout)
        trainer.train()
    summary = {"episodes": rollout.episodes, "generate_calls": rollout.generate_calls, "log": trainer.state.log_history}
    print(json.dumps(summary, default=str))
    return summary


if __name__ == "__main__":
    main()
