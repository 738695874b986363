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

import json
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from envforge.errors import Problem, SpecError
from envforge.sources.candidate import relative_to_source, slug
from envforge.sources.environment import HistoryEnvironment, check_dockerfile, resolve_environment
from envforge.sources.gitrepo import materialize_repo, patch_applies, resolve_commit
from envforge.sources.records import iter_records
from envforge.sources.result import LoadResult
from envforge.sources.specs import _pydantic_problems
from envforge.task import Task, TaskSpec

REQUIRED = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS",
            "PASS_TO_PASS")


def task_id_for(instance_id: str) -> str:
    return slug(instance_id) or "instance"


def _ids(value: Any) -> list[str] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _repo_map(jsonl: Path) -> dict[str, str]:
    sidecar = jsonl.with_name("swebench.yaml")
    if not sidecar.exists():
        return {}
    data = yaml.safe_load(sidecar.read_text()) or {}
    return {name: str(p) for name, p in (data.get("repos") or {}).items()}


def _environment(jsonl: Path) -> HistoryEnvironment:
    """The `environment:` section of swebench.yaml (SpecError naming the file and field)."""
    sidecar = jsonl.with_name("swebench.yaml")
    data = (yaml.safe_load(sidecar.read_text()) or {}) if sidecar.exists() else {}
    try:
        section = HistoryEnvironment.model_validate(data.get("environment") or {})
    except ValidationError as err:
        raise SpecError([Problem(p.source, f"environment.{p.field}", p.reason)
                         for p in _pydantic_problems(str(sidecar), err)]) from None
    check_dockerfile(section, sidecar)
    return section


def record_to_task(rec: dict, where: str, base_dir: Path, repos: dict[str, str],
                   environment: HistoryEnvironment | None = None) -> Task:
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
    sha = resolve_commit(git_dir, str(rec["base_commit"]))
    if sha is None:
        raise SpecError(problems + [Problem(where, "base_commit", f"commit {rec['base_commit']!r} not found in "
                                                                 f"{repo_path}")])
    for field in ("patch", "test_patch"):
        complaint = patch_applies(git_dir, sha, rec[field])
        if complaint:
            problems.append(Problem(where, field, f"does not apply to base_commit: {complaint}"))
    if problems:
        raise SpecError(problems)
    env = resolve_environment(environment or HistoryEnvironment(), git_dir, sha, where)
    data = {
        "id": task_id_for(rec["instance_id"]), "source": "swebench", "instruction": rec["problem_statement"],
        "environment": {**env.fields, "repository": {"path": relative_to_source(str(repo_ref), base_dir),
                                                     "commit": sha}},
        "verification": {"tests": {"framework": "pytest", "fail_to_pass": f2p, "pass_to_pass": p2p}},
        "reference_solution": {"patch": "<inline>"},
        "metadata": {"instance_id": rec["instance_id"], "repo": rec["repo"], **env.metadata,
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
            try:
                environment = _environment(f)
            except SpecError as exc:
                result.rejects.extend(exc.problems)
                continue
            for where, rec in iter_records(f, "jsonl"):
                if isinstance(rec, Problem):
                    result.rejects.append(rec)
                    continue
                try:
                    task = record_to_task(rec, where, f.parent, repos, environment)
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
