"""Verification pieces without Docker: protected-path filtering and report parsers."""

from __future__ import annotations

import pytest

from envforge.sources.specs import load_spec_file
from envforge.verify.parsers import ReportError, ReportIncomplete, parse_pattern, parse_report_lines, parse_tap
from envforge.verify.protect import filter_diff, matches, protected_globs, split_diff
from tests.conftest import BUNDLED_SPECS

DIFF = """diff --git a/inventory/stats.py b/inventory/stats.py
--- a/inventory/stats.py
+++ b/inventory/stats.py
@@ -1 +1 @@
-a
+b
diff --git a/tests/test_stats.py b/tests/test_stats.py
deleted file mode 100644
--- a/tests/test_stats.py
+++ /dev/null
@@ -1 +0,0 @@
-x
diff --git a/conftest.py b/conftest.py
new file mode 100644
--- /dev/null
+++ b/conftest.py
@@ -0,0 +1 @@
+import os
diff --git a/old.py b/tests/moved.py
similarity index 100%
rename from old.py
rename to tests/moved.py
"""


def test_glob_semantics():
    assert matches("conftest.py", ["**/conftest.py"]) and matches("a/b/conftest.py", ["**/conftest.py"])
    assert matches("pkg/tests/x.py", ["**/tests/**"]) and not matches("pkg/testsx/x.py", ["**/tests/**"])
    assert matches("lib/python.pth", ["**/*.pth"]) and not matches("lib/python.pthx", ["**/*.pth"])
    assert matches(".github/x", [".github/*"])  # a leading dot is part of the name


def test_filter_drops_protected_sections_including_renames():
    task = load_spec_file(BUNDLED_SPECS / "inventory-median-even" / "task.yaml")
    kept, touched = filter_diff(DIFF, protected_globs(task))
    assert [s.paths for s in split_diff(kept)] == [["inventory/stats.py"]]
    assert touched == ["conftest.py", "tests/moved.py", "tests/test_stats.py"]  # the whole rename is dropped


def test_report_lines_keep_the_worst_outcome_and_need_the_closing_line():
    text = '{"id": "t.A.test_x", "status": "passed"}\n{"id": "t.A.test_x", "status": "error"}\n' \
           '{"id": "t.A.test_y", "status": "skipped"}\n'
    assert parse_report_lines(text + '{"finished": true}\n') == {"t.A.test_x": "error", "t.A.test_y": "skipped"}
    with pytest.raises(ReportIncomplete):  # a run cut short (os._exit, crash) is not trusted
        parse_report_lines(text)
    with pytest.raises(ReportError):
        parse_report_lines('{"finished": true}\n{"id": "late", "status": "passed"}\n')
    with pytest.raises(ReportError):
        parse_report_lines("not json\n")


def test_hunkless_git_section_cannot_hide_a_protected_edit():
    sneaky = ("diff --git a/e b/e\nnew file mode 100644\nindex 0000000..e69de29\njunk\n"
              "--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1 @@\n-a\n+b\n"
              "diff --git a/.git/config b/.git/config\n--- a/.git/config\n+++ b/.git/config\n@@ -1 +1 @@\n-a\n+b\n")
    kept, touched = filter_diff(sneaky, ["**/tests/**"])
    assert "tests/test_x.py" in touched and ".git/config" in touched
    assert "tests/test_x.py" not in kept and ".git/config" not in kept


def test_tap_and_pattern():
    tap = "1..4\nok 1 - adds numbers\nnot ok 2 - divides\nok 3 - todo thing # TODO later\nok 4 - skipped # SKIP no db\n"
    assert parse_tap(tap) == {"adds numbers": "passed", "divides": "failed", "todo thing": "skipped",
                              "skipped": "skipped"}
    text = "--- PASS: TestAdd (0.00s)\n--- FAIL: TestDiv (0.01s)\nnoise\n"
    assert parse_pattern(text, r"--- (?P<status>PASS|FAIL): (?P<id>\S+)") == {"TestAdd": "passed", "TestDiv": "failed"}


def test_plain_unified_diffs_are_split_too():
    plain = ("--- a/x.py\t2026-01-01\n+++ b/x.py\t2026-01-02\n@@ -1 +1 @@\n-a\n+b\n"
             "--- tests/t.py\n+++ tests/t.py\n@@ -1 +1 @@\n-- removed line starting with dashes\n+c\n")
    sections = split_diff(plain)
    assert [s.paths for s in sections] == [["x.py"], ["tests/t.py"]]
    kept, touched = filter_diff(plain, ["**/tests/**"])
    assert touched == ["tests/t.py"] and kept.startswith("--- a/x.py") and "tests/t.py" not in kept
