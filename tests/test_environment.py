"""The environment vocabulary, inference from manifests, env-layer recipes, and the derivation's
classification of unstable and order-dependent tests (no Docker here; see test_real_envs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from envforge.environment import PythonEnvironment, merge_env, split_assignments
from envforge.errors import ImageBuildError
from envforge.sandbox.envlayer import env_recipe
from envforge.sources.derive import Derivation, Run, classify, not_reproduced, outside_test_change, settle
from envforge.sources.infer import infer_environment, nearest_version
from envforge.sources.tickets import load_ticket_source
from envforge.task import TestCheckpoint as Check
from envforge.verify.checkpoints import test_command as make_test_command
from envforge.verify.selection import TARGETED
from envforge.verify.parsers import error_summary, parse_report
from tests.test_history_sources import commit, git, make_calc_repo, write_ticket_source


def test_environment_fields_are_validated_with_reasons():
    env = PythonEnvironment(python="3.11", pip=["freezegun==1.5.1", "-r requirements/test.txt", "attrs>=22"],
                            apt=["gettext"], env={"TZ": "UTC"}, workdir="./pkg/")
    assert env.workdir == "pkg" and env.command_workdir() == "/workspace/pkg" and env.needs_env_layer
    bad = {
        "env": ({"PYTEST_ADDOPTS": "-p evil"}, "set by envforge"),
        "pip": (["--index-url https://evil.example/simple"], "only requirements and `-r FILE`"),
        "workdir": ("../outside", "inside the repository"),
        "apt": (["gettext; rm -rf /"], "not Debian package names"),
        "python": ("three", "neither a version"),
    }
    for field, (value, reason) in bad.items():
        with pytest.raises(ValidationError, match=reason):
            PythonEnvironment(**{field: value})
    with pytest.raises(ValidationError, match="inside the repository"):
        PythonEnvironment(pip=["-r ../../etc/passwd"])
    with pytest.raises(ValidationError, match="set by envforge"):
        Check(command="PYTEST_DISABLE_PLUGIN_AUTOLOAD=0 python3 -m pytest", fail_to_pass=["t"])


def test_envforge_variables_are_merged_never_replacing_the_users():
    merged = merge_env({"PATH": "/opt/tool/bin", "PYTHONPATH": "src", "TZ": "UTC"},
                       {"PATH": "/usr/bin", "PYTHONPATH": "/run/envforge-verifier/runner", "PYTHONNOUSERSITE": "1"})
    assert merged == {"PATH": "/opt/tool/bin:/usr/bin", "PYTHONPATH": "/run/envforge-verifier/runner:src",
                      "TZ": "UTC", "PYTHONNOUSERSITE": "1"}
    assert split_assignments("PYTHONPATH=src A='x y' python3 -m pytest -x") == (
        {"PYTHONPATH": "src", "A": "x y"}, "python3 -m pytest -x")
    # `PYTHONPATH=... python3 -m pytest` keeps the safe launcher and the reporter; the entries are
    # appended after site-packages by the launcher instead of shadowing it.
    check = Check(command="PYTHONPATH=src python3 -m pytest tests", fail_to_pass=["t"])
    cmd, reports, env = make_test_command(check, TARGETED, PythonEnvironment(env={"TZ": "UTC"}))
    assert cmd.startswith("python3 -P /run/envforge-verifier/runner/pytest_launcher.py tests ")
    assert "-p envforge_reporter" in cmd and reports
    assert env["PYTHONPATH"] == "/run/envforge-verifier/runner" and env["ENVFORGE_PYTHONPATH"] == "/workspace/src"
    assert env["TZ"] == "UTC" and env["ENVFORGE_TEST_FILES"] == '["t"]' and "tests" in cmd


def test_history_sources_take_an_environment_section(allow_tmp_sources):
    tmp_path = allow_tmp_sources
    repo = tmp_path / "calc"
    shas = make_calc_repo(repo)
    config = write_ticket_source(tmp_path / "t", repo, shas)
    text = config.read_text()
    config.write_text(text + "environment:\n  pip: [freezegun==1.5.1]\n  env: {TZ: UTC}\n  apt: [gettext]\n")
    [cand] = [c for c in load_ticket_source(config).candidates if c.id == "calc-calc-1"]
    task = cand.provisional_task()
    env = task.spec.environment
    assert env.pip == ["freezegun==1.5.1"] and env.apt == ["gettext"] and env.env == {"TZ": "UTC"}
    assert task.spec.metadata["environment"]["declared"] is True
    assert env.repository.path == "../calc"  # relative to the source, though the config gave an absolute path
    config.write_text(text + "environment:\n  pipx: [x]\n  env: {LD_PRELOAD: /tmp/x.so}\n")
    problems = {p.field: p.reason for p in load_ticket_source(config).rejects}
    assert problems["environment.pipx"].startswith("unknown field")
    assert "set by envforge" in problems["environment.env"]
    assert all(p.source == str(config) for p in load_ticket_source(config).rejects)
    config.write_text(text + "environment:\n  pip: ['-r requirements-test.txt']\n")
    rejects = load_ticket_source(config).rejects
    assert any(p.field == "environment.pip[0]" and "requirements-test.txt does not exist in the repository" in p.reason
               for p in rejects)
    config.write_text(text + "environment:\n  dockerfile: ../../Dockerfile\n")
    assert any(p.field == "environment.dockerfile" for p in load_ticket_source(config).rejects)


def _repo(tmp_path: Path, files: dict[str, str]) -> tuple[Path, str]:
    repo = tmp_path / "r"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    sha = commit(repo, "initial", files, 0)
    git(repo, "tag", "v2.3.1")
    return repo, sha


def test_inference_reads_every_manifest_kind_in_a_fixed_order(tmp_path):
    repo, sha = _repo(tmp_path, {
        "pyproject.toml": '[build-system]\nrequires = ["hatchling", "hatch-vcs"]\n'
                          '[project]\nname = "demo"\ndependencies = ["attrs>=22"]\nrequires-python = ">=3.9"\n'
                          'dynamic = ["version"]\n'
                          '[project.optional-dependencies]\ntests = ["freezegun", "demo[extra]"]\ndocs = ["sphinx"]\n'
                          '[dependency-groups]\ntest = ["pytest-mock", {include-group = "typing"}]\ntyping = ["typing-extensions"]\n'
                          '[tool.hatch.version]\nsource = "vcs"\n',
        "setup.cfg": "[options]\ninstall_requires =\n    six>=1.16\n    idna; python_version < '4'\n"
                     "[options.extras_require]\ntest = pytz\n",
        "setup.py": "from setuptools import setup\nTESTS = ['simplejson']\nsetup(tests_require=TESTS, "
                    "extras_require={'dev': ['black']})\n",
        "requirements.txt": "requests\n", "requirements-test.txt": "-r requirements.txt\nmock\n",
        "requirements-docs.txt": "sphinx\n", "docs/requirements.txt": "mkdocs\n",
        "tox.ini": "[testenv]\ndeps =\n    -r{toxinidir}/requirements-test.txt\n    coverage\n    {posargs}\n",
        "src/demo/__init__.py": "",
    })
    inf = infer_environment(repo, sha)
    assert inf.build_requires == ["hatchling", "hatch-vcs"]
    assert inf.pip == ["attrs>=22", "freezegun", "pytest-mock", "typing-extensions", "six>=1.16",
                       "idna; python_version < '4'", "pytz", "simplejson", "-r requirements.txt",
                       "-r requirements-test.txt", "coverage"]
    assert inf.install == "editable" and inf.dynamic_version == "hatch-vcs" and inf.python == ">=3.9"
    assert [r.split(" (")[0] for r in inf.read] == [
        "pyproject.toml [build-system].requires", "pyproject.toml [project.dependencies]",
        "pyproject.toml [project.optional-dependencies].tests", "pyproject.toml [dependency-groups].test",
        "setup.cfg [options] install_requires", "setup.cfg [options.extras_require].test", "setup.py tests_require",
        "requirements files requirements.txt, requirements-test.txt", "tox.ini [testenv] deps"]
    assert nearest_version(repo, sha) == "2.3.1"
    flat, sha2 = _repo(tmp_path / "flat", {"mod.py": "x = 1\n", "test_mod.py": "def test_x():\n    pass\n"})
    bare = infer_environment(flat, sha2)
    assert bare.pip == [] and bare.install == "none"


def test_tox_configuration_is_read_where_tox_4_reads_it(tmp_path):
    toml = ('env_list = ["3.12", "type"]\n[env_run_base]\ndeps = ["pytest>=8", "-r{tox_root}/requirements-test.txt", '
            '{ replace = "ref", of = ["env", "x", "deps"] }, "py38: mock"]\n'
            '[env.test]\ndeps = ["hypothesis"]\n[env.type]\ndeps = ["mypy"]\n')
    repo, sha = _repo(tmp_path / "a", {"tox.toml": toml, "requirements-test.txt": "freezegun\n"})
    inf = infer_environment(repo, sha)
    assert inf.pip == ["-r requirements-test.txt", "pytest>=8", "hypothesis"]
    assert [r.split(" (")[0] for r in inf.read][-2:] == ["tox.toml [env_run_base] deps", "tox.toml [env.test] deps"]
    # tox.ini comes first, as in tox: tox.toml beside it is not read.
    ini, sha = _repo(tmp_path / "b", {"tox.ini": "[testenv]\ndeps = coverage\n", "tox.toml": toml})
    assert infer_environment(ini, sha).pip == ["coverage"]
    native, sha = _repo(tmp_path / "c", {"pyproject.toml": '[tool.tox.env_run_base]\ndeps = ["respx"]\n',
                                         "tox.toml": toml})
    assert infer_environment(native, sha).pip == ["respx"]
    legacy, sha = _repo(tmp_path / "d", {"pyproject.toml": '[tool.tox]\nlegacy_tox_ini = """\n[testenv]\n'
                                                           'deps = sybil\n"""\n'})
    assert infer_environment(legacy, sha).pip == ["sybil"]


