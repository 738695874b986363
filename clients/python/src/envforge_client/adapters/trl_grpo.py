"""TRL's GRPOTrainer on envforge environments: a custom `rollout_func` that plays each prompt as a
multi-turn episode on the environment service, and a reward function that returns the verified reward.

    from envforge_client.adapters.trl_grpo import EnvforgeRollout, envforge_reward, task_dataset
    with EnvforgeClient(url, key) as client:
        dataset, tasks = task_dataset(client, "main")
        rollout = EnvforgeRollout(client, tasks, max_turns=8, max_new_tokens=256)
        trainer = GRPOTrainer(model=..., processing_class=tokenizer, args=GRPOConfig(...),
                              train_dataset=dataset, reward_funcs=[envforge_reward], rollout_func=rollout)
        trainer.train()

Token bookkeeping is tokens-in, tokens-out: each turn continues generation from the exact ids of the
prompt and everything so far, and an observation enters as the ids of the chat template's turn
boundary (rendered once by difference), so no turn is ever re-tokenized. Model tokens have
`env_mask` 1 and observation tokens 0, so the loss sees only what the model wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from envforge_client.client import Client as EnvforgeClient
from envforge_client.prompts import TOOLS, system_message, user_message

_SENTINEL = "\u2063envforge-turn-end\u2063"


@dataclass(frozen=True)
class TaskRef:
    task_id: str
    content_hash: str
    task_set_version: str


def task_dataset(client: EnvforgeClient, task_set: str, split: str | None = None):
    """(a `datasets.Dataset` of conversational prompts, {user message: TaskRef}) for a task set's tasks.

    The rollout function receives only prompts, so it finds each prompt's task by its user message."""
    import datasets

    listing = client.tasks(task_set)
    rows, refs = [], {}
    for t in listing.tasks:
        if split is not None and t.split not in (split, None):
            continue
        user = user_message(t.instruction)
        if user in refs:
            raise ValueError(
                f"tasks {refs[user].task_id} and {t.task_id} have the same instruction; the rollout "
                "function could not tell their prompts apart"
            )
        refs[user] = TaskRef(t.task_id, t.content_hash, listing.task_set.version)
        rows.append(
            {
                "prompt": [{"role": "system", "content": system_message()}, {"role": "user", "content": user}],
                "task_id": t.task_id,
            }
        )
    return datasets.Dataset.from_list(rows), refs


def envforge_reward(completions: list[Any], envforge_reward: list[float] | None = None, **kwargs: Any) -> list[float]:
    """The reward function for GRPOTrainer: the verified reward the rollout function got from the service."""
    if envforge_reward is None:
        raise ValueError("envforge_reward needs EnvforgeRollout as the trainer's rollout_func")
    return [float(r) for r in envforge_reward]


class EnvforgeRollout:
    """`rollout_func(prompts, trainer) -> {prompt_ids, completion_ids, logprobs, env_mask, envforge_reward}`."""

    def __init__(
        self,
        client: EnvforgeClient,
        tasks: dict[str, TaskRef],
        max_turns: int = 8,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        max_completion_tokens: int = 4096,
    ):
        self.client, self.tasks = client, tasks
        self.max_turns, self.max_new_tokens, self.temperature = max_turns, max_new_tokens, temperature
        self.max_completion_tokens = max_completion_tokens
        self.episodes: list[dict[str, Any]] = []  # what each episode did (turns, reward, session id)

    # -- chat-template plumbing ---------------------------------------------------------------

    @staticmethod
    def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _observation_ids(self, tokenizer: Any, observation: str, last_token_text: str) -> list[int]:
        """The ids that close the model's turn and present the observation as the next user turn."""
        head = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        before = self._render(tokenizer, head, False)
        after = self._render(tokenizer, head + [{"role": "user", "content": observation}], True)
        if not after.startswith(before):
            raise ValueError("the chat template renders earlier turns differently once a turn is added")
        end_of_turn = before[before.rindex(_SENTINEL) + len(_SENTINEL) :]
        if last_token_text and end_of_turn.startswith(last_token_text):
            end_of_turn = end_of_turn[len(last_token_text) :]  # the model already wrote its stop token
        return list(tokenizer(end_of_turn + after[len(before) :], add_special_tokens=False)["input_ids"])

    def _generate(self, model: Any, tokenizer: Any, ids: list[int]) -> tuple[list[int], list[float]]:
        stops = [
            i
            for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
            if isinstance(i, int) and i >= 0
        ]
        inputs = torch.tensor([ids], device=model.device)
        with torch.no_grad():
            out = model.generate(
                input_ids=inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=self.max_new_tokens,
                do_sample=self.temperature > 0,
                temperature=self.temperature if self.temperature > 0 else None,
                eos_token_id=stops,
                pad_token_id=tokenizer.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
        new = out.sequences[0, len(ids) :]
        scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0]
        keep = len(new)
        for i, tok in enumerate(new.tolist()):
            if tok in stops:
                keep = i + 1
                break
        return new[:keep].tolist(), [float(x) for x in scores[:keep].tolist()]

    # -- one episode --------------------------------------------------------------------------

    def episode(self, prompt: list[dict[str, Any]], model: Any, tokenizer: Any) -> dict[str, Any]:
        user = next(m["content"] for m in reversed(prompt) if m["role"] == "user")
        ref = self.tasks.get(user)
        if ref is None:
            raise KeyError("a prompt that task_dataset did not make (its user message names no envforge task)")
        prompt_ids = list(tokenizer(self._render(tokenizer, prompt, True), add_special_tokens=False)["input_ids"])
        completion: list[int] = []
        logprobs: list[float] = []
        mask: list[int] = []
        with self.client.create_session(
            task_id=ref.task_id, task_set=ref.task_set_version, content_hash=ref.content_hash, max_turns=self.max_turns
        ) as session:
            for _ in range(self.max_turns):
                tokens, lps = self._generate(model, tokenizer, prompt_ids + completion)
                completion += tokens
                logprobs += lps
                mask += [1] * len(tokens)
                text = tokenizer.decode(tokens, skip_special_tokens=True)
                out = session.step(text=text)
                if out.done or len(completion) >= self.max_completion_tokens:
                    break
                last = tokenizer.decode(tokens[-1:]) if tokens else ""
                obs = self._observation_ids(tokenizer, out.observation.text, last)
                completion += obs
                logprobs += [0.0] * len(obs)
                mask += [0] * len(obs)
            result = session.result if session.done else session.verify().result
            turns = session.state().turn
        episode = {"session_id": session.id, "task_id": ref.task_id, "turns": turns, "reward": float(result.reward)}
        self.episodes.append(episode)
        cut = self.max_completion_tokens
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion[:cut],
            "logprobs": logprobs[:cut],
            "env_mask": mask[:cut],
            "envforge_reward": float(result.reward),
        }

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        tokenizer = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            results = [self.episode(p, model, tokenizer) for p in prompts]
        finally:
            model.train(was_training)
        return {k: [r[k] for r in results] for k in results[0]}
