"""Timing a piece of work on several buffer sets held at once, each set timed as often.

A kernel's rate can depend on where its buffers land in device memory: one placement times alike
call after call, another differs by several times that, and what a process allocated before
decides which placement it gets.  A figure timed on one placement then moves from one night to the
next by the placement's share alone; timed on several, its median moves less
(docs/detection.md#placements).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: The share of a Target's memory budget the buffer sets may take together.
SHARE = 0.8


def fitting(need_bytes: int, budget_bytes: int, wanted: int) -> int:
    """How many buffer sets of ``need_bytes`` each fit in ``SHARE`` of ``budget_bytes``, at most
    ``wanted``: 0 where not even one does."""
    if need_bytes <= 0:
        return max(0, wanted)
    return max(0, min(wanted, int(SHARE * budget_bytes // need_bytes)))


class Rotation:
    """A callable that runs ``step(*args)`` on each of ``sets`` in turn.  Timed a multiple of
    ``len(sets)`` times in a row (:meth:`repeats`), it times every set as often, whatever number of
    calls a warm-up made before."""

    def __init__(self, sets: Sequence[tuple[Any, ...]], step: Callable[..., Any]) -> None:
        if not sets:
            raise ValueError("a rotation needs at least one buffer set")
        self.sets, self.step, self.calls = list(sets), step, 0

    def repeats(self, least: int) -> int:
        """The timed repeats that give every set as many and come to at least ``least``."""
        n = len(self.sets)
        return n * max(1, -(-least // n))

    def __call__(self) -> Any:
        args = self.sets[self.calls % len(self.sets)]
        self.calls += 1
        return self.step(*args)
