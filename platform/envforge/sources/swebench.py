"""SWE-bench instances as tasks, against local git repositories; and export back to the format.

Input: JSONL records with repo, instance_id, base_commit, patch, test_patch,
problem_statement, FAIL_TO_PASS, PASS_TO_PASS (lists, or JSON-encoded lists as in the
published datasets), and optionally environment_setup_commit and version. The repository
comes from a `repos:` mapping (owner/name -> local path or .bundle file) in a
`swebench.yaml` beside the JSONL, or from a `repo_path` field in the record.

The task's workspace is the repository's tree at base_commit with no history at all (the
image commits that tree as its only commit), so no git command in the sandbox can reach the
fix. The test patch is held back and applied only at grading.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from envforge.errors import Problem, SpecError
from envforge.sources.result import LoadResult
from envforge.sources.specs import _pydantic_problems
from envforge.task import Task, TaskSpec

REQUIRED = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS",
            "PASS_TO_PASS")
BUNDLE_CACHE = Path(tempfile.gettempdir()) / "envforge-bundles"


def task_id_for(instance_id: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", instance_id.lower()).strip("-._")
    return slug[:80] or "instance"


def materialize_repo(path: Path) -> Path:
    """A git directory for a repository path or a .bundle file (cloned once, bare, cached by digest)."""
    path = Path(path)
    if path.is_file() and path.suffix == ".bundle":
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        target = BUNDLE_CACHE / digest
        if not (target / "HEAD").exists():
            BUNDLE_CACHE.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=BUNDLE_CACHE))
            proc = subprocess.run(["git", "clone", "-q", "--bare", "--mirror", str(path), str(tmp / "repo")],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise ValueError(f"cannot read bundle {path}: {proc.stderr.strip()}")
            (tmp / "repo").rename(target)
        return target
    return path


def _git(repo: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, input=input)


def _ids(value: Any) -> list[str] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _patch_applies(repo: Path, commit: str, patch: str) -> str | None:
    """None if the patch applies cleanly to the tree at commit; otherwise git's complaint."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = _git(repo, "archive", "--format=tar", commit)
        if archive.returncode != 0:
            return archive.stderr.decode(errors="replace").strip()
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        proc = subprocess.run(["git", "apply", "--check", "-"], cwd=tmp, input=patch.encode(), capture_output=True)
        return None if proc.returncode == 0 else proc.stderr.decode(errors="replace").strip()[:300]


def _repo_map(jsonl: Path) -> dict[str, Path]:
    sidecar = jsonl.with_name("swebench.yaml")
    if not sidecar.exists():
        return {}
    data = yaml.safe_load(sidecar.read_text()) or {}
    return {name: (sidecar.parent / p).resolve() for name, p in (data.get("repos") or {}).items()}


def record_to_task(rec: dict, where: str, base_dir: Path, repos: dict[str, Path]) -> Task:
    """One instance -> Task, or SpecError naming the record and field."""
    missing = [f for f in REQUIRED if rec.get(f) in (None, "")]
    if missing:
        raise SpecError([Problem(where, f, "required field is missing") for f in missing])
    problems: list[Problem] = []
    f2p, p2p = _ids(rec["FAIL_TO_PASS"]), _ids(rec["PASS_TO_PASS"])
    if f2p is None:
        problems.append(Problem(where, "FAIL_TO_PASS", "must be a list of test ids (or a JSON-encoded list)"))
    if p2p is None:
        problems.append(Problem(where, "PASS_TO_PASS", "must be a list of test ids (or a JSON-encoded list)"))
    repo_ref = rec.get("repo_path") or repos.get(rec["repo"])
    if repo_ref is None:
        problems.append(Problem(where, "repo", f"no local repository for {rec['repo']!r}: add it to swebench.yaml "
                                               f"`repos:` or give `repo_path`"))
        raise SpecError(problems)
    repo_path = (base_dir / repo_ref).resolve()
    try:
        git_dir = materialize_repo(repo_path)
    except ValueError as exc:
        raise SpecError(problems + [Problem(where, "repo", str(exc))]) from None
    if not git_dir.exists():
        raise SpecError(problems + [Problem(where, "repo", f"repository {repo_path} does not exist")])
    commit = _git(git_dir, "rev-parse", "--verify", "--quiet", f"{rec['base_commit']}^{{commit}}")
    if commit.returncode != 0:
        raise SpecError(problems + [Problem(where, "base_commit", f"commit {rec['base_commit']!r} not found in "
                                                                 f"{repo_path}")])
    sha = commit.stdout.decode().strip()
    for field in ("patch", "test_patch"):
        complaint = _patch_applies(git_dir, sha, rec[field])
        if complaint:
            problems.append(Problem(where, field, f"does not apply to base_commit: {complaint}"))
    if problems:
        raise SpecError(problems)
    data = {
        "id": task_id_for(rec["instance_id"]), "source": "swebench", "instruction": rec["problem_statement"],
        "environment": {"image": "base", "repository": {"path": str(git_dir), "commit": sha}},
        "verification": {"tests": {"framework": "pytest", "fail_to_pass": f2p, "pass_to_pass": p2p}},
        "reference_solution": {"patch": "<inline>"},
        "metadata": {"instance_id": rec["instance_id"], "repo": rec["repo"],
                     **{k: rec[k] for k in ("version", "environment_setup_commit") if rec.get(k)}},
    }
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_pydantic_problems(where, err)) from None
    task = Task(spec=spec, origin=where, base_dir=str(base_dir), reference_patch=rec["patch"],
                test_patch=rec["test_patch"], workspace_digest=f"git:{sha}")
    return task.model_copy(update={"content_hash": task.compute_content_hash()})


def load_swebench(paths: Iterable[Path]) -> LoadResult:
    """Every instance in the JSONL files (or *.jsonl under directories); bad ones become rejects."""
    result = LoadResult()
    seen: dict[str, str] = {}
    for p in paths:
        p = Path(p)
        files = sorted(p.rglob("*.jsonl")) if p.is_dir() else [p]
        for f in files:
            repos = _repo_map(f)
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                where = f"{f}:{n}"
                try:
                    rec = json.loads(line)
                    if not isinstance(rec, dict):
                        raise ValueError("not a JSON object")
                    task = record_to_task(rec, where, f.parent, repos)
                except ValueError as exc:
                    result.rejects.append(Problem(where, "", f"not a JSON record: {exc}"))
                    continue
                except SpecError as exc:
                    result.rejects.extend(exc.problems)
                    continue
                result.add_unique(task, seen, "instance_id")
    return result


def export_swebench(tasks: Iterable[Task], path: Path) -> int:
    """Write test-verified tasks in SWE-bench's instance format (JSONL); returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for t in tasks:
            tests = t.spec.verification.tests
            if tests is None or t.reference_patch is None:
                continue
            repo = t.spec.environment.repository
            fh.write(json.dumps({
                "repo": t.spec.metadata.get("repo", t.spec.source), "instance_id": t.spec.metadata.get("instance_id", t.id),
                "base_commit": repo.commit if repo else "", "patch": t.reference_patch,
                "test_patch": t.test_patch or "", "problem_statement": t.spec.instruction,
                "FAIL_TO_PASS": json.dumps(tests.fail_to_pass), "PASS_TO_PASS": json.dumps(tests.pass_to_pass),
                **{k: t.spec.metadata[k] for k in ("version", "environment_setup_commit") if k in t.spec.metadata},
            }) + "\n")
            n += 1
    return n
