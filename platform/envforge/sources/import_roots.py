"""A repository's own top-level import names, read from its tree at one commit.

A task records them (`tests.modules`) so that its pytest runs import the project from the work
tree even when pytest's start-up, or the base image, already provides a copy (attrs, pluggy,
packaging ...; verify/runners/pytest_launcher.py). They come from the reference tree at derivation,
never from a policy's work tree, so a policy cannot add a name.
"""

from __future__ import annotations

from pathlib import Path

from envforge.gitstore import git

# Files at a repository's root that are tooling, not the project's modules.
_TOOLING = frozenset({"setup", "conftest", "noxfile", "fabfile", "dodo", "manage", "versioneer"})


def import_names(paths: list[str], roots: tuple[str, ...] = ("",)) -> list[str]:
    """The top-level modules and regular packages (a folder with `__init__.py`) directly under each
    root (`""` the repository's, `src` a src layout's): sorted, valid identifiers only."""
    names: set[str] = set()
    for root in roots:
        prefix = f"{root}/" if root else ""
        for path in paths:
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix) :].split("/")
            if len(parts) == 1 and parts[0].endswith(".py"):
                name = parts[0][: -len(".py")]
                if not (root == "" and name in _TOOLING):
                    names.add(name)
            elif len(parts) == 2 and parts[1] == "__init__.py":
                names.add(parts[0])
    return sorted(n for n in names if n.isidentifier())


def project_modules(repo: Path, commit: str, workdir: str | None = None) -> list[str]:
    """The project's top-level import names at the commit: flat and src layouts, at the repository's
    root and, for a project in a subfolder, at its workdir. Empty when the tree cannot be read."""
    proc = git(repo, "ls-tree", "-r", "--name-only", "-z", commit)
    if proc.returncode != 0:
        return []
    paths = [p for p in proc.stdout.decode("utf-8", "replace").split("\0") if p]
    roots: tuple[str, ...] = ("", "src")
    if workdir:
        roots += (workdir, f"{workdir}/src")
    return import_names(paths, roots)
