"""Energy at the run's temperature: a history brought to the temperature this run's energy was read at.

A board's power at a given load is dynamic power plus leakage, and leakage rises with the die's
temperature.  So an energy figure (kind ``"energy"``: J/TFLOP, J/GB, J/particle-turn, J/token) reads
higher on a warm night than on a cool one with nothing changed: a night that starts on a GPU just off
a user's job.  On an H100 whose night started 8 degC warmer, STREAM's and the CUDA-core FMA's energy
read 3.5-5.2% higher with every rate unchanged (docs/detection.md, "Energy").  The model is linear in
the temperature on a log scale::

    ln(value) = a_board + s * T

with one intercept per board (boards differ by a few percent) and one slope ``s`` per figure, fitted
within each board's runs of the reference of its GPU model and profile (:func:`pooled_slope`, as
:func:`pytest_mig.judge.reference.pooled_sigma` pools each board's spread about its own median).  A
slope is used only where it is positive (leakage never lowers energy), clearly measured (``MIN_T``
standard errors above zero) and of the size leakage has (at most ``MAX_PER_DEGREE``):
:func:`significant`.

A figure's history is then compared at this run's temperature: each run's value brought from the
temperature it read to this run's (:func:`at_run_temperature`); the median and the history's own
sigma are taken from the values so brought.  The priors are not: a short history is judged with the
reference's sigma as its runs read, since the noise left after the temperature differs between boards
more than the reference's few boards show.  Where the record, a run of the history or the reference
lacks a temperature, the figure is judged as it read.  Pure functions: no files, no pytest.
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


@dataclass(frozen=True)
class Slope:
    """The relative change of an energy figure per degC, its standard error and the residual degrees
    of freedom it was fitted with."""

    per_degree: float
    se: float
    dof: int


def pooled_slope(groups: Iterable[Sequence[tuple[float, float]]]) -> Slope | None:
    """The common slope of ln(value) on the temperature over ``groups`` (each one board's runs as
    (temperature, value) pairs), each group about its own means.  Points with a non-finite temperature
    or a non-finite or non-positive value are left out, and groups left with fewer than 2 points.
    None with fewer than ``MIN_SLOPE_DOF`` residual degrees of freedom or no spread in temperature."""
    centred: list[tuple[float, float]] = []
    points = used = 0
    for group in groups:
        pts = [(float(t), math.log(v)) for t, v in group if math.isfinite(t) and math.isfinite(v) and v > 0]
        if len(pts) < 2:
            continue
        mean_t = math.fsum(t for t, _ in pts) / len(pts)
        mean_y = math.fsum(y for _, y in pts) / len(pts)
        centred.extend((t - mean_t, y - mean_y) for t, y in pts)
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
    return Slope(slope, math.sqrt(rss / dof / sxx), dof)


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
    that read ``history_c`` (their median temperature), to ``run_c``, at ``per_degree``."""

    values: list[float]
    history_c: float
    run_c: float
    per_degree: float

    def text(self) -> str:
        """'at this run's 52 °C: its runs (median 41 °C) brought to it at +0.45%/°C (leakage)'."""
        runs = f"its run ({self.history_c:.0f} °C)" if len(self.values) == 1 else \
            f"its runs (median {self.history_c:.0f} °C)"
        return f"at this run's {self.run_c:.0f} °C: {runs} brought to it at +{100 * self.per_degree:.2f}%/°C (leakage)"


def at_run_temperature(info: Mapping[str, object], runs: Sequence[tuple[float, float | None]],
                       slope: Slope | None) -> AtRunTemperature | None:
    """The history ``runs`` ((value, temperature) pairs) of an energy figure whose record's info is
    ``info``, brought to the temperature the record read, with ``slope``.  None where the slope is not
    :func:`significant`, the record or a run read no temperature, or there is no run: then the figure
    is judged as it read."""
    if not significant(slope) or not runs:
        return None
    run_c = temperature_of(info)
    temps = [temperature_of({"temperature_c": t}) for _, t in runs]
    if run_c is None or any(t is None for t in temps):
        return None
    per_degree = slope.per_degree  # type: ignore[union-attr]
    values = [v * math.exp(per_degree * (run_c - t)) for (v, _), t in zip(runs, temps)]  # type: ignore[operator]
    return AtRunTemperature(values, float(statistics.median(temps)), run_c, per_degree)  # type: ignore[arg-type]


__all__ = ["MAX_PER_DEGREE", "MIN_SLOPE_DOF", "MIN_T", "AtRunTemperature", "Slope", "at_run_temperature",
           "pooled_slope", "significant", "slope_of"]
