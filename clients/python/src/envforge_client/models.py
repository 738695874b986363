"""The HTTP API's request and response models: the service answers with them (through
`envforge.service.models`), the OpenAPI spec (docs/service-openapi.json) is generated from them, and
the clients parse responses with them."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

SHA256 = r"^[0-9a-f]{64}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Request(_Model):
    """A request body whose optional fields are absent or set, never null: the JSON schema says so
    (with the combinations it needs), so what the spec allows is exactly what the service accepts."""

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(k for k, v in data.items() if v is None and k in cls.model_fields)
            if nulls:
                raise ValueError(f"omit fields you do not set instead of sending null: {', '.join(nulls)}")
        return data


class ErrorDetail(_Model):
    code: str = Field(
        description="machine-readable: unauthorized, not_found, session_lost, quota_exceeded, "
        "request_too_large, invalid_request, infra_error, unavailable"
    )
    message: str = Field(description="what went wrong and what to do about it")


class ErrorResponse(_Model):
    error: ErrorDetail


class TaskSetOut(_Model):
    version: str = Field(description="content-hash version of the task set (immutable)")
    name: str = Field(description="the task set's name; new versions of a name replace older ones")
    n_tasks: int
    created_at: str


class TaskSetList(_Model):
    task_sets: list[TaskSetOut]


class TaskLimits(_Model):
    cpus: float
    memory_mb: int
    pids: int
    command_timeout_s: float
    trajectory_timeout_s: float


class TaskOut(_Model):
    task_id: str
    content_hash: str = Field(description="the exact task version; pass it to POST /sessions to pin it")
    index: int = Field(description="position in the task set (ordered by task id)")
    instruction: str
    source: str
    tags: list[str]
    max_turns: int
    tier: Optional[str] = Field(None, description="difficulty tier when the task set was tiered")
    split: Optional[str] = Field(None, description="train / eval / audit when the task set was tiered")
    limits: TaskLimits


class ToolFunction(_Model):
    name: str
    description: str
    parameters: dict[str, Any]


class Tool(_Model):
    type: Literal["function"]
    function: ToolFunction


class TaskList(_Model):
    task_set: TaskSetOut
    system_prompt: str = Field(description="the system prompt envforge's own rollouts use")
    tools: list[Tool] = Field(description="OpenAI tool definitions the actions follow")
    tasks: list[TaskOut]


class CreateSession(_Request):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [{"required": ["task_id"]}, {"required": ["content_hash"]}, {"required": ["task_set", "index"]}],
            "dependentRequired": {"index": ["task_set"]},
        },
    )

    task_id: Union[Annotated[str, Field(max_length=200)], SkipJsonSchema[None]] = Field(
        None,
        description="a task id (with task_set: in that set; alone: the newest task set this key may use that holds it)",
    )
    task_set: Union[Annotated[str, Field(max_length=200)], SkipJsonSchema[None]] = Field(
        None, description="task-set name, version or unique version prefix"
    )
    index: Union[Annotated[int, Field(ge=0, le=1_000_000)], SkipJsonSchema[None]] = Field(
        None, description="with task_set: the task at this position"
    )
    content_hash: Union[Annotated[str, Field(pattern=SHA256)], SkipJsonSchema[None]] = Field(
        None, description="pin the exact task version (what verl's reward looks up)"
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="recorded with the session")
    max_turns: Union[Annotated[int, Field(ge=1, le=10_000)], SkipJsonSchema[None]] = Field(
        None, description="fewer turns than the task allows"
    )

    @model_validator(mode="after")
    def _one_way_to_name_a_task(self) -> "CreateSession":
        if self.task_id is None and self.content_hash is None and (self.task_set is None or self.index is None):
            raise ValueError("name a task: task_id, task_set + index, or content_hash")
        if self.index is not None and self.task_set is None:
            raise ValueError("index needs task_set")
        return self


class Observation(_Model):
    text: str
    exit_code: Optional[int] = None
    error: Optional[str] = Field(None, description="set when the action was malformed or the tool failed")


class CheckpointOut(_Model):
    name: str
    passed: bool
    exit_code: int
    expected_exit: int
    stdout_matched: Optional[bool] = None
    timed_out: bool = False


class VerifyResult(_Model):
    task_id: str
    reward: float
    resolved: bool
    tests: dict[str, str] = Field(description="test id -> passed / failed / missing ...")
    checkpoints: list[CheckpointOut]
    reasons: list[str] = Field(description="why the reward is what it is (test_failed:<id>, checkpoint_failed:...)")
    patch_method: Optional[str] = None
    infra_error: Optional[str] = None
    duration_s: float
    logs: dict[str, str]


class SessionOut(_Model):
    session_id: str
    task_id: str
    content_hash: str
    task_set_version: str
    seed: int
    observation: Observation = Field(description="the first observation: instruction and the workspace's files")
    done: bool
    turn: int
    max_turns: int
    system_prompt: str
    tools: list[Tool]
    idle_timeout_s: float = Field(description="the session is reaped after this long without a request")


class SessionState(_Model):
    session_id: str
    task_id: str
    content_hash: str
    task_set_version: str
    seed: int
    done: bool
    turn: int
    max_turns: int
    end_reason: Optional[str] = None
    result: Optional[VerifyResult] = None
    idle_s: float


class SessionList(_Model):
    sessions: list[SessionState]


class ToolCallFunction(_Model):
    name: str = Field(max_length=200)
    arguments: Union[str, dict[str, Any]] = Field("{}", description="a JSON object, or its text")


class ToolCall(_Model):
    model_config = ConfigDict(extra="ignore")
    id: Optional[str] = Field(None, max_length=200)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class StepRequest(_Request):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"oneOf": [{"required": ["tool_call"]}, {"required": ["text"]}]}
    )

    tool_call: Union[ToolCall, SkipJsonSchema[None]] = Field(None, description="an OpenAI tool call")
    text: Union[str, SkipJsonSchema[None]] = Field(
        None,
        description='a reply holding <tool_call>{"name": ..., "arguments": {...}}</tool_call> (models '
        "without native tool calls)",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> "StepRequest":
        if (self.tool_call is None) == (self.text is None):
            raise ValueError("give exactly one of tool_call or text")
        return self


class StepOut(_Model):
    observation: Observation
    done: bool
    turn: int
    end_reason: Optional[str] = Field(None, description="submitted, max_turns or trajectory_timeout when done")
    result: Optional[VerifyResult] = Field(None, description="the verification result, on the terminal step")


class VerifyOut(_Model):
    result: VerifyResult
    done: bool = Field(description="whether the episode had ended (then this is its final grade)")


class SessionClosed(_Model):
    session_id: str
    turns: int
    reward: Optional[float] = None


class Health(_Model):
    status: Literal["ok"]
    boot_id: str = Field(description="changes when the service restarts; session ids carry it")
    sessions_open: int
    backend: dict[str, Any] = Field(
        description="the sandbox backend serving sessions (`backend`: `local-pool`, or "
        "`fleet` with its `nodes`, `in_use` and `idle_sandboxes`) and its statistics"
    )


# -- OpenEnv 0.3 under /openenv (envforge.service.routes.openenv, the WebSocket at /openenv/ws) --------


_NO_MCP_FIELDS = {"not": {"anyOf": [{"required": ["type"]}, {"required": ["tool_name"]}]}}
_NO_FORMS = {"anyOf": [{"required": ["name"]}, {"required": ["tool_call"]}, {"required": ["text"]}]}


class OpenEnvAction(_Request):
    """One action in any form an OpenEnv client sends: exactly one of `name` (+ `arguments`),
    `tool_call` or `text`; or OpenEnv's MCP actions, `type: call_tool` with `tool_name` (+
    `arguments`), or `type: list_tools` alone."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["name"], **_NO_MCP_FIELDS},
                {"required": ["tool_call"], **_NO_MCP_FIELDS},
                {"required": ["text"], **_NO_MCP_FIELDS},
                {"required": ["type", "tool_name"], "properties": {"type": {"const": "call_tool"}}, "not": _NO_FORMS},
                {
                    "required": ["type"],
                    "properties": {"type": {"const": "list_tools"}},
                    "not": {"anyOf": [*_NO_FORMS["anyOf"], {"required": ["tool_name"]}]},
                },
            ]
        },
    )

    type: Union[Literal["call_tool", "list_tools"], SkipJsonSchema[None]] = Field(
        None, description="OpenEnv's MCP actions"
    )
    tool_name: Union[Annotated[str, Field(max_length=200)], SkipJsonSchema[None]] = Field(
        None, description="with type call_tool: the tool"
    )
    name: Union[Annotated[str, Field(max_length=200)], SkipJsonSchema[None]] = Field(
        None, description="one of envforge's tools"
    )
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments")
    tool_call: Union[ToolCall, SkipJsonSchema[None]] = Field(None, description="an OpenAI tool call")
    text: Union[str, SkipJsonSchema[None]] = Field(None, description="a model's reply holding a <tool_call> block")

    @model_validator(mode="after")
    def _one_form(self) -> "OpenEnvAction":
        forms = [f for f in ("name", "tool_call", "text") if getattr(self, f) is not None]
        if self.type == "call_tool" and (self.tool_name is None or forms):
            raise ValueError("a call_tool action names its tool in tool_name (and sets nothing else but arguments)")
        if self.type == "list_tools" and (forms or self.tool_name is not None):
            raise ValueError("a list_tools action carries nothing else")
        if self.type is None and (len(forms) != 1 or self.tool_name is not None):
            raise ValueError("an action sets exactly one of name (+ arguments), tool_call or text")
        return self


