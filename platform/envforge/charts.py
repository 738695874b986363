"""PNG charts people would rather look at than read; attached to MLflow runs and Dagster metadata."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)


def solution_outcomes_chart(rows: list[dict], path: Path, title: str = "Verifier sanity: reference vs empty") -> Path:
    """Grouped bars per task: reward of the reference solution and of the empty solution.

    rows: dicts with task_id, solution ('reference'|'empty') and reward.
    """
    tasks = sorted({r["task_id"] for r in rows})
    ref = [next((r["reward"] for r in rows if r["task_id"] == t and r["solution"] == "reference"), 0) for t in tasks]
    empty = [next((r["reward"] for r in rows if r["task_id"] == t and r["solution"] == "empty"), 0) for t in tasks]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(tasks) + 2), 4))
    xs = range(len(tasks))
    ax.bar([x - 0.2 for x in xs], ref, width=0.4, label="reference solution", color="#2a9d8f")
    ax.bar([x + 0.2 for x in xs], empty, width=0.4, label="empty solution", color="#e76f51")
    ax.set_xticks(list(xs), tasks, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
