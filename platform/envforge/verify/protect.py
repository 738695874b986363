"""Protected paths: the parts of a workspace a policy's diff may not change.

The grader never lets such changes reach the grading sandbox: the diff is split per file,
sections touching a protected path are dropped (and reported), and the rest is applied to a
pristine copy. Globs use `**` for any number of directories.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from envforge.task import Task

# Test config and interpreter start-up hooks: changing these changes how tests run.
CONFIG_GLOBS = [
    "**/conftest.py",
    "**/pytest.ini",
    "**/tox.ini",
    "**/setup.cfg",
    "**/pyproject.toml",
    "**/sitecustomize.py",
    "**/usercustomize.py",
    "**/*.pth",
    "**/*.dist-info/**",
    "**/*.egg-info/**",
]
# Where tests live by convention.
TEST_GLOBS = ["**/tests/**", "**/test/**", "**/test_*.py", "**/*_test.py"]


@lru_cache(maxsize=256)
def _glob_regex(glob: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out + r"\Z")


def matches(path: str, globs: list[str]) -> bool:
    path = path.removeprefix("./")
    return any(_glob_regex(g).match(path) for g in globs)


def protected_globs(task: Task) -> list[str]:
    """The task's globs, or the defaults plus the files holding its required tests and the test patch."""
    v = task.spec.verification
    if v.protected_paths is not None:
        return list(v.protected_paths)
    globs = CONFIG_GLOBS + TEST_GLOBS
    if v.tests is not None and v.tests.framework == "pytest":
        globs += sorted({tid.split("::", 1)[0] for tid in v.tests.ids})
    if task.test_patch:
        globs += [p for section in split_diff(task.test_patch) for p in section.paths]
    return globs


_HEADER = re.compile(
    r'^diff --git (?:"a/(?P<qa>(?:[^"\\]|\\.)*)"|a/(?P<a>\S+)) (?:"b/(?P<qb>(?:[^"\\]|\\.)*)"|b/(?P<b>\S+))$'
)


@dataclass
class DiffSection:
    text: str
    paths: list[str] = field(default_factory=list)


_GIT_EXTENDED = (
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "copy from ",
    "copy to ",
    "rename from ",
    "rename to ",
    "similarity index ",
    "dissimilarity index ",
    "index ",
    "--- ",
    "+++ ",
    "Binary files ",
    "GIT binary patch",
)


def _plain_path(header_line: str) -> str | None:
    """The path of a `--- a/x` / `+++ b/x` line (None for /dev/null); timestamps after a tab dropped."""
    path = header_line[4:].split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    return path[2:] if path.startswith(("a/", "b/")) else path


def split_diff(diff: str) -> list[DiffSection]:
    """One section per file, for git diffs and plain unified diffs (`--- x` / `+++ y` headers).

    Text before the first header is dropped.
    """
    lines = diff.splitlines(keepends=True)
    sections: list[DiffSection] = []
    in_git_header = False  # between `diff --git` and its first hunk, `---`/`+++` belong to it
    for i, line in enumerate(lines):
        m = _HEADER.match(line.rstrip("\n"))
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if m:
            a = m.group("qa") if m.group("qa") is not None else m.group("a")
            b = m.group("qb") if m.group("qb") is not None else m.group("b")
            sections.append(DiffSection(line, sorted({a, b})))
            in_git_header = True
            continue
        if line.startswith("--- ") and nxt.startswith("+++ ") and not in_git_header:
            paths = {p for p in (_plain_path(line), _plain_path(nxt)) if p}
            sections.append(DiffSection(line, sorted(paths)))
            continue
        if in_git_header and not line.startswith(_GIT_EXTENDED):
            in_git_header = False  # the extended header ends at the first line that is not one of its own
        if sections:
            sections[-1].text += line
            for prefix in ("rename from ", "rename to ", "copy from ", "copy to "):
                if line.startswith(prefix):
                    sections[-1].paths = sorted(set(sections[-1].paths) | {line[len(prefix) :].rstrip("\n")})
    return sections


def _never_allowed(path: str) -> bool:
    parts = path.split("/")
    return ".git" in parts or ".." in parts or path.startswith("/")


def filter_diff(diff: str, globs: list[str]) -> tuple[str, list[str]]:
    """(the diff without sections touching protected paths, the protected paths it touched).

    A first line of defence only: the grader also checks the tree after applying (a diff can
    be crafted to hide a section from any parser), see grader.py.
    """
    kept, dropped = [], []
    for section in split_diff(diff):
        hit = [p for p in section.paths if matches(p, globs) or _never_allowed(p)]
        if hit:
            dropped.extend(hit)
        else:
            kept.append(section.text)
    return "".join(kept), sorted(set(dropped))
