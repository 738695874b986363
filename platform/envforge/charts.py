"""PNG charts people would rather look at than read; attached to MLflow runs and Dagster metadata."""

from __future__ import annotations

import base64
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)


def png_data_uri(path: Path) -> str:
    """A PNG inlined as a data URI, so a page (the run report, Dagster's markdown) needs no other file."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def flake_chart(rows: list[dict], path: Path, title: str = "Flakiness gate: verifier agreement per task") -> Path:
    """Per task: share of reference runs that passed and of empty runs that failed; quarantined in red.

    rows: dicts with task_id, verdict, reference_passes, empty_fails, runs (reference runs graded) and
    optionally empty_runs (empty runs graded; fewer than configured when the gate stopped early).
    """
    rows = sorted(rows, key=lambda r: r["task_id"])
    names = [r["task_id"] for r in rows]
    ref = [r["reference_passes"] / max(1, r["runs"]) for r in rows]
    empty = [r["empty_fails"] / max(1, r.get("empty_runs", r["runs"])) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows) + 2), 4.2))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], ref, width=0.4, label="reference passed", color="#2a9d8f")
    ax.bar([x + 0.2 for x in xs], empty, width=0.4, label="empty failed", color="#457b9d")
    for x, r in zip(xs, rows):
        if r["verdict"] != "accepted":
            ax.axvspan(x - 0.5, x + 0.5, color="#e63946", alpha=0.15)
            ax.text(x, 1.12, "quarantined", ha="center", fontsize=7, color="#e63946")
    ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("share of the runs graded")
    ax.set_title(title)
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    return _save(fig, path)


def similarity_histogram(
    corpus_sims: list[float],
    task_sims: list[float],
    threshold: float,
    path: Path,
    title: str = "Nearest-neighbour similarity (exact Jaccard)",
) -> Path:
    """Two histograms: each task's best match in the reference corpora, and among the tasks."""
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = [i / 20 for i in range(21)]
    ax.hist(
        [corpus_sims, task_sims],
        bins=bins,
        label=["vs reference corpora", "vs other tasks"],
        color=["#e76f51", "#457b9d"],
    )
    ax.axvline(threshold, color="black", linestyle="--", linewidth=1)
    ax.text(threshold + 0.01, ax.get_ylim()[1] * 0.9, f"threshold {threshold}", fontsize=8)
    ax.set_xlabel("exact Jaccard of the nearest neighbour")
    ax.set_ylabel("tasks")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def evidence_strength_chart(
    rows: list[dict], path: Path, title: str = "Strongest evidence per task field vs the reference corpora"
) -> Path:
    """One dot per (task, field): its best evidence's strength (the strongest rule's value over
    what it needs; 1 = the rule holds), flagged ones in red. rows: dicts with field, strength, flagged."""
    fields = ["instruction", "workspace", "solution", "tests", "verifier"]
    fields += sorted({r["field"] for r in rows} - set(fields))
    fig, ax = plt.subplots(figsize=(7, 4))
    for x, name in enumerate(fields):
        mine = [r for r in rows if r["field"] == name]
        for flagged, colour in ((False, "#457b9d"), (True, "#e76f51")):
            ys = [min(r["strength"], 3.0) for r in mine if r["flagged"] == flagged]
            xs = [x + ((i * 0.37) % 0.5) - 0.25 for i in range(len(ys))]
            ax.scatter(
                xs, ys, s=12, color=colour, alpha=0.8, label=("flagged" if flagged else "clean") if x == 0 else None
            )
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(fields)), fields)
    ax.set_ylim(0, 3.1)
    ax.set_ylabel("evidence strength (1 = rule holds, capped at 3)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def tier_histogram(rows: list[dict], path: Path, title: str = "Difficulty tiers by source") -> Path:
    """Tasks per tier, stacked by source; the method (pass@k or static) in the title.

    rows: dicts with tier, source, method.
    """
    from envforge.tier_names import TIERS

    sources = sorted({r["source"] for r in rows}) or ["-"]
    methods = sorted({r["method"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bottom = [0] * len(TIERS)
    palette = ["#264653", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51", "#457b9d", "#8d99ae"]
    for i, src in enumerate(sources):
        counts = [sum(1 for r in rows if r["tier"] == t and r["source"] == src) for t in TIERS]
        ax.bar(TIERS, counts, bottom=bottom, label=src, color=palette[i % len(palette)])
        bottom = [b + c for b, c in zip(bottom, counts)]
    for x, total in enumerate(bottom):
        ax.text(x, total + 0.1, str(total), ha="center", fontsize=9)
    ax.set_ylabel("tasks")
    ax.set_title(f"{title} ({', '.join(methods) or 'no tasks'})")
    ax.legend(fontsize=8)
    return _save(fig, path)


def learning_curve(
    sft_losses: list[tuple[int, float]],
    sft_eval: list[tuple[int, float]],
    grpo_rewards: list[float],
    pass_at_1: list[tuple[str, float]],
    path: Path,
    title: str = "Learning demo",
) -> Path:
    """Three panels: SFT loss (train and held-out eval), GRPO mean reward per round, held-out pass@1 per phase."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    ax = axes[0]
    if sft_losses:
        ax.plot([s for s, _ in sft_losses], [v for _, v in sft_losses], color="#264653", label="train")
    if sft_eval:
        ax.plot([s for s, _ in sft_eval], [v for _, v in sft_eval], "o-", color="#e76f51", label="held-out eval")
    ax.set_title("SFT loss (completion tokens)")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(range(1, len(grpo_rewards) + 1), grpo_rewards, "o-", color="#2a9d8f")
    ax.set_title("GRPO: mean reward of the round's rollouts")
    ax.set_xlabel("round")
    ax.set_ylim(-0.05, 1.05)
    ax = axes[2]
    ax.bar([p for p, _ in pass_at_1], [v for _, v in pass_at_1], color="#457b9d")
    for x, (_, v) in enumerate(pass_at_1):
        ax.text(x, v + 0.02, f"{v:.2f}", ha="center", fontsize=9)
    ax.set_ylim(0, 1.1)
    ax.set_title("held-out pass@1 (sandbox verifier)")
    ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def pass_rate_bars(groups: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    """Grouped bars: for each bucket (tier or source), pass@1 of each phase (before, after SFT, after RL)."""
    phases = list(groups)
    buckets = sorted({b for g in groups.values() for b in g})
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(buckets) + 2), 3.8))
    width = 0.8 / max(1, len(phases))
    colors = ["#8d99ae", "#2a9d8f", "#e76f51", "#264653"]
    for i, phase in enumerate(phases):
        xs = [x + (i - (len(phases) - 1) / 2) * width for x in range(len(buckets))]
        ax.bar(xs, [groups[phase].get(b, 0.0) for b in buckets], width=width, label=phase, color=colors[i % 4])
    ax.set_xticks(list(range(len(buckets))), buckets)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("pass@1")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def strength_chart(
    scores: list[float],
    threshold: float,
    path: Path,
    title: str = "Verifier strength: share of non-equivalent mutants the tests reject",
) -> Path:
    """Histogram of per-task verifier strength, the gate's minimum as a dashed line (below it: weak)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = [i / 10 for i in range(11)]
    weak = [s for s in scores if s < threshold]
    ax.hist(
        [weak, [s for s in scores if s >= threshold]],
        bins=bins,
        stacked=True,
        label=[f"below {threshold:g} (weak verifier)", "strong enough"],
        color=["#e63946", "#2a9d8f"],
    )
    ax.axvline(threshold, color="black", linestyle="--", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_xlabel("strength (killed / non-equivalent mutants)")
    ax.set_ylabel("tasks")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)
