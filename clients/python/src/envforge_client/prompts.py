"""What a policy is told and how it answers: the system prompt, the OpenAI tool definitions of the
five actions, and the plain-text form of a call (the Hermes/Qwen `<tool_call>` convention).

They live in the client package because every trainer adapter builds its prompts from them without
installing the platform; envforge's own rollouts, the service and the verl export import them from here,
so there is one copy. The service validates and runs the actions (envforge.rollout.actions)."""

from __future__ import annotations

import json
import re
from typing import Any

WORKSPACE = "/workspace"  # where the task's repository is inside the sandbox

TOOL_CALL = re.compile(r"<tool_call>\s*(?P<body>.*?)\s*</tool_call>", re.DOTALL)

# What every policy is told first: the rollout scheduler, the verl export and the environment service use it.
SYSTEM_PROMPT = (
    "You are a software engineer working in a sandboxed repository. Use the tools to inspect and change "
    "files and to run commands; call `submit` when the task is done."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command in /workspace and see its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file (path relative to /workspace).",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a file (path relative to /workspace).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "apply_patch",
            "description": "Apply a unified diff to /workspace.",
            "parameters": {"type": "object", "properties": {"patch": {"type": "string"}}, "required": ["patch"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish: the current state of /workspace is graded.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def system_message() -> str:
    """The system prompt with the tools and the text form of a call, so prompts work for models and chat
    templates without native tool support."""
    tools = "\n".join(json.dumps(t, sort_keys=True) for t in TOOLS)
    return (
        f"{SYSTEM_PROMPT}\n\n# Tools\n\nYou may call the following tools:\n<tools>\n{tools}\n</tools>\n\n"
        'To act, answer with one JSON object between tags:\n<tool_call>{"name": <tool-name>, "arguments": '
        "<args-json-object>}</tool_call>"
    )


def user_message(instruction: str) -> str:
    """The task's first user turn: its instruction and where the repository is."""
    return f"{instruction.strip()}\n\nThe repository is in {WORKSPACE}."


def tool_call_blocks(text: str) -> list[str]:
    """Every `<tool_call>...</tool_call>` block of a reply, in order (each is one step)."""
    return [m.group(0) for m in TOOL_CALL.finditer(text or "")]
