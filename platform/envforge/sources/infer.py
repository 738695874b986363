"""What a Python repository needs, read from its manifests at one commit, when nobody declared it.

Deterministic: the same tree always gives the same result, read in this order (each adds
to the list; duplicates are dropped, pip merges specifiers of one package):

1. `pyproject.toml`: `[build-system].requires` (the build backend, needed for the editable
   install), `[project].dependencies`, the optional-dependency extras and PEP 735 dependency
   groups named `test`, `tests` or `testing` (`dev` only when none of those exists; a group's
   `{include-group = "..."}` entries are followed, and a cycle or an unknown group is an error
   naming the groups), and `requires-python`;
2. `setup.cfg`: `[options] install_requires`, `python_requires`, `setup_requires`, and the same
   extras under `[options.extras_require]`;
3. `setup.py`, statically (never executed): literal `install_requires`, `tests_require`,
   `setup_requires`, `python_requires` and test extras of the `setup()` call, following plain
   names bound to literals at module level;
4. requirements files at the root or in `requirements/`: `requirements.txt` and every file
   whose name mentions `test` (files mentioning `dev` only when there is none), as `-r FILE`;
5. tox's configuration, the first of the places tox 4 itself reads: `tox.ini`, the INI in
   pyproject.toml's `[tool.tox] legacy_tox_ini`, pyproject.toml's native `[tool.tox]`, then
   `tox.toml`: the `deps` of the base run environment (`[testenv]`, `[env_run_base]`), of
   environments named `test`, `tests` or `testing`, and of the Python-version environments the
   test runs are usually declared in (`[testenv:py{38,39}]`, `[testenv:py311]`, `[env.py312]`:
   every name a section generates is a Python factor alone), without tox substitutions; and their
   `setenv` / `set_env` variables (the test environment's, e.g. `THREADING_TESTS = 1`);
6. what the repository's own CI installs in the jobs that run its tests (`sources/ci_installs.py`):
   the project's extras (`pip install -e .[testing]`) and dependency groups (`--group test`) it
   names, resolved against the manifests above (any extra or group, not only test-named ones),
   requirements files and named packages, and `noxfile.py`'s `session.install(...)` calls of its test
   sessions. Added to what the manifests say, not instead of it: the
   CI is what the suite actually runs with, and what the two share is installed once;
7. only when none of the above names a test dependency: requirements files in `tests/` or `test/`
   (`tests/requirements.txt`, `tests/requirements-ci.txt`), the last place a suite's needs are kept.

Each requirement's source is recorded (`from`: the manifest file, or `FILE:JOB` of a CI job).

Whether the project itself is installed (`editable` when there is a pyproject.toml or a
setup.py) and whether its version comes from VCS metadata (setuptools_scm, hatch-vcs,
versioneer) are read from the same files.
"""

from __future__ import annotations

import ast
import configparser
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from envforge.environment import check_requirement
from envforge.sources.ci_installs import ALL, read_ci_installs
from envforge.sources.gitrepo import git
from envforge.sources.static_python import literal, parse_module

TEST_GROUPS = ("test", "tests", "testing")
# What build backends ask for on top of their own requirements to build an editable wheel
# (PEP 660 `get_requires_for_build_editable`): the editable install runs without build
# isolation, so the env layer has to hold these too.
EDITABLE_REQUIRES = {"hatchling": ["editables"], "setuptools": ["wheel"]}
FALLBACK_GROUPS = ("dev",)
BASE_REQUIREMENTS = ("requirements.txt", "requirements/base.txt", "requirements/main.txt")
_VCS_BACKENDS = {
    "setuptools_scm": "setuptools_scm",
    "setuptools-scm": "setuptools_scm",
    "hatch-vcs": "hatch-vcs",
    "hatch_vcs": "hatch-vcs",
    "versioneer": "versioneer",
    "flit_scm": "setuptools_scm",
    "pdm-backend": None,
    "setuptools-git-versioning": "setuptools-git-versioning",
}


