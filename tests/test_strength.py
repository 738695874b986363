"""Verifier strength on the real engine: small generated tasks whose tests are deliberately weak or
proper, graded through the gate's own path (pristine copies, targeted files, pool sandboxes)."""

from __future__ import annotations

import json
import uuid

import pytest
import yaml

from envforge.catalog import Catalog
from envforge.sandbox.images import build_task_image, image_digest
from envforge.stages.gate import gate as gate_stage
from envforge.stages.images import ImageSet
from envforge.sources.specs import load_spec_file
from envforge.verify.config import GateConfig
from envforge.verify.covering import CallMap
from envforge.verify.gate import mutant_timeout_s, validate_task
from envforge.verify.mutants import SourceChange, file_diff, generate_mutants
from envforge.verify.strength import measure_strength
from tests.test_strength_units import MERGE_BUGGY, MERGE_FIXED, STRONG_MERGE_TEST, WEAK_MERGE_TEST

pytestmark = pytest.mark.docker

# A rate helper whose bug returns text; the reference returns the rounded number. A comment far
# from the fix is a second hunk: undoing it leaves the same program (an equivalent mutant).
SPEED_BUGGY = ('"""Trip statistics."""\n\n\ndef average_speed(distance_km, minutes):\n'
               '    """Average speed in km/h, rounded to 2 decimals."""\n    hours = minutes / 60\n'
               '    return f"{distance_km / hours:.2f}"\n\n\n\n\n\n\n\n\n# Labels for trips\ndef label(name):\n'
               '    return name.title()\n')
SPEED_FIXED = SPEED_BUGGY.replace('return f"{distance_km / hours:.2f}"', "return round(distance_km / hours, 2)") \
    .replace("# Labels for trips", "# Display labels for trips")
P2P_TEST = "def test_label():\n    assert label('to work') == 'To Work'\n"
WEAK_TESTS = ("from trips import average_speed, label\n\n\ndef test_speed():\n"
              "    assert isinstance(average_speed(10.0, 30.0), float)\n\n\n" + P2P_TEST)
PROPER_TESTS = ("from trips import average_speed, label\n\n\ndef test_speed():\n"
                "    assert average_speed(10.0, 30.0) == 20.0\n    assert average_speed(5.0, 45.0) == 6.67\n"
                "    for km in range(1, 30):\n        assert average_speed(float(km), 60.0) == km\n\n\n" + P2P_TEST)
ONE_LITERAL_TESTS = ("from trips import average_speed, label\n\n\ndef test_speed():\n"
                     "    assert average_speed(10.0, 30.0) == 20.0\n\n\n" + P2P_TEST)

# Counting digits: the fix adds the zero case; mutants of its loop (`n > 0` -> `n >= 0`, the
# division deleted) never end.
DIGITS_BUGGY = ("def count_digits(n):\n    count = 0\n    while n > 0:\n        n //= 10\n        count += 1\n"
                "    return count\n")
DIGITS_FIXED = DIGITS_BUGGY.replace("    count = 0\n", "    if n == 0:\n        return 1\n    count = 0\n")
DIGITS_TESTS = ("from digits import count_digits\n\n\ndef test_zero():\n    assert count_digits(0) == 1\n\n\n"
                "def test_many():\n    assert [count_digits(n) for n in (7, 10, 99, 12345)] == [1, 2, 2, 5]\n")


