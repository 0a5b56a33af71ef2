"""A layout run's figures (``--mig-layout``), read from its workers' records: client, provider,
isolation, each against the whole GPU where the run measured it, and the plot of the paper.

Every record of a layout's worker carries its ``layout``, ``layout_phase`` (``alone``: the slice with
its neighbours idle; ``together``: every slice at once) and ``layout_slot`` (:class:`pytest_mig.device.layout.SlotTag`).

- **client**: each slice's own figure with its neighbours busy (the worker's records, judged by the
  worker against the history of that slice in that layout).
- **provider** (Columbia/IBM): the work per second of every slice together, and energy per unit of work:
  the board's power (counted once) over the total work per second; each also as a ratio to the
  whole GPU's, the layout of one slice of the most compute slices (``7g``) in the same run.
- **isolation**: each slice's figure with its neighbours busy as a percentage of the same slice alone
  (under emulation, of an alone run of its profile: MPS clients of one profile are alike).

:func:`derived_records` turns them into records with a Metric each, which the runner judges against
their history like any figure, so a driver that weakens isolation or the provider gain is caught.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Sequence

from pytest_mig.device.layout import parse_layouts
from pytest_mig.device.profiles import ProfileError, parse_profile
from pytest_mig.judge.verdict import format_number
from pytest_mig.measure import ENERGY_INFIX, RATE_KINDS, Metric
from pytest_mig.store.results import ResultRecord


class LayoutPlotError(Exception):
    """The layout plot cannot be drawn; the message says why in one sentence."""


@dataclass
class SliceFigure:
    slot: int
    profile: str
    together: float
    alone: float | None = None

    @property
    def isolation_pct(self) -> float | None:
        return 100.0 * self.together / self.alone if self.alone else None


@dataclass
class LayoutFigure:
    """One rate figure of one test on one layout."""

    layout: str
    gpu: str
    emulated: bool
    test: str
    metric: str
    unit: str
    mode: str
    slices: list[SliceFigure] = field(default_factory=list)
    energy: float | None = None  # J per unit of work of the board, all slices together
    energy_metric: str | None = None
    whole: "LayoutFigure | None" = None

    @property
    def total(self) -> float:
        return sum(s.together for s in self.slices)

    @cached_property
    def expected(self) -> int:
        """The layout's slices (from its name): how many must give the figure for a provider total."""
        try:
            return sum(len(items) for _, items in parse_layouts(self.layout))
        except ProfileError:
            return len(self.slices)

    @property
    def complete(self) -> bool:
        """Whether every slice gave the figure: a provider total of fewer is not the layout's."""
        return len(self.slices) >= self.expected

    @property
    def is_whole(self) -> bool:
        return len(self.slices) == 1 and _slices(self.slices[0].profile) == 7

    @property
    def vs_whole(self) -> float | None:
        return self.total / self.whole.total if self.whole is not None and self.whole.total else None

    @property
    def energy_vs_whole(self) -> float | None:
        w = self.whole.energy if self.whole is not None else None
        return self.energy / w if self.energy and w else None


def _slices(profile: str) -> int | None:
    try:
        return parse_profile(profile).gpu_slices
    except ProfileError:
        return None


def _is_rate(m: Metric) -> bool:
    return m.kind in RATE_KINDS and m.direction == "higher" and m.compare and "cycle" not in m.unit \
        and m.unit != "fraction"


