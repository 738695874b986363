"""Pipeline stages wrapped in MLflow runs: what the CLI, the demo and the Dagster assets call.

`pipeline` does the work; this module adds the record of it (params, metrics, tables,
charts) so that every entry point logs the same things the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from envforge import pipeline, track
from envforge.catalog import Catalog, IngestSummary
from envforge.charts import flake_chart, similarity_histogram
from envforge.config import Settings
from envforge.pipeline import ImagesReport, Progress, QualityReport, ValidationReport, _no_progress
from envforge.quality.params import DedupConfig
from envforge.sources import LoadResult
from envforge.task import Task
from envforge.verify.gate import GateConfig


@dataclass
class TrackedIngest:
    result: LoadResult
    summary: IngestSummary
    mlflow_run_id: str
    sources: list[pipeline.SourceIngest]


def ingest(settings: Settings, paths: Sequence[Path], strict: bool = False, dagster_run_id: str | None = None,
           nested: bool = False, progress: Progress = _no_progress) -> TrackedIngest:
    with track.mlflow_run(settings, "ingest", "ingest", {"paths": [str(p) for p in paths], "strict": strict},
                          dagster_run_id, nested) as run:
        report = pipeline.ingest(settings, paths, strict=strict, progress=progress)
        result, summary = report.result, report.summary
        total = len(result.tasks) + len(result.rejects)
        track.log_metrics({"tasks_valid": len(result.tasks), "tasks_added": summary.added,
                           "tasks_unchanged": summary.unchanged, "records_rejected": summary.rejected,
                           "reject_rate": len(result.rejects) / total if total else 0.0})
        track.log_json([{"source": p.source, "field": p.field, "reason": p.reason} for p in result.rejects],
                       "rejects.json")
        track.log_json(report.rows(), "sources.json")
        return TrackedIngest(result, summary, run.info.run_id, report.sources)


def decontaminate(settings: Settings, tasks: Sequence[Task], config: DedupConfig = DedupConfig(),
                  dagster_run_id: str | None = None, nested: bool = False) -> tuple[QualityReport, str, Path]:
    """Decontamination and dedup, logged: verdicts, the contamination table and a similarity histogram."""
    with track.mlflow_run(settings, "decontaminate", "quality", {"n_tasks": len(tasks), **config.as_params()},
                          dagster_run_id, nested) as run:
        report = pipeline.decontaminate(settings, tasks, config=config)
        statuses = [r["status"] for r in report.rows]
        track.log_metrics({
            "tasks_checked": len(report.rows), "tasks_clean": statuses.count("clean"),
            "tasks_contaminated": statuses.count("contaminated"), "tasks_duplicate": statuses.count("duplicate"),
            "duplicate_pairs": len(report.pairs), "index_docs_added": report.sync.added_docs,
        })
        chart = similarity_histogram([r["exact_jaccard"] for r in report.rows],
                                     [r["nearest_task_jaccard"] for r in report.rows], config.threshold,
                                     settings.data_dir / "charts" / "similarity_histogram.png")
        track.log_png(chart)
        track.log_json(report.rows, "contamination_report.json")
        return report, run.info.run_id, chart


def build_images(settings: Settings, tasks: Sequence[Task], dagster_run_id: str | None = None,
                 nested: bool = False, progress: Progress = _no_progress) -> tuple[ImagesReport, str]:
    with track.mlflow_run(settings, "images", "images", {"n_tasks": len(tasks)}, dagster_run_id, nested) as run:
        report = pipeline.build_images(settings, tasks, progress=progress)
        built = [b for _, b in report.builds]
        track.log_metrics({
            "images_built": sum(not b.cache_hit for b in built), "images_cache_hits": report.cache_hits,
            "image_failures": len(report.failures), "base_build_s": report.base.seconds,
            "base_cache_hit": float(report.base.cache_hit),
            "task_build_s_total": sum(b.seconds for b in built),
        })
        track.log_json({"base": report.base.tag, "images": {t.id: b.tag for t, b in report.builds},
                        "failures": [str(p) for p in report.failures]}, "images.json")
        return report, run.info.run_id


def validate(settings: Settings, tasks: Sequence[Task], images: dict[str, str], config: GateConfig = GateConfig(),
             dagster_run_id: str | None = None, nested: bool = False, concurrency: int = 2,
             progress: Progress = _no_progress, force: bool = False) -> tuple[ValidationReport, str, Path]:
    """The flakiness gate, logged: verdicts, the flake report table and its chart."""
    with track.mlflow_run(settings, "validate", "validate", {"n_tasks": len(tasks), **config.as_params(),
                                                             "workers": config.workers, "force": force},
                          dagster_run_id, nested) as run:
        report = pipeline.validate(settings, tasks, images, config, concurrency=concurrency, progress=progress,
                                   mlflow_run_id=run.info.run_id, dagster_run_id=dagster_run_id, force=force)
        rows = report.rows()
        accepted = sum(r.accepted for r in report.reports)
        track.log_metrics({
            "tasks_accepted": accepted, "tasks_quarantined": len(report.reports) - accepted,
            "quarantine_rate": (len(report.reports) - accepted) / max(1, len(report.reports)),
            "infra_failures": len(report.infra_failures),
            "infra_retries": sum(r.infra_retries for r in report.reports),
            "verifier_median_s": statistics.median([r.median_verifier_s for r in report.reports] or [0.0]),
            "tasks_kept": len(report.kept), "gradings": sum(r.gradings for r in report.reports if not r.reused_from),
            "gate_sandbox_s": sum(r.sandbox_s for r in report.reports if not r.reused_from),
        })
        chart = flake_chart(rows, settings.data_dir / "charts" / "flake_report.png")
        track.log_png(chart)
        track.log_json(rows, "flake_report.json")
        track.log_json({r.task_id: r.probe_results for r in report.reports}, "probes.json")
        track.log_json({r.task_id: r.probes_skipped for r in report.reports}, "probes_skipped.json")
        return report, run.info.run_id, chart


def create_task_set(settings: Settings, name: str, tasks: Sequence[Task], params: dict,
                    sources: list[str] | None = None, removed: list[dict] | None = None) -> tuple[str, Path]:
    catalog = Catalog(settings.catalog_path)
    version = catalog.create_task_set(name, tasks, params, sources=sources, removed=removed)
    path = catalog.export_task_set(version, settings.data_dir / "task_sets" / f"{name}-{version[:12]}.parquet")
    track.log_metrics({"task_set_size": len(tasks)})
    track.log_json({"name": name, "version": version, "parquet": str(path)}, "task_set.json")
    return version, path


def rollout(settings: Settings, tasks: Sequence[Task], policy_spec: str, config, task_set_version: str = "",
            batch_id: str | None = None, root: str | None = None, dagster_run_id: str | None = None,
            nested: bool = False, progress: Progress = _no_progress):
    """A rollout batch (images built as needed), logged: params, metrics, and the batch summary."""
    from envforge.rollout.batch import run_batch
    from envforge.rollout.policies.factory import make_policy

    params = {"policy": policy_spec, "task_set_version": task_set_version, "n_tasks": len(tasks),
              **{f"rollout.{k}": v for k, v in config.as_params().items()}}
    with track.mlflow_run(settings, "rollout", "rollout", params, dagster_run_id, nested) as run:
        images = pipeline.build_images(settings, tasks, progress=progress)
        image_for = images.image_for()
        items = [(t, image_for[t.content_hash]) for t in tasks if t.content_hash in image_for]
        policy = make_policy(policy_spec)
        result = run_batch(settings, items, policy, config, task_set_version=task_set_version, batch_id=batch_id,
                           root=root, progress=progress)
        track.log_metrics(result.metrics)
        track.log_json({"batch_id": result.store.batch_id, "location": f"{result.store.root}/{result.store.batch_id}",
                        "dropped_groups": [g.to_json() for g in result.report.dropped_groups]}, "rollout_batch.json")
        result.mlflow_run_id = run.info.run_id
        return result


def tier_task_set(settings: Settings, version: str, policy_spec: str | None = None, k: int = 8,
                  eval_fraction: float = 0.2, seed: int = 0, concurrency: int = 4,
                  dagster_run_id: str | None = None, nested: bool = False, progress: Progress = _no_progress):
    """Difficulty tiers (pass@k of a reference policy, or static features) and a stratified split.

    Returns (tier rows as dicts, histogram PNG, MLflow run id).
    """
    from envforge.charts import tier_histogram
    from envforge.rollout.batch import run_batch
    from envforge.rollout.policies.factory import make_policy
    from envforge.rollout.scheduler import RolloutConfig
    from envforge.rollout.tiers import static_tiers, stratified_split, tiers_from_passes

    catalog = Catalog(settings.catalog_path)
    version = catalog.resolve_task_set(version)
    tasks = catalog.load_task_set(version)
    params = {"task_set_version": version, "policy": policy_spec or "static", "k": k, "eval_fraction": eval_fraction,
              "seed": seed}
    with track.mlflow_run(settings, "tiers", "tiers", params, dagster_run_id, nested) as run:
        policy_id = "static"
        if policy_spec:
            images = pipeline.build_images(settings, tasks, progress=progress).image_for()
            policy = make_policy(policy_spec)
            policy_id = getattr(policy, "policy_id", policy_spec)
            result = run_batch(settings, [(t, images[t.content_hash]) for t in tasks if t.content_hash in images],
                               policy, RolloutConfig(n_samples=k, concurrency=concurrency, seed=seed),
                               task_set_version=version, batch_id=f"tiers-{version[:12]}-k{k}-s{seed}",
                               progress=progress)
            solved: dict[str, tuple[int, int]] = {}
            for t in result.store.trajectories():
                n, c = solved.get(t.task_id, (0, 0))
                solved[t.task_id] = (n + int(t.resolved), c + 1)
            rows = tiers_from_passes(tasks, solved)
            track.log_metrics({f"reference_{key}": v for key, v in result.metrics.items()})
        else:
            rows = static_tiers(tasks)
        rows = stratified_split(rows, eval_fraction, seed)
        dicts = [dict(r.__dict__, policy_id=policy_id if r.method == "pass@k" else "static") for r in rows]
        catalog.record_tiers(version, dicts)
        chart = tier_histogram(dicts, settings.data_dir / "charts" / f"tiers-{version[:12]}.png")
        track.log_png(chart)
        track.log_json(dicts, "tiers.json")
        for tier in ("unsolved", "hard", "medium", "easy", "trivial"):
            track.log_metrics({f"tier_{tier}": sum(1 for r in rows if r.tier == tier)})
        track.log_metrics({"train": sum(r.split == "train" for r in rows), "eval": sum(r.split == "eval" for r in rows)})
        return dicts, chart, run.info.run_id


def _split_items(settings: Settings, version: str, split: str, progress: Progress = _no_progress):
    catalog = Catalog(settings.catalog_path)
    version = catalog.resolve_task_set(version)
    tiers = catalog.tiers(version)
    wanted = set(tiers.filter(tiers["split"] == split)["task_id"])
    tasks = [t for t in catalog.load_task_set(version) if t.id in wanted]
    images = pipeline.build_images(settings, tasks, progress=progress).image_for()
    tier_of = dict(zip(tiers["task_id"], tiers["tier"]))
    return version, [(t, images[t.content_hash]) for t in tasks if t.content_hash in images], tier_of


def checkpoint_dir(settings: Settings, kind: str, version: str) -> Path:
    return settings.data_dir / "checkpoints" / f"{kind}-{version[:12]}"


def sft_stage(settings: Settings, version: str = "latest", base_model: str = "tiny", epochs: int = 5,
              lr: float = 3e-3, seed: int = 0, dagster_run_id: str | None = None, progress: Progress = _no_progress):
    """SFT on the teacher's demonstrations of the task set's train split; eval loss on the eval split."""
    from envforge.charts import learning_curve
    from envforge.train.checkpoint import log_checkpoint, save_checkpoint
    from envforge.train.loop import demonstrations, load_model
    from envforge.train.sft import SFTConfig, steps_per_epoch, train_sft

    version, train_items, _ = _split_items(settings, version, "train", progress)
    _, eval_items, _ = _split_items(settings, version, "eval", progress)
    params = {"task_set_version": version, "base_model": base_model, "epochs": epochs, "lr": lr, "seed": seed,
              "train_tasks": len(train_items), "eval_tasks": len(eval_items)}
    with track.mlflow_run(settings, "sft", "sft", params, dagster_run_id) as run:
        model, tokenizer = load_model(base_model, seed)

        def on_metrics(step: int, metrics: dict) -> None:
            track.log_metrics({f"sft_{k}": v for k, v in metrics.items()}, step=step)
            progress("sft", f"step {step}: loss {metrics.get('loss', float('nan')):.4f}", step, total_steps)

        train = demonstrations(settings, train_items, tokenizer, f"sft-{version[:12]}-teacher-train", 4, version)
        evals = demonstrations(settings, eval_items, tokenizer, f"sft-{version[:12]}-teacher-eval", 4, version)
        sft_config = SFTConfig(lr=lr, epochs=epochs, seed=seed, eval_every=20, pad_id=tokenizer.pad_token_id or 0)
        total_steps = steps_per_epoch(len(train), sft_config, train) * epochs
        result = train_sft(model, train, evals, sft_config, tokenizer=tokenizer, on_metrics=on_metrics)
        path = save_checkpoint(checkpoint_dir(settings, "sft", version), model, tokenizer, step=result.total_steps,
                               extra={"base_model": base_model, "task_set_version": version})
        log_checkpoint(path, {"eval_loss": result.eval_losses[-1][1] if result.eval_losses else 0.0},
                       "envforge-policy-sft")
        chart = learning_curve(list(zip(result.steps, result.losses)), result.eval_losses, [], [],
                               settings.data_dir / "charts" / f"sft-{version[:12]}.png", title="SFT")
        track.log_png(chart)
        return path, result, chart, run.info.run_id


def rl_stage(settings: Settings, version: str = "latest", rounds: int = 2, group_size: int = 4, lr: float = 1e-4,
             seed: int = 0, dagster_run_id: str | None = None, progress: Progress = _no_progress,
             tasks_per_round: int | None = 4):
    """GRPO rounds from the SFT checkpoint on the train split; the result is registered with alias `best`."""
    from envforge.train.checkpoint import log_checkpoint
    from envforge.train.grpo import GRPOConfig
    from envforge.train.loop import GRPORounds, grpo_rounds, load_model

    version, train_items, _ = _split_items(settings, version, "train", progress)
    sft_dir = checkpoint_dir(settings, "sft", version)
    params = {"task_set_version": version, "from": str(sft_dir), "rounds": rounds, "group_size": group_size,
              "tasks_per_round": tasks_per_round, "lr": lr, "seed": seed}
    with track.mlflow_run(settings, "grpo", "rl", params, dagster_run_id) as run:
        model, tokenizer = load_model(str(sft_dir), seed)
        cfg = GRPORounds(rounds=rounds, group_size=group_size, seed=seed, tasks_per_round=tasks_per_round,
                         grpo=GRPOConfig(lr=lr, seed=seed, pad_id=tokenizer.pad_token_id or 0))

        def on_round(r: int, metrics: dict) -> None:
            track.log_metrics(metrics, step=r)
            progress("grpo", f"round {r}: rollout reward {metrics['rollout_mean_reward']:.3f}", r + 1, rounds)

        trainer, history = grpo_rounds(settings, model, tokenizer, train_items, cfg, f"rl-{version[:12]}",
                                       on_round=on_round, task_set_version=version, progress=progress)
        path = trainer.save(checkpoint_dir(settings, "rl", version))
        log_checkpoint(path, history[-1] if history else {}, "envforge-policy", alias="best", is_best=True)
        return path, history, run.info.run_id


def evaluation_stage(settings: Settings, version: str = "latest", base_model: str = "tiny", seed: int = 0,
                     dagster_run_id: str | None = None, progress: Progress = _no_progress):
    """Eval-split pass@1 of the base model, the SFT checkpoint and the RL checkpoint, per tier and per source."""
    from envforge.charts import pass_rate_bars
    from envforge.train.loop import evaluate, load_model, pass_at_1_by

    version, eval_items, tier_of = _split_items(settings, version, "eval", progress)
    tasks = [t for t, _ in eval_items]
    phases = {"before": base_model, "after SFT": str(checkpoint_dir(settings, "sft", version)),
              "after RL": str(checkpoint_dir(settings, "rl", version))}
    report: dict[str, Any] = {"task_set_version": version, "eval_tasks": len(tasks), "phases": {}}
    with track.mlflow_run(settings, "evaluation", "evaluation", {"task_set_version": version, **phases},
                          dagster_run_id) as run:
        for label, source in phases.items():
            model, tokenizer = load_model(source, seed)
            result = evaluate(settings, model, tokenizer, eval_items, f"eval-{version[:12]}-{label.replace(' ', '-')}",
                              label, task_set_version=version, progress=progress)
            report["phases"][label] = {
                "pass_at_1": result.metrics["pass_at_1"],
                "by_tier": pass_at_1_by(result, tasks, lambda t: tier_of.get(t.id, "?")),
                "by_source": pass_at_1_by(result, tasks, lambda t: t.spec.source)}
            track.log_metrics({f"pass_at_1_{label.replace(' ', '_')}": result.metrics["pass_at_1"]})
        charts = {}
        for key in ("by_tier", "by_source"):
            charts[key] = pass_rate_bars({p: v[key] for p, v in report["phases"].items()},
                                         settings.data_dir / "charts" / f"evaluation-{key}-{version[:12]}.png",
                                         f"eval-split pass@1 {key.replace('_', ' ')}")
            track.log_png(charts[key])
        track.log_json(report, "evaluation_report.json")
        return report, charts, run.info.run_id


def publish_task_set(settings: Settings, name: str, tasks: Sequence[Task], params: dict,
                     dagster_run_id: str | None = None) -> tuple[str, Path]:
    """A task-set version from the given tasks (content-addressed: unchanged tasks give the same version), logged."""
    with track.mlflow_run(settings, "task_set", "task_set", {"name": name, "n_tasks": len(tasks)}, dagster_run_id):
        return create_task_set(settings, name, tasks, params)
