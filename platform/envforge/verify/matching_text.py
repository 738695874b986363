"""A short text that a regular expression matches: what a forged checkpoint output prints.

A probe that fakes a checkpoint's output has to print what the checkpoint looks for, and
checkpoints state that as a regex. Walking the pattern's parse tree (the `re` module's own
parser) and taking the smallest choice at every node gives such a text for the patterns
checkpoints use (literals, classes, repeats, groups, alternations, anchors).
"""

from __future__ import annotations

import re

try:  # the parser moved in Python 3.11; `sre_parse` still works, with a deprecation warning
    import re._parser as _parser  # type: ignore[import-not-found]
    from re import _constants as _c  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as _c  # type: ignore[no-redef]
    import sre_parse as _parser  # type: ignore[no-redef]

_CATEGORY = {
    "DIGIT": "0",
    "NOT_DIGIT": "a",
    "WORD": "a",
    "NOT_WORD": " ",
    "SPACE": " ",
    "NOT_SPACE": "a",
    "LINEBREAK": "\n",
    "NOT_LINEBREAK": "a",
}


def _category(cat) -> str:
    name = str(cat).removeprefix("CATEGORY_").removeprefix("UNI_").removeprefix("LOC_")
    return _CATEGORY.get(name, "a")


def _in_class(items) -> str:
    negated = any(op is _c.NEGATE for op, _ in items)
    if negated:
        pattern = re.compile(_class_regex(items))
        return next(ch for ch in "xa0 _-Z" if pattern.fullmatch(ch))
    op, av = items[0]
    if op is _c.LITERAL:
        return chr(av)
    if op is _c.RANGE:
        return chr(av[0])
    if op is _c.CATEGORY:
        return _category(av)
    return "a"


def _class_regex(items) -> str:
    """A regex for one parsed character class, to test candidate characters against."""
    parts = []
    for op, av in items:
        if op is _c.NEGATE:
            parts.insert(0, "^")
        elif op is _c.LITERAL:
            parts.append(re.escape(chr(av)))
        elif op is _c.RANGE:
            parts.append(f"{re.escape(chr(av[0]))}-{re.escape(chr(av[1]))}")
        elif op is _c.CATEGORY:
            parts.append({"0": r"\d", "a": r"\w", " ": r"\s", "\n": r"\n"}.get(_category(av), ""))
    return "[" + "".join(parts) + "]"


def _walk(tree, groups: dict[int, str]) -> str:
    out = []
    for op, av in tree:
        if op is _c.LITERAL:
            out.append(chr(av))
        elif op is _c.NOT_LITERAL:
            out.append("x" if chr(av) != "x" else "y")
        elif op is _c.ANY:
            out.append(".")  # reads as the text the pattern's author meant ("127.0.0.1")
        elif op is _c.IN:
            out.append(_in_class(av))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", None)):
            low, _high, sub = av
            out.append(_walk(sub, groups) * low)
        elif op is _c.SUBPATTERN:
            group, _add, _del, sub = av
            text = _walk(sub, groups)
            if group is not None:
                groups[group] = text
            out.append(text)
        elif op is getattr(_c, "ATOMIC_GROUP", None):
            out.append(_walk(av, groups))
        elif op is _c.BRANCH:
            out.append(_walk(av[1][0], groups))
        elif op is _c.GROUPREF:
            out.append(groups.get(av, ""))
        elif op is _c.CATEGORY:
            out.append(_category(av))
        # AT (anchors) and ASSERT / ASSERT_NOT (lookarounds) add no text
    return "".join(out)


def matching_text(pattern: str, flags: int = re.MULTILINE) -> str | None:
    """A text `re.search(pattern, text, flags)` matches, or None when this walk cannot find one."""
    try:
        text = _walk(_parser.parse(pattern, flags), {})
    except (re.error, RecursionError, StopIteration, TypeError, ValueError):
        return None
    return text if re.search(pattern, text, flags) else None
