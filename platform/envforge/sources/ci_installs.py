"""What a repository's own CI installs before it runs the tests, read from its CI files (never run).

Many projects declare their test dependencies nowhere but in a workflow step
(`pip install -e .[testing]`, `pip install -r requirements/tests.txt pytest-asyncio`,
`uv pip install --group test`). Environment inference (`sources/infer.py`) adds what this module
finds to what the manifests say, so the env layer holds what the project's CI gives its suite.

Read, in this order (each file with the bounded YAML loader sources use, `guard.load_yaml`):

- GitHub Actions: `.github/workflows/*.yml` / `*.yaml`, each job's `run:` steps (with the job's and
  the workflow's `defaults.run.working-directory` and the step's `working-directory`);
- GitLab: `.gitlab-ci.yml`, each job's `before_script` (its own, else `default:`'s or the top
  level one) and `script`, following `extends:` of templates in the same file;
- Azure Pipelines: `azure-pipelines.yml` / `.azure-pipelines.yml`, the `script:` / `bash:` steps of
  each job (top-level `steps:`, `jobs:`, or `stages:` -> `jobs:`);
- then `noxfile.py`, statically (never run): the `session.install(...)` calls of the sessions the CI's
  test jobs run (`nox -s tests-3.12`), or of every session whose name runs tests when no job names one.

Only jobs that run tests count: a command (outside the install commands) runs pytest / py.test,
`python -m unittest`, `setup.py test` or `make test|tests|check`. A job that runs them only through
tox or nox (`tox`, `tox -e py311`, `nox -s tests`; not `tox -e docs` or `tox -e mypy-test`) is listed
too, but its installs are not read: they set up the runner (`pip install tox coverage`), and the test
environment is tox's, which inference reads from tox's configuration. From the install commands
(`pip install`, `pip3 install`, `python -m pip install`, `uv pip install`, `uv sync`) of the others come:

- extras of the project itself (`.`, `.[test,dev]`, `-e ".[testing]"`, uv's `--extra` / `--all-extras`);
- requirements and constraints files (`-r FILE`, `-c FILE`), relative to the step's directory,
  normalized; a path that leaves the repository (`..`, absolute) is refused with the reason;
- dependency groups (`--group NAME`; `uv sync`'s default `dev` group unless `--no-dev`);
- named packages (`pytest-asyncio`, `"hypothesis>=6"`).

Left out, with a reason in `skipped`: tokens holding CI expressions or shell variables
(`${{ matrix.extras }}`, `$PKG`), other local paths, wheels and URLs, and the tools that set up or
publish rather than test (pip, setuptools, wheel, build, twine, tox, nox and their `tox-*` / `nox-*`
plugins, uv, virtualenv, pipx, pre-commit, codecov, coveralls): the build backend comes from `[build-system]`, and tox's or nox's own deps are
what the test run gets. Coverage and pytest-cov are kept: a suite whose `addopts` say `--cov` fails
without the plugin. Jobs that only run on Windows or macOS (`runs-on: windows-latest`) are left out.
A file that is not valid YAML, too large, or of the wrong shape is skipped with the reason; nothing
here raises on a repository's content.
"""

from __future__ import annotations

import ast
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from envforge.errors import SpecError
from envforge.sources import guard
from envforge.sources.policy import SourcePolicy
from envforge.sources.static_python import literal, parse_module

