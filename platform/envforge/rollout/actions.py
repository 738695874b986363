"""The tool set a policy acts with, accepted as OpenAI tool calls or parsed from plain text.

Tools:

| tool | arguments | effect |
|---|---|---|
| `run` | `command` (str), optional `timeout_s` | run a shell command in /workspace (bash -lc), as the sandbox user |
| `read_file` | `path` (str, relative to /workspace) | the file's text (truncated to the observation limit) |
| `write_file` | `path`, `content` (str) | create or replace a file |
| `apply_patch` | `patch` (unified diff) | `git apply`, falling back to `patch` |
| `submit` | none | end the episode; the final state is graded |

Plain-text format (for models without native tool calling): one JSON object between tags,

    <tool_call>{"name": "run", "arguments": {"command": "python3 -m pytest -q"}}</tool_call>

the Hermes/Qwen convention. The first tag block in a turn is the action; text around it is
the model's reasoning and is kept in the trajectory. A turn without a tag is an error
observation, not a crash, and so is anything malformed, unknown or oversized.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Union

# The prompt, the tool definitions and the text form of a call live in the client package (one copy, which
# trainer adapters use without the platform); re-exported here for the rollout code.
from envforge_client.prompts import SYSTEM_PROMPT as SYSTEM_PROMPT
from envforge_client.prompts import TOOL_CALL as TOOL_CALL
from envforge_client.prompts import TOOLS as TOOLS

MAX_ACTION_BYTES = 256 * 1024
MAX_PATH_CHARS = 4096


class ActionError(ValueError):
    """A malformed action: the message is shown to the model as the observation."""


@dataclass(frozen=True)
class Run:
    command: str
    timeout_s: float | None = None
    name: Literal["run"] = "run"


@dataclass(frozen=True)
class ReadFile:
    path: str
    name: Literal["read_file"] = "read_file"


@dataclass(frozen=True)
class WriteFile:
    path: str
    content: str
    name: Literal["write_file"] = "write_file"


@dataclass(frozen=True)
class ApplyPatch:
    patch: str
    name: Literal["apply_patch"] = "apply_patch"


@dataclass(frozen=True)
class Submit:
    name: Literal["submit"] = "submit"


Action = Union[Run, ReadFile, WriteFile, ApplyPatch, Submit]

_FIELDS: dict[str, tuple[type, dict[str, type], dict[str, type]]] = {
    # name: (class, required {arg: type}, optional {arg: type})
    "run": (Run, {"command": str}, {"timeout_s": (int, float)}),
    "read_file": (ReadFile, {"path": str}, {}),
    "write_file": (WriteFile, {"path": str, "content": str}, {}),
    "apply_patch": (ApplyPatch, {"patch": str}, {}),
    "submit": (Submit, {}, {}),
}


def _check_path(path: str) -> None:
    if not path or len(path) > MAX_PATH_CHARS or "\0" in path:
        raise ActionError("path must be a non-empty string without NUL characters")


def build_action(name: Any, arguments: Any) -> Action:
    """An action from a tool name and its arguments (a dict, or a JSON string of one)."""
    if not isinstance(name, str) or name not in _FIELDS:
        raise ActionError(f"unknown tool {name!r}; available: {', '.join(_FIELDS)}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise ActionError(f"arguments of {name} are not valid JSON: {exc}") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ActionError(f"arguments of {name} must be a JSON object")
    cls, required, optional = _FIELDS[name]
    missing = [k for k in required if k not in arguments]
    if missing:
        raise ActionError(f"{name} needs argument(s) {missing}")
    unknown = sorted(set(arguments) - set(required) - set(optional))
    if unknown:
        raise ActionError(f"{name} does not take argument(s) {unknown}")
    for key, typ in {**required, **optional}.items():
        if key in arguments and (not isinstance(arguments[key], typ) or isinstance(arguments[key], bool)):
            raise ActionError(f"argument {key!r} of {name} has the wrong type")
    size = sum(len(v.encode("utf-8", "surrogatepass")) for v in arguments.values() if isinstance(v, str))
    if size > MAX_ACTION_BYTES:
        raise ActionError(f"action is {size} bytes, over the {MAX_ACTION_BYTES}-byte limit; write large files in parts")
    if "path" in arguments:
        _check_path(arguments["path"])
    if name == "run" and not arguments["command"].strip():
        raise ActionError("run needs a non-empty command")
    if name == "run" and "timeout_s" in arguments and not 0 < arguments["timeout_s"] <= 3600:
        raise ActionError("timeout_s must be in (0, 3600]")
    return cls(**arguments)


def parse_tool_call(call: Any) -> Action:
    """An OpenAI tool call: {"type": "function", "function": {"name": ..., "arguments": "<json>"}}."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise ActionError("a tool call must be an object with a 'function' member")
    fn = call["function"]
    return build_action(fn.get("name"), fn.get("arguments"))


def parse_text(text: str) -> Action:
    """The first `<tool_call>{...}</tool_call>` block of a plain-text turn."""
    if len(text.encode("utf-8", "surrogatepass")) > 4 * MAX_ACTION_BYTES:
        raise ActionError("the turn is too long to contain a valid action")
    m = TOOL_CALL.search(text)
    if m is None:
        raise ActionError(
            'no action found: reply with <tool_call>{"name": ..., "arguments": {...}}</tool_call> '
            "(tools: " + ", ".join(_FIELDS) + ")"
        )
    try:
        obj = json.loads(m.group("body"))
    except ValueError as exc:
        raise ActionError(f"the <tool_call> block is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ActionError("the <tool_call> block must hold a JSON object with 'name' and 'arguments'")
    return build_action(obj.get("name"), obj.get("arguments", {}))


def to_tool_call(action: Action, call_id: str) -> dict[str, Any]:
    """The OpenAI tool-call form of an action (how replayed or parsed actions are recorded)."""
    args = {k: v for k, v in action.__dict__.items() if k != "name" and v is not None}
    return {"id": call_id, "type": "function", "function": {"name": action.name, "arguments": json.dumps(args)}}


def to_text(action: Action) -> str:
    """The plain-text form of an action (what SFT demonstrations teach text-only models)."""
    args = {k: v for k, v in action.__dict__.items() if k != "name" and v is not None}
    return "<tool_call>" + json.dumps({"name": action.name, "arguments": args}) + "</tool_call>"
