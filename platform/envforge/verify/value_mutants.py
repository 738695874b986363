"""Value operators: wrong fixes that take the reference's changed branch but compute the wrong value.

The other operators (mutants.py) break a changed line's control or delete it, so any test that
notices the changed branch ran kills them: a FAIL_TO_PASS test that checks only
`len(result) == 1` scores as well as one that checks the merged values. These operators keep
the shape of what the changed code computes and get its content wrong, which only a test that
reads the value rejects:

- drop_element: a list/tuple/set/dict display with two or more entries loses its last one;
- replace_element: its last element (a dict: its last keyed value) replaced by its first, so the
  length stays;
- swap_merge: a dict display that merges (`{**a, **b}`, `{**a, "k": v}`) with its first and
  last entries swapped: the other side wins;
- comprehension_element: a comprehension's element replaced by its loop target (a dict
  comprehension's value by its key): the right length, the wrong elements;
- swap_value: a returned or assigned local replaced by another local of the same kind (bound
  earlier in the function to a display, comprehension, literal or builtin constructor of that kind);
- off_by_one: a returned or assigned arithmetic result (`a + b`, `len(x)`, `round(...)`) plus one;
- swap_view: `.keys()` and `.values()` swapped.

They apply only on the reference's changed lines (mutants.py decides where), so each adds a
handful of mutants at most; the cap and its even spread (generate_mutants) bound the total.
"""

from __future__ import annotations

import ast
import copy
from typing import Callable, Iterator

__all__ = ["Edit", "short", "value_edits"]

Edit = tuple[str, ast.AST, str, str]  # operator, node replaced, replacement text, description

_DISPLAYS = (ast.List, ast.Tuple, ast.Set)
_NUMERIC_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_NUMERIC_CALLS = {"len", "sum", "round", "abs", "int", "float", "min", "max"}
# what a builtin constructor or function returns, for telling locals of the same kind apart
_CALL_KINDS = {
    "list": "list",
    "sorted": "list",
    "dict": "dict",
    "set": "set",
    "frozenset": "set",
    "tuple": "tuple",
    "str": "str",
    "int": "int",
    "len": "int",
    "float": "float",
}
_VIEWS = {"keys": "values", "values": "keys"}


def short(text: str, limit: int = 60) -> str:
    """One line of at most `limit` characters, for a mutant's description."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _kind(value: ast.AST) -> str | None:
    """What kind of value an expression builds, when its syntax says so (None: unknown)."""
    if isinstance(value, (ast.List, ast.ListComp)):
        return "list"
    if isinstance(value, (ast.Dict, ast.DictComp)):
        return "dict"
    if isinstance(value, (ast.Set, ast.SetComp)):
        return "set"
    if isinstance(value, ast.Tuple):
        return "tuple"
    if isinstance(value, ast.JoinedStr):
        return "str"
    if isinstance(value, ast.Constant) and value.value is not None:
        return type(value.value).__name__
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return _CALL_KINDS.get(value.func.id)
    return None


def _locals_by_kind(fn: ast.AST) -> list[tuple[int, str, str]]:
    """(line, name, kind) of every plain local the function binds to a value of a known kind."""
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        kind = _kind(value)
        if isinstance(target, ast.Name) and kind:
            out.append((node.lineno, target.id, kind))
    return out


def _assigned_or_returned(node: ast.AST) -> ast.AST | None:
    """The value a return statement or a single assignment produces (what the changed code computes)."""
    if isinstance(node, ast.Return):
        return node.value
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value
    return None


def _display_edits(node: ast.AST, segment: Callable[[ast.AST], str]) -> Iterator[Edit]:
    """drop_element, replace_element and swap_merge of a list/tuple/set/dict display."""
    candidates: list[tuple[str, ast.AST]] = []
    if isinstance(node, _DISPLAYS) and len(node.elts) >= 2 and not isinstance(getattr(node, "ctx", None), ast.Store):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            return
        dropped, replaced = copy.copy(node), copy.copy(node)
        dropped.elts = node.elts[:-1]
        replaced.elts = [*node.elts[:-1], node.elts[0]]
        candidates += [("drop_element", dropped), ("replace_element", replaced)]
    elif isinstance(node, ast.Dict) and len(node.keys) >= 2:
        shorter = copy.copy(node)
        shorter.keys, shorter.values = node.keys[:-1], node.values[:-1]
        candidates.append(("drop_element", shorter))
        keyed = [i for i, k in enumerate(node.keys) if k is not None]
        if len(keyed) >= 2:
            other_value = copy.copy(node)
            other_value.values = list(node.values)
            other_value.values[keyed[-1]] = node.values[keyed[0]]
            candidates.append(("replace_element", other_value))
        if None in node.keys:  # a merge: which side wins is the point
            swapped = copy.copy(node)
            swapped.keys = [node.keys[-1], *node.keys[1:-1], node.keys[0]]
            swapped.values = [node.values[-1], *node.values[1:-1], node.values[0]]
            candidates.append(("swap_merge", swapped))
    before = ast.dump(node)
    for operator, new in candidates:
        if ast.dump(new) != before:  # equal elements swapped or replaced: the same display, no mutant
            yield operator, node, f"({ast.unparse(new)})", f"{short(segment(node))} -> {short(ast.unparse(new))}"


def _comprehension_edit(node: ast.AST, segment: Callable[[ast.AST], str]) -> Iterator[Edit]:
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
        element, target = node.elt, node.generators[0].target
    elif isinstance(node, ast.DictComp):
        element, target = node.value, node.key
    else:
        return
    if ast.dump(element) == ast.dump(target):
        return
    text = f"({segment(target)})"
    yield "comprehension_element", element, text, f"{short(segment(element))} -> {short(segment(target))}"


def value_edits(node: ast.AST, segment: Callable[[ast.AST], str], fn: ast.AST | None) -> Iterator[Edit]:
    """The value operators' rewrites of one node on a changed line (`fn`: its enclosing function)."""
    yield from _display_edits(node, segment)
    yield from _comprehension_edit(node, segment)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _VIEWS
        and not node.args
        and not node.keywords
    ):
        new = f"{segment(node.func.value)}.{_VIEWS[node.func.attr]}()"
        yield "swap_view", node, f"({new})", f"{short(segment(node))} -> {short(new)}"
    value = _assigned_or_returned(node)
    if value is None:
        return
    if isinstance(value, ast.Name) and fn is not None:
        kinds = _locals_by_kind(fn)
        mine = {k for line, name, k in kinds if name == value.id}
        others = [
            name for line, name, k in kinds if k in mine and name != value.id and line < getattr(node, "lineno", 0)
        ]
        if len(mine) == 1 and others:
            yield "swap_value", value, others[-1], f"{value.id} -> {others[-1]}"
    numeric_call = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _NUMERIC_CALLS
    if (isinstance(value, ast.BinOp) and isinstance(value.op, _NUMERIC_OPS)) or numeric_call:
        yield (
            "off_by_one",
            value,
            f"({segment(value)}) + 1",
            f"{short(segment(value))} -> ({short(segment(value))}) + 1",
        )
