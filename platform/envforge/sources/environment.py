"""The `environment:` section of history sources (tickets.yaml, reviews.yaml, swebench.yaml).

Same vocabulary as a task spec's `environment:` (`envforge.environment.PythonEnvironment`),
plus where the image comes from (`image` / `dockerfile`) and `setup` commands. When the section
declares no packages (no `pip`, `apt`, `python`, `dockerfile`, or an image other than the base),
they are inferred from the repository's manifests at each task's commit
(`envforge.sources.infer`). Either way the stored task holds the resolved recipe, and its
metadata says what was declared or inferred and from which files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from envforge.environment import PythonEnvironment, inside_path, pip_file_reference
from envforge.errors import Problem, SpecError
from envforge.sources import guard
from envforge.sources.infer import InferredEnvironment, RepoTree, infer_environment, nearest_version
from envforge.sources.policy import SourcePolicy


class HistoryEnvironment(PythonEnvironment):
    """What a history source's repository needs (the `environment:` section of its config)."""

    image: str | None = Field(None, description="'base' (default) or a local image the env layer builds on")
    dockerfile: str | None = Field(
        None, description="Dockerfile, relative to the config's folder, built FROM ${ENVFORGE_BASE} under the env layer"
    )
    setup: list[str] = Field(
        default_factory=list,
        description="shell commands run in the workspace at image build (network only at build time)",
    )

    @field_validator("dockerfile")
    @classmethod
    def _inside(cls, v: str | None) -> str | None:
        return inside_path(v, "dockerfile") if v is not None else None

    @property
    def declares_packages(self) -> bool:
        return bool(self.pip or self.apt or self.python or self.dockerfile or self.image not in (None, "base"))


@dataclass(frozen=True)
class ResolvedEnvironment:
    """The task spec's environment fields for one commit, and the metadata that explains them."""

    fields: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


def check_dockerfile(section: HistoryEnvironment, config_path: Path, policy: SourcePolicy) -> None:
    """The Dockerfile must exist inside the config's folder or an allowed root (symlinks included)."""
    if section.dockerfile is None:
        return
    path = guard.confined(config_path.parent, section.dockerfile, str(config_path), "environment.dockerfile", policy)
    if not path.is_file():
        raise SpecError([Problem(str(config_path), "environment.dockerfile", f"{path} does not exist")])


def added_by_change(before: InferredEnvironment, git_dir: Path, change_commit: str) -> tuple[list[str], list[str]]:
    """The requirement lines (runtime, build) the manifests at `change_commit` name and those at the
    workspace commit do not: a fix that adds a dependency (or raises a bound) needs it installed to
    pass, and a sandbox has no network to fetch it. `-r FILE` lines are left out: the file is read
    from the workspace commit at build time, where it may not say the same."""
    after = infer_environment(git_dir, change_commit)
    pip = [line for line in after.pip if not line.startswith("-") and line not in before.pip]
    build = [line for line in after.build_requires if line not in before.build_requires]
    return pip, build


def resolve_environment(
    section: HistoryEnvironment, git_dir: Path, commit: str, where: str, change_commit: str | None = None
) -> ResolvedEnvironment:
    """Declared or inferred packages for the repository at `commit` (plus, when inferred, what the
    manifests at `change_commit`, the fix, add: see `added_by_change`); SpecError (naming `where`
    and the dotted field) when the section names a requirements file or directory the commit lacks."""
    inferred = infer_environment(git_dir, commit)
    tree = RepoTree(git_dir, commit)
    install = section.install or "auto"
    if install == "auto":
        install = inferred.install
    declared = section.declares_packages
    added_pip, added_build = (
        ([], []) if declared or not change_commit else added_by_change(inferred, git_dir, change_commit)
    )
    build = [*inferred.build_requires, *added_build] if install == "editable" else []
    pip = (
        [*build, *[p for p in section.pip if p not in build]]
        if declared
        else [*build, *[p for p in [*inferred.pip, *added_pip] if p not in build]]
    )
    problems = []
    for i, line in enumerate(section.pip):
        ref = pip_file_reference(line)
        if ref is not None and not tree.exists(ref[1]):
            problems.append(
                Problem(
                    where,
                    f"environment.pip[{i}]",
                    f"requirements file {ref[1]} does not exist in the repository at {commit[:12]}",
                )
            )
    if section.workdir and not any(p.startswith(section.workdir + "/") for p in tree.paths):
        problems.append(
            Problem(
                where, "environment.workdir", f"{section.workdir} is not a directory of the repository at {commit[:12]}"
            )
        )
    if not declared:
        problems += [
            Problem(where, "environment", f"cannot infer the environment at {commit[:12]}: {e}")
            for e in inferred.errors
        ]
    if problems:
        raise SpecError(problems)
    fields = {
        "image": section.image,
        "dockerfile": section.dockerfile,
        "python": section.python or inferred.python,
        "pip": pip,
        "apt": list(section.apt),
        "env": dict(section.env) if declared else {**inferred.env, **section.env},
        "workdir": section.workdir,
        "install": install,
        "setup": list(section.setup),
        "version": section.version or (nearest_version(git_dir, commit) if install == "editable" else None),
    }
    about: dict[str, Any] = {"declared": declared, "install": install}
    if build:
        about["build_requires"] = build
    if not declared:
        about["inferred"] = inferred.as_metadata()
        if added_pip or added_build:
            about["inferred"]["added_by_change"] = [*added_build, *added_pip]
    elif inferred.dynamic_version:
        about["dynamic_version"] = inferred.dynamic_version
    return ResolvedEnvironment(fields, {"environment": about})


__all__ = ["HistoryEnvironment", "ResolvedEnvironment", "added_by_change", "check_dockerfile", "resolve_environment"]
