"""The tests' own helpers outside the test folders: changed files only the tests import.

A commit's change is split by path (gitrepo.split_change): tests/, test_*.py, conftest.py go to the
test change, everything else to the source change a policy must write. Some projects keep test helpers
elsewhere: filelock's `tasks/coverage_pragmas.py` sits on pytest's `pythonpath` and its tests import
capability probes from it. A commit that adds a probe there and uses it in 27 test files was split with
the helper in the source change, so every test that imported the new name failed to collect before
the change (959 FAIL_TO_PASS ids for a fix of a few lines in `_strict.py`), and a policy would have had
to write the helper's names, which no statement mentions.

A changed Python file is such a helper when it is a loose module (not in a folder with `__init__.py`)
outside the project's own modules (its top-level import names, import_roots.py), the tests of the changed
tree import it, and no other Python file of that tree does (helpers imported only by other helpers count
as test files). It then goes with the test change. Files in a package stay where they are: a package
outside the layouts import_roots.py knows (`lib/pkg/`) is more likely the project's code than the tests'.
Nothing moves when no Python file would be left in the source change: a single-module project in a
subfolder looks like a helper, and without a code change there is no task to derive.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable, Iterable

from envforge.gitstore import file_text, git
from envforge.verify.protect import matches

__all__ = ["module_names", "test_support_files"]


def module_names(path: str) -> set[str]:
    """The dotted names a file may be imported by, one per folder it may be imported from:
    `tasks/coverage_pragmas.py` -> {"tasks.coverage_pragmas", "coverage_pragmas"}."""
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return {".".join(parts[i:]) for i in range(len(parts)) if all(p.isidentifier() for p in parts[i:])}


def _imports(importer: str, text: str) -> tuple[set[str], set[str]]:
    """(absolute module names, repository paths of relative imports) that a Python file imports;
    empty when it does not parse (it then imports nothing as far as this module can tell)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set(), set()
    names: set[str] = set()
    paths: set[str] = set()
    folder = importer.split("/")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif node.level > 0 and node.level - 1 <= len(folder):
                base = folder[: len(folder) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                targets = [base] + [base + [alias.name] for alias in node.names]
                paths.update("/".join(t) for t in targets if t)
    return names, paths


def _imported_by(candidate: str, names: set[str], paths: set[str]) -> bool:
    stem = candidate[: -len("/__init__.py")] if candidate.endswith("/__init__.py") else candidate[: -len(".py")]
    return bool(module_names(candidate) & names) or stem in paths


def _existing(repo: Path, commit: str, paths: Iterable[str]) -> set[str]:
    """Which of the paths are files in the tree at `commit` (one `git ls-tree` over just those paths, not the
    whole tree: a history source asks this of every commit that changes a nested Python file)."""
    wanted = sorted(set(paths))
    if not wanted:
        return set()
    proc = git(repo, "--literal-pathspecs", "ls-tree", "--name-only", "-z", commit, "--", *wanted)
    if proc.returncode != 0:
        return set()
    return {p for p in proc.stdout.decode("utf-8", "replace").split("\0") if p} & set(wanted)


def _nested_python(path: str) -> bool:
    """A Python file below the root and not directly under src/ (files there are the project's modules, or
    root tooling such as setup.py)."""
    return path.endswith(".py") and "/" in path and not re.fullmatch(r"src/[^/]+", path)


def _markers(path: str) -> list[str]:
    """The `__init__.py` files that, present, make a nested file one of the project's modules (a regular
    package at the root or under src/, as import_roots.py reads a layout) or a member of a package."""
    parts = path.split("/")
    markers = [f"{parts[0]}/__init__.py", "/".join(parts[:-1] + ["__init__.py"])]
    if parts[0] == "src" and len(parts) > 2:
        markers.append(f"src/{parts[1]}/__init__.py")
    return markers


def _mentioning(repo: Path, commit: str, words: Iterable[str]) -> list[str]:
    """The Python files of the tree at `commit` that contain one of the words (a cheap first cut)."""
    args = [arg for word in sorted(set(words)) for arg in ("-e", word)]
    proc = git(repo, "grep", "-l", "-w", "-I", "--full-name", *args, commit, "--", "*.py")
    prefix = f"{commit}:"
    return [line[len(prefix) :] for line in proc.stdout.decode(errors="replace").splitlines() if line]


def test_support_files(
    repo: Path, before: str, commit: str, source_files: list[str], test_globs: list[str]
) -> list[str]:
    """The files of `source_files` (the source part of the change from `before` to `commit`) that are the
    tests' helpers at `commit` (see the module's docstring), sorted; [] when none is, or when no Python file
    would be left to ask for. A package is one in either tree (a commit that deletes a package's
    `__init__.py` leaves its modules the project's)."""
    nested = [p for p in source_files if _nested_python(p)]
    if not nested:
        return []
    marked: dict[str, bool] = {}

    def loose(path: str) -> bool:
        if not _nested_python(path):
            return False
        unknown = [m for m in _markers(path) if m not in marked]
        if unknown:
            present = _existing(repo, before, unknown) | _existing(repo, commit, unknown)
            marked.update({m: m in present for m in unknown})
        return not any(marked[m] for m in _markers(path))

    after = _existing(repo, commit, nested)
    helpers = _TestHelpers(repo, commit, test_globs, loose)
    support = sorted(p for p in nested if p in after and loose(p) and helpers.is_helper(p))
    if not any(p.endswith(".py") and p not in support for p in source_files):
        return []  # no code change left to ask for
    return support


class _TestHelpers:
    """Which loose modules of one tree only the tests import, directly or through other such modules."""

    def __init__(self, repo: Path, commit: str, test_globs: list[str], loose: Callable[[str], bool]):
        self._repo, self._commit, self._test_globs, self._loose = repo, commit, test_globs, loose
        self._known: dict[str, bool] = {}
        self._imports: dict[str, tuple[set[str], set[str]]] = {}

    def is_helper(self, path: str, visiting: frozenset[str] = frozenset()) -> bool:
        if path in self._known:
            return self._known[path]
        if path in visiting:  # an import cycle among candidates: not shown to be the tests' alone
            return False
        importers = self._importers(path)
        self._known[path] = bool(importers) and all(
            matches(i, self._test_globs) or (self._loose(i) and self.is_helper(i, visiting | {path})) for i in importers
        )
        return self._known[path]

    def _importers(self, path: str) -> list[str]:
        words = {name.rsplit(".", 1)[-1] for name in module_names(path)}
        found = []
        for other in _mentioning(self._repo, self._commit, words):
            if other == path:
                continue
            if other not in self._imports:
                self._imports[other] = _imports(other, file_text(self._repo, self._commit, other) or "")
            if _imported_by(path, *self._imports[other]):
                found.append(other)
        return found
