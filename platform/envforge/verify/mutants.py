"""Mutants of a reference solution: wrong fixes close to the right one, for measuring how specific a
task's tests are.

Scope: the code the reference changes, i.e. the lines it adds or replaces and the function that
encloses each of them (a fix's context: a test that any edit to that function satisfies rewards
the wrong fix). Operators work on the standard `ast` module's tree and rewrite only the source
span of the node they mutate, so the rest of the file (formatting, comments) is the
reference's own and each mutant's diff is as small as a policy's would be:

- compare_flip: a comparison negated (`==`/`!=`, `<`/`>=`, `is`/`is not`, `in`/`not in`);
- boundary: a comparison's boundary moved (`<`/`<=`, `>`/`>=`), an integer constant +1 / -1;
- negate_condition: an `if`/`while`/conditional-expression test wrapped in `not (...)`;
- bool_op: `and`/`or` swapped; arith: `+`/`-`, `*`/`/`, `//` -> `/` swapped;
- return_constant / return_input: a return's value replaced by None, or by the function's
  first argument (the identity "fix");
- delete_statement: an assignment, call, raise, `if` block (a new guard clause) replaced by `pass`;
- swap_args: a call's first two positional arguments swapped;
- revert_hunk: one hunk of the reference's diff undone, the others kept (a partial fix);
- value operators, on the changed lines only (value_mutants.py): what the changed code computes
  or returns replaced by a wrong value of the same shape (an element dropped or replaced, a
  merge's order swapped, a comprehension's element, another same-kind local, a number off by
  one, `.keys()`/`.values()` swapped), so that "takes the branch but produces the wrong value"
  fixes exist: the other operators' mutants are killed by any test that notices the changed
  branch is taken.

Only Python files are mutated (hunk reverts included: fix commits carry README, CI and data
hunks whose revert is no wrong fix), and a module-level `__version__ = ...` is left alone.

mutmut and cosmic-ray were looked at first: both own the test run (mutmut 3 runs pytest
in-process through trampolines in a `mutants/` copy; cosmic-ray mutates files in place from a
session database and runs a test command itself) and scope by module, not by a diff's lines;
neither yields a mutant as a diff that envforge's grader can grade on a pristine copy in a pool
sandbox. libcst would keep formatting too, but span rewriting on `ast` does that without a new
dependency. See docs/verification.md.

A mutant whose file has the same AST as the reference's (after normalisation: positions and
formatting dropped), or that swaps the two arguments of `min` / `max`, is marked `equivalent`:
it cannot change what any test observes except through the source text itself (or, for
`min`/`max`, which of two equal values is returned). Each mutant is parsed and compared as the
top-level statement that holds it (`_TopLevel`), which gives the same answer as whole files.
"""

from __future__ import annotations

import ast
import copy
import difflib
from dataclasses import dataclass
from typing import Callable, Iterator

from envforge.verify.value_mutants import Edit, value_edits
from envforge.verify.value_mutants import short as _short

__all__ = ["SourceChange", "Mutant", "changed_lines", "file_diff", "generate_mutants", "same_ast"]


@dataclass(frozen=True)
class SourceChange:
    """One file the reference changes: its text in the task's workspace (None: the reference adds it)
    and after the reference."""

    path: str
    before: str | None
    after: str


@dataclass(frozen=True)
class Mutant:
    name: str
    operator: str
    path: str
    line: int  # 1-based line of the mutated node in the reference's version of the file
    after: str  # the whole mutated file
    description: str
    equivalent: bool  # same AST as the reference's file (likely equivalent)
    on_changed: bool = True  # on the reference's changed lines (or a hunk undone), not elsewhere in their functions


_NEGATED = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div}
_DELETABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.If, ast.Delete)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Builtins whose result does not depend on the order of their first two arguments: swapping them is
# an equivalent mutant (seen as survivors on the ledger tasks: `min(amount, balance)` swapped).
_COMMUTATIVE = {"min", "max"}


