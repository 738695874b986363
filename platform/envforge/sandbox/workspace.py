"""The git operations on a sandbox's /workspace: apply a patch, diff against the initial state,
list and restore changed paths.

Every read goes through git against the image's read-only copy of the initial commit, with a
private index and object store and no user or system configuration (`programs.GIT_OVER_WORKSPACE`),
after making the workspace readable to its own user: nothing a policy does to /workspace/.git,
~/.gitconfig or file modes can hide or forge changes, or turn its own failure into an
infrastructure fault. `Sandbox` exposes these as methods (`sb.diff()`, `sb.apply_patch(...)`);
the functions here take the sandbox to run in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from envforge.errors import InfraError, PolicyOutcome
from envforge.sandbox.programs import (
    APPLY_METHODS,
    APPLY_PATCH,
    APPLY_STEPS,
    CHANGED_BYTES_AT_MOST,
    CLEAR_TMP,
    GIT_OVER_PATCHED_COPY,
    GIT_OVER_WORKSPACE,
    RESTORE_GIT_DIR,
    RESTORE_PATHS,
)
from envforge.task import Limits

if TYPE_CHECKING:
    from envforge.sandbox.container import Sandbox

# A policy's workspace changes larger than this (or than half of /tmp, where the diff's objects go)
# cannot be graded: a model outcome (`diff_too_large`), not an infrastructure fault.
MAX_DIFF_INPUT = 16 << 20
DIFF_TOO_LARGE_EXIT = 75
DIFF_CAP = 256 << 20


def apply_errors(lines: list[str]) -> list[str]:
    """'method: complaint' per method tried, from the script's marked stderr."""
    out: list[str] = []
    for line in lines:
        if line.startswith("@") and line[1:] in APPLY_STEPS:
            out.append(f"{line[1:]}:")
        elif out and len(out[-1]) < 300:
            out[-1] = (out[-1] + " " + line.strip())[:300]
    return out


def apply_patch(sandbox: Sandbox, patch: str) -> str:
    """Apply a unified diff to the workspace; returns the method that worked.

    Tries `git apply`, then `git apply --reject`, then `patch --fuzz`, as the SWE-bench
    harness does. A failed `--reject` leaves hunks half-applied, so it is only tried on a
    clean tree, which is then restored before `patch` runs. Raises ValueError naming every
    method's complaint when none applies; the workspace is then as it was. One command
    does it all (graders apply two patches per grading, so round trips count).
    """
    data = patch if patch.endswith("\n") else patch + "\n"
    res = sandbox.exec(APPLY_PATCH, stdin=data.encode("utf-8", errors="surrogateescape"), timeout_s=120)
    lines = res.text().strip().splitlines()
    if res.exit_code == 0 and lines and lines[-1] in APPLY_METHODS:
        return lines[-1]
    errors = [line for line in res.err_text().splitlines() if line.strip()]
    raise ValueError("patch does not apply: " + " | ".join(apply_errors(errors)))


def diff(sandbox: Sandbox, kill_processes: bool = True) -> str:
    """The workspace's changes against the task's initial state, as a binary-safe git patch.

    Computed against the read-only copy of the initial commit in the image, with a private
    index and object store in /tmp, so nothing the policy did to /workspace/.git can hide
    or forge changes, and user/system git config is ignored (no external diff drivers,
    no textconv). By default every sandbox process is killed first, so a background job
    cannot write into git's output: take the diff at the end of an episode. Files matched
    by the task's own .gitignore are left out.
    """
    if kill_processes:
        sandbox.kill_processes()  # nothing left running can write into git's output
        # /tmp holds the diff's private index and objects: what a policy left there (a full
        # tmpfs included) must not stop its diff, and only /workspace is graded.
        sandbox.exec(CLEAR_TMP, timeout_s=120, workdir="/")
    limit = sandbox.diff_input_limit()
    res = sandbox.exec(
        GIT_OVER_WORKSPACE
        + CHANGED_BYTES_AT_MOST.format(limit=limit, code=DIFF_TOO_LARGE_EXIT)
        + "git add -A && git diff --cached --binary --no-ext-diff --no-textconv HEAD",
        timeout_s=120,
        output_cap=DIFF_CAP,
    )
    if res.exit_code == DIFF_TOO_LARGE_EXIT:
        raise PolicyOutcome(
            "diff_too_large", f"the workspace changes hold {res.err_text().strip()} bytes, over the {limit}-byte limit"
        )
    if res.oom_killed:
        raise PolicyOutcome("oom", "the diff was killed for memory the policy's files take")
    if res.exit_code != 0:
        raise InfraError("diff_failed", res.err_text()[-300:])
    if res.stdout_truncated:
        raise InfraError("diff_too_large", f"the workspace diff is over {DIFF_CAP >> 20} MiB")
    return res.stdout.decode("utf-8", errors="surrogateescape")


def diff_input_limit(limits: Limits) -> int:
    """Bytes of changed files a diff may take: its objects are written to /tmp, and past a few
    MiB a diff is not a solution anyone can learn from."""
    return min(MAX_DIFF_INPUT, limits.tmp_mb << 19)


def changed_paths(sandbox: Sandbox, patched_copy: bool = False) -> list[str]:
    """Workspace paths that differ from the task's initial state (added, modified, deleted, type-changed).

    `patched_copy`: only the grader wrote to this workspace since its reset (a patch applied), so stat data
    tells which files changed and only those are hashed (`programs.GIT_OVER_PATCHED_COPY`); a workspace
    a policy touched is always read in full."""
    git = GIT_OVER_PATCHED_COPY if patched_copy else GIT_OVER_WORKSPACE
    res = sandbox.exec(
        git + "git add -A && git diff --cached --no-renames --name-only -z HEAD",
        timeout_s=120,
        output_cap=DIFF_CAP,
    )
    if res.exit_code != 0:
        raise InfraError("diff_failed", res.err_text()[-300:])
    return [p for p in res.stdout.decode("utf-8", errors="surrogateescape").split("\0") if p]


def restore_paths(sandbox: Sandbox, paths: list[str]) -> None:
    """Put paths back as they are in the task's initial state (removed if they did not exist)."""
    if not paths:
        return
    lines = "\n".join(paths)
    res = sandbox.exec(RESTORE_PATHS, stdin=(lines + "\n").encode(), timeout_s=120, workdir="/")
    if res.exit_code != 0:
        raise InfraError("restore_failed", res.err_text()[-300:])


def restore_git_dir(sandbox: Sandbox) -> None:
    """Replace /workspace/.git with the image's pristine copy (a diff may have written into it)."""
    res = sandbox.exec(RESTORE_GIT_DIR, timeout_s=120, workdir="/")
    if res.exit_code != 0:
        raise InfraError("restore_failed", res.err_text()[-300:])
