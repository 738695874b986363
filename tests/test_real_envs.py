"""Repositories with dependencies, on the real engine: declared and inferred environments, env
layers, an src layout with a VCS version, derivations that exclude unstable and order-dependent
tests, per-id grading, reproducible identity, and two envforge processes on one engine.

One small repository (`demo`) carries most cases, so its env layer is built once per session
(then a tag lookup) and its pip downloads come from the engine's pip cache volume afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import docker
import pytest
from packaging.utils import canonicalize_name

from envforge.config import Settings
from envforge.errors import ImageBuildError, InfraError
from envforge.sandbox.envlayer import EnvRecipe, build_env_image
from envforge.sandbox.images import build_base_image, build_task_image
from envforge.sources.derive import derive_tasks
from envforge.sources.gitrepo import repository_dir
from envforge.sources.tickets import load_ticket_source
from envforge.task import Task
from tests.test_history_sources import commit, git, make_calc_repo

pytestmark = [pytest.mark.docker, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]

PYPROJECT = """[build-system]
requires = ["setuptools>=64", "setuptools_scm>=8"]
build-backend = "setuptools.build_meta"

[project]
name = "demo"
dynamic = ["version"]
dependencies = ["tomli-w"]

[project.optional-dependencies]
tests = ["text-unidecode"]
docs = ["sphinx"]

