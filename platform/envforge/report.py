"""The run report: one self-contained HTML page per pipeline run, for people rather than tools.

It gathers what the catalog and the MLflow store know about one task-set version (the card,
the gates, the rollout batches, SFT, GRPO and the evaluation, with their PNG charts) and
renders it with Jinja2 into a single file: charts inlined as data URIs, inline CSS, no
script and nothing fetched from elsewhere, so it can be mailed or attached as it is. A stage
that has not run yet is shown as "not run yet" instead of failing the report. Every value
that comes from the data (task text, reject reasons, ids) is HTML-escaped by the template.

The report is written to `<data dir>/reports/run-report-<version>-<UTC time>.html` and
copied to `reports/latest.html` (both atomically); the `report` stage (envforge.stages.report)
keeps it as an artifact of its MLflow run (tagged with the Dagster run id when there is one).
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import polars as pl

from envforge import objectstore, track
from envforge.catalog import Catalog
from envforge.config import Settings
from envforge.errors import Problem
from envforge.observe.health import thresholds_from_env
from envforge.quality.statement_policy import statement_verdicts
from envforge.rollout.health import catalog_verdicts
from envforge.safefs import write_atomic

NOT_RUN = "not run yet"
# The stages whose MLflow runs carry the task-set version as a param (the others act on the catalog's current tasks).
_VERSIONED_STAGES = ("tiers", "rollout", "sft", "rl", "evaluation")
_GATE_STAGES = ("ingest", "quality", "images", "validate", "task_set")
_INSTRUCTION_CHARS = 220


@dataclass(frozen=True)
class RunReport:
    """Where the report went and what it holds (for the CLI and the Dagster asset)."""

    path: Path
    latest: Path
    task_set_version: str | None
    mlflow_run_id: str
    sections: dict[str, bool]  # section -> whether its stage has run
    counts: dict[str, int] = field(default_factory=dict)


# -- MLflow --------------------------------------------------------------------------------------


class _Runs:
    """Read-only queries on the configured MLflow experiment."""

    def __init__(self, settings: Settings):
        import mlflow

        self.experiment = track.experiment_id(settings)
        self.client = mlflow.MlflowClient(tracking_uri=settings.mlflow_tracking_uri)

    def find(self, stage: str, version: str | None = None, limit: int = 1) -> list:
        """The newest finished runs of a stage (of a task-set version, for the versioned stages)."""
        where = f"tags.`{track.STAGE_TAG}` = '{stage}' AND attributes.status = 'FINISHED'"
        if version is not None:
            where += f" AND params.task_set_version = '{version}'"
        return list(
            self.client.search_runs(
                [self.experiment], where, order_by=["attributes.start_time DESC"], max_results=limit
            )
        )

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, key))

    def artifact_json(self, run, name: str) -> Any | None:
        import mlflow

        try:
            return mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{name}")
        except Exception:  # not logged by this run, or the artifact store is gone
            return None

    def model_versions(self, run_id: str) -> list[dict]:
        out = []
        for mv in self.client.search_model_versions(f"run_id = '{run_id}'"):
            out.append(
                {
                    "name": mv.name,
                    "version": mv.version,
                    "aliases": ", ".join(getattr(mv, "aliases", []) or []),
                    "source": mv.source,
                }
            )
        return sorted(out, key=lambda m: (m["name"], int(m["version"])))


def _run_row(stage: str, run) -> dict:
    started = datetime.fromtimestamp(run.info.start_time / 1000, tz=timezone.utc) if run.info.start_time else None
    return {
        "stage": stage,
        "name": run.info.run_name or "",
        "run_id": run.info.run_id,
        "status": run.info.status,
        "started": started.strftime("%Y-%m-%d %H:%M:%S UTC") if started else "",
        "dagster_run_id": run.data.tags.get(track.DAGSTER_RUN_TAG, ""),
    }


# -- charts --------------------------------------------------------------------------------------


class _Charts:
    """PNG charts as data URIs: the stage's own file when there is one, else drawn from the recorded data."""

    def __init__(self, settings: Settings, scratch: Path):
        self.dir = settings.data_dir / "charts"
        self.scratch = scratch

    def get(self, name: str, draw: Callable[[Path], Path] | None = None) -> str | None:
        path = self.dir / name
        if path.is_file():
            return self._uri(path)
        return self.draw(name, draw) if draw is not None else None

    def draw(self, name: str, draw: Callable[[Path], Path]) -> str:
        """A chart no stage writes, drawn into the report's scratch directory."""
        return self._uri(draw(self.scratch / name))

    @staticmethod
    def _uri(path: Path) -> str:
        from envforge.charts import png_data_uri

        return png_data_uri(path)


