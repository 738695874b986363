"""The task model: what a policy is asked to do, where, and how success is verified.

`TaskSpec` is the on-disk contract users write by hand (YAML) and other sources emit; it is
validated strictly (unknown fields are errors) so that typos fail loudly instead of silently
dropping a checkpoint. `Task` is a spec resolved against its files: patch text, verifier
files and a content hash, everything later stages need without re-reading the source.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from envforge.environment import WORKSPACE as WORKSPACE  # the task model's sandbox paths are importable from here
from envforge.environment import PythonEnvironment, check_command

TASK_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{1,79}$"
# Paths inside the sandbox besides WORKSPACE (what the policy edits): /run/envforge-verifier
# is a root-owned tmpfs where the grader installs verifier files after the policy is done.
VERIFIER_DIR = "/run/envforge-verifier/verifier"
# Writable tmpfs mounts besides /workspace and /tmp (/dev/shm and /run/envforge, 16 MiB each), and
# the memory kept for the in-sandbox agent when a policy fills them all.
EXTRA_TMPFS_MB = 32
AGENT_RESERVE_MB = 48


# Spaces are allowed inside an id (pytest parametrize ids and TAP descriptions hold them; no id
# ever reaches a shell unquoted or pytest's command line), not at either end; control characters
# and other whitespace (tabs, newlines, line separators) are not: reports are read line by line.
TEST_ID_PATTERN = r"^(?=.{1,2000}$)[^\s\x00-\x1f\x7f](?:[^\s\x00-\x1f\x7f]| )*(?<! )$"
_TEST_ID = re.compile(TEST_ID_PATTERN)


def check_regex(value: str) -> str:
    """A field's regular expression, or ValueError saying why Python cannot compile it."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a valid regular expression: {exc}") from None
    return value


def valid_test_id(value: str) -> bool:
    return bool(_TEST_ID.match(value))


def _test_id(value: str, info: ValidationInfo) -> str:
    # Tasks read back from the catalog (context `stored`) were checked when they were ingested, under
    # the rules of their time: a stricter rule must not make an existing catalog unreadable.
    if (info.context or {}).get("stored"):
        return value
    if not valid_test_id(value):
        raise ValueError(
            f"test id {value[:200]!r} is empty, longer than 2000 characters, starts or ends with a space, "
            "or holds control characters or whitespace other than a space: ids are matched against "
            "the runner's report line by line, so such an id could never pass"
        )
    return value


# A test id as the runner reports it (pytest node id, unittest id, TAP/pattern name).
TestId = Annotated[str, AfterValidator(_test_id), Field(json_schema_extra={"pattern": TEST_ID_PATTERN})]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class Limits(_Strict):
    """Resource quotas for one sandbox. Defaults are safe for small repositories."""

    cpus: float = Field(1.0, gt=0, le=64, description="CPU cores (CFS quota)")
    memory_mb: int = Field(1024, ge=64, le=262144, description="memory limit incl. tmpfs pages")
    pids: int = Field(256, ge=16, le=65536, description="max processes/threads in the sandbox")
    workspace_mb: int = Field(512, ge=16, le=65536, description="size of the writable /workspace")
    tmp_mb: int = Field(256, ge=16, le=65536, description="size of the writable /tmp")
    command_timeout_s: float = Field(120, gt=0, le=86400, description="default per-command wall time")
    trajectory_timeout_s: float = Field(1800, gt=0, le=604800, description="wall time for a whole episode")

    @model_validator(mode="after")
    def _tmpfs_fits_in_memory(self, info: ValidationInfo) -> "Limits":
        # tmpfs pages are charged to the sandbox's memory cgroup and no OOM kill frees them: a
        # full disk must hit ENOSPC, not the OOM killer, and the agent must keep room to work
        # when a policy fills every mount it can write to.
        need = self.workspace_mb + self.tmp_mb + EXTRA_TMPFS_MB + AGENT_RESERVE_MB
        if (info.context or {}).get("stored"):  # checked at ingest, under that time's rule (see _test_id)
            need = self.workspace_mb + self.tmp_mb + 1
        if need > self.memory_mb:
            raise ValueError(
                f"workspace_mb + tmp_mb + {EXTRA_TMPFS_MB + AGENT_RESERVE_MB} ({need}) must not exceed "
                f"memory_mb ({self.memory_mb}): tmpfs pages count against memory, /dev/shm and "
                f"/run/envforge take {EXTRA_TMPFS_MB} MiB and the agent keeps {AGENT_RESERVE_MB} MiB"
            )
        return self


