"""Hostile and careless inputs that used to end in a traceback, a wrong label or an injection: each
now a sentence, an escape or a refusal.  (Files and data loss: test_site_files.py; generated inputs:
test_fuzz.py.)"""

from __future__ import annotations

import csv
import io
import types
from pathlib import Path

import fake_pynvml
import pytest
import topologies

from pytest_mig import cli

from pytest_mig.device import nvml
from pytest_mig.store.history import BaselineEntry, Run
from pytest_mig.measure import Metric
from pytest_mig.judge.noise import PRIOR, PRIOR_RUNS, band
from pytest_mig.report.tables import write_report
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord
from pytest_mig.judge.verdict import compare

TARGET = {"kind": "full", "profile": "full", "gpu_name": "NVIDIA H200", "gpu_slug": "nvidia-h200"}


def test_a_pynvml_that_raises_as_it_loads_is_a_sentence_not_internalerror(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> types.ModuleType:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file: Permission denied")

    monkeypatch.setattr(nvml, "load", broken)
    inv = nvml.discover()
    assert inv.error is not None and "the pynvml module (package nvidia-ml-py) failed to load (OSError: " in inv.error
    assert cli.main(["devices"]) == 0
    assert "failed to load" in capsys.readouterr().out


def test_a_gpu_name_with_control_characters_is_printed_escaped(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    hostile = "NVIDIA H200\x1b[2J\nGPU 9: fake"
    fake_pynvml.install(monkeypatch, topologies.with_gpu(topologies.get_topology("h200-mig-off"), 0, name=hostile))
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\nGPU 9: fake" not in out
    assert "GPU 0: NVIDIA H200\\x1b[2J\\nGPU 9: fake, " in out


@pytest.mark.parametrize("option", ["--mig-profile", "--mig-tolerance", "--mig-window", "--mig-su-coefficients",
                                    "--mig-confirm", "--mig-export"])
def test_an_option_with_control_characters_is_echoed_escaped(pytester: pytest.Pytester, option: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", option, "\x1b]0;owned\x07\x1b[2J5\nERROR: forged")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "\x1b" not in err and "\x07" not in err and "\nERROR: forged" not in err, err
    assert "\\x1b]0;owned\\x07\\x1b[2J5\\nERROR: forged" in err  # what was typed, visibly
    assert "Traceback" not in err


def _records(test: str) -> list[ResultRecord]:
    return [ResultRecord(test, Metric("rate", 100.0, "items/s"), TargetInfo.from_dict(TARGET), {}, node="=HYPERLINK(\"x\")")]


def test_csv_report_cells_never_start_a_formula(tmp_path) -> None:
    path = write_report(tmp_path / "night.csv", _records("=cmd|' /C calc'!A0"))
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert rows[0]["test"].startswith("'=") and rows[0]["node"].startswith("'=")
    for row in rows:
        assert not any(str(v).startswith(("=", "+", "-", "@")) for v in row.values())


def test_markdown_report_keeps_one_row_per_figure_and_no_raw_html(tmp_path) -> None:
    path = write_report(tmp_path / "night.md", _records("t.py::test_x[a|b\nc<script>alert(1)</script>]"))
    lines = path.read_text().splitlines()
    assert len(lines) == 3  # header, rule, one row: the | and the newline did not break the table
    assert "<script>" not in lines[2] and "&lt;script&gt;" in lines[2] and "a\\|b c" in lines[2]
    assert lines[2].count(" | ") == lines[0].count(" | ")


def _entry(values: list[float]) -> BaselineEntry:
    return BaselineEntry("t", "rate", "items/s", "higher", "compute", None,
                         [Run(v, f"2026-11-{i + 1:02d}T00:00:00+00:00") for i, v in enumerate(values)])


def test_a_value_of_1e308_is_not_compared_rather_than_passed_at_inf_percent() -> None:
    rec = ResultRecord("t", Metric("rate", 1.5e308, "items/s"), TargetInfo.from_dict(TARGET), {})
    v = compare(rec, _entry([0.5, 0.5, 0.5, 0.5, 0.5]))
    assert v.outcome == "incomparable" and "too large to be a number" in v.message and "inf" not in v.message


def test_a_short_history_borrows_the_references_sigma_until_it_has_ten_runs() -> None:
    """Five back-to-back runs 0.2% apart, as calibrate -n 5 gave bf16 GEMM on an H100: alone they set a
    1% threshold, which the next unchanged run crossed; with the reference's 0.7% the threshold is 3.5%."""
    five = [716.1, 714.0, 717.3, 715.2, 716.8]
    alone = band(five)
    assert alone.basis == "floor" and alone.threshold == pytest.approx(0.01)
    borrowed = band(five, prior=0.007)
    assert borrowed.sigma == pytest.approx(0.007) and borrowed.sigma_of == PRIOR
    assert borrowed.threshold == pytest.approx(0.035)
    ten = five * 2
    assert len(ten) == PRIOR_RUNS and band(ten, prior=0.007).sigma_of is None  # its own history has taken over
    assert band(five, prior=0.0001).sigma_of is None  # a quieter prior never narrows the band
    rec = ResultRecord("t", Metric("rate", 707.1, "items/s"), TargetInfo.from_dict(TARGET), {})
    assert compare(rec, _entry(five)).outcome == "regressed"  # the false alarm of the issue
    v = compare(rec, _entry(five), prior=0.007)
    assert v.outcome == "pass" and "the reference's for this GPU model, across nights and boards" in v.message


def test_the_judge_takes_the_prior_from_the_shipped_reference() -> None:
    from pytest_mig.judge.reference import ReferenceStore
    from pytest_mig.judge.prior import reference_prior

    refs = ReferenceStore()
    ref = refs.load("nvidia-h100-80gb-hbm3", "full")
    assert ref is not None
    entry = next(e for e in ref.baseline.entries.values() if ref.band_for(e).sigma)
    target = {"kind": "full", "profile": "full", "baseline_profile": "full", "gpu_name": "NVIDIA H100 80GB HBM3",
              "gpu_slug": "nvidia-h100-80gb-hbm3"}
    rec = ResultRecord(entry.test, Metric(entry.metric, entry.value, entry.unit, entry.direction, kind=entry.kind),
                       TargetInfo.from_dict(target), {}, mode=entry.mode)
    assert reference_prior(refs, rec) == pytest.approx(ref.band_for(entry).sigma)
    assert reference_prior(None, rec) is None


# --------------------------------------------------------------------------- numbers no schema bounded

def _results_text(tmp_path, value: float = 700.0, duration: float = 61.9, **target: str) -> str:
    from pytest_mig.store.results import write_results

    rec = ResultRecord("bench.py::test_gemm[bf16]", Metric("bf16_tflops", value, "TFLOPS", "higher", [], "tensor"),
                       TargetInfo.from_dict({**TARGET, "baseline_profile": "full", **target}), {"driver": "580.159.04"},
                       "2026-11-20T00:00:00+00:00")
    path = tmp_path / "seed.json"
    write_results(path, [rec], {"complete": True, "durations": {"bench.py::test_gemm[bf16]": duration}})
    text = path.read_text()
    path.unlink()
    return text


HUGE = {"400 digits": "1" + "0" * 400, "5000 digits": "1" + "0" * 5000, "1e999": "1e999",
        "-1e999": "-1e999", "long decimal": "1" + "0" * 400 + ".5"}


@pytest.mark.parametrize("number", list(HUGE.values()), ids=list(HUGE))
@pytest.mark.parametrize("field", ["value", "duration"])
def test_a_number_no_float_holds_is_one_sentence_naming_its_field_in_every_command(
        tmp_path, number: str, field: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_mig.store.results import ResultsFileError, read_results_file

    text = _results_text(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(text)
    bad = tmp_path / "bad.json"
    bad.write_text(text.replace("700.0", number) if field == "value" else text.replace("61.9", number))
    at = "records/0/metric/value" if field == "value" else "meta/durations/bench.py::test_gemm[bf16]"
    with pytest.raises(ResultsFileError, match=f"at {at.replace('[', '.').replace(']', '.')}: ") as exc:
        read_results_file(bad)
    assert str(exc.value).startswith(str(bad)) and "not a number any pytest-mig file holds" in str(exc.value)
    for args in (["report", str(good), str(bad)], ["compare", str(good), str(bad)], ["samples", str(good), str(bad)],
                 ["history", str(good), str(bad), "--out", str(tmp_path / "t.html")],
                 ["reference", str(bad), "--out", str(tmp_path / "ref")]):
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"at {at}" in err, (args, err)
    assert not (tmp_path / "ref").exists() and not (tmp_path / "t.html").exists()


@pytest.mark.parametrize("value", ["NaN", "-5.0", "0.0"])
def test_an_earlier_results_file_whose_figure_no_history_keeps_is_left_out_of_the_comparison(
        tmp_path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A NaN (a results file holds one where a measurement failed) or a value no rate has, in an earlier
    file: a history never keeps it (store.baselines.saveable), so compare judges without it."""
    text = _results_text(tmp_path)
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(text.replace('"value": 700.0', f'"value": {value}'))
    new.write_text(text)
    assert cli.main(["compare", str(old), str(new)]) == 1  # nothing could be compared: no history left
    out = capsys.readouterr().out
    assert "no-baseline" in out and "nothing could be compared" in out
    # beside a good earlier run, the history is that run alone: its value, and the band of one run
    (tmp_path / "older.json").write_text(text)
    assert cli.main(["compare", str(tmp_path / "older.json"), str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "The history holds 1 run(s)" in out and "1 pass" in out


def test_an_earlier_results_file_with_a_huge_duration_is_passed_over_with_a_line(pytester: pytest.Pytester) -> None:
    """The night reads earlier results files for its tests' times; one it cannot read is passed over."""
    pytester.makepyfile("def test_x():\n    pass\n")
    folder = pytester.path / "nights"
    folder.mkdir()
    (folder / "earlier.json").write_text(_results_text(pytester.path).replace("61.9", "9" * 5000))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--mig-results", f"{folder}/",
                                           "--mig-window", "1h")
    assert result.ret == 0, result.stderr.str()
    out = result.stdout.str()
    assert "earlier results passed over (their times are not used): " in out and "an integer of 5000 digits" in out
    assert "Traceback" not in out + result.stderr.str()


def test_reference_on_tiny_values_writes_a_figure_with_no_band_and_refuses_1e301_before_writing(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for i, value in enumerate(["1e-200", "1e-40", "1e-200"]):
        path = tmp_path / f"r{i}.json"
        path.write_text(_results_text(tmp_path).replace("700.0", value).replace("2026-11-20", f"2026-11-2{i}"))
        files.append(str(path))
    assert cli.main(["reference", *files, "--out", str(tmp_path / "ref")]) == 0  # OverflowError before
    from pytest_mig.judge.reference import ReferenceStore

    ref = ReferenceStore(tmp_path / "ref").load("nvidia-h200", "full")
    assert ref is not None and ref.sigma == {}  # deviations of 1e160 times the median: no sigma, no band
    capsys.readouterr()
    big = tmp_path / "big.json"
    big.write_text(_results_text(tmp_path).replace("700.0", "1e301"))
    assert cli.main(["reference", files[0], str(big), "--out", str(tmp_path / "ref2")]) == 2
    assert "1e+301, which no measurement gives; nothing was written" in capsys.readouterr().err
    assert not (tmp_path / "ref2").exists()


def _history(tmp_path, fingerprint_field: str) -> Path:
    from pytest_mig.store.baselines import BaselineStore
    from pytest_mig.store.results import read_results

    src = tmp_path / "src.json"
    src.write_text(_results_text(tmp_path))
    store = BaselineStore(tmp_path / "baselines")
    store.save(read_results(src))
    path = store.path_for("nvidia-h200", "full")
    path.write_text(path.read_text().replace('"driver": "580.159.04"', f'"driver": {fingerprint_field}'))
    return path


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e999", "1" + "0" * 40])
def test_a_fingerprint_no_json_can_write_back_is_refused_when_read(tmp_path, number: str) -> None:
    """Read with allow_nan (a figure's NaN is named by the store), a NaN fingerprint field was kept, and
    found only when the run's save could not write it; now the history is refused when read, so that
    --mig-save-baseline says it at start-up (check_save)."""
    from pytest_mig.store.baselines import BaselineStore
    from pytest_mig.store.history import BaselineError
    from pytest_mig.store.reader import load_baseline_file

    path = _history(tmp_path, number)
    with pytest.raises(BaselineError, match=r"driver|integer of 41 digits|too large for a float") as exc:
        load_baseline_file(path)
    assert str(exc.value).startswith(str(path))
    with pytest.raises(BaselineError):
        BaselineStore(tmp_path / "baselines").check_save("nvidia-h200", "full")


@pytest.mark.parametrize("number", ["1e301", "-1e301"])
def test_a_history_run_noise_beyond_1e300_is_refused(tmp_path, number: str) -> None:
    from pytest_mig.store.history import BaselineError
    from pytest_mig.store.reader import load_baseline_file

    path = _history(tmp_path, '"580.159.04"')
    text = path.read_text()
    assert '"value": 700.0' in text
    path.write_text(text.replace('"value": 700.0', f'"noise": {number}, "value": 700.0'))
    with pytest.raises(BaselineError, match="noise"):
        load_baseline_file(path)


@pytest.mark.parametrize("slug", ["nvidia\x00h200", "..", "../../etc", "a" * 300, "x/y"])
def test_a_gpu_slug_from_a_results_file_never_reaches_the_file_system(tmp_path, slug: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(_results_text(tmp_path, gpu_slug=slug))
    assert cli.main(["reference", str(path), "--out", str(tmp_path / "ref")]) == 2
    err = capsys.readouterr().err
    assert "cannot name a baseline file" in err and "\x00" not in err and err.count("\n") == 1
    assert not any((tmp_path / "ref").rglob("*.json")) if (tmp_path / "ref").exists() else True


def test_a_batches_file_naming_a_huge_batch_is_passed_over(tmp_path) -> None:
    from pytest_mig.workloads import batch_search
    from pytest_mig.workloads.caches import Caches

    caches = Caches(stack=tmp_path)
    (tmp_path / batch_search.FILE).write_text('{"case": {"eager": 48, "compiled": 1' + "0" * 400 + "}}")
    assert batch_search.recall("case", caches) == {}  # OverflowError, or a batch of 10**400, before
    (tmp_path / batch_search.FILE).write_text('{"case": {"eager": 48, "compiled": 100000000000000000000}}')
    assert batch_search.recall("case", caches) == {"eager": 48}


# --------------------------------------------------------------------------- long and odd strings

LONG = "a" * 300  # one name longer than NAME_MAX (255)


@pytest.mark.parametrize("option, value", [
    ("--mig-baseline-dir", LONG), ("--mig-results", LONG), ("--mig-report", LONG + ".md"),
    ("--mig-export", f"github={LONG}"), ("--mig-export", f"prometheus={LONG}.prom"), ("--mig-reference", LONG),
    ("--mig-scaling-plot", LONG + ".png"), ("--mig-scaling-results", LONG), ("--mig-results", "x/" * 2100 + "r.json"),
])
def test_a_path_no_file_system_takes_is_one_sentence_at_start_up(pytester: pytest.Pytester, option: str,
                                                                  value: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "Traceback" not in err and "INTERNALERROR" not in err + result.stdout.str()
    assert "longer than a file name can be (255)" in err or "longer than any path can be" in err, err
    assert "a" * 81 not in err and "..." in err  # the value is cut for display


@pytest.mark.parametrize("args", [["report", "r.json", "--out", LONG + ".md"], ["history", "--out", LONG + ".html"],
                                  ["reference", "--out", LONG], ["samples", LONG], ["compare", "a", LONG],
                                  ["compare", "r.json", "--mig-reference", LONG]])
def test_a_path_no_file_system_takes_is_a_cli_usage_error(args: list[str], tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.json").write_text(_results_text(tmp_path))
    try:
        rc = cli.main(args)
    except SystemExit as exc:  # argparse's usage error
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert "longer than a file name can be (255)" in err and "a" * 81 not in err


def test_a_profile_of_100000_characters_is_one_short_sentence(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--mig-profile", "1g." + "9" * 100_000 + "gb")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "is not a MIG profile name" in err and len(err) < 2000 and "Traceback" not in err


CONTROL = "\x1b[31mred\rback\nERROR: forged"


def _no_raw_controls(text: str) -> None:
    assert "\x1b" not in text and "\rback" not in text and "\nERROR: forged" not in text, repr(text)


@pytest.mark.parametrize("source", ["ini mig_require_gpu", "ini mig_tolerance", "ini mig_reference",
                                    "--mig-reference", "--mig-device", "CUDA_VISIBLE_DEVICES"])
def test_control_characters_in_every_source_are_echoed_escaped(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch,
                                                               source: str) -> None:
    fake_pynvml.install_subprocess(mig_env, "h200-mig-off")  # a machine with a GPU: the device options are read
    pytester.makepyfile("def test_x():\n    pass\n")
    args = ["-p", "no:cacheprovider"]
    typed = CONTROL
    if source.startswith("ini "):  # an ini line ends at \r or \n: the escape sequence and a bell
        typed = "\x1b[31mred\x07back"
        pytester.path.joinpath("pytest.ini").write_text(f"[pytest]\n{source.split()[1]} = {typed}\n", encoding="utf-8")
    elif source == "CUDA_VISIBLE_DEVICES":
        mig_env.setenv("CUDA_VISIBLE_DEVICES", "GPU-" + CONTROL)
    else:
        args += [source, CONTROL]
    result = pytester.runpytest_subprocess(*args)
    err = result.stderr.str() + result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, err
    _no_raw_controls(err)
    assert "\x07" not in err and "Traceback" not in err
    assert typed.encode("unicode_escape").decode()[:20] in err, err


@pytest.mark.parametrize("content", ["{", '{"schema": "pytest-mig/results/1", "records": [1' + "0" * 40 + "]}", None])
def test_a_file_name_with_control_characters_is_echoed_escaped(tmp_path, content: str | None,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "night\x1b[31m\rx.json"
    if content is not None:
        bad.write_text(content)
    assert cli.main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err and "night\\x1b[31m\\rx.json" in err
