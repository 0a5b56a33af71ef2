"""The whole save / pass / fail / corrupt flow through the plugin, on the CPU.

Each run is a real pytest run (pytester, in-process) of a test that records synthetic metrics with
the ``mig_bench`` fixture.  CPU runs are never compared with baselines, so the runs here are GPU
runs in everything but the GPU: NVML is the fake pynvml loaded with a real GPU's topology (an H200
with MIG off, an H100 with 1g.10gb slices) and CUDA's answer is stood in for
(``pytest_mig.target.cuda_props``, see conftest.py), so the Target, its slug and the baseline file
are exactly what the real GPU would give.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Callable

import fake_pynvml
import pytest
import topologies

import pytest_mig.report  # noqa: F401  (imported once here, not again by every in-process run)
from pytest_mig.results import read_results

BENCH = '''
from pytest_mig.measure import Metric


def test_rate(mig_bench):
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0] * 3, kind="compute"))
    mig_bench.record(Metric("latency_ms", 2.0, "ms", "lower", [1.98, 2.0, 2.02] * 3, kind="compute"))
    mig_bench.record(Metric("size_at_peak", 8192, "n", "higher", [], kind="info", compare=False))
'''
TEST_ID = "test_bench.py::test_rate"

#: Options of every run: no hypothesis or cache plugin (slow to load again in every in-process run, and
#: not what is tested), and no warning that the synthetic test never timed anything with `benchmark`.
QUIET = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider",
         "-W", "ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


@pytest.fixture
def h200(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch, stand_in_cuda: Callable[..., None],
         cuda_props_of: Callable[..., Any]) -> Callable[..., pytest.RunResult]:
    """run(*options): one pytest run of BENCH on a whole H200 (--mig-profile full)."""
    fake_pynvml.install(mig_env, "h200-mig-off")
    stand_in_cuda(cuda_props_of("h200-mig-off"))
    pytester.makepyfile(test_bench=BENCH)

    def run(*options: str) -> pytest.RunResult:
        mig_env.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # each run pins afresh, as a new process would
        return pytester.runpytest("--mig-profile", "full", *QUIET, *options)

    return run


def baseline_path(pytester: pytest.Pytester, slug: str = "nvidia-h200", profile: str = "full") -> Path:
    return pytester.path / "baselines" / slug / f"{profile}.json"


def edit_value(path: Path, metric: str, value: float) -> None:
    """Change one value as a reviewer would: by hand, the rest of the file untouched."""
    doc = json.loads(path.read_text())
    doc["tests"][TEST_ID][metric]["value"] = value
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def summary_row(result: pytest.RunResult, metric: str) -> list[str]:
    (line,) = [x for x in result.outlines if x.startswith("test_rate ") and f" {metric} " in x]
    return line.split()


# --------------------------------------------------------------------------- the flow


def test_save_then_pass_then_fail_then_corrupt(h200: Callable[..., pytest.RunResult],
                                               pytester: pytest.Pytester) -> None:
    path = baseline_path(pytester)

    # 1. record the baseline
    first = h200("--mig-save-baseline", "--mig-results", "run1.json", "--mig-report", "run1.md")
    first.assert_outcomes(passed=1)
    assert first.ret == 0
    first.stdout.fnmatch_lines([f"baseline saved: {path} (2 metric(s) from this run, 0 kept from earlier runs; "
                                f"1 not saved: {TEST_ID}::size_at_peak (informational))"])
    doc = json.loads(path.read_text())
    assert (doc["gpu_model"], doc["gpu_slug"], doc["profile"], doc["emulated"]) == ("NVIDIA H200", "nvidia-h200",
                                                                                    "full", False)
    assert doc["fingerprint"]["driver"] == "580.159.04" and doc["fingerprint"]["memory_total_mib"] == 143771
    rate = doc["tests"][TEST_ID]["rate"]
    assert (rate["value"], rate["unit"], rate["direction"], rate["tolerance"]) == (100.0, "items/s", "higher", 0.05)
    assert rate["spread"] == {"n": 9, "median": 100.0, "mad": 1.0, "min": 99.0, "max": 101.0}
    assert set(doc["tests"][TEST_ID]) == {"rate", "latency_ms"}

    records = read_results(pytester.path / "run1.json")
    assert [r.metric.name for r in records] == ["rate", "latency_ms", "size_at_peak"]  # one record per metric
    assert {r.target["gpu_slug"] for r in records} == {"nvidia-h200"}
    assert {(r.target["kind"], r.target["profile"], r.target["baseline_profile"]) for r in records} == {
        ("full", "full", "full")}
    assert records[0].test == TEST_ID and records[0].fingerprint["driver"] == "580.159.04"
    assert records[0].metric.samples == [99.0, 100.0, 101.0] * 3
    md = (pytester.path / "run1.md").read_text()
    assert md.startswith("| test ") and f"| {TEST_ID} | rate " in md

    # 2. the same figures pass; a normal run never writes the baseline
    saved = path.read_bytes()
    second = h200("--mig-results", "run2.json", "--mig-report", "run2.csv")
    second.assert_outcomes(passed=1)
    assert second.ret == 0
    assert summary_row(second, "rate") == ["test_rate", "rate", "100.0", "items/s", "100.0", "+0.0%", "pass"]
    assert summary_row(second, "latency_ms") == ["test_rate", "latency_ms", "2", "ms", "2", "+0.0%", "pass"]
    assert summary_row(second, "size_at_peak")[-1] == "info"
    second.stdout.fnmatch_lines(["results: run2.json", "report: run2.csv"])
    assert path.read_bytes() == saved
    rows = list(csv.DictReader((pytester.path / "run2.csv").open()))
    assert [(r["metric"], r["verdict"]) for r in rows] == [("rate", "pass"), ("latency_ms", "pass"),
                                                           ("size_at_peak", "info")]
    verdicts = {r.metric.name: r.verdict for r in read_results(pytester.path / "run2.json")}
    assert verdicts["rate"] is not None and verdicts["rate"]["outcome"] == "pass"

    # 3. the baseline edited to claim 10% more: the run fails, naming metric, value, baseline and change
    edit_value(path, "rate", 110.0)
    edited = path.read_bytes()
    third = h200()
    third.assert_outcomes(failed=1)
    assert third.ret == pytest.ExitCode.TESTS_FAILED
    third.stdout.fnmatch_lines([f"*REGRESSED {TEST_ID} rate 100.0 items/s, baseline 110.0 items/s (-9.1%, "
                                f"tolerance 5%, noise ±*); nothing in the fingerprint changed since the baseline"])
    assert "latency_ms" not in "".join(x for x in third.outlines if "REGRESSED" in x)
    assert summary_row(third, "rate")[-2:] == ["-9.1%", "regressed"]
    assert path.read_bytes() == edited

    # 4. a corrupt baseline fails the run with one sentence naming the file, and is left as it is
    path.write_text(path.read_text()[:-20])
    corrupt = path.read_bytes()
    fourth = h200()
    fourth.assert_outcomes(failed=1)
    assert fourth.ret == pytest.ExitCode.TESTS_FAILED
    failure = [x for x in fourth.outlines if x.startswith("baseline unusable: ")]
    assert len(failure) == 1
    assert failure[0].startswith(f"baseline unusable: {path}: not valid JSON (")
    assert "Traceback" not in fourth.stdout.str()
    assert path.read_bytes() == corrupt

    # 5. saving over a corrupt baseline is refused, and the run exits non-zero
    fifth = h200("--mig-save-baseline")
    fifth.assert_outcomes(passed=1)  # the test itself ran; the save failed
    assert fifth.ret == pytest.ExitCode.TESTS_FAILED
    fifth.stdout.fnmatch_lines([f"baseline not saved: {path}: not valid JSON (*); fix or delete it "
                                f"(pytest-mig never overwrites a file it cannot read)"])
    assert path.read_bytes() == corrupt


def test_improvement_passes_unless_asked_to_fail(h200: Callable[..., pytest.RunResult],
                                                 pytester: pytest.Pytester) -> None:
    h200("--mig-save-baseline").assert_outcomes(passed=1)
    edit_value(baseline_path(pytester), "rate", 90.0)  # the run is now 11% faster than its baseline

    lenient = h200()
    lenient.assert_outcomes(passed=1)
    assert summary_row(lenient, "rate")[-2:] == ["+11.1%", "improved"]

    strict = h200("--mig-fail-on-improvement")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines([f"*IMPROVED {TEST_ID} rate 100.0 items/s, baseline 90.00 items/s (+11.1%, *"])


def test_a_quick_baseline_judges_quick_runs_only(h200: Callable[..., pytest.RunResult],
                                                 pytester: pytest.Pytester) -> None:
    h200("--mig-quick", "--mig-save-baseline").assert_outcomes(passed=1)
    assert json.loads(baseline_path(pytester).read_text())["tests"][TEST_ID]["rate"]["mode"] == "quick"
    edit_value(baseline_path(pytester), "rate", 150.0)  # a quick run is now 33% slow against it
    h200("--mig-quick").assert_outcomes(failed=1)
    normal = h200("--mig-results", "r.json")  # a normal run measures other sizes: not compared, not failed
    normal.assert_outcomes(passed=1)
    assert summary_row(normal, "rate")[-1] == "incomparable"
    (rate,) = [r for r in read_results(pytester.path / "r.json") if r.metric.name == "rate"]
    assert rate.mode == "normal" and "measured without --mig-quick" in rate.verdict["message"]


def test_a_resave_keeps_a_tuned_tolerance_and_other_tests(h200: Callable[..., pytest.RunResult],
                                                          pytester: pytest.Pytester) -> None:
    h200("--mig-save-baseline").assert_outcomes(passed=1)
    path = baseline_path(pytester)
    doc = json.loads(path.read_text())
    doc["tests"][TEST_ID]["rate"]["tolerance"] = 0.12
    doc["tests"]["test_other.py::test_kept"] = {"x": {"value": 1.0, "unit": "s", "direction": "lower"}}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    edit_value(path, "rate", 110.0)  # -9.1% is within the tuned 12%
    h200().assert_outcomes(passed=1)
    again = h200("--mig-save-baseline")
    again.stdout.fnmatch_lines(["baseline saved: *(2 metric(s) from this run, 1 kept from earlier runs*"])
    doc = json.loads(path.read_text())
    assert doc["tests"][TEST_ID]["rate"] == {**doc["tests"][TEST_ID]["rate"], "value": 100.0, "tolerance": 0.12}
    assert doc["tests"]["test_other.py::test_kept"]["x"]["value"] == 1.0


def test_a_mig_slice_saves_under_its_model_and_profile(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch,
                                                       stand_in_cuda: Callable[..., None],
                                                       cuda_props_of: Callable[..., Any]) -> None:
    fake_pynvml.install(mig_env, "h100-mig")
    stand_in_cuda(cuda_props_of("h100-mig", topologies.H100_1G[0]))  # the first free 1g.10gb, as the plugin picks
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest("--mig-profile", "1g.10gb", "--mig-save-baseline", "--mig-results", "r.json", *QUIET)
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    path = baseline_path(pytester, "nvidia-h100-80gb-hbm3", "1g.10gb")
    doc = json.loads(path.read_text())
    assert (doc["gpu_model"], doc["profile"], doc["emulated"]) == ("NVIDIA H100 80GB HBM3", "1g.10gb", False)
    (target,) = {json.dumps(r.target, sort_keys=True) for r in read_results(pytester.path / "r.json")}
    t = json.loads(target)
    assert (t["kind"], t["profile"], t["gpu_slug"], t["uuid"]) == ("mig", "1g.10gb", "nvidia-h100-80gb-hbm3",
                                                                  topologies.H100_1G[0])
    assert t["sms_obtained"] == 16
    assert [p.name for p in (pytester.path / "baselines").iterdir() if not p.name.startswith(".")] == [
        "nvidia-h100-80gb-hbm3"]


def test_an_emulated_profile_is_saved_apart_from_real_slices(h200: Callable[..., pytest.RunResult],
                                                             pytester: pytest.Pytester,
                                                             green_contexts: Callable[[bool], None],
                                                             stand_in_emulator: Any) -> None:
    green_contexts(True)
    h200("--mig-save-baseline").assert_outcomes(passed=1)  # the whole GPU first
    result = pytester.runpytest("--mig-profile", "3g.71gb", "--mig-emulate", "--mig-save-baseline", *QUIET)
    result.assert_outcomes(passed=1)
    assert stand_in_emulator.activated == ["3g.71gb", "3g.71gb"]  # for the header, then for the test
    doc = json.loads(baseline_path(pytester, profile="3g.71gb-emulated").read_text())
    assert (doc["profile"], doc["emulated"]) == ("3g.71gb-emulated", True)
    assert sorted(p.name for p in baseline_path(pytester).parent.iterdir()) == ["3g.71gb-emulated.json", "full.json"]


def test_a_cpu_run_is_never_compared(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    fake_pynvml.install(mig_env, "no-gpu")
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest("--mig-results", "r.json", "--mig-report", "r.json.md", *QUIET)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["CPU run: real CPU measurements at small sizes; nothing was compared with GPU *"])
    assert summary_row(result, "rate")[-1] == "info"
    assert not (pytester.path / "baselines").exists()
    assert all(r.target["gpu_slug"] == "cpu" for r in read_results(pytester.path / "r.json"))


def test_a_report_path_without_a_known_suffix_fails_the_run(h200: Callable[..., pytest.RunResult]) -> None:
    result = h200("--mig-report", "out.txt")
    assert result.ret != 0
    said = "\n".join(result.outlines + result.errlines)
    assert re.search(r"out\.txt: cannot tell the report format from '\.txt'; use one of \.md", said), said
    assert "Traceback" not in said


def test_a_driver_change_is_named_in_the_failing_verdict(h200: Callable[..., pytest.RunResult],
                                                          pytester: pytest.Pytester,
                                                          mig_env: pytest.MonkeyPatch) -> None:
    h200("--mig-save-baseline").assert_outcomes(passed=1)
    edit_value(baseline_path(pytester), "rate", 110.0)
    newer = topologies.with_driver(topologies.get_topology("h200-mig-off"), "590.10.02", 13010)
    fake_pynvml.install(mig_env, newer)  # the night after a driver update
    result = h200()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*REGRESSED {TEST_ID} rate 100.0 items/s, baseline 110.0 items/s (-9.1%, *); "
                                 f"since the baseline: driver 580.159.04 -> 590.10.02, CUDA driver 13.0 -> 13.1"])


def test_an_unwritable_results_file_is_one_line_and_the_baseline_is_still_saved(
    h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    (pytester.path / "a-file").write_text("")
    result = h200("--mig-results", "a-file/results.json", "--mig-save-baseline")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # not INTERNAL_ERROR with a traceback
    result.stdout.fnmatch_lines(["a-file/results.json: results not written (*)"])
    assert baseline_path(pytester).exists()


def test_percentages_in_verdicts_never_use_exponents() -> None:
    """A tolerance tuned to 12.5% or a 100% noise band reads as written, not as 1.2e+01%."""
    from pytest_mig.baselines import entry_from_record, meta_from_record
    from pytest_mig.measure import Metric
    from pytest_mig.results import ResultRecord
    from pytest_mig.verdict import compare

    target = {"kind": "full", "profile": "full", "baseline_profile": "full", "gpu_name": "NVIDIA H200",
              "gpu_slug": "nvidia-h200", "emulated": False}
    old = ResultRecord(TEST_ID, Metric("rate", 100.0, "items/s", "higher", [100.0] * 3), target, {})
    new = ResultRecord(TEST_ID, Metric("rate", 80.0, "items/s", "higher", [80.0] * 3), target, {})
    assert "(-20.0%, tolerance 12.5%)" in compare(new, entry_from_record(old), meta_from_record(old),
                                                 tolerance=0.125).message
    assert "tolerance 100%)" in compare(new, entry_from_record(old), meta_from_record(old), tolerance=1.0).message
