"""What a repository needs to run its tests: interpreter, packages, variables, where to start.

One vocabulary serves hand-written task specs (`environment:` in task.yaml) and every history
source (`environment:` in tickets.yaml, reviews.yaml, swebench.yaml), so a task mined from a
ticket is stored with the same fields a person would have written. The packages (`python`,
`pip`, `apt`) become an *env layer*: an image shared by every task of a repository whose
recipe and dependency manifests are the same (see `envforge.sandbox.envlayer`).

Variables in `env` reach every test run and every episode command. envforge's own variables
are merged with them, never silently replacing them: path lists (PATH, PYTHONPATH) keep the
user's entries, and the few variables envforge relies on for isolation are refused at load
time with the reason, instead of being overridden later without a word.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Where the task's repository is inside a sandbox: what the policy edits (re-exported by envforge.task;
# sandbox/agent.py, stdlib-only, keeps its own copy, checked equal by tests/test_constants.py).
WORKSPACE = "/workspace"
# Variables envforge sets for isolation (a policy must not be able to load code into the test
# runner through them); a source that sets one is told so at load time.
RESERVED_ENV = {
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "plugin autoload stays off in every test run; list plugins under tests.plugins",
    "PYTEST_PLUGINS": "plugins are loaded only by name from tests.plugins",
    "PYTEST_ADDOPTS": "test options belong in tests.command",
    "PYTHONNOUSERSITE": "the user site directory stays off",
    "PYTHONHOME": "the interpreter's home is the image's",
    "PYTHONSTARTUP": "start-up hooks are not allowed",
    "PYTHONUSERBASE": "the user site directory stays off",
    "LD_PRELOAD": "preloaded libraries could replace the test runner",
    "LD_AUDIT": "audit libraries could replace the test runner",
    "LD_LIBRARY_PATH": "set library paths in the image (apt, dockerfile), not per command",
    "BASH_ENV": "shell start-up files are not allowed",
    "ENV": "shell start-up files are not allowed",
}
RESERVED_PREFIXES = ("ENVFORGE_",)
PATH_LISTS = ("PATH", "PYTHONPATH")
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # what sandbox commands get when nobody sets PATH
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_APT_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]*(=[A-Za-z0-9.+:~-]+)?$")
_PIP_FILE_OPTION = re.compile(r"^(-r|-c|--requirement|--constraint)(?:\s+|=)(?P<path>\S+)$")
_ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)


def inside_path(value: str, what: str) -> str:
    """A relative path that stays inside its folder (no absolute paths, no `..`)."""
    p = PurePosixPath(value)
    if not value or p.is_absolute() or ".." in p.parts or "\\" in value:
        raise ValueError(f"{what} {value!r} must be a relative path inside the repository (no '..', not absolute)")
    return p.as_posix()


def pip_file_reference(line: str) -> tuple[str, str] | None:
    """('-r'|'-c', path) for a requirements/constraints file line, None for a requirement."""
    m = _PIP_FILE_OPTION.match(line.strip())
    if not m:
        return None
    opt = "-c" if m.group(1) in ("-c", "--constraint") else "-r"
    return opt, m.group("path")


def check_requirement(line: str) -> str:
    """A pip line: a requirement specifier or `-r/-c FILE` inside the repository; other options are refused."""
    line = line.strip()
    ref = pip_file_reference(line)
    if ref is not None:
        inside_path(ref[1], f"pip {ref[0]} file")
        return f"{ref[0]} {PurePosixPath(ref[1]).as_posix()}"
    if line.startswith("-"):
        raise ValueError(
            f"pip entry {line!r}: only requirements and `-r FILE` / `-c FILE` are allowed "
            f"(the package index is the one configured for envforge)"
        )
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(line)
    except InvalidRequirement as exc:
        raise ValueError(f"pip entry {line!r} is not a requirement: {exc}") from None
    return line


class PythonEnvironment(BaseModel):
    """The fields task specs and history sources share (the env layer, variables, start directory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str | None = Field(
        None,
        description="interpreter the env layer must provide: a version (`3.11`) or a specifier (`>=3.10`). "
        "The base image offers Python 3.11; for another version use `image:` or `dockerfile:` "
        "with an image that has it",
    )
    pip: list[str] = Field(
        default_factory=list,
        description="installed in the env layer: requirement specifiers (pin them: "
        "`name==1.2`), or `-r FILE` / `-c FILE` for a requirements or constraints "
        "file inside the repository",
    )
    apt: list[str] = Field(default_factory=list, description="Debian packages installed in the env layer")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="variables for every test run and episode command; PATH and PYTHONPATH "
        "entries are merged with envforge's",
    )
    workdir: str | None = Field(
        None,
        description="directory, relative to the repository root, that tests and the "
        "policy's commands start in (default: the root)",
    )
    install: Literal["auto", "editable", "none"] | None = Field(
        None,
        description="how the repository's own package becomes importable from the work tree: `editable` "
        "(pip install -e at image build, so src layouts and VCS versions work), `none`, or `auto` "
        "(editable when the repository has a pyproject.toml or setup.py). Default: `auto` for "
        "history sources, `none` for task specs",
    )
    version: str | None = Field(
        None,
        description="version the project is installed as when its version comes from VCS metadata "
        "(setuptools_scm, hatch-vcs): SETUPTOOLS_SCM_PRETEND_VERSION at build. Default: the "
        "nearest tag of the task's commit, else 0.0.0",
        pattern=r"^[0-9][0-9A-Za-z.+!-]{0,63}$",
    )

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.strip()
        if re.fullmatch(r"3\.\d{1,2}", v):
            return v
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            SpecifierSet(v)
        except InvalidSpecifier:
            raise ValueError(f"{v!r} is neither a version like 3.11 nor a specifier like >=3.10") from None
        return v

    @field_validator("pip")
    @classmethod
    def _pip(cls, v: list[str]) -> list[str]:
        return [check_requirement(line) for line in v if line.strip()]

    @field_validator("apt")
    @classmethod
    def _apt(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if not _APT_NAME.match(p)]
        if bad:
            raise ValueError(f"not Debian package names: {bad}")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a variable name")
            why = RESERVED_ENV.get(name) or ("envforge's own namespace" if name.startswith(RESERVED_PREFIXES) else "")
            if why:
                raise ValueError(f"{name} is set by envforge for every command ({why})")
            if "\0" in str(value):
                raise ValueError(f"{name}: value contains a NUL byte")
        return {k: str(val) for k, val in v.items()}

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is None or v.strip() in ("", "."):
            return None
        return inside_path(v.strip().rstrip("/"), "workdir")

    @property
    def needs_env_layer(self) -> bool:
        return bool(self.pip or self.apt or self.python)

    def command_workdir(self) -> str:
        return f"{WORKSPACE}/{self.workdir}" if self.workdir else WORKSPACE

    def command_env(self, envforge: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables of one command: the task's, merged with envforge's (path lists keep both)."""
        return merge_env(self.env, envforge or {})

    def launcher_paths(self) -> list[str]:
        """PYTHONPATH entries of the task, as absolute paths for the safe pytest launcher to append."""
        entries = [e for e in self.env.get("PYTHONPATH", "").split(":") if e]
        return [e if e.startswith("/") else f"{self.command_workdir()}/{e}" for e in entries]


def merge_env(user: Mapping[str, str], envforge: Mapping[str, str]) -> dict[str, str]:
    """User variables plus envforge's: PATH gets the user's entries first, PYTHONPATH envforge's first
    (its runner must stay importable); other envforge variables are the reserved ones, which users
    cannot set, so nothing of the user's is dropped."""
    merged = {**user, **{k: v for k, v in envforge.items() if k not in PATH_LISTS}}
    if "PATH" in user:
        envforge = {"PATH": SANDBOX_PATH, **envforge}
    for name in PATH_LISTS:
        parts = [envforge.get(name, ""), user.get(name, "")]
        if name == "PATH":
            parts.reverse()
        joined = ":".join(p for p in parts if p)
        if joined:
            merged[name] = joined
    return merged


def split_assignments(command: str) -> tuple[dict[str, str], str]:
    """`A=1 B=2 python3 -m pytest -x` -> ({'A': '1', 'B': '2'}, 'python3 -m pytest -x').

    Leading assignments in a test command become variables, so the command can still go
    through the safe pytest launcher and the assignment cannot silently drop envforge's own.
    """
    try:
        words = shlex.split(command)
    except ValueError:
        return {}, command
    env: dict[str, str] = {}
    consumed = 0
    for word in words:
        m = _ASSIGNMENT.match(word)
        if not m:
            break
        env[m.group("name")] = m.group("value")
        consumed += 1
    if not env:
        return {}, command
    return env, shlex.join(words[consumed:])


def check_command(command: str | None) -> str | None:
    """A test command whose leading `NAME=value` words do not set a variable envforge reserves."""
    if command:
        for name in split_assignments(command)[0]:
            why = RESERVED_ENV.get(name) or ("envforge's own namespace" if name.startswith(RESERVED_PREFIXES) else "")
            if why:
                raise ValueError(f"{name} is set by envforge for every command ({why})")
    return command


__all__ = [
    "PATH_LISTS",
    "check_command",
    "RESERVED_ENV",
    "PythonEnvironment",
    "check_requirement",
    "inside_path",
    "merge_env",
    "pip_file_reference",
    "split_assignments",
]
