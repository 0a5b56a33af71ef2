"""A run stopped partway keeps what it measured.

A nightly is stopped before its end more often than it crashes: Slurm's time limit and
``scancel``, a Kubernetes Job's ``activeDeadlineSeconds`` or a node drain, a CI runner's timeout.
Each sends SIGTERM, then SIGKILL after a grace period (Slurm's ``KillWait``, Kubernetes'
``terminationGracePeriodSeconds``: 30 s by default).  A results file written only at the end would
lose every figure such a run had measured, so:

- **The results file is written as the run goes** (:class:`Checkpoint`): after every test that
  recorded figures it is rewritten atomically with the records so far and ``"complete": false`` in
  its meta.  Even SIGKILL leaves every finished test's figures, and never a half-written file.
- **SIGTERM stops the run the way Ctrl-C does** (:func:`stop_on_sigterm`): while the session runs,
  it raises KeyboardInterrupt, so pytest ends the test under way and runs the session's end: the MPS
  daemon is stopped, exports and report are written, and the file's meta says ``"stopped":
  "SIGTERM"``.  A handler the site (or another plugin) set is left alone.  Further SIGTERMs while
  stopping are ignored: Slurm signals every process of the job and a wrapper script may pass the
  signal on as well, so two can come at once; SIGKILL after the grace period stays the hard stop.
  One that comes after the last test, while the session's end writes its files (results, report,
  baseline), interrupts nothing and stops no run (:meth:`SigtermStop.hold`).  One that comes while
  the plugin judges a test or writes its results file waits for the end of that step
  (:meth:`SigtermStop.deferred`), so it never cuts a verdict, a write or an import in half; the
  modules the session's end needs are imported before the handler is installed.

A stopped run is never added to a history by ``--mig-save-if-passed`` (its exit status is not 0);
``--mig-save-baseline`` saves the tests that finished, as it would have at the end.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Iterator, Sequence

from pytest_mig.common.files import writes_through
from pytest_mig.store.results import ResultRecord, ResultsFileError, write_results


@dataclass
class Checkpoint:
    """The run's results file, rewritten as records arrive and finally at the session's end."""

    path: Path
    written: int = 0  # records in the file now
    failed: bool = False  # a write failed: no more until the session's end, which reports it

    def update(self, records: Sequence[ResultRecord], meta: dict[str, Any]) -> None:
        """Rewrite the file if records arrived since the last write (an incomplete run's file).  A
        character device or a pipe (``/dev/stdout``) gets only the session's end's whole run."""
        if len(records) == self.written or self.failed or writes_through(self.path):
            return
        try:
            write_results(self.path, records, meta={**meta, "complete": False})
            self.written = len(records)
        except ResultsFileError:
            self.failed = True

    def finish(self, records: Sequence[ResultRecord], meta: dict[str, Any], stopped: str | None) -> None:
        """The session's end: the whole run, complete unless it was stopped.  Raises ResultsFileError."""
        meta = {**meta, "complete": stopped is None}
        if stopped:
            meta["stopped"] = stopped
        write_results(self.path, records, meta=meta)
        self.written = len(records)


@dataclass
class SigtermStop:
    """SIGTERM turned into KeyboardInterrupt for the session's length; whether it came.

    No lock: Python runs signal handlers in the main thread, where :meth:`hold` runs too (a lock
    taken there would deadlock a handler that interrupts it)."""

    previous: Any = None
    installed: bool = False
    received: bool = False  # SIGTERM came while tests ran: the run was stopped
    holding: bool = False  # the session's end is writing its files: SIGTERM no longer interrupts
    deferring: bool = False  # a step that must not be cut in half is under way (:meth:`deferred`)
    pending: bool = False  # SIGTERM came during such a step: it stops the run at the step's end

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.received or self.holding:  # later ones (the scheduler's and a wrapper's at once) must not
            return                         # break off the stopping, nor the session's end its writing
        self.received = True
        if self.deferring:
            self.pending = True
            return
        raise KeyboardInterrupt("SIGTERM")

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A step that SIGTERM must not cut in half (judging a test, writing its results file): one
        that comes during it raises KeyboardInterrupt at its end, in place of whatever it raised."""
        outer = self.deferring
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = outer
            if not outer and self.pending and not self.holding:
                self.pending = False
                raise KeyboardInterrupt("SIGTERM")  # the run stops here, whatever the step raised

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Work inside a deferred step that SIGTERM stops at once (re-measuring a test while it is judged):
        one held back before it stops the run as it starts."""
        outer = self.deferring
        self.deferring = False
        try:
            if self.pending and not self.holding:
                self.pending = False
                raise KeyboardInterrupt("SIGTERM")
            yield
        finally:
            self.deferring = outer

    def hold(self) -> bool:
        """From the session's end on, SIGTERM interrupts nothing (the results, report and baseline are
        being written; SIGKILL stays the hard stop).  Whether the run was stopped by one before."""
        self.holding = True
        return self.received

    def restore(self) -> None:
        if self.installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.previous)
        self.installed = False


def stop_on_sigterm() -> SigtermStop:
    """Install the SIGTERM handler where SIGTERM still has its default action (a site's own handler is
    left alone) and this is the main thread (the only one Python lets set a handler)."""
    stop = SigtermStop()
    if threading.current_thread() is not threading.main_thread():
        return stop
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return stop
    stop.previous = signal.SIG_DFL
    signal.signal(signal.SIGTERM, stop._handler)
    stop.installed = True
    return stop
