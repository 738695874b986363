"""SWE-bench instances against a local git repository: history scrubbed, test patch held back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from envforge.sandbox.images import build_task_image
from envforge.sources.gitrepo import repository_dir
from envforge.sources.swebench import export_swebench, load_swebench

# The repositories live beside the sources under tmp_path: allowed as a deployment would allow them.
pytestmark = pytest.mark.usefixtures("allow_tmp_sources")

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
OLD_TESTS = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
NEW_TESTS = OLD_TESTS + "\n\ndef test_add():\n    from calc import add\n    assert add(2, 3) == 5\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def instance(tmp_path: Path) -> Path:
    repo = tmp_path / "calc-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(OLD_TESTS)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text(FIXED)
    patch = git(repo, "diff") + "\n"
    (repo / "tests" / "test_calc.py").write_text(NEW_TESTS)
    test_patch = git(repo, "diff", "--", "tests") + "\n"
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "fix add: SECRET-FIX-MARKER")
    git(repo, "tag", "v1-fixed")
    data = tmp_path / "instances"
    data.mkdir()
    (data / "swebench.yaml").write_text(f"repos:\n  acme/calc: {repo}\n")
    rec = {"repo": "acme/calc", "instance_id": "acme__calc-1", "base_commit": base, "patch": patch,
           "test_patch": test_patch, "problem_statement": "add() subtracts instead of adding; fix it.",
           "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
           "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul"]), "version": "1.0"}
    bad = [{k: v for k, v in rec.items() if k != "patch"} | {"instance_id": "missing-patch"},
           rec | {"instance_id": "ghost", "base_commit": "0" * 40},
           rec | {"instance_id": "no-apply", "patch": patch.replace("return a - b", "return a / b")},
           rec | {"instance_id": "unknown-repo", "repo": "acme/other"}]
    (data / "instances.jsonl").write_text("\n".join(json.dumps(r) for r in [rec, *bad]) + "\nnot json\n")
    return data


def test_instances_become_tasks_and_bad_records_are_rejected(instance):
    result = load_swebench([instance])
    assert [t.id for t in result.tasks] == ["acme__calc-1"]
    task = result.tasks[0]
    assert task.spec.source == "swebench" and task.spec.verification.tests.fail_to_pass == ["tests/test_calc.py::test_add"]
    assert "test_add" in task.test_patch and "return a + b" in task.reference_patch
    reasons = {(p.source.rsplit(":", 1)[1], p.field): p.reason for p in result.rejects}
    assert reasons[("2", "patch")] == "required field is missing"
    assert "not found" in reasons[("3", "base_commit")]
    assert "does not apply" in reasons[("4", "patch")]
    assert "no local repository" in reasons[("5", "repo")]
    assert "not a JSON record" in reasons[("6", "")]


def test_export_round_trips(instance, tmp_path):
    tasks = load_swebench([instance]).tasks
    out = tmp_path / "export.jsonl"
    assert export_swebench(tasks, out) == 1
    rec = json.loads(out.read_text())
    assert rec["instance_id"] == "acme__calc-1" and json.loads(rec["FAIL_TO_PASS"]) == ["tests/test_calc.py::test_add"]
    assert rec["patch"] == tasks[0].reference_patch and rec["test_patch"] == tasks[0].test_patch


@pytest.mark.docker
def test_history_is_scrubbed_and_the_instance_grades(instance, docker_client, base_image, grader, settings):
    from envforge.sandbox.container import Sandbox

    task = load_swebench([instance]).tasks[0]
    image = build_task_image(docker_client, task, base_image, settings, repository_dir=repository_dir).tag
    with Sandbox.start(docker_client, image) as sb:
        log = sb.exec("git log --all --oneline | wc -l; git tag; git branch -a; git reflog | wc -l").text().split()
        assert log[0] == "1"  # one commit: the initial state
        assert "v1-fixed" not in log
        leak = sb.exec("git log --all -p | grep -c SECRET-FIX-MARKER; git grep -c 'a + b' $(git rev-list --all)")
        assert leak.text().split()[0] == "0"
        assert "test_add" not in sb.read_file("/workspace/tests/test_calc.py").decode()  # test patch held back
    ref = grader.grade(task, image, task.reference_patch)
    assert ref.resolved and ref.tests == {"tests/test_calc.py::test_add": "passed",
                                          "tests/test_calc.py::test_mul": "passed"}, ref.reasons
    empty = grader.grade(task, image, "")
    assert not empty.resolved and "test_failed:tests/test_calc.py::test_add" in empty.reasons


def test_ingest_finds_instances_beside_a_repo_map_and_exports_a_task_set(instance, tmp_path):
    from envforge.catalog import Catalog
    from envforge.config import Settings
    from envforge.stages.configs import IngestConfig
    from envforge.stages.ingest import ingest

    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    report = ingest(settings, IngestConfig(), [instance])
    result, summary = report.result, report.summary
    assert [t.id for t in result.tasks] == ["acme__calc-1"] and summary.rejected == 5
    cat = Catalog(settings.catalog_path)
    assert set(cat.rejects()["source_kind"]) == {"swebench"}
    version = cat.create_task_set("swe", result.tasks, {})
    out = tmp_path / "out.jsonl"
    env = {**__import__("os").environ, "ENVFORGE_DATA_DIR": str(settings.data_dir)}
    import sys
    cli = str(Path(sys.executable).with_name("envforge"))
    proc = subprocess.run([cli, "taskset", "export-swebench", version[:12], str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["instance_id"] == "acme__calc-1"


def test_a_bundle_file_works_as_the_repository(instance, tmp_path):
    repo = tmp_path / "calc-repo"
    bundle = tmp_path / "calc.bundle"
    git(repo, "bundle", "create", str(bundle), "--all")
    (instance / "swebench.yaml").write_text(f"repos:\n  acme/calc: {bundle}\n")
    result = load_swebench([instance])
    assert [t.id for t in result.tasks] == ["acme__calc-1"] and result.rejects[0].field == "patch"
    from envforge.sources.swebench import materialize_repo

    cloned = materialize_repo(bundle)
    assert (cloned / "HEAD").exists()
    # The stored task names the bundle relative to its source, never the machine's cache path.
    assert result.tasks[0].spec.environment.repository.path == "../calc.bundle"


def test_swebench_yaml_takes_an_environment_section(instance):
    sidecar = instance / "swebench.yaml"
    sidecar.write_text(sidecar.read_text() + "environment:\n  pip: [attrs==23.2.0]\n  env: {TZ: UTC}\n")
    [task] = load_swebench([instance]).tasks
    assert task.spec.environment.pip == ["attrs==23.2.0"] and task.spec.environment.env == {"TZ": "UTC"}
    assert task.spec.metadata["environment"]["declared"] is True
    assert not Path(task.spec.environment.repository.path).is_absolute()
    sidecar.write_text(sidecar.read_text() + "  pipx: [x]\n")
    rejects = load_swebench([instance]).rejects
    assert [(Path(p.source).name, p.field) for p in rejects] == [("swebench.yaml", "environment.pipx")]


@pytest.mark.docker
def test_an_instance_loads_the_pytest_plugins_its_env_layer_installs(tmp_path, docker_client, base_image, grader):
    """asgiref's real fix as a SWE-bench instance, nothing declared: pytest-asyncio comes from its
    `tests` extra. The env layer is built at ingest, as for history candidates: the task records it and
    loads its pytest11 plugin with -p (autoload stays off), so the async FAIL_TO_PASS test can pass."""
    import shutil

    import yaml

    from envforge.config import Settings
    from envforge.sources.swebench import record_env_layers
    from envforge.sources.tickets import load_ticket_source

    project = Path(__file__).resolve().parents[1] / "task_sources" / "examples" / "real-repos" / "asgiref"
    for name in ("tickets.yaml", "github-issues.csv", "asgiref.bundle"):
        shutil.copy(project / name, tmp_path / name)
    [candidate] = load_ticket_source(tmp_path / "tickets.yaml").candidates
    f2p = yaml.safe_load((project / "expected.yaml").read_text())["tickets"]["gh-1"]["fail_to_pass"]
    (tmp_path / "swebench.yaml").write_text("repos:\n  django/asgiref: asgiref.bundle\n")
    rec = {"repo": "django/asgiref", "instance_id": "django__asgiref-1", "base_commit": candidate.workspace_commit,
           "patch": candidate.change.source_patch, "test_patch": candidate.change.test_patch,
           "problem_statement": candidate.instruction, "FAIL_TO_PASS": f2p,
           "PASS_TO_PASS": ["tests/test_sync_contextvars.py::test_sync_to_async_contextvars"]}
    (tmp_path / "instances.jsonl").write_text(json.dumps(rec) + "\n")
    settings = Settings.from_env().with_data_dir(tmp_path / "data")
    settings.ensure_dirs()
    result = load_swebench([tmp_path / "instances.jsonl"])
    assert result.rejects == [] and result.tasks[0].spec.verification.tests.plugins == []
    record_env_layers(settings, result, client=docker_client)
    assert result.rejects == [], result.rejects
    [task] = result.tasks
    assert task.spec.verification.tests.plugins == ["pytest_asyncio.plugin"]
    assert task.spec.metadata["images"]["env_plugins"] == ["pytest_asyncio.plugin"]
    assert task.spec.metadata["images"]["env_freeze"]
    image = build_task_image(docker_client, task, base_image, settings, repository_dir=repository_dir).tag
    assert grader.grade(task, image, task.reference_patch).resolved
    assert not grader.grade(task, image, "").resolved
