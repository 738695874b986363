"""`envforge images`: the sandbox base image and the catalog's task images."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from envforge.cli.common import DataDir, console, fail, out, run_stage, settings_for
from envforge.cli.options import config_options
from envforge.errors import EnvforgeError, InvalidValue
from envforge.stages.configs import ImagesConfig

app = typer.Typer(help="Environment images (base and per task).", no_args_is_help=True)


@app.command("base")
def images_base(data_dir: Optional[Path] = DataDir) -> None:
    """Build the sandbox base image from sandboxes/base/ (a cache hit unless the recipe changed)."""
    from envforge.sandbox.engine import docker_client
    from envforge.sandbox.images import build_base_image

    settings = settings_for(data_dir)
    try:
        client = docker_client(settings)
        if not console.is_terminal:
            console.print("building the sandbox base image if needed (first build takes 1-2 minutes)")
        with console.status("sandbox base image (debootstrap on first build, 1-2 minutes)"):
            build = build_base_image(client, settings)
    except EnvforgeError as exc:
        fail(exc)
    out.print(
        f"base image {build.tag} ({'cached' if build.cache_hit else f'built in {build.seconds:.0f}s'}, "
        f"{build.size_mb} MB)"
    )


@app.command("build")
@config_options
def images_build(
    task: List[str] = typer.Option([], "--task", "-t", help="only these task ids"),
    config: ImagesConfig = ImagesConfig(),
    data_dir: Optional[Path] = DataDir,
) -> None:
    """Build the base image and the images of the catalog's current tasks (cache hits are instant)."""
    from envforge.stages.images import build_images

    settings = settings_for(data_dir)
    result = run_stage(build_images, settings, config, current_tasks(settings, task))
    out.print(f"base: {result.base.tag}{' (cached)' if result.base.cache_hit else ''}")
    for t, b in result.builds:
        out.print(f"{t.id}: {b.tag}{' (cached)' if b.cache_hit else f' built in {b.seconds:.1f}s'}{_env_note(b)}")
    for p in result.failures:
        out.print(f"[red]failed[/red] {p}")
    if result.failures:
        raise typer.Exit(1)


def _env_note(build) -> str:
    """Which env layer a task image sits on, and whether building it hit the pip cache."""
    env = build.env
    if env is None:
        return ""
    if env.cache_hit:
        return f" on {env.tag} (cached)"
    return (
        f" on {env.tag} (built in {env.seconds:.1f}s, {env.from_cache} packages from the pip cache, "
        f"{env.downloaded} downloaded)"
    )


def current_tasks(settings, task_ids: List[str]) -> list:
    """The catalog's current tasks (or those of `task_ids`; an unknown id is an error)."""
    from envforge.catalog import Catalog

    tasks = Catalog(settings.catalog_path).load_tasks(task_ids or None)
    if task_ids and len(tasks) != len(set(task_ids)):
        fail(InvalidValue(f"unknown task id(s): {sorted(set(task_ids) - {t.id for t in tasks})}"))
    return tasks
