"""``pytest-mig replay``: recorded nights judged night by night, priors leave-one-out."""

from __future__ import annotations

import io
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_mig import cli
from pytest_mig.measure import BEST, Metric, best_rate
from pytest_mig.night.calibrate import NIGHTS, threshold_rows
from pytest_mig.night.replay import LeaveOneOut, as_reported_now, copied_at_once, nights_of, replaced_headlines, replay
from pytest_mig.judge.thermal import significant
from pytest_mig.store.baselines import entry_from_records
from pytest_mig.store.history import Baseline, BaselineMeta
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord, read_results, write_results
from pytest_mig.store.verdicts import Verdict

FMA = "benchmarks/test_cuda_cores.py::test_cuda_core_fma[fp32]"


def night(value: float, board: str, day: int, *, health: dict | None = None) -> ResultRecord:
    target = {"kind": "full", "profile": "full", "baseline_profile": "full", "gpu_name": "NVIDIA A100-SXM4-80GB",
              "gpu_slug": "nvidia-a100-sxm4-80gb", "emulated": False, "uuid": board}
    metric = Metric("fp32_fma_tflops", value, "TFLOPS", "higher", [value] * 3, "compute")
    return ResultRecord(FMA, metric, TargetInfo.from_dict(target), {"driver": "580.159.04"}, f"2026-01-{day:02d}T00:00:00+00:00", "n1",
                        health=health)


def series(tmp_path: Path, boards: int = 4, nights: int = 5, slow: dict[tuple[int, int], float] | None = None) -> Path:
    rng = random.Random(7)
    for b in range(boards):
        folder = tmp_path / "runs" / f"board{b}"
        folder.mkdir(parents=True)
        for n in range(nights):
            value = 19.0 * (1 + rng.gauss(0, 0.003)) * (slow or {}).get((b, n), 1.0)
            write_results(folder / f"night{n}.json", [night(value, f"GPU-{b}", n + 1)])
    return tmp_path / "runs"


def test_unchanged_nights_raise_no_alarm_and_a_5_percent_loss_is_caught_from_the_second_night(tmp_path: Path) -> None:
    nights = nights_of(sorted(series(tmp_path).rglob("*.json")), open("/dev/null", "w"))
    lengths = replay(nights, LeaveOneOut(nights))
    assert lengths[1].nights == 4 and lengths[1].alarmed == 0
    assert lengths[1].gating == 4 and lengths[1].caught == 4  # 5 x 0.3% x 1.41 = 2.1%: a 5% loss is beyond it
    assert sum(row.alarmed for row in lengths.values()) == 0


def test_a_real_slowdown_in_a_series_is_counted_as_an_alarm_and_named(tmp_path: Path, capsys) -> None:
    root = series(tmp_path, slow={(2, 3): 0.9})
    assert cli.main(["replay", str(root)]) == 0
    out = capsys.readouterr().out
    assert "False alarms: 1 night(s) of 16 (1 of them unconfirmed" in out and "GPU-2 2026-01-04" in out
    assert "fp32_fma_tflops -9.8% (threshold 2.0%), unconfirmed" in out  # the night recorded no re-measurement


def test_an_alarm_the_night_re_measured_is_counted_as_confirmed(tmp_path: Path, capsys) -> None:
    root = series(tmp_path, slow={(2, 3): 0.9})
    path = root / "board2" / "night3.json"
    (slow,) = read_results(path)
    slow.verdict = Verdict("regressed", slow.metric.name, slow.metric.value, None, None, None,
                           confirmations=[17.1, 17.2])
    write_results(path, [slow])
    assert cli.main(["replay", str(root)]) == 0
    out = capsys.readouterr().out
    assert "False alarms: 1 night(s) of 16." in out and "-9.8% (threshold 2.0%)\n" in out


