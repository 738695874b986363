"""The request bodies `envforge policy serve` accepts, validated, and what it refuses.

The server stands in for `vllm serve`, so it takes the OpenAI fields trainers and eval
harnesses send. A field is either honoured, accepted because it cannot change the output
(`model`, `user`, `metadata`, ...), or refused with a 400 that names it: a parameter the
server cannot honour (guided decoding, `logit_bias`, a forced tool call, an unknown field)
is never silently ignored, because the client would get output that does not mean what it
asked for. vLLM ignores unknown fields with a log line; this server refuses them instead.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError, model_validator

from envforge.rollout.policies.hf import SamplingRow


class BadRequest(ValueError):
    """A request the server will not run; the message goes back to the client with a 400."""


_OPEN = ConfigDict(extra="allow")  # messages carry more than we read (name, tool_call_id, ...)
_Number = StrictFloat | StrictInt


class ToolCall(BaseModel):
    model_config = _OPEN
    function: dict[str, Any]


class ChatMessage(BaseModel):
    model_config = _OPEN
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list | None = None
    tool_calls: list[ToolCall] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class SamplingRequest(BaseModel):
    """The sampling parameters both endpoints share (OpenAI's, plus vLLM's `top_k`, `stop_token_ids`,
    `return_token_ids`)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: StrictBool | None = None
    service_tier: str | None = None
    request_id: str | None = None
    priority: StrictInt | None = None
    cache_salt: str | None = None
    temperature: _Number | None = Field(default=None, ge=0.0, le=100.0)
    top_p: _Number | None = Field(default=None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(default=None, ge=-1)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=1 << 20)
    seed: StrictInt | None = Field(default=None, ge=-(1 << 63), le=(1 << 64) - 1)
    n: StrictInt = Field(default=1, ge=1, le=128)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    presence_penalty: _Number | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: _Number | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Any] | None = None
    return_token_ids: StrictBool | None = None

    @model_validator(mode="after")
    def _refusals(self) -> SamplingRequest:
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def rows(self, prompt_ids: list[int], *, max_tokens: int, top_logprobs: int) -> list[SamplingRow]:
        """The `n` sampling rows of one prompt; choice j draws with seed + j (a random seed when none is given)."""
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        return [
            SamplingRow(
                prompt_ids,
                seed=seed + j,
                max_tokens=max_tokens,
                temperature=1.0 if self.temperature is None else float(self.temperature),
                top_p=1.0 if self.top_p is None else float(self.top_p),
                top_k=max(self.top_k or 0, 0),
                top_logprobs=top_logprobs,
                presence_penalty=float(self.presence_penalty or 0.0),
                frequency_penalty=float(self.frequency_penalty or 0.0),
                stop=self.stop_strings,
                stop_token_ids=tuple(self.stop_token_ids or ()),
            )
            for j in range(self.n)
        ]


class ChatRequest(SamplingRequest):
    """A chat-completions body, validated."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto"] | dict[str, Any] | str | None = None
    parallel_tool_calls: StrictBool | None = None
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=1 << 20)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _chat_refusals(self) -> ChatRequest:
        if self.tool_choice not in (None, "auto", "none"):
            raise ValueError(
                f"tool_choice {self.tool_choice!r} is not supported: this server cannot force a tool "
                'call (the chat template has no constrained decoding); use "auto" or "none"'
            )
        if self.parallel_tool_calls is False:
            raise ValueError("parallel_tool_calls=false is not supported: the server cannot limit a turn to one call")
        if self.response_format is not None and self.response_format.get("type") != "text":
            raise ValueError(
                f"response_format {self.response_format.get('type')!r} is not supported: this server "
                'has no guided decoding; only {"type": "text"}'
            )
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as the client sent them (`developer` read as `system`)."""
        out = [m.model_dump(exclude_unset=True) for m in self.messages]
        return [{**m, "role": "system"} if m["role"] == "developer" else m for m in out]

    @property
    def active_tools(self) -> list[dict[str, Any]]:
        """The tools rendered into the prompt and parsed out of the answer (none with tool_choice "none")."""
        return [] if self.tool_choice == "none" else list(self.tools or [])

    @property
    def completion_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 512

    @property
    def wants_token_ids(self) -> bool:
        return bool(self.return_token_ids) or self.logprobs

    def sampling_rows(self, prompt_ids: list[int]) -> list[SamplingRow]:
        return self.rows(
            prompt_ids, max_tokens=self.completion_tokens, top_logprobs=(self.top_logprobs or 0) if self.logprobs else 0
        )


class CompletionRequest(SamplingRequest):
    """A legacy completions body (`/v1/completions`), validated: no echo, no suffix, best_of = n."""

    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None

    @model_validator(mode="after")
    def _completion_refusals(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported by this server")
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of other than n is not supported by this server")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt must not be empty")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    @property
    def wants_token_ids(self) -> bool:
        return bool(self.return_token_ids)

    def sampling_rows(self, prompt_ids: list[int]) -> list[SamplingRow]:
        return self.rows(prompt_ids, max_tokens=self.max_tokens or 16, top_logprobs=self.logprobs or 0)


def _validate(model: type[SamplingRequest], body: Any) -> Any:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        parts = []
        for e in exc.errors():
            where = ".".join(str(x) for x in e["loc"]) or "body"
            if e["type"] == "extra_forbidden" and len(e["loc"]) == 1:
                parts.append(f"{where}: this server does not support the parameter {where!r}")
            else:
                parts.append(f"{where}: {e['msg']}")
        raise BadRequest("; ".join(parts)) from None


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a chat-completions body; BadRequest names each bad or refused field and what is wrong with it."""
    return _validate(ChatRequest, body)


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a completions body; BadRequest names each bad or refused field and what is wrong with it."""
    return _validate(CompletionRequest, body)