def test_tox_python_version_environments_hold_the_test_deps(tmp_path):
    """tomli's pyproject.toml (at 9e56735, #30's history) has no [testenv]: its runs are
    `[testenv:py{37,38,39,310}]` with `deps = -r tests/requirements.txt` (python-dateutil), and
    nothing else declares the tests' requirements."""
    legacy = ('[tool.tox]\nlegacy_tox_ini = \'\'\'\n[tox]\nenvlist = py{37,38,39,310}\nisolated_build = True\n\n'
              '[testenv:py{37,38,39,310}]\ndescription = run tests against unpackaged source\nskip_install = True\n'
              'deps = -r tests/requirements.txt\ncommands =\n    python -m pytest {posargs}\n\n'
              '[testenv:py{37,38,39,310}-package]\ndeps = build\n\n[testenv:fuzz]\ndeps = atheris\n\'\'\'\n')
    repo, sha = _repo(tmp_path / "a", {"pyproject.toml": legacy, "tests/requirements.txt": "pytest\npython-dateutil\n"})
    assert infer_environment(repo, sha).pip == ["-r tests/requirements.txt"]
    toml = '[env.py312]\ndeps = ["freezegun"]\n[env."py3.13"]\ndeps = ["respx"]\n[env.lint]\ndeps = ["ruff"]\n'
    repo, sha = _repo(tmp_path / "b", {"tox.toml": toml})
    assert infer_environment(repo, sha).pip == ["freezegun", "respx"]


