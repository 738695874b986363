"""Exact fingerprints of token streams: hashed n-grams, winnowing, and the longest shared run.

Tokens are hashed once to 64-bit integers (`MinHasher.word_hashes`); everything here works on
those integers with numpy, so a whole batch of documents is fingerprinted without a Python
loop per n-gram.

Winnowing (Schleimer, Wilkerson and Aiken, 2003) keeps, from every window of `w` consecutive
n-gram hashes, the smallest. Two texts that share a run of `w + n - 1` tokens share the whole
window of n-grams inside it, and so its minimum: a shared run of that length is *guaranteed*
to leave a shared fingerprint, while only about 2/(w+1) of the n-grams are stored. The
reference side is winnowed; the query side looks up all its n-grams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

_MASK64 = (1 << 64) - 1
_ROLL_INT = 0x9E3779B97F4A7C15
_ROLL = np.uint64(_ROLL_INT)
_BASE = np.uint64(0xD6E8FEB86659FD93)  # odd, so invertible mod 2^64
_BASE_INV = np.uint64(pow(0xD6E8FEB86659FD93, -1, 1 << 64))


def fmix64(x: np.ndarray) -> np.ndarray:
    """The murmur3 64-bit finalizer: spreads rolled hashes over all bits."""
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def batch_ngrams(streams: Sequence[np.ndarray], n: int, salt: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(hash, stream index) of every n-gram of every token-hash stream, in order.

    A stream shorter than n contributes one n-gram of all its tokens (so short texts still
    have a fingerprint); an empty stream contributes nothing. `salt` separates views.
    """
    lengths = np.fromiter((len(s) for s in streams), dtype=np.int64, count=len(streams))
    if not len(streams) or lengths.sum() == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    flat = np.concatenate([np.asarray(s, dtype=np.uint64) for s in streams])
    owner_tok = np.repeat(np.arange(len(streams)), lengths)
    starts = np.cumsum(lengths) - lengths
    m = len(flat) - n + 1
    hashes, owners = [], []
    if m > 0:
        acc = np.full(m, np.uint64((salt * _ROLL_INT + n) & _MASK64))
        for j in range(n):
            acc = acc * _ROLL + flat[j : j + m]
        own = owner_tok[:m]
        valid = (np.arange(m) - starts[own]) <= (lengths[own] - n)
        hashes.append(fmix64(acc[valid]))
        owners.append(own[valid])
    for i in np.flatnonzero((lengths > 0) & (lengths < n)):
        acc = (salt * _ROLL_INT + int(lengths[i]) + 0x5BD1E995) & _MASK64
        for t in flat[starts[i] : starts[i] + lengths[i]].tolist():
            acc = (acc * _ROLL_INT + t) & _MASK64
        hashes.append(fmix64(np.array([acc], dtype=np.uint64)))
        owners.append(np.array([i], dtype=np.int64))
    h, o = np.concatenate(hashes), np.concatenate(owners)
    order = np.argsort(o, kind="stable")
    return h[order], o[order]


