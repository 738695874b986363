"""Code-aware views of text: renamed copies of code still match.

A benchmark leak rarely survives verbatim: the function gets a new name, the variables too,
and a word-level comparison then sees a shared run broken at every identifier. Two views of
Python code make such copies comparable again:

- the **code view**: the token stream with every identifier the author chose (functions,
  variables, parameters, classes) replaced by `ID` and every string literal by `STR`;
  keywords, builtins, attribute names and imported names stay (a rename does not touch
  them), numbers stay (they are the content of tests and examples), comments and docstrings
  go to the prose view;
- the **prose view**: docstrings, comments and the text around the code, as words, with
  every identifier the code defines replaced by `ID` (so `>>> has_close_elements([1.0], 0.5)`
  and `>>> nearby([1.0], 0.5)` read the same).

The lexer is a regular expression, not `tokenize`: it has to read fragments (the changed
lines of a patch, a function pasted into an instruction, a file cut at a size cap) where the
standard tokenizer stops at the first unbalanced bracket or inconsistent dedent. On complete
files it yields the same names, numbers and strings as `tokenize` (tested).
"""

from __future__ import annotations

import builtins
import keyword
import re
from dataclasses import dataclass

from envforge.quality.text import tokens

ID, STR = "ID", "STR"
_KEEP = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins)) | {"self", "cls"}

_LEX = re.compile(
    r"""
  (?P<comment>\#[^\n]*)
| (?P<string>(?:[rRbBuUfF]{1,2})?(?:\"\"\"[\s\S]*?(?:\"\"\"|\Z)|'''[\s\S]*?(?:'''|\Z)
             |"(?:\\.|[^"\\\n])*(?:"|$)|'(?:\\.|[^'\\\n])*(?:'|$)))
| (?P<number>0[xXoObB][\da-fA-F_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?[jJ]?)
| (?P<name>[^\W\d]\w*)
| (?P<op>\*\*=?|//=?|->|<<=?|>>=?|:=|[-+*/%&|^@=<>!]=|[-+*/%&|^~<>=.,:;@()\[\]{}])
| (?P<nl>\n)
""",
    re.VERBOSE | re.MULTILINE,
)

