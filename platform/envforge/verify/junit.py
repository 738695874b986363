"""Parse pytest's JUnit XML into per-test statuses keyed by pytest node ids.

The report is read, not the exit code: a test that is missing from the report, skipped or
errored is not a pass. pytest is run with junit_family=xunit1 so each case carries its
file, which makes node ids (`path/test_x.py::Class::test_name[param]`) reconstructible.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Literal

TestStatus = Literal["passed", "failed", "error", "skipped", "missing"]


class ReportError(ValueError):
    """The report file is not JUnit XML we can read."""


def _node_id(case: ET.Element) -> str:
    name = case.get("name", "")
    classname = case.get("classname", "")
    file = case.get("file")
    if file:
        module = file[:-3].replace("/", ".") if file.endswith(".py") else file
        rest = classname[len(module) :].lstrip(".") if classname.startswith(module) else ""
        parts = [file] + ([p for p in rest.split(".") if p] if rest else []) + [name]
        return "::".join(parts)
    # Without a file attribute, fall back to the dotted classname as a path guess.
    path = classname.replace(".", "/") + ".py"
    return f"{path}::{name}"


def parse_junit(xml_text: str | bytes) -> dict[str, TestStatus]:
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError as exc:
        raise ReportError(f"not valid XML: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(f"unexpected root element <{root.tag}>")
    statuses: dict[str, TestStatus] = {}
    for case in root.iter("testcase"):
        status: TestStatus = "passed"
        if case.find("error") is not None:
            status = "error"
        elif case.find("failure") is not None:
            status = "failed"
        elif case.find("skipped") is not None:
            status = "skipped"
        node = _node_id(case)
        # A node id seen twice (e.g. a teardown error) keeps the worst outcome.
        if statuses.get(node, "passed") == "passed":
            statuses[node] = status
    return statuses
