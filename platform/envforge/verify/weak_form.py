"""The weak-form probe: answer each FAIL_TO_PASS assert's weakest form with a value that is wrong.

A FAIL_TO_PASS test that asserts only `len(result) == 1`, `isinstance(result, list)`, `result`
(truthiness), `result is not None` or `"a" in result` accepts any value of that form, and so
rewards a fix that takes the changed branch and builds the wrong content. The special-case
probe cannot see it (there is no literal result to answer) and the mutants only find it when
one of them happens to keep the form. This probe reads the forms from the FAIL_TO_PASS tests
(ast), and where every assert on a function's result is one of them, makes that function
return a value holding the forms and nothing right: bare `object()` fillers (a list of the
asserted length, a dict with the asserted keys), a NUL string, NaN. The reference is kept
everywhere else, so an import or a helper the fix adds is there. Its diff is graded like any
solution; when the FAIL_TO_PASS tests pass with it, they do not check the value.

A function is not answered when anything else reads its result (an `==`, an index, a loop, a
helper, `pytest.raises`): such a test checks more than a form. Nor when the forms conflict
(two lengths, true and false) or allow no value that is wrong for sure: a falsy result (`[]`,
`0`, `None` may be right), a `bool`, or an instance of a class the probe cannot build.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import Callable

from envforge.verify.mutants import SourceChange, changed_lines
from envforge.verify.special_case import Function, is_literal, prepend_to_functions

__all__ = ["WeakForm", "weak_form_sources", "weak_forms", "weak_value"]

_CONTAINERS = {"list", "tuple", "set", "frozenset", "dict"}
_BUILDABLE = _CONTAINERS | {"str", "bytes", "int", "float"}
_UNITTEST_WEAK = {"assertIsInstance", "assertTrue", "assertIsNotNone", "assertIn", "assertNotIn", "assertEqual"}


@dataclass(frozen=True)
class WeakForm:
    """Everything the FAIL_TO_PASS tests assert about one function's result (sources of literals)."""

    function: str
    length: int | None = None
    type_name: str | None = None
    truth: bool | None = None
    members: tuple[str, ...] = ()
    not_none: bool = False

    @property
    def shape(self) -> bool:
        """Whether a length, a type, membership or `is not None` is asserted, not truthiness alone: a predicate
        asserted truthy is checked on its whole value, a result asserted in a shape only on its form."""
        return self.length is not None or self.type_name is not None or bool(self.members) or self.not_none

    def describe(self) -> str:
        parts = [f"len(...) == {self.length}"] if self.length is not None else []
        parts += [f"isinstance(..., {self.type_name})"] if self.type_name else []
        parts += [f"{m} in ..." for m in self.members]
        parts += ["truthy" if self.truth else "falsy"] if self.truth is not None else []
        parts += ["is not None"] if self.not_none else []
        return f"{self.function}: {', '.join(parts)}"


class _Conflict(Exception):
    pass


def _merge(a: WeakForm, b: WeakForm) -> WeakForm:
    """Both forms at once (raises _Conflict when no value can satisfy both)."""

    def one(x, y):
        if x is not None and y is not None and x != y:
            raise _Conflict
        return x if x is not None else y

    return replace(
        a,
        length=one(a.length, b.length),
        type_name=one(a.type_name, b.type_name),
        truth=one(a.truth, b.truth),
        members=tuple(dict.fromkeys(a.members + b.members)),
        not_none=a.not_none or b.not_none,
    )


