"""One judging pipeline: a test's records against their histories, confirmed, explained.

Every figure is judged by :class:`Pipeline`, wherever it is judged: the plugin (each test as it
ends), ``pytest-mig compare`` (a results file against earlier ones), the detection analysis (a
replay of recorded nights) and node mode's workers (each a plugin run).  The steps, in order:

1. the first verdict: against the figure's own history (:func:`pytest_mig.judge.verdict.compare`), else
   the reference of its GPU model and profile (:func:`pytest_mig.judge.verdict.compare_reference`), else,
   for a compute or bandwidth figure, the device's own ceiling (:class:`pytest_mig.judge.ceiling.Ceilings`),
   else why none of them exists;
2. a verdict beyond its threshold is re-judged on re-measurements (:func:`pytest_mig.judge.verdict.confirm`):
   the plugin runs the test again, compare and detection read the ones the run recorded;
3. a throughput verdict says whether its clock-normalised partner moved too
   (:func:`pytest_mig.judge.verdict.explain_clock`);
4. a regression measured beside a health sign names it (:func:`pytest_mig.device.health.annotate`).

Only where a figure's history comes from differs, behind :class:`Histories`: the site's baseline
files (:class:`StoreHistories`) or earlier results files (:class:`RecordHistories`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from typing import Callable, Iterable, Mapping, Protocol, Sequence

from pytest_mig.measure.clocks import temperature_of, throttle_reasons
from pytest_mig.measure.metric import Metric
from pytest_mig.store.baselines import BaselineStore, entry_from_records, meta_from_record, saveable
from pytest_mig.store.history import Baseline, BaselineEntry, BaselineError, BaselineMeta
from pytest_mig.device.health import annotate
from pytest_mig.device.host import SHARED_HOST, shared_host
from pytest_mig.judge.prior import PriorSource, Priors
from pytest_mig.judge.ceiling import Ceilings
from pytest_mig.judge.reference import Reference, ReferenceStore
from pytest_mig.judge.thermal import Slope, at_run_temperature, cap_for, hidden, history_temperature, widening
from pytest_mig.store.results import ResultRecord
from pytest_mig.judge.verdict import (
    DEFAULT_TOLERANCE,
    Verdict,
    compare,
    compare_reference,
    confirm,
    explain_clock,
    format_number,
    make_verdict,
    value_text,
)

#: A site's explicit tolerance: one fraction for every metric, or one per metric name.
Tolerance = float | Mapping[str, float] | None
#: Re-measurements of a test's figures, by metric name (called only when a figure is beyond its threshold).
Remeasure = Callable[[], Mapping[str, Sequence[float]]]


#: How a verdict says that a re-measurement read warmer widened what it detects (:meth:`Pipeline._remeasured`).
REMEASURED_WARMER = "re-measured warmer"


class Remeasured(dict):  # type: ignore[type-arg]
    """Each metric's re-measured values made alone; ``shared``: those made while the host's other GPUs
    copied, which judge nothing (:meth:`Pipeline.judge`); ``temperatures``: the GPU temperature each
    one made alone read (None where it read none), beside its value; ``brought``: the metrics whose
    values are at their first measurement's temperature already (a results file's, brought as the
    run judged them: :meth:`Pipeline.judge_runs`); ``detects``: the smallest change each metric's
    verdict said it detected once re-measured (a results file's, whose re-measurements keep no
    temperature to widen it again)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared: dict[str, list[float]] = {}
        self.temperatures: dict[str, list[float | None]] = {}
        self.brought: set[str] = set()
        self.detects: dict[str, float] = {}

    def keep(self, metric: Metric, shared: bool) -> None:
        """One re-measured figure: among those made while the host's other GPUs copied where ``shared``."""
        if shared:
            self.shared.setdefault(metric.name, []).append(metric.value)
            return
        self.setdefault(metric.name, []).append(metric.value)
        self.temperatures.setdefault(metric.name, []).append(temperature_of(metric.info))