def test_tox_names_a_section_generates():
    from envforge.sources.infer import expand_tox_name, is_python_env

    assert expand_tox_name("py{38,39}-{a,b}") == ["py38-a", "py38-b", "py39-a", "py39-b"]
    assert [is_python_env(n) for n in ("py", "py3", "py311", "py3.12", "pypy3", "py{37,310}", "py{38,39}-package",
                                       "lint", "py-cov", "{py,pypy}3")] == [
        True, True, True, True, True, True, False, False, False, True]


def test_tox_variables_reach_the_tests_when_nothing_is_declared(tmp_path, allow_tmp_sources):
    """cachetools' tox.ini sets THREADING_TESTS = 1 for its suite (its threading tests skip without
    it); substitutions, factor conditions and variables envforge reserves are left out."""
    from envforge.sources.environment import HistoryEnvironment, resolve_environment

    ini = ("[testenv]\ndeps = pytest\nsetenv =\n    THREADING_TESTS = 1\n    PYTHONPATH = {toxinidir}/src\n"
           "    py38: OLD=1\n    PYTEST_ADDOPTS=-x\n    LANG=C.UTF-8\n[testenv:docs]\nsetenv = DOCS=1\n")
    repo, sha = _repo(tmp_path / "a", {"tox.ini": ini})
    inf = infer_environment(repo, sha)
    assert inf.env == {"THREADING_TESTS": "1", "LANG": "C.UTF-8"}
    assert any("PYTEST_ADDOPTS (set by envforge)" in s for s in inf.skipped)
    env = resolve_environment(HistoryEnvironment(env={"LANG": "C"}), repo, sha, "tickets.yaml")
    assert env.fields["env"] == {"THREADING_TESTS": "1", "LANG": "C"}  # the source's own value wins
    assert resolve_environment(HistoryEnvironment(pip=["pytest"]), repo, sha, "t.yaml").fields["env"] == {}
    toml = '[env_run_base]\nset_env = { TZ = "UTC", COVERAGE_FILE = { replace = "env", name = "X" } }\n'
    repo, sha = _repo(tmp_path / "b", {"tox.toml": toml})
    assert infer_environment(repo, sha).env == {"TZ": "UTC"}