def test_a_prior_counts_only_the_runs_at_the_size_the_night_was_measured_at(tmp_path: Path) -> None:
    """GEMM at two squares 8% apart: the other boards' runs at another size are another workload."""
    for b in range(4):
        folder = tmp_path / "runs" / f"board{b}"
        folder.mkdir(parents=True)
        for n in range(6):
            size = 16384 if n % 2 else 20480
            r = night(19.0 * (1.0 if size == 16384 else 0.92) * (1 + 0.001 * (n % 2)), f"GPU-{b}", n + 1)
            write_results(folder / f"night{n}.json", [replace(r, metric=replace(r.metric, info={"size": size}))])
    nights = nights_of(sorted((tmp_path / "runs").rglob("*.json")), open("/dev/null", "w"))
    priors = LeaveOneOut(nights)
    priors.board = "GPU-0"
    at_size = [r for n in nights for r in n.records if r.metric.info.get("size") == 16384][0]
    assert priors.for_record(at_size).sigma < 0.002  # type: ignore[union-attr]  # the 8% step is left out


def test_the_prior_never_comes_from_the_judged_board(tmp_path: Path) -> None:
    nights = nights_of(sorted(series(tmp_path, boards=2).rglob("*.json")), open("/dev/null", "w"))
    priors = LeaveOneOut(nights)
    rec = nights[0].records[0]
    priors.board = "GPU-0"
    from_one = priors.for_record(rec)
    priors.board = None
    assert from_one is not None and from_one.sigma != priors.for_record(rec).sigma  # type: ignore[union-attr]
    priors.board = "GPU-0"
    nights_one = [n for n in nights if n.series[1] == "GPU-1"][:2]  # 1 dof left: too little for a prior
    assert LeaveOneOut(nights_one).for_record(rec) is None


def test_a_gpu_model_whose_other_boards_hold_too_little_borrows_another_models_prior(tmp_path: Path) -> None:
    """The judged H200's other board holds 1 degree of freedom: the prior is the A100's, as the plugin
    borrows it; with no model that holds enough, none."""
    def h200(r: ResultRecord) -> ResultRecord:
        t = TargetInfo.from_dict({**r.target.to_dict(), "gpu_name": "NVIDIA H200", "gpu_slug": "nvidia-h200"})
        return replace(r, target=t)

    runs = [h200(night(19.0, "GPU-0", 1)), h200(night(19.0, "GPU-0", 2)),
            h200(night(19.0, "GPU-1", 1)), h200(night(19.02, "GPU-1", 2)),
            *[night(19.0 * (1 + 0.003 * (n % 3 - 1)), "GPU-2", n + 1) for n in range(5)]]
    for i, r in enumerate(runs):
        write_results(tmp_path / f"{r.target.uuid}-{i}.json", [r])
    nights = nights_of(sorted(tmp_path.glob("*.json")), open("/dev/null", "w"))
    priors = LeaveOneOut(nights)
    priors.board = "GPU-0"
    assert priors._on(runs[0], "NVIDIA H200")[0] is None  # its model's other board: 1 dof, too little
    borrowed = priors.for_record(runs[0])
    assert borrowed is not None and "of other GPU models" in borrowed.source
    assert borrowed.sigma == pytest.approx(0.003, rel=0.2)  # the A100's night-to-night noise
    assert LeaveOneOut([n for n in nights if n.model == "NVIDIA H200"]).for_record(runs[0]) is None
    noisy = replace(runs[3], metric=replace(runs[3].metric, value=19.8))  # GPU-1's two nights 4% apart
    write_results(tmp_path / "GPU-1-3.json", [noisy])
    priors = LeaveOneOut(nights_of(sorted(tmp_path.glob("*.json")), open("/dev/null", "w")))
    priors.board = "GPU-0"
    kept = priors.for_record(runs[0])
    assert kept is not None and kept.sigma > 0.02  # never below the few runs' own spread


def test_priors_within_boards_leave_out_the_spread_between_boards(tmp_path: Path, capsys) -> None:
    """Two other boards 4% apart, each steady: across boards their spread is the prior; within boards
    only each board's own night-to-night noise is (``--priors within-boards``)."""
    for b, level in enumerate((19.0, 19.0, 19.76)):
        folder = tmp_path / "runs" / f"board{b}"
        folder.mkdir(parents=True)
        for n in range(3):
            write_results(folder / f"night{n}.json", [night(level * (1 + 0.001 * (n - 1)), f"GPU-{b}", n + 1)])
    nights = nights_of(sorted((tmp_path / "runs").rglob("*.json")), open("/dev/null", "w"))
    rec = nights[0].records[0]
    across, within = LeaveOneOut(nights, within_boards=False), LeaveOneOut(nights)
    across.board = within.board = "GPU-0"
    assert across.for_record(rec).sigma > 0.015  # type: ignore[union-attr]  # the 4% step between boards
    assert within.for_record(rec).sigma == pytest.approx(0.001, rel=0.05)  # type: ignore[union-attr]
    assert cli.main(["replay", str(tmp_path / "runs")]) == 0  # within boards, as the plugin judges one board
    assert "False alarms: 0 night(s)" in capsys.readouterr().out
    assert "on one board (leave-one-out)" in within.for_record(rec).source  # type: ignore[union-attr]