[tool.setuptools_scm]
version_file = "src/demo/_version.py"
"""
INIT = "from ._version import version\nfrom .text import slug\n"
TEXT = "from text_unidecode import unidecode\n\n\ndef slug(s):\n    return unidecode(s).lower()\n"
TEXT_FIXED = "from text_unidecode import unidecode\n\n\ndef slug(s):\n    return unidecode(s).lower().replace(' ', '-')\n"
STABLE = "import demo\n\n\ndef test_version_from_the_nearest_tag():\n    assert demo.version == '2.3.1'\n"
# An id holding a memory address, an id holding the time, and a test that passes only in file order.
UNSTABLE = ("import time\nimport pytest\n\n\n@pytest.mark.parametrize('obj', [object()], ids=repr)\n"
            "def test_address(obj):\n    pass\n\n\n@pytest.mark.parametrize('t', [0], ids=[str(time.time())])\n"
            "def test_clock(t):\n    pass\n")
ORDER = ("STATE = []\n\n" + "".join(f"\ndef test_step_{i}():\n    STATE.append({i})\n\n" for i in range(8))
         + "\ndef test_steps_ran_in_file_order():\n    assert STATE == list(range(8))\n")
SLUG_TEST = ("import os\nimport iso8601\nimport tomli_w\nfrom demo import slug\n\n\n"
             "def test_slug_joins_words():\n    assert slug('Héllo World') == 'hello-world'\n")


def _make_demo(repo: Path) -> dict[str, str]:
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas = {"initial": commit(repo, "initial", {
        "pyproject.toml": PYPROJECT, "requirements-test.txt": "iso8601\n", ".gitignore": "src/demo/_version.py\n",
        "src/demo/__init__.py": INIT, "src/demo/text.py": TEXT, "tests/test_version.py": STABLE,
        "tests/test_unstable.py": UNSTABLE, "tests/test_order.py": ORDER}, 0)}
    git(repo, "tag", "v2.3.1")
    shas["fix"] = commit(repo, "slug: join words with dashes", {"src/demo/text.py": TEXT_FIXED,
                                                                  "tests/test_slug.py": SLUG_TEST}, 1)
    shas["needs_dep"] = commit(repo, "slug: keep case", {
        "src/demo/text.py": TEXT_FIXED + "\n\ndef keep(s):\n    return s\n",
        "tests/test_keep.py": "import envforge_missing_dependency\nfrom demo.text import keep\n\n\n"
                              "def test_keep():\n    assert keep('A') == 'A'\n"}, 2)
    return shas


def _source(root: Path, repo: Path, shas: dict[str, str], extra: str = "", tickets=("fix", "needs_dep")) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"number": i, "title": f"ticket about {name}", "body": "see title", "closed_by_commit": shas[name]}
            for i, name in enumerate(tickets, start=1)]
    (root / "issues.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tickets.yaml").write_text(f"repository: {os.path.relpath(repo, root)}\nproject: demo\n"
                                       "exports:\n  - file: issues.jsonl\n    preset: github\n    id_prefix: d\n"
                                       + extra)
    return root / "tickets.yaml"


@pytest.fixture(autouse=True)
def sources_beside_repositories(tmp_path_factory, monkeypatch):
    """The sources here name repositories in other pytest folders: allow them the way a deployment
    does (ENVFORGE_SOURCE_ROOTS), for one test at a time."""
    monkeypatch.setenv("ENVFORGE_SOURCE_ROOTS", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("demo")
    return root / "demo", _make_demo(root / "demo")


@pytest.fixture(scope="session")
def demo_settings(tmp_path_factory) -> Settings:
    s = Settings.from_env().with_data_dir(tmp_path_factory.mktemp("demo-data"))
    s.ensure_dirs()
    return s


@pytest.fixture(scope="session")
def inferred(demo, demo_settings, docker_client, base_image, tmp_path_factory):
    """The demo source with nothing declared, derived once for the session."""
    repo, shas = demo
    # PASS_TO_PASS from the whole suite: the unstable and order-dependent tests sit in files the change
    # does not touch, so the default scope (the change's test files) would leave them out anyway.
    config = _source(tmp_path_factory.mktemp("inferred"), repo, shas, extra="tests: {pass_to_pass: suite}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENVFORGE_SOURCE_ROOTS", str(tmp_path_factory.getbasetemp()))
        return config, derive_tasks(demo_settings, load_ticket_source(config).candidates, client=docker_client)


def test_inferred_env_src_layout_vcs_version_and_unstable_tests(inferred, docker_client, grader, demo_settings):
    _, result = inferred
    [task] = result.tasks
    tests = task.spec.verification.tests
    # The fix's test needs packages from pyproject's dependencies, its `tests` extra and a requirements
    # file; the src-layout package imports from the work tree with the version of the nearest tag.
    assert tests.fail_to_pass == ["tests/test_slug.py::test_slug_joins_words"]
    assert "tests/test_version.py::test_version_from_the_nearest_tag" in tests.pass_to_pass
    assert {f"tests/test_order.py::test_step_{i}" for i in range(8)} <= set(tests.pass_to_pass)
    excluded = task.spec.metadata["excluded_tests"]
    assert "depends on the order" in excluded["tests/test_order.py::test_steps_ran_in_file_order"]
    unstable = [t for t in excluded if t.startswith(("tests/test_unstable.py::test_address[<object object at",
                                                     "tests/test_unstable.py::test_clock["))]
    assert len(unstable) == 2 and all("not found again" in excluded[t] for t in unstable)
    assert not any(t.startswith("tests/test_unstable.py") for t in tests.pass_to_pass)
    env = task.spec.environment
    assert env.install == "editable" and env.version == "2.3.1" and "-r requirements-test.txt" in env.pip
    about = task.spec.metadata["environment"]
    assert about["declared"] is False and about["inferred"]["dynamic_version"] == "setuptools_scm"
    assert "sphinx" not in " ".join(env.pip)
    images = task.spec.metadata["images"]
    assert images["base"].startswith("envforge/base:") and images["env"].startswith("envforge/env-demo:")
    installed = {canonicalize_name(line.split("==")[0]) for line in images["env_freeze"]}
    assert {"tomli-w", "text-unidecode", "iso8601", "setuptools-scm"} <= installed
    labels = docker_client.images.get(images["env"]).labels  # containers made from it claim no owner
    assert "envforge.managed" not in labels and not labels.get("envforge.owner")
    assert not Path(env.repository.path).is_absolute()
    # The task grades for real: reference resolves, the empty diff does not.
    base = build_base_image(docker_client, demo_settings).tag
    image = build_task_image(docker_client, task, base, demo_settings).tag
    assert grader.grade(task, image, task.reference_patch).resolved
    assert not grader.grade(task, image, "").resolved


def test_a_missing_test_dependency_is_rejected_with_the_import_error(inferred):
    _, result = inferred
    [reject] = result.rejects
    assert reject.field == "closed_by_commit" and reject.source.endswith("issues.jsonl:2")
    assert "tests could not be collected after the change" in reject.reason
    assert "ModuleNotFoundError: No module named 'envforge_missing_dependency'" in reject.reason


def test_declared_env_reaches_tests_and_episode_commands(demo, demo_settings, docker_client, grader, tmp_path):
    repo, shas = demo
    config = _source(tmp_path / "declared", repo, shas, tickets=("fix",), extra=(
        "tests: {command: 'DEMO_FLAG=on python3 -m pytest'}\n"
        "environment:\n  pip: [tomli-w==1.0.0, text-unidecode==1.3, iso8601==2.1.0]\n"
        "  env: {DEMO_GREETING: hello, PATH: /opt/demo/bin}\n"))
    result = derive_tasks(demo_settings, load_ticket_source(config).candidates, client=docker_client)
    [task] = result.tasks
    env = task.spec.environment
    assert task.spec.metadata["environment"]["declared"] is True
    assert env.pip[-3:] == ["tomli-w==1.0.0", "text-unidecode==1.3", "iso8601==2.1.0"]
    assert "tomli_w==1.0.0" in task.spec.metadata["images"]["env_freeze"]
    base = build_base_image(docker_client, demo_settings).tag
    image = build_task_image(docker_client, task, base, demo_settings).tag
    # Episode commands (and solution commands) see the task's variables merged with envforge's.
    diff, failures = grader.commands_diff(task, image, ['printf "%s|%s" "$DEMO_GREETING" "$PATH" > seen.txt'])
    assert not failures and "+hello|/opt/demo/bin:/usr/local/bin:/usr/bin:/bin" in diff
    # A test run sees them too, and a `NAME=value` prefix of the test command is merged, not lost.
    probe = ("import os\n\ndef test_env():\n    assert os.environ['DEMO_GREETING'] == 'hello'\n"
             "    assert os.environ['DEMO_FLAG'] == 'on'\n")
    checked = task.model_copy(update={"test_patch": (task.test_patch or "") + _new_file("tests/test_env.py", probe)})
    spec = checked.spec.model_copy(update={"verification": checked.spec.verification.model_copy(update={
        "tests": checked.spec.verification.tests.model_copy(update={"pass_to_pass": ["tests/test_env.py::test_env"]})})})
    result = grader.grade(checked.model_copy(update={"spec": spec}), image, task.reference_patch)
    assert result.resolved, result.reasons


def test_env_layers_share_downloads_through_the_engine_wheelhouse(docker_client, base_image):
    """Two env layers needing the same packages: the second downloads none of them (the wheelhouse
    does not depend on the index's caching headers, which this machine's proxy drops)."""
    volume = f"envforge-test-pip-{uuid.uuid4().hex[:8]}"
    recipe = EnvRecipe("wheelhouse-test", base_image, None, (), ("six==1.16.0", "iniconfig==2.0.0"))
    builds = []
    try:
        for n in range(2):
            builds.append(build_env_image(docker_client, recipe, cache_volume=volume,
                                          tag=f"envforge/env-wheelhouse-test:{uuid.uuid4().hex[:8]}-{n}"))
    finally:
        for b in builds:
            docker_client.images.remove(b.tag, force=True)
        docker_client.volumes.get(volume).remove(force=True)
    first, second = builds
    assert not first.cache_hit and not second.cache_hit
    assert (first.downloaded, first.from_cache) == (2, 0)
    assert (second.downloaded, second.from_cache) == (0, 2)
    assert {"six==1.16.0", "iniconfig==2.0.0"} <= set(second.freeze)


def _new_file(path: str, text: str) -> str:
    lines = text.splitlines()
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines))


def test_one_unknown_id_is_missing_on_its_own(bundled_images, grader):
    task, image = bundled_images["inventory-median-even"]
    tests = task.spec.verification.tests
    ghost = "tests/test_stats.py::test_not_there[<obj at 0x7f00>]"
    spec = task.spec.model_copy(update={"verification": task.spec.verification.model_copy(update={
        "tests": tests.model_copy(update={"fail_to_pass": [*tests.fail_to_pass, ghost,
                                                           "tests/test_gone.py::test_x"]})})})
    result = grader.grade(task.model_copy(update={"spec": spec}), image, task.reference_patch)
    assert result.tests[ghost] == "missing" and result.tests["tests/test_gone.py::test_x"] == "missing"
    assert all(result.tests[t] == "passed" for t in tests.ids)
    assert sorted(result.reasons) == sorted([f"test_missing:{ghost}", "test_missing:tests/test_gone.py::test_x"])


def test_a_moved_source_still_builds_and_a_different_base_is_refused(demo, docker_client, grader, tmp_path,
                                                                     base_image):
    repo, shas = demo
    first = tmp_path / "first"
    shutil.copytree(repo, first / "repo")
    config = _source(first / "source", first / "repo", shas, tickets=("fix",))
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    [task] = derive_tasks(settings, load_ticket_source(config).candidates, client=docker_client).tasks
    assert task.spec.environment.repository.path == "../repo"
    stored = Task.model_validate_json(task.model_dump_json())
    (tmp_path / "elsewhere").mkdir()
    shutil.move(str(first), str(tmp_path / "elsewhere" / "first"))  # the source and its repository move away
    built = build_task_image(docker_client, stored, base_image, settings)
    docker_client.images.remove(built.tag, force=True)
    rebuilt = build_task_image(docker_client, stored, base_image, settings)  # from the store, by commit
    assert not rebuilt.cache_hit and grader.grade(stored, rebuilt.tag, stored.reference_patch).resolved
    other = f"envforge/base:other-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ImageBuildError, match=r"was built on the base image envforge/base:.* would now be built on "
                                              r"envforge/base:other-.*--rebuild"):
        build_task_image(docker_client, stored, other, settings)
    images = stored.spec.metadata["images"]
    moved_env = stored.model_copy(update={"spec": stored.spec.model_copy(update={
        "metadata": {**stored.spec.metadata, "images": {**images, "env": "envforge/env-demo:0000000000000000"}}})})
    with pytest.raises(ImageBuildError, match="was built on the env image envforge/env-demo:0000000000000000"):
        build_task_image(docker_client, moved_env, base_image, settings)


def test_two_envforge_processes_ingest_at_once_on_one_engine(demo, tmp_path, inferred):
    repo, shas = demo
    config = _source(tmp_path / "src", repo, shas, tickets=("fix",))
    envforge = str(Path(sys.executable).with_name("envforge"))
    procs = [subprocess.Popen([envforge, "ingest", str(config), "--json", "--data-dir", str(tmp_path / f"d{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    docs = [json.loads(out) for out, _ in outs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert [d["valid"] for d in docs] == [1, 1] and docs[0]["tasks"] == docs[1]["tasks"]


def test_a_build_killed_from_outside_is_retried_as_an_infra_fault(tmp_path, docker_client, base_image):
    repo = tmp_path / "calc"
    shas = make_calc_repo(repo)
    marker = f"sleep 7.{uuid.uuid4().int % 1000:03d}"
    root = tmp_path / "src"
    root.mkdir()
    (root / "issues.jsonl").write_text(json.dumps({"number": 1, "title": "add subtracts", "body": "fix it",
                                                   "closed_by_commit": shas["fix"]}) + "\n")
    (root / "tickets.yaml").write_text("repository: ../calc\nproject: calc\nexports:\n  - file: issues.jsonl\n"
                                       f"    preset: github\nenvironment:\n  setup: ['{marker}']\n")
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    killed: list[str] = []

    def killer(times: int) -> None:
        """Kill the build step running `marker` (another process doing it: `docker kill`)."""
        deadline = time.monotonic() + 240
        while len(killed) < times and time.monotonic() < deadline:
            for c in docker_client.api.containers(filters={"status": "running"}):
                if marker in c.get("Command", "") and c["Id"] not in killed:
                    try:
                        docker_client.api.kill(c["Id"])
                        killed.append(c["Id"])
                    except docker.errors.APIError:
                        pass  # it ended meanwhile
            time.sleep(0.2)

    [cand] = load_ticket_source(root / "tickets.yaml").candidates
    thread = threading.Thread(target=killer, args=(1,), daemon=True)
    thread.start()
    with pytest.raises(InfraError, match=r"image_build_killed.*code: 137"):
        build_task_image(docker_client, cand.provisional_task(), base_image, settings,
                         repository_dir=repository_dir)
    thread.join()
    # Killed once, then retried: the derivation goes through.
    thread = threading.Thread(target=killer, args=(2,), daemon=True)
    thread.start()
    result = derive_tasks(settings, [cand], client=docker_client)
    thread.join()
    assert len(killed) == 2 and [t.id for t in result.tasks] == ["calc-1"], result.rejects


def test_a_real_fix_commit_of_a_bundled_repository(tmp_path, docker_client, grader, base_image):
    """The short form of bench/real_repos.py: one parse ticket, environment inferred, derived
    FAIL_TO_PASS equal to the hand-checked list, and the task grades."""
    import yaml

    project = REPO / "task_sources" / "examples" / "real-repos" / "parse"
    [record] = [line for line in (project / "jira-export.jsonl").read_text().splitlines() if '"PARSE-92"' in line]
    (tmp_path / "one.jsonl").write_text(record + "\n")
    (tmp_path / "tickets.yaml").write_text(
        (project / "tickets.yaml").read_text().replace("file: jira-export.jsonl", "file: one.jsonl"))
    shutil.copy(project / "parse.bundle", tmp_path / "parse.bundle")  # sources are confined to their folder
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    [task] = derive_tasks(settings, load_ticket_source(tmp_path / "tickets.yaml").candidates, client=docker_client).tasks
    expected = yaml.safe_load((project / "expected.yaml").read_text())["tickets"]["PARSE-92"]["fail_to_pass"]
    assert task.spec.verification.tests.fail_to_pass == expected
    assert task.spec.metadata["environment"]["declared"] is False and task.spec.environment.install == "editable"
    image = build_task_image(docker_client, task, base_image, settings).tag
    assert grader.grade(task, image, task.reference_patch).resolved
    assert not grader.grade(task, image, "").resolved


def test_a_bundled_repository_whose_async_tests_need_its_declared_plugin(tmp_path, docker_client, grader,
                                                                        base_image):
    """asgiref, nothing declared: pytest-asyncio comes from its `tests` extra; the env layer records
    its pytest11 entry point and every run of the task loads it with -p (autoload stays off).
    Without that, the async tests fail before and after the fix and the ticket is rejected."""
    import yaml

    project = REPO / "task_sources" / "examples" / "real-repos" / "asgiref"
    for name in ("tickets.yaml", "github-issues.csv", "asgiref.bundle"):
        shutil.copy(project / name, tmp_path / name)
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    result = derive_tasks(settings, load_ticket_source(tmp_path / "tickets.yaml").candidates, client=docker_client)
    assert not result.rejects, result.rejects
    [task] = result.tasks
    expected = yaml.safe_load((project / "expected.yaml").read_text())["tickets"]["gh-1"]["fail_to_pass"]
    assert task.spec.verification.tests.fail_to_pass == expected
    assert task.spec.verification.tests.plugins == ["pytest_asyncio.plugin"]
    assert task.spec.metadata["images"]["env_plugins"] == ["pytest_asyncio.plugin"]
    assert task.spec.metadata["environment"]["declared"] is False
    image = build_task_image(docker_client, task, base_image, settings).tag
    assert grader.grade(task, image, task.reference_patch).resolved
    assert not grader.grade(task, image, "").resolved
    # A task stored before plugins were recorded (no env_plugins, no tests.plugins) keeps working on
    # its own env-layer-2 recipe: it builds and grades, loading no plugin.
    from envforge.sandbox.images import env_recipe, records_legacy_env

    old_images = {k: v for k, v in task.spec.metadata["images"].items() if k != "env_plugins"}
    old = task.model_copy(update={"spec": task.spec.model_copy(update={
        "metadata": {**task.spec.metadata, "images": old_images},
        "verification": task.spec.verification.model_copy(update={
            "tests": task.spec.verification.tests.model_copy(update={"plugins": []})})})})
    assert records_legacy_env(old)
    recipe = env_recipe("asgiref", base_image, old.spec.environment, lambda rel: None, legacy=True)
    old = old.model_copy(update={"spec": old.spec.model_copy(update={
        "metadata": {**old.spec.metadata, "images": {**old_images, "env": recipe.tag}}})})
    old_image = build_task_image(docker_client, old, base_image, settings).tag
    assert not grader.grade(old, old_image, old.reference_patch).resolved  # its async test cannot run


BUILD_PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "spdx-demo"
version = "1.0"
license = "MIT"
license-files = ["LICENSE"]

[project.optional-dependencies]
test = ["pytest"]
"""


