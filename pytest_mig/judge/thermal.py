"""Energy at the run's temperature: a history brought to the temperature this run's energy was read at.

A board's power at a given load is dynamic power plus leakage, and leakage rises with the die's
temperature.  So an energy figure (kind ``"energy"``: J/TFLOP, J/GB, J/particle-turn, J/token) reads
higher on a warm night than on a cool one with nothing changed: a night that starts on a GPU just off
a user's job.  On an H100 whose night started 7-8 degC warmer, STREAM's and the CUDA-core FMA's energy
read 2.2-5.2% higher with every rate unchanged (docs/detection.md, "Energy").  The model is linear in
the temperature on a log scale::

    ln(value) = a_board + s * T

with one intercept per board (boards differ by a few percent) and one slope ``s`` per figure, fitted
within each board's runs of the reference of its GPU model and profile (:func:`pooled_slope`, as
:func:`pytest_mig.judge.reference.pooled_sigma` pools each board's spread about its own median).  A
slope is used only where it is positive (leakage never lowers energy), clearly measured (``MIN_T``
standard errors above zero) and of the size leakage has (at most ``MAX_PER_DEGREE``):
:func:`significant`; and then at its lower bound, ``CAUTION`` standard errors below the fit
(:attr:`Slope.cautious`).  Too steep a slope would turn a cool, unchanged night into a regression
and hide a real loss on a warm one; one too shallow only leaves part of the temperature in, as a
history judged as read leaves all of it.  A board's own slope is not the pool's, though (eight
archived H100s' STREAM ran +0.16 to +0.65%/°C, the pool +0.35 ± 0.02), so no run is moved by more
than half the figure's threshold (at most ``MAX_BROUGHT``): a slope wrong for the board can neither
raise a false alarm alone nor hide more than half the threshold of a loss, nor more than leaves a
5% loss beyond what the figure says it detects (:func:`cap_for`).
Nor is a run brought from or to a temperature outside those
the reference's runs read (``MARGIN_C`` either side): a sensor's glitch, or a GPU far hotter or cooler
than the reference's, is judged as read.  Within them a run may still be brought further than any one
board of the reference moved (each board's nights spanned a few degrees): the line is assumed to hold
across the range its boards read together.

A figure's history is then compared at this run's temperature: each run's value brought from the
temperature it read to this run's (:func:`at_run_temperature`), and the median of the values so
brought is the baseline.  Its sigma is not: the history's own spread and the priors stay as its runs
read, since the noise left after the temperature differs between boards more than the reference's
few boards show.  A re-measurement, which reads warmer, is brought back to the first's, or, where its
temperature is unknown or not covered, judged as it read
(:meth:`pytest_mig.judge.pipeline.Pipeline._at_first_temperature`).  Where the record, a run of the
history or the reference lacks a temperature, the figure is judged as it read.  Pure functions: no
files, no pytest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_mig.measure.clocks import temperature_of

#: Residual degrees of freedom (points - boards - 1) a pooled slope needs before it is fitted at all.
MIN_SLOPE_DOF = 6
#: Standard errors a slope must stand above zero to be used.
MIN_T = 3.0
#: The steepest slope taken for leakage (2% per degC); a steeper one is something else.
MAX_PER_DEGREE = 0.02
#: Standard errors below its fit a slope is used at (a third of it at the least, as ``MIN_T`` is 3).
CAUTION = 2.0
#: Degrees C beyond the temperatures a slope was fitted over that a run may read and still be brought.
MARGIN_C = 5.0
#: The least slope used (0.01%/°C: less moves a run under 0.2% over 20 °C): a flatter one brings nothing.
MIN_USED = 0.0001
#: The most a run's value is moved when brought (2%); never more than half the figure's threshold either.
MAX_BROUGHT = 0.02
#: Degrees C beyond the temperatures its history's runs read that an energy figure still gates at: a
#: board as steep as the steepest measured (H200 FMA +0.47%/°C; H100 FMA +0.9%/°C, whose thresholds
#: are 6% and more) moves 1.9% over it, under half the tightest energy threshold (about 4%).  Further
#: away it is reported, not gated (:func:`beyond_history`).
GATES_WITHIN_C = 4.0


@dataclass(frozen=True)
class Slope:
    """The relative change of an energy figure per degC, its standard error, the residual degrees of
    freedom it was fitted with and the temperatures it was fitted over."""

    per_degree: float
    se: float
    dof: int
    low_c: float = -math.inf
    high_c: float = math.inf

    @property
    def cautious(self) -> float:
        """The slope used: ``CAUTION`` standard errors below the fit, never below zero."""
        return max(self.per_degree - CAUTION * self.se, 0.0)

    def covers(self, temperature: float) -> bool:
        """Whether ``temperature`` lies within the temperatures the slope was fitted over, ``MARGIN_C`` either side."""
        return self.low_c - MARGIN_C <= temperature <= self.high_c + MARGIN_C


def pooled_slope(groups: Iterable[Sequence[tuple[float, float]]]) -> Slope | None:
    """The common slope of ln(value) on the temperature over ``groups`` (each one board's runs as
    (temperature, value) pairs), each group about its own means.  Points with a non-finite temperature
    or a non-finite or non-positive value are left out, and groups left with fewer than 2 points.
    None with fewer than ``MIN_SLOPE_DOF`` residual degrees of freedom or no spread in temperature."""
    centred: list[tuple[float, float]] = []
    temps: list[float] = []
    points = used = 0
    for group in groups:
        pts = [(float(t), math.log(v)) for t, v in group if math.isfinite(t) and math.isfinite(v) and v > 0]
        if len(pts) < 2:
            continue
        mean_t = math.fsum(t for t, _ in pts) / len(pts)
        mean_y = math.fsum(y for _, y in pts) / len(pts)
        centred.extend((t - mean_t, y - mean_y) for t, y in pts)
        temps.extend(t for t, _ in pts)
        points += len(pts)
        used += 1
    dof = points - used - 1
    if dof < MIN_SLOPE_DOF:
        return None
    sxx = math.fsum(t * t for t, _ in centred)
    if not (sxx > 0 and math.isfinite(sxx)):
        return None
    slope = math.fsum(t * y for t, y in centred) / sxx
    rss = math.fsum((y - slope * t) ** 2 for t, y in centred)
    return Slope(slope, math.sqrt(rss / dof / sxx), dof, min(temps), max(temps))


def significant(slope: Slope | None) -> bool:
    """Whether ``slope`` is one to compare with: positive, at least ``MIN_T`` standard errors above
    zero, and no steeper than ``MAX_PER_DEGREE``."""
    if slope is None or not (math.isfinite(slope.per_degree) and math.isfinite(slope.se)):
        return False
    return 0 < slope.per_degree <= MAX_PER_DEGREE and slope.per_degree >= MIN_T * slope.se


def slope_of(runs_by_board: Mapping[str, Sequence[tuple[float | None, float]]]) -> Slope | None:
    """The :func:`significant` slope of a figure whose runs are given by board as (temperature, value)
    pairs (runs without a temperature are left out), else None."""
    slope = pooled_slope([[(t, v) for t, v in runs if t is not None] for runs in runs_by_board.values()])
    return slope if significant(slope) else None


@dataclass(frozen=True)
class AtRunTemperature:
    """A history brought to this run's temperature: ``values`` (in the history's order), from runs
    that read ``history_c`` (their median temperature), to ``run_c``, at ``per_degree`` (the slope's
    :attr:`~Slope.cautious` value)."""

    values: list[float]
    history_c: float
    run_c: float
    per_degree: float
    capped: float | None = None  # the most a run was moved, where that held one back (relative)

    def text(self) -> str:
        """'at this run's 52 °C: its runs (median 41 °C) brought to it at +0.45%/°C (leakage)', and
        ', none moved more than 1.4%' where that held a run back."""
        runs = f"its run ({self.history_c:.0f} °C)" if len(self.values) == 1 else \
            f"its runs (median {self.history_c:.0f} °C)"
        held = f", none moved more than {100 * self.capped:.1f}%" if self.capped is not None else ""
        return (f"at this run's {self.run_c:.0f} °C: {runs} brought to it at +{100 * self.per_degree:.2f}%/°C "
                f"(leakage){held}")


@dataclass(frozen=True)
class BeyondHistory:
    """An energy figure read at ``run_c``, more than ``GATES_WITHIN_C`` outside the ``low_c``-``high_c``
    its history's runs read."""

    run_c: float
    low_c: float
    high_c: float

    @property
    def by(self) -> float:
        """How far outside (degC): positive warmer than the warmest run, negative cooler than the coolest."""
        return self.run_c - self.high_c if self.run_c > self.high_c else self.run_c - self.low_c

    def text(self) -> str:
        """'its runs read 44-49 °C, this run 61 °C'."""
        read = f"{self.low_c:.0f} °C" if round(self.low_c) == round(self.high_c) else \
            f"{self.low_c:.0f}-{self.high_c:.0f} °C"
        return f"its runs read {read}, this run {self.run_c:.0f} °C"


