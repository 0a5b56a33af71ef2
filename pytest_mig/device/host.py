"""What the GPUs of one host share while copying to and from it: a turn, and the others' traffic.

Host-device copies go through the host's memory, its PCIe root ports and switches, which every GPU
of the host shares.  Four H200s of one host running the suite at once, each its own process
started together as a scheduler starts one job per GPU (docs/results/h200-quad-2026-11-28.tgz),
copied as little as 31 GB/s host-to-device and 28 GB/s device-to-host where one alone copies 55
(43% and 50% less); 10 of their 11 nights failed their host copies, confirmed by re-measurements
taken while the others still copied.  A nightly on every GPU of a node would fail so every night.  So:

* **pytest-mig processes of one host take turns at their host copies** (:func:`host_turn`): the
  turn is an abstract Unix socket name, bound by one process at a time and freed by the kernel when
  the process ends, however it ends (no file to leave stale, follow through a link, or lose).  A
  process waits up to ``TURN_WAIT_S`` for it; then it measures anyway, and the reading below tells.
* **The other GPUs' PCIe traffic is read while the copies run** (:class:`Neighbours`, NVML's PCIe
  throughput counters), for what a turn cannot see: another user's job.  Where the others moved
  more than ``NEIGHBOUR_GBS`` together, the figures say so (``info["shared_host"]``): they are
  judged ``incomparable`` with that sentence and never saved into a history or a reference
  (:func:`shared_host`).

Neither reaches across containers: one pod per GPU has its own network namespace (no shared turn)
and an NVML that lists its own GPU only (no neighbours to read); the figures then say that sharing
was not checked (``info["neighbours"]``).  Run one job per node with ``--mig-device all`` there, as
docs/fleet.md does: its workers share the turn.  A process waits the whole ``TURN_WAIT_S`` once;
after that, if the turn is still held, it takes the turn only where it is free.
"""

from __future__ import annotations

import contextlib
import errno
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, TypeVar

from pytest_mig.common.text import printable

T = TypeVar("T")

#: The turn's name in the abstract socket namespace (Linux), one per host and network namespace.
TURN_NAME = "\0pytest-mig/host-copies"
#: How long a process waits for its turn before it measures anyway: eight GPUs' normal host copies
#: take under a minute together, 56 MIG workers' (eight GPUs of 7 slices) about four.
TURN_WAIT_S = 300.0
#: Seconds between two attempts at the turn.
TURN_POLL_S = 0.05
#: The other GPUs' PCIe traffic (GB/s, both directions, together) above which a host copy was not
#: measured alone: 4% of the 50-55 GB/s a Gen5 x16 GPU copies at, under the figures' thresholds
#: (10-11% on a short history); another GPU's copies move 30-55 GB/s.
NEIGHBOUR_GBS = 2.0
#: Seconds between two readings of the other GPUs' traffic (each reading takes NVML's 20 ms
#: sample per counter).
SAMPLE_S = 0.1
#: The key a host-copy figure carries in its info when the host was shared during its measurement.
SHARED_HOST = "shared_host"
#: Measurements taken again, after a pause, while the other GPUs were seen copying.
SHARED_RETRIES = 2
SHARED_PAUSE_S = 5.0


@dataclass
class Turn:
    """A process's turn at the host's copies: whether it has the host to itself among pytest-mig
    processes, and how long it waited."""

    held: bool
    waited_s: float = 0.0
    note: str = ""

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host_turn": "held" if self.held else "not held", "host_turn_waited_s": round(self.waited_s, 2)}
        if self.note:
            out["host_turn_note"] = self.note
        return out


#: Turn names whose whole wait ran out in this process: a second wait would only add as much again.
_WAITED_OUT: set[str] = set()


