"""Confirming LSH candidates: exact Jaccard on shingle sets and the longest shared word run."""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher

from envforge.quality.minhash import exact_jaccard
from envforge.quality.params import DedupConfig
from envforge.quality.text import is_short, tokens


@dataclass(frozen=True)
class Match:
    exact_jaccard: float
    longest_shared_ngram: int
    near_duplicate: bool  # Jaccard at or above the threshold
    verbatim: bool  # a shared run of at least verbatim_ngram words

    @property
    def flagged(self) -> bool:
        return self.near_duplicate or self.verbatim


def longest_shared_run(a: list[str], b: list[str]) -> int:
    if not a or not b:
        return 0
    m = SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
    return m.size


def confirm(config: DedupConfig, text_a: str, text_b: str, hasher=None) -> Match:
    hasher = hasher or config.hasher()
    j = exact_jaccard(hasher.shingle_hashes(text_a), hasher.shingle_hashes(text_b))
    ta, tb = tokens(text_a), tokens(text_b)
    run = longest_shared_run(ta, tb)
    short = is_short(ta, config.short_words) or is_short(tb, config.short_words)
    need = config.verbatim_ngram_short if short else config.verbatim_ngram
    return Match(round(j, 6), run, j >= config.threshold, run >= need)