def test_a_profile_no_other_board_ran_twice_is_judged_with_its_spread_across_them(tmp_path: Path) -> None:
    """Other boards quiet night to night on the whole GPU, and each once on an emulated profile, 3%
    apart: a night of that profile is judged with that spread, as the plugin reads an emulated
    profile's reference; once another board ran it twice, with the pooled noise on one board."""
    def emulated(r: ResultRecord) -> ResultRecord:
        t = TargetInfo.from_dict({**r.target.to_dict(), "kind": "emulated", "profile": "2g.20gb",
                                  "baseline_profile": "2g.20gb-emulated", "emulated": True})
        return replace(r, target=t)

    runs = [night(19.0 * (1 + 0.001 * (n % 3 - 1)), f"GPU-{b}", n + 1) for b in (1, 2, 3) for n in range(3)]
    runs += [emulated(night(level, f"GPU-{b}", 9)) for b, level in ((1, 9.0), (2, 9.27), (3, 9.135))]
    for i, r in enumerate(runs):
        write_results(tmp_path / f"{i}.json", [r])
    mine = emulated(night(9.1, "GPU-0", 9))
    priors = LeaveOneOut(nights_of(sorted(tmp_path.glob("*.json")), open("/dev/null", "w")))
    priors.board = "GPU-0"
    whole = priors.for_record(night(19.0, "GPU-0", 9))
    assert whole is not None and whole.sigma == pytest.approx(0.001, rel=0.1)
    spread = priors.for_record(mine)
    assert spread is not None and spread.sigma > 0.01  # the 3% between boards, not the whole GPU's 0.1%
    key = (mine.test, mine.metric.name, mine.mode)
    assert priors._spread("NVIDIA A100-SXM4-80GB", key, None, "2g.20gb") is None  # a real slice: not floored
    h200 = replace(mine, target=TargetInfo.from_dict({**mine.target.to_dict(), "gpu_name": "NVIDIA H200",
                                                      "gpu_slug": "nvidia-h200"}))
    borrowed = priors.for_record(h200)  # no H200 board: the A100's noise, not its profile's spread
    assert borrowed is not None and borrowed.sigma < 0.002
    write_results(tmp_path / "again.json", [emulated(night(9.001, "GPU-1", 10))])  # GPU-1 ran it twice
    priors = LeaveOneOut(nights_of(sorted(tmp_path.glob("*.json")), open("/dev/null", "w")))
    priors.board = "GPU-0"
    pooled = priors.for_record(mine)
    assert pooled is not None and pooled.sigma < 0.002


def _gemm(name: str, value: float, kind: str, info: dict, mode: str = "normal") -> ResultRecord:
    r = night(value, "GPU-0", 1)
    test = "benchmarks/test_gemm.py::test_gemm[bf16]"
    return replace(r, test=test, mode=mode, metric=Metric(name, value, "TFLOPS", "higher", [value], kind, info))


