"""Hostile and careless inputs that used to end in a traceback, a wrong label or an injection: each
now a sentence, an escape or a refusal.  (Files and data loss: test_site_files.py; generated inputs:
test_fuzz.py.)"""

from __future__ import annotations

import csv
import io
import types

import fake_pynvml
import pytest
import topologies

from pytest_mig import cli, nvml
from pytest_mig.baselines import BaselineEntry, Run
from pytest_mig.measure import Metric
from pytest_mig.noise import PRIOR, PRIOR_RUNS, band
from pytest_mig.report import write_report
from pytest_mig.results import ResultRecord
from pytest_mig.verdict import compare

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
    return [ResultRecord(test, Metric("rate", 100.0, "items/s"), dict(TARGET), {}, node="=HYPERLINK(\"x\")")]


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
    rec = ResultRecord("t", Metric("rate", 1.5e308, "items/s"), dict(TARGET), {})
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
    rec = ResultRecord("t", Metric("rate", 707.1, "items/s"), dict(TARGET), {})
    assert compare(rec, _entry(five)).outcome == "regressed"  # the false alarm of the issue
    v = compare(rec, _entry(five), prior=0.007)
    assert v.outcome == "pass" and "the reference's, across nights and boards" in v.message


def test_the_judge_takes_the_prior_from_the_shipped_reference() -> None:
    from pytest_mig.reference import ReferenceStore
    from pytest_mig.verdict import reference_prior

    refs = ReferenceStore()
    ref = refs.load("nvidia-h100-80gb-hbm3", "full")
    assert ref is not None
    entry = next(e for e in ref.baseline.entries.values() if ref.band_for(e).sigma)
    target = {"kind": "full", "profile": "full", "baseline_profile": "full", "gpu_name": "NVIDIA H100 80GB HBM3",
              "gpu_slug": "nvidia-h100-80gb-hbm3"}
    rec = ResultRecord(entry.test, Metric(entry.metric, entry.value, entry.unit, entry.direction, kind=entry.kind),
                       target, {}, mode=entry.mode)
    assert reference_prior(refs, rec) == pytest.approx(ref.band_for(entry).sigma)
    assert reference_prior(None, rec) is None