@dataclass
class InferredEnvironment:
    """The result: requirement lines for the env layer and how the project is installed."""

    pip: list[str] = field(default_factory=list)
    build_requires: list[str] = field(default_factory=list)
    python: str | None = None
    install: str = "none"
    dynamic_version: str | None = None
    read: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    found_test_group: bool = False
    dev_groups: list[tuple[list[str], str]] = field(default_factory=list)  # used only when no test group exists
    errors: list[str] = field(default_factory=list)  # manifests that say something impossible (an include-group cycle)
    env: dict[str, str] = field(default_factory=dict)  # tox's set_env of the base (and test) run environment
    origins: list[str] = field(default_factory=list)  # where requirements came from: files, `FILE:JOB` of CI jobs
    declares_tests: bool = False  # a test extra/group, test requirements file, tox deps or CI job named something
    # Every extra of the manifests by name (requirement lines, where), for the extras a CI job installs.
    extras: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    ci_jobs: list[str] = field(default_factory=list)  # `FILE:JOB` of the CI jobs that run tests

    def add_group(self, available: dict, where: str, lines_of=lambda value: value, extras: bool = True) -> None:
        """The test extras/groups of one manifest table; `dev` ones are kept aside as a fallback.
        Every extra is remembered (`extras`) for a CI job that installs it by name."""
        if extras:
            for name, value in available.items():
                lines = (
                    [v for v in lines_of(value) if isinstance(v, str)] if isinstance(value, (str, list, tuple)) else []
                )
                self.extras.setdefault(_canonical(str(name)), (lines, f"{where}.{name}"))
        for name in TEST_GROUPS:
            if name in available:
                self.found_test_group = self.declares_tests = True
                self.add([v for v in lines_of(available[name]) if isinstance(v, str)], f"{where}.{name}")
        for name in FALLBACK_GROUPS:
            if name in available:
                self.dev_groups.append(
                    ([v for v in lines_of(available[name]) if isinstance(v, str)], f"{where}.{name}")
                )

    def add(self, lines: list[str], where: str, build: bool = False, origin: str | list[str] | None = None) -> None:
        """Requirement lines from `where` (`origin`: the file(s) or CI job they come from, by default
        the first word of `where`); a line that is not a requirement is skipped with the reason."""
        kept, named = [], False
        for line in lines:
            try:
                req = check_requirement(_strip_comment(line))
            except ValueError as exc:
                self.skipped.append(f"{where}: {exc}")
                continue
            named = True
            target = self.build_requires if build else self.pip
            if req not in target:
                target.append(req)
                kept.append(req)
        self.read.append(f"{where} ({len(kept)})")
        if named:
            self._origin(origin if origin is not None else where.split(" ")[0])

    def _origin(self, origin: str | list[str]) -> None:
        for o in [origin] if isinstance(origin, str) else origin:
            if o not in self.origins:
                self.origins.append(o)

    def as_metadata(self) -> dict:
        return {
            "read": self.read,
            "skipped": self.skipped,
            "dynamic_version": self.dynamic_version,
            "requires_python": self.python,
            "from": self.origins,
            **({"ci_jobs": self.ci_jobs} if self.ci_jobs else {}),
            **({"env": self.env} if self.env else {}),
        }

    def add_env(self, values: dict[str, str], where: str) -> None:
        """Variables tox sets for the tests (a suite that skips its threading tests without
        `THREADING_TESTS=1`); values with tox substitutions and variables envforge reserves are left out."""
        from envforge.environment import RESERVED_ENV, RESERVED_PREFIXES

        kept = 0
        for name, value in values.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or "{" in value or "\0" in value:
                self.skipped.append(f"{where}: {name} (a substitution or not a variable name)")
            elif name in RESERVED_ENV or name.startswith(RESERVED_PREFIXES):
                self.skipped.append(f"{where}: {name} (set by envforge)")
            else:
                self.env.setdefault(name, value)
                kept += 1
        if kept:
            self.read.append(f"{where} ({kept})")
            self._origin(where.split(" ")[0])


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).strip()


class RepoTree:
    """Files of one commit, read through git (never checked out)."""

    def __init__(self, git_dir: Path, commit: str):
        self.git_dir, self.commit = git_dir, commit
        proc = git(git_dir, "ls-tree", "-r", "--name-only", "-z", commit)
        self.paths = set(proc.stdout.decode(errors="replace").split("\0")) - {""} if proc.returncode == 0 else set()
        self._read: dict[str, str | None] = {}  # pyproject.toml is read by several readers: one `git show`

    def read(self, path: str) -> str | None:
        if path not in self.paths:
            return None
        if path not in self._read:
            proc = git(self.git_dir, "show", f"{self.commit}:{path}")
            self._read[path] = proc.stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else None
        return self._read[path]

    def exists(self, path: str) -> bool:
        return path in self.paths


class DependencyGroupError(ValueError):
    """A PEP 735 dependency group that includes an unknown group or itself (directly or not)."""


