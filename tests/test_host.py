"""What the GPUs of one host share while copying: the host's turn, the others' traffic, and what a
figure measured while they copied becomes (judged incomparable, never saved, never replayed)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import fake_pynvml
import pytest
import topologies

from pytest_mig.device.host import (NEIGHBOUR_GBS, SHARED_HOST, HostLockError, Neighbours, check_host_lock, host_turn,
                                   measured_alone, shared_host)
from pytest_mig.common.text import shown
from pytest_mig.device.nvml import BoardReader
from pytest_mig.device.target import TargetInfo
from pytest_mig.judge.pipeline import Pipeline, RecordHistories, Remeasured
from pytest_mig.measure import Metric
from pytest_mig.night.replay import nights_of
from pytest_mig.session import _remeasure
from pytest_mig.store.baselines import BaselineStore, saveable
from pytest_mig.store.results import ResultRecord, write_results
from pytest_mig.store.verdicts import Verdict
from pytest_mig.workloads.hostcopy import mark_shared

HOST = "benchmarks/test_host_bandwidth.py::test_host_bandwidth"
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the turn is an abstract Unix socket (Linux)")

#: A process that holds the turn ``name`` until it is killed, and says so on its stdout.
HOLDER = """
import sys, time
from pytest_mig.device.host import host_turn
with host_turn("\\0" + sys.argv[1], wait_s=0) as turn:
    print("held" if turn.held else "refused", flush=True)
    time.sleep(60)
"""


#: A process that holds the turn ``name`` and the lock file ``path`` until it is killed.
LOCK_HOLDER = """
import sys, time
from pathlib import Path
from pytest_mig.device.host import host_turn
with host_turn("\\0" + sys.argv[1], wait_s=0, lock=Path(sys.argv[2])) as turn:
    print("held" if turn.held else "refused", flush=True)
    time.sleep(60)
