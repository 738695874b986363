"""The gate's pieces without Docker: what a grading runs, which probes apply and what they do,
the verdict key, and batch grading (sharing copies, stopping early, retrying faults) on a fake grader."""

from __future__ import annotations

import json
import threading
import time

import pytest

from envforge.errors import InfraError
from envforge.sources.runbooks import load_runbook
from envforge.sources.specs import load_spec_file
from envforge.verify.batch import Grading, grade_batch
from envforge.verify.config import GateConfig
from envforge.verify.gate import GateReport, _plan, gate_key, mutant_timeout_s, order_check_is_a_run
from envforge.verify.grader import GradedCopy, PreparedDiff
from envforge.verify.matching_text import matching_text
from envforge.verify.probes import STANDARD_PROBES, scripts_run, verifier_inputs, applicable_probes
from envforge.verify.result import VerificationResult
from envforge.verify.selection import SUITE, TARGETED, TRACE_OUT, TestRun, judged_ids, selection_env
from tests.conftest import BUNDLED_SPECS, REPO


def _spec(name: str):
    return load_spec_file(BUNDLED_SPECS / name / "task.yaml")


def test_targeted_runs_name_the_files_holding_the_required_ids():
    check = _spec("inventory-median-even").spec.verification.tests
    env = selection_env(check, TARGETED)
    assert json.loads(env["ENVFORGE_TEST_FILES"]) == ["tests/test_stats.py", "tests/test_stock.py"]
    assert "ENVFORGE_TEST_ORDER" not in env
    assert selection_env(check, SUITE) == {}
    assert selection_env(check, TestRun("suite", "reverse")) == {"ENVFORGE_TEST_ORDER": "reverse"}


def test_fail_fast_runs_name_the_fail_to_pass_ids_for_pytest_only():
    check = _spec("inventory-median-even").spec.verification.tests
    env = selection_env(check, TestRun(fail_fast=True))
    assert json.loads(env["ENVFORGE_FAIL_FAST"]) == check.fail_to_pass
    assert json.loads(env["ENVFORGE_TEST_FILES"]) == ["tests/test_stats.py", "tests/test_stock.py"]
    assert TestRun(fail_fast=True).without_fail_fast() == TARGETED
    assert "ENVFORGE_FAIL_FAST" not in selection_env(check.model_copy(update={"framework": "unittest"}),
                                                     TestRun(fail_fast=True))
    huge = check.model_copy(update={"fail_to_pass": [f"tests/test_stats.py::test_{i:06d}" for i in range(3000)]})
    assert "ENVFORGE_FAIL_FAST" not in selection_env(huge, TestRun(fail_fast=True))  # too big for one variable


def test_a_run_of_some_ids_names_them_and_their_files_and_judges_only_them():
    check = _spec("inventory-median-even").spec.verification.tests
    some = (check.pass_to_pass[0],)
    env = selection_env(check, TestRun(ids=some))
    assert json.loads(env["ENVFORGE_TEST_IDS"]) == list(some)
    assert json.loads(env["ENVFORGE_TEST_FILES"]) == [some[0].split("::")[0]]
    assert judged_ids(check, TestRun(ids=some)) == list(some) and judged_ids(check, TARGETED) == check.ids
    huge = tuple(f"tests/test_stats.py::test_{i:06d}" for i in range(3000))
    assert "ENVFORGE_TEST_IDS" not in selection_env(check, TestRun(ids=huge))  # the files run in full
    traced = selection_env(check, TestRun(trace=("/workspace/calc.py",)))
    assert json.loads(traced["ENVFORGE_TRACE_CALLS"]) == {"files": ["/workspace/calc.py"], "out": TRACE_OUT}


@pytest.mark.parametrize("pattern", [r"^healthy port=8080$", r"\Aid,email\n1,a@b\.com\n\Z", r"^EUR \d+ x{2,3}(a|b)$",
                                     r"[^\d\s]z", r"^contract ok: 8 rows$", r"(ab)\1"])
