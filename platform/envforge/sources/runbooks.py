"""Runbooks (Markdown) as tasks.

A runbook is the text an operator follows to fix a broken system. The format adds just
enough structure to build and verify it (see docs/runbooks.md):

    ---                         YAML front matter: id (required), tags, max_turns, limits
    id: rb-log-rotation
    ---
    # Title and free text       everything outside the sections below is the instruction
    ## Setup                    fenced shell block(s): puts the workspace into the broken state
    ## Files                    `### path` headings, each followed by one fenced block: file contents
    ## Checks                   one fenced YAML block: a list of {name, run, expect_exit, stdout}
    ## Solution                 fenced shell block(s): the reference solution

Files and setup run at image build time, in /workspace. Checks run after the policy is done,
as shell checkpoints on a pristine copy with the policy's diff applied.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envforge.errors import Problem, SpecError
from envforge.sources import guard
from envforge.sources.policy import SourcePolicy
from envforge.sources.result import LoadResult
from envforge.task import Limits, Task, TaskSpec

SECTIONS = ("setup", "files", "checks", "solution")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_H2 = re.compile(r"^## +(.+?)\s*$", re.MULTILINE)
_H3 = re.compile(r"^### +(.+?)\s*$", re.MULTILINE)


class FrontMatter(BaseModel):
    """A runbook's front matter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Any = Field(description="the task id (checked by the task spec)")
    tags: list[str] = Field(default_factory=list)
    max_turns: int = Field(30, ge=1, le=1000)
    limits: Limits | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, description="free-form, kept with the task")


def _front_matter(text: str, src: str, policy: SourcePolicy) -> tuple[FrontMatter, str]:
    text = text.replace("\r\n", "\n")
    if not text.startswith("---\n"):
        raise SpecError(
            [
                Problem(
                    src, "front matter", "a runbook starts with YAML front matter between '---' lines (at least `id:`)"
                )
            ]
        )
    end = text.find("\n---", 3)
    if end < 0:
        raise SpecError([Problem(src, "front matter", "front matter is not closed by a '---' line")])
    meta = guard.load_yaml(text[4:end], src, policy, "front matter") or {}
    if not isinstance(meta, dict):
        raise SpecError([Problem(src, "front matter", "must be a YAML mapping")])
    try:
        front = FrontMatter.model_validate(meta)
    except ValidationError as err:
        allowed = "unknown field (allowed: id, tags, max_turns, limits, metadata)"
        raise SpecError(
            [
                Problem(
                    p.source,
                    f"front matter.{p.field}" if p.field else "front matter",
                    allowed if p.reason.startswith("unknown field") else p.reason,
                )
                for p in guard.validation_problems(src, err)
            ]
        ) from None
    return front, text[end + 4 :].lstrip("\n")


def _sections(body: str) -> tuple[str, dict[str, str]]:
    """(instruction text, {section name: raw text}) for the known ## sections."""
    heads = list(_H2.finditer(body))
    instruction = body[: heads[0].start()] if heads else body
    found: dict[str, str] = {}
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(body)
        name = h.group(1).strip().lower()
        if name in SECTIONS:
            found[name] = body[h.end() : end]
        else:  # any other section is part of what the operator reads
            instruction += body[h.start() : end]
    return instruction.strip() + "\n", found


def _blocks(text: str) -> list[str]:
    return [m.group(1) for m in _FENCE.finditer(text)]


def _files(section: str, src: str) -> tuple[list[str], list[Problem]]:
    """Setup commands that write each `### path` file (heredocs), and problems."""
    commands, problems = [], []
    heads = list(_H3.finditer(section))
    for i, h in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(section)
        path = h.group(1).strip().strip("`")
        blocks = _blocks(section[h.end() : end])
        if path.startswith("/") or ".." in Path(path).parts:
            problems.append(Problem(src, f"Files.{path}", "paths are relative to /workspace and stay inside it"))
            continue
        if len(blocks) != 1:
            problems.append(Problem(src, f"Files.{path}", f"expected exactly one fenced block, found {len(blocks)}"))
            continue
        marker = "ENVFORGE_RUNBOOK_EOF"
        if marker in blocks[0]:
            problems.append(Problem(src, f"Files.{path}", f"content may not contain {marker}"))
            continue
        q = shlex.quote(path)
        commands.append(f"mkdir -p \"$(dirname {q})\" && cat > {q} <<'{marker}'\n{blocks[0]}{marker}")
    return commands, problems


