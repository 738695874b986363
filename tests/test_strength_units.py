"""Verifier strength without sandboxes: mutant generation, equivalence, the cap, the special-case
probe's reading of asserts, the gate policy, and where strength is kept (catalog, splits)."""

from __future__ import annotations

import ast
import json
import subprocess
import threading

import pytest

from envforge.catalog import Catalog
from envforge.cli.gate import _strength_text
from envforge.rollout.tiers import TierRow, stratified_split
from envforge.verify.config import GateConfig
from envforge.verify.gate import GateReport, strength_findings
from envforge.verify.mutants import SourceChange, changed_lines, file_diff, generate_mutants, same_ast
from envforge.verify.result import VerificationResult
from envforge.verify.special_case import LiteralCase, literal_cases, special_case_diff, split_test_id
from envforge.stages.gate import _strength_row
from envforge.verify.strength import StrengthReport, strength_text
from envforge.verify.weak_form import WeakForm, weak_form_sources, weak_forms, weak_value

BUGGY = "def clamp(value, low, high):\n    if value < low:\n        return low\n    return value\n"
FIXED = ("def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n"
         "        return high\n    return value\n")


def _by_operator(mutants):
    out = {}
    for m in mutants:
        out.setdefault(m.operator, []).append(m)
    return out


def test_mutants_cover_the_changed_lines_and_their_function_with_every_operator():
    mutants, generated = generate_mutants([SourceChange("clamp.py", BUGGY, FIXED)], cap=100)
    ops = _by_operator(mutants)
    assert generated == len(mutants)
    assert {"compare_flip", "boundary", "negate_condition", "return_constant", "return_input",
            "delete_statement"} <= set(ops)
    assert "value > high -> value <= high" in {m.description for m in ops["compare_flip"]}
    assert "value > high -> value >= high" in {m.description for m in ops["boundary"]}
    assert "return high -> return value" in {m.description for m in ops["return_input"]}
    # the unchanged `if value < low` is in the enclosing function: mutated too
    assert any(m.line == 2 for m in ops["compare_flip"])
    for m in mutants:
        compile(m.after, m.path, "exec")
        assert m.after != FIXED and not m.equivalent
    assert len({m.name for m in mutants}) == len(mutants)
    assert changed_lines(BUGGY, FIXED) == {4, 5}


def test_code_outside_the_changed_functions_is_left_alone():
    other = "\n\ndef untouched(a, b):\n    return a < b\n"
    mutants, _ = generate_mutants([SourceChange("clamp.py", BUGGY + other, FIXED + other)], cap=100)
    assert all(m.line <= 6 for m in mutants), [m.name for m in mutants if m.line > 6]


def test_reverting_one_of_several_hunks_and_equivalence():
    tail = "\n" * 8 + "# helpers\nX = 1\n"
    fixed_tail = "\n" * 8 + "# the helpers\nX = 1\n"
    mutants, _ = generate_mutants([SourceChange("clamp.py", BUGGY + tail, FIXED + fixed_tail)], cap=100)
    reverts = _by_operator(mutants)["revert_hunk"]
    assert [m.equivalent for m in reverts] == [False, True]  # the comment-only hunk: same AST
    assert reverts[0].after == BUGGY + fixed_tail
    # The diff's only hunk undone is the empty solution: no mutant for it.
    only, _ = generate_mutants([SourceChange("clamp.py", BUGGY, FIXED)], cap=100)
    assert "revert_hunk" not in _by_operator(only)
    assert same_ast("x = 1  # one\n", "x = (1)\n") and not same_ast("x = 1\n", "x = 2\n")
    # swapping min's or max's two arguments is equivalent; another call's is not
    calls = SourceChange("pay.py", "def pay(a, b):\n    return a\n", "def pay(a, b):\n    return min(a, b) + f(a, b)\n")
    swaps = {m.description: m.equivalent for m in _by_operator(generate_mutants([calls], cap=100)[0])["swap_args"]}
    assert swaps == {"min(a, b) -> min(b, a)": True, "f(a, b) -> f(b, a)": False}


