"""`envforge verify` (grade one solution) and `envforge validate` (the flakiness gate)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from envforge.cli.common import DataDir, console, fail, out, run_stage, settings_for
from envforge.cli.exit_codes import ExitCode
from envforge.cli.images import current_tasks
from envforge.cli.options import config_options
from envforge.errors import EnvforgeError, InfraError, InvalidValue, PolicyOutcome
from envforge.stages.configs import ImagesConfig
from envforge.verify.config import GateConfig


def _load_task(settings, ref: str):
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


def verify(
    task: str = typer.Option(..., "--task", help="spec file/folder or catalog task id"),
    patch: Optional[Path] = typer.Option(None, "--patch", help="a diff to grade"),
    commands: Optional[Path] = typer.Option(
        None, "--commands", help="a file of shell commands (one per line) run as the agent"
    ),
    as_json: bool = typer.Option(False, "--json", help="print exactly the result object"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Grade one solution on a pristine copy of the task (exit 0 resolved, 1 not, 2 infrastructure fault)."""
    from envforge.sandbox.engine import docker_client
    from envforge.stages.images import ensure_images
    from envforge.verify.grader import Grader
    from envforge.verify.result import VerificationResult

    if (patch is None) == (commands is None):
        fail(InvalidValue("give exactly one of --patch FILE or --commands FILE"))
    settings = settings_for(data_dir)
    try:
        t = _load_task(settings, task)
        [(_, image)] = ensure_images(settings, [t]).items([t])
        with Grader(docker_client(settings)) as grader:
            if patch is not None:
                diff, notes = patch.read_text(), []
            else:
                lines = [ln for ln in commands.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
                try:
                    diff, notes = grader.commands_diff(t, image, lines)
                except PolicyOutcome as exc:  # what the commands did is their outcome: not resolved, exit 1
                    diff, notes = None, [f"{exc.reason}:{exc.detail}" if exc.detail else exc.reason]
            if diff is None:
                result = VerificationResult(
                    task_id=t.id, solution="commands", reward=0.0, resolved=False, reasons=notes, image=image
                )
            else:
                result = grader.grade(t, image, diff, "patch" if patch else "commands")
                result.reasons += notes
    except InfraError as exc:
        result = VerificationResult(
            task_id=task,
            solution="patch" if patch else "commands",
            reward=0.0,
            resolved=False,
            infra_error=f"{exc.cause}: {exc.detail}",
        )
        doc = result.as_json()
        doc["reward"] = None
        if as_json:
            sys.stdout.write(json.dumps(doc) + "\n")
        else:
            console.print(f"[red]infrastructure fault, retry:[/red] {exc}")
        raise typer.Exit(ExitCode.INFRA)
    except (EnvforgeError, OSError, ValueError) as exc:
        fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result.as_json()) + "\n")
    else:
        out.print(
            f"{t.id}: reward {result.reward} ({'resolved' if result.resolved else 'not resolved'}), "
            f"patch applied with {result.patch_method}"
        )
        for test_id, status in result.tests.items():
            out.print(f"  {status:8} {test_id}")
        for c in result.checkpoints:
            out.print(f"  {'passed' if c.passed else 'FAILED':8} checkpoint {c.name} (exit {c.exit_code})")
        for r in result.reasons:
            out.print(f"  reason: {r}")
    raise typer.Exit(ExitCode.OK if result.resolved else ExitCode.NO)


@config_options
def validate(
    task: List[str] = typer.Option([], "--task", "-t", help="only these task ids"),
    config: GateConfig = GateConfig(),
    images_config: ImagesConfig = ImagesConfig(),
    as_json: bool = typer.Option(False, "--json"),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """The flakiness gate on the catalog's current tasks: accept or quarantine each, with the reason."""
    from envforge.stages.gate import gate
    from envforge.stages.images import build_images

    settings = settings_for(data_dir)
    tasks = current_tasks(settings, task)
    built = run_stage(build_images, settings, images_config, tasks, progress=False)
    result = run_stage(gate, settings, config, tasks, built.image_set)
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "tasks": result.rows(),
                    "chart": str(result.chart),
                    "probes": {r.task_id: r.probe_results for r in result.reports},
                    "probes_skipped": {r.task_id: r.probes_skipped for r in result.reports},
                    "strength": {r.task_id: r.strength.as_json() for r in result.reports if r.strength is not None},
                    "infra_failures": [str(p) for p in result.infra_failures],
                    "image_failures": [str(p) for p in built.failures],
                }
            )
            + "\n"
        )
    else:
        for r in result.rows():
            how = (
                "kept: unchanged since its last gate"
                if r["kept"]
                else (
                    f"{r['gradings']} gradings, {r['gate_s']} s"
                    + (", stopped at the first disagreement" if r["stopped_early"] else "")
                )
            )
            out.print(
                f"{r['task_id']}: {r['verdict']} (reference {r['reference_passes']}/{r['runs']}, "
                f"empty failed {r['empty_fails']}/{r['empty_runs']}, probes {r['probes_caught']}/{r['probes']}"
                f"; {how})" + _strength_text(r) + (f" — {'; '.join(r['disagreements'])}" if r["disagreements"] else "")
            )
        out.print(f"flake report: {result.chart}")
        if result.strength_chart:
            out.print(f"verifier strength: {result.strength_chart}")
    for p in built.failures:
        console.print(f"[red]not validated[/red] {p}")
    if result.infra_failures or built.failures:
        raise typer.Exit(ExitCode.INFRA)


def _strength_text(row: dict) -> str:
    """`, strength 0.83 (24 mutants, 4 survive)` for a flake-report row whose strength was measured (with the
    FAIL_TO_PASS tests' own score on the changed code where it differs: `, F2P 0.40`)."""
    if row.get("strength") is None:
        return ""
    flags = "".join(
        f", {f}"
        for f, on in (
            ("overfittable", row["overfittable"]),
            ("weak FAIL_TO_PASS asserts", row.get("weak_form")),
            ("audit split only", row["admission"]),
        )
        if on
    )
    f2p = row.get("f2p_strength")
    f2p_text = f", F2P {f2p:.2f}" if f2p is not None and f2p != row["strength"] else ""
    return f", strength {row['strength']:.2f}{f2p_text} ({row['mutants']} mutants, {row['survivors']} survive{flags})"
