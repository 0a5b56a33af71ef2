"""The verdict rule on synthetic histories: thresholds from run-to-run noise, too few runs, too noisy
to gate, a site's tolerance, direction, confirmation by re-measuring, the clock-normalised partner,
fingerprint text, throttling, and never comparing across GPU models, profiles, emulation or modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_mig.store.baselines import BaselineStore, entry_from_records, meta_from_record
from pytest_mig.measure import Metric
from pytest_mig.judge.noise import FEW_RUNS_BAND, FLOOR, K, band, run_sigma
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord
from pytest_mig.judge.pipeline import Pipeline, StoreHistories
from pytest_mig.judge.verdict import (
    compare,
    confirm,
    explain_clock,
    failing,
    failure_text,
    fingerprint_diff,
    parse_tolerance,
)

FP_OLD = {"driver": "550.54", "cuda_driver": "12.4", "vbios": "96.00.A5.00.1A", "inforom": "G520.0282.02.02",
          "gsp": "550.54", "ecc": "on", "power_limit_w": 700, "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 3201,
          "torch": "2.4.0", "cuda_runtime": "12.4", "python": "3.11.9", "gpu_name": "NVIDIA H200",
          "memory_total_mib": 143771}
TEST = "benchmarks/test_gemm.py::test_gemm[fp16]"


def record(
    value: float,
    *,
    name: str = "fp16_tflops",
    unit: str = "TFLOPS",
    direction: str = "higher",
    kind: str = "tensor",
    gpu: str = "NVIDIA H200",
    profile: str = "3g.71gb",
    target_kind: str = "mig",
    fingerprint: dict[str, Any] | None = None,
    info: dict[str, Any] | None = None,
    compare_: bool = True,
    mode: str = "normal",
) -> ResultRecord:
    emulated = target_kind == "emulated"
    slug = "cpu" if target_kind == "cpu" else gpu.lower().replace(" ", "-")
    target = {"kind": target_kind, "profile": profile, "gpu_name": None if target_kind == "cpu" else gpu,
              "gpu_slug": slug, "emulated": emulated,
              "baseline_profile": f"{profile}-emulated" if emulated else profile}
    metric = Metric(name, value, unit, direction, [value] * 3, kind, dict(info or {}), compare_)  # type: ignore[arg-type]
    return ResultRecord(TEST, metric, TargetInfo.from_dict(target), dict(FP_OLD if fingerprint is None else fingerprint), node="n1",
                        mode=mode)


#: Ten unchanged runs of a quiet figure (run-to-run sigma about 0.3%).
QUIET = [100.0, 100.3, 99.8, 100.1, 99.6, 100.4, 99.9, 100.2, 99.7, 100.0]


def history(values: list[float], **kw: Any) -> list[ResultRecord]:
    return [record(v, **kw) for v in values]


def judged(value: float, values: list[float] = QUIET, *, tolerance: float | None = None, **kw: Any):
    old = history(values, **{k: v for k, v in kw.items() if k not in ("fingerprint", "info")})
    return compare(record(value, **kw), entry_from_records(old), meta_from_record(old[-1]), tolerance=tolerance)


# --------------------------------------------------------------------------- the band (pytest_mig.judge.noise)


def test_the_threshold_is_k_run_to_run_sigmas_with_a_floor() -> None:
    b = band(QUIET)
    assert b.runs == 10 and b.center == pytest.approx(100.0, abs=0.05) and b.gates
    assert b.sigma == pytest.approx(run_sigma(QUIET)) and 0.002 < b.sigma < 0.004
    assert b.threshold == pytest.approx(K * b.sigma) and b.basis == "noise"
    assert b.detectable == pytest.approx(b.threshold + 2.2 * b.sigma)
    flat = band([100.0, 100.01, 99.99, 100.0, 100.02])
    assert flat.threshold == FLOOR and flat.basis == "floor"  # sub-noise wiggles never fail


def test_sigma_takes_the_larger_of_mad_and_sd_but_forgives_one_dip_from_eight_runs() -> None:
    five = [100.0, 100.0, 100.1, 97.5, 102.4]  # MAD says 0.15%, the runs themselves say 1.8%
    assert run_sigma(five) == pytest.approx(0.0176, rel=0.05)
    dip = QUIET[:9] + [95.0]  # one transient dip among 10 runs
    assert run_sigma(dip) == pytest.approx(run_sigma(QUIET[:9]), rel=0.6) and run_sigma(dip) < 0.006
    two_dips = QUIET[:8] + [95.0, 94.0]  # two are a pattern: the band widens
    assert run_sigma(two_dips) > 0.015


def test_too_few_runs_give_a_conservative_band_never_a_tight_one() -> None:
    assert band([100.0]).threshold == FEW_RUNS_BAND and band([100.0]).basis == "few-runs"
    assert band([100.0, 100.0, 100.0, 100.0]).threshold == FEW_RUNS_BAND
    wild = band([100.0, 130.0])
    assert wild.threshold > 0.5 and wild.sigma is None and wild.gates  # the few runs already disagree


def test_a_figure_whose_noise_needs_more_than_the_tolerance_does_not_gate() -> None:
    noisy = [100.0, 108.0, 93.0, 104.0, 97.0, 110.0, 91.0]
    b = band(noisy)
    assert not b.gates and b.threshold > 0.05
    assert band(noisy, default_tolerance=0.6).gates
    capped = band(noisy, tolerance=0.08)  # a site's tolerance caps the threshold and gates it
    assert capped.gates and capped.threshold == 0.08 and capped.basis == "tolerance"
    assert band(QUIET, tolerance=0.5).threshold == band(QUIET).threshold  # a cap, never a widening


# --------------------------------------------------------------------------- compare


def test_unchanged_passes_and_the_line_says_threshold_and_smallest_detectable_change() -> None:
    v = judged(100.1)
    assert v.outcome == "pass" and not v.failed and v.runs == 10 and v.gates
    assert "baseline 100.0 TFLOPS (median of 10 runs): +0.1%, threshold" in v.message
    assert f"({K:g} x run-to-run sigma" in v.message and "detects >= " in v.message


def test_a_change_beyond_the_threshold_regresses_in_either_direction_of_better() -> None:
    v = judged(96.0)
    assert v.outcome == "regressed" and v.failed and v.change_pct == pytest.approx(-4.0, abs=0.05)
    assert "nothing in the fingerprint changed since the baseline" in v.message
    assert judged(104.0).outcome == "improved" and not judged(104.0).failed
    slower = judged(104.0, name="step_s", unit="s", direction="lower")
    assert slower.outcome == "regressed"  # a time that grew is worse
    assert judged(96.0, name="step_s", unit="s", direction="lower").outcome == "improved"


def test_too_noisy_to_gate_is_reported_never_regressed() -> None:
    noisy = [100.0, 108.0, 93.0, 104.0, 97.0, 110.0, 91.0]
    v = judged(60.0, noisy)
    assert v.outcome == "noisy" and not v.failed and v.gates is False
    assert "too noisy to gate (run-to-run CV" in v.message and "more than the 5% tolerance" in v.message
    assert v.line().startswith("TOO NOISY TO GATE ")
    assert judged(60.0, noisy, tolerance=0.1).outcome == "regressed"  # the site chose to gate it


def test_the_explicit_tolerance_wins_over_the_one_in_the_file() -> None:
    old = history([100.0])
    entry = entry_from_records(old, tolerance=0.03)
    assert compare(record(96.0), entry, meta_from_record(old[0])).outcome == "regressed"  # file: 3%
    assert compare(record(96.0), entry, meta_from_record(old[0]), tolerance=0.06).outcome == "pass"  # site: 6%


@pytest.mark.parametrize(
    ("old_kw", "new_kw", "phrase"),
    [
        ({"gpu": "NVIDIA A100-SXM4-80GB", "profile": "3g.40gb"}, {}, "baseline is for NVIDIA A100-SXM4-80GB"),
        ({"profile": "2g.35gb"}, {}, "baseline is for 2g.35gb"),
        ({}, {"target_kind": "emulated"}, "measured on an emulated profile"),
        ({"target_kind": "emulated"}, {}, "baseline is for an emulated profile"),
        ({"unit": "GFLOPS"}, {}, "re-record the baseline"),
        ({"mode": "quick"}, {}, "measured without --mig-quick but the baseline holds only quick runs"),
        ({}, {"mode": "quick"}, "measured with --mig-quick but the baseline holds only normal runs"),
    ],
)
def test_incomparable_is_never_compared(old_kw: dict[str, Any], new_kw: dict[str, Any], phrase: str) -> None:
    old = history([100.0] * 6, **old_kw)
    v = compare(record(50.0, **new_kw), entry_from_records(old), meta_from_record(old[0]))
    assert v.outcome == "incomparable" and not v.failed
    assert phrase in v.message
    assert v.change_pct is None


def test_no_baseline_and_info() -> None:
    assert compare(record(1.0), None, None).outcome == "no-baseline"
    info = compare(record(12288, name="size_at_peak", unit="n", compare_=False), None, None)
    assert info.outcome == "info" and not info.failed and "informational" in info.message


def test_fingerprint_diff_text() -> None:
    new = {**FP_OLD, "driver": "560.35", "torch": "2.5.1", "power_limit_w": 600, "gsp": None, "extra_key": 1}
    old = {**FP_OLD, "extra_key": 2}
    assert fingerprint_diff(old, new) == [
        "driver 550.54 -> 560.35", "GSP firmware 550.54 -> n/a", "power limit 700 W -> 600 W",
        "torch 2.4.0 -> 2.5.1", "extra_key 2 -> 1",
    ]
    assert fingerprint_diff(FP_OLD, dict(FP_OLD)) == []
    assert fingerprint_diff({"cuda_driver": 12040}, {"cuda_driver": 13000}) == ["CUDA driver 12.4 -> 13.0"]
    assert fingerprint_diff({}, {"driver": "1"}) == []  # unknown before: not called a change
    # another board of the same model: said, since energy per unit of work differs between boards
    assert fingerprint_diff({**FP_OLD, "gpu_uuid": "GPU-aaa"}, {**FP_OLD, "gpu_uuid": "GPU-bbb"}) == [
        "GPU board GPU-aaa -> GPU-bbb"]
    assert judged(90.0, fingerprint={**FP_OLD, "driver": "560.35"}).message.endswith(
        "since the baseline: driver 550.54 -> 560.35")


def test_a_regression_after_an_engine_or_suite_upgrade_names_it() -> None:
    """The run's fingerprint holds the versions of pytest-mig and the engines its workloads run
    through, so that a step after `pip install -U transformers` says what changed."""
    from pytest_mig import __version__
    from pytest_mig.device import nvml

    mine = nvml.software_versions()
    assert mine["pytest_mig"] == __version__ and "torch" in mine
    assert {k for k, _ in nvml.PACKAGES} >= set(mine) - {"torch", "cuda_runtime"}
    for key, dist in nvml.PACKAGES:  # an engine that is not installed is left out, not recorded as None
        assert key not in mine or mine[key]
    old = {**FP_OLD, "transformers": "4.57.1", "pytest_mig": "0.1.0", "openmm": "8.6.1"}
    new = {**FP_OLD, "transformers": "5.2.0", "pytest_mig": "0.2.0", "openmm": "8.6.1"}
    assert fingerprint_diff(old, new) == ["pytest-mig 0.1.0 -> 0.2.0", "transformers 4.57.1 -> 5.2.0"]
    saved = history(QUIET, fingerprint=old)
    v = compare(record(90.0, fingerprint=new), entry_from_records(saved), meta_from_record(saved[-1]))
    assert v.failed and v.message.endswith(
        "since the baseline: pytest-mig 0.1.0 -> 0.2.0, transformers 4.57.1 -> 5.2.0")
    assert fingerprint_diff(FP_OLD, new) == []  # a history saved before versions were recorded: no change named


def test_throttled_regression_fails_but_names_the_throttle() -> None:
    clocks = {"before": {"sm_clock_mhz": 1980, "throttle_reasons": [], "throttled": False},
              "after": {"sm_clock_mhz": 1410, "throttle_reasons": ["gpu_idle", "sw_power_cap"], "throttled": True}}
    v = judged(90.0, info={"clocks": clocks})
    assert v.outcome == "regressed" and v.failed and v.throttled == ["sw_power_cap"]
    assert "GPU was throttled during the measurement (sw_power_cap): not blamed on the driver" in v.message
    idle = {"after": {"throttle_reasons": ["gpu_idle", "applications_clocks_setting"], "throttled": False}}
    assert judged(100.0, info={"clocks": idle}).throttled == []


# --------------------------------------------------------------------------- confirmation


def test_a_regression_is_confirmed_only_when_every_re_measurement_is_beyond() -> None:
    old = history(QUIET)
    entry = entry_from_records(old)
    first = compare(record(95.0), entry, meta_from_record(old[0]))
    assert first.failed
    kept = confirm(first, record(95.0), [95.2, 94.8])
    assert kept.outcome == "regressed" and kept.failed and kept.confirmations == [95.2, 94.8]
    assert "confirmed: every re-measurement is beyond the threshold, 95.20, 94.80 TFLOPS" in kept.message
    dip = confirm(first, record(95.0), [95.1, 100.1])  # one came back: a transient, not a regression
    assert dip.outcome == "transient" and not dip.failed
    assert "a transient change, not a regression: re-measured 95.10, 100.1 TFLOPS" in dip.message
    assert confirm(first, record(95.0), [float("nan")]) is first  # nothing usable: the first stands
    passing = compare(record(100.0), entry, meta_from_record(old[0]))
    assert confirm(passing, record(100.0), [90.0]) is passing  # only verdicts beyond are re-judged


def test_the_judge_reads_each_file_once_and_confirms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = BaselineStore(tmp_path)
    for v in QUIET:
        store.save([record(v), record(3.9, name="copy_tbs", unit="TB/s", kind="memory")])
    loads = []
    real = store.load
    monkeypatch.setattr(store, "load", lambda *a: loads.append(a) or real(*a))
    j = Pipeline(StoreHistories(store))
    recs = [record(95.0), record(3.9, name="copy_tbs", unit="TB/s", kind="memory")]
    verdicts = j.judge(recs)
    assert [v.outcome for v in verdicts] == ["regressed", "pass"] and len(loads) == 1
    v = j.confirm(recs[0], verdicts[0], [99.9, 100.1])
    assert v.outcome == "transient"
    (again,) = j.judge(recs[:1], remeasure=lambda: {recs[0].metric.name: [99.9, 100.1]})
    assert again.outcome == "transient" and recs[0].verdict is not None and recs[0].verdict.outcome == "transient"
    assert len(loads) == 1


def test_the_clock_normalised_partner_says_whether_the_clock_or_the_kernel_moved() -> None:
    info = {"normalises": "fp16_tflops"}
    tflops = history(QUIET)
    cycles = history(QUIET, name="fp16_flop_per_sm_cycle", unit="FLOP/SM/cycle")
    e_t, e_c = entry_from_records(tflops), entry_from_records(cycles)
    meta = meta_from_record(tflops[0])
    capped = [record(92.0), record(100.0, name="fp16_flop_per_sm_cycle", unit="FLOP/SM/cycle", info=info)]
    vs = [compare(capped[0], e_t, meta), compare(capped[1], e_c, meta)]
    explain_clock(capped, vs)
    assert "per SM cycle it held" in vs[0].message and "a power or clock cap is the likely cause" in vs[0].message
    slower = [record(92.0), record(92.0, name="fp16_flop_per_sm_cycle", unit="FLOP/SM/cycle", info=info)]
    vs = [compare(slower[0], e_t, meta), compare(slower[1], e_c, meta)]
    explain_clock(slower, vs)
    assert "the kernel itself is slower per cycle" in vs[0].message
    assert vs[0].clock is not None and vs[0].clock.moved_too and vs[0].clock.metric == "fp16_flop_per_sm_cycle"


def test_a_throttled_figure_slower_per_cycle_is_not_blamed_on_the_throttle() -> None:
    """The message is rendered from the verdict's fields: once the per-cycle partner moved too, the
    throttle is no longer named as the likely cause, and rendering it again says the same."""
    throttled = {"clocks": {"after": {"sm_clock_mhz": 1410, "throttle_reasons": ["sw_power_cap"], "throttled": True}}}
    tflops = history(QUIET)
    cycles = history(QUIET, name="fp16_flop_per_sm_cycle", unit="FLOP/SM/cycle")
    meta = meta_from_record(tflops[0])
    recs = [record(92.0, info=throttled),
            record(92.0, name="fp16_flop_per_sm_cycle", unit="FLOP/SM/cycle", info={"normalises": "fp16_tflops"})]
    vs = [compare(recs[0], entry_from_records(tflops), meta), compare(recs[1], entry_from_records(cycles), meta)]
    assert "not blamed on the driver, the throttle is the likely cause" in vs[0].message
    explain_clock(recs, vs)
    once = vs[0].message
    assert "GPU was throttled during the measurement (sw_power_cap)" in once and "not blamed on the driver" not in once
    explain_clock(recs, vs)
    assert vs[0].message == once and once.count("per SM cycle") == 1


def test_a_judged_record_goes_to_its_results_file_and_back_unchanged(tmp_path: Path) -> None:
    """Typed in memory, a dict only in the file: the verdict's file form holds the fields it always
    held, the record reads back equal, and writing it again gives the same bytes."""
    from pytest_mig.store.results import read_results, write_results

    rec = record(92.0, info={"clocks": {"after": {"throttle_reasons": ["sw_power_cap"], "throttled": True}}})
    old = history(QUIET)
    rec.verdict = confirm(compare(rec, entry_from_records(old), meta_from_record(old[-1])), rec, [91.0, 92.5])
    assert set(rec.verdict.to_dict()) == {
        "outcome", "metric", "value", "baseline", "change_pct", "tolerance", "threshold", "sigma", "detectable", "runs",
        "gates", "confirmations", "fingerprint_changes", "throttled", "message", "unit", "test", "failed", "direction",
        "basis", "source", "sigma_of", "at_temperature", "warmth"}
    write_results(tmp_path / "a.json", [rec])
    (back,) = read_results(tmp_path / "a.json")
    assert back.target == rec.target and back.verdict is not None
    assert back.verdict.to_dict() == rec.verdict.to_dict() and back.verdict.confirmations == [91.0, 92.5]
    write_results(tmp_path / "b.json", [back])
    assert (tmp_path / "b.json").read_bytes() == (tmp_path / "a.json").read_bytes()


# --------------------------------------------------------------------------- against a store


def test_judge_against_a_store_cpu_runs_included(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    assert [v.outcome for v in Pipeline(StoreHistories(store)).judge([record(100.0)])] == ["no-baseline"]
    for v in QUIET:
        store.save([record(v, target_kind="cpu", profile="cpu")])
    assert [v.outcome for v in Pipeline(StoreHistories(store)).judge(
        [record(99.9, target_kind="cpu", profile="cpu")])] == ["pass"]
    assert [v.outcome for v in Pipeline(StoreHistories(store)).judge(
        [record(80.0, target_kind="cpu", profile="cpu")])] == ["regressed"]
    assert (tmp_path / "baselines" / "cpu" / "cpu.json").exists()


def test_failing_lines() -> None:
    vs = [judged(90.0), judged(100.0)]
    assert failing(vs) == [vs[0]]
    assert failure_text(vs).startswith(f"REGRESSED {TEST} fp16_tflops 90.00 TFLOPS, baseline 100.0 TFLOPS")


def test_parse_tolerance() -> None:
    assert parse_tolerance("5%") == pytest.approx(0.05)
    assert parse_tolerance("0.05") == pytest.approx(0.05)
    assert parse_tolerance(0.1) == pytest.approx(0.1)
    for bad, phrase in (("abc", "is not a number"), ("5", "ambiguous"), ("150%", "out of range"),
                        ("-1%", "out of range"), ("nan", "out of range"), ("100%", "out of range")):
        with pytest.raises(ValueError, match=phrase):
            parse_tolerance(bad)


def test_percentages_in_verdicts_never_use_exponents() -> None:
    v = judged(80.0, [100.0], tolerance=0.125)
    assert "-20.0%, threshold 12.5% (the tolerance set" not in v.message  # the few-runs band (10%) is tighter
    assert "threshold 10%: only 1 run(s)" in v.message
    capped = judged(80.0, [100.0], tolerance=0.0625)
    assert "threshold 6.2%" in capped.message or "threshold 6.3%" in capped.message
