"""A policy over a local transformers causal LM, with its own sampling loop.

The loop is written out (rather than `generate`) so that the recorded log-probabilities are
exactly those of the distribution each token was drawn from: log-softmax of the float32
logits divided by the temperature. GRPO uses them as behaviour log-probs, and the test
suite recomputes them with one forward pass over prompt + completion.

Generation runs in a worker thread under a lock: the rollout scheduler's event loop stays
responsive, and a `reload` (new weights from training) never swaps the model mid-turn.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import time
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
        calls.append({"id": f"call_{n}", "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
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


class HFPolicy:
    """A `Policy` over a transformers causal LM loaded from a local directory, or given in memory.

    `HFPolicy("/ckpt/step-10")` or `HFPolicy((model, tokenizer))` / `HFPolicy(model, tokenizer)`;
    `device` is "cpu", "cuda[:n]" or "auto". An in-memory model is moved to device/dtype in place.
    Sampling is reproducible for a fixed seed on a given device. At temperature 0 decoding is
    greedy and the recorded log-probs are those of the unscaled model distribution (the
    point-mass sampling distribution would only ever give 0). The completion token ids
    include the stop token (`<|im_end|>` or eos) when one ended the turn, as vLLM reports
    them; the text does not."""

    def __init__(self, model: str | os.PathLike | PreTrainedModel | tuple[PreTrainedModel, PreTrainedTokenizerBase],
                 tokenizer: PreTrainedTokenizerBase | None = None, *, device: str = "cpu",
                 dtype: str | torch.dtype | None = None, policy_id: str | None = None, version: int = 0) -> None:
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
        model = self._model
        limit = getattr(model.config, "max_position_embeddings", None) or (len(prompt_ids) + max_tokens)
        budget = min(max_tokens, limit - len(prompt_ids))
        if budget <= 0:
            return _Generation(prompt_ids, [], [], "length")
        stops = self.stop_ids()
        generator = torch.Generator(device=self.device).manual_seed(int(seed) % (1 << 63))
        cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        cache = DynamicCache(config=model.config)
        inp = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        tokens: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        with torch.inference_mode():
            for _ in range(budget):
                out = model(input_ids=inp, use_cache=True, logits_to_keep=1, **{cache_kw: cache})
                logits = out.logits[0, -1].float()
                if temperature > 0:
                    logp = torch.log_softmax(logits / temperature, dim=-1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=generator).item())
                else:
                    logp = torch.log_softmax(logits, dim=-1)
                    tok = int(torch.argmax(logits).item())
                tokens.append(tok)
                logprobs.append(float(logp[tok].item()))
                if tok in stops:
                    finish = "stop"
                    break
                inp = torch.tensor([[tok]], dtype=torch.long, device=self.device)
        return _Generation(prompt_ids, tokens, logprobs, finish)

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, seed: int,
                 temperature: float = 1.0, max_tokens: int = 512) -> PolicyOutput:
        """One assistant turn, synchronously (what `act` runs in a worker thread)."""
        if temperature < 0:
            raise ValueError("temperature must be >= 0")
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        start = time.perf_counter()
        with self._lock:
            prompt_ids = self.encode_prompt(messages, tools)
            gen = self._sample(prompt_ids, seed=seed, temperature=temperature, max_tokens=max_tokens)
            body = gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids
            text = self._tokenizer.decode(body, skip_special_tokens=True)
        content, calls = parse_tool_calls(text)
        return PolicyOutput(text=content, tool_calls=calls, prompt_token_ids=gen.prompt_ids,
                            token_ids=gen.token_ids, logprobs=gen.logprobs, finish_reason=gen.finish_reason,
                            latency_s=time.perf_counter() - start)

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, seed: int,
                  temperature: float = 1.0, max_tokens: int = 512) -> PolicyOutput:
        return await asyncio.to_thread(self.generate, messages, tools, seed=seed, temperature=temperature,
                                       max_tokens=max_tokens)

    async def aclose(self) -> None:
        return None