def _dependency_group(groups: dict, name: str, path: tuple[str, ...] = ()) -> list[str]:
    """The requirements of one group with its `{include-group = ...}` entries expanded (PEP 735)."""
    from packaging.utils import canonicalize_name

    by_name = {canonicalize_name(str(k)): k for k in groups}
    key = by_name.get(canonicalize_name(name))
    if key is None:
        raise DependencyGroupError(f"[dependency-groups].{path[-1]} includes {name!r}, which is not a group")
    if canonicalize_name(name) in {canonicalize_name(p) for p in path}:
        raise DependencyGroupError("[dependency-groups] include-group cycle: " + " -> ".join([*path, key]))
    items = groups.get(key)
    if not isinstance(items, list):
        raise DependencyGroupError(f"[dependency-groups].{key} is not a list")
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("include-group"), str):
            out += _dependency_group(groups, item["include-group"], (*path, key))
    return out


def _pyproject(tree: RepoTree, inf: InferredEnvironment) -> None:
    text = tree.read("pyproject.toml")
    if text is None:
        return
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        inf.skipped.append(f"pyproject.toml: not valid TOML ({exc})")
        return
    build = data.get("build-system") or {}
    requires = [r for r in build.get("requires") or [] if isinstance(r, str)]
    if requires:
        inf.add(requires, "pyproject.toml [build-system].requires", build=True)
        backend = str(build.get("build-backend") or "").split(".")[0].split(":")[0]
        if backend in EDITABLE_REQUIRES:
            inf.add(EDITABLE_REQUIRES[backend], f"the editable build of {backend}", build=True, origin="pyproject.toml")
    project = data.get("project") or {}
    if build or project:
        inf.install = "editable"
    deps = [d for d in project.get("dependencies") or [] if isinstance(d, str)]
    if deps:
        inf.add(deps, "pyproject.toml [project.dependencies]")
    inf.add_group(project.get("optional-dependencies") or {}, "pyproject.toml [project.optional-dependencies]")
    groups = data.get("dependency-groups") or {}
    if isinstance(groups, dict):
        expanded = {}
        for name in (g for g in groups if g in (*TEST_GROUPS, *FALLBACK_GROUPS)):
            try:
                expanded[name] = _dependency_group(groups, name)
            except DependencyGroupError as exc:
                inf.errors.append(f"pyproject.toml {exc}")
        inf.add_group(expanded, "pyproject.toml [dependency-groups]", extras=False)
    if isinstance(project.get("requires-python"), str):
        inf.python = project["requires-python"]
    tool = data.get("tool") or {}
    backends = " ".join(requires).lower()
    if "setuptools_scm" in tool or "setuptools-scm" in tool:
        inf.dynamic_version = "setuptools_scm"
    elif ((tool.get("hatch") or {}).get("version") or {}).get("source") == "vcs":
        inf.dynamic_version = "hatch-vcs"
    elif "versioneer" in tool:
        inf.dynamic_version = "versioneer"
    else:
        inf.dynamic_version = next((v for k, v in _VCS_BACKENDS.items() if v and k in backends), None)


def _cfg_list(value: str) -> list[str]:
    return [
        _strip_comment(line)
        for line in value.splitlines()
        if _strip_comment(line) and not line.strip().startswith(("#", ";"))
    ]


def _setup_cfg(tree: RepoTree, inf: InferredEnvironment) -> None:
    text = tree.read("setup.cfg")
    if text is None:
        return
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(text)
    except configparser.Error as exc:
        inf.skipped.append(f"setup.cfg: cannot parse ({exc.__class__.__name__})")
        return
    if cfg.has_section("versioneer"):
        inf.dynamic_version = inf.dynamic_version or "versioneer"
    if not cfg.has_section("options"):
        return
    opts = cfg["options"]
    for key in ("install_requires", "tests_require"):
        if opts.get(key):
            inf.add(_cfg_list(opts[key]), f"setup.cfg [options] {key}")
            inf.declares_tests |= key == "tests_require"
    if opts.get("setup_requires"):
        inf.add(_cfg_list(opts["setup_requires"]), "setup.cfg [options] setup_requires", build=True)
    if opts.get("python_requires") and not inf.python:
        inf.python = opts["python_requires"].strip()
    if cfg.has_section("options.extras_require"):
        inf.add_group(dict(cfg["options.extras_require"]), "setup.cfg [options.extras_require]", _cfg_list)


