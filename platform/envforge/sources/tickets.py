"""Tickets with their fix commits, from Jira-like or GitHub-issue-like exports.

A `tickets.yaml` names the repository and the export files, and maps each export's field
names onto the few a task needs (`id`, `title`, `body`, `fix_commit`, optional `labels`)
through a preset (`jira`, `jira-csv`, `github`) plus overrides. Each ticket's fix commit is
split into the source change (the reference solution) and the test change (held back for
grading); the workspace is the fix's parent with no history. FAIL_TO_PASS / PASS_TO_PASS
are derived later by running the tests (`envforge.sources.derive`).

    repository: ../          # git dir, .bundle, or patch-series project (relative to this file)
    project: ledger          # task ids become <project>-<ticket id>
    exports:
      - file: jira-export.jsonl
        preset: jira
        fields: {fix_commit: fields.customfield_10042}
      - file: github-issues.csv
        preset: github
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from envforge.errors import Problem, SpecError
from envforge.sources.candidate import (Candidate, HistorySourceConfig, StrictModel, add_candidates, check_change,
                                       load_config, open_repository, relative_to_source, slug)
from envforge.sources.gitrepo import first_parent, resolve_commit, split_change
from envforge.sources.records import blank, get_path
from envforge.sources.result import LoadResult

CONFIG_NAME = "tickets.yaml"
FIELDS = ("id", "title", "body", "fix_commit", "labels")
REQUIRED = ("id", "title", "fix_commit")
# Field names as the trackers export them. Dotted paths reach into nested JSON.
PRESETS: dict[str, dict[str, str]] = {
    "jira": {"id": "key", "title": "fields.summary", "body": "fields.description", "fix_commit": "fields.fix_commit",
             "labels": "fields.labels"},
    "jira-csv": {"id": "Issue key", "title": "Summary", "body": "Description", "fix_commit": "Fix commit",
                 "labels": "Labels"},
    "github": {"id": "number", "title": "title", "body": "body", "fix_commit": "closed_by_commit", "labels": "labels"},
}


class TicketExport(StrictModel):
    file: str
    format: Literal["jsonl", "csv"] | None = Field(None, description="default: from the file suffix")
    preset: Literal["jira", "jira-csv", "github", "none"] = "none"
    fields: dict[str, str] = Field(default_factory=dict, description="canonical field -> export field (dotted)")
    id_prefix: str | None = Field(None, description="prepended to the ticket id (e.g. 'gh' for GitHub numbers)")

    @field_validator("fields")
    @classmethod
    def _known(cls, v: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(v) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown canonical field(s) {unknown}; allowed: {list(FIELDS)}")
        return v

    def field_map(self) -> dict[str, str]:
        return {**PRESETS.get(self.preset, {}), **self.fields}


class TicketSourceConfig(HistorySourceConfig):
    repository: str = Field(description="git directory, .bundle file or patch-series project, relative to the config")
    project: str | None = Field(None, description="task id prefix; default: the repository folder's name")
    exports: list[TicketExport] = Field(min_length=1)


def _labels(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value if str(v).strip()]
    if isinstance(value, str):
        return [v.strip() for v in value.replace(",", ";").split(";") if v.strip()]
    return []


def ticket_to_candidate(rec: dict[str, Any], where: str, export: TicketExport, cfg: TicketSourceConfig,
                        git_dir: Path, project: str, base_dir: Path) -> Candidate:
    fmap = export.field_map()
    values = {name: get_path(rec, path) for name, path in fmap.items()}
    missing = [f for f in REQUIRED if f not in fmap]
    if missing:
        raise SpecError([Problem(where, f, f"no export field is mapped to {f!r}: set it under fields: in "
                                           f"{CONFIG_NAME}") for f in missing])
    blanks = [f for f in REQUIRED if blank(values.get(f))]
    if blanks:
        raise SpecError([Problem(where, fmap[f], f"required field is missing (mapped to {f})") for f in blanks])
    fix_field = fmap["fix_commit"]
    rev = str(values["fix_commit"]).strip()
    fix = resolve_commit(git_dir, rev)
    if fix is None:
        raise SpecError([Problem(where, fix_field, f"fix commit {rev!r} does not exist in the repository")])
    parent = first_parent(git_dir, fix)
    if parent is None:
        raise SpecError([Problem(where, fix_field, f"fix commit {fix[:12]} is the root commit: there is no "
                                                   f"state before the fix")])
    change = split_change(git_dir, parent, fix)
    check_change(change, where, fix_field, f"fix commit {fix[:12]}")
    ticket_id = f"{export.id_prefix}-{values['id']}" if export.id_prefix else str(values["id"])
    title, body = str(values["title"]).strip(), str(values.get("body") or "").strip()
    instruction = f"{title}\n\n{body}".strip() if body else title
    return Candidate(
        id=slug(f"{project}-{ticket_id}"), kind="ticket", origin=where, field=fix_field,
        instruction=f"Ticket {ticket_id}: {instruction}", git_dir=git_dir, workspace_commit=parent, change=change,
        config=cfg, base_dir=base_dir, tags=["ticket", *_labels(values.get("labels"))],
        metadata={"ticket": ticket_id, "repo": project, "fix_commit": fix, "base_commit": parent,
                  "export": export.file},
        repository=relative_to_source(cfg.repository, base_dir),
    )


def load_ticket_source(config_path: Path) -> LoadResult:
    """Every ticket in the exports a tickets.yaml lists; bad ones become rejects with file, field, reason."""
    result = LoadResult()
    try:
        cfg = load_config(config_path, TicketSourceConfig)
    except SpecError as exc:
        result.rejects.extend(exc.problems)
        return result
    base_dir = config_path.parent
    try:
        git_dir = open_repository(config_path, "repository", cfg.repository)
    except SpecError as exc:
        result.rejects.extend(exc.problems)
        return result
    repo_path = (base_dir / cfg.repository).resolve()
    project = cfg.project or repo_path.name
    seen: dict[str, str] = {}
    for i, export in enumerate(cfg.exports):
        add_candidates(result, config_path, f"exports[{i}].file", base_dir / export.file, export.format,
                       lambda rec, where, export=export: ticket_to_candidate(rec, where, export, cfg, git_dir, project,
                                                                             base_dir),
                       seen, export.field_map()["id"])
    return result
