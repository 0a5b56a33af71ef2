"""Energy per unit of work: how its window reads the counter, and which rates time the same work.

The window (pytest_mig.measure.counter_instants, EnergyTicks.mean_power_w): an energy counter that
advances on a fixed period, each step seen by the host late by a varying delay, read through a fake
counter and a fake clock; the power comes from the steps' own instants, not from when they were seen.

An energy or cost figure, and GEMM's headline, are never judged more tightly than the rate that times
the same work (a headline: its sustained rate).

J/token is power x step time / tokens.  When the steps slow down (a host-bound small batch), power
drops, but not in proportion, so J/token moves with tokens/s even where its own history happened to
be quiet.  These tests hold the rule (pytest_mig.measure.timing_partners, noise.band's and
noise.reference_band's ``partners``) wherever a figure is judged: the judging pipeline against a
local history and against a shipped reference, ``pytest-mig compare``, calibrate's threshold table,
the detection analysis and ``devices``' judged counts.  The values are synthetic.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from pathlib import Path

import pytest

from pytest_mig import cli
from pytest_mig.store.baselines import BaselineStore
from pytest_mig.night.calibrate import threshold_rows
from pytest_mig.night.detection import analyse
from pytest_mig.measure import EnergyTicks, Metric, Telemetry, Timer, energy_metrics, timing_partners
from pytest_mig.measure.timing import FIT_SLACK, counter_instants
from pytest_mig.judge.noise import FEW_RUNS_BAND, K, REFERENCE_FLOOR, band, reference_band, run_sigma, spread
from pytest_mig.judge.reference import ReferenceStore, build
from pytest_mig.judge.reference_check import check_folder
from pytest_mig.device.target import TargetInfo
from pytest_mig.store import results as results_module
from pytest_mig.store.results import ResultRecord, read_results, write_results
from pytest_mig.judge.pipeline import Pipeline, StoreHistories
from pytest_mig.store.verdicts import Verdict

TRAIN = "benchmarks/test_training.py::test_training[gpt2-small-full-fixed]"
GEMM = "benchmarks/test_gemm.py::test_gemm[bf16]"
TARGET = {"kind": "emulated", "profile": "4g.40gb", "baseline_profile": "4g.40gb-emulated",
          "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_slug": "nvidia-h100-80gb-hbm3", "emulated": True}
FP = {"driver": "580.159.04", "torch": "2.11.0", "gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001"}

#: Ten unchanged runs: a noisy rate (host-bound steps, sigma about 7%) and a quiet energy (0.3%).
NOISY = [100.0, 112.0, 90.0, 105.0, 95.0, 110.0, 92.0, 104.0, 97.0, 108.0]
QUIET = [100.0, 100.3, 99.8, 100.1, 99.6, 100.4, 99.9, 100.2, 99.7, 100.0]
UNITS = {"tokens_per_s": ("tokens/s", "higher", "training"), "step_time_s": ("s", "lower", "training"),
         "energy_j_per_token": ("J/token", "lower", "energy"), "su_per_1M_tokens": ("SU/1M tokens", "lower", "cost"),
         "bf16_tflops": ("TFLOPS", "higher", "tensor"), "bf16_sustained_tflops": ("TFLOPS", "higher", "tensor"),
         "bf16_energy_j_per_tflop": ("J/TFLOP", "lower", "energy")}


def rec(name: str, value: float, test: str = TRAIN) -> ResultRecord:
    unit, direction, kind = UNITS[name]
    metric = Metric(name, value, unit, direction, [value] * 3, kind)  # type: ignore[arg-type]
    return ResultRecord(test, metric, TargetInfo.from_dict(TARGET), dict(FP), node="n1")


def training_run(tokens: float, joules: float) -> list[ResultRecord]:
    """One run of the training test: tokens/s and the step time it implies, and J/token."""
    return [rec("tokens_per_s", tokens), rec("step_time_s", 4096 / tokens), rec("energy_j_per_token", joules / 1000)]


# --------------------------------------------------------------------------- which figures share the timing


def test_an_energy_figure_shares_the_timing_of_its_tests_rate_figures_with_its_label() -> None:
    training = [("tokens_per_s", "training"), ("step_time_s", "training"), ("su_per_1M_tokens", "cost"),
                ("power_w", "energy"), ("peak_allocated_gb", "info")]
    assert timing_partners("energy_j_per_token", "energy", training) == ["tokens_per_s", "step_time_s"]
    stream = [("fp32_copy_gbs", "memory"), ("fp32_triad_gbs", "memory"), ("fp32_dot_gbs", "memory")]
    assert timing_partners("fp32_triad_energy_j_per_gb", "energy", stream) == ["fp32_triad_gbs"]
    # GEMM reports the rate over the energy window itself beside a headline from short repeats: that one alone
    gemm = [("bf16_tflops", "tensor"), ("bf16_flop_per_sm_cycle", "tensor"), ("bf16_sustained_tflops", "tensor"),
            ("fp16_sustained_tflops", "tensor")]
    assert timing_partners("bf16_energy_j_per_tflop", "energy", gemm) == ["bf16_sustained_tflops"]
    assert timing_partners("bf16_energy_j_per_tflop", "energy", gemm[:2]) == ["bf16_tflops", "bf16_flop_per_sm_cycle"]
    # a rate with no longer window beside it, and an informational or power figure, have none
    assert timing_partners("tokens_per_s", "training", training) == []
    assert timing_partners("bf16_sustained_tflops", "tensor", gemm) == []
    assert timing_partners("bf16_flop_per_sm_cycle", "tensor", gemm) == []
    assert timing_partners("power_w", "energy", training) == []


def test_cost_and_a_headline_share_the_noise_of_the_rate_timed_over_the_same_work() -> None:
    training = [("tokens_per_s", "training"), ("step_time_s", "training"), ("su_per_1M_tokens", "cost")]
    assert timing_partners("su_per_1M_tokens", "cost", training) == ["tokens_per_s", "step_time_s"]
    gemm = [("bf16_tflops", "tensor"), ("bf16_flop_per_sm_cycle", "tensor"), ("bf16_sustained_tflops", "tensor"),
            ("su_per_1M_TFLOPs", "cost")]
    # SU per work converts the headline, whose window is short: the sustained rate over the energy window
    assert timing_partners("su_per_1M_TFLOPs", "cost", gemm) == ["bf16_sustained_tflops"]
    # the headline of about 2 s of calls beside the rate over the longer window of the same kernel and size
    assert timing_partners("bf16_tflops", "tensor", gemm) == ["bf16_sustained_tflops"]
    assert timing_partners("fp16_tflops", "tensor", gemm) == []
    assert timing_partners("su_per_1M_TFLOPs", "cost", [("su_per_1M_TFLOPs", "cost")]) == []
    # an energy figure with no label keeps every rate of its test unless one is its own window
    fwd = [("tokens_per_s", "training"), ("fwd_sustained_tokens_per_s", "training")]
    assert timing_partners("energy_j_per_token", "energy", fwd) == ["tokens_per_s", "fwd_sustained_tokens_per_s"]
    assert timing_partners("energy_j_per_token", "energy", [*fwd, ("sustained_tokens_per_s", "training")]) == [
        "sustained_tokens_per_s"]


# --------------------------------------------------------------------------- the bands


def test_a_quiet_energy_figure_takes_the_sigma_of_its_noisy_rate_figure_and_says_whose() -> None:
    alone = band(QUIET)
    assert alone.gates and alone.sigma_of is None
    shared = band(QUIET, partners={"tokens_per_s": NOISY})
    assert shared.sigma == pytest.approx(run_sigma(NOISY)) and shared.sigma_of == "tokens_per_s"
    assert shared.threshold == pytest.approx(K * run_sigma(NOISY)) and not shared.gates
    # a quieter partner changes nothing: the figure's own sigma stands
    assert band(NOISY, partners={"tokens_per_s": QUIET}) == band(NOISY)


def test_with_few_runs_the_partners_spread_widens_the_conservative_band() -> None:
    b = band(QUIET[:3], partners={"tokens_per_s": NOISY[:3]})
    assert b.basis == "few-runs" and b.sigma is None and b.sigma_of == "tokens_per_s"
    assert b.threshold == pytest.approx(K * spread(NOISY[:3])) and b.threshold > FEW_RUNS_BAND


def test_against_a_reference_the_larger_pooled_sigma_is_used_and_an_unknown_one_leaves_it_unjudged() -> None:
    assert reference_band([1.0], 0.01, {"tokens_per_s": 0.004}).threshold == REFERENCE_FLOOR
    wide = reference_band([1.0], 0.01, {"tokens_per_s": 0.05})
    assert wide.sigma == 0.05 and wide.sigma_of == "tokens_per_s" and not wide.gates
    unknown = reference_band([1.0], 0.01, {"tokens_per_s": None})
    assert unknown.sigma is None and not unknown.gates


# --------------------------------------------------------------------------- verdicts


def test_a_local_history_does_not_fail_energy_that_moved_with_a_rate_too_noisy_to_gate(tmp_path: Path) -> None:
    """The false alarm seen on an H100: tokens/s -15% (its history too noisy to gate), J/token +12%."""
    noisy, quiet = BaselineStore(tmp_path / "noisy"), BaselineStore(tmp_path / "quiet")
    for tokens, joules in zip(NOISY, QUIET):
        noisy.save(training_run(tokens, joules))
        quiet.save(training_run(100.0 + (joules - 100.0) / 3, joules))  # a steady rate: the energy alone moved
    slow = training_run(85.0, 112.0)
    v = {x.metric: x for x in Pipeline(StoreHistories(noisy)).judge(slow)}["energy_j_per_token"]
    assert v.outcome == "noisy" and not v.failed and v.sigma_of in ("tokens_per_s", "step_time_s")
    assert f"(that of {v.sigma_of}, which times the same work)" in v.message
    # where the rate is steady, the same +12% in energy alone is a regression
    v = {x.metric: x for x in Pipeline(StoreHistories(quiet)).judge(training_run(100.0, 112.0))}[
        "energy_j_per_token"]
    assert v.outcome == "regressed" and v.failed and v.sigma_of is None


def test_gemm_energy_is_judged_with_the_sustained_rate_not_the_noisier_headline(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for n, q in zip(NOISY, QUIET):
        store.save([rec("bf16_tflops", n * 7, GEMM), rec("bf16_sustained_tflops", q * 7, GEMM),
                    rec("bf16_energy_j_per_tflop", q, GEMM)])
    verdicts = {v.metric: v for v in Pipeline(StoreHistories(store)).judge([rec("bf16_tflops", 700.0, GEMM),
                                                          rec("bf16_sustained_tflops", 700.0, GEMM),
                                                          rec("bf16_energy_j_per_tflop", 110.0, GEMM)])}
    energy = verdicts["bf16_energy_j_per_tflop"]
    assert energy.outcome == "regressed" and energy.sigma_of is None


def test_a_short_history_judges_the_headline_with_the_noise_of_the_sustained_rate(tmp_path: Path) -> None:
    """An H200's case: a reference whose few headline runs happened to agree (sigma 0.1%, so a 1% band
    on night 2) while the rate over the longer window of the same calls moved 0.4%; a new board's
    night 2 then read the headline -1.15% with the sustained rate unmoved."""
    def run(headline: float, sustained: float) -> list[ResultRecord]:
        return [rec("bf16_tflops", headline, GEMM), rec("bf16_sustained_tflops", sustained, GEMM)]

    def night2(sustained_runs: list[float]) -> Verdict:
        ref = tmp_path / f"ref-{len(list(tmp_path.iterdir()))}"
        files = []
        for i, (h, s) in enumerate(zip([700.0, 700.7, 699.3, 700.2, 699.8, 700.5], sustained_runs)):
            files.append(tmp_path / f"{ref.name}-{i}.json")
            write_results(files[-1], run(h, s))
        build(files, ref)
        history = BaselineStore(ref.with_name(ref.name + "-history"))
        history.save(run(700.0, 700.0))
        pipeline = Pipeline(StoreHistories(history), references=ReferenceStore(ref))
        return {v.metric: v for v in pipeline.judge(run(692.0, 700.0))}["bf16_tflops"]

    sustained = [700.0, 704.0, 696.0, 702.5, 697.5, 701.0]
    moved = night2(sustained)
    assert moved.outcome == "pass" and moved.threshold > 0.0115
    # the sustained rate's sigma, not the headline's 0.07%
    assert moved.sigma == pytest.approx(statistics.stdev(sustained) / statistics.mean(sustained), rel=0.02)
    # where the sustained rate was as steady as the headline, the same -1.15% is beyond the 1% floor
    steady = night2([700.0, 700.7, 699.3, 700.2, 699.8, 700.5])
    assert steady.outcome == "regressed" and steady.threshold == pytest.approx(0.01)


def test_a_reference_does_not_judge_energy_whose_rate_varies_between_its_runs(tmp_path: Path) -> None:
    files = []
    for i, (tokens, joules) in enumerate(zip(NOISY[:5], QUIET[:5])):
        path = tmp_path / f"run{i}.json"
        write_results(path, training_run(tokens, joules))
        files.append(path)
    build(files, tmp_path / "ref")
    refs = ReferenceStore(tmp_path / "ref")
    pipeline = Pipeline(StoreHistories(None), references=refs)
    verdicts = {v.metric: v for v in pipeline.judge(training_run(85.0, 112.0))}
    energy = verdicts["energy_j_per_token"]
    assert energy.source == "reference" and energy.outcome == "noisy" and not energy.failed
    assert "too noisy to judge against another board" in energy.message and "which times the same work" in energy.message
    (ref,) = [refs.load("nvidia-h100-80gb-hbm3", "4g.40gb-emulated")]
    assert ref is not None and ref.judged_counts()["normal"] == (0, 3)  # devices counts it as not judged


def test_compare_reads_the_partners_history_from_the_old_files(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    old = []
    for i, (tokens, joules) in enumerate(zip(NOISY, QUIET)):
        path = tmp_path / f"old{i}.json"
        write_results(path, training_run(tokens, joules))
        old.append(str(path))
    new = tmp_path / "new.json"
    write_results(new, training_run(85.0, 112.0))
    assert cli.main(["compare", *old, str(new), "--mig-reference", "none"]) == 0
    out = capsys.readouterr().out
    assert "energy_j_per_token" in out and "which times the same work" in out and "REGRESSED" not in out


def test_calibrate_shows_whose_cv_an_energy_figure_took(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for tokens, joules in zip(NOISY, QUIET):
        store.save(training_run(tokens, joules))
    base = store.load("nvidia-h100-80gb-hbm3", "4g.40gb-emulated")
    assert base is not None
    rows = {r["metric"]: r for r in threshold_rows(base)}
    assert rows["energy_j_per_token"]["cv_of"] in ("tokens_per_s", "step_time_s")
    assert rows["energy_j_per_token"]["gates"] == "no: too noisy" and rows["tokens_per_s"]["cv_of"] is None


def test_the_detection_analysis_applies_the_same_rule(tmp_path: Path) -> None:
    runs = []
    for i, (tokens, joules) in enumerate(zip(NOISY, QUIET)):
        path = tmp_path / f"unchanged-{i:02d}.json"
        write_results(path, training_run(tokens, joules))
        runs.append(read_results(path))
    figures = {f.key[1]: f for f in analyse(runs, {})}
    energy = figures["energy_j_per_token"]
    assert not energy.gates and energy.cv == pytest.approx(max(figures["tokens_per_s"].cv or 0,
                                                               figures["step_time_s"].cv or 0))


# --------------------------------------------------------------------------- step time at the largest batch

MAXBATCH = "benchmarks/test_training.py::test_training[qwen1.5b-full-compiled-maxbatch]"
#: The step times of ten unchanged runs of a largest-batch case whose batch was 27, 30 or 28 (sigma about 4.6%).
BATCH_STEPS = [1.0, 1.11, 1.04, 1.0, 1.11, 1.04, 1.0, 1.11, 1.04, 1.0]


def maxbatch_run(tokens: float, step: float, joules: float, *, step_compared: bool) -> list[ResultRecord]:
    """One run of a largest-batch case; its step time compared, as histories and references made before
    it was informational hold it, or informational, as the workload records it now."""
    runs = [rec("tokens_per_s", tokens, MAXBATCH), rec("energy_j_per_token", joules / 1000, MAXBATCH)]
    kind = "training" if step_compared else "info"
    metric = Metric("step_time_s", step, "s", "lower", [step] * 3, kind, compare=step_compared)
    return [*runs, ResultRecord(MAXBATCH, metric, TargetInfo.from_dict(TARGET), dict(FP), node="n1")]


def test_a_history_of_step_time_at_the_largest_batch_is_kept_but_judges_and_pairs_with_nothing(
        tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    for tokens, step, joules in zip(QUIET, BATCH_STEPS, QUIET):
        store.save(maxbatch_run(tokens, step, joules, step_compared=True))
    night = maxbatch_run(100.0, 1.11, 105.0, step_compared=False)  # the batch grew; J/token +5%
    verdicts = {v.metric: v for v in Pipeline(StoreHistories(store)).judge(night)}
    assert verdicts["step_time_s"].outcome == "info" and not verdicts["step_time_s"].failed
    energy = verdicts["energy_j_per_token"]  # judged on its own and tokens/s's sigma, not the step time's
    assert energy.outcome == "regressed" and energy.sigma_of in (None, "tokens_per_s")
    store.save(night)
    base = store.load("nvidia-h100-80gb-hbm3", "4g.40gb-emulated")
    assert base is not None and base.get(MAXBATCH, "step_time_s") is None
    assert len(base.retired[(MAXBATCH, "step_time_s", "normal")].runs) == 10  # kept in the file, never judged
    assert len(base.get(MAXBATCH, "tokens_per_s").runs) == 10  # keep 10: the night's run took the oldest's place
    rows = {r["metric"] for r in threshold_rows(base)}
    assert rows == {"tokens_per_s", "energy_j_per_token"}  # calibrate lists what is judged


def test_a_reference_holding_step_time_at_the_largest_batch_counts_it_nowhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = []
    for i, (tokens, step, joules) in enumerate(zip(QUIET[:5], BATCH_STEPS[:5], QUIET[:5])):
        path = tmp_path / f"run{i}.json"
        write_results(path, maxbatch_run(tokens, step, joules, step_compared=True))
        files.append(path)
    with monkeypatch.context() as m:  # built as before the step time was informational: it holds it compared
        m.setattr(results_module, "batch_bound", lambda test, metric: False)
        build(files, tmp_path / "ref")
    assert "step_time_s" in (tmp_path / "ref" / "nvidia-h100-80gb-hbm3" / "4g.40gb-emulated.json").read_text()
    refs = ReferenceStore(tmp_path / "ref")
    pipeline = Pipeline(StoreHistories(None), references=refs)
    verdicts = {v.metric: v for v in pipeline.judge(maxbatch_run(100.0, 1.11, 101.0, step_compared=False))}
    assert verdicts["step_time_s"].outcome == "info"
    energy = verdicts["energy_j_per_token"]
    assert energy.source == "reference" and energy.outcome == "pass" and energy.sigma_of in (None, "tokens_per_s")
    ref = refs.load("nvidia-h100-80gb-hbm3", "4g.40gb-emulated")
    assert ref is not None and ref.judged_counts()["normal"] == (2, 2)  # what devices and the header count
    (tally,) = check_folder(tmp_path / "ref")
    assert tally.cases == 10 and tally.judged == 10  # reference-check: tokens/s and J/token, 5 runs each


# --------------------------------------------------------------------------- the window: the counter's own instants

PERIOD = 0.1  # the counter's step (an H100's: 100 ms)
WATTS = 400.0


def seen_late(steps: int, delays: list[float], t0: float = 50.0, watts: float = WATTS) -> list[tuple[float, float]]:
    """Ticks (seconds seen, mJ) of a counter stepping every PERIOD at ``watts``, step k seen ``delays[k]`` late."""
    return [(t0 + k * PERIOD + delays[k], watts * PERIOD * 1e3 * k) for k in range(steps)]


def as_seen_power(ticks: list[tuple[float, float]]) -> float:
    (t0, e0), (t1, e1) = ticks[0], ticks[-1]
    return (e1 - e0) / 1e3 / (t1 - t0)


def test_a_counter_seen_late_by_a_varying_delay_gives_its_power_from_its_own_instants() -> None:
    rng = random.Random(48)
    delays = [rng.uniform(0.0, 0.03) for _ in range(16)]  # 0-30 ms, as the gaps of 75-133 ms on an H100 show
    delays[0], delays[-1] = 0.0, 0.03  # the worst case at the ends: the window looks 30 ms longer than it is
    ticks = seen_late(16, delays)
    assert as_seen_power(ticks) == pytest.approx(WATTS * 1.5 / 1.53)  # 2% low, read as seen
    placed = counter_instants(ticks, 0.01)
    assert len(placed) == 16 and [e for _, e in placed] == [e for _, e in ticks]
    gaps = [b[0] - a[0] for a, b in zip(placed, placed[1:])]
    assert max(gaps) - min(gaps) < 1e-9 and gaps[0] == pytest.approx(PERIOD, rel=0.02)  # one period, as stepped
    energy = EnergyTicks(None, interval=0.002)
    energy.ticks = ticks
    assert energy.mean_power_w(0.0, 100.0) == pytest.approx(WATTS, rel=0.02)
    assert abs(energy.mean_power_w(0.0, 100.0) / WATTS - 1) < abs(as_seen_power(ticks) / WATTS - 1) / 2


def test_the_power_is_exact_where_the_delay_is_steady_and_where_a_step_was_missed() -> None:
    ticks = seen_late(20, [0.007] * 20)
    del ticks[8]  # the poller missed a step: a gap of two periods
    placed = counter_instants(ticks, 0.01)
    assert len(placed) == 19 and placed[8][0] - placed[7][0] == pytest.approx(2 * PERIOD)
    energy = EnergyTicks(None)
    energy.ticks = ticks
    assert energy.mean_power_w(0.0, 100.0) == pytest.approx(WATTS, rel=1e-9)


def test_a_tick_seen_too_late_to_place_is_left_out() -> None:
    delays = [0.005] * 20
    delays[11] = 0.005 + (FIT_SLACK + 0.1) * PERIOD  # seen half a period late: nearer the next step than its own
    ticks = seen_late(20, delays)
    placed = counter_instants(ticks, 0.01)
    assert len(placed) == 19 and ticks[11][1] not in [e for _, e in placed]
    energy = EnergyTicks(None)
    energy.ticks = ticks
    assert energy.mean_power_w(0.0, 100.0) == pytest.approx(WATTS, rel=1e-6)


def test_ticks_with_no_period_of_their_own_are_taken_as_seen() -> None:
    every_read = [(1.0 + 0.002 * k + 0.0005 * (k % 3), 10.0 * k) for k in range(50)]  # a counter read when it changes
    assert counter_instants(every_read, 0.01) == every_read
    few = seen_late(3, [0.0, 0.02, 0.01])
    assert counter_instants(few, 0.01) == few
    rng = random.Random(7)
    times = sorted(rng.uniform(0.0, 2.0) for _ in range(20))  # no period: too many ticks off any line
    scattered = [(t, 100.0 * k) for k, t in enumerate(times)]
    assert counter_instants(scattered, 0.0) == scattered


def test_only_the_ticks_inside_the_window_are_placed_and_read() -> None:
    ticks = seen_late(40, [0.004 * (k % 5) for k in range(40)], t0=0.0)
    energy = EnergyTicks(None)
    energy.ticks = ticks[:10] + [(t, e + 5e5) for t, e in ticks[10:]]  # a jump before the window: not in it
    assert energy.mean_power_w(1.05, 3.95) == pytest.approx(WATTS, rel=0.01)
    assert energy.mean_power_w(1.05, 1.12) is None  # one tick: no power, rather than a guess


class SteppingCounter:
    """A fake energy counter on the real clock: steps every ``period`` at ``watts``, each step seen after
    its own delay (0 to ``late`` seconds), as an H100's is seen by the host."""

    def __init__(self, watts: float, period: float, late: float, seed: int = 1) -> None:
        self.watts, self.period, self.late = watts, period, late
        self.rng = random.Random(seed)
        self.t0 = time.perf_counter()
        self.delays: list[float] = []
        self.lock = threading.Lock()

    def __call__(self) -> float:
        now = time.perf_counter() - self.t0
        with self.lock:
            while len(self.delays) <= now / self.period:
                self.delays.append(self.rng.uniform(0.0, self.late))
            seen = max((k for k in range(len(self.delays)) if k * self.period + self.delays[k] <= now), default=0)
        return self.watts * self.period * 1e3 * seen


