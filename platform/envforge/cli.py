"""The `envforge` command. Every subcommand that does work also logs an MLflow run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from envforge.config import Settings
from envforge.errors import BatchRejectedError, EnvforgeError, InfraError

app = typer.Typer(help="Turn workflows into verifiable RL environments.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
images_app = typer.Typer(help="Environment images (base and per task).", no_args_is_help=True)
catalog_app = typer.Typer(help="The DuckDB task catalog.", no_args_is_help=True)
dedup_app = typer.Typer(help="Decontamination and near-duplicate removal (MinHash LSH).", no_args_is_help=True)
taskset_app = typer.Typer(help="Versioned task sets: lineage and diffs.", no_args_is_help=True)
app.add_typer(images_app, name="images")
app.add_typer(catalog_app, name="catalog")
app.add_typer(dedup_app, name="dedup")
app.add_typer(taskset_app, name="taskset")
policy_app = typer.Typer(help="Policies: serve a local model over an OpenAI-compatible API.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
train_app = typer.Typer(help="Training: SFT and GRPO, and the CPU learning demo.", no_args_is_help=True)
app.add_typer(train_app, name="train")
sources_app = typer.Typer(help="Task sources on disk: what is found, and bundled repositories.", no_args_is_help=True)
app.add_typer(sources_app, name="sources")

console = Console(stderr=True)
out = Console()


def _settings(data_dir: Optional[Path]) -> Settings:
    settings = Settings.from_env()
    return settings.with_data_dir(data_dir) if data_dir else settings


DataDir = typer.Option(None, "--data-dir", help="data directory (default: $ENVFORGE_DATA_DIR or ./.envforge)")


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2 if isinstance(exc, InfraError) else 1)


@app.command()
def demo(data_dir: Optional[Path] = DataDir,
         quick: bool = typer.Option(False, help="shortened stages (fewer gate runs, samples, training steps)"),
         json_path: Optional[Path] = typer.Option(None, "--json", help="also write the summary as JSON here")) -> None:
    """Materialize the whole asset graph on the bundled examples (the main job end to end) in the Dagster
    instance `make ui` shows, and print what went through each stage and where to look."""
    import os
    import subprocess

    from envforge.config import checkout_root

    root = checkout_root()
    if not (root / "assets" / "definitions.py").is_file():
        _fail(EnvforgeError(f"the demo drives the Dagster code location in a checkout; {root} has no "
                            "assets/definitions.py (run it from the envforge repository)"))
    settings = _settings(data_dir)
    env = {**os.environ, "ENVFORGE_DATA_DIR": str(settings.data_dir)}
    env.setdefault("DAGSTER_HOME", str(settings.data_dir / "dagster"))
    cmd = [sys.executable, "-m", "assets.demo"] + (["--quick"] if quick else []) \
        + (["--json", str(json_path.resolve())] if json_path else [])
    raise typer.Exit(subprocess.run(cmd, cwd=root, env=env).returncode)


@app.command()
def ingest(paths: List[Path] = typer.Argument(..., help="source files or directories: task.yaml, runbook .md, "
                                                       "tickets.yaml, reviews.yaml, SWE-bench .jsonl"),
           strict: bool = typer.Option(False, help="refuse the whole batch if any record is bad"),
           as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
           data_dir: Optional[Path] = DataDir) -> None:
    """Load task sources, derive tests for tickets and reviews in sandboxes, and store the tasks (and the
    rejects, with file, record, field and reason) in the catalog."""
    from envforge import stages
    from envforge.progress import rich_progress

    settings = _settings(data_dir)
    try:
        with rich_progress(console) as progress:
            tracked = stages.ingest(settings, paths, strict=strict, progress=progress)
    except BatchRejectedError as exc:
        if as_json:
            out.print_json(json.dumps({"valid": 0, "rejected": len(exc.problems), "written": False,
                                       "rejects": [p.as_json() for p in exc.problems]}))
        else:
            console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1)
    res, summ = tracked.result, tracked.summary
    if as_json:
        sys.stdout.write(json.dumps({
            "valid": len(res.tasks), "rejected": len(res.rejects), "added": summ.added, "unchanged": summ.unchanged,
            "rejects": [p.as_json() for p in res.rejects], "tasks": [t.id for t in res.tasks],
            "by_kind": {k: sum(1 for t in res.tasks if t.spec.source == k) for k in sorted({t.spec.source for t in res.tasks})},
            "mlflow_run_id": tracked.mlflow_run_id}) + "\n")
        return
    out.print(f"{len(res.tasks)} valid task(s) ({summ.added} new, {summ.unchanged} unchanged), "
              f"{len(res.rejects)} rejected")
    for p in res.rejects:
        out.print(f"  [yellow]rejected[/yellow] {p}")


@images_app.command("base")
def images_base(data_dir: Optional[Path] = DataDir) -> None:
    """Build the sandbox base image from sandboxes/base/ (a cache hit unless the recipe changed)."""
    from envforge.sandbox.engine import docker_client
    from envforge.sandbox.images import build_base_image

    settings = _settings(data_dir)
    try:
        client = docker_client(settings)
        if not console.is_terminal:
            console.print("building the sandbox base image if needed (first build takes 1-2 minutes)")
        with console.status("sandbox base image (debootstrap on first build, 1-2 minutes)"):
            build = build_base_image(client, settings)
    except EnvforgeError as exc:
        _fail(exc)
    out.print(f"base image {build.tag} ({'cached' if build.cache_hit else f'built in {build.seconds:.0f}s'}, "
              f"{build.size_mb} MB)")


@images_app.command("build")
def images_build(task: List[str] = typer.Option([], "--task", "-t", help="only these task ids"),
                 data_dir: Optional[Path] = DataDir) -> None:
    """Build the base image and the images of the catalog's current tasks (cache hits are instant)."""
    from envforge import stages
    from envforge.catalog import Catalog
    from envforge.progress import rich_progress

    settings = _settings(data_dir)
    tasks = Catalog(settings.catalog_path).load_tasks(task or None)
    if task and len(tasks) != len(set(task)):
        _fail(EnvforgeError(f"unknown task id(s): {sorted(set(task) - {t.id for t in tasks})}"))
    try:
        with rich_progress(console) as progress:
            report, _ = stages.build_images(settings, tasks, progress=progress)
    except EnvforgeError as exc:
        _fail(exc)
    out.print(f"base: {report.base.tag}{' (cached)' if report.base.cache_hit else ''}")
    for t, b in report.builds:
        out.print(f"{t.id}: {b.tag}{' (cached)' if b.cache_hit else f' built in {b.seconds:.1f}s'}")
    for p in report.failures:
        out.print(f"[red]failed[/red] {p}")
    if report.failures:
        raise typer.Exit(1)


