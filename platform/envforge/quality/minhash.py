"""MinHash signatures, computed for many documents at once with numpy.

Hashing dominates MinHash cost. datasketch hashes every shingle in Python (SHA-1 by default,
or the `hashfunc` given) from a shingle object the caller builds, and permutes one shingle
(`update`) or one document (`bulk`) at a time. Here the tokens of a whole batch of documents
are hashed from one byte buffer (`fingerprint.hash_tokens`: no Python object per token or
per shingle), word n-gram hashes are rolled from the token hashes with vectorised integer
arithmetic, and the 128 affine permutations run as one matrix operation per chunk, reduced
per document with `np.minimum.reduceat`. Same estimator (min over random bijections of
32-bit shingle hashes), different hash functions: Jaccard estimates agree within sampling
error. The same token hashes feed the exact n-gram index and the shared-run confirmation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import xxhash

from envforge.quality.fingerprint import fmix64 as _fmix64
from envforge.quality.fingerprint import hash_tokens
from envforge.quality.text import char_shingle_strings, token_string

_MASK32 = np.uint64(0xFFFFFFFF)
_ROLL = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier for rolling word hashes into n-gram hashes
EMPTY_SLOT = np.uint32(0xFFFFFFFF)


@dataclass
class MinHasher:
    """Turns texts into (n, num_perm) uint32 signatures and into exact shingle-hash sets.

    Long texts use word n-grams (`ngram`); texts shorter than `short_words` words use
    character n-grams (`char_ngram`) so that short instructions still get enough shingles.
    """

    num_perm: int = 128
    ngram: int = 5
    char_ngram: int = 5
    short_words: int = 20
    seed: int = 1
    chunk: int = 1 << 14  # shingles per permutation chunk (memory: chunk x num_perm x 4 bytes)

    def __post_init__(self) -> None:
        if self.num_perm < 16:
            raise ValueError(f"num_perm {self.num_perm} is too small for useful estimates (>= 16)")
        if self.ngram < 1 or self.char_ngram < 1:
            raise ValueError("ngram and char_ngram must be >= 1")
        gen = np.random.RandomState(self.seed)
        # Affine bijections on 32-bit values: h -> (a*h + b) mod 2^32, with odd a.
        self._a = gen.randint(0, 1 << 31, self.num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self._b = gen.randint(0, 1 << 32, self.num_perm, dtype=np.uint64)
        self._a32, self._b32 = self._a.astype(np.uint32), self._b.astype(np.uint32)

    # -- tokens and shingles ---------------------------------------------------------------

    def word_hashes(self, words: Sequence[str]) -> np.ndarray:
        """64-bit hashes of tokens (tokens never hold spaces): what n-grams and runs are computed on."""
        if not words:
            return np.zeros(0, np.uint64)
        return hash_tokens(" ".join(words).encode(), self.seed)[0]

    def text_hashes(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(token hashes of all texts concatenated, tokens per text, each text's token string)."""
        strings = [token_string(t) for t in texts]
        if not strings:
            return np.zeros(0, np.uint64), np.zeros(0, np.int64), strings
        buf = " ".join(strings).encode()
        hashes, starts = hash_tokens(buf, self.seed)
        offsets = (
            np.cumsum([0] + [len(s.encode()) + 1 for s in strings[:-1]])
            if not buf.isascii()
            else np.cumsum([0] + [len(s) + 1 for s in strings[:-1]])
        )
        owner = np.searchsorted(offsets, starts, side="right") - 1
        return hashes, np.bincount(owner, minlength=len(strings)).astype(np.int64), strings

    def _rolled(self, word_hashes: np.ndarray, n: int) -> np.ndarray:
        """Hashes of all word n-grams of one token sequence (fewer than n words: one n-gram)."""
        if len(word_hashes) < n:
            n = max(1, len(word_hashes))
        if len(word_hashes) == 0:
            return np.zeros(0, dtype=np.uint64)
        m = len(word_hashes) - n + 1
        acc = np.zeros(m, dtype=np.uint64)
        for j in range(n):
            acc = acc * _ROLL + word_hashes[j : j + m]
        return _fmix64(acc)

    def shingle_sequence(self, word_hashes: np.ndarray) -> np.ndarray:
        """The 32-bit word n-gram shingle at every position (repeats kept, in order)."""
        return (self._rolled(word_hashes, self.ngram) & _MASK32).astype(np.uint32)

    def _char_shingles(self, token_str: str) -> np.ndarray:
        grams = char_shingle_strings(" ".join(token_str.split()), self.char_ngram)
        h = np.fromiter(
            (xxhash.xxh64_intdigest(g.encode(), seed=self.seed) for g in grams), dtype=np.uint64, count=len(grams)
        )
        return np.unique((h & _MASK32).astype(np.uint32))

    def shingle_hashes(self, text: str) -> np.ndarray:
        """Unique 32-bit shingle hashes of one text (what exact Jaccard is computed on)."""
        hashes, lengths, strings = self.text_hashes([text])
        if int(lengths[0]) < self.short_words:
            return self._char_shingles(strings[0])
        return np.unique(self.shingle_sequence(hashes))

    # -- signatures ----------------------------------------------------------------------

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """(n, num_perm) uint32 MinHash signatures. An empty text gets all-EMPTY_SLOT."""
        texts = list(texts)
        flat, lengths, strings = self.text_hashes(texts)
        return self.signatures_from_hashes(
            np.split(flat, np.cumsum(lengths)[:-1]) if len(texts) else [], strings.__getitem__
        )

    def signatures_from_hashes(self, hashes: Sequence[np.ndarray], short_text: Callable[[int], str]) -> np.ndarray:
        """Signatures of texts given their token hashes; a text under `short_words` tokens uses
        character shingles of `short_text(i)` (its token string).

        Long texts are processed as one batch: their token hashes are concatenated, n-gram
        hashes are rolled over the whole array at once and n-grams that would cross a
        document boundary are dropped.
        """
        n = len(hashes)
        min_len = max(self.short_words, self.ngram)
        lengths_all = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=n)
        long_docs = np.flatnonzero(lengths_all >= min_len)
        parts_h: list[np.ndarray] = []
        parts_d: list[np.ndarray] = []
        if len(long_docs):
            lengths = lengths_all[long_docs]
            wh = np.concatenate([hashes[i] for i in long_docs.tolist()])
            k = self.ngram
            m = len(wh) - k + 1
            acc = np.zeros(m, dtype=np.uint64)
            for j in range(k):
                acc = acc * _ROLL + wh[j : j + m]
            starts = np.cumsum(lengths) - lengths
            doc_of_pos = np.repeat(np.arange(len(long_docs)), lengths)[:m]
            offset = np.arange(m) - starts[doc_of_pos]
            valid = offset <= (lengths[doc_of_pos] - k)
            parts_h.append(_fmix64(acc[valid]) & _MASK32)
            parts_d.append(long_docs[doc_of_pos[valid]])
        short = np.flatnonzero((lengths_all < min_len) & (lengths_all > 0))
        for i in short.tolist():
            sh = self._char_shingles(short_text(i)).astype(np.uint64)
            parts_h.append(sh)
            parts_d.append(np.full(len(sh), i, dtype=np.int64))
        flat = np.concatenate(parts_h) if parts_h else np.zeros(0, np.uint64)
        doc_of = np.concatenate(parts_d) if parts_d else np.zeros(0, np.int64)
        if len(short):
            order = np.argsort(doc_of, kind="stable")
            flat, doc_of = flat[order], doc_of[order]
        return self._min_permute(flat, doc_of, n)

    def signatures_from_shingles(self, shingles: Sequence[np.ndarray]) -> np.ndarray:
        n = len(shingles)
        lengths = np.fromiter((len(s) for s in shingles), dtype=np.int64, count=n)
        flat = np.concatenate([s.astype(np.uint64) for s in shingles]) if lengths.sum() else np.zeros(0, np.uint64)
        return self._min_permute(flat, np.repeat(np.arange(n), lengths), n)

    def _min_permute(self, flat: np.ndarray, doc_of: np.ndarray, n: int) -> np.ndarray:
        """Per document, the minimum of each permutation over its shingle hashes (doc_of sorted).

        uint32 arithmetic wraps mod 2^32, which is the permutation itself; the (num_perm,
        chunk) layout makes the per-document reduction run along contiguous memory.
        """
        sig = np.full((n, self.num_perm), EMPTY_SLOT, dtype=np.uint32)
        flat32 = flat.astype(np.uint32)
        a, b = self._a32[:, None], self._b32[:, None]
        for start in range(0, len(flat32), self.chunk):
            stop = min(len(flat32), start + self.chunk)  # a document split across chunks is fine: min of mins
            perm = a * flat32[None, start:stop] + b
            docs = doc_of[start:stop]
            heads = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
            mins = np.minimum.reduceat(perm, heads, axis=1).T
            rows = docs[heads]
            sig[rows] = np.minimum(sig[rows], mins)
        return sig


def estimate_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Share of equal slots of two signatures (0 when either is empty)."""
    if (a == EMPTY_SLOT).all() or (b == EMPTY_SLOT).all():
        return 0.0
    return float(np.mean(a == b))


def exact_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two unique shingle-hash arrays."""
    if len(a) == 0 and len(b) == 0:
        return 0.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