class NetworkPolicy(_Strict):
    """Network is off unless a task opts into an explicit allow-list."""

    mode: Literal["none", "allowlist"] = "none"
    allow: list[str] = Field(default_factory=list, description="host:port entries when mode=allowlist")

    @model_validator(mode="after")
    def _allow_only_with_allowlist(self) -> "NetworkPolicy":
        if self.mode == "none" and self.allow:
            raise ValueError("'allow' entries need mode: allowlist")
        if self.mode == "allowlist" and not self.allow:
            raise ValueError("mode: allowlist needs at least one 'allow' entry (host:port)")
        for entry in self.allow:
            if not re.fullmatch(r"[A-Za-z0-9.-]+:\d{1,5}", entry):
                raise ValueError(f"allow entry {entry!r} is not host:port")
        return self


class RepositorySnapshot(_Strict):
    """A local git repository checked out at one commit as the workspace."""

    path: str = Field(description="git repository directory, relative to the spec file")
    commit: str = Field(
        pattern=r"^[0-9a-fA-F]{7,40}$|^[A-Za-z0-9._/][A-Za-z0-9._/~^-]{0,199}$",
        description="a commit SHA, or a ref (`main`, `main~3`) that ingest resolves to its SHA",
    )


class Environment(PythonEnvironment):
    """How the task's container image is made, and its limits.

    The fields it shares with history sources (python, pip, apt, env, workdir, install) come
    from `envforge.environment.PythonEnvironment`.
    """

    image: str | None = Field(None, description="'base' (the envforge base image) or a local image name")
    dockerfile: str | None = Field(None, description="Dockerfile relative to the spec; FROM ${ENVFORGE_BASE}")
    files: str | None = Field(None, description="directory (relative to the spec) copied into /workspace")
    repository: RepositorySnapshot | None = None
    setup: list[str] = Field(default_factory=list, description="shell commands run in /workspace at build")
    limits: Limits = Field(default_factory=Limits)
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)

    @model_validator(mode="after")
    def _one_image_source(self) -> "Environment":
        if self.image is not None and self.dockerfile is not None:
            raise ValueError("set either 'image' or 'dockerfile', not both")
        if self.files is not None and self.repository is not None:
            raise ValueError("set either 'files' or 'repository' for the workspace, not both")
        return self

    @property
    def base(self) -> str:
        return self.image or "base"


