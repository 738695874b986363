"""What a repository's CI installs for its tests (sources/ci_installs.py), and inference using it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envforge.sources.ci_installs import CiInstall, read_ci_installs
from envforge.sources.infer import infer_environment
from tests.test_history_sources import commit, git


class Tree:
    """A commit's files, as `infer.RepoTree` shows them."""

    def __init__(self, files: dict[str, str]):
        self.files, self.paths = files, set(files)

    def read(self, path: str) -> str | None:
        return self.files.get(path)


GITHUB_MATRIX = """\
name: tests
on:
  push:
  pull_request:
jobs:
  lint:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: pip install ruff mypy && ruff check .
      - run: echo "pytest runs in the tests job"
  tests:
    runs-on: ${{ matrix.os }}
    strategy:
      matrix:
        os: [ubuntu-latest, windows-latest]
        python-version: ["3.10", "3.11", "3.12"]
        extra: [fast, slow]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python-version }}
      - name: Install
        run: |
          python -m pip install --upgrade pip setuptools wheel
          python -m pip install -e .[testing,${{ matrix.extra }}] \\
            "pytest-asyncio>=0.23" hypothesis
          pip install ${{ matrix.deps }} codecov
      - name: Test
        run: python -m pytest -q --cov
  windows-only:
    runs-on: windows-latest
    steps:
      - run: pip install pywin32 && pytest
"""

GITHUB_REQUIREMENTS = """\
jobs:
  test:
    runs-on: ubuntu-22.04
    defaults:
      run:
        working-directory: ci
    steps:
      - run: pip install -r ../requirements/tests.txt -c ../requirements/constraints.txt
      - run: pip install --requirement=../requirements/missing.txt
      - run: pip install -r ../../outside.txt -r /etc/requirements.txt
      - run: cd .. && python -m pytest tests
  docs:
    runs-on: ubuntu-latest
    steps:
      - run: pip install -r requirements/docs.txt && sphinx-build docs out
"""


def test_a_github_matrix_job_installs_the_projects_extras_and_named_packages():
    found = read_ci_installs(Tree({".github/workflows/tests.yml": GITHUB_MATRIX}))
    origin = ".github/workflows/tests.yml:tests"
    assert found.jobs == [origin]  # lint runs no tests; windows-only runs on Windows only
    assert found.installs == [
        CiInstall("extra", "testing", origin),
        CiInstall("package", "pytest-asyncio>=0.23", origin),
        CiInstall("package", "hypothesis", origin),
    ]
    # matrix values only CI knows are dropped with the reason; pip, setuptools, wheel and codecov silently
    assert any("extra named by a CI expression" in s for s in found.skipped)
    assert any("'${{ ... }}' depends on CI values" in s for s in found.skipped)
    assert any("windows-only: runs on windows-latest only" in s for s in found.skipped)
    assert not any("codecov" in s or "setuptools" in s for s in found.skipped)


def test_requirement_files_are_read_from_the_steps_directory_and_never_outside_the_repository():
    tree = Tree({
        ".github/workflows/ci.yaml": GITHUB_REQUIREMENTS,
        "requirements/tests.txt": "pytest\n",
        "requirements/constraints.txt": "pytest==8.3.3\n",
        "requirements/docs.txt": "sphinx\n",
    })
    found = read_ci_installs(tree)
    origin = ".github/workflows/ci.yaml:test"
    assert found.jobs == [origin]  # docs runs no tests
    assert found.installs == [
        CiInstall("requirements", "requirements/tests.txt", origin),
        CiInstall("constraints", "requirements/constraints.txt", origin),
    ]
    assert f"{origin}: requirements file requirements/missing.txt does not exist in the repository (written by CI?)" \
        in found.skipped
    assert f"{origin}: requirements file '../../outside.txt' leaves the repository (../outside.txt)" in found.skipped
    assert f"{origin}: requirements file '/etc/requirements.txt' is an absolute path, not a file of the repository" \
        in found.skipped