def test_dependency_group_includes_are_followed_and_cycles_named(tmp_path, allow_tmp_sources):
    from envforge.errors import SpecError
    from envforge.sources.environment import HistoryEnvironment, resolve_environment

    groups = ('[dependency-groups]\nTest = ["pytest", {include-group = "async"}]\n'
              'async = ["pytest-asyncio", {include-group = "base"}]\nbase = ["anyio"]\nother = [{include-group = "other"}]\n')
    repo, sha = _repo(tmp_path / "a", {"pyproject.toml": '[project]\nname = "x"\n' + groups.replace("Test", "test")})
    assert infer_environment(repo, sha).pip == ["pytest", "pytest-asyncio", "anyio"]  # `other`'s cycle is not used
    cyclic = groups.replace('base = ["anyio"]', 'base = [{include-group = "TEST"}]').replace("Test", "test")
    repo, sha = _repo(tmp_path / "b", {"pyproject.toml": '[project]\nname = "x"\n' + cyclic})
    with pytest.raises(SpecError, match=r"environment: cannot infer .*include-group cycle: test -> async -> base -> test"):
        resolve_environment(HistoryEnvironment(), repo, sha, "tickets.yaml")
    assert resolve_environment(HistoryEnvironment(pip=["pytest"]), repo, sha, "tickets.yaml").fields["pip"] == ["pytest"]
    unknown = '[project]\nname = "x"\n[dependency-groups]\ntest = [{include-group = "lint"}]\n'
    repo, sha = _repo(tmp_path / "c", {"pyproject.toml": unknown})
    with pytest.raises(SpecError, match=r"\[dependency-groups\]\.test includes 'lint', which is not a group"):
        resolve_environment(HistoryEnvironment(), repo, sha, "tickets.yaml")


def test_a_real_repository_whose_test_group_includes_another_group():
    """attrs (task_sources/examples/real-repos/attrs), nothing declared: its `tests` dependency group
    starts with `{include-group = "tests-mypy"}`; the included group's pytest-mypy-plugins is inferred
    with the group's own requirements, in the order the group lists them."""
    project = Path(__file__).resolve().parents[1] / "task_sources" / "examples" / "real-repos" / "attrs"
    [candidate] = load_ticket_source(project / "tickets.yaml").candidates
    pip = candidate.environment.fields["pip"]
    tests_group = [
        'pytest-mypy-plugins; platform_python_implementation == "CPython" and python_version >= "3.10"',
        'cloudpickle; platform_python_implementation == "CPython"',
        "hypothesis",
        "pympler",
        "pytest",
    ]
    assert pip[-len(tests_group) :] == tests_group
    assert "pyproject.toml [dependency-groups].tests (5)" in candidate.environment.metadata["environment"]["inferred"]["read"]


