"""Verifier strength without sandboxes: mutant generation, equivalence, the cap, the special-case
probe's reading of asserts, the gate policy, and where strength is kept (catalog, splits)."""

from __future__ import annotations

import json
import subprocess

import pytest

from envforge.catalog import Catalog
from envforge.rollout.tiers import TierRow, stratified_split
from envforge.verify.config import GateConfig
from envforge.verify.gate import GateReport, strength_findings
from envforge.verify.mutants import SourceChange, changed_lines, file_diff, generate_mutants, same_ast
from envforge.verify.special_case import LiteralCase, literal_cases, special_case_diff, split_test_id
from envforge.verify.strength import StrengthReport

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
