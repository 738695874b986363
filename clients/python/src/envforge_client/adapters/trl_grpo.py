"""TRL's GRPOTrainer on envforge environments: a custom `rollout_func` that plays each prompt as a
multi-turn episode on the environment service, and a reward function that returns the verified reward.

    from envforge_client.adapters.trl_grpo import EnvforgeRollout, envforge_reward, task_dataset
    with EnvforgeClient(url, key) as client:
        dataset, tasks = task_dataset(client, "main")
        rollout = EnvforgeRollout(client, tasks, max_turns=8)
        trainer = GRPOTrainer(model=..., processing_class=tokenizer, args=GRPOConfig(...),
                              train_dataset=dataset, reward_funcs=[envforge_reward], rollout_func=rollout)
        trainer.train()

TRL's documented agentic route is `environment_factory` (`envforge_client.adapters.trl_env`); this one is
for trainers that want the raw-text `<tool_call>` protocol and their own token bookkeeping.

Generation is the trainer's: sampling comes from `trainer.args` (temperature, top_p, top_k, min_p,
repetition_penalty, generation_kwargs; `max_completion_length` bounds the whole episode's completion),
and every turn of a step is one batched call for all the episodes still running: through TRL's vLLM
backend (`trainer.vllm_generation`, whose weights TRL syncs before calling the rollout) when
`args.use_vllm`, else one left-padded `generate` on the model unwrapped with TRL's
`unwrap_model_for_generation` (ZeRO-3 parameters gathered, FSDP-1 parameters summoned, as TRL's own
generation does). Across processes the turns run in lockstep, so collective generation never hangs.

Token bookkeeping is tokens-in, tokens-out: each turn continues generation from the exact ids of the
prompt and everything so far, and an observation enters as the ids of the chat template's turn
boundary (rendered once by difference), so no turn is ever re-tokenized. Model tokens have
`env_mask` 1 and observation tokens 0, so the loss sees only what the model wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from envforge_client.client import Client as EnvforgeClient
from envforge_client.client import Session
from envforge_client.models import VerifyResult
from envforge_client.prompts import TOOLS, system_message, user_message

_SENTINEL = "\u2063envforge-turn-end\u2063"
_T = TypeVar("_T")


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


def generation_kwargs(trainer: Any, max_new_tokens: int) -> dict[str, Any]:
    """The Hugging Face generation settings TRL's own generation uses, read from `trainer.args`."""
    args, tokenizer = trainer.args, trainer.processing_class
    kwargs = {
        "max_new_tokens": max_new_tokens,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": list(trainer.eos_token_ids),
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": args.cache_implementation,
    }
    kwargs.update(args.generation_kwargs or {})
    return kwargs


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), left-padded to the longest sequence, as decoder-only generation needs."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def cut_turn(
    tokens: list[int], logprobs: list[float], stops: Iterable[int], limit: int
) -> tuple[list[int], list[float]]:
    """A generated turn up to and including its first stop token, and at most `limit` tokens."""
    stop_set = set(stops)
    keep = min(len(tokens), limit)
    for i, tok in enumerate(tokens[:keep]):
        if tok in stop_set:
            keep = i + 1
            break
    return tokens[:keep], logprobs[:keep]


@dataclass
class _Episode:
    ref: TaskRef
    prompt_ids: list[int]
    session: Session | None = None
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    running: bool = True
    turns: int = 0
    result: VerifyResult | None = None