def file_diff(path: str, before: str | None, after: str) -> str:
    """A git-style unified diff of one file (`before` None: a new file), as `git apply` takes it."""
    a = before.splitlines(keepends=True) if before is not None else []
    b = after.splitlines(keepends=True)
    out = [f"diff --git a/{path} b/{path}\n"] + (["new file mode 100644\n"] if before is None else [])
    for line in difflib.unified_diff(a, b, f"a/{path}" if before is not None else "/dev/null", f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def changed_lines(before: str | None, after: str) -> set[int]:
    """1-based lines of `after` that the change added or replaced (for a deletion, the line after it)."""
    b = after.splitlines()
    if before is None:
        return set(range(1, len(b) + 1))
    lines: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, before.splitlines(), b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            lines.update(range(j1 + 1, j2 + 1))
        elif tag == "delete":
            lines.add(min(j1 + 1, max(1, len(b))))
    return lines


def same_ast(a: str, b: str) -> bool:
    """Whether two Python sources parse to the same tree (positions, comments, formatting and module-level
    dunder assignments such as `__version__` ignored)."""

    def normalised(source: str) -> str:
        tree = ast.parse(source)
        tree.body = [n for n in tree.body if not _metadata(n, None)]
        return ast.dump(tree)

    try:
        return normalised(a) == normalised(b)
    except (SyntaxError, ValueError):
        return False


class _Source:
    """A file's text with byte offsets per line: `ast` positions count UTF-8 bytes within a line."""

    def __init__(self, text: str):
        self.data = text.encode("utf-8", errors="surrogateescape")
        self.starts = [0]
        for i, byte in enumerate(self.data):
            if byte == 0x0A:
                self.starts.append(i + 1)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.starts[node.lineno - 1] + node.col_offset, self.starts[node.end_lineno - 1] + node.end_col_offset)

    def replaced(self, node: ast.AST, text: str) -> str:
        start, end = self.span(node)
        return (self.data[:start] + text.encode("utf-8", errors="surrogateescape") + self.data[end:]).decode(
            "utf-8", errors="surrogateescape"
        )

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode("utf-8", errors="surrogateescape")


class _TopLevel:
    """The module's top-level statements as byte spans, so a mutant is parsed and compared as the one statement
    that holds it: the rest of the file is the reference's own text, so the file parses and has the reference's
    tree exactly when that statement does (parsing whole files per mutant cost seconds per task on real
    modules). A statement's span starts at its line's first decorator and ends where its last token does."""

    def __init__(self, tree: ast.Module, src: _Source):
        self.src = src
        self.spans: list[tuple[int, int]] = []
        # `__version__ = ...`, `__all__ = [...]`: same_ast leaves them out, so a mutant inside one keeps the tree
        self.metadata = {i for i, node in enumerate(tree.body) if _metadata(node, None)}
        for node in tree.body:
            decorators = getattr(node, "decorator_list", [])
            # a top-level decorator's `@` is its line's first character; a statement after `;` starts at its column
            start = (
                src.starts[decorators[0].lineno - 1] if decorators else src.starts[node.lineno - 1] + node.col_offset
            )
            end_line, end_col = node.end_lineno or node.lineno, node.end_col_offset or 0  # always set by ast.parse
            self.spans.append((start, src.starts[end_line - 1] + end_col))
        self._dumps: dict[int, str] = {}

    def text(self, index: int) -> str:
        s, e = self.spans[index]
        return self.src.data[s:e].decode("utf-8", errors="surrogateescape")

    def holding(self, node: ast.AST) -> int:
        start, end = self.src.span(node)
        for i, (s, e) in enumerate(self.spans):
            if s <= start and end <= e:
                return i
        raise ValueError("node outside every top-level statement")

    def mutated(self, index: int, node: ast.AST, text: str) -> str:
        """The text of top-level statement `index` with `node` replaced by `text`."""
        s, e = self.spans[index]
        start, end = self.src.span(node)
        data = self.src.data
        return (data[s:start] + text.encode("utf-8", errors="surrogateescape") + data[end:e]).decode(
            "utf-8", errors="surrogateescape"
        )

    def dump(self, index: int) -> str:
        """The reference's statement `index` as `ast.dump` gives it (positions left out)."""
        if index not in self._dumps:
            self._dumps[index] = ast.dump(ast.parse(self.text(index)))
        return self._dumps[index]


def _first_argument(fn: ast.AST | None, in_class: bool) -> str | None:
    if fn is None:
        return None
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if in_class and params and params[0] in ("self", "cls"):
        params = params[1:]
    return params[0] if params else None