def test_jobs_that_test_through_tox_or_nox_are_listed_and_their_runner_installs_left_out():
    """cachetools' CI runs `pip install coverage tox` then `tox`: coverage and tox set up the runner, and
    the test environment is tox's own (read from its configuration). marshmallow's `tox -e mypy-test`
    and `tox -e docs` jobs, attrs' `tox run -e docs-doctests,changelog`, run no tests."""
    workflow = """\
jobs:
  main:
    steps:
      - run: pip install coverage tox
      - run: tox
  matrix:
    steps:
      - run: python -m pip install tox tox-py && python -m tox -e ${{ matrix.tox }}
  sessions:
    steps:
      - run: pipx run nox -s tests-3.12
  mypy:
    steps:
      - run: python -m pip install tox && python -m tox -e mypy-test
  docs:
    steps:
      - run: uvx --with=tox-uv tox run -e docs-doctests,changelog
      - run: tox -edocs
  lint:
    steps:
      - run: nox --session=lint
"""
    found = read_ci_installs(Tree({".github/workflows/ci.yml": workflow}))
    assert found.jobs == [f".github/workflows/ci.yml:{j}" for j in ("main", "matrix", "sessions")]
    assert found.installs == []
    assert ".github/workflows/ci.yml:main: runs the tests through tox or nox; what it installs sets up the runner" \
        in found.skipped


NOXFILE = """\
import nox

TEST_DEPS = ["pytest-asyncio", "hypothesis>=6"]


@nox.session(python=["3.11", "3.12"])
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.install(*TEST_DEPS)
    session.install("-r", "requirements/test.txt")
    for dep in ["x"]:
        session.install(dep)
    session.run("pytest")


@nox.session(name="test-minimal")
def minimal(session):
    session.install("pytest")


@nox.session
def lint(session):
    session.install("ruff")
"""


def test_the_noxfile_sessions_a_ci_test_job_runs_are_read_statically():
    workflow = "jobs:\n  t:\n    steps:\n      - run: pip install nox\n      - run: nox -s tests-3.12 lint\n"
    tree = Tree({".github/workflows/ci.yml": workflow, "noxfile.py": NOXFILE, "requirements/test.txt": "mock\n"})
    found = read_ci_installs(tree)
    assert found.jobs == [".github/workflows/ci.yml:t", "noxfile.py:tests"]
    assert found.installs == [
        CiInstall("extra", "test", "noxfile.py:tests"),
        CiInstall("package", "pytest-asyncio", "noxfile.py:tests"),
        CiInstall("package", "hypothesis>=6", "noxfile.py:tests"),
        CiInstall("requirements", "requirements/test.txt", "noxfile.py:tests"),
    ]
    assert "noxfile.py:tests: line 12: an argument of session.install is not a literal" in found.skipped
    # Without a CI job naming sessions: every session whose name runs tests (not lint).
    found = read_ci_installs(Tree({"noxfile.py": NOXFILE, "requirements/test.txt": "mock\n"}))
    assert found.jobs == ["noxfile.py:tests", "noxfile.py:test-minimal"]
    assert CiInstall("package", "pytest", "noxfile.py:test-minimal") in found.installs
    assert read_ci_installs(Tree({"noxfile.py": "def (:\n"})).skipped == ["noxfile.py: not parseable as Python"]


def test_gitlab_jobs_with_templates_and_default_before_script():
    gitlab = """\
stages: [test]
default:
  before_script:
    - pip install -U pip
    - pip install -e ".[test]"
.unit:
  script:
    - cd src/..
    - python -m pip install -r requirements-ci.txt
    - pytest
unit:
  extends: .unit
  image: python:3.12
integration:
  before_script: [uv pip install --system --group integration > /dev/null]
  script: [make test]
pages:
  script: [pip install mkdocs, mkdocs build]
listing:
  script:
    - !reference [.unit, script]
    - pip install sphinx
    - pip list | grep pytest
"""
    found = read_ci_installs(Tree({".gitlab-ci.yml": gitlab, "requirements-ci.txt": "freezegun\n"}))
    assert found.jobs == [".gitlab-ci.yml:unit", ".gitlab-ci.yml:integration"]
    assert found.installs == [
        CiInstall("extra", "test", ".gitlab-ci.yml:unit"),
        CiInstall("requirements", "requirements-ci.txt", ".gitlab-ci.yml:unit"),
        CiInstall("group", "integration", ".gitlab-ci.yml:integration"),
    ]