class OpenEnvObservation(_Model):
    """An observation's fields: those of the action's form and the turn (reset: the session and the
    task; a step: the tool's output; list_tools: `tools`; call_tool: `tool_name`, `result`, `metadata`)."""

    text: Optional[str] = Field(None, description="the tool's output; on reset the task statement")
    exit_code: Optional[int] = None
    error: Optional[Any] = Field(None, description="why the action was refused; for call_tool: OpenEnv's ToolError")
    session_id: Optional[str] = Field(None, description="the episode: what HTTP steps and states name")
    episode_id: Optional[str] = Field(None, description="on reset: the episode_id the reset named")
    task_id: Optional[str] = None
    content_hash: Optional[str] = None
    task_set_version: Optional[str] = None
    seed: Optional[int] = None
    done: Optional[bool] = None
    turn: Optional[int] = None
    max_turns: Optional[int] = None
    end_reason: Optional[str] = None
    idle_timeout_s: Optional[float] = None
    system_prompt: Optional[str] = Field(None, description="on reset")
    tools: Optional[list[dict[str, Any]]] = Field(
        None, description="on reset: OpenAI function tools; for list_tools: MCP tools (name, description, inputSchema)"
    )
    result: Optional[dict[str, Any]] = Field(
        None, description="the verification result on the terminal step; for call_tool: MCP's CallToolResult"
    )
    tool_name: Optional[str] = Field(None, description="for call_tool")
    metadata: Optional[dict[str, Any]] = Field(None, description="for call_tool: session_id, turn, end_reason")


