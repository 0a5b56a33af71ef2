"""A daemon thread that calls one function at a fixed interval while a measurement runs.

Board power, the energy counter and the other GPUs' PCIe traffic are each read this way
(:class:`pytest_mig.measure.timing.PowerSampler`, :class:`pytest_mig.measure.timing.EnergyTicks`,
:class:`pytest_mig.device.host.Neighbours`); the step itself must never raise: telemetry that
fails is no reading, and the measurement goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Poller:
    """Calls ``step`` every ``interval`` seconds in a daemon thread named ``name``, from
    :meth:`start` until :meth:`stop`; with ``last_step``, once more after the stop, so that a short
    measurement has at least one reading.  :meth:`stop` waits at most ``join_s`` for the thread:
    a reading the driver never answers does not hold the test.  One start, one stop: a measurement
    makes a poller of its own."""

    def __init__(self, step: Callable[[], None], interval: float, name: str, *, join_s: float = 2.0,
                 last_step: bool = False) -> None:
        self.step, self.interval, self.name = step, interval, name
        self.join_s, self.last_step = join_s, last_step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.interval)
        if self.last_step:
            self.step()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_s)
