"""The ``pytest-mig`` command, called in-process: devices (fake pynvml), report (results files of
several nodes merged, a slow node flagged), compare (verdicts, exit status), and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import fake_pynvml
import pytest
import topologies

from pytest_mig import cli
from pytest_mig.measure import Metric
from pytest_mig.judge.reference import ReferenceStore, build
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.store.results import ResultRecord, write_results

GEMM = "benchmarks/test_gemm.py::test_gemm[fp16]"
STREAM = "benchmarks/test_bandwidth.py::test_stream"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rec(value: float, *, node: str = "gpu01", test: str = GEMM, name: str = "fp16_tflops", unit: str = "TFLOPS",
        direction: str = "higher", kind: str = "tensor", profile: str = "3g.71gb", gpu: str = "NVIDIA H200",
        samples: list[float] | None = None, fingerprint: dict[str, Any] | None = None) -> ResultRecord:
    target = {"kind": "mig", "profile": profile, "baseline_profile": profile, "gpu_name": gpu,
              "gpu_slug": gpu.lower().replace(" ", "-"), "emulated": False}
    xs = [value * (1 + 0.002 * (i % 5 - 2)) for i in range(10)] if samples is None else samples
    metric = Metric(name, value, unit, direction, xs, kind)  # type: ignore[arg-type]
    return ResultRecord(test, metric, TargetInfo.from_dict(target), dict(fingerprint or {"driver": "580.159.04"}),
                        "2025-01-01T00:00:00+00:00", node)


#: A figure no shipped reference holds: no prior, so one earlier run gives the conservative band.
OWN = "own_tflops"


def results(path: Path, *records: ResultRecord) -> str:
    write_results(path, records)
    return str(path)


# --------------------------------------------------------------------------- devices


def test_devices_lists_gpus_instances_and_profiles(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pynvml.install(monkeypatch, "a100-40gb-mixed")
    code, out, err = run(capsys, "devices")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "driver 535.183.01, CUDA driver 12.2"
    assert lines[1].startswith("GPU 0: NVIDIA A100-SXM4-40GB, 40960 MiB, MIG on, GPU-")
    instances = [line.split() for line in lines if line.strip().startswith("MIG ")]
    assert [i[1] for i in instances] == ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]
    slots = [i[i.index("--mig-device") + 1].rstrip(",") for i in instances]  # what --mig-device N:M takes
    assert len(set(slots)) == 4 and all(slot.startswith("0:") for slot in slots)
    busy = next(line for line in lines if topologies.A100_40_1G_BUSY in line)
    assert f"busy (pids {topologies.A100_40_BUSY_PID})" in busy and "14 SMs" in busy
    assert any(line.startswith("GPU 1: NVIDIA A100-SXM4-40GB") and "MIG off" in line for line in lines)
    profiles = next(line for line in lines if line.strip().startswith("profiles:"))
    for name in ("1g.5gb (14 SMs, x7)", "2g.10gb (28 SMs, x3)", "3g.20gb (42 SMs, x2)", "7g.40gb (98 SMs, x1)"):
        assert name in profiles


def test_devices_shows_a_pending_mig_mode_and_a_busy_whole_gpu(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    t = topologies.with_mig_mode(topologies.get_topology("h200-mig-off"), 0, current=0, pending=1)
    fake_pynvml.install(monkeypatch, topologies.with_busy(topologies.with_all_free(t), topologies.H200_GPU0, pid=77))
    code, out, _ = run(capsys, "devices")
    assert code == 0
    assert "MIG off (MIG on pending: a GPU reset is due before it applies)" in out and "busy (pids 77)" in out


def test_devices_on_a_gpu_with_mig_off(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pynvml.install(monkeypatch, "h200-mig-off")
    code, out, _ = run(capsys, "devices")
    assert code == 0
    assert "GPU 0: NVIDIA H200, 143771 MiB, MIG off" in out
    assert "  MIG " not in out  # no instances with MIG off
    assert "3g.71gb (60 SMs, x2)" in out and "7g.141gb (132 SMs, x1)" in out
    shipped = ReferenceStore().models()["NVIDIA H200"]  # whatever the package ships for the H200
    assert "full" in shipped and "1g.18gb-emulated" in shipped
    line = next(x for x in out.splitlines() if x.startswith("  NVIDIA H200: "))
    assert [p.split(" (")[0] for p in line.split(": ", 1)[1].split("), ")] == shipped and "no reference for" not in out
    assert "full (quick x" in line  # the runs of each mode


@pytest.mark.parametrize(("topology", "phrase"), [
    ("no-gpu", "No GPU: NVML found no NVIDIA GPU on this machine."),
    ("no-nvml", "No GPU: NVML could not start: the NVML library (libnvidia-ml.so) was not found"),
    (fake_pynvml.NO_PYNVML, "No GPU: the pynvml module (package nvidia-ml-py) is not installed."),
])
def test_devices_without_a_gpu_says_so_and_succeeds(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                    topology: str, phrase: str) -> None:
    fake_pynvml.install(monkeypatch, topology)
    code, out, err = run(capsys, "devices")
    assert code == 0 and err == ""
    assert out.startswith(phrase)
    lines = out.splitlines()
    assert len(lines) == 4  # the reason, then the GPU models with shipped references
    assert lines[1].startswith("references (") and lines[2].startswith("  NVIDIA H100 80GB HBM3: 1g.10gb-emulated (")
    assert ", full (quick x" in lines[2] and lines[3].startswith("  NVIDIA H200: ")


# --------------------------------------------------------------------------- report


@pytest.fixture
def night(tmp_path: Path) -> list[str]:
    """One results file per node; gpu03 is three times slower on the GEMM."""
    values = {"gpu01": 151.7, "gpu02": 149.9, "gpu03": 50.2, "gpu04": 152.3}
    return [results(tmp_path / f"{node}.json", rec(v, node=node),
                    rec(4.1, node=node, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory"))
            for node, v in values.items()]


def test_report_merges_nodes_into_one_table_and_flags_the_slow_one(capsys: pytest.CaptureFixture[str],
                                                                   night: list[str]) -> None:
    code, out, err = run(capsys, "report", *night)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "8 metric(s) from 4 file(s): 4 device(s) on 4 node(s); verdicts: 8 not judged"  # summary first
    assert lines[lines.index("SLOW NODES: 1") + 1] == (
        f"  OUTLIER node gpu03: {GEMM} fp16_tflops 50.20 TFLOPS on NVIDIA H200 3g.71gb is 3.0x worse "
        f"than the median 151.7 TFLOPS of 3 other node(s) (1 figure(s) in all)")
    header = next(i for i, line in enumerate(lines) if line.startswith("test "))
    assert lines[header].split() == ["test", "metric", "gpu", "profile", "node", "device", "value", "unit", "verdict",
                                     "outlier"]
    assert header > lines.index("SLOW NODES: 1")  # the rows (few, and no --out) after the summary
    rows = [line for line in lines if line.startswith(("benchmarks/", GEMM))]
    assert len(rows) == 8
    gemm = [line for line in rows if "fp16_tflops" in line]
    assert [line.split()[5] for line in gemm] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert gemm[2].rstrip().endswith("<< 3.0x worse")
    assert not any("<<" in line for line in rows if "gpu03" not in line)


def test_report_fail_on_outlier_and_factor(capsys: pytest.CaptureFixture[str], night: list[str]) -> None:
    assert run(capsys, "report", "--fail-on-outlier", *night)[0] == 1
    code, out, _ = run(capsys, "report", "--fail-on-outlier", "--outlier-factor", "3.5", *night)
    header = next(line for line in out.splitlines() if line.startswith("test "))
    assert code == 0 and "OUTLIER node" not in out and "SLOW NODES" not in out and "outlier" not in header


def test_report_without_outliers_and_written_to_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    files = [results(tmp_path / f"n{i}.json", rec(v, node=f"n{i}")) for i, v in enumerate((100.0, 96.0, 104.0))]
    out_path = tmp_path / "merged.csv"
    code, out, _ = run(capsys, "report", "--fail-on-outlier", "--out", str(out_path), *files)
    assert code == 0 and "OUTLIER BOARDS: 0" in out and "SLOW NODES" not in out
    assert f"3 row(s), one per device and figure, written to {out_path}" in out
    header, *rows = out_path.read_text().splitlines()
    assert header.split(",")[-1] == "outlier" and len(rows) == 3


def test_report_of_empty_results(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "report", results(tmp_path / "empty.json"))
    assert code == 0 and out == "no metrics in 1 file(s)\n"


# --------------------------------------------------------------------------- compare


def test_compare_prints_verdicts_and_fails_on_a_regression(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = results(tmp_path / "old.json", rec(151.7, name=OWN), rec(4.1, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory"))
    new = results(tmp_path / "new.json", rec(130.2, name=OWN, fingerprint={"driver": "590.10"}),
                  rec(4.11, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory"),
                  rec(7.0, test=STREAM, name="triad_tbs", unit="TB/s", kind="memory"))
    code, out, err = run(capsys, "compare", old, new)
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["test", "metric", "profile", "value", "unit", "baseline", "change_pct", "threshold_pct",
                                "verdict"]
    # one earlier run of a figure no reference knows: too few to measure noise, so the conservative 10% band
    assert f"REGRESSED {GEMM} {OWN} 130.2 TFLOPS, baseline 151.7 TFLOPS (1 run): -14.2%, threshold 10%: " \
           "only 1 run(s) in the baseline" in out
    assert "since the baseline: driver 580.159.04 -> 590.10" in out
    copy_row = next(line.split() for line in lines if "copy_tbs" in line)
    assert copy_row[-1] == "pass" and copy_row[-3] == "0.24" and copy_row[-2] == "10.00"
    triad_row = next(line.split() for line in lines if "triad_tbs" in line)
    assert triad_row[-4:] == ["-", "-", "-", "no-baseline"]
    assert lines[-1] == "3 metric(s) against 1 earlier run(s): 1 no-baseline, 1 pass, 1 regressed"
    assert lines[-2].startswith("how sharp: 0 of 2 judged figure(s) gate within 5%; 2 judged at a wider band. "
                                "The history holds 1 run(s)")


def test_compare_judges_the_last_file_against_the_history_of_the_others(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    own = "benchmarks/test_site.py::test_own_kernel"  # a site's own figure: no reference knows its noise
    history = [results(tmp_path / f"run{i}.json", rec(100.0 + d, test=own))
               for i, d in enumerate([0.0, 0.1, -0.1, 0.05, -0.05, 0.0])]
    steady = results(tmp_path / "steady.json", rec(100.4, test=own))
    slow = results(tmp_path / "slow.json", rec(95.0, test=own))
    code, out, _ = run(capsys, "compare", *history, steady)
    assert code == 0 and "against 6 earlier run(s): 1 pass" in out
    code, out, _ = run(capsys, "compare", *history, slow)
    # the history's sigma is under 0.1%: the 1% floor is the threshold, and a 5% drop fails
    assert code == 1 and "baseline 100.0 TFLOPS (median of 6 runs): -5.0%, threshold 1% (the floor" in out
    # with two files only, the same 5% drop is inside the conservative band of one run
    assert run(capsys, "compare", history[0], slow)[0] == 0


def test_compare_without_regression_exits_zero_and_improvement_can_fail(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    old = results(tmp_path / "old.json", rec(100.0, name=OWN))
    same = results(tmp_path / "same.json", rec(100.2, name=OWN))
    faster = results(tmp_path / "faster.json", rec(120.0, name=OWN))
    assert run(capsys, "compare", old, same)[0] == 0
    code, out, _ = run(capsys, "compare", old, faster)
    assert code == 0 and f"IMPROVED {GEMM} {OWN} 120.0 TFLOPS" in out
    assert run(capsys, "compare", "--mig-fail-on-improvement", old, faster)[0] == 1
    # a site's tolerance caps the threshold: 7% slower passes the conservative 10% band of one run, not 5%
    slower = results(tmp_path / "slower.json", rec(93.0, name=OWN))
    assert run(capsys, "compare", old, slower)[0] == 0
    code, out, _ = run(capsys, "compare", "--mig-tolerance", "5%", old, slower)
    assert code == 1 and "threshold 5% (the tolerance set" in out
    # one run and no prior: its noise is unknown, and the line says so rather than a sigma of 0% or a detectable change
    assert ("threshold 5% (the tolerance set; only 1 run(s) in the baseline, too few to measure its noise: without "
            "the tolerance a conservative band of at least 10% until 5 runs); nothing in the fingerprint") in out
    # the tolerance is the line's limit; one run of a site's own figure has no known noise: nothing said to catch 3%
    code, out, _ = run(capsys, "compare", "--mig-tolerance", "3%", old, slower)
    assert out.splitlines()[-2].startswith("how sharp: 1 of 1 judged figure(s) gate within 3%, 0 of them catching a 3% loss")


def test_compare_never_judges_another_profile_or_gpu_and_says_when_nothing_was_compared(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = results(tmp_path / "old.json", rec(151.7, profile="3g.71gb"))
    new = results(tmp_path / "new.json", rec(30.0, profile="1g.18gb"),
                  rec(20.0, gpu="NVIDIA H100 80GB HBM3", profile="1g.10gb"))
    code, out, _ = run(capsys, "compare", old, new)
    assert code == 1  # nothing at all could be compared: not a silent success
    assert f"INCOMPARABLE {GEMM} fp16_tflops 30.00 TFLOPS not compared: measured on profile 1g.18gb" in out
    assert "measured on NVIDIA H100 80GB HBM3 but the baseline is for NVIDIA H200" in out
    assert "2 metric(s) against 1 earlier run(s): 2 incomparable" in out
    assert out.splitlines()[-1] == (f"nothing could be compared: each figure of {new} is incomparable (the reasons "
                                    f"above) or has no history in the earlier files")


def test_compare_picks_the_old_record_of_the_same_profile(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = results(tmp_path / "old.json", rec(30.0, profile="1g.18gb"), rec(151.7, profile="3g.71gb"))
    new = results(tmp_path / "new.json", rec(151.0, profile="3g.71gb"), rec(30.1, profile="1g.18gb"))
    code, out, _ = run(capsys, "compare", old, new)
    assert code == 0 and out.splitlines()[-1] == "2 metric(s) against 1 earlier run(s): 2 pass"


def test_compare_refuses_a_tolerance_of_100_percent_or_more(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = results(tmp_path / "old.json", rec(100.0))
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", "--mig-tolerance", "150%", old, old])
    assert info.value.code == 2 and "out of range" in capsys.readouterr().err


def test_compare_needs_two_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["compare", results(tmp_path / "only.json", rec(100.0))]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("pytest-mig: error: compare needs at least two results files: the earlier ones, then the "
                           "one to judge (or one file with --mig-reference shipped)")


def test_compare_refuses_a_reference_folder_that_is_not_there(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    night = results(tmp_path / "night.json", rec(100.0))
    assert cli.main(["compare", "--mig-reference", str(tmp_path / "nowhere"), night]) == 2
    assert capsys.readouterr().err == (f"pytest-mig: error: --mig-reference {tmp_path / 'nowhere'}: no such folder; give "
                                       "'shipped' or a folder made by 'pytest-mig reference'\n")


@pytest.fixture
def ref_dir(tmp_path: Path) -> str:
    """A reference folder of five quiet runs of the H200 3g.71gb GEMM at about 100 TFLOPS."""
    runs = [results(tmp_path / f"ref{i}.json", rec(100.0 * (1 + d))) for i, d in
            enumerate((0.0, 0.002, -0.002, 0.001, -0.001))]
    build([Path(r) for r in runs], tmp_path / "ref")
    return str(tmp_path / "ref")


def test_compare_judges_a_file_alone_against_a_reference_as_a_first_night(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path, ref_dir: str) -> None:
    slow = results(tmp_path / "slow.json", rec(84.0))
    code, out, err = run(capsys, "compare", "--mig-reference", ref_dir, slow)
    assert code == 1 and err == ""
    assert (f"REGRESSED {GEMM} fp16_tflops 84.00 TFLOPS, reference 100.0 TFLOPS (median of 5 runs of the reference "
            f"for this GPU model): -16.0%, threshold 10% (against another board") in out
    assert out.splitlines()[-1] == f"1 metric(s) against 0 earlier run(s) and the references in {ref_dir}: 1 regressed"
    assert out.splitlines()[-2] == ("how sharp: 0 of 1 judged figure(s) gate within 5%; 1 judged at a wider band. "
                                    "1 against a reference of other runs (at least 10%): a history of the site's own "
                                    "runs narrows each band to the figure's noise.")
    # 7% under the reference is inside the band between boards
    assert run(capsys, "compare", "--mig-reference", ref_dir, results(tmp_path / "ok.json", rec(93.0)))[0] == 0


def test_compare_with_a_reference_lets_the_earlier_files_history_take_over(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path, ref_dir: str) -> None:
    old = results(tmp_path / "old.json", rec(84.5))
    new = results(tmp_path / "new.json", rec(84.0), rec(7.0, test=STREAM, name="triad_tbs", unit="TB/s", kind="memory"))
    code, out, _ = run(capsys, "compare", "--mig-reference", ref_dir, old, new)
    assert code == 0  # this GPU's own history: 84 is its normal; the reference would have failed it
    gemm = next(line.split() for line in out.splitlines() if "fp16_tflops" in line)
    # one run of its own, judged with the noise the reference measured, widened for a history of one run
    assert gemm[-4:-2] == ["84.50", "-0.59"] and gemm[-1] == "pass" and 1 <= float(gemm[-2]) < 5
    triad = next(line.split() for line in out.splitlines() if "triad_tbs" in line)
    assert triad[-1] == "no-baseline"  # neither a history nor a reference figure


def test_compare_re_judges_a_reference_verdict_on_the_runs_re_measurements(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path, ref_dir: str) -> None:
    dip = rec(84.0)
    dip.verdict = Verdict.from_dict({"outcome": "regressed", "confirmations": [99.2, 99.6]})  # what the plugin re-measured
    code, out, _ = run(capsys, "compare", "--mig-reference", ref_dir, results(tmp_path / "dip.json", dip))
    assert code == 0 and out.splitlines()[-1].endswith(": 1 transient")


def test_compare_reference_mistakes_are_one_sentence(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    only = results(tmp_path / "only.json", rec(100.0))
    assert cli.main(["compare", "--mig-reference", str(tmp_path / "nope"), only]) == 2
    assert capsys.readouterr().err.strip() == (f"pytest-mig: error: --mig-reference {tmp_path / 'nope'}: no such folder; "
                                               f"give 'shipped' or a folder made by 'pytest-mig reference'")
    # the shipped references hold emulated H200 profiles, never a real 3g.71gb slice: nothing to compare
    code, out, _ = run(capsys, "compare", "--mig-reference", "shipped", only)
    assert code == 1 and out.splitlines()[-1].startswith("nothing could be compared")
    assert "earlier files or a reference on the same GPU model" in out


# --------------------------------------------------------------------------- bad input


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pytest-mig: error: ")
    return lines[0]


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    for argv in (["report", str(missing)], ["compare", str(missing), str(missing)]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        assert _one_error_line(err) == f"pytest-mig: error: {missing}: no such results file"


@pytest.mark.parametrize(("content", "phrase"), [
    ("{not json", "not a readable JSON results file"),
    ("", "not a readable JSON results file"),
    ('{"schema": "pytest-mig/baseline/1", "tests": {}}', "not a pytest-mig results file"),
    ('{"schema": "pytest-mig/results/1", "records": [{"test": "t"}]}', "a record is malformed"),
    ('{"schema": "pytest-mig/results/1", "records": [{"test": "t", "metric": {"name": "x", "value": 1, '
     '"unit": "s", "direction": "up"}}]}', "a record is malformed"),
    ('{"schema": "pytest-mig/results/1", "records": [[1, 2]]}', "a record is malformed"),
])
def test_corrupt_results_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, phrase: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = results(tmp_path / "good.json", rec(1.0))
    for argv in (["report", good, str(bad)], ["compare", good, str(bad)], ["compare", str(bad), good]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        line = _one_error_line(err)
        assert line.startswith(f"pytest-mig: error: {bad}: {phrase}")


def test_a_folder_or_unreadable_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "report", str(tmp_path))
    assert code == 2 and str(tmp_path) in _one_error_line(err)


def test_unknown_report_suffix_is_said_before_reading(capsys: pytest.CaptureFixture[str], night: list[str],
                                                      tmp_path: Path) -> None:
    code, out, err = run(capsys, "report", "--out", str(tmp_path / "merged.xlsx"), *night)
    assert code == 2 and out == ""
    assert "cannot tell the report format from '.xlsx'; use one of .md" in _one_error_line(err)


def test_a_report_that_cannot_be_written(capsys: pytest.CaptureFixture[str], night: list[str], tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    code, _, err = run(capsys, "report", "--out", str(tmp_path / "a-file" / "merged.csv"), *night)
    assert code == 2
    assert str(tmp_path / "a-file") in _one_error_line(err)


@pytest.mark.parametrize("argv", [["compare"], ["report"], ["frobnicate"], [],
                                  ["compare", "--mig-tolerance", "5", "a", "b"],
                                  ["report", "--outlier-factor", "0.5", "a"]])
def test_usage_errors_exit_two_without_a_traceback(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.search(r"^pytest-mig( \w+)?: error: ", err, re.MULTILINE), err


def test_the_console_script_entry_point(tmp_path: Path) -> None:
    """`python -m pytest_mig.cli` as the installed `pytest-mig` runs it: exit status and stderr."""
    missing = tmp_path / "missing.json"
    proc = subprocess.run([sys.executable, "-m", "pytest_mig.cli", "compare", str(missing), str(missing)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"pytest-mig: error: {missing}: no such results file\n"
    assert json.loads(Path(results(tmp_path / "r.json", rec(1.0))).read_text())["schema"] == "pytest-mig/results/1"


def test_every_subcommand_module_is_in_the_dispatch_table_and_answers_help(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Each module of pytest_mig/cli (but the shared one) holds a Command listed in COMMANDS, and
    ``pytest-mig NAME --help`` works for each."""
    import importlib
    import inspect
    import pkgutil

    from pytest_mig.cli.common import Command

    modules = [m.name for m in pkgutil.iter_modules(cli.__path__) if m.name not in ("common", "__main__")]
    listed = set(cli.COMMANDS.values())
    for name in modules:
        module = importlib.import_module(f"pytest_mig.cli.{name}")
        own = [c for _, c in inspect.getmembers(module, inspect.isclass)
               if issubclass(c, Command) and c is not Command and c.__module__ == module.__name__]
        assert own and set(own) <= listed, f"pytest_mig.cli.{name}: {own} not in COMMANDS"
    assert len(modules) == len(cli.COMMANDS) == 10
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit) as exc:
            cli.main([name, "--help"])
        assert exc.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: pytest-mig {name} ")