"""


def _name() -> str:
    return f"\0pytest-mig-test/{uuid.uuid4().hex}"  # a turn of this test's own: never a real run's


def _holder(name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name.lstrip("\0")], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@LINUX
def test_a_process_waits_for_the_turn_another_holds_and_takes_it_when_that_one_is_killed() -> None:
    name = _name()
    holder = _holder(name)
    try:
        with host_turn(name, wait_s=0.3, poll_s=0.02) as turn:
            assert not turn.held and turn.waited_s >= 0.3
            assert "another process held the host's copies for over 0.3 s" in turn.note
        with host_turn(name, wait_s=60, poll_s=0.02) as turn:  # the whole wait ran out once: not again
            assert not turn.held and turn.waited_s < 1 and "as it did for this run's whole wait" in turn.note
        os.kill(holder.pid, signal.SIGKILL)  # however it ends, the kernel frees the name
        holder.wait()
        with host_turn(name, wait_s=5, poll_s=0.02) as turn:
            assert turn.held and turn.waited_s < 5 and not turn.note
            assert turn.info() == {"host_turn": "held", "host_turn_waited_s": round(turn.waited_s, 2)}
    finally:
        holder.kill()
        holder.wait()


@LINUX
def test_one_turn_at_a_time_and_free_again_after_the_block() -> None:
    name = _name()
    with host_turn(name, wait_s=0) as first:
        with host_turn(name, wait_s=0) as second:
            assert first.held and not second.held
    with host_turn(name, wait_s=0) as again:
        assert again.held


def test_a_waiting_process_takes_the_turn_as_soon_as_it_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    name = _name()
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        if now[0] >= 1.0:  # the holder finishes after 1 s
            holding.close()

    import socket
    holding = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        holding.bind(name)
    except OSError:
        holding.close()
        pytest.skip("no abstract Unix sockets here")
    with host_turn(name, wait_s=10, poll_s=0.25, clock=lambda: now[0], sleep=sleep) as turn:
        assert turn.held and turn.waited_s == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------
# --mig-host-lock: the turn across containers (each its own network namespace), on a file.


@LINUX
def test_runs_that_share_only_the_lock_file_take_turns(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    # two network namespaces: each its own socket name, the one file between them
    with host_turn(_name(), wait_s=0, lock=lock) as first:
        with host_turn(_name(), wait_s=0, lock=lock) as second:
            assert first.held and not second.held
            assert first.info()["host_turn_lock"] == str(lock)
    with host_turn(_name(), wait_s=0, lock=lock) as again:
        assert again.held and not again.note


@LINUX
def test_a_run_waiting_for_the_lock_file_does_not_hold_the_socket_meanwhile(tmp_path: Path) -> None:
    """Both or neither: while a run waits for the file, the socket is free for a run of its own
    namespace, so no two runs each hold one lock and wait for the other."""
    lock, name = tmp_path / "host.lock", _name()
    free_while_waiting: list[bool] = []

    def sleep(_: float) -> None:  # between two attempts: is the socket free?
        with host_turn(name, wait_s=0) as other:
            free_while_waiting.append(other.held)

    with host_turn(_name(), wait_s=0, lock=lock):  # another namespace's run holds the file
        with host_turn(name, wait_s=0.05, poll_s=0.01, lock=lock, sleep=sleep) as blocked:
            assert not blocked.held
    assert free_while_waiting and all(free_while_waiting)


@LINUX
def test_a_killed_holder_of_the_lock_file_frees_it(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, _name().lstrip("\0"), str(lock)],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with host_turn(_name(), wait_s=0.2, poll_s=0.02, lock=lock) as turn:
            assert not turn.held and "another process held the host's copies" in turn.note
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with host_turn(_name(), wait_s=5, poll_s=0.02, lock=lock) as turn:
            assert turn.held
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_file_is_never_written(tmp_path: Path) -> None:
    kept = tmp_path / "results.json"
    kept.write_text('{"a site keeps this": 1}')
    os.utime(kept, (1_000_000_000, 1_000_000_000))
    check_host_lock(kept)
    with host_turn(_name(), wait_s=0, lock=kept) as turn:
        assert turn.held
    assert kept.read_text() == '{"a site keeps this": 1}' and kept.stat().st_mtime == 1_000_000_000
    made = tmp_path / "new.lock"
    check_host_lock(made)
    assert made.is_file() and made.stat().st_size == 0


@pytest.mark.parametrize("kind", ["folder", "link", "fifo", "no parent", "results file"])
def test_what_cannot_be_the_lock_file_is_one_sentence(tmp_path: Path, kind: str) -> None:
    path = tmp_path / kind.replace(" ", "-")
    if kind == "folder":
        path.mkdir()
        said = "is a folder: name a file in it, such as pytest-mig.lock"
    elif kind == "link":
        (tmp_path / "target").write_text("kept")
        path.symlink_to(tmp_path / "target")
        said = "is a link: name the file itself"
    elif kind == "results file":
        path.write_text('{"schema": "pytest-mig/results/1", "records": []}')
        said = "is a results file, which pytest-mig replaces as it saves: name a file of its own, such as pytest-mig.lock"
    elif kind == "fifo":
        os.mkfifo(path)  # opening it must not wait for a writer
        said = "is not a plain file"
    else:
        path = tmp_path / "missing" / "host.lock"
        said = "cannot be opened: No such file or directory"
    with pytest.raises(HostLockError) as err:
        check_host_lock(path)
    assert str(err.value) == f"--mig-host-lock {shown(str(path))} {said}"
    if kind == "link":
        assert (tmp_path / "target").read_text() == "kept"


def test_a_file_system_without_an_exclusive_lock_on_a_read_only_file_is_refused_at_start_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS gives flock's exclusive lock only on a file opened for writing: the run would never hold it."""
    import fcntl

    real = fcntl.flock

    def nfs(fd: int, op: int) -> None:
        if op & fcntl.LOCK_EX:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        real(fd, op)

    monkeypatch.setattr(fcntl, "flock", nfs)
    lock = tmp_path / "host.lock"
    with pytest.raises(HostLockError) as err:
        check_host_lock(lock)
    assert str(err.value) == (f"--mig-host-lock {shown(str(lock))}: its file system gives no lock on it (Bad file "
                              f"descriptor); name a file on a local file system")


