"""A night inside a maintenance window: ``--mig-window 5m``.

A site's nightly often shares a Slurm reservation or a maintenance window with other checks.  Rather
than a run that the window's end kills halfway (SIGTERM: the tests that finished are kept, the rest
are lost for the night), ``--mig-window`` plans the night to fit, and rotates what does not fit:

- **Each test's seconds** are the median of the last three times it ran on the same GPU model,
  profile and mode (a first night on a new stack, compiling again, is one time of three), read
  from the newest results files in the results folder (their ``durations``,
  :func:`pytest_mig.night.nights.last_runs`); a test with none is counted at the median of the others'.
- **The stalest tests go first**: the tests are taken in the order of when each last ran (never
  first), each while the window holds its seconds, so a test left out tonight is among the first
  tomorrow and every test runs within a few nights.  The chosen tests run in the suite's own order
  (the order the history was measured in: GEMM after training is a warmer board).
- **The rest are left for the next night and named** in the summary and in the results file's
  ``window`` block, never silently: a test longer than the whole window is named as such (it never
  fits: run it outside the window or widen it).  Only the tests the run selected are planned (after
  ``-k``, ``-m`` and the tests that gate nothing are taken out), and the summary, written at the
  end, counts the tests that ran.
- **While the night runs**, a test that would no longer end inside the window (the seconds spent
  plus its own) is skipped with the reason, so a night whose estimates ran long still ends in time.

The window counts pytest's time from the end of collection; leave the minute that start-up and the
end of the run take (NVML, the verdicts, the files) outside it.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Collection, Iterable

from pytest_mig.night.nights import duration_text as _short
from pytest_mig.common.text import SHOWN, quoted
import argparse

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_window(text: str) -> float:
    """Seconds from ``300``, ``300s``, ``5m`` or ``1.5h``; ValueError with one sentence otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|min|h)?\s*", str(text))
    if not m:
        raise ValueError(f"{quoted(text, SHOWN)} is not a length of time (seconds, or with s, m or h: 300, 5m, 1.5h)")
    seconds = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if not math.isfinite(seconds) or seconds < 1:
        raise ValueError(f"{quoted(text, SHOWN)} is shorter than a second: a window holds at least one test")
    return seconds


def window_arg(text: str) -> float:
    """:func:`parse_window` as an argparse type (a usage error in one sentence)."""

    try:
        return parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def merge_meta(metas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What node mode's results file keeps of its workers' meta: each test's longest time (the node's
    night ends with its slowest device) and, where a window ran, every test it left out on any device."""
    durations: dict[str, float] = {}
    windows = [m["window"] for m in metas if isinstance(m.get("window"), dict)]
    for meta in metas:
        kept = meta.get("durations")
        for nodeid, value in (kept.items() if isinstance(kept, dict) else ()):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                durations[nodeid] = max(durations.get(nodeid, 0.0), float(value))
    out: dict[str, Any] = {"durations": durations} if durations else {}
    if windows:
        left = {n for w in windows if isinstance(w.get("left"), list) for n in w["left"] if isinstance(n, str)}
        out["window"] = {"seconds": windows[0].get("seconds"), "left": sorted(left)}
    return out


@dataclass
class Plan:
    """The night's tests inside the window, and those left for a later night."""

    window_s: float
    run: list[str]  # node ids, in the suite's order
    left: list[str] = field(default_factory=list)  # stalest first
    too_long: list[str] = field(default_factory=list)  # each alone longer than the whole window
    seconds: dict[str, float] = field(default_factory=dict)  # node id -> the seconds counted for it
    guessed: list[str] = field(default_factory=list)  # counted at the others' median: never ran here

    @property
    def planned_s(self) -> float:
        return sum(self.seconds.get(n, 0.0) for n in self.run)

    def message(self, skipped: Collection[str] = ()) -> str | None:
        """The summary's line (None where every test fits and ran): the tests that ran (the plan's, less
        ``skipped``, those the :class:`Guard` skipped while running), then those left out, and why."""
        if not self.left and not self.too_long and not skipped:
            return None
        ran = [n for n in self.run if n not in skipped]
        parts = [f"--mig-window {_short(self.window_s)}: {len(ran)} test(s) run (about "
                 f"{_short(sum(self.seconds.get(n, 0.0) for n in ran))} by their last times)"]
        if skipped:
            parts.append(f"{len(skipped)} skipped while running, since each would have ended outside the window; "
                         "the next night runs them first: " + ", ".join(_name(n) for n in skipped))
        rotated = [n for n in self.left if n not in self.too_long]
        if rotated:
            parts.append(f"{len(rotated)} left for the next night, which runs them first: "
                         + ", ".join(_name(n) for n in rotated))
        if self.too_long:
            parts.append(f"{len(self.too_long)} never fit (each took longer than the whole window; run them "
                         "outside it or widen it): " + ", ".join(f"{_name(n)} ({_short(self.seconds[n])})"
                                                            for n in self.too_long))
        return "; ".join(parts)

    def to_meta(self, skipped: Iterable[str] = ()) -> dict[str, Any]:
        """The results file's ``window`` block: what the window left out (planned or skipped while running)."""
        return {"seconds": self.window_s, "left": sorted(set(self.left) | set(skipped))}


def plan(nodeids: list[str], window_s: float, seconds: dict[str, float], when: dict[str, float]) -> Plan:
    """The tests of ``nodeids`` (the suite's order) that fit ``window_s``, stalest first.  ValueError with
    one sentence where none fits."""
    known = [seconds[n] for n in nodeids if n in seconds]
    median = statistics.median(known) if known else 0.0
    counted = {n: seconds.get(n, median) for n in nodeids}
    order = sorted(range(len(nodeids)), key=lambda i: (when.get(nodeids[i], -math.inf), i))
    chosen: set[str] = set()
    left: list[str] = []
    too_long: list[str] = []
    total = 0.0
    for i in order:
        n = nodeids[i]
        if counted[n] > window_s:
            too_long.append(n)
            left.append(n)
        elif total + counted[n] <= window_s:
            chosen.add(n)
            total += counted[n]
        else:
            left.append(n)
    if nodeids and not chosen:
        shortest = min(counted.values())
        raise ValueError(f"--mig-window {_short(window_s)} holds none of the {len(nodeids)} test(s): the shortest took "
                         f"{_short(shortest)} the last time it ran")
    return Plan(window_s, [n for n in nodeids if n in chosen], left, too_long, counted,
                [n for n in nodeids if n in chosen and n not in seconds])


@dataclass
class Guard:
    """While the night runs: the reason to skip a test that would no longer end inside the window."""

    plan: Plan
    started: float = field(default_factory=time.monotonic)
    skipped: list[str] = field(default_factory=list)

    def message(self) -> str | None:
        """The summary's line at the end of the night (:meth:`Plan.message` with what was skipped)."""
        return self.plan.message(self.skipped)

    def reason(self, nodeid: str, now: float | None = None) -> str | None:
        if nodeid not in self.plan.seconds:
            return None  # not a benchmark the plan counted (a scaling check, a unit test)
        now = time.monotonic() if now is None else now
        spent, need = now - self.started, self.plan.seconds[nodeid]
        if spent + need <= self.plan.window_s:
            return None
        self.skipped.append(nodeid)
        return (f"--mig-window {_short(self.plan.window_s)}: {_short(spent)} spent and this test took "
                f"{_short(need)} the last time, so it would end outside the window; the next night runs it first")


def _name(nodeid: str) -> str:
    return nodeid.split("::")[-1]


__all__ = ["Guard", "Plan", "merge_meta", "parse_window", "plan", "window_arg"]
