"""The main job end to end: `make demo` / `envforge demo` materialize the whole asset graph.

It launches the same jobs a user launches from the UI, in the Dagster instance `make ui` reads
($DAGSTER_HOME), so afterwards the UI shows every asset materialized with its checks:

1. one ingest run per source partition (what `task_sources_sensor` requests),
2. `main_job`: candidate tasks -> decontamination -> images -> gate -> tiers -> SFT -> GRPO ->
   evaluation -> run report,
3. `rollout_job` for the new task-set version with the reference (replay) policy,
4. `report_job`, so the HTML run report also covers that rollout batch.

Runs execute in this process (no daemon needed); their asset metadata is what the summary prints.
Usage: python -m assets.demo [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# The summary is the demo's output: keep library progress bars and tokenizer warnings off the terminal.
for _var, _value in (
    ("TRANSFORMERS_VERBOSITY", "error"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"),
    ("TQDM_DISABLE", "1"),
):
    os.environ.setdefault(_var, _value)

import dagster as dg  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from envforge.config import Settings  # noqa: E402
from envforge.sources import discover_sources  # noqa: E402
from envforge.tier_names import TIERS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
console = Console(stderr=True)
out = Console()


@dataclass(frozen=True)
class DemoConfig:
    """Overrides of the assets' own defaults; None keeps the default a user gets from the UI."""

    gate_runs: int | None = None
    gate_max_mutants: int | None = None
    sft_epochs: int | None = None
    rl_rounds: int | None = None
    rl_group_size: int | None = None
    rollout_samples: int | None = None
    max_tokens: int | None = None
    rollout_policy: str = "replay"

    @classmethod
    def quick(cls) -> "DemoConfig":
        """A shortened demo for tests: fewer gate runs, mutants, samples, training steps and completion tokens, same
        graph. Mutation stays on (the bundled tasks must still clear the default strength bar), on the 12 most
        telling mutants a task (hunk reverts and changed lines first) instead of 24."""
        return cls(
            gate_runs=2, gate_max_mutants=12, sft_epochs=1, rl_rounds=1, rl_group_size=2, rollout_samples=2,
            max_tokens=32,
        )

    def main_run_config(self) -> dict:
        training = {"sft_epochs": self.sft_epochs, "rl_rounds": self.rl_rounds, "group_size": self.rl_group_size,
                    "max_tokens": self.max_tokens}
        gate = {"runs": self.gate_runs, "max_mutants": self.gate_max_mutants}
        return _run_config({"validated_tasks": gate}, resources={"training": training})

    def rollout_run_config(self) -> dict:
        return _run_config({"rollout_batch": {"n_samples": self.rollout_samples}})


def _run_config(
    ops: dict[str, dict[str, Any]], log_level: str = "INFO", resources: dict[str, dict[str, Any]] | None = None
) -> dict:
    def given(values: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if v is not None}

    doc: dict[str, Any] = {
        "ops": {op: {"config": given(c)} for op, c in ops.items() if given(c)},
        "loggers": {"console": {"config": {"log_level": log_level}}},
    }
    chosen = {name: {"config": given(c)} for name, c in (resources or {}).items() if given(c)}
    if chosen:
        doc["resources"] = chosen
    return doc


@dataclass
class DemoRun:
    """What the demo's runs produced: per-asset materialization metadata (check outcomes: graph_status)."""

    metadata: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    runs: list[tuple[str, str, bool, float]] = field(default_factory=list)  # job, run id, success, seconds

    def record(self, job: str, result: dg.ExecuteInProcessResult, seconds: float) -> None:
        self.runs.append((job, result.run_id, result.success, seconds))
        for event in result.get_asset_materialization_events():
            mat = event.materialization
            values = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
            self.metadata.setdefault(mat.asset_key.to_user_string(), []).append(values)

    def last(self, asset: str) -> dict[str, Any]:
        return (self.metadata.get(asset) or [{}])[-1]

    @property
    def ok(self) -> bool:
        return all(success for _, _, success, _ in self.runs)


