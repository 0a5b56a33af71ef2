"""pytest-mig samples: the run-to-run CV of each figure as if only its first k samples had been measured."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from pytest_mig import cli
from pytest_mig.measure import Metric
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord, write_results
from pytest_mig.report.samples import KEEPS, analyse, lines, windows_for

TARGET = {"kind": "full", "profile": "full", "baseline_profile": "full", "gpu_slug": "nvidia-h100-80gb-hbm3",
          "uuid": "GPU-1"}


def _record(test: str, name: str, samples: list[float], run: int, **target: str) -> ResultRecord:
    return ResultRecord(test, Metric(name, statistics.median(samples), "x/s", "higher", samples),
                        TargetInfo.from_dict({**TARGET, **target}), {}, f"2026-11-{run + 1:02d}T00:00:00+00:00")


def _runs(rng: random.Random, *, between: float, within: float, n: int = 16, runs: int = 12) -> list[list[float]]:
    """Runs whose figure moves by ``between`` from run to run, each sample by ``within`` about it."""
    out = []
    for _ in range(runs):
        level = 100.0 * (1 + rng.gauss(0, between))
        out.append([level * (1 + rng.gauss(0, within)) for _ in range(n)])
    return out


def test_a_figure_whose_noise_is_the_run_s_own_keeps_every_sample_and_one_that_is_the_night_s_needs_few() -> None:
    rng = random.Random(7)
    records = []
    for gpu in ("GPU-1", "GPU-2", "GPU-3", "GPU-4"):  # four groups pooled, as four boards would be
        for i, s in enumerate(_runs(rng, between=0.0, within=0.02)):  # all of it sampling noise
            records.append(_record("bench.py::test_md[water]", "ns_per_day", s, i, uuid=gpu, gpu_slug=gpu))
        for i, s in enumerate(_runs(rng, between=0.02, within=0.0005)):  # all of it the night's
            records.append(_record("bench.py::test_stream[fp32]", "copy_gbs", s, i, uuid=gpu, gpu_slug=gpu))
    md, stream = analyse(records)
    assert (md.test, md.samples, len(md.groups), md.runs, md.windows) == ("test_md", 16, 4, 48, [4, 8, 12, 16])
    assert md.cv(4) > 1.5 * md.cv(16) and md.fewest == 16  # a median of 4 is twice as noisy: no shorter window
    assert stream.test == "test_stream" and stream.fewest == 4  # the run's own noise is nothing beside the night's
    assert all(stream.bound(k) <= KEEPS for k in (4, 8, 12)) and md.bound(12) > KEEPS
    table = lines([md, stream])
    assert table[1].split()[:7] == ["normal", "test_md", "ns_per_day", "16", "4", "48", f"{100 * md.cv(16):.2f}%"]
    assert table[1].endswith(" 16") and table[2].endswith(" 4")


def test_figures_that_are_not_the_median_of_their_samples_or_have_too_few_runs_are_left_out() -> None:
    rng = random.Random(3)
    runs = _runs(rng, between=0.01, within=0.01)
    records = [_record("b.py::test_a", "rate", s, i) for i, s in enumerate(runs)]
    for r in records[:]:  # the same runs read again from a copy of the file count once
        records.append(_record("b.py::test_a", "rate", r.metric.samples, int(r.timestamp[8:10]) - 1))
    mean = [ResultRecord("b.py::test_b", Metric("rate", statistics.fmean(s), "x/s", "higher", s), TargetInfo.from_dict(TARGET), {},
                         f"2026-11-{i + 1:02d}T00:00:00+00:00") for i, s in enumerate(runs)]
    two = [_record("b.py::test_c", "rate", s, i) for i, s in enumerate(runs[:2])]
    info = [ResultRecord("b.py::test_d", Metric("size", statistics.median(s), "n", "higher", s, compare=False),
                    TargetInfo.from_dict(TARGET),
                         {}, f"2026-11-{i + 1:02d}T00:00:00+00:00") for i, s in enumerate(runs)]
    few = [_record("b.py::test_e", "rate", s[:5], i) for i, s in enumerate(runs)]
    (row,) = analyse(records + mean + two + info + few)
    assert (row.test, row.runs) == ("test_a", 12)


def test_the_windows_tried_never_go_below_three_samples() -> None:
    assert windows_for(16) == [4, 8, 12, 16]
    assert windows_for(6) == [3, 4, 6]
    assert windows_for(50) == [12, 25, 38, 50]


def test_the_command_prints_the_table_or_says_why_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(5)
    for i, s in enumerate(_runs(rng, between=0.01, within=0.01, runs=4)):
        write_results(tmp_path / f"r{i}.json", [_record("b.py::test_a[x]", "rate", s, i)])
    assert cli.main(["samples", *map(str, sorted(tmp_path.glob("r*.json")))]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("mode") and "test_a" in out.splitlines()[1]
    assert cli.main(["samples", str(tmp_path / "r0.json")]) == 2
    assert capsys.readouterr().err.startswith("pytest-mig: error: no figure that is the median of its samples, and no "
                                              "energy figure, has 3 runs or more")
    (tmp_path / "bad.json").write_text("{")
    assert cli.main(["samples", str(tmp_path / "bad.json")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def _energy(test: str, whole: float, half: float | None, run: int, window_s: float = 1.5) -> ResultRecord:
    info = {"window_s": window_s, **({"first_half": {"window_s": window_s / 2, "calls": 10, "value": half}}
                                     if half is not None else {})}
    return ResultRecord(test, Metric("energy_j_per_x", whole, "J/x", "lower", [], kind="energy", info=info),
                        TargetInfo.from_dict(TARGET), {}, f"2026-11-{run + 1:02d}T00:00:00+00:00")


def test_an_energy_windows_first_half_is_judged_against_the_whole_window() -> None:
    rng = random.Random(11)
    records = []
    for i in range(12):
        level = 1.0 + rng.gauss(0, 0.02)  # the night moves both halves alike: a half window keeps the threshold
        records.append(_energy("b.py::test_steady[a]", level, level * (1 + rng.gauss(0, 0.001)), i))
        whole = 1.0 + rng.gauss(0, 0.005)  # the first half alone is four times as noisy: it does not
        records.append(_energy("b.py::test_short[a]", whole, whole * (1 + rng.gauss(0, 0.02)), i, window_s=0.75))
        records.append(_energy("b.py::test_old[a]", 1.0, None, i))  # recorded before first halves were kept
    from pytest_mig.report.samples import energy_windows, window_lines

    short, steady = energy_windows(records)
    assert (steady.test, steady.runs, steady.window_s) == ("test_steady", 12, 1.5) and steady.fewest == 1
    assert short.window_s == 0.75 and short.cv(1) > 2 * short.cv(2) and short.fewest == 2
    table = window_lines([short, steady])
    assert table[1].split()[1:4] == ["test_short", "energy_j_per_x", "0.75s"] and table[1].endswith(" no")
    assert table[2].endswith(" yes")
    assert energy_windows(records[:6]) == []  # two runs of each: too few to count


def test_the_command_prints_the_energy_windows_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(4):
        write_results(tmp_path / f"e{i}.json", [_energy("b.py::test_e[x]", 1.0 + i / 100, 1.0 + i / 90, i)])
    assert cli.main(["samples", *map(str, sorted(tmp_path.glob("e*.json")))]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "energy windows: the first half of each window against the whole"  # no samples table above it
    assert any(line.split()[1:3] == ["test_e", "energy_j_per_x"] for line in out)
