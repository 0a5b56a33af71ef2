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
history or the reference lacks a temperature, the figure is judged as it read.

What a board steeper than the slope used may still owe its temperature widens the band instead
(:func:`warmth`): a board is taken to be up to ``BOARDS`` times the pooled slope (``STEEPEST`` at
most, and where none was fitted); on a warmer night what that moves over the distance from the
median temperature of the history's runs (``MAX_WARMTH_C`` at most), less what the history was
brought and half the threshold (the rest holds the noise), is added to the threshold and to the
smallest change it detects; on a cooler night, what it may hide of a loss is added to what it
detects.  A night that starts on a GPU just off a user's job then passes, a loss larger than the
warmth explains still fails, and the verdict says how far it was widened.  A re-measurement is
judged as a first reading at its own temperature would be.  Pure functions: no
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
#: How much steeper than the pooled slope a board's own may be: on the archived boards their own
#: slopes ran 0.45 to 1.9 times it (H100 STREAM J/GB +0.16 to +0.65%/°C against +0.35).
BOARDS = 2.0
#: The steepest leakage a board is taken to have (1%/°C; the steepest measured: an H100's FMA energy,
#: +0.90 ± 0.29%/°C), and that of a figure with no slope known.
STEEPEST = 0.01
#: The farthest from its history's temperature a reading is counted as (degC): further is no night a
#: GPU's nightly reads (a sensor's glitch, a failed fan), and widening on would let any loss pass.
MAX_WARMTH_C = 20.0


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
    """The :func:`pooled_slope` of a figure whose runs are given by board as (temperature, value) pairs
    (runs without a temperature are left out), else None.  It brings a history only where it is
    :func:`significant`; any fit bounds how steep a board may be (:func:`steepest_for`)."""
    return pooled_slope([[(t, v) for t, v in runs if t is not None] for runs in runs_by_board.values()])


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


def steepest_for(slope: Slope | None) -> float:
    """The steepest leakage a board of this figure is taken to have (relative per degC): ``BOARDS`` times
    its pooled slope, or times the slope's upper bound (``CAUTION`` standard errors above the fit)
    where it is not :func:`significant` (a figure whose energy hardly follows the temperature, as
    GEMM's, which sets its own, gets little); at most ``STEEPEST``, and that where none was fitted."""
    if slope is None or not (math.isfinite(slope.per_degree) and math.isfinite(slope.se)):
        return STEEPEST
    fit = slope.per_degree if significant(slope) else slope.per_degree + CAUTION * slope.se
    return min(STEEPEST, BOARDS * max(fit, 0.0))


@dataclass(frozen=True)
class Warmth:
    """An energy figure read at ``run_c``, away from the ``history_c`` its history's runs read (their
    median), further than its band (``threshold``) and the history brought to it hold for a board of
    the ``steepest`` leakage.  Warmer: its threshold, and the smallest change it detects, widened by
    ``widen`` (relative).  Cooler: what leakage may hide of a loss, ``hidden``, added to what it detects."""

    run_c: float
    history_c: float
    steepest: float
    threshold: float
    widen: float
    hidden: float

    def text(self) -> str:
        """'read 12 °C warmer than its runs (median 41 °C): its 2.9% threshold widened by 6.9% for
        leakage (up to 0.70%/°C)', or for a cooler reading what it detects the less."""
        side = "warmer" if self.run_c > self.history_c else "cooler"
        far = abs(self.run_c - self.history_c)
        counted = f", counted as {MAX_WARMTH_C:g} °C" if far > MAX_WARMTH_C else ""
        head = f"read {far:.0f} °C {side} than its runs (median {self.history_c:.0f} °C{counted}): "
        up_to = f"(up to {100 * self.steepest:.2f}%/°C)"
        if self.widen > 0:
            return head + f"its {100 * self.threshold:.1f}% threshold widened by {100 * self.widen:.1f}% for leakage {up_to}"
        return head + f"leakage {up_to} may hide {100 * self.hidden:.1f}% of a loss, which it detects the less"


def history_temperature(temperatures: Sequence[float | None]) -> float | None:
    """The median temperature of a history's runs (``temperatures``, one each), where at least half of
    them read one (those that did not left out); else None."""
    known = [t for read in temperatures if (t := temperature_of({"temperature_c": read})) is not None]
    return float(statistics.median(known)) if known and 2 * len(known) >= len(temperatures) else None


def _counted(run_c: float | None, history_c: float | None) -> float | None:
    """How far ``run_c`` read from ``history_c`` (degC, warmer positive), at most ``MAX_WARMTH_C``."""
    if run_c is None or history_c is None:
        return None
    return max(min(run_c - history_c, MAX_WARMTH_C), -MAX_WARMTH_C)


def widening(run_c: float | None, history_c: float | None, slope: Slope | None, brought: float,
             threshold: float) -> float:
    """How far a band of ``threshold`` widens for a run read at ``run_c``, warmer than its history's
    runs (their median ``history_c``), which were ``brought`` (relative) toward it: what a board of the
    :func:`steepest_for` leakage moves over that distance (``MAX_WARMTH_C`` at most), less what was
    brought and half the threshold (the rest holds the noise); 0 where it read no warmer, or a
    temperature is unknown.  A cooler reading raises no false alarm: :func:`hidden` says what it hides."""
    d = _counted(run_c, history_c)
    if d is None or not (math.isfinite(threshold) and math.isfinite(brought)):
        return 0.0
    return max(0.0, steepest_for(slope) * d - abs(brought) - threshold / 2)


def hidden(run_c: float | None, history_c: float | None, slope: Slope | None, brought: float) -> float:
    """What a run read at ``run_c``, cooler than its history's runs (their median ``history_c``), which
    were ``brought`` toward it, may hide of a loss: what a board of the :func:`steepest_for` leakage
    moves over that distance (``MAX_WARMTH_C`` at most), less what was brought; 0 where it read no
    cooler or a temperature is unknown."""
    d = _counted(run_c, history_c)
    if d is None or not math.isfinite(brought):
        return 0.0
    return max(0.0, steepest_for(slope) * -d - abs(brought))


def warmth(info: Mapping[str, object], temperatures: Sequence[float | None], threshold: float, brought: float,
           slope: Slope | None) -> Warmth | None:
    """The :func:`widening` of the band (``threshold``) of the record whose info is ``info``, whose
    history's runs read ``temperatures`` (:func:`history_temperature`) and were ``brought`` toward its
    temperature, or what it :func:`hidden` reading cooler; None where neither is anything, or the
    record or most runs read no temperature.  A night that starts on a GPU just off a user's job, or
    whose cooling changed, then passes, a loss larger than the warmth explains still fails, and a cool
    night claims no loss that its leakage may hide."""
    run_c, history_c = temperature_of(info), history_temperature(temperatures)
    widen = widening(run_c, history_c, slope, brought, threshold)
    hides = hidden(run_c, history_c, slope, brought)
    if run_c is None or history_c is None or not (widen > 0 or hides > 0):
        return None
    return Warmth(run_c, history_c, steepest_for(slope), threshold, widen, hides)


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


__all__ = ["BOARDS", "CAUTION", "MARGIN_C", "MAX_BROUGHT", "MAX_PER_DEGREE", "MAX_WARMTH_C", "MIN_SLOPE_DOF", "MIN_T",
           "MIN_USED", "STEEPEST", "AtRunTemperature", "Slope", "Warmth",
           "at_run_temperature", "cap_for", "hidden", "history_temperature", "pooled_slope",
           "significant", "slope_of", "steepest_for", "warmth", "widening"]