def test_the_lock_file_is_made_for_every_run_of_the_host_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        check_host_lock(tmp_path / "host.lock")
    finally:
        os.umask(old)
    assert (tmp_path / "host.lock").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("path, said", [("/proc/self/status", "is in /proc or /sys, whose files take no lock that "
                                                               "holds between runs: name a file on a local file system"),
                                        ("/dev/null", "is not a plain file")])
def test_files_that_are_no_lock_are_refused_before_they_are_opened(path: str, said: str) -> None:
    with pytest.raises(HostLockError) as err:
        check_host_lock(Path(path))
    assert str(err.value) == f"--mig-host-lock {path} {said}"


@LINUX
def test_a_lock_file_lost_after_start_up_is_no_turn_and_says_so(tmp_path: Path) -> None:
    gone = tmp_path / "removed" / "host.lock"
    with host_turn(_name(), wait_s=0, lock=gone) as turn:
        assert not turn.held
        assert turn.note == f"no turn taken: --mig-host-lock {shown(str(gone))} cannot be opened: No such file or directory"


@LINUX
def test_a_lock_file_replaced_while_a_run_waits_is_opened_again(tmp_path: Path) -> None:
    """A run that opened the file before it was replaced would lock a file no one else uses once its
    holder ends: it checks that the path still names what it locked, and opens it again."""
    from pytest_mig.device.host import _FileClaim

    lock = tmp_path / "host.lock"
    waiting = _FileClaim(lock)
    try:
        with host_turn(_name(), wait_s=0, lock=lock) as holder:
            assert holder.held and not waiting.take()  # opened the first file, which the holder locks
            lock.unlink()
            lock.write_text("")  # the path now names another file
        assert waiting.take()  # the first file is free: not enough, it locked the file the path names
        with host_turn(_name(), wait_s=0, lock=lock) as newcomer:
            assert not newcomer.held
    finally:
        waiting.close()


def test_no_abstract_namespace_runs_without_the_turn_and_says_so() -> None:
    with host_turn("/nonexistent-folder/pytest-mig-turn", wait_s=0) as turn:  # a path that cannot be bound
        assert not turn.held and turn.note.startswith("no turn taken:")


def test_the_others_traffic_is_read_until_the_measurement_ends() -> None:
    readings = iter([{"GPU 1": 0.01, "GPU 2": 0.02}, {"GPU 1": 30.0, "GPU 2": 11.5, "GPU 10": 0.1}, {"GPU 1": 0.0}])

    def read() -> dict[str, float]:
        return next(readings, {"GPU 1": 0.0})

    watch = Neighbours(read, every_s=0.001)
    with watch:
        time.sleep(0.05)
    assert watch.readings >= 3
    assert watch.peak == pytest.approx(41.6)  # together in one reading, not each one's most added up
    assert watch.by_gpu["GPU 1"] == 30.0 and watch.by_gpu["GPU 2"] == 11.5
    said = watch.shared()
    assert said is not None and said.startswith("GPU 1, GPU 2 of this host moved up to 41.6 GB/s over PCIe")
    assert "GPU 10" not in said  # 0.1 GB/s is nobody's copying


def test_idle_neighbours_and_failed_readings_leave_the_figure_alone() -> None:
    calls = iter([RuntimeError("NVML went away"), {"GPU 1": float("nan")}, {"GPU 1": 0.4, "GPU 3": 0.3}])

    def read() -> dict[str, float]:
        got = next(calls, {})
        if isinstance(got, Exception):
            raise got
        return got

    watch = Neighbours(read)
    for _ in range(3):
        watch.sample()
    assert watch.readings == 1 and watch.peak == pytest.approx(0.7)  # the failed and the NaN reading are none
    assert watch.shared() is None and NEIGHBOUR_GBS > 0.7


