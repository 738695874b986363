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
from typing import Any

from pydantic import Field

from envforge.errors import Problem, SpecError
from envforge.sources.candidate import (Candidate, HistorySourceConfig, add_candidates, check_change, load_config,
                                       open_repository, relative_to_source, slug)
from envforge.sources.gitrepo import git, is_ancestor, resolve_commit, split_change
from envforge.sources.records import blank
from envforge.sources.result import LoadResult

CONFIG_NAME = "reviews.yaml"
REQUIRED = ("id", "repository", "change_commit", "comment", "follow_up_commit")
MAX_DIFF_CHARS = 12_000


class ReviewSourceConfig(HistorySourceConfig):
    repos: dict[str, str] = Field(min_length=1, description="repository name -> local repository, relative to this file")
    files: list[str] | None = Field(None, description="record files; default every *.jsonl beside the config")


def _comment(value: Any, where: str) -> tuple[str, str]:
    """(comment body, 'path:line by author' context) from a string or a comment object."""
    if isinstance(value, str):
        return value.strip(), ""
    if not isinstance(value, dict) or blank(value.get("body")):
        raise SpecError([Problem(where, "comment.body" if isinstance(value, dict) else "comment",
                                 "the review comment needs a non-empty body")])
    loc = value.get("path") or ""
    if loc and value.get("line") is not None:
        loc += f":{value['line']}"
    by = f" by {value['author']}" if value.get("author") else ""
    return str(value["body"]).strip(), f"{loc}{by}".strip()


def _commit(git_dir: Path, rec: dict, field: str, where: str) -> str:
    sha = resolve_commit(git_dir, str(rec[field]).strip())
    if sha is None:
        raise SpecError([Problem(where, field, f"commit {rec[field]!r} does not exist in the repository")])
    return sha


def review_to_candidate(rec: dict[str, Any], where: str, cfg: ReviewSourceConfig, repos: dict[str, Path],
                        base_dir: Path) -> Candidate:
    missing = [f for f in REQUIRED if blank(rec.get(f))]
    if missing:
        raise SpecError([Problem(where, f, "required field is missing") for f in missing])
    body, context = _comment(rec["comment"], where)
    git_dir = repos.get(rec["repository"])
    if git_dir is None:
        raise SpecError([Problem(where, "repository", f"no local repository for {rec['repository']!r}: add it to "
                                                      f"{CONFIG_NAME} `repos:`")])
    change = _commit(git_dir, rec, "change_commit", where)
    follow_up = _commit(git_dir, rec, "follow_up_commit", where)
    base = _commit(git_dir, rec, "base_commit", where) if not blank(rec.get("base_commit")) \
        else resolve_commit(git_dir, f"{change}^")
    if base is None or not is_ancestor(git_dir, base, change) or base == change:
        raise SpecError([Problem(where, "base_commit", f"must be an ancestor of change_commit {change[:12]}")])
    if follow_up == change or not is_ancestor(git_dir, change, follow_up):
        raise SpecError([Problem(where, "follow_up_commit", f"{follow_up[:12]} does not build on change_commit "
                                                            f"{change[:12]}")])
    under_review = git(git_dir, "diff", "--no-renames", base, change).stdout.decode(errors="replace")
    if len(under_review) > MAX_DIFF_CHARS:
        under_review = under_review[:MAX_DIFF_CHARS] + "\n... (diff truncated)\n"
    split = split_change(git_dir, change, follow_up)
    check_change(split, where, "follow_up_commit", f"follow-up commit {follow_up[:12]}")
    header = f"Review comment{' on ' + context if context else ''}:"
    quoted = "\n".join("> " + line for line in body.splitlines())
    instruction = (f"A change to this repository is under review; it is already applied in the workspace.\n\n"
                   f"{header}\n{quoted}\n\nThe change under review:\n```diff\n{under_review}```\n\n"
                   f"Update the code to address the review comment.")
    return Candidate(
        id=slug(f"{rec['repository'].split('/')[-1]}-review-{rec['id']}"), kind="review", origin=where,
        field="follow_up_commit", instruction=instruction, git_dir=git_dir, workspace_commit=change, change=split,
        config=cfg, base_dir=base_dir, tags=["review"],
        metadata={"review": str(rec["id"]), "repo": rec["repository"], "base_commit": base, "change_commit": change,
                  "follow_up_commit": follow_up},
        repository=relative_to_source(cfg.repos[rec["repository"]], base_dir),
    )


def load_review_source(config_path: Path) -> LoadResult:
    """Every review record in the files a reviews.yaml covers; bad ones become rejects."""
    result = LoadResult()
    try:
        cfg = load_config(config_path, ReviewSourceConfig)
    except SpecError as exc:
        result.rejects.extend(exc.problems)
        return result
    base_dir = config_path.parent
    repos: dict[str, Path] = {}
    for name, rel in cfg.repos.items():
        try:
            repos[name] = open_repository(config_path, f"repos.{name}", rel)
        except SpecError as exc:
            result.rejects.extend(exc.problems)
    files = [base_dir / f for f in cfg.files] if cfg.files is not None else sorted(base_dir.glob("*.jsonl"))
    seen: dict[str, str] = {}
    for i, path in enumerate(files):
        add_candidates(result, config_path, f"files[{i}]", path, "jsonl",
                       lambda rec, where: review_to_candidate(rec, where, cfg, repos, base_dir), seen)
    return result
