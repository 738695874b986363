"""The special-case probe: keep the buggy code, and answer the FAIL_TO_PASS tests' literal inputs
with their literal expected values.

A policy under RL finds this the moment a task's tests check one input: `assert f(3) == 9` is
satisfied by `if x == 3: return 9` in front of the unchanged bug. The probe reads such cases
from the FAIL_TO_PASS tests' simple asserts (a call whose arguments are all literals, compared
with `==` or `is` to a literal, or asserted true/false; unittest's assertEqual / assertIs /
assertTrue / assertFalse / assertIsNone alike), finds the called function in the files the
reference changes (as they are in the task's workspace, i.e. buggy), and adds one guarded
return per case at the top of its body. "Literal" includes constructors of literals
(`Money("8.00")`, `date(2024, 2, 29)`), used only where the answering module binds the
constructor's name. Its diff is graded like any solution; a task whose
verification accepts it is "overfittable", the diff kept as evidence.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from typing import Callable

from envforge.verify.mutants import file_diff

__all__ = ["Function", "LiteralCase", "literal_cases", "prepend_to_functions", "special_case_diff", "split_test_id"]

Function = ast.FunctionDef | ast.AsyncFunctionDef
_EQUAL_ASSERTS = {"assertEqual", "assertEquals", "assertIs"}
_TRUTH_ASSERTS = {"assertTrue": "True", "assertFalse": "False", "assertIsNone": "None"}


@dataclass(frozen=True)
class LiteralCase:
    """`function(*args, **kwargs)` is expected to give `expected` (all as Python source of literals)."""

    function: str
    args: tuple[str, ...]
    kwargs: tuple[tuple[str, str], ...]
    expected: str
    needs: tuple[str, ...] = ()  # names the answering module must bind (constructors: Money, date)


def split_test_id(test_id: str, framework: str) -> tuple[str, str] | None:
    """(test file path, test function name) of a FAIL_TO_PASS id (pytest or unittest), parameters dropped."""
    if framework == "pytest" and "::" in test_id:
        path, *rest = test_id.split("::")
        return path, rest[-1].split("[", 1)[0]
    if framework == "unittest" and test_id.count(".") >= 2:
        parts = test_id.split(".")
        return "/".join(parts[:-2]) + ".py", parts[-1]
    return None


def is_literal(node: ast.AST) -> bool:
    """Whether the expression is a Python literal (what `ast.literal_eval` accepts)."""
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _root_name(func: ast.AST) -> str | None:
    """`Money` for `Money`, `dt` for `dt.date`: the name a constructor's module must bind."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else None


def _value(node: ast.AST, needs: set[str], depth: int = 0) -> bool:
    """A literal, or a constructor of literals (`Money("8.00")`, `date(2024, 2, 29)`); the constructors'
    root names are added to `needs` (the module that answers with it must bind them)."""
    if is_literal(node):
        return True
    if depth > 2 or not isinstance(node, ast.Call) or _root_name(node.func) is None:
        return False
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        return False
    if all(_value(a, needs, depth + 1) for a in [*node.args, *(k.value for k in node.keywords)]):
        needs.add(_root_name(node.func))
        return True
    return False


def _case(call: ast.AST, expected: ast.AST) -> LiteralCase | None:
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name is None or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    needs: set[str] = set()
    if not all(_value(a, needs) for a in [*call.args, *(k.value for k in call.keywords), expected]):
        return None
    return LiteralCase(
        name,
        tuple(ast.unparse(a) for a in call.args),
        tuple((k.arg, ast.unparse(k.value)) for k in call.keywords),
        ast.unparse(expected),
        tuple(sorted(needs)),
    )


def _constant(value: str) -> ast.AST:
    return ast.Constant({"True": True, "False": False, "None": None}[value])