class Histories(Protocol):
    """Where a figure's history comes from."""

    def load(self, gpu_slug: str, profile: str) -> Baseline | None:
        """The histories of one GPU model and profile (None: there are none)."""

    def missing(self, rec: ResultRecord, base: Baseline | None) -> Verdict:
        """The verdict of a figure with no history of its own (``base``: its GPU model and profile's)."""

    def elsewhere(self, rec: ResultRecord) -> tuple[BaselineEntry, BaselineMeta] | None:
        """A history of the figure measured elsewhere (another GPU model, profile or mode), which
        makes the verdict say why it is not compared (None: no such history is known)."""


class StoreHistories:
    """The site's baseline files, each read once per run."""

    def __init__(self, store: BaselineStore | None) -> None:
        self.store = store
        self._loaded: dict[tuple[str, str], Baseline | None] = {}

    def load(self, gpu_slug: str, profile: str) -> Baseline | None:
        key = (gpu_slug, profile)
        if key not in self._loaded:
            self._loaded[key] = self.store.load(*key) if self.store is not None else None
        return self._loaded[key]

    def missing(self, rec: ResultRecord, base: Baseline | None) -> Verdict:
        if base is not None:  # the file exists: the rule says why this figure has no history in it
            return compare(rec, base)
        meta = meta_from_record(rec)
        where = f" {self.store.path_for(meta.gpu_slug, meta.profile)}" if self.store is not None else ""
        return make_verdict(rec, "no-baseline",
                            f"{value_text(rec)}: no baseline file{where} (record one with --mig-save-baseline)",
                            throttled=throttle_reasons(rec.metric.info))

    def elsewhere(self, rec: ResultRecord) -> tuple[BaselineEntry, BaselineMeta] | None:
        return None


class RecordHistories:
    """Histories made of earlier runs' records (results files), oldest first: each figure's history
    is its records on the same GPU model and profile, as a baseline that had saved them would hold."""

    def __init__(self, runs: Iterable[Iterable[ResultRecord]]) -> None:
        self._by_key: dict[tuple[str, str, str], list[ResultRecord]] = {}
        groups: dict[tuple[str, str], dict[tuple[str, str, str], list[ResultRecord]]] = {}
        metas: dict[tuple[str, str], BaselineMeta] = {}
        for run in runs:
            for r in run:
                if r.metric.compare and saveable(r) is not None:  # never saved (copies made while the host's
                    continue  # other GPUs copied, a NaN, a value not positive), so never history
                key = (r.test, r.metric.name, r.mode)
                self._by_key.setdefault(key, []).append(r)
                meta = meta_from_record(r)
                where = (meta.gpu_slug, meta.profile)
                groups.setdefault(where, {}).setdefault(key, []).append(r)
                metas[where] = meta
        self._baselines = {where: Baseline(meta=metas[where],
                                           entries={k: entry_from_records(recs) for k, recs in entries.items()})
                           for where, entries in groups.items()}

    def load(self, gpu_slug: str, profile: str) -> Baseline | None:
        return self._baselines.get((gpu_slug, profile))

    def missing(self, rec: ResultRecord, base: Baseline | None) -> Verdict:
        v = compare(rec, None, None)
        if v.outcome == "no-baseline":
            m = rec.metric
            v.message = f"{m.name} {format_number(m.value)} {m.unit}: not in the old files"
        return v

    def elsewhere(self, rec: ResultRecord) -> tuple[BaselineEntry, BaselineMeta] | None:
        others = [c for mode in ("normal", "quick") for c in self._by_key.get((rec.test, rec.metric.name, mode), [])]
        return (entry_from_records([others[-1]]), meta_from_record(others[-1])) if others else None


