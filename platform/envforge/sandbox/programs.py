"""The fixed shell programs the host runs inside a sandbox.

They are security-relevant text: each one runs as the sandbox user next to whatever a policy
left behind (files it locked, a planted ~/.gitconfig, a full /tmp, background jobs), so the
guards in them are part of the isolation model (docs/sandbox.md, docs/security.md). They are
kept here, apart from the code that sends them (`container.Sandbox` for the container's own
life, `workspace` for the git operations on /workspace), so they can be read and reviewed as
one.
"""

from __future__ import annotations

from envforge.sandbox.agent import WIPE_WRITABLE
from envforge.sandbox.images import TEMPLATE_DIR
from envforge.task import WORKSPACE

# -- the container's life ------------------------------------------------------------------

# The supervisor keeps the container alive if the agent dies (so `docker exec` still works)
# and says so on the stream (docker-init holds the stream open, so it never ends by itself).
SUPERVISOR = 'python3 -c "$0"; printf \'\\n{"agent_exit": true}\\n\'; exec sleep infinity </dev/null >/dev/null 2>&1'
# The fallback path's wrapper (`docker exec`, no agent): without the agent to set it, commands
# still make themselves the OOM killer's first choice.
OOM_FIRST_THEN_EXEC = 'echo 1000 >/proc/self/oom_score_adj 2>/dev/null; exec "$@"'
READ_OOM_KILLS = (
    "cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null "
    "| sed -n 's/^oom_kill //p' | head -n 1"
)
# SIGKILL every process of the sandbox user, without the agent (a few rounds: forks in flight).
_KILL_ALL = "for i in 1 2 3 4 5; do kill -9 -1 2>/dev/null; done"
KILL_ALL = _KILL_ALL + "; true"
# A reset to the initial state without the agent: kill, empty every writable place, copy the template.
RESET_TO_INITIAL = f"{_KILL_ALL}; {WIPE_WRITABLE}; cp -a {TEMPLATE_DIR}/. {WORKSPACE}/"

# -- the workspace -------------------------------------------------------------------------

CLEAR_TMP = "chmod -R u+rwX /tmp 2>/dev/null; find /tmp -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + ; true"
# git against the image's read-only initial commit, with a private index and object store,
# and no configuration but the image's own (a policy can plant ~/.gitconfig in /tmp).
PRIVATE_GIT = (
    'set -e; t=$(mktemp -d); trap \'rm -rf "$t"\' EXIT; mkdir "$t/objects"; '
    "export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=/nonexistent; "
    f'export GIT_DIR={TEMPLATE_DIR}/.git GIT_WORK_TREE={WORKSPACE} GIT_INDEX_FILE="$t/index" '
    f'GIT_OBJECT_DIRECTORY="$t/objects" GIT_ALTERNATE_OBJECT_DIRECTORIES={TEMPLATE_DIR}/.git/objects; '
    f'cp {TEMPLATE_DIR}/.git/index "$t/index"; cd {WORKSPACE}; '
)
# The sizes of the files that differ from the initial state (added, modified; deleted ones count 0),
# before `git add` writes their objects: too much is the policy's outcome, stated, not a full /tmp.
# Format with `limit` (bytes) and `code` (the exit status that says "too much").
CHANGED_BYTES_AT_MOST = (
    "n=$(git status --porcelain=v1 -z --untracked-files=all --no-renames | sed -z 's/^...//' "
    "| du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f 1); "
    'if [ "${{n:-0}}" -gt {limit} ]; then echo "$n" >&2; exit {code}; fi; '
)
# Before git reads the workspace: what the policy made unreadable to its own user (`chmod 000
# run.sh`, a directory without r or x) would fail `git add` and turn the policy's act into an
# "infrastructure fault", retried and then dropped: a failing policy could hide its failures that
# way. Directories get u+rwx (git keeps no directory modes) and files u+r (git keeps only the
# executable bit, which is left alone), top-down so a locked directory is opened before its
# entries are read; symlinks are not followed, and what the user does not own is left as it is.
WORKSPACE_READABLE = (
    "python3 -c 'import os,stat\n"
    'todo=["%s"]\n'
    "while todo:\n"
    " p=todo.pop()\n"
    " try:\n"
    "  m=os.lstat(p).st_mode\n"
    "  if stat.S_ISDIR(m):\n"
    "   if m&0o700!=0o700: os.chmod(p,m|0o700)\n"
    "   todo.extend(e.path for e in os.scandir(p))\n"
    "  elif stat.S_ISREG(m) and not m&0o400: os.chmod(p,m|0o400)\n"
    " except OSError: pass'; " % WORKSPACE
)
GIT_OVER_WORKSPACE = WORKSPACE_READABLE + PRIVATE_GIT  # what every read of the workspace through git runs first
# A copy that only the grader wrote to (a reset from the template, then `git apply` or `patch`) can be read from
# stat data: the template's index records each file's mtime and size, `cp -a` keeps them, and whatever the patch
# wrote has a new mtime; only those files are hashed (inode, device and ctime differ in every copy, so they are
# not compared). Never for a workspace a policy touched: it can write a file and set its mtime back.
GIT_OVER_PATCHED_COPY = (
    GIT_OVER_WORKSPACE + "export GIT_CONFIG_COUNT=2 GIT_CONFIG_KEY_0=core.checkStat GIT_CONFIG_VALUE_0=minimal "
    "GIT_CONFIG_KEY_1=core.trustctime GIT_CONFIG_VALUE_1=false; "
)