class OpenEnvResult(_Model):
    """OpenEnv's ResetResponse / StepResponse: the terminal step carries the verified reward."""

    observation: OpenEnvObservation
    reward: Optional[float] = None
    done: bool = False


class OpenEnvState(SessionState):
    """OpenEnv's State (episode_id, step_count = turns) with the session's state."""

    episode_id: str
    step_count: int


class OpenEnvResetRequest(CreateSession):
    episode_id: Union[Annotated[str, Field(max_length=255)], SkipJsonSchema[None]] = Field(
        None, description="OpenEnv's episode id, echoed in the reset's observation"
    )


class OpenEnvStepRequest(_Model):
    action: OpenEnvAction
    session_id: Optional[str] = Field(
        None, max_length=200, description="the episode (from /reset's observation); not needed for list_tools"
    )


class OpenEnvHealth(_Model):
    status: Literal["healthy"]


class OpenEnvMetadata(_Model):
    name: str
    description: str
    readme_content: Optional[str] = None
    version: Optional[str] = None
    author: Optional[str] = None
    documentation_url: Optional[str] = None


class OpenEnvSchema(_Model):
    action: dict[str, Any]
    observation: dict[str, Any]
    state: dict[str, Any]


class OpenEnvJsonRpcError(_Model):
    code: int = Field(
        description="JSON-RPC's: -32700 parse, -32600 request, -32601 method, -32602 params, -32000 server"
    )
    message: str
    data: Optional[Any] = Field(None, description="for server errors: envforge's error code (quota_exceeded, ...)")


class OpenEnvJsonRpcResponse(_Model):
    jsonrpc: Literal["2.0"]
    id: Optional[Union[int, str]] = None
    result: Optional[Any] = None
    error: Optional[OpenEnvJsonRpcError] = None
