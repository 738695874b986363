"""Hand-written YAML task specs (`task.yaml`), the first-class task source.

A task is a folder holding `task.yaml` plus the files it references (workspace files,
verifier files, a solution patch). Only files named `task.yaml` or `*.task.yaml` are
specs, so YAML files that belong to a task's workspace are never mistaken for one.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from envforge.errors import Problem, SpecError
from envforge.hashing import iter_tree, tree_digest
from envforge.sources.gitrepo import resolve_commit
from envforge.sources.result import LoadResult
from envforge.task import Task, TaskSpec

MAX_VERIFIER_BYTES = 8 * 1024 * 1024


def is_spec_file(path: Path) -> bool:
    return path.name == "task.yaml" or path.name.endswith(".task.yaml")


def discover_spec_files(paths: Iterable[Path]) -> tuple[list[Path], list[Problem]]:
    """Expand files and directories into spec files; missing paths become problems."""
    found: list[Path] = []
    problems: list[Problem] = []
    for p in paths:
        p = Path(p)
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(f for f in p.rglob("*.yaml") if is_spec_file(f)))
        else:
            problems.append(Problem(str(p), "", "no such file or directory"))
    return found, problems


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_problems(source: str, err: ValidationError) -> list[Problem]:
    problems = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see docs/task-spec.md)"
        elif e["type"] == "missing":
            msg = "required field is missing"
        problems.append(Problem(source, _field_path(e["loc"]), msg))
    return problems


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([Problem(str(path), "", f"not valid YAML{where}: {problem}")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Problem(str(path), "", f"cannot read file: {exc}")]) from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise SpecError([Problem(str(path), "", f"a task spec must be a YAML mapping, got {kind}")])
    return data


def _check_referenced_files(path: Path, spec: TaskSpec) -> list[Problem]:
    base = path.parent
    src = str(path)
    problems: list[Problem] = []

    def need(field: str, rel: str | None, kind: str) -> None:
        if rel is None:
            return
        target = base / rel
        ok = target.is_dir() if kind == "dir" else target.is_file()
        if not ok:
            problems.append(Problem(src, field, f"{kind} {rel!r} not found (relative to {base})"))

    env = spec.environment
    need("environment.files", env.files, "dir")
    need("environment.dockerfile", env.dockerfile, "file")
    if env.repository is not None:
        need("environment.repository.path", env.repository.path, "dir")
        if (base / env.repository.path).is_dir() and resolve_commit(base / env.repository.path, env.repository.commit) is None:
            problems.append(Problem(src, "environment.repository.commit",
                                    f"commit {env.repository.commit!r} not found in {env.repository.path}"))
    need("verification.files", spec.verification.files, "dir")
    for field, rel in (("reference_solution.patch", spec.reference_solution.patch),
                       ("verification.test_patch", spec.verification.test_patch)):
        need(field, rel, "file")
        if rel and (base / rel).is_file():
            text = (base / rel).read_text(encoding="utf-8", errors="replace")
            if not any(line.startswith(("--- ", "diff --git")) for line in text.splitlines()):
                problems.append(Problem(src, field, "file is not a unified diff (no '---' or 'diff --git' header)"))
    return problems


def _workspace_digest(base: Path, spec: TaskSpec) -> str:
    env = spec.environment
    if env.files:
        return tree_digest(base / env.files)
    if env.repository:
        return "git:" + (resolve_commit(base / env.repository.path, env.repository.commit) or "")
    return ""


def _verifier_files(root: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    total = 0
    for f in iter_tree(root):
        data = f.read_bytes()
        total += len(data)
        files[f.relative_to(root).as_posix()] = base64.b64encode(data).decode()
    if total > MAX_VERIFIER_BYTES:
        raise ValueError(f"verifier files total {total} bytes, over the {MAX_VERIFIER_BYTES} limit")
    return files


def load_spec_file(path: Path) -> Task:
    """Parse and validate one spec file into a resolved Task, or raise SpecError."""
    path = Path(path).resolve()
    data = _read_yaml(path)
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_pydantic_problems(str(path), err)) from None
    problems = _check_referenced_files(path, spec)
    if problems:
        raise SpecError(problems)
    base = path.parent
    patch = test_patch = None
    if spec.reference_solution.patch:
        patch = (base / spec.reference_solution.patch).read_text(encoding="utf-8")
    if spec.verification.test_patch:
        test_patch = (base / spec.verification.test_patch).read_text(encoding="utf-8")
    try:
        verifier = _verifier_files(base / spec.verification.files) if spec.verification.files else {}
    except ValueError as exc:
        raise SpecError([Problem(str(path), "verification.files", str(exc))]) from None
    workspace = _workspace_digest(base, spec)
    task = Task(
        spec=spec, origin=str(path), base_dir=str(base), reference_patch=patch, test_patch=test_patch,
        verifier_files=verifier, workspace_digest=workspace,
    )
    return task.model_copy(update={"content_hash": task.compute_content_hash()})


def load_specs(paths: Iterable[Path]) -> LoadResult:
    """Load every spec under the given paths; bad ones become rejects, good ones go through."""
    files, result_rejects = discover_spec_files(paths)
    result = LoadResult(rejects=result_rejects)
    seen: dict[str, str] = {}
    for f in files:
        try:
            task = load_spec_file(f)
        except SpecError as exc:
            result.rejects.extend(exc.problems)
            continue
        result.add_unique(task, seen, "id")
    return result
