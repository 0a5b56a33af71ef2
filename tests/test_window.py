"""--mig-window: a night that fits its maintenance window, the stalest tests first, the rest named and
run first the next night; a test that would end outside the window skipped with the reason."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import pytest
from test_verdict_flow import h200  # noqa: F401

from pytest_mig.night.calibrate import check_pytest_args
from pytest_mig.store.results import read_results_file
from pytest_mig.night.nights import last_runs
from pytest_mig.night.window import Guard, merge_meta, parse_window, plan

SUITE = '''
import os
import time

from pytest_mig.measure import Metric


def _figure(mig_bench, name):
    time.sleep(float(os.environ.get("SLEEP_" + name.upper(), "0")))
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0] * 3, kind="compute"))


def test_gemm(mig_bench):
    _figure(mig_bench, "gemm")


def test_stream(mig_bench):
    _figure(mig_bench, "stream")


def test_openmm(mig_bench):
    _figure(mig_bench, "openmm")


def test_not_a_benchmark():
    assert True
'''
IDS = [f"test_suite.py::test_{n}" for n in ("gemm", "stream", "openmm")]


@pytest.mark.parametrize("text, seconds", [("300", 300.0), ("300s", 300.0), ("5m", 300.0), ("5min", 300.0),
                                           ("1.5h", 5400.0), (" 90 s ", 90.0)])
def test_a_window_is_seconds_or_minutes_or_hours(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize("text", ["", "five minutes", "-3", "0", "0.5", "nan", "inf", "1e9", "5d", "5m30s"])
def test_a_window_that_is_not_a_length_of_time_is_one_sentence(text: str) -> None:
    with pytest.raises(ValueError, match=r"^'.*' is (not a length of time|shorter than a second)"):
        parse_window(text)


def test_the_stalest_tests_fit_first_and_run_in_the_suites_order() -> None:
    seconds = {"a": 60.0, "b": 120.0, "c": 90.0, "d": 30.0}
    when = {"a": 4.0, "b": 1.0, "c": 3.0, "d": 2.0}  # b ran longest ago, then d, c, a
    night = plan(["a", "b", "c", "d"], 250.0, seconds, when)
    assert night.run == ["b", "c", "d"]  # b, d, c fit (240 s), in the suite's order; a waits
    assert night.left == ["a"] and night.planned_s == 240.0 and not night.too_long
    assert night.message() == ("--mig-window 4 min 10 s: 3 test(s) run (about 4 min 00 s by their last times); "
                               "1 left for the next night, which runs them first: a")
    never = plan(["a", "b", "new"], 250.0, seconds, when)  # a test that never ran here goes first
    assert never.run == ["b", "new"] and never.guessed == ["new"] and never.seconds["new"] == 90.0  # the median


def test_a_test_longer_than_the_window_is_named_and_an_impossible_window_refused() -> None:
    night = plan(["a", "b"], 100.0, {"a": 60.0, "b": 400.0}, {})
    assert night.run == ["a"] and night.too_long == ["b"] and night.left == ["b"]
    assert "1 never fit (each took longer than the whole window; run them outside it or widen it): b (6 min 40 s)" \
        in (night.message() or "")
    with pytest.raises(ValueError, match=r"^--mig-window 30 s holds none of the 2 test\(s\): the shortest took 1 min"):
        plan(["a", "b"], 30.0, {"a": 60.0, "b": 400.0}, {})
    assert plan(["a", "b"], 1000.0, {"a": 60.0}, {}).message() is None  # everything fits: nothing to say


def test_over_nights_every_test_runs() -> None:
    """Six tests of 100 s, a window of 250 s: two a night, and each runs within three nights."""
    tests = [f"t{i}" for i in range(6)]
    seconds = dict.fromkeys(tests, 100.0)
    when: dict[str, float] = {}
    ran: dict[str, list[int]] = {t: [] for t in tests}
    for night_no in range(1, 7):
        night = plan(tests, 250.0, seconds, when)
        assert len(night.run) == 2
        for t in night.run:
            when[t] = float(night_no)
            ran[t].append(night_no)
    assert all(len(nights) == 2 and nights[1] - nights[0] == 3 for nights in ran.values())


def test_the_guard_skips_a_test_that_would_end_outside_the_window() -> None:
    guard = Guard(plan(["a", "b"], 100.0, {"a": 40.0, "b": 50.0}, {}), started=0.0)
    assert guard.reason("a", now=10.0) is None
    assert guard.reason("b", now=45.0) is None  # 45 + 50 <= 100
    reason = guard.reason("b", now=60.0)
    assert reason == ("--mig-window 1 min 40 s: 1 min 00 s spent and this test took 50 s the last time, so it would "
                      "end outside the window; the next night runs it first")
    assert guard.skipped == ["b"] and guard.plan.to_meta(guard.skipped) == {"seconds": 100.0, "left": ["b"]}
    assert guard.reason("a unit test", now=1e6) is None  # not a benchmark the plan counted
    assert guard.message() == ("--mig-window 1 min 40 s: 1 test(s) run (about 40 s by their last times); 1 skipped "
                               "while running, since each would have ended outside the window; the next night runs "
                               "them first: b")


def _results(path: Path, durations: dict[str, float], left: list[str] | None = None, age: float = 0.0,
             profile: str = "full", mode: str = "normal") -> None:
    """A results file of a night on a whole H200 (``profile``, ``mode``) that took ``durations``."""
    meta: dict = {"durations": durations}
    if left is not None:
        meta["window"] = {"seconds": 100, "left": left}
    record = {"test": "test_suite.py::test_gemm", "mode": mode,
              "metric": {"name": "rate", "value": 100.0, "unit": "items/s"},
              "target": {"gpu_slug": "nvidia-h200", "profile": profile, "baseline_profile": profile}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": "pytest-mig/results/1", "meta": meta, "records": [record]}))
    os.utime(path, (1_700_000_000 - age, 1_700_000_000 - age))


def test_last_runs_come_from_the_newest_results_files_and_skip_what_a_window_left_out(tmp_path: Path) -> None:
    _results(tmp_path / "old.json", {"a": 10.0, "b": 20.0, "c": 30.0}, age=200)
    _results(tmp_path / "new.json", {"a": 11.0, "b": 0.01}, left=["b"], age=100)
    (tmp_path / "broken.json").write_text('{"schema": "pytest-mig/results/1", "records": [], "records": []}')
    (tmp_path / "odd.json").write_text(json.dumps({"schema": "pytest-mig/results/1", "records": [],
                                                   "meta": {"durations": {"a": "fast", "b": True, "c": -1}}}))
    seconds, when = last_runs(tmp_path, current=tmp_path / "tonight.json")
    assert seconds == {"a": 10.5, "b": 20.0, "c": 30.0}  # b was skipped by the newest night: the older time counts
    assert when["a"] > when["b"] == when["c"]
    assert last_runs(None) == ({}, {}) and last_runs(tmp_path / "missing") == ({}, {})


def test_a_first_night_on_a_new_stack_does_not_make_the_next_nights_estimate_pessimistic(tmp_path: Path) -> None:
    for age, compiled in ((500, 40.0), (400, 41.0), (300, 38.0), (200, 216.0)):  # the newest compiled everything
        _results(tmp_path / f"night-{age}.json", {"compiled": compiled, "gemm": 55.0}, age=age)
    seconds, when = last_runs(tmp_path)
    assert seconds == {"compiled": 41.0, "gemm": 55.0}  # the median of the last three: 216, 38 and 41
    assert when["compiled"] == 1_700_000_000 - 200  # when it last ran is still the newest night
    _results(tmp_path / "night-100.json", {"compiled": 39.0}, age=100)
    assert last_runs(tmp_path)[0]["compiled"] == 39.0  # three warm nights out of the newest three files: 216 is gone


def test_a_nodes_results_keep_each_tests_longest_time_and_all_a_window_left_out() -> None:
    metas = [{"durations": {"a": 10.0, "b": 5.0}, "window": {"seconds": 300.0, "left": ["c"]}},
             {"durations": {"a": 12.5, "b": "slow", "c": float("nan")}, "window": {"seconds": 300.0, "left": ["b"]}},
             {"complete": False}]
    assert merge_meta(metas) == {"durations": {"a": 12.5, "b": 5.0}, "window": {"seconds": 300.0, "left": ["b", "c"]}}
    assert merge_meta([{}, {"durations": None}, {"durations": [1, 2]}, {"window": {"left": "x"}}]) == \
        {"window": {"seconds": None, "left": []}}


def test_only_nights_of_the_same_gpu_model_profile_and_mode_time_a_night(tmp_path: Path) -> None:
    _results(tmp_path / "full.json", {"a": 10.0}, age=300)
    _results(tmp_path / "quick.json", {"a": 3.0}, age=200, mode="quick")
    _results(tmp_path / "slice.json", {"a": 70.0}, age=100, profile="1g.18gb")
    (tmp_path / "empty.json").write_text(json.dumps({"schema": "pytest-mig/results/1", "records": [],
                                                     "meta": {"durations": {"a": 1.0}}}))
    assert last_runs(tmp_path, where=("nvidia-h200", "full", "normal"))[0] == {"a": 10.0}
    assert last_runs(tmp_path, where=("nvidia-h200", "full", "quick"))[0] == {"a": 3.0}
    assert last_runs(tmp_path, where=("nvidia-h200", None, "normal"))[0] == {"a": 40.0}  # a sweep: any profile (70, 10)
    assert last_runs(tmp_path, where=("nvidia-h100-80gb-hbm3", "full", "normal"))[0] == {}
    assert last_runs(tmp_path)[0] == {"a": 3.0}  # no Target given: the newest files, whatever they measured


def test_calibrate_refuses_a_window() -> None:
    with pytest.raises(ValueError, match="^--mig-window leaves tests out of a night, and each run here must run"):
        check_pytest_args(["benchmarks", "--mig-window=5m"])


@pytest.fixture
def suite(h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester) -> Callable[..., pytest.RunResult]:  # noqa: F811
    """run(name, *options): one pytest run of SUITE on a whole H200, its results in nights/NAME.json."""
    (pytester.path / "test_bench.py").unlink()  # h200's own one-test suite
    pytester.makepyfile(test_suite=SUITE)

    def run(name: str, *options: str) -> pytest.RunResult:
        return h200("--mig-results", f"nights/{name}.json", *options)

    return run


def test_a_night_in_a_window_rotates_through_the_suite(suite: Callable[..., pytest.RunResult],
                                                       pytester: pytest.Pytester) -> None:
    nights = pytester.path / "nights"
    _results(nights / "last.json", {IDS[0]: 40.0, IDS[1]: 40.0, IDS[2]: 40.0}, age=300)
    first = suite("n1", "--mig-window", "90")
    first.assert_outcomes(passed=3, deselected=1)  # two benchmarks and the unit test; one benchmark waits
    first.stdout.fnmatch_lines(["*--mig-window 1 min 30 s: 2 test(s) run (about 1 min 20 s by their last times); "
                                "1 left for the next night, which runs them first: test_openmm*"])
    _, meta = read_results_file(nights / "n1.json")
    assert meta["window"] == {"seconds": 90.0, "left": [IDS[2]]}
    second = suite("n2", "--mig-window", "90")  # tonight's times are near 0 s: everything fits again
    second.assert_outcomes(passed=4)
    assert "left for the next night" not in second.stdout.str()
    _, meta = read_results_file(nights / "n2.json")
    assert meta["window"]["left"] == [] and IDS[2] in meta["durations"]


def test_the_window_plans_over_the_tests_k_selected(suite: Callable[..., pytest.RunResult],
                                                    pytester: pytest.Pytester) -> None:
    """-k keeps two of the three benchmarks: the window plans over those two only, and the summary counts
    the test that ran and names the one left, never the test -k removed."""
    _results(pytester.path / "nights" / "last.json", {IDS[0]: 40.0, IDS[1]: 40.0, IDS[2]: 40.0}, age=300)
    night = suite("n1", "--mig-window", "50", "-k", "gemm or stream")
    night.assert_outcomes(passed=1, deselected=3)  # openmm and the unit test by -k, stream by the window
    night.stdout.fnmatch_lines(["*--mig-window 50 s: 1 test(s) run (about 40 s by their last times); 1 left for the "
                                "next night, which runs them first: test_stream"])
    assert "test_openmm" not in night.stdout.str()
    _, meta = read_results_file(pytester.path / "nights" / "n1.json")
    assert meta["window"]["left"] == [IDS[1]]


def test_a_night_whose_estimates_ran_long_ends_inside_the_window(suite: Callable[..., pytest.RunResult],
                                                                 pytester: pytest.Pytester,
                                                                 mig_env: pytest.MonkeyPatch) -> None:
    mig_env.setenv("SLEEP_GEMM", "1.3")  # last night it took a moment: tonight longer than the whole window
    _results(pytester.path / "nights" / "last.json", {IDS[0]: 0.1, IDS[1]: 0.1, IDS[2]: 0.1}, age=300)
    result = suite("n1", "--mig-window", "1", "-rs")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_suite.py:16: --mig-window 1 s: 1 s spent and this test took 0 s the last time, so it would "
                                 "end outside the window; the next night runs it first*"])
    result.stdout.fnmatch_lines(["*--mig-window 1 s: 1 test(s) run (about 0 s by their last times); 2 skipped while "
                                 "running, since each would have ended outside the window; the next night runs them "
                                 "first: test_stream, test_openmm"])
    _, meta = read_results_file(pytester.path / "nights" / "n1.json")
    assert meta["window"]["left"] == sorted([IDS[1], IDS[2]])
    seconds, _ = last_runs(pytester.path / "nights")
    assert seconds[IDS[1]] == 0.1  # the skipped tests keep last night's time, and their staleness


def test_a_window_that_holds_no_test_is_refused_at_start(suite: Callable[..., pytest.RunResult],
                                                         pytester: pytest.Pytester) -> None:
    _results(pytester.path / "nights" / "last.json", {IDS[0]: 40.0, IDS[1]: 40.0, IDS[2]: 40.0}, age=300)
    result = suite("n1", "--mig-window", "10s")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --mig-window 10 s holds none of the 3 test(s): the shortest took 40 s the "
                                 "last time it ran"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    bad = suite("n2", "--mig-window", "soon")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*argument --mig-window: 'soon' is not a length of time*"])