def test_matching_text_matches(pattern):
    import re

    text = matching_text(pattern)
    assert text is not None and re.search(pattern, text, re.MULTILINE)


def test_probes_that_apply_depend_on_how_the_task_is_verified():
    applies, skipped = applicable_probes(_spec("inventory-median-even"))
    assert len(applies) + len(skipped) == len(STANDARD_PROBES)
    assert {"fake_checkpoint_output", "tamper_verifier_inputs"} == set(skipped)
    applies, skipped = applicable_probes(_spec("ops-service-config"))
    assert [p.name for p in applies] == ["sys_exit_in_code", "git_config_hijack", "fake_checkpoint_output",
                                         "tamper_verifier_inputs", "edit_outside_workspace"]
    assert all(why for why in skipped.values())


def test_checkpoint_probes_target_what_the_checks_run_and_read():
    assert scripts_run("python3 svc/server.py --check-config") == ["svc/server.py"]
    assert scripts_run("./bin/deploy.sh && cat var/last-deploy") == ["bin/deploy.sh"]
    assert scripts_run("git diff --quiet HEAD -- svc/server.py") == []
    task = _spec("orders-daily-summary")
    assert "data/orders.csv" in verifier_inputs(task, [])
    assert "data/orders.csv" not in verifier_inputs(task, ["data/orders.csv"])
    runbook = load_runbook(REPO / "task_sources" / "runbooks" / "log-rotation.md")
    script = [p for p in STANDARD_PROBES if p.name == "tamper_verifier_inputs"][0].script(
        runbook, ["logs/app.log", "logs/app.log.1", "logs/app.log.3", "bin/rotate-logs.sh"])
    assert script == "true"  # every file the checks read is an output of the reference


def test_the_gate_key_changes_with_content_image_and_parameters():
    task = _spec("inventory-median-even")
    key = gate_key(task, "sha256:aaa", GateConfig())
    # how long gating takes does not change verdicts
    assert key == gate_key(task, "sha256:aaa", GateConfig(workers=4, concurrency=1, force=True))
    assert key != gate_key(task, "sha256:bbb", GateConfig())
    assert key != gate_key(task, "sha256:aaa", GateConfig(runs=3))
    assert key != gate_key(task, "sha256:aaa", GateConfig(full_suite=True))
    other = task.model_copy(update={"content_hash": "0" * 64})
    assert key != gate_key(other, "sha256:aaa", GateConfig())
    # mutants graded in full (the code path before fail fast) is a parameter of its own, absent by default
    assert "mutant_fail_fast" not in GateConfig().as_params()
    assert GateConfig(mutant_fail_fast=False).as_params()["mutant_fail_fast"] is False
    assert key != gate_key(task, "sha256:aaa", GateConfig(mutant_fail_fast=False))
    # a right but slow mutant counts as killed under a lower limit: the limit is part of the verdict
    assert key != gate_key(task, "sha256:aaa", GateConfig(mutant_timeout_min_s=60))


def test_a_mutants_time_limit_is_four_times_the_slowest_given_grading_at_least_the_floor():
    assert mutant_timeout_s(GateConfig(), [0.4, 0.9]) == GateConfig().mutant_timeout_min_s == 15.0
    assert mutant_timeout_s(GateConfig(), [2.0, 3.5]) == 15.0
    assert mutant_timeout_s(GateConfig(), [2.0, 29.0]) == 116.0
    assert mutant_timeout_s(GateConfig(mutant_timeout_min_s=60), []) == 60.0
    with pytest.raises(ValueError, match="mutant_timeout_min_s"):
        GateConfig(mutant_timeout_min_s=0)