def beyond_history(info: Mapping[str, object], temperatures: Iterable[float | None]) -> BeyondHistory | None:
    """Where the record whose info is ``info`` read a temperature more than ``GATES_WITHIN_C`` outside
    the range its history's runs read (``temperatures``; those unknown left out), how far; else None,
    as where the record or every run read none.  A night that starts on a GPU just off a user's job,
    or one whose cooling changed: the history's spread holds the temperatures its runs read, and a
    board's own leakage slope is not known well enough to bring a run further."""
    run_c = temperature_of(info)
    known = [t for read in temperatures if (t := temperature_of({"temperature_c": read})) is not None]
    if run_c is None or not known:
        return None
    low, high = min(known), max(known)
    if low - GATES_WITHIN_C <= run_c <= high + GATES_WITHIN_C:
        return None
    return BeyondHistory(run_c, low, high)


def cap_for(threshold: float, detectable: float, limit: float) -> float:
    """The most a figure's run may be moved when brought (relative): half its ``threshold``, so that a
    slope wrong for the board never raises a false alarm alone, and no more than leaves a loss of
    ``limit`` (the tolerance) beyond what it ``detectable`` says it catches; ``MAX_BROUGHT`` at most."""
    cap = min(threshold / 2, limit - detectable, MAX_BROUGHT)
    return cap if math.isfinite(cap) and cap > 0 else 0.0