def _image_for(settings: Settings, task) -> str:
    from envforge.catalog import Catalog
    from envforge.sandbox.engine import docker_client
    from envforge.sandbox.images import build_base_image, build_task_image

    image = Catalog(settings.catalog_path).latest_images().get(task.content_hash)
    if image:
        return image
    client = docker_client(settings)
    return build_task_image(client, task, build_base_image(client, settings).tag, settings).tag


def _load_task(settings: Settings, ref: str):
    """A task from a spec file path or a catalog task id."""
    from envforge.catalog import Catalog
    from envforge.sources.specs import load_spec_file

    path = Path(ref)
    if path.exists():
        return load_spec_file(path / "task.yaml" if path.is_dir() else path)
    tasks = Catalog(settings.catalog_path).load_tasks([ref])
    if not tasks:
        raise EnvforgeError(f"--task {ref!r}: neither a spec file nor a task id in the catalog")
    return tasks[0]


@app.command()
def verify(task: str = typer.Option(..., "--task", help="spec file/folder or catalog task id"),
           patch: Optional[Path] = typer.Option(None, "--patch", help="a diff to grade"),
           commands: Optional[Path] = typer.Option(None, "--commands",
                                                   help="a file of shell commands (one per line) run as the agent"),
           as_json: bool = typer.Option(False, "--json", help="print exactly the result object"),
           data_dir: Optional[Path] = DataDir) -> None:
    """Grade one solution on a pristine copy of the task (exit 0 resolved, 1 not, 2 infrastructure fault)."""
    from envforge.sandbox.engine import docker_client
    from envforge.verify.grader import Grader
    from envforge.verify.result import VerificationResult

    if (patch is None) == (commands is None):
        _fail(EnvforgeError("give exactly one of --patch FILE or --commands FILE"))
    settings = _settings(data_dir)
    try:
        t = _load_task(settings, task)
        image = _image_for(settings, t)
        with Grader(docker_client(settings)) as grader:
            if patch is not None:
                diff, notes = patch.read_text(), []
            else:
                lines = [ln for ln in commands.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
                diff, notes = grader.commands_diff(t, image, lines)
            result = grader.grade(t, image, diff, "patch" if patch else "commands")
            result.reasons += notes
    except InfraError as exc:
        result = VerificationResult(task_id=task, solution="patch" if patch else "commands", reward=0.0,
                                    resolved=False, infra_error=f"{exc.cause}: {exc.detail}")
        doc = result.as_json()
        doc["reward"] = None
        if as_json:
            sys.stdout.write(json.dumps(doc) + "\n")
        else:
            console.print(f"[red]infrastructure fault, retry:[/red] {exc}")
        raise typer.Exit(2)
    except (EnvforgeError, OSError) as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result.as_json()) + "\n")
    else:
        out.print(f"{t.id}: reward {result.reward} ({'resolved' if result.resolved else 'not resolved'}), "
                  f"patch applied with {result.patch_method}")
        for test_id, status in result.tests.items():
            out.print(f"  {status:8} {test_id}")
        for c in result.checkpoints:
            out.print(f"  {'passed' if c.passed else 'FAILED':8} checkpoint {c.name} (exit {c.exit_code})")
        for r in result.reasons:
            out.print(f"  reason: {r}")
    raise typer.Exit(0 if result.resolved else 1)


