"""Is a task's statement worth training on? Deterministic rules, then a repair.

A statement fails a task in two ways the verifier cannot see: it hands over the fix (the
hidden tests' names or files, the identifiers, literals or lines the reference adds, "add a
regression test"), or it says too little to act on (a bare commit subject, no observable
behaviour). SWE-bench Verified dropped about 68% of its original set on exactly these
grounds; commit-derived tasks (tickets, reviews, plain history) fail them often, because a
commit message describes the change, not the problem.

`check_statement` reports findings with their evidence; `repair_statement` cleans what is
noise (trailers, PR and issue references, envforge's own `Ticket X:` / `Commit X:` prefix, gitmoji,
conventional-commit types), drops the sentences that leak and, when what is left says too little, adds the
observable failure of the FAIL_TO_PASS tests as a reporter would describe it (the assertion
messages recorded when the tests were derived, with the hidden test names taken out, and the
interface names they found missing: "`calc.safe_div` does not exist"). The task's interface (the
names the reference adds and the hidden tests call, `interface_identifiers`) is no leak: a policy
cannot pass the tests without being told what to call what it writes. The
repaired text is checked again by the same rules, so what is shown is measured not to hand
over the fix. The policy (`StatementPolicy`) decides what happens to a statement that is still
flagged: `strict` keeps the task out, `flag` keeps it with its verdict, `off` skips the check.

Model-assisted review is a separate, optional step (`envforge.quality.statement_review`).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal, Sequence

from envforge.quality.statement_config import STATEMENT_POLICIES
from envforge.sources.commits import MERGE_LINE
from envforge.task import Task

StatementPolicy = Literal["strict", "flag", "off"]
Verdict = Literal["ok", "repaired", "flagged", "unchecked"]

# Source kinds whose statement is written from a commit or a tracker, not by a task author:
# envforge prefixes their instruction and their text carries trailers and references.
COMMIT_DERIVED_KINDS = frozenset({"ticket", "review", "history"})

MIN_WORDS = 8  # fewer words than this is not a problem statement
MIN_STATEMENT_CHARS = 10  # as TaskSpec.instruction: a repair never leaves less
BARE_TITLE_WORDS = 15  # a single line shorter than this is a commit subject, not a report
MIN_PATCH_LINE_CHARS = 16  # shorter added lines (`return None`) are too common to count as a leak
MIN_LITERAL_CHARS = 4
MAX_FAILURES_SHOWN = 3
MAX_FAILURE_CHARS = 300

_TRAILER_KEYS = (
    "co-authored-by",
    "signed-off-by",
    "reviewed-by",
    "acked-by",
    "tested-by",
    "reported-by",
    "suggested-by",
    "helped-by",
    "change-id",
    "cc",
    "reviewed-on",
    "pr-url",
    "differential revision",
    "link",
    "bug",
    "issue",
    "refs",
    "see-also",
    "fixes",
    "closes",
    "resolves",
    "co-developed-by",
    "release-note",
    "changelog",
    "jira",
    "ticket",
)
_TRAILER = re.compile(r"^\s*(?:" + "|".join(re.escape(k) for k in _TRAILER_KEYS) + r")\s*:.*$", re.I | re.M)
_CLOSING_REF = re.compile(
    r"\b(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?|refs?|see|related to|part of)\s*:?\s+"
    r"(?:[\w.-]+/[\w.-]+)?(?:#|GH-)\d+\b[.,;]?",
    re.I,
)
_PAREN_REF = re.compile(r"\s*\((?:[\w.-]+/[\w.-]+)?(?:#|GH-|!)\d+\)")
_BARE_REF = re.compile(r"(?<![\w&])(?:[\w.-]+/[\w.-]+)?(?:#|GH-)\d+\b")
_REF_URL = re.compile(r"https?://\S+/(?:pull|pulls|issues|merge_requests|commit)/\S+", re.I)
_ENVFORGE_PREFIX = re.compile(r"^\s*(?:Ticket\s+[^\s:]+|Commit\s+[0-9a-f]{12}):\s*")  # tickets.py, history.py
_TRACKER_KEY_PREFIX = re.compile(r"^\s*\[?[A-Z][A-Z0-9]{1,9}-\d+\]?\s*[:\-]?\s*")
_CONVENTIONAL = re.compile(
    r"^\s*(?:feat|fix|bugfix|hotfix|chore|refactor|perf|test|tests|docs|build|ci|style|revert)"
    r"(?:\([^)]{0,40}\))?!?:\s*",
    re.I,
)
# A gitmoji before or after the conventional type (`:bug: Fix x`, `🐛 Fix x`, `✨ feat: add x`): decoration, not words.
_GITMOJI = re.compile(
    r"^\s*(?::[a-z0-9_+-]{1,40}:|[\u2190-\u21ff\u2300-\u23ff\u2460-\u27bf\u2900-\u2bff\U0001f000-\U0001faff]"
    r"[\ufe0f\u200d\u2190-\u21ff\u2300-\u23ff\u2460-\u27bf\u2900-\u2bff\U0001f000-\U0001faff\U0001f3fb-\U0001f3ff]*)"
    r"\s*:?\s*"
)

_ADD_TEST = re.compile(
    r"\b(?:add(?:s|ed|ing)?|write|writes|wrote|include[sd]?|introduc(?:e|es|ed|ing)|new)\b"
    r"[^.\n]{0,40}?\b(?:(?:regression|unit|integration)\s+)?tests?\b(?!\s*(?:suite|runner))|"
    r"\btests?\s+(?:added|included|for this)\b|\bwith\s+(?:a\s+)?(?:regression\s+)?tests?\b",
    re.I,
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING = re.compile(r"""(?P<q>['"])(?P<s>(?:\\.|(?!(?P=q)).){%d,120})(?P=q)""" % MIN_LITERAL_CHARS)
_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(test\w*)|^\s*class\s+(Test\w*)", re.M)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"'(])")
# Sentences that say how to change the code (a commit message's voice), not what goes wrong.
_IMPERATIVE = re.compile(
    r"^\s*(?:[-*]\s*)?(?:use|call|replace|rename|change|set|pass|add|remove|delete|drop|move|wrap|"
    r"calculate|compute|switch|convert|catch|refactor|extract|inline|introduce|implement|store|"
    r"cache|memoi[sz]e|iterate|loop|split|join|strip|append|import|initiali[sz]e|reorder|swap|"
    r"instead of)\b",
    re.I,
)
_BEHAVIOUR = re.compile(
    r"\b(?:error|errors|exception|traceback|raise[sd]?|crash(?:es|ed)?|fail(?:s|ed|ing|ure|ures)?|wrong|incorrect(?:ly)?|"
    r"should|expected|expect(?:s|ing)?|instead|actual(?:ly)?|returns?|returned|output(?:s)?|prints?|shows?|gives?|"
    r"produces?|bug|broken|breaks?|doesn'?t|does not|don'?t|do not|can'?t|cannot|unable|missing|hangs?|leaks?|"
    r"invalid|unexpected|must|never|always|ignored?|ignores|when|rejects?|accepts?|allows?|warns?|warning|"
    r"supports?|regression|mismatch|overflow|timeout|deadlock|slow|reports?|not|only|too (?:many|few|much|little|"
    r"large|small|long|short|early|late)|off by one|duplicated?|lost|loses?|empty|none|null|nan|negative)\b",
    re.I,
)

# Words too common in prose to count as "an identifier the reference adds" unless quoted as code.
_PROSE = frozenset(
    """a an and are as at be but by can do for from has have if in into is it its not of on or so
than that the then this to was were will with without you your we our they their all any each every none no yes
only also both either new old value values data file files name names type types list dict set get put key keys
item items result results error errors test tests case cases time date self cls args kwargs true false none
return raise def class import from pass else elif while for try except finally lambda yield async await""".split()
)
# Short English words (and the letters of "e.g.", "i.e."): a parameter so named is told apart from prose only when
# the sentence marks it as code.
_SHORT_WORDS = frozenset(
    "a e g i s t am an as at be by do go he if in is it me my no of ok on or so to up us we vs id".split()
)
# Instruction verbs that say WHAT to provide (a name, a parameter), not how to write it: with the task's interface
# names they describe a feature, with internals they still hand over the fix.
_PROVIDE = re.compile(r"^\s*(?:[-*]\s*)?(?:add|introduce|implement|rename)\b", re.I)
_ANY_STRING = re.compile(r"""(?P<q>['"])(?:\\.|(?!(?P=q)).)*(?P=q)""")
_NAME_STRING = re.compile(r"""^['"]([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)['"]$""")
_TRIPLE = re.compile(r"\"\"\"|'''")
_TRIPLE_SPAN = re.compile(r"\"\"\".*?\"\"\"|'''.*?'''")
# A test's failure that says a name is missing (import, module attribute, class attribute, keyword argument).
_MISSING = (
    re.compile(r"\bcannot import name '(?P<name>\w+)' from '(?P<owner>[\w.]+)'"),
    re.compile(r"\bmodule '(?P<owner>[\w.]+)' has no attribute '(?P<name>\w+)'"),
    re.compile(r"\btype object '(?P<owner>[\w.]+)' has no attribute '(?P<name>\w+)'"),
    re.compile(r"\bNo module named '(?P<owner>[\w.]+)\.(?P<name>\w+)'"),
)
_MISSING_ARGUMENT = re.compile(r"\b(?P<owner>[\w.]+)\(\) got an unexpected keyword argument '(?P<name>\w+)'")


@dataclass(frozen=True)
class Finding:
    """One rule a statement breaks, with the text that shows it."""

    rule: str  # e.g. leak.test_name, leak.added_identifier, underspecified.bare_title
    evidence: str
    detail: str

    @property
    def is_leak(self) -> bool:
        return self.rule.startswith("leak.")


@dataclass(frozen=True)
class StatementContext:
    """What the rules compare a statement against: the task's hidden parts."""

    kind: str = ""
    reference_patch: str = ""
    test_patch: str = ""
    fail_to_pass: tuple[str, ...] = ()
    failure_messages: tuple[tuple[str, str], ...] = ()  # (FAIL_TO_PASS id, its failure before the fix)
    # The workspace before the fix: what exists there already is the problem's vocabulary, not the fix's.
    existing_identifiers: frozenset[str] = frozenset()
    existing_text: str = ""

    @classmethod
    def of_task(cls, task: Task, workspace: Sequence[tuple[str, str]] = ()) -> "StatementContext":
        """The context of a task; `workspace` is its (path, text) files before the fix, as
        `quality.fields.WorkspaceReader.files` reads them."""
        tests = task.spec.verification.tests
        messages = (task.spec.metadata or {}).get("failure_messages") or {}
        text = "\n".join(body for _, body in workspace)
        return cls(
            kind=task.spec.source or "",
            reference_patch=task.reference_patch or "",
            test_patch=task.test_patch or "",
            fail_to_pass=tuple(tests.fail_to_pass) if tests else (),
            failure_messages=tuple(sorted((str(k), str(v)) for k, v in messages.items())),
            existing_identifiers=frozenset(_IDENT.findall(text)),
            existing_text=text,
        )


@dataclass(frozen=True)
class StatementCheck:
    """The verdict on one statement: what was wrong, what was done, and the text to use."""

    verdict: Verdict
    statement: str  # the text the task should carry (repaired when verdict is "repaired")
    findings: tuple[Finding, ...] = ()  # on `statement`, after any repair
    repaired: tuple[Finding, ...] = ()  # what the original text had that the repair took care of
    cleaned: tuple[str, ...] = ()  # what cleaning removed (trailers, references, prefixes)
    added_failures: int = 0  # observed failures the repair described

    @property
    def leaks(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.is_leak)

    def reason(self) -> str:
        """One line for a reject or a report row."""
        if not self.findings:
            return f"statement {self.verdict}"
        shown = "; ".join(f"{f.rule}: {f.evidence!r}" for f in self.findings[:4])
        more = f" (+{len(self.findings) - 4} more)" if len(self.findings) > 4 else ""
        return f"statement flagged: {shown}{more}"

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "findings": [asdict(f) for f in self.findings],
            "repaired": [asdict(f) for f in self.repaired],
            "cleaned": list(self.cleaned),
            "added_failures": self.added_failures,
        }


# ---------------------------------------------------------------------------------------------- patches


@dataclass(frozen=True)
class PatchLines:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    context: tuple[str, ...]
    new_files: tuple[str, ...]
    files: tuple[str, ...]


def patch_lines(patch: str) -> PatchLines:
    """Added, removed and context lines of a unified diff, and the files it touches (new ones apart)."""
    added, removed, context, files, new_files = [], [], [], [], []
    current, from_null = "", False
    for line in (patch or "").splitlines():
        if line.startswith("diff --git"):
            from_null = False
            continue
        if line.startswith("--- "):
            from_null = line[4:].strip() == "/dev/null"
            continue
        if line.startswith("+++ "):
            path = line[4:].strip()
            current = path[2:] if path.startswith("b/") else path
            files.append(current)
            if from_null:
                new_files.append(current)
            continue
        if line.startswith(("index ", "@@", "new file mode", "deleted file mode", "similarity", "rename ", "Binary")):
            continue
        if line.startswith("+"):
            added.append(line[1:])
        elif line.startswith("-"):
            removed.append(line[1:])
        elif line.startswith(" "):
            context.append(line[1:])
    return PatchLines(tuple(added), tuple(removed), tuple(context), tuple(new_files), tuple(files))


def _code(line: str) -> str:
    """A line without its comment, so a comment's prose does not count as code the reference adds."""
    return line.split("#", 1)[0] if "#" in line and not re.search(r"""['"][^'"]*#""", line) else line


def added_identifiers(patch: str, existing: frozenset[str] = frozenset()) -> set[str]:
    """Identifiers the patch's added code introduces: in added lines, in no removed or context line and
    nowhere in the workspace before the change (`existing`)."""
    return {i for i in _new_names(patch, existing) if len(i) >= 3}


def _new_names(patch: str, existing: frozenset[str]) -> set[str]:
    lines = patch_lines(patch)
    before = existing | {m for ln in (*lines.removed, *lines.context) for m in _IDENT.findall(ln)}
    after = {m for ln in lines.added for m in _IDENT.findall(_strip_strings(_code(ln)))}
    return {i for i in after - before if not keyword.iskeyword(i)}


def added_literals(patch: str, existing_text: str = "") -> set[str]:
    """String literals the patch's added lines introduce (at least MIN_LITERAL_CHARS long), found
    nowhere in the workspace before the change."""
    lines = patch_lines(patch)
    before = {m.group("s") for ln in (*lines.removed, *lines.context) for m in _STRING.finditer(ln)}
    after = {m.group("s") for ln in lines.added for m in _STRING.finditer(ln)}
    return {
        s
        for s in after - before
        if len(s.strip()) >= MIN_LITERAL_CHARS and re.search(r"\w", s) and s not in existing_text
    }


def _strip_strings(line: str) -> str:
    return _STRING.sub(" ", line)


def hidden_test_names(context: StatementContext) -> set[str]:
    """Test function and class names the task's grading relies on: FAIL_TO_PASS ids and the tests the
    held-back test change defines."""
    names = set()
    for test_id in context.fail_to_pass:
        for part in test_id.split("::")[1:]:
            names.add(part.split("[", 1)[0])
    for m in _DEF.finditer("\n".join(patch_lines(context.test_patch).added)):
        names.add(m.group(1) or m.group(2))
    return {n for n in names if n and len(n) >= 5}


def _code_lines(lines: Iterable[str]) -> list[str]:
    """The code of diff lines read in order: comments, string literals and the prose of triple-quoted
    docstrings (which span lines) taken out, so only what a program names is left."""
    out: list[str] = []
    inside = ""
    for line in lines:
        text = line
        if inside:
            if inside not in text:
                continue
            text, inside = text.split(inside, 1)[1], ""
        text = _TRIPLE_SPAN.sub(" ", text)
        opening = _TRIPLE.search(text)
        if opening:
            text, inside = text[: opening.start()], opening.group(0)
        out.append(_ANY_STRING.sub(" ", text).split("#", 1)[0])
    return out


def used_by_tests(test_patch: str) -> set[str]:
    """Names the held-back tests' added lines use as code (call, import, pass as a keyword, read as an
    attribute) or spell as a whole string (`getattr(mod, "name")`, `mock.patch("pkg.mod.name")`);
    words of their messages, comments and docstrings do not count."""
    added = patch_lines(test_patch).added
    names = {m for ln in _code_lines(added) for m in _IDENT.findall(ln)}
    for line in added:
        for m in _ANY_STRING.finditer(_code(line)):
            spelled = _NAME_STRING.match(m.group(0))
            if spelled:
                names.update(spelled.group(1).split("."))
    return {n for n in names if not keyword.iskeyword(n)}


def interface_identifiers(context: StatementContext) -> set[str]:
    """The task's interface: names the reference adds AND the held-back tests use.

    A feature commit's tests call what it adds (`user_config_path()`, a `sep=` keyword): a policy
    cannot pass them without being told those names, so a statement that names them says WHAT to
    provide and hands over nothing the grading does not already require. Names the reference adds
    that the tests never use (private helpers, local variables) are how it was written: they stay
    leaks."""
    added = added_identifiers(context.reference_patch, context.existing_identifiers)
    return added & used_by_tests(context.test_patch) if added else set()


# ---------------------------------------------------------------------------------------------- cleaning


def clean_statement(text: str, kind: str = "") -> tuple[str, list[str]]:
    """The statement without what is noise to a policy: trailers, merge lines, PR/issue references and
    links, and for commit-derived kinds the `Ticket X:` / `Commit X:` prefix, a gitmoji, a tracker key and a
    conventional-commit type. Returns (text, what was removed)."""
    removed: list[str] = []

    def cut(pattern: re.Pattern, value: str, repl: str = "") -> str:
        removed.extend(m.group(0).strip() for m in pattern.finditer(value) if m.group(0).strip())
        return pattern.sub(repl, value)

    out = text.replace("\r\n", "\n")
    for pattern in (_TRAILER, MERGE_LINE, _REF_URL, _CLOSING_REF, _PAREN_REF, _BARE_REF):
        out = cut(pattern, out)
    if kind in COMMIT_DERIVED_KINDS:
        first, sep, rest = out.partition("\n")
        for pattern in (_ENVFORGE_PREFIX, _GITMOJI, _TRACKER_KEY_PREFIX, _CONVENTIONAL, _GITMOJI):
            first = cut(pattern, first)
        out = first + sep + rest
    out = re.sub(r"[ \t]+\n", "\n", out)
    out = re.sub(r"\n{3,}", "\n\n", out)
    out = re.sub(r"[ \t]{2,}", " ", out)
    return out.strip(), removed


# ---------------------------------------------------------------------------------------------- rules


def _word_in(word: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(word)}(?!\w)", text) is not None


def _code_like(name: str) -> bool:
    return (
        "_" in name.strip("_")
        or bool(re.search(r"\d", name))
        or bool(re.search(r"[a-z][A-Z]", name))
        or (name.isupper() and len(name) > 3)
    )


def _quoted_spans(text: str) -> str:
    return " ".join(re.findall(r"`([^`]+)`", text))


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def leak_findings(text: str, context: StatementContext) -> list[Finding]:
    """What in the text hands over the fix or the hidden tests."""
    findings: list[Finding] = []
    for name in sorted(hidden_test_names(context)):
        if _word_in(name, text):
            findings.append(Finding("leak.test_name", name, "names a hidden test the grading runs"))
    tests = patch_lines(context.test_patch)
    for path in sorted(set(tests.new_files)):
        base = path.rsplit("/", 1)[-1]
        if _word_in(path, text) or (len(base) > 8 and _word_in(base, text)):
            findings.append(Finding("leak.test_file", path, "names a test file the held-back test change adds"))
    quoted, squashed = _quoted_spans(text), _squash(text)
    sentences = split_sentences(text)
    added = added_identifiers(context.reference_patch, context.existing_identifiers)
    interface = interface_identifiers(context)
    for ident in sorted(added - interface):
        if not _word_in(ident, text) or ident.lower() in _PROSE:
            continue
        imperative = any(_IMPERATIVE.match(s) and _word_in(ident, s) for s in sentences)
        if _code_like(ident) or _word_in(ident, quoted) or imperative:
            findings.append(
                Finding("leak.added_identifier", ident, "uses an identifier only the reference solution introduces")
            )
    if context.kind in COMMIT_DERIVED_KINDS:
        findings.extend(_solution_steps(sentences, context, interface))
    for literal in sorted(added_literals(context.reference_patch, context.existing_text)):
        # an expected output quoted in a report is the spec; a literal in an instruction is the fix
        if any(_IMPERATIVE.match(s) and literal in s for s in sentences):
            findings.append(Finding("leak.added_literal", literal, "tells to use a literal only the reference adds"))
    for line in sorted({_squash(ln) for ln in patch_lines(context.reference_patch).added}):
        if len(line) >= MIN_PATCH_LINE_CHARS and line in squashed:
            findings.append(Finding("leak.patch_line", line[:120], "contains a line of the reference solution"))
    for m in _ADD_TEST.finditer(text):
        findings.append(
            Finding(
                "leak.add_test",
                m.group(0).strip(),
                "asks for tests the grading already holds back (and says a hidden test exists)",
            )
        )
    return _unique(findings)


def _solution_steps(sentences: Sequence[str], context: StatementContext, interface: set[str]) -> list[Finding]:
    """Instruction sentences naming code the fix changes (a commit message's voice: "Use sep in both",
    "call _helper() instead"). An instruction that says what to provide ("Add `foo()` returning X")
    is a feature's description when everything it names is the interface or was there before; it is a
    step when it names an internal the reference adds or a private name the tests do not use."""
    lines = patch_lines(context.reference_patch).added
    code = {i for ln in _code_lines(lines) for i in _IDENT.findall(ln) if not keyword.iskeyword(i)}
    touched = {i for i in code if len(i) >= 3 and i.lower() not in _PROSE}
    # short or prose-like names count too, where the sentence names them as code (`n`, `key=`)
    as_code = code - touched
    tested = used_by_tests(context.test_patch)
    new = _new_names(context.reference_patch, context.existing_identifiers)
    findings = []
    for sentence in sentences:
        if not _IMPERATIVE.match(sentence):
            continue
        named = {i for i in touched if _word_in(i, sentence)} | {i for i in as_code if _names_as_code(i, sentence)}
        if _PROVIDE.match(sentence):
            named = {i for i in named if i not in interface and (i in new or (i.startswith("_") and i not in tested))}
        if named:
            findings.append(
                Finding(
                    "leak.solution_step",
                    sentence.strip()[:160],
                    f"tells how to change the code the fix changes ({', '.join(sorted(named)[:3])})",
                )
            )
    return findings


def _names_as_code(name: str, sentence: str) -> bool:
    """Whether a sentence names a short or prose-like identifier as code rather than as a word: quoted
    as code, called, indexed, assigned or dotted into (`key=`, `value.strip`), or, for a name that is no
    English word (`n`, `fn`), standing on its own."""
    if _word_in(name, _quoted_spans(sentence)):
        return True
    if re.search(rf"(?<![\w.]){re.escape(name)}(?:\(|\[|\s?=(?!=)|\.\w)", sentence):
        return True
    return name.lower() not in _PROSE and name.lower() not in _SHORT_WORDS and _word_in(name, sentence)


def underspecified_findings(text: str, kind: str = "") -> list[Finding]:
    """What makes the text too thin to act on (a bare title only counts against commit-derived kinds:
    an author's one-line instruction is a choice, a commit subject is not a report)."""
    findings = []
    words = re.findall(r"[\w'`]+", text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(words) < MIN_WORDS:
        findings.append(
            Finding(
                "underspecified.too_short",
                f"{len(words)} words",
                f"fewer than {MIN_WORDS} words cannot describe a problem",
            )
        )
    if kind in COMMIT_DERIVED_KINDS and len(lines) == 1 and len(words) < BARE_TITLE_WORDS:
        findings.append(
            Finding("underspecified.bare_title", lines[0][:120], "a bare title: no description of what goes wrong")
        )
    if not _BEHAVIOUR.search(text):
        findings.append(
            Finding(
                "underspecified.no_behaviour",
                text[:80].replace("\n", " "),
                "names no observable behaviour (what fails, what is expected)",
            )
        )
    return findings


def check_statement(text: str, context: StatementContext) -> list[Finding]:
    """Every finding on the text as it stands (no cleaning, no repair)."""
    return [*leak_findings(text, context), *underspecified_findings(text, context.kind)]


# ---------------------------------------------------------------------------------------------- repair


def split_sentences(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        out.extend(s for s in _SENTENCE_END.split(line) if s.strip())
    return out


def _drop_leaking_sentences(text: str, leaks: Sequence[Finding]) -> str:
    """The text without the sentences (or list items, or lines) that hold a leak's evidence."""
    kept_lines = []
    for line in text.splitlines():
        parts = _SENTENCE_END.split(line)
        kept = [p for p in parts if not any(_holds(p, f) for f in leaks)]
        if parts and not kept and line.strip():
            continue
        kept_lines.append(" ".join(kept))
    out = "\n".join(kept_lines)
    return re.sub(r"\n{3,}", "\n\n", out).strip()


def _holds(sentence: str, finding: Finding) -> bool:
    if finding.rule in ("leak.add_test", "leak.solution_step"):
        return finding.evidence in sentence
    if finding.rule == "leak.patch_line":
        return finding.evidence in _squash(sentence)
    if finding.rule == "leak.added_literal":
        return finding.evidence in sentence
    return _word_in(finding.evidence, sentence)


def _mask(text: str, names: Iterable[str]) -> str:
    for name in sorted(names, key=len, reverse=True):
        text = re.sub(rf"(?<![\w.]){re.escape(name)}(?!\w)", "<test>", text)
    return text


def observed_failures(context: StatementContext) -> list[str]:
    """The FAIL_TO_PASS tests' failures before the fix, as a reporter would quote them: the message
    only (no test names, no test file paths), each checked not to hand over the fix."""
    hidden = hidden_test_names(context)
    files = set(patch_lines(context.test_patch).files)
    shown: list[str] = []
    for _test_id, message in context.failure_messages:
        line = re.sub(r"0x[0-9a-fA-F]{6,}", "0x...", _squash(_mask(message, hidden)))  # addresses vary by run
        for path in files:
            line = line.replace(path, "<test file>")
        line = line[:MAX_FAILURE_CHARS]
        if not line or line in shown or leak_findings(line, context):
            continue
        shown.append(line)
        if len(shown) == MAX_FAILURES_SHOWN:
            break
    return shown


def missing_interface(context: StatementContext) -> list[str]:
    """The interface names the FAIL_TO_PASS tests found missing before the fix, said as a reporter would
    ("`calc.safe_div` does not exist", "`args2sh()` takes no `sep` argument"), read from their recorded
    failures (`cannot import name 'safe_div' from 'calc'`, `module 'calc' has no attribute 'safe_div'`,
    `got an unexpected keyword argument 'sep'`). Only interface names: a missing dependency or any other
    name is the environment's problem, not the task's; each sentence is checked not to leak."""
    interface = interface_identifiers(context)
    said: list[str] = []
    for _test_id, message in context.failure_messages:
        for pattern in _MISSING:
            for m in pattern.finditer(message):
                if m.group("name") in interface:
                    said.append(f"`{m.group('owner')}.{m.group('name')}` does not exist.")
        for m in _MISSING_ARGUMENT.finditer(message):
            if m.group("name") in interface:
                said.append(f"`{m.group('owner')}()` takes no `{m.group('name')}` argument.")
    unique = list(dict.fromkeys(said))
    return [s for s in unique if not leak_findings(s, context)][:MAX_FAILURES_SHOWN]


def repair_statement(text: str, context: StatementContext) -> StatementCheck:
    """Clean, drop leaking sentences, describe the observed failure (and the interface names the tests
    found missing) when the rest says too little; then the rules again on the result (the verdict says
    whether anything is still wrong)."""
    original = check_statement(text, context)
    cleaned, removed = clean_statement(text, context.kind)
    leaks = leak_findings(cleaned, context)
    repaired = _drop_leaking_sentences(cleaned, leaks) if leaks else cleaned
    added, described = 0, False
    if underspecified_findings(repaired, context.kind):
        failures, missing = observed_failures(context), missing_interface(context)
        parts = [repaired.rstrip(".") + "."] if repaired else []
        parts += [" ".join(missing)] if missing else []
        if failures:
            body = "\n".join(f"- {f}" for f in failures)
            parts.append(f"Observed behaviour: with the code as it is, the project's tests report:\n{body}")
        if failures or missing:
            repaired, added, described = "\n\n".join(parts), len(failures), True
    after = check_statement(repaired, context)
    if described:  # the observed failures are the behaviour; thinness of the title alone is no longer a finding
        after = [f for f in after if not f.rule.startswith("underspecified.")]
    if len(repaired.strip()) < MIN_STATEMENT_CHARS:  # nothing usable left: keep the words there were, flagged
        repaired = cleaned if len(cleaned.strip()) >= MIN_STATEMENT_CHARS else text
        leaks, added, described = [], 0, False
        after = check_statement(repaired, context)  # the verdict is the shown text's: its leaks included
    changed = bool(removed or leaks or described) and repaired != text  # whitespace alone is no repair
    repaired = repaired if changed else text
    verdict: Verdict = "flagged" if after else "repaired" if changed else "ok"
    return StatementCheck(
        verdict, repaired, tuple(after), tuple(f for f in original if f not in after), tuple(removed), added
    )


def _unique(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.rule, f.evidence) not in seen:
            seen.add((f.rule, f.evidence))
            out.append(f)
    return out


@dataclass
class StatementSummary:
    """Counts over a batch of checks (for the run report, MLflow and Dagster metadata)."""

    checked: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)
    rules: dict[str, int] = field(default_factory=dict)

    def add(self, check: StatementCheck) -> None:
        self.checked += 1
        self.verdicts[check.verdict] = self.verdicts.get(check.verdict, 0) + 1
        for f in (*check.findings, *check.repaired):
            self.rules[f.rule] = self.rules.get(f.rule, 0) + 1

    def merge(self, other: "StatementSummary") -> None:
        self.checked += other.checked
        for mine, theirs in ((self.verdicts, other.verdicts), (self.rules, other.rules)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n

    def as_json(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "verdicts": dict(sorted(self.verdicts.items())),
            "rules": dict(sorted(self.rules.items())),
        }


__all__ = [
    "COMMIT_DERIVED_KINDS",
    "STATEMENT_POLICIES",
    "Finding",
    "StatementCheck",
    "StatementContext",
    "StatementPolicy",
    "StatementSummary",
    "added_identifiers",
    "added_literals",
    "check_statement",
    "clean_statement",
    "hidden_test_names",
    "interface_identifiers",
    "leak_findings",
    "missing_interface",
    "observed_failures",
    "patch_lines",
    "repair_statement",
    "used_by_tests",
    "underspecified_findings",
]
