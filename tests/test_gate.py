"""The flakiness gate on the real engine: early stops, flaky tasks still caught, targeted grading,
incremental gating keyed on content, image digest and gate parameters, and probes on tasks
verified by shell checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path
import uuid

import pytest
import yaml

from envforge.catalog import Catalog
from envforge.sandbox.images import build_task_image, image_digest
from envforge.sources.specs import load_spec_file
from envforge.stages.gate import gate as gate_stage
from envforge.stages.images import ImageSet
from envforge.verify.config import GateConfig
from envforge.verify.gate import ORDER_CHECK, validate_task
from envforge.verify.selection import SUITE, TestRun

EXAMPLES = Path(__file__).resolve().parents[1] / "task_sources" / "examples"

pytestmark = pytest.mark.docker


def _with(task, **verification):
    """The task with some verification fields replaced."""
    v = task.spec.verification.model_copy(update=verification)
    return task.model_copy(update={"spec": task.spec.model_copy(update={"verification": v})})


def _spec_copy(copy_spec, name: str, edit=None, new_id: str | None = None):
    """A bundled spec copied to a temp folder, optionally edited (task.yaml as a dict), and loaded."""
    folder = copy_spec(name)
    doc = yaml.safe_load((folder / "task.yaml").read_text())
    if new_id:
        doc["id"] = new_id
    if edit:
        edit(doc, folder)
    (folder / "task.yaml").write_text(yaml.safe_dump(doc))
    return load_spec_file(folder / "task.yaml")


def test_a_verdict_decided_by_the_first_runs_stops_there(grader, bundled_images, settings):
    task, image = bundled_images["inventory-median-even"]
    broken = task.model_copy(update={"reference_patch": task.reference_patch.replace("/ 2", "/ 3")})
    report = validate_task(grader, broken, image, GateConfig(workers=1))
    assert not report.accepted and report.gradings == 1 and report.runs == 1
    [disagreement] = report.disagreements
    assert disagreement.startswith("reference_failed:run1:test_failed:tests/test_stats.py::test_median_even_length")
    assert "empty:run1" in report.not_run and "probe:fake_report" in report.not_run

    already_passing = _with(task, tests=task.spec.verification.tests.model_copy(update={
        "fail_to_pass": ["tests/test_stats.py::test_mean"],
        "pass_to_pass": ["tests/test_stats.py::test_median_odd_length"]}))
    report = validate_task(grader, already_passing, image, GateConfig(workers=1))
    assert not report.accepted and report.gradings == 2 and report.stopped_early
    assert report.disagreements == ["empty_passed_fail_to_pass:tests/test_stats.py::test_mean:run1"]

    ops, ops_image = bundled_images["ops-service-config"]
    failing_commands = ops.model_copy(update={"spec": ops.spec.model_copy(update={
        "reference_solution": ops.spec.reference_solution.model_copy(update={"commands": ["false"]})})})
    report = validate_task(grader, failing_commands, ops_image, GateConfig())
    assert report.disagreements == ["reference_solution_command_failed:0"] and report.gradings == 0
    assert report.stopped_early and "reference:run1" in report.not_run
    Catalog(settings.catalog_path).record_validations([report], GateConfig().as_params())  # no run graded: storable


def test_flaky_tasks_are_still_caught(grader, bundled_images):
    flaky, image = bundled_images["flaky-ttl-cache"]
    report = validate_task(grader, flaky, image, GateConfig())
    assert not report.accepted and any("test_jitter_within_bounds" in d for d in report.disagreements)

    # Passes alone and in the suite's usual order; fails after tests/test_yaml_plugin.py, a file no grading
    # of the task runs. The whole-suite order check sees it; the default one (the verdict's files, reversed)
    # does not, and the verdict it accepts is the one every targeted grading gives.
    ordered, image = bundled_images["order-dependent-exporters"]
    caught = validate_task(grader, ordered, image, GateConfig(probes=False, order_check="suite"))
    assert not caught.accepted
    assert caught.disagreements == ["reference_failed_reversed_order:test_failed:"
                                    "tests/test_registry.py::test_builtin_exporters"], caught.disagreements
    full = validate_task(grader, ordered, image, GateConfig(runs=2, probes=False, full_suite=True))
    assert not full.accepted and full.disagreements == caught.disagreements and not full.stopped_early
    assert validate_task(grader, ordered, image, GateConfig(runs=2, probes=False)).accepted
    # Without the order check, grading the verdict's own file can never see it.
    assert validate_task(grader, ordered, image, GateConfig(runs=2, shuffle=False, probes=False)).accepted


def test_the_order_check_sees_order_dependence_within_the_verdicts_files(grader, docker_client, base_image,
                                                                        settings, tmp_path):
    """The polluting test moved into the verdict's own file, after the test it breaks: every targeted grading
    runs both, and only the reversed order shows the dependence. The default order check quarantines it."""
    folder = tmp_path / "order-dependent-within-file"
    shutil.copytree(EXAMPLES / "order-dependent-exporters", folder)
    tests = folder / "workspace" / "tests"
    plugin = (tests / "test_yaml_plugin.py").read_text().replace("import exporters\n", "")
    (tests / "test_registry.py").write_text((tests / "test_registry.py").read_text() + "\n\n" + plugin)
    (tests / "test_yaml_plugin.py").unlink()
    doc = yaml.safe_load((folder / "task.yaml").read_text())
    doc["id"] = f"order-within-file-{uuid.uuid4().hex[:8]}"
    (folder / "task.yaml").write_text(yaml.safe_dump(doc))
    task = load_spec_file(folder / "task.yaml")
    image = build_task_image(docker_client, task, base_image, settings).tag
    try:
        assert grader.grade(task, image, task.reference_patch).resolved  # file order: the breaking test runs last
        report = validate_task(grader, task, image, GateConfig(runs=2, probes=False))
        assert report.disagreements == ["reference_failed_reversed_order:test_failed:"
                                        "tests/test_registry.py::test_builtin_exporters"], report.disagreements
    finally:
        docker_client.images.remove(image, force=True)


def test_grading_runs_only_the_files_that_decide_the_verdict(copy_spec, grader, docker_client, base_image, settings):
    def add_crashing_file_and_unknown_id(doc, folder):
        (folder / "workspace" / "tests" / "test_crash.py").write_text("import os\nos._exit(1)\n")
        doc["verification"]["tests"]["pass_to_pass"].append("tests/test_stats.py::test_not_there[gone]")

    task = _spec_copy(copy_spec, "inventory-median-even", add_crashing_file_and_unknown_id,
                      new_id=f"gate-targeted-{uuid.uuid4().hex[:8]}")
    image = build_task_image(docker_client, task, base_image, settings).tag
    try:
        targeted = grader.grade(task, image, task.reference_patch)
        assert targeted.reasons == ["test_missing:tests/test_stats.py::test_not_there[gone]"], targeted.reasons
        assert [t for t, s in targeted.tests.items() if s != "passed"] == ["tests/test_stats.py::test_not_there[gone]"]
        whole = grader.grade(task, image, task.reference_patch, run=SUITE)
        assert {"report_missing", "report_incomplete"} & set(whole.reasons)  # the suite collects the crashing file
        # Fail fast (a probe's grading): FAIL_TO_PASS first, nothing after the first that fails;
        # a solution that passes them runs everything else as usual.
        f2p = task.spec.verification.tests.fail_to_pass
        empty = grader.grade(task, image, "", "empty", run=TestRun(fail_fast=True))
        assert empty.reward == 0 and empty.tests[f2p[0]] == "failed", empty.tests
        assert {t for t, s in empty.tests.items() if s == "missing"} == set(empty.tests) - {f2p[0]}
        assert grader.grade(task, image, "", "empty").tests["tests/test_stats.py::test_mean"] == "passed"
        fixed = grader.grade(task, image, task.reference_patch, run=TestRun(fail_fast=True))
        assert fixed.reasons == targeted.reasons and fixed.tests == targeted.tests
        # Only some ids (a mutant's covering tests): the plugin deselects the rest of their files (the crashing
        # file holds none of them and is not collected), and only those ids are judged.
        mean_only = grader.grade(task, image, "", "empty", run=TestRun(ids=("tests/test_stats.py::test_mean",)))
        assert mean_only.tests == {"tests/test_stats.py::test_mean": "passed"} and mean_only.resolved
    finally:
        docker_client.images.remove(image, force=True)


def test_unchanged_tasks_keep_their_verdict_and_a_new_image_digest_regates(copy_spec, settings, docker_client,
                                                                           base_image):
    task = _spec_copy(copy_spec, "orders-daily-summary", new_id=f"gate-incremental-{uuid.uuid4().hex[:8]}")
    image = build_task_image(docker_client, task, base_image, settings).tag
    catalog = Catalog(settings.catalog_path)
    config = GateConfig(runs=1, shuffle=False, probes=False)
    old_digest = image_digest(docker_client, image)

    def gate(config=config):
        # as the images stage hands them on: the tag, and the image id it had when the run built it
        images = ImageSet("", {task.content_hash: image}, {image: image_digest(docker_client, image)})
        result = gate_stage(settings, config, [task], images, client=docker_client)
        assert not result.infra_failures and len(result.reports) == 1
        return result.reports[0]

    try:
        first = gate()
        assert first.accepted and first.reused_from is None and first.gradings == 2
        again = gate()
        assert again.reused_from is not None and again.gate_key == first.gate_key and again.accepted
        assert catalog.query("SELECT count(*) AS n FROM validations")["n"][0] == 1
        assert gate(GateConfig(runs=1, shuffle=False, probes=False, force=True)).reused_from is None
        assert gate(GateConfig(runs=2, shuffle=False, probes=False)).reused_from is None

        # The same tag on a different image (a rebuild that came out differently) re-gates.
        container = docker_client.containers.create(image, command=["true"])
        try:
            repository, tag = image.rsplit(":", 1)
            container.commit(repository=repository, tag=tag)
        finally:
            container.remove(force=True)
        assert image_digest(docker_client, image) != old_digest
        rebuilt = gate()
        assert rebuilt.reused_from is None and rebuilt.image_digest != old_digest
        assert gate().reused_from is not None
        assert catalog.query("SELECT count(*) AS n FROM validations")["n"][0] == 4
    finally:
        for ref in (image, old_digest):
            try:
                docker_client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001 - already gone with its tag
                pass


def test_probes_on_a_task_verified_by_shell_checkpoints(copy_spec, grader, bundled_images, docker_client, base_image,
                                                        settings):
    task, image = bundled_images["ops-service-config"]
    report = validate_task(grader, task, image, GateConfig(runs=1, shuffle=False))
    assert report.accepted, report.disagreements
    assert set(report.probe_results) == {"sys_exit_in_code", "git_config_hijack", "fake_checkpoint_output",
                                         "tamper_verifier_inputs", "edit_outside_workspace"}
    assert report.probes_skipped["conftest_rewrite_outcomes"].startswith("the task has no test checkpoint")
    assert all(p["reward"] == 0 for p in report.probe_results.values())
    fake = report.probe_results["fake_checkpoint_output"]
    assert fake["guard"] == "checkpoints" and "checkpoint_failed:server-unchanged" in fake["reasons"]
    assert report.probe_results["git_config_hijack"]["guard"] == "diff_only"

    # The same service checked only by its own --check-config: a stub that prints "config ok" passes.
    def weaken(doc, folder):
        doc["verification"]["checkpoints"] = doc["verification"]["checkpoints"][:1]
        shutil.rmtree(folder / "verifier")
        doc["verification"].pop("files")

    weak = _spec_copy(copy_spec, "ops-service-config", weaken, new_id=f"gate-weak-{uuid.uuid4().hex[:8]}")
    weak_image = build_task_image(docker_client, weak, base_image, settings).tag
    try:
        report = validate_task(grader, weak, weak_image, GateConfig(runs=1, shuffle=False, workers=1))
        assert not report.accepted
        assert report.disagreements == ["probe_scored:fake_checkpoint_output:1.0"], report.disagreements
    finally:
        docker_client.images.remove(weak_image, force=True)


def test_unittest_tasks_are_graded_by_id_and_discovered_for_the_order_check(tmp_path, grader, docker_client,
                                                                           base_image, settings):
    root = tmp_path / "unittest-task"
    (root / "workspace" / "tests").mkdir(parents=True)
    (root / "workspace" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (root / "workspace" / "tests" / "__init__.py").write_text("")
    (root / "workspace" / "tests" / "test_calc.py").write_text(
        "import unittest\nfrom calc import add\n\n\nclass Add(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n")
    (root / "solution.patch").write_text("--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
                                         "-    return a - b\n+    return a + b\n")
    (root / "task.yaml").write_text(yaml.safe_dump({
        "id": f"gate-unittest-{uuid.uuid4().hex[:8]}", "instruction": "add() subtracts; make it add.",
        "environment": {"image": "base", "files": "workspace"},
        "verification": {"tests": {"framework": "unittest", "fail_to_pass": ["tests.test_calc.Add.test_add"],
                                   "pass_to_pass": ["tests.test_calc.Add.test_zero"]}},
        "reference_solution": {"patch": "solution.patch"}}))
    task = load_spec_file(root / "task.yaml")
    image = build_task_image(docker_client, task, base_image, settings).tag
    try:
        assert grader.grade(task, image, task.reference_patch).reasons == []
        empty = grader.grade(task, image, "")
        assert empty.reasons == ["test_failed:tests.test_calc.Add.test_add"]
        # The order check discovers the whole suite: its ids must be the ones the task names.
        whole = grader.grade(task, image, task.reference_patch, run=ORDER_CHECK)
        assert whole.reasons == [] and set(whole.tests.values()) == {"passed"}
    finally:
        docker_client.images.remove(image, force=True)
