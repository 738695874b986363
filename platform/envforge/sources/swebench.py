"""SWE-bench instances as tasks, against local git repositories; and export back to the format.

Input: JSONL records with repo, instance_id, base_commit, patch, test_patch,
problem_statement, FAIL_TO_PASS, PASS_TO_PASS (lists, or JSON-encoded lists as in the
published datasets), and optionally environment_setup_commit and version. The repository
comes from a `repos:` mapping (owner/name -> local path or .bundle file) in a
`swebench.yaml` beside the JSONL, or from a `repo_path` field in the record. Either must
resolve inside the JSONL's folder or an allowed root (`envforge.sources.policy`).
`swebench.yaml` may also hold an `environment:` section (the tickets' vocabulary); without one
what the repository needs is inferred at each base_commit.

The task's workspace is the repository's tree at base_commit with no history at all (the
image commits that tree as its only commit), so no git command in the sandbox can reach the
fix. The test patch is held back and applied only at grading.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from envforge.errors import Problem, SpecError
from envforge.sources import guard
from envforge.sources.candidate import check_repo_footprint, load_config, relative_to_source, slug
from envforge.sources.environment import HistoryEnvironment, check_dockerfile, resolve_environment
from envforge.sources.fields import Identifier, Ref, StrictModel
from envforge.sources.gitrepo import materialize_repo, patch_applies, repository_dir, resolve_commit
from envforge.sources.import_roots import project_modules
from envforge.sources.policy import SourcePolicy
from envforge.sources.records import blank, built_records
from envforge.sources.result import LoadResult
from envforge.task import Limits, Task, TaskSpec, TestId

if TYPE_CHECKING:
    import docker

    from envforge.config import Settings

CONFIG_NAME = "swebench.yaml"
REQUIRED = (
    "repo",
    "instance_id",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)


class SweBenchConfig(StrictModel):
    """`swebench.yaml` beside the JSONL."""

    repos: dict[Identifier, str] = Field(
        default_factory=dict, description="owner/name -> git directory, .bundle or patch-series project (relative)"
    )
    environment: HistoryEnvironment = Field(
        default_factory=HistoryEnvironment,
        description="what the repositories need to run their tests (declared "
        "or inferred at each base_commit), as for tickets",
    )


def _decode_ids(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            raise ValueError("must be a list of test ids (or a JSON-encoded list)") from None
    return value


class SweBenchRecord(BaseModel):
    """One instance; fields the format carries but envforge does not use are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    repo: Identifier
    instance_id: Identifier
    base_commit: Ref
    patch: str
    test_patch: str
    problem_statement: str
    FAIL_TO_PASS: list[TestId]
    PASS_TO_PASS: list[TestId]
    version: str | int | float | None = None
    environment_setup_commit: Ref | None = None
    repo_path: str | None = None

    _ids = field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")(_decode_ids)


def task_id_for(instance_id: str) -> str:
    return slug(instance_id) or "instance"


def _sidecar(jsonl: Path, policy: SourcePolicy, result: LoadResult) -> tuple[dict[str, Path], HistoryEnvironment]:
    """(owner/name -> real repository path, the environment section) from swebench.yaml; a bad repos
    entry is a reject naming the config and field, and the other entries still count."""
    sidecar = jsonl.with_name(CONFIG_NAME)
    if not sidecar.exists():
        return {}, HistoryEnvironment()
    cfg = load_config(sidecar, SweBenchConfig, policy)
    check_dockerfile(cfg.environment, sidecar, policy)
    repos = {}
    for name, rel in cfg.repos.items():
        try:
            repos[name] = guard.confined(sidecar.parent, rel, str(sidecar), f"repos.{name}", policy)
        except SpecError as exc:
            result.rejects.extend(exc.problems)
    return repos, cfg.environment


def record_to_task(
    rec: dict,
    where: str,
    base_dir: Path,
    repos: dict[str, Path],
    policy: SourcePolicy | None = None,
    environment: HistoryEnvironment | None = None,
) -> Task:
    """One instance -> Task, or SpecError naming the record and field."""
    policy = policy or SourcePolicy.from_env()
    missing = [f for f in REQUIRED if blank(rec.get(f))]
    if missing:
        raise SpecError([Problem(where, f, "required field is missing") for f in missing])
    try:
        r = SweBenchRecord.model_validate(rec)
    except ValidationError as err:
        raise SpecError(guard.validation_problems(where, err)) from None
    statement = guard.check_text(r.problem_statement, where, "problem_statement", policy)
    if r.repo_path:
        repo_path = guard.confined(base_dir, r.repo_path, where, "repo_path", policy)
    elif r.repo in repos:
        repo_path = repos[r.repo]
    else:
        raise guard.reject(
            where, "repo", f"no local repository for {r.repo!r}: add it to swebench.yaml `repos:` or give `repo_path`"
        )
    try:
        git_dir = materialize_repo(repo_path)
    except ValueError as exc:
        raise guard.reject(where, "repo", str(exc)) from None
    if not git_dir.exists():
        raise guard.reject(where, "repo", f"repository {repo_path} does not exist")
    sha = resolve_commit(git_dir, r.base_commit)
    if sha is None:
        raise guard.reject(where, "base_commit", f"commit {r.base_commit!r} not found in {repo_path}")
    pins: dict[str, dict[str, str]] = {}
    sha = guard.pinned(r.base_commit, sha, where, "base_commit", policy, pins)
    check_repo_footprint(git_dir, sha, Limits(), where, "base_commit")
    problems = []
    for field in ("patch", "test_patch"):
        complaint = patch_applies(git_dir, sha, getattr(r, field))
        if complaint:
            problems.append(Problem(where, field, f"does not apply to base_commit: {complaint}"))
    if problems:
        raise SpecError(problems)
    env = resolve_environment(environment or HistoryEnvironment(), git_dir, sha, where)
    metadata: dict[str, Any] = {"instance_id": r.instance_id, "repo": r.repo, **env.metadata}
    if r.version not in (None, ""):
        metadata["version"] = str(r.version)
    if r.environment_setup_commit:
        metadata["environment_setup_commit"] = r.environment_setup_commit
    if pins:
        metadata["resolved_refs"] = pins
    data = {
        "id": task_id_for(r.instance_id),
        "source": "swebench",
        "instruction": statement,
        "environment": {
            **env.fields,
            "repository": {"path": relative_to_source(str(repo_path), base_dir), "commit": sha},
        },
        "verification": {
            "tests": {
                "framework": "pytest",
                "fail_to_pass": r.FAIL_TO_PASS,
                "pass_to_pass": r.PASS_TO_PASS,
                "modules": project_modules(git_dir, sha, env.fields.get("workdir")),
            }
        },
        "reference_solution": {"patch": "<inline>"},
        "metadata": metadata,
    }
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(guard.validation_problems(where, err)) from None
    task = Task(
        spec=spec,
        origin=where,
        base_dir=str(base_dir),
        reference_patch=r.patch,
        test_patch=r.test_patch,
        workspace_digest=f"git:{sha}",
    )
    return task.model_copy(update={"content_hash": task.compute_content_hash()})


