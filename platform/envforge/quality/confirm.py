"""Confirming candidates exactly, view by view, and saying what matched.

Each text is prepared once (`Prepared`): its words, hashed; the shingle sets of its windows
(for exact Jaccard); and, when it holds Python, its code and prose views (see `code.py`).
Two prepared texts are then compared by these rules, the same whoever proposed the pair
(LSH, the n-gram index):
- text view: best window-pair exact Jaccard >= threshold, or a shared word run of
  `verbatim_ngram` words (`verbatim_ngram_short` when either text is short);
- prose view (docstrings, comments, surrounding text; defined names masked): a shared run of
  `verbatim_ngram` words;
- code view (identifiers and strings canonicalized): a shared run of `code_run` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from envforge.quality.code import ID, STR, CodeViews, views_of
from envforge.quality.fingerprint import longest_shared_run
from envforge.quality.minhash import MinHasher, exact_jaccard
from envforge.quality.params import DedupConfig
from envforge.quality.text import is_short, tokens, window_starts

SNIPPET_WORDS = 24
_SENTINEL = np.uint64(0xFFFFFFFFFFFFFFFF)  # masks a run already looked at (never a token hash in practice)


@dataclass
class Prepared:
    """A text ready for exact comparison: word hashes, shingles, code views.

    Window shingle sets are made on demand: a big workspace file has hundreds of windows,
    and only those sharing something with a candidate are ever compared."""

    words: list[str]
    word_hashes: np.ndarray
    short: bool
    window_words: int
    shingle_seq: np.ndarray  # word n-gram shingle per position (long texts), or the char-shingle set (short)
    ngram: int
    prose: list[str] | None = None
    prose_hashes: np.ndarray | None = None
    code: list[str] | None = None
    code_hashes: np.ndarray | None = None
    _windows: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def window_spans(self) -> list[tuple[int, int]]:
        """(first, last + 1) shingle positions of each half-overlapping window."""
        if self.short or len(self.words) <= self.window_words:
            return [(0, len(self.shingle_seq))]
        return [(s, s + self.window_words - self.ngram + 1) for s in window_starts(len(self.words), self.window_words)]

    def window(self, i: int) -> np.ndarray:
        if i not in self._windows:
            lo, hi = self.window_spans[i]
            seq = self.shingle_seq[lo:hi]
            self._windows[i] = seq if self.short else np.unique(seq)
        return self._windows[i]


_UNSET = object()


def prepare(
    text: str,
    hasher: MinHasher,
    window_words: int,
    python: bool | None = None,
    views: CodeViews | None | object = _UNSET,
) -> Prepared:
    """A text ready for exact comparison (see the module docstring); `views`: its code views,
    when already computed."""
    words = tokens(text)
    hashes = hasher.word_hashes(words)
    short = is_short(words, hasher.short_words)
    seq = hasher.shingle_hashes(text) if short else hasher.shingle_sequence(hashes)
    if views is _UNSET:
        views = views_of(text, python) if python is not False else None
    prose = code = None
    if views is not None:
        prose = views.prose if views.prose and views.prose != words else None
        code = views.code or None
    return Prepared(
        words,
        hashes,
        short,
        window_words,
        seq,
        hasher.ngram,
        prose,
        hasher.word_hashes(prose) if prose else None,
        code,
        hasher.word_hashes(code) if code else None,
    )


@dataclass(frozen=True)
class RunEvidence:
    """The longest run one view of two texts shares, against what the rule needs."""

    view: str  # text | prose | code
    run: int
    needed: int
    snippet: str = ""
    hollow: bool = False  # long enough, but says nothing (see `hollow`): no evidence

    @property
    def flagged(self) -> bool:
        return self.run >= self.needed and not self.hollow

    @property
    def strength(self) -> float:
        return min(self.run / self.needed, 0.99) if self.hollow else self.run / self.needed


@dataclass(frozen=True)
class Match:
    exact_jaccard: float
    longest_shared_ngram: int  # in the text view
    near_duplicate: bool  # Jaccard at or above the threshold
    verbatim: bool  # some view's run rule holds
    threshold: float = 0.5
    runs: tuple[RunEvidence, ...] = field(default_factory=tuple)

    @property
    def flagged(self) -> bool:
        return self.near_duplicate or self.verbatim

    @property
    def strength(self) -> float:
        """>= 1 exactly when flagged: the strongest rule's value over what it needs."""
        return max([self.exact_jaccard / self.threshold] + [r.strength for r in self.runs])

    def strongest_run(self) -> RunEvidence | None:
        return max(self.runs, key=lambda r: r.strength, default=None)

    def describe(self) -> str:
        """The strongest evidence first, in words."""
        parts = []
        run = self.strongest_run()
        jac = f"exact Jaccard {self.exact_jaccard:.2f}" + (f" >= {self.threshold}" if self.near_duplicate else "")
        if run is not None and run.run:
            what = {"text": "word", "prose": "word (masked prose)", "code": "token (normalized code)"}[run.view]
            r = f"shared {run.run}-{what} run" + (
                f" (>= {run.needed})"
                if run.flagged
                else " (hollow: a counting sequence or placeholders, not counted)"
                if run.hollow
                else f" (needs {run.needed})"
            )
            if run.snippet:
                r += f': "{run.snippet}"'
            parts = [r, jac] if run.strength >= self.exact_jaccard / self.threshold else [jac, r]
        else:
            parts = [jac]
        return "; ".join(parts)


