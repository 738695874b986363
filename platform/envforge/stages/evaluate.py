"""Evaluation: eval-split pass@1 of the base model, the SFT checkpoint and the RL checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.stages.base import StageContext, StageResult, stage
from envforge.stages.images import ImageSet, ensure_images
from envforge.train.config import TrainingConfig


@dataclass
class EvaluationResult(StageResult):
    version: str
    phases: dict[str, str]  # label -> model source
    report: dict[str, Any]  # {task_set_version, eval_tasks, phases: {label: {pass_at_1, by_tier, by_source}}}
    charts_by: dict[str, Path] = field(default_factory=dict)  # by_tier / by_source -> PNG

    def pass_at_1(self) -> dict[str, float]:
        return {label: p["pass_at_1"] for label, p in self.report["phases"].items()}

    def params(self) -> dict[str, Any]:
        return {"task_set_version": self.version, **self.phases}

    def metrics(self) -> dict[str, float]:
        return {f"pass_at_1_{label.replace(' ', '_')}": v for label, v in self.pass_at_1().items()}

    def artifacts(self) -> dict[str, Any]:
        return {"evaluation_report.json": self.report}

    def charts(self) -> list[Path]:
        return list(self.charts_by.values())


@stage("evaluation")
def evaluate(
    settings: Settings,
    config: TrainingConfig,
    version: str,
    checkpoints: Mapping[str, Path],
    images: ImageSet | None = None,
    context: StageContext = StageContext(),
    promote: str | None = "after RL",
) -> EvaluationResult:
    """Greedy pass@1 on the eval split, per tier and per source, of `config.base_model` ("before") and of
    each of `checkpoints` (label -> checkpoint directory, e.g. "after SFT", "after RL").

    The checkpoint labelled `promote` (a registered version of the RL policy) then gets the registry's
    `best` alias if its eval-split pass@1 beats the current `best`'s (`train.registry.promote_if_better`);
    the decision is the report's `promotion`."""
    from envforge.charts import pass_rate_bars
    from envforge.train.loop import evaluate as evaluate_model
    from envforge.train.loop import load_model, pass_at_1_by

    catalog = Catalog(settings.catalog_path)
    eval_tasks = catalog.load_split(version, "eval")
    eval_items = ensure_images(settings, eval_tasks, images, context).items(eval_tasks)
    tiers = catalog.tiers(version)
    tier_of = dict(zip(tiers["task_id"], tiers["tier"]))
    tasks = [t for t, _ in eval_items]
    phases = {"before": config.base_model, **{label: str(path) for label, path in checkpoints.items()}}
    report: dict[str, Any] = {"task_set_version": version, "eval_tasks": len(tasks), "phases": {}}

    def measure(label: str, source: str) -> dict[str, Any]:
        model, tokenizer = load_model(source, config.seed)
        result = evaluate_model(
            settings,
            model,
            tokenizer,
            eval_items,
            f"eval-{version[:12]}-{label.replace(' ', '-')}",
            label,
            concurrency=config.concurrency,
            max_tokens=config.max_tokens,
            task_set_version=version,
            progress=context.progress,
            sandboxes=context.sandboxes,
        )
        return {
            "pass_at_1": result.metrics["pass_at_1"],
            "batch_id": result.store.batch_id,
            "by_tier": pass_at_1_by(result, tasks, lambda t: tier_of.get(t.id, "?")),
            "by_source": pass_at_1_by(result, tasks, lambda t: t.spec.source),
        }

    for label, source in phases.items():
        report["phases"][label] = measure(label, source)
    if promote in checkpoints:
        from envforge.stages.rl import POLICY_MODEL
        from envforge.train.registry import promote_if_better

        report["promotion"] = promote_if_better(
            settings,
            POLICY_MODEL,
            checkpoints[promote],
            float(report["phases"][promote]["pass_at_1"]),
            version,
            measure=lambda path: float(measure("current best", path)["pass_at_1"]),
        )
    charts = {
        key: pass_rate_bars(
            {p: v[key] for p, v in report["phases"].items()},
            settings.charts_dir / f"evaluation-{key}-{version[:12]}.png",
            f"eval-split pass@1 {key.replace('_', ' ')}",
        )
        for key in ("by_tier", "by_source")
    }
    return EvaluationResult(version, phases, report, charts)
