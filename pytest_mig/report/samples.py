"""How many samples a figure needs: its run-to-run CV as if only the first k samples had been measured.

A figure that is the median of its samples (OpenMM's chunks, STREAM's passes, a training case's
steps) could be measured over a shorter window.  Whether that costs detection is a question of
measured noise, not of taste.  The threshold a figure gates at grows with its run-to-run sigma
(:mod:`pytest_mig.judge.noise`), so a shorter window is free only where the median of the first k samples
varies from run to run no more than the median of all of them.  The samples are kept in the order
they were measured, so the first k of them are what a run of k samples would have measured, after
the same warm-up.

:func:`analyse` takes the records of repeated runs (a calibration's, or a reference's results
files), groups each figure by GPU model, profile, mode and case, recomputes each run's figure from
its first k samples, and pools the CV over the groups of one test and metric.  A shorter window
*keeps the threshold* where, resampling the runs, the ratio of its pooled CV to the full window's
stays at most :data:`KEEPS` with :data:`CONFIDENCE` (a ratio that came out low by chance in a few
runs does not shorten a window).  Figures
whose value is not the median of their samples, or with fewer than :data:`MIN_RUNS` runs in a group,
are left out: nothing is guessed.

Energy figures are read over a window of sustained work after each timing, and each records what the
window's first half alone gave (``first_half`` in its info).  :func:`energy_windows` pools those the
same way, with two "samples" per run: the first half and the whole window.  A halved window keeps
the threshold where its CV's ratio to the whole window's passes the same test.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

#: Shares of a figure's samples tried (the first k of n).
LADDER = (0.25, 0.5, 0.75, 1.0)
#: A shorter window keeps the threshold where the upper bound of its CV's ratio to the full window's
#: (:data:`CONFIDENCE`, resampling the runs) is at most this: a sigma 5% wider at worst.
KEEPS = 1.05
#: The share of resampled poolings under the bound.
CONFIDENCE = 0.9
#: Resamplings of the runs (seeded: the same files give the same table).
RESAMPLES = 400
#: Runs of one figure on one Target needed before its CV counts.
MIN_RUNS = 3
#: Fewest samples a shortened figure keeps (a median of fewer is not a median).
MIN_SAMPLES = 3


@dataclass
class Shortening:
    """One test's metric, pooled over its cases, GPU models and profiles: the CV for each window."""

    test: str  # the test's name without its parameters
    metric: str
    mode: str
    samples: int  # measured per run
    groups: list[dict[int, list[float]]] = field(default_factory=list)  # per group: k -> each run's figure
    _bounds: dict[int, float] = field(default_factory=dict, repr=False)
    window_s: float | None = None  # an energy window's length (energy_windows: k 1 is its first half, 2 the whole)

    @property
    def runs(self) -> int:
        return sum(len(g[self.samples]) for g in self.groups)

    @property
    def windows(self) -> list[int]:
        return [1, 2] if self.window_s is not None else windows_for(self.samples)

    def cv(self, k: int) -> float:
        """The pooled run-to-run CV of the figure made from the first ``k`` samples."""
        dof = self.runs - len(self.groups)
        return math.sqrt(_squares(self.groups, k) / dof) if dof > 0 else math.nan

    def bound(self, k: int) -> float:
        """The :data:`CONFIDENCE` upper bound of CV(k) / CV(all), resampling each group's runs (paired)."""
        if k == self.samples:
            return 1.0
        if k not in self._bounds:
            self._bounds[k] = self._resampled_bound(k)
        return self._bounds[k]

    def _resampled_bound(self, k: int) -> float:
        rng = random.Random(f"{self.test}|{self.metric}|{k}")
        ratios = []
        for _ in range(RESAMPLES):
            picks = [[rng.randrange(len(g[k])) for _ in g[k]] for g in self.groups]
            chosen = [{w: [g[w][i] for i in pick] for w in (k, self.samples)} for g, pick in zip(self.groups, picks)]
            full = _squares(chosen, self.samples)
            if full > 0:
                ratios.append(math.sqrt(_squares(chosen, k) / full))
        if not ratios:
            return math.inf
        ratios.sort()
        return ratios[min(len(ratios) - 1, int(CONFIDENCE * len(ratios)))]

    @property
    def fewest(self) -> int:
        """The fewest samples whose CV, and every longer window's, keeps the full window's threshold
        (:data:`KEEPS`)."""
        fewest = self.samples
        for k in reversed(self.windows):
            if self.bound(k) > KEEPS:
                break
            fewest = k
        return fewest

    def add(self, runs: list[list[float]]) -> None:
        """One group's runs (each its samples in the order measured; for an energy window, its first
        half's figure, the whole window's and the window's seconds)."""
        if self.window_s is not None:  # each run [first half, whole window, its seconds]: the longest group's window
            self.groups.append({1: [r[0] for r in runs], 2: [r[1] for r in runs]})
            self.window_s = max(self.window_s, statistics.median(r[2] for r in runs))
        else:
            self.groups.append({k: [statistics.median(s[:k]) for s in runs] for k in self.windows})
        self._bounds.clear()


def _squares(groups: list[dict[int, list[float]]], k: int) -> float:
    """Sum over the groups of the squared relative deviations of each run's figure from its group's mean."""
    total = 0.0
    for g in groups:
        mean = statistics.fmean(g[k])
        total += sum((f / mean - 1) ** 2 for f in g[k])
    return total


