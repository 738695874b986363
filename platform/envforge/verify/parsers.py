"""Turning a test run into per-test statuses, for every supported framework.

pytest (our reporter plugin) and unittest (our runner) write JSON lines to the report pipe,
which no file in the sandbox can replace; JUnit XML parsing is kept for importing results. TAP and line patterns are read from the test
command's stdout: the test binary's own output is trusted there (see docs/verification.md).
"""

from __future__ import annotations

import json
import re

from envforge.verify.junit import ReportError, TestStatus, parse_junit

_PASS = {"pass", "passed", "ok", "success", "succeeded"}
_SKIP = {"skip", "skipped", "todo"}
_WORSE = ["passed", "skipped", "failed", "error"]


def _merge(statuses: dict[str, TestStatus], test_id: str, status: TestStatus) -> None:
    old = statuses.get(test_id)
    if old is None or _WORSE.index(status) > _WORSE.index(old):
        statuses[test_id] = status


class ReportIncomplete(ReportError):
    """The run did not end normally (no closing line): nothing in it can be trusted."""


def parse_report_lines(text: str | bytes, require_finished: bool = True) -> dict[str, TestStatus]:
    """JSON lines from envforge's runners: {"id", "status"} per test, then {"finished": true}."""
    return parse_report(text, require_finished)[0]


def parse_report(text: str | bytes, require_finished: bool = True) -> tuple[dict[str, TestStatus], dict[str, str]]:
    """(status per test id, collection error message per collector) from a runner's JSON lines;
    collection errors are `{"collect_error": nodeid, "message": text}` lines."""
    statuses: dict[str, TestStatus] = {}
    collect_errors: dict[str, str] = {}
    raw = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    finished = False
    for n, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        if finished:
            raise ReportError(f"report line {n} comes after the closing line")
        try:
            rec = json.loads(line)
            if rec.get("finished") is True:
                finished = True
                continue
            if "collect_error" in rec:
                collect_errors[str(rec["collect_error"])] = str(rec.get("message", ""))[-4000:]
                continue
            test_id, status = str(rec["id"]), rec["status"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ReportError(f"report line {n} is not a JSON record") from None
        if status not in _WORSE:
            raise ReportError(f"report line {n}: unknown status {status!r}")
        _merge(statuses, test_id, status)
    if require_finished and not finished:
        raise ReportIncomplete("the test run did not finish normally (no closing line)")
    return statuses, collect_errors


def parse_failure_messages(text: str | bytes) -> dict[str, str]:
    """The one-line failure message of each failed test in a runner's JSON lines (`{"id", "status",
    "message"}`), for describing a task's observable failure; lines it cannot read are left to
    `parse_report`, which decides whether the report counts."""
    raw = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    messages: dict[str, str] = {}
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "id" in rec and isinstance(rec.get("message"), str):
            messages[str(rec["id"])] = rec["message"][:500]
    return messages


def error_summary(message: str, lines: int = 3) -> str:
    """The lines of a pytest failure that say what went wrong (`E   ModuleNotFoundError: ...`), else its first."""
    errors = [ln[1:].strip() for ln in message.splitlines() if ln.startswith("E ") and ln[1:].strip()]
    if not errors:
        errors = [ln.strip() for ln in message.splitlines() if ln.strip()][:1]
    return " | ".join(errors[:lines])[:400]


_TAP = re.compile(r"^(?P<ok>not ok|ok)\b\s*(?P<num>\d+)?\s*(?:-\s*)?(?P<desc>[^#]*?)\s*(?:#\s*(?P<directive>\S+).*)?$")


def parse_tap(text: str) -> dict[str, TestStatus]:
    """TAP: `ok 1 - name`, `not ok 2 - name`, `# SKIP` / `# TODO` directives. The id is the name."""
    statuses: dict[str, TestStatus] = {}
    for line in text.splitlines():
        m = _TAP.match(line.strip())
        if not m:
            continue
        test_id = m.group("desc").strip() or (m.group("num") or "")
        directive = (m.group("directive") or "").lower()
        if directive in _SKIP:
            status: TestStatus = "skipped"
        else:
            status = "passed" if m.group("ok") == "ok" else "failed"
        _merge(statuses, test_id, status)
    return statuses


def parse_pattern(text: str, pattern: str) -> dict[str, TestStatus]:
    """Each line matching `pattern` (named groups `id`, `status`) is one result."""
    rx = re.compile(pattern)
    statuses: dict[str, TestStatus] = {}
    for line in text.splitlines():
        m = rx.search(line)
        if not m:
            continue
        word = m.group("status").strip().lower()
        status: TestStatus = "passed" if word in _PASS else "skipped" if word in _SKIP else "failed"
        _merge(statuses, m.group("id").strip(), status)
    return statuses


__all__ = [
    "ReportError",
    "ReportIncomplete",
    "TestStatus",
    "error_summary",
    "parse_junit",
    "parse_report",
    "parse_report_lines",
    "parse_tap",
    "parse_pattern",
]
