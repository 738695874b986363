"""Benchmark envforge on the bundled real repositories (task_sources/examples/real-repos).

    .venv/bin/python bench/real_repos.py [--project NAME ...] [--cold] [--runs N] [--out FILE]

For each project (humanize: declared environment; the others inferred), as a user
would run it, with no file of envforge's touched: `ingest` its tickets.yaml (derivation in
sandboxes), build the images and put every task through the flakiness gate. Prints one JSON
document with, per project and in total:
- tickets, tasks accepted by ingest and by the gate, and the rejects with their reasons;
- FAIL_TO_PASS equality with the hand-checked lists in each project's expected.yaml;
- ingest wall time, gate wall time, and per-task medians;
- env layers: distinct layers built vs tasks that found theirs already built (cache hits);
- the naive alternative, measured in the same run on one env layer of the project: the same
  recipe installed again with the shared pip cache, and with an empty pip cache (what every
  task would pay if each installed its own dependencies); `ratio_*` compare them with a
  cache hit.

`--cold` removes this project's env and task images first (images envforge built for these
sources only), so the env layers are built inside the measured ingest. `--combine FILE ...`
prints the document for the projects measured by earlier runs (their `--out` files, or the
`.partial.json` a run keeps as it goes), e.g. runs of one project each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "platform"))

from envforge.config import Settings  # noqa: E402
from envforge.errors import EnvforgeError  # noqa: E402
from envforge.sandbox.engine import docker_client  # noqa: E402
from envforge.sandbox.envlayer import build_env_image, env_recipe  # noqa: E402
from envforge.sandbox.images import build_base_image, build_requirements, env_image_name, workspace_file  # noqa: E402
from envforge.sources.gitrepo import repository_dir  # noqa: E402
from envforge.stages.base import StageContext  # noqa: E402
from envforge.stages.configs import ImagesConfig, IngestConfig  # noqa: E402
from envforge.stages.gate import gate  # noqa: E402
from envforge.stages.images import build_images  # noqa: E402
from envforge.stages.ingest import ingest  # noqa: E402
from envforge.verify.config import GateConfig  # noqa: E402

EXAMPLES = REPO / "task_sources" / "examples" / "real-repos"
PROJECTS = ("humanize", "parse", "marshmallow", "asgiref", "cachetools", "xopen")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _progress(stage: str, detail: str, done: int, total: int) -> None:
    if total and (done == total or done % 4 == 0):
        log(f"{stage} {done}/{total} {detail}")


def _remove_project_images(client, project: str) -> int:
    removed = 0
    for image in client.images.list():
        for tag in image.tags:
            if tag.startswith((f"envforge/env-{project}:", f"envforge/task-{project}-")):
                client.images.remove(tag, force=True)
                removed += 1
    return removed


def _naive_env_builds(client, settings: Settings, task) -> dict:
    """One of the project's env layers again: with the shared pip cache, and with an empty one.

    An infrastructure fault here (the engine's bridge gone) is recorded instead of losing the
    project's other figures."""
    try:
        return _naive_env_builds_or_raise(client, settings, task)
    except EnvforgeError as exc:
        return {"error": str(exc)[:300]}


def _naive_env_builds_or_raise(client, settings: Settings, task) -> dict:
    env = task.spec.environment
    if not env.needs_env_layer:
        return {}
    base = build_base_image(client, settings).tag
    recipe = env_recipe(env_image_name(task), base, env, lambda rel: workspace_file(task, settings, rel, repository_dir),
                        build=build_requirements(task))
    out = {}
    for label, volume in (("warm_pip_cache", None), ("empty_pip_cache", f"envforge-bench-{uuid.uuid4().hex[:8]}")):
        tag = f"envforge/env-bench:{uuid.uuid4().hex[:12]}"
        kwargs = {"cache_volume": volume} if volume else {}
        try:
            build = build_env_image(client, recipe, tag=tag, **kwargs)
            out[label] = {"seconds": round(build.seconds, 2), "downloaded": build.downloaded,
                          "from_cache": build.from_cache}
            client.images.remove(tag, force=True)
        finally:
            if volume and client.volumes.list(filters={"name": volume}):
                client.volumes.get(volume).remove(force=True)
    return out


def run_project(project: str, data_root: Path, client, runs: int, cold: bool) -> dict:
    source = EXAMPLES / project / "tickets.yaml"
    expected = yaml.safe_load((EXAMPLES / project / "expected.yaml").read_text())["tickets"]
    settings = Settings.from_env().with_data_dir(data_root / project)
    settings.ensure_dirs()
    if cold:
        log(f"{project}: removed {_remove_project_images(client, project)} images")
    log(f"{project}: ingest")
    started = time.perf_counter()
    context = StageContext(progress=_progress)
    report = ingest(settings, IngestConfig(), [source], context=context, client=client)
    infra = [p for p in report.result.rejects if p.reason.startswith("infra:")]
    if infra:  # what a user does after an infrastructure fault: ingest again (derivations done are cached)
        log(f"{project}: {len(infra)} infra rejects, ingesting again")
        report = ingest(settings, IngestConfig(), [source], context=context, client=client)
    ingest_s = time.perf_counter() - started
    tasks = report.result.tasks
    by_ticket = {t.spec.metadata.get("ticket"): t for t in tasks}
    mismatches = {}
    for ticket, want in expected.items():
        task = by_ticket.get(ticket)
        got = sorted(task.spec.verification.tests.fail_to_pass) if task else None
        if got != sorted(want["fail_to_pass"]):
            mismatches[ticket] = {"derived": got, "expected": sorted(want["fail_to_pass"])}
    log(f"{project}: images and the gate on {len(tasks)} tasks")
    started = time.perf_counter()
    images = build_images(settings, ImagesConfig(), tasks, client=client)
    validation = gate(settings, GateConfig(runs=runs), tasks, images.image_set, context=context, client=client)
    retried = [t for t, _ in validation.ungated]
    if retried:  # what a user does after an infrastructure fault: validate those tasks again
        log(f"{project}: {len(retried)} infra failures, validating them again")
        again = gate(settings, GateConfig(runs=runs), retried, images.image_set, client=client)
        validation.reports += again.reports
        validation.ungated = again.ungated
    gate_s = time.perf_counter() - started
    accepted = {r.task_id for r in validation.reports if r.accepted}
    env_tags = [t.spec.metadata.get("images", {}).get("env") for t in tasks]
    layers = sorted({t for t in env_tags if t})
    both = [t for t in tasks if t.id in accepted and t.spec.metadata.get("ticket") not in mismatches]
    return {
        "tickets": len(expected), "accepted_by_ingest": len(tasks), "ingest_retried_infra": len(infra),
        "accepted_by_gate": len(accepted),
        "gate_and_f2p_equal": len(both), "f2p_equal": len(expected) - len(mismatches),
        "environment": "declared" if tasks and tasks[0].spec.metadata["environment"]["declared"] else "inferred",
        "ingest_s": round(ingest_s, 1), "gate_s": round(gate_s, 1),
        "ingest_s_per_task": round(ingest_s / max(1, len(expected)), 2),
        "gate_s_per_task": round(gate_s / max(1, len(tasks)), 2),
        "verifier_median_s": round(statistics.median([r.median_verifier_s for r in validation.reports] or [0]), 3),
        "env_layers": len(layers), "env_layer_builds": len(layers), "env_layer_cache_hits": len(tasks) - len(layers),
        "rejects": [f"{p.record or p.source}: {p.field}: {p.reason[:300]}" for p in report.result.rejects],
        "quarantined": {r.task_id: r.disagreements[:3] for r in validation.reports if not r.accepted},
        "image_failures": [str(p)[:300] for p in images.failures],
        "infra_failures": [str(p)[:300] for p in validation.infra_failures], "gate_retried": len(retried),
        "f2p_mismatches": mismatches,
        "naive_env_install": _naive_env_builds(client, settings, tasks[-1]) if tasks else {},
    }


def summarize(results: dict[str, dict]) -> dict:
    """The benchmark's document: per-project results and the totals over them."""
    tickets = sum(r["tickets"] for r in results.values())
    good = sum(r["gate_and_f2p_equal"] for r in results.values())
    naive = [r["naive_env_install"] for r in results.values() if "warm_pip_cache" in r["naive_env_install"]]
    doc = {
        "projects": results,
        "total": {
            "tickets": tickets, "accepted_by_ingest": sum(r["accepted_by_ingest"] for r in results.values()),
            "accepted_by_gate": sum(r["accepted_by_gate"] for r in results.values()),
            "f2p_equal": sum(r["f2p_equal"] for r in results.values()),
            "gate_and_f2p_equal": good, "rate": round(good / max(1, tickets), 3), "target": 0.95,
            "target_met": good / max(1, tickets) >= 0.95,
            "ingest_s": round(sum(r["ingest_s"] for r in results.values()), 1),
            "gate_s": round(sum(r["gate_s"] for r in results.values()), 1),
            "ingest_s_per_task_median": statistics.median([r["ingest_s_per_task"] for r in results.values()]),
            "env_layer_builds": sum(r["env_layer_builds"] for r in results.values()),
            "env_layer_cache_hits": sum(r["env_layer_cache_hits"] for r in results.values()),
        },
    }
    if naive:
        warm = statistics.median(n["warm_pip_cache"]["seconds"] for n in naive)
        empty = statistics.median(n["empty_pip_cache"]["seconds"] for n in naive)
        doc["total"]["naive_env_install_s_median"] = {"warm_pip_cache": warm, "empty_pip_cache": empty}
        doc["total"]["ratio_empty_vs_warm_pip_cache"] = round(empty / max(warm, 1e-9), 2)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", action="append", choices=PROJECTS)
    ap.add_argument("--cold", action="store_true", help="remove the projects' env and task images first")
    ap.add_argument("--runs", type=int, default=5, help="gate runs of the empty and the reference solution")
    ap.add_argument("--data-dir", type=Path, default=None, help="default: a fresh temporary directory")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--combine", type=Path, nargs="+", default=None,
                    help="summarize the projects of earlier runs' output files instead of running")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    if args.combine:
        for path in args.combine:
            doc = json.loads(path.read_text())
            results.update(doc.get("projects", doc))  # a full document, or a run's partial file
    else:
        client = docker_client(Settings.from_env())
        data_root = args.data_dir or Path(tempfile.mkdtemp(prefix="envforge-bench-real-"))
        for project in args.project or PROJECTS:
            results[project] = run_project(project, data_root, client, args.runs, args.cold)
            if args.out:  # a long run keeps what it has measured so far
                args.out.with_suffix(".partial.json").write_text(json.dumps(results, indent=1) + "\n")
        log(f"data: {data_root}")
    text = json.dumps(summarize(results), indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
