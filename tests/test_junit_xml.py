"""JUnit XML that its consumers accept: under pytest's default ``junit_family`` (xunit2) the file
validates against the schema pytest's own tests check xunit2 against (tests/data/junit-10.xsd,
whose test cases have no properties), and the figures are the test suite's properties; under
xunit1 they stay the test case's own, as record_property writes them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SCHEMA = Path(__file__).with_name("data") / "junit-10.xsd"

SUITE = """
from pytest_mig.measure import Metric


def test_rate(mig_bench):
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0], kind="compute"))


def test_broken(mig_bench):
    mig_bench.record(Metric("step_time_s", 0.25, "s", "lower", [0.25, 0.26], kind="training"))
    assert False, "the workload's check failed"
"""


@pytest.fixture(scope="module")
def xunit2_schema():
    xmlschema = pytest.importorskip("xmlschema", reason="xmlschema is not installed (pip install -e '.[test]')")
    return xmlschema.XMLSchema(str(SCHEMA))


def _run(pytester: pytest.Pytester, *args: str) -> ET.Element:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "no:randomly", "--mig-results", "none", "--junitxml=junit.xml", *args)
    result.assert_outcomes(passed=1, failed=1)
    assert "is incompatible with junit_family" not in result.stdout.str()
    return ET.parse(pytester.path / "junit.xml").getroot()


def _properties(element: ET.Element | None) -> dict[str, str]:
    return {} if element is None else {p.get("name"): p.get("value") for p in element.iter("property")}


def test_xunit2_validates_against_pytests_schema_with_the_figures_on_the_suite(pytester, xunit2_schema):
    root = _run(pytester)
    errors = [str(e.reason) for e in xunit2_schema.iter_errors(str(pytester.path / "junit.xml"))]
    assert errors == []
    suite = root.find("testsuite")
    assert all(case.find("properties") is None for case in suite.iter("testcase"))
    props = _properties(suite.find("properties"))
    assert props["test_suite.py::test_rate::rate"] == "100.0"
    assert props["test_suite.py::test_rate::rate.unit"] == "items/s"
    assert props["test_suite.py::test_rate::mig.profile"] == "cpu"
    assert suite.find("testcase[@name='test_broken']/failure") is not None


def test_the_schema_check_finds_per_test_properties(pytester, xunit2_schema):
    """What xunit2 refuses, so the validation above could fail: a test case's own properties."""
    root = _run(pytester, "-o", "junit_family=xunit1")
    errors = [str(e.reason) for e in xunit2_schema.iter_errors(str(pytester.path / "junit.xml"))]
    assert any("properties" in e for e in errors), errors
    (rate,) = [c for c in root.iter("testcase") if c.get("name") == "test_rate"]
    assert _properties(rate)["rate"] == "100.0" and _properties(rate)["rate.unit"] == "items/s"
    assert _properties(root.find("testsuite").find("properties")) == {}
