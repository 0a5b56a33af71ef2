"""The whole save / history / judge / confirm flow through the plugin, on the CPU.

Each run is a real pytest run (pytester, in-process) of a test that records synthetic metrics with
the ``mig_bench`` fixture; the figure it records is set per run through the environment (RATE), and
a dip of its first measurement only (DIP) stands for a transient.  The runs are GPU runs in
everything but the GPU: NVML is the fake pynvml loaded with a real GPU's topology (an H200 with MIG
off, an H100 with 1g.10gb slices) and CUDA's answer is stood in for (``pytest_mig.device.target.cuda_props``,
see conftest.py), so the Target, its slug and the baseline file are exactly what the real GPU would
give.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import fake_pynvml
import pytest
import topologies

import pytest_mig.report.tables  # noqa: F401  (imported once here, not again by every in-process run)
from pytest_mig.device.nvml import cpu_model
from pytest_mig.judge.reference import ReferenceStore
from pytest_mig.store.results import read_results

BENCH = '''
import math
import os

from pytest_mig.measure import Metric

CALLS = []


def test_rate(mig_bench):
    CALLS.append(1)
    rate = float(os.environ.get("RATE", "100"))
    if os.environ.get("DIP") and len(CALLS) == 1:  # only the first measurement of the run dips
        rate *= 1 - float(os.environ["DIP"])
    samples = [rate * 0.99, rate, rate * 1.01] * 3
    if os.environ.get("NAN_SAMPLE"):
        samples[0] = math.nan
    mig_bench.record(Metric("rate", rate, "items/s", "higher", samples, kind="compute"))
    mig_bench.record(Metric("latency_ms", 2.0, "ms", "lower", [1.98, 2.0, 2.02] * 3, kind="compute"))
    mig_bench.record(Metric("size_at_peak", 8192, "n", "higher", [], kind="info", compare=False))
    assert not os.environ.get("FAIL_TEST"), "the workload's own check failed"
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


def entry(path: Path, metric: str = "rate", mode: str = "normal", test: str = TEST_ID) -> dict[str, Any]:
    return json.loads(path.read_text())["modes"][mode][test][metric]


def history(h200: Callable[..., pytest.RunResult], mig_env: pytest.MonkeyPatch, rates: list[float],
            *options: str) -> None:
    """Save one run per rate into the baseline history."""
    for rate in rates:
        mig_env.setenv("RATE", str(rate))
        h200("--mig-save-baseline", *options).assert_outcomes(passed=1)
    mig_env.delenv("RATE")

STEADY = [100.0, 100.2, 99.9, 100.1, 99.8, 100.0]


def rate_record(pytester: pytest.Pytester, results: str) -> Any:
    """The record of the figure "rate" in a run's results file."""
    (rate,) = [r for r in read_results(pytester.path / results) if r.metric.name == "rate"]
    return rate


def summary_row(result: pytest.RunResult, metric: str) -> list[str]:
    (line,) = [x for x in result.outlines if x.startswith("test_rate ") and f" {metric} " in x]
    return line.split()


# --------------------------------------------------------------------------- the history


