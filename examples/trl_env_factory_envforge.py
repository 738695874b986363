"""TRL's GRPOTrainer on envforge environments the documented way, `environment_factory`, on CPU.

    envforge service keys create --tenant demo            # prints a key
    envforge service serve &                              # http://127.0.0.1:8080
    ENVFORGE_API_KEY=efk_... python examples/trl_env_factory_envforge.py --task-set main --steps 1

Each rollout is one `EnvforgeToolEnv` (envforge_client.adapters.trl_env): `reset` opens a session on the
row's task, the model's tool calls (`run`, `read_file`, `write_file`, `apply_patch`, `submit`) are steps of
that session, run by TRL's own tool loop, and the reward is the verifier's (`rewards/EnvforgeToolEnv`).

The model is envforge's tiny test model (random weights, built in code: nothing is downloaded), which
never writes a tool call on its own. `--bias-toward TEXT` adds a logit bias to the trainer's sampling
(`GRPOConfig.generation_kwargs["sequence_bias"]`) so that it writes TEXT, e.g. a fix and a submit:
the tools, the sandbox and the verifier then do real work. Swap in a real checkpoint (`--model DIR`) to learn.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from envforge_client import Client
from envforge_client.adapters.trl_env import EnvforgeEnvironments, tool_task_dataset

# The tool calls a fix of the inventory-median-even task takes: one command, then submit.
FIX_MEDIAN = (
    '<tool_call>{"name": "run", "arguments": {"command": "sed -i \'s/return ordered\\\\[mid\\\\]$/return '
    "(ordered[mid] + ordered[~mid]) \\\\/ 2/' inventory/stats.py\"}}</tool_call>\n"
    '<tool_call>{"name": "submit", "arguments": {}}</tool_call><|im_end|>'
)


def sequence_bias_toward(tokenizer, text: str) -> list[list]:
    """A `sequence_bias` under which sampling writes `text`: each prefix of its ids biases the prefix's
    last token, longer prefixes more, so the longest prefix already written decides the next token."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [[ids[: k + 1], 50.0 * (k + 1)] for k in range(len(ids))]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("ENVFORGE_SERVICE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--task-set", default="main")
    parser.add_argument("--task", default=None, help="train on this task id only")
    parser.add_argument("--model", default=None, help="a local Hugging Face checkpoint (default: the tiny model)")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=8, help="steps one session allows")
    parser.add_argument("--max-tool-calls", type=int, default=2, help="TRL's max_tool_calling_iterations")
    parser.add_argument("--max-completion-length", type=int, default=256)
    parser.add_argument("--bias-toward", default=None, help="text the sampling is biased to write ('fix-median': a fix)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    else:
        from envforge.rollout.policies.tiny import build_tiny_model

        model, tokenizer = build_tiny_model()
        # Its template is ChatML with Hermes `<tool_call>`s, the Qwen convention; TRL recognises templates
        # by their exact text, so name the parser that reads it.
        tokenizer.response_template = qwen3_template
    bias = {"fix-median": FIX_MEDIAN}.get(args.bias_toward, args.bias_toward)
    started = time.monotonic()
    with Client(args.url) as client, EnvforgeEnvironments(client, max_turns=args.max_turns) as environments:
        dataset = tool_task_dataset(client, args.task_set)
        if args.task:
            dataset = dataset.filter(lambda row: row["task_id"] == args.task)
        config = GRPOConfig(
            output_dir=args.out or tempfile.mkdtemp(prefix="grpo-env-"),
            use_cpu=True,
            bf16=False,
            max_steps=args.steps,
            per_device_train_batch_size=args.generations,
            num_generations=args.generations,
            max_completion_length=args.max_completion_length,
            max_tool_calling_iterations=args.max_tool_calls,
            generation_kwargs={"sequence_bias": sequence_bias_toward(tokenizer, bias)} if bias else None,
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            beta=0.0,
            seed=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model, processing_class=tokenizer, args=config, train_dataset=dataset, environment_factory=environments
        )
        trainer.train()
    summary = {
        "episodes": environments.episodes,
        "log": trainer.state.log_history,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary, default=str))
    return summary


if __name__ == "__main__":
    main()
