"""The barrier through which a layout's slices begin each test together (night/barrier.py): a worker
waits for the others at each test, and never for one that does not run the test, has ended, is
gone, or never came (then it says so)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from pytest_mig.night.barrier import Barrier, prepare


def _later(seconds: float, fn) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    t.start()
    return t


def test_a_worker_waits_at_a_test_until_the_other_has_begun_it(tmp_path):
    folder = prepare(tmp_path / "b", 2)
    a, b = Barrier(folder, 0), Barrier(folder, 1)
    a.collected(["t1", "t2"])
    b.collected(["t1", "t2"])
    t = _later(0.4, lambda: b.wait("t1"))
    start = time.monotonic()
    assert a.wait("t1") is None
    assert time.monotonic() - start >= 0.35
    t.join()
    assert a.waited_s >= 0.35


def test_a_worker_that_has_passed_the_test_is_not_waited_for(tmp_path):
    folder = prepare(tmp_path / "b", 2)
    a, b = Barrier(folder, 0), Barrier(folder, 1)
    a.collected(["t1", "t2"])
    b.collected(["t1", "t2"])
    b._set_begun(2)  # b has begun t2, so t1 too
    start = time.monotonic()
    assert a.wait("t1") is None and time.monotonic() - start < 0.3


def test_a_test_the_other_does_not_run_and_an_ended_worker_are_not_waited_for(tmp_path):
    folder = prepare(tmp_path / "b", 3)
    a, b, c = Barrier(folder, 0), Barrier(folder, 1), Barrier(folder, 2)
    a.collected(["t1", "t2"])
    b.collected(["t2"])  # deselected t1
    c.collected(["t1", "t2"])
    c.end()
    start = time.monotonic()
    assert a.wait("t1") is None and time.monotonic() - start < 0.3
    t = _later(0.3, lambda: b.wait("t2"))
    assert a.wait("t2") is None
    t.join()


def test_a_worker_whose_process_is_gone_is_not_waited_for(tmp_path):
    folder = prepare(tmp_path / "b", 2)
    a = Barrier(folder, 0)
    a.collected(["t1"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / "pid.1").write_text(dead.stdout.strip())
    (folder / "items.1").write_text('["t1"]')
    (folder / "at.1").write_text("0")
    start = time.monotonic()
    assert a.wait("t1") is None and time.monotonic() - start < 0.5


def test_a_worker_that_never_comes_is_waited_for_until_the_timeout_and_said(tmp_path):
    folder = prepare(tmp_path / "b", 2)
    a = Barrier(folder, 0, timeout_s=0.3)
    a.collected(["tests/x.py::t1"])
    start = time.monotonic()
    note = a.wait("tests/x.py::t1")
    assert 0.3 <= time.monotonic() - start < 2
    assert note == "layout barrier: slot(s) 1 had not begun tests/x.py::t1 after 0.3 s; it ran without them"


def test_a_barrier_folder_that_is_not_there_is_refused(tmp_path):
    from pytest_mig.common.files import FileProblem

    with pytest.raises(FileProblem):
        Barrier(tmp_path / "missing", 0)
    prepare(tmp_path / "b", 2)
    with pytest.raises(FileExistsError):  # a phase's folder is new: never one of another phase
        prepare(tmp_path / "b", 2)


def _two(tmp_path, items=("t1", "t2"), **kw):
    folder = prepare(tmp_path / "b", 2)
    a, b = Barrier(folder, 0, **kw), Barrier(folder, 1, **kw)
    a.collected(list(items))
    b.collected(list(items))
    return a, b


def _together(call_a, call_b) -> None:
    """Both workers' calls at once (each may wait for the other)."""
    t = threading.Thread(target=call_b)
    t.start()
    call_a()
    t.join()


def test_a_timed_call_begins_when_the_other_worker_reaches_its_own(tmp_path):
    a, b = _two(tmp_path)
    _together(lambda: a.wait("t1"), lambda: b.wait("t1"))
    waited = b.waited_s
    t = _later(0.5, a.timing)  # a's set-up takes 0.5 s longer
    start = time.monotonic()
    b.timing()  # b is set up first: it waits until a reaches its timed call
    assert time.monotonic() - start >= 0.45
    t.join()
    assert b.waited_s - waited >= 0.45


def test_after_its_timed_call_a_worker_keeps_busy_until_the_other_has_timed_its_own(tmp_path):
    a, b = _two(tmp_path)
    _together(lambda: a.wait("t1"), lambda: b.wait("t1"))
    _together(a.timing, b.timing)
    calls = []
    t = _later(0.5, lambda: b.timed(lambda: None))  # b times for 0.5 s more than a
    start = time.monotonic()
    a.timed(lambda: (calls.append(1), time.sleep(0.01)))
    assert time.monotonic() - start >= 0.45
    assert len(calls) >= 20  # a ran its work, untimed, all that time
    assert a.busy_s >= 0.45 and a.waited_s < 0.1  # busy is not counted as waiting
    t.join()


