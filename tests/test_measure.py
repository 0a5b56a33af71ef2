from __future__ import annotations

import time

import pytest

from pytest_mig.measure import (
    GpuClock, Metric, PowerSampler, Stats, Telemetry, Timer, energy_metrics, percentile,
)


def test_stats_are_robust_to_one_outlier() -> None:
    st = Stats.of([1.0, 1.01, 0.99, 1.0, 10.0])
    assert st.median == pytest.approx(1.0)
    assert st.mad == pytest.approx(0.01)
    assert st.max == 10.0 and st.n == 5
    assert st.cv > 1.0  # the outlier shows in the CV, not in the median


def test_stats_of_one_sample_and_none() -> None:
    assert Stats.of([2.0]).cv == 0.0
    with pytest.raises(ValueError):
        Stats.of([])


def test_percentile_interpolates() -> None:
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([5, 1, 3], 100) == 5


def test_metric_checks_direction_and_kind() -> None:
    with pytest.raises(ValueError):
        Metric("x", 1.0, "s", direction="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Metric("x", 1.0, "s", kind="vibes")
    m = Metric("tflops", 3, "TFLOPS", samples=[1, 2, 3])
    d = m.to_dict()
    assert d["value"] == 3.0 and d["stats"]["median"] == 2.0


def test_gpu_clock_is_monotonic_on_the_cpu() -> None:
    clock = GpuClock()
    values = [clock() for _ in range(50)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    t0 = clock()
    time.sleep(0.01)
    assert clock() - t0 >= 0.009


def test_timer_times_every_repeat_on_the_cpu() -> None:
    calls = []
    timing = Timer("cpu")(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and len(timing.samples) == 5
    assert timing.power is None and timing.clocks == {}


def test_power_sampler_prefers_the_energy_counter() -> None:
    energy = iter([1000.0, 3000.0])  # mJ before and after
    with PowerSampler(lambda: 100.0, lambda: next(energy), interval=0.01) as s:
        time.sleep(0.05)
    assert s.trace is not None
    assert s.trace.source == "energy-counter" and s.trace.energy_j == pytest.approx(2.0)
    assert s.trace.watts and all(w == 100.0 for w in s.trace.watts)


def test_power_sampler_survives_failing_readers() -> None:
    def broken() -> float:
        raise RuntimeError("NVML went away")

    with PowerSampler(broken, broken, interval=0.01) as s:
        time.sleep(0.03)
    assert s.trace is not None and s.trace.watts == [] and s.trace.joules is None


def test_energy_metrics_per_unit_of_work() -> None:
    tel = Telemetry(read_power_w=lambda: 200.0, interval=0.005, window_s=0.05)
    timing = Timer("cpu", tel)(lambda: time.sleep(0.01), warmup=0, repeats=3)
    assert 3 <= timing.energy_calls <= 6  # the energy window ran the work for ~50 ms
    ms = energy_metrics(timing, work_per_call=2.0, unit="TFLOP")
    names = {m.name: m for m in ms}
    assert names["power_w"].value == pytest.approx(200.0)
    per = names["energy_j_per_tflop"]
    assert per.unit == "J/TFLOP" and per.direction == "lower"
    # 200 W x ~10 ms per call / 2 TFLOP per call = ~1 J/TFLOP
    assert 0.5 < per.value < 3.0


def test_energy_figures_keep_the_temperature_read_as_their_window_ended() -> None:
    reads: list[int] = []

    def clocks() -> dict[str, int]:  # 41 C before the timing, warmer ever after
        reads.append(1)
        return {"sm_clock_mhz": 1980, "temperature_c": 41 if len(reads) == 1 else 57}

    tel = Telemetry(read_power_w=lambda: 200.0, interval=0.005, window_s=0.03, read_clocks=clocks)
    timing = Timer("cpu", tel)(lambda: time.sleep(0.005), warmup=0, repeats=2)
    per = {m.name: m for m in energy_metrics(timing, 1.0, "TFLOP")}["energy_j_per_tflop"]
    assert per.info["temperature_c"] == 57.0
    unread = Timer("cpu", Telemetry(read_power_w=lambda: 200.0, interval=0.005, window_s=0.03))(
        lambda: time.sleep(0.005), warmup=0, repeats=2)
    assert "temperature_c" not in {m.name: m for m in energy_metrics(unread, 1.0, "TFLOP")}["energy_j_per_tflop"].info


def test_no_energy_metrics_without_power() -> None:
    timing = Timer("cpu")(lambda: None, warmup=0, repeats=2)
    assert energy_metrics(timing, 1.0, "token") == []


def test_energy_comes_from_a_window_of_its_own_divided_by_its_calls() -> None:
    clock = {"mj": 0.0}
    calls = []

    def work() -> None:
        calls.append(1)
        clock["mj"] += 500.0  # every call costs 0.5 J on the (fake) energy counter
        time.sleep(0.002)

    tel = Telemetry(read_energy_mj=lambda: clock["mj"], window_s=0.3)
    timing = Timer("cpu", tel)(work, warmup=1, repeats=3)
    assert timing.energy_calls == timing.window_calls == len(calls) - 4  # not the warm-up or the repeats
    assert timing.power is not None and timing.power.source == "energy-counter"
    per = {m.name: m for m in energy_metrics(timing, 1.0, "call")}["energy_j_per_call"]
    assert per.value == pytest.approx(0.5, rel=0.15)  # power between counter ticks x the window / its calls
    half = per.info["first_half"]  # the figure a window half as long would have given, from the same ticks
    assert 0.1 <= half["window_s"] <= 0.2 and 0 < half["calls"] < timing.energy_calls
    assert half["value"] == pytest.approx(0.5, rel=0.15)


def test_energy_ticks_give_power_between_the_first_and_last_tick_inside_the_window() -> None:
    from pytest_mig.measure import EnergyTicks

    ticks = EnergyTicks(None)
    ticks.ticks = [(0.0, 0.0), (1.0, 700_000.0), (2.0, 1_400_000.0), (3.0, 2_400_000.0)]
    assert ticks.mean_power_w(0.5, 2.5) == pytest.approx(700.0)  # ticks at 1 s and 2 s only
    assert ticks.mean_power_w(0.0, 3.0) == pytest.approx(800.0)
    assert ticks.mean_power_w(0.5, 1.5) is None  # one tick: no power, rather than a guess


def test_an_average_above_the_power_limit_is_a_measurement_error_not_compared() -> None:
    from pytest_mig.measure import PowerTrace, Timing

    timing = Timing(samples=[0.01], power=PowerTrace([], 2.0, 1600.0, "energy-counter", limit_w=700.0), energy_calls=100)
    by = {m.name: m for m in energy_metrics(timing, 1.0, "TFLOP")}
    assert by["power_w"].value == pytest.approx(800.0)
    assert not by["energy_j_per_tflop"].compare and "above the enforced 700 W limit" in by["energy_j_per_tflop"].info["error"]
    ok = Timing(samples=[0.01], power=PowerTrace([], 2.0, 1300.0, "energy-counter", limit_w=700.0), energy_calls=100)
    assert {m.name: m for m in energy_metrics(ok, 1.0, "TFLOP")}["energy_j_per_tflop"].compare


def test_clock_info_holds_the_clock_sampled_through_the_window_beside_the_snapshots() -> None:
    from pytest_mig.measure import PowerTrace, Timing

    snaps = {"before": {"sm_clock_mhz": 1755}, "after": {"sm_clock_mhz": 1725, "throttled": True}}
    timing = Timing(samples=[0.01], power=PowerTrace([600.0], 1.5, 900.0, "energy-counter", 700.0, [1600.0, 1650.5]),
                    clocks=snaps, energy_calls=150)
    info = timing.clock_info()
    assert info["clocks"]["window"] == {"sm_clock_mhz": 1625.2} and info["clocks"]["after"]["sm_clock_mhz"] == 1725
    assert info["throttled"] is True and "window" not in snaps  # the snapshots themselves are left as read
    assert "window" not in Timing(samples=[0.01], clocks=snaps).clock_info()["clocks"]  # no window, no guess


def test_an_energy_counter_that_did_not_move_gives_no_figure_not_zero() -> None:
    tel = Telemetry(read_energy_mj=lambda: 1234.0, window_s=0.005)
    timing = Timer("cpu", tel)(lambda: None, warmup=0, repeats=2)
    assert energy_metrics(timing, 1.0, "call") == []


def test_rounds_last_long_enough_for_the_gpu_clock() -> None:
    from pytest_mig.measure.rounds import MAX_ITERATIONS, rounds_iterations

    assert rounds_iterations(0.0005, 0.01) == 20
    assert rounds_iterations(0.5, 0.01) == 1
    assert rounds_iterations(1e-9, 0.01) == MAX_ITERATIONS
    assert rounds_iterations(0.0, 0.01) == 1


def test_timed_calls_span_at_least_the_time_asked() -> None:
    from pytest_mig.measure import timed_repeats
    from pytest_mig.measure.timing import MAX_TIMED_REPEATS

    assert timed_repeats(0.013, 20, 2.0) == 154  # a 13 ms GEMM: 20 calls would span 0.26 s
    assert timed_repeats(0.15, 20, 2.0) == 20  # 20 calls of 150 ms already span 3 s
    assert timed_repeats(0.013, 20, 0.0) == 20 and timed_repeats(0.0, 20, 2.0) == 20
    assert timed_repeats(1e-9, 20, 2.0) == MAX_TIMED_REPEATS
    assert timed_repeats(5e-324, 20, 2.0) == timed_repeats(0.013, 20, float("inf")) == MAX_TIMED_REPEATS
    assert timed_repeats(0.013, 20, float("nan")) == timed_repeats(float("nan"), 20, 2.0) == 20


def test_pytest_benchmarks_rounds_span_the_time_asked_on_a_gpu(monkeypatch) -> None:
    import pytest_mig.bench as bench

    class Benchmark:
        enabled = True
        rounds = None

        def pedantic(self, fn, rounds, warmup_rounds, iterations):
            self.rounds, self.iterations = rounds, iterations
            self.stats = type("S", (), {"stats": type("D", (), {"data": [0.013] * rounds})()})()

    monkeypatch.setattr(bench, "time_fn", lambda fn, **kw: [0.013, 0.013])  # no GPU here: its estimate
    bm = Benchmark()
    samples = bench.BenchTimer(bm, "cuda:0", None)._timed(lambda: None, 5, 20, 2.0)
    assert (bm.rounds, bm.iterations) == (154, 1) and len(samples) == 154
    bm = Benchmark()
    bench.BenchTimer(bm, "cuda:0", None)._timed(lambda: None, 5, 20)
    assert bm.rounds == 20
    # a site's own benchmark asks the same through mig_bench.time
    from pytest_mig.device.target import Target

    mig = bench.MigBench(Benchmark(), Target(kind="full", profile="full", chosen_by="test", gpu_name="NVIDIA H200"))
    mig.timer.device = "cuda:0"
    timing = mig.time(lambda: None, warmup=1, repeats=20, energy=False, min_time_s=2.0)
    assert mig.timer._benchmark.rounds == 154 and len(timing.samples) == 154 and timing.calls_per_sample == 1
    monkeypatch.setattr(bench, "time_fn", lambda fn, **kw: [0.0015, 0.0015])  # a 1.5 ms call: 7 a round
    mig = bench.MigBench(Benchmark(), Target(kind="full", profile="full", chosen_by="test", gpu_name="NVIDIA H200"))
    mig.timer.device = "cuda:0"
    timing = mig.time(lambda: None, warmup=1, repeats=20, energy=False, min_time_s=2.0)
    assert (len(timing.samples), timing.calls_per_sample) == (191, 7)  # 1337 calls, 2.0 s
    mig.timer.device = "cpu"  # pytest-benchmark times once: the timer's own after
    again = mig.time(lambda: None, warmup=1, repeats=3, energy=False)
    assert again.calls_per_sample == 1


@pytest.mark.parametrize("bad", [57, True, float("nan"), "sw_power_cap", {"a": 1}])
def test_a_files_throttle_reasons_that_are_not_a_list_are_none(bad: object) -> None:
    from pytest_mig.measure.clocks import throttle_reasons

    info = {"clocks": {"after": {"throttle_reasons": bad}, "before": {"throttle_reasons": ["sw_power_cap"]}}}
    assert throttle_reasons(info) == ["sw_power_cap"]  # the readable snapshot still counts, the other is none


def test_a_number_too_large_for_a_float_is_no_clock_and_no_temperature() -> None:
    from pytest_mig.measure.clocks import measured_clock, temperature_of

    assert temperature_of({"temperature_c": 10 ** 400}) is None
    assert measured_clock({"clocks": {"window": {"sm_clock_mhz": 10 ** 400}, "after": {"sm_clock_mhz": 1980}}}) == 1980.0
    assert str(temperature_of({"temperature_c": -0.0})) == "0.0" and temperature_of({"temperature_c": 57}) == 57.0