def _edits(node: ast.AST, src: _Source, fn: ast.AST | None, in_class: bool) -> Iterator[Edit]:
    """The operators' rewrites of one node."""

    def expr(new: ast.AST) -> str:
        return f"({ast.unparse(new)})"

    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        op = type(node.ops[0])
        for operator, table in (("compare_flip", _NEGATED), ("boundary", _BOUNDARY)):
            if op in table:
                new = copy.copy(node)
                new.ops = [table[op]()]
                yield operator, node, expr(new), f"{_short(src.segment(node))} -> {_short(ast.unparse(new))}"
    elif isinstance(node, ast.BoolOp):
        new = copy.copy(node)
        new.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "bool_op", node, expr(new), f"{_short(src.segment(node))} -> {_short(ast.unparse(new))}"
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        new = copy.copy(node)
        new.op = _ARITH[type(node.op)]()
        yield "arith", node, expr(new), f"{_short(src.segment(node))} -> {_short(ast.unparse(new))}"
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            yield "boundary", node, f"({node.value + delta})", f"{node.value} -> {node.value + delta}"
    elif (
        isinstance(node, ast.Call)
        and len(node.args) >= 2
        and not any(isinstance(a, ast.Starred) for a in node.args[:2])
    ):
        new = copy.copy(node)
        new.args = [node.args[1], node.args[0], *node.args[2:]]
        yield "swap_args", node, expr(new), f"{_short(src.segment(node))} -> {_short(ast.unparse(new))}"
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        test = node.test
        yield (
            "negate_condition",
            test,
            f"(not ({src.segment(test)}))",
            f"{_short(src.segment(test))} -> not ({_short(src.segment(test))})",
        )
    if isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            yield "return_constant", node, "return None", f"{_short(src.segment(node))} -> return None"
        arg = _first_argument(fn, in_class)
        if arg is not None and not (isinstance(node.value, ast.Name) and node.value.id == arg):
            yield "return_input", node, f"return {arg}", f"{_short(src.segment(node))} -> return {arg}"
    if isinstance(node, _DELETABLE) and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
        yield "delete_statement", node, "pass", f"deleted: {_short(src.segment(node))}"


def _metadata(node: ast.AST, fn: ast.AST | None) -> bool:
    """A module-level assignment to a dunder name (`__version__ = "1.20.2"`): a release's bookkeeping
    that fix commits carry, not code a test could or should pin."""
    return (
        fn is None
        and isinstance(node, ast.Assign)
        and all(isinstance(t, ast.Name) and t.id.startswith("__") and t.id.endswith("__") for t in node.targets)
    )


def _walk(tree: ast.Module) -> Iterator[tuple[ast.AST, ast.AST | None, bool]]:
    """Every node with its innermost enclosing function and whether that function is a method."""

    def visit(node: ast.AST, fn: ast.AST | None, in_class: bool, parent_is_class: bool) -> Iterator:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _FUNCTIONS):
                yield child, fn, in_class
                yield from visit(child, child, parent_is_class, False)
            elif isinstance(child, ast.ClassDef):
                yield child, fn, in_class
                yield from visit(child, fn, in_class, True)
            elif isinstance(child, ast.JoinedStr):
                yield child, fn, in_class  # f-string internals: not mutated
            else:
                yield child, fn, in_class
                yield from visit(child, fn, in_class, False)

    yield from visit(tree, None, False, False)


