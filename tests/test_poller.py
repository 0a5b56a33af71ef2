"""The polling thread behind the power, energy-counter and neighbour readings."""

from __future__ import annotations

import threading
import time

from pytest_mig.common.poller import Poller


def test_it_calls_the_step_until_stopped_and_no_more() -> None:
    calls: list[float] = []
    poller = Poller(lambda: calls.append(time.monotonic()), 0.005, "test-poller")
    poller.start()
    time.sleep(0.1)
    poller.stop()
    made = len(calls)
    time.sleep(0.05)
    assert made >= 3 and len(calls) == made  # nothing after stop()


def test_a_last_step_reads_once_more_after_the_stop() -> None:
    calls: list[str] = []
    gate = threading.Event()

    def step() -> None:
        calls.append("stopped" if gate.is_set() else "running")

    poller = Poller(step, 60.0, "test-poller", last_step=True)  # one step, then a long wait
    poller.start()
    time.sleep(0.05)
    gate.set()
    poller.stop()
    assert calls == ["running", "stopped"]


def test_a_step_that_never_returns_does_not_hold_the_stop() -> None:
    stuck = threading.Event()
    poller = Poller(lambda: stuck.wait(60), 0.01, "test-poller", join_s=0.1)
    poller.start()
    start = time.monotonic()
    poller.stop()
    assert time.monotonic() - start < 1.0
