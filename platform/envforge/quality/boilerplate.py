"""Boilerplate: text that many tasks share and that says nothing about any one of them.

Tasks from one team share a template intro, a license header, "Don't change the tests".
Compared with it, two different tasks look alike; without it, they are what they are. A
shingle (word 5-gram) found in at least `min_tasks` of the tasks compared is boilerplate and
is left out of task-vs-task comparison. A task made only of boilerplate keeps its shingles
(so five identical copies of a task are still duplicates of each other).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def boilerplate_shingles(shingle_sets: Sequence[np.ndarray], min_tasks: int) -> np.ndarray:
    """Sorted shingle hashes found in at least `min_tasks` of the (unique) shingle sets."""
    if not shingle_sets:
        return np.zeros(0, np.uint32)
    values, counts = np.unique(np.concatenate(shingle_sets), return_counts=True)
    return values[counts >= min_tasks]


def own_shingles(shingles: np.ndarray, boilerplate: np.ndarray) -> np.ndarray:
    """A task's shingles without the boilerplate; all of them if nothing else is left."""
    if len(boilerplate) == 0 or len(shingles) == 0:
        return shingles
    own = shingles[~np.isin(shingles, boilerplate, assume_unique=True)]
    return own if len(own) else shingles