def at_run_temperature(info: Mapping[str, object], runs: Sequence[tuple[float, float | None]],
                       slope: Slope | None, cap: float = MAX_BROUGHT) -> AtRunTemperature | None:
    """The history ``runs`` ((value, temperature) pairs) of an energy figure whose record's info is
    ``info``, brought to the temperature the record read, with ``slope``.  None where the slope is not
    :func:`significant` or its :attr:`~Slope.cautious` value is under ``MIN_USED``, there is no run,
    or the record or a run read no temperature or one the slope does not cover (:meth:`Slope.covers`):
    then the figure is judged as it read, as it is where ``cap`` is none.  No run is moved by more
    than ``cap`` (relative: :func:`cap_for`; at most ``MAX_BROUGHT``)."""
    if slope is None or not significant(slope) or not slope.cautious >= MIN_USED or not (cap > 0) or not runs or \
            any(not (math.isfinite(v) and v > 0) for v, _ in runs):
        return None
    run_c = temperature_of(info)
    temps = [t for _, read in runs if (t := temperature_of({"temperature_c": read})) is not None and slope.covers(t)]
    if run_c is None or len(temps) != len(runs) or not slope.covers(run_c):
        return None
    per_degree, limit = slope.cautious, min(cap, MAX_BROUGHT)
    most = math.log1p(limit)
    moves = [per_degree * (run_c - t) for t in temps]
    values = [v * math.exp(min(max(move, -most), most)) for (v, _), move in zip(runs, moves)]
    capped = limit if any(abs(m) > most for m in moves) else None
    return AtRunTemperature(values, float(statistics.median(temps)), run_c, per_degree, capped)


__all__ = ["CAUTION", "GATES_WITHIN_C", "MARGIN_C", "MAX_BROUGHT", "MAX_PER_DEGREE", "MIN_SLOPE_DOF", "MIN_T",
           "MIN_USED", "AtRunTemperature", "BeyondHistory", "Slope",
           "at_run_temperature", "beyond_history", "cap_for", "pooled_slope", "significant", "slope_of"]