def _setup_py(tree: RepoTree, inf: InferredEnvironment) -> None:
    text = tree.read("setup.py")
    if text is None:
        return
    inf.install = "editable"
    if "use_scm_version" in text:
        inf.dynamic_version = inf.dynamic_version or "setuptools_scm"
    if "versioneer" in text:
        inf.dynamic_version = inf.dynamic_version or "versioneer"
    parsed = parse_module(text)
    if parsed is None:
        inf.skipped.append("setup.py: not parseable as Python")
        return
    module, names = parsed
    calls = [
        n
        for n in ast.walk(module)
        if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "setup"
    ]
    for call in calls[:1]:
        kwargs = {k.arg: k.value for k in call.keywords if k.arg}
        for key in ("install_requires", "tests_require"):
            value = literal(kwargs[key], names) if key in kwargs else None
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                inf.add(list(value), f"setup.py {key}")
                inf.declares_tests |= key == "tests_require"
            elif key in kwargs:
                inf.skipped.append(f"setup.py {key}: not a literal list")
        value = literal(kwargs["setup_requires"], names) if "setup_requires" in kwargs else None
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            inf.add(list(value), "setup.py setup_requires", build=True)
        extras = literal(kwargs["extras_require"], names) if "extras_require" in kwargs else None
        if isinstance(extras, dict):
            inf.add_group({k: v for k, v in extras.items() if isinstance(v, (list, tuple))}, "setup.py extras_require")
        py = literal(kwargs["python_requires"], names) if "python_requires" in kwargs else None
        if isinstance(py, str) and not inf.python:
            inf.python = py


def requirement_files(tree: RepoTree) -> list[str]:
    """The requirements files inference uses, in a stable order."""
    found = sorted(
        p
        for p in tree.paths
        if p.endswith(".txt")
        and (("/" not in p and "requirement" in p.lower()) or PurePosixPath(p).parent.as_posix() == "requirements")
    )
    stem = {p: PurePosixPath(p).stem.lower() for p in found}
    base = [p for p in found if p in BASE_REQUIREMENTS]
    tests = [p for p in found if "test" in stem[p]]
    dev = [] if tests else [p for p in found if "dev" in stem[p]]
    return list(dict.fromkeys(base + tests + dev))


def test_requirement_files(tree: RepoTree) -> list[str]:
    """Requirements files kept with the tests (`tests/requirements.txt`, `test/requirements-ci.txt`):
    read only when nothing else names a test dependency."""
    return sorted(
        p
        for p in tree.paths
        if PurePosixPath(p).parent.as_posix() in ("tests", "test")
        and p.endswith(".txt")
        and PurePosixPath(p).name.lower().startswith("requirements")
    )


def _ci(tree: RepoTree, inf: InferredEnvironment) -> None:
    """What the CI's test jobs install (`sources/ci_installs.py`), each item with its `FILE:JOB`: extras and
    groups are resolved against the manifests (pip installs none of an extra no manifest defines)."""
    found = read_ci_installs(tree)
    inf.ci_jobs = found.jobs
    inf.skipped += [f"CI {s}" for s in found.skipped]
    groups = _pyproject_table(tree, "dependency-groups")
    group_names = {_canonical(str(g)): str(g) for g in groups}
    own = _project_name(tree)
    for item in found.installs:
        where = f"{item.origin} {item.kind} {item.value}"
        kind, values = item.kind, [item.value]
        if kind == "package" and own:
            from packaging.requirements import Requirement

            req = Requirement(item.value)  # ci_installs kept only valid requirements
            if _canonical(req.name) == own:  # `pip install "mypkg[test]"`: the project's own extras
                kind, values = "extra", sorted(req.extras)
        if kind == "package":
            inf.add([item.value], where, origin=item.origin)
        elif kind in ("requirements", "constraints"):
            inf.add([f"{'-c' if kind == 'constraints' else '-r'} {item.value}"], where, origin=item.origin)
        elif kind == "extra":
            for name in list(inf.extras) if values == [ALL] else [_canonical(v) for v in values]:
                if name not in inf.extras:
                    inf.skipped.append(f"{where}: no manifest defines the extra {name!r}")
                    continue
                lines, defined = inf.extras[name]
                inf.add(lines, f"{where} ({defined})", origin=item.origin)
        else:
            for name in list(group_names.values()) if values == [ALL] else values:
                if _canonical(name) not in group_names:
                    if not item.implied:
                        inf.skipped.append(f"{where}: pyproject.toml has no dependency group {name!r}")
                    continue
                try:
                    lines = _dependency_group(groups, name)
                except DependencyGroupError as exc:
                    inf.skipped.append(f"{where}: pyproject.toml {exc}")
                    continue
                inf.add(
                    lines,
                    f"{where} (pyproject.toml [dependency-groups].{group_names[_canonical(name)]})",
                    origin=item.origin,
                )
        inf.declares_tests |= item.origin in inf.origins