# apply_patch in one command: the patch arrives on stdin; each method's complaint goes to stderr
# after a `@method` marker line; the method that worked is the last line of stdout.
# A patch that cannot even be staged in /tmp (a policy filled it) fails as `stage_patch`, never
# as an empty patch that `patch` would "apply".
APPLY_METHODS = ("git_apply", "git_apply_reject", "patch_fuzz")
APPLY_STEPS = ("stage_patch",) + APPLY_METHODS
APPLY_PATCH = (
    'p=$(mktemp /tmp/.envforge-apply-XXXXXXXX 2>&1) || { echo @stage_patch >&2; echo "$p" >&2; exit 1; }; '
    "trap 'rm -f \"$p\"' EXIT; "
    'if ! err=$(cat 2>&1 > "$p"); then echo @stage_patch >&2; echo "$err" >&2; exit 1; fi; '
    'echo @git_apply >&2; git apply --whitespace=nowarn "$p" >&2 && { echo git_apply; exit 0; }; '
    # a failed `git apply` wrote nothing, so the tree's state is read only now (it hashes every file of a copy)
    "clean=$(git status --porcelain --untracked-files=all 2>/dev/null); "
    'if [ -z "$clean" ]; then echo @git_apply_reject >&2; '
    'if git apply --reject --whitespace=nowarn "$p" >&2; then echo git_apply_reject; exit 0; fi; '
    "git checkout -q -- . && git clean -fdq; fi; "
    'echo @patch_fuzz >&2; patch --batch --fuzz=5 -p1 --dry-run -i "$p" >&2 '
    '&& patch --batch --fuzz=5 -p1 --no-backup-if-mismatch -i "$p" >&2 && { echo patch_fuzz; exit 0; }; exit 1'
)
# Paths (one a line, on stdin) put back as they are in the initial state, removed if they did not exist.
RESTORE_PATHS = (
    f'while IFS= read -r p; do rm -rf -- "{WORKSPACE}/$p"; '
    f'if [ -e "{TEMPLATE_DIR}/$p" ] || [ -L "{TEMPLATE_DIR}/$p" ]; then '
    f'mkdir -p "$(dirname "{WORKSPACE}/$p")" && cp -a "{TEMPLATE_DIR}/$p" "{WORKSPACE}/$p"; fi; '
    f"done"
)
RESTORE_GIT_DIR = f"rm -rf {WORKSPACE}/.git && cp -a {TEMPLATE_DIR}/.git {WORKSPACE}/.git"
