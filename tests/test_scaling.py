"""Scaling math on published numbers (Wulver A100-80GB, CERN A100-40GB; tests/data/published_scaling.csv)
and on synthetic records: ideals by slices, SMs and memory slices, MIG off vs 7g, the failure table,
real and emulated ladders kept apart, emulated bandwidth left out, stored baselines filling gaps."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_mig.store.baselines import BaselineStore
from pytest_mig.measure import Metric
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord, write_results
from pytest_mig.judge.scaling import SCALING_TOLERANCE, ScalingReport, check_scaling, check_values

DATA = Path(__file__).with_name("data") / "published_scaling.csv"
WULVER_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference" / "wulver"
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Series:
    gpu: str
    kind: str
    direction: str
    unit: str
    values: dict[str, float]
    sources: dict[str, str]


def _published() -> dict[str, Series]:
    rows = csv.DictReader(line for line in DATA.read_text().splitlines() if not line.startswith("#"))
    out: dict[str, Series] = {}
    for r in rows:
        s = out.setdefault(r["series"], Series(r["gpu"], r["kind"], r["direction"], r["unit"], {}, {}))
        s.values[r["profile"]] = float(r["value"])
        s.sources[r["profile"]] = r["source"]
    return out


PUBLISHED = _published()


def published(series: str, *, basis: str = "slices", profiles: tuple[str, ...] | None = None) -> ScalingReport:
    s = PUBLISHED[series]
    values = {p: v for p, v in s.values.items() if profiles is None or p in profiles}
    return check_values(s.gpu, values, kind=s.kind, direction=s.direction, basis=basis, unit=s.unit, metric=series)


def by_pair(report: ScalingReport) -> dict[str, Any]:
    return {r.pair: r for r in report.rows}


# --------------------------------------------------------------------------- the published numbers


def test_published_rows_match_the_wulver_csv_files() -> None:
    if not WULVER_DIR.is_dir():
        pytest.skip(f"the shared reference tables are not at {WULVER_DIR} (only in the development workspace)")
    columns = {"matrix_multiplication.csv": {"wulver_fp16_gemm": "Peak FP16 TFLOPs",
                                             "wulver_tf32_gemm": "Peak FP32 (TF32) TFLOPs"},
               "gromacs_performance.csv": {"wulver_gromacs": "Performance (ns/day)"},
               "llm-finetuning.csv": {"wulver_qlora": "Tokens/s"}}
    profile = {"A100_10gb": "1g.10gb", "A100_20gb": "2g.20gb", "A100_40gb": "3g.40gb", "A100_80gb full GPU": "full"}
    checked = 0
    for name, wanted in columns.items():
        for row in csv.DictReader((WULVER_DIR / name).open()):
            key = row.get("MIG Profile") or row["GPU Profile"]
            for series, column in wanted.items():
                assert PUBLISHED[series].values[profile[key]] == float(row[column]), (series, key)
                assert name in PUBLISHED[series].sources[profile[key]]
                checked += 1
    assert checked == 16


def test_wulver_gemm_fp16_and_tf32_pass_within_the_tensor_tolerance() -> None:
    assert SCALING_TOLERANCE["tensor"] == 0.15
    for series in ("wulver_fp16_gemm", "wulver_tf32_gemm"):
        report = published(series)
        rows = by_pair(report)
        assert list(rows) == ["2g.20gb / 1g.10gb", "3g.40gb / 2g.20gb", "full / 3g.40gb"]
        assert report.ok, report.failure_text()
        assert max(abs(r.deviation) for r in report.rows) < 0.065  # "within 6.4%"
    fp16 = by_pair(published("wulver_fp16_gemm"))
    assert fp16["2g.20gb / 1g.10gb"].ratio == pytest.approx(2.05, abs=0.005)
    assert fp16["3g.40gb / 2g.20gb"].ratio == pytest.approx(1.50, abs=0.005)
    assert fp16["full / 3g.40gb"].ratio == pytest.approx(2.41, abs=0.005)
    # a whole A100 over 3g: 7/3 slices times the 108/98 SMs MIG gives up
    assert fp16["full / 3g.40gb"].ideal == pytest.approx(7 / 3 * 108 / 98)


def test_cern_tensor_core_7g_over_3g_fails_as_cern_flagged_it() -> None:
    report = published("cern_fp16_tensor")
    rows = by_pair(report)
    bad = rows["7g.40gb / 3g.20gb"]
    assert bad.ratio == pytest.approx(1.61, abs=0.005)
    assert bad.ideal == pytest.approx(7 / 3)
    assert bad.deviation == pytest.approx(-0.31, abs=0.005)
    assert report.failures == [bad]
    assert rows["3g.20gb / 2g.10gb"].ok and rows["2g.10gb / 1g.5gb"].ok and rows["full / 7g.40gb"].ok


@pytest.mark.parametrize("series", ["cern_fp16_cuda", "cern_fp32_cuda", "cern_fp64_cuda"])
def test_cern_cuda_core_flops_pass_within_the_compute_tolerance(series: str) -> None:
    report = published(series)
    assert report.ok, report.failure_text()
    assert len(report.rows) == 4
    assert max(abs(r.deviation) for r in report.rows if r.smaller != "7g.40gb") <= 0.051


@pytest.mark.parametrize("series", ["cern_simpletrack_5M", "cern_simpletrack_10M", "cern_simpletrack_15M"])
def test_cern_simpletrack_passes_at_twelve_percent(series: str) -> None:
    report = published(series)
    assert report.ok, report.failure_text()
    rows = by_pair(report)
    assert rows["7g.40gb / 3g.20gb"].ratio == pytest.approx(PUBLISHED[series].values["3g.20gb"]
                                                            / PUBLISHED[series].values["7g.40gb"])  # times: small/big
    assert min(r.deviation for r in report.rows) >= -0.072  # worst: 5M 7g/3g at -7.1%
    # at the compute tolerance the 7g/3g of the 5M run is still within 10%: the 12% is headroom, not a dodge
    assert published(series).rows[2].tolerance == 0.12


def test_gromacs_full_over_3g_fails_and_the_slices_pass() -> None:
    report = published("wulver_gromacs")
    rows = by_pair(report)
    assert rows["2g.20gb / 1g.10gb"].ok and rows["3g.40gb / 2g.20gb"].ok
    full = rows["full / 3g.40gb"]
    assert not full.ok and full.ratio == pytest.approx(1.03, abs=0.005)
    assert full.ideal == pytest.approx(2.57, abs=0.005)


def test_cern_training_7g_over_3g_fails_on_slices_and_passes_on_memory() -> None:
    for series in ("cern_training_7g_3g_2000", "cern_training_7g_3g_5000"):
        slices = published(series)
        memory = published(series, basis="memory")
        (row,) = slices.rows
        assert not row.ok and -0.239 <= row.deviation <= -0.218  # -23.8% and -21.9%
        assert row.ideal == pytest.approx(7 / 3)
        (mrow,) = memory.rows
        assert mrow.ok and mrow.ideal == pytest.approx(2.0) and mrow.basis == "memory"
    for series, ratio in (("cern_training_4g_2g_2000", 1.87), ("cern_training_2g_1g_2000", 1.94)):
        (row,) = published(series).rows
        assert row.ok and row.ideal == pytest.approx(2.0) and row.ratio == pytest.approx(ratio, abs=0.005)
    qlora = by_pair(published("wulver_qlora"))
    assert qlora["2g.20gb / 1g.10gb"].ok and qlora["3g.40gb / 2g.20gb"].ok
    assert not qlora["full / 3g.40gb"].ok and qlora["full / 3g.40gb"].ratio == pytest.approx(1.32, abs=0.005)


@pytest.mark.parametrize("basis", ["slices", "sms", "memory"])
def test_cern_bandwidth_is_exactly_one_two_four_eight_on_memory_slices(basis: str) -> None:
    report = published("cern_bandwidth", basis=basis)  # bandwidth follows memory slices whatever the basis
    assert [r.pair for r in report.rows] == ["2g.10gb / 1g.5gb", "3g.20gb / 2g.10gb", "7g.40gb / 3g.20gb"]
    assert all(r.basis == "memory" and r.ideal == 2.0 and r.deviation == 0.0 for r in report.rows)
    assert report.ok


def test_mig_off_over_7g_is_judged_against_the_sm_ratio() -> None:
    for series in ("cern_fp16_cuda", "cern_fp32_cuda", "cern_fp64_cuda", "cern_fp16_tensor", "cern_simpletrack_15M"):
        for basis in ("slices", "sms"):
            row = by_pair(published(series, basis=basis))["full / 7g.40gb"]
            assert row.ideal == pytest.approx(108 / 98)
            assert row.ok, (series, basis, row.deviation)
            assert "MIG off vs 7g" in row.note
    training = by_pair(published("cern_training_full_7g_2000"))["full / 7g.40gb"]
    assert training.ratio == pytest.approx(65.77 / 63.30) and training.ok  # the loss is smaller than the SMs'
    # Hopper's 7g keeps all 132 SMs: MIG off vs 7g is 1
    (row,) = check_values("NVIDIA H200", {"7g.141gb": 700.0, "full": 770.0}).rows
    assert row.ideal == 1.0 and not row.ok  # 10% faster with MIG off would be a finding on Hopper


# --------------------------------------------------------------------------- ideal ratios


def test_slice_ideals_are_seven_thirds_three_halves_and_two() -> None:
    report = check_values("NVIDIA A100-SXM4-40GB", {"1g.5gb": 1.0, "2g.10gb": 2.0, "3g.20gb": 3.0, "7g.40gb": 7.0})
    assert [(r.pair, r.ideal) for r in report.rows] == [
        ("2g.10gb / 1g.5gb", 2.0), ("3g.20gb / 2g.10gb", 1.5), ("7g.40gb / 3g.20gb", pytest.approx(7 / 3))]
    assert report.ok and all(r.deviation == pytest.approx(0.0) for r in report.rows)


def test_sm_basis_is_exact_on_hopper_and_the_slice_basis_is_not() -> None:
    """A perfectly SM-bound figure on H100/H200: 16, 32, 60, 132 SMs (3g has 60, not 3/7 of 132)."""
    for gpu, profiles in (("NVIDIA H200", ("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb")),
                          ("NVIDIA H100 80GB HBM3", ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"))):
        values = dict(zip(profiles, (16 * 4.0, 32 * 4.0, 60 * 4.0, 132 * 4.0)))
        sms = check_values(gpu, values, basis="sms")
        assert sms.ok and [r.ideal for r in sms.rows] == [2.0, pytest.approx(60 / 32), pytest.approx(132 / 60)]
        assert by_pair(sms)[f"{profiles[3]} / {profiles[2]}"].ideal == pytest.approx(2.2)
        slices = check_values(gpu, values)
        assert [r.pair for r in slices.failures] == [f"{profiles[2]} / {profiles[1]}"]  # 1.875 for 1.5: +25%
        assert slices.failures[0].deviation == pytest.approx(0.25)
    # on the A100 the two bases agree: 98/42 = 7/3, 42/28 = 3/2, 28/14 = 2
    a100 = {"1g.5gb": 14.0, "2g.10gb": 28.0, "3g.20gb": 42.0, "7g.40gb": 98.0}
    assert [r.ideal for r in check_values("NVIDIA A100-SXM4-40GB", a100, basis="sms").rows] == pytest.approx(
        [r.ideal for r in check_values("NVIDIA A100-SXM4-40GB", a100).rows])


def test_times_scale_as_speed_ups() -> None:
    report = check_values("NVIDIA A100-SXM4-40GB", {"1g.5gb": 10.0, "2g.10gb": 5.0}, direction="lower")
    (row,) = report.rows
    assert row.ratio == 2.0 and row.ok


def test_failure_text_holds_the_table_with_ratio_ideal_and_deviation() -> None:
    text = published("cern_fp16_tensor").failure_text()
    lines = text.splitlines()
    assert lines[0] == "1 scaling ratio(s) off their ideal by more than the tolerance:"
    header = lines[1].split()
    for column in ("profiles", "ratio", "ideal", "deviation", "tolerance", "result"):
        assert column in header
    (row,) = [line for line in lines if "7g.40gb / 3g.20gb" in line]
    assert "1.610" in row and "2.333 (slices)" in row and "-31.0%" in row and "±15%" in row and "FAIL" in row
    assert "2g.10gb / 1g.5gb" not in text  # only the failing ratios
    assert published("wulver_fp16_gemm").format_table().count(" ok") == 3


# --------------------------------------------------------------------------- families and sources

H200 = "NVIDIA H200"


def rec(profile: str, value: float, *, kind: str = "compute", target_kind: str = "mig", name: str = "fp32_tflops",
        unit: str = "TFLOPS", direction: str = "higher", sms_obtained: int | None = None, node: str = "n1",
        test: str = "benchmarks/test_cuda_cores.py::test_fma[fp32]") -> ResultRecord:
    emulated = target_kind == "emulated"
    target = {"kind": target_kind, "profile": profile, "gpu_name": H200, "gpu_slug": "nvidia-h200",
              "emulated": emulated, "baseline_profile": f"{profile}-emulated" if emulated else profile,
              "sms_obtained": sms_obtained}
    metric = Metric(name, value, unit, direction, [], kind)  # type: ignore[arg-type]
    return ResultRecord(test, metric, TargetInfo.from_dict(target), {"memory_total_mib": 143771}, node=node)


def test_emulated_and_real_profiles_are_never_in_one_ladder() -> None:
    records = [rec("1g.18gb", 16.0), rec("2g.35gb", 32.0),  # real slices, from other jobs' files
               rec("3g.71gb", 30.0, target_kind="emulated"), rec("7g.141gb", 66.0, target_kind="emulated"),
               rec("full", 66.0, target_kind="full")]
    report = check_scaling(records, basis="sms")
    pairs = {(r.family, r.pair) for r in report.rows}
    assert pairs == {("MIG", "2g.35gb / 1g.18gb"), ("MIG", "full / 2g.35gb"),
                     ("emulated", "7g.141gb / 3g.71gb"), ("emulated", "full / 7g.141gb")}
    assert {g.family: [r.profile for r in g.rungs] for g in report.groups} == {
        "MIG": ["1g.18gb", "2g.35gb", "full"], "emulated": ["3g.71gb", "7g.141gb", "full"]}


def test_emulated_bandwidth_is_left_out_and_real_bandwidth_is_checked() -> None:
    emulated = [rec(p, 4000.0, kind="memory", name="copy_gbs", unit="GB/s", target_kind="emulated")
                for p in ("1g.18gb", "3g.71gb", "7g.141gb")]
    report = check_scaling(emulated)
    assert report.rows == []
    assert any("emulated bandwidth left out" in s for s in report.skipped)
    real = [rec("1g.18gb", 600.0, kind="memory", name="copy_gbs", unit="GB/s"),
            rec("3g.71gb", 2400.0, kind="memory", name="copy_gbs", unit="GB/s")]
    (row,) = check_scaling(emulated + real).rows
    assert (row.family, row.pair, row.ideal, row.basis) == ("MIG", "3g.71gb / 1g.18gb", 4.0, "memory")


def test_emulation_uses_the_sm_count_really_obtained() -> None:
    """Hopper green contexts come in multiples of 8 SMs: a 3g asked with 60 may get 64."""
    report = check_scaling([rec("3g.71gb", 64.0, target_kind="emulated", sms_obtained=64),
                            rec("7g.141gb", 132.0, target_kind="emulated", sms_obtained=132)], basis="sms")
    (row,) = report.rows
    assert row.ideal == pytest.approx(132 / 64) and row.deviation == pytest.approx(0.0)


def test_an_emulated_sweep_is_held_to_the_sms_obtained_whatever_the_basis() -> None:
    """The H200 sweep as the green contexts really gave it (16, 32, 32, 64, 64, 132 SMs): slice
    ratios (3g/2g = 1.5) cannot hold when 3g got 64 SMs, so emulation is judged on SMs, and the
    1g.35gb variant (26 SMs asked, 32 obtained) stays out of the 1g -> 2g -> 3g -> 4g -> 7g ladder."""
    sms = {"1g.18gb": 16, "1g.35gb": 32, "2g.35gb": 32, "3g.71gb": 64, "4g.71gb": 64, "7g.141gb": 132}
    records = [rec(p, 0.5 * n, target_kind="emulated", sms_obtained=n) for p, n in sms.items()]
    report = check_scaling(records, basis="slices")
    assert [r.pair for r in report.rows] == ["2g.35gb / 1g.18gb", "3g.71gb / 2g.35gb", "4g.71gb / 3g.71gb",
                                             "7g.141gb / 4g.71gb"]
    assert all(r.basis == "sms" and r.ok for r in report.rows)
    assert any("1g.35gb" in s and "variant" in s for s in report.skipped)
    # a profile that lost half its speed is still caught
    records[3] = rec("3g.71gb", 0.25 * 64, target_kind="emulated", sms_obtained=64)
    bad = check_scaling(records, basis="slices")
    assert {r.pair for r in bad.failures} == {"3g.71gb / 2g.35gb", "4g.71gb / 3g.71gb"}


def test_real_slices_keep_the_basis_asked_for() -> None:
    records = [rec("1g.18gb", 16.0), rec("2g.35gb", 32.0), rec("3g.71gb", 60.0)]
    rows = check_scaling(records, basis="slices").rows
    assert [(r.pair, r.basis, r.ideal) for r in rows] == [("2g.35gb / 1g.18gb", "slices", 2.0),
                                                          ("3g.71gb / 2g.35gb", "slices", 1.5)]


def test_several_nodes_of_one_profile_give_their_median() -> None:
    records = [rec("1g.18gb", v, node=f"n{i}") for i, v in enumerate((15.0, 16.0, 40.0))] + [rec("2g.35gb", 32.0)]
    (group,) = check_scaling(records).groups
    assert [(r.profile, r.value, r.n) for r in group.rungs] == [("1g.18gb", 16.0, 3), ("2g.35gb", 32.0, 1)]


def test_stored_baselines_fill_in_profiles_this_run_did_not_measure(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save([rec("1g.18gb", 16.0), rec("3g.71gb", 99.0), rec("1g.18gb", 5.0, name="other")])
    stored, problems = store.records("nvidia-h200")
    assert problems == []
    report = check_scaling([rec("3g.71gb", 60.0), rec("2g.35gb", 32.0)], basis="sms", extra=stored)
    rows = by_pair(report)
    assert list(rows) == ["2g.35gb / 1g.18gb", "3g.71gb / 2g.35gb"]  # this run's 3g wins over the stored one
    assert rows["3g.71gb / 2g.35gb"].value_bigger == 60.0
    assert "other profile from the stored baseline" in rows["2g.35gb / 1g.18gb"].note
    assert all(r.metric == "fp32_tflops" for r in report.rows)  # a metric only stored is not checked


def test_a_stored_profile_keeps_the_clock_it_ran_at_for_the_power_limited_rule(tmp_path: Path) -> None:
    """A site's nightly 4g job against the 7g history it saved: at 700 W the 7g ran at 1485 MHz. With
    nothing of its clocks kept, its bf16 7g/4g (1.57 for 2.06) failed every night the 4g ran alone."""
    def capped(r: ResultRecord, window: float, after: float, reasons: list[str]) -> ResultRecord:
        r.metric.info["clocks"] = {"window": {"sm_clock_mhz": window},
                                   "after": {"sm_clock_mhz": after, "throttle_reasons": reasons, "throttled": bool(reasons)}}
        return r

    def sustained(profile: str, value: float, sms: int) -> ResultRecord:
        return rec(profile, value, kind="tensor", name="bf16_sustained_tflops", target_kind="emulated",
                   sms_obtained=sms, test="benchmarks/test_gemm.py::test_gemm[bf16]")

    store = BaselineStore(tmp_path)
    store.save([capped(sustained("7g.141gb", 664.0, 132), 1485.0, 1665.0, ["sw_power_cap"])])
    doc = json.loads(next(tmp_path.rglob("7g.141gb-emulated.json")).read_text())
    assert '"clock_mhz": 1485.0' in json.dumps(doc)  # the window's clock, not the 1665 read after it
    stored, problems = store.records("nvidia-h200")
    assert problems == [] and stored[0].metric.info["clocks"]["window"] == {"sm_clock_mhz": 1485.0}
    tonight = capped(sustained("4g.71gb", 425.0, 64), 1935.0, 1935.0, [])
    (row,) = check_scaling([tonight], extra=stored).rows
    assert row.pair == "7g.141gb / 4g.71gb" and row.result == "power-limited"
    assert "SM clock 1485 vs 1935 MHz" in row.note
    slow = capped(sustained("4g.71gb", 640.0, 64), 1935.0, 1935.0, [])  # 4g gained 50%: still a finding
    assert [r.result for r in check_scaling([slow], extra=stored).rows] == ["FAIL"]

    # a history saved before clocks were kept: its throttle reasons still say the 7g was capped
    old = tmp_path / "old"
    BaselineStore(old).save([capped(sustained("7g.141gb", 664.0, 132), 1485.0, 1665.0, ["sw_power_cap"])])
    path = next(old.rglob("7g.141gb-emulated.json"))
    path.write_text(path.read_text().replace('"clock_mhz": 1485.0,', "").replace(', "clock_mhz": 1485.0', ""))
    assert "clock_mhz" not in path.read_text()
    stored_old, problems = BaselineStore(old).records("nvidia-h200")
    assert problems == [] and "window" not in stored_old[0].metric.info["clocks"]
    (row,) = check_scaling([tonight], extra=stored_old).rows
    assert row.result == "power-limited" and "sw_power_cap" in row.note


@pytest.mark.parametrize("clock", ["1485", -5, 0, True, float("nan")])
def test_a_saved_clock_that_is_not_a_clock_is_named_and_nothing_is_written(tmp_path: Path, clock: Any) -> None:
    from pytest_mig.store.history import BaselineError

    store = BaselineStore(tmp_path)
    store.save([rec("7g.141gb", 66.0)])
    path = next(tmp_path.rglob("7g.141gb.json"))
    doc = json.loads(path.read_text())
    entry = next(iter(next(iter(doc["modes"].values())).values()))
    next(iter(entry.values()))["runs"][0]["clock_mhz"] = clock
    path.write_text(json.dumps(doc))
    before = path.read_text()
    with pytest.raises(BaselineError, match="clock_mhz"):
        store.save([rec("7g.141gb", 67.0)])
    assert path.read_text() == before


def test_stored_real_slices_never_join_an_emulated_ladder(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path)
    store.save([rec("1g.18gb", 16.0), rec("2g.35gb", 32.0, target_kind="emulated")])
    stored, _ = store.records("nvidia-h200")
    assert {(r.target.kind, r.target.profile) for r in stored} == {("mig", "1g.18gb"), ("emulated", "2g.35gb")}
    report = check_scaling([rec("3g.71gb", 60.0, target_kind="emulated")], basis="sms", extra=stored)
    (row,) = report.rows
    assert (row.family, row.pair) == ("emulated", "3g.71gb / 2g.35gb")


def test_nothing_to_check_says_what_it_saw() -> None:
    report = check_scaling([rec("3g.71gb", 60.0)])
    assert report.rows == [] and report.ok
    assert "only 3g.71gb measured" in report.skipped[0]
    reason = report.skip_reason()
    assert "at least two profiles" in reason and "NVIDIA H200: 3g.71gb" in reason and "--mig-emulate" in reason
    assert "(no GPU results)" in check_scaling([]).skip_reason()
    assert report.format_table() == "(no scaling ratios)"


def test_mixed_units_kinds_not_checked_and_bad_basis() -> None:
    mixed = check_scaling([rec("1g.18gb", 16.0), rec("2g.35gb", 32000.0, unit="GFLOPS")])
    assert mixed.rows == [] and "direction or unit differs" in mixed.skipped[0]
    energy = check_scaling([rec("1g.18gb", 1.0, kind="energy", name="j"), rec("2g.35gb", 9.0, kind="energy", name="j")])
    assert energy.rows == [] and energy.groups == []
    with pytest.raises(ValueError, match="unknown scaling basis 'flops'"):
        check_scaling([], basis="flops")
    tight = check_values(H200, {"1g.18gb": 16.0, "2g.35gb": 30.0}, tolerances=0.05)
    assert not tight.ok and tight.rows[0].tolerance == 0.05
    per_kind = check_values(H200, {"1g.18gb": 16.0, "2g.35gb": 30.0}, tolerances={"compute": 0.1})
    assert per_kind.ok


# --------------------------------------------------------------------------- the benchmark test


def _results_file(path: Path, records: list[ResultRecord]) -> str:
    write_results(path, records)
    return str(path)


def test_benchmark_scaling_test_fails_with_the_table_from_other_slices_results(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """benchmarks/test_scaling.py on the CPU, fed two slices' results files and a stored baseline
    (found through the ini's mig_baseline_dir, relative to the rootdir)."""
    import fake_pynvml

    fake_pynvml.install(monkeypatch, "no-gpu")
    pytester.makefile(".ini", pytest="[pytest]\nmig_baseline_dir = stored\n")
    pytester.path.joinpath("test_bench_scaling.py").write_text((REPO / "benchmarks" / "test_scaling.py").read_text())
    BaselineStore(pytester.path / "stored").save([rec("1g.18gb", 16.0)])
    one = _results_file(pytester.path / "r2g.json", [rec("2g.35gb", 32.0)])
    three = _results_file(pytester.path / "r3g.json", [rec("3g.71gb", 30.0)])  # half of what 60 SMs should give
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)  # the baseline folder is found from the rootdir, not the working directory
    test_file = str(pytester.path / "test_bench_scaling.py")
    quiet = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")  # not what is tested; slow to load each run
    result = pytester.runpytest(test_file, *quiet, "--mig-scaling-basis", "sms", "--mig-scaling-results", one, three)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*1 scaling ratio(s) off their ideal by more than the tolerance:*",
        "*3g.71gb / 2g.35gb*0.938*1.875 (sms)*-50.0%*FAIL*",
    ])
    assert "2g.35gb / 1g.18gb" in result.stdout.str()  # the stored 1g filled in (shown in the section)
    result = pytester.runpytest(test_file, *quiet, "--mig-scaling-results", one)
    result.assert_outcomes(passed=1)  # 2g from the file, 1g from the baseline: 2.0 for 2
    result = pytester.runpytest(test_file, *quiet)
    result.assert_outcomes(skipped=1)
    assert json.loads(Path(one).read_text())["records"][0]["target"]["profile"] == "2g.35gb"