def test_requirements_the_fix_adds_are_installed_with_the_workspaces(tmp_path, allow_tmp_sources):
    """xopen's move to backports.zstd: the fix adds a dependency its own code and tests import, and a
    sandbox cannot fetch it, so the env layer holds what the fix's manifests add (not `-r` files,
    read at the workspace commit at build time); a declared environment is left as declared."""
    from envforge.sources.environment import HistoryEnvironment, resolve_environment

    before = ('[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
              '[project]\nname = "x"\n'
              'dependencies = ["isal>=1.6"]\n[project.optional-dependencies]\ntest = ["pytest"]\n')
    repo, parent = _repo(tmp_path, {"pyproject.toml": before, "requirements-test.txt": "mock\n"})
    fix = commit(repo, "zstd from backports", {
        "pyproject.toml": before.replace('"setuptools>=61"', '"setuptools>=77"')
        .replace('["isal>=1.6"]', '["isal>=1.6", "backports.zstd; python_version < \'3.14\'"]'),
        "requirements-test.txt": "mock\nresponses\n", "requirements-dev.txt": "ruff\n"}, 1)
    env = resolve_environment(HistoryEnvironment(), repo, parent, "tickets.yaml", fix)
    assert env.fields["pip"] == ["setuptools>=61", "wheel", "setuptools>=77", "isal>=1.6", "pytest",
                                 "-r requirements-test.txt", "backports.zstd; python_version < '3.14'"]
    assert env.metadata["environment"]["inferred"]["added_by_change"] == [
        "setuptools>=77", "backports.zstd; python_version < '3.14'"]
    assert env.metadata["environment"]["build_requires"] == ["setuptools>=61", "wheel", "setuptools>=77"]
    unchanged = resolve_environment(HistoryEnvironment(), repo, parent, "tickets.yaml", parent)
    assert "added_by_change" not in unchanged.metadata["environment"]["inferred"]
    declared = resolve_environment(HistoryEnvironment(pip=["pytest"]), repo, parent, "tickets.yaml", fix)
    assert declared.fields["pip"] == ["setuptools>=61", "wheel", "pytest"]


def test_the_derivation_cache_key_follows_the_tests_variables_and_limits(tmp_path, allow_tmp_sources):
    """A suite killed for memory under 1 GiB must not be served from the cache once the source
    raises the limit (xopen decompresses a 2 GiB zstd window); nor one run without a variable tox
    sets; nor one run before the project's modules resolved from the work tree (a project pytest's start-up
    imports, like attrs, was tested as the system's copy)."""
    from envforge.sources.derive import cache_key

    repo = tmp_path / "calc"
    shas = make_calc_repo(repo)
    config = write_ticket_source(tmp_path / "src", repo, shas)
    text = config.read_text()
    keys = {}
    for name, extra in (("plain", ""), ("limits", "limits: {memory_mb: 3072}\n"),
                        ("env", "environment: {env: {THREADING_TESTS: '1'}}\n")):
        config.write_text(text + extra)
        [cand] = [c for c in load_ticket_source(config).candidates if c.id == "calc-calc-1"]
        keys[name] = cache_key(cand, "envforge/task-calc:0")
    assert len(set(keys.values())) == 3
    from envforge.hashing import digest_parts
    from envforge.sources.derive import CACHE_VERSION

    config.write_text(text)
    [cand] = [c for c in load_ticket_source(config).candidates if c.id == "calc-calc-1"]
    assert cand.modules == ["calc"]
    files = ["tests/test_calc.py"]  # the runs cover the files the change touches, forward and reversed
    assert cand.change.test_files == files
    assert keys["plain"] == digest_parts(CACHE_VERSION, "envforge/task-calc:0", cand.change.source_patch,
                                         cand.change.test_patch,
                                         cand.config.tests.model_dump_json(exclude={"pass_to_pass"}),
                                         json.dumps([files, files]), "calc")[:32]


