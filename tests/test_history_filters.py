"""The history source's pre-filters: commits whose message or diff shape rules out a failing-then-passing
test are skipped before any sandbox time, each with its reason; accepted kinds of commits are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from envforge.sources.change_shape import behaviour_neutral, only_removes_tests
from envforge.sources.history import Commit, HistoryFilters, load_history_source, skip_reason
from tests.test_history_sources import commit, git

pytestmark = pytest.mark.usefixtures("allow_tmp_sources")

# Real subjects from upstream history (tomli, cachetools, tenacity), ingested on 2 December 2026.
REJECTED = {  # the change had no failing-then-passing test
    "Update mypy to 1.15 and use `--strict` mode (#257)": "typing",
    "Reduce import time by removing `string` and `tomli._types` imports": "performance",
    "Create binary wheels with mypyc (#242)": "build or packaging",
    "Minor cleanups.": "refactor or cleanup",
    "Fix #356: Improve RRCache performance.": "performance",
    'Drop support for passing "info" as fourth positional parameter of @cached.': "removal of deprecated or dropped support",
    "refactor: enable additional ruff rule categories (#620)": "non-behavioural conventional type",
    "🔧 fix(type): resolve ty 0.0.25 type errors (#468)": "non-behavioural conventional type",  # platformdirs
    "Drop Python 2": "removal of deprecated or dropped support",  # itsdangerous (a merged pull request)
}
ACCEPTED = [  # became tasks
    "TOML 1.1: Make seconds optional in Date-Time and Time (#203)",
    "Add attributes to TOMLDecodeError. Deprecate free-form `__init__` args (#238)",
    "`tomli.loads`: Raise TypeError not AttributeError. Improve message (#229)",
    "Fix #357: Convert @cachedmethod decorators to descriptors.",
    "Avoid unnecessary exponential wait computation (#654)",
    "feat: deprecate `initial` in favor of `multiplier` in `wait_exponential_jitter` (#629)",
    "fix: respect enabled=False in iterator protocols (__iter__ / __aiter__) (#643)",
    "Keep statistics visible when @retry is further wrapped (fixes #519) (#653)",
]


def _commit(message: str) -> Commit:
    return Commit("a" * 40, ("b" * 40,), "Dev", "dev@example.com", "2026-01-01T00:00:00Z", message)


def test_subjects_of_commits_without_a_failing_test_are_skipped_by_name_and_accepted_ones_are_kept():
    filters = HistoryFilters.model_validate({})
    for subject, name in REJECTED.items():
        reason = skip_reason(_commit(subject + "\n\nbody"), filters) or ""
        assert reason.startswith(f"{name} commit") and f"skip_subjects.{name}" in reason, (subject, reason)
    for subject in ACCEPTED:
        assert skip_reason(_commit(subject), filters) is None, subject
    # a runtime TypeError fixed is a fix, and a fix in a package named like a scope is one too
    assert skip_reason(_commit("fix: type error when the cache is None"), filters) is None
    assert skip_reason(_commit("✨ feat(cache): typed keys"), filters) is None
    # the subject line only: a body that mentions performance does not make a fix a performance commit
    assert skip_reason(_commit("Fix the off-by-one in wait_chain\n\nNo performance impact."), filters) is None
    off = HistoryFilters.model_validate({"skip_subjects": {}})
    assert all(skip_reason(_commit(s), off) is None for s in REJECTED)


def test_a_subject_pattern_that_does_not_compile_is_a_reject_naming_the_field(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "initial", {"m.py": "x = 1\n"}, 0)
    cfg = tmp_path / "h" / "history.yaml"
    cfg.parent.mkdir()
    cfg.write_text(f"repository: {repo}\nfilters: {{skip_subjects: {{perf: '('}}}}\n")
    [problem] = load_history_source(cfg).rejects
    assert problem.field == "filters.skip_subjects" and "perf: " in problem.reason
    assert "regular expression" in problem.reason


DELETE_ONLY = """diff --git a/profiler/test_for_profiler.py b/profiler/test_for_profiler.py
deleted file mode 100644
--- a/profiler/test_for_profiler.py
+++ /dev/null
@@ -1,3 +0,0 @@
-def test_x():
-    assert True
-
diff --git a/tests/test_cached.py b/tests/test_cached.py
--- a/tests/test_cached.py
+++ b/tests/test_cached.py
@@ -10,4 +10,0 @@
-    def test_info_positional(self):
-        self.assertEqual(1, 1)
"""


def test_a_test_change_that_only_removes_tests_is_recognised_but_unskipping_one_is_not():
    assert only_removes_tests(DELETE_ONLY)
    assert not only_removes_tests(DELETE_ONLY + "@@ -20,0 +20,1 @@\n+    assert x\n")
    unskip = DELETE_ONLY.replace(
        "-    def test_info_positional", "-    @pytest.mark.xfail\n-    def test_info_positional"
    )
    assert not only_removes_tests(unskip)
    importorskip = DELETE_ONLY.replace("-        self.assertEqual(1, 1)", '-        pytest.importorskip("zstd")')
    assert not only_removes_tests(importorskip)
    assert not only_removes_tests("")


def _reader(before: dict[str, str], after: dict[str, str]):
    return lambda side, path: (before if side == "old" else after).get(path)


def test_annotation_docstring_and_format_changes_are_behaviour_neutral_a_real_change_is_not():
    old = 'def f(a, b=1):\n    """Add."""\n    return a + b  # sum\n\nX = 1\n'
    typed = (
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING, cast\n\nif TYPE_CHECKING:\n"
        '    from os import PathLike\n\n\ndef f(a: int, b: int = 1) -> int:\n    """Add two numbers."""\n'
        "    return cast(int, a + b)\n\n\nX: int = 1\nY: str\n"
    )
    assert behaviour_neutral(["pkg/m.py"], _reader({"pkg/m.py": old}, {"pkg/m.py": typed}))
    assert not behaviour_neutral(["pkg/m.py"], _reader({"pkg/m.py": old}, {"pkg/m.py": old.replace("+ b", "- b")}))
    assert not behaviour_neutral(["pkg/new.py"], _reader({}, {"pkg/new.py": old}))
    assert not behaviour_neutral(["pkg/data.json"], _reader({"pkg/data.json": "1"}, {"pkg/data.json": "1 "}))
    assert not behaviour_neutral(["pkg/m.py"], _reader({"pkg/m.py": old}, {"pkg/m.py": "def f(:\n"}))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "proj"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "x")
    commit(
        repo,
        "initial",
        {
            "pkg/m.py": "def f(a, b):\n    return a + b\n",
            "pyproject.toml": "[project]\n",
            "tests/test_m.py": "from pkg.m import f\n\n\ndef test_f():\n    assert f(1, 2) == 3\n\n\n"
            "def test_old():\n    assert f(0, 0) == 0\n",
        },
        0,
    )
    return repo


def test_the_change_filters_skip_by_diff_shape_with_their_reasons(repo, tmp_path):
    tests = (repo / "tests/test_m.py").read_text()
    shas = {
        "tooling": commit(
            repo,
            "Add a benchmark",
            {
                "benchmarks/bench.py": "import pkg\n",
                "pyproject.toml": "[x]\n",
                "tests/test_m.py": tests + "\n\ndef test_b():\n    pass\n",
            },
            1,
        ),
        "removal": commit(
            repo, "Retire the zero check", {"pkg/m.py": "def f(a, b):\n    return b + a\n", "tests/test_m.py": tests}, 2
        ),
        "typed": commit(
            repo,
            "Annotate f",
            {
                "pkg/m.py": "def f(a: int, b: int) -> int:\n    return b + a\n",
                "tests/test_m.py": tests + "\n\ndef test_c() -> None:\n    pass\n",
            },
            3,
        ),
        "fix": commit(
            repo,
            "Make f subtract as documented",
            {
                "pkg/m.py": "def f(a: int, b: int) -> int:\n    return a - b\n",
                "tests/test_m.py": tests.replace("== 3", "== -1") + "\n\ndef test_c() -> None:\n    pass\n",
            },
            4,
        ),
    }
    # the removal commit: its test file is the initial one again after test_b was added
    cfg = tmp_path / "h" / "history.yaml"
    cfg.parent.mkdir()
    cfg.write_text(f"repository: {repo}\nproject: proj\n")
    result = load_history_source(cfg)
    assert [c.metadata["fix_commit"] for c in result.candidates] == [shas["fix"]]
    skipped = {p.source.rsplit(":", 1)[1]: p.reason for p in result.skipped}
    assert skipped[shas["tooling"][:12]].startswith("tooling only")
    assert skipped[shas["removal"][:12]].startswith("its test change only removes tests")
    assert skipped[shas["typed"][:12]].startswith("behaviour-neutral package change")
    cfg.write_text(
        f"repository: {repo}\nproject: proj\nfilters: {{skip_test_removals: false, "
        "skip_neutral_changes: false, tooling_files: []}\n"
    )
    assert len(load_history_source(cfg).candidates) == 4
