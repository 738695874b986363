"""The sandbox's pytest launcher: pytest from the system, the project's own modules from the work tree.

The launcher runs here under the venv's pytest with the work tree in a temporary folder (its WORKSPACE
patched): iniconfig stands for attrs, a module pytest's start-up imports before any test does."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envforge.environment import WORKSPACE
from envforge.sources.import_roots import import_names
from envforge.task import TestCheckpoint as Check
from envforge.verify.checkpoints import RUNNER_DIR, launcher_program, literal_words
from envforge.verify.checkpoints import test_command as make_test_command
from envforge.verify.selection import TARGETED

RUNNERS = Path(__file__).resolve().parents[1] / "platform" / "envforge" / "verify" / "runners"


def _launcher():
    spec = importlib.util.spec_from_file_location("pytest_launcher_under_test", RUNNERS / "pytest_launcher.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_launcher_knows_the_sandbox_workspace():
    assert _launcher().WORKSPACE == WORKSPACE


def test_the_stdlib_and_pytest_are_never_project_names():
    names = _launcher().project_names("attr, attrs,json,pytest,_pytest,os,envforge_reporter,not-a-name,,pluggy")
    assert names == {"attr", "attrs", "pluggy"}


def test_the_task_modules_reach_the_launcher_and_only_through_it():
    check = Check(fail_to_pass=["t"], modules=["attr", "attrs"])
    cmd, _, env = make_test_command(check, TARGETED)
    assert cmd.startswith(f"python3 -P {RUNNER_DIR}/pytest_launcher.py ") and env["ENVFORGE_PROJECT_MODULES"] == "attr,attrs"
    assert "ENVFORGE_PROJECT_MODULES" not in make_test_command(Check(fail_to_pass=["t"]), TARGETED)[2]
    with pytest.raises(ValueError, match="'a.b' is not a top-level import name"):
        Check(fail_to_pass=["t"], modules=["a.b"])


def test_only_a_launcher_command_the_shell_would_not_expand_is_said_as_data():
    """A fork of a preloaded interpreter gets the words as data, so the command may hold nothing the
    shell would expand or parse: then the words are exactly what bash would pass."""
    assert literal_words("tests -x -k 'a and not b' -o addopts= '' x'y'z") == [
        "tests", "-x", "-k", "a and not b", "-o", "addopts=", "", "xyz"]
    for text in ("$TESTS", "tests/*.py", 'tests "-x"', "a\\ b", "x; rm -rf /", "a | b", "~/t", "a#b", "'open",
                 "{a,b}", "$(id)", "`id`", "a > b"):
        assert literal_words(text) is None, text
    check = Check(fail_to_pass=["t"], plugins=["pytest_asyncio.plugin"], command="python3 -m pytest -k 'not slow' tests")
    cmd, _, _ = make_test_command(check, TARGETED)
    program = launcher_program(cmd)
    assert program is not None and program.script == f"{RUNNER_DIR}/pytest_launcher.py"
    assert program.args[:3] == ("-k", "not slow", "tests") and "pytest_asyncio.plugin" in program.args
    assert program.preload == ("pytest",) and program.flags == ("-P",) and program.interpreter == "python3"
    assert launcher_program(make_test_command(Check(fail_to_pass=["t"], command="python3 -m pytest $ARGS"),
                                              TARGETED)[0]) is None
    assert launcher_program("cd sub && python3 -m pytest") is None


def test_import_names_read_flat_and_src_layouts():
    paths = ["setup.py", "conftest.py", "six.py", "tests/__init__.py", "tests/test_x.py", "docs/conf.py",
             "src/attr/__init__.py", "src/attr/_make.py", "src/attrs/__init__.py", "src/typing_x.py",
             "src/ns/sub/__init__.py", "my-tool/__init__.py"]
    assert import_names(paths, ("", "src")) == ["attr", "attrs", "six", "tests", "typing_x"]


def _work_tree(root: Path) -> Path:
    ws = (root / "ws").resolve()
    (ws / "src" / "iniconfig").mkdir(parents=True)
    (ws / "src" / "iniconfig" / "__init__.py").write_text("WHERE = 'work tree'\n")
    (ws / "src" / "iniconfig" / "part.py").write_text("WHERE = 'work tree part'\n")
    # what a policy might write to shadow pytest, its plugin machinery or the stdlib
    for name in ("pytest", "json", "pluggy"):
        (ws / f"{name}.py").write_text("raise SystemExit('shadowed by the work tree')\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_where.py").write_text(textwrap.dedent(f"""
        import json, os, sys
        import pluggy
        import pytest

        WS = {str(ws)!r}

        def outside(module):
            return not os.path.realpath(module.__file__).startswith(WS + "/")

        def test_where():
            import iniconfig
            assert outside(json) and outside(pluggy) and outside(pytest)
            expected = os.environ["EXPECT"]
            assert getattr(iniconfig, "WHERE", "system") == expected, iniconfig.__file__
            if expected == "work tree":
                import iniconfig.part
                assert iniconfig.part.WHERE == "work tree part"
    """))
    return ws


def _run(ws: Path, modules: str, expect: str) -> subprocess.CompletedProcess:
    driver = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('pytest_launcher', {str(RUNNERS / 'pytest_launcher.py')!r}); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        f"m.WORKSPACE = {str(ws)!r}; sys.argv[1:] = ['-p', 'no:cacheprovider', '-q', 'tests']; m.main()"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "ENVFORGE_PYTHONPATH": f"{ws}/src", "EXPECT": expect}
    if modules:
        env["ENVFORGE_PROJECT_MODULES"] = modules
    return subprocess.run([sys.executable, "-P", "-c", driver], cwd=ws, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_project_pytest_already_imported_is_tested_from_the_work_tree(tmp_path):
    ws = _work_tree(tmp_path)
    # without the task's names: the system's copy, which pytest's start-up loaded (the attrs fault)
    before = _run(ws, "", "system")
    assert before.returncode == 0, before.stdout + before.stderr
    # with them: the work tree's, submodules too; pytest, pluggy and json stay the system's even when
    # the list names them
    after = _run(ws, "iniconfig,pytest,json", "work tree")
    assert after.returncode == 0, after.stdout + after.stderr


def test_a_name_the_work_tree_lacks_keeps_the_installed_copy(tmp_path):
    ws = _work_tree(tmp_path)
    (ws / "src" / "iniconfig" / "__init__.py").unlink()
    (ws / "src" / "iniconfig" / "part.py").unlink()
    (ws / "src" / "iniconfig").rmdir()
    run = _run(ws, "iniconfig", "system")
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_editable_finder_that_maps_the_name_into_the_work_tree_is_used(tmp_path, monkeypatch):
    """setuptools' editable installs may map a package to its folder with a meta-path finder instead of
    a path entry; the launcher takes that finder's answer when it points into the work tree, never
    when it points elsewhere."""
    launcher = _launcher()
    ws = (tmp_path / "ws").resolve()
    (ws / "lib" / "proj").mkdir(parents=True)
    (ws / "lib" / "proj" / "__init__.py").write_text("")
    outside = tmp_path / "elsewhere" / "other"
    outside.mkdir(parents=True)
    (outside / "__init__.py").write_text("")
    monkeypatch.setattr(launcher, "WORKSPACE", str(ws))

    class Editable:
        mapping = {"proj": ws / "lib" / "proj", "other": outside}

        def find_spec(self, name, path=None, target=None):
            where = self.mapping.get(name)
            if where is None:
                return None
            return importlib.util.spec_from_file_location(name, where / "__init__.py",
                                                          submodule_search_locations=[str(where)])

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Editable()])
    finder = launcher.ProjectFinder({"proj", "other"})
    assert finder.find_spec("proj").origin == str(ws / "lib" / "proj" / "__init__.py")
    assert finder.find_spec("other") is None and finder.find_spec("json") is None

    foreign = type(sys)("proj")
    foreign.__file__ = str(outside / "__init__.py")
    modules = {"proj": foreign, "proj.sub": foreign, "projection": foreign, "json": sys.modules["json"]}
    meta_path: list = []
    assert launcher.prefer_work_tree({"proj", "absent"}, modules, meta_path) == {"proj"}
    assert set(modules) == {"projection", "json"} and isinstance(meta_path[0], launcher.ProjectFinder)