class EnvforgeRollout:
    """`rollout_func(prompts, trainer) -> {prompt_ids, completion_ids, logprobs, env_mask, envforge_reward}`.

    `max_new_tokens` caps one turn (default: what is left of `args.max_completion_length`)."""

    def __init__(
        self,
        client: EnvforgeClient,
        tasks: dict[str, TaskRef],
        max_turns: int = 8,
        max_new_tokens: int | None = None,
        max_parallel_requests: int = 32,
    ):
        self.client, self.tasks = client, tasks
        self.max_turns, self.max_new_tokens = max_turns, max_new_tokens
        self.max_parallel_requests = max_parallel_requests
        self.episodes: list[dict[str, Any]] = []  # what each episode did (turns, reward, session id)
        self.generate_calls: list[int] = []  # the batch size of each generation call (one per turn)

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

    # -- generation: one batched call per turn ------------------------------------------------------

    def generate(
        self, trainer: Any, sequences: list[list[int]], limits: list[int]
    ) -> list[tuple[list[int], list[float]]]:
        """(tokens, logprobs) of the next turn of every sequence, each cut at its first stop and its limit."""
        self.generate_calls.append(len(sequences))
        if trainer.args.use_vllm:
            # The server mode slices the gathered answers by equal shares: every process sends as many.
            width = self._widest(trainer, len(sequences))
            padded = sequences + [sequences[0]] * (width - len(sequences))
            _, completions, logprobs, _ = trainer.vllm_generation.generate(
                prompts=padded, images=None, num_generations=1
            )
            turns = [
                (list(c), [float(lp[0]) for lp in lps])
                for c, lps in zip(completions[: len(sequences)], logprobs[: len(sequences)], strict=True)
            ]
        else:
            turns = self._generate_hf(trainer, sequences, max(limits))
        stops = trainer.eos_token_ids
        return [cut_turn(tokens, lps, stops, limit) for (tokens, lps), limit in zip(turns, limits, strict=True)]

    @staticmethod
    def _generate_hf(
        trainer: Any, sequences: list[list[int]], max_new_tokens: int
    ) -> list[tuple[list[int], list[float]]]:
        from transformers import GenerationConfig
        from trl.distributed import DistributedBackend
        from trl.models import unwrap_model_for_generation

        args = trainer.args
        kwargs = generation_kwargs(trainer, max_new_tokens)
        ids, mask = left_pad(sequences, trainer.processing_class.pad_token_id)
        device = trainer.accelerator.device
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                gather_deepspeed3_params=args.ds3_gather_for_generation,
                generation_kwargs=kwargs,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
            DistributedBackend(trainer.accelerator).summon_full_params(trainer.model_wrapped, recurse=False),
        ):
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                generation_config=GenerationConfig(
                    **kwargs, output_scores=True, return_dict_in_generate=True, disable_compile=True
                ),
            )
            scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        new = out.sequences[:, ids.shape[1] :].tolist()
        return [(row, [float(x) for x in s]) for row, s in zip(new, scores.tolist(), strict=True)]

    @staticmethod
    def _widest(trainer: Any, count: int) -> int:
        accelerator = trainer.accelerator
        if accelerator.num_processes == 1:
            return count
        return int(accelerator.gather(torch.tensor([count], device=accelerator.device)).max())

    @staticmethod
    def _anyone_running(trainer: Any, running: int) -> bool:
        """Whether any process still has an episode running: generation is collective across processes
        (vLLM server slices, ZeRO-3 gathers, FSDP), so every process takes every turn while one does."""
        accelerator = trainer.accelerator
        if accelerator.num_processes == 1:
            return running > 0
        counts = accelerator.gather(torch.tensor([running], device=accelerator.device))
        return bool(int(counts.sum()) > 0)

    def _parallel(self, fn: Callable[[_T], Any], items: list[_T]) -> list[Any]:
        """Service calls for several episodes at once (sandbox commands are slow, HTTP is not the limit)."""
        if len(items) <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel_requests, len(items))) as pool:
            return list(pool.map(fn, items))

    # -- the episodes of one step -----------------------------------------------------------------

    def _episode_for(self, prompt: list[dict[str, Any]], tokenizer: Any) -> _Episode:
        user = next(m["content"] for m in reversed(prompt) if m["role"] == "user")
        ref = self.tasks.get(user)
        if ref is None:
            raise KeyError("a prompt that task_dataset did not make (its user message names no envforge task)")
        return _Episode(
            ref, list(tokenizer(self._render(tokenizer, prompt, True), add_special_tokens=False)["input_ids"])
        )

    def _open(self, episode: _Episode) -> None:
        ref = episode.ref
        episode.session = self.client.create_session(
            task_id=ref.task_id, task_set=ref.task_set_version, content_hash=ref.content_hash, max_turns=self.max_turns
        )

    def _play(self, trainer: Any, episodes: list[_Episode]) -> None:
        tokenizer, budget = trainer.processing_class, trainer.args.max_completion_length
        for turn in range(self.max_turns):
            live = [e for e in episodes if e.running]
            if not self._anyone_running(trainer, len(live)):
                return
            if live:
                sequences = [e.prompt_ids + e.completion for e in live]
                limits = [min(self.max_new_tokens or budget, budget - len(e.completion)) for e in live]
            else:  # this process is done but another is not: take the turn on a stand-in, discard it
                sequences, limits = [episodes[0].prompt_ids], [1]
            outputs = self.generate(trainer, sequences, limits)
            if not live:
                continue
            for e, (tokens, lps) in zip(live, outputs, strict=True):
                e.completion += tokens
                e.logprobs += lps
                e.mask += [1] * len(tokens)
            texts = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens, _ in outputs]
            steps = self._parallel(lambda pair: pair[0].session.step(text=pair[1]), list(zip(live, texts)))
            for e, (tokens, _), out in zip(live, outputs, steps, strict=True):
                e.turns = out.turn
                if out.done or len(e.completion) >= budget or turn == self.max_turns - 1:
                    e.running = False
                    continue
                last = tokenizer.decode(tokens[-1:]) if tokens else ""
                obs = self._observation_ids(tokenizer, out.observation.text, last)
                e.completion += obs
                e.logprobs += [0.0] * len(obs)
                e.mask += [0] * len(obs)
                e.running = len(e.completion) < budget  # an observation can fill what was left

    @staticmethod
    def _grade(episode: _Episode) -> None:
        session = episode.session
        assert session is not None
        episode.result = session.result if session.done and session.result is not None else session.verify().result

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        tokenizer = trainer.processing_class
        episodes = [self._episode_for(p, tokenizer) for p in prompts]
        try:
            self._parallel(self._open, episodes)
            self._play(trainer, episodes)
            self._parallel(self._grade, episodes)
        finally:
            self._parallel(lambda e: e.session.close(), [e for e in episodes if e.session is not None])
        cut = trainer.args.max_completion_length
        results: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "envforge_reward": [],
        }
        for e in episodes:
            assert e.session is not None and e.result is not None
            reward = float(e.result.reward)
            self.episodes.append(
                {"session_id": e.session.id, "task_id": e.ref.task_id, "turns": e.turns, "reward": reward}
            )
            results["prompt_ids"].append(e.prompt_ids)
            results["completion_ids"].append(e.completion[:cut])
            results["logprobs"].append(e.logprobs[:cut])
            results["env_mask"].append(e.mask[:cut])
            results["envforge_reward"].append(reward)
        return results