def test_a_worker_with_fewer_timed_calls_in_a_test_is_not_waited_for_at_the_others(tmp_path):
    a, b = _two(tmp_path)
    _together(lambda: a.wait("t1"), lambda: b.wait("t1"))
    _together(a.timing, b.timing)
    t = _later(0.1, lambda: (b.timed(lambda: None), b.wait("t2")))  # b's one timed call; then on to t2
    a.timed(lambda: time.sleep(0.005))
    while b.begun < 2:  # b has gone on to t2 (where it waits for a)
        time.sleep(0.01)
    start = time.monotonic()
    a.timing()  # a's second timed call of t1: b is not waited for
    a.timed(lambda: pytest.fail("b has timed its calls of t1: a does not keep busy"))
    assert time.monotonic() - start < 0.2
    assert a.wait("t2") is None and a.notes == []
    t.join()


def test_a_timed_call_of_a_test_another_worker_does_not_run_waits_for_nobody(tmp_path):
    a, b = _two(tmp_path)
    a.collected(["t1", "solo"])
    b.collected(["t1"])
    a.wait("solo")
    start = time.monotonic()
    a.timing()
    a.timed(lambda: pytest.fail("nobody to wait for: the work is not repeated"))
    assert time.monotonic() - start < 0.2


def test_a_worker_not_paced_in_a_test_it_was_not_given_does_nothing(tmp_path):
    a, _b = _two(tmp_path)
    assert a.wait("elsewhere") is None  # a test this worker did not collect (a plugin's own)
    a.timing()
    a.timed(lambda: pytest.fail("not paced"))
    assert a.step == 0


def test_a_timed_call_waited_for_until_the_timeout_is_said_once(tmp_path):
    a, b = _two(tmp_path, timeout_s=0.2)
    _together(lambda: a.wait("t1"), lambda: b.wait("t1"))
    a.timing()  # b never reaches its timed call
    a.timing()
    assert a.notes == ["layout barrier: slot(s) 1 had not reached a timed call of t1 after 0.2 s; it went on "
                       "without them"]
    b.timing()
    calls = []
    a.timed(lambda: (calls.append(1), time.sleep(0.02)))  # nor times it: a stops keeping busy at the timeout
    assert calls and a.notes[-1].startswith("layout barrier: slot(s) 1 had not timed a timed call of t1")


class _Pace:
    """Records what the timer asks of its pace, and keeps 'busy' for three batches."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def timing(self) -> None:
        self.events.append("timing")

    def timed(self, busy) -> None:
        self.events.append("timed")
        for _ in range(3):
            busy()


def test_the_timer_paces_each_timed_call_and_keeps_busy_with_the_same_work_untimed():
    from pytest_mig.measure import Timer

    events: list[str] = []
    timer = Timer("cpu", pace=_Pace(events))
    timer.window_batch_s = 0.0  # one call per busy batch

    def fn():
        events.append("fn")

    timing = timer(fn, warmup=1, repeats=2)
    assert len(timing.samples) == 2 and timing.busy_calls == 3  # the busy calls are not samples, but counted
    assert events[0] == "timing" and events.index("timed") == len(events) - 4
    assert events.count("fn") == 1 + 2 + 3 and events[-3:] == ["fn"] * 3
    unpaced: list[str] = []
    Timer("cpu")(lambda: unpaced.append("fn"), warmup=1, repeats=2)
    assert unpaced == ["fn"] * 3


def test_a_worker_killed_but_not_yet_reaped_is_not_waited_for(tmp_path):
    a, _b = _two(tmp_path, timeout_s=5)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "b" / "pid.1").write_text(str(child.pid))
        child.kill()
        time.sleep(0.3)  # dead, and not waited for: a zombie, as a runner waiting on another slot leaves it
        start = time.monotonic()
        assert a.wait("t1") is None and time.monotonic() - start < 1
    finally:
        child.wait()


def test_a_test_begun_again_starts_its_timed_calls_again(tmp_path):
    a, b = _two(tmp_path)
    b.end()  # nobody to wait for
    a.wait("t1")
    a.timing()
    a.timed(lambda: None)
    assert a.step == 2
    a.wait("t1")  # re-run (pytest-rerunfailures): its first timed call pairs with the others' first
    assert a.step == 0 and json.loads((tmp_path / "b" / "at.0").read_text()) == [1, 0]
