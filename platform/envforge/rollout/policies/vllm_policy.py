"""A policy over an in-process vLLM engine (`vllm.LLM`), for GPU rollouts without a server.

vLLM is imported only when the policy is built, so the rest of envforge runs without the
`gpu` extra. The prompt is rendered with the checkpoint's own chat template (the same one
`HFPolicy` uses) and passed as token ids, so the recorded prompt ids are exactly what the
engine saw. For many concurrent rollouts prefer `vllm serve` + `OpenAIChatPolicy`: one
`LLM.generate` call per turn serializes turns that a server would batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from typing import Any

from envforge.rollout.policies.base import IM_END, PolicyOutput
from envforge.rollout.policies.render import render_prompt


class VLLMPolicy:
    """A `Policy` over `vllm.LLM(model=model_path, **engine_kwargs)`.

    Log-probs are requested with `SamplingParams(logprobs=0)` (the sampled token only). Where
    the installed vLLM has `logprobs_mode`, it defaults to `processed_logprobs` so they are of
    the temperature-scaled distribution actually sampled from, like `HFPolicy`'s; vLLM's own
    default reports the raw model distribution."""

    def __init__(
        self, model_path: str | os.PathLike, *, policy_id: str | None = None, version: int = 0, **engine_kwargs: Any
    ) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                "VLLMPolicy needs vLLM, which is not installed: install the `gpu` extra "
                "(pip install 'envforge[gpu]') on a machine with a supported GPU"
            ) from exc
        try:
            from vllm.engine.arg_utils import EngineArgs

            if "logprobs_mode" in {f.name for f in dataclasses.fields(EngineArgs)}:
                engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        except (ImportError, TypeError):
            pass
        self._sampling_params = vllm.SamplingParams
        self.model_path = str(model_path)
        self.llm = vllm.LLM(model=self.model_path, **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.policy_id = policy_id or f"vllm:{self.model_path}"
        self.version = version
        self._lock = threading.Lock()
        vocab = self.tokenizer.get_vocab()
        self._extra_stops = [vocab[IM_END]] if IM_END in vocab else []

    def encode_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return render_prompt(self.tokenizer, messages, tools)

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
        from envforge.rollout.policies.hf import parse_tool_calls  # shares the Hermes parser

        start = time.perf_counter()
        prompt_ids = self.encode_prompt(messages, tools)
        params = self._sampling_params(
            seed=seed, temperature=temperature, max_tokens=max_tokens, logprobs=0, stop_token_ids=self._extra_stops
        )
        with self._lock:
            result = self.llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)[0]
        completion = result.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = None
        if completion.logprobs is not None:
            logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs)]
        content, calls = parse_tool_calls(completion.text)
        return PolicyOutput(
            text=content,
            tool_calls=calls,
            prompt_token_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=completion.finish_reason or "stop",
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
