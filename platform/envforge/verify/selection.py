"""Which tests one grading runs, and in what order.

A task's verdict depends only on its FAIL_TO_PASS and PASS_TO_PASS ids, so a grading runs
the test files that hold them (`targeted`), as the SWE-bench harness does, instead of the
whole suite. A derivation runs the test files a change touches before any id is known
(`TestRun.files`); the whole suite (`suite`) is what it runs with `tests.pass_to_pass: suite`, and
what the gate's `--order-check suite` and `--full-suite` modes run.

For pytest, targeting is done inside the test process by envforge's reporter plugin: the
task's command runs as written (same rootdir, ini files and collection order as the whole
suite) and the plugin ignores every test file that holds no required id. No ids go on the
command line, so an unknown or odd id (parametrized with spaces, brackets, addresses) can
never abort the run: it is reported missing on its own. The order is changed by the same
plugin, after collection, so the files need not be listed either.

A grading whose only question is "does this solution score 0?" (a hack probe) can stop at
the first FAIL_TO_PASS test that does not pass: without partial credit the reward is 0 from
then on, whatever the other tests do. `fail_fast` asks the pytest plugin to run the
FAIL_TO_PASS tests first and to stop there; a solution that passes them all runs the rest as
usual. Only the order of the tests changes, so only an order-dependent test could give
another outcome (the order check catches those for the reference). This is what makes a
probe cheap when the task's own test file is the slow one.

A mutant's grading may run only some of the required ids (`ids`): the FAIL_TO_PASS tests and the
PASS_TO_PASS tests that call the function the mutant changes (covering.py). The plugin deselects
every other test of the files, and only those ids are judged: the others run the reference's code
exactly, so they pass as they did for it. `trace` asks the plugin to record, per test, which
functions of those source files the test calls (the one traced grading that selection rests on).

unittest graders load the required ids (targeted) or discover every test (suite); tap and
pattern commands are run as written, so for them both scopes run whatever the command runs,
and `fail_fast` changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Literal

from envforge.task import TestCheckpoint

Scope = Literal["targeted", "suite"]
Order = Literal["default", "reverse"]

# Read (and removed from the environment) by the reporter plugin before any workspace code runs.
FILES_ENV = "ENVFORGE_TEST_FILES"
ORDER_ENV = "ENVFORGE_TEST_ORDER"
FAIL_FAST_ENV = "ENVFORGE_FAIL_FAST"
IDS_ENV = "ENVFORGE_TEST_IDS"
TRACE_ENV = "ENVFORGE_TRACE_CALLS"
# Where the plugin writes what a traced run called (read back by the grader before the sandbox is reset).
TRACE_OUT = "/tmp/.envforge-calls.json"
# Ids travel in one environment variable: past this size (Linux refuses one over 128 KiB), fail
# fast is left off and the grading runs in full, as it would without it (and `ids` runs their files in
# full: the other tests run too, and only the ids are judged).
FAIL_FAST_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class TestRun:
    """What a grading runs: the verdict-deciding test files or the whole suite, in collection
    order or reversed; with `fail_fast`, FAIL_TO_PASS first, stopping at the first that fails.

    `fresh_interpreter`: the test command starts a new interpreter even where it could be a fork of
    a preloaded one (sandbox/forkserver.py). Forks of one server share the string hash seed and the
    memory layout, so runs compared to see what varies between runs (the gate's flakiness runs, the
    derivation's suite runs) start fresh.

    Reversed is the order check's permutation: it runs every pair of tests in the opposite
    order from the default, so a test that passes only when another one has (or has not)
    run before it fails in one of the two orders; a random shuffle gives no such guarantee.
    """

    __test__ = False  # not a pytest test class, whatever its name

    scope: Scope = "targeted"
    order: Order = "default"
    fail_fast: bool = False
    fresh_interpreter: bool = False
    # A targeted pytest run over these files instead of those holding the check's ids: a derivation
    # runs the test files a change touches before it knows any id (sources/derive.py).
    files: tuple[str, ...] = ()
    # Only these of the check's ids run and are judged (a mutant's covering tests, covering.py).
    ids: tuple[str, ...] = ()
    # Absolute paths of source files whose functions' calls the plugin records per test (TRACE_OUT).
    trace: tuple[str, ...] = ()

    def without_fail_fast(self) -> "TestRun":
        """The same run in full: its graded copy answers every question a fail-fast one does."""
        return replace(self, fail_fast=False)


TARGETED = TestRun()
SUITE = TestRun("suite")


def target_files(check: TestCheckpoint) -> list[str]:
    """The pytest files holding the check's required ids (sorted, each once)."""
    return sorted({test_id.split("::", 1)[0] for test_id in check.ids})


def selection_env(check: TestCheckpoint, run: TestRun) -> dict[str, str]:
    """Environment for the test command: what envforge's pytest plugin collects, and the order its
    pytest plugin or unittest runner runs the tests in."""
    env: dict[str, str] = {}
    if check.framework == "pytest" and run.scope == "targeted":
        files = run.files or (sorted({i.split("::", 1)[0] for i in run.ids}) if run.ids else target_files(check))
        env[FILES_ENV] = json.dumps(sorted(set(files)))
    if check.framework == "pytest" and run.ids:
        only = json.dumps(sorted(set(run.ids)))
        if len(only.encode()) <= FAIL_FAST_MAX_BYTES:
            env[IDS_ENV] = only
    if check.framework == "pytest" and run.trace:
        env[TRACE_ENV] = json.dumps({"files": sorted(set(run.trace)), "out": TRACE_OUT})
    if check.framework in ("pytest", "unittest") and run.order != "default":
        env[ORDER_ENV] = run.order
    if check.framework == "pytest" and run.fail_fast:
        first = json.dumps(list(check.fail_to_pass))
        if len(first.encode()) <= FAIL_FAST_MAX_BYTES:
            env[FAIL_FAST_ENV] = first
    return env


def judged_ids(check: TestCheckpoint, run: TestRun) -> list[str]:
    """The required ids a run reports on: the check's, or those of them the run selects (`ids`)."""
    if not run.ids:
        return list(check.ids)
    selected = set(run.ids)
    return [i for i in check.ids if i in selected]


def unittest_ids(check: TestCheckpoint, run: TestRun) -> list[str]:
    """The ids a unittest run loads (none for a suite run: the runner discovers every test)."""
    return [] if run.scope == "suite" else judged_ids(check, run)