def test_build_requirements_are_upgraded_and_legacy_layers_keep_their_tags():
    from envforge.sandbox.envlayer import _build_script

    env = PythonEnvironment(pip=["setuptools>=61", "wheel", "attrs"])
    plain = env_recipe("demo", "envforge/base:abc", env, {}.get)
    build = env_recipe("demo", "envforge/base:abc", env, {}.get, build=["setuptools>=61", "wheel", "not-in-pip"])
    legacy = env_recipe("demo", "envforge/base:abc", env, {}.get, build=["setuptools>=61"], legacy=True)
    assert build.build == ("setuptools>=61", "wheel") and legacy.build == ()
    assert len({plain.tag, build.tag, legacy.tag}) == 3
    # The tag a task stored before env-layer-3 records (the digest as env-layer-2 computed it).
    from envforge.hashing import digest_parts

    old = digest_parts("env-layer-2", "envforge/base:abc", "", "[]", json.dumps(list(env.pip)))
    assert legacy.tag == f"envforge/env-demo:{old[:16]}"
    script = _build_script(build)
    assert "--upgrade --no-index --find-links /var/cache/envforge-pip/wheelhouse 'setuptools>=61' wheel" in script
    assert script.index("pip wheel") < script.index("--upgrade") < script.index("plugins.txt")
    assert "plugins.py" in _build_script(plain) and "--upgrade" not in _build_script(plain)
    assert "plugins" not in _build_script(legacy) and "--upgrade" not in _build_script(legacy)


def test_env_recipe_tags_follow_the_manifests_content():
    files = {"requirements-test.txt": b"-r base.txt\nmock==5.1\n-e .\n--index-url https://x\n", "base.txt": b"attrs\n"}
    env = PythonEnvironment(pip=["hatchling", "-r requirements-test.txt"])
    recipe = env_recipe("demo", "envforge/base:abc", env, files.get)
    assert recipe.files == {"requirements-test.txt": b"-r base.txt\nmock==5.1\n", "base.txt": b"attrs\n"}
    assert recipe.requirements_txt() == "hatchling\n-r repo/requirements-test.txt\n"
    assert recipe.tag.startswith("envforge/env-demo:")
    assert env_recipe("demo", "envforge/base:abc", env, files.get).tag == recipe.tag
    changed = {**files, "base.txt": b"attrs==23.1\n"}
    assert env_recipe("demo", "envforge/base:abc", env, changed.get).tag != recipe.tag
    assert env_recipe("demo", "envforge/base:other", env, files.get).tag != recipe.tag
    with pytest.raises(ImageBuildError, match="requirements file missing.txt does not exist"):
        env_recipe("demo", "b", PythonEnvironment(pip=["-r missing.txt"]), files.get)


def test_images_result_reports_each_env_layer_once_with_its_build():
    from types import SimpleNamespace

    from envforge.sandbox.envlayer import EnvBuild
    from envforge.sandbox.images import ImageBuild
    from envforge.stages.images import ImagesResult

    built = EnvBuild("envforge/env-demo:a", cache_hit=False, seconds=12.345, freeze=[], downloaded=3, from_cache=9)
    found = EnvBuild("envforge/env-demo:a", cache_hit=True, seconds=0.01, freeze=[])
    other = EnvBuild("envforge/env-calc:b", cache_hit=True, seconds=0.01, freeze=[])
    builds = [ImageBuild("t1", False, 1.0, env=built), ImageBuild("t2", False, 1.0, env=found),
              ImageBuild("t3", True, 0.0, env=other), ImageBuild("t4", True, 0.0)]
    result = ImagesResult(base=ImageBuild("envforge/base:x", True, 0.0),
                          builds=[(SimpleNamespace(id=b.tag), b) for b in builds])
    assert result.env_layers() == {
        "envforge/env-demo:a": {"built": True, "seconds": 12.35, "from_cache": 9, "downloaded": 3, "tasks": 2},
        "envforge/env-calc:b": {"built": False, "seconds": 0.0, "from_cache": 0, "downloaded": 0, "tasks": 1}}
    metrics = result.metrics()
    assert (metrics["env_layers"], metrics["env_layers_built"], metrics["env_build_s_total"]) == (2, 1, 12.35)
    assert result.artifacts()["images.json"]["env_layers"] == result.env_layers()