class TestCheckpoint(_Strict):
    """Run a test suite; named tests must go from failing to passing (or keep passing)."""

    framework: Literal["pytest", "unittest", "tap", "pattern"] = "pytest"
    command: str | None = Field(
        None,
        description="pytest: runner invocation (default `python3 -m pytest`); unittest: the interpreter "
        "(default `python3`); tap/pattern: the command whose stdout is parsed (required)",
    )
    plugins: list[str] = Field(
        default_factory=list, description="pytest plugins to load (`-p NAME`); plugin autoload is always off"
    )
    modules: list[str] = Field(
        default_factory=list,
        description="pytest: the project's own top-level import names, imported from the work tree before any "
        "installed copy (pytest's own start-up may have loaded one); recorded at derivation from the workspace "
        "commit's import roots. The standard library's names and pytest's are never taken from the work tree",
    )
    pattern: str | None = Field(None, description="pattern framework: regex with named groups `id` and `status`")
    fail_to_pass: list[TestId] = Field(description="test ids that fail before and must pass after")
    pass_to_pass: list[TestId] = Field(default_factory=list, description="test ids that must keep passing")
    timeout_s: float = Field(300, gt=0, le=86400)

    @model_validator(mode="after")
    def _framework_needs(self) -> "TestCheckpoint":
        if self.framework in ("tap", "pattern") and not self.command:
            raise ValueError(f"framework {self.framework} needs a 'command' whose output is parsed")
        if self.framework == "pattern":
            if not self.pattern:
                raise ValueError("framework pattern needs 'pattern' (a regex with groups `id` and `status`)")
            try:
                groups = re.compile(self.pattern).groupindex
            except re.error as exc:
                raise ValueError(f"pattern is not a valid regular expression: {exc}") from None
            if not {"id", "status"} <= set(groups):
                raise ValueError("pattern needs named groups `id` and `status`")
        elif self.pattern is not None:
            raise ValueError("'pattern' is only used with framework: pattern")
        return self

    @property
    def ids(self) -> list[str]:
        return [*self.fail_to_pass, *self.pass_to_pass]

    @field_validator("modules")
    @classmethod
    def _modules(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name.isidentifier():
                raise ValueError(f"modules: {name!r} is not a top-level import name")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        return check_command(v)

    @field_validator("fail_to_pass")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one test id is needed: a task must fail before its fix")
        return v

    @model_validator(mode="after")
    def _disjoint(self) -> "TestCheckpoint":
        both = sorted(set(self.fail_to_pass) & set(self.pass_to_pass))
        if both:
            raise ValueError(f"test ids in both fail_to_pass and pass_to_pass: {both}")
        return self


class ShellCheckpoint(_Strict):
    """A command whose exit code (and optionally stdout) says whether a goal was reached."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    run: str = Field(min_length=1, description="shell command, run in /workspace")
    expect_exit: int = Field(0, ge=0, le=255)
    stdout_pattern: str | None = Field(None, description="Python regex searched in stdout")
    timeout_s: float = Field(60, gt=0, le=86400)

    @field_validator("stdout_pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        return v if v is None else check_regex(v)


class Verification(_Strict):
    tests: TestCheckpoint | None = None
    checkpoints: list[ShellCheckpoint] = Field(default_factory=list)
    files: str | None = Field(
        None, description=f"directory (relative to the spec) of verifier files, placed at {VERIFIER_DIR} at grading"
    )
    test_patch: str | None = Field(
        None,
        description="diff (relative to the spec) held back from the policy and "
        "applied at grading, after the policy's diff",
    )
    protected_paths: list[str] | None = Field(
        None,
        description="globs (`**` allowed) of workspace paths the policy's diff may not change; default: test "
        "files, conftest.py, pytest/tox/setup.cfg/pyproject config, sitecustomize, .pth files",
    )
    zero_reward_on_protected_change: bool = Field(
        False, description="reward 0 when the diff touches a protected path (by default the change is ignored)"
    )
    partial_credit: bool = Field(False, description="reward = fraction of required tests and checkpoints that pass")

    @model_validator(mode="after")
    def _something_to_check(self) -> "Verification":
        if self.tests is None and not self.checkpoints:
            raise ValueError("needs 'tests' or at least one entry in 'checkpoints'")
        names = [c.name for c in self.checkpoints]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"checkpoint names must be unique, repeated: {dup}")
        return self


class ReferenceSolution(_Strict):
    """A known-good solution: a unified diff against the workspace, or shell commands."""

    patch: str | None = Field(None, description="path (relative to the spec) of a unified diff")
    commands: list[str] | None = Field(None, description="shell commands run in /workspace")

    @model_validator(mode="after")
    def _exactly_one(self) -> "ReferenceSolution":
        if (self.patch is None) == (self.commands is None):
            raise ValueError("set exactly one of 'patch' or 'commands'")
        if self.commands is not None and not self.commands:
            raise ValueError("'commands' must not be empty")
        return self


class TaskSpec(_Strict):
    """A task as written by a person or emitted by a source parser."""

    id: str = Field(pattern=TASK_ID_PATTERN, description="unique, lowercase, [a-z0-9._-]")
    source: str = Field("spec", description="source kind that produced the task")
    instruction: str = Field(min_length=10, description="the text the policy sees")
    environment: Environment = Field(default_factory=Environment)
    verification: Verification
    reference_solution: ReferenceSolution
    max_turns: int = Field(30, ge=1, le=1000)
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict, description="free-form, kept with the task")

    @field_validator("instruction")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v


class Task(BaseModel):
    """A spec resolved against its files; carries everything grading needs."""

    model_config = ConfigDict(frozen=True)

    spec: TaskSpec
    origin: str = Field(description="where the spec came from (file path or source record)")
    base_dir: str = Field(description="directory relative paths in the spec resolve against")
    reference_patch: str | None = None
    test_patch: str | None = None
    verifier_files: dict[str, str] = Field(default_factory=dict, description="relative path -> base64 bytes")
    workspace_digest: str = Field("", description="sha256 of the workspace files tree")
    content_hash: str = ""

    @property
    def id(self) -> str:
        return self.spec.id

    @classmethod
    def from_stored(cls, task_json: str) -> "Task":
        """A task as the catalog stored it (checked at ingest; not re-checked against newer ingest rules)."""
        return cls.model_validate_json(task_json, context={"stored": True})

    def verifier_bytes(self) -> dict[str, bytes]:
        return {k: base64.b64decode(v) for k, v in self.verifier_files.items()}

    def compute_content_hash(self) -> str:
        """Hash of everything that defines the task; task-set versions are built from these."""
        spec = self.spec.model_dump(mode="json")
        tests = (spec.get("verification") or {}).get("tests")
        if tests is not None and not tests.get("modules"):  # added later: unset, a task keeps its earlier hash
            del tests["modules"]
        payload = {
            "spec": spec,
            "reference_patch": self.reference_patch,
            "test_patch": self.test_patch,
            "verifier_files": self.verifier_files,
            "workspace_digest": self.workspace_digest,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def workspace_path(self) -> Path | None:
        files = self.spec.environment.files
        return (Path(self.base_dir) / files) if files else None


def task_spec_json_schema() -> dict[str, Any]:
    """The JSON Schema users and editors validate YAML task specs against."""
    schema = TaskSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "envforge task spec"
    return schema