@pytest.mark.parametrize("dir_option,keep_option,shrink_option", [
    ("--mig-baseline-dir", "--mig-baseline-keep", "--mig-baseline-shrink"),
    ("--baseline-dir", "--keep", "--shrink")])
def test_calibrate_takes_the_plugins_spellings_and_the_old_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        dir_option: str, keep_option: str, shrink_option: str) -> None:
    """The baseline folder, relative to the working directory, reaches each run as an absolute path;
    the old spellings work and --help lists only the plugin's."""
    from pytest_mig.night import calibrate

    seen: dict[str, Any] = {}

    def fake(pytest_args: list[str], runs: int, baseline_dir: Path, work_dir: Path, keep: int | None, out: Any,
             shrink: bool) -> int:
        seen.update(args=pytest_args, runs=runs, baseline_dir=baseline_dir, keep=keep, shrink=shrink)
        return 0

    monkeypatch.setattr(calibrate, "cmd_calibrate", fake)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["calibrate", "-n", "2", dir_option, "site/hist", keep_option, "4", shrink_option,
                     "--", "benchmarks"]) == 0
    assert seen == {"args": ["benchmarks"], "runs": 2, "baseline_dir": tmp_path.resolve() / "site" / "hist", "keep": 4,
                    "shrink": True}
    assert cli.main(["calibrate", "--", "benchmarks"]) == 0
    assert seen["baseline_dir"] == tmp_path.resolve() / "baselines" and seen["keep"] is None and not seen["shrink"]
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--mig-baseline-dir" in shown and "relative to the working directory" in shown
    assert not re.search(r"--baseline-dir|--keep|--shrink\b", shown)


def test_compare_spells_its_judging_options_as_the_plugin_does(capsys: pytest.CaptureFixture[str]) -> None:
    """One definition (options.add_judging_options) for pytest's parser and the command: the same
    spellings, parsed by the same types; the command's earlier spellings are usage errors."""
    import argparse

    from pytest_mig.options import add_judging_options

    plugin = argparse.ArgumentParser()
    add_judging_options(plugin.add_argument)
    args = plugin.parse_args(["--mig-tolerance", "5%", "--mig-reference", "shipped", "--mig-fail-on-improvement"])
    assert (args.mig_tolerance, args.mig_reference, args.mig_fail_on_improvement) == (0.05, "shipped", True)
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    shown = capsys.readouterr().out
    assert all(f"--mig-{name}" in shown for name in ("reference", "tolerance", "fail-on-improvement"))
    for old in (["--tolerance", "5%"], ["--reference", "shipped"], ["--fail-on-improvement"]):
        with pytest.raises(SystemExit) as info:
            cli.main(["compare", *old, "a.json", "b.json"])
        assert info.value.code == 2 and f"unrecognized arguments: {old[0]}" in capsys.readouterr().err