# -- sections ------------------------------------------------------------------------------------


def _short(text: str | None, limit: int = _INSTRUCTION_CHARS) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _flat(params: dict, prefix: str = "") -> dict:
    """Nested params as dotted keys (`gate.runs`, `dedup.threshold`), for one readable line."""
    out: dict = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _task_set_section(cat: Catalog, version: str | None, charts: _Charts) -> dict:
    if version is None:
        return {"ran": False}
    from envforge.charts import tier_histogram
    from envforge.tier_names import SPLITS, TIERS

    row = cat.task_sets().filter(pl.col("version") == version).row(0, named=True)
    members = cat.task_set_frame(version)
    tiers = cat.tiers(version)
    tier_of = {r["task_id"]: r for r in tiers.iter_rows(named=True)}
    try:
        lineage = cat.lineage(version)
    except KeyError:
        lineage = {"parent_version": None, "sources": [], "gates": {}, "removed": []}
    tier_rows = tiers.to_dicts()
    strength = {r["content_hash"]: _strength_cell(r) for r in cat.latest_validations().to_dicts()}
    statements = statement_verdicts(cat.load_versions(members["content_hash"].to_list())) if members.height else {}
    return {
        "ran": True,
        "version": version,
        "name": row["name"],
        "created": str(row["created_at"])[:19],
        "n_tasks": row["n_tasks"],
        "parent": lineage["parent_version"],
        "sources": lineage["sources"],
        "params": _flat(json.loads(row["params_json"] or "{}")),
        "by_source": sorted(Counter(members["source"].to_list()).items()),
        "tiered": tiers.height > 0,
        "method": ", ".join(sorted(set(tiers["method"].to_list()))),
        "tiers": [(t, sum(1 for r in tier_rows if r["tier"] == t)) for t in TIERS],
        "splits": [(s, sum(1 for r in tier_rows if r["split"] == s)) for s in SPLITS],
        "chart": charts.get(f"tiers-{version[:12]}.png", lambda p: tier_histogram(tier_rows, p)) if tier_rows else None,
        "members": [
            {
                "task_id": m["task_id"],
                "source": m["source"],
                "hash": m["content_hash"][:12],
                "tier": tier_of.get(m["task_id"], {}).get("tier", "-"),
                "split": tier_of.get(m["task_id"], {}).get("split", "-"),
                "strength": strength.get(m["content_hash"], "-"),
                "statement": statements.get(m["task_id"], {}).get("verdict", "-"),
                "instruction": _short(m["instruction"]),
            }
            for m in members.iter_rows(named=True)
        ],
        "removed": lineage["removed"],
        "statements": sorted(Counter(v["verdict"] for v in statements.values()).items()),
        "flagged_statements": [
            {"task_id": t, "findings": v["findings"]}
            for t, v in sorted(statements.items())
            if v["verdict"] == "flagged"
        ],
    }