def test_a_metric_the_workload_exempts_is_not_scaling_checked() -> None:
    fixed = [rec(p, v, kind="training", name="tokens_per_s", unit="tokens/s") for p, v in
             (("1g.18gb", 100.0), ("7g.141gb", 150.0))]
    for r in fixed:
        r.metric.info["scaling"] = False
    report = check_scaling(fixed)
    assert report.rows == [] and any("not scaling-checked" in s for s in report.skipped)
    for r in fixed:
        r.metric.info["scaling"] = True
    assert [r.ok for r in check_scaling(fixed).rows] == [False]


def test_a_bigger_profile_at_the_power_limit_is_reported_not_failed() -> None:
    """The H200 sweep: 7g at 1485 MHz (sw_power_cap), 4g at 1980 MHz; 673/425 = 1.58 for 132/64 SMs."""
    def clocked(mhz: int, reasons: list[str]) -> dict:
        return {"clocks": {"after": {"sm_clock_mhz": mhz, "throttle_reasons": reasons, "throttled": bool(reasons)}}}

    small = rec("4g.71gb", 425.0, kind="tensor", name="bf16_tflops", target_kind="emulated", sms_obtained=64)
    big = rec("7g.141gb", 673.0, kind="tensor", name="bf16_tflops", target_kind="emulated", sms_obtained=132)
    assert [r.result for r in check_scaling([small, big]).rows] == ["FAIL"]
    small.metric.info.update(clocked(1980, []))
    big.metric.info.update(clocked(1485, ["sw_power_cap"]))
    (row,) = check_scaling([small, big]).rows
    assert row.ok and row.result == "power-limited" and "SM clock 1485 vs 1980 MHz" in row.note
    big.metric.value = 500.0  # far below even the clock-scaled ideal (1.547): a real loss
    assert [r.result for r in check_scaling([small, big]).rows] == ["FAIL"]
    big.metric.value = 673.0
    big.metric.info.update(clocked(1980, ["sw_power_cap"]))  # same clock: the cap does not explain the gap
    assert [r.result for r in check_scaling([small, big]).rows] == ["FAIL"]
    del small.metric.info["clocks"], big.metric.info["clocks"]  # no clocks: the bigger alone throttled
    big.metric.info.update({"clocks": {"after": {"throttle_reasons": ["sw_power_cap"], "throttled": True}}})
    assert [r.result for r in check_scaling([small, big]).rows] == ["power-limited"]


