"""Banded LSH over MinHash signatures, as sorted numpy arrays (so it scales and persists).

The banding (b bands of r rows) minimises the weighted false-positive and false-negative
areas under the S-curve around the threshold, the way datasketch's MinHashLSH chooses it (the
same integrals and search, so the same (b, r); tests/test_quality.py compares them). With
datasketch's default weights (0.5, 0.5) the curve's steep part sits above the threshold, so
pairs just above it are missed; for decontamination we weight recall (0.1, 0.9) and confirm
every candidate with exact Jaccard and n-gram overlap, which removes the extra false positives.

Storage is one sorted (band key, doc index) array per band. Insertion appends and
re-sorts; a query is a `searchsorted` per band. The arrays are saved as one .npz file and
can be partitioned by band across machines (see docs/dedup.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.integrate import quad

from envforge.quality.minhash import EMPTY_SLOT
from envforge.safefs import atomic_writer


@functools.lru_cache(maxsize=64)
def banding(threshold: float, num_perm: int, weights: tuple[float, float]) -> tuple[int, int]:
    """(bands, rows) minimising the weighted false-positive/false-negative area at `threshold`; `weights`
    (false positives, false negatives) are the caller's (`quality.params.IndexConfig.banding`)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold {threshold} must be in (0, 1)")
    best, best_error = (0, 0), float("inf")
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            false_positive, _ = quad(lambda s: collision_probability(s, b, r), 0.0, threshold)
            false_negative, _ = quad(lambda s: 1.0 - collision_probability(s, b, r), threshold, 1.0)
            error = false_positive * weights[0] + false_negative * weights[1]
            if error < best_error:
                best, best_error = (b, r), error
    return best


def collision_probability(jaccard: float, bands: int, rows: int) -> float:
    """P(a pair with this Jaccard shares at least one band) = 1 - (1 - j^r)^b."""
    return 1.0 - (1.0 - jaccard**rows) ** bands


def _band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64 keys: each band's rows folded into one 64-bit value."""
    n = sigs.shape[0]
    keys = np.zeros((n, bands), dtype=np.uint64)
    s = sigs[:, : bands * rows].astype(np.uint64).reshape(n, bands, rows)
    for j in range(rows):
        keys = (keys * np.uint64(0x100000001B3)) ^ s[:, :, j]
    keys ^= np.arange(bands, dtype=np.uint64)[None, :] * np.uint64(0x9E3779B97F4A7C15)
    return keys


@dataclass
class BandIndex:
    """Candidate search over signatures. Doc indexes are positions in insertion order."""

    bands: int
    rows: int

    def __post_init__(self) -> None:
        self._keys: list[np.ndarray] = [np.zeros(0, np.uint64) for _ in range(self.bands)]
        self._docs: list[np.ndarray] = [np.zeros(0, np.int64) for _ in range(self.bands)]
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # (keys (n, bands), ids) not yet merged
        self.size = 0

    def add(self, sigs: np.ndarray) -> np.ndarray:
        """Insert signatures; returns their doc indexes. Empty signatures are never candidates.

        Batches are merged into the sorted arrays lazily (one sort per band at the next
        query or save), so inserting a large corpus in many batches stays O(n log n).
        """
        ids = np.arange(self.size, self.size + len(sigs), dtype=np.int64)
        keep = ~(sigs == EMPTY_SLOT).all(axis=1)
        self._pending.append((_band_keys(sigs[keep], self.bands, self.rows), ids[keep]))
        self.size += len(sigs)
        return ids

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([k for k, _ in self._pending])
        ids = np.concatenate([d for _, d in self._pending])
        for band in range(self.bands):
            k = np.concatenate([self._keys[band], keys[:, band]])
            d = np.concatenate([self._docs[band], ids])
            order = np.argsort(k, kind="stable")
            self._keys[band], self._docs[band] = k[order], d[order]
        self._pending.clear()

    def query(self, sigs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All (query row, doc index) pairs that share at least one band, deduplicated."""
        self._merge()
        keys = _band_keys(sigs, self.bands, self.rows)
        empty = (sigs == EMPTY_SLOT).all(axis=1)
        qs, ds = [], []
        for band in range(self.bands):
            bk = self._keys[band]
            if len(bk) == 0:
                continue
            lo = np.searchsorted(bk, keys[:, band], side="left")
            hi = np.searchsorted(bk, keys[:, band], side="right")
            counts = np.where(empty, 0, hi - lo)
            if counts.sum() == 0:
                continue
            hit = np.flatnonzero(counts)
            c = counts[hit]
            ends = np.cumsum(c)
            # positions lo[q] .. hi[q]-1 for every query q with hits, without a Python loop
            offsets = np.arange(ends[-1]) - np.repeat(ends - c, c) + np.repeat(lo[hit], c)
            q = np.repeat(hit, c)
            qs.append(q)
            ds.append(self._docs[band][offsets])
        if not qs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        pairs = np.unique(np.stack([np.concatenate(qs), np.concatenate(ds)], axis=1), axis=0)
        return pairs[:, 0], pairs[:, 1]

    def save(self, path: Path) -> None:
        self._merge()
        arrays = {f"k{i}": k for i, k in enumerate(self._keys)} | {f"d{i}": d for i, d in enumerate(self._docs)}
        with atomic_writer(path) as fh:
            np.savez(fh, bands=self.bands, rows=self.rows, size=self.size, **arrays)

    @classmethod
    def load(cls, path: Path) -> "BandIndex":
        with np.load(path) as z:
            index = cls(int(z["bands"]), int(z["rows"]))
            index._keys = [z[f"k{i}"] for i in range(index.bands)]
            index._docs = [z[f"d{i}"] for i in range(index.bands)]
            index.size = int(z["size"])
        return index