def _cases_of_statement(node: ast.AST) -> list[LiteralCase]:
    if isinstance(node, ast.Assert):
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is)):
            left, right = test.left, test.comparators[0]
            for call, value in ((left, right), (right, left)):
                if isinstance(call, ast.Call) and (case := _case(call, value)):
                    return [case]
            return []
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return [c for c in [_case(test.operand, _constant("False"))] if c]
        return [c for c in [_case(test, _constant("True"))] if c]
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
        method, args = node.value.func.attr, node.value.args
        if method in _EQUAL_ASSERTS and len(args) >= 2:
            for call, value in ((args[0], args[1]), (args[1], args[0])):
                if isinstance(call, ast.Call) and (case := _case(call, value)):
                    return [case]
        if method in _TRUTH_ASSERTS and args:
            return [c for c in [_case(args[0], _constant(_TRUTH_ASSERTS[method]))] if c]
    return []


def literal_cases(test_source: str, test_names: list[str]) -> list[LiteralCase]:
    """The literal cases the named test functions (methods included) assert, in source order, each once."""
    try:
        tree = ast.parse(test_source)
    except (SyntaxError, ValueError):
        return []
    wanted = set(test_names)
    out: list[LiteralCase] = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in wanted:
            for node in ast.walk(fn):
                out += [c for c in _cases_of_statement(node) if c not in out]
    return out


def _guard(case: LiteralCase, fn: Function, method: bool) -> str | None:
    """`if <params equal the literals>: return <expected>`, or None when the arguments do not bind."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if method and params and params[0] in ("self", "cls"):
        params = params[1:]
    if len(case.args) > len(params):
        return None
    named = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    if any(k not in named for k, _ in case.kwargs):
        return None
    parts = [f"{p} == {v}" for p, v in zip(params, case.args)] + [f"{k} == {v}" for k, v in case.kwargs]
    return f"if {' and '.join(parts) or 'True'}:\n    return {case.expected}\n"


def _module_names(tree: ast.Module) -> set[str]:
    """Names the module binds at its top level (imports, definitions, assignments), and the builtins."""
    names = set(dir(builtins))
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def prepend_to_functions(source: str, lines_for: Callable[[Function, bool, set[str]], list[str]]) -> tuple[str, int]:
    """The source with `lines_for(function, is_method, names the module binds)` inserted at the top of each
    function's body (after its docstring, indented as the body); (new source, functions changed)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source, 0
    bound = _module_names(tree)
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
    lines = source.splitlines(keepends=True)
    inserts: dict[int, list[str]] = {}
    changed = 0
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = fn.body
        first = (
            body[1]
            if len(body) > 1
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
            and isinstance(body[0].value.value, str)
            else body[0]
        )
        if first.lineno == fn.lineno:
            continue  # a one-line `def f(): return x`: no line to insert before
        added = lines_for(fn, id(fn) in methods, bound)
        if added:
            indent = lines[first.lineno - 1][: len(lines[first.lineno - 1]) - len(lines[first.lineno - 1].lstrip())]
            inserts.setdefault(first.lineno - 1, []).extend(indent + line + "\n" for line in added)
            changed += 1
    for index in sorted(inserts, reverse=True):
        lines[index:index] = inserts[index]
    return "".join(lines), changed


def _with_guards(source: str, cases: list[LiteralCase]) -> tuple[str, int]:
    """The source with guards inserted into the functions the cases call; (new source, cases used)."""
    used = 0

    def guards(fn: Function, method: bool, bound: set[str]) -> list[str]:
        nonlocal used
        out = []
        for case in cases:
            if case.function != fn.name or not set(case.needs) <= bound:
                continue
            guard = _guard(case, fn, method)
            if guard is not None:
                out += guard.splitlines()
                used += 1
        return out

    new, _ = prepend_to_functions(source, guards)
    return new, used


def special_case_diff(sources: dict[str, str], cases: list[LiteralCase]) -> tuple[str, int]:
    """(the probe's diff against the workspace, how many cases it answers) for the buggy `sources`
    ({path: text as in the workspace}); an empty diff when no case's function is found."""
    out, used = [], 0
    for path in sorted(sources):
        new, n = _with_guards(sources[path], cases)
        if n:
            out.append(file_diff(path, sources[path], new))
            used += n
    return "".join(out), used