InstallKind = Literal["extra", "group", "requirements", "constraints", "package"]
ALL = "*"  # the value of an `extra` or `group` item that stands for all of them (`--all-extras`)
GITHUB_DIR = ".github/workflows/"
GITLAB_FILE = ".gitlab-ci.yml"
AZURE_FILES = ("azure-pipelines.yml", ".azure-pipelines.yml")
# Installed to set up, build or publish, not to test: never added to the env layer.
TOOLS = frozenset("pip setuptools wheel build twine tox nox uv virtualenv pipx pre-commit codecov coveralls".split())
_GITLAB_KEYWORDS = frozenset(
    "stages variables default include workflow image services before_script after_script cache pages".split()
)
_TEST_RUN = re.compile(
    r"(^|[\s/(])(pytest|py\.test)(\s|$)|-m\s+(pytest|unittest)\b|\bsetup\.py\s+test\b"
    r"|\bmake\s+(test|tests|check|unittest)\b"
)
_MAY_RUN_TESTS = re.compile(r"pytest|py\.test|unittest|setup\.py\s+test|\b(tox|nox|make)\b")
_NOT_RUNS = frozenset("echo printf grep which cat ls test [".split())  # commands that name pytest, not run it
_RUNNERS = {"tox": ("-e", "--env"), "nox": ("-s", "--session", "--sessions")}
# Factors of tox environment / nox session names: one that runs tests, one that does something else.
_TEST_FACTOR = re.compile(r"(py|pypy)?\d*(\.\d+)?|tests?|testing|unit|unittests?|\$\{\{\}\}")
_OTHER_FACTORS = frozenset(
    "docs doc lint mypy typing type types pyright flake8 ruff style format fmt pre-commit precommit build release "
    "publish package pkg docset changelog bench benchmark benchmarks qa check-manifest".split()
)
_EXPR = re.compile(r"\$\{\{.*?\}\}", re.S)
_PIP = re.compile(r"(.*/)?pip(3(\.\d+)?)?$")
# pip / uv options whose value is the next token (unless given as `--opt=value`).
_VALUE_OPTIONS = frozenset(
    "-i --index-url --extra-index-url -f --find-links -t --target --prefix --root --python -p --upgrade-strategy "
    "--only-binary --no-binary --platform --python-version --implementation --abi -C --config-settings "
    "--global-option --cache-dir --src --progress-bar --timeout --retries --log --trusted-host --index "
    "--default-index --index-strategy --resolution --prerelease --python-platform --package --directory "
    "--project --no-binary-package --only-binary-package --exclude-newer --reinstall-package".split()
)
_MAX_BYTES = 1 << 20


class Tree(Protocol):
    """What is read of a commit's tree (`infer.RepoTree`)."""

    paths: set[str]

    def read(self, path: str) -> str | None: ...


@dataclass(frozen=True)
class CiInstall:
    """One thing a test job installs, and where it came from (`FILE:JOB`)."""

    kind: InstallKind
    value: str
    origin: str
    implied: bool = False  # not named: `uv sync` installs the `dev` group unless told not to


@dataclass
class CiInstalls:
    """Everything the repository's CI test jobs install, the jobs read, and what was left out and why."""

    installs: list[CiInstall] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)  # `FILE:JOB` of every job that runs tests
    skipped: list[str] = field(default_factory=list)
    nox_sessions: list[str] = field(default_factory=list)  # sessions test jobs run (`nox -s tests-3.12`)

    def add(self, kind: InstallKind, value: str, origin: str, implied: bool = False) -> None:
        item = CiInstall(kind, value, origin, implied)
        if not any((i.kind, i.value) == (kind, value) for i in self.installs):
            self.installs.append(item)


@dataclass
class _Step:
    script: str
    workdir: str = "."


def ci_files(tree: Tree) -> list[str]:
    """The CI files read, in the order they are read."""
    github = sorted(
        p
        for p in tree.paths
        if p.startswith(GITHUB_DIR) and "/" not in p[len(GITHUB_DIR) :] and p.endswith((".yml", ".yaml"))
    )
    return [*github, *(p for p in (GITLAB_FILE, *AZURE_FILES) if p in tree.paths)]


def read_ci_installs(tree: Tree, policy: SourcePolicy | None = None) -> CiInstalls:
    """What the test jobs of every CI file of `tree` install (see the module docstring)."""
    policy = policy or SourcePolicy.from_env()
    out = CiInstalls()
    for path in ci_files(tree):
        text = tree.read(path)
        if text is None:
            continue
        if len(text.encode("utf-8", "replace")) > _MAX_BYTES:
            out.skipped.append(f"{path}: larger than 1 MiB")
            continue
        if not _MAY_RUN_TESTS.search(text):
            continue  # a release, label or docs workflow: not worth parsing (most of the cost is YAML)
        if path == GITLAB_FILE:  # GitLab's `!reference [.job, script]`: a plain list here, never a command
            text = re.sub(r"!reference\b", "", text)
        try:
            data = guard.load_yaml(text, path, policy)
        except SpecError as exc:
            out.skipped.append(str(exc))
            continue
        if not isinstance(data, dict):
            out.skipped.append(f"{path}: not a mapping of jobs")
            continue
        if path.startswith(GITHUB_DIR):
            jobs = _github_jobs(data, path, out)
        elif path == GITLAB_FILE:
            jobs = _gitlab_jobs(data)
        else:
            jobs = _azure_jobs(data)
        for job, steps in jobs:
            _read_job(f"{path}:{job}", steps, tree, out)
    _noxfile(tree, out)
    return out


