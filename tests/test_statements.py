"""Task statements: cleaning, leak and underspecification rules, the deterministic repair and the
ingest policy (no Docker here; the derivation that records failure messages is in test_derive.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envforge.quality.statement_policy import apply_statement_policy
from envforge.quality.statements import (_IDENT, StatementContext, added_identifiers, check_statement,
                                         clean_statement, hidden_test_names, interface_identifiers, leak_findings,
                                         missing_interface, repair_statement, used_by_tests)
from envforge.stages.configs import IngestConfig
from envforge.task import Task, TaskSpec
from envforge.verify.parsers import parse_failure_messages, parse_report

REFERENCE = """diff --git a/shellargs.py b/shellargs.py
--- a/shellargs.py
+++ b/shellargs.py
@@ -1,7 +1,7 @@
 import shlex
 
-def args2sh(args):
-    return " ".join(shlex.quote(a) for a in args)
+def args2sh(args, sep=" "):
+    return sep.join(shlex.quote(a) for a in args)
 
-def args2cmd(args):
-    return " ".join(args)
+def args2cmd(args, sep=" "):
+    return sep.join(args)
"""
TESTS = """diff --git a/tests/test_sep.py b/tests/test_sep.py
new file mode 100644
--- /dev/null
+++ b/tests/test_sep.py
@@ -0,0 +1,6 @@
+from shellargs import args2cmd, args2sh
+def test_args2sh_sep():
+    assert args2sh(["a", "b"], sep=";") == "a;b"
+
+def test_args2cmd_sep():
+    assert args2cmd(["a", "b"], sep=";") == "a;b"
"""
WORKSPACE = [("shellargs.py", "import shlex\n\ndef args2sh(args):\n    return ' '.join(shlex.quote(a) for a in args)\n\n"
                              "def args2cmd(args):\n    return ' '.join(args)\n")]
FAILURE = "TypeError: args2sh() got an unexpected keyword argument 'sep'"


def context(kind: str = "ticket", messages: tuple = ()) -> StatementContext:
    text = "\n".join(body for _, body in WORKSPACE)
    return StatementContext(kind=kind, reference_patch=REFERENCE, test_patch=TESTS,
                            fail_to_pass=("tests/test_sep.py::test_args2sh_sep", "tests/test_sep.py::test_args2cmd_sep"),
                            failure_messages=messages, existing_identifiers=frozenset(_IDENT.findall(text)),
                            existing_text=text)


def rules(findings) -> set[str]:
    return {f.rule for f in findings}


# A feature commit: `safe_div` (and its `default=` keyword) is what the hidden tests call; `_nonzero` is a helper
# they never see, and `n` / `key` are short and prose-like parameters of a second change.
FEATURE = '''diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,14 @@
 def div(a, b):
     return a / b
 
-def pad(text):
-    return text + " "
+def pad(text, n=1, key=None):
+    text = key(text) if key else text
+    return text + " " * n
+
+def _nonzero(b):
+    return b != 0
+
+def safe_div(a, b, default=None):
+    """Divide, or return the default when the divisor is zero: a separator of cases."""
+    return a / b if _nonzero(b) else default
'''
FEATURE_TESTS = """diff --git a/tests/test_safe.py b/tests/test_safe.py
new file mode 100644
--- /dev/null
+++ b/tests/test_safe.py
@@ -0,0 +1,9 @@
+import calc
+from calc import safe_div
+
+def test_safe_div_by_zero():
+    \"\"\"The helper must not raise on zero
+    (a _nonzero check, say).\"\"\"
+    assert safe_div(1, 0, default=0) == 0
+    assert getattr(calc, "safe_div")(4, 2) == 2  # pad would not do
+    assert calc.pad("a", n=2) == "a  ", "pad is wrong"
"""
FEATURE_WORKSPACE = "def div(a, b):\n    return a / b\n\ndef pad(text):\n    return text + ' '\n"
IMPORT_FAILURE = "ImportError: cannot import name 'safe_div' from 'calc' (/repo/calc.py)"


def feature(kind: str = "history", messages: tuple = ()) -> StatementContext:
    return StatementContext(kind=kind, reference_patch=FEATURE, test_patch=FEATURE_TESTS,
                            fail_to_pass=("tests/test_safe.py::test_safe_div_by_zero",), failure_messages=messages,
                            existing_identifiers=frozenset(_IDENT.findall(FEATURE_WORKSPACE)),
                            existing_text=FEATURE_WORKSPACE)


def test_cleaning_removes_trailers_references_and_the_ticket_prefix():
    text = ("Ticket c-3: fix(args): quote arguments on Windows (#526)\n\nThe joined command line is wrong for "
            "arguments with spaces. See #12 and https://github.com/o/r/pull/527 for the discussion.\n\n"
            "Fixes #526\nCo-authored-by: Dev <dev@example.com>\nSigned-off-by: Dev <dev@example.com>")
    cleaned, removed = clean_statement(text, "ticket")
    assert cleaned.startswith("quote arguments on Windows")
    for gone in ("#526", "#12", "Co-authored-by", "Signed-off-by", "github.com", "Ticket c-3", "fix(args)"):
        assert gone not in cleaned
    assert "Fixes #526" in removed and any(r.startswith("Co-authored-by") for r in removed)
    # a hand-written spec keeps its first words: only commit-derived kinds lose prefixes
    assert clean_statement("fix: the parser", "spec")[0] == "fix: the parser"


def test_hidden_test_names_and_new_test_files_are_leaks():
    findings = leak_findings("Adds test_args2sh_sep in tests/test_sep.py.", context())
    assert {("leak.test_name", "test_args2sh_sep"), ("leak.test_file", "tests/test_sep.py")} <= \
        {(f.rule, f.evidence) for f in findings}
    assert "test_args2sh_sep" in hidden_test_names(context())


def test_identifiers_only_the_reference_adds_leak_but_the_problems_vocabulary_does_not():
    assert added_identifiers(REFERENCE, context().existing_identifiers) == {"sep"}
    # `sep` is the interface (the hidden tests pass `sep=`), so naming it is no added_identifier leak; telling how to
    # use it is still a solution step
    assert interface_identifiers(context()) == {"sep"}
    assert rules(leak_findings("Use sep in both.", context())) == {"leak.solution_step"}
    # names that exist before the fix describe the problem: not a leak
    assert leak_findings("`args2sh` joins its arguments with a space; the output is wrong on Windows.", context()) == []


def test_the_interface_is_what_the_reference_adds_and_the_hidden_tests_use():
    """Calls, imports, keywords and whole-string names count; words of a docstring, a comment or a message do not."""
    assert {"safe_div", "default", "calc", "pad", "getattr", "n"} <= used_by_tests(FEATURE_TESTS)
    assert not {"_nonzero", "helper", "wrong", "would"} & used_by_tests(FEATURE_TESTS)
    assert interface_identifiers(feature()) == {"safe_div", "default"}
    assert interface_identifiers(StatementContext(reference_patch=FEATURE)) == set()  # no tests: no interface


def test_a_feature_statement_naming_its_interface_is_no_leak():
    for text in ("Add `safe_div(a, b, default)` that returns the default instead of raising when b is zero.",
                 "Implement safe_div: dividing by zero must give the default value.",
                 "`safe_div` should accept a `default` keyword for a zero divisor."):
        assert leak_findings(text, feature()) == [], text


def test_internals_and_how_to_steps_still_leak():
    """A helper the tests never call is how the reference was written; an instruction that says how to use even
    an interface name is a step of the fix."""
    text = "Add `safe_div()` using a `_nonzero` helper."
    assert {(f.rule, f.evidence) for f in leak_findings(text, feature())} >= {
        ("leak.added_identifier", "_nonzero"), ("leak.solution_step", text)}
    assert "leak.solution_step" in rules(leak_findings("Call _nonzero(b) instead of comparing.", feature()))
    assert "leak.solution_step" in rules(leak_findings("Use default in safe_div.", feature()))
    assert "leak.solution_step" in rules(leak_findings("Use sep in both.", context("history")))


def test_short_and_prose_like_parameters_are_seen_when_the_sentence_names_them_as_code():
    for text in ("Use n in both.", "Pass key=str.upper too.", "Use `key` first.", "Call key() on it first."):
        assert "leak.solution_step" in rules(leak_findings(text, feature())), text
    # the same words as English: no step named ("a" and "key" are code in the reference too)
    for text in ("Use a separator in both.", "Use the key of the record to sort the output.",
                 "Add padding, e.g. for tables; the result is wrong when it is too short."):
        assert leak_findings(text, feature()) == [], text
        assert leak_findings(text, context("history")) == [], text


def test_add_a_test_instructions_and_reference_lines_are_leaks():
    assert "leak.add_test" in rules(leak_findings("Quote the args. Add a regression test.", context()))
    assert "leak.add_test" in rules(leak_findings("Fixed, with tests added for both helpers.", context()))
    assert "leak.patch_line" in rules(leak_findings("Write it as return sep.join(shlex.quote(a) for a in args)",
                                                    context()))
    assert "leak.add_test" not in rules(leak_findings("The test suite runner hangs on Windows.", context()))


def test_underspecified_statements_are_found():
    assert rules(check_statement("TOML 1.1: Make seconds optional in Date-Time and Time", context())) >= \
        {"underspecified.bare_title", "underspecified.no_behaviour"}
    assert "underspecified.too_short" in rules(check_statement("Fix it", context("spec")))
    report = ("Calling args2sh with a list containing an argument with spaces gives the wrong command line: "
              "the argument is not quoted for cmd.exe, so Windows sees two arguments instead of one.")
    assert check_statement(report, context()) == []


def test_a_leaking_commit_message_is_repaired_and_what_it_shows_does_not_hand_over_the_fix():
    text = ("Ticket c-3: Allow a separator in args2sh\n\nUse sep in both. Adds test_args2sh_sep and "
            "test_args2cmd_sep.\n\nCo-authored-by: X <x@example.com>")
    check = repair_statement(text, context(messages=(("tests/test_sep.py::test_args2sh_sep", FAILURE),)))
    assert check.verdict == "repaired", check
    assert "test_args2sh_sep" not in check.statement and "Use sep" not in check.statement
    assert "Co-authored-by" not in check.statement
    assert FAILURE in check.statement  # the observed failure, as a reporter would quote it
    assert leak_findings(check.statement, context()) == []  # measured: the repair shows no leak
    assert {"leak.test_name", "leak.solution_step"} <= rules(check.repaired)


def test_failure_messages_are_masked_and_dropped_when_they_would_leak():
    leaky = ("tests/test_sep.py::test_args2sh_sep", "AssertionError: test_args2sh_sep expected "
                                                    "return sep.join(shlex.quote(a) for a in args)")
    check = repair_statement("Ticket 9: args2sh separator", context(messages=(leaky,)))
    assert "return sep.join" not in check.statement
    assert check.verdict == "flagged"  # nothing safe to show: still a bare title


def test_a_thin_feature_statement_is_repaired_with_the_names_the_tests_found_missing():
    check = repair_statement("✨ feat: add safe_div", feature(messages=(("tests/test_safe.py::test_safe_div_by_zero",
                                                                        IMPORT_FAILURE),)))
    assert check.verdict == "repaired" and not check.findings, check
    assert check.statement.startswith("add safe_div.\n\n`calc.safe_div` does not exist.\n\nObserved behaviour:")
    assert IMPORT_FAILURE in check.statement and check.added_failures == 1
    assert leak_findings(check.statement, feature()) == []  # the interface is no leak: the repair stands
    # a leaking sentence goes, the missing name is still said; an attribute error reads the same
    attribute = "AttributeError: module 'calc' has no attribute 'safe_div'"
    check = repair_statement("Commit 0123456789ab: :sparkles: Add safe_div. Call _nonzero(b) first.",
                             feature(messages=(("tests/test_safe.py::test_safe_div_by_zero", attribute),)))
    assert check.verdict == "repaired" and "_nonzero" not in check.statement, check
    assert "`calc.safe_div` does not exist." in check.statement and "leak.solution_step" in rules(check.repaired)


def test_only_interface_names_are_described_as_missing():
    messages = (("a", "ModuleNotFoundError: No module named 'dateutil.parser'"),
                ("b", "AttributeError: module 'calc' has no attribute '_nonzero'"),
                ("c", "TypeError: safe_div() got an unexpected keyword argument 'default'"),
                ("d", IMPORT_FAILURE), ("e", IMPORT_FAILURE))
    assert missing_interface(feature(messages=messages)) == ["`safe_div()` takes no `default` argument.",
                                                             "`calc.safe_div` does not exist."]
    assert missing_interface(context(messages=(("t", FAILURE),))) == ["`args2sh()` takes no `sep` argument."]


def test_gitmoji_are_cleaned_from_commit_subjects():
    for subject in (":bug: Fix x", "🐛 Fix x", ":sparkles: fix: Fix x", "✨ feat(cli)!: Fix x", "fix: 🐛 Fix x",
                    "Commit 0123456789ab: 🧑‍💻 Fix x", "⚡️ Fix x"):
        cleaned, removed = clean_statement(subject, "history")
        assert cleaned == "Fix x" and removed, subject
    assert clean_statement(":bug: Fix x", "spec")[0] == ":bug: Fix x"  # an author's text keeps its words
    assert clean_statement("Fix x: y", "history")[0] == "Fix x: y"


def test_a_good_report_is_left_alone():
    report = ("`args2sh([\"a b\"])` returns `'a b'` quoted for POSIX shells, but on Windows the command line is "
              "split at the space: the result should keep the argument whole.")
    check = repair_statement(report, context("swebench"))
    assert check.verdict == "ok" and check.statement == report and not check.findings


def task(instruction: str, source: str = "ticket") -> Task:
    spec = TaskSpec.model_validate({
        "id": "shellargs-c-3", "source": source, "instruction": instruction,
        "environment": {"image": "base"},
        "verification": {"tests": {"command": "python3 -m pytest", "fail_to_pass": list(context().fail_to_pass)}},
        "reference_solution": {"patch": "<inline>"},
        "metadata": {"failure_messages": {"tests/test_sep.py::test_args2sh_sep": FAILURE}}})
    t = Task(spec=spec, origin="tickets.yaml:3", base_dir="/nonexistent", reference_patch=REFERENCE,
             test_patch=TESTS)
    return t.model_copy(update={"content_hash": t.compute_content_hash()})


class _Reader:
    def files(self, task):
        return WORKSPACE, None


LEAKY = "Ticket c-3: Allow a separator in args2sh\n\nUse sep in both. Adds test_args2sh_sep."
THIN = "Ticket c-4: args2sh separator"


def test_policy_flag_keeps_the_task_repaired_with_its_verdict_and_original():
    out = apply_statement_policy([task(LEAKY)], "flag", reader=_Reader())
    [kept] = out.tasks
    record = kept.spec.metadata["statement"]
    assert record["verdict"] == "repaired" and record["original"] == LEAKY
    assert "test_args2sh_sep" not in kept.spec.instruction
    assert kept.content_hash == kept.compute_content_hash() != task(LEAKY).content_hash
    assert out.summary.verdicts == {"repaired": 1} and out.rejects == []


def test_policy_strict_keeps_a_still_flagged_statement_out_as_a_reject_naming_the_field():
    without_messages = task(THIN).spec.model_copy(update={"metadata": {}})
    thin = task(THIN).model_copy(update={"spec": without_messages})
    out = apply_statement_policy([thin, task(LEAKY)], "strict", reader=_Reader())
    assert [t.id for t in out.tasks] == ["shellargs-c-3"]  # the repaired one goes through
    [problem] = out.rejects
    assert problem.source == "tickets.yaml:3" and problem.field == "instruction"
    assert "underspecified.bare_title" in problem.reason and "strict" in problem.reason


def test_policy_off_changes_nothing():
    original = task(LEAKY)
    out = apply_statement_policy([original], "off")
    assert out.tasks == [original] and out.summary.checked == 0


def test_the_ingest_config_names_the_policies():
    assert IngestConfig().statements == "flag"
    with pytest.raises(ValueError, match="IngestConfig.statements"):
        IngestConfig(statements="lenient")


def test_the_report_carries_failure_messages_beside_the_statuses():
    report = ('{"id": "t.py::test_a", "status": "failed", "message": "AssertionError: assert 1 == 2"}\n'
              '{"id": "t.py::test_b", "status": "passed"}\n{"finished": true, "exitstatus": 1}\n')
    assert parse_report(report)[0] == {"t.py::test_a": "failed", "t.py::test_b": "passed"}
    assert parse_failure_messages(report) == {"t.py::test_a": "AssertionError: assert 1 == 2"}


def test_bundled_statements_raise_no_false_alarms():
    """Every bundled spec, runbook and SWE-bench statement is a fair report: none is flagged."""
    from envforge.sources import load_by_source, scan_sources

    root = Path(__file__).resolve().parents[1] / "task_sources"
    loaded, _ = load_by_source([root / "specs", root / "runbooks", root / "projects"],
                               scan_sources([root / "specs", root / "runbooks", root / "projects"]))
    tasks = [t for _, res in loaded for t in res.tasks]
    assert len(tasks) >= 10
    out = apply_statement_policy(tasks, "flag")
    assert set(out.summary.verdicts) == {"ok"}, {i: c.findings for i, c in out.checks.items() if c.findings}


def test_a_repair_never_leaves_less_than_a_statement():
    """A commit subject that is all solution step ('add sep', say) and no failure to describe: the
    repair keeps the words there were, flagged, rather than an empty statement."""
    check = repair_statement("Ticket c-9: use sep", context(messages=()))
    assert check.verdict == "flagged" and len(check.statement) >= 10
    # Its verdict is the shown text's: when dropping the leaking sentence left nothing and the cleaned words
    # are shown after all, their leak is a finding (platformdirs' "✨ feat: add user_fonts_dir ...").
    check = repair_statement("Commit 0123456789ab: feat: `safe_div` uses `_nonzero` (#491)", feature(messages=()))
    assert check.verdict == "flagged" and check.statement == "`safe_div` uses `_nonzero`"
    assert rules(check.findings) >= {"leak.added_identifier"}, check.findings
    # naming only the interface is no leak: such a subject is flagged as thin, nothing else
    check = repair_statement("Ticket c-9: feat: `args2sh` takes `sep` (#491)", context(messages=()))
    assert check.verdict == "flagged" and check.statement == "`args2sh` takes `sep`"
    assert {f.rule.split(".")[0] for f in check.findings} == {"underspecified"}, check.findings