@app.command()
def validate(task: List[str] = typer.Option([], "--task", "-t", help="only these task ids"),
             runs: int = typer.Option(5, help="grades of the empty and of the reference solution, each"),
             shuffle: bool = typer.Option(True, help="the order check: one more reference run of the whole suite "
                                                     "in reversed order"),
             probes: bool = typer.Option(True, help="run the reward-hacking probes that apply to each task"),
             full_suite: bool = typer.Option(False, help="the exhaustive gate: the whole suite on every grading, "
                                                         "every run and probe graded even after a disagreement"),
             workers: int = typer.Option(2, min=1, help="gradings of one task in parallel"),
             force: bool = typer.Option(False, help="re-gate tasks whose content, image and gate parameters are "
                                                    "unchanged (by default they keep their verdict)"),
             as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """The flakiness gate on the catalog's current tasks: accept or quarantine each, with the reason."""
    from envforge import stages
    from envforge.catalog import Catalog
    from envforge.progress import rich_progress
    from envforge.verify.gate import GateConfig

    settings = _settings(data_dir)
    cat = Catalog(settings.catalog_path)
    tasks = cat.load_tasks(task or None)
    try:
        images, _ = stages.build_images(settings, tasks)
        with rich_progress(console) as progress:
            report, _, chart = stages.validate(settings, tasks, images.image_for(),
                                               GateConfig(runs, shuffle, probes, full_suite, workers),
                                               progress=progress, force=force)
    except EnvforgeError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps({"tasks": report.rows(), "chart": str(chart),
                                     "probes": {r.task_id: r.probe_results for r in report.reports},
                                     "probes_skipped": {r.task_id: r.probes_skipped for r in report.reports},
                                     "infra_failures": [str(p) for p in report.infra_failures]}) + "\n")
    else:
        for r in report.rows():
            how = "kept: unchanged since its last gate" if r["kept"] else (
                f"{r['gradings']} gradings, {r['gate_s']} s" + (", stopped at the first disagreement"
                                                                 if r["stopped_early"] else ""))
            out.print(f"{r['task_id']}: {r['verdict']} (reference {r['reference_passes']}/{r['runs']}, "
                      f"empty failed {r['empty_fails']}/{r['empty_runs']}, probes {r['probes_caught']}/{r['probes']}"
                      f"; {how})" + (f" — {'; '.join(r['disagreements'])}" if r["disagreements"] else ""))
        out.print(f"flake report: {chart}")
    if report.infra_failures:
        raise typer.Exit(2)