def _pyproject_table(tree: RepoTree, key: str) -> dict:
    """One top-level table of pyproject.toml (empty when absent or not valid TOML, which the
    pyproject.toml reader reports)."""
    try:
        table = tomllib.loads(tree.read("pyproject.toml") or "").get(key)
    except tomllib.TOMLDecodeError:
        return {}
    return table if isinstance(table, dict) else {}


def _project_name(tree: RepoTree) -> str | None:
    """The canonical `[project].name` of pyproject.toml, if it has one."""
    name = _pyproject_table(tree, "project").get("name")
    return _canonical(name) if isinstance(name, str) and name.strip() else None


def _tox_deps(lines: list[str]) -> list[str]:
    """tox `deps` lines pip can take as they are: `-r {toxinidir}/x` becomes `-r x`; lines with other
    substitutions, factor conditions (`py38: x`), editable and path installs are left out."""
    kept = []
    for line in lines:
        line = _strip_comment(line)
        m = re.match(r"^-r\s*\{(toxinidir|tox_root)\}/(?P<path>\S+)$", line)
        if m:
            line = f"-r {m.group('path')}"
        if not line or "{" in line or line.startswith(("-e", ".")) or re.match(r"^\S+:\s", line):
            continue
        kept.append(line)
    return kept


def expand_tox_name(name: str) -> list[str]:
    """The environment names a tox section name generates: `py{38,39}-x` -> py38-x, py39-x."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [
        n for part in m.group(1).split(",") for n in expand_tox_name(name[: m.start()] + part.strip() + name[m.end() :])
    ]


def is_python_env(name: str) -> bool:
    """A tox environment named by its Python alone (py, py3, py311, py3.12, pypy3): where projects
    without a `[testenv]` section declare their test run's deps."""
    return all(re.fullmatch(r"(py|pypy)(\d+(\.\d+)?)?", n) for n in expand_tox_name(name))


def _tox_ini(text: str, where: str, inf: InferredEnvironment) -> None:
    cfg = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cfg.read_string(text)
    except configparser.Error as exc:
        inf.skipped.append(f"{where}: cannot parse ({exc.__class__.__name__})")
        return
    named = ("testenv", *(f"testenv:{name}" for name in TEST_GROUPS))
    versions = [s for s in cfg.sections() if s.startswith("testenv:") and is_python_env(s.removeprefix("testenv:"))]
    for section in (*named, *versions):
        if cfg.has_option(section, "deps"):
            lines = _tox_deps(cfg[section]["deps"].splitlines())
            if lines:
                inf.add(lines, f"{where} [{section}] deps")
                inf.declares_tests = True
        for option in ("setenv", "set_env"):
            if cfg.has_option(section, option):
                inf.add_env(_tox_ini_setenv(cfg[section][option]), f"{where} [{section}] {option}")


def _tox_ini_setenv(text: str) -> dict[str, str]:
    """`NAME = value` lines of an INI `setenv`; factor-conditional (`py38: X=1`) and `file|` lines left out."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>.*)$", line)
        if m and not line.startswith("file|"):
            values[m.group("name")] = m.group("value")
    return values


def _tox_toml(table: dict, where: str, inf: InferredEnvironment) -> None:
    """tox 4's TOML configuration: `[env_run_base]` (what `[testenv]` is in tox.ini) and `[env.NAME]`."""
    env = table.get("env")
    envs = env if isinstance(env, dict) else {}
    names = [*TEST_GROUPS, *(n for n in envs if n not in TEST_GROUPS and is_python_env(n))]
    sections = [("env_run_base", table.get("env_run_base")), *((f"env.{n}", envs.get(n)) for n in names)]
    for name, section in sections:
        deps = section.get("deps") if isinstance(section, dict) else None
        if isinstance(deps, str):
            deps = deps.splitlines()
        lines = _tox_deps([d for d in deps if isinstance(d, str)]) if isinstance(deps, list) else []
        if lines:
            inf.add(lines, f"{where} [{name}] deps")
            inf.declares_tests = True
        set_env = section.get("set_env") if isinstance(section, dict) else None
        if isinstance(set_env, dict):
            inf.add_env({k: v for k, v in set_env.items() if isinstance(v, str)}, f"{where} [{name}] set_env")