def _ingest_gate(cat: Catalog) -> dict:
    loads = cat.source_loads()
    rejects = cat.current_rejects()
    n_current = cat.tasks().height
    ran = loads.height > 0 or rejects.height > 0 or n_current > 0
    from envforge.sources.funnel import Funnel, classify

    reject_rows: list[dict[str, Any]] = []
    by_source: dict[str | None, list[Problem]] = {}
    for r in rejects.iter_rows(named=True):
        p = Problem(r["source"], r["field"], r["reason"])
        loss = classify(p)
        by_source.setdefault(r.get("source_key"), []).append(p)
        reject_rows.append(
            {
                "kind": r["source_kind"],
                "file": p.file,
                "record": p.record or "-",
                "field": p.field or "-",
                "reason": p.reason,
                "lost_at": loss.stage,
                "fault": loss.owner,
            }
        )
    load_rows = []
    for r in loads.iter_rows(named=True):
        funnel = Funnel.of(r["n_tasks"], by_source.get(r["source_key"], []))
        load_rows.append(
            {
                "key": r["source_key"],
                "kind": r["source_kind"],
                "valid": r["n_tasks"],
                "rejected": r["n_rejects"],
                "loaded": str(r["loaded_at"])[:19],
                "funnel": funnel,
            }
        )
    total = Funnel()
    for row in load_rows:
        total.merge(row["funnel"])
    return {
        "ran": ran,
        "current_tasks": n_current,
        "rejected": rejects.height,
        "loads": load_rows,
        "rejects": reject_rows,
        "funnel": total,
        "reasons": sorted(total.reasons.items(), key=lambda kv: -kv[1])[:15],
    }


def _quality_gate(cat: Catalog, charts: _Charts) -> dict:
    q = cat.latest_quality()
    statuses = Counter(q["status"].to_list())
    removed = [
        {
            "task_id": r["task_id"],
            "status": r["status"],
            "match": r["duplicate_of"] or ":".join(x for x in (r["corpus"], r["doc_id"]) if x) or "-",
            "jaccard": r["exact_jaccard"] if r["status"] == "contaminated" else r["nearest_task_jaccard"],
            "reason": r["reason"],
        }
        for r in q.iter_rows(named=True)
        if r["status"] != "clean"
    ]
    return {
        "ran": q.height > 0,
        "checked": q.height,
        "kept": statuses["clean"],
        "contaminated": statuses["contaminated"],
        "duplicates": statuses["duplicate"],
        "removed": removed,
        "chart": charts.get("similarity_histogram.png") if q.height else None,
    }


def _images_gate(cat: Catalog, version: str | None) -> dict:
    images = cat.latest_images()
    current = cat.tasks()["content_hash"].to_list()
    members = cat.task_set_frame(version)["content_hash"].to_list() if version else []
    return {
        "ran": bool(images),
        "built": len(images),
        "current": sum(h in images for h in current),
        "n_current": len(current),
        "members": sum(h in images for h in members),
        "n_members": len(members),
    }


def _empty_runs(row: dict) -> int:
    """Empty runs graded (fewer than the reference's when the gate stopped early; older rows lack it)."""
    return json.loads(row.get("stats_json") or "{}").get("empty_runs", row["runs"])


def _strength_cell(row: dict) -> str:
    """A validation row's verifier strength for a table cell: the score, and flags ("-": not measured)."""
    s = json.loads(row.get("stats_json") or "{}").get("strength")
    if not s or s.get("strength") is None:
        return "-"
    from envforge.verify.strength import strength_text

    flags = [
        f
        for f, on in (
            ("overfittable", s.get("overfittable")),
            ("weak FAIL_TO_PASS asserts", s.get("weak_form_passes")),
            ("audit only", row.get("admission")),
        )
        if on
    ]
    return strength_text(s) + (f" ({', '.join(flags)})" if flags else "")


