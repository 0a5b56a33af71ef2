"""``pytest-mig calibrate`` (real pytest processes on the CPU) and the detection experiment's analysis
(``pytest-mig detection --analyse-only``) on synthetic results files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_mig import cli
from pytest_mig.night.calibrate import CPU_NOT_A_BASELINE
from pytest_mig.night.detection import SIZES, analyse, markdown
from pytest_mig.measure import Metric
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.store.results import ResultRecord, write_results

BENCH = '''
import os

from pytest_mig.measure import Metric


def test_rate(mig_bench):
    mig_bench.record(Metric("rate", float(os.environ.get("RATE", "100")), "items/s", "higher", [99.0, 100.0, 101.0]))
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with one benchmark test, as the current folder, on a machine without a GPU."""
    (tmp_path / "test_bench.py").write_text(BENCH)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # whatever this machine has, the runs are CPU runs
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    return tmp_path


def test_calibrate_runs_the_suite_n_times_into_the_history_and_prints_the_thresholds(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["calibrate", "-n", "3", "--", "test_bench.py", "-p", "no:cacheprovider", "-q"])
    out = capsys.readouterr().out
    assert code == 0, out
    for i in (1, 2, 3):
        assert f"calibrate: run {i}/3 ..." in out and f"calibrate: run {i}/3 done in " in out
    doc = json.loads((project / "baselines" / "cpu" / "cpu.json").read_text())
    runs = doc["modes"]["normal"]["test_bench.py::test_rate"]["rate"]["runs"]
    assert [r["value"] for r in runs] == [100.0, 100.0, 100.0]
    # CPU figures are not a baseline: their spread, no threshold, nothing called gating, and the closing
    # sentence says so
    assert "spread (CV)" in out and "test_rate" in out
    table = out[:out.index("1 figure(s) of 1 test(s) on the CPU.")]
    assert "threshold" not in table and "detects" not in table and "gates" not in table and "yes" not in table
    assert out.rstrip().endswith("1 figure(s) of 1 test(s) on the CPU. " + CPU_NOT_A_BASELINE)
    (folder,) = (project / ".mig-results" / "calibrate").iterdir()  # this calibration's own folder
    assert f"calibrate: each run's results file and log go to {folder.relative_to(project)}" in out
    assert sorted(p.name for p in folder.iterdir()) == [
        "calibrate-01.json", "calibrate-01.log", "calibrate-02.json", "calibrate-02.log", "calibrate-03.json",
        "calibrate-03.log"]