def test_build_requirements_are_the_newest_that_satisfy_the_range(tmp_path, docker_client, base_image):
    """A project that asks for setuptools>=61 but writes its licence as an SPDX expression (which
    setuptools reads only from 77 on): the base image's Debian setuptools 66 satisfies the range,
    and an isolated build, as the project's CI runs, would still install the newest one. (No small
    public project with this shape was found in time; this repository is made here.)"""
    repo = tmp_path / "spdx"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = {"initial": commit(repo, "initial", {
        "pyproject.toml": BUILD_PYPROJECT, "LICENSE": "MIT\n", "src/spdx_demo/__init__.py": "def add(a, b):\n    return a - b\n",
        "tests/test_add.py": "from spdx_demo import add\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"}, 0)}
    shas["fix"] = commit(repo, "add: add", {"src/spdx_demo/__init__.py": "def add(a, b):\n    return a + b\n",
                                           "tests/test_add.py": "from spdx_demo import add\n\n\ndef test_zero():\n"
                                           "    assert add(0, 0) == 0\n\n\ndef test_two():\n    assert add(1, 1) == 2\n"}, 1)
    src = _source(tmp_path / "src", repo, shas, tickets=("fix",))
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    result = derive_tasks(settings, load_ticket_source(src).candidates, client=docker_client)
    assert not result.rejects, result.rejects
    [task] = result.tasks
    assert task.spec.verification.tests.fail_to_pass == ["tests/test_add.py::test_two"]
    assert task.spec.metadata["environment"]["build_requires"] == ["setuptools>=61", "wheel"]
    freeze = dict(line.split("==", 1) for line in task.spec.metadata["images"]["env_freeze"] if "==" in line)
    from packaging.version import Version

    assert Version(freeze["setuptools"]) >= Version("77")