class _Reader:
    """Reads one test function: which function each local holds the result of, and the forms asserted."""

    def __init__(self, test: ast.AST):
        self.holds: dict[str, str] = {}  # local -> the function whose result it holds
        self.read_weakly: set[int] = set()  # ids of the nodes a weak form reads a result through
        for node in ast.walk(test):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and (name := _called(node.value))
            ):
                self.holds[node.targets[0].id] = name

    def subject(self, node: ast.AST) -> str | None:
        """The function whose result `node` is: a call of it, or a local holding it."""
        name = self.holds.get(node.id) if isinstance(node, ast.Name) else _called(node)
        if name is not None:
            self.read_weakly.add(id(node))
        return name

    def form(self, node: ast.AST) -> WeakForm | None:
        """The weak form an assert's test states about one result (None: not a weak form)."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.subject(node.operand)
            return WeakForm(inner, truth=False) if inner else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "bool" and len(node.args) == 1 and (s := self.subject(node.args[0])):
                return WeakForm(s, truth=True)
            if node.func.id == "isinstance" and len(node.args) == 2 and (s := self.subject(node.args[0])):
                kind = (
                    node.args[1].elts[0] if isinstance(node.args[1], ast.Tuple) and node.args[1].elts else node.args[1]
                )
                return WeakForm(s, type_name=ast.unparse(kind))
        if (s := self.subject(node)) is not None:
            return WeakForm(s, truth=True)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, op, right = node.left, node.ops[0], node.comparators[0]
            if isinstance(op, ast.Eq):
                return self._length(left, right) or self._length(right, left)
            if isinstance(op, ast.In) and is_literal(left) and (s := self.subject(right)):
                return WeakForm(s, members=(ast.unparse(left),))
            if isinstance(op, ast.NotIn) and is_literal(left) and (s := self.subject(right)):
                return WeakForm(s)  # the probe's fillers never hold a test's literal
            if isinstance(op, (ast.IsNot, ast.NotEq)) and _none(right) and (s := self.subject(left)):
                return WeakForm(s, not_none=True)
        return None

    def _length(self, call: ast.AST, n: ast.AST) -> WeakForm | None:
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "len"
            and len(call.args) == 1
            and isinstance(n, ast.Constant)
            and type(n.value) is int
            and (s := self.subject(call.args[0]))
        ):
            return WeakForm(s, length=n.value)
        return None

    def unittest_form(self, call: ast.Call) -> WeakForm | None:
        """assertEqual(len(x), n), assertIsInstance, assertTrue, assertIsNotNone, assertIn, assertNotIn."""
        method, args = call.func.attr, call.args  # type: ignore[attr-defined]
        if method not in _UNITTEST_WEAK or not args:
            return None
        if method == "assertEqual" and len(args) >= 2:
            return self._length(args[0], args[1]) or self._length(args[1], args[0])
        if method == "assertIsInstance" and len(args) >= 2:
            return self.form(ast.Call(ast.Name("isinstance"), args[:2], []))
        if method == "assertTrue":
            return self.form(args[0])
        if method == "assertIsNotNone" and (s := self.subject(args[0])):
            return WeakForm(s, not_none=True)
        if method in ("assertIn", "assertNotIn") and len(args) >= 2:
            op = ast.In() if method == "assertIn" else ast.NotIn()
            return self.form(ast.Compare(args[0], [op], [args[1]]))
        return None


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return None


def _none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _weak_asserts(test: ast.AST, reader: _Reader) -> tuple[list[WeakForm], list[ast.AST]]:
    """(the weak forms the test asserts, the statements that are such asserts)."""
    forms, statements = [], []
    for node in ast.walk(test):
        found: list[WeakForm | None] = []
        if isinstance(node, ast.Assert):
            parts = (
                node.test.values
                if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)
                else [node.test]
            )
            found = [reader.form(p) for p in parts]
        elif (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
        ):
            found = [reader.unittest_form(node.value)]
        if found and all(found):
            forms += [f for f in found if f is not None]
            statements.append(node)
    return forms, statements


def _read_elsewhere(test: ast.AST, reader: _Reader, weak: list[ast.AST]) -> set[str]:
    """Functions whose result the test reads other than as the subject of a weak assert: through a local
    that holds it, or a call of it (an `==`, an index, a loop, a helper, `pytest.raises`)."""
    skip = {id(n) for s in weak for n in ast.walk(s) if id(n) in reader.read_weakly}
    for node in ast.walk(test):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in reader.holds:
                skip.add(id(node.value))  # the binding call itself (its arguments are walked all the same)
    out = set()
    for node in ast.walk(test):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in reader.holds:
            out.add(reader.holds[node.id])
        elif name := _called(node):
            out.add(name)
    return out


def weak_forms(test_source: str, test_names: list[str]) -> tuple[dict[str, WeakForm], dict[str, str]]:
    """({function: the forms asserted on its result} for functions the named tests check only in weak forms,
    {function: why it is not answered} for those that are asserted weakly but not only so)."""
    try:
        tree = ast.parse(test_source)
    except (SyntaxError, ValueError):
        return {}, {}
    wanted = set(test_names)
    forms: dict[str, WeakForm] = {}
    skipped: dict[str, str] = {}
    strong: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name not in wanted:
            continue
        reader = _Reader(fn)
        found, statements = _weak_asserts(fn, reader)
        strong |= _read_elsewhere(fn, reader, statements)
        for form in found:
            try:
                forms[form.function] = _merge(forms[form.function], form) if form.function in forms else form
            except _Conflict:
                skipped[form.function] = "the tests assert conflicting forms of its result"
    for name in list(forms):
        if name in strong:
            skipped[name] = "the tests also read its result in other ways"
        if name in skipped:
            del forms[name]
    return forms, skipped


def weak_value(form: WeakForm) -> str | None:
    """Python source of a value that satisfies the form and is wrong for sure (None: there is none)."""
    if form.truth is False:
        return None  # a falsy result ([], 0, None) may well be the right one
    kind = form.type_name or ("list" if form.length is not None or form.members else None)
    if kind is None:
        return "object()" if form.truth or form.not_none else None
    if kind not in _BUILDABLE:
        return None
    if kind in ("int", "float"):
        if form.length is not None or form.members:
            return None
        return "-7919" if kind == "int" else 'float("nan")'
    if kind in ("str", "bytes"):
        nul: str | bytes = "\0" if kind == "str" else b"\0"
        parts = [ast.literal_eval(m) for m in form.members]  # substrings the result must hold
        if not all(type(p) is type(nul) for p in parts):
            return None
        text = nul[:0].join(parts)
        pad = form.length - len(text) if form.length is not None else 1
        return repr(text + nul * pad) if pad >= 1 else None  # type: ignore[operator]
    n = form.length if form.length is not None else len(form.members) + 1
    fillers = n - len(form.members)
    if fillers < 1:
        return None  # only the test's own literals: that may be the right value
    items = list(form.members) + ["object()"] * fillers
    if kind == "dict":
        return "{" + ", ".join(f"{k}: None" for k in items) + "}"
    if kind in ("set", "frozenset"):
        body = "{" + ", ".join(items) + "}"
        return body if kind == "set" else f"frozenset({body})"
    if kind == "tuple":
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return "[" + ", ".join(items) + "]"


def _answerer(
    values: dict[str, str], lines: set[int], answered: set[str]
) -> Callable[[Function, bool, set[str]], list[str]]:
    """prepend_to_functions' callback: a `return <wrong value>` for each answered function that encloses a
    changed line (generators are left alone: a return in front does not give their caller that value)."""

    def answer(fn: Function, method: bool, bound: set[str]) -> list[str]:
        if fn.name not in values or not any(fn.lineno <= n <= (fn.end_lineno or fn.lineno) for n in lines):
            return []
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(fn)):
            return []
        answered.add(fn.name)
        return [f"return {values[fn.name]}  # envforge weak-form probe"]

    return answer


def weak_form_sources(changes: list[SourceChange], forms: dict[str, WeakForm]) -> tuple[dict[str, str], list[str]]:
    """({path: the reference's file with the answering returns}, the forms answered) for the functions named in
    `forms` that enclose a line the reference changes (the changed function; an unchanged helper of the same
    name elsewhere is left alone)."""
    values = {name: v for name, form in forms.items() if (v := weak_value(form)) is not None}
    out: dict[str, str] = {}
    answered: set[str] = set()
    for change in changes:
        if change.path.endswith(".py"):
            lines = changed_lines(change.before, change.after)
            new, n = prepend_to_functions(change.after, _answerer(values, lines, answered))
            if n:
                out[change.path] = new
    return out, [forms[name].describe() for name in sorted(answered)]