def test_a_gemm_headline_timed_shorter_than_the_suite_times_it_now_is_left_out_with_its_su(
        tmp_path: Path, capsys) -> None:
    """An 8192 square at 700 TFLOPS takes 1.57 ms a call, 7 calls a round: 20 rounds span 0.22 s of
    GPU time, under half the 2 s the suite times now, so that headline and its SU are a replaced
    measurement; the sustained rate and the energy figure of the same run stay, and so do a headline
    of 170 rounds (1.87 s, its first calls' estimate a little long), in quick mode one of 50 rounds
    (0.55 s) but not one of 5, and a headline whose info does not say its rounds."""
    short = _gemm("bf16_tflops", 700.0, "tensor", {"dtype": "bf16", "size": 8192, "repeats": 20})
    su = _gemm("su_per_1M_TFLOPs", 0.01, "cost", {"rate_per_s": 700.0})
    sustained = _gemm("bf16_sustained_tflops", 690.0, "tensor", {"size": 8192})
    energy = _gemm("bf16_energy_j_per_tflop", 0.9, "energy", {"size": 8192})
    run = [short, su, sustained, energy]
    assert replaced_headlines(run) == {id(short), id(su)}
    long = replace(short, metric=replace(short.metric, info={**short.metric.info, "repeats": 170}))
    assert replaced_headlines([long, su, sustained, energy]) == set()
    quick = [_gemm("bf16_tflops", 700.0, "tensor", {"dtype": "bf16", "size": 8192, "repeats": n}, "quick")
             for n in (50, 5)]
    assert replaced_headlines(quick) == {id(quick[1])}
    counted = [replace(short, metric=replace(short.metric, info={**short.metric.info, "calls": n})) for n in (140, 1300)]
    assert replaced_headlines(counted) == {id(counted[0])}  # the calls it kept: 0.22 s, 2.04 s
    unsaid = replace(short, metric=replace(short.metric, info={"dtype": "bf16", "size": 8192}))
    assert replaced_headlines([unsaid, su]) == set()
    write_results(tmp_path / "night.json", run)
    kept = [r.metric.name for n in nights_of([tmp_path / "night.json"], open("/dev/null", "w")) for r in n.records]
    assert sorted(kept) == ["bf16_energy_j_per_tflop", "bf16_sustained_tflops"]
    said = io.StringIO()
    nights_of([tmp_path / "night.json"], said)
    assert said.getvalue().startswith("left out 2 GEMM headline record(s), with their SU, timed over less than")


def test_nights_that_shared_the_gpu_or_were_slowed_on_purpose_are_left_out(tmp_path: Path) -> None:
    busy = night(10.0, "GPU-9", 1, health={"after": {"others": [1343]}})
    write_results(tmp_path / "busy.json", [busy])
    assert nights_of([tmp_path / "busy.json"], open("/dev/null", "w")) == []
    assert cli.main(["replay", str(tmp_path / "busy.json")]) == 1


HOST = "benchmarks/test_host_bandwidth.py::test_host_bandwidth"