TOX_PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "slugs"
version = "1.0"

[dependency-groups]
test = ["pytest>=8", {include-group = "async"}]
async = ["pytest-asyncio>=0.23"]

[tool.pytest.ini_options]
asyncio_mode = "strict"
"""
TOX_TOML = 'env_list = ["3.11"]\n\n[env_run_base]\ndeps = ["text-unidecode"]\ncommands = [["pytest"]]\n'
SLUGS_TEST = ("import pytest\nfrom text_unidecode import unidecode\nfrom slugs import slug\n\n\n@pytest.mark.asyncio\n"
              "async def test_slug_joins_words():\n    assert await slug(unidecode('Héllo World')) == 'hello-world'\n")


def test_tox_toml_deps_and_an_included_dependency_group_reach_the_tests(tmp_path, docker_client):
    """Nothing declared: the test imports a package only tox.toml's [env_run_base] deps name, and
    is async, with pytest-asyncio from a group the `test` group includes. (Made here: no small public
    project with this shape was found in time.)"""
    repo = tmp_path / "slugs"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = {"initial": commit(repo, "initial", {
        "pyproject.toml": TOX_PYPROJECT, "tox.toml": TOX_TOML,
        "slugs/__init__.py": "async def slug(s):\n    return s.lower()\n"}, 0)}
    shas["fix"] = commit(repo, "slug: dashes", {"slugs/__init__.py": "async def slug(s):\n    return s.lower()"
                                                                     ".replace(' ', '-')\n",
                                                "tests/test_slug.py": SLUGS_TEST}, 1)
    src = _source(tmp_path / "src", repo, shas, tickets=("fix",))
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    result = derive_tasks(settings, load_ticket_source(src).candidates, client=docker_client)
    assert not result.rejects, result.rejects
    [task] = result.tasks
    assert task.spec.verification.tests.fail_to_pass == ["tests/test_slug.py::test_slug_joins_words"]
    assert "text-unidecode" in task.spec.environment.pip and "pytest-asyncio>=0.23" in task.spec.environment.pip
    assert task.spec.verification.tests.plugins == ["pytest_asyncio.plugin"]


def _derive_bundled(project: str, tmp_path: Path, docker_client) -> tuple[object, Settings, dict]:
    """A bundled real repository's tickets, nothing declared, derived in a fresh data dir (the source
    copied into tmp_path: sources are confined to their folder); with its hand-checked lists."""
    import yaml

    folder = REPO / "task_sources" / "examples" / "real-repos" / project
    for path in folder.iterdir():
        if path.name != "expected.yaml":
            shutil.copy(path, tmp_path / path.name)
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    result = derive_tasks(settings, load_ticket_source(tmp_path / "tickets.yaml").candidates, client=docker_client)
    expected = yaml.safe_load((folder / "expected.yaml").read_text())["tickets"]
    return result, settings, expected


def test_a_bundled_repository_whose_test_group_includes_another(tmp_path, docker_client, grader, base_image):
    """attrs' `tests` dependency group includes `tests-mypy` (PEP 735 `include-group`): no environment
    declared, the env layer holds both groups' requirements and the fix derives its hand-checked FAIL_TO_PASS.
    The base image's pytest imports Debian's `attr` at start-up: the task records attrs' own modules
    (`attr`, `attrs`, `tests`) and its runs import them from the work tree, not Debian's copy."""
    result, settings, expected = _derive_bundled("attrs", tmp_path, docker_client)
    assert not result.rejects, result.rejects
    [task] = result.tasks
    assert task.spec.verification.tests.modules == ["attr", "attrs", "tests"]
    assert sorted(task.spec.verification.tests.fail_to_pass) == sorted(expected["gh-1"]["fail_to_pass"])
    assert any(line.startswith("pytest-mypy-plugins==") for line in task.spec.metadata["images"]["env_freeze"])
    image = build_task_image(docker_client, task, base_image, settings).tag
    assert grader.grade(task, image, task.reference_patch).resolved
    assert not grader.grade(task, image, "").resolved


