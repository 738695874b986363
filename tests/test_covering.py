"""Selecting a mutant's tests by the functions it changes (covering.py): where a change lies, and which
tests a traced run says can notice it. The traced run itself is tested on the real engine in
tests/test_strength.py."""

from __future__ import annotations

from envforge.verify.covering import CallMap, changed_functions, covering_tests
from envforge.verify.mutants import SourceChange, generate_mutants

REFERENCE = '''"""Prices."""
import functools

RATE = 2


def cached(fn):
    return functools.lru_cache(fn)


class Cart:
    currency = "EUR"

    def __init__(self, items=()):
        self.items = list(items)

    @property
    def total(self):
        return sum(self.items) * RATE

    @total.setter
    def total(self, value):
        self.items = [value / RATE]

    def label(self):
        def fmt(x):
            return f"{x:.2f} {self.currency}"

        return fmt(self.total)


@cached
def tax(amount, rate=0.2):
    if amount < 0:
        raise ValueError(amount)
    return amount * rate
'''


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


def _changed(old: str, new: str) -> set | None:
    return changed_functions("shop.py", REFERENCE, REFERENCE.replace(old, new, 1))


def test_a_change_inside_a_body_is_the_functions_keyed_by_its_code_objects_first_line():
    # a decorated function's code object starts at its first decorator
    assert _changed("return amount * rate", "return amount / rate") == {("shop.py", _line(REFERENCE, "@cached"))}
    assert _changed("raise ValueError(amount)", "pass") == {("shop.py", _line(REFERENCE, "@cached"))}
    # a method, and the second of two definitions with one name (a property's setter)
    assert _changed("self.items = list(items)", "self.items = []") == {
        ("shop.py", _line(REFERENCE, "def __init__"))}
    setter = _line(REFERENCE, "@total.setter")
    assert _changed("self.items = [value / RATE]", "self.items = [value * RATE]") == {("shop.py", setter)}
    # a nested function's own body is its own code object
    assert _changed('return f"{x:.2f} {self.currency}"', 'return f"{x:.3f} {self.currency}"') == {
        ("shop.py", _line(REFERENCE, "def fmt"))}


def test_lines_added_at_the_start_of_a_body_or_taken_away_belong_to_that_function():
    added = REFERENCE.replace("        return sum(self.items) * RATE\n",
                              "        if not self.items:\n            return 0\n        return sum(self.items) * RATE\n")
    assert changed_functions("shop.py", REFERENCE, added) == {("shop.py", _line(REFERENCE, "@property"))}
    # the reverse: the reference has lines the mutant lacks
    assert changed_functions("shop.py", added, REFERENCE) == {("shop.py", _line(added, "@property"))}


def test_code_that_runs_at_import_selects_every_test():
    assert _changed("RATE = 2", "RATE = 3") is None  # module level
    assert _changed('currency = "EUR"', 'currency = "USD"') is None  # a class body
    assert _changed("def tax(amount, rate=0.2):", "def tax(amount, rate=0.3):") is None  # a default value
    assert _changed("@cached\n", "") is None  # a decorator
    assert changed_functions("shop.py", REFERENCE, REFERENCE + "\nRATE = 5\n") is None
    assert changed_functions("shop.py", REFERENCE, "def broken(:\n") is None  # does not parse


def test_lines_are_counted_as_the_parser_counts_them_and_a_one_line_def_is_its_signature():
    text = "\x0c\n\x0c\ndef f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert changed_functions("m.py", text, text.replace("return 1", "return 0")) == {("m.py", 3)}
    one_line = "def f(n=3): return n\n"
    assert changed_functions("m.py", one_line, one_line.replace("n=3", "n=4")) is None
    assert changed_functions("m.py", one_line, one_line.replace("return n", "return -n")) is None


def test_a_new_function_or_one_that_moves_elsewhere_is_not_a_change_inside_a_body():
    moved = REFERENCE.replace("    def label(self):", "    def describe(self):")
    assert changed_functions("shop.py", REFERENCE, moved) is None


def test_every_mutant_of_a_function_body_is_keyed_to_it():
    before = REFERENCE.replace("    if amount < 0:\n        raise ValueError(amount)\n", "")
    mutants, _ = generate_mutants([SourceChange("shop.py", before, REFERENCE)], 50)
    keys = {m.name: changed_functions("shop.py", REFERENCE, m.after) for m in mutants}
    assert keys and all(k == {("shop.py", _line(REFERENCE, "@cached"))} for k in keys.values()), keys


CALLS = CallMap(
    calls={
        "tests/test_a.py::test_tax": {("shop.py", 34)},
        "tests/test_a.py::test_total": {("shop.py", 18), ("shop.py", 14)},
        "tests/test_a.py::test_new": {("shop.py", 14)},
    },
    everywhere={("shop.py", 7)},
    spawners={"tests/test_a.py::test_fork"},
)
F2P = ["tests/test_a.py::test_new"]
P2P = ["tests/test_a.py::test_tax", "tests/test_a.py::test_total", "tests/test_a.py::test_fork"]


def test_a_mutant_runs_the_required_tests_that_call_what_it_changes_and_those_that_start_processes():
    assert covering_tests(CALLS, {("shop.py", 34)}, F2P, P2P) == ["tests/test_a.py::test_tax", "tests/test_a.py::test_fork"]
    assert covering_tests(CALLS, {("shop.py", 14)}, F2P, P2P) == [
        "tests/test_a.py::test_new", "tests/test_a.py::test_total", "tests/test_a.py::test_fork"]
    # every required test calls it: the grading is the plain one (it may share a copy with another)
    assert covering_tests(CALLS, {("shop.py", 14)}, F2P, P2P[1:]) is None


def test_nothing_is_selected_from_a_call_outside_the_tests_or_an_unusable_trace():
    assert covering_tests(CALLS, {("shop.py", 7)}, F2P, P2P) is None  # called at import or by a wide fixture
    assert covering_tests(CALLS, None, F2P, P2P) is None  # a change outside any function body
    for unusable in (CallMap(CALLS.calls, broken="t replaced the trace function"),
                     CallMap(CALLS.calls, spawned_outside=True)):
        assert unusable.unusable and covering_tests(unusable, {("shop.py", 34)}, F2P, P2P) is None


def test_a_function_no_test_calls_cannot_change_an_outcome():
    alone = CallMap(calls=CALLS.calls)  # no process started by a test
    assert covering_tests(alone, {("shop.py", 99)}, F2P, P2P[:2]) == []
    # a test that starts a process may call it there, unseen
    assert covering_tests(CALLS, {("shop.py", 99)}, F2P, P2P) == ["tests/test_a.py::test_fork"]


def test_the_plugins_record_reads_back_with_work_tree_relative_paths():
    doc = {"calls": {"t::a": [["/workspace/src/shop.py", 3]]}, "everywhere": [["/workspace/shop.py", 1]],
           "spawners": ["t::b"], "spawned_outside": False, "broken": ""}
    calls = CallMap.from_json(doc)
    assert calls.calls == {"t::a": {("src/shop.py", 3)}} and calls.everywhere == {("shop.py", 1)}
    assert calls.spawners == {"t::b"} and not calls.unusable