def copy_night(board: str, at: str, samples: list[float], info: dict | None = None) -> ResultRecord:
    """A host copy's record as the suite wrote it before its figure was the best copy: the median."""
    rec = night(0.0, board, 1)
    metric = Metric("h2d_gbs", sorted(samples)[len(samples) // 2], "GB/s", "higher", samples, "memory",
                    info={"pinned": True, **(info or {})})
    return replace(rec, test=HOST, metric=metric, timestamp=at)


def test_host_copies_are_judged_by_their_best_copy() -> None:
    rec = copy_night("GPU-1", "2026-01-01T00:00:10+00:00", [50.0, 55.2, 54.9, 40.0, 55.0])
    now = as_reported_now(rec)
    assert now.metric.value == 55.2 and now.metric.info["statistic"] == BEST and rec.metric.value == 54.9
    assert as_reported_now(now) == now  # already the best: left as it is
    other = night(19.0, "GPU-1", 1)
    assert as_reported_now(other) is other  # not a host copy
    assert best_rate([3.0, float("inf"), 0.0, -1.0, float("nan"), 2.0]) == 3.0 and math.isnan(best_rate([0.0]))


@pytest.mark.parametrize(("info", "apart_s", "same_board", "left_out"), [
    ({}, 2, False, True),  # two boards of one node copying at once, before the turn existed
    ({}, 10, False, False),  # one after the other (the tests take 4 s)
    ({}, 2, True, False),  # one board's own records
    ({"host_turn": "held"}, 2, False, False),  # taken in turn: the other's record is the earlier one's
    ({"neighbours_pcie_gbs": 0.1, "neighbour_readings": 9}, 2, False, False),  # the others watched
])
def test_host_copies_made_at_once_on_one_node_without_a_turn_are_left_out(
        tmp_path: Path, info: dict, apart_s: int, same_board: bool, left_out: bool) -> None:
    a = copy_night("GPU-1", "2026-01-01T00:00:10+00:00", [55.0] * 3, info)
    b = copy_night("GPU-1" if same_board else "GPU-2", f"2026-01-01T00:00:{10 + apart_s:02d}+00:00", [55.0] * 3, info)
    files = []
    for name, rec in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        write_results(tmp_path / name / "night.json", [rec], meta={"durations": {HOST: 4.0}})
        files.append(tmp_path / name / "night.json")
    nights = nights_of(files, open("/dev/null", "w"))
    assert len(nights) == (0 if left_out else 2)
    assert copied_at_once([(Path("x"), [a, b], {HOST: 4.0})]) == ({id(a), id(b)} if left_out else set())


def test_a_copy_whose_file_gives_no_seconds_for_it_is_still_placed_in_time() -> None:
    """A sweep keeps its seconds under the test id with the profile; a file may keep none (then
    UNKNOWN_SPAN_S); a time with no zone is UTC, and a duration no test takes is unknown."""
    a = copy_night("GPU-1", "2026-01-01T00:00:10+00:00", [55.0] * 3)
    b = copy_night("GPU-2", "2026-01-01T00:00:30", [55.0] * 3)  # no zone: UTC, 20 s after a
    sweep = {f"{HOST}[{a.target.profile}]": 25.0}
    assert copied_at_once([(Path("x"), [a, b], sweep)]) == {id(a), id(b)}
    assert copied_at_once([(Path("x"), [a, b], {})]) == set()  # 20 s apart, 10 s either side of each
    b5 = replace(b, timestamp="2026-01-01T00:00:15+00:00")
    assert copied_at_once([(Path("x"), [a, b5], {})]) == {id(a), id(b5)}
    assert copied_at_once([(Path("x"), [a, b], {HOST: 1e300})]) == set()  # not a test's seconds: unknown
    theirs = replace(a, metric=replace(a.metric, name="loader_gbs"))  # a site's own figure, pinned too
    assert copied_at_once([(Path("x"), [theirs, b5], {})]) == set() and as_reported_now(theirs) is theirs


def test_a_host_copys_recorded_re_measurements_are_not_kept_beside_its_best() -> None:
    """They were medians: an alarm on the best copy counts as unconfirmed, never confirmed by them."""
    rec = copy_night("GPU-1", "2026-01-01T00:00:10+00:00", [50.0, 55.2, 54.9])
    rec = replace(rec, verdict=Verdict("regressed", "h2d_gbs", 54.9, None, None, None, confirmations=[48.9, 54.5]))
    assert as_reported_now(rec).verdict.confirmations == []


def test_a_replaced_workloads_figures_are_left_out_by_their_test_id(tmp_path: Path, capsys) -> None:
    root = series(tmp_path, slow={(2, 3): 0.9})
    assert cli.main(["replay", str(root), "--exclude-test", "fma[fp32]"]) == 1  # nothing left to judge
    assert "no unchanged GPU nights" in capsys.readouterr().out
    assert cli.main(["replay", str(root), "--exclude-test", "fma[fp64]"]) == 0  # another test: all judged
    assert "False alarms: 1 night(s) of 16" in capsys.readouterr().out


def test_replay_names_a_missing_path_in_one_sentence(tmp_path: Path, capsys) -> None:
    assert cli.main(["replay", str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_calibrate_shows_each_figures_threshold_on_nights_1_2_5_and_10() -> None:
    recs = [night(19.0 * (1 + 0.001 * (i % 3 - 1)), "GPU-0", i + 1) for i in range(10)]
    meta = BaselineMeta(gpu_model="NVIDIA H100 80GB HBM3", gpu_slug="nvidia-h100-80gb-hbm3", profile="full", emulated=False)
    base = Baseline(meta=meta, entries={(FMA, "fp32_fma_tflops", "normal"): entry_from_records(recs)})
    from pytest_mig.judge.reference import SHIPPED, ReferenceStore

    (row,) = threshold_rows(base, references=ReferenceStore(SHIPPED))
    cells = row["nights"]
    assert list(cells) == list(NIGHTS)  # type: ignore[arg-type]
    assert cells[1] == "±10.0%"  # the first night: against the reference, another board's band
    shrinking = [float(cells[n].strip("±%~")) for n in NIGHTS[1:]]  # type: ignore[index]
    assert shrinking == sorted(shrinking, reverse=True) and shrinking[0] < 5
    assert not any(str(c).startswith("~") for c in cells.values())  # type: ignore[union-attr]


@pytest.mark.parametrize("runs", [3])
def test_calibrate_marks_a_night_its_runs_cannot_show_yet(runs: int) -> None:
    recs = [night(19.0, "GPU-0", i + 1) for i in range(runs)]
    meta = BaselineMeta(gpu_model="NVIDIA H100 80GB HBM3", gpu_slug="nvidia-h100-80gb-hbm3", profile="full", emulated=False)
    base = Baseline(meta=meta, entries={(FMA, "fp32_fma_tflops", "normal"): entry_from_records(recs)})
    (row,) = threshold_rows(base)
    assert str(row["nights"][5]).startswith("~") and str(row["nights"][10]).startswith("~")  # type: ignore[index]


def test_calibrate_show_prints_the_saved_histories_thresholds_running_nothing(tmp_path: Path, capsys) -> None:
    from pytest_mig.store.baselines import BaselineStore

    BaselineStore(tmp_path / "bl").save([night(19.0 + 0.01 * i, "GPU-0", i + 1) for i in range(3)])
    assert cli.main(["calibrate", "--show", "--mig-baseline-dir", str(tmp_path / "bl")]) == 0
    out = capsys.readouterr().out
    assert "night 1" in out and "night 10" in out and "fp32_fma_tflops" in out and "calibrate: run" not in out
    (tmp_path / "empty").mkdir()
    assert cli.main(["calibrate", "--show", "--mig-baseline-dir", str(tmp_path / "empty")]) == 1
    assert "holds no history yet" in capsys.readouterr().out
    assert cli.main(["calibrate", "--show", "--mig-baseline-dir", str(tmp_path / "nope")]) == 2
    assert cli.main(["calibrate", "--show", "--", "benchmarks"]) == 2
    assert "--show runs nothing" in capsys.readouterr().err


def test_a_night_copied_in_part_into_another_folder_is_counted_once(tmp_path: Path) -> None:
    first = night(19.0, "GPU-7", 3)
    later = replace(first, test=FMA.replace("fp32", "fp64"), timestamp="2026-01-03T00:05:00+00:00")
    (tmp_path / "raw").mkdir()
    (tmp_path / "less-one-test").mkdir()
    write_results(tmp_path / "raw" / "night3.json", [first, later])
    write_results(tmp_path / "less-one-test" / "night3.json", [first])  # a copy with a test left out
    with open("/dev/null", "w") as out:
        found = nights_of(sorted(tmp_path.rglob("*.json")), out)
    assert len(found) == 1 and len(found[0].records) == 2  # the first copy read, whole


def test_the_leakage_slope_comes_from_the_other_boards_only(tmp_path: Path) -> None:
    def energy(value: float, temperature: float, board: str, day: int) -> ResultRecord:
        r = night(value, board, day)
        return replace(r, metric=Metric("fp32_fma_energy_j_per_tflop", value, "J/TFLOP", "lower", [], "energy",
                                        {"temperature_c": temperature}))
    for b, per_degree in (("GPU-0", 0.005), ("GPU-1", 0.0)):  # only GPU-0's energy follows its temperature
        folder = tmp_path / "runs" / b
        folder.mkdir(parents=True)
        for n in range(8):
            t = 40.0 + 2 * n
            write_results(folder / f"night{n}.json", [energy(5.0 * math.exp(per_degree * t), t, b, n + 1)])
    nights = nights_of(sorted((tmp_path / "runs").rglob("*.json")), open("/dev/null", "w"))
    priors = LeaveOneOut(nights)
    rec = nights[0].records[0]
    priors.board = "GPU-1"  # judging GPU-1: GPU-0's slope
    assert priors.slope_for(rec) is not None and priors.slope_for(rec).per_degree == pytest.approx(0.005)  # type: ignore[union-attr]
    priors.board = "GPU-0"  # judging GPU-0: GPU-1 shows no slope, and its own is never used
    assert not significant(priors.slope_for(rec))
    assert priors.slope_for(replace(rec, metric=replace(rec.metric, name="fp32_fma_tflops", kind="compute"))) is None
