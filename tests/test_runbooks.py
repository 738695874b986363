"""Runbooks (Markdown) as tasks: the syntax, its errors, and a real sandbox run."""

from __future__ import annotations

from pathlib import Path

import pytest

from envforge.errors import SpecError
from envforge.sandbox.images import build_task_image
from envforge.sources.runbooks import load_runbook, load_runbooks
from tests.conftest import REPO

RUNBOOKS = REPO / "task_sources" / "runbooks"

MINIMAL = """---
id: rb-minimal
---
# Fix it

Make `state.txt` say ok.

## Files

### state.txt
```
broken
```

## Checks
```yaml
- name: ok
  run: cat state.txt
  stdout: "^ok$"
```

## Solution
```sh
echo ok > state.txt
```
"""


def write(tmp_path: Path, text: str, name: str = "rb.md") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_minimal_runbook_becomes_a_task(tmp_path):
    task = load_runbook(write(tmp_path, MINIMAL))
    assert task.id == "rb-minimal" and task.spec.source == "runbook"
    assert task.spec.instruction.startswith("# Fix it") and "state.txt" in task.spec.instruction
    assert [c.name for c in task.spec.verification.checkpoints] == ["ok"]
    assert task.spec.verification.checkpoints[0].stdout_pattern == "^ok$"
    assert task.spec.reference_solution.commands == ["echo ok > state.txt\n"]
    assert "cat > state.txt" in task.spec.environment.setup[0]


@pytest.mark.parametrize("mutate, field, fragment", [
    (lambda t: t.replace("---\nid: rb-minimal\n---\n", ""), "front matter", "starts with YAML front matter"),
    (lambda t: t.replace("id: rb-minimal", "id: rb-minimal\ncolour: blue"), "front matter.colour", "unknown field"),
    (lambda t: t.split("## Checks")[0] + "## Solution\n```sh\ntrue\n```\n", "Checks", "needs a '## Checks' section"),
    (lambda t: t.split("## Solution")[0], "Solution", "needs a '## Solution' section"),
    (lambda t: t.replace("### state.txt", "### ../outside.txt"), "Files.../outside.txt", "stay inside it"),
    (lambda t: t.replace("  run: cat state.txt\n", ""), "verification.checkpoints[0].run", "required field"),
    (lambda t: t.replace("id: rb-minimal", "id: Not Valid"), "id", "should match pattern"),
])
def test_bad_runbooks_are_rejected_with_the_field(tmp_path, mutate, field, fragment):
    with pytest.raises(SpecError) as info:
        load_runbook(write(tmp_path, mutate(MINIMAL)))
    assert any(p.field == field and fragment in p.reason for p in info.value.problems), info.value.problems


def test_bundled_runbooks_load(tmp_path):
    result = load_runbooks([RUNBOOKS])
    assert {t.id for t in result.tasks} >= {"rb-log-rotation"} and len(result.tasks) == 5
    # The bundled deliberately bad runbook (no checks) is the only reject.
    assert [(Path(p.source).name, p.field) for p in result.rejects] == [("disk-cleanup-no-checks.md", "Checks")]
    mixed = load_runbooks([RUNBOOKS, write(tmp_path, MINIMAL.replace("## Checks", "## Nope"), "bad.md")])
    assert len(mixed.tasks) == len(result.tasks) and [p.field for p in mixed.rejects] == ["Checks", "Checks"]


@pytest.mark.docker
def test_runbook_reference_passes_and_empty_fails_in_a_sandbox(docker_client, base_image, grader, settings):
    for task in load_runbooks([RUNBOOKS]).tasks:
        image = build_task_image(docker_client, task, base_image, settings).tag
        diff, notes = grader.solution_diff(task, image, "reference")
        assert notes == []
        ref = grader.grade(task, image, diff)
        assert ref.resolved, (task.id, ref.reasons, [c.output_tail for c in ref.checkpoints])
        empty = grader.grade(task, image, "")
        assert not empty.resolved, task.id
