"""Code-review records as tasks: "address this review comment".

A record names a change under review (a commit on top of `base_commit`), the reviewer's
comment, and the follow-up commit the author pushed in answer. The task's workspace is the
change under review (no history); the instruction is the comment plus the change's diff; the
reference solution is the follow-up's source change, and the follow-up's test change is
held back and grades it (FAIL_TO_PASS / PASS_TO_PASS derived by running the tests).

`reviews.yaml` beside the JSONL maps repository names to local repositories:

    repos: {acme/ledger: ../}   # git dir, .bundle or patch-series project
    files: [reviews.jsonl]      # default: every *.jsonl beside this file

Record (one JSON object per line):

    {"id": "PR-21#c1", "repository": "acme/ledger", "base_commit": "<sha>",
     "change_commit": "<sha>", "follow_up_commit": "<sha>",
     "comment": {"body": "...", "path": "ledger/money.py", "line": 42, "author": "dana"}}

`comment` may also be a plain string; `base_commit` defaults to the change's parent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, StrictStr, Tag, ValidationError
from typing_extensions import Annotated

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
from envforge.sources.fields import Identifier, Ref
from envforge.sources.gitrepo import git, is_ancestor, resolve_commit, split_change
from envforge.sources.policy import SourcePolicy
from envforge.sources.records import blank
from envforge.sources.result import LoadResult

CONFIG_NAME = "reviews.yaml"
REQUIRED = ("id", "repository", "change_commit", "comment", "follow_up_commit")
MAX_DIFF_CHARS = 12_000


class ReviewSourceConfig(HistorySourceConfig):
    repos: dict[Identifier, str] = Field(
        min_length=1,
        description="repository name -> local repository, relative to this file (inside its folder or an allowed root)",
    )
    files: list[str] | None = Field(None, description="record files; default every *.jsonl beside the config")


class ReviewComment(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    body: StrictStr
    path: StrictStr | None = None
    line: StrictInt | StrictStr | None = None
    author: StrictStr | None = None


class ReviewRecord(BaseModel):
    """One review record (types checked before use; fields envforge does not use are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: Identifier
    repository: Identifier
    base_commit: Ref | None = None
    change_commit: Ref
    follow_up_commit: Ref
    comment: Annotated[
        Union[Annotated[StrictStr, Tag("str")], Annotated[ReviewComment, Tag("ReviewComment")]],
        Discriminator(lambda v: "ReviewComment" if isinstance(v, (dict, ReviewComment)) else "str"),
    ]


def _comment(value: StrictStr | ReviewComment, where: str, policy: SourcePolicy) -> tuple[str, str]:
    """(comment body, 'path:line by author' context) from a string or a comment object."""
    if isinstance(value, str):
        body = guard.check_text(value, where, "comment", policy).strip()
        if not body:
            raise SpecError([Problem(where, "comment", "the review comment needs a non-empty body")])
        return body, ""
    body = guard.check_text(value.body, where, "comment.body", policy).strip()
    if not body:
        raise SpecError([Problem(where, "comment.body", "the review comment needs a non-empty body")])
    loc = guard.clean_text(value.path or "")[:500]
    if loc and value.line is not None:
        loc += f":{guard.clean_text(str(value.line))[:20]}"
    by = f" by {guard.clean_text(value.author)[:200]}" if value.author else ""
    return body, f"{loc}{by}".strip()


def _commit(git_dir: Path, rev: str, field: str, where: str, policy: SourcePolicy, pins: dict) -> str:
    sha = resolve_commit(git_dir, rev.strip())
    if sha is None:
        raise SpecError([Problem(where, field, f"commit {rev!r} does not exist in the repository")])
    return guard.pinned(rev.strip(), sha, where, field, policy, pins)


def review_to_candidate(
    rec: dict[str, Any],
    where: str,
    cfg: ReviewSourceConfig,
    repos: dict[str, Path],
    base_dir: Path,
    policy: SourcePolicy | None = None,
) -> Candidate:
    policy = policy or SourcePolicy.from_env()
    missing = [f for f in REQUIRED if blank(rec.get(f))]
    if missing:
        raise SpecError([Problem(where, f, "required field is missing") for f in missing])
    if isinstance(rec["comment"], dict) and blank(rec["comment"].get("body")):
        raise SpecError([Problem(where, "comment.body", "the review comment needs a non-empty body")])
    try:
        r = ReviewRecord.model_validate(rec)
    except ValidationError as err:
        raise SpecError(guard.validation_problems(where, err)) from None
    body, context = _comment(r.comment, where, policy)
    git_dir = repos.get(r.repository)
    if git_dir is None:
        raise SpecError(
            [
                Problem(
                    where, "repository", f"no local repository for {r.repository!r}: add it to {CONFIG_NAME} `repos:`"
                )
            ]
        )
    pins: dict[str, dict[str, str]] = {}
    change = _commit(git_dir, r.change_commit, "change_commit", where, policy, pins)
    follow_up = _commit(git_dir, r.follow_up_commit, "follow_up_commit", where, policy, pins)
    base = (
        _commit(git_dir, r.base_commit, "base_commit", where, policy, pins)
        if not blank(r.base_commit)
        else resolve_commit(git_dir, f"{change}^")
    )
    if base is None or not is_ancestor(git_dir, base, change) or base == change:
        raise SpecError([Problem(where, "base_commit", f"must be an ancestor of change_commit {change[:12]}")])
    if follow_up == change or not is_ancestor(git_dir, change, follow_up):
        raise SpecError(
            [Problem(where, "follow_up_commit", f"{follow_up[:12]} does not build on change_commit {change[:12]}")]
        )
    under_review = git(git_dir, "diff", "--no-renames", base, change).stdout.decode(errors="replace")
    if len(under_review) > MAX_DIFF_CHARS:
        under_review = under_review[:MAX_DIFF_CHARS] + "\n... (diff truncated)\n"
    check_repo_footprint(git_dir, change, cfg.limits, where, "change_commit")
    split = split_change(git_dir, change, follow_up)
    check_change(split, where, "follow_up_commit", f"follow-up commit {follow_up[:12]}")
    header = f"Review comment{' on ' + context if context else ''}:"
    quoted = "\n".join("> " + line for line in body.splitlines())
    instruction = (
        f"A change to this repository is under review; it is already applied in the workspace.\n\n"
        f"{header}\n{quoted}\n\nThe change under review:\n```diff\n{under_review}```\n\n"
        f"Update the code to address the review comment."
    )
    metadata: dict[str, Any] = {
        "review": r.id,
        "repo": r.repository,
        "base_commit": base,
        "change_commit": change,
        "follow_up_commit": follow_up,
    }
    if pins:
        metadata["resolved_refs"] = pins
    return Candidate(
        id=slug(f"{r.repository.split('/')[-1]}-review-{r.id}"),
        kind="review",
        origin=where,
        field="follow_up_commit",
        instruction=instruction,
        git_dir=git_dir,
        workspace_commit=change,
        change=split,
        config=cfg,
        base_dir=base_dir,
        tags=["review"],
        metadata=metadata,
        repository=relative_to_source(cfg.repos[r.repository], base_dir),
    )


def load_review_source(config_path: Path, policy: SourcePolicy | None = None) -> LoadResult:
    """Every review record in the files a reviews.yaml covers; bad ones become rejects."""
    policy = policy or SourcePolicy.from_env()
    result = LoadResult()
    try:
        cfg = load_config(config_path, ReviewSourceConfig, policy)
    except SpecError as exc:
        result.rejects.extend(exc.problems)
        return result
    base_dir = config_path.parent
    repos: dict[str, Path] = {}
    for name, rel in cfg.repos.items():
        try:
            repos[name] = open_repository(config_path, f"repos.{name}", rel, policy)
        except SpecError as exc:
            result.rejects.extend(exc.problems)
    files = list(cfg.files) if cfg.files is not None else sorted(f.name for f in base_dir.glob("*.jsonl"))
    seen: dict[str, str] = {}
    for i, rel in enumerate(files):
        for cand in record_candidates(
            config_path,
            f"files[{i}]",
            rel,
            "jsonl",
            lambda rec, where: review_to_candidate(rec, where, cfg, repos, base_dir, policy),
            policy,
            result.rejects,
        ):
            result.add_unique_candidate(cand, seen)
    return result
