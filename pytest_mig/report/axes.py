"""The trend page's axes: "nice" value ticks (steps of 1, 2, 2.5 or 5 times a power of ten) and
time ticks (steps from a second to a year, on UTC boundaries), each with its label.

Plain functions of numbers, so they are tested without a page.  The page's script zooms the time
axis with the same step table (:data:`TIME_STEPS`, written into the script by ``report.trend``), so a
zoomed axis is labelled as the page was.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

MINUTE, HOUR, DAY = 60, 3600, 86400
#: Time-tick steps in seconds, smallest first; ticks fall on multiples of the step since the epoch (UTC).
TIME_STEPS = (1, 2, 5, 10, 15, 30, MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE,
              HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 3 * DAY, 7 * DAY, 14 * DAY, 28 * DAY, 56 * DAY,
              91 * DAY, 182 * DAY, 364 * DAY)
#: At most this many time ticks across a chart (a date label is about a sixth of the plot's width).
TIME_TICKS = 6


def nice_step(span: float, target: int = 5) -> float:
    """The smallest step of 1, 2, 2.5, 5 or 10 times a power of ten that cuts ``span`` into at most
    ``target`` parts."""
    if not span > 0 or not math.isfinite(span):
        raise ValueError(f"span must be a positive finite number, not {span!r}")
    raw = span / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))


def nice_ticks(lo: float, hi: float, target: int = 5) -> tuple[float, float, list[float]]:
    """The axis from ``lo`` to ``hi`` widened to whole steps: (its bottom, its top, the ticks).

    A zero span is widened around its value first (1% of it, or to 0..1 at zero); a bottom of zero or
    above stays at zero or above."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.01 or 1.0
        lo, hi = (lo - pad if lo - pad >= 0 or lo < 0 else 0.0), hi + pad
    step = nice_step(hi - lo, target)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    digits = max(0, 3 - math.floor(math.log10(step)))
    ticks = [round(k * step, digits) + 0.0 for k in range(first, last + 1)]
    return ticks[0], ticks[-1], ticks


def tick_label(value: float, step: float) -> str:
    """A value tick's label with as many decimals as its step needs (``2.5`` steps one more): ticks
    one step apart never read the same."""
    power = math.floor(math.log10(step) + 1e-9)
    decimals = max(0, -power + (1 if abs(step / 10.0 ** power - 2.5) < 1e-6 else 0))
    text = f"{value:.{decimals}f}"
    return "0" if float(text) == 0 else text


def parse_time(at: str) -> float | None:
    """An ISO 8601 time as seconds since the epoch (UTC when it names no zone); None if it is not one."""
    try:
        when = datetime.fromisoformat(at.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def time_step(span: float, target: int = TIME_TICKS) -> float:
    """The smallest step of :data:`TIME_STEPS` that cuts ``span`` seconds into at most ``target`` parts
    (beyond them, whole multiples of the largest)."""
    for step in TIME_STEPS:
        if span / step <= target:
            return float(step)
    return float(TIME_STEPS[-1] * math.ceil(span / (TIME_STEPS[-1] * target)))


def time_label(t: float, step: float) -> tuple[str, str]:
    """A time tick's two lines in UTC: the date, and the time of day where the step is under a day
    (with seconds where it is under a minute), so ticks of one day read apart."""
    when = datetime.fromtimestamp(t, timezone.utc)
    if step >= DAY:
        return when.strftime("%Y-%m-%d"), ""
    return when.strftime("%Y-%m-%d"), when.strftime("%H:%M:%S" if step < MINUTE else "%H:%M")


def time_ticks(t0: float, t1: float, target: int = TIME_TICKS) -> list[tuple[float, str, str]]:
    """The time ticks between ``t0`` and ``t1`` (seconds since the epoch): (time, date line, time line)."""
    if t1 <= t0:
        raise ValueError(f"the time axis must end after it starts ({t0!r} .. {t1!r})")
    step = time_step(t1 - t0, target)
    first = math.ceil(t0 / step) * step
    count = int(math.floor((t1 - first) / step + 1e-9)) + 1
    return [(first + k * step, *time_label(first + k * step, step)) for k in range(count)]


def time_domain(times: list[float]) -> tuple[float, float]:
    """The time axis around the runs: 3% of their span each side, an hour each side of a single time."""
    if not times:
        raise ValueError("no times to draw")
    lo, hi = min(times), max(times)
    pad = (hi - lo) * 0.03 if hi > lo else float(HOUR)
    return lo - pad, hi + pad


__all__ = ["TIME_STEPS", "TIME_TICKS", "nice_step", "nice_ticks", "parse_time", "tick_label", "time_domain", "time_label",
           "time_step", "time_ticks"]