@pytest.fixture
def make_task(tmp_path, docker_client, base_image, settings):
    """A generated pytest task (module, tests, reference patch) with its image; images removed after."""
    images = []

    def make(module: str, buggy: str, fixed: str, tests: str, f2p: list[str], p2p: list[str],
             timeout_s: float = 60, extra_files: dict[str, str] | None = None):
        root = tmp_path / f"{module}-{uuid.uuid4().hex[:6]}"
        (root / "workspace" / "tests").mkdir(parents=True)
        for rel, text in (extra_files or {}).items():
            (root / "workspace" / rel).write_text(text)
        (root / "workspace" / f"{module}.py").write_text(buggy)
        (root / "workspace" / "tests" / f"test_{module}.py").write_text(tests)
        (root / "solution.patch").write_text(file_diff(f"{module}.py", buggy, fixed))
        (root / "task.yaml").write_text(yaml.safe_dump({
            "id": f"strength-{module}-{uuid.uuid4().hex[:8]}", "instruction": f"Fix {module}.py.",
            "environment": {"image": "base", "files": "workspace"},
            "verification": {"tests": {"framework": "pytest", "timeout_s": timeout_s,
                                       "fail_to_pass": [f"tests/test_{module}.py::{t}" for t in f2p],
                                       "pass_to_pass": [f"tests/test_{module}.py::{t}" for t in p2p]}},
            "reference_solution": {"patch": "solution.patch"}}))
        task = load_spec_file(root / "task.yaml")
        image = build_task_image(docker_client, task, base_image, settings).tag
        images.append(image)
        return task, image

    yield make
    for image in images:
        docker_client.images.remove(image, force=True)


GATE = dict(runs=1, shuffle=False, probes=False, mutation=True)


def test_a_verifier_that_checks_only_the_type_scores_low_and_is_quarantined(make_task, grader, settings,
                                                                              docker_client, monkeypatch):
    task, image = make_task("trips", SPEED_BUGGY, SPEED_FIXED, WEAK_TESTS, ["test_speed"], ["test_label"])
    report = validate_task(grader, task, image, GateConfig(**GATE, mutation_early_stop=False))
    s = report.strength
    assert not report.accepted and report.reference_passes == 1 and report.empty_fails == 1
    assert [d.split(" ", 1)[0] for d in report.disagreements] == [
        "weak_verifier:strength", "weak_verifier:weak_form_probe"], report.disagreements
    # the weak-form probe answers `isinstance(..., float)` with NaN above the reference's code
    assert s.weak_form_passes is True and s.weak_form["forms"] == ["average_speed: isinstance(..., float)"]
    assert '+    return float("nan")  # envforge weak-form probe\n' in s.weak_form["diff"]
    assert s.strength < 0.5 and s.survived >= 4, s
    # the wrong fixes it rewards are listed: a wrong unit, a wrong rounding, the identity
    changes = {v["change"] for v in s.survivors}
    assert "minutes / 60 -> minutes * 60" in changes and "2 -> 3" in changes, changes
    assert any(v["operator"] == "return_input" for v in s.survivors)
    assert s.special_case == {"skipped": "no FAIL_TO_PASS test asserts a literal result for literal arguments"}
    assert report.stats()["strength"]["survivors"] == s.survivors  # kept in the gate record

    # Through the gate stage, admitted to the audit split instead (when configured): recorded in the
    # catalog and listed with its strength; early stop grades fewer mutants (at a fixed count of sandboxes:
    # with more at once while the CPUs are idle, the gradings in flight when the score is decided finish).
    monkeypatch.setenv("ENVFORGE_SANDBOX_CEILING", "1")
    images = ImageSet("", {task.content_hash: image}, {image: image_digest(docker_client, image)})
    result = gate_stage(settings, GateConfig(**GATE, below_strength="audit"), [task], images, client=docker_client)
    [audit] = result.reports
    assert audit.accepted and audit.admission == "audit" and not audit.disagreements
    assert audit.strength.not_run > 0 and audit.strength.strength_upper < 0.5
    assert result.strength_chart.is_file() and result.rows()[0]["admission"] == "audit"
    catalog = Catalog(settings.catalog_path)
    assert catalog.audit_only([task.content_hash]) == {task.content_hash}
    [row] = catalog.query("SELECT strength, admission FROM validations").to_dicts()
    assert row == {"strength": audit.strength.strength, "admission": "audit"}