def test_where_no_other_gpu_is_visible_the_figure_says_sharing_was_not_checked() -> None:
    watch = Neighbours(lambda: {})  # a container's NVML lists its own GPU only
    for _ in range(3):
        watch.sample()
    assert watch.readings == 0 and watch.shared() is None
    assert watch.info() == {"neighbours": "no other GPU's PCIe traffic could be read (none visible to NVML, or no "
                                          "answer): sharing not checked"}


def test_a_reading_nvml_never_answers_does_not_hold_the_measurement() -> None:
    import threading
    stuck = threading.Event()

    def read() -> dict[str, float]:
        if stuck.is_set():
            threading.Event().wait(60)  # NVML stopped answering
        stuck.set()
        return {"GPU 1": 0.0}

    start = time.monotonic()
    with Neighbours(read, every_s=0.01, join_s=0.2) as watch:
        time.sleep(0.05)
    assert time.monotonic() - start < 2 and watch.readings == 1


def test_the_gbs_figures_carry_the_sentence_and_the_fractions_do_not() -> None:
    figures = [Metric("h2d_gbs", 42.1, "GB/s", "higher", [42.1], "memory", info={}),
               Metric("h2d_fraction_of_link", 0.67, "fraction", "higher", [], "info", info={}, compare=False)]
    watch = Neighbours(lambda: {"GPU 2": 35.0})
    watch.sample()
    turn = SimpleNamespace(info=lambda: {"host_turn": "not held", "host_turn_waited_s": 180.0})
    mark_shared(figures, watch, turn)
    assert shared_host(figures[0].info) and "GPU 2 of this host" in figures[0].info[SHARED_HOST]
    assert figures[0].info["neighbours_pcie_gbs"] == 35.0 and figures[0].info["host_turn"] == "not held"
    assert figures[1].info == {}
    alone = [Metric("d2h_gbs", 55.2, "GB/s", "higher", [55.2], "memory", info={})]
    idle = Neighbours(lambda: {"GPU 2": 0.05})
    idle.sample()
    mark_shared(alone, idle)
    assert shared_host(alone[0].info) is None and alone[0].info["neighbours_pcie_gbs"] == 0.05
    assert "host_copy_attempts" not in alone[0].info and "host_copy_attempts" not in figures[0].info
    again = [Metric("h2d_gbs", 55.0, "GB/s", "higher", [55.0], "memory", info={})]
    mark_shared(again, idle, attempts=2)
    assert again[0].info["host_copy_attempts"] == 2


def test_a_shared_measurement_is_taken_again_after_a_pause_until_alone() -> None:
    now = {"GPU 1": 40.0}  # GPU 1 copies until the first attempt ends, then idles
    pauses: list[float] = []
    calls: list[int] = []

    import threading
    seen = threading.Event()

    def read() -> dict[str, float]:
        got = dict(now)
        seen.set()
        return got

    def measure() -> int:
        calls.append(1)
        assert seen.wait(5)  # the reading thread has read GPU 1 copying
        now["GPU 1"] = 0.0
        return len(calls)

    result, watch, attempts = measured_alone(measure, read, retries=2, pause_s=7.0, sleep=pauses.append)
    assert (result, attempts, pauses) == (2, 2, [7.0]) and watch.shared() is None
    busy, watch, attempts = measured_alone(lambda: 1, lambda: {"GPU 1": 40.0}, retries=2, pause_s=7.0, sleep=lambda s: None)
    assert attempts == 3 and watch.shared() is not None  # never alone: the last, still marked
    once, watch, attempts = measured_alone(lambda: 1, lambda: {"GPU 1": 40.0}, retries=0, sleep=pytest.fail)
    assert attempts == 1 and watch.shared() is not None  # a layout's slice: marked, never measured out of step


def test_what_a_figure_says_is_what_was_read_by_the_end_of_its_measurement() -> None:
    now = {"GPU 1": 0.0}
    watch = Neighbours(lambda: dict(now), every_s=0.001)
    with watch:
        time.sleep(0.01)
    now["GPU 1"] = 40.0  # a reading that lands after the measurement ended
    watch.sample()
    assert watch.shared() is None and watch.info()["neighbours_pcie_gbs"] == 0.0