def windows_for(n: int) -> list[int]:
    """The numbers of first samples tried for a figure of ``n`` samples."""
    return sorted({max(MIN_SAMPLES, min(n, round(n * share))) for share in LADDER} | {n})


def _samples(metric: Any) -> list[float] | None:
    """The samples of a figure that is their median (None otherwise)."""
    s = metric.samples
    if metric.compare is False or len(s) < 2 * MIN_SAMPLES or not all(math.isfinite(x) and x > 0 for x in s):
        return None
    if not math.isclose(statistics.median(s), metric.value, rel_tol=1e-6):
        return None
    return list(s)


def _pool(records: Iterable[Any], values: Callable[[Any], list[float] | None],
          new_row: Callable[[str, str, str, int], Shortening]) -> list[Shortening]:
    """Group the records' figures by GPU model, profile, mode and case (each run once, by board and
    time), keep the groups of :data:`MIN_RUNS` runs or more, and pool them per test and metric.
    ``values`` gives a figure's values per run (None: not this table's), ``new_row`` a pooled row."""
    groups: dict[tuple[Any, ...], dict[tuple[Any, ...], list[float]]] = defaultdict(dict)
    for r in records:
        v = values(r.metric)
        if v is None:
            continue
        t = r.target
        key = (r.mode, r.test.split("::")[-1].split("[")[0], r.metric.name, len(v),
               t.gpu_slug, t.baseline_profile or t.profile, r.test)
        groups[key][(t.uuid, r.timestamp)] = v  # a run read twice (two copies of a file) counts once
    pooled: dict[tuple[Any, ...], Shortening] = {}
    for key, runs in groups.items():
        if len(runs) < MIN_RUNS:
            continue
        if key[:4] not in pooled:
            pooled[key[:4]] = new_row(*key[:4])
        pooled[key[:4]].add(list(runs.values()))
    rows = (r for r in pooled.values() if r.runs > len(r.groups))
    return sorted(rows, key=lambda r: (r.mode, r.test, r.metric, r.samples))


def analyse(records: Iterable[Any]) -> list[Shortening]:
    """Pool the records' figures (:class:`pytest_mig.store.results.ResultRecord`) as the module says."""
    return _pool(records, _samples, lambda mode, test, metric, n: Shortening(test, metric, mode, n))


def _halves(metric: Any) -> list[float] | None:
    """[first half's figure, the whole window's, the window's seconds] of an energy figure that kept both."""
    half = (metric.info or {}).get("first_half") if metric.compare is not False else None
    window = (metric.info or {}).get("window_s")
    if not isinstance(half, dict) or not isinstance(window, (int, float)) or isinstance(window, bool):
        return None
    value = half.get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if not (math.isfinite(value) and value > 0 and math.isfinite(metric.value) and metric.value > 0 and window > 0):
        return None
    return [float(value), float(metric.value), float(window)]


def energy_windows(records: Iterable[Any]) -> list[Shortening]:
    """Energy figures pooled as :func:`analyse` pools samples, each run's first half against its whole window."""
    return _pool(records, _halves, lambda mode, test, metric, _: Shortening(test, metric, mode, 2, window_s=0.0))


def window_lines(rows: list[Shortening]) -> list[str]:
    """The energy windows' table: the whole window's CV, and its first half's as a multiple of it."""
    out = [f"{'mode':7} {'test':22} {'metric':28} {'window':>7} {'groups':>6} {'runs':>5} {'CV (whole)':>10}  "
           f"{'first half: CV / CV(whole), its 90% bound':42} half keeps it"]
    for r in rows:
        full = r.cv(2)
        ratio = f"{r.cv(1) / full:.2f} ({r.bound(1):.2f})" if full else "-"
        out.append(f"{r.mode:7} {r.test[:22]:22} {r.metric[:28]:28} {r.window_s or 0:>6.2f}s {len(r.groups):>6} "
                   f"{r.runs:>5} {100 * full:>9.2f}%  {ratio:42} {'yes' if r.fewest == 1 else 'no'}")
    return out


def lines(rows: list[Shortening]) -> list[str]:
    """The table: each window's CV as a multiple of the full window's, and the fewest samples that keep it."""
    out = [f"{'mode':7} {'test':22} {'metric':24} {'n':>3} {'groups':>6} {'runs':>5} {'CV (all n)':>10}  "
           f"{'first k of n: CV(k) / CV(all), its 90% bound':46} fewest"]
    for r in rows:
        full = r.cv(r.samples)
        ladder = "  ".join(f"{k}: {r.cv(k) / full:.2f} ({r.bound(k):.2f})" if full else f"{k}: -"
                           for k in r.windows if k != r.samples)
        out.append(f"{r.mode:7} {r.test[:22]:22} {r.metric[:24]:24} {r.samples:>3} {len(r.groups):>6} {r.runs:>5} "
                   f"{100 * full:>9.2f}%  {ladder:46} {r.fewest}")
    return out


__all__ = ["CONFIDENCE", "KEEPS", "LADDER", "MIN_RUNS", "Shortening", "analyse", "energy_windows", "lines",
           "window_lines", "windows_for"]
