"""The barrier through which a layout's slices begin each test together (night/barrier.py): a worker
waits for the others at each test, and never for one that does not run the test, has ended, is
gone, or never came (then it says so)."""

from __future__ import annotations

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