def test_a_bundled_repository_whose_spdx_licence_needs_a_newer_setuptools(tmp_path, docker_client, grader,
                                                                          base_image):
    """cachetools asks for `setuptools >= 61.0.0` and writes its licence as PEP 639 metadata (`license =
    "MIT"`, `license-files`), which setuptools reads from 77 on (the base image's Debian setuptools 66
    fails its metadata generation). The env layer holds the newest setuptools the range allows, as the
    project's isolated build would, and the editable install builds."""
    result, settings, expected = _derive_bundled("cachetools", tmp_path, docker_client)
    assert not result.rejects, result.rejects
    [task] = result.tasks
    assert task.spec.verification.tests.fail_to_pass == expected["gh-1"]["fail_to_pass"]
    assert task.spec.metadata["environment"]["declared"] is False
    assert "setuptools >= 61.0.0" in task.spec.metadata["environment"]["build_requires"]
    freeze = dict(line.split("==", 1) for line in task.spec.metadata["images"]["env_freeze"] if "==" in line)
    from packaging.version import Version

    assert Version(freeze["setuptools"]) >= Version("77")
    image = build_task_image(docker_client, task, base_image, settings).tag
    assert grader.grade(task, image, task.reference_patch).resolved
    assert not grader.grade(task, image, "").resolved