def load_swebench_file(f: Path, result: LoadResult, seen: dict[str, str], policy: SourcePolicy) -> None:
    """Every instance of one JSONL into result; a broken swebench.yaml rejects the file, not the batch."""
    try:
        guard.source_file(f, policy)
        repos, environment = _sidecar(f, policy, result)
    except SpecError as exc:
        result.rejects.extend(exc.problems)
        return
    build = lambda rec, where: record_to_task(rec, where, f.parent, repos, policy, environment)  # noqa: E731
    for task in built_records(f, "jsonl", policy, result.rejects, build):
        result.add_unique(task, seen, "instance_id")


def load_swebench(paths: Iterable[Path], policy: SourcePolicy | None = None) -> LoadResult:
    """Every instance in the JSONL files (or *.jsonl under directories); bad ones become rejects."""
    policy = policy or SourcePolicy.from_env()
    result = LoadResult()
    seen: dict[str, str] = {}
    for p in paths:
        p = Path(p)
        for f in sorted(p.rglob("*.jsonl")) if p.is_dir() else [p]:
            load_swebench_file(f, result, seen, policy)
    return result


def record_env_layers(settings: Settings, result: LoadResult, client: docker.DockerClient | None = None) -> None:
    """Build the env layer of each instance that has one, in place: the task then records the images it
    was built on and loads the layer's pytest plugins with `-p`, exactly as history-mined tasks do at
    derivation (`sources.derive`). Without this a suite whose CI relies on plugin autoload (an async
    suite on pytest-asyncio from its test extra) fails before and after the fix alike. An env layer that
    does not build is a reject of the instance's `environment`, never of the batch."""
    from envforge.sandbox.engine import docker_client
    from envforge.sandbox.images import build_base_image, build_task_image
    from envforge.sources.candidate import with_env_plugins
    from envforge.sources.derive import build_or_problem, recorded_images_of

    needing = [t for t in result.tasks if t.spec.environment.needs_env_layer]
    if not needing:
        return
    client = client or docker_client(settings)
    base = build_base_image(client, settings).tag
    kept: list[Task] = [t for t in result.tasks if not t.spec.environment.needs_env_layer]
    for task in needing:
        build = build_or_problem(
            partial(build_task_image, client, task, base, settings, repository_dir=repository_dir), task.origin
        )
        if isinstance(build, Problem):
            result.rejects.append(build)
            continue
        tests = task.spec.verification.tests
        assert tests is not None  # every SWE-bench task has FAIL_TO_PASS tests
        plugins = with_env_plugins(tests.plugins, build.env.plugins if build.env else [])
        spec = task.spec.model_copy(
            update={
                "verification": task.spec.verification.model_copy(
                    update={"tests": tests.model_copy(update={"plugins": plugins})}
                ),
                "metadata": {**task.spec.metadata, "images": recorded_images_of(base, build)},
            }
        )
        updated = task.model_copy(update={"spec": spec})
        kept.append(updated.model_copy(update={"content_hash": updated.compute_content_hash()}))
    result.tasks = kept


def export_swebench(tasks: Iterable[Task], path: Path) -> int:
    """Write test-verified tasks in SWE-bench's instance format (JSONL); returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for t in tasks:
            tests = t.spec.verification.tests
            if tests is None or t.reference_patch is None:
                continue
            repo = t.spec.environment.repository
            fh.write(
                json.dumps(
                    {
                        "repo": t.spec.metadata.get("repo", t.spec.source),
                        "instance_id": t.spec.metadata.get("instance_id", t.id),
                        "base_commit": repo.commit if repo else "",
                        "patch": t.reference_patch,
                        "test_patch": t.test_patch or "",
                        "problem_statement": t.spec.instruction,
                        "FAIL_TO_PASS": json.dumps(tests.fail_to_pass),
                        "PASS_TO_PASS": json.dumps(tests.pass_to_pass),
                        **{
                            k: t.spec.metadata[k]
                            for k in ("version", "environment_setup_commit")
                            if k in t.spec.metadata
                        },
                    }
                )
                + "\n"
            )
            n += 1
    return n