_CODE_START = re.compile(
    r"^[ \t]*(?:def |class |async def |from [\w.]+ import |import [\w.]|@\w|if __name__)", re.MULTILINE
)
_FENCE = re.compile(r"^[ \t]*```[\w+-]*[ \t]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_PY_SUFFIXES = (".py", ".pyi", ".pyw")
_ASSIGN = frozenset({"=", "+=", "-=", "*=", "/=", "//=", "%=", "|=", "&=", "^=", "**=", ">>=", "<<=", "@="})


Lexeme = tuple  # (kind, text); kind: comment | string | number | name | op | nl. Plain tuples: files are big.
KIND, TEXT = 0, 1


def lex(source: str) -> list[Lexeme]:
    """Python lexemes of a whole file or a fragment; anything unrecognised is skipped."""
    return [(m.lastgroup, m.group()) for m in _LEX.finditer(source)]


def _doc_strings(lexemes: list[Lexeme]) -> set[int]:
    """Indexes of strings that stand alone as a statement (docstrings and string comments)."""
    out = set()
    depth = 0
    sig = [i for i, x in enumerate(lexemes) if x[KIND] != "comment"]
    for k, i in enumerate(sig):
        x = lexemes[i]
        if x[KIND] == "op" and x[TEXT] in "([{":
            depth += 1
        elif x[KIND] == "op" and x[TEXT] in ")]}":
            depth = max(0, depth - 1)
        elif x[KIND] == "string" and depth == 0:
            before = lexemes[sig[k - 1]] if k else None
            after = lexemes[sig[k + 1]] if k + 1 < len(sig) else None
            if (before is None or before[KIND] == "nl") and (after is None or after[KIND] == "nl"):
                out.add(i)
    return out


def defined_names(lexemes: list[Lexeme]) -> set[str]:
    """Names the code itself defines: functions, classes, parameters, assignment, loop, `as`
    and lambda targets. An approximation from the token stream that also works on fragments."""
    names: set[str] = set()
    n = len(lexemes)
    depth = 0
    line_names: list[str] = []  # names at depth 0 since the start of the logical line
    in_params = -1  # depth of an open `def f(` parameter list
    in_for = in_lambda = False
    prev: Lexeme | None = None
    for i, x in enumerate(lexemes):
        if x[KIND] == "comment":
            continue
        t = x[TEXT]
        if x[KIND] == "nl":
            if depth == 0:
                line_names, in_for = [], False
            prev = x
            continue
        if x[KIND] == "op":
            if t in "([{":
                depth += 1
            elif t in ")]}":
                depth = max(0, depth - 1)
                if in_params >= 0 and depth < in_params:
                    in_params = -1
            elif t == "=" and depth == 0:
                names.update(line_names)
                line_names = []
            elif t == ":" and in_lambda:
                in_lambda = False
            if (
                (t == ":=" or (depth == 0 and t in _ASSIGN))
                and prev is not None
                and prev[KIND] == "name"
                and prev[TEXT] not in _KEEP
            ):
                names.add(prev[TEXT])
        elif x[KIND] == "name":
            p = prev[TEXT] if prev is not None else ""
            if p in ("def", "class", "as") or in_lambda or in_for:
                if t not in _KEEP:
                    names.add(t)
            elif in_params >= 0 and depth == in_params and p in ("(", ",", "*", "**") and t not in _KEEP:
                names.add(t)
            elif depth == 0 and t not in _KEEP and p != ".":
                line_names.append(t)
            if t == "in" and in_for:
                in_for = False
            elif t == "for":
                in_for = True
            elif t == "lambda":
                in_lambda = True
            if p == "def" and i + 1 < n and lexemes[i + 1][TEXT] == "(":
                in_params = depth + 1
        prev = x
    return names


@dataclass(frozen=True)
class CodeViews:
    """The code and prose views of one text (empty when it holds no Python)."""

    code: list[str]
    prose: list[str]
    prose_text: str = ""  # the prose as written (not masked): what the semantic stage embeds


def _imported(lexemes: list[Lexeme]) -> set[str]:
    """Names that appear in import statements: APIs a rename does not touch."""
    out: set[str] = set()
    importing = False
    for x in lexemes:
        if x[KIND] == "nl":
            importing = False
        elif x[KIND] == "name" and x[TEXT] in ("import", "from"):
            importing = True
        elif importing and x[KIND] == "name" and x[TEXT] != "as":
            out.add(x[TEXT])
    return out


def code_tokens(lexemes: list[Lexeme], docs: set[int], imported: set[str]) -> list[str]:
    out: list[str] = []
    prev = ""
    for i, x in enumerate(lexemes):
        if x[KIND] in ("comment", "nl") or i in docs:
            continue
        if x[KIND] == "name":
            out.append(x[TEXT] if x[TEXT] in _KEEP or x[TEXT] in imported or prev == "." else ID)
        elif x[KIND] == "string":
            out.append(STR)
        elif x[KIND] == "number":
            out.append(x[TEXT].lower().replace("_", ""))
        else:
            out.append(x[TEXT])
        prev = x[TEXT]
    return out


def python_views(source: str, around: str = "") -> CodeViews:
    """Code and prose views of Python source; `around` is prose that goes with it (an
    instruction's text outside its code blocks), masked with the same defined names."""
    lexemes = lex(source)
    docs = _doc_strings(lexemes)
    imported = _imported(lexemes)
    defined = {d.lower() for d in defined_names(lexemes) - imported}
    prose_parts = [around] if around else []
    prose_parts += [
        x[TEXT].lstrip("#") if x[KIND] == "comment" else _string_body(x[TEXT])
        for i, x in enumerate(lexemes)
        if x[KIND] == "comment" or i in docs
    ]
    prose_text = "\n".join(prose_parts)
    prose = [ID if w in defined else w for w in tokens(prose_text)]
    return CodeViews(code_tokens(lexemes, docs, imported), prose, prose_text)


def _string_body(literal: str) -> str:
    return literal.lstrip("rRbBuUfF").strip("\"'")


_MARKERS = ("```", "def ", "class ", "import ", "@", "if __name__")


def code_segments(text: str) -> tuple[str, str]:
    """(Python code, surrounding prose) of free text such as an instruction.

    Code is what fenced blocks hold; without fences, it is everything from the first line that
    starts Python (`def`, `class`, `import`, a decorator) to the end of the text. Prose is the rest.
    """
    if not any(m in text for m in _MARKERS):  # most reference text: no regex pass at all
        return "", text
    fenced = _FENCE.findall(text)
    if fenced:
        return "\n".join(fenced), _FENCE.sub("\n", text)
    m = _CODE_START.search(text)
    if m is None:
        return "", text
    return text[m.start() :], text[: m.start()]


def is_python_path(path: str) -> bool:
    return path.lower().endswith(_PY_SUFFIXES)


def semantic_text(text: str, python: bool | None = None) -> str:
    """What a text means in words: its prose (docstrings, comments, surrounding text) when it
    holds code, which an embedding of the raw code would drown; else the text itself."""
    views = views_of(text, python) if python is not False else None
    return views.prose_text if views is not None and views.prose_text.strip() else text


def views_of(text: str, python: bool | None = None) -> CodeViews | None:
    """Code-aware views of a text, or None when it holds no Python.

    `python=True`: the whole text is Python source (a .py file); None: find code in free text.
    """
    if python:
        return python_views(text)
    if python is None:
        code, around = code_segments(text)
        if code:
            return python_views(code, around)
    return None