def test_a_bundled_repository_whose_test_plugin_comes_from_tox_toml(tmp_path, docker_client, grader, base_image):
    """xopen, nothing declared: pytest-timeout is named only by tox.toml's [env_run_base] deps, and
    the suite runs with --strict-markers, so without it tests/test_xopen.py (`@pytest.mark.timeout`)
    is not even collected. Its move to backports.zstd adds the dependency in the fix itself: the env
    layer installs what the fix's manifests add (before, the ticket was rejected: the suite produced
    no results after the change)."""
    result, settings, expected = _derive_bundled("xopen", tmp_path, docker_client)
    assert not result.rejects, result.rejects
    [task] = result.tasks
    assert sorted(task.spec.verification.tests.fail_to_pass) == sorted(expected["gh-1"]["fail_to_pass"])
    about = task.spec.metadata["environment"]
    assert about["declared"] is False and any(r.startswith("tox.toml [env_run_base] deps") for r in about["inferred"]["read"])
    assert about["inferred"]["added_by_change"] == ["backports.zstd; python_version < \"3.14\""]
    assert "pytest_timeout" in task.spec.verification.tests.plugins
    image = build_task_image(docker_client, task, base_image, settings).tag
    assert grader.grade(task, image, task.reference_patch).resolved
    assert not grader.grade(task, image, "").resolved