class Pipeline:
    """Judges records against ``histories``, falling back on ``references`` for a figure with no
    history of its own, and on ``ceilings`` (the device's own ceiling) for a compute or bandwidth
    figure that no reference holds either: a site's first night, until its own history takes over
    figure by figure.

    A baseline or reference file that cannot be read raises BaselineError: a broken baseline is an
    error to fix, not a reason to pass.
    """

    def __init__(self, histories: Histories, *, references: ReferenceStore | None = None,
                 ceilings: Ceilings | None = None, improvement_fails: bool = False,
                 default_tolerance: float = DEFAULT_TOLERANCE, priors: PriorSource | None = None) -> None:
        self.histories = histories
        self.references = references
        self.ceilings = ceilings
        self.priors: PriorSource = priors if priors is not None else Priors(references)
        self.improvement_fails = improvement_fails
        self.default_tolerance = default_tolerance

    def judge(self, records: Sequence[ResultRecord], *, tolerance: Tolerance = None,
              remeasure: Remeasure | None = None) -> list[Verdict]:
        """The verdicts of one test's records, through every step; sets each ``record.verdict``.

        ``remeasure`` gives the re-measurements of the test's figures when one is beyond its
        threshold (None: none are taken, the first verdict stands)."""
        verdicts = [self.first(rec, tolerance) for rec in records]
        if remeasure is not None and any(v.failed for v in verdicts):
            again = remeasure()
            shared: Mapping[str, Sequence[float]] = getattr(again, "shared", {})
            verdicts = [self._remeasured(rec, v, again, shared.get(rec.metric.name, []))
                        if v.failed else v for rec, v in zip(records, verdicts)]
        explain_clock(records, verdicts)
        health = next((r.health for r in records if r.health), None)
        annotate(verdicts, health)
        for rec, v in zip(records, verdicts):
            rec.verdict = v
        return verdicts

    def judge_runs(self, records: Sequence[ResultRecord], *, tolerance: Tolerance = None) -> list[Verdict]:
        """The verdicts of a whole run's records (many tests), each test judged on the re-measurements
        its own run recorded (``verdict.confirmations``), in the records' order."""
        by_test: dict[str, list[int]] = {}
        for i, rec in enumerate(records):
            by_test.setdefault(rec.test, []).append(i)
        out: list[Verdict | None] = [None] * len(records)
        for idx in by_test.values():
            mine = [records[i] for i in idx]
            taken = Remeasured()
            for r in mine:
                taken[r.metric.name] = list(r.verdict.confirmations) if r.verdict is not None else []
                if r.verdict is not None and r.verdict.at_temperature:
                    taken.brought.add(r.metric.name)
                if r.verdict is not None and REMEASURED_WARMER in (r.verdict.warmth or "") \
                        and r.verdict.detectable is not None:
                    taken.detects[r.metric.name] = r.verdict.detectable
            for i, v in zip(idx, self.judge(mine, tolerance=tolerance, remeasure=lambda taken=taken: taken)):
                out[i] = v
        return [v for v in out if v is not None]

    def history(self, rec: ResultRecord) -> Baseline | None:
        """The histories of the record's GPU model and profile (None: there are none)."""
        meta = meta_from_record(rec)
        return self.histories.load(meta.gpu_slug, meta.profile)

    def reference(self, rec: ResultRecord, base: Baseline | None) -> Reference | None:
        """The reference this record is judged against when ``base``, its GPU model and profile's
        histories, holds no history of its own (None: none)."""
        if self.references is None:
            return None
        if base is not None and base.get(rec.test, rec.metric.name, rec.mode) is not None:
            return None
        return self.references.holding(rec)

    def measured_size(self, rec: ResultRecord) -> int | None:
        """The problem size the record's figure is judged at (:attr:`BaselineEntry.size`): that of its
        own history, else, where it has none, of the reference it is judged against.  None where the
        one it is judged against names none (a history saved before runs kept their size: the workload
        sizes itself as it did), or a file cannot be read (the verdict names it).  A workload that
        chooses its size each run measures at this one, so a night compares like with like."""
        try:
            base = self.history(rec)
            entry = base.get(rec.test, rec.metric.name, rec.mode) if base is not None else None
            ref = self.reference(rec, base) if entry is None else None
        except BaselineError:
            return None
        if ref is not None:
            entry = ref.get(rec.test, rec.metric.name, rec.mode)
        return entry.size if entry is not None else None

    def first(self, rec: ResultRecord, tolerance: Tolerance = None) -> Verdict:
        """The verdict on the first measurement."""
        if not rec.metric.compare:
            return compare(rec, None, None)
        shared = shared_host(rec.metric.info)
        if shared:  # not this GPU's own figure: judged against nothing, saved nowhere
            return make_verdict(rec, "incomparable", f"{value_text(rec)} not compared: {shared}")
        base = self.history(rec)
        ref = self.reference(rec, base)
        if ref is not None:
            return compare_reference(rec, ref, improvement_fails=self.improvement_fails)
        tol = tolerance_for(tolerance, rec.metric.name)
        if base is None or base.get(rec.test, rec.metric.name, rec.mode) is None:
            # nothing of this GPU model and profile in either mode: the device's ceiling, where it has one
            unseen = base is None or base.other_mode(rec.test, rec.metric.name, rec.mode) is None
            judged = self.ceilings.judge(rec) if unseen and self.ceilings is not None else None
            if isinstance(judged, Verdict):
                return judged
            alt = self.histories.elsewhere(rec)
            if alt is not None:
                return compare(rec, *alt, tolerance=tol, improvement_fails=self.improvement_fails)
            if unseen:
                return _why_no_ceiling(self.histories.missing(rec, base), judged)
        history = base.get(rec.test, rec.metric.name, rec.mode) if base is not None else None
        return compare(rec, base, tolerance=tol, improvement_fails=self.improvement_fails,
                       default_tolerance=self.default_tolerance, prior=self.priors.for_record(rec, history),
                       slope=self.priors.slope_for(rec))

    def _remeasured(self, rec: ResultRecord, verdict: Verdict, again: Mapping[str, Sequence[float]],
                    shared: Sequence[float]) -> Verdict:
        """The verdict re-judged on its re-measurements, put where its first measurement was; where one
        was widened further for the warmth it read, the smallest change the verdict detects grows alike
        (a re-run that reads warmer can clear a loss its first reading's band would have caught)."""
        values, wider = self._at_first_temperature(rec, verdict, again)
        recorded = getattr(again, "detects", {}).get(rec.metric.name)
        if recorded is not None and verdict.detectable is not None:
            wider = max(wider, recorded - verdict.detectable)
        if wider > 0 and verdict.detectable is not None:
            note = f"{REMEASURED_WARMER}: what it detects widened by {100 * wider:.1f}% for leakage"
            verdict = replace(verdict, detectable=verdict.detectable + wider,
                              warmth=f"{verdict.warmth}; {note}" if verdict.warmth else note)
        return self._confirmed(rec, verdict, values, shared)

    def _at_first_temperature(self, rec: ResultRecord, verdict: Verdict,
                              again: Mapping[str, Sequence[float]]) -> tuple[list[float], float]:
        """An energy figure's re-measurements (of ``again``) put where its first measurement's baseline
        and threshold were (:mod:`pytest_mig.judge.thermal`): each one judged as a first measurement at
        its own temperature would be, against the history brought there (no run moved by more than the
        cap) and with its threshold widened for the warmth it read (a re-run reads warmer, and would
        read as a loss against the first's), then moved by the difference; or, where its temperature is
        unknown or one the slope does not cover (a results file written before keeps none), judged as it
        read: moved by what the baseline was, so that it meets the baseline as the runs read it.  As
        they are for any other figure, or where they were put so already (``Remeasured.brought``).  With
        them, the most any one was widened beyond the first reading."""
        name = rec.metric.name
        values = list(again.get(name, []))
        temperatures: Sequence[float | None] = getattr(again, "temperatures", {}).get(name, [])
        if name in getattr(again, "brought", ()) or rec.metric.kind != "energy":
            return values, 0.0
        base = self.history(rec)
        entry = base.get(rec.test, rec.metric.name, rec.mode) if base is not None else None
        if entry is None or not verdict.baseline or not entry.value:
            return values, 0.0
        slope = self.priors.slope_for(rec)
        known = list(temperatures) if len(temperatures) == len(values) else [None] * len(values)
        runs = [(r.value, r.temperature_c) for r in entry.runs]
        widen = _Widening(rec, verdict, entry, slope)
        cap = cap_for(widen.threshold, widen.detectable, verdict.tolerance or 0.0)
        out, wider = [], 0.0
        for value, t in zip(values, known):
            own = at_run_temperature({"temperature_c": t}, runs, slope, cap=cap) if t is not None else None
            center = statistics.median(own.values) if own is not None else entry.value  # as read where not brought
            extra = widen.at(t, center / entry.value - 1) - widen.first
            out.append(value * verdict.baseline / center - verdict.baseline * extra)
            wider = max(wider, extra)
        return out, wider

    def _confirmed(self, rec: ResultRecord, verdict: Verdict, values: Sequence[float],
                   shared: Sequence[float]) -> Verdict:
        """The verdict re-judged on its re-measurements made alone.  Where every one was made while the
        host's other GPUs copied (``shared``), they can neither confirm nor clear it: the figure is not
        judged tonight, and is marked so that it is never saved, exported or replayed either."""
        if shared and not values:
            change = f"{verdict.change_pct:+.1f}%" if verdict.change_pct is not None else "beyond its threshold"
            why = f"it read {change} alone, and its re-measurements were made while the host's other GPUs copied"
            rec.metric.info[SHARED_HOST] = why
            return make_verdict(rec, "incomparable", f"{value_text(rec)} not compared: {why}",
                                throttled=verdict.throttled)
        return self.confirm(rec, verdict, values)

    def confirm(self, rec: ResultRecord, verdict: Verdict, values: Sequence[float]) -> Verdict:
        """The verdict re-judged on the median of the first measurement and ``values``."""
        if verdict.source == "ceiling" and self.ceilings is not None:
            return self.ceilings.confirm(verdict, values)
        return confirm(verdict, rec, values, improvement_fails=self.improvement_fails)