def test_each_save_adds_a_run_to_the_history_one_line_each_and_keeps_the_last_n(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    path = baseline_path(pytester)
    first = h200("--mig-save-baseline", "--mig-results", "run1.json")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines([f"baseline saved: {path} (2 figure(s) added to their history, 0 kept from earlier "
                                f"runs; the fewest runs of a figure is now 1; 1 not saved: {TEST_ID}::size_at_peak "
                                f"(informational))"])
    doc = json.loads(path.read_text())
    assert doc["schema"] == "pytest-mig/baseline/2" and doc["keep"] == 10
    assert (doc["gpu_model"], doc["gpu_slug"], doc["profile"], doc["emulated"]) == ("NVIDIA H200", "nvidia-h200",
                                                                                    "full", False)
    (fp,) = doc["fingerprints"].values()
    assert fp["driver"] == "580.159.04" and fp["memory_total_mib"] == 143771
    assert fp["gpu_uuid"] == topologies.H200_GPU0  # the board: boards of one model share a baseline file
    assert fp["cpu_model"] == cpu_model()  # the host too: launch-bound figures follow its CPU
    rate = entry(path)
    assert (rate["unit"], rate["direction"], rate["kind"], rate["tolerance"]) == ("items/s", "higher", "compute", None)
    (run,) = rate["runs"]
    assert run["value"] == 100.0 and run["fp"] in doc["fingerprints"] and run["noise"] == pytest.approx(0.0148, abs=1e-3)
    records = read_results(pytester.path / "run1.json")
    assert [r.metric.name for r in records] == ["rate", "latency_ms", "size_at_peak"]
    assert records[0].test == TEST_ID and records[0].fingerprint["driver"] == "580.159.04"

    history(h200, mig_env, [101.0, 102.0, 103.0], "--mig-baseline-keep", "3")  # it held 1 run: nothing lost
    rate = entry(path)
    assert [r["value"] for r in rate["runs"]] == [101.0, 102.0, 103.0]  # the last 3 kept
    assert json.loads(path.read_text())["keep"] == 3
    text = path.read_text()
    assert sum(1 for line in text.splitlines() if line.strip().startswith('{"at": ')) == 6  # one line per run
    assert len(json.loads(text)["fingerprints"]) == 1  # the same fingerprint is written once
    # a keep below the runs the file holds is refused at start-up, before anything is measured
    refused = h200("--mig-save-baseline", "--mig-baseline-keep", "2")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR and path.read_text() == text
    refused.stderr.fnmatch_lines([f"ERROR: {path} keeps 3 runs per figure and a keep of 2 would drop 2 older run(s) "
                                  f"of its 2 figure(s); nothing is saved: confirm with --mig-baseline-shrink*"])
    mig_env.setenv("RATE", "104")
    h200("--mig-save-baseline", "--mig-baseline-keep", "2", "--mig-baseline-shrink").assert_outcomes(passed=1)
    assert [r["value"] for r in entry(path)["runs"]] == [103.0, 104.0]


def test_quick_and_normal_histories_are_kept_apart(h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester,
                                                   mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    path = baseline_path(pytester)
    normal = path.read_text()
    mig_env.setenv("RATE", "150")
    h200("--mig-quick", "--mig-save-baseline").assert_outcomes(passed=1)
    doc = json.loads(path.read_text())
    assert [r["value"] for r in doc["modes"]["quick"][TEST_ID]["rate"]["runs"]] == [150.0]
    assert doc["modes"]["normal"] == json.loads(normal)["modes"]["normal"]  # the quick save left them alone
    mig_env.setenv("RATE", "60")  # 40% slow: a normal run is still judged against the normal history
    h200().assert_outcomes(failed=1)
    mig_env.setenv("RATE", "150")  # 50% above the normal history, equal to the quick one
    quick = h200("--mig-quick")
    quick.assert_outcomes(passed=1)
    assert summary_row(quick, "rate")[-1] == "pass" and summary_row(quick, "rate")[4] == "150.0"


def test_a_failed_test_s_figures_are_never_saved(h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester,
                                                 mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, [100.0])
    mig_env.setenv("FAIL_TEST", "1")
    mig_env.setenv("RATE", "0.5")
    failed = h200("--mig-save-baseline")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines([f"baseline: the figures of 1 test(s) that failed or did not finish were not saved: {TEST_ID}"])
    assert [r["value"] for r in entry(baseline_path(pytester))["runs"]] == [100.0]


def test_a_nan_sample_or_a_nan_value_never_breaks_the_end_of_the_run(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    mig_env.setenv("NAN_SAMPLE", "1")
    result = h200("--mig-save-baseline", "--mig-results", "r.json", "--mig-report", "r.md")
    result.assert_outcomes(passed=1)
    assert result.ret == 0 and "Traceback" not in result.stdout.str()
    assert read_results(pytester.path / "r.json") and (pytester.path / "r.md").exists()
    assert entry(baseline_path(pytester))["runs"][0]["value"] == 100.0
    mig_env.setenv("RATE", "nan")
    nan_run = h200("--mig-save-baseline", "--mig-results", "n.json")
    assert nan_run.ret == 0 and "Traceback" not in nan_run.stdout.str()
    nan_run.stdout.fnmatch_lines([f"*not saved: {TEST_ID}::rate (value nan)*"])
    assert [r["value"] for r in entry(baseline_path(pytester))["runs"]] == [100.0]  # the NaN never entered it


def test_no_lock_file_is_left_in_the_baseline_folder(h200: Callable[..., pytest.RunResult],
                                                      pytester: pytest.Pytester) -> None:
    h200("--mig-save-baseline").assert_outcomes(passed=1)
    root = pytester.path / "baselines"
    assert sorted(p.name for p in root.rglob("*")) == ["full.json", "nvidia-h200"]


# --------------------------------------------------------------------------- judging against the history


def test_a_steady_history_passes_and_every_line_says_its_threshold(h200: Callable[..., pytest.RunResult],
                                                                   pytester: pytest.Pytester,
                                                                   mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    saved = baseline_path(pytester).read_bytes()
    result = h200("--mig-results", "r.json")
    result.assert_outcomes(passed=1)
    assert summary_row(result, "rate") == ["test_rate", "rate", "100.0", "items/s", "100.0", "+0.0%", "±1.0%", "1.3%",
                                           "pass"]
    assert baseline_path(pytester).read_bytes() == saved  # a normal run never writes the baseline
    rate = rate_record(pytester, "r.json")
    v = rate.verdict
    assert v is not None and v.outcome == "pass" and v.runs == 6 and v.threshold == 0.01 and v.gates is True
    assert "threshold 1% (the floor; run-to-run sigma 0.15% over 6 runs), detects >= 1.3%" in v.message


def test_a_sustained_slowdown_is_confirmed_by_re_measuring_and_fails(h200: Callable[..., pytest.RunResult],
                                                                     pytester: pytest.Pytester,
                                                                     mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    mig_env.setenv("RATE", "95")
    result = h200("--mig-results", "r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*REGRESSED {TEST_ID} rate 95.00 items/s, baseline 100.0 items/s (median of 6 runs): "
                                 f"-5.0%, threshold 1% (the floor*; confirmed: every re-measurement is beyond the "
                                 f"threshold, 95.00, 95.00 items/s (median of 3 -5.0%); nothing in the fingerprint "
                                 f"changed since the baseline"])
    rate = rate_record(pytester, "r.json")
    assert rate.verdict.confirmations == [95.0, 95.0] and rate.metric.value == 95.0  # results keep the first


def test_a_transient_dip_is_reported_as_one_and_passes(h200: Callable[..., pytest.RunResult],
                                                        pytester: pytest.Pytester,
                                                        mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    mig_env.setenv("DIP", "0.05")
    dipped = h200("--mig-results", "r.json")
    dipped.assert_outcomes(passed=1)
    assert summary_row(dipped, "rate")[-1] == "transient"
    rate = rate_record(pytester, "r.json")
    assert "a transient change, not a regression: re-measured 100.0, 100.0 items/s" in rate.verdict.message
    h200("--mig-confirm", "0").assert_outcomes(failed=1)  # without re-measuring, the dip fails


def test_too_few_runs_use_a_conservative_band_and_say_so(h200: Callable[..., pytest.RunResult],
                                                         pytester: pytest.Pytester,
                                                         mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, [100.0])
    mig_env.setenv("RATE", "92")
    result = h200("--mig-results", "r.json")
    result.assert_outcomes(passed=1)  # 8% is inside the 10% band of a single run
    rate = rate_record(pytester, "r.json")
    assert "threshold 10%: only 1 run(s) in the baseline, too few to measure its noise" in rate.verdict.message
    h200("--mig-tolerance", "5%").assert_outcomes(failed=1)  # a site's tolerance caps the band
    mig_env.setenv("RATE", "85")
    h200().assert_outcomes(failed=1)


def test_a_figure_too_noisy_to_gate_is_reported_never_failed(h200: Callable[..., pytest.RunResult],
                                                             pytester: pytest.Pytester,
                                                             mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, [100.0, 120.0, 80.0, 110.0, 90.0])
    mig_env.setenv("RATE", "60")
    result = h200("--mig-results", "r.json")
    result.assert_outcomes(passed=1)
    assert summary_row(result, "rate")[-1] == "noisy"
    rate = rate_record(pytester, "r.json")
    assert "too noisy to gate (run-to-run CV 15.8% over 5 runs" in rate.verdict.message
    assert rate.verdict.gates is False
    h200("--mig-tolerance", "20%").assert_outcomes(failed=1)  # a site that sets a tolerance gates it anyway


def test_improvement_passes_unless_asked_to_fail(h200: Callable[..., pytest.RunResult],
                                                 pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    mig_env.setenv("RATE", "111")
    lenient = h200()
    lenient.assert_outcomes(passed=1)
    assert summary_row(lenient, "rate")[-1] == "improved"
    strict = h200("--mig-fail-on-improvement")
    strict.assert_outcomes(failed=1)
    strict.stdout.fnmatch_lines([f"*IMPROVED {TEST_ID} rate 111.0 items/s, baseline 100.0 items/s (median of 6 runs): "
                                 f"+11.0%*"])


def test_a_save_run_is_judged_but_never_failed_by_its_verdicts(h200: Callable[..., pytest.RunResult],
                                                               pytester: pytest.Pytester,
                                                               mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    mig_env.setenv("RATE", "90")
    accepted = h200("--mig-save-baseline")
    accepted.assert_outcomes(passed=1)
    assert summary_row(accepted, "rate")[-1] == "regressed"
    accepted.stdout.fnmatch_lines(["this run was added to the baseline: its verdicts against the earlier runs are "
                                   "shown, none of them fails it"])
    assert entry(baseline_path(pytester))["runs"][-1]["value"] == 90.0


def test_a_driver_change_is_named_in_the_failing_verdict(h200: Callable[..., pytest.RunResult],
                                                          pytester: pytest.Pytester,
                                                          mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    newer = topologies.with_driver(topologies.get_topology("h200-mig-off"), "590.10.02", 13010)
    fake_pynvml.install(mig_env, newer)  # the night after a driver update
    mig_env.setenv("RATE", "90")
    result = h200()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*REGRESSED {TEST_ID} rate 90.00 items/s, baseline 100.0 items/s (median of 6 runs): "
                                 f"-10.0%*; since the baseline: driver 580.159.04 -> 590.10.02, CUDA driver 13.0 -> 13.1"])


def test_a_corrupt_baseline_is_one_sentence_and_never_overwritten(h200: Callable[..., pytest.RunResult],
                                                                   pytester: pytest.Pytester) -> None:
    h200("--mig-save-baseline").assert_outcomes(passed=1)
    path = baseline_path(pytester)
    path.write_text(path.read_text()[:-20])
    corrupt = path.read_bytes()
    judged = h200()  # only judging: refused before anything is measured too, not every test failed after the run
    assert judged.ret == pytest.ExitCode.USAGE_ERROR
    judged.stderr.fnmatch_lines([(f"ERROR: {path}: not valid JSON (*); fix or delete it "
                                  f"(pytest-mig never overwrites a file it cannot read); nothing was run.")])
    assert "Traceback" not in judged.stderr.str() and "baseline unusable" not in judged.stdout.str()
    saving = h200("--mig-save-baseline")  # refused before anything is measured, not after the run
    assert saving.ret == pytest.ExitCode.USAGE_ERROR
    saving.stderr.fnmatch_lines([f"ERROR: {path}: not valid JSON (*); fix or delete it "
                                 f"(pytest-mig never overwrites a file it cannot read)"])
    assert "Traceback" not in saving.stderr.str() and not saving.outlines[-1:] == ["1 passed"]
    assert path.read_bytes() == corrupt


def test_a_schema_1_baseline_still_judges_and_is_upgraded_on_the_next_save(h200: Callable[..., pytest.RunResult],
                                                                            pytester: pytest.Pytester,
                                                                            mig_env: pytest.MonkeyPatch) -> None:
    path = baseline_path(pytester)
    path.parent.mkdir(parents=True)
    v1 = {"schema": "pytest-mig/baseline/1", "gpu_model": "NVIDIA H200", "gpu_slug": "nvidia-h200", "profile": "full",
          "emulated": False, "fingerprint": {"driver": "580.159.04"}, "updated_at": "2026-11-22T00:00:00+00:00",
          "tests": {TEST_ID: {"rate": {"value": 110.0, "unit": "items/s", "direction": "higher", "kind": "compute",
                                       "tolerance": 0.05, "samples": [109.0, 110.0, 111.0], "mode": "normal",
                                       "recorded_at": "2026-11-22T00:00:00+00:00"}}}}
    path.write_text(json.dumps(v1))
    result = h200()
    result.assert_outcomes(passed=1)  # -9.1% against one run: inside the conservative 10% band
    assert summary_row(result, "rate")[5:] == ["-9.1%", "±10.0%", "10.0%", "pass"]
    h200("--mig-save-baseline").assert_outcomes(passed=1)
    doc = json.loads(path.read_text())
    assert doc["schema"] == "pytest-mig/baseline/2"
    assert [r["value"] for r in doc["modes"]["normal"][TEST_ID]["rate"]["runs"]] == [110.0, 100.0]
    assert doc["modes"]["normal"][TEST_ID]["rate"]["tolerance"] is None  # v1's default 5% was not a choice


def test_a_cpu_run_is_compared_with_a_cpu_baseline(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    fake_pynvml.install(mig_env, "no-gpu")
    pytester.makepyfile(test_bench=BENCH)
    first = pytester.runpytest("--mig-results", "r.json", *QUIET)
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["CPU run: real CPU measurements at small sizes, compared only with a CPU baseline *"])
    assert summary_row(first, "rate")[-1] == "no-baseline"
    assert all(r.target.gpu_slug == "cpu" for r in read_results(pytester.path / "r.json"))
    pytester.runpytest("--mig-save-baseline", *QUIET).assert_outcomes(passed=1)
    assert (pytester.path / "baselines" / "cpu" / "cpu.json").exists()
    mig_env.setenv("RATE", "50")
    pytester.runpytest(*QUIET).assert_outcomes(failed=1)  # a CPU figure halving is caught too


def test_an_incomparable_figure_is_printed_with_its_reason(pytester: pytest.Pytester,
                                                          mig_env: pytest.MonkeyPatch) -> None:
    """A quick run against a history of normal runs: the table says incomparable, the line under it why."""
    fake_pynvml.install(mig_env, "no-gpu")
    pytester.makepyfile(test_bench=BENCH)
    pytester.runpytest("--mig-save-baseline", "--mig-results", "none", *QUIET).assert_outcomes(passed=1)
    quick = pytester.runpytest("--mig-quick", "--mig-results", "none", *QUIET)
    quick.assert_outcomes(passed=1)
    assert summary_row(quick, "rate")[-1] == "incomparable"
    quick.stdout.fnmatch_lines([f"INCOMPARABLE {TEST_ID} rate 100.0 items/s not compared: measured with --mig-quick "
                                "but the baseline holds only normal runs, and the workloads' sizes differ; *"])


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
    (target,) = {json.dumps(r.target.to_dict(), sort_keys=True) for r in read_results(pytester.path / "r.json")}
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


def test_a_test_whose_work_left_the_green_context_fails_and_records_nothing(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, green_contexts: Callable[[bool], None],
        stand_in_emulator: Any) -> None:
    green_contexts(True)
    h200()  # the plan's header reads the whole GPU first
    stand_in_emulator.escape = "the test's CUDA work left the profile's green context of 64 SMs"
    result = pytester.runpytest("--mig-profile", "3g.71gb", "--mig-emulate", "--mig-results", "r.json",
                                "--mig-save-baseline", *QUIET)
    result.assert_outcomes(failed=1)
    said = "\n".join(result.outlines)
    assert "left the profile's green context of 64 SMs; this test's figures are not recorded" in said, said
    assert not (pytester.path / "r.json").exists()  # no figure at all: no results file
    assert not baseline_path(pytester, profile="3g.71gb-emulated").exists()


def test_a_report_path_without_a_known_suffix_fails_the_run(h200: Callable[..., pytest.RunResult]) -> None:
    result = h200("--mig-report", "out.txt")
    assert result.ret != 0
    said = "\n".join(result.outlines + result.errlines)
    assert re.search(r"out\.txt: cannot tell the report format from '\.txt'; use one of \.md", said), said
    assert "Traceback" not in said


def test_an_unwritable_results_file_is_said_at_start_up_and_nothing_is_saved(
    h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester
) -> None:
    (pytester.path / "a-file").write_text("")
    result = h200("--mig-results", "a-file/results.json", "--mig-save-baseline")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # said before an hour of benchmarks, not after
    assert "--mig-results a-file/results.json: a-file is a file, not a folder" in "\n".join(result.errlines)
    assert not baseline_path(pytester).exists()


def test_two_runs_in_the_same_second_never_share_a_results_file(tmp_path: Path) -> None:
    from pytest_mig.store.results import default_results_path

    a, b = default_results_path(tmp_path), default_results_path(tmp_path)
    assert a != b and a.parent == tmp_path / ".mig-results" and a.name.startswith("results-")


@pytest.mark.parametrize(("options", "sentence"), [
    (["--mig-su-allocation", "cpus=nan"], "--mig-su-allocation 'cpus=nan': 'cpus=nan' is not understood"),
    (["--mig-slowdown-sms", "120", "--mig-save-baseline"], "--mig-slowdown-sms measures a GPU slowed on purpose"),
    (["--mig-slowdown-sms", "200"], "--mig-slowdown-sms 200: the GPU has 132 SMs; ask for fewer"),
    (["--mig-confirm", "-1"], "-1 is too small: use 0 or more"),
    (["--mig-baseline-keep", "0"], "0 is too small: use 1 or more"),
    (["-o", "mig_tolerance=150%"], "ini option mig_tolerance: tolerance '150%' is out of range"),
    (["-o", "mig_confirm=two"], "ini option mig_confirm: 'two' is not a whole number"),
])
def test_bad_settings_are_one_sentence_at_start_up(h200: Callable[..., pytest.RunResult], options: list[str],
                                                   sentence: str) -> None:
    result = h200(*options)
    assert result.ret in (pytest.ExitCode.USAGE_ERROR, 4)
    said = "\n".join(result.outlines + result.errlines)
    assert sentence in said and "Traceback" not in said
    assert not re.search(r"\d+ passed", said)  # nothing ran




# --------------------------------------------------------------------------- a first night against a reference


def test_a_first_run_is_judged_against_the_reference_until_a_baseline_is_saved(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    from pytest_mig.cli import main

    for i, rate in enumerate([100.0, 100.3, 99.8]):  # the reference: runs on "another board" elsewhere
        mig_env.setenv("RATE", str(rate))
        h200("--mig-results", f"ref{i}.json", "--mig-baseline-dir", "elsewhere").assert_outcomes(passed=1)
    assert main(["reference", *(str(pytester.path / f"ref{i}.json") for i in range(3)),
                 "--out", str(pytester.path / "ref")]) == 0
    # The three runs' rates make 3 runs; their equal latency counts once per second they fell in
    # (a run is known by its time and value), so the header reads "3", "2-3" or "1-3 run(s)".
    shipped = ReferenceStore(pytester.path / "ref").load("nvidia-h200", "full")
    assert shipped is not None
    runs = shipped.describe("normal")
    assert re.match(r"(?:[12]-)?3 run\(s\) of NVIDIA H200 full \(normal\), driver 580\.159\.04, ", runs), runs
    mig_env.setenv("RATE", "84")  # this GPU is 16% under the reference on its first night
    slow = h200("--mig-reference", "ref", "--mig-results", "first.json", "-v")
    slow.assert_outcomes(failed=1)
    # The rate is judged (three runs show its noise); the latency too unless its runs counted as one.
    judged, figures = shipped.judged_counts()["normal"]
    assert figures == 2 and judged >= 1
    which = "all 2 of its normal figures" if judged == 2 else "1 of its 2 normal figures, the others reported only"
    slow.stdout.fnmatch_lines([
        "pytest-mig: verdicts for full: no local baseline yet (*baselines/nvidia-h200/full.json): judged against the "
        f"reference, {runs}, in a band of at least 10% (another board): {which}*; a saved baseline *",
        "*REGRESSED test_bench.py::test_rate rate 84.00 items/s, reference 100.0 items/s (median of 3 runs of the "
        "reference for this GPU model): -16.0%, threshold 10% (against another board*",
    ])
    assert rate_record(pytester, "first.json").verdict.source == "reference"
    assert summary_row(slow, "rate")[4:6] == ["100.0", "(ref)"]  # the summary table names the reference
    quick = h200("--mig-reference", "ref", "--mig-quick")  # the reference holds normal runs only
    quick.assert_outcomes(passed=1)
    quick.stdout.fnmatch_lines(["pytest-mig: verdicts for full: no local baseline (*), and the reference for NVIDIA "
                                "H200 full holds normal runs only: this run's compute and bandwidth figures judged "
                                "against this device's ceiling (Hopper, 132 SMs at up to 1980 MHz, memory 4917 GB/s)*; "
                                "the other figures are reported, not judged; *"])
    mig_env.setenv("RATE", "95")
    h200("--mig-reference", "ref").assert_outcomes(passed=1)  # 5% under: another board, not a fault
    h200("--mig-reference", "ref", "--mig-save-baseline").assert_outcomes(passed=1)
    own = h200("--mig-reference", "ref", "--mig-results", "own.json")  # the local history takes over
    own.assert_outcomes(passed=1)
    assert rate_record(pytester, "own.json").verdict.source == "baseline"


def test_a_reference_of_one_run_is_shown_beside_not_said_to_judge(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    from pytest_mig.cli import main

    mig_env.setenv("RATE", "100")
    h200("--mig-results", "ref0.json", "--mig-baseline-dir", "elsewhere").assert_outcomes(passed=1)
    assert main(["reference", str(pytester.path / "ref0.json"), "--out", str(pytester.path / "ref")]) == 0
    mig_env.setenv("RATE", "84")  # 16% under: with one reference run its noise is unknown, so not judged
    first = h200("--mig-reference", "ref", "--mig-results", "first.json")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines([
        "pytest-mig: verdicts for full: no local baseline yet (*): shown beside the reference, 1 run(s) of NVIDIA "
        "H200 full (normal), *, but not judged: no figure of this mode has a second reference run of NVIDIA H200 to "
        "show its run-to-run noise; record a baseline with --mig-save-baseline"])
    verdict = rate_record(pytester, "first.json").verdict
    assert verdict is not None and verdict.outcome == "noisy" and "the reference has one run of it" in verdict.message


def test_a_reference_folder_that_does_not_exist_is_one_sentence_at_start_up(
        h200: Callable[..., pytest.RunResult]) -> None:
    result = h200("--mig-reference", "no-such-folder")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --mig-reference no-such-folder: no such folder; give a folder made by "
                                 "'pytest-mig reference', 'shipped' (the default) or 'none'."])


def test_with_references_off_a_first_run_has_no_baseline(h200: Callable[..., pytest.RunResult],
                                                         pytester: pytest.Pytester) -> None:
    h200("--mig-reference", "none", "--mig-results", "r.json").assert_outcomes(passed=1)
    assert rate_record(pytester, "r.json").verdict.outcome == "no-baseline"


def test_save_if_passed_grows_the_history_with_good_nights_only(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    history(h200, mig_env, STEADY)
    path = baseline_path(pytester)
    mig_env.setenv("RATE", "100.1")
    h200("--mig-save-if-passed").assert_outcomes(passed=1)
    assert [r["value"] for r in entry(path)["runs"]][-1] == 100.1  # a good night is learned
    before = path.read_text()
    mig_env.setenv("RATE", "80")
    bad = h200("--mig-save-if-passed")
    bad.assert_outcomes(failed=1)  # judged as usual, unlike --mig-save-baseline
    bad.stdout.fnmatch_lines(["baseline: this run failed, so it was not added to the history (--mig-save-if-passed); "
                              "the history is as it was"])
    assert path.read_text() == before


def test_save_if_passed_and_save_baseline_together_are_refused(h200: Callable[..., pytest.RunResult]) -> None:
    result = h200("--mig-save-if-passed", "--mig-save-baseline")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --mig-save-baseline adds a run whatever its verdicts and --mig-save-if-passed "
                                 "only a run that passed: give one of them"])


def test_a_transient_dip_enters_the_history_as_the_median_of_the_runs_measurements(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    """A nightly that saves its run (--mig-save-baseline) after a first reading its re-measurements
    found transient keeps the median of the three readings, not the dip: one dip in a rolling
    history of a few runs would set the figure's sigma and widen its band for the nights after."""
    history(h200, mig_env, STEADY)
    mig_env.setenv("DIP", "0.05")
    h200("--mig-save-baseline", "--mig-results", "r.json").assert_outcomes(passed=1)
    rate = rate_record(pytester, "r.json")
    assert rate.metric.value == pytest.approx(95.0) and rate.verdict.confirmations == [100.0, 100.0]
    assert entry(baseline_path(pytester))["runs"][-1]["value"] == 100.0  # results keep the first reading


SIZED = '''
import os

from pytest_mig.measure import Metric


def test_sized(mig_bench):
    size = mig_bench.size_of("rate") or int(os.environ["SWEEP"])  # as run_gemm: the size judged at, else its own
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0], kind="compute",
                            info={"size": size}))
'''


def test_a_workload_measures_at_the_size_its_history_was_measured_at(
        h200: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    """mig_bench.size_of gives the size the figure's history was measured at: a first night's own choice is
    saved with the run and every later night measures there, whatever it would choose itself."""
    pytester.makepyfile(test_bench=SIZED)

    def night(sweep: int, results: str) -> int:
        mig_env.setenv("SWEEP", str(sweep))
        h200("--mig-save-baseline", "--mig-reference", "none", "--mig-results", results).assert_outcomes(passed=1)
        (rec,) = read_results(pytester.path / results)
        return rec.metric.info["size"]

    assert night(16384, "n1.json") == 16384  # nothing known: its own choice
    sized = "test_bench.py::test_sized"
    assert [r["size"] for r in entry(baseline_path(pytester), test=sized)["runs"]] == [16384]
    assert night(20480, "n2.json") == 16384  # the history's size, not the one it would choose
    assert [r["size"] for r in entry(baseline_path(pytester), test=sized)["runs"]] == [16384, 16384]
