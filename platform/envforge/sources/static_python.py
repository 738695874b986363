"""Reading a project's Python build files (setup.py, noxfile.py) without running them.

Inference must never execute a repository's code, so what those files declare is read from their
syntax tree: literals, and names bound to literals at module level.
"""

from __future__ import annotations

import ast


def parse_module(text: str) -> tuple[ast.Module, dict[str, ast.expr]] | None:
    """The file's tree and its module-level `NAME = value` bindings; None when it is not Python."""
    try:
        module = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names = {
        t.id: n.value for n in module.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    return module, names


def literal(node: ast.AST | None, names: dict[str, ast.expr]):
    """The value of a literal, or of a name bound to one at module level; None for anything computed."""
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