def _text(value: Any) -> str:
    """A script value: a string, or a (nested) list of strings as GitLab allows."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    return ""


def _workdir(*dirs: Any) -> str:
    """The last working directory given (job, step), `.` when none is a plain relative path."""
    found = "."
    for d in dirs:
        if isinstance(d, str) and d.strip():
            found = d.strip()
    return found


def _mapping(value: Any) -> dict:
    """`value` if it is a mapping, else an empty one (a CI file's keys hold anything)."""
    return value if isinstance(value, dict) else {}


def _github_jobs(data: dict, path: str, out: CiInstalls) -> list[tuple[str, list[_Step]]]:
    jobs = data.get("jobs")
    if not isinstance(jobs, dict):
        out.skipped.append(f"{path}: no `jobs:` mapping")
        return []
    top = _mapping(_mapping(data.get("defaults")).get("run"))
    found = []
    for name, job in jobs.items():
        if not isinstance(job, dict) or not isinstance(job.get("steps"), list):
            continue
        runs_on = job.get("runs-on")
        if isinstance(runs_on, str) and runs_on.lower().startswith(("windows", "macos")):
            out.skipped.append(f"{path}:{name}: runs on {runs_on} only")
            continue
        run_defaults = _mapping(_mapping(job.get("defaults")).get("run"))
        base = [top.get("working-directory"), run_defaults.get("working-directory")]
        steps = [
            _Step(s["run"], _workdir(*base, s.get("working-directory")))
            for s in job["steps"]
            if isinstance(s, dict) and isinstance(s.get("run"), str)
        ]
        found.append((str(name), steps))
    return found


def _gitlab_jobs(data: dict) -> list[tuple[str, list[_Step]]]:
    default = _mapping(data.get("default"))
    top_before = default.get("before_script", data.get("before_script"))

    def resolved(job: dict, key: str, seen: tuple[str, ...] = ()) -> Any:
        if key in job:
            return job[key]
        parents = job.get("extends")
        for parent in [parents] if isinstance(parents, str) else parents if isinstance(parents, list) else []:
            if isinstance(parent, str) and isinstance(data.get(parent), dict) and parent not in seen:
                value = resolved(data[parent], key, (*seen, parent))
                if value is not None:
                    return value
        return None

    found = []
    for name, job in data.items():
        if not isinstance(name, str) or name in _GITLAB_KEYWORDS or name.startswith(".") or not isinstance(job, dict):
            continue
        before = resolved(job, "before_script")
        script = _text(before if before is not None else top_before) + "\n" + _text(resolved(job, "script"))
        found.append((name, [_Step(script)]))
    return found


def _azure_jobs(data: dict) -> list[tuple[str, list[_Step]]]:
    def steps_of(steps: Any) -> list[_Step]:
        out = []
        for s in steps if isinstance(steps, list) else []:
            if isinstance(s, dict):
                script = next((s[k] for k in ("script", "bash") if isinstance(s.get(k), str)), None)
                if script is not None:
                    out.append(_Step(script, _workdir(s.get("workingDirectory"))))
        return out

    def jobs_of(jobs: Any) -> list[tuple[str, list[_Step]]]:
        return [
            (str(j.get("job") or j.get("deployment") or j.get("displayName") or f"job{i}"), steps_of(j.get("steps")))
            for i, j in enumerate(jobs if isinstance(jobs, list) else [])
            if isinstance(j, dict)
        ]

    if "steps" in data:
        return [("steps", steps_of(data["steps"]))]
    if "jobs" in data:
        return jobs_of(data["jobs"])
    stages = data.get("stages")
    return [
        (f"{st.get('stage', i)}.{name}", steps)
        for i, st in enumerate(stages if isinstance(stages, list) else [])
        if isinstance(st, dict)
        for name, steps in jobs_of(st.get("jobs"))
    ]


def _commands(script: str) -> list[tuple[list[str], str]]:
    """(tokens, text) of each shell command of a script: lines joined at `\\`, split at `&&`, `||`, `;`, `|`.
    CI expressions (`${{ ... }}`) become one `${{}}` token so they can be dropped whole."""
    script = _EXPR.sub("${{}}", script.replace("\\\n", " "))
    commands = []
    for line in script.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:  # unbalanced quotes: a line that is not plain shell
            continue
        current: list[str] = []
        for tok in [*tokens, ";"]:
            if tok and set(tok) <= set(";&|"):
                if current:
                    commands.append((current, " ".join(current)))
                current = []
            else:
                current.append(tok)
    return commands


def _read_job(origin: str, steps: list[_Step], tree: Tree, out: CiInstalls) -> None:
    """A job's installs count when the job runs the tests itself; a job that runs them only through tox
    or nox is listed (its test environment is tox's, read from tox's configuration), its installs are not
    (they set up the runner: `pip install tox coverage`)."""
    installs: list[tuple[list[str], str, str]] = []
    direct = via_runner = False
    for step in steps:
        cwd = step.workdir
        for tokens, text in _commands(step.script):
            if tokens[0] == "cd" and len(tokens) == 2:
                cwd = "$CI" if _dropped(tokens[1]) else posixpath.join(cwd, tokens[1])
                continue
            kind = _install_kind(tokens)
            if kind:
                installs.append((tokens, kind, cwd))
            elif tokens[0] in _NOT_RUNS:
                continue
            elif _TEST_RUN.search(text):
                direct = True
            elif _runs_tests_through_runner(tokens, out):
                via_runner = True
    if not (direct or via_runner):
        return
    out.jobs.append(origin)
    if not direct:
        if installs:
            out.skipped.append(f"{origin}: runs the tests through tox or nox; what it installs sets up the runner")
        return
    for tokens, kind, cwd in installs:
        _read_install(tokens, kind, cwd, origin, tree, out)


def _runs_tests_through_runner(tokens: list[str], out: CiInstalls) -> bool:
    """`tox`, `tox -e py311`, `python -m tox -e ${{ matrix.tox }}`, `nox -s tests`: a test run; `tox -e docs`,
    `tox -e mypy-test`, `nox -s lint` are not (a name counts when a factor runs tests and none is another tool's).
    The nox sessions a test run names are kept (`nox_sessions`): the noxfile's installs are read for them."""
    for i, tok in enumerate(tokens):
        runner = tok.rsplit("/", 1)[-1]
        if runner not in _RUNNERS:
            continue
        names: list[str] = []
        rest = tokens[i + 1 :]
        for j, arg in enumerate(rest):
            opt, eq, inline = arg.partition("=")
            if re.fullmatch(r"-[es].+", arg):  # `tox -edocs`
                opt, eq, inline = arg[:2], "=", arg[2:]
            if opt in _RUNNERS[runner]:
                value = inline if eq else (rest[j + 1] if j + 1 < len(rest) else "")
                names += [n for n in re.split(r"[,\s]+", value) if n]
        tests = [n for n in names if _test_name(n)]
        if runner == "nox":
            out.nox_sessions += [n for n in tests if n not in out.nox_sessions and not _dropped(n)]
        if tests or not names:  # no names: the default environments / sessions
            return True
    return False


def _test_name(name: str) -> bool:
    """A tox environment or nox session name that runs tests (`py311`, `tests-3.12`), not another tool."""
    factors = name.lower().split("-")
    return any(_TEST_FACTOR.fullmatch(f) for f in factors) and not any(f in _OTHER_FACTORS for f in factors)


def _noxfile(tree: Tree, out: CiInstalls) -> None:
    """The `session.install(...)` calls of noxfile.py's test sessions, read statically (never run): the
    sessions the CI's test jobs name (`nox -s tests-3.12` is session `tests`), else every session whose
    name runs tests. Literal arguments only (and `*NAME` of a module-level literal list)."""
    text = tree.read("noxfile.py")
    if text is None:
        return
    parsed = parse_module(text)
    if parsed is None:
        out.skipped.append("noxfile.py: not parseable as Python")
        return
    module, names = parsed
    wanted = {re.sub(r"-(\d+(\.\d+)*|pypy\S*)$", "", n) for n in out.nox_sessions}
    for fn in module.body:
        if not isinstance(fn, ast.FunctionDef) or not fn.args.args:
            continue
        name = _nox_session_name(fn)
        if name is None or not (name in wanted if wanted else _test_name(name)):
            continue
        origin, arg = f"noxfile.py:{name}", fn.args.args[0].arg
        out.jobs.append(origin)
        for call in ast.walk(fn):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "install"
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id == arg
            ):
                continue
            tokens: list[str] = []
            for a in call.args:
                value = literal(a.value if isinstance(a, ast.Starred) else a, names)
                values = list(value) if isinstance(a, ast.Starred) and isinstance(value, (list, tuple)) else [value]
                strings = [v for v in values if isinstance(v, str)]
                if len(strings) == len(values):
                    tokens += strings
                else:
                    out.skipped.append(f"{origin}: line {call.lineno}: an argument of session.install is not a literal")
            _read_install(["pip", "install", *tokens], "pip", ".", origin, tree, out)


