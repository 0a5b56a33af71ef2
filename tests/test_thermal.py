"""Energy compared at the run's temperature: the leakage slope, and a history brought to this run's temperature."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any

import pytest

from pytest_mig.device.target import TargetInfo
from pytest_mig.judge.noise import Prior
from pytest_mig.judge.prior import Priors
from pytest_mig.judge.reference import SHIPPED, ReferenceStore
from pytest_mig.judge.thermal import (
    BOARDS, CAUTION, MARGIN_C, MAX_BROUGHT, MAX_PER_DEGREE, MAX_WARMTH_C, MIN_SLOPE_DOF, MIN_USED, STEEPEST, Slope,
    at_run_temperature, cap_for, hidden, history_temperature, pooled_slope, significant, slope_of, steepest_for,
    widening,
)
from pytest_mig.judge.verdict import compare
from pytest_mig.measure import Metric
from pytest_mig.store.baselines import entry_from_records
from pytest_mig.store.results import ResultRecord, read_results_file, write_results
from pytest_mig.store.verdicts import Verdict

FMA = "benchmarks/test_cuda_cores.py::test_cuda_core_fma[fp32]"
ENERGY = "fp32_fma_energy_j_per_tflop"
#: ten runs' spread of about 0.4%: a threshold of about 2%, which can catch a 5% loss
SPREAD10 = (1.000, 1.005, 0.995, 1.004, 0.996, 1.006, 0.994, 1.003, 0.997, 1.000)
SLOPE = Slope(0.005, 0.0005, 20)  # +0.5% per degC, clearly measured: used at its lower bound, +0.4%


def rec(value: float, temperature: float | None, *, name: str = ENERGY, kind: str = "energy",
        gpu: str = "NVIDIA H200", profile: str = "full", emulated: bool = False, board: str = "GPU-aaaa") -> ResultRecord:
    slug = gpu.lower().replace(" ", "-")
    target = {"kind": "emulated" if emulated else "full", "profile": profile, "gpu_name": gpu, "gpu_slug": slug,
              "emulated": emulated, "baseline_profile": f"{profile}-emulated" if emulated else profile}
    info: dict[str, Any] = {} if temperature is None else {"temperature_c": temperature}
    unit, direction = ("J/TFLOP", "lower") if kind == "energy" else ("TFLOPS", "higher")
    metric = Metric(name, value, unit, direction, [], kind, info)  # type: ignore[arg-type]
    return ResultRecord(FMA, metric, TargetInfo.from_dict(target), {"driver": "580.159.04", "gpu_uuid": board},
                        "2026-01-01T00:00:00+00:00", "n1")


def history(values_and_temps: list[tuple[float, float | None]]) -> Any:
    return entry_from_records([rec(v, t) for v, t in values_and_temps])


# --------------------------------------------------------------------------- the slope


def test_the_pooled_slope_is_fitted_within_boards_so_their_levels_do_not_bias_it() -> None:
    # two boards 8% apart, each +0.4%/degC; the warmer board is also the higher one, which a fit
    # across boards would read as a far steeper slope
    cool = [(t, 5.0 * math.exp(0.004 * t)) for t in (40.0, 42.0, 44.0, 46.0, 48.0)]
    warm = [(t, 5.4 * math.exp(0.004 * t)) for t in (60.0, 61.0, 63.0, 65.0, 66.0)]
    s = pooled_slope([cool, warm])
    assert s is not None and s.per_degree == pytest.approx(0.004) and s.dof == 10 - 2 - 1
    assert significant(s) and (s.low_c, s.high_c) == (40.0, 66.0)


def test_no_slope_from_too_few_runs_or_one_temperature() -> None:
    few = [(40.0 + i, 5.0 + i * 0.02) for i in range(MIN_SLOPE_DOF + 1)]  # one board: dof = points - 2
    assert pooled_slope([few]) is None
    assert pooled_slope([few + [(50.0, 5.3)]]) is not None
    flat = [(45.0, 5.0 + i * 0.01) for i in range(12)]
    assert pooled_slope([flat]) is None


@pytest.mark.parametrize("slope, used", [
    (Slope(0.004, 0.001, 10), True),
    (Slope(0.004, 0.0015, 10), False),  # under 3 standard errors
    (Slope(-0.004, 0.0001, 10), False),  # leakage never lowers energy
    (Slope(MAX_PER_DEGREE * 1.5, 0.0001, 10), False),  # steeper than leakage
    (Slope(float("nan"), 0.0001, 10), False),
    (None, False),
])
def test_only_a_positive_clearly_measured_slope_of_leakage_size_is_used(slope: Slope | None, used: bool) -> None:
    assert significant(slope) is used


def test_slope_of_leaves_out_runs_without_a_temperature() -> None:
    runs = {"a": [(40.0 + i, 5.0 * math.exp(0.005 * (40 + i))) for i in range(6)] + [(None, 99.0)],
            "b": [(50.0 + i, 5.2 * math.exp(0.005 * (50 + i))) for i in range(4)]}
    s = slope_of(runs)
    assert s is not None and s.per_degree == pytest.approx(0.005)


# --------------------------------------------------------------------------- a history at the run's temperature


def test_a_slope_is_used_at_its_lower_bound() -> None:
    # over-correcting turns a cool unchanged night into a regression; under-correcting never does
    assert SLOPE.cautious == pytest.approx(0.005 - CAUTION * 0.0005)
    assert Slope(0.004, 0.0013, 10).cautious == pytest.approx(0.004 - 2 * 0.0013)  # >= 3 se: a third left at least
    assert Slope(0.004, 0.003, 10).cautious == 0.0


def test_a_history_is_brought_to_the_run_temperature() -> None:
    warm = at_run_temperature({"temperature_c": 44.0}, [(5.0, 40.0), (5.1, 42.0)], SLOPE)
    assert warm is not None and warm.run_c == 44.0 and warm.history_c == 41.0 and warm.per_degree == SLOPE.cautious
    assert warm.values == pytest.approx([5.0 * math.exp(0.004 * 4), 5.1 * math.exp(0.004 * 2)])
    assert "at this run's 44 °C" in warm.text() and "median 41 °C" in warm.text() and "+0.40%/°C" in warm.text()


def test_no_run_is_moved_by_more_than_its_cap() -> None:
    # a board whose own slope is flat, brought 15 degC at the pool's: at most the cap of a loss hidden
    runs = [(5.0, 40.0), (5.0, 54.0), (5.0, 70.0)]
    warm = at_run_temperature({"temperature_c": 55.0}, runs, SLOPE)
    assert warm is not None and MAX_BROUGHT == 0.02
    assert warm.values == pytest.approx([5.0 * 1.02, 5.0 * math.exp(0.004), 5.0 / 1.02])
    half = at_run_temperature({"temperature_c": 55.0}, runs, SLOPE, cap=0.01)
    assert half is not None and half.values == pytest.approx([5.0 * 1.01, 5.0 * math.exp(0.004), 5.0 / 1.01])
    assert at_run_temperature({"temperature_c": 55.0}, runs, SLOPE, cap=0.5).values == warm.values  # type: ignore[union-attr]


def test_a_verdict_moves_no_run_by_more_than_half_its_threshold() -> None:
    # a flat board on a night 4 degC cooler than its history: the slope alone never raises the alarm
    hist = history([(5.00, 55.0), (5.01, 56.0), (4.99, 55.0)])
    cool = compare(rec(5.00, 51.0), hist, prior=Prior(0.003), slope=SLOPE)
    assert cool.at_temperature and cool.outcome == "pass"
    half = 5 * 0.003 * math.sqrt(1 + 1 / 3) / 2  # of the band's threshold, before any widening for warmth
    assert (cool.change_pct or 0) == pytest.approx(100 * half, rel=0.01)


@pytest.mark.parametrize("run_c, history_c, brought", [
    (50.0, 45.0, True), (40.0 - MARGIN_C, 45.0, True), (40.0 - MARGIN_C - 1, 45.0, False),
    (60.0, 60.0 + MARGIN_C + 1, False), (0.0, 45.0, False), (255.0, 45.0, False),
])
def test_no_temperature_beyond_those_the_slope_was_fitted_over(run_c: float, history_c: float, brought: bool) -> None:
    fitted = Slope(0.005, 0.0005, 20, 40.0, 60.0)
    assert (at_run_temperature({"temperature_c": run_c}, [(5.0, history_c)] * 3, fitted) is not None) is brought


@pytest.mark.parametrize("info, runs, slope", [
    ({}, [(5.0, 40.0)], SLOPE),  # the run read no temperature
    ({"temperature_c": 50.0}, [(5.0, 40.0), (5.0, None)], SLOPE),  # a run of the history read none
    ({"temperature_c": 50.0}, [(5.0, 40.0)], Slope(0.005, 0.01, 20)),  # a slope not clearly measured
    ({"temperature_c": 50.0}, [(5.0, 40.0)], None),
    ({"temperature_c": 50.0}, [], SLOPE),
    ({"temperature_c": float("nan")}, [(5.0, 40.0)], SLOPE),
    ({"temperature_c": True}, [(5.0, 40.0)], SLOPE),
])
def test_otherwise_the_history_is_judged_as_it_read(info: dict[str, Any], runs: list[Any], slope: Slope | None) -> None:
    assert at_run_temperature(info, runs, slope) is None


def test_a_hot_start_passes_at_its_temperature_where_as_read_it_fails() -> None:
    hist = history([(5.00, 40.0), (5.01, 41.0), (4.99, 40.0)])
    hot = rec(5.00 * math.exp(0.005 * 5), 45.0)  # +2.5%: leakage of 5 degC, nothing else
    prior = Prior(0.004)
    as_read = compare(hot, history([(5.00, None), (5.01, None), (4.99, None)]), prior=prior)  # runs that read none
    assert as_read.outcome == "regressed" and as_read.at_temperature is None and as_read.warmth is None
    warm = compare(hot, hist, prior=prior, slope=SLOPE)
    assert warm.outcome == "pass" and 0 < (warm.change_pct or 0) < 1.5  # the lower bound and the cap leave a little
    assert warm.sigma == pytest.approx(as_read.sigma)  # the prior is as the runs read
    assert warm.at_temperature and "at this run's 45 °C" in warm.message and "(leakage)" in warm.message


def test_a_real_loss_at_another_temperature_is_still_caught() -> None:
    hist = history([(5.00, 40.0), (5.01, 41.0), (4.99, 40.0)])
    worse = rec(5.00 * math.exp(0.005 * 5) * 1.08, 45.0)  # 8% more energy beyond the leakage
    v = compare(worse, hist, prior=Prior(0.004), slope=SLOPE)
    assert v.outcome == "regressed" and v.change_pct == pytest.approx(9.5, abs=0.3)  # moved half its threshold
    cooler = rec(5.00 * 1.08 * math.exp(-0.005 * 4), 36.0)  # a cool night hides part of it as read
    assert compare(cooler, hist, prior=Prior(0.004)).change_pct == pytest.approx(5.9, abs=0.2)
    v = compare(cooler, hist, prior=Prior(0.004), slope=SLOPE)
    assert v.outcome == "regressed" and v.change_pct == pytest.approx(7.1, abs=0.2)


def test_the_sigma_stays_as_the_runs_read() -> None:
    # ten runs whose spread is mostly their temperatures: brought to one, they would look quiet
    runs = [(5.0 * math.exp(0.005 * t), t) for t in (40.0, 55.0, 42.0, 58.0, 45.0, 60.0, 41.0, 52.0, 47.0, 56.0)]
    hist = history(runs)
    night = rec(5.0 * math.exp(0.005 * 50), 50.0)
    as_read, warm = compare(night, hist), compare(night, hist, slope=SLOPE)
    assert warm.sigma == as_read.sigma and warm.threshold == as_read.threshold
    assert warm.outcome == "noisy" and warm.at_temperature is None  # it cannot catch 5%: nothing may move it


def test_a_rate_figure_is_never_brought_to_a_temperature() -> None:
    hist = entry_from_records([rec(v, t, name="fp32_fma_tflops", kind="compute") for v, t in [(60.0, 40.0)] * 3])
    hist.runs = [replace(r, temperature_c=40.0) for r in hist.runs]  # as if its runs had read one
    v = compare(rec(60.0, 50.0, name="fp32_fma_tflops", kind="compute"), hist, prior=Prior(0.004), slope=SLOPE)
    assert v.at_temperature is None and v.change_pct == pytest.approx(0.0)


def test_the_note_survives_a_results_file(tmp_path: Any) -> None:
    hot = rec(5.10, 44.0)
    hot.verdict = compare(hot, history([(5.0, 40.0)] * 3), prior=Prior(0.004), slope=SLOPE)
    path = tmp_path / "r.json"
    write_results(path, [hot])
    back = read_results_file(path)[0][0].verdict
    assert isinstance(back, Verdict) and back.at_temperature == hot.verdict.at_temperature is not None


# --------------------------------------------------------------------------- warmth beyond what the band holds

STEEP = Slope(0.003, 0.0003, 20)  # +0.3%/degC pooled: a board taken to reach +0.6%/degC (BOARDS)


def test_the_steepest_board_is_twice_the_pooled_slope_and_never_over_1_percent_per_degree() -> None:
    assert BOARDS == 2.0 and STEEPEST == 0.01
    assert steepest_for(STEEP) == pytest.approx(BOARDS * 0.003)
    assert steepest_for(Slope(0.008, 0.0008, 20)) == STEEPEST
    assert steepest_for(Slope(0.0005, 0.0005, 20)) == pytest.approx(0.003)  # not significant: its upper bound
    assert steepest_for(Slope(-0.002, 0.0005, 20)) == 0.0  # energy that falls as it warms: none
    assert steepest_for(None) == steepest_for(Slope(float("nan"), 0.0, 20)) == STEEPEST  # none fitted


@pytest.mark.parametrize("run_c, history_c, brought, widen", [
    (55.0, 45.0, 0.0, 0.06 - 0.01),  # 10 degC at 0.6%/degC, less half a 2% threshold
    (55.0, 45.0, 0.012, 0.06 - 0.012 - 0.01),  # less what the history was brought
    (45.0 + MAX_WARMTH_C + 100, 45.0, 0.0, MAX_WARMTH_C * 0.006 - 0.01),  # a glitch counts MAX_WARMTH_C at most
    (35.0, 45.0, -0.012, 0.0),  # a cool night raises no false alarm: its band stays
    (46.0, 45.0, 0.0, 0.0),  # within what half the threshold holds
    (None, 45.0, 0.0, 0.0), (55.0, None, 0.0, 0.0),
])
def test_a_band_widens_by_what_a_steep_board_moves_beyond_what_it_holds(
        run_c: float | None, history_c: float | None, brought: float, widen: float) -> None:
    assert widening(run_c, history_c, STEEP, brought, 0.02) == pytest.approx(widen)


def test_a_cool_night_claims_no_loss_its_leakage_may_hide() -> None:
    assert hidden(35.0, 45.0, STEEP, -0.012) == pytest.approx(0.06 - 0.012)
    assert hidden(55.0, 45.0, STEEP, 0.012) == 0.0 and hidden(None, 45.0, STEEP, 0.0) == 0.0
    assert widening(55.0, 45.0, STEEP, 0.0, float("nan")) == 0.0 and hidden(35.0, 45.0, STEEP, float("inf")) == 0.0
    hist = history([(5.00, 44.0), (5.01, 46.0), (4.99, 45.0)])
    near = compare(rec(5.00, 45.0), hist, prior=Prior(0.004), slope=STEEP)
    cool = compare(rec(5.00 * 1.04 * math.exp(-0.006 * 10), 35.0), hist, prior=Prior(0.004), slope=STEEP)  # 4% hidden
    brought = (cool.baseline or 0) / 5.00 - 1
    assert cool.outcome == "pass" and cool.threshold == pytest.approx(near.threshold)  # no wider
    assert cool.detectable == pytest.approx((near.detectable or 0) + hidden(35.0, 45.0, STEEP, brought))
    assert "read 10 °C cooler than its runs (median 45 °C): leakage (up to 0.60%/°C) may hide" in cool.message
    leakage = compare(rec(5.00 * math.exp(-0.006 * 10), 35.0), hist, prior=Prior(0.004), slope=STEEP,
                      improvement_fails=True)
    assert leakage.outcome == "improved" and not leakage.failed  # a cool night's leakage fails no improvement
    gain = compare(rec(5.00 * 0.70, 44.0), hist, prior=Prior(0.004), slope=STEEP, improvement_fails=True)
    assert gain.outcome == "improved" and gain.failed  # one far beyond what it may owe the cool still does
    glitch = compare(rec(5.00 * 1.30, 45.0 + 100), hist, prior=Prior(0.004), slope=STEEP)
    assert glitch.outcome == "regressed" and f"(median 45 °C, counted as {MAX_WARMTH_C:g} °C)" in glitch.message


def test_a_re_measurement_widened_further_widens_what_the_verdict_detects(tmp_path: Any) -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    a100 = "NVIDIA A100-SXM4-80GB"
    pipeline = Pipeline(RecordHistories([[rec(5.0 * f, 45.0, gpu=a100)] for f in SPREAD10]),
                        references=ReferenceStore(SHIPPED))
    loss = rec(5.0 * 1.05, 45.0, gpu=a100)  # a real 5% loss on a board whose energy ignores its temperature
    (first,) = pipeline.judge([loss])

    def rerun() -> Remeasured:  # re-read far warmer, the loss as it was
        again = Remeasured()
        for t in (54.0, 56.0):
            again.keep(rec(5.0 * 1.05, t, gpu=a100).metric, False)
        return again
    (v,) = pipeline.judge([loss], remeasure=rerun)
    assert first.outcome == "regressed" and v.outcome == "transient"
    assert (v.detectable or 0) - (first.detectable or 0) > 0.05  # it no longer claims what its re-runs cannot show
    assert "re-measured warmer: what it detects widened by" in v.message
    loss.verdict = v
    write_results(tmp_path / "night.json", [loss])
    (back,) = read_results_file(tmp_path / "night.json")[0]
    (again,) = pipeline.judge_runs([back])  # pytest-mig compare: its re-measurements keep no temperature
    assert again.outcome == v.outcome and again.detectable == pytest.approx(v.detectable) and again.message == v.message


def test_the_history_s_temperature_is_its_runs_median_where_most_read_one() -> None:
    assert history_temperature([44.0, 60.0, 44.0, None]) == 44.0  # one warm run does not move it
    assert history_temperature([44.0, None, None]) is None and history_temperature([]) is None


def test_an_energy_figure_far_warmer_than_its_history_is_judged_with_its_band_widened(tmp_path: Any) -> None:
    hist = history([(5.00, 44.0), (5.01, 46.0), (4.99, 45.0)])
    within = compare(rec(5.00, 45.0), hist, prior=Prior(0.004), slope=STEEP)
    hot = rec(5.00 * math.exp(steepest_for(STEEP) * 10), 55.0)  # a steep board's leakage over 10 degC alone
    v = compare(hot, hist, prior=Prior(0.004), slope=STEEP)
    brought = (v.baseline or 0) / 5.00 - 1
    widen = widening(55.0, 45.0, STEEP, brought, within.threshold or 0)
    assert v.outcome == "pass" and v.at_temperature and 0 < brought < 0.02 and widen > 0.02
    assert v.threshold == pytest.approx((within.threshold or 0) + widen)
    assert v.detectable == pytest.approx((within.detectable or 0) + widen) and not v.catches(0.05)
    assert (f"read 10 °C warmer than its runs (median 45 °C): its {100 * (within.threshold or 0):.1f}% threshold widened "
            f"by {100 * widen:.1f}% for leakage") in v.message
    hot.verdict = v
    write_results(tmp_path / "r.json", [hot])
    back = read_results_file(tmp_path / "r.json")[0][0].verdict
    assert isinstance(back, Verdict) and back.warmth == v.warmth and back.message == v.message
    fan = compare(rec(5.00 * 1.20, 55.0), hist, prior=Prior(0.004), slope=STEEP)  # more than warmth explains
    assert fan.outcome == "regressed" and fan.failed and "threshold widened" in fan.message
    as_read = compare(hot, hist, prior=Prior(0.004))  # no slope known: the steepest, 1%/degC
    assert as_read.outcome == "pass" and as_read.at_temperature is None and "up to 1.00%/°C" in as_read.message


def test_near_its_history_s_temperature_a_loss_is_still_caught_at_its_band() -> None:
    hist = history([(5.00, 44.0), (5.01, 46.0), (4.99, 45.0)])
    v = compare(rec(5.00 * 1.05, 46.0), hist, prior=Prior(0.004), slope=STEEP)
    assert v.outcome == "regressed" and v.warmth is None and v.basis == "short"


def test_a_rate_figure_is_judged_at_any_temperature() -> None:
    rate = entry_from_records([rec(60.0, 40.0, name="fp32_fma_tflops", kind="compute")] * 3)
    rate.runs = [replace(r, temperature_c=40.0) for r in rate.runs]
    v = compare(rec(57.0, 60.0, name="fp32_fma_tflops", kind="compute"), rate, prior=Prior(0.004))
    assert v.outcome == "regressed" and v.warmth is None


def test_a_warmer_re_measurement_meets_the_band_it_would_have_had() -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    pipeline = Pipeline(RecordHistories([[triad(0.12 * f, 45.0)] for f in SPREAD10]), references=ReferenceStore(SHIPPED))
    slope = Priors(ReferenceStore(SHIPPED)).slope_for(triad(0.12, 45.0))
    steep = steepest_for(slope)
    first = triad(0.1200 * math.exp(steep * 2) * 1.04, 47.0)  # a blip on a steep board 2 degC warmer

    def rerun() -> Remeasured:  # unchanged, and read far warmer
        again = Remeasured()
        for t in (55.0, 57.0):
            again.keep(triad(0.1200 * math.exp(steep * (t - 45)), t).metric, False)
        return again
    (v,) = pipeline.judge([first])
    assert v.outcome == "regressed" and v.warmth is None
    (again,) = pipeline.judge([first], remeasure=rerun)
    assert again.outcome == "transient"  # a re-run's warmth confirms nothing
    loss = triad(0.1200 * math.exp(steep * 2) * 1.10, 47.0)

    def rerun_lost() -> Remeasured:  # a real 10% loss, re-read far warmer
        again = Remeasured()
        for t in (55.0, 57.0):
            again.keep(triad(0.1200 * math.exp(steep * (t - 45)) * 1.10, t).metric, False)
        return again
    assert pipeline.judge([loss], remeasure=rerun_lost)[0].outcome == "regressed"


def test_a_widened_verdict_of_a_results_file_is_judged_again_as_the_run_judged_it(tmp_path: Any) -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    a100 = "NVIDIA A100-SXM4-80GB"  # no reference slope: not brought, only widened
    pipeline = Pipeline(RecordHistories([[rec(5.0 * f, 45.0, gpu=a100)] for f in SPREAD10]),
                        references=ReferenceStore(SHIPPED))
    first = rec(5.0 * 1.12, 53.0, gpu=a100)

    def rerun() -> Remeasured:  # re-read warmer still
        again = Remeasured()
        for t in (56.0, 57.0):
            again.keep(rec(5.0 * 1.12, t, gpu=a100).metric, False)
        return again
    (live,) = pipeline.judge([first], remeasure=rerun)
    assert live.warmth and live.at_temperature is None and live.confirmations
    write_results(tmp_path / "night.json", [first])
    (back,) = read_results_file(tmp_path / "night.json")[0]
    (again,) = pipeline.judge_runs([back])
    assert again.outcome == live.outcome and again.confirmations == pytest.approx(live.confirmations)


# --------------------------------------------------------------------------- where the slope comes from


def test_the_shipped_references_give_the_leakage_slope_of_energy_figures() -> None:
    priors = Priors(ReferenceStore(SHIPPED))
    s = priors.slope_for(rec(5.0, 50.0))
    assert s is not None and significant(s) and 0.001 < s.cautious < s.per_degree < 0.015
    flat = Slope(0.00025, 0.00008, 20)  # used at 0.009%/degC: nothing brought, judged as read
    assert significant(flat) and 0 < flat.cautious < MIN_USED
    assert at_run_temperature({"temperature_c": 50.0}, [(5.0, 48.0)], flat) is None
    assert s.low_c < 50.0 < s.high_c
    assert priors.slope_for(rec(60.0, 50.0, name="fp32_fma_tflops", kind="compute")) is None  # a rate
    assert priors.slope_for(rec(5.0, 50.0, profile="1g.18gb", emulated=True)) is None  # no temperatures held
    assert priors.slope_for(rec(5.0, 50.0, gpu="NVIDIA A100-SXM4-80GB")) is None  # no reference


def test_a_site_reference_folder_without_the_model_leaves_the_shipped_slope(tmp_path: Any) -> None:
    shipped = Priors(ReferenceStore(SHIPPED)).slope_for(rec(5.0, 50.0))
    assert shipped is not None and Priors(ReferenceStore(tmp_path)).slope_for(rec(5.0, 50.0)) == shipped


def test_a_gpu_without_a_reference_is_judged_as_read() -> None:
    a100 = rec(5.25, 44.0, gpu="NVIDIA A100-SXM4-80GB")
    hist = entry_from_records([rec(5.0, 40.0, gpu="NVIDIA A100-SXM4-80GB")] * 3)
    priors = Priors(ReferenceStore(SHIPPED))
    v = compare(a100, hist, prior=priors.for_record(a100, hist), slope=priors.slope_for(a100))
    assert v.at_temperature is None and v.change_pct == pytest.approx(5.0)


# --------------------------------------------------------------------------- through the pipeline

STREAM = "benchmarks/test_bandwidth.py::test_stream[fp32]"
TRIAD = "fp32_triad_energy_j_per_gb"


def triad(value: float, temperature: float | None) -> ResultRecord:
    r = rec(value, temperature, name=TRIAD)
    return ResultRecord(STREAM, Metric(TRIAD, value, "J/GB", "lower", [], "energy",  # type: ignore[arg-type]
                                       {} if temperature is None else {"temperature_c": temperature}),
                        r.target, r.fingerprint, r.timestamp, r.node)


def test_the_pipeline_brings_an_h200_energy_history_to_the_run_temperature() -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories
    slope = Priors(ReferenceStore(SHIPPED)).slope_for(triad(0.12, 50.0))
    assert slope is not None and slope.covers(45.0) and slope.covers(52.0)
    pipeline = Pipeline(RecordHistories([[triad(0.12 * f, 45.0)] for f in SPREAD10]), references=ReferenceStore(SHIPPED))
    (v,) = pipeline.judge([triad(0.1200 * math.exp(slope.per_degree * 4), 49.0)])
    assert v.at_temperature and "at this run's 49 °C" in v.message and "none moved more than" in v.message
    assert 0 < (v.change_pct or 0) < 100 * (math.exp(slope.per_degree * 4) - 1)
    (as_read,) = Pipeline(RecordHistories([[triad(0.12 * f, None)] for f in SPREAD10]),
                          references=ReferenceStore(SHIPPED)).judge([triad(0.1200 * math.exp(slope.per_degree * 4), 49.0)])
    assert as_read.at_temperature is None and (as_read.change_pct or 0) > (v.change_pct or 0) + 0.5


def test_a_re_measurement_is_brought_back_to_the_first_measurement_temperature() -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    slope = Priors(ReferenceStore(SHIPPED)).slope_for(triad(0.12, 47.0))
    assert slope is not None
    history = RecordHistories([[triad(0.12 * f, 47.0)] for f in SPREAD10])
    pipeline = Pipeline(history, references=ReferenceStore(SHIPPED))
    s = slope.cautious
    first = triad(0.1200 * math.exp(s * (43 - 47)) * 1.06, 43.0)  # a blip on a cool start

    def rerun(with_temperatures: bool) -> Remeasured:
        again = Remeasured()
        for _ in range(2):  # unchanged, and warmer: 50 degC
            again.keep(triad(0.1200 * math.exp(s * (50 - 47)), 50.0 if with_temperatures else None).metric, False)
        return again
    assert pipeline.judge([first])[0].outcome == "regressed"
    brought = pipeline.judge([first], remeasure=lambda: rerun(True))[0]
    assert brought.outcome == "transient" and "brought to this run's temperature" in brought.message
    # without their temperatures they are judged as they read: against the baseline as its runs read it
    assert pipeline.judge([first], remeasure=lambda: rerun(False))[0].outcome == "transient"


def test_each_re_measurement_is_brought_alone_or_judged_as_it_read() -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    history = RecordHistories([[triad(0.12 * f, 47.0)] for f in SPREAD10])
    pipeline = Pipeline(history, references=ReferenceStore(SHIPPED))
    first = triad(0.1300, 47.0)
    (v,) = pipeline.judge([first])
    s = Priors(ReferenceStore(SHIPPED)).slope_for(first).cautious  # type: ignore[union-attr]
    most = math.log1p(cap_for(v.threshold or 0, v.detectable or 0, v.tolerance or 0))
    assert 0 < most < 0.02

    def base_at(t: float) -> float:  # the history brought to t, no run moved further than the cap
        return 0.12 * math.exp(min(max(s * (t - 47), -most), most))
    assert v.at_temperature and v.baseline == pytest.approx(base_at(47))
    again = Remeasured()
    again[TRIAD], again.temperatures[TRIAD] = [0.121, 0.122, 0.123, 0.124], [50.0, None, 44.0, 80.0]
    out, _ = pipeline._at_first_temperature(first, v, again)
    as_read = v.baseline / 0.1200  # what the baseline was moved by
    slope = Priors(ReferenceStore(SHIPPED)).slope_for(first)

    def warmer(t: float, brought: float) -> float:  # the widening a first reading at t would have had
        return (v.baseline or 0) * widening(t, 47.0, slope, brought, v.threshold or 0)
    assert v.warmth is None and warmer(80.0, 0.0) > 0.1 * 0.12
    assert out == pytest.approx([0.121 * base_at(47) / base_at(50) - warmer(50.0, base_at(50) / 0.12 - 1),
                                 0.122 * as_read,
                                 0.123 * base_at(47) / base_at(44) - warmer(44.0, base_at(44) / 0.12 - 1),
                                 0.124 * as_read - warmer(80.0, 0.0)])  # 80 degC: not covered, and far warmer
    again[TRIAD], again.temperatures[TRIAD] = [0.121, 0.122], [50.0]
    assert pipeline._at_first_temperature(first, v, again)[0] == pytest.approx(
        [0.121 * as_read, 0.122 * as_read])  # temperatures that do not line up: none is used
    again.brought.add(TRIAD)
    assert pipeline._at_first_temperature(first, v, again) == ([0.121, 0.122], 0.0)  # brought already


def test_a_re_run_keeps_each_temperature_beside_its_value() -> None:
    from types import SimpleNamespace
    from pytest_mig.device.host import SHARED_HOST
    from pytest_mig.session import _remeasure
    bench = SimpleNamespace(remeasured=None)
    runs = iter([(0.121, 50.0, False), (0.119, 51.0, True), (0.122, None, False), (0.123, 53.0, False)])

    def runtest() -> None:
        value, t, shared = next(runs)
        info: dict[str, Any] = {} if t is None else {"temperature_c": t}
        if shared:
            info[SHARED_HOST] = "GPU 3 of this host moved ..."
        bench.remeasured.append(Metric(TRIAD, value, "J/GB", "lower", [], "energy", info))  # type: ignore[arg-type]

    got = _remeasure(SimpleNamespace(runtest=runtest), bench, 4)  # type: ignore[arg-type]
    assert got == {TRIAD: [0.121, 0.122, 0.123]} and got.shared == {TRIAD: [0.119]}
    assert got.temperatures == {TRIAD: [50.0, None, 53.0]}


def test_a_history_with_a_value_no_measurement_gives_is_judged_as_read() -> None:
    assert at_run_temperature({"temperature_c": 50.0}, [(5.0, 40.0), (float("inf"), 40.0)], SLOPE) is None
    assert at_run_temperature({"temperature_c": 50.0}, [(5.0, 40.0), (0.0, 40.0)], SLOPE) is None


def test_a_results_file_is_judged_again_as_the_run_judged_it(tmp_path: Any) -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    slope = Priors(ReferenceStore(SHIPPED)).slope_for(triad(0.12, 47.0))
    assert slope is not None
    s = slope.per_degree  # the physics
    history = RecordHistories([[triad(0.12 * f, 47.0)] for f in SPREAD10])
    pipeline = Pipeline(history, references=ReferenceStore(SHIPPED))
    first = triad(0.1200 * math.exp(s * (43 - 47)) * 1.06, 43.0)  # a real 6% loss, on a cool start

    def rerun() -> Remeasured:
        again = Remeasured()
        for _ in range(2):
            again.keep(triad(0.1200 * math.exp(s * (50 - 47)) * 1.06, 50.0).metric, False)
        return again
    (live,) = pipeline.judge([first], remeasure=rerun)
    assert live.outcome == "regressed"
    write_results(tmp_path / "night.json", [first])
    (back,) = read_results_file(tmp_path / "night.json")[0]
    (again,) = pipeline.judge_runs([back])  # pytest-mig compare, the replay: the recorded re-measurements
    assert again.outcome == "regressed" and again.confirmations == pytest.approx(live.confirmations)


# --------------------------------------------------------------------------- the window's temperature, from older files


def _stream_run(gpu: str, energy_t: float | None, rate_t: float | None, *, at: str = "2026-01-01T00:00:00+00:00",
                profile: str = "full") -> list[ResultRecord]:
    base = rec(0.12, None, name=TRIAD, board=gpu)
    target = replace(base.target, uuid=gpu, profile=profile)
    rate_info: dict[str, Any] = {} if rate_t is None else {"clocks": {"after": {"temperature_c": rate_t}}}
    energy_info: dict[str, Any] = {} if energy_t is None else {"temperature_c": energy_t}
    return [ResultRecord(STREAM, Metric("fp32_triad_gbs", 4000.0, "GB/s", "higher", [], "memory", rate_info),  # type: ignore[arg-type]
                         target, base.fingerprint, at, "n1"),
            ResultRecord(STREAM, Metric(TRIAD, 0.12, "J/GB", "lower", [], "energy", energy_info),  # type: ignore[arg-type]
                         target, base.fingerprint, at, "n1")]


def _energy_temperatures(records: list[ResultRecord]) -> list[Any]:
    from pytest_mig.judge.reference import window_temperatures
    return [r.metric.info.get("temperature_c", "none kept") for r in window_temperatures(records)
            if r.metric.kind == "energy"]


def test_an_energy_figure_of_an_older_file_takes_its_window_s_read_from_the_rate_timing_it() -> None:
    assert _energy_temperatures(_stream_run("GPU-a", None, 47.0)) == [47.0]
    assert _energy_temperatures(_stream_run("GPU-a", 45.0, 47.0)) == [45.0]  # its own, where it kept one
    assert _energy_temperatures(_stream_run("GPU-a", None, None)) == ["none kept"]
    assert _energy_temperatures(_stream_run("GPU-a", None, 999.0)) == ["none kept"]  # no reading a GPU gives
    from pytest_mig.measure.clocks import after_temperature
    assert [after_temperature(i) for i in ({"clocks": 57}, {"clocks": {"after": 3}}, None)] == [None, None, None]


def test_another_gpu_s_run_of_the_same_test_at_the_same_time_lends_no_temperature() -> None:
    # a host's two GPUs, or a layout's two slices, start the test together; GPU-b's rate kept no clocks
    both = _stream_run("GPU-a", None, 71.0) + _stream_run("GPU-b", None, None)
    assert _energy_temperatures(both) == [71.0, "none kept"]
    slices = _stream_run("GPU-a", None, 60.0, profile="3g.40gb") + _stream_run("GPU-a", None, 50.0, profile="4g.40gb")
    assert _energy_temperatures(slices) == [60.0, 50.0]


def test_an_energy_figure_timed_with_several_rates_takes_none() -> None:
    run = _stream_run("GPU-a", None, 47.0)
    run.append(ResultRecord(STREAM, Metric("fp32_triad_step_s", 1.0, "s", "lower", [], "memory",  # type: ignore[arg-type]
                                           {"clocks": {"after": {"temperature_c": 48.0}}}),
                            run[0].target, run[0].fingerprint, run[0].timestamp, "n1"))
    run[1] = replace(run[1], metric=replace(run[1].metric, name="fp32_triad_energy_j_per_gb"))
    from pytest_mig.measure.metric import timing_partners
    assert len(timing_partners(TRIAD, "energy", [(r.metric.name, r.metric.kind) for r in run])) == 2
    assert _energy_temperatures(run) == ["none kept"]
    run[2] = replace(run[2], metric=replace(run[2].metric, info={}))  # one of the two kept no clocks
    assert _energy_temperatures(run) == ["none kept"]


def test_a_reference_built_from_an_older_file_keeps_the_window_s_temperature(tmp_path: Any) -> None:
    from pytest_mig.judge.reference import build
    from pytest_mig.store.reader import load_baseline_file
    paths = []
    for i, t in enumerate((44.0, 46.0)):
        path = tmp_path / f"night{i}.json"
        write_results(path, _stream_run("GPU-a", None, t, at=f"2026-01-0{i + 1}T00:00:00+00:00"))
        paths.append(path)
    built = build(paths, tmp_path / "ref")
    (entry,) = [e for f in built.files for e in load_baseline_file(f).entries.values() if e.metric == TRIAD]
    assert [r.temperature_c for r in entry.runs] == [44.0, 46.0]


def test_the_shipped_h100_reference_gives_its_stream_and_fma_energy_a_slope() -> None:
    priors = Priors(ReferenceStore(SHIPPED))
    h100 = "NVIDIA H100 80GB HBM3"
    bf16 = replace(rec(5.0, 50.0, gpu=h100, name="bf16_fma_energy_j_per_tflop"), test=FMA.replace("fp32", "bf16"))
    for r in (bf16, triad(0.12, 45.0)):
        r = replace(r, target=rec(5.0, 50.0, gpu=h100).target)
        s = priors.slope_for(r)
        assert s is not None and significant(s) and 0.001 < s.cautious < s.per_degree < 0.01


def test_pytest_mig_compare_reads_older_files_window_temperatures(tmp_path: Any) -> None:
    import io
    from pytest_mig.cli.compare import cmd_compare
    paths = []
    for i, f in enumerate(SPREAD10):
        path = tmp_path / f"night{i}.json"
        run = _stream_run("GPU-a", None, 40.0, at=f"2026-01-{i + 1:02d}T00:00:00+00:00")
        run[1] = replace(run[1], metric=replace(run[1].metric, value=0.12 * f))
        write_results(path, run)
        paths.append(path)
    hot = _stream_run("GPU-a", None, 52.0, at="2026-01-15T00:00:00+00:00")  # 12 degC warmer, 3.4% more energy
    hot[1] = replace(hot[1], metric=replace(hot[1].metric, value=0.1200 * 1.034))
    write_results(tmp_path / "hot.json", hot)
    out = io.StringIO()
    assert cmd_compare([*paths, tmp_path / "hot.json"], None, False, out, reference="shipped") == 0, out.getvalue()
    as_read = [*paths, tmp_path / "hot.json"]
    for p in as_read:  # the same nights with no temperature anywhere: judged as read, a regression
        text = p.read_text().replace('"temperature_c": 40.0', '"x": 0').replace('"temperature_c": 52.0', '"x": 0')
        p.write_text(text)
    assert cmd_compare(as_read, None, False, io.StringIO(), reference="shipped") == 1


def test_a_re_measurement_is_judged_as_a_first_measurement_at_its_temperature_would_be() -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    pipeline = Pipeline(RecordHistories([[triad(0.12 * f, 41.0)] for f in SPREAD10]), references=ReferenceStore(SHIPPED))
    first = triad(0.1200 * 1.05, 45.0)  # a board with no leakage of its own, and a real 5% loss
    (v,) = pipeline.judge([first])
    assert v.at_temperature and v.outcome == "regressed"
    for t in (45.0, 48.0, 52.0, 56.0):  # the last beyond what the slope covers: as read, and widened
        again = Remeasured()
        again[TRIAD], again.temperatures[TRIAD] = [0.1200 * 1.05], [t]
        (out,), _ = pipeline._at_first_temperature(first, v, again)
        (own,) = pipeline.judge([triad(0.1200 * 1.05, t)])  # no further brought, and its own widening
        beyond = (out / (v.baseline or 1) - 1) - (v.threshold or 0)
        assert beyond == pytest.approx((own.change_pct or 0) / 100 - (own.threshold or 0), abs=1e-9)
    assert v.warmth  # widened: a re-measurement whose temperature is unknown meets the first's band as it read
    again[TRIAD], again.temperatures[TRIAD] = [0.126], [None]
    as_read = (v.baseline or 0) / statistics.median([0.12 * f for f in SPREAD10])
    assert pipeline._at_first_temperature(first, v, again)[0] == pytest.approx([0.126 * as_read])


def test_a_warmer_re_measurement_confirms_nothing_where_the_first_was_neither_brought_nor_widened() -> None:
    from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
    a100 = "NVIDIA A100-SXM4-80GB"  # no reference slope: nothing brought, 1%/degC taken
    pipeline = Pipeline(RecordHistories([[rec(5.0 * f, 45.0, gpu=a100)] for f in SPREAD10]),
                        references=ReferenceStore(SHIPPED))
    (v,) = pipeline.judge([rec(5.0 * 1.03, 46.0, gpu=a100)])  # a blip, 1 degC warm
    assert v.outcome == "regressed" and v.warmth is None and v.at_temperature is None

    def rerun() -> Remeasured:  # unchanged, on a board of 0.5%/degC, re-read far warmer
        again = Remeasured()
        for t in (54.0, 56.0):
            again.keep(rec(5.0 * math.exp(0.005 * (t - 45)), t, gpu=a100).metric, False)
        return again
    assert pipeline.judge([rec(5.0 * 1.03, 46.0, gpu=a100)], remeasure=rerun)[0].outcome == "transient"