def test_proper_asserts_score_high_and_equivalent_mutants_are_set_aside(make_task, grader):
    task, image = make_task("trips", SPEED_BUGGY, SPEED_FIXED, PROPER_TESTS, ["test_speed"], ["test_label"])
    report = validate_task(grader, task, image, GateConfig(**GATE, mutation_early_stop=False))
    s = report.strength
    assert report.accepted, report.disagreements
    assert s.strength == 1.0 and s.survived == 0 and s.killed >= 8, s
    # undoing the comment hunk changes no test outcome and leaves the same AST: not counted against the task
    assert s.equivalent == 1 and s.equivalents[0].startswith("revert_hunk:trips.py:"), s
    assert s.killed + s.equivalent == s.mutants
    # the probe answers the two literal asserts, but the loop over inputs rejects it
    assert s.overfittable is False and s.special_case["cases"] == 2
    assert s.weak_form_passes is None and "skipped" in s.weak_form  # every assert reads the value
    assert "if distance_km == 10.0 and minutes == 30.0:" in s.special_case["diff"]


def test_the_special_case_probe_catches_a_test_of_one_literal_input(make_task, grader):
    task, image = make_task("trips", SPEED_BUGGY, SPEED_FIXED, ONE_LITERAL_TESTS, ["test_speed"], ["test_label"])
    s = measure_strength(grader, task, image, task.reference_patch, max_mutants=1)
    assert s.overfittable is True and s.special_case["reward"] == 1.0
    diff = s.special_case["diff"]
    assert "+    if distance_km == 10.0 and minutes == 30.0:\n+        return 20.0\n" in diff
    assert '    return f"{distance_km / hours:.2f}"' in diff  # the bug is still there


def test_a_hanging_mutant_is_a_timeout_outcome_not_an_infrastructure_fault(make_task, grader):
    task, image = make_task("digits", DIGITS_BUGGY, DIGITS_FIXED, DIGITS_TESTS, ["test_zero"], ["test_many"],
                            timeout_s=6)
    s = measure_strength(grader, task, image, task.reference_patch, max_mutants=40, early_stop=False)
    assert s.timeouts >= 2 and s.survived == 0 and s.strength == 1.0, s


def test_the_gate_gives_a_hanging_mutant_its_floor_not_the_tasks_timeout(make_task, grader):
    """A task may allow its tests minutes; a mutant that never ends is killed at 10x the slowest reference/empty
    grading or the config's floor, whichever is more, and the report says which limit applied."""
    task, image = make_task("digits", DIGITS_BUGGY, DIGITS_FIXED, DIGITS_TESTS, ["test_zero"], ["test_many"],
                            timeout_s=600)
    config = GateConfig(**GATE, mutation_early_stop=False, mutant_timeout_min_s=2)
    report = validate_task(grader, task, image, config)
    s = report.strength
    assert s is not None and s.timeout_s == mutant_timeout_s(config, report.verifier_seconds) < 600, s
    assert s.timeouts >= 2 and s.survived == 0 and s.strength == 1.0, s


# A test of the same function that passes before and after the fix (distinct ids: nothing to merge).
MERGE_P2P = ('\n\ndef test_distinct_ids_are_kept():\n'
             '    assert merge_by_id([{"id": 1}, {"id": 2, "b": 1}]) == [{"id": 1}, {"id": 2, "b": 1}]\n')


