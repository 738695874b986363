"""Rebuild one bundled example repository from its upstream clone (provenance, not part of envforge).

    python make_bundle.py UPSTREAM_GIT START END OUT.bundle MAP.json

The first-parent history START..END of the upstream repository is replayed as a linear
history whose root commit is START's tree: every commit keeps its tree, author, committer,
dates and message, so each fix commit is the upstream change, byte for byte. Merge commits
become single commits with the merge's tree (the change a pull request made). Upstream tags
on replayed commits are kept, and the root is tagged with START's nearest upstream tag, so
versions derived from tags (setuptools_scm, hatch-vcs) look as they did upstream. MAP.json
maps upstream SHAs to the bundled ones (the ticket exports refer to bundled SHAs).
"""

import json
import os
import subprocess
import sys
import tempfile

ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def git(repo, *args, env=None, input=None):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True,
                          env={**ENV, **(env or {})}, input=input).stdout.strip()


def main(upstream, start, end, out, map_path):
    shas = git(upstream, "rev-list", "--first-parent", "--reverse", f"{start}^..{end}").split()
    tags = {}
    for line in git(upstream, "show-ref", "--tags", "-d").splitlines():
        sha, ref = line.split()
        tags.setdefault(sha, []).append(ref.removeprefix("refs/tags/").removesuffix("^{}"))
    root_tag = subprocess.run(["git", "-C", upstream, "describe", "--tags", "--abbrev=0", start],
                              capture_output=True, text=True, env=ENV).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "repo.git")
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", repo], check=True, env=ENV)
        git(upstream, "push", "-q", repo, f"{end}:refs/heads/upstream")
        mapping, parent = {}, None
        for sha in shas:
            fmt = git(upstream, "log", "-1", "--format=%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI", sha).split("\0")
            msg = git(upstream, "log", "-1", "--format=%B", sha)
            env = dict(zip(["GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE", "GIT_COMMITTER_NAME",
                            "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE"], fmt))
            args = ["commit-tree", f"{sha}^{{tree}}"] + (["-p", parent] if parent else [])
            parent = git(repo, *args, env=env, input=msg + "\n")
            mapping[sha] = parent
        git(repo, "update-ref", "refs/heads/main", parent)
        git(repo, "update-ref", "-d", "refs/heads/upstream")
        for sha, new in mapping.items():
            for tag in tags.get(sha, []):
                git(repo, "tag", tag, new)
        if root_tag and root_tag not in {t for s in mapping for t in tags.get(s, [])}:
            git(repo, "tag", root_tag, mapping[shas[0]])
        git(repo, "gc", "-q", "--prune=now", "--aggressive")
        git(repo, "bundle", "create", os.path.abspath(out), "--all")
    with open(map_path, "w") as fh:
        json.dump(mapping, fh, indent=1)
        fh.write("\n")
    print(f"{len(shas)} commits, {os.path.getsize(out) / 1024:.0f} KiB")


if __name__ == "__main__":
    main(*sys.argv[1:])
