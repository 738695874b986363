"""What a commit's diff says about whether it can yield a failing-then-passing test.

A history candidate costs a sandbox derivation (minutes); these checks read only the diff and the
two versions of the changed files, so `sources scan` can leave out, before any sandbox time, the
commits whose shape rules out a FAIL_TO_PASS test (SWE-rebench-style pre-filters):

- a test change that only removes tests: the tests left after it already ran before it, so none
  can fail before the fix and pass after it (removing a skip/xfail marker is the exception);
- a Python change that is behaviour-neutral: the syntax trees before and after are the same once
  annotations, docstrings and typing-only imports are left out (comments and formatting are not
  in a syntax tree at all), so a type-only, lint or format commit changes nothing a test sees.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from envforge.verify.protect import split_diff

# A removed line naming one of these may un-skip a test: its removal can make a test fail-then-pass.
_MARKER = re.compile(r"(skip|xfail|expectedFailure|known_failure)", re.I)
_TYPING_MODULES = frozenset({"typing", "typing_extensions", "__future__", "_typeshed"})


def only_removes_tests(test_patch: str) -> bool:
    """True when the test change adds no line and removes no skip/xfail marker: every test that
    runs after it ran, unchanged, before it."""
    sections = split_diff(test_patch)
    if not sections:
        return False
    for section in sections:
        for line in section.text.splitlines():
            if line.startswith("+++") or line.startswith("---"):
                continue
            if line.startswith("+"):
                return False
            if line.startswith("-") and _MARKER.search(line):
                return False
        if "GIT binary patch" in section.text and "deleted file mode" not in section.text:
            return False  # a changed binary fixture is a change we cannot read
    return True


class _Neutral(ast.NodeTransformer):
    """Drops what a running program does not see: annotations, docstrings, typing-only imports,
    `if TYPE_CHECKING:` blocks and `cast(T, x)` wrappers."""

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                body = body[1:]
        return body

    def visit_Module(self, node: ast.Module) -> ast.AST:
        node.body = self._body(node.body)
        return self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.body = self._body(node.body)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.body, node.returns = self._body(node.body), None
        return self.generic_visit(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        node.body, node.returns = self._body(node.body), None
        return self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = None
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno))

    def visit_If(self, node: ast.If) -> ast.AST | None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
        if name == "TYPE_CHECKING":
            return None
        return self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> ast.AST | None:
        return None if all(a.name.split(".")[0] in _TYPING_MODULES for a in node.names) else node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | None:
        return None if (node.module or "").split(".")[0] in _TYPING_MODULES else node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name == "cast" and len(node.args) == 2 and not node.keywords:
            return self.visit(node.args[1])
        return self.generic_visit(node)


def _runtime_shape(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return ast.dump(_Neutral().visit(tree), include_attributes=False)


def behaviour_neutral(paths: list[str], read: Callable[[str, str], str | None]) -> bool:
    """True when every path is a Python file present before and after whose syntax tree, without
    annotations, docstrings and typing-only code, is unchanged. `read(side, path)` gives the file's
    text on side "old" or "new" (None: absent). A file that does not parse is not neutral."""
    if not paths:
        return False
    for path in paths:
        if not path.endswith(".py"):
            return False
        old, new = read("old", path), read("new", path)
        if old is None or new is None:
            return False
        before, after = _runtime_shape(old), _runtime_shape(new)
        if before is None or before != after:
            return False
    return True


__all__ = ["behaviour_neutral", "only_removes_tests"]