def test_twin_tasks_one_checking_the_merged_values_the_other_only_the_length_now_separate(make_task, grader,
                                                                                            settings, docker_client):
    """Issue #30 item 7: the same fix, one FAIL_TO_PASS test checking the merged values, the other only
    `len(result) == 1`. Before, both scored alike and were accepted; the value mutants, the FAIL_TO_PASS tests'
    own score and the weak-form probe tell them apart."""
    twins = {name: make_task("records", MERGE_BUGGY, MERGE_FIXED, tests + MERGE_P2P, ["test_merge"],
                             ["test_distinct_ids_are_kept"])
             for name, tests in (("strong", STRONG_MERGE_TEST), ("weak", WEAK_MERGE_TEST))}
    exact = {name: measure_strength(grader, task, image, task.reference_patch, early_stop=False)
             for name, (task, image) in twins.items()}
    strong, weak = exact["strong"], exact["weak"]
    assert strong.mutants == weak.mutants and strong.f2p_mutants == weak.f2p_mutants  # the same fix, the same mutants
    assert strong.strength == strong.f2p_strength == 1.0 and strong.survived == 0, strong
    # the wrong merges keep len == 1: the weak FAIL_TO_PASS test lets them through; the other test kills two of
    # them (the keys for the values, a side dropped), so the suite's score hides what the F2P score shows
    assert weak.f2p_strength <= 0.7 and weak.f2p_strength < weak.strength < 1.0, weak
    assert {v["operator"] for v in weak.survivors} == {"swap_merge"}, weak.survivors
    assert weak.weak_form_passes is True and weak.weak_form["forms"] == ["merge_by_id: len(...) == 1"]
    assert strong.weak_form_passes is None and "skipped" in strong.weak_form
    assert weak.weak_form["shapes"] == ["merge_by_id: len(...) == 1"]  # a shape, not a predicate's truth
    # The gate stage (early stop on, as by default): the probe's wrong value fails the PASS_TO_PASS test (the whole
    # verifier does not reward it) but passes the FAIL_TO_PASS test, which asserts only a shape: a weak verifier
    # (GateConfig.weak_fail_to_pass='shape'), quarantined with the evidence; the strong twin is accepted.
    images = ImageSet("", {t.content_hash: i for t, i in twins.values()},
                      {i: image_digest(docker_client, i) for _, i in twins.values()})
    result = gate_stage(settings, GateConfig(**GATE), [t for t, _ in twins.values()], images, client=docker_client)
    by_id = {r.task_id: r for r in result.reports}
    verdicts = {name: by_id[task.id] for name, (task, _) in twins.items()}
    assert verdicts["strong"].accepted, verdicts["strong"].disagreements
    assert not verdicts["weak"].accepted and verdicts["weak"].strength.weak_form["resolved"] is False
    finding = ("weak_verifier:weak_form_probe passes the FAIL_TO_PASS tests with a wrong value "
               "(merge_by_id: len(...) == 1)")
    assert verdicts["weak"].disagreements == [finding]
    assert "+    return [object()]  # envforge weak-form probe\n" in verdicts["weak"].strength.weak_form["diff"]
    rows = {r["task_id"]: r for r in Catalog(settings.catalog_path).query(
        "SELECT task_id, verdict, disagreements, stats_json FROM validations").to_dicts()}
    weak_row, strong_row = rows[twins["weak"][0].id], rows[twins["strong"][0].id]
    assert (strong_row["verdict"], weak_row["verdict"]) == ("accepted", "quarantined")
    assert list(weak_row["disagreements"]) == [finding]  # the catalog verdict, the run report's quarantine table
    kept = json.loads(weak_row["stats_json"])["strength"]["weak_form"]
    assert kept["shapes"] == ["merge_by_id: len(...) == 1"] and "[object()]" in kept["diff"]  # the evidence

# Covering tests (covering.py): a session fixture calls one function (a call outside any one test), one
# test starts a process, an audit hook (which CPython runs untraced unless it allows tracing) is noticed
# by one test only, and the reference also changes a function no test calls.
SHOP_BUGGY = ('"""Shop."""\nimport sys\n\nRATES = {}\nSALES = []\n\n\ndef setup_rates():\n    RATES["eur"] = 1.5\n'
              '    return RATES\n\n\ndef price(amount, currency):\n    return amount\n\n\ndef label(name):\n'
              '    return name.title()\n\n\ndef _audit(event, args):\n    if event == "shop.sale":\n'
              '        SALES.append(args[0])\n\n\nsys.addaudithook(_audit)\n\n\n'
              'def legacy_total(values):\n    total = 0\n    for v in values:\n        total += v\n    return total\n')
SHOP_FIXED = (SHOP_BUGGY.replace("    return amount\n", "    return round(amount * RATES.get(currency, 1.0), 2)\n")
              .replace("    total = 0\n", "    total = 0.0\n")
              .replace('    if event == "shop.sale":\n', '    if event == "shop.sale" and args:\n'))
