"""A layout's slices start each test together: a barrier between the workers of one phase.

Every slice of a layout's ``together`` phase is its own pytest process running the same tests in the
same order.  Started at once, they drift apart within a few tests (a slice of fewer SMs takes longer,
start-up differs), and a slice's figure "with its neighbours busy" would then be measured against
neighbours that are compiling, idle or running another test: on an H100 under MPS, seven 1g.10gb
slices' tracking read 75-100% of alone from one run to the next.  So before each test a worker waits
until every other worker of the phase has begun it too.

Beginning a test together is not enough: slices of different sizes build their models, compile and
warm up for different times, so one slice's timed loop would overlap a neighbour's set-up, and a
fast slice would finish timing while a slow one still measures (on an H100 under MPS, GPT-2 at a
constant batch read 61-88% of alone with its test's start alone in step, varying by up to 23% over
five runs).  So the suite's timer
(:class:`pytest_mig.measure.Timer`, every workload's timed calls) also paces each timed call
through the barrier (:meth:`Barrier.timing`, :meth:`Barrier.timed`): a worker begins timing its
``c``-th timed call of a test once every other worker has reached its own ``c``-th, and after it
has timed it keeps running the same work, untimed, until every other worker has timed its ``c``-th
too.  So each slice is measured from start to end with its neighbours running the same test's work.

The folder (one per phase, made by :mod:`pytest_mig.night.layout`) holds ``slots`` (how many workers)
and, per worker ``k``: ``items.k`` (its tests in order, written once collected), ``at.k`` (``[begun,
step]``: how many of them it has begun, and how far into the current one's timed calls it is: ``2c +
1`` once it reached timed call ``c``, ``2c + 2`` once it timed it) and ``pid.k``.  A worker waits at a
point of test ``T`` until each other worker has reached that point of ``T`` or passed it (or does not
run ``T``, or has ended, or its process is gone): each moves forward through the same order and
waits only for those behind it, so no two wait on each other.  A worker whose files never come (a
crash at start-up) is waited for at most ``timeout_s``; the wait is then given up and said.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Sequence

from pytest_mig.common.files import FileProblem, atomic_write_text, read_text

#: Seconds a worker waits for the others at one test before it goes on alone (and says so).
TIMEOUT_S = 1800.0
#: Seconds between looks at the other workers' files.
POLL_S = 0.02


def prepare(folder: Path, slots: int) -> Path:
    """Make the barrier folder of a phase of ``slots`` workers."""
    folder.mkdir(parents=True, exist_ok=False)
    atomic_write_text(folder / "slots", str(int(slots)))
    return folder


class Barrier:
    """One worker's side of the barrier in ``folder``."""

    def __init__(self, folder: Path, slot: int, *, timeout_s: float = TIMEOUT_S, poll_s: float = POLL_S) -> None:
        self.folder, self.slot = Path(folder), int(slot)
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.slots = int(read_text(self.folder / "slots").strip())
        self.items: list[str] = []
        self.others: dict[int, list[str]] = {}  # each other worker's tests, once it has written them
        self.begun = 0
        self.step = 0  # how far into the current test's timed calls (the module docstring)
        self.current: str | None = None  # the test begun last, if this worker runs it
        self.waited_s = 0.0
        self.busy_s = 0.0  # seconds spent running work untimed while slower neighbours timed theirs
        self.notes: list[str] = []  # waits given up while pacing timed calls (each said once)
        atomic_write_text(self.folder / f"pid.{self.slot}", str(os.getpid()))

    def collected(self, nodeids: Sequence[str]) -> None:
        """This worker's tests, in the order it runs them."""
        self.items = list(nodeids)
        atomic_write_text(self.folder / f"items.{self.slot}", json.dumps(self.items))
        self._set_begun(0)

    def wait(self, nodeid: str) -> str | None:
        """Mark ``nodeid`` begun and wait until every other worker has begun it; a sentence where the
        wait was given up (None otherwise)."""
        if nodeid not in self.items:
            self.current = None
            return None
        self._set_begun(self.items.index(nodeid) + 1)
        self.current = nodeid
        pending = self._until(0)
        return (f"layout barrier: slot(s) {', '.join(map(str, pending))} had not begun {nodeid} after "
                f"{self.timeout_s:g} s; it ran without them") if pending else None

    def timing(self) -> None:
        """This worker is about to time a call of the current test: wait until every other worker has
        reached the same timed call of it (or passed it)."""
        if self.current is None:
            return
        self._set_step(self.step + 1 if self.step % 2 == 0 else self.step + 2)
        self._note(self._until(self.step), "had not reached")

    def timed(self, busy: Callable[[], None]) -> None:
        """This worker has timed its call: run ``busy`` (the same work, untimed) until every other
        worker has timed its own call of the test too (or passed it)."""
        if self.current is None:
            return
        self._set_step(self.step + 1)
        self._note(self._until(self.step, busy), "had not timed")

    def end(self) -> None:
        """This worker runs no more tests: nobody waits for it."""
        self._set_begun(len(self.items) + 1)

    def _until(self, step: int, busy: Callable[[], None] | None = None) -> list[int]:
        """Wait (running ``busy`` meanwhile, if given) until every other worker has reached ``step``
        of the current test, the seconds counted as waited or kept busy; the slots still behind when
        ``timeout_s`` ran out (none: all came)."""
        start = time.monotonic()
        pending = [k for k in range(self.slots) if k != self.slot]
        assert self.current is not None
        while pending := [k for k in pending if not self._passed(k, self.current, step)]:
            if time.monotonic() - start > self.timeout_s:
                break
            if busy is not None:
                busy()
            else:
                time.sleep(self.poll_s)
        if busy is None:
            self.waited_s += time.monotonic() - start
        else:
            self.busy_s += time.monotonic() - start
        return pending

    def _note(self, pending: list[int], what: str) -> None:
        if pending:
            note = (f"layout barrier: slot(s) {', '.join(map(str, pending))} {what} a timed call of {self.current} "
                    f"after {self.timeout_s:g} s; it went on without them")
            if note not in self.notes:
                self.notes.append(note)

    def _set_begun(self, n: int) -> None:
        if n >= self.begun:  # a test begun again (a re-run) starts its timed calls again too
            self.begun, self.step = n, 0
        self._write()

    def _set_step(self, step: int) -> None:
        self.step = step
        self._write()

    def _write(self) -> None:
        atomic_write_text(self.folder / f"at.{self.slot}", json.dumps([self.begun, self.step]))

    def _passed(self, k: int, nodeid: str, step: int = 0) -> bool:
        """Whether worker ``k`` has reached ``step`` of ``nodeid`` (0: begun it) or gone past it, does
        not run it, or will run nothing more."""
        items = self._items(k)
        if items is None:  # not collected yet: passed only if its process is gone
            return not self._alive(k)
        if nodeid not in items:
            return True
        at = self._read(f"at.{k}")
        begun, at_step = (at, 0) if isinstance(at, int) else (at if _pair(at) else (0, 0))
        index = items.index(nodeid) + 1
        return begun > index or (begun == index and at_step >= step) or not self._alive(k)

    def _items(self, k: int) -> list[str] | None:
        """Worker ``k``'s tests in order (written once, so read once); None until it has written them."""
        if k not in self.others:
            items = self._read(f"items.{k}")
            if not isinstance(items, list):
                return None
            self.others[k] = items
        return self.others[k]

    def _alive(self, k: int) -> bool:
        """Whether worker ``k``'s process runs (one that has not written its pid yet counts as alive:
        one that never will is left to the timeout)."""
        pid = self._read(f"pid.{k}")
        if not isinstance(pid, int):
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _zombie(pid)  # killed, its exit not yet collected by the runner (which waits in slot order)

    def _read(self, name: str) -> object:
        try:
            return json.loads(read_text(self.folder / name))
        except (FileProblem, OSError, ValueError):
            return None


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has ended but not been reaped (Linux's /proc; elsewhere: not known, no)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 1:].split()[:1] == ["Z"]


def _pair(value: object) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


__all__ = ["Barrier", "POLL_S", "TIMEOUT_S", "prepare"]