def _run(statuses: dict[str, str], **kw) -> Run:
    return Run(statuses, **kw)


def test_unstable_ids_and_order_dependent_tests_are_excluded_with_reasons():
    before = [_run({"t.py::ok": "passed", "t.py::order": "passed", "t.py::new": "failed"}),
              _run({"t.py::ok": "passed", "t.py::order": "passed", "t.py::new": "failed"})]
    after = [_run({"t.py::ok": "passed", "t.py::order": "passed", "t.py::new": "passed",
                   "t.py::obj[<X at 0x7f01>]": "passed", "t.py::flips": "passed", "t.py::broken": "failed"}),
             _run({"t.py::ok": "passed", "t.py::order": "failed", "t.py::new": "passed", "t.py::flips": "passed",
                   "t.py::broken": "failed"})]
    before[0].statuses["t.py::broken"] = before[1].statuses["t.py::broken"] = "passed"
    cls = classify(before, after)
    assert cls.fail_to_pass == ["t.py::flips", "t.py::new"] and cls.pass_to_pass == ["t.py::ok"]
    assert cls.broken_by_change == ["t.py::broken"]
    assert "not found again" in cls.excluded["t.py::obj[<X at 0x7f01>]"]
    assert "depends on the order" in cls.excluded["t.py::order"]
    check = {"after": _run({"t.py::new": "passed", "t.py::flips": "failed", "t.py::ok": "passed"}),
             "before": _run({"t.py::ok": "passed"})}
    assert not_reproduced(cls.fail_to_pass, cls.pass_to_pass, check) == {
        "t.py::flips": "failed after the change when run the way the grader runs it"}
    doc = Derivation(before, after, [check]).as_json()
    assert Derivation.from_json(json.loads(json.dumps(doc))).checks[0]["after"].statuses == check["after"].statuses


def test_collection_errors_travel_in_the_report_and_are_quoted():
    report = "\n".join([
        json.dumps({"collect_error": "tests/test_time.py", "message": "ImportError while importing test module\n"
                    "Traceback:\ntests/test_time.py:3: in <module>\n    import freezegun\n"
                    "E   ModuleNotFoundError: No module named 'freezegun'"}),
        json.dumps({"id": "tests/test_a.py::test_a", "status": "passed"}), json.dumps({"finished": True})])
    statuses, errors = parse_report(report)
    assert statuses == {"tests/test_a.py::test_a": "passed"}
    assert error_summary(errors["tests/test_time.py"]) == "ModuleNotFoundError: No module named 'freezegun'"


def test_a_candidate_that_fails_before_only_after_other_tests_is_excluded():
    """humanize's i18n tests leave a translation active when they fail, so a time test in an
    untouched file fails before the fix in file order; run alone it passes: not FAIL_TO_PASS."""
    before = [_run({"tests/test_i18n.py::test_new": "failed", "tests/test_time.py::test_hour": "failed"})]
    after = [_run({"tests/test_i18n.py::test_new": "passed", "tests/test_time.py::test_hour": "passed"})] * 2
    files = ["tests/test_i18n.py"]
    derivation = Derivation(before, after)
    assert outside_test_change(settle(derivation, files).fail_to_pass, files) == ["tests/test_time.py::test_hour"]
    alone = Derivation(before, after, [{"after": after[0], "before": _run({})}],
                       _run({"tests/test_time.py::test_hour": "passed"}))
    settled = settle(alone, files)
    assert settled.fail_to_pass == ["tests/test_i18n.py::test_new"] and settled.confirmed
    assert "only when other tests ran first" in settled.excluded["tests/test_time.py::test_hour"]