def test_the_order_check_is_one_of_the_reference_runs_in_the_default_gate():
    task = _spec("inventory-median-even")

    def plan(config):
        return [(g.name, g.run.scope) for g in _plan(task, "fix", config, None, "img", GateReport("t", "h", False))]

    # Default: 4 targeted reference runs and the order check (5 gradings of every required test, as
    # many as the empty solution's), the first reference and empty runs and the order check first. The
    # order check reverses the verdict's files; `order_check: suite` reverses the whole suite.
    default = plan(GateConfig(probes=False))
    assert default[:3] == [("reference:run1", "targeted"), ("empty:run1", "targeted"), ("reference:order", "targeted")]
    suite = plan(GateConfig(probes=False, order_check="suite"))
    assert suite == [(n, "suite" if n == "reference:order" else s) for n, s in default]
    assert GateConfig().as_params()["order_check"] == "files"
    with pytest.raises(ValueError, match="GateConfig.order_check: must be one of files, suite, got 'x'"):
        GateConfig(order_check="x")
    assert sum(n.startswith("reference:run") for n, _ in default) == 4 and order_check_is_a_run(GateConfig())
    assert sum(n.startswith("empty:run") for n, _ in default) == 5 and default[-1] == ("empty:run5", "targeted")
    # The full-suite gate (the gate as it was) grades it once more; so does a gate of one run (the
    # reference stays graded once the way rollouts grade it); without the order check, N runs.
    full = plan(GateConfig(probes=False, full_suite=True))
    assert sum(n.startswith("reference:run") for n, _ in full) == 5 and {s for _, s in full} == {"suite"}
    assert not order_check_is_a_run(GateConfig(full_suite=True))
    assert plan(GateConfig(runs=1, probes=False)) == [("reference:run1", "targeted"), ("empty:run1", "targeted"),
                                                      ("reference:order", "targeted")]
    assert sum(n.startswith("reference:run") for n, _ in plan(GateConfig(runs=3, shuffle=False, probes=False))) == 3


def test_the_repeated_runs_start_fresh_interpreters_and_the_probes_may_fork():
    """Forks of one preloaded interpreter share the string hash seed (sandbox/forkserver.py), so the runs
    repeated to see what varies between runs start fresh; a probe is graded once, and may be a fork."""
    task = _spec("inventory-median-even")
    plan = _plan(task, "fix", GateConfig(), None, "img", GateReport("t", "h", False))
    fresh = {g.name for g in plan if g.run.fresh_interpreter}
    assert fresh == {g.name for g in plan if g.name.startswith(("reference:", "empty:"))} and len(fresh) == 10
    probes = [g for g in plan if g.name.startswith("probe:")]
    assert probes and not any(g.run.fresh_interpreter for g in probes)
    assert TestRun(fail_fast=True, fresh_interpreter=True).without_fail_fast() == TestRun(fresh_interpreter=True)


class FakeGrader:
    """Grades a diff as resolved when it contains 'fix'; counts copies; can fail once with an infra fault."""

    def __init__(self, fail_first: bool = False, delay_s: float = 0.0):
        self.copies: list[tuple[str, TestRun]] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._fail = fail_first
        self.delay_s = delay_s

    def prepare(self, task, diff):
        kept = "\n".join(line for line in diff.splitlines() if not line.startswith("protected"))
        return PreparedDiff(kept, tuple(line for line in diff.splitlines() if line.startswith("protected")))

    def run_copy(self, task, image, kept, run=TARGETED):
        with self._lock:
            if self._fail:
                self._fail = False
                raise InfraError("agent_died", "boom")
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight -= 1
            self.copies.append((kept, run))
        ok = "fix" in kept
        return GradedCopy("empty" if not kept else "git_apply", {}, [], [] if ok else ["test_failed:t"], 0.01)

    def result(self, task, image, solution, prepared, copy):
        return VerificationResult(task.id if task else "t", solution, 1.0 if not copy.failures else 0.0,
                                  not copy.failures, reasons=[*map("protected_path_modified:{}".format,
                                                                   prepared.touched), *copy.failures])


class _Task:
    id = "t"