def ensure_instance(settings: Settings) -> dg.DagsterInstance:
    """The persistent instance in $DAGSTER_HOME (default <data dir>/dagster), configured as `make ui` does."""
    home = Path(os.environ.get("DAGSTER_HOME") or settings.data_dir / "dagster")
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(REPO / "platform" / "deploy" / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return dg.DagsterInstance.get()


def run_demo(
    settings: Settings, config: DemoConfig, instance: dg.DagsterInstance, step: Callable[[str], None] = lambda _: None
) -> DemoRun:
    from assets.definitions import defs
    from assets.defs.sources.assets import register_source_partitions

    demo = DemoRun()

    def execute(job_name: str, label: str, **kwargs) -> dg.ExecuteInProcessResult:
        step(label)
        start = time.perf_counter()
        result = defs.resolve_job_def(job_name).execute_in_process(instance=instance, raise_on_error=False, **kwargs)
        demo.record(job_name, result, time.perf_counter() - start)
        if not result.success:
            failed = [e.step_key for e in result.all_events if e.is_step_failure]
            console.print(f"[red]{job_name} failed[/red] at {failed}: see run {result.run_id} in the Dagster UI")
        return result

    refs, _ = discover_sources(settings.bundled_sources())
    keys = register_source_partitions(instance, refs, settings.task_sources_dir)
    quiet = _run_config({}, "WARNING")
    for i, (kind, key) in enumerate(keys, 1):
        execute(f"ingest_{kind}_sources", f"ingest {i}/{len(keys)}: {key}", partition_key=key, run_config=quiet)
    main = execute(
        "main_job",
        "main_job: candidates -> decontamination -> images -> gate -> tiers -> SFT -> GRPO -> evaluation -> report",
        run_config=config.main_run_config(),
    )
    if not main.success:
        return demo
    version_key = demo.last("tiered_task_set").get("partition_key")
    partition = dg.MultiPartitionKey({"task_set": version_key, "policy": config.rollout_policy})
    samples = config.rollout_samples or "the default number of"
    execute(
        "rollout_job",
        f"rollout_job: {samples} samples per task, policy {config.rollout_policy}, task set {version_key}",
        partition_key=partition,
        run_config=config.rollout_run_config(),
    )
    execute("report_job", "report_job: the HTML run report", run_config=quiet)
    return demo


def graph_status(instance: dg.DagsterInstance) -> dict[str, dict[str, str]]:
    """What the UI shows for the whole graph: each asset's latest materialization, each check's latest result."""
    from assets.definitions import defs

    graph = defs.resolve_asset_graph()

    def status(key: dg.AssetKey) -> str:
        if instance.get_latest_materialization_event(key):
            return "materialized"
        partitions = defs.get_assets_def(key).partitions_def
        if (
            isinstance(partitions, dg.DynamicPartitionsDefinition)
            and partitions.name
            and not instance.get_dynamic_partitions(partitions.name)
        ):
            return "no sources"  # a source kind nothing under task_sources/ uses (e.g. history): nothing to do
        return "missing"

    assets = {key.to_user_string(): status(key) for key in sorted(graph.get_all_asset_keys())}
    check_keys = sorted(graph.asset_check_keys, key=lambda k: k.to_user_string())
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(check_keys)
    checks = {}
    for key in check_keys:
        record = latest.get(key)
        state = record.status.value.lower() if record else "never run"  # planned | succeeded | failed | skipped
        if not record and assets.get(key.asset_key.to_user_string()) == "no sources":
            state = "no sources"
        checks[key.to_user_string()] = "passed" if state == "succeeded" else state
    return {"assets": assets, "checks": checks}


def summary(demo: DemoRun, settings: Settings, instance: dg.DagsterInstance) -> dict[str, Any]:
    """The figures a user wants after the demo, from the materializations the UI also shows."""
    from envforge.catalog import Catalog

    sources = demo.metadata.get("candidate_tasks") and demo.last("candidate_tasks")
    quality, gate = demo.last("decontaminated_tasks"), demo.last("validated_tasks")
    tiers, rollout = demo.last("tiered_task_set"), demo.last("rollout_batch")
    sft, rl, evaluation = demo.last("sft_checkpoint"), demo.last("rl_checkpoint"), demo.last("evaluation_report")
    rejects = Catalog(settings.catalog_path).current_rejects()
    flake = gate.get("flake_report") or []
    return {
        "ok": demo.ok,
        "runs": [{"job": j, "run_id": r, "success": s, "seconds": round(t, 1)} for j, r, s, t in demo.runs],
        "seconds": round(sum(t for *_, t in demo.runs), 1),
        "stages": {
            "ingest": {
                "valid": (sources or {}).get("tasks", 0),
                "rejected": rejects.height,
                "rejects": [
                    {
                        "source": _relative(r["source"], settings.task_sources_dir),
                        "field": r["field"],
                        "reason": r["reason"],
                    }
                    for r in rejects.iter_rows(named=True)
                ],
            },
            "quality": {
                "in": quality.get("tasks", 0),
                "clean": quality.get("clean", 0),
                "contaminated": quality.get("contaminated", 0),
                "duplicates": quality.get("duplicates", 0),
            },
            "gate": {
                "in": gate.get("tasks", 0),
                "accepted": gate.get("accepted", 0),
                "quarantined": gate.get("quarantined", 0),
                "flaky": sum(
                    1
                    for r in flake
                    if 0 < r.get("reference_passes", 0) < r.get("runs", 0)
                    or 0 < r.get("empty_fails", 0) < r.get("runs", 0)
                ),
                "quarantine_reasons": {
                    r["task_id"]: r.get("disagreements", [])[:2] for r in flake if r.get("verdict") != "accepted"
                },
            },
            "tiers": {
                "version": tiers.get("version", ""),
                "method": tiers.get("method", ""),
                "histogram": tiers.get("tiers", {}),
                "splits": tiers.get("splits", {}),
            },
            "rollouts": {
                "trajectories": rollout.get("trajectories", 0),
                "pass_at_1": rollout.get("pass_at_1"),
                "dropped_groups": len(rollout.get("dropped_groups") or []),
                "steps_per_s": rollout.get("steps_per_s"),
            },
            "training": {
                "sft_first_loss": sft.get("first_loss"),
                "sft_final_loss": sft.get("final_loss"),
                "rl_mean_reward_by_round": rl.get("rollout_mean_reward"),
                "eval_tasks": evaluation.get("eval_tasks"),
                "pass_at_1": evaluation.get("pass_at_1", {}),
            },
        },
        "graph": graph_status(instance),
        "report": demo.last("run_report").get("path"),
        "dagster_home": str(instance.root_directory),
        "catalog": str(settings.catalog_path),
    }


def _relative(source: str, root: Path) -> str:
    prefix = f"{root}/"
    return source[len(prefix) :] if source.startswith(prefix) else source


def print_summary(doc: dict[str, Any]) -> None:
    st = doc["stages"]
    table = Table(title="envforge demo: the whole graph on the bundled examples")
    for col in ("stage", "in", "out", "details"):
        table.add_column(col)
    ing, q, g = st["ingest"], st["quality"], st["gate"]
    table.add_row(
        "ingest", str(ing["valid"] + ing["rejected"]), str(ing["valid"]), f"{ing['rejected']} rejected (reasons below)"
    )
    table.add_row(
        "decontamination",
        str(q["in"]),
        str(q["clean"]),
        f"{q['contaminated']} contaminated, {q['duplicates']} duplicates",
    )
    table.add_row(
        "flakiness gate", str(g["in"]), str(g["accepted"]), f"{g['quarantined']} quarantined ({g['flaky']} flaky)"
    )
    t = st["tiers"]
    table.add_row(
        "tiers",
        str(sum(t["histogram"].values())),
        str(t["splits"].get("train", 0)) + " train",
        f"{t['method']}; "
        + ", ".join(f"{k} {t['histogram'].get(k, 0)}" for k in TIERS)
        + f"; eval {t['splits'].get('eval', 0)}, audit {t['splits'].get('audit', 0)}",
    )
    r = st["rollouts"]
    table.add_row(
        "rollouts",
        str(sum(t["histogram"].values())) + " tasks",
        str(r["trajectories"]) + " trajectories",
        f"pass@1 {r['pass_at_1']}, {r['dropped_groups']} dropped groups, {r['steps_per_s']} steps/s",
    )
    tr = st["training"]
    p = tr["pass_at_1"]
    table.add_row(
        "training",
        "",
        str(tr["eval_tasks"]) + " eval tasks",
        f"SFT loss {tr['sft_first_loss']:.3g} -> {tr['sft_final_loss']:.3g}; GRPO reward by round "
        f"{tr['rl_mean_reward_by_round']}; eval pass@1 before {p.get('before')}, after SFT "
        f"{p.get('after SFT')}, after RL {p.get('after RL')}"
        if tr["sft_first_loss"] is not None
        else "-",
    )
    out.print(table)
    out.print("[bold]Tier histogram[/bold]")
    for tier in TIERS:
        n = st["tiers"]["histogram"].get(tier, 0)
        out.print(f"  {tier:9s} {'#' * n} {n}")
    for rej in st["ingest"]["rejects"]:
        field_name = f" field {rej['field']}" if rej["field"] else ""
        out.print(f"[yellow]rejected[/yellow] {escape(rej['source'])}{escape(field_name)}: {escape(rej['reason'])}")
    for task, why in st["gate"]["quarantine_reasons"].items():
        out.print(f"[red]quarantined[/red] {escape(task)}: {escape('; '.join(why))}")
    assets, checks = doc["graph"]["assets"], doc["graph"]["checks"]
    idle = [k for k, v in assets.items() if v == "no sources"]
    missing = [k for k, v in assets.items() if v not in ("materialized", "no sources")]
    failed = {k: v for k, v in checks.items() if v not in ("passed", "no sources")}
    live, live_checks = len(assets) - len(idle), sum(1 for v in checks.values() if v != "no sources")
    out.print(
        f"\n{live - len(missing)}/{live} assets materialized"
        + (f" (missing: {', '.join(missing)})" if missing else "")
        + (f" ({', '.join(idle)}: no such source bundled)" if idle else "")
        + f"; {live_checks - len(failed)}/{live_checks} asset checks passing"
        + (f" (not passing: {failed})" if failed else "")
        + f"; {len(doc['runs'])} Dagster runs, {doc['wall_seconds']:.0f} s"
    )
    out.print("Where to look:")
    out.print(f"  Dagster UI:  make ui  -> http://127.0.0.1:3000 (instance {doc['dagster_home']})")
    out.print("  MLflow UI:   make mlflow-ui  -> http://127.0.0.1:5000")
    out.print(f"  HTML report: {doc['report']}")
    out.print(f"  catalog:     {doc['catalog']}")
    out.print(
        "A tiny CPU model does not learn the bundled code tasks in minutes; for a learning curve where it "
        "does (SFT + GRPO on a task family a small model can learn), run `envforge train demo`."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m assets.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shortened stages (tests); same graph")
    ap.add_argument("--json", type=Path, help="also write the summary as JSON here")
    args = ap.parse_args(argv)
    settings = Settings.from_env()
    settings.ensure_dirs()
    instance = ensure_instance(settings)
    config = DemoConfig.quick() if args.quick else DemoConfig()
    start = time.perf_counter()

    def step(label: str) -> None:
        console.rule(f"[bold]{label}[/bold] [dim]({time.perf_counter() - start:.0f} s)[/dim]", align="left")

    demo = run_demo(settings, config, instance, step)
    doc = summary(demo, settings, instance)
    doc["wall_seconds"] = round(time.perf_counter() - start, 1)
    doc["ok"] = doc["ok"] and all(v in ("materialized", "no sources") for v in doc["graph"]["assets"].values())
    (settings.data_dir / "demo_summary.json").write_text(json.dumps(doc, indent=2, default=str))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2, default=str))
    print_summary(doc)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