def test_the_energy_window_reads_a_stepping_counter_seen_late_through_the_timer() -> None:
    counter = SteppingCounter(watts=250.0, period=0.02, late=0.006)
    tel = Telemetry(read_energy_mj=counter, window_s=0.6)
    timing = Timer("cpu", tel)(lambda: time.sleep(0.003), warmup=1, repeats=3)
    assert timing.power is not None and timing.power.source == "energy-counter"
    by = {m.name: m for m in energy_metrics(timing, 1.0, "call")}
    assert by["power_w"].value == pytest.approx(250.0, rel=0.05)
    seconds_per_call = timing.power.seconds / timing.energy_calls
    assert by["energy_j_per_call"].value == pytest.approx(250.0 * seconds_per_call, rel=0.05)


def test_a_results_file_written_when_step_time_at_the_largest_batch_was_compared_reads_it_as_informational(
        tmp_path: Path) -> None:
    largest = "benchmarks/test_training.py::test_training[qwen1.5b-full-compiled-maxbatch]"
    old = [ResultRecord(test, Metric("step_time_s", 0.29, "s", "lower", [0.29] * 3, "training"),  # compared, as then
                        TargetInfo.from_dict(TARGET), dict(FP)) for test in (largest, TRAIN)]
    write_results(tmp_path / "old.json", old)
    back = {r.test: r.metric for r in read_results(tmp_path / "old.json")}
    assert (back[largest].compare, back[largest].kind) == (False, "info")  # replay and compare never judge it
    assert (back[TRAIN].compare, back[TRAIN].kind) == (True, "training")  # a fixed batch's step time still is