def test_the_clock_of_a_measurement_is_its_window_mean_before_the_snapshot_after_it() -> None:
    """On the GPU (2026-11-26) an emulated 7g.141gb's fp64 GEMM sampled 1620 MHz through its window and
    read 1710 MHz once it ended: scaled by the snapshot, 1.69 would be judged against 1.78, not 1.69."""
    def clocked(window: float | None, after: float) -> dict:
        clocks: dict = {"after": {"sm_clock_mhz": after, "throttle_reasons": [], "throttled": False}}
        if window is not None:
            clocks["window"] = {"sm_clock_mhz": window}
        return {"clocks": clocks}

    small = rec("4g.71gb", 31.64, kind="tensor", name="fp64_sustained_tflops", target_kind="emulated", sms_obtained=64)
    big = rec("7g.141gb", 53.47, kind="tensor", name="fp64_sustained_tflops", target_kind="emulated", sms_obtained=132)
    small.metric.info.update(clocked(1980.0, 1980.0))
    big.metric.info.update(clocked(1620.0, 1710.0))
    (row,) = check_scaling([small, big]).rows
    assert row.result == "power-limited" and "SM clock 1620 vs 1980 MHz (clock-scaled ideal 1.688)" in row.note
    big.metric.info.update(clocked(None, 1710.0))  # no window: the snapshot after it
    (row,) = check_scaling([small, big]).rows
    assert "SM clock 1710 vs 1980 MHz" in row.note
    big.metric.info["clocks"]["window"] = {"sm_clock_mhz": True}  # not a clock: passed over, never a number
    (row,) = check_scaling([small, big]).rows
    assert "SM clock 1710 vs 1980 MHz" in row.note


