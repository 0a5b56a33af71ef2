"""Verdict logic on synthetic measurements: direction, tolerance precedence, noise, fingerprint
text, throttling, never comparing across GPU models, profiles or emulation."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from pytest_mig.baselines import BaselineStore, entry_from_record, meta_from_record
from pytest_mig.measure import Metric
from pytest_mig.results import ResultRecord
from pytest_mig.verdict import (
    compare,
    failing,
    failure_text,
    fingerprint_diff,
    judge,
    mann_whitney_p,
    parse_tolerance,
)

FP_OLD = {"driver": "550.54", "cuda_driver": "12.4", "vbios": "96.00.A5.00.1A", "inforom": "G520.0282.02.02",
          "gsp": "550.54", "ecc": "on", "power_limit_w": 700, "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 3201,
          "torch": "2.4.0", "cuda_runtime": "12.4", "python": "3.11.9", "gpu_name": "NVIDIA H200",
          "memory_total_mib": 143771}


def record(
    value: float,
    samples: list[float] | None = None,
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
    test: str = "benchmarks/test_gemm.py::test_gemm[fp16]",
) -> ResultRecord:
    emulated = target_kind == "emulated"
    slug = "cpu" if target_kind == "cpu" else gpu.lower().replace(" ", "-")
    target = {"kind": target_kind, "profile": profile, "gpu_name": None if target_kind == "cpu" else gpu,
              "gpu_slug": slug, "emulated": emulated,
              "baseline_profile": f"{profile}-emulated" if emulated else profile}
    metric = Metric(name, value, unit, direction, list(samples or []), kind, dict(info or {}), compare_)  # type: ignore[arg-type]
    return ResultRecord(test, metric, target, dict(FP_OLD if fingerprint is None else fingerprint), node="n1")


def tight(center: float, n: int = 10, rel: float = 0.003) -> list[float]:
    return [center * (1 + rel * ((i % 5) - 2) / 2) for i in range(n)]


def judge_one(new: ResultRecord, old: ResultRecord, **kw: Any):
    return compare(new, entry_from_record(old, kw.pop("entry_tolerance", None)), meta_from_record(old), **kw)


def test_unchanged_tight_samples_pass() -> None:
    v = judge_one(record(151.7, tight(151.7)), record(151.7, tight(151.7)))
    assert v.outcome == "pass" and not v.failed
    assert v.change_pct == pytest.approx(0.0)
    assert v.baseline == pytest.approx(151.7)


def test_five_percent_drop_with_tight_samples_is_caught_at_three_percent() -> None:
    old = record(100.0, tight(100.0))
    new = record(95.0, tight(95.0))
    v = judge_one(new, old, tolerance=0.03)
    assert v.outcome == "regressed" and v.failed
    assert v.change_pct == pytest.approx(-5.0)
    assert v.message.startswith("fp16_tflops 95.00 TFLOPS, baseline 100.0 TFLOPS (-5.0%, tolerance 3%, noise ±0.63%)")
    assert "nothing in the fingerprint changed" in v.message
    assert v.noise is not None and 0 < v.noise < 0.03


def test_design_example_message() -> None:
    old = record(151.7, [151.7] * 5)
    new = record(138.2, [138.2] * 5, fingerprint={**FP_OLD, "driver": "560.35"})
    v = judge_one(new, old)
    assert v.outcome == "regressed"
    assert v.message == ("fp16_tflops 138.2 TFLOPS, baseline 151.7 TFLOPS (-8.9%, tolerance 5%); "
                         "since the baseline: driver 550.54 -> 560.35")
    assert v.fingerprint_changes == ["driver 550.54 -> 560.35"]
    assert v.line().startswith("REGRESSED benchmarks/test_gemm.py::test_gemm[fp16] fp16_tflops 138.2")


def test_noisy_but_unchanged_samples_raise_no_alarm() -> None:
    """Same distribution (8% spread) twice: the medians differ by more than 5% now and then; the
    tolerance alone would cry wolf, the noise band must not."""
    rng = random.Random(1234)
    beyond_tolerance = 0
    for _ in range(300):
        a = [rng.gauss(100.0, 8.0) for _ in range(10)]
        b = [rng.gauss(100.0, 8.0) for _ in range(10)]
        old = record(sorted(a)[5], a)
        new = record(sorted(b)[5], b)
        v = judge_one(new, old)
        assert v.outcome == "pass", v.message
        beyond_tolerance += abs(v.change_pct or 0) > 5
    assert beyond_tolerance >= 5  # the scenario really tests the noise rule


def test_real_drop_beyond_the_noise_is_caught_even_with_noisy_samples() -> None:
    rng = random.Random(7)
    a = [rng.gauss(100.0, 3.0) for _ in range(20)]
    b = [rng.gauss(70.0, 2.1) for _ in range(20)]
    v = judge_one(record(sorted(b)[10], b), record(sorted(a)[10], a))
    assert v.outcome == "regressed"


def test_change_beyond_tolerance_inside_noise_passes_and_says_why() -> None:
    old = record(100.0, [80, 90, 100, 110, 120])
    new = record(93.0, [73, 83, 93, 103, 113])
    v = judge_one(new, old)
    assert v.outcome == "pass"
    assert "within the measured noise" in v.message


def test_lower_is_better_direction() -> None:
    old = record(10.0, tight(10.0), name="step_s", unit="s", direction="lower", kind="training")
    slower = judge_one(record(11.0, tight(11.0), name="step_s", unit="s", direction="lower", kind="training"), old)
    faster = judge_one(record(9.0, tight(9.0), name="step_s", unit="s", direction="lower", kind="training"), old)
    assert slower.outcome == "regressed" and slower.change_pct == pytest.approx(10.0)
    assert faster.outcome == "improved" and not faster.failed
    again = judge_one(record(9.0, tight(9.0), name="step_s", unit="s", direction="lower", kind="training"), old,
                      improvement_fails=True)
    assert again.outcome == "improved" and again.failed


def test_higher_is_better_improvement() -> None:
    v = judge_one(record(120.0, tight(120.0)), record(100.0, tight(100.0)))
    assert v.outcome == "improved" and not v.failed and v.change_pct == pytest.approx(20.0)


def test_tolerance_precedence_marker_then_entry_then_default() -> None:
    old, new = record(100.0, tight(100.0)), record(93.0, tight(93.0))
    assert judge_one(new, old, entry_tolerance=0.10).outcome == "pass"  # entry 10% beats default 5%
    assert judge_one(new, old, entry_tolerance=0.10, tolerance=0.05).outcome == "regressed"  # marker wins
    assert judge_one(new, old).outcome == "regressed"  # default 5%
    assert judge_one(new, old, default_tolerance=0.2).outcome == "pass"  # ini default
    v = judge_one(new, old, entry_tolerance=0.10)
    assert v.tolerance == pytest.approx(0.10)


@pytest.mark.parametrize(
    ("old_kw", "new_kw", "phrase"),
    [
        ({"gpu": "NVIDIA A100-SXM4-80GB", "profile": "3g.40gb"}, {}, "baseline is for NVIDIA A100-SXM4-80GB"),
        ({"profile": "2g.35gb"}, {}, "baseline is for 2g.35gb"),
        ({}, {"target_kind": "emulated"}, "measured on an emulated profile"),
        ({"target_kind": "emulated"}, {}, "baseline is for an emulated profile"),
        ({"unit": "GFLOPS"}, {}, "re-record the baseline"),
    ],
)
def test_incomparable_is_never_compared(old_kw: dict[str, Any], new_kw: dict[str, Any], phrase: str) -> None:
    v = judge_one(record(50.0, tight(50.0), **new_kw), record(100.0, tight(100.0), **old_kw))
    assert v.outcome == "incomparable" and not v.failed
    assert phrase in v.message
    assert v.change_pct is None


def test_a_quick_run_is_never_compared_with_a_normal_baseline(tmp_path: Path) -> None:
    """--mig-quick measures smaller problems: its figures and a normal run's are not the same thing."""
    quick = record(50.0, tight(50.0))
    quick.mode = "quick"
    v = judge_one(quick, record(100.0, tight(100.0)))
    assert v.outcome == "incomparable" and not v.failed and v.change_pct is None and v.baseline is None
    assert "measured with --mig-quick but the baseline was recorded in a normal run" in v.message
    normal = judge_one(record(50.0, tight(50.0)), quick)
    assert normal.outcome == "incomparable" and "recorded in a quick run (--mig-quick)" in normal.message
    assert judge_one(quick, quick).outcome == "pass"

    store = BaselineStore(tmp_path)
    store.save([quick])  # a quick save says so in the file, and a quick run is judged against it
    path = store.path_for("nvidia-h200", "3g.71gb")
    entry = json.loads(path.read_text())["tests"][quick.test]["fp16_tflops"]
    assert entry["mode"] == "quick"
    again = record(40.0, tight(40.0))
    again.mode = "quick"
    assert [v.outcome for v in judge([again], store)] == ["regressed"]
    assert [v.outcome for v in judge([record(40.0, tight(40.0))], store)] == ["incomparable"]


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


