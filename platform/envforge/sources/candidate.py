"""Tasks mined from history whose tests are not known yet.

A ticket's fix commit or a review's follow-up commit says *what changed*, not which tests
prove it. A `Candidate` holds everything else a task needs (workspace commit, instruction,
the source change as reference solution, the held-back test change); `envforge.sources.derive`
runs the suite before and after the change in a sandbox and turns it into a `Task` with
FAIL_TO_PASS / PASS_TO_PASS, or into a reject.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

from pydantic import BaseModel, Field, ValidationError, field_validator

from envforge.environment import check_command
from envforge.errors import Problem, SpecError
from envforge.sources import guard
from envforge.sources.environment import HistoryEnvironment, ResolvedEnvironment, check_dockerfile, resolve_environment
from envforge.sources.fields import StrictModel
from envforge.sources.gitrepo import SplitChange, materialize_repo, resolve_commit, tree_footprint
from envforge.sources.import_roots import project_modules
from envforge.sources.policy import SourcePolicy
from envforge.sources.records import built_records
from envforge.task import Limits, Task, TaskSpec, valid_test_id

# Stands in for the test ids while a candidate's image is built: the image depends on the
# environment and workspace only, never on the verification, so it is the task's real image.
PENDING_TEST = "(derived-by-running-the-tests)"


class SuiteConfig(StrictModel):
    """How a history source's repository runs its tests (the `tests:` block of its config)."""

    framework: str = Field("pytest", pattern="^pytest$", description="suites are run whole; pytest only for now")
    command: str = Field(
        "python3 -m pytest", description="runs the whole suite from the repository root (or environment.workdir)"
    )
    plugins: list[str] = Field(
        default_factory=list, description="pytest plugins to load by name (`-p NAME`); plugin autoload is always off"
    )
    timeout_s: float = Field(300, gt=0, le=86400)
    pass_to_pass: Literal["test-files", "suite"] = Field(
        "test-files",
        description="which tests that pass before and after the change become PASS_TO_PASS: those in "
        "the test files the change touches or that hold its FAIL_TO_PASS tests (as the "
        "SWE-bench harness does; grading then runs only those files), or every one in the "
        "suite (grading then runs the whole suite)",
    )

    @field_validator("command")
    @classmethod
    def _command(cls, v: str) -> str:
        return check_command(v) or v


class HistorySourceConfig(StrictModel):
    """Settings every history source (tickets, reviews) shares; each adds its own fields."""

    tests: SuiteConfig = Field(default_factory=SuiteConfig)
    environment: HistoryEnvironment = Field(default_factory=HistoryEnvironment)
    limits: Limits = Field(default_factory=Limits)
    max_turns: int = Field(40, ge=1, le=1000)
    tags: list[str] = Field(default_factory=list)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:80]


# Plugins a project's test dependencies bring that put its tests in a new random order (and reseed
# `random`) on every run. Derivation compares runs in file order and reversed, and the gate repeats
# runs to see what varies: with these loaded, every run is another order, so order dependence and
# flakiness are measured against chance. They are left out of what an env layer's record loads; a
# source that names one in its own `tests.plugins` still gets it.
ORDER_SHUFFLING_PLUGINS = frozenset({"pytest_randomly", "random_order.plugin"})


def with_env_plugins(declared: Sequence[str], env_plugins: Sequence[str]) -> list[str]:
    """The pytest plugins every run of a task loads with `-p`: the source's own, then those its env layer
    installed (the project's CI loads them by autoload, which stays off here), less the ones that shuffle
    the tests (`ORDER_SHUFFLING_PLUGINS`). One rule for every kind."""
    recorded = [p for p in env_plugins if p not in ORDER_SHUFFLING_PLUGINS]
    return list(dict.fromkeys([*declared, *recorded]))


@dataclass(frozen=True)
class Candidate:
    """A task from a commit range whose verification is derived by running its tests."""

    id: str
    kind: str
    origin: str
    field: str  # the record field that names the change (rejects point at it)
    instruction: str
    git_dir: Path
    workspace_commit: str
    change: SplitChange
    config: HistorySourceConfig
    base_dir: Path
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    repository: str = ""  # as the config names it, relative to base_dir: stored tasks never hold absolute paths
    # The pytest plugins the env layer installed (its recorded pytest11 modules), known once it is built.
    env_plugins: tuple[str, ...] = ()

    @property
    def plugins(self) -> list[str]:
        """What every pytest run of the task loads with `-p`: the source's `tests.plugins`, then the env layer's."""
        return with_env_plugins(self.config.tests.plugins, self.env_plugins)

    @cached_property
    def environment(self) -> ResolvedEnvironment:
        """The packages and settings of the workspace commit, declared or inferred (once per candidate),
        with what the fix's own manifests add when inferred."""
        change_commit = self.metadata.get("fix_commit") or self.metadata.get("follow_up_commit")
        return resolve_environment(
            self.config.environment, self.git_dir, self.workspace_commit, self.origin, change_commit
        )

    @cached_property
    def modules(self) -> list[str]:
        """The project's own top-level import names at the workspace commit: its pytest runs import them
        from the work tree first (`tests.modules`; sources/import_roots.py)."""
        return project_modules(self.git_dir, self.workspace_commit, self.environment.fields.get("workdir"))

    def to_task(self, fail_to_pass: list[str], pass_to_pass: list[str], extra_metadata: dict | None = None) -> Task:
        env = self.environment
        data = {
            "id": self.id,
            "source": self.kind,
            "instruction": self.instruction,
            "environment": {
                **env.fields,
                "limits": self.config.limits.model_dump(),
                "repository": {"path": self.repository or str(self.git_dir), "commit": self.workspace_commit},
            },
            "verification": {
                "tests": {
                    "framework": self.config.tests.framework,
                    "command": self.config.tests.command,
                    "plugins": self.plugins,
                    "modules": self.modules,
                    "timeout_s": self.config.tests.timeout_s,
                    "fail_to_pass": fail_to_pass,
                    "pass_to_pass": pass_to_pass,
                }
            },
            "reference_solution": {"patch": "<inline>"},
            "max_turns": self.config.max_turns,
            "tags": sorted({*self.config.tags, *self.tags}),
            "metadata": {
                **self.metadata,
                **env.metadata,
                **(extra_metadata or {}),
                "source_files": self.change.source_files,
                "test_files": self.change.test_files,
                # test helpers outside the test folders, held back with the tests (sources/test_support.py)
                **({"test_support_files": self.change.support_files} if self.change.support_files else {}),
            },
        }
        try:
            spec = TaskSpec.model_validate(data)
        except ValidationError as err:
            raise SpecError(guard.validation_problems(self.origin, err)) from None
        task = Task(
            spec=spec,
            origin=self.origin,
            base_dir=str(self.base_dir),
            reference_patch=self.change.source_patch,
            test_patch=self.change.test_patch,
            workspace_digest=f"git:{self.workspace_commit}",
        )
        return task.model_copy(update={"content_hash": task.compute_content_hash()})

    def provisional_task(self) -> Task:
        """The task with a placeholder test id: enough to build its image and check the spec."""
        return self.to_task([PENDING_TEST], [])