SHOP_TESTS = ("import subprocess\nimport sys\n\nfrom shop import label, price\n\n\ndef test_price():\n"
              "    assert price(10, 'eur') == 15.0\n    assert price(3, 'usd') == 3\n\n\n"
              "def test_label():\n    assert label('to work') == 'To Work'\n\n\n"
              "def test_sales():\n    import shop\n\n    sys.audit('shop.sale', 3)\n    assert shop.SALES[-1] == 3\n\n\n"
              "def test_spawn():\n    out = subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True, text=True)\n"
              "    assert out.stdout.strip() == '1'\n")
SHOP_CONFTEST = ("import pytest\n\nimport shop\n\n\n@pytest.fixture(scope='session', autouse=True)\n"
                 "def rates():\n    return shop.setup_rates()\n")


def _def_line(text: str, name: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if line.startswith(f"def {name}("))


def test_a_mutant_is_graded_on_the_tests_that_call_what_it_changes_with_the_same_verdicts(make_task, grader):
    # test_spawn runs (it is in a verdict file) but is not required: a required test that starts a process
    # would run with every mutant (covering_tests' unit tests)
    task, image = make_task("shop", SHOP_BUGGY, SHOP_FIXED, SHOP_TESTS, ["test_price"], ["test_label", "test_sales"],
                            extra_files={"tests/conftest.py": SHOP_CONFTEST})
    kept = grader.prepare(task, task.reference_patch).kept
    doc, why = grader.trace_calls(task, image, kept, ["shop.py"])
    assert doc is not None, why
    calls = CallMap.from_json(doc)
    test = "tests/test_shop.py::"
    assert ("shop.py", _def_line(SHOP_FIXED, "price")) in calls.calls[test + "test_price"]
    assert ("shop.py", _def_line(SHOP_FIXED, "label")) in calls.calls[test + "test_label"]
    assert ("shop.py", _def_line(SHOP_FIXED, "_audit")) in calls.calls[test + "test_sales"]
    # the session fixture's call outlives the test that set it up; the subprocess is not traced
    assert ("shop.py", _def_line(SHOP_FIXED, "setup_rates")) in calls.everywhere
    assert calls.spawners == {test + "test_spawn"} and not calls.unusable

    covering = measure_strength(grader, task, image, task.reference_patch, early_stop=False)
    files = measure_strength(grader, task, image, task.reference_patch, early_stop=False, covering=False)
    assert (covering.test_selection, files.test_selection) == ("covering", "files")
    assert [(s.killed, s.survived, s.equivalent) for s in (covering, files)] == [
        (files.killed, files.survived, files.equivalent)] * 2
    assert sorted(v["mutant"] for v in covering.survivors) == sorted(v["mutant"] for v in files.survivors)
    # legacy_total's mutants: no test calls it, so they survive without a grading
    unexecuted = [v for v in covering.survivors if v.get("not_executed")]
    assert covering.not_executed == len(unexecuted) >= 1 and all(v["line"] > _def_line(SHOP_FIXED, "legacy_total") for v in unexecuted), unexecuted
    # price's mutants run test_price alone (the audit hook's, the tests that raised an event)
    assert covering.covering_tests and min(covering.covering_tests) == 1 and max(covering.covering_tests) < 3
    # the hook's mutants were graded on test_sales, which kills some: seen although CPython runs hooks untraced
    mutants, _ = generate_mutants([SourceChange("shop.py", SHOP_BUGGY, SHOP_FIXED)], 24)
    hook_line = SHOP_FIXED.splitlines().index('    if event == "shop.sale" and args:') + 1
    hook = {m.name for m in mutants if m.line == hook_line and not m.equivalent}
    assert hook - {v["mutant"] for v in covering.survivors}, hook
    # one traced grading, and the reference once on each distinct set of selected tests
    subsets = len(set(covering.covering_tests))
    assert covering.gradings <= files.gradings - covering.not_executed + 1 + subsets
