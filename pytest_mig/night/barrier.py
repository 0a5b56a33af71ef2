"""A layout's slices start each test together: a barrier between the workers of one phase.

Every slice of a layout's ``together`` phase is its own pytest process running the same tests in the
same order.  Started at once, they drift apart within a few tests (a slice of fewer SMs takes longer,
start-up differs), and a slice's figure "with its neighbours busy" would then be measured against
neighbours that are compiling, idle or running another test: on an H100 under MPS, seven 1g.10gb
slices' tracking read 75-100% of alone from one run to the next.  So before each test a worker waits
until every other worker of the phase has begun it too.

The folder (one per phase, made by :mod:`pytest_mig.night.layout`) holds ``slots`` (how many workers)
and, per worker ``k``: ``items.k`` (its tests in order, written once collected), ``at.k`` (how many of
them it has begun) and ``pid.k``.  A worker waits at test ``T`` until each other worker has begun
``T`` (or does not run ``T``, or has ended, or its process is gone): each moves forward through the
same order, so no two wait on each other.  A worker whose files never come (a crash at start-up) is
waited for at most ``timeout_s``; the wait is then given up and said.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

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
        self.waited_s = 0.0
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
            return None
        self._set_begun(self.items.index(nodeid) + 1)
        start = time.monotonic()
        pending = [k for k in range(self.slots) if k != self.slot]
        while pending := [k for k in pending if not self._passed(k, nodeid)]:
            if time.monotonic() - start > self.timeout_s:
                self.waited_s += time.monotonic() - start
                return (f"layout barrier: slot(s) {', '.join(map(str, pending))} had not begun {nodeid} after "
                        f"{self.timeout_s:g} s; it ran without them")
            time.sleep(self.poll_s)
        self.waited_s += time.monotonic() - start
        return None

    def end(self) -> None:
        """This worker runs no more tests: nobody waits for it."""
        self._set_begun(len(self.items) + 1)

    def _set_begun(self, n: int) -> None:
        self.begun = max(self.begun, n)
        atomic_write_text(self.folder / f"at.{self.slot}", str(self.begun))

    def _passed(self, k: int, nodeid: str) -> bool:
        """Whether worker ``k`` has begun ``nodeid``, does not run it, or will run nothing more."""
        items = self._items(k)
        if items is None:  # not collected yet: passed only if its process is gone
            return not self._alive(k)
        if nodeid not in items:
            return True
        begun = self._read(f"at.{k}")
        return (isinstance(begun, int) and begun > items.index(nodeid)) or not self._alive(k)

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
        return True

    def _read(self, name: str) -> object:
        try:
            return json.loads(read_text(self.folder / name))
        except (FileProblem, OSError, ValueError):
            return None


__all__ = ["Barrier", "POLL_S", "TIMEOUT_S", "prepare"]