def test_only_python_code_is_mutated_and_release_bookkeeping_is_left_alone():
    readme = SourceChange("README.rst", "Usage\n", "Usage and limits\n")
    gap = "\n" * 10
    version = SourceChange("pkg.py", '__version__ = "1.0"' + gap + BUGGY, '__version__ = "1.1"' + gap + FIXED)
    mutants, _ = generate_mutants([readme, version], cap=100)
    assert {m.path for m in mutants} == {"pkg.py"}
    assert not any(m.line == 1 and m.operator != "revert_hunk" for m in mutants)  # `__version__ = ...` not mutated
    # pkg.py's two hunks: the version line (undone: an equivalent) and the fix
    assert [m.equivalent for m in mutants if m.operator == "revert_hunk"] == [True, False]


def test_the_cap_keeps_reverts_and_changed_lines_first_spread_over_the_rest():
    mutants, generated = generate_mutants([SourceChange("clamp.py", BUGGY, FIXED)], cap=5)
    assert len(mutants) == 5 and generated > 5
    assert all(m.line in (4, 5) for m in mutants)  # the changed lines' mutants come first
    assert generate_mutants([SourceChange("clamp.py", BUGGY, FIXED)], cap=5)[0] == mutants  # deterministic


def test_a_mutant_diff_applies_with_git(tmp_path):
    before, after = "a = 1\nb = 2", "a = 1\nb = 3"  # no newline at the end of the file
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "m.py").write_text(before)
    (tmp_path / "p.diff").write_text(file_diff("m.py", before, after) + file_diff("new.py", None, "x = 1\n"))
    subprocess.run(["git", "apply", "p.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "m.py").read_text() == after and (tmp_path / "new.py").read_text() == "x = 1\n"


def test_literal_cases_are_read_from_simple_asserts_only():
    tests = ("import calc\nfrom calc import area\n\n\ndef test_area():\n    assert area(2, 3) == 6\n"
             "    assert 12 == calc.area(w=3, h=4)\n    assert isinstance(area(1, 1), int)\n"
             "    x = 5\n    assert area(x, 1) == 5\n    assert not calc.is_empty([1])\n\n\n"
             "class TestArea:\n    def test_unit(self):\n        self.assertEqual(area(1, 1), 1)\n"
             "        self.assertIsNone(calc.parse(''))\n\n\ndef test_other():\n    assert area(9, 9) == 81\n")
    cases = literal_cases(tests, ["test_area", "test_unit"])
    assert cases == [LiteralCase("area", ("2", "3"), (), "6"), LiteralCase("area", (), (("w", "3"), ("h", "4")), "12"),
                     LiteralCase("is_empty", ("[1]",), (), "False"), LiteralCase("area", ("1", "1"), (), "1"),
                     LiteralCase("parse", ("''",), (), "None")]
    assert split_test_id("tests/test_a.py::TestX::test_y[1-2]", "pytest") == ("tests/test_a.py", "test_y")
    assert split_test_id("tests.test_a.TestX.test_y", "unittest") == ("tests/test_a.py", "test_y")
    assert literal_cases("def broken(:\n", ["x"]) == []


def test_the_special_case_diff_keeps_the_bug_and_answers_the_literals():
    source = ('class Box:\n    def area(self, w, h):\n        """Area."""\n        return w + h\n\n\n'
              "def area(w, h):\n    return w + h\n")
    diff, used = special_case_diff({"calc.py": source}, [LiteralCase("area", ("2", "3"), (), "6"),
                                                         LiteralCase("area", ("1", "2", "3"), (), "0")])
    assert used == 2  # the method and the function; three arguments bind to neither
    assert "+        if w == 2 and h == 3:\n+            return 6\n" in diff
    assert "+    if w == 2 and h == 3:\n+        return 6\n" in diff
    assert "-" not in [line[:1] for line in diff.splitlines() if not line.startswith("---")]
    assert special_case_diff({"calc.py": source}, [LiteralCase("volume", ("1",), (), "1")]) == ("", 0)


def test_the_gate_policy_for_weak_and_overfittable_verifiers():
    weak = StrengthReport(strength=0.3, strength_upper=0.3, killed=3, survived=7)
    assert strength_findings(weak, 0.5) == ["weak_verifier:strength 0.30 < 0.5 (7 of 10 mutants survive)"]
    decided = StrengthReport(strength=0.6, strength_upper=1.0, killed=6, survived=0)  # stopped early, above
    assert strength_findings(decided, 0.5) == []
    overfit = StrengthReport(strength=1.0, strength_upper=1.0, killed=5, overfittable=True,
                             special_case={"cases": 1})
    assert strength_findings(overfit, 0.5) == ["overfittable:special_case_probe answers 1 literal case(s)"]
    assert strength_findings(overfit, 0.5, block_overfittable=False) == []  # the gate's default: flagged only
    assert strength_findings(StrengthReport(), 0.5) == []  # nothing mutable: no finding
    with pytest.raises(ValueError, match="GateConfig.below_strength: must be one of quarantine, audit"):
        GateConfig(below_strength="train")
    with pytest.raises(ValueError, match="GateConfig.min_strength"):
        GateConfig(min_strength=1.5)
    assert GateConfig().mutation  # on by default: every test-verified task the gate accepts is measured
    assert "min_strength" not in GateConfig(mutation=False).as_params()  # gated without it: the keys of before
    assert GateConfig().as_params()["min_strength"] == GateConfig().min_strength


def test_strength_is_kept_in_the_catalog_listed_and_decides_the_audit_split(settings):
    catalog = Catalog(settings.catalog_path)
    strength = StrengthReport(strength=0.25, strength_upper=0.25, mutants=8, killed=2, survived=6,
                              survivors=[{"mutant": "boundary:m.py:3", "operator": "boundary", "path": "m.py",
                                          "line": 3, "change": "2 -> 3"}])
    reports = [GateReport("t-weak", "a" * 64, True, runs=1, reference_passes=1, strength=strength,
                          admission="audit"),
               GateReport("t-plain", "b" * 64, True, runs=1, reference_passes=1)]
    catalog.record_validations(reports, GateConfig(mutation=True).as_params())
    assert catalog.audit_only(["a" * 64, "b" * 64, "c" * 64]) == {"a" * 64}
    rows = {r["task_id"]: r for r in catalog.query("SELECT * FROM validations").to_dicts()}
    assert rows["t-weak"]["strength"] == 0.25 and rows["t-plain"]["strength"] is None
    kept = GateReport.from_row(rows["t-weak"])
    assert kept.strength == strength and kept.admission == "audit"
    assert json.loads(rows["t-weak"]["stats_json"])["strength"]["survivors"][0]["change"] == "2 -> 3"

    tiers = [TierRow(t, h, "specs", "medium", "static", 0, 0, 1.0) for t, h in
             (("t-weak", "a" * 64), ("t-plain", "b" * 64), ("t-3", "c" * 64), ("t-4", "d" * 64))]
    split = {r.task_id: r.split for r in stratified_split(tiers, 0.5, audit_only={"a" * 64})}
    assert split["t-weak"] == "audit" and {split[t] for t in ("t-plain", "t-3", "t-4")} <= {"train", "eval"}


def test_constructors_of_literals_are_answered_only_where_the_module_binds_them():
    tests = ("from datetime import date\nfrom dates import add_months\n\n\ndef test_clamp():\n"
             "    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)\n")
    [case] = literal_cases(tests, ["test_clamp"])
    assert case == LiteralCase("add_months", ("date(2024, 1, 31)", "1"), (), "date(2024, 2, 29)", ("date",))
    body = "def add_months(d, months):\n    return d.replace(month=d.month + months)\n"
    diff, used = special_case_diff({"dates.py": "from datetime import date\n\n\n" + body}, [case])
    assert used == 1 and "+    if d == date(2024, 1, 31) and months == 1:\n+        return date(2024, 2, 29)\n" in diff
    assert special_case_diff({"dates.py": body}, [case]) == ("", 0)  # `date` unbound there: not answered


# Twin tasks (issue #30 item 7): the same fix, one FAIL_TO_PASS test checking the merged values, the other only
# the length. Shared with tests/test_strength.py, which grades both on the real engine.
MERGE_BUGGY = ('"""Customer records."""\n\n\ndef merge_by_id(records):\n'
               '    """Records with the same id merged into one, later fields winning."""\n    merged = []\n'
               "    for record in records:\n        merged.append(dict(record))\n    return merged\n")
MERGE_FIXED = MERGE_BUGGY.replace("    merged = []\n    for record in records:\n        merged.append(dict(record))\n"
                                  "    return merged\n",
                                  "    merged = {}\n    for record in records:\n        key = record[\"id\"]\n"
                                  "        merged[key] = {**merged.get(key, {}), **record}\n"
                                  "    return list(merged.values())\n")
MERGE_CALL = 'merge_by_id([{"id": 1, "a": 1, "c": 5}, {"id": 1, "a": 3, "b": 2}])'
STRONG_MERGE_TEST = (f"from records import merge_by_id\n\n\ndef test_merge():\n    result = {MERGE_CALL}\n"
                     '    assert result == [{"id": 1, "a": 3, "c": 5, "b": 2}]\n')
WEAK_MERGE_TEST = (f"from records import merge_by_id\n\n\ndef test_merge():\n    result = {MERGE_CALL}\n"
                   "    assert len(result) == 1\n")


def test_value_operators_get_what_the_changed_lines_compute_wrong_and_keep_its_shape():
    ops = _by_operator(generate_mutants([SourceChange("records.py", MERGE_BUGGY, MERGE_FIXED)], cap=100)[0])
    # a merge whose other side wins, one side dropped, the keys returned for the values: each keeps len == 1
    assert {m.description for m in ops["swap_merge"]} == {
        "{**merged.get(key, {}), **record} -> {**record, **merged.get(key, {})}"}
    assert {m.description for m in ops["drop_element"]} == {"{**merged.get(key, {}), **record} -> {**merged.get(key, {})}"}
    assert {m.description for m in ops["swap_view"]} == {"merged.values() -> merged.keys()"}
    fixed = ("def stats(xs):\n    seen = []\n    doubled = [x * 2 for x in xs]\n    total = len(xs) + 1\n"
             "    pair = (min(xs), max(xs))\n    names = {k: str(k) for k in xs}\n    return seen\n")
    ops = _by_operator(generate_mutants([SourceChange("s.py", "def stats(xs):\n    return None\n", fixed)], 100)[0])
    assert {m.description for m in ops["comprehension_element"]} == {"x * 2 -> x", "str(k) -> k"}
    assert {m.description for m in ops["replace_element"]} == {"(min(xs), max(xs)) -> (min(xs), min(xs))"}
    assert {m.description for m in ops["off_by_one"]} == {"len(xs) + 1 -> (len(xs) + 1) + 1"}
    assert {m.description for m in ops["swap_value"]} == {"seen -> doubled"}  # another list bound before the return
    for group in ops.values():
        for m in group:
            compile(m.after, m.path, "exec")
            assert not m.equivalent and m.on_changed
    # a display whose first and last elements are the same text: replacing one by the other is no mutant
    same = generate_mutants([SourceChange("s.py", "def f(a):\n    return 0\n", "def f(a):\n    return [a, a]\n")], 100)
    assert "replace_element" not in _by_operator(same[0])


def test_value_operators_stay_on_the_changed_lines_and_the_rest_is_marked_off_them():
    mutants, _ = generate_mutants([SourceChange("clamp.py", BUGGY, FIXED)], cap=100)
    assert {m.on_changed for m in mutants if m.line in (4, 5)} == {True}
    assert {m.on_changed for m in mutants if m.line == 2} == {False}  # the enclosing function's unchanged `if`
    untouched = "def pair(a, b):\n    out = [a, b]\n    return out\n"
    mutants, _ = generate_mutants([SourceChange("p.py", untouched + "X = 1\n", untouched + "X = 2\n")], cap=100)
    assert not {"drop_element", "replace_element"} & {m.operator for m in mutants}


def test_weak_forms_are_read_only_where_every_assert_on_a_result_is_one():
    tests = (WEAK_MERGE_TEST + "\n\ndef test_type():\n    assert isinstance(speed(10.0, 30.0), float)\n"
             "\n\ndef test_mixed():\n    r = parse('x')\n    assert r is not None and 'x' in r\n    assert all(v for v in r)\n"
             "\n\ndef test_polarity():\n    assert count(3)\n    assert not empty([])\n"
             "\n\ndef test_raises():\n    assert check(1)\n    with pytest.raises(ValueError):\n        check(2)\n"
             "\n\nclass TestUnit:\n    def test_u(self):\n        out = lookup(1)\n        self.assertEqual(len(out), 2)\n"
             "        self.assertIn('k', out)\n        self.assertIsInstance(out, dict)\n")
    forms, skipped = weak_forms(tests, ["test_merge", "test_type", "test_mixed", "test_polarity", "test_raises",
                                        "test_u"])
    assert {n: f.describe() for n, f in forms.items()} == {
        "merge_by_id": "merge_by_id: len(...) == 1", "speed": "speed: isinstance(..., float)",
        "all": "all: truthy", "count": "count: truthy", "empty": "empty: falsy",
        "lookup": "lookup: len(...) == 2, isinstance(..., dict), 'k' in ..."}
    # read in a loop / under pytest.raises as well: not only weak forms
    assert skipped == {"parse": "the tests also read its result in other ways",
                       "check": "the tests also read its result in other ways"}
    assert weak_forms(STRONG_MERGE_TEST, ["test_merge"]) == ({}, {})  # no weak form at all
    both = STRONG_MERGE_TEST + "    assert len(result) == 1\n"
    assert weak_forms(both, ["test_merge"]) == ({}, {"merge_by_id": "the tests also read its result in other ways"})
    two = "def test_a():\n    assert len(f(1)) == 1\n    assert len(f(2)) == 2\n"
    assert weak_forms(two, ["test_a"]) == ({}, {"f": "the tests assert conflicting forms of its result"})
    # the values: the form's shape, content that is wrong for sure; none where no such value exists
    values = {n: weak_value(f) for n, f in forms.items()}
    assert values == {"merge_by_id": "[object()]", "speed": 'float("nan")', "all": "object()", "count": "object()",
                      "empty": None, "lookup": "{'k': None, object(): None}"}
    assert weak_value(WeakForm("f", length=3, type_name="str", members=("'ab'",))) == "'ab\\x00'"
    assert weak_value(WeakForm("f", length=1, members=("'a'",))) is None  # only the test's own literal
    assert weak_value(WeakForm("f", type_name="bool", truth=True)) is None
    assert weak_value(WeakForm("f", type_name="Money")) is None


def test_the_weak_form_probe_answers_at_the_changed_function_and_keeps_the_reference():
    forms, _ = weak_forms(WEAK_MERGE_TEST, ["test_merge"])
    helper = "\n\ndef merge_by_id_legacy(records):\n    return records\n"
    change = SourceChange("records.py", MERGE_BUGGY + helper, MERGE_FIXED + helper)
    texts, answered = weak_form_sources([change], forms)
    assert answered == ["merge_by_id: len(...) == 1"]
    new = texts["records.py"]
    assert ('    """Records with the same id merged into one, later fields winning."""\n'
            "    return [object()]  # envforge weak-form probe\n    merged = {}\n") in new
    namespace: dict = {}
    exec(compile(new, "records.py", "exec"), namespace)
    assert len(namespace["merge_by_id"]([{"id": 1}])) == 1  # the weak test's form holds, the value is wrong
    # a function the reference does not change is not answered, nor is a generator
    assert weak_form_sources([SourceChange("records.py", MERGE_BUGGY, MERGE_BUGGY + "\nX = 1\n")], forms) == ({}, [])
    gen = "def merge_by_id(records):\n    yield from records\n"
    assert weak_form_sources([SourceChange("records.py", None, gen)], forms) == ({}, [])


def test_the_fail_to_pass_score_and_the_weak_form_probe_in_the_text_and_the_policy():
    assert strength_text({"strength": 0.6, "strength_upper": 0.6}) == "0.60"  # records from before: as they were
    assert strength_text({"strength": 0.5, "strength_upper": 0.9, "f2p_strength": 0.2, "f2p_strength_upper": 0.7}) \
        == ">= 0.50 (<= 0.90); F2P >= 0.20 (<= 0.70)"
    assert strength_text({"strength": 1.0, "strength_upper": 1.0, "f2p_strength": 1.0, "f2p_strength_upper": 1.0}) \
        == "1.00"
    weak = StrengthReport(strength=0.67, strength_upper=0.67, killed=6, survived=3, weak_form_passes=True,
                          weak_form={"forms": ["merge_by_id: len(...) == 1"], "resolved": False})
    assert strength_findings(weak, 0.5) == []  # a record without the shapes (gated before the policy): reported only
    hacked = StrengthReport(strength=0.67, strength_upper=0.67, weak_form_passes=True,
                            weak_form={"forms": ["merge_by_id: len(...) == 1"], "resolved": True})
    assert strength_findings(hacked, 0.5) == [
        "weak_verifier:weak_form_probe is rewarded for a wrong value (merge_by_id: len(...) == 1)"]
    assert strength_findings(StrengthReport(strength=0.67, strength_upper=0.67, weak_form_passes=False), 0.5) == []
    assert StrengthReport.from_json(weak.as_json()) == weak
    # `envforge validate`'s line for a flake-report row
    weak.f2p_strength, weak.mutants = 0.33, 9
    row = _strength_row(GateReport("t", "a" * 64, False, strength=weak))
    assert _strength_text(row) == ", strength 0.67, F2P 0.33 (9 mutants, 0 survive, weak FAIL_TO_PASS asserts)"


def test_mutants_are_graded_fail_fast_and_the_probes_in_full(monkeypatch):
    """A mutant's grading only asks whether it resolves and whether every FAIL_TO_PASS test passes: a run
    stopped at the first FAIL_TO_PASS test that fails answers both. The probes keep their reasons: in full."""
    from envforge.verify import strength
    from envforge.verify.batch import BatchOutcome
    from envforge.verify.grader import Grader
    from envforge.verify.selection import TARGETED, TestRun
    from tests.test_gate_units import _spec

    task = _spec("inventory-median-even")
    check = task.spec.verification.tests
    tests = {p: f"def {n}():\n    assert clamp(5, 0, 3) == 3\n" for p, n in
             (t.split("::", 1) for t in check.fail_to_pass)}
    monkeypatch.setattr(strength, "_workspace_texts",
                        lambda *a: ([SourceChange("calc.py", BUGGY, FIXED)], tests))
    plans = []

    def batch(grader, task, image, plan, workers=2, stop=None):
        plans.append(plan)
        return BatchOutcome(not_run=[g.name for g in plan])

    monkeypatch.setattr(strength, "grade_batch", batch)
    grader = Grader(None, pool=object())
    for fail_fast in (True, False):
        strength.measure_strength(
            grader, task, "img", file_diff("calc.py", BUGGY, FIXED), fail_fast=fail_fast, covering=False
        )
    fast, full = plans
    assert [g.name for g in fast] == [g.name for g in full] and "special_case" in [g.name for g in fast]
    assert {g.run for g in fast if g.name.startswith("mutant:")} == {TestRun(fail_fast=True)}
    assert {g.run for g in fast if not g.name.startswith("mutant:")} == {TARGETED}
    assert {g.run for g in full} == {TARGETED}  # the code path as it was


def test_the_policy_on_fail_to_pass_tests_that_take_the_weak_form_probes_wrong_value():
    """The PASS_TO_PASS tests refused the probe's wrong value, the FAIL_TO_PASS tests took it: a shape asserted
    (len, a type, membership, `is not None`) is a weak verifier by default; a predicate asserted truthy is not
    (its truth is its whole value: the demo's `assert can_charge(...)`), unless weak_fail_to_pass is 'any'."""
    shape = StrengthReport(strength=0.89, strength_upper=1.0, f2p_strength=0.67, weak_form_passes=True,
                           weak_form={"forms": ["merge_by_id: len(...) == 1"], "shapes": ["merge_by_id: len(...) == 1"],
                                      "resolved": False})
    finding = "weak_verifier:weak_form_probe passes the FAIL_TO_PASS tests with a wrong value (merge_by_id: len(...) == 1)"
    assert strength_findings(shape, 0.5) == [finding]
    assert strength_findings(shape, 0.5, weak_fail_to_pass="any") == [finding]
    assert strength_findings(shape, 0.5, weak_fail_to_pass="report") == []  # flagged in the report only
    truthy = StrengthReport(strength=1.0, strength_upper=1.0, weak_form_passes=True,
                            weak_form={"forms": ["can_charge: truthy"], "shapes": [], "resolved": False})
    assert strength_findings(truthy, 0.5) == []
    assert strength_findings(truthy, 0.5, weak_fail_to_pass="any") == [
        "weak_verifier:weak_form_probe passes the FAIL_TO_PASS tests with a wrong value (can_charge: truthy)"]
    # the FAIL_TO_PASS tests refused the wrong value, or the probe did not apply: nothing
    for passes in (False, None):
        refused = StrengthReport(strength=1.0, strength_upper=1.0, weak_form_passes=passes,
                                 weak_form={**shape.weak_form, "resolved": False})
        assert strength_findings(refused, 0.5, weak_fail_to_pass="any") == []
    # the whole verifier took it: a weak verifier whatever the setting, with the finding of before
    hacked = StrengthReport(strength=1.0, strength_upper=1.0, weak_form_passes=True,
                            weak_form={**truthy.weak_form, "resolved": True})
    assert strength_findings(hacked, 0.5, weak_fail_to_pass="report") == [
        "weak_verifier:weak_form_probe is rewarded for a wrong value (can_charge: truthy)"]
    # which forms are shapes
    assert [WeakForm("f", truth=True).shape, WeakForm("f", length=1).shape, WeakForm("f", type_name="float").shape,
            WeakForm("f", members=("'a'",), truth=True).shape, WeakForm("f", not_none=True).shape] == [
        False, True, True, True, True]
    # a typed, validated setting, part of a verdict's key when mutation is on
    assert GateConfig().weak_fail_to_pass == "shape"
    assert GateConfig(weak_fail_to_pass="any").as_params()["weak_fail_to_pass"] == "any"
    assert "weak_fail_to_pass" not in GateConfig(mutation=False).as_params()
    with pytest.raises(ValueError, match="GateConfig.weak_fail_to_pass: must be one of shape, any, report, got 'x'"):
        GateConfig(weak_fail_to_pass="x")


@pytest.mark.parametrize("module", ["verify/mutants.py", "quality/statements.py", "sources/history.py"])
def test_the_mutants_equivalence_is_what_same_ast_says_on_real_files(module):
    """Mutants are parsed and compared one top-level statement at a time (whole files per mutant took seconds a
    task): on real modules, each mutant is unique, and a mutant's file parses and is marked equivalent exactly when
    the whole file has the reference's tree (or it swaps min/max's arguments). The whole-file check costs ~75 ms a
    mutant (a minute a file for all of them), so it runs on a deterministic sample: every mutant marked equivalent,
    and for each operator two mutants spread over the file, which still catches an operator whose marking is wrong."""
    from pathlib import Path

    import envforge
    from envforge.verify.mutants import _spread

    after = (Path(envforge.__file__).parent / module).read_text()
    mutants, _ = generate_mutants([SourceChange(module, None, after)], cap=100_000)
    assert len(mutants) > 200
    assert len({m.after for m in mutants}) == len(mutants)
    operators = sorted({m.operator for m in mutants})
    sample = {m.name: m for m in mutants if m.equivalent}
    for op in operators:
        sample.update((m.name, m) for m in _spread([m for m in mutants if m.operator == op], 2))
    assert len(operators) >= 10
    for m in sample.values():
        ast.parse(m.after)
        swapped_min_max = m.operator == "swap_args" and m.description.startswith(("min(", "max("))
        assert m.equivalent == (same_ast(m.after, after) or swapped_min_max), (m.name, m.description)
    assert any(m.equivalent for m in mutants) and not all(m.equivalent for m in mutants)


def _two_batch_strength(monkeypatch, **kwargs):
    """measure_strength on a file with a module-level change and a function's, a probe, and fakes for the trace
    (selecting one test for each function mutant) and for grade_batch (sequential, honouring `stop`: module-level
    mutants are killed, the others survive unless `kill_all`). Returns (events, report)."""
    from envforge.verify import strength
    from envforge.verify.batch import BatchOutcome
    from envforge.verify.grader import Grader
    from tests.test_gate_units import _spec

    kill_all = kwargs.pop("kill_all", False)
    buggy = "LIMIT = 3\n\ndef clamp(value, low, high):\n    if value < low:\n        return low\n    return value\n"
    fixed = "LIMIT = 5\n\ndef clamp(value, low, high):\n    if value < low:\n        return low\n    return min(value, high)\n"
    task = _spec("inventory-median-even")
    monkeypatch.setattr(strength, "_workspace_texts", lambda *a: ([SourceChange("calc.py", buggy, fixed)], {}))
    monkeypatch.setattr(strength, "_special_case", lambda *a: ("probe diff", 1, ""))
    events: list = []
    traced = threading.Event()
    first_batch = threading.Event()

    def covering(grader, task, image, kept, paths, functions, workers, stopped):
        events.append(("trace", sorted(functions)))
        first_batch.wait(5)  # the untraced mutants are being graded meanwhile
        traced.set()
        return {name: ["t::chosen"] for name in functions}, "covering", 2

    def batch(grader, task, image, plan, workers=2, stop=None):
        during = traced.is_set()
        first_batch.set()
        results = {}
        for g in plan:
            killed = g.name != "special_case" and (kill_all or ":calc.py:1" in g.name)
            results[g.name] = VerificationResult("t", g.name, 0.0 if killed else 1.0, not killed)
            if stop is not None and stop(g.name, results[g.name]):
                break
        events.append(("batch", [(g.name, g.run.ids) for g in plan if g.name in results], during))
        return BatchOutcome(results=results, copies=len(results))

    monkeypatch.setattr(strength, "_covering", covering)
    monkeypatch.setattr(strength, "grade_batch", batch)
    report = strength.measure_strength(
        Grader(None, pool=object()), task, "img", file_diff("calc.py", buggy, fixed), **kwargs
    )
    return events, report


def test_mutants_outside_function_bodies_are_graded_while_the_trace_runs(monkeypatch):
    """The trace only narrows the tests of mutants inside function bodies: the others (a module-level constant)
    and the probes run every test, so they are graded while the reference is traced, and the traced mutants after
    it on the tests it selected, the likely-equivalent ones last."""
    events, report = _two_batch_strength(monkeypatch, early_stop=False)
    (_, functions), (_, untraced, during), (_, after, late) = events
    assert not during and late  # the first batch ran before the trace was back, the second after it
    assert untraced[0] == ("special_case", ()) and all(ids == () for _, ids in untraced)  # every test
    assert [n for n, _ in untraced[1:]] == [n for n in [f"mutant:{m}" for m in (
        "delete_statement:calc.py:1", "boundary:calc.py:1", "boundary:calc.py:1#2")]]  # LIMIT = 5, module level
    assert sorted(name for name, _ in after) == functions and all(ids == ("t::chosen",) for _, ids in after)
    assert after[-1][0] == "mutant:swap_args:calc.py:6"  # min(high, value): likely equivalent, graded last
    assert report.test_selection == "covering" and (report.killed, report.survived, report.equivalent) == (3, 9, 1)
    assert report.gradings == 2 + len(untraced) + len(after) and report.overfittable is True  # the fake rewards it


def test_one_early_stop_count_spans_both_batches_and_a_cancelled_strength_grades_only_the_probes(monkeypatch):
    """The early stop counts the kills of both batches: 3 module-level kills before the trace, 3 after it reach
    6 of 12, and nothing more is graded. A strength cancelled before it starts (its gate disagreed) grades the
    probes only, and traces nothing."""
    events, report = _two_batch_strength(monkeypatch, kill_all=True)
    _trace, (_, first, _), (_, second, _) = events
    assert len(first) == 4 and len(second) == 3  # the probe and 3 kills, then 3 kills: settled at 6 of 12
    assert (report.killed, report.not_run, report.strength, report.strength_upper) == (6, 7, 0.5, 1.0)

    events, report = _two_batch_strength(monkeypatch, cancelled=lambda: True)
    assert [e[0] for e in events] == ["batch"] and [n for n, _ in events[0][1]] == ["special_case"]
    assert report.killed == report.survived == 0 and report.not_run == 13