@app.command()
def rollout(task_set: str = typer.Option("latest", help="task-set version (prefix) or 'latest'; 'current' for "
                                                         "the catalog's clean current tasks"),
            task: List[str] = typer.Option([], "--task", "-t", help="only these task ids"),
            policy: str = typer.Option("replay", help="replay | replay-text | openai:<url>[#model] | hf:<path> | "
                                                     "vllm:<path>"),
            samples: int = typer.Option(4, "--samples", "-n", help="samples per task (the GRPO group size)"),
            concurrency: int = typer.Option(8, help="trajectories at once"),
            seed: int = typer.Option(0), temperature: float = typer.Option(1.0),
            max_tokens: int = typer.Option(512), max_turns: Optional[int] = typer.Option(None),
            max_infra_retries: int = typer.Option(3, help="per trajectory, on a fresh sandbox each time"),
            batch_id: Optional[str] = typer.Option(None, help="resume this batch (default: from set, policy, seed)"),
            out_dir: Optional[str] = typer.Option(None, "--out", help="store root: a path or fsspec URL "
                                                                       "(default: <data dir>/rollouts)"),
            as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """Roll a policy out on a task set: n samples per task, graded, stored as parquet (resumable)."""
    from envforge import stages
    from envforge.catalog import Catalog
    from envforge.progress import rich_progress
    from envforge.rollout.scheduler import RolloutConfig

    settings = _settings(data_dir)
    cat = Catalog(settings.catalog_path)
    try:
        if task_set == "current":
            version, tasks = "", cat.clean_tasks()
        else:
            version = cat.resolve_task_set(task_set)
            tasks = cat.load_task_set(version)
    except ValueError as exc:
        _fail(EnvforgeError(str(exc)))
    if task:
        tasks = [t for t in tasks if t.id in set(task)]
    config = RolloutConfig(n_samples=samples, concurrency=concurrency, seed=seed, temperature=temperature,
                           max_tokens=max_tokens, max_turns=max_turns, max_infra_retries=max_infra_retries)
    try:
        with rich_progress(console) as progress:
            result = stages.rollout(settings, tasks, policy, config, task_set_version=version, batch_id=batch_id,
                                    root=out_dir, progress=progress)
    except (EnvforgeError, ValueError) as exc:
        _fail(exc if isinstance(exc, EnvforgeError) else EnvforgeError(str(exc)))
    doc = {"batch_id": result.store.batch_id, "location": f"{result.store.root}/{result.store.batch_id}",
           "stored_this_run": result.report.stored, "resumed": result.report.resumed,
           "dropped_groups": [g.to_json() for g in result.report.dropped_groups], "metrics": result.metrics,
           "mlflow_run_id": result.mlflow_run_id}
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    m = result.metrics
    out.print(f"batch {doc['batch_id']}: {int(m['trajectories'])} trajectories ({result.report.stored} new, "
              f"{result.report.resumed} resumed), pass@1 {m['pass_at_1']:.3f}, {len(result.report.dropped_groups)} "
              f"dropped group(s), {int(m['infra_retries'])} infra retries, {m['steps_per_s']:.1f} steps/s")
    out.print(f"stored in {doc['location']}")


@app.command()
def tiers(task_set: str = typer.Option("latest", help="task-set version (prefix) or 'latest'"),
          policy: Optional[str] = typer.Option(None, help="reference policy for pass@k (default: static features)"),
          k: int = typer.Option(8, "-k", help="samples per task for pass@k"),
          eval_fraction: float = typer.Option(0.2), seed: int = typer.Option(0),
          as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """Difficulty tiers of a task set (pass@k of a reference policy, or static) and a stratified train/eval split."""
    from envforge import stages
    from envforge.progress import rich_progress

    settings = _settings(data_dir)
    try:
        with rich_progress(console) as progress:
            rows, chart, _ = stages.tier_task_set(settings, task_set, policy, k, eval_fraction, seed,
                                                  progress=progress)
    except (EnvforgeError, ValueError) as exc:
        _fail(exc if isinstance(exc, EnvforgeError) else EnvforgeError(str(exc)))
    if as_json:
        sys.stdout.write(json.dumps({"tiers": rows, "chart": str(chart)}) + "\n")
        return
    for r in rows:
        out.print(f"{r['task_id']:<40} {r['tier']:<9} {r['split']:<6} {r['method']} "
                  + (f"{r['solved']}/{r['k']}" if r["method"] == "pass@k" else f"score {r['score']}"))
    out.print(f"histogram: {chart}")


@app.command("rollout-export")
def rollout_export(batch_id: str = typer.Argument(...), path: Path = typer.Argument(...),
                   fmt: str = typer.Option("verl", "--format", help="verl (parquet) | jsonl"),
                   root: Optional[str] = typer.Option(None, "--out", help="store root (default <data dir>/rollouts)"),
                   data_dir: Optional[Path] = DataDir) -> None:
    """Export a rollout batch: verl's RL parquet layout, or one trajectory per JSON line."""
    from envforge.rollout.store import TrajectoryStore

    settings = _settings(data_dir)
    store = TrajectoryStore(root or str(settings.data_dir / "rollouts"), batch_id)
    if store.manifest() is None:
        _fail(EnvforgeError(f"no rollout batch {batch_id!r} under {store.root}"))
    n = store.export_verl(path) if fmt == "verl" else store.export_jsonl(path)
    out.print(f"{n} trajectories -> {path}")


@app.command()
def report(task_set: str = typer.Option("latest", help="task-set version (prefix) or 'latest'"),
           open_path: bool = typer.Option(False, "--open-path", help="print a file:// URL to open in a browser "
                                                                     "instead of the plain path"),
           data_dir: Optional[Path] = DataDir) -> None:
    """Write the run report of a task set: one self-contained HTML page (card, gates, rollouts, training, charts)
    under <data dir>/reports, logged to MLflow; stages that have not run are shown as 'not run yet'."""
    from envforge.report import build_run_report

    try:
        result = build_run_report(_settings(data_dir), task_set)
    except ValueError as exc:
        _fail(EnvforgeError(str(exc)))
    not_run = [k for k, ran in result.sections.items() if not ran]
    if not_run:
        console.print(f"not run yet: {', '.join(not_run)}")
    console.print(f"MLflow run {result.mlflow_run_id}; also {result.latest}")
    sys.stdout.write((result.path.resolve().as_uri() if open_path else str(result.path)) + "\n")


@train_app.command("demo")
def train_demo(quick: bool = typer.Option(False, help="a shortened run (fewer tasks, steps and rounds)"),
               seed: int = typer.Option(0), rounds: Optional[int] = typer.Option(None, help="GRPO rounds"),
               as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """The CPU learning demo: a small model, SFT on demonstrations, then GRPO rounds, with held-out pass@1
    measured before, after SFT and after GRPO by the sandbox verifier (learning_demo.json, curve PNG, MLflow)."""
    from dataclasses import replace

    from envforge.progress import rich_progress
    from envforge.train.learning_demo import LearningDemoConfig, run_learning_demo

    settings = _settings(data_dir)
    settings.ensure_dirs()
    cfg = LearningDemoConfig(seed=seed)
    if quick:
        cfg = replace(cfg, train_per_chore=2, held_out_per_chore=1, sft_epochs=10, grpo_rounds=1, group_size=2,
                      eval_samples=2)
    if rounds is not None:
        cfg = replace(cfg, grpo_rounds=rounds)
    try:
        with rich_progress(console) as progress:
            doc = run_learning_demo(settings, cfg, progress=progress)
    except EnvforgeError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(doc, default=str) + "\n")
        return
    out.print(f"held-out pass@1 ({doc['held_out_tasks']} tasks): before {doc['pass_at_1_before']:.2f}, after SFT "
              f"{doc['pass_at_1_after_sft']:.2f}, after GRPO {doc['pass_at_1_after_grpo']:.2f}")
    out.print(f"learning curve: {doc['chart']}\nfigures: {settings.data_dir / 'learning_demo.json'}\n"
              f"checkpoint: {doc['checkpoint']} (MLflow run {doc['mlflow_run_id']})")


@policy_app.command("serve")
def policy_serve(model: Path = typer.Argument(..., help="a local Hugging Face model directory"),
                 host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8000)) -> None:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/models, /v1/reload) over a local model.

    The stand-in for `vllm serve` on machines without a GPU: rollouts use it with
    `--policy openai:http://HOST:PORT/v1`.
    """
    from envforge.rollout.policies.serve import serve

    serve(str(model), host, port)


def _corpora(specs: List[str]) -> dict:
    from envforge.pipeline import corpora_from_env

    corpora = corpora_from_env()
    for item in specs:
        name, sep, path = item.partition("=")
        if not sep:
            raise EnvforgeError(f"--corpus {item!r}: expected NAME=PATH")
        corpora[name] = Path(path)
    return corpora


Corpus = typer.Option([], "--corpus", help="NAME=PATH of a reference corpus (JSONL/parquet/text file or "
                                           "directory); HumanEval and ENVFORGE_CORPORA are always included")


@dedup_app.command("index")
def dedup_index(corpus: List[str] = Corpus, rebuild: bool = typer.Option(False, help="start the index afresh"),
                data_dir: Optional[Path] = DataDir) -> None:
    """Build or incrementally update the persisted reference index (new corpus files only)."""
    import shutil

    from envforge.quality.params import DedupConfig
    from envforge.quality.reference_index import ReferenceIndex

    settings = _settings(data_dir)
    root = settings.data_dir / "dedup" / "reference-index"
    try:
        if rebuild and root.exists():
            shutil.rmtree(root)
        index = ReferenceIndex(root, DedupConfig())
        with console.status("indexing reference corpora"):
            report = index.sync(_corpora(corpus))
    except (EnvforgeError, ValueError, OSError) as exc:
        _fail(exc)
    out.print(f"index {root}: {index.size} documents (+{report.added_docs} from {len(report.added_files)} new "
              f"file(s), {report.unchanged_files} unchanged)")
    for f in report.changed_files:
        out.print(f"[yellow]changed since indexed, not re-read:[/yellow] {f} (use --rebuild)")


@dedup_app.command("run")
def dedup_run(corpus: List[str] = Corpus, threshold: float = typer.Option(0.5, help="exact-Jaccard threshold"),
              as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """Decontaminate and dedup the catalog's current tasks; verdicts go to the catalog."""
    from envforge import pipeline, track
    from envforge.catalog import Catalog
    from envforge.quality.params import DedupConfig

    settings = _settings(data_dir)
    tasks = Catalog(settings.catalog_path).load_tasks()
    try:
        config = DedupConfig(threshold=threshold)
        with track.mlflow_run(settings, "decontaminate", "quality", config.as_params()):
            report = pipeline.decontaminate(settings, tasks, _corpora(corpus), config)
    except (EnvforgeError, ValueError, OSError) as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps({"tasks": report.rows, "pairs": [p.__dict__ for p in report.pairs]}) + "\n")
        return
    for r in report.rows:
        flag = "" if r["status"] == "clean" else f" — {r['reason']}"
        out.print(f"{r['task_id']}: {r['status']} (best corpus match J={r['exact_jaccard']:.2f}){flag}")