def test_quick_and_normal_runs_are_never_one_ladder() -> None:
    """--mig-quick measures smaller problems: a quick 1g and a normal 2g are not a scaling pair."""
    small, big = rec("1g.18gb", 16.0), rec("2g.35gb", 20.0)
    assert [r.result for r in check_scaling([small, big], basis="sms").rows] == ["FAIL"]
    small.mode = "quick"
    report = check_scaling([small, big], basis="sms")
    assert report.rows == [] and sum("only" in s and "measured" in s for s in report.skipped) == 2


def test_an_emulated_figure_held_back_by_the_shared_memory_bandwidth_is_reported_not_failed() -> None:
    """Emulation shares HBM: a 64-SM context already draws what 132 SMs draw, so a training or
    simulation figure between the bandwidth ratio and the SM ratio is 'bandwidth-shared'."""
    def ladder_of(kind: str, big_value: float, *, target_kind: str = "emulated") -> list[ResultRecord]:
        return [rec("4g.71gb", 100.0, kind=kind, name="tokens_per_s", unit="tokens/s", target_kind=target_kind,
                    sms_obtained=64, test="benchmarks/test_training.py::test_training[x]"),
                rec("7g.141gb", big_value, kind=kind, name="tokens_per_s", unit="tokens/s", target_kind=target_kind,
                    sms_obtained=132, test="benchmarks/test_training.py::test_training[x]")]

    def bandwidth(gbs_4g: float, gbs_7g: float, *, target_kind: str = "emulated") -> list[ResultRecord]:
        return [rec(p, v, kind="memory", name="fp32_triad_gbs", unit="GB/s", target_kind=target_kind, sms_obtained=s,
                    test="benchmarks/test_bandwidth.py::test_stream[fp32]")
                for p, v, s in (("4g.71gb", gbs_4g, 64), ("7g.141gb", gbs_7g, 132))]

    assert [r.result for r in check_scaling(ladder_of("training", 160.0)).rows] == ["FAIL"]  # no bandwidth data
    (row,) = check_scaling(ladder_of("training", 160.0) + bandwidth(4000.0, 4040.0)).rows
    assert row.ok and row.result == "bandwidth-shared"
    assert "4040 vs 4000 GB/s" in row.note and row.to_dict()["bandwidth_shared"]
    assert [r.result for r in check_scaling(ladder_of("simulation", 160.0) + bandwidth(4000.0, 4040.0)).rows] == [
        "bandwidth-shared"]
    assert [r.result for r in check_scaling(ladder_of("training", 210.0) + bandwidth(4000.0, 4040.0)).rows] == [
        "ok"]  # within the SM ideal: no allowance needed
    # Compute-bound kinds get no allowance; nor a figure that fell below even the bandwidth ratio,
    # nor one whose contexts' bandwidth grew with their SMs, nor real slices (they own their memory).
    assert [r.result for r in check_scaling(ladder_of("tensor", 160.0) + bandwidth(4000.0, 4040.0)).rows] == ["FAIL"]
    assert [r.result for r in check_scaling(ladder_of("training", 80.0) + bandwidth(4000.0, 4040.0)).rows] == ["FAIL"]
    assert [r.result for r in check_scaling(ladder_of("training", 160.0) + bandwidth(2000.0, 4000.0)).rows] == ["FAIL"]
    real = ladder_of("training", 160.0, target_kind="mig") + bandwidth(4000.0, 4040.0, target_kind="mig")
    assert [r.result for r in check_scaling(real, basis="sms").rows if r.metric == "tokens_per_s"] == ["FAIL"]


def test_a_passing_scaling_check_prints_its_table_and_draws_the_plot(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fake_pynvml

    fake_pynvml.install(monkeypatch, "no-gpu")
    pytester.path.joinpath("test_bench_scaling.py").write_text((REPO / "benchmarks" / "test_scaling.py").read_text())
    one = _results_file(pytester.path / "r1g.json", [rec("1g.18gb", 16.0)])
    two = _results_file(pytester.path / "r2g.json", [rec("2g.35gb", 32.0)])
    plot = pytester.path / "scaling.png"
    quiet = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")
    result = pytester.runpytest(*quiet, "--mig-scaling-results", one, two, "--mig-scaling-plot", str(plot))
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*pytest-mig scaling against ideal*", "*2g.35gb / 1g.18gb*2.000*ok*",
                                 "*pytest-mig scaling plot*", f"*{plot}*"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_scaling_plot_without_matplotlib_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    import fake_pynvml

    fake_pynvml.install(monkeypatch, "no-gpu")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:hypothesispytest", "--mig-scaling-plot", "s.png")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --mig-scaling-plot needs matplotlib, which is not installed*"])