def test_batch_shares_copies_runs_in_parallel_and_stops_early():
    grader = FakeGrader(delay_s=0.05)
    gradings = [Grading("reference:run1", "fix", share=False), Grading("empty:run1", "", share=False),
                Grading("reference:run2", "fix", share=False),
                Grading("probe:a", lambda: "protected x"), Grading("probe:b", "protected y"),
                Grading("probe:c", "hack"), Grading("probe:d", "hack\nprotected z"),
                Grading("probe:e", "hack", run=SUITE)]
    out = grade_batch(grader, _Task(), "img", gradings, workers=3)
    assert list(out.results) == [g.name for g in gradings] and not out.not_run
    assert out.results["reference:run2"].resolved and out.results["probe:a"].reasons == [
        "protected_path_modified:protected x", "test_failed:t"]
    assert out.shared_with == {"probe:a": "empty:run1", "probe:b": "empty:run1", "probe:d": "probe:c"}
    assert out.copies == len(grader.copies) == 5 and grader.max_in_flight > 1
    assert out.diffs["probe:a"] == "protected x"
    # when each ran, on the batch's clock (the bench's timeline and idle worker-seconds)
    assert set(out.timeline) == set(out.results) and all(0 <= s <= e for s, e in out.timeline.values())
    assert out.timeline["reference:run1"][1] >= 0.05 and out.timeline["probe:e"][0] > 0

    # A fail-fast grading takes a full run's copy of the same diff (never the other way round), or
    # another fail-fast one's.
    fast = TestRun(fail_fast=True)
    grader = FakeGrader()
    out = grade_batch(grader, _Task(), "img", [
        Grading("empty:run1", "", share=False), Grading("probe:a", "protected x", fast),
        Grading("probe:b", "hack", fast), Grading("probe:c", "hack\nprotected z", fast),
        Grading("probe:d", "hack")], workers=1)
    assert out.shared_with == {"probe:a": "empty:run1", "probe:c": "probe:b"}
    assert grader.copies == [("", TARGETED), ("hack", fast), ("hack", TARGETED)]

    # A probe (which may fork) takes a copy a fresh interpreter graded (the gate's repeated runs).
    fresh = TestRun(fresh_interpreter=True)
    grader = FakeGrader()
    out = grade_batch(grader, _Task(), "img", [
        Grading("empty:run1", "", fresh, share=False), Grading("probe:a", "protected x", fast),
        Grading("empty:run2", "", fresh, share=False)], workers=1)
    assert out.shared_with == {"probe:a": "empty:run1"} and grader.copies == [("", fresh), ("", fresh)]

    grader = FakeGrader()
    out = grade_batch(grader, _Task(), "img", gradings, workers=1, stop=lambda name, r: not r.resolved)
    assert list(out.results) == ["reference:run1", "empty:run1"] and out.not_run == [g.name for g in gradings[2:]]


def test_batch_retries_infrastructure_faults():
    grader = FakeGrader(fail_first=True)
    out = grade_batch(grader, _Task(), "img", [Grading("reference:run1", "fix", share=False)], workers=1)
    assert out.infra_retries == 1 and out.results["reference:run1"].resolved


class _GateGrader(FakeGrader):
    """A fake grader for validate_task: the reference diff is 'fix'; `fail_reference` fails that reference run."""

    def __init__(self, fail_reference: int = 0, delay_s: float = 0.02):
        super().__init__(delay_s=delay_s)
        self.fail_reference = fail_reference
        self.references = 0

    def solution_diff(self, task, image, which):
        return "fix", []

    def run_copy(self, task, image, kept, run=TARGETED):
        if "fix" in kept:
            with self._lock:
                self.references += 1
                failing = self.references == self.fail_reference
            if failing:
                time.sleep(self.delay_s)
                with self._lock:
                    self.copies.append((kept, run))
                return GradedCopy("git_apply", {}, [], ["test_failed:t"], 0.01)
        return super().run_copy(task, image, kept, run)

    def result(self, task, image, solution, prepared, copy):
        result = super().result(task, image, solution, prepared, copy)
        check = task.spec.verification.tests
        fixed = result.resolved or not prepared.kept  # the empty diff fails FAIL_TO_PASS, passes PASS_TO_PASS
        result.tests = {t: "passed" if result.resolved else "failed" for t in check.fail_to_pass}
        result.tests |= {t: "passed" if fixed else "failed" for t in check.pass_to_pass}
        result.duration_s = 5.0 if solution == "empty:run1" else 1.0
        return result