@contextlib.contextmanager
def host_turn(name: str = TURN_NAME, wait_s: float = TURN_WAIT_S, poll_s: float = TURN_POLL_S,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Iterator[Turn]:
    """Hold the host's turn at host copies while the block runs (see the module docstring).

    Never raises for the turn itself: where the platform has no abstract sockets, or the wait runs
    out, the block runs without it and ``Turn.note`` says why.  Once a wait has run out in this
    process, later ones take the turn only if it is free (a stuck holder costs one wait a night,
    not one per re-measurement)."""
    if name in _WAITED_OUT:
        wait_s = 0.0
    start = clock()
    sock: socket.socket | None = None
    note = ""
    try:
        while True:
            try:
                candidate = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            except (AttributeError, OSError) as exc:  # no Unix sockets here
                note = f"no turn taken: {exc}"
                break
            try:
                candidate.bind(name)
                sock = candidate
                break
            except OSError as exc:
                candidate.close()
                if exc.errno != errno.EADDRINUSE:
                    note = f"no turn taken: {exc.strerror or exc}"  # no abstract namespace (not Linux)
                    break
            if clock() - start >= wait_s:
                note = (f"no turn taken: another process held the host's copies for over {wait_s:g} s" if wait_s
                        else "no turn taken: another process held the host's copies, as it did for this run's whole wait")
                _WAITED_OUT.add(name)
                break
            sleep(poll_s)
        yield Turn(sock is not None, clock() - start, note)
    finally:
        if sock is not None:
            sock.close()


@dataclass
class Neighbours:
    """Reads the other GPUs' PCIe traffic in a thread while a measurement runs.

    ``read`` returns each other GPU's traffic now, in GB/s both directions together, by name
    (``{"GPU 1": 41.2}``); an empty mapping where there is none to read.  ``peak`` keeps the most
    the others moved together in one reading, ``by_gpu`` each one's most."""

    read: Callable[[], Mapping[str, float]]
    every_s: float = SAMPLE_S
    join_s: float = 5.0  # the most the measurement waits for a reading at its end
    peak: float = 0.0
    by_gpu: dict[str, float] = field(default_factory=dict)
    readings: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _final: tuple[float, dict[str, float], int] | None = None

    def sample(self) -> None:
        """Take one reading (the thread's step; callable directly).  A reading that fails, or in which
        no other GPU answered, is no reading."""
        try:
            now = {str(k): float(v) for k, v in self.read().items() if v is not None and math.isfinite(v)}
        except Exception:  # a reading that fails is no reading; the measurement goes on
            return
        if not now:
            return
        self.readings += 1
        self.peak = max(self.peak, sum(now.values()))
        for k, v in now.items():
            self.by_gpu[k] = max(self.by_gpu.get(k, 0.0), v)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)
        self.sample()  # one reading at the end, so a short measurement has at least one

    def __enter__(self) -> Neighbours:
        self._thread = threading.Thread(target=self._run, name="pytest-mig-neighbours", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_s)  # a reading NVML never answers does not hold the test
        # What was read by the end is what the figure says: a reading that lands later changes nothing.
        self._final = (self.peak, dict(self.by_gpu), self.readings)

    def _state(self) -> tuple[float, dict[str, float], int]:
        return self._final if self._final is not None else (self.peak, dict(self.by_gpu), self.readings)

    def shared(self, limit: float = NEIGHBOUR_GBS) -> str | None:
        """The sentence a figure carries when the others moved more than ``limit`` (None: alone)."""
        peak, by_gpu, _ = self._state()
        if peak <= limit:
            return None
        busy = sorted((k for k, v in by_gpu.items() if v > 0.1 * limit), key=_gpu_order)
        who = ", ".join(busy) if busy else "the other GPUs"
        return (f"{who} of this host moved up to {peak:.1f} GB/s over PCIe while it was measured (over "
                f"{limit:g} GB/s): host copies share the host's memory and PCIe switches, so this is not this "
                f"GPU's link alone; measure it with the host's other GPUs idle")

    def info(self) -> dict[str, Any]:
        peak, _, readings = self._state()
        if not readings:
            return {"neighbours": "no other GPU's PCIe traffic could be read (none visible to NVML, or no "
                                  "answer): sharing not checked"}
        return {"neighbours_pcie_gbs": round(peak, 2), "neighbour_readings": readings}


def measured_alone(measure: Callable[[], T], read: Callable[[], Mapping[str, float]] | None,
                   retries: int = SHARED_RETRIES, pause_s: float = SHARED_PAUSE_S,
                   sleep: Callable[[float], None] = time.sleep) -> tuple[T, Neighbours, int]:
    """``measure()`` while the other GPUs' traffic is read; taken again after a pause, up to
    ``retries`` times, while they were seen copying.  Returns the last result, its reading and the
    attempts made: a result whose reading is still shared is not this GPU's alone."""
    attempt = 0
    while True:
        attempt += 1
        watch = Neighbours(read or (lambda: {}))
        with watch:
            result = measure()
        if attempt > retries or watch.shared() is None:
            return result, watch, attempt
        sleep(pause_s)


def _gpu_order(name: str) -> tuple[int, str]:
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits) if digits else 1 << 30, name)


#: The most of a file's ``shared_host`` sentence a verdict repeats.
SENTENCE_LIMIT = 400


def shared_host(info: Any) -> str | None:
    """The sentence of a figure measured while the host's other GPUs copied, printable and at most
    ``SENTENCE_LIMIT`` characters (None: measured alone)."""
    if not isinstance(info, Mapping):
        return None
    text = info.get(SHARED_HOST)
    if not isinstance(text, str) or not text.strip():
        return None
    shown = printable(text.strip())  # escaped first, so that the limit holds what is printed
    return shown if len(shown) <= SENTENCE_LIMIT else shown[:SENTENCE_LIMIT - 3] + "..."


__all__ = ["NEIGHBOUR_GBS", "SHARED_HOST", "SHARED_PAUSE_S", "SHARED_RETRIES", "TURN_NAME", "TURN_WAIT_S", "Neighbours",
           "Turn", "host_turn", "measured_alone", "shared_host"]
