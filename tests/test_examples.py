"""The example of a site's own benchmark (examples/own_benchmark) runs as README says, on the CPU, and
gets what the suite's tests get: a saved history, a verdict against it, the trend page and an export."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_mig import cli
from pytest_mig.store.results import read_results

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "own_benchmark"
TEST = "test_our_model.py::test_our_training_step"


def test_a_sites_own_benchmark_gets_history_verdicts_trend_and_exports(pytester: pytest.Pytester) -> None:
    shutil.copy(EXAMPLE / "test_our_model.py", pytester.path / "test_our_model.py")
    first = pytester.runpytest_subprocess("--mig-save-baseline", "--mig-results", "night1.json", "-p",
                                          "no:cacheprovider")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["baseline saved: *(2 figure(s) added to their history*"])
    (history,) = (pytester.path / "baselines").glob("*/*.json")
    runs = json.loads(history.read_text())["modes"]["normal"][TEST]["samples_per_s"]["runs"]
    assert len(runs) == 1 and runs[0]["value"] > 0

    second = pytester.runpytest_subprocess("--mig-results", "night2.json", "--mig-export", "prometheus=night.prom",
                                           "-p", "no:cacheprovider")
    assert second.ret in (0, 1)  # a CPU shared with other work may move past 10%: the verdict says so either way
    # no reference knows a site's own figures: 10% bands until their history measures their noise
    second.stdout.fnmatch_lines(["how sharp: 0 of 2 judged figure(s) gate within 5%; 2 judged at a wider band. "
                                 "The history holds 1 run(s): *"])
    verdicts = {r.metric.name: r.verdict for r in read_results(pytester.path / "night2.json")}
    for name in ("samples_per_s", "step_ms"):
        v = verdicts[name]
        assert v is not None and v.source == "baseline" and v.runs == 1
        assert v.outcome in ("pass", "regressed", "improved", "transient")
        assert v.baseline == pytest.approx(json.loads(history.read_text())["modes"]["normal"][TEST][name]
                                              ["runs"][0]["value"], rel=1e-5)
        assert v.tolerance == pytest.approx(0.10)  # the marker's tolerance
    assert 'test="test_our_model.py::test_our_training_step"' in (pytester.path / "night.prom").read_text()
    page = pytester.path / "trend.html"
    assert cli.main(["history", str(pytester.path / "night2.json"), "--baselines", str(pytester.path / "baselines"),
                     "--out", str(page)]) == 0
    assert "samples_per_s" in page.read_text()
