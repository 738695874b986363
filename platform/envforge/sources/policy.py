"""What the deployment allows a task source to do: where its paths may point, and how big it may be.

A source is untrusted input, exactly as a model's action is: it comes from another team and
may name any path, hold any bytes, or be crafted to exhaust memory. The policy is one typed
object that serves Python, the YAML config file and the environment:

- `ENVFORGE_SOURCE_CONFIG`: a YAML file with any of the fields below;
- `ENVFORGE_SOURCE_ROOTS`: the allowed roots, separated by `:` (overrides the file; set it
  empty to confine every source to its own folder);
- `ENVFORGE_MOVING_REFS`: `resolve` or `refuse` (overrides the file).

Without either, the allowed roots are the deployment's task-sources directory, so the
bundled project's tickets, reviews and SWE-bench folders can share its patch series.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

KIB = 1024
MIB = 1024 * KIB


class SourcePolicy(BaseModel):
    """Confinement and size limits applied to every source while it is loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    roots: tuple[Path, ...] = Field(
        (), description="folders, besides a source's own folder, that the paths a source names may resolve into"
    )
    max_yaml_bytes: int = Field(1 * MIB, gt=0, description="size cap of a YAML file (spec, config, front matter)")
    max_yaml_nodes: int = Field(
        100_000, gt=0, description="cap on a YAML document's nodes with every alias expanded (alias bombs)"
    )
    max_markdown_bytes: int = Field(4 * MIB, gt=0, description="size cap of a runbook")
    max_record_file_bytes: int = Field(2048 * MIB, gt=0, description="size cap of a JSONL/CSV record file")
    max_record_bytes: int = Field(32 * MIB, gt=0, description="size cap of one JSONL line or CSV row")
    max_patch_bytes: int = Field(32 * MIB, gt=0, description="size cap of a patch file a spec names")
    max_text_chars: int = Field(
        64 * KIB, gt=0, description="cap on an instruction, problem statement, title, body or review comment"
    )
    moving_refs: Literal["resolve", "refuse"] = Field(
        "resolve",
        description="a branch or relative ref (`main`, `main~7`) given as a commit: resolved to its SHA "
        "at ingest and recorded in the task's metadata, or refused",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "SourcePolicy":
        """The deployment's policy: the config file, then the environment variables over it."""
        from envforge.settings import read_env

        env = read_env(environ)
        data: dict = {}
        config = env.source_config
        if config:
            try:
                loaded = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ValueError(f"ENVFORGE_SOURCE_CONFIG {config}: cannot read it: {exc}") from None
            if not isinstance(loaded, dict):
                raise ValueError(f"ENVFORGE_SOURCE_CONFIG {config}: must be a YAML mapping of policy fields")
            data.update(loaded)
        if env.source_roots is not None:
            data["roots"] = [p for p in env.source_roots.split(os.pathsep) if p.strip()]
        elif "roots" not in data:
            from envforge.config import Settings

            data["roots"] = [Settings.from_env(environ).task_sources_dir]
        if env.moving_refs:
            data["moving_refs"] = env.moving_refs
        try:
            policy = cls.model_validate(data)
        except ValidationError as err:
            raise ValueError(f"source policy ({config or 'environment'}): {err}") from None
        return policy.model_copy(update={"roots": tuple(Path(os.path.realpath(r)) for r in policy.roots)})


__all__ = ["KIB", "MIB", "SourcePolicy"]
