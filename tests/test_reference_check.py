"""pytest-mig reference-check: each run of a reference folder judged against the others, unchanged
(a failure is a false alarm) and after a loss (a pass is a miss)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_reference import BOARD
from test_verdict import TEST, record

from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.reader import load_baseline_file
from pytest_mig.cli import main
from pytest_mig.judge.reference import SHIPPED, build
from pytest_mig.judge.reference_check import check_folder, leave_one_out, pooled, summary
from pytest_mig.store.results import write_results

#: How each figure of these tests is recorded: unit, direction, kind.
FIGURES = {"step_time_s": ("s", "lower", "training"), "tokens_per_s": ("tokens/s", "higher", "training"),
           "energy_j_per_token": ("J/token", "lower", "energy")}


def folder(tmp_path: Path, runs: dict[str, dict[str, list[float]]]) -> Path:
    """A reference folder: profile -> figure -> its runs' values (TFLOPS, higher is better, unless
    :data:`FIGURES` says otherwise), a results file per run."""
    files = []
    for profile, figures in runs.items():
        for i in range(len(next(iter(figures.values())))):
            path = tmp_path / f"{profile}-{i}.json"
            recs = []
            for metric, values in figures.items():
                unit, direction, kind = FIGURES.get(metric, ("TFLOPS", "higher", "tensor"))
                recs.append(record(values[i], name=metric, unit=unit, direction=direction, kind=kind,
                                   profile=profile, fingerprint=dict(BOARD)))
            write_results(path, recs)
            files.append(path)
    out = tmp_path / "ref"
    build(files, out)
    return out


def test_runs_that_agree_raise_no_false_alarm_and_a_15_percent_loss_fails_every_one(tmp_path: Path) -> None:
    out = folder(tmp_path, {"3g.71gb": {"fp16_tflops": [100.0, 100.4, 99.7]},
                            "7g.141gb": {"fp16_tflops": [230.0, 229.1, 230.8]}})
    (t,) = check_folder(out)
    assert (t.model, t.mode, t.cases, t.judged, t.false_alarms, t.caught) == ("NVIDIA H200", "normal", 6, 6, [], 6)
    (soft,) = check_folder(out, loss=0.05)  # inside the reference's 10% band: a first night cannot see it
    assert soft.caught == 0 and soft.missed == 6


def test_a_run_beyond_the_band_from_the_others_is_a_false_alarm_named(tmp_path: Path) -> None:
    quiet = {"fp16_tflops": [100.0, 100.2, 99.9, 100.1]}
    out = folder(tmp_path, {"3g.71gb": {"fp16_tflops": [100.0, 100.3, 99.8, 86.0]}, "7g.141gb": quiet,
                            "4g.71gb": quiet, "2g.35gb": quiet, "1g.18gb": quiet})
    (t,) = check_folder(out)
    assert len(t.false_alarms) == 1
    assert t.false_alarms[0].startswith(f"3g.71gb {TEST} fp16_tflops ") and "+14.0% worse" in t.false_alarms[0]


def test_a_figure_too_noisy_to_judge_counts_neither_as_alarm_nor_as_miss(tmp_path: Path) -> None:
    out = folder(tmp_path, {"3g.71gb": {"small_batch_tflops": [100.0, 80.0, 120.0]}})
    (t,) = check_folder(out)
    assert t.cases == 3 and t.judged == 0 and not t.false_alarms and t.caught == 0


def test_a_time_is_made_worse_by_dividing_it_by_what_is_left(tmp_path: Path) -> None:
    """Lower is better: a 15% loss of speed makes a step take 1/0.85 as long (+17.6%), past the 10% band."""
    out = folder(tmp_path, {"3g.71gb": {"step_time_s": [1.0, 1.004, 0.998]}})
    (t,) = check_folder(out)
    assert t.judged == 3 and t.caught == 3
    (just,) = check_folder(out, loss=0.085)  # x1.093: inside the 10% band
    assert just.caught == 0


def test_an_energy_figure_held_out_takes_its_rate_partner_s_sigma_without_the_same_run(tmp_path: Path) -> None:
    """J/token shares tokens/s's timing (docs/verdicts.md, "The rule"): with tokens/s noisy, it is not judged,
    however well its own runs agree."""
    runs = {"tokens_per_s": [100.0, 80.0, 120.0], "energy_j_per_token": [1.0, 1.002, 0.999]}
    out = folder(tmp_path, {"3g.71gb": runs})
    bases = [load_baseline_file(p) for p in BaselineStore(out).files()]
    (t,) = leave_one_out(bases)
    assert t.cases == 6 and t.judged == 0
    (alone,) = leave_one_out(bases, rule=lambda groups: [0.001] * len(groups))  # a rule that calls both quiet
    assert alone.judged == 6


def test_the_build_s_rule_pools_every_profile() -> None:
    sigma = math.sqrt(4 * 0.01 ** 2 / 2)  # four runs 1% off their profiles' medians, two degrees of freedom
    assert pooled([[99.0, 101.0], [10.0], [9.9, 10.1]]) == [pytest.approx(sigma)] * 3


def test_the_shipped_references_raise_at_most_one_false_alarm_on_their_own_runs() -> None:
    """The claim docs/nightly.md makes of the shipped references: each run of theirs judged against the
    others raises at most one false alarm per GPU model and mode (the one it names: a host copy of
    an emulated slice, whose host differs more than the boards do), and a 15% loss fails almost
    every judged figure."""
    tallies = check_folder(SHIPPED)
    assert {(t.model, t.mode) for t in tallies} >= {("NVIDIA H100 80GB HBM3", "normal"), ("NVIDIA H200", "quick")}
    for t in tallies:
        assert len(t.false_alarms) <= 1 and all("test_host_bandwidth" in a for a in t.false_alarms), t.false_alarms
        assert t.judged > 1000 and t.caught >= 0.98 * t.judged


def test_the_command_prints_the_table_and_exits_1_on_a_false_alarm(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    quiet = {"fp16_tflops": [100.0, 100.2, 99.9, 100.1]}
    good = folder(tmp_path / "a", {"3g.71gb": quiet, "7g.141gb": quiet})
    assert main(["reference-check", str(good), "--loss", "12%"]) == 0
    printed = capsys.readouterr().out
    assert "after a loss of 12%" in printed and "NVIDIA H200" in printed and "false alarm:" not in printed
    bad = folder(tmp_path / "b", {"3g.71gb": {"fp16_tflops": [100.0, 100.3, 99.8, 86.0]}, "7g.141gb": quiet,
                                  "4g.71gb": quiet, "2g.35gb": quiet, "1g.18gb": quiet})
    assert main(["reference-check", str(bad)]) == 1
    assert "false alarm: 3g.71gb" in capsys.readouterr().out
    assert summary(check_folder(bad)).startswith("checked (pytest-mig reference-check): each run judged against "
                                                 "the others, 1 false alarm(s) (pytest-mig reference-check names them)")


def test_the_command_says_in_one_sentence_what_is_wrong_with_its_folder(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reference-check", str(tmp_path / "none")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    single = folder(tmp_path, {"3g.71gb": {"fp16_tflops": [100.0]}})
    assert main(["reference-check", str(single)]) == 1
    assert "nothing to judge one run against" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["reference-check", "--loss", "150%"])
    assert exc.value.code == 2