def _python_mutants(change: SourceChange) -> list[tuple[int, Mutant]]:
    """(priority, mutant) for one Python file: 1 on a changed line, 2 elsewhere in an enclosing function."""
    try:
        tree = ast.parse(change.after)
    except (SyntaxError, ValueError):
        return []
    src = _Source(change.after)
    lines = changed_lines(change.before, change.after)
    touched = {
        id(fn) for node, fn, _ in _walk(tree) if fn is not None and hasattr(node, "lineno") and node.lineno in lines
    }
    out: list[tuple[int, Mutant]] = []
    top = _TopLevel(tree, src)
    seen: set[tuple[int, str]] = set()
    for node, fn, in_class in _walk(tree):
        if not hasattr(node, "lineno") or isinstance(node, (*_FUNCTIONS, ast.ClassDef)) or _metadata(node, fn):
            continue
        on_changed = bool(lines & set(range(node.lineno, node.end_lineno + 1)))
        if not on_changed and (fn is None or id(fn) not in touched):
            continue
        edits = list(_edits(node, src, fn, in_class))
        if on_changed and getattr(node, "lineno", 0) in lines:
            edits += value_edits(node, src.segment, fn)
        for operator, target, text, description in edits:
            index = top.holding(target)
            statement = top.mutated(index, target, text)
            if (index, statement) in seen or statement == top.text(index):
                continue
            try:
                same_tree = ast.dump(ast.parse(statement)) == top.dump(index) or index in top.metadata
            except (SyntaxError, ValueError):
                continue  # a rewrite that does not fit its context (an elif's span, a decorator)
            seen.add((index, statement))
            commutative = (
                operator == "swap_args"
                and isinstance(target.func, ast.Name)
                and target.func.id in _COMMUTATIVE
                and not target.keywords
                and len(target.args) == 2
            )
            changed_here = on_changed and target.lineno in lines
            out.append(
                (
                    1 if changed_here else 2,
                    Mutant(
                        f"{operator}:{change.path}:{target.lineno}",
                        operator,
                        change.path,
                        target.lineno,
                        src.replaced(target, text),
                        description,
                        commutative or same_tree,
                        changed_here,
                    ),
                )
            )
    return out


def _hunk_reverts(change: SourceChange, only_hunk_of_the_diff: bool) -> list[tuple[int, Mutant]]:
    """One mutant per hunk of the reference's change to the file, that hunk undone."""
    if change.before is None:
        return []
    a, b = change.before.splitlines(keepends=True), change.after.splitlines(keepends=True)
    groups = list(difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(3))
    if only_hunk_of_the_diff and len(groups) == 1:
        return []  # undoing the diff's only hunk is the empty solution, which the gate grades already
    out = []
    for group in groups:
        reverted, pos = [], 0
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                continue
            reverted += b[pos:j1] + a[i1:i2]
            pos = j2
        text = "".join(reverted + b[pos:])
        first = next(j1 for tag, _, _, j1, _ in group if tag != "equal") + 1
        equivalent = change.path.endswith(".py") and same_ast(text, change.after)
        out.append(
            (
                0,
                Mutant(
                    f"revert_hunk:{change.path}:{first}",
                    "revert_hunk",
                    change.path,
                    first,
                    text,
                    f"the reference's hunk at line {first} undone",
                    equivalent,
                ),
            )
        )
    return out


def _spread(items: list, n: int) -> list:
    """n items evenly spaced over the list (all of them when it holds n or fewer)."""
    if n <= 0:
        return []
    if len(items) <= n:
        return list(items)
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)] if n > 1 else items[:1]


def generate_mutants(
    changes: list[SourceChange], cap: int, is_python: Callable[[str], bool] = lambda p: p.endswith(".py")
) -> tuple[list[Mutant], int]:
    """(at most `cap` mutants, how many there were before the cap), most telling first: hunk reverts,
    then mutants on the reference's changed lines, then the rest of their enclosing functions. When a
    group does not fit, mutants spread evenly over it are kept (deterministically)."""
    single_file = sum(is_python(c.path) for c in changes) == 1  # its only hunk undone: (nearly) the empty solution
    ranked: list[tuple[int, Mutant]] = []
    for change in changes:
        if is_python(change.path):  # a README, CI or data hunk undone is no wrong fix (parse's fixes carry them)
            ranked += _hunk_reverts(change, single_file) + _python_mutants(change)
    names: dict[str, int] = {}
    unique: list[tuple[int, Mutant]] = []
    for priority, m in ranked:
        n = names.get(m.name, 0)
        names[m.name] = n + 1
        unique.append(
            (
                priority,
                m
                if n == 0
                else Mutant(
                    f"{m.name}#{n + 1}", m.operator, m.path, m.line, m.after, m.description, m.equivalent, m.on_changed
                ),
            )
        )
    chosen: list[Mutant] = []
    for priority in (0, 1, 2):
        group = [m for p, m in unique if p == priority]
        chosen += _spread(group, cap - len(chosen))
    return chosen, len(unique)