def winnow(hashes: np.ndarray, owners: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """The minimum of every window of `w` consecutive n-gram hashes of the same owner
    (owners sorted); an owner with fewer than `w` n-grams keeps them all. Consecutive repeats
    of a selection are kept once."""
    if w <= 1 or len(hashes) == 0:
        return hashes, owners
    counts = np.bincount(owners)
    short = counts[owners] < w
    keep_h, keep_o = [hashes[short]], [owners[short]]
    if len(hashes) >= w:
        view = np.lib.stride_tricks.sliding_window_view(hashes, w)
        same = owners[: len(hashes) - w + 1] == owners[w - 1 :]
        mins = view.min(axis=1)[same]
        own = owners[: len(hashes) - w + 1][same]
        fresh = np.r_[True, (mins[1:] != mins[:-1]) | (own[1:] != own[:-1])]
        keep_h.append(mins[fresh])
        keep_o.append(own[fresh])
    return np.concatenate(keep_h), np.concatenate(keep_o)


_HASH_CHUNK = 1 << 20  # bytes hashed per pass (bounds the power tables and temporaries)
_SPACE = 32


def hash_tokens(buf: bytes, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(64-bit hash of every space-separated token of `buf`, byte offset where it starts).

    Vectorised: a polynomial hash of each token's bytes from one prefix sum over the buffer,
    finalized with fmix64; no Python string is made per token. The same token hashes the same
    wherever it occurs, so word lists hash alike when joined with spaces.
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    hashes, starts_out = [], []
    lo = 0
    mix = np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK64)
    while lo < len(data):
        hi = min(len(data), lo + _HASH_CHUNK)
        if hi < len(data):  # cut at a space, so no token straddles two passes
            spaces = np.flatnonzero(data[hi:] == _SPACE)
            hi = hi + int(spaces[0]) if len(spaces) else len(data)
        chunk = data[lo:hi]
        sep = np.empty(len(chunk) + 2, dtype=np.int8)
        sep[0] = sep[-1] = 1
        sep[1:-1] = chunk == _SPACE
        edges = np.diff(sep)
        starts, ends = np.flatnonzero(edges == -1), np.flatnonzero(edges == 1)
        if len(starts):
            pows, inv = _powers(len(chunk))
            prefix = np.empty(len(chunk) + 1, dtype=np.uint64)
            prefix[0] = 0
            np.cumsum((chunk.astype(np.uint64) + np.uint64(1)) * pows, dtype=np.uint64, out=prefix[1:])
            h = (prefix[ends] - prefix[starts]) * inv[starts]
            h ^= (ends - starts).astype(np.uint64) * _ROLL ^ mix
            hashes.append(fmix64(h))
            starts_out.append(starts + lo)
        lo = hi
    if not hashes:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    return np.concatenate(hashes), np.concatenate(starts_out)


@dataclass(frozen=True)
class Run:
    """The longest run of tokens two streams share, and where it starts in each."""

    length: int
    a_start: int = 0
    b_start: int = 0


def _window_hashes(prefix: np.ndarray, inv_pows: np.ndarray, length: int) -> np.ndarray:
    """Position-independent polynomial hashes of every window of `length` tokens."""
    return (prefix[length:] - prefix[:-length]) * inv_pows[: len(prefix) - length]


_POWERS = [np.ones(1, np.uint64), np.ones(1, np.uint64)]  # BASE^i and BASE^-i, grown on demand


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    if len(_POWERS[0]) < n:
        size = max(n, 2 * len(_POWERS[0]))
        for k, base in ((0, _BASE), (1, _BASE_INV)):
            steps = np.full(size, base, dtype=np.uint64)
            steps[0] = 1
            _POWERS[k] = np.cumprod(steps, dtype=np.uint64)
    return _POWERS[0][:n], _POWERS[1][:n]


def _prefix(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pows, inv = _powers(len(tokens))
    prefix = np.empty(len(tokens) + 1, dtype=np.uint64)
    prefix[0] = 0
    np.cumsum(tokens * pows, dtype=np.uint64, out=prefix[1:])
    return prefix, inv


def _common_positions(ha: np.ndarray, hb: np.ndarray) -> list[tuple[int, int]]:
    """(i, j) with ha[i] == hb[j], a few: sort the shorter side once, binary-search the longer."""
    swap = len(ha) < len(hb)
    big, small = (hb, ha) if swap else (ha, hb)
    order = np.argsort(small, kind="stable")
    s_sorted = small[order]
    pos = np.minimum(np.searchsorted(s_sorted, big), len(s_sorted) - 1)
    hit = np.flatnonzero(s_sorted[pos] == big)[:8]
    pairs = [(int(k), int(order[pos[k]])) for k in hit]
    return [(j, i) for i, j in pairs] if swap else pairs


def longest_shared_run(a: np.ndarray, b: np.ndarray) -> Run:
    """The longest common contiguous run of two token-hash streams, exactly.

    Binary search on the length with rolling polynomial hashes mod 2^64 (a shared run of
    length L implies one of every shorter length): O((|a| + |b|) log) with numpy, where a
    dynamic-programming or difflib match is O(|a| |b|) in Python. The run found is
    compared token by token, so a hash collision cannot inflate it.
    """
    a, b = np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64)
    if len(a) == 0 or len(b) == 0:
        return Run(0)
    pa, ia = _prefix(a)
    pb, ib = _prefix(b)
    best = Run(0)
    lo, hi = 1, min(len(a), len(b))
    while lo <= hi:
        mid = (lo + hi) // 2
        ha, hb = _window_hashes(pa, ia, mid), _window_hashes(pb, ib, mid)
        found = None
        for i, j in _common_positions(ha, hb)[:8]:
            if np.array_equal(a[i : i + mid], b[j : j + mid]):
                found = Run(mid, i, j)
                break
        if found is not None:
            best, lo = found, mid + 1
        else:
            hi = mid - 1
    return best