def test_the_board_reads_every_other_gpus_pcie_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = topologies.get_topology("h200-mig-off").gpus[0]
    busy = replace(gpu, uuid="GPU-busy", pcie_throughput_kbs=(20_000_000, 9_000_000))  # 29.7 GB/s both ways
    four = replace(topologies.get_topology("h200-mig-off"),
                   gpus=(gpu, replace(gpu, uuid="GPU-idle"), busy, replace(gpu, uuid="GPU-three")))
    fake_pynvml.install(monkeypatch, four)
    got = BoardReader(0).neighbours_pcie_gbs()
    assert set(got) == {"GPU 1", "GPU 2", "GPU 3"}  # not its own
    assert got["GPU 2"] == pytest.approx(29e6 * 1024 / 1e9) and got["GPU 1"] < 0.1
    assert set(BoardReader(2).neighbours_pcie_gbs()) == {"GPU 0", "GPU 1", "GPU 3"}


def test_without_the_counters_there_is_nothing_to_read(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = topologies.with_error(topologies.get_topology("h200-mig-off"), "nvmlDeviceGetPcieThroughput",
                                 fake_pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake_pynvml.install(monkeypatch, replace(topo, gpus=topo.gpus * 2))
    assert BoardReader(0).neighbours_pcie_gbs() == {}


def _record(value: float, shared: bool, day: int = 1) -> ResultRecord:
    info = {SHARED_HOST: "GPU 1 of this host moved up to 41.6 GB/s over PCIe while it was measured"} if shared else {}
    target = {"kind": "full", "profile": "full", "baseline_profile": "full", "gpu_name": "NVIDIA H200",
              "gpu_slug": "nvidia-h200", "emulated": False, "uuid": "GPU-0"}
    return ResultRecord(HOST, Metric("h2d_gbs", value, "GB/s", "higher", [value], "memory", info=info),
                        TargetInfo.from_dict(target), {"driver": "580.159.04"}, f"2026-01-{day:02d}T00:00:00+00:00", "n1")


def test_a_sentence_from_a_file_is_printable_bounded_and_blank_is_none() -> None:
    assert shared_host({SHARED_HOST: "GPU 1 \x1b[2J\x07moved"}) == "GPU 1 \\x1b[2J\\x07moved"
    assert shared_host({SHARED_HOST: "   "}) is None and shared_host({SHARED_HOST: 7}) is None
    assert shared_host({SHARED_HOST: "x" * 5_000_000}) == "x" * 397 + "..."
    assert len(shared_host({SHARED_HOST: "\x1b" * 5000}) or "") == 400  # the limit holds what is printed
    assert shared_host("not a mapping") is None


def test_a_figure_measured_while_the_host_was_shared_is_judged_incomparable_with_the_sentence() -> None:
    history = RecordHistories([[_record(55.0, False, d)] for d in range(1, 11)])  # ten runs: its own sigma rules
    alone, shared = Pipeline(history).judge([_record(31.0, False, 12)])[0], Pipeline(history).judge([_record(31.0, True, 12)])[0]
    assert alone.outcome == "regressed" and alone.failed  # the same value, measured alone: a real loss
    assert shared.outcome == "incomparable" and not shared.failed
    assert shared.message == "h2d_gbs 31.00 GB/s not compared: GPU 1 of this host moved up to 41.6 GB/s over PCIe while it was measured"


def test_it_is_never_saved_into_a_history(tmp_path: Path) -> None:
    assert saveable(_record(31.0, True)) == "measured while the host's other GPUs copied (not this GPU's own figure)"
    assert saveable(_record(55.0, False)) is None
    store = BaselineStore(tmp_path / "bl")
    store.save([_record(31.0, True), _record(55.0, False, 2)])
    base = store.load("nvidia-h200", "full")
    assert base is not None and base.get(HOST, "h2d_gbs", "normal").values == [55.0]  # type: ignore[union-attr]


def test_the_replay_leaves_it_out_as_it_leaves_out_a_shared_gpu(tmp_path: Path) -> None:
    write_results(tmp_path / "shared.json", [_record(31.0, True)])
    write_results(tmp_path / "alone.json", [_record(55.0, False)])
    with open(os.devnull, "w") as out:
        assert nights_of([tmp_path / "shared.json"], out) == []
        assert len(nights_of([tmp_path / "alone.json"], out)) == 1


def test_a_re_measurement_taken_while_the_host_was_shared_does_not_confirm() -> None:
    bench = SimpleNamespace(remeasured=None)
    runs = iter([True, False])

    def runtest() -> None:
        shared = next(runs)
        info = {SHARED_HOST: "GPU 3 of this host moved ..."} if shared else {}
        bench.remeasured.append(Metric("h2d_gbs", 30.0 if shared else 54.0, "GB/s", "higher", [], "memory", info=info))

    got = _remeasure(SimpleNamespace(runtest=runtest), bench, 2)  # type: ignore[arg-type]
    assert got == {"h2d_gbs": [54.0]} and got.shared == {"h2d_gbs": [30.0]}


def _judged(first: float, again: list[float], shared: list[float]) -> Verdict:
    history = RecordHistories([[_record(55.0, False, d)] for d in range(1, 11)])
    taken = Remeasured()
    if again:
        taken["h2d_gbs"] = again
    if shared:
        taken.shared["h2d_gbs"] = shared
    return Pipeline(history).judge([_record(first, False, 12)], remeasure=lambda: taken)[0]


def test_re_measurements_made_while_the_host_was_shared_judge_nothing() -> None:
    rec = _record(49.0, False, 12)
    history = RecordHistories([[_record(55.0, False, d)] for d in range(1, 11)])
    taken = Remeasured()
    taken.shared["h2d_gbs"] = [55.1, 54.9]  # back in the band, but the others copied: no evidence either way
    v = Pipeline(history).judge([rec], remeasure=lambda: taken)[0]
    assert v.outcome == "incomparable" and not v.failed and not v.confirmations
    assert v.message == ("h2d_gbs 49.00 GB/s not compared: it read -10.9% alone, and its re-measurements were made "
                         "while the host's other GPUs copied")
    assert saveable(rec) is not None  # marked: never saved, exported or replayed
    again = Pipeline(history).judge_runs([rec])[0]  # read back from the results file: the same verdict
    assert again.outcome == "incomparable"
    unsure = _judged(49.0, [], [30.0, 31.0])
    assert unsure.outcome == "incomparable" and not unsure.failed
    alone = _judged(49.0, [48.8], [55.0])  # one made alone decides, as before; the shared one is left out
    assert alone.outcome == "regressed" and alone.confirmations == [48.8]
    cleared = _judged(49.0, [55.1], [30.0])
    assert cleared.outcome == "transient" and cleared.confirmations == [55.1]


def test_the_detection_experiment_keeps_no_shared_figure() -> None:
    from pytest_mig.night.detection import _gating_records
    kept = _gating_records([_record(31.0, True), replace(_record(55.0, False), test=HOST + "[alone]")])
    assert [k[0] for k in kept] == [HOST + "[alone]"]


def test_compare_builds_no_history_of_shared_figures(tmp_path: Path) -> None:
    history = RecordHistories([[_record(55.0, False, 1)], [_record(55.2, False, 2)]]
                              + [[_record(31.0 + d / 10, True, d)] for d in range(3, 6)])
    base = history.load("nvidia-h200", "full")
    assert base is not None and base.get(HOST, "h2d_gbs", "normal").values == [55.0, 55.2]  # type: ignore[union-attr]


def test_a_layouts_slice_does_not_take_the_turn_and_a_lone_run_does(cpu) -> None:
    from pytest_mig.bench import MigBench
    assert MigBench(None, cpu).in_layout is False  # a run of its own: its host copies wait for the turn
    assert MigBench(None, cpu, pace=SimpleNamespace()).in_layout is True  # slices copy together on purpose
    text = (Path(__file__).resolve().parent.parent / "benchmarks" / "test_host_bandwidth.py").read_text()
    assert "neighbours=mig_bench.neighbours" in text and "turn=not mig_bench.in_layout" in text