def _strength_summary(rows: list[dict], charts: _Charts) -> dict:
    """Verifier strength over the latest verdicts: counts, the weakest tasks with their survivors, the chart."""
    measured = []
    for r in rows:
        s = json.loads(r.get("stats_json") or "{}").get("strength")
        if s and s.get("strength") is not None:
            measured.append((r, s))
    if not measured:
        return {"ran": False}
    from envforge.charts import strength_chart
    from envforge.verify.config import GateConfig

    scores = sorted(s["strength"] for _, s in measured)
    threshold = json.loads(measured[0][0].get("params_json") or "{}").get("min_strength", GateConfig().min_strength)
    weakest = sorted(measured, key=lambda rs: rs[1]["strength"])[:10]
    return {
        "ran": True,
        "measured": len(measured),
        "median": scores[len(scores) // 2],
        "mutants": sum(s["mutants"] for _, s in measured),
        "overfittable": sum(bool(s.get("overfittable")) for _, s in measured),
        "weak_form": sum(bool(s.get("weak_form_passes")) for _, s in measured),
        "audit": sum(r.get("admission") == "audit" for r, _ in measured),
        "bounds": sum(1 for _, s in measured if (s.get("strength_upper") or s["strength"]) > s["strength"]),
        "weakest": [
            {
                "task_id": r["task_id"],
                "strength": _strength_cell(r),
                "killed": s["killed"],
                "survived": s["survived"],
                "equivalent": s["equivalent"],
                "survivors": [f"{v['path']}:{v['line']} {v['change']}" for v in s["survivors"][:5]],
            }
            for r, s in weakest
        ],
        "chart": charts.get("strength.png", lambda p: strength_chart(scores, threshold, p)),
    }


def _validation_gate(cat: Catalog, charts: _Charts) -> dict:
    v = cat.latest_validations()
    rows = v.to_dicts()
    quarantined = [
        {
            "task_id": r["task_id"],
            "reference": f"{r['reference_passes']}/{r['runs']}",
            "empty": f"{r['empty_fails']}/{_empty_runs(r)}",
            "retries": r["infra_retries"],
            "reasons": list(r["disagreements"]),
        }
        for r in rows
        if r["verdict"] != "accepted"
    ]
    accepted = len(rows) - len(quarantined)
    return {
        "ran": bool(rows),
        "checked": len(rows),
        "accepted": accepted,
        "quarantined": len(quarantined),
        "rate": len(quarantined) / len(rows) if rows else 0.0,
        "rows": quarantined,
        "median_s": sorted(r["verifier_median_s"] for r in rows)[len(rows) // 2] if rows else 0.0,
        "chart": charts.get("flake_report.png") if rows else None,
        "strength": _strength_summary(rows, charts),
    }


def _rollouts_section(cat: Catalog, version: str | None) -> dict:
    if version is None:
        return {"ran": False, "batches": []}
    frame = cat.rollout_batches().filter(pl.col("task_set_version") == version)
    batches = []
    for r in frame.iter_rows(named=True):
        m = json.loads(r["metrics_json"] or "{}")
        k_keys = sorted(
            (int(key.rsplit("_", 1)[1]), key)
            for key in m
            if key.startswith("pass_at_") and key.rsplit("_", 1)[1].isdigit() and key != "pass_at_1"
        )
        k, key = k_keys[-1] if k_keys else (1, "pass_at_1")
        batches.append(
            {
                "batch_id": r["batch_id"],
                "policy": r["policy_id"],
                "tasks": r["n_tasks"],
                "samples": r["n_samples"],
                "trajectories": r["n_trajectories"],
                "pass_at_1": r["pass_at_1"],
                "k": k,
                "pass_at_k": m.get(key, r["pass_at_1"]),
                "dropped": r["n_dropped_groups"],
                "retries": int(m.get("infra_retries", 0)),
                "steps_per_s": m.get("steps_per_s"),
                "mean_reward": m.get("mean_reward"),
                "location": r["location"],
                "created": str(r["created_at"])[:19],
            }
        )
    verdicts = catalog_verdicts(frame.to_dicts(), thresholds_from_env())
    for b in batches:
        b["health"] = verdicts[b["batch_id"]].as_json()
    return {"ran": bool(batches), "batches": batches}


def _checkpoint(settings: Settings, kind: str, version: str) -> dict:
    path = settings.checkpoint_dir(kind, version)
    return {"path": str(path), "exists": path.is_dir()}


def _training_section(settings: Settings, runs: _Runs, version: str | None, charts: _Charts) -> dict:
    from envforge.charts import learning_curve, pass_rate_bars

    out: dict[str, Any] = {"sft": {"ran": False}, "rl": {"ran": False}, "evaluation": {"ran": False}, "chart": None}
    if version is None:
        return out
    key = version[:12]
    sft = runs.find("sft", version)
    if sft:
        run = sft[0]
        losses, evals = runs.history(run.info.run_id, "sft_loss"), runs.history(run.info.run_id, "sft_eval_loss")
        out["sft"] = {
            "ran": True,
            "run_id": run.info.run_id,
            "params": dict(run.data.params),
            "steps": len(losses),
            "first_loss": losses[0][1] if losses else None,
            "final_loss": losses[-1][1] if losses else None,
            "eval_loss": evals[-1][1] if evals else None,
            "checkpoint": _checkpoint(settings, "sft", version),
            "models": runs.model_versions(run.info.run_id),
            "losses": losses,
            "evals": evals,
        }
    rl = runs.find("rl", version)
    if rl:
        run = rl[0]
        reward = dict(runs.history(run.info.run_id, "rollout_mean_reward"))
        pass1 = dict(runs.history(run.info.run_id, "rollout_pass_at_1"))
        loss = dict(runs.history(run.info.run_id, "loss"))
        out["rl"] = {
            "ran": True,
            "run_id": run.info.run_id,
            "params": dict(run.data.params),
            "rounds": [
                {"round": step + 1, "reward": reward[step], "pass_at_1": pass1.get(step), "loss": loss.get(step)}
                for step in sorted(reward)
            ],
            "checkpoint": _checkpoint(settings, "rl", version),
            "models": runs.model_versions(run.info.run_id),
        }
    ev = runs.find("evaluation", version)
    if ev:
        run = ev[0]
        doc = runs.artifact_json(run, "evaluation_report.json") or {"phases": {}, "eval_tasks": 0}
        phases = doc.get("phases", {})
        tables = {}
        for group in ("by_tier", "by_source"):
            buckets = sorted({b for p in phases.values() for b in p.get(group, {})})
            tables[group] = {
                "buckets": buckets,
                "rows": [(label, [p.get(group, {}).get(b) for b in buckets]) for label, p in phases.items()],
                "chart": charts.get(
                    f"evaluation-{group}-{key}.png",
                    (
                        lambda p, g=group: pass_rate_bars(
                            {label: ph.get(g, {}) for label, ph in phases.items()},
                            p,
                            f"eval-split pass@1 {g.replace('_', ' ')}",
                        )
                    )
                    if phases
                    else None,
                ),
            }
        out["evaluation"] = {
            "ran": True,
            "run_id": run.info.run_id,
            "eval_tasks": doc.get("eval_tasks", 0),
            "overall": [(label, p.get("pass_at_1")) for label, p in phases.items()],
            "by_tier": tables["by_tier"],
            "by_source": tables["by_source"],
        }
    if out["sft"]["ran"] or out["rl"]["ran"] or out["evaluation"]["ran"]:  # the three curves, from the records
        out["chart"] = charts.draw(
            f"training-{key}.png",
            lambda p: learning_curve(
                out["sft"].get("losses", []),
                out["sft"].get("evals", []),
                [r["reward"] for r in out["rl"].get("rounds", [])],
                [(label, v or 0.0) for label, v in out["evaluation"].get("overall", [])],
                p,
                title=f"Training on task set {key}",
            ),
        )
    return out


def _runs_section(runs: _Runs, version: str | None) -> list[dict]:
    rows = []
    for stage in _GATE_STAGES:
        rows += [_run_row(stage, r) for r in runs.find(stage)]
    if version is not None:
        for stage in _VERSIONED_STAGES:
            rows += [_run_row(stage, r) for r in runs.find(stage, version, limit=20 if stage == "rollout" else 1)]
    return rows


# -- rendering -----------------------------------------------------------------------------------


def _environment():
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=PackageLoader("envforge", "templates"),
        undefined=StrictUndefined,
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = lambda v, digits=3: "-" if v is None else f"{v:.{digits}f}"
    env.filters["pct"] = lambda v: "-" if v is None else f"{100 * v:.0f}%"
    return env


def render_report(context: dict) -> str:
    """The HTML page for collected report data (autoescaped: the data is untrusted)."""
    return _environment().get_template("run_report.html.j2").render(**context)


def report_version(cat: Catalog, ref: str) -> str | None:
    """The full version a report is asked for (a unique prefix, or 'latest'); None for 'latest' when there is
    no task set yet (the report then says what has not run). Other unknown versions raise UnknownTaskSetError."""
    if ref == "latest" and cat.task_sets().height == 0:
        return None
    return cat.resolve_task_set(ref)


def build_run_report(
    settings: Settings, version: str | None, mlflow_run_id: str = "", dagster_run_id: str | None = None
) -> RunReport:
    """Collect, render and write the run report of a task-set version (None: before any task set).

    Reads the catalog and the MLflow store and writes the HTML files; `mlflow_run_id` is the run
    the page says it belongs to (the report stage's, which keeps the page as an artifact)."""
    settings.ensure_dirs()
    cat = Catalog(settings.catalog_path)
    now = datetime.now(timezone.utc)
    with tempfile.TemporaryDirectory(prefix="envforge-report-") as scratch:
        runs = _Runs(settings)
        charts = _Charts(settings, Path(scratch))
        gates = {
            "ingest": _ingest_gate(cat),
            "quality": _quality_gate(cat, charts),
            "images": _images_gate(cat, version),
            "validation": _validation_gate(cat, charts),
        }
        context = {
            "generated": now.strftime("%Y-%m-%d %H:%M:%S UTC"),
            "not_run": NOT_RUN,
            "requested": version or "latest",
            "data_dir": str(settings.data_dir),
            "report_run_id": mlflow_run_id,
            "dagster_run_id": dagster_run_id or "",
            "tracking_uri": settings.mlflow_tracking_uri,
            "experiment": settings.mlflow_experiment,
            "ui_command": track.ui_command(settings),
            "task_set": _task_set_section(cat, version, charts),
            "gates": gates,
            "rollouts": _rollouts_section(cat, version),
            "training": _training_section(settings, runs, version, charts),
            "runs": _runs_section(runs, version),
        }
        html = render_report(context)
    reports = settings.data_dir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    path = write_atomic(reports / f"run-report-{(version or 'no-task-set')[:12]}-{now:%Y%m%dT%H%M%SZ}.html", html)
    latest = write_atomic(reports / "latest.html", html)
    for written in (path, latest):
        objectstore.publish(settings.store_url, "reports", written)
    sections = {
        "task_set": context["task_set"]["ran"],
        **{f"gate_{k}": g["ran"] for k, g in gates.items()},
        "rollouts": context["rollouts"]["ran"],
        **{k: context["training"][k]["ran"] for k in ("sft", "rl", "evaluation")},
    }
    counts = {
        "sections_run": sum(sections.values()),
        "sections_not_run": sum(not v for v in sections.values()),
        "tasks": context["task_set"].get("n_tasks", 0),
        "rejects": gates["ingest"]["rejected"],
        "quarantined": gates["validation"]["quarantined"],
        "rollout_batches": len(context["rollouts"]["batches"]),
        "mlflow_runs": len(context["runs"]),
    }
    return RunReport(path, latest, version, mlflow_run_id, sections, counts)
