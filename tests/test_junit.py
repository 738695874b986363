"""JUnit parsing: node ids are reconstructed and anything but an explicit pass is not a pass."""

from envforge.verify.junit import ReportError, parse_junit

import pytest

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="6">
  <testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" line="1" time="0.001"/>
  <testcase classname="tests.test_a" name="test_bad" file="tests/test_a.py" line="4">
    <failure message="assert 1 == 2">boom</failure></testcase>
  <testcase classname="tests.test_a.TestGroup" name="test_param[2-3]" file="tests/test_a.py" line="9"/>
  <testcase classname="tests.test_a" name="test_skip" file="tests/test_a.py" line="12">
    <skipped message="skip"/></testcase>
  <testcase classname="tests.test_a" name="test_err" file="tests/test_a.py" line="15">
    <error message="fixture failed"/></testcase>
  <testcase classname="tests.test_a" name="test_ok" file="tests/test_a.py" line="1">
    <error message="teardown failed"/></testcase>
</testsuite></testsuites>"""


def test_statuses_and_node_ids():
    statuses = parse_junit(REPORT)
    assert statuses == {
        "tests/test_a.py::test_ok": "error",  # its teardown error is kept over the earlier pass
        "tests/test_a.py::test_bad": "failed",
        "tests/test_a.py::TestGroup::test_param[2-3]": "passed",
        "tests/test_a.py::test_skip": "skipped",
        "tests/test_a.py::test_err": "error",
    }


@pytest.mark.parametrize("text", ["not xml", "<html></html>"])
def test_unreadable_reports_raise(text):
    with pytest.raises(ReportError):
        parse_junit(text)
