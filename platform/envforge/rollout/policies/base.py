"""The one interface every policy implements, and what it returns.

A policy sees the conversation so far (OpenAI chat messages: system, user, assistant with
optional `tool_calls`, and `tool` results) plus the tool definitions, and returns one
assistant turn. Policies that own their tokens (local transformers, vLLM in-process, or a
server that returns them) also return the prompt and completion token ids and the
log-probability of each completion token under the sampling distribution, which GRPO needs
as behaviour log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# The end-of-turn marker of the ChatML template every local policy uses (tiny, Qwen-style checkpoints).
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


@dataclass
class PolicyOutput:
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(
        default_factory=list
    )  # OpenAI format: {id, type, function:{name, arguments}}
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None  # completion tokens
    logprobs: list[float] | None = None  # one per completion token
    finish_reason: str = "stop"
    latency_s: float = 0.0

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids or [])


class PolicyError(Exception):
    """The policy could not produce a turn (transport failure after retries, server error).

    An infrastructure fault from the scheduler's point of view: retried, never scored."""


@runtime_checkable
class Policy(Protocol):
    #: stable identifier, e.g. "replay", "hf:/models/x@step-120", "openai:http://host/v1:model"
    policy_id: str
    #: checkpoint version (monotonic int) for staleness accounting; 0 when not applicable
    version: int

    async def act(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        seed: int,
        temperature: float = 1.0,
        max_tokens: int = 512,
    ) -> PolicyOutput: ...

    async def aclose(self) -> None: ...