def _tox(tree: RepoTree, inf: InferredEnvironment) -> None:
    """tox's configuration, from the first place tox 4 looks that has one (see the module docstring)."""
    text = tree.read("tox.ini")
    if text is not None:
        _tox_ini(text, "tox.ini", inf)
        return
    try:
        tool = tomllib.loads(tree.read("pyproject.toml") or "").get("tool") or {}
    except tomllib.TOMLDecodeError:
        tool = {}  # already reported by the pyproject.toml reader
    tox = tool.get("tox") if isinstance(tool, dict) else None
    if isinstance(tox, dict) and isinstance(tox.get("legacy_tox_ini"), str):
        _tox_ini(tox["legacy_tox_ini"], "pyproject.toml [tool.tox] legacy_tox_ini", inf)
        return
    if isinstance(tox, dict) and tox:
        _tox_toml(tox, "pyproject.toml [tool.tox]", inf)
        return
    text = tree.read("tox.toml")
    if text is None:
        return
    try:
        _tox_toml(tomllib.loads(text), "tox.toml", inf)
    except tomllib.TOMLDecodeError as exc:
        inf.skipped.append(f"tox.toml: not valid TOML ({exc})")


def infer_environment(git_dir: Path, commit: str) -> InferredEnvironment:
    """Everything the repository's manifests at `commit` say it needs (see the module docstring)."""
    tree = RepoTree(git_dir, commit)
    inf = InferredEnvironment()
    _pyproject(tree, inf)
    _setup_cfg(tree, inf)
    _setup_py(tree, inf)
    files = requirement_files(tree)
    if files:
        inf.add([f"-r {f}" for f in files], "requirements files " + ", ".join(files), origin=files)
        inf.declares_tests |= any(f not in BASE_REQUIREMENTS for f in files)
    _tox(tree, inf)
    if not inf.found_test_group:
        for lines, where in inf.dev_groups:
            inf.add(lines, where)
            inf.declares_tests = True
    _ci(tree, inf)
    if not inf.declares_tests:
        files = test_requirement_files(tree)
        if files:
            inf.add([f"-r {f}" for f in files], "test requirements files " + ", ".join(files), origin=files)
    inf.pip = _own_extras_expanded(inf, tree)
    if tree.exists("versioneer.py"):
        inf.dynamic_version = inf.dynamic_version or "versioneer"
    return inf


def _own_extras_expanded(inf: InferredEnvironment, tree: RepoTree) -> list[str]:
    """The pip lines with requirements on the project itself (`pkg[speedups]` in its own `test` extra)
    replaced by the lines of the extras they name, as pip resolves them; the editable install provides
    the project. An extra no manifest defines adds nothing (pip warns and goes on)."""
    own = _project_name(tree)
    if not own:
        return inf.pip
    from packaging.requirements import Requirement

    out: list[str] = []
    seen: set[str] = set()

    def expand(line: str) -> None:
        if line.startswith("-") or _canonical(Requirement(line).name) != own:
            if line not in out:
                out.append(line)
            return
        for extra in sorted(_canonical(e) for e in Requirement(line).extras):
            if extra in inf.extras and extra not in seen:
                seen.add(extra)
                for sub in inf.extras[extra][0]:
                    try:
                        expand(check_requirement(_strip_comment(sub)))
                    except ValueError:
                        pass  # already listed under `skipped` if the extra was read

    for line in inf.pip:
        expand(line)
    return out


def nearest_version(git_dir: Path, commit: str) -> str:
    """The nearest tag before `commit`, as a PEP 440 version (v1.2.3 -> 1.2.3), else 0.0.0."""
    proc = git(git_dir, "describe", "--tags", "--abbrev=0", commit)
    tag = proc.stdout.decode(errors="replace").strip() if proc.returncode == 0 else ""
    tag = re.sub(r"^[^0-9]*", "", tag)
    from packaging.version import InvalidVersion, Version

    try:
        return str(Version(tag))
    except InvalidVersion:
        return "0.0.0"


__all__ = [
    "DependencyGroupError",
    "InferredEnvironment",
    "RepoTree",
    "infer_environment",
    "nearest_version",
    "requirement_files",
    "test_requirement_files",
]