def test_azure_pipelines_script_and_bash_steps_in_stages():
    azure = """\
trigger: [main]
stages:
  - stage: Test
    jobs:
      - job: Linux
        pool: {vmImage: ubuntu-latest}
        steps:
          - task: UsePythonVersion@0
          - script: python -m pip install .[tests] pytest-xdist
            displayName: install
          - bash: |
              set -e
              uv sync --extra speedups
              python -m pytest -n auto
  - stage: Publish
    jobs:
      - job: Wheel
        steps:
          - script: pip install build twine && python -m build
"""
    found = read_ci_installs(Tree({"azure-pipelines.yml": azure}))
    origin = "azure-pipelines.yml:Test.Linux"
    assert found.jobs == [origin]
    assert found.installs == [
        CiInstall("extra", "tests", origin),
        CiInstall("package", "pytest-xdist", origin),
        CiInstall("extra", "speedups", origin),
        CiInstall("group", "dev", origin, implied=True),  # what `uv sync` installs unless told --no-dev
    ]


def test_a_malformed_or_odd_ci_file_is_skipped_with_the_reason_and_the_others_still_read():
    good = "jobs:\n  t:\n    steps:\n      - run: pip install pytest-mock && pytest\n"
    found = read_ci_installs(Tree({
        ".github/workflows/a.yml": "jobs:\n  t:\n    steps: [{run: pytest}\n",  # not valid YAML
        ".github/workflows/b.yml": "- pytest\n- a list\n",
        ".github/workflows/release.yml": "jobs: [\n",  # names no test runner: not parsed
        ".github/workflows/c.yml": "jobs: {t: {steps: [{run: \"pip install 'unbalanced && pytest\"}]}}\n",
        ".github/workflows/d.yml": good,
        ".github/workflows/nested/e.yml": good.replace("pytest-mock", "nested"),  # not a workflow
        ".gitlab-ci.yml": "a: &a [*a]\nb: {script: [pytest]}\n",  # a recursive alias
    }))
    assert found.installs == [CiInstall("package", "pytest-mock", ".github/workflows/d.yml:t")]
    assert any(s.startswith(".github/workflows/a.yml: not valid YAML at line") for s in found.skipped)
    assert ".github/workflows/b.yml: not a mapping of jobs" in found.skipped
    assert any(s.startswith(".gitlab-ci.yml: YAML refused: a recursive alias") for s in found.skipped)
    assert not any("release.yml" in s for s in found.skipped)
    odd = {  # shapes no CI system accepts: read as far as they make sense, never an exception
        ".github/workflows/f.yml": "jobs: [pytest]\n",
        ".github/workflows/g.yml": "jobs: {a: {steps: pytest}, b: {steps: [{run: 3}, pytest], defaults: 1}}\n",
        ".github/workflows/h.yml": "defaults: {run: [1]}\njobs: {a: {steps: [{run: pytest, working-directory: 7}]}}\n",
        ".gitlab-ci.yml": "a: {extends: [b, 3], script: {x: pytest}}\nb: {extends: a}\nc: {extends: c, script: pytest}\n",
        "azure-pipelines.yml": "stages: [{jobs: pytest}, 1, {jobs: [{steps: [{bash: [pytest]}]}]}]\n",
        "noxfile.py": "import nox\n@nox.session\ndef tests():\n    pass\n@nox.session\ndef test(s):\n"
                      "    s.install(*missing, **{'a': 1})\n",
    }
    found = read_ci_installs(Tree(odd))
    assert found.installs == [] and ".github/workflows/f.yml: no `jobs:` mapping" in found.skipped


def _repo(tmp_path: Path, files: dict[str, str]) -> tuple[Path, str]:
    repo = tmp_path / "r"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    return repo, commit(repo, "initial", files, 0)


PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[project]
name = "clock"
version = "1.0"
dependencies = ["attrs"]
[project.optional-dependencies]
ci = ["freezegun==1.5.1", "clock[speedups]"]
speedups = ["ujson"]
docs = ["sphinx"]
[dependency-groups]
lint = ["ruff"]
"""
WORKFLOW = """\
jobs:
  test:
    runs-on: ubuntu-latest
    steps:
      - run: python -m pip install -e '.[ci]' pytest-asyncio 'clock[speedups]'
      - run: pip install --group lint --group nope
      - run: python -m pytest
"""


def test_inference_adds_what_the_ci_installs_with_provenance(tmp_path):
    """A project whose test extra is named `ci`, which only its workflow installs: the extra's
    requirements and the workflow's own packages reach the environment, each with its source."""
    repo, sha = _repo(tmp_path, {
        "pyproject.toml": PYPROJECT, ".github/workflows/tests.yml": WORKFLOW,
        "clock.py": "x = 1\n", "tests/test_clock.py": "def test_x():\n    pass\n",
        "tests/requirements.txt": "pytest\n",
    })
    inf = infer_environment(repo, sha)
    # the `ci` extra's `clock[speedups]` is the project's own `speedups` extra (ujson), as pip resolves it
    assert inf.pip == ["attrs", "freezegun==1.5.1", "ujson", "pytest-asyncio", "ruff"]
    origin = ".github/workflows/tests.yml:test"
    assert inf.origins == ["pyproject.toml", origin]
    assert inf.as_metadata()["from"] == inf.origins and inf.as_metadata()["ci_jobs"] == [origin]
    assert f"{origin} extra ci (pyproject.toml [project.optional-dependencies].ci) (2)" in inf.read
    assert f"{origin} group nope: pyproject.toml has no dependency group 'nope'" in inf.skipped
    # The CI names test dependencies, so tests/requirements.txt (the last resort) is not read.
    assert "-r tests/requirements.txt" not in inf.pip


def test_a_package_the_fixs_workflow_starts_installing_is_installed_with_the_workspaces(tmp_path):
    from envforge.sources.environment import HistoryEnvironment, resolve_environment

    repo, parent = _repo(tmp_path, {"pyproject.toml": PYPROJECT, ".github/workflows/tests.yml": WORKFLOW})
    fix = commit(repo, "test with respx", {".github/workflows/tests.yml": WORKFLOW.replace(
        "pytest-asyncio", "pytest-asyncio respx")}, 1)
    env = resolve_environment(HistoryEnvironment(), repo, parent, "tickets.yaml", fix)
    assert env.fields["pip"][-1] == "respx"
    assert env.metadata["environment"]["inferred"]["added_by_change"] == ["respx"]


def test_tests_requirements_are_the_last_resort(tmp_path):
    files = {"pyproject.toml": PYPROJECT.split("[project.optional")[0], "tests/requirements.txt": "pytest\n",
             "tests/requirements-extra.txt": "mock\n", "tests/data/requirements.txt": "no\n"}
    repo, sha = _repo(tmp_path / "a", files)
    inf = infer_environment(repo, sha)
    assert inf.pip == ["attrs", "-r tests/requirements-extra.txt", "-r tests/requirements.txt"]
    assert inf.origins == ["pyproject.toml", "tests/requirements-extra.txt", "tests/requirements.txt"]
    repo, sha = _repo(tmp_path / "b", {**files, "requirements-test.txt": "pytest\n"})
    assert infer_environment(repo, sha).pip == ["attrs", "-r requirements-test.txt"]


def _ticket_source(tmp_path: Path, pyproject: str, workflow: str, test: str, fixed_test: str) -> Path:
    """A repository whose fix commit makes `fixed_test` pass, and a ticket source naming that fix."""
    repo, _ = _repo(tmp_path, {
        "pyproject.toml": pyproject, ".github/workflows/tests.yml": workflow,
        "clock.py": "def now():\n    return 0\n", "tests/test_clock.py": test,
    })
    fix = commit(repo, "now() returns 1", {"clock.py": "def now():\n    return 1\n",
                                           "tests/test_clock.py": fixed_test}, 1)
    source = tmp_path / "src"
    source.mkdir()
    (source / "t.jsonl").write_text(json.dumps({"key": "CLK-1", "fields": {
        "summary": "now() returns 0 instead of 1", "description": "clock.now() must return 1, it returns 0.",
        "customfield_1": fix}}) + "\n")
    (source / "tickets.yaml").write_text(
        f"repository: {repo}\nproject: clock\nexports:\n"
        "  - file: t.jsonl\n    preset: jira\n    fields: {fix_commit: fields.customfield_1}\n")
    return source / "tickets.yaml"