def load_runbook(path: Path, policy: SourcePolicy | None = None) -> Task:
    """Parse and validate one runbook into a resolved Task, or raise SpecError with every problem."""
    policy = policy or SourcePolicy.from_env()
    path = Path(os.path.abspath(path))
    src = str(path)
    text = guard.read_text(guard.source_file(path, policy), policy.max_markdown_bytes, src)
    meta, body = _front_matter(text, src, policy)
    instruction, sections = _sections(body)
    instruction = guard.check_text(instruction, src, "instruction", policy)
    problems: list[Problem] = []
    setup: list[str] = []
    if "files" in sections:
        file_cmds, file_problems = _files(sections["files"], src)
        setup += file_cmds
        problems += file_problems
    setup += [b for b in _blocks(sections.get("setup", "")) if b.strip()]
    checks: object = []
    check_blocks = _blocks(sections.get("checks", ""))
    if "checks" not in sections or not check_blocks:
        problems.append(
            Problem(
                src,
                "Checks",
                "a runbook needs a '## Checks' section with a fenced YAML list of "
                "checkpoints (name, run, expect_exit, stdout)",
            )
        )
    else:
        try:
            checks = guard.load_yaml(check_blocks[0], src, policy, "Checks") or []
        except SpecError as exc:
            problems.extend(exc.problems)
        if not isinstance(checks, list) or not checks:
            problems.append(Problem(src, "Checks", "must be a non-empty YAML list of checkpoints"))
            checks = []
    solution = [b for b in _blocks(sections.get("solution", "")) if b.strip()]
    if not solution:
        problems.append(Problem(src, "Solution", "a runbook needs a '## Solution' section with a fenced shell block"))
    if problems:
        raise SpecError(problems)
    renamed = []
    for c in checks:
        if isinstance(c, dict) and "stdout" in c:
            c = {**{k: v for k, v in c.items() if k != "stdout"}, "stdout_pattern": c["stdout"]}
        renamed.append(c)
    environment: dict[str, Any] = {"image": "base", "setup": setup}
    if meta.limits is not None:
        environment["limits"] = meta.limits
    data = {
        "id": meta.id,
        "source": "runbook",
        "instruction": instruction,
        "environment": environment,
        "verification": {"checkpoints": renamed},
        "reference_solution": {"commands": ["\n".join(solution)]},
        "max_turns": meta.max_turns,
        "tags": meta.tags,
        "metadata": {"runbook": path.name, **meta.metadata},
    }
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(guard.validation_problems(src, err)) from None
    task = Task(spec=spec, origin=src, base_dir=str(path.parent), workspace_digest="runbook")
    return task.model_copy(update={"content_hash": task.compute_content_hash()})


def _head(path: Path, n: int = 64) -> bytes:
    """The first bytes of a regular file (b"" for anything else); opened non-blocking, so a FIFO never hangs."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        return b""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(n)


def is_runbook(path: Path) -> bool:
    """A regular Markdown file that opens with front matter (so a task's own README.md is never one);
    a byte-order mark before the opening line is allowed."""
    if path.suffix != ".md":
        return False
    try:
        head = _head(path)
    except OSError:
        return False
    return head.removeprefix(b"\xef\xbb\xbf").split(b"\n", 1)[0].rstrip(b"\r") == b"---"


def load_runbooks(paths: Iterable[Path], policy: SourcePolicy | None = None) -> LoadResult:
    """Every runbook (a .md file opening with front matter) under the paths; bad ones become rejects."""
    policy = policy or SourcePolicy.from_env()
    result = LoadResult()
    seen: dict[str, str] = {}
    for p in paths:
        p = Path(p)
        files = sorted(f for f in p.rglob("*.md") if is_runbook(f)) if p.is_dir() else [p]
        if not p.exists():
            result.rejects.append(Problem(str(p), "", "no such file or directory"))
            continue
        for f in files:
            try:
                task = load_runbook(f, policy)
            except SpecError as exc:
                result.rejects.extend(exc.problems)
                continue
            except Exception as exc:  # noqa: BLE001 - one runbook is lost, never the batch
                result.rejects.append(guard.unexpected(str(f), exc))
                continue
            result.add_unique(task, seen, "id")
    return result