def test_a_second_calibration_never_writes_over_the_first_one_s_files(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two calibrations with the default work folder, in the same second: each writes into a folder of its
    own, and the first one's results files and logs are as it left them."""
    args = ["calibrate", "-n", "1", "--", "test_bench.py", "-p", "no:cacheprovider", "-q"]
    assert cli.main(args) == 0
    (first,) = (project / ".mig-results" / "calibrate").iterdir()
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    os.environ["RATE"] = "90"
    try:
        assert cli.main(args) == 0
    finally:
        del os.environ["RATE"]
    folders = sorted((project / ".mig-results" / "calibrate").iterdir())
    assert len(folders) == 2 and first in folders
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    (second,) = set(folders) - {first}
    assert json.loads((second / "calibrate-01.json").read_text())["records"][0]["metric"]["value"] == 90.0
    capsys.readouterr()


def test_a_work_folder_that_cannot_be_made_is_one_sentence(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "taken").write_text("a file, not a folder\n")
    assert cli.main(["calibrate", "-n", "1", "--work-dir", "taken", "--", "test_bench.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pytest-mig: error: --work-dir taken: no folder for this calibration's files can be made "
                          "there (") and len(err.splitlines()) == 1
    assert (project / "taken").read_text() == "a file, not a folder\n" and not (project / "baselines").exists()


def test_calibrate_refuses_options_it_sets_itself_and_needs_pytest_arguments(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["calibrate", "--", "test_bench.py", "--mig-save-baseline"]) == 2
    assert capsys.readouterr().err.strip() == ("pytest-mig: error: --mig-save-baseline is set by pytest-mig itself "
                                               "here; leave it out of the pytest arguments")
    assert cli.main(["calibrate"]) == 2
    assert "give the pytest arguments after --" in capsys.readouterr().err
    assert not (project / "baselines").exists()


def test_calibrate_stops_when_pytest_cannot_run_at_all_and_says_pytests_sentence(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["calibrate", "-n", "3", "--", "test_bench.py", "--mig-tolerance", "150%"])
    out, err = capsys.readouterr()
    assert code == 2  # a usage error, as pytest-mig's own are
    assert "calibrate: run 2/3" not in out and "Traceback" not in out + err
    assert err == ("pytest-mig: error: pytest refused its arguments (exit 4): argument --mig-tolerance: tolerance "
                   "'150%' is out of range: it must be at least 0 and below 100%\n")
    assert len(err.splitlines()) == 1


def test_calibrate_with_a_baseline_dir_that_is_a_file_says_why_in_one_escaped_sentence(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "history").write_text("not a folder")
    assert cli.main(["calibrate", "-n", "2", "--baseline-dir", "history", "--", "test_bench.py"]) == 2
    out, err = capsys.readouterr()
    assert err == (f"pytest-mig: error: pytest refused its arguments (exit 4): --mig-baseline-dir {project / 'history'}: "
                   f"{project / 'history'} is a file, not a folder, so nothing can be written there.\n")
    assert "calibrate: run 2/2" not in out and (project / "history").read_text() == "not a folder"
    assert cli.main(["calibrate", "-n", "2", "--", "test_bench.py", "--no-such-option\x1b[2J"]) == 2
    err = capsys.readouterr().err  # argparse's own line, with the escape sequence shown, not sent
    assert err == ("pytest-mig: error: pytest refused its arguments (exit 4): unrecognized arguments: "
                   "--no-such-option\\x1b[2J\n")


def test_the_time_budget_says_what_the_next_night_does_with_a_test_that_gates_nothing() -> None:
    """A test whose figures gate nothing only because a short history is held to the reference's sigma still
    runs (its history must reach 10 runs to gate); one whose own runs are too noisy is left out, as the
    plugin leaves it out (night.gates_nothing), and the table says which (it said both were candidates)."""
    import io

    from pytest_mig.store.history import Baseline, BaselineEntry, BaselineMeta, Run
    from pytest_mig.night.calibrate import LEFT_OUT, STILL_RUN, budget_rows, left_out_tests, print_thresholds, threshold_rows
    from pytest_mig.judge.reference import ReferenceStore

    def entry(test: str, metric: str, values: list[float]) -> BaselineEntry:
        return BaselineEntry(test, metric, "items/s", "higher", "compute", None, [Run(v) for v in values], "normal")

    quiet, noisy = [100.0, 100.1, 99.9, 100.0, 100.05], [100.0, 88.0, 112.0, 95.0, 106.0]
    fixed, lora = ("benchmarks/test_training.py::test_training[qwen1.5b-lora-maxbatch]",
                   "benchmarks/test_site.py::test_site_kernel")  # a site's own test: no reference holds it
    gemm = "benchmarks/test_gemm.py::test_gemm[fp32]"
    base = Baseline(BaselineMeta("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3", "full", False),
                    {(t, m, "normal"): entry(t, m, v) for t, m, v in (
                        (fixed, "tokens_per_s", quiet),  # quiet here; the reference's 11% holds it until 10 runs
                        (lora, "tokens_per_s", noisy),  # too noisy in its own runs too
                        (gemm, "fp32_sustained_tflops", quiet))})
    refs = ReferenceStore()
    ref = refs.load("nvidia-h100-80gb-hbm3", "full")
    rows = threshold_rows(base, references=refs)
    assert {r["test"]: r["gates"] for r in rows if r["test"] != "test_gemm[fp32]"} == {
        "test_training[qwen1.5b-lora-maxbatch]": "no: too noisy",
        "test_site_kernel": "no: too noisy"}
    assert left_out_tests(base, ref) == {("test_site_kernel", "normal")}
    seconds = {fixed: 20.0, lora: 15.0, gemm: 9.0}
    table = {r[0]: r for r in budget_rows(rows, seconds, left_out_tests(base, ref))}
    assert table["test_training[qwen1.5b-lora-maxbatch]"][5] == STILL_RUN
    assert table["test_site_kernel"][5] == LEFT_OUT
    assert (table["test_gemm[fp32]"][3], table["test_gemm[fp32]"][5]) == ("1/1", "")  # it gates: it buys a verdict
    out = io.StringIO()
    print_thresholds([base], out)
    assert "2 test(s) gate nothing: 1 left out of the next night (0 s), 1 still run until their own history decides." \
        in out.getvalue()


# --------------------------------------------------------------------------- detection analysis

TARGET = TargetInfo("full", "full", "full", gpu_name="NVIDIA H100 80GB HBM3", gpu_slug="nvidia-h100-80gb-hbm3",
                    emulated=False)


def run_file(path: Path, values: dict[str, float], verdicts: dict[str, dict[str, object]] | None = None) -> None:
    records = []
    for name, value in values.items():
        direction = "lower" if name.endswith("_s") else "higher"
        rec = ResultRecord("benchmarks/test_x.py::test_x", Metric(name, value, "u", direction, [value]), TARGET,
                           {"driver": "580.159.04"}, mode="quick")
        verdict = (verdicts or {}).get(name)
        rec.verdict = Verdict.from_dict(verdict) if verdict is not None else None
        records.append(rec)
    write_results(path, records)


def test_detection_counts_false_alarms_replays_slowdowns_and_reports_slowed_runs(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture[str]) -> None:
    quiet = [100.0, 100.1, 99.9, 100.05, 99.95, 100.0, 100.1, 99.9, 100.0, 100.05, 99.95, 100.0]
    noisy = [100.0, 112.0, 90.0, 105.0, 95.0, 110.0, 92.0, 104.0, 97.0, 108.0, 94.0, 101.0]
    for i, (q, n) in enumerate(zip(quiet, noisy), start=1):
        run_file(tmp_path / f"unchanged-{i:02d}.json", {"quiet_rate": q, "noisy_rate": n, "step_s": 1.0 + (q - 100) / 1000})
    for j in (1, 2):  # slowed runs the plugin judged and failed (quiet) or reported (noisy)
        run_file(tmp_path / f"slow-120-{j:02d}.json", {"quiet_rate": 90.0, "noisy_rate": 95.0, "step_s": 1.11},
                 {"quiet_rate": {"outcome": "regressed", "failed": True}, "noisy_rate": {"outcome": "noisy", "failed": False},
                  "step_s": {"outcome": "regressed", "failed": True}})
    assert cli.main(["detection", "--analyse-only", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    text = (tmp_path / "detection.md").read_text()
    assert text in out
    assert "Unchanged runs: 12; judged as nightly runs (against >= 5 earlier runs): 7; runs with a false alarm: **0**." in text
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in text.splitlines() if line.startswith("| test_x")}
    quiet_row, noisy_row, step_row = rows["quiet_rate"], rows["noisy_rate"], rows["step_s"]
    assert quiet_row[7] == "yes" and quiet_row[8] == "0 / 7 (0)"
    assert quiet_row[10:13] == ["12/12", "12/12", "12/12"]  # 3%, 5% and 10% worse are all caught
    assert quiet_row[13] == "+10.0%, 2/2"  # the slowed runs' true slowdown, and how many failed
    assert step_row[13] == "+11.0%, 2/2"  # a time that grew is a slowdown too
    assert noisy_row[7] == "no" and noisy_row[10].startswith("(")  # too noisy: shown, in brackets


def test_a_false_alarm_in_the_nightly_flow_is_counted_and_its_re_measurements_can_clear_it(tmp_path: Path) -> None:
    values = [100.0, 100.1, 99.9, 100.05, 99.95, 100.0, 96.0, 100.0]  # run 7 dips by 4%
    runs = []
    for i, v in enumerate(values):
        verdict = {"outcome": "transient", "confirmations": [99.9, 100.1]} if i == 6 else None  # it re-measured and came back
        run_file(tmp_path / f"u{i}.json", {"rate": v}, {"rate": verdict} if verdict else None)
    from pytest_mig.store.results import read_results

    runs = [read_results(tmp_path / f"u{i}.json") for i in range(len(values))]
    (fig,) = analyse(runs, {})
    assert (fig.flow_judged, fig.flow_false, fig.flow_transient) == (3, 0, 1)
    runs[6][0].verdict = None  # had it not re-measured, the dip would be an alarm
    (fig,) = analyse(runs, {})
    assert (fig.flow_false, fig.alarm_runs) == (1, [7])
    assert "runs with a false alarm: **1** (run(s) 7: rate)." in markdown([fig], runs, {})
    assert SIZES == (0.03, 0.05, 0.10)


def test_detection_refuses_a_folder_that_is_not_there_and_stops_at_pytests_refusal(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["detection", "--analyse-only", "--out", "nowhere"]) == 2
    assert capsys.readouterr().err == ("pytest-mig: error: --out nowhere: no such folder (--analyse-only reads the "
                                       "results files that earlier runs left there)\n")
    assert not (project / "nowhere").exists()
    assert cli.main(["detection", "--out", "exp", "--", "test_bench.py", "--mig-profile", "nonsense"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("pytest-mig: error: pytest refused its arguments (exit 4): 'nonsense' is not a MIG profile")
    assert "unchanged run 1/" not in out and sorted(p.name for p in (project / "exp").iterdir()) == [
        "unchanged-01.log"]  # one run, not fifteen refused ones


def test_detection_needs_enough_unchanged_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_file(tmp_path / "unchanged-01.json", {"rate": 100.0})
    assert cli.main(["detection", "--analyse-only", "--out", str(tmp_path)]) == 1
    assert "1 unchanged run(s) in" in capsys.readouterr().out and os.path.exists(tmp_path)