def test_a_ticket_source_infers_what_only_ci_names_and_the_scan_shows_it(tmp_path, allow_tmp_sources):
    """End to end on a real repository tree: a ticket whose fix commit is in a repository that declares
    its test extra only by name in CI; the candidate's environment (what its env layer installs) holds
    the extra's requirements, and `envforge sources scan` says where they came from."""
    from typer.testing import CliRunner

    from envforge.cli import app
    from envforge.sandbox.envlayer import env_recipe
    from envforge.sources.tickets import load_ticket_source

    config = _ticket_source(tmp_path, PYPROJECT, WORKFLOW, "def test_x():\n    pass\n",
                            "import clock\n\ndef test_x():\n    assert clock.now() == 1\n")
    [cand] = load_ticket_source(config).candidates
    task = cand.provisional_task()
    env = task.spec.environment
    assert env.pip == ["setuptools>=61", "wheel", "attrs", "freezegun==1.5.1", "ujson", "pytest-asyncio", "ruff"]
    about = task.spec.metadata["environment"]["inferred"]
    assert about["from"] == ["pyproject.toml", ".github/workflows/tests.yml:test"]
    recipe = env_recipe("clock", "envforge/base:test", env, lambda p: None)
    assert "freezegun==1.5.1\nujson\npytest-asyncio\n" in recipe.requirements_txt()

    result = CliRunner().invoke(app, ["sources", "scan", "--json", str(config)])
    assert result.exit_code == 0, result.output
    [row] = [r for r in json.loads(result.output)["records"] if r["becomes"] == "candidate"]
    assert row["environment"] == "inferred from pyproject.toml, .github/workflows/tests.yml:test"
    table = CliRunner().invoke(app, ["sources", "scan", str(config)], env={"COLUMNS": "400"})
    assert "inferred from pyproject.toml, .github/workflows/tests.yml:test" in table.output, table.output


CLOCK_TEST = """\
import clock
from freezegun import freeze_time


@freeze_time("2024-01-01")
def test_now(mocker):
    spy = mocker.spy(clock, "now")
    assert clock.now() == {expected}
    assert spy.call_count == 1
"""


@pytest.mark.docker
@pytest.mark.slow
def test_a_task_is_derived_with_what_only_the_ci_installs(tmp_path, allow_tmp_sources, settings, docker_client):
    """On the engine: the fix's test imports freezegun (the `ci` extra, which only the workflow names) and
    uses pytest-mock's `mocker` (a package only the workflow installs, a plugin loaded by name). Without
    the CI's installs the suite cannot be collected and the ticket is rejected; with them it derives."""
    from envforge.sources.derive import derive_tasks
    from envforge.sources.tickets import load_ticket_source

    pyproject = ('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
                 '[project]\nname = "clock"\nversion = "1.0"\n[project.optional-dependencies]\nci = ["freezegun"]\n'
                 '[tool.setuptools]\npy-modules = ["clock"]\n')
    workflow = ("jobs:\n  test:\n    runs-on: ubuntu-latest\n    steps:\n"
                "      - run: pip install -e .[ci] pytest-mock\n      - run: pytest\n")
    config = _ticket_source(tmp_path, pyproject, workflow, "def test_other():\n    pass\n",
                            CLOCK_TEST.format(expected=1))
    result = derive_tasks(settings, load_ticket_source(config).candidates, client=docker_client)
    assert not result.rejects, [r.reason for r in result.rejects]
    [task] = result.tasks
    assert task.spec.verification.tests.fail_to_pass == ["tests/test_clock.py::test_now"]
    images = task.spec.metadata["images"]
    installed = {line.split("==")[0].lower().replace("_", "-") for line in images["env_freeze"]}
    assert {"freezegun", "pytest-mock"} <= installed
    assert "pytest_mock" in images["env_plugins"]
