"""Hand-written YAML task specs (`task.yaml`), the first-class task source.

A task is a folder holding `task.yaml` plus the files it references (workspace files,
verifier files, a solution patch). Only files named `task.yaml` or `*.task.yaml` are
specs, so YAML files that belong to a task's workspace are never mistaken for one.
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from envforge import safefs
from envforge.errors import Problem, SpecError
from envforge.hashing import tree_digest
from envforge.sources import guard
from envforge.sources.gitrepo import resolve_commit, tree_footprint
from envforge.sources.policy import SourcePolicy
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


def _read_yaml(path: Path, policy: SourcePolicy) -> dict[str, Any]:
    data = guard.load_yaml_file(path, str(path), policy)
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        raise SpecError([Problem(str(path), "", f"a task spec must be a YAML mapping, got {kind}")])
    return data


class _Resolved:
    """The real paths a spec names, each confined to the spec's folder or an allowed root."""

    def __init__(self, path: Path, policy: SourcePolicy):
        self.src, self.base, self.policy = str(path), path.parent, policy
        self.problems: list[Problem] = []

    def path(self, field: str, rel: str | None, kind: str) -> Path | None:
        if rel is None:
            return None
        try:
            target = guard.confined(self.base, rel, self.src, field, self.policy)
        except SpecError as exc:
            self.problems.extend(exc.problems)
            return None
        try:
            mode = target.stat().st_mode
        except OSError:
            self.problems.append(Problem(self.src, field, f"{kind} {rel!r} not found (relative to {self.base})"))
            return None
        if not (stat.S_ISDIR(mode) if kind == "dir" else stat.S_ISREG(mode)):
            self.problems.append(Problem(self.src, field, f"{rel!r} is {safefs.kind_of(mode)}, not a {kind}"))
            return None
        return target

    def tree(self, field: str, rel: str | None) -> tuple[Path, safefs.TreeScan] | None:
        root = self.path(field, rel, "dir")
        if root is None:
            return None
        try:
            return root, guard.scan_tree(root, self.src, field)
        except SpecError as exc:
            self.problems.extend(exc.problems)
            return None

    def patch(self, field: str, rel: str | None) -> str | None:
        target = self.path(field, rel, "file")
        if target is None:
            return None
        try:
            text = guard.read_text(target, self.policy.max_patch_bytes, self.src, field)
        except SpecError as exc:
            self.problems.extend(exc.problems)
            return None
        if not any(line.startswith(("--- ", "diff --git")) for line in text.splitlines()):
            self.problems.append(
                Problem(self.src, field, "file is not a unified diff (no '---' or 'diff --git' header)")
            )
            return None
        return text


def _verifier_files(root: Path, scan: safefs.TreeScan, src: str) -> dict[str, str]:
    files: dict[str, str] = {}
    total = 0
    for rel in [*scan.files, *(link for link in scan.links if (root / link).is_file())]:
        data = guard.read_bytes(safefs.real(root / rel), MAX_VERIFIER_BYTES, src, "verification.files")
        total += len(data)
        if total > MAX_VERIFIER_BYTES:
            raise guard.reject(
                src, "verification.files", f"verifier files total over the {MAX_VERIFIER_BYTES}-byte limit"
            )
        files[rel] = base64.b64encode(data).decode()
    return dict(sorted(files.items()))


def _patch_check(workspace: Path, patch: str) -> str | None:
    """None if the patch applies to the workspace files (`git apply --check`); else git's complaint."""
    with tempfile.TemporaryDirectory(prefix="envforge-check-") as tmp:
        safefs.copy_tree(workspace, Path(tmp) / "w")
        proc = subprocess.run(
            ["git", "apply", "--check", "-"],
            cwd=Path(tmp) / "w",
            input=patch.encode(),
            capture_output=True,
            env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"},
        )
        return None if proc.returncode == 0 else proc.stderr.decode(errors="replace").strip()[:300]


def load_spec_file(path: Path, policy: SourcePolicy | None = None) -> Task:
    """Parse and validate one spec file into a resolved Task, or raise SpecError."""
    policy = policy or SourcePolicy.from_env()
    path = Path(os.path.abspath(path))
    src = str(path)
    data = _read_yaml(path, policy)
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(guard.validation_problems(src, err)) from None
    instruction = guard.check_text(spec.instruction, src, "instruction", policy)
    env = spec.environment
    r = _Resolved(path, policy)
    workspace = r.tree("environment.files", env.files)
    r.path("environment.dockerfile", env.dockerfile, "file")
    verifier = r.tree("verification.files", spec.verification.files)
    patch = r.patch("reference_solution.patch", spec.reference_solution.patch)
    test_patch = r.patch("verification.test_patch", spec.verification.test_patch)
    pins: dict[str, dict[str, str]] = {}
    repo_sha = None
    if env.repository is not None:
        repo_dir = r.path("environment.repository.path", env.repository.path, "dir")
        if repo_dir is not None:
            repo_sha = resolve_commit(repo_dir, env.repository.commit)
            if repo_sha is None:
                r.problems.append(
                    Problem(
                        src,
                        "environment.repository.commit",
                        f"commit {env.repository.commit!r} not found in {env.repository.path}",
                    )
                )
            else:
                try:
                    repo_sha = guard.pinned(
                        env.repository.commit, repo_sha, src, "environment.repository.commit", policy, pins
                    )
                    guard.check_footprint(tree_footprint(repo_dir, repo_sha), env.limits, src, "environment.repository")
                except SpecError as exc:
                    r.problems.extend(exc.problems)
    if workspace is not None:
        try:
            guard.check_footprint(workspace[1].footprint, env.limits, src, "environment.files")
        except SpecError as exc:
            r.problems.extend(exc.problems)
        if not env.setup and not env.dockerfile:  # setup could create what the patches change: the gate checks those
            for field, text in (("reference_solution.patch", patch), ("verification.test_patch", test_patch)):
                complaint = _patch_check(workspace[0], text) if text else None
                if complaint:
                    r.problems.append(Problem(src, field, f"does not apply to environment.files: {complaint}"))
    if r.problems:
        raise SpecError(r.problems)
    verifier_files = _verifier_files(*verifier, src) if verifier else {}
    updates: dict[str, Any] = {"instruction": instruction}
    if pins:
        repo = env.repository.model_copy(update={"commit": repo_sha})
        updates["environment"] = env.model_copy(update={"repository": repo})
        updates["metadata"] = {**spec.metadata, "resolved_refs": pins}
    spec = spec.model_copy(update=updates)
    digest = tree_digest(workspace[0]) if workspace else (f"git:{repo_sha}" if repo_sha else "")
    task = Task(
        spec=spec,
        origin=src,
        base_dir=str(path.parent),
        reference_patch=patch,
        test_patch=test_patch,
        verifier_files=verifier_files,
        workspace_digest=digest,
    )
    return task.model_copy(update={"content_hash": task.compute_content_hash()})


def load_specs(paths: Iterable[Path], policy: SourcePolicy | None = None) -> LoadResult:
    """Load every spec under the given paths; bad ones become rejects, good ones go through."""
    policy = policy or SourcePolicy.from_env()
    files, result_rejects = discover_spec_files(paths)
    result = LoadResult(rejects=result_rejects)
    seen: dict[str, str] = {}
    for f in files:
        try:
            task = load_spec_file(f, policy)
        except SpecError as exc:
            result.rejects.extend(exc.problems)
            continue
        except Exception as exc:  # noqa: BLE001 - one spec is lost, never the batch
            result.rejects.append(guard.unexpected(str(f), exc))
            continue
        result.add_unique(task, seen, "id")
    return result