class _Widening:
    """How far an energy verdict's band was widened for the temperature its first measurement read
    (:func:`~pytest_mig.judge.thermal.warmth`), the band before it, and what a re-measurement at another
    temperature would have been widened by.  The threshold before is recovered from the one widened:
    ``widening`` adds what the warmth moves less half the threshold, so the total is half the band's
    threshold plus that warmth."""

    def __init__(self, rec: ResultRecord, verdict: Verdict, entry: BaselineEntry, slope: Slope | None) -> None:
        self.slope, self.history_c = slope, history_temperature([r.temperature_c for r in entry.runs])
        total = verdict.threshold or 0.0
        first_c = temperature_of(rec.metric.info)
        brought = (verdict.baseline or entry.value) / entry.value - 1
        moved = widening(first_c, self.history_c, slope, brought, 0.0) if verdict.warmth else 0.0
        self.threshold = 2 * (total - moved) if moved > 0 else total
        self.first = max(0.0, total - self.threshold)
        hides = hidden(first_c, self.history_c, slope, brought) if verdict.warmth else 0.0
        self.detectable = (verdict.detectable or math.inf) - self.first - hides

    def at(self, temperature: float | None, brought: float) -> float:
        """The widening a measurement read at ``temperature``, its history brought by ``brought``, has."""
        return widening(temperature, self.history_c, self.slope, brought, self.threshold) if temperature is not None \
            else self.first


def _why_no_ceiling(verdict: Verdict, why: str | None) -> Verdict:
    """A no-baseline verdict with why the device's ceiling did not judge the figure either."""
    if why and verdict.outcome == "no-baseline":
        verdict.message += f"; {why}"
    return verdict


def tolerance_for(tolerance: Tolerance, metric: str) -> float | None:
    """The tolerance ``metric`` is held to: a run's or marker's fraction, a marker's entry for the
    metric (``{'fp16_tflops': 0.03}``), or None (the history file's, else the noise alone)."""
    if tolerance is None or isinstance(tolerance, (int, float)):
        return tolerance
    return tolerance.get(metric)


__all__ = ["REMEASURED_WARMER", "Histories", "Pipeline", "RecordHistories", "Remeasure", "Remeasured",
           "StoreHistories", "Tolerance", "tolerance_for"]
