"""Which of a task's tests can notice a mutant: those that call the function it changes.

A mutant changes code inside one function's body (or a few). A test that never calls that
function runs exactly the reference's code, so its outcome is the reference's: it passes. Mutation
tools (mutmut, PIT, cosmic-ray) select tests this way from coverage; envforge does it by function,
not by line, because a line that did not run in the traced run may run under the mutant (a branch
the mutant flips), while a function that was never entered cannot be. One traced grading of the
reference (the reporter plugin's `_CallTracer`) records, per test, the functions of the changed files
it called. Then, for each mutant:

- the change is outside any function body (module or class level, a signature, a decorator, a
  default value: code that runs at import), the function was called outside a test (collection, a
  fixture wider than one test), a process was started outside a test, or the trace is incomplete:
  every test runs (`None`);
- no test calls the changed function: the mutant cannot change any outcome, so it survives without
  being graded (an empty selection);
- otherwise the required tests (FAIL_TO_PASS and PASS_TO_PASS alike) that call the function, and
  those that start processes (what a child runs is not traced), run, and only they are judged; the
  others pass, as they did with the reference.

What this cannot see: a value computed by the changed function in one test and kept (a cache, a
module global) for a later test that does not call it. Such a kill is missed and the mutant counts as
surviving, so the miss can only lower a strength, never raise it. bench/gate.py's strength agreement
measures both selections on the same tasks.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass, field
from typing import Iterator

from envforge.task import WORKSPACE

__all__ = ["CallMap", "changed_functions", "covering_tests"]

_LINES = re.compile(r"\r\n|\r|\n")
FunctionKey = tuple[str, int]  # (path relative to the work tree, the code object's first line)


@dataclass
class CallMap:
    """What the traced run recorded: per test, the functions of the changed files it called."""

    calls: dict[str, set[FunctionKey]] = field(default_factory=dict)
    everywhere: set[FunctionKey] = field(default_factory=set)
    spawners: set[str] = field(default_factory=set)
    spawned_outside: bool = False
    broken: str = ""

    @classmethod
    def from_json(cls, doc: dict) -> "CallMap":
        def keys(rows: list) -> set[FunctionKey]:
            return {(_relative(str(p)), int(line)) for p, line in rows}

        return cls(
            calls={str(t): keys(rows) for t, rows in doc.get("calls", {}).items()},
            everywhere=keys(doc.get("everywhere", [])),
            spawners={str(t) for t in doc.get("spawners", [])},
            spawned_outside=bool(doc.get("spawned_outside")),
            broken=str(doc.get("broken", "")),
        )

    @property
    def unusable(self) -> str:
        """Why nothing may be selected from this record ("" when it may)."""
        if self.broken:
            return f"the trace is incomplete: {self.broken}"
        if self.spawned_outside:
            return "a process was started outside a test (what it ran is not traced)"
        return ""


def _relative(path: str) -> str:
    prefix = WORKSPACE.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _first_line(node: ast.AST) -> int:
    """The line a statement's code starts on: its first decorator's for a decorated definition (what
    the code object of a decorated function records as its first line)."""
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decorators])  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _Function:
    qualname: str  # Outer.method.<locals>.inner, with an occurrence index for redefinitions
    first_line: int
    body_start: int
    end: int


def _functions(source: str) -> list[_Function]:
    """Every function definition with the lines its body spans, innermost last among nested ones."""
    out: list[_Function] = []
    seen: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                seen[name] = seen.get(name, 0) + 1
                qualname = f"{name}#{seen[name]}"
                if not isinstance(child, ast.ClassDef):
                    # a one-line `def f(n=3): return g(n)`: its line holds the signature too (it runs at import)
                    body_start = max(min(_first_line(s) for s in child.body), child.lineno + 1)
                    out.append(_Function(qualname, _first_line(child), body_start, child.end_lineno or child.lineno))
                walk(child, f"{qualname}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def _innermost(functions: list[_Function], first: int, last: int) -> _Function | None:
    """The innermost function whose body holds lines first..last (1-based, inclusive)."""
    holding = [f for f in functions if f.body_start <= first and last <= f.end]
    return max(holding, key=lambda f: f.body_start, default=None)


def _changed_spans(reference: str, mutant: str) -> Iterator[tuple[tuple[int, int] | None, tuple[int, int] | None]]:
    """(reference lines, mutant lines) of each change, 1-based inclusive; None for the side that is
    empty (a pure insertion or deletion)."""
    # Lines as the parser counts them: str.splitlines also breaks at form feeds and other separators.
    matcher = difflib.SequenceMatcher(None, _LINES.split(reference), _LINES.split(mutant), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            yield ((i1 + 1, i2) if i2 > i1 else None), ((j1 + 1, j2) if j2 > j1 else None)


def changed_functions(path: str, reference: str, mutant: str) -> set[FunctionKey] | None:
    """The functions whose bodies a mutant changes, by (path, first line) in the reference; None when
    some change is not inside a function body in both texts (it runs at import, or the structure
    changed), or a text does not parse."""
    try:
        ref_functions, mutant_functions = _functions(reference), _functions(mutant)
    except (SyntaxError, ValueError):
        return None
    by_name = {f.qualname: f for f in ref_functions}
    keys: set[FunctionKey] = set()
    for ref_span, mutant_span in _changed_spans(reference, mutant):
        names = set()
        for span, functions in ((ref_span, ref_functions), (mutant_span, mutant_functions)):
            if span is None:
                continue
            inner = _innermost(functions, *span)
            if inner is None:
                return None
            names.add(inner.qualname)
        if len(names) != 1 or (name := names.pop()) not in by_name:
            return None
        keys.add((path, by_name[name].first_line))
    return keys or None


def covering_tests(
    calls: CallMap, functions: set[FunctionKey] | None, fail_to_pass: list[str], pass_to_pass: list[str]
) -> list[str] | None:
    """The required ids a mutant of `functions` must run (see the module docstring): None for all of
    them, [] when no test calls the functions (the mutant survives ungraded)."""
    if functions is None or calls.unusable or functions & calls.everywhere:
        return None
    noticing = {t for t, keys in calls.calls.items() if keys & functions} | calls.spawners
    selected = [t for t in [*fail_to_pass, *pass_to_pass] if t in noticing]
    return None if len(selected) == len(fail_to_pass) + len(pass_to_pass) else selected
