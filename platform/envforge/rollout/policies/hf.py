"""A policy over a local transformers causal LM, with its own sampling loop.

The loop is written out (rather than `generate`) so that the recorded log-probabilities are
exactly those of the distribution each token was drawn from: log-softmax of the float32
logits divided by the temperature. GRPO uses them as behaviour log-probs, and the test
suite recomputes them with one forward pass over prompt + completion.

Generation runs in a worker thread under a lock: the rollout scheduler's event loop stays
responsive, and a `reload` (new weights from training) never swaps the model mid-turn.
`generate_batch` samples many rows (prompts with their own sampling parameters and seeds) in
one left-padded batch, for the policy server's batcher; a lone turn is a batch of one.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from envforge.rollout.actions import TOOL_CALL
from envforge.rollout.policies.base import IM_END, PolicyOutput
from envforge.rollout.policies.render import render_prompt


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split a plain-text turn into (content, OpenAI tool calls).

    Every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block becomes a call with
    id `call_<n>` and JSON-string arguments, and the blocks are removed from the content (the
    chat template writes them back from `tool_calls`, so keeping both would render them
    twice). If any block is malformed or unclosed, nothing is parsed and the text is kept
    whole: the environment turns it into an error observation."""
    blocks = list(TOOL_CALL.finditer(text))
    if not blocks or text.count("<tool_call>") != len(blocks):
        return text, []
    calls: list[dict[str, Any]] = []
    for n, m in enumerate(blocks):
        try:
            obj = json.loads(m.group("body"))
        except ValueError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models double-encode; keep it if it is a JSON object
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return text, []
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return text, []
        calls.append(
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    content = TOOL_CALL.sub("", text).strip()
    return content, calls


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """float32 on CPU (bf16 matmuls are slow there), bfloat16 on accelerators, unless told."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32 if str(device).startswith("cpu") else torch.bfloat16
    try:
        resolved = getattr(torch, str(dtype))
    except AttributeError:
        raise ValueError(f"unknown dtype {dtype!r}") from None
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


@dataclass
class _Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    #: per token, the `top_logprobs` most likely (token id, log-prob) of the same distribution
    top_logprobs: list[list[tuple[int, float]]] | None = None
    #: the text up to a stop string that ended the turn (None: decode the tokens)
    text: str | None = None


@dataclass
class SamplingRow:
    """One sequence to sample: a prompt and the OpenAI sampling parameters that apply to it.

    Penalties follow OpenAI's definition (subtracted from the logits, per generated occurrence
    for `frequency_penalty`, once for `presence_penalty`); `stop` strings end the turn and are
    cut from the text, as vLLM does; `top_p`/`top_k` restrict what can be drawn."""

    prompt_ids: list[int]
    seed: int
    temperature: float = 1.0
    max_tokens: int = 512
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


#: called from the sampling thread after each token of row `i`: (i, token id, log-prob, top log-probs)
TokenCallback = Callable[[int, int, float, list[tuple[int, float]] | None], None]


class HFPolicy:
    """A `Policy` over a transformers causal LM loaded from a local directory, or given in memory.

    `HFPolicy("/ckpt/step-10")` or `HFPolicy((model, tokenizer))` / `HFPolicy(model, tokenizer)`;
    `device` is "cpu", "cuda[:n]" or "auto". An in-memory model is moved to device/dtype in place.
    Sampling is reproducible for a fixed seed on a given device. At temperature 0 decoding is
    greedy and the recorded log-probs are those of the unscaled model distribution (the
    point-mass sampling distribution would only ever give 0). The completion token ids
    include the stop token (`<|im_end|>` or eos) when one ended the turn, as vLLM reports
    them; the text does not."""

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel | tuple[PreTrainedModel, PreTrainedTokenizerBase],
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        device: str = "cpu",
        dtype: str | torch.dtype | None = None,
        policy_id: str | None = None,
        version: int = 0,
    ) -> None:
        if device == "auto":  # what `make_policy("hf:<path>")` wants: the GPU when there is one
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, str(device))
        self._lock = threading.Lock()
        self._auto_id = policy_id is None
        if isinstance(model, tuple):
            model, tokenizer = model
        if isinstance(model, (str, os.PathLike)):
            self.model_path: str | None = str(Path(model).resolve())
            self._model, loaded = self._load(self.model_path, need_tokenizer=tokenizer is None)
            self._tokenizer = tokenizer if tokenizer is not None else loaded
        else:
            if tokenizer is None:
                raise ValueError("an in-memory model needs its tokenizer")
            self.model_path = None
            self._model, self._tokenizer = self._prepare(model), tokenizer
        self.version = version
        self.policy_id = policy_id or self._default_id()

    # -- loading ---------------------------------------------------------------------------------

    def _default_id(self) -> str:
        return f"hf:{self.model_path or 'memory'}"

    def _prepare(self, model: PreTrainedModel) -> PreTrainedModel:
        return model.to(device=self.device, dtype=self.dtype).eval()

    def _load(self, path: str, *, need_tokenizer: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
        p = Path(path)
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a checkpoint directory (no config.json)")
        model = AutoModelForCausalLM.from_pretrained(p, local_files_only=True, dtype=self.dtype)
        tokenizer = None
        if need_tokenizer or (p / "tokenizer_config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(p, local_files_only=True)
        return self._prepare(model), tokenizer

    def reload(self, path: str | os.PathLike) -> int:
        """Swap in the weights (and tokenizer, if the directory has one) of a new checkpoint.

        The new model is loaded before taking the lock, so generation pauses only for the swap.
        Returns the new version."""
        path = str(Path(path).resolve())
        model, tokenizer = self._load(path, need_tokenizer=False)
        with self._lock:
            self._model = model
            if tokenizer is not None:
                self._tokenizer = tokenizer
            self.model_path = path
            self.version += 1
            if self._auto_id:
                self.policy_id = self._default_id()
            return self.version

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    # -- generation ------------------------------------------------------------------------------

    def encode_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Prompt ids from the chat template, control tokens in message text sanitized (`render_prompt`)."""
        return render_prompt(self._tokenizer, messages, tools)

    def stop_ids(self) -> set[int]:
        """eos, `<|im_end|>` when the vocabulary has it, and the generation config's eos ids."""
        ids = [self._tokenizer.eos_token_id]
        if IM_END in self._tokenizer.get_vocab():
            ids.append(self._tokenizer.convert_tokens_to_ids(IM_END))
        gen_eos = getattr(getattr(self._model, "generation_config", None), "eos_token_id", None)
        ids.extend(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        return {i for i in ids if isinstance(i, int) and i >= 0}

    def _sample(self, prompt_ids: list[int], *, seed: int, temperature: float, max_tokens: int) -> _Generation:
        return self._sample_batch([SamplingRow(prompt_ids, seed, temperature, max_tokens)])[0]

    def generate_batch(
        self,
        rows: list[SamplingRow],
        on_token: TokenCallback | None = None,
    ) -> tuple[list[_Generation], int]:
        """Sample every row in one padded batch; (generations in row order, the policy version that made them).

        Holds the lock for the whole batch, so a `reload` lands between batches, never inside one."""
        with self._lock:
            return self._sample_batch(rows, on_token), self.version

    def _sample_batch(self, rows: list[SamplingRow], on_token: TokenCallback | None = None) -> list[_Generation]:
        """Left-padded batched decoding with a KV cache: one forward pass per step for every row.

        Each row draws from its own seeded generator, so a row samples the same tokens as it
        would alone (up to the float noise of batched matmuls). A prompt without padding is
        run without an attention mask, exactly as a lone prompt is."""
        model = self._model
        limit = getattr(model.config, "max_position_embeddings", None)
        gens = [_Generation(r.prompt_ids, [], [], "length", [] if r.top_logprobs else None) for r in rows]
        budgets = [min(r.max_tokens, (limit or len(r.prompt_ids) + r.max_tokens) - len(r.prompt_ids)) for r in rows]
        live = [i for i, b in enumerate(budgets) if b > 0]
        if not live:
            return gens
        base_stops = self.stop_ids()
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        lengths = [len(rows[i].prompt_ids) for i in live]
        width = max(lengths)
        padded = any(n != width for n in lengths)
        inp = torch.tensor(
            [[pad] * (width - len(rows[i].prompt_ids)) + list(rows[i].prompt_ids) for i in live],
            dtype=torch.long,
            device=self.device,
        )
        mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths], dtype=torch.long, device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator(device=self.device).manual_seed(int(rows[i].seed) % (1 << 63)) for i in live]
        penalized = any(rows[i].presence_penalty or rows[i].frequency_penalty for i in live)
        counts = torch.zeros(len(live), model.config.vocab_size, device=self.device) if penalized else None
        cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        cache = DynamicCache(config=model.config)
        done = [False] * len(live)
        with torch.inference_mode():
            for _ in range(max(budgets[i] for i in live)):
                kw: dict[str, Any] = {"input_ids": inp, "use_cache": True, "logits_to_keep": 1, cache_kw: cache}
                if padded:
                    kw.update(attention_mask=mask, position_ids=positions)
                logits = model(**kw).logits[:, -1].float()
                chosen: list[int] = []
                for j, i in enumerate(live):
                    if done[j]:
                        chosen.append(pad)
                        continue
                    row, gen = rows[i], gens[i]
                    tok, lp, top = self._draw(logits[j], row, generators[j], None if counts is None else counts[j])
                    chosen.append(tok)
                    gen.token_ids.append(tok)
                    gen.logprobs.append(lp)
                    if gen.top_logprobs is not None:
                        gen.top_logprobs.append(top or [])
                    if counts is not None:
                        counts[j, tok] += 1
                    if on_token is not None:
                        on_token(i, tok, lp, top)
                    if tok in base_stops or tok in row.stop_token_ids:
                        gen.finish_reason, done[j] = "stop", True
                    elif row.stop and self._cut_at_stop(gen, row.stop):
                        done[j] = True
                    elif len(gen.token_ids) >= budgets[i]:
                        done[j] = True
                if all(done):
                    break
                inp = torch.tensor([[t] for t in chosen], dtype=torch.long, device=self.device)
                if padded:
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                    positions = positions[:, -1:] + 1
        return gens

    @staticmethod
    def _draw(
        logits: torch.Tensor,
        row: SamplingRow,
        generator: torch.Generator,
        counts: torch.Tensor | None,
    ) -> tuple[int, float, list[tuple[int, float]] | None]:
        """One token of one row: (token, its log-prob, the top log-probs) under the row's sampling distribution.

        The log-probs are of the penalized, temperature-scaled distribution (vLLM's
        `processed_logprobs`), before top-p/top-k truncation; greedy decoding reports the
        unscaled distribution."""
        if counts is not None and (row.frequency_penalty or row.presence_penalty):
            logits = logits - row.frequency_penalty * counts - row.presence_penalty * (counts > 0).float()
        if row.temperature > 0:
            logp = torch.log_softmax(logits / row.temperature, dim=-1)
            probs = logp.exp()
            if row.top_k and row.top_k < probs.numel():
                kth = torch.topk(probs, row.top_k).values[-1]
                probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
            if row.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                keep = (sorted_probs.cumsum(0) - sorted_probs) < row.top_p * sorted_probs.sum()
                probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
            tok = int(torch.multinomial(probs, 1, generator=generator).item())
        else:
            logp = torch.log_softmax(logits, dim=-1)
            tok = int(torch.argmax(logits).item())
        top = None
        if row.top_logprobs:
            values, ids = torch.topk(logp, min(row.top_logprobs, logp.numel()))
            top = [(int(t), float(v)) for t, v in zip(ids.tolist(), values.tolist())]
        return tok, float(logp[tok].item()), top

    def _cut_at_stop(self, gen: _Generation, stop: tuple[str, ...]) -> bool:
        """If the text so far contains a stop string, keep the text before it and end the turn."""
        text = self._tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        hits = [k for k in (text.find(s) for s in stop if s) if k >= 0]
        if not hits:
            return False
        gen.text, gen.finish_reason = text[: min(hits)], "stop"
        return True

    def completion_text(self, gen: _Generation) -> str:
        """The text of a generation: cut at its stop string, else its tokens without the stop token."""
        if gen.text is not None:
            return gen.text
        body = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
        return self._tokenizer.decode(body, skip_special_tokens=True)

    def generate(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        seed: int,
        temperature: float = 1.0,
        max_tokens: int = 512,
    ) -> PolicyOutput:
        """One assistant turn, synchronously (what `act` runs in a worker thread)."""
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        start = time.perf_counter()
        with self._lock:
            prompt_ids = self.encode_prompt(messages, tools)
            gen = self._sample(prompt_ids, seed=seed, temperature=temperature, max_tokens=max_tokens)
            text = self.completion_text(gen)
        content, calls = parse_tool_calls(text)
        return PolicyOutput(
            text=content,
            tool_calls=calls,
            prompt_token_ids=gen.prompt_ids,
            token_ids=gen.token_ids,
            logprobs=gen.logprobs,
            finish_reason=gen.finish_reason,
            latency_s=time.perf_counter() - start,
        )

    async def act(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        seed: int,
        temperature: float = 1.0,
        max_tokens: int = 512,
    ) -> PolicyOutput:
        return await asyncio.to_thread(
            self.generate, messages, tools, seed=seed, temperature=temperature, max_tokens=max_tokens
        )

    async def aclose(self) -> None:
        return None
