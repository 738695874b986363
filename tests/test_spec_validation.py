"""Spec validation: every malformed spec is rejected with the file, the field and the problem."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml

from envforge.errors import SpecError
from envforge.sources.specs import load_spec_file, load_specs
from envforge.task import task_spec_json_schema
from tests.conftest import BUNDLED_SPECS, REPO

GOOD = {
    "id": "tiny-task",
    "instruction": "Make the checkpoint pass please.",
    "verification": {"checkpoints": [{"name": "ok", "run": "test -f done"}]},
    "reference_solution": {"commands": ["touch done"]},
}


def write_spec(dir_: Path, data, name: str = "task.yaml") -> Path:
    dir_.mkdir(parents=True, exist_ok=True)
    path = dir_ / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def problems_of(path: Path) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    for p in info.value.problems:
        assert p.source == str(path.resolve())
    return [(p.field, p.reason) for p in info.value.problems]


def test_good_spec_loads(tmp_path):
    task = load_spec_file(write_spec(tmp_path, GOOD))
    assert task.id == "tiny-task"
    assert task.spec.environment.network.mode == "none"
    assert len(task.content_hash) == 64


def test_bundled_specs_are_valid():
    result = load_specs([BUNDLED_SPECS])
    assert result.rejects == []
    assert {t.id for t in result.tasks} >= {"inventory-median-even", "ops-service-config", "orders-daily-summary"}
    kinds = {("tests" if t.spec.verification.tests else "checkpoints") for t in result.tasks}
    assert kinds == {"tests", "checkpoints"}


@pytest.mark.parametrize("mutate, field, fragment", [
    (lambda d: d.pop("instruction"), "instruction", "required field is missing"),
    (lambda d: d.update(id="Bad ID!"), "id", "should match pattern"),
    (lambda d: d.update(instrucion="typo"), "instrucion", "unknown field"),
    (lambda d: d["reference_solution"].update(patch="x.patch"), "reference_solution", "exactly one"),
    (lambda d: d.update(verification={}), "verification", "needs 'tests' or at least one"),
    (lambda d: d["verification"]["checkpoints"][0].update(stdout_pattern="(unclosed"),
     "verification.checkpoints[0].stdout_pattern", "not a valid regular expression"),
    (lambda d: d.update(environment={"limits": {"memory_mb": 1}}), "environment.limits.memory_mb",
     "greater than or equal to 64"),
    (lambda d: d.update(environment={"network": {"allow": ["pypi.org:443"]}}), "environment.network",
     "need mode: allowlist"),
    (lambda d: d.update(verification={"tests": {"fail_to_pass": []}}), "verification.tests.fail_to_pass",
     "at least one test id"),
    (lambda d: d.update(max_turns=0), "max_turns", "greater than or equal to 1"),
    (lambda d: d.update(environment={"image": "base", "dockerfile": "Dockerfile"}), "environment",
     "either 'image' or 'dockerfile'"),
])
def test_invalid_field_is_named(tmp_path, mutate, field, fragment):
    data = json.loads(json.dumps(GOOD))
    mutate(data)
    problems = problems_of(write_spec(tmp_path, data))
    assert any(f == field and fragment in reason for f, reason in problems), problems


def test_missing_referenced_files(tmp_path):
    data = dict(GOOD, environment={"files": "nope"}, reference_solution={"patch": "missing.patch"})
    problems = dict(problems_of(write_spec(tmp_path, data)))
    assert "dir 'nope' not found" in problems["environment.files"]
    assert "file 'missing.patch' not found" in problems["reference_solution.patch"]


def test_patch_that_is_not_a_diff(tmp_path):
    (tmp_path / "fix.patch").write_text("just some text\n")
    problems = problems_of(write_spec(tmp_path, dict(GOOD, reference_solution={"patch": "fix.patch"})))
    assert problems == [("reference_solution.patch", "file is not a unified diff (no '---' or 'diff --git' header)")]


def test_yaml_syntax_error_names_line(tmp_path):
    path = write_spec(tmp_path, "id: x\ninstruction: [unclosed\n")
    [(field, reason)] = problems_of(path)
    assert field == "" and "not valid YAML at line" in reason


def test_non_mapping_spec(tmp_path):
    [(field, reason)] = problems_of(write_spec(tmp_path, "- a\n- b\n"))
    assert "must be a YAML mapping, got list" in reason


def test_several_problems_reported_at_once(tmp_path):
    data = dict(GOOD, id="UPPER", max_turns=-1, colour="blue")
    fields = {f for f, _ in problems_of(write_spec(tmp_path, data))}
    assert {"id", "max_turns", "colour"} <= fields


def test_load_specs_keeps_good_records_and_rejects_bad(tmp_path):
    write_spec(tmp_path / "a", GOOD)
    write_spec(tmp_path / "b", dict(GOOD, id="other-task", max_turns="many"))
    write_spec(tmp_path / "c", GOOD)  # duplicate id
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.yaml").write_text("not: a spec\n")  # not named task.yaml: ignored
    result = load_specs([tmp_path, tmp_path / "does-not-exist"])
    assert [t.id for t in result.tasks] == ["tiny-task"]
    reasons = {(Path(p.source).parent.name, p.field): p.reason for p in result.rejects}
    assert ("b", "max_turns") in reasons
    assert "duplicate task id 'tiny-task'" in reasons[("c", "id")]
    missing = [p for p in result.rejects if p.source.endswith("does-not-exist")]
    assert [(p.field, p.reason) for p in missing] == [("", "no such file or directory")]


def test_content_hash_tracks_files(tmp_path, copy_spec):
    spec_dir = copy_spec("inventory-median-even")
    before = load_spec_file(spec_dir / "task.yaml").content_hash
    assert load_spec_file(spec_dir / "task.yaml").content_hash == before
    (spec_dir / "workspace" / "inventory" / "notes.txt").write_text("# changed\n")
    assert load_spec_file(spec_dir / "task.yaml").content_hash != before


def test_published_json_schema_is_current_and_accepts_bundled_specs():
    published = json.loads((REPO / "docs" / "task-spec.schema.json").read_text())
    assert published == task_spec_json_schema(), "run `envforge schema -o docs/task-spec.schema.json`"
    for spec in BUNDLED_SPECS.rglob("task.yaml"):
        jsonschema.validate(yaml.safe_load(spec.read_text()), published)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(GOOD, unknown=1), published)


def test_repository_snapshot_commit_must_exist(tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"],
                   check=True)
    ok = dict(GOOD, environment={"repository": {"path": "repo", "commit": "HEAD"}})
    assert load_spec_file(write_spec(tmp_path, ok)).workspace_digest.startswith("git:")
    bad = dict(GOOD, environment={"repository": {"path": "repo", "commit": "deadbeef"}})
    [(field, reason)] = problems_of(write_spec(tmp_path, bad, "bad.task.yaml"))
    assert field == "environment.repository.commit" and "not found" in reason