def layout_figures(records: Sequence[ResultRecord]) -> list[LayoutFigure]:
    """The figures of every layout and rate metric in ``records`` (a layout run's merged records)."""
    by: dict[tuple[str, str, str, str], dict[str, list[ResultRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        layout, phase = r.target.extra.get("layout"), r.target.extra.get("layout_phase")
        if layout and phase and r.metric.value > 0:
            by[(str(layout), r.test, r.mode, str(r.target.gpu_name))][str(phase)].append(r)
    out = []
    for (layout, test, mode, gpu), phases in sorted(by.items()):
        together = phases.get("together", [])
        for rec in together:
            if not _is_rate(rec.metric) or any(f.layout == layout and f.test == test and f.metric == rec.metric.name
                                               and f.mode == mode for f in out):
                continue
            fig = LayoutFigure(layout, gpu, rec.target.is_emulated, test, rec.metric.name, rec.metric.unit, mode)
            for t in sorted((x for x in together if x.metric.name == rec.metric.name), key=_slot):
                fig.slices.append(SliceFigure(_slot(t), str(t.target.profile), t.metric.value,
                                              _alone(t, phases.get("alone", []))))
            fig.energy, fig.energy_metric = _energy(rec.metric.name, together)
            out.append(fig)
    for f in out:
        f.whole = next((w for w in out if w.is_whole and (w.gpu, w.test, w.metric, w.mode, w.emulated)
                        == (f.gpu, f.test, f.metric, f.mode, f.emulated)), None)
    return out


def _slot(r: ResultRecord) -> int:
    return int(r.target.extra.get("layout_slot", 0))


def _alone(t: ResultRecord, alone: Sequence[ResultRecord]) -> float | None:
    same = [a for a in alone if a.metric.name == t.metric.name]
    mine = next((a for a in same if _slot(a) == _slot(t)), None)
    if mine is None and t.target.is_emulated:
        mine = next((a for a in same if a.target.profile == t.target.profile), None)
    return mine.metric.value if mine is not None else None


def _energy(rate_metric: str, together: Sequence[ResultRecord]) -> tuple[float | None, str | None]:
    """J per unit of work of the board: its power (the median of the slices' readings of it) over the
    slices' work per second, each slice's rate taken from its own energy and power figures."""
    for r in together:
        name = r.metric.name
        if r.metric.kind != "energy" or ENERGY_INFIX not in name:
            continue
        power_name = name.split(ENERGY_INFIX)[0] + "power_w"
        slots = {_slot(x): x for x in together if x.metric.name == name}
        powers = {_slot(x): x.metric.value for x in together if x.metric.name == power_name}
        rates = {_slot(x) for x in together if x.metric.name == rate_metric}
        if not slots or set(slots) != set(powers) or set(slots) != rates:
            continue
        work = sum(powers[s] / slots[s].metric.value for s in slots)
        return statistics.median(powers.values()) / work, name
    return None, None


def derived_records(figures: Sequence[LayoutFigure], records: Sequence[ResultRecord]) -> list[ResultRecord]:
    """Provider and isolation figures as records of their own, one history per layout (``layout-<name>``)."""
    out = []
    for f in figures:
        base = next(r for r in records if r.test == f.test and r.metric.name == f.metric
                    and r.target.extra.get("layout") == f.layout and r.target.extra.get("layout_phase") == "together")
        target = replace(base.target, profile=f.layout, baseline_profile=f"layout-{f.layout}", uuid=base.target.gpu_uuid,
                         sms=None, sms_obtained=None, memory_bytes=None,
                         extra={k: v for k, v in base.target.extra.items() if k not in ("layout_slot", "layout_phase")})
        metrics = _provider_metrics(f, base.metric.kind) if f.complete else []  # a slice that gave none: no total
        for s in f.slices:
            if s.isolation_pct is not None and f.expected > 1:
                metrics.append(Metric(f"{f.metric}_isolation_slot{s.slot}", s.isolation_pct, "% of alone", "higher",
                                      [s.isolation_pct], kind=base.metric.kind, info={"profile": s.profile}))
        out += [ResultRecord(f.test, m, target, dict(base.fingerprint), mode=f.mode) for m in metrics]
    return out


def _provider_metrics(f: LayoutFigure, kind: str) -> list[Metric]:
    """The provider figures of a layout every slice of which gave ``f``: its total work per second and
    the board's energy per unit of work, each also against the whole GPU's."""
    out = [Metric(f"{f.metric}_provider", f.total, f.unit, "higher", [f.total], kind=kind)]
    if f.vs_whole is not None and not f.is_whole:
        out.append(Metric(f"{f.metric}_provider_vs_whole", f.vs_whole, "x whole GPU", "higher", [f.vs_whole], kind=kind))
    if f.energy is not None and f.energy_metric:
        out.append(Metric(f"{f.energy_metric}_provider", f.energy, _energy_unit(f.unit), "lower", [f.energy],
                          kind="energy"))
        if f.energy_vs_whole is not None and not f.is_whole:
            out.append(Metric(f"{f.energy_metric}_provider_vs_whole", f.energy_vs_whole, "x whole GPU", "lower",
                              [f.energy_vs_whole], kind="energy"))
    return out


def _energy_unit(rate_unit: str) -> str:
    return "J/" + (rate_unit.split("/")[0] if "/" in rate_unit else "unit")


def layout_lines(figures: Sequence[LayoutFigure]) -> list[str]:
    """One line per layout and figure: provider, against the whole GPU, energy, each slice's client figure
    and isolation."""
    out = []
    for f in figures:
        vs = f" = {f.vs_whole:.2f}x the whole GPU" if f.vs_whole is not None and not f.is_whole else ""
        energy = ""
        if f.energy is not None:
            against = f" = {f.energy_vs_whole:.2f}x the whole GPU's" if f.energy_vs_whole and not f.is_whole else ""
            energy = f"; {format_number(f.energy)} {_energy_unit(f.unit)}{against}"
        each = ", ".join(f"{s.profile} {format_number(s.together)}"
                         + (f" ({s.isolation_pct:.1f}% of alone)" if s.isolation_pct is not None and f.expected > 1
                            else "") for s in f.slices)
        tag = " (emulated: MPS shares memory bandwidth and L2, MIG does not)" if f.emulated else ""
        if not f.complete:
            out.append(f"{f.layout}{tag}: {f.test.split('::')[-1]} {f.metric}: only {len(f.slices)} of the "
                       f"{f.expected} slices gave it, so no provider figure; slices: {each}")
            continue
        out.append(f"{f.layout}{' (whole GPU)' if f.is_whole else ''}{tag}: {f.test.split('::')[-1]} {f.metric} "
                   f"{format_number(f.total)} {f.unit} together{vs}{energy}; slices: {each}")
    return out


def plot_layouts(figures: Sequence[LayoutFigure], path: Path | str) -> Path:
    """Energy per unit of work against time per unit of work, one point per layout, the whole GPU
    marked, one panel per test and figure (Columbia/IBM's plot).  Needs matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise LayoutPlotError("plotting needs matplotlib, which is not installed: pip install 'pytest-mig[plot]'") \
            from None
    panels: dict[tuple[str, str, str], list[LayoutFigure]] = defaultdict(list)
    for f in figures:
        if f.energy is not None and f.complete:
            panels[(f.gpu, f.test, f.metric)].append(f)
    if not panels:
        raise LayoutPlotError("nothing to plot: no layout has both a work rate and an energy figure")
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(5 * ncols, 4 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    for i, ((gpu, test, metric), figs) in enumerate(sorted(panels.items())):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for f in figs:
            x, y = 1.0 / f.total, f.energy or 0.0
            ax.plot([x], [y], "*" if f.is_whole else "o", markersize=12 if f.is_whole else 7,
                    color="black" if f.is_whole else "tab:blue")
            ax.annotate(f.layout + (" (whole GPU)" if f.is_whole else ""), (x, y), textcoords="offset points",
                        xytext=(5, 4), fontsize=7)
        unit = f.unit.split("/")[0] if "/" in figs[0].unit else "unit"
        ax.set_xlabel(f"time per {unit} (s)")
        ax.set_ylabel(f"energy per {unit} (J)")
        ax.set_title(f"{test.split('::')[-1]} {metric}\n{gpu}" + (" (emulated)" if figs[0].emulated else ""), fontsize=9)
        ax.grid(True, alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


__all__ = ["LayoutFigure", "LayoutPlotError", "SliceFigure", "derived_records", "layout_figures", "layout_lines",
           "plot_layouts"]