def relative_to_source(rel: str, base_dir: Path) -> str:
    """A repository reference as the stored task keeps it: relative to the source's folder, even when
    the config gave an absolute path (a task must not be tied to one machine's layout)."""
    return os.path.relpath((base_dir / rel).resolve(), base_dir.resolve())


def check_change(change: SplitChange, where: str, field: str, what: str) -> None:
    """A change can become a task only if it has a source part to ask for and a test part to grade it."""
    if not change.test_files:
        raise SpecError(
            [
                Problem(
                    where,
                    field,
                    f"{what} changes no test files, so nothing can verify it "
                    f"(changed: {', '.join(change.source_files) or 'nothing'})",
                )
            ]
        )
    if not change.source_files:
        raise SpecError(
            [
                Problem(
                    where,
                    field,
                    f"{what} changes only tests ({', '.join(change.test_files)}): there is no source change to ask for",
                )
            ]
        )


def open_repository(config_path: Path, field: str, rel: str, policy: SourcePolicy) -> Path:
    """The git directory a history source's config names (path, bundle or patch series, relative to
    the config and confined to its folder or an allowed root), or SpecError naming the config file and field."""
    where = guard.confined(config_path.parent, rel, str(config_path), field, policy)
    try:
        git_dir = materialize_repo(where)
    except ValueError as exc:
        raise SpecError([Problem(str(config_path), field, str(exc))]) from None
    if resolve_commit(git_dir, "HEAD") is None:
        raise SpecError([Problem(str(config_path), field, f"{where} is not a git repository with commits")])
    return git_dir


def check_repo_footprint(git_dir: Path, commit: str, limits: Limits, where: str, field: str) -> None:
    """A repository tree that cannot fit the sandbox's /workspace is a reject now, not an
    infrastructure fault at every sandbox start later."""
    need = tree_footprint(git_dir, commit)
    guard.check_footprint(need, limits, where, field)


def derivable_ids(ids: list[str]) -> tuple[list[str], list[str]]:
    """(ids a task can require, ids it cannot): a derived id with whitespace could never be matched."""
    ok = [t for t in ids if valid_test_id(t)]
    return ok, [t for t in ids if not valid_test_id(t)]


def record_candidates(
    config_path: Path,
    field: str,
    rel: str,
    fmt: str | None,
    to_candidate: Callable[[dict, str], "Candidate"],
    policy: SourcePolicy,
    rejects: list[Problem],
) -> Iterator["Candidate"]:
    """Every record of one record file as a candidate (spec checked before any sandbox time), as it is read;
    a missing or outside file, an unreadable record or an invalid one becomes a reject and the rest still load."""
    path = config_path.parent / rel
    try:
        guard.confined(config_path.parent, rel, str(config_path), field, policy)
    except SpecError as exc:
        rejects.extend(exc.problems)
        return
    if not path.exists():
        rejects.append(Problem(str(config_path), field, f"{path} does not exist"))
        return

    def build(rec: dict, where: str) -> "Candidate":
        cand = to_candidate(rec, where)
        cand.provisional_task()  # the spec is checked before any sandbox time is spent
        return cand

    yield from built_records(path, fmt, policy, rejects, build)


def load_config(path: Path, model: type[BaseModel], policy: SourcePolicy) -> BaseModel:
    """A YAML config file validated into its model; problems name the file and dotted field."""
    data = guard.load_yaml_file(path, str(path), policy) or {}
    if not isinstance(data, dict):
        raise SpecError([Problem(str(path), "", "config must be a YAML mapping")])
    try:
        cfg = model.model_validate(data)
    except ValidationError as err:
        raise SpecError(guard.validation_problems(str(path), err)) from None
    if isinstance(cfg, HistorySourceConfig):
        check_dockerfile(cfg.environment, path, policy)
    return cfg
