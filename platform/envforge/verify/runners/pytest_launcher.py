"""Start pytest in the grading sandbox: pytest from the system, the project's own modules from the work tree.

Usage (in the sandbox): python3 -P pytest_launcher.py [PYTEST ARGUMENTS ...]

1. pytest, and what its start-up imports (pluggy, iniconfig, packaging, Debian's attrs ...), is
   imported with every work-tree entry off sys.path: nothing a policy writes (a `pytest.py`, a
   `pluggy.py`, a `json.py`) can shadow pytest, its plugin machinery or the standard library.
2. sys.path is restored; the task's PYTHONPATH entries (ENVFORGE_PYTHONPATH) and the cwd are
   appended after site-packages.
3. The project's own top-level modules (ENVFORGE_PROJECT_MODULES, comma-separated: fixed by the
   task when it was derived, never read from the work tree, so a policy cannot add a name) import
   from the work tree first. Without this a project that pytest itself depends on, or that the base
   image ships (attrs, pluggy, packaging ...), would be tested as the system's copy: pytest's start-up
   already loaded it, and site-packages come before the work tree. A copy loaded from outside the work
   tree is dropped from sys.modules, and a finder at the front of sys.meta_path resolves exactly those
   names from the work tree (its entries on sys.path, or an editable install's finder that maps the
   name into it). The standard library's names and pytest's own are never taken, whatever the list says.
"""

import importlib.machinery
import os
import sys

WORKSPACE = "/workspace"  # envforge.environment.WORKSPACE (a unit test keeps the two equal)
RUNNER_DIR = os.path.dirname(os.path.abspath(__file__))
# Never resolved from the work tree, even when a project's list names them (pytest's own repository).
NEVER_PROJECT = frozenset({"pytest", "_pytest", "py", "envforge_reporter", "unittest_runner", "pytest_launcher"})


def in_workspace(path):
    """Whether a file or folder lies in the work tree (symbolic links followed)."""
    real = os.path.realpath(path)
    return real == WORKSPACE or real.startswith(WORKSPACE + "/")


def _places(file, search_locations):
    return ([file] if file else []) + [p for p in (search_locations or []) if isinstance(p, str)]


def spec_in_workspace(spec):
    """Whether everything a found module would load from lies in the work tree."""
    if spec is None:
        return False
    places = _places(spec.origin if spec.has_location else None, spec.submodule_search_locations)
    return bool(places) and all(in_workspace(p) for p in places)


def module_in_workspace(module):
    places = _places(getattr(module, "__file__", None), getattr(module, "__path__", None))
    return bool(places) and all(in_workspace(p) for p in places)


def project_names(value, stdlib=frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)):
    """The names the work tree may provide: the task's list less the stdlib's and pytest's names."""
    names = (n.strip() for n in value.split(","))
    return frozenset(n for n in names if n.isidentifier() and n not in NEVER_PROJECT and n not in stdlib)


class ProjectFinder:
    """Finds exactly the project's top-level names, in the work tree, before any other finder does."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        roots = [p for p in sys.path if isinstance(p, str) and p and in_workspace(p)]
        spec = importlib.machinery.PathFinder.find_spec(fullname, roots)
        if spec_in_workspace(spec):
            return spec
        # An editable install's own finder (setuptools' __editable__ mapping) may place it in the work tree.
        for finder in sys.meta_path:
            if finder is self or finder is importlib.machinery.PathFinder or isinstance(finder, ProjectFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(fullname, None, target)
            except Exception:
                continue
            if spec_in_workspace(spec):
                return spec
        return None


def prefer_work_tree(names, modules=sys.modules, meta_path=sys.meta_path):
    """Put the project's names on the work tree: the names it provides lose any copy loaded from
    elsewhere (and its submodules), and the finder goes first. Returns the names the work tree has."""
    finder = ProjectFinder(names)
    present = frozenset(n for n in finder.names if finder.find_spec(n) is not None)
    for key in list(modules):
        if key.partition(".")[0] in present and not module_in_workspace(modules[key]):
            del modules[key]
    meta_path.insert(0, finder)
    return present


def main():
    sys.path.insert(0, RUNNER_DIR)
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if p != WORKSPACE and not p.startswith(WORKSPACE + "/")]
    import pytest

    sys.path[:] = saved
    sys.path.extend(p for p in os.environ.get("ENVFORGE_PYTHONPATH", "").split(":") if p)
    sys.path.append(".")
    names = project_names(os.environ.get("ENVFORGE_PROJECT_MODULES", ""))
    if names:
        prefer_work_tree(names)
    sys.exit(pytest.main(sys.argv[1:]))


if __name__ == "__main__":
    main()
