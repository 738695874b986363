"""Tiers: a task set's difficulty tiers (pass@k of a reference policy, or static features) and its
train/eval/audit split, stratified by tier and source and keeping near-duplicate clusters whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.quality.dedup import DuplicatePair, cluster_keys, near_duplicate_pairs, straddling_pairs
from envforge.quality.params import DedupConfig
from envforge.stages.base import StageContext, StageResult, counts, stage
from envforge.stages.configs import TierConfig
from envforge.stages.images import ImageSet, ensure_images
from envforge.task import Task
from envforge.tier_names import SPLITS, TIERS


@dataclass
class TiersResult(StageResult):
    version: str
    rows: list[dict]  # TaskTierRow fields but version
    chart: Path
    pairs: list[DuplicatePair] = field(default_factory=list)  # near duplicates inside the set, kept on one side
    reference_metrics: dict[str, float] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.rows[0]["method"] if self.rows else ""

    def tier_counts(self) -> dict[str, int]:
        return counts([r["tier"] for r in self.rows], TIERS)

    def split_counts(self) -> dict[str, int]:
        return counts([r["split"] for r in self.rows], SPLITS)

    def params(self) -> dict[str, Any]:
        return {"task_set_version": self.version}

    def metrics(self) -> dict[str, float]:
        splits = self.split_counts()
        return {
            **{f"reference_{k}": v for k, v in self.reference_metrics.items()},
            **{f"tier_{t}": n for t, n in self.tier_counts().items()},
            "train": splits["train"],
            "eval": splits["eval"],
            "duplicate_pairs": len(self.pairs),
        }

    def artifacts(self) -> dict[str, Any]:
        return {"tiers.json": self.rows}

    def charts(self) -> list[Path]:
        return [self.chart]


def duplicate_groups(settings: Settings, version: str, tasks: list[Task]) -> tuple[list[DuplicatePair], dict[str, str]]:
    """Near-duplicate pairs among a task set's members (with the dedup params the version was made
    with) and the cluster each paired task belongs to: what a split must keep together."""
    params = Catalog(settings.catalog_path).task_set_params(version).get("dedup")
    pairs = near_duplicate_pairs(tasks, config=DedupConfig.from_params(params) if params else DedupConfig())
    return pairs, cluster_keys(tasks, pairs)


def split_leaks(settings: Settings, version: str) -> tuple[list[DuplicatePair], list[DuplicatePair]]:
    """The near-duplicate pairs among a task set's members, and those its recorded split puts one in
    train and one in eval (a leak: the model is evaluated on what it was trained on)."""
    catalog = Catalog(settings.catalog_path)
    pairs, _ = duplicate_groups(settings, version, catalog.load_task_set(version))
    tiers = catalog.tiers(version)
    return pairs, straddling_pairs(dict(zip(tiers["task_id"], tiers["split"])), pairs)


@stage("tiers")
def tier_task_set(
    settings: Settings,
    config: TierConfig,
    version: str,
    images: ImageSet | None = None,
    context: StageContext = StageContext(),
) -> TiersResult:
    """Tier and split the members of task-set `version` (a full version), and record them in the catalog."""
    from envforge.charts import tier_histogram
    from envforge.rollout.batch import run_batch
    from envforge.rollout.config import RolloutConfig
    from envforge.rollout.policies.factory import make_policy
    from envforge.rollout.tiers import static_tiers, stratified_split, tiers_from_passes

    catalog = Catalog(settings.catalog_path)
    tasks = catalog.load_task_set(version)
    policy_id, reference = "static", {}
    if config.policy:
        items = ensure_images(settings, tasks, images, context).items(tasks)
        policy = make_policy(config.policy)
        policy_id = getattr(policy, "policy_id", config.policy)
        batch = run_batch(
            settings,
            items,
            policy,
            RolloutConfig(n_samples=config.k, concurrency=config.concurrency, seed=config.seed),
            task_set_version=version,
            batch_id=f"tiers-{version[:12]}-k{config.k}-s{config.seed}",
            progress=context.progress,
            sandboxes=context.sandboxes,
            register=catalog.record_rollout_batch,
        )
        solved: dict[str, tuple[int, int]] = {}
        for t in batch.store.trajectories():
            n, c = solved.get(t.task_id, (0, 0))
            solved[t.task_id] = (n + int(t.resolved), c + 1)
        tier_rows = tiers_from_passes(tasks, solved)
        reference = dict(batch.metrics)
    else:
        tier_rows = static_tiers(tasks)
    pairs, groups = duplicate_groups(settings, version, tasks)
    audit_only = catalog.audit_only(t.content_hash for t in tasks)  # weak verifiers: never train or eval
    tier_rows = stratified_split(tier_rows, config.eval_fraction, config.seed, groups, audit_only)
    rows = [dict(r.__dict__, policy_id=policy_id if r.method == "pass@k" else "static") for r in tier_rows]
    catalog.record_tiers(version, rows)
    chart = tier_histogram(rows, settings.charts_dir / f"tiers-{version[:12]}.png")
    return TiersResult(version, rows, chart, pairs, reference)