def test_throttled_regression_fails_but_names_the_throttle() -> None:
    clocks = {"before": {"sm_clock_mhz": 1980, "throttle_reasons": [], "throttled": False},
              "after": {"sm_clock_mhz": 1410, "throttle_reasons": ["gpu_idle", "sw_power_cap"], "throttled": True}}
    new = record(90.0, tight(90.0), info={"clocks": clocks}, fingerprint={**FP_OLD, "driver": "560.35"})
    v = judge_one(new, record(100.0, tight(100.0)))
    assert v.outcome == "regressed" and v.failed
    assert v.throttled == ["sw_power_cap"]
    assert "GPU was throttled during the measurement (sw_power_cap): not blamed on the driver" in v.message
    assert "driver 550.54 -> 560.35" in v.message


def test_idle_reasons_are_not_throttling() -> None:
    clocks = {"after": {"throttle_reasons": ["gpu_idle", "applications_clocks_setting"], "throttled": False}}
    v = judge_one(record(100.0, tight(100.0), info={"clocks": clocks}), record(100.0, tight(100.0)))
    assert v.throttled == [] and "throttled" not in v.message


def test_judge_against_a_store_save_pass_fail(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    first = [record(151.7, tight(151.7)), record(3.9, tight(3.9), name="copy_tbs", unit="TB/s", kind="memory")]
    store.save(first)
    again = [record(151.5, tight(151.5)), record(3.91, tight(3.91), name="copy_tbs", unit="TB/s", kind="memory")]
    verdicts = judge(again, store)
    assert [v.outcome for v in verdicts] == ["pass", "pass"]
    assert again[0].verdict is not None and again[0].verdict["outcome"] == "pass"

    # the baseline edited to claim 10% more: the run now fails, naming the metric
    path = store.path_for("nvidia-h200", "3g.71gb")
    doc = json.loads(path.read_text())
    entry = doc["tests"]["benchmarks/test_gemm.py::test_gemm[fp16]"]["fp16_tflops"]
    entry["value"] = round(entry["value"] * 1.10, 1)  # as a person edits it: the value only
    path.write_text(json.dumps(doc))
    verdicts = judge([record(151.5, tight(151.5))], store)
    assert verdicts[0].outcome == "regressed"
    text = failure_text(verdicts)
    assert "fp16_tflops 151.5 TFLOPS, baseline 166.9 TFLOPS (-9.2%, tolerance 5%" in text
    assert failing(verdicts) == verdicts


def test_judge_marker_tolerance_per_metric_and_no_file(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save([record(100.0, tight(100.0))])
    v = judge([record(93.0, tight(93.0))], store, tolerance={"fp16_tflops": 0.10})
    assert v[0].outcome == "pass"
    other = judge([record(93.0, tight(93.0), profile="1g.18gb")], store)
    assert other[0].outcome == "no-baseline" and "1g.18gb.json" in other[0].message


def test_judge_does_not_compare_cpu_runs_unless_asked(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save([record(10.0, tight(10.0), target_kind="cpu", profile="cpu")])
    slow = record(5.0, tight(5.0), target_kind="cpu", profile="cpu")
    assert judge([slow], store)[0].outcome == "info"
    assert judge([slow], store, compare_cpu=True)[0].outcome == "regressed"


def test_compare_accepts_a_whole_baseline(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save([record(100.0, tight(100.0))])
    base = store.load("nvidia-h200", "3g.71gb")
    assert compare(record(80.0, tight(80.0)), base).outcome == "regressed"
    assert compare(record(80.0, tight(80.0), gpu="NVIDIA H100 80GB HBM3"), base).outcome == "incomparable"


def test_mann_whitney_matches_the_textbook() -> None:
    a = [10.1, 9.8, 10.4, 10.0, 9.7, 10.2, 10.3, 9.9]
    b = [10.6, 10.9, 10.2, 11.1, 10.8, 10.7, 10.5, 11.0, 10.4]
    assert mann_whitney_p(a, b) == pytest.approx(0.0017412111818571306)  # scipy, asymptotic, continuity
    assert mann_whitney_p(b, a) == pytest.approx(mann_whitney_p(a, b))
    assert mann_whitney_p([1.0] * 8, [1.0] * 8) == 1.0


def test_rank_test_decides_with_enough_samples() -> None:
    """3% spread, 10% drop, 10 samples: the spread band (2 x 4.2%) alone would hesitate, the rank
    test does not; and the p-value is reported."""
    rng = random.Random(11)
    a = [rng.gauss(100.0, 3.0) for _ in range(10)]
    b = [rng.gauss(90.0, 2.7) for _ in range(10)]
    v = judge_one(record(statistics.median(b), b), record(statistics.median(a), a))
    assert v.outcome == "regressed"
    assert v.p_value is not None and v.p_value < 0.002


def test_parse_tolerance() -> None:
    assert parse_tolerance("5%") == pytest.approx(0.05)
    assert parse_tolerance("0.03") == pytest.approx(0.03)
    assert parse_tolerance(0.1) == pytest.approx(0.1)
    for bad in ("5", "abc", "-1%"):
        with pytest.raises(ValueError):
            parse_tolerance(bad)
