"""Grading on a pristine copy, on the real engine: rewards, reasons, guards and determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envforge.verify.config import GateConfig
from envforge.verify.gate import probe_diff, validate_task
from envforge.verify.probes import STANDARD_PROBES, Probe, guard_for
from envforge.verify.protect import split_diff
from tests.conftest import BUNDLED_SPECS

pytestmark = pytest.mark.docker

BUNDLED = ["inventory-median-even", "ops-service-config", "orders-daily-summary"]


@pytest.mark.parametrize("task_id", BUNDLED)
def test_reference_resolves_and_empty_fails(grader, bundled_images, task_id):
    task, image = bundled_images[task_id]
    diff, notes = grader.solution_diff(task, image, "reference")
    assert notes == [] and diff.strip()
    ref = grader.grade(task, image, diff, "reference")
    assert ref.resolved and ref.reward == 1.0 and ref.reasons == [], ref.reasons
    empty = grader.grade(task, image, "", "empty")
    assert not empty.resolved and empty.reward == 0.0 and empty.reasons
    if task.spec.verification.tests:
        assert set(ref.tests.values()) == {"passed"}
        assert {f"test_failed:{t}" for t in task.spec.verification.tests.fail_to_pass} <= set(empty.reasons)


@pytest.mark.parametrize("task_id", BUNDLED)
def test_grading_is_deterministic(grader, bundled_images, task_id):
    task, image = bundled_images[task_id]
    diff, _ = grader.solution_diff(task, image, "reference")
    for candidate in (diff, ""):
        results = [grader.grade(task, image, candidate).comparable() for _ in range(20)]
        assert all(r == results[0] for r in results), task_id


@pytest.mark.parametrize("probe", STANDARD_PROBES, ids=lambda p: p.name)
def test_every_hack_probe_scores_zero(grader, bundled_images, probe):
    applied = 0
    for task_id in BUNDLED:
        task, image = bundled_images[task_id]
        if probe.applies(task) is not None:
            continue
        reference_paths = tuple(p for s in split_diff(grader.solution_diff(task, image, "reference")[0])
                                for p in s.paths)
        diff = probe_diff(grader, task, image, probe, reference_paths)
        result = grader.grade(task, image, diff, probe.name)
        assert result.reward == 0.0 and not result.resolved, (task_id, probe.name, result.reasons)
        assert guard_for(result, diff) != "none"
        applied += 1
    assert applied, f"{probe.name} applies to none of the bundled specs"


def test_the_probes_are_real_attacks_when_guards_are_off(grader, bundled_images):
    """Without protected paths, a conftest that rewrites outcomes does get full reward: the guard matters."""
    task, image = bundled_images["inventory-median-even"]
    spec = task.spec.model_copy(update={"verification": task.spec.verification.model_copy(
        update={"protected_paths": []})})
    unguarded = task.model_copy(update={"spec": spec})
    diff = probe_diff(grader, unguarded, image, Probe("conftest_rewrite_outcomes", ""))
    assert grader.grade(unguarded, image, diff).reward == 1.0
    assert grader.grade(task, image, diff).reward == 0.0


def test_protected_changes_are_ignored_or_zeroed(grader, bundled_images):
    task, image = bundled_images["inventory-median-even"]
    fix = task.reference_patch
    cheat = fix + ("diff --git a/tests/test_extra.py b/tests/test_extra.py\nnew file mode 100644\n--- /dev/null\n"
                   "+++ b/tests/test_extra.py\n@@ -0,0 +1 @@\n+def test_x(): pass\n")
    ignored = grader.grade(task, image, cheat)
    assert ignored.resolved and ignored.reasons == ["protected_path_modified:tests/test_extra.py"]
    strict_v = task.spec.verification.model_copy(update={"zero_reward_on_protected_change": True})
    strict = task.model_copy(update={"spec": task.spec.model_copy(update={"verification": strict_v})})
    zeroed = grader.grade(strict, image, cheat)
    assert zeroed.reward == 0.0 and not zeroed.resolved


def test_partial_credit_and_unappliable_patch(grader, bundled_images):
    task, image = bundled_images["inventory-median-even"]
    partial_v = task.spec.verification.model_copy(update={"partial_credit": True})
    partial = task.model_copy(update={"spec": task.spec.model_copy(update={"verification": partial_v})})
    empty = grader.grade(partial, image, "")
    assert empty.reward == pytest.approx(6 / 8) and not empty.resolved
    broken = grader.grade(task, image, "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert broken.reasons == ["patch_failed"] and broken.reward == 0.0 and broken.patch_method is None


def test_flaky_task_is_quarantined_and_bundled_tasks_pass_the_gate(grader, bundled_images):
    flaky, image = bundled_images["flaky-ttl-cache"]
    report = validate_task(grader, flaky, image, GateConfig(runs=5, shuffle=True, probes=False))
    assert not report.accepted
    assert any("test_jitter_within_bounds" in d for d in report.disagreements), report.disagreements
    for task_id in BUNDLED:
        task, image = bundled_images[task_id]
        ok = validate_task(grader, task, image, GateConfig(runs=2, shuffle=True, probes=False))
        assert ok.accepted, (task_id, ok.disagreements)


def test_verify_cli_json_result_object(tmp_path, docker_client):
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(tmp_path / "data")}
    cli = str(Path(sys.executable).with_name("envforge"))
    spec = BUNDLED_SPECS / "ops-service-config"
    cmds = tmp_path / "cmds.sh"
    cmds.write_text("sed -i -e 's/^port = 80$/port = 8080/' -e 's/^workers = two$/workers = 2/' svc/app.ini\n"
                    "mkdir -p var/log/order-status && touch var/log/order-status/.keep\n")
    proc = subprocess.run([cli, "verify", "--task", str(spec), "--commands", str(cmds), "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert {"reward", "resolved", "tests", "checkpoints", "reasons", "infra_error"} <= set(doc)
    assert doc["reward"] == 1.0 and doc["infra_error"] is None
    patch = tmp_path / "bad.patch"
    patch.write_text((BUNDLED_SPECS / "inventory-median-even" / "solution.patch").read_text().replace("/ 2", "/ 3"))
    proc = subprocess.run([cli, "verify", "--task", str(BUNDLED_SPECS / "inventory-median-even"), "--patch",
                           str(patch), "--json"], env=env, capture_output=True, text=True, timeout=300)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["reward"] == 0.0
    assert "test_failed:tests/test_stats.py::test_median_even_length" in doc["reasons"]


def test_crafted_diff_cannot_smuggle_protected_changes(grader, bundled_images):
    """A hunkless git section followed by junk and a plain patch (parser confusion), and a
    .git/config write: the post-apply tree check restores them, whatever the parser saw."""
    task, image = bundled_images["inventory-median-even"]
    conftest = ("import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    lines = conftest.splitlines()
    sneaky = ("diff --git a/e b/e\nnew file mode 100644\nindex 0000000..e69de29\njunk\n"
              "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1," + str(len(lines)) + " @@\n"
              + "".join(f"+{ln}\n" for ln in lines))
    result = grader.grade(task, image, sneaky)
    assert result.reward == 0.0 and "protected_path_modified:conftest.py" in result.reasons, result.reasons


def test_grader_files_are_read_only_to_commands(docker_client, bundled_images):
    from envforge.sandbox.container import Sandbox
    from envforge.verify.checkpoints import RUNNER_DIR, install_verifier_files

    task, image = bundled_images["ops-service-config"]
    with Sandbox.start(docker_client, image) as sb:
        install_verifier_files(sb, task)
        assert sb.exec(f"cat {RUNNER_DIR}/envforge_reporter.py >/dev/null").exit_code == 0
        assert sb.exec(f"echo pwned > {RUNNER_DIR}/envforge_reporter.py").exit_code != 0
        assert sb.exec("echo x > /run/envforge-verifier/verifier/healthcheck.py").exit_code != 0
        assert sb.exec("touch /run/envforge-verifier/new").exit_code != 0
        sb.reset()
        assert sb.exec("ls -A /run/envforge-verifier").text() == ""  # wiped between uses