@taskset_app.command("list")
def taskset_list(data_dir: Optional[Path] = DataDir) -> None:
    """Every task-set version, newest last."""
    from envforge.catalog import Catalog

    for r in Catalog(_settings(data_dir).catalog_path).task_sets().iter_rows(named=True):
        out.print(f"{r['version'][:12]}  {r['name']:24} {r['n_tasks']:5} tasks  {r['created_at']}")


def _version(cat, prefix: str) -> str:
    matches = [v for v in cat.task_sets()["version"] if v.startswith(prefix)]
    if len(matches) != 1:
        raise EnvforgeError(f"task-set version {prefix!r} matches {len(matches)} versions")
    return matches[0]


@taskset_app.command("lineage")
def taskset_lineage(version: str, data_dir: Optional[Path] = DataDir) -> None:
    """Sources, gates, parent version and what was removed (and why) for a task-set version."""
    from envforge.catalog import Catalog

    cat = Catalog(_settings(data_dir).catalog_path)
    try:
        sys.stdout.write(json.dumps(cat.lineage(_version(cat, version)), indent=2) + "\n")
    except (EnvforgeError, KeyError) as exc:
        _fail(exc)


@taskset_app.command("export-swebench")
def taskset_export_swebench(version: str, path: Path, data_dir: Optional[Path] = DataDir) -> None:
    """Write a task-set version's test-verified tasks as SWE-bench instances (JSONL)."""
    from envforge.catalog import Catalog
    from envforge.sources.swebench import export_swebench
    from envforge.task import Task

    cat = Catalog(_settings(data_dir).catalog_path)
    try:
        frame = cat.task_set_frame(_version(cat, version))
    except (EnvforgeError, KeyError) as exc:
        _fail(exc)
    n = export_swebench([Task.model_validate_json(j) for j in frame["task_json"]], path)
    out.print(f"{n} instance(s) written to {path}")