def _nox_session_name(fn: Any) -> str | None:
    """The session name of a function decorated with `@nox.session` / `@session(...)` (its `name=`, else
    the function's name); None for another function."""
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if (isinstance(target, ast.Attribute) and target.attr == "session") or (
            isinstance(target, ast.Name) and target.id == "session"
        ):
            if isinstance(dec, ast.Call):
                for kw in dec.keywords:
                    if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        return kw.value.value
            return fn.name
    return None


def _install_kind(tokens: list[str]) -> str | None:
    """`pip` for a pip (or `uv pip`) install command, `uv-sync` for `uv sync`, None otherwise."""
    for i, tok in enumerate(tokens[:-1]):
        if _PIP.fullmatch(tok) and tokens[i + 1] == "install":
            return "pip"
        if tok.rsplit("/", 1)[-1] == "uv" and tokens[i + 1] == "sync":
            return "uv-sync"
    return None


def _arguments(tokens: list[str], kind: str) -> list[str]:
    """The tokens after `install` / `sync`."""
    word = "install" if kind == "pip" else "sync"
    return tokens[tokens.index(word) + 1 :]


def _dropped(token: str) -> bool:
    """A token whose value only CI knows: an expression or a shell variable or substitution."""
    return "${{}}" in token or "$" in token or "`" in token or re.search(r"%\w+%", token) is not None


