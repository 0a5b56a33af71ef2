"""Reports from synthetic records: the terminal summary, .md/.csv/.json files read back, JUnit
properties, outlier nodes in a merged report, and the scaling plot (with and without matplotlib)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_mig.measure import Metric
from pytest_mig.report.tables import (
    COLUMNS,
    ReportError,
    find_outliers,
    frame_table,
    junit_properties,
    merged_frame,
    plot_scaling,
    records_frame,
    sharpness_line,
    summary_lines,
    verdict_notes,
    summary_table,
    verdict_counts,
    write_report,
)
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.store.results import ResultRecord
from pytest_mig.judge.scaling import check_values

GEMM = "benchmarks/test_gemm.py::test_gemm[fp16]"
STREAM = "benchmarks/test_bandwidth.py::test_stream"


def rec(
    value: float,
    *,
    test: str = GEMM,
    name: str = "fp16_tflops",
    unit: str = "TFLOPS",
    direction: str = "higher",
    kind: str = "tensor",
    profile: str = "3g.71gb",
    node: str = "gpu01",
    verdict: dict[str, Any] | None = None,
    compare_: bool = True,
    gpu: str = "NVIDIA H200",
) -> ResultRecord:
    target = {"kind": "mig", "profile": profile, "baseline_profile": profile, "gpu_name": gpu,
              "gpu_slug": "nvidia-h200", "emulated": False}
    metric = Metric(name, value, unit, direction, [value], kind, {}, compare_)  # type: ignore[arg-type]
    return ResultRecord(test, metric, TargetInfo.from_dict(target), {"driver": "580.159.04"}, "2025-01-01T00:00:00+00:00",
                        node, Verdict.from_dict(verdict) if verdict is not None else None)


def verdict(outcome: str, baseline: float | None = None, change: float | None = None, **kw: Any) -> dict[str, Any]:
    band = {"threshold": 0.02, "detectable": 0.029, "runs": 10, "gates": True, "source": "baseline"} \
        if baseline is not None else {}
    return {"outcome": outcome, "baseline": baseline, "change_pct": change, **band, **kw}


@pytest.fixture
def judged() -> list[ResultRecord]:
    return [
        rec(138.2, verdict=verdict("regressed", 151.7, -8.899)),
        rec(3.91, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory", verdict=verdict("pass", 3.9, 0.256)),
        rec(12288, test=GEMM, name="size_at_peak", unit="n", compare_=False, verdict=verdict("info")),
        rec(40.0, test=STREAM, name="triad_tbs", unit="TB/s", kind="memory", verdict=verdict("no-baseline")),
    ]


# --------------------------------------------------------------------------- terminal summary


def test_summary_table_columns_and_rows(judged: list[ResultRecord]) -> None:
    lines = summary_table(judged).splitlines()
    assert lines[0].split() == ["test", "metric", "value", "unit", "baseline", "change", "threshold", "detects",
                                "verdict"]
    gemm = lines[2].split()
    assert gemm == ["test_gemm[fp16]", "fp16_tflops", "138.2", "TFLOPS", "151.7", "-8.9%", "±2.0%", "2.9%", "regressed"]
    stream = lines[3].split()
    assert stream == ["test_stream", "copy_tbs", "3.91", "TB/s", "3.9", "+0.3%", "±2.0%", "2.9%", "pass"]
    assert lines[5].split() == ["test_stream", "triad_tbs", "40.00", "TB/s", "-", "-", "-", "-", "no-baseline"]
    assert summary_table([]) == "(no metrics recorded)"


def test_summary_table_adds_the_profile_when_the_run_covered_several() -> None:
    records = [rec(30.0, profile="1g.18gb"), rec(60.0, profile="3g.71gb")]
    lines = summary_table(records).splitlines()
    assert lines[0].split()[-1] == "profile"
    assert lines[2].split()[-1] == "1g.18gb" and lines[3].split()[-1] == "3g.71gb"
    assert lines[2].split()[-2] == "-"  # not judged


def test_throttled_verdicts_say_so_and_counts(judged: list[ResultRecord]) -> None:
    judged[0].verdict = Verdict.from_dict(verdict("regressed", 151.7, -8.9, throttled=["sw_power_cap"]))
    assert "regressed (throttled)" in summary_table(judged)
    assert verdict_counts(judged) == {"regressed": 1, "pass": 1, "no-baseline": 1, "info": 1}
    assert verdict_counts([rec(1.0)]) == {"not judged": 1}
    tail = summary_lines(judged)[-1]
    assert tail == "4 metric(s): 1 pass, 1 regressed, 1 no-baseline, 1 info"


def band_verdict(outcome: str, threshold: float, detectable: float, *, gates: bool | None = True, runs: int = 3,
                 source: str = "baseline", sigma: float | None = 0.004) -> dict[str, Any]:
    return {"outcome": outcome, "baseline": 100.0, "change_pct": 0.0, "threshold": threshold,
            "detectable": detectable, "gates": gates, "runs": runs, "source": source, "sigma": sigma}


def test_what_judged_and_gating_within_a_limit_mean() -> None:
    def v(**kw: Any) -> Verdict:
        return Verdict.from_dict(band_verdict(**{"outcome": "pass", "threshold": 0.05, "detectable": 0.06, **kw}))

    assert v().judged and v().gates_within(0.05)  # a threshold equal to the limit is within it
    assert not v().gates_within(0.049)
    assert v(threshold=1 - 0.85).gates_within(0.15)  # 0.15000000000000002: rounding, not a wider band
    assert not v(gates=None).gates_within(0.05) and not v(gates=False).gates_within(0.05)
    assert v(outcome="noisy").judged and not v(outcome="noisy").gates_within(0.05)  # judged too noisy: never gating
    assert v(detectable=0.05).catches(0.05) and not v().catches(0.05)  # detects 6%: a 5% loss only sometimes
    assert not v(detectable=0.05, sigma=None).catches(0.05)  # its noise unknown: nothing says it catches
    for outcome in ("no-baseline", "incomparable", "info"):
        assert not Verdict.from_dict(verdict(outcome)).judged


def test_the_sharpness_line_counts_what_tonight_would_catch() -> None:
    records = [rec(100.0, verdict=band_verdict("pass", 0.02, 0.03)),  # gates, catches a 5% loss
               rec(100.0, verdict=band_verdict("regressed", 0.045, 0.06)),  # gates; a 5% loss only sometimes
               rec(100.0, verdict=band_verdict("pass", 0.10, 0.10, runs=1, sigma=None)),  # a short history's wide band
               rec(100.0, verdict=band_verdict("noisy", 0.08, 0.12, gates=False)),
               rec(100.0, verdict=verdict("no-baseline")), rec(100.0, verdict=verdict("info")), rec(100.0)]
    line = sharpness_line(records)
    assert line == (
        "how sharp: 2 of 4 judged figure(s) gate within 5%, 1 of them catching a 5% loss (detects <= 5%); "
        "1 judged at a wider band; 1 too noisy to gate. The history holds 1-3 run(s): each band narrows as it "
        "grows (to the figure's own noise alone from 10 runs).")
    assert line.isascii()  # compare prints it to whatever stdout is: an ASCII locale too
    # a run's tolerance is the limit: 4.5% is wider than 3%
    assert sharpness_line(records, 0.03).startswith("how sharp: 1 of 4 judged figure(s) gate within 3%, 1 of them")
    # a band of unknown noise capped by a tolerance gates within it, but nothing says it catches a loss of that size
    capped = [rec(100.0, verdict=band_verdict("pass", 0.03, 0.03, runs=1, sigma=None))]
    assert sharpness_line(capped, 0.03).startswith("how sharp: 1 of 1 judged figure(s) gate within 3%, 0 of them catching")
    # nothing judged: no line
    assert sharpness_line(records[4:]) is None and sharpness_line([]) is None


def test_the_sharpness_line_names_what_the_bands_stood_on() -> None:
    first_night = [rec(100.0, verdict=band_verdict("pass", 0.10, 0.11, source="reference", runs=12)),
                   rec(100.0, verdict=band_verdict("pass", 0.15, 0.2, source="ceiling", runs=432))]
    line = sharpness_line(first_night)
    assert line is not None and line.startswith("how sharp: 0 of 2 judged figure(s) gate within 5%; 2 judged at a wider band.")
    assert ("1 against a reference of other runs (at least 10%): a history of the site's own runs narrows each band "
            "to the figure's noise.") in line
    assert "1 against the device's ceiling (no reference holds them)." in line
    assert "The history holds" not in line  # the reference's runs and the ceiling's are no history of the site's
    settled = [rec(100.0, verdict=band_verdict("pass", 0.02, 0.03, runs=10))]
    assert sharpness_line(settled) == ("how sharp: 1 of 1 judged figure(s) gate within 5%, 1 of them catching a 5% "
                                       "loss (detects <= 5%).")


def test_an_incomparable_verdict_has_a_note_with_its_reason(judged: list[ResultRecord]) -> None:
    assert verdict_notes(judged) == []  # nothing incomparable: no note
    why = "fp16_tflops 138.2 TFLOPS not compared: measured on profile 3g.71gb but the baseline is for 2g.35gb"
    judged[0].verdict = Verdict.from_dict(verdict("incomparable", message=why))
    assert verdict_notes(judged) == [f"INCOMPARABLE {GEMM} {why}"]


# --------------------------------------------------------------------------- report files


def test_markdown_report(tmp_path: Path, judged: list[ResultRecord]) -> None:
    path = write_report(tmp_path / "out" / "report.md", judged)
    lines = path.read_text().splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(COLUMNS)
    assert set(lines[1]) <= set("|:-")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:10] == [GEMM, "fp16_tflops", "138.2", "TFLOPS", "151.7", "-8.9", "2", "2.9", "10", "regressed"]
    missing = [c.strip() for c in lines[5].strip("|").split("|")]
    assert missing[4:10] == ["-", "-", "-", "-", "-", "no-baseline"]  # no baseline shows as "-", never "nan"
    assert "nan" not in path.read_text()


def test_csv_report(tmp_path: Path, judged: list[ResultRecord]) -> None:
    path = write_report(tmp_path / "report.CSV", judged)  # the suffix decides, in any case
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == list(COLUMNS)
    assert len(rows) == 4
    assert rows[0]["test"] == GEMM and float(rows[0]["value"]) == 138.2 and float(rows[0]["baseline"]) == 151.7
    assert rows[0]["verdict"] == "regressed" and rows[0]["node"] == "gpu01" and rows[0]["profile"] == "3g.71gb"
    assert rows[3]["baseline"] == "" and rows[3]["change_pct"] == ""


def test_json_report(tmp_path: Path, judged: list[ResultRecord]) -> None:
    path = write_report(tmp_path / "report.json", judged)
    rows = json.loads(path.read_text())
    assert isinstance(rows, list) and len(rows) == 4
    assert rows[0] == {
        "test": GEMM, "metric": "fp16_tflops", "value": 138.2, "unit": "TFLOPS", "baseline": 151.7,
        "change_pct": -8.9, "threshold_pct": 2.0, "detectable_pct": 2.9, "runs": 10, "verdict": "regressed",
        "source": "baseline", "profile": "3g.71gb", "gpu": "NVIDIA H200", "node": "gpu01",
        "kind": "tensor", "direction": "higher", "emulated": False, "mode": "normal", "timestamp": "2025-01-01T00:00:00+00:00",
    }
    assert rows[3]["baseline"] is None and rows[3]["change_pct"] is None  # null, not NaN (which is not JSON)
    assert "NaN" not in path.read_text()


def test_unknown_report_suffix_is_a_clear_error(tmp_path: Path, judged: list[ResultRecord]) -> None:
    for name in ("report.txt", "report"):
        with pytest.raises(ReportError) as info:
            write_report(tmp_path / name, judged)
        message = str(info.value)
        assert message.startswith(str(tmp_path / name))
        assert ".md" in message and ".csv" in message and ".json" in message
        assert not (tmp_path / name).exists()
    assert "'no suffix'" in str(pytest.raises(ReportError, write_report, tmp_path / "report", judged).value)


def test_an_empty_report_still_has_its_columns(tmp_path: Path) -> None:
    assert next(csv.reader(write_report(tmp_path / "r.csv", []).open())) == list(COLUMNS)
    assert json.loads(write_report(tmp_path / "r.json", []).read_text()) == []


# --------------------------------------------------------------------------- JUnit properties


def test_junit_properties_of_one_test() -> None:
    props = junit_properties([rec(138.2, verdict=verdict("regressed", 151.7, -8.8991))])
    assert props == [
        ("fp16_tflops", 138.2), ("fp16_tflops.unit", "TFLOPS"), ("fp16_tflops.verdict", "regressed"),
        ("fp16_tflops.baseline", 151.7), ("fp16_tflops.baseline_source", "baseline"), ("fp16_tflops.change_pct", -8.9),
        ("mig.profile", "3g.71gb"), ("mig.gpu", "NVIDIA H200"),
    ]
    ref = junit_properties([rec(138.2, verdict={**verdict("regressed", 151.7, -8.8991), "source": "reference"})])
    assert ("fp16_tflops.baseline_source", "reference") in ref
    suite = junit_properties([rec(138.2, verdict=verdict("regressed", 151.7, -8.8991))], prefix="b/t.py::t[3g.71gb]")
    assert [n for n, _ in suite] == [f"b/t.py::t[3g.71gb]::{n}" for n, _ in props]  # a suite's properties


def test_junit_properties_name_the_test_when_there_are_several(judged: list[ResultRecord]) -> None:
    names = [n for n, _ in junit_properties(judged)]
    assert f"{GEMM}::fp16_tflops" in names and f"{STREAM}::copy_tbs.verdict" in names
    assert f"{STREAM}::triad_tbs.baseline" not in names  # no baseline: no property
    assert junit_properties([]) == []


# --------------------------------------------------------------------------- outliers across nodes


def nodes(values: dict[str, float], **kw: Any) -> list[ResultRecord]:
    return [rec(v, node=n, **kw) for n, v in values.items()]


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_a_node_three_times_slower_is_flagged(direction: str) -> None:
    slow = 100.0 / 3 if direction == "higher" else 300.0
    records = nodes({"gpu01": 100.0, "gpu02": 97.0, "gpu03": slow, "gpu04": 103.0}, direction=direction,
                    name="rate" if direction == "higher" else "seconds")
    (o,) = find_outliers(records)
    assert o.node == "gpu03"
    assert o.factor == pytest.approx(3.0, rel=0.05)
    assert o.others == 3 and o.others_median == 100.0
    assert o.line().startswith("OUTLIER node gpu03: ")
    assert "3.0x worse than the median 100.0" in o.line()


def test_ordinary_noise_is_not_an_outlier() -> None:
    assert find_outliers(nodes({"gpu01": 100.0, "gpu02": 92.0, "gpu03": 108.0, "gpu04": 95.0})) == []
    assert find_outliers(nodes({"gpu01": 100.0, "gpu02": 80.0})) == []  # 25% apart is noise for this check
    assert find_outliers(nodes({"gpu01": 100.0})) == []  # one node: nothing to compare with


def test_two_nodes_the_slow_one_is_flagged_not_the_fast_one() -> None:
    (o,) = find_outliers(nodes({"fast": 10.0, "slow": 30.0}, direction="lower", name="seconds"))
    assert o.node == "slow" and o.factor == pytest.approx(3.0)


def test_outliers_are_per_test_metric_gpu_and_profile() -> None:
    records = (nodes({"a": 100.0, "b": 101.0}, profile="3g.71gb")
               + nodes({"c": 33.0, "d": 34.0}, profile="1g.18gb")  # a smaller slice is slower, not an outlier
               + [rec(12288, node="e", name="size_at_peak", compare_=False), rec(3.0, node="f", name="size_at_peak",
                                                                                compare_=False)])
    assert find_outliers(records) == []
    records.append(rec(10.0, node="g", profile="1g.18gb"))
    assert [o.node for o in find_outliers(records)] == ["g"]


def test_a_quick_run_is_not_an_outlier_among_normal_runs() -> None:
    """--mig-quick measures smaller problems; its nodes are compared among themselves."""
    records = nodes({"a": 100.0, "b": 101.0, "c": 30.0})
    records[2].mode = "quick"
    assert find_outliers(records) == []
    records += nodes({"d": 31.0, "e": 10.0})
    for r in records[3:]:
        r.mode = "quick"
    (o,) = find_outliers(records)
    assert o.node == "e" and o.mode == "quick" and "on NVIDIA H200 3g.71gb (quick) is 3.0x worse" in o.line()
    frame = merged_frame(records, [o])
    assert list(frame.loc[frame["outlier"] != "", "node"]) == ["e"] and set(frame["mode"]) == {"normal", "quick"}


def test_several_records_of_one_node_are_reduced_to_their_median() -> None:
    records = nodes({"a": 100.0, "b": 100.0}) + [rec(v, node="c") for v in (30.0, 100.0, 101.0)]
    assert find_outliers(records) == []


def test_merged_frame_marks_the_outlier_rows() -> None:
    records = nodes({"gpu02": 100.0, "gpu01": 98.0, "gpu03": 30.0})
    outliers = find_outliers(records)
    frame = merged_frame(records, outliers)
    assert list(frame["node"]) == ["gpu01", "gpu02", "gpu03"]  # sorted
    assert list(frame["outlier"]) == ["", "", "<< 3.3x worse"]
    table = frame_table(frame, ["node", "value", "outlier", "no-such-column"])
    assert table.splitlines()[0].split() == ["node", "value", "outlier"]
    assert table.splitlines()[-1].split() == ["gpu03", "30.00", "<<", "3.3x", "worse"]


# --------------------------------------------------------------------------- the scaling plot


def _report() -> Any:
    return check_values("NVIDIA A100-SXM4-40GB", {"1g.5gb": 30.1, "2g.10gb": 66.0, "3g.20gb": 94.2, "7g.40gb": 151.7},
                        kind="tensor", metric="fp16_tflops", unit="TFLOPS")


def test_plot_scaling_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    times = check_values("NVIDIA A100-SXM4-40GB", {"1g.5gb": 182.3, "7g.40gb": 28.7}, direction="lower",
                         kind="simulation", metric="seconds")
    report = _report()
    report.groups += times.groups
    report.rows += times.rows
    path = plot_scaling(report, tmp_path / "plots" / "scaling.png")
    assert path == tmp_path / "plots" / "scaling.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_scaling_marks_the_pairs_that_missed_their_ideal(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = check_values("NVIDIA A100-SXM4-40GB", {"1g.5gb": 10.0, "2g.10gb": 20.0, "3g.20gb": 21.0})
    assert [r.result for r in report.rows] == ["ok", "FAIL"]
    svg = plot_scaling(report, tmp_path / "scaling.svg").read_text()
    assert svg.count("<!-- FAIL -->") == 1 and "<!-- ok -->" not in svg  # matplotlib's SVG names each text


def test_plot_scaling_without_matplotlib_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + [
            "matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"]:
        monkeypatch.setitem(sys.modules, name, None)  # what `import matplotlib` meets when it is not installed
    with pytest.raises(ReportError, match=r"plotting needs matplotlib, which is not installed: "
                                          r"pip install 'pytest-mig\[plot\]'"):
        plot_scaling(_report(), tmp_path / "scaling.png")
    assert not (tmp_path / "scaling.png").exists()


def test_plot_scaling_with_nothing_to_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    empty = check_values("NVIDIA H200", {"3g.71gb": 1.0})
    with pytest.raises(ReportError, match="nothing to plot"):
        plot_scaling(empty, tmp_path / "scaling.png")


def test_records_frame_has_every_column() -> None:
    frame = records_frame([rec(1.0, verdict=verdict("pass", 1.0, 0.0))])
    assert list(frame.columns) == list(COLUMNS)
    assert frame.loc[0, "verdict"] == "pass" and frame.loc[0, "gpu"] == "NVIDIA H200"


def test_reports_are_readable_by_the_team_not_only_their_writer(tmp_path: Path) -> None:
    import os
    import stat

    from pytest_mig.store.results import atomic_write_text

    old = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.md"
        atomic_write_text(fresh, "x\n")
        assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
        kept = tmp_path / "kept.md"
        kept.write_text("old\n")
        os.chmod(kept, 0o640)
        atomic_write_text(kept, "new\n")
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "new\n"
    finally:
        os.umask(old)