def _snippet(words: list[str], start: int, length: int) -> str:
    part = words[start : start + min(length, SNIPPET_WORDS)]
    return " ".join(part) + (" ..." if length > SNIPPET_WORDS else "")


def best_window_jaccard(a: Prepared, b: Prepared) -> float:
    """Best exact Jaccard over window pairs. Windows of `a` that share nothing (or too little to
    beat the best so far) with `b` are never turned into sets."""
    spans_a, spans_b = a.window_spans, b.window_spans
    if not len(a.shingle_seq) or not len(b.shingle_seq):
        return 0.0
    b_sets = [b.window(i) for i in range(len(spans_b))]
    union_b = np.unique(np.concatenate(b_sets)) if len(b_sets) > 1 else b_sets[0]
    hits = np.isin(a.shingle_seq, union_b)
    prefix = np.r_[0, np.cumsum(hits)]
    best = 0.0
    for i, (lo, hi) in enumerate(spans_a):
        if prefix[hi] == prefix[lo]:
            continue
        x = a.window(i)
        for y in b_sets:
            best = max(best, exact_jaccard(x, y))
    return best


def hollow(tokens_: list[str], min_distinct: int) -> bool:
    """A run that says nothing about where it came from: fewer than `min_distinct` distinct
    tokens besides placeholders and punctuation (a row of masked names, `0 0 0 0`), or only
    numbers in arithmetic progression (a counting sequence). Test vectors such as
    `1.0 2.8 3.0 ... true` are not hollow: they are what a leaked test looks like."""
    content = [t for t in tokens_ if t not in (ID, STR) and any(ch.isalnum() for ch in t)]
    if len(set(content)) < min_distinct:
        return True
    if all(t.isdigit() for t in content):
        steps = {int(b) - int(a) for a, b in zip(content, content[1:])}
        return len(steps) <= 1
    return False


def qualifying_run(
    view: str,
    a_hashes: np.ndarray,
    a_tokens: list[str],
    b_hashes: np.ndarray,
    needed: int,
    min_distinct: int,
    tries: int = 4,
) -> RunEvidence:
    """The longest shared run that is not `hollow`, else the longest (marked hollow).

    A counting sequence or a row of masked names is shared by unrelated texts all the time;
    such a run is set aside (its tokens masked) and the next longest is tried, a few times.
    """
    a = a_hashes.copy()
    first = None
    for _ in range(tries):
        r = longest_shared_run(a, b_hashes)
        ev = RunEvidence(view, r.length, needed, _snippet(a_tokens, r.a_start, r.length))
        if first is None:
            first = ev
        if r.length < needed or not hollow(a_tokens[r.a_start : r.a_start + r.length], min_distinct):
            return (
                ev
                if r.length >= needed
                else (first if first.run < needed else RunEvidence(view, first.run, needed, first.snippet, True))
            )
        a[r.a_start : r.a_start + r.length] = _SENTINEL - np.arange(r.a_start, r.a_start + r.length, dtype=np.uint64)
    return RunEvidence(view, first.run, needed, first.snippet, True)


def compare(config: DedupConfig, a: Prepared, b: Prepared) -> Match:
    """Every rule on two prepared texts; the runs of every view both texts have."""
    j = best_window_jaccard(a, b)
    short = a.short or b.short
    needed = config.verbatim_ngram_short if short else config.verbatim_ngram
    distinct = config.min_distinct_run_tokens
    runs = [qualifying_run("text", a.word_hashes, a.words, b.word_hashes, needed, distinct)]
    if a.prose_hashes is not None and b.prose_hashes is not None:
        runs.append(qualifying_run("prose", a.prose_hashes, a.prose, b.prose_hashes, config.verbatim_ngram, distinct))
    if a.code_hashes is not None and b.code_hashes is not None:
        runs.append(qualifying_run("code", a.code_hashes, a.code, b.code_hashes, config.code_run, distinct))
    return Match(
        round(j, 6), runs[0].run, j >= config.threshold, any(r.flagged for r in runs), config.threshold, tuple(runs)
    )


def confirm(config: DedupConfig, text_a: str, text_b: str, hasher: MinHasher | None = None) -> Match:
    """Compare two raw texts (both prepared here)."""
    hasher = hasher or config.hasher()
    w = config.index_config.window_words
    return compare(config, prepare(text_a, hasher, w), prepare(text_b, hasher, w))
