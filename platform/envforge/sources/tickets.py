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
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator

from envforge.errors import Problem, SpecError
from envforge.sources import guard
from envforge.sources.candidate import (
    Candidate,
    HistorySourceConfig,
    check_change,
    check_repo_footprint,
    load_config,
    open_repository,
    record_candidates,
    relative_to_source,
    slug,
)
from envforge.sources.fields import Identifier, Ref, StrictModel
from envforge.sources.gitrepo import first_parent, resolve_commit, split_change
from envforge.sources.policy import SourcePolicy
from envforge.sources.records import blank, get_path
from envforge.sources.result import LoadResult

CONFIG_NAME = "tickets.yaml"
FIELDS = ("id", "title", "body", "fix_commit", "labels")
REQUIRED = ("id", "title", "fix_commit")
# Field names as the trackers export them. Dotted paths reach into nested JSON.
PRESETS: dict[str, dict[str, str]] = {
    "jira": {
        "id": "key",
        "title": "fields.summary",
        "body": "fields.description",
        "fix_commit": "fields.fix_commit",
        "labels": "fields.labels",
    },
    "jira-csv": {
        "id": "Issue key",
        "title": "Summary",
        "body": "Description",
        "fix_commit": "Fix commit",
        "labels": "Labels",
    },
    "github": {"id": "number", "title": "title", "body": "body", "fix_commit": "closed_by_commit", "labels": "labels"},
}


class TicketExport(StrictModel):
    file: str = Field(description="the export file, relative to tickets.yaml (inside its folder or an allowed root)")
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


class TicketFields(BaseModel):
    """A ticket's canonical fields, as the export's mapped fields hold them (types checked before use)."""

    model_config = ConfigDict(frozen=True)

    id: Identifier
    title: StrictStr
    body: StrictStr | None = None
    fix_commit: Ref
    labels: Union[list[Union[StrictStr, int, float]], StrictStr, None] = None

    @field_validator("fix_commit", mode="before")
    @classmethod
    def _strip(cls, v: Any) -> Any:
        return v.strip() if isinstance(v, str) else v


def _labels(value: list | str | None) -> list[str]:
    if isinstance(value, list):
        return [guard.clean_text(str(v)).strip()[:100] for v in value if str(v).strip()]
    if isinstance(value, str):
        return [guard.clean_text(v).strip()[:100] for v in value.replace(",", ";").split(";") if v.strip()]
    return []


def ticket_to_candidate(
    rec: dict[str, Any],
    where: str,
    export: TicketExport,
    cfg: TicketSourceConfig,
    git_dir: Path,
    project: str,
    base_dir: Path,
    policy: SourcePolicy | None = None,
) -> Candidate:
    policy = policy or SourcePolicy.from_env()
    fmap = export.field_map()
    values = {name: get_path(rec, path) for name, path in fmap.items()}
    missing = [f for f in REQUIRED if f not in fmap]
    if missing:
        raise SpecError(
            [
                Problem(where, f, f"no export field is mapped to {f!r}: set it under fields: in {CONFIG_NAME}")
                for f in missing
            ]
        )
    blanks = [f for f in REQUIRED if blank(values.get(f))]
    if blanks:
        raise SpecError([Problem(where, fmap[f], f"required field is missing (mapped to {f})") for f in blanks])
    try:
        ticket = TicketFields.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as err:
        problems = guard.validation_problems(where, err)
        raise SpecError(
            [Problem(p.source, fmap.get(p.field.split(".")[0].split("[")[0], p.field), p.reason) for p in problems]
        ) from None
    fix_field = fmap["fix_commit"]
    title = guard.check_text(ticket.title, where, fmap["title"], policy).strip()
    body = guard.check_text(ticket.body or "", where, fmap.get("body", "body"), policy).strip()
    rev = ticket.fix_commit
    fix = resolve_commit(git_dir, rev)
    if fix is None:
        raise SpecError([Problem(where, fix_field, f"fix commit {rev!r} does not exist in the repository")])
    pins: dict[str, dict[str, str]] = {}
    fix = guard.pinned(rev, fix, where, fix_field, policy, pins)
    parent = first_parent(git_dir, fix)
    if parent is None:
        raise SpecError(
            [Problem(where, fix_field, f"fix commit {fix[:12]} is the root commit: there is no state before the fix")]
        )
    check_repo_footprint(git_dir, parent, cfg.limits, where, fix_field)
    change = split_change(git_dir, parent, fix)
    check_change(change, where, fix_field, f"fix commit {fix[:12]}")
    ticket_id = f"{export.id_prefix}-{ticket.id}" if export.id_prefix else ticket.id
    if not title:
        raise SpecError([Problem(where, fmap["title"], "required field is missing (mapped to title)")])
    instruction = f"{title}\n\n{body}".strip() if body else title
    metadata: dict[str, Any] = {
        "ticket": ticket_id,
        "repo": project,
        "fix_commit": fix,
        "base_commit": parent,
        "export": export.file,
    }
    if pins:
        metadata["resolved_refs"] = pins
    return Candidate(
        id=slug(f"{project}-{ticket_id}"),
        kind="ticket",
        origin=where,
        field=fix_field,
        instruction=f"Ticket {ticket_id}: {instruction}",
        git_dir=git_dir,
        workspace_commit=parent,
        change=change,
        config=cfg,
        base_dir=base_dir,
        tags=["ticket", *_labels(ticket.labels)],
        metadata=metadata,
        repository=relative_to_source(cfg.repository, base_dir),
    )


def load_ticket_source(config_path: Path, policy: SourcePolicy | None = None) -> LoadResult:
    """Every ticket in the exports a tickets.yaml lists; bad ones become rejects with file, field, reason."""
    policy = policy or SourcePolicy.from_env()
    result = LoadResult()
    try:
        cfg = load_config(config_path, TicketSourceConfig, policy)
        git_dir = open_repository(config_path, "repository", cfg.repository, policy)
    except SpecError as exc:
        result.rejects.extend(exc.problems)
        return result
    base_dir = config_path.parent
    project = cfg.project or (base_dir / cfg.repository).resolve().name
    seen: dict[str, str] = {}
    for i, export in enumerate(cfg.exports):
        for cand in record_candidates(
            config_path,
            f"exports[{i}].file",
            export.file,
            export.format,
            lambda rec, where, export=export: ticket_to_candidate(
                rec, where, export, cfg, git_dir, project, base_dir, policy
            ),
            policy,
            result.rejects,
        ):
            result.add_unique_candidate(cand, seen, export.field_map().get("id", "id"))
    return result