def _repo_path(cwd: str, path: str) -> tuple[str | None, str]:
    """(normalized path inside the repository or None, why not)."""
    if path.startswith("/") or "\\" in path:
        return None, f"{path!r} is an absolute path, not a file of the repository"
    norm = posixpath.normpath(posixpath.join(cwd, path))
    if norm == ".." or norm.startswith("../"):
        return None, f"{path!r} leaves the repository ({norm})"
    return norm, ""


def _read_install(tokens: list[str], kind: str, cwd: str, origin: str, tree: Tree, out: CiInstalls) -> None:
    if _dropped(cwd):
        out.skipped.append(f"{origin}: {' '.join(tokens)!r} runs in a directory only CI knows")
        return
    args = _arguments(tokens, kind)
    uv_dev = kind == "uv-sync"
    targets: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if re.match(r"\d*[<>]", tok):  # a redirection ends the arguments (`> /dev/null`, `2>&1`)
            break
        opt, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        takes_value = opt in ("-r", "--requirement", "-c", "--constraint", "-e", "--editable", "--group", "--extra")
        short = re.fullmatch(r"-([rce])(.+)", tok)
        if short:
            opt, eq, inline = f"-{short.group(1)}", "=", short.group(2)
        value = None
        if takes_value or opt in _VALUE_OPTIONS:
            if eq:
                value = inline
            elif i + 1 < len(args):
                value = args[i + 1]
                i += 1
        i += 1
        if opt in ("-r", "--requirement", "-c", "--constraint") and value is not None:
            _file(value, "constraints" if opt in ("-c", "--constraint") else "requirements", cwd, origin, tree, out)
        elif opt in ("-e", "--editable") and value is not None:
            targets.append(value)
        elif opt == "--group" and value is not None:
            _group(value, cwd, origin, out)
        elif opt == "--extra" and value is not None:
            _extras(value.split(","), cwd, origin, out)
        elif opt == "--all-extras":
            _extras([ALL], cwd, origin, out)
        elif opt in ("--all-groups",):
            out.add("group", ALL, origin)
        elif opt in ("--no-dev", "--no-default-groups", "--only-group", "--only-dev"):
            uv_dev = False
        elif not tok.startswith("-"):
            targets.append(tok)
    if uv_dev:
        out.add("group", "dev", origin, implied=True)
    for target in targets:
        _target(target, cwd, origin, out)


