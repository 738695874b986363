"""The exact n-gram candidate index: hashed n-gram -> reference documents.

MinHash LSH proposes pairs whose whole windows are similar; it cannot see a 30-word run
shared by two texts that otherwise differ, and it proposes a pair just below its band
threshold only by chance. This index proposes every reference document that shares a
winnowed n-gram with a query (see `fingerprint.winnow`): any shared run of at least the
index's guaranteed length becomes a candidate, however different the rest of the texts.

Postings are two arrays sorted by hash (uint64 hash, int32 document); a query is a
`searchsorted`. An n-gram found in more than `max_df` documents is boilerplate (a license
header, a benchmark's common test preamble) and proposes nothing: it would make every
document a candidate and tells nothing about any one of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envforge.safefs import atomic_writer


class NgramIndex:
    def __init__(self, max_df: int = 100) -> None:
        self.max_df = max_df
        self._hashes = np.zeros(0, np.uint64)
        self._docs = np.zeros(0, np.int32)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []

    @property
    def size(self) -> int:
        return len(self._hashes) + sum(len(h) for h, _ in self._pending)

    def add(self, hashes: np.ndarray, docs: np.ndarray) -> None:
        """Add postings (document indexes are the caller's); merged lazily, one sort per merge."""
        if len(hashes):
            self._pending.append((np.asarray(hashes, np.uint64), np.asarray(docs, np.int32)))

    def _merge(self) -> None:
        if not self._pending:
            return
        h = np.concatenate([self._hashes, *(p[0] for p in self._pending)])
        d = np.concatenate([self._docs, *(p[1] for p in self._pending)])
        order = np.argsort(h, kind="stable")
        self._hashes, self._docs = h[order], d[order]
        self._pending.clear()

    def query(self, hashes: np.ndarray, owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unique (owner, document) pairs for which some query n-gram is posted (df <= max_df)."""
        self._merge()
        if len(self._hashes) == 0 or len(hashes) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        hashes = np.asarray(hashes, np.uint64)
        lo = np.searchsorted(self._hashes, hashes, side="left")
        hi = np.searchsorted(self._hashes, hashes, side="right")
        counts = hi - lo
        hit = np.flatnonzero((counts > 0) & (counts <= self.max_df))
        if len(hit) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        c = counts[hit]
        ends = np.cumsum(c)
        offsets = np.arange(ends[-1]) - np.repeat(ends - c, c) + np.repeat(lo[hit], c)
        pairs = np.stack(
            [np.repeat(np.asarray(owners, np.int64)[hit], c), self._docs[offsets].astype(np.int64)], axis=1
        )
        pairs = np.unique(pairs, axis=0)
        return pairs[:, 0], pairs[:, 1]

    def save(self, path: Path) -> None:
        self._merge()
        with atomic_writer(path) as fh:
            np.savez(fh, hashes=self._hashes, docs=self._docs, max_df=self.max_df)

    @classmethod
    def load(cls, path: Path) -> "NgramIndex":
        with np.load(path) as z:
            index = cls(int(z["max_df"]))
            index._hashes, index._docs = z["hashes"], z["docs"]
        return index
