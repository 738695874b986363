"""`envforge train`: the CPU learning demo, and SFT, GRPO and evaluation on a tiered task set."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from envforge.cli.common import DataDir, console, fail, out, resolve_version, run_stage, settings_for
from envforge.cli.options import config_options
from envforge.errors import EnvforgeError, InvalidValue
from envforge.train.config import DEMO_TRAINING, TrainingConfig

app = typer.Typer(help="Training: SFT and GRPO, and the CPU learning demo.", no_args_is_help=True)

TaskSet = typer.Option("latest", help="a tiered task-set version (prefix) or 'latest'")


@app.command("demo")
@config_options
def train_demo(
    quick: bool = typer.Option(
        False,
        help="a shortened run (one seed, fewer tasks and samples; it sets "
        "its own SFT epochs, GRPO rounds and group size)",
    ),
    seeds: Optional[str] = typer.Option(
        None,
        help="comma-separated seeds, run one after the other "
        "(default: --seed and the two after it; with --quick "
        "--seed alone)",
    ),
    config: TrainingConfig = DEMO_TRAINING,
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """The CPU learning demo: a small model, SFT on demonstrations, then GRPO rounds, with held-out pass@1
    measured before, after SFT and after GRPO by the sandbox verifier (learning_demo.json, curve PNG, MLflow).
    Every training option defaults to the demo's setting."""
    from envforge.demos.learning import LearningDemoConfig, run_learning_demo
    from envforge.progress import rich_progress

    settings = settings_for(data_dir)
    settings.ensure_dirs()
    if seeds is None:
        seed_list = (config.seed,) if quick else (config.seed, config.seed + 1, config.seed + 2)
    else:
        try:
            seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
        except ValueError:
            fail(InvalidValue(f"--seeds {seeds!r}: expected comma-separated integers such as 0,1,2"))
        if not seed_list:
            fail(InvalidValue("--seeds: give at least one seed"))
    training = replace(config, seed=seed_list[0])
    cfg = (
        replace(LearningDemoConfig.quick(training), seeds=seed_list)
        if quick
        else LearningDemoConfig(training, seeds=seed_list)
    )
    try:
        with rich_progress(console) as progress:
            doc = run_learning_demo(settings, cfg, progress=progress)
    except EnvforgeError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(doc, default=str) + "\n")
        return
    sp = doc["spread"]
    for kind, label in (("", "greedy"), ("sampled_", "sampled")):
        out.print(
            f"held-out {label} pass@1 ({doc['held_out_tasks']} tasks, mean [min, max] over seeds "
            f"{doc['seeds']}): "
            + ", ".join(
                f"{phase.replace('_', ' ')} {sp[k]['mean']:.2f} [{sp[k]['min']:.2f}, {sp[k]['max']:.2f}]"
                for phase in ("before", "after_sft", "after_grpo")
                for k in [f"pass_at_1_{kind}{phase}"]
            )
        )
    gain = doc["sampled_gain_grpo_over_sft"]
    out.print(
        f"sampled gain of GRPO over SFT: {gain['mean']:+.2f} [{gain['min']:+.2f}, {gain['max']:+.2f}], std "
        f"{gain['std']:.2f}"
    )
    out.print(
        f"learning curve: {doc['chart']}\nfigures: {settings.data_dir / 'learning_demo.json'}\n"
        f"checkpoint: {doc['checkpoint']} (MLflow run {doc['mlflow_run_id']})"
    )


@app.command("sft")
@config_options
def train_sft(
    task_set: str = TaskSet, config: TrainingConfig = TrainingConfig(), data_dir: Optional[Path] = DataDir
) -> None:
    """SFT on the teacher's demonstrations of the task set's train split (what the sft_checkpoint asset does)."""
    from envforge.stages.sft import sft

    settings = settings_for(data_dir)
    result = run_stage(sft, settings, config, resolve_version(settings, task_set))
    out.print(
        f"SFT checkpoint {result.checkpoint}: loss {result.result.losses[0]:.3f} -> {result.result.losses[-1]:.3f}"
        f" over {result.result.total_steps} steps (MLflow run {result.mlflow_run_id})"
        if result.result.losses
        else f"SFT checkpoint {result.checkpoint} (no training steps)"
    )


@app.command("rl")
@config_options
def train_rl(
    task_set: str = TaskSet, config: TrainingConfig = TrainingConfig(), data_dir: Optional[Path] = DataDir
) -> None:
    """GRPO rounds from the task set's SFT checkpoint on its train split (what the rl_checkpoint asset does)."""
    from envforge.stages.rl import rl

    settings = settings_for(data_dir)
    version = resolve_version(settings, task_set)
    start = settings.checkpoint_dir("sft", version)
    if not start.is_dir():
        fail(EnvforgeError(f"no SFT checkpoint for task set {version[:12]} at {start}: run `envforge train sft` first"))
    result = run_stage(rl, settings, config, version, start)
    rewards = [round(m["rollout_mean_reward"], 3) for m in result.history]
    out.print(
        f"RL checkpoint {result.checkpoint}: rollout reward by round {rewards} (MLflow run {result.mlflow_run_id})"
    )


@app.command("evaluate")
@config_options
def train_evaluate(
    task_set: str = TaskSet,
    config: TrainingConfig = TrainingConfig(),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Eval-split pass@1 of the base model and of the task set's SFT and RL checkpoints (those that exist)."""
    from envforge.stages.evaluate import evaluate

    settings = settings_for(data_dir)
    version = resolve_version(settings, task_set)
    checkpoints = {
        label: settings.checkpoint_dir(kind, version) for label, kind in (("after SFT", "sft"), ("after RL", "rl"))
    }
    result = run_stage(evaluate, settings, config, version, {k: p for k, p in checkpoints.items() if p.is_dir()})
    if as_json:
        sys.stdout.write(json.dumps(result.report) + "\n")
        return
    out.print(
        f"eval-split pass@1 ({result.report['eval_tasks']} tasks): "
        + ", ".join(f"{label} {v:.2f}" for label, v in result.pass_at_1().items())
    )


def lineage(
    checkpoint: str = typer.Argument(
        ..., help="a checkpoint directory, <model>@<alias> (e.g. envforge-policy@best) or <model>/<version>"
    ),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """The chain from a checkpoint back to its sources: registry version, MLflow and Dagster runs, the rollout
    batches it trained on, its task set and that set's source records, then the checkpoint it started from."""
    from envforge.train.lineage import checkpoint_lineage, format_lineage

    settings = settings_for(data_dir)
    try:
        node = checkpoint_lineage(settings, checkpoint)
    except ValueError as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(node, indent=2, default=str) + "\n")
        return
    out.print("\n".join(format_lineage(node)), markup=False, highlight=False)
