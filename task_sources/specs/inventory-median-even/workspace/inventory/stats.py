"""Summary statistics used by the reorder report."""

from __future__ import annotations

from typing import Sequence


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of an empty sequence")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid]


def spread(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("spread of an empty sequence")
    return max(values) - min(values)