@taskset_app.command("diff")
def taskset_diff(old: str, new: str, data_dir: Optional[Path] = DataDir) -> None:
    """Tasks added, removed and changed between two task-set versions."""
    from envforge.catalog import Catalog

    cat = Catalog(_settings(data_dir).catalog_path)
    try:
        sys.stdout.write(json.dumps(cat.diff_task_sets(_version(cat, old), _version(cat, new)), indent=2) + "\n")
    except (EnvforgeError, KeyError) as exc:
        _fail(exc)


@catalog_app.command("list")
def catalog_list(as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """List the current version of every task, with its latest flakiness-gate verdict."""
    from envforge.catalog import Catalog

    cat = Catalog(_settings(data_dir).catalog_path)
    frame = cat.query("""
        SELECT t.task_id, t.source, substr(t.content_hash, 1, 12) AS version, t.tags,
               arg_max(v.verdict, v.created_at) AS verdict,
               arg_max(v.reference_passes || '/' || v.runs, v.created_at) AS reference_passed,
               arg_max(v.empty_fails || '/' || v.runs, v.created_at) AS empty_failed
        FROM current_tasks t LEFT JOIN validations v USING (content_hash)
        GROUP BY ALL ORDER BY t.task_id""")
    if as_json:
        sys.stdout.write(json.dumps(frame.to_dicts(), default=str) + "\n")
        return
    table = Table(title=f"{frame.height} task(s) in {cat.path}")
    for col in frame.columns:
        table.add_column(col)
    for row in frame.iter_rows():
        table.add_row(*["-" if v is None else ", ".join(v) if isinstance(v, list) else str(v) for v in row])
    out.print(table)


@catalog_app.command("rejects")
def catalog_rejects(all_loads: bool = typer.Option(False, "--all", help="every reject ever, not just each "
                                                                        "source's latest load"),
                    data_dir: Optional[Path] = DataDir) -> None:
    """Records that were rejected at ingestion, with the field and the reason."""
    from envforge.catalog import Catalog

    cat = Catalog(_settings(data_dir).catalog_path)
    frame = cat.rejects() if all_loads else cat.current_rejects()
    for row in frame.iter_rows(named=True):
        out.print(f"{row['source']}: {row['field'] or '-'}: {row['reason']}")
    out.print(f"{frame.height} reject(s)")


@sources_app.command("list")
def sources_list(paths: List[Path] = typer.Argument(None, help="default: the bundled task_sources/ folders"),
                 as_json: bool = typer.Option(False, "--json"), data_dir: Optional[Path] = DataDir) -> None:
    """Every source found under the paths: kind, key (the Dagster partition) and fingerprint."""
    from envforge.sources import discover_sources, fingerprint

    settings = _settings(data_dir)
    refs, problems = discover_sources(paths or settings.bundled_sources())
    rows = [{"kind": r.kind, "key": r.key(settings.task_sources_dir), "fingerprint": fingerprint(r)} for r in refs]
    if as_json:
        sys.stdout.write(json.dumps({"sources": rows, "problems": [p.as_json() for p in problems]}) + "\n")
        return
    for r in rows:
        out.print(f"{r['kind']:<9} {r['key']}  {r['fingerprint'][:12]}")
    for p in problems:
        out.print(f"[yellow]problem[/yellow] {p}")


@sources_app.command("build-repo")
def sources_build_repo(project: Path = typer.Argument(..., help="a patch-series project (patches/*.patch, repo.yaml)"),
                       target: Path = typer.Argument(..., help="new directory for the repository")) -> None:
    """Rebuild a bundled project's git repository from its patches (same commit SHAs every time)."""
    from envforge.sources.gitrepo import build_patch_series, git

    try:
        repo = build_patch_series(project, target)
    except ValueError as exc:
        _fail(EnvforgeError(str(exc)))
    head = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    count = git(repo, "rev-list", "--count", "HEAD").stdout.decode().strip()
    out.print(f"{repo}: {count} commits, HEAD {head}")


@catalog_app.command("export")
def catalog_export(version: str = typer.Argument(..., help="task-set version (a unique prefix is enough)"),
                   path: Path = typer.Argument(..., help="output parquet file"),
                   data_dir: Optional[Path] = DataDir) -> None:
    """Export a task-set version to parquet."""
    from envforge.catalog import Catalog

    cat = Catalog(_settings(data_dir).catalog_path)
    matches = [v for v in cat.task_sets()["version"] if v.startswith(version)]
    if len(matches) != 1:
        _fail(EnvforgeError(f"task-set version {version!r} matches {len(matches)} versions"))
    out.print(str(cat.export_task_set(matches[0], path)))


@app.command()
def schema(output: Optional[Path] = typer.Option(None, "-o", help="write here instead of stdout")) -> None:
    """Print the JSON Schema of the YAML task spec."""
    from envforge.task import task_spec_json_schema

    text = json.dumps(task_spec_json_schema(), indent=2) + "\n"
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    app()