def _file(value: str, kind: InstallKind, cwd: str, origin: str, tree: Tree, out: CiInstalls) -> None:
    if _dropped(value):
        out.skipped.append(f"{origin}: {kind} file {value!r} depends on CI values")
        return
    path, why = _repo_path(cwd, value)
    if path is None:
        out.skipped.append(f"{origin}: {kind} file {why}")
    elif path in ("pyproject.toml", "setup.py", "setup.cfg"):
        pass  # the project's own dependencies: read from its manifests
    elif path not in tree.paths:
        out.skipped.append(f"{origin}: {kind} file {path} does not exist in the repository (written by CI?)")
    else:
        out.add(kind, path, origin)


def _group(value: str, cwd: str, origin: str, out: CiInstalls) -> None:
    """`--group NAME` or pip's `--group PATH:NAME` (only the root pyproject.toml is read)."""
    if _dropped(value):
        out.skipped.append(f"{origin}: group {value!r} depends on CI values")
        return
    where, _, name = value.rpartition(":")
    pyproject = posixpath.normpath(posixpath.join(cwd, where or "pyproject.toml"))
    if pyproject != "pyproject.toml":
        out.skipped.append(f"{origin}: group {value!r} is not of the repository's root pyproject.toml")
    else:
        out.add("group", name, origin)


def _extras(names: list[str], cwd: str, origin: str, out: CiInstalls) -> None:
    if posixpath.normpath(cwd) != ".":
        out.skipped.append(f"{origin}: extras {','.join(names)} of the project in {cwd}, not the repository's root")
        return
    for name in names:
        name = name.strip()
        if name and not _dropped(name):
            out.add("extra", name, origin)
        elif name:
            out.skipped.append(
                f"{origin}: an extra named by a CI expression or variable ({name.replace('${{}}', '${{ ... }}')})"
            )


def _target(target: str, cwd: str, origin: str, out: CiInstalls) -> None:
    """A positional install target: the project itself (with extras), a package, or something left out."""
    m = re.fullmatch(r"(?P<path>\.{1,2}(/[^\[]*)?|[^\[\s]*/[^\[]*)(\[(?P<extras>[^\]]*)\])?", target)
    if _dropped(m.group("path") if m else target):
        out.skipped.append(f"{origin}: {target.replace('${{}}', '${{ ... }}')!r} depends on CI values")
        return
    if m and not target.endswith((".whl", ".tar.gz", ".zip")):
        path, why = _repo_path(cwd, m.group("path"))
        if path is None:
            out.skipped.append(f"{origin}: {why}")
        elif path != ".":
            out.skipped.append(f"{origin}: {target!r} is a local path other than the project")
        elif m.group("extras"):
            _extras(m.group("extras").split(","), ".", origin, out)
        return
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        req = Requirement(target)
    except InvalidRequirement:
        out.skipped.append(f"{origin}: {target!r} is not a requirement (a wheel, archive or URL)")
        return
    name = canonicalize_name(req.name)
    if name in TOOLS or name.startswith(("tox-", "nox-")):  # the runners and their plugins (tox-gh-actions)
        return
    if req.url:
        out.skipped.append(f"{origin}: {target!r} is installed from a URL")
        return
    out.add("package", target, origin)


__all__ = ["ALL", "TOOLS", "CiInstall", "CiInstalls", "ci_files", "read_ci_installs"]