@pytest.mark.parametrize("fail_reference", [0, 1, 4])
def test_the_strength_is_measured_alongside_the_stability_runs_and_dropped_when_they_disagree(
    monkeypatch, fail_reference
):
    """A slow task's gate used to be its stability runs, then its mutants: the strength now starts once the first
    reference and empty runs agree (its mutants' timeout: 4x the slower of the two), while the other runs go on; a
    later disagreement cancels it (no more gradings start) and the task keeps no strength; a first reference run
    that fails starts none."""
    from envforge.verify import gate
    from envforge.verify.strength import StrengthReport

    grader = _GateGrader(fail_reference=fail_reference)
    seen: dict = {}

    def measure(grader_, task, image, diff, *, timeout_s, cancelled, **kw):
        seen.update(diff=diff, timeout_s=timeout_s, graded_before=len(grader.copies))
        deadline = time.monotonic() + 5
        while not cancelled() and time.monotonic() < deadline and len(grader.copies) < 10:
            time.sleep(0.005)  # a long strength: it sees the stability runs finish, or a disagreement
        seen["cancelled"] = cancelled()
        return StrengthReport(strength=1.0, strength_upper=1.0, gradings=3)

    monkeypatch.setattr(gate, "measure_strength", measure)
    config = GateConfig(probes=False, workers=2, mutant_timeout_min_s=1.0)
    report = gate.validate_task(grader, _spec("inventory-median-even"), "img", config)
    if fail_reference == 1:  # the first reference run failed: nothing to measure
        assert not seen and report.strength is None and not report.accepted
        return
    assert seen["diff"] == "fix" and seen["timeout_s"] == 20.0  # 4 x the first empty run's 5 s
    assert seen["graded_before"] < 10  # it started while stability runs were still to grade
    if fail_reference == 4:  # a later reference run failed: the strength is cancelled and not kept
        assert seen["cancelled"] and report.strength is None and not report.accepted
        assert any(d.startswith("reference_failed") for d in report.disagreements)
    else:
        assert not seen["cancelled"] and report.accepted and report.strength.strength == 1.0
    assert report.gradings == len(grader.copies) + 3  # the strength's gradings are counted either way


def test_a_dropped_strength_neither_fails_the_gate_nor_runs_for_a_reference_that_failed(monkeypatch):
    """An infrastructure fault in a strength the gate drops anyway (a later run disagreed) does not turn a
    rejected task into an ungated one; the full-suite gate, which grades everything even when the reference's
    own commands failed, measures no strength for it."""
    from envforge.verify import gate
    from envforge.verify.strength import StrengthReport

    started = []

    def measure(grader_, task, image, diff, *, cancelled, **kw):
        started.append(task.id)
        deadline = time.monotonic() + 5
        while not cancelled() and time.monotonic() < deadline:
            time.sleep(0.005)
        raise InfraError("agent_died", "the node went away")

    monkeypatch.setattr(gate, "measure_strength", measure)
    config = GateConfig(probes=False, workers=2)
    report = gate.validate_task(_GateGrader(fail_reference=4), _spec("inventory-median-even"), "img", config)
    assert started and not report.accepted and report.strength is None
    assert any(d.startswith("reference_failed") for d in report.disagreements)

    class FailingCommands(_GateGrader):
        def solution_diff(self, task, image, which):
            return "fix", ["command_failed:make"]

    started.clear()
    monkeypatch.setattr(gate, "measure_strength", lambda *a, **k: started.append("x") or StrengthReport())
    report = gate.validate_task(FailingCommands(), _spec("inventory-median-even"), "img",
                                GateConfig(probes=False, full_suite=True))
    assert not started and not report.accepted and report.strength is None
    assert report.disagreements[0] == "reference_command_failed:make" and report.runs == 5
