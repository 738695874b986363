"""One string names a policy everywhere (CLI, Dagster config, Python):

| spec | policy |
|---|---|
| `replay` | the task's reference solution as tool calls (`replay-text`: as `<tool_call>` text) |
| `replay-skip:<rate>` | a deliberately worse replay: that share of episodes submit without the solution |
| `openai:<base_url>[#<model>]` | an OpenAI-compatible server: `vllm serve`, SGLang, `envforge policy serve`, hosted |
| `hf:<path>` | a local Hugging Face causal LM (CPU, or GPU when available) |
| `vllm:<path>` | vLLM in-process (the `gpu` extra) |
"""

from __future__ import annotations

from typing import Any


def make_policy(spec: str, **kwargs: Any) -> Any:
    kind, _, rest = spec.partition(":")
    if spec in ("replay", "replay-text"):
        from envforge.rollout.policies.replay import ReplayPolicy

        return ReplayPolicy(as_text=spec == "replay-text")
    if kind == "replay-skip":
        from envforge.rollout.policies.replay import ReplayPolicy

        try:
            return ReplayPolicy(skip_rate=float(rest))
        except ValueError as exc:
            raise ValueError(f"policy {spec!r}: replay-skip:<rate> needs a rate within [0, 1] ({exc})") from None
    if kind == "openai" and rest:
        from envforge.rollout.policies.openai_client import OpenAIChatPolicy

        url, _, model = rest.partition("#")
        return OpenAIChatPolicy(url, model or "envforge", **kwargs)
    if kind == "hf" and rest:
        from envforge.rollout.policies.hf import HFPolicy

        return HFPolicy(rest, **{"device": "auto", **kwargs})
    if kind == "vllm" and rest:
        from envforge.rollout.policies.vllm_policy import VLLMPolicy

        return VLLMPolicy(rest, **kwargs)
    raise ValueError(
        f"unknown policy {spec!r}: use replay, replay-text, replay-skip:<rate>, openai:<base_url>[#<model>], hf:<path> "
        f"or vllm:<path>"
    )
