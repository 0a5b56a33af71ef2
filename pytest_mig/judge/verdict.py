"""Verdicts: one run's figure against its history, in words a person can act on.

The rule (one place, used by the plugin, ``pytest-mig compare`` and ``pytest-mig calibrate``):

* Never compared: informational metrics (``info``); figures of another GPU model, another profile,
  emulated against real, or the other mode (quick vs normal) (``incomparable``); different units or
  directions (``incomparable``: the metric was redefined, re-record the baseline).
* The store hands over the figure's history (the runs kept in its baseline entry).  Its band
  (:func:`pytest_mig.judge.noise.band`) gives the baseline (median of the runs), the threshold from the
  run-to-run noise, whether the figure gates, and the smallest change it can detect.
* ``worse`` is the relative change in the bad direction (a TFLOPS drop, a time increase).
  ``regressed`` when worse by more than the threshold, ``improved`` when better by more than it,
  else ``pass``.  A figure that does not gate is ``noisy`` ("too noisy to gate"), whatever it did.
* **Confirmation**: a run beyond the threshold is re-measured (:func:`confirm`; the plugin runs the
  test again, twice by default) and fails only if every re-measurement is beyond the threshold too.
  A slowdown that persists (a driver, a clock cap, a bad board) stays beyond and fails; a transient
  dip comes back and is reported ``transient``, with every measurement shown, and passes.
* A throttled measurement (power or thermal clock-event reasons) is still judged, and a regression
  still fails, but the message names the throttle as the likely cause, not the driver.
* ``improved`` fails only with ``improvement_fails`` (``--mig-fail-on-improvement``): a stale
  baseline hides regressions.

The message names the metric, value, baseline, change, threshold and where it came from, the
smallest detectable change, and what differs in the fingerprint since the baseline was recorded,
e.g. ``fp16_tflops 652.1 TFLOPS, baseline 699.0 TFLOPS (median of 10 runs): -6.7%, threshold 2.1%
(5 x run-to-run sigma 0.42% over 10 runs), detects >= 3%; confirmed: every re-measurement is beyond
the threshold, 651.0, 653.4 TFLOPS (median of 3 -6.8%); since the baseline: driver 550.54 -> 560.35``
(an illustration of the form; README quotes a real one).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from pytest_mig.device.fingerprint import FINGERPRINT_FIELDS, fingerprint_value
from pytest_mig.measure.clocks import throttle_reasons
from pytest_mig.store.baselines import meta_from_record
from pytest_mig.store.history import Baseline, BaselineEntry, BaselineMeta
from pytest_mig.judge.noise import (
    FEW_RUNS_BAND,
    FLOOR,
    MIN_RUNS,
    PRIOR,
    PRIOR_BOARD,
    PRIOR_RUNS,
    PRIOR_SPREAD,
    Prior,
    REFERENCE_FLOOR,
    REFERENCE_MAX,
    REFERENCE_PRIORS,
    Band,
    K,
    band,
    is_prior,
)
from pytest_mig.judge.reference import Reference, fingerprint_beside
from pytest_mig.judge.thermal import Slope, Warmth, at_run_temperature, cap_for, warmth
from pytest_mig.store.results import ResultRecord
from pytest_mig.store.verdicts import ClockNote, Outcome, Verdict
from pytest_mig.common.text import SHOWN, quoted

#: The tolerance a figure is held to when nobody set one: a figure whose run-to-run noise needs a
#: wider threshold than this is reported as too noisy to gate (see pytest_mig.judge.noise).
DEFAULT_TOLERANCE = 0.05


def format_number(x: float | None) -> str:
    """Four significant figures without exponents for the sizes benchmarks produce."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    a = abs(x)
    if a >= 1000:
        return f"{x:.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 10:
        return f"{x:.2f}"
    if a >= 0.01 or a == 0:
        return f"{x:.3f}".rstrip("0").rstrip(".") if a < 1 else f"{x:.3g}"
    return f"{x:.3g}"


def percent(fraction: float) -> str:
    """0.05 -> '5%', 0.0063 -> '0.63%', 0.125 -> '12.5%', 1.0 -> '100%' (never an exponent)."""
    pct = fraction * 100
    if abs(pct) >= 10:
        return f"{pct:.1f}".rstrip("0").rstrip(".") + "%"
    return f"{pct:.2g}%"


def parse_tolerance(text: str | float) -> float:
    """'5%' or '0.05' -> 0.05.  A bare number above 1 is refused (write 5% or 0.05), and so is
    anything outside [0, 100%): a tolerance of 150% would let every drop pass."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        try:
            value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
        except ValueError:
            raise ValueError(f"tolerance {quoted(text, SHOWN)} is not a number: write a percentage such as 5% or a fraction such as 0.05") from None
        if not math.isfinite(value):
            raise ValueError(f"tolerance {quoted(text, SHOWN)} is out of range: it must be a finite number, at least 0 and "
                             f"below 100%")
        if not s.endswith("%") and value > 1:
            raise ValueError(f"tolerance {quoted(text, SHOWN)} is ambiguous: write {s}% or {value / 100:g}")
    if not math.isfinite(value) or not 0 <= value < 1:
        raise ValueError(f"tolerance {quoted(text, SHOWN)} is out of range: it must be at least 0 and below 100%")
    return value


def fingerprint_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """What changed between two fingerprints as (label, old value, new value), values as shown, e.g.
    ``[("driver", "550.54", "560.35")]``; :func:`fingerprint_diff` words them.

    A key absent from either side is not reported (an older file may not have recorded it); a key
    present on both sides whose value became unknown is (``("GSP firmware", "550.54", "n/a")``).
    """
    old, new = dict(old or {}), dict(new or {})
    known = [k for k, _, _ in FINGERPRINT_FIELDS]
    labels = {k: (label, unit) for k, label, unit in FINGERPRINT_FIELDS}
    keys = known + sorted(k for k in set(old) & set(new) if k not in labels)
    out: list[tuple[str, str, str]] = []
    for key in keys:
        if key not in old or key not in new or old[key] == new[key]:
            continue
        label, unit = labels.get(key, (key, ""))
        a, b = fingerprint_value(key, old[key], unit), fingerprint_value(key, new[key], unit)
        if a != b:
            out.append((label, a, b))
    return out


def fingerprint_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """What changed between two fingerprints, e.g. ``["driver 550.54 -> 560.35", "torch 2.4.0 -> 2.5.1"]``
    (see :func:`fingerprint_changes`)."""
    return [f"{label} {a} -> {b}" for label, a, b in fingerprint_changes(old, new)]


def incomparable_reason(record: ResultRecord, meta: BaselineMeta) -> str | None:
    """Why this record must not be compared with a baseline of ``meta`` (None: it may be)."""
    mine = meta_from_record(record)
    if mine.gpu_slug != meta.gpu_slug:
        return f"measured on {mine.gpu_model} but the baseline is for {meta.gpu_model}"
    if mine.emulated != meta.emulated:
        what = "an emulated profile" if mine.emulated else "a real MIG slice or GPU"
        other = "an emulated profile" if meta.emulated else "a real MIG slice or GPU"
        return f"measured on {what} but the baseline is for {other}"
    if mine.profile != meta.profile:
        return f"measured on profile {mine.target_profile} but the baseline is for {meta.target_profile}"
    return None


def value_text(record: ResultRecord) -> str:
    m = record.metric
    return f"{m.name} {format_number(m.value)} {m.unit}".rstrip()


def make_verdict(record: ResultRecord, outcome: Outcome, message: str, **kw: Any) -> Verdict:
    m = record.metric
    fields: dict[str, Any] = dict(baseline=None, change_pct=None, tolerance=None)
    fields.update(kw)
    return Verdict(outcome=outcome, metric=m.name, value=m.value, unit=m.unit, test=record.test,
                   message=message, direction=m.direction, **fields)


def worse_by(value: float, center: float, direction: str) -> float:
    """Relative change in the bad direction: positive is worse (what a verdict holds against its threshold)."""
    change = (value - center) / abs(center)
    return -change if direction == "higher" else change


def _sigma_text(v: Verdict) -> str:
    """'0.42%', or '5.1% (that of tokens_per_s, which times the same work)' where a partner's sigma was used,
    or the prior's (:class:`~pytest_mig.judge.noise.Prior`) where it was the larger."""
    if v.sigma_of in REFERENCE_PRIORS:
        where = {PRIOR_BOARD: "night to night on one board", PRIOR: "across nights and boards",
                 PRIOR_SPREAD: "this emulated profile's spread across its boards, each run once"}[v.sigma_of]
        return (f"{percent(v.sigma or 0.0)} (the reference's for this GPU model, {where}: larger than "
                f"this history's own until it has {PRIOR_RUNS} runs)")
    if is_prior(v.sigma_of):
        return f"{percent(v.sigma or 0.0)} ({v.sigma_of})"
    shared = f" (that of {v.sigma_of}, which times the same work)" if v.sigma_of else ""
    return f"{percent(v.sigma or 0.0)}{shared}"


def _widen(runs: int | None) -> str:
    """'1.41 (sqrt(1 + 1/1))': the widening of a short history's band for the uncertainty of its median."""
    n = max(runs or 1, 1)
    return f"{math.sqrt(1 + 1 / n):.2f} (sqrt(1 + 1/{n}))"


def _band_text(v: Verdict) -> str:
    """The threshold of a compared verdict, where it came from, and the smallest change it detects."""
    threshold = percent(v.threshold or 0.0)
    if v.basis == "reference":
        return (f"threshold {threshold} (against another board: at least {percent(REFERENCE_FLOOR)} for the spread "
                f"between boards, {K:g} x the reference's run-to-run sigma {_sigma_text(v)}), detects >= "
                f"{percent(v.detectable or 0.0)}")
    if v.basis == "few-runs":
        if is_prior(v.sigma_of) and (v.threshold or 0.0) > FEW_RUNS_BAND:
            widened = f", widened to {K:g} x sqrt(1 + 1/{v.runs}) x the run-to-run sigma of {v.sigma_of}"
        elif v.sigma_of and (v.threshold or 0.0) > FEW_RUNS_BAND:
            widened = f", widened to the spread of {v.sigma_of}, which times the same work"
        else:
            widened = ""
        return (f"threshold {threshold}: only {v.runs} run(s) in the baseline, too few to measure its "
                f"noise, so a conservative band until {MIN_RUNS} runs (pytest-mig calibrate){widened}")
    sig = f"run-to-run sigma {_sigma_text(v)}"
    if v.basis == "short":
        return (f"threshold {threshold} ({K:g} x {sig} x {_widen(v.runs)} for a baseline of {v.runs} run(s)), "
                f"detects >= {percent(v.detectable or 0.0)}")
    if v.basis == "tolerance" and v.sigma is None:  # a history too short to measure, no prior to judge it with
        return (f"threshold {threshold} (the tolerance set; only {v.runs} run(s) in the baseline, too few to measure "
                f"its noise: without the tolerance a conservative band of at least {percent(FEW_RUNS_BAND)} until "
                f"{MIN_RUNS} runs)")
    if v.basis == "tolerance":
        short = (v.runs or 0) < MIN_RUNS
        alone = percent(max(K * (v.sigma or 0.0) * (math.sqrt(1 + 1 / (v.runs or 1)) if short else 1.0), FLOOR))
        head = f"threshold {threshold} (the tolerance set; {sig} alone would give {alone})"
    elif v.basis == "floor":
        head = f"threshold {threshold} (the floor; {sig} over {v.runs} runs)"
    else:
        head = f"threshold {threshold} ({K:g} x {sig} over {v.runs} runs)"
    return f"{head}, detects >= {percent(v.detectable or 0.0)}"


def compare(
    record: ResultRecord,
    baseline_entry: BaselineEntry | Baseline | None,
    baseline_meta: BaselineMeta | Baseline | None = None,
    *,
    tolerance: float | None = None,
    improvement_fails: bool = False,
    default_tolerance: float = DEFAULT_TOLERANCE,
    partners: Mapping[str, Sequence[float]] | None = None,
    prior: Prior | float | None = None,
    slope: Slope | None = None,
) -> Verdict:
    """Judge one record against its figure's history (see the module docstring for the rule).

    ``tolerance`` is a site's explicit tolerance (marker, command line, ini); it wins over one set
    in the baseline file, and caps the threshold.  ``baseline_meta`` says what the baseline file is
    for, so a figure of another GPU model, profile or kind of target is never compared.  A whole
    :class:`Baseline` may be passed instead of the entry: its entry for this test, metric and mode
    and its meta are used, and the histories of the rate figures that time the same work
    (``partners``, by name, given directly otherwise: :func:`pytest_mig.judge.noise.band`).  An energy
    figure's history is brought to this run's temperature with ``slope``: :mod:`pytest_mig.judge.thermal`.
    """
    m = record.metric
    other_mode: str | None = None
    if isinstance(baseline_entry, Baseline):
        baseline_meta = baseline_meta or baseline_entry
        whole = baseline_entry
        baseline_entry = whole.get(record.test, m.name, record.mode)
        if baseline_entry is None:
            other_mode = whole.other_mode(record.test, m.name, record.mode)
        else:
            partners = {p.metric: p.values for p in whole.timing_partners(baseline_entry)}
    meta = baseline_meta.meta if isinstance(baseline_meta, Baseline) else baseline_meta
    throttled = throttle_reasons(m.info)
    shown = value_text(record)
    if not m.compare:
        return make_verdict(record, "info", f"{shown} (informational, not compared)", throttled=throttled)
    if meta is not None:
        reason = incomparable_reason(record, meta)
        if reason:
            return make_verdict(record, "incomparable", f"{shown} not compared: {reason}", throttled=throttled)
    if baseline_entry is not None and baseline_entry.mode != record.mode:
        other_mode, baseline_entry = baseline_entry.mode, None
    if other_mode is not None:
        return _other_mode(record, other_mode, throttled)
    if baseline_entry is None or not baseline_entry.runs:
        where = f" in {meta.path or f'{meta.gpu_model} {meta.profile}'}" if meta else ""
        return make_verdict(record, "no-baseline", f"{shown}: no baseline{where} (record one with --mig-save-baseline)",
                        throttled=throttled)
    e = baseline_entry
    early = _unjudgeable(record, e, throttled)
    if early is not None:
        return early
    b, warm, more = _at_run_temperature(record, e, band(e.values, tolerance=tolerance if tolerance is not None
                                                          else e.tolerance, default_tolerance=default_tolerance,
                                                          partners=partners, prior=prior), slope)
    changes = fingerprint_diff(e.fingerprint or (meta.fingerprint if meta else {}), record.fingerprint)
    return _judged(record, e, b, changes, improvement_fails=improvement_fails, at_temperature=warm,
                   warmth=more.text() if more is not None else None, cooler=more.hidden if more is not None else 0.0)


def _at_run_temperature(record: ResultRecord, e: BaselineEntry, b: Band,
                        slope: Slope | None) -> tuple[Band, str | None, Warmth | None]:
    """The band of an energy figure at this run's temperature (:mod:`pytest_mig.judge.thermal`), and
    what the verdict says of it (its ``at_temperature``, its ``warmth``): its baseline brought there,
    no run moved by more than :func:`~pytest_mig.judge.thermal.cap_for` allows, its sigma as the runs
    read, and its threshold widened by what a steep board's leakage may add beyond what that and half
    the threshold hold (:func:`~pytest_mig.judge.thermal.warmth`); else ``b`` as it is."""
    if record.metric.kind != "energy":
        return b, None, None
    as_read = b.center
    cap = cap_for(b.threshold, b.detectable, b.limit)
    warm = at_run_temperature(record.metric.info, [(r.value, r.temperature_c) for r in e.runs], slope, cap=cap)
    if warm is not None:
        b = replace(b, center=float(statistics.median(warm.values)))
    more = warmth(record.metric.info, [r.temperature_c for r in e.runs], b.threshold, b.center / as_read - 1, slope)
    if more is not None:
        b = replace(b, threshold=b.threshold + more.widen, detectable=b.detectable + more.widen + more.hidden)
    return b, warm.text() if warm is not None else None, more


def _other_mode(record: ResultRecord, other_mode: str, throttled: list[str]) -> Verdict:
    """A figure whose history holds only the other mode's runs: not compared, and no baseline value
    shown (a figure of other sizes would read as a change)."""
    run_mode = "with --mig-quick" if record.mode == "quick" else "without --mig-quick"
    base_mode = "quick runs (--mig-quick)" if other_mode == "quick" else "normal runs"
    return make_verdict(record, "incomparable",
                        f"{value_text(record)} not compared: measured {run_mode} but the baseline holds only "
                        f"{base_mode}, and the workloads' sizes differ; run as the baseline was recorded, or "
                        f"record this mode's with --mig-save-baseline", throttled=throttled)


def compare_reference(record: ResultRecord, reference: Reference, *, improvement_fails: bool = False) -> Verdict:
    """Judge one record against the reference of its GPU model and profile (no local history yet):
    the reference band of :func:`pytest_mig.judge.noise.reference_band`, the reference's fingerprint shown
    beside this GPU's.  A site's tolerance does not narrow it: it is for the site's own history."""
    m = record.metric
    meta = reference.baseline.meta
    throttled = throttle_reasons(m.info)
    if not m.compare:
        return make_verdict(record, "info", f"{value_text(record)} (informational, not compared)", throttled=throttled)
    reason = incomparable_reason(record, meta)
    e = reference.get(record.test, m.name, record.mode)
    if reason or e is None:
        why = reason or f"the reference holds no {record.mode} figure of it"
        return make_verdict(record, "incomparable", f"{value_text(record)} not compared with the reference: {why}",
                        throttled=throttled)
    early = _unjudgeable(record, e, throttled)
    if early is not None:
        return early
    b = reference.band_for(e)
    return _judged(record, e, b, [], improvement_fails=improvement_fails, source="reference")


def _unjudgeable(record: ResultRecord, e: BaselineEntry, throttled: list[str]) -> Verdict | None:
    """Why a record cannot be judged against this history although one exists (None: it can)."""
    m = record.metric
    shown = value_text(record)
    if e.unit != m.unit or e.direction != m.direction:
        return make_verdict(record, "incomparable",
                            f"{shown} not compared: the baseline is in {e.unit or 'no unit'}, {e.direction} is better, "
                        f"this run in {m.unit or 'no unit'}, {m.direction} is better; re-record the baseline",
                        baseline=e.value, throttled=throttled)
    if not math.isfinite(m.value):
        return make_verdict(record, "incomparable", f"{shown} not compared: this run's value is {m.value}",
                        baseline=e.value, throttled=throttled)
    return None


def _judged(record: ResultRecord, e: BaselineEntry, b: Band, changes: list[str], *, improvement_fails: bool,
            source: str = "baseline", at_temperature: str | None = None, warmth: str | None = None,
            cooler: float = 0.0) -> Verdict:
    """The verdict of a record against a history whose band is ``b``; an improvement fails (where it
    does) only beyond ``cooler`` more, what a cool reading's leakage may lower it by."""
    m = record.metric
    change = (m.value - b.center) / abs(b.center)
    if not math.isfinite(change):  # 1.5e308 against 0.5: no measurement, and no verdict either way
        return make_verdict(record, "incomparable", f"{value_text(record)} not compared: the change against the "
                        f"baseline {format_number(b.center)} {m.unit} is too large to be a number; the figure or "
                        f"its history is not a measurement", throttled=throttle_reasons(m.info))
    worse = worse_by(m.value, b.center, m.direction)
    if not b.gates:
        outcome: Outcome = "noisy"
    elif worse > b.threshold:
        outcome = "regressed"
    elif -worse > b.threshold:
        outcome = "improved"
    else:
        outcome = "pass"
    failed = outcome == "regressed" or (outcome == "improved" and improvement_fails and -worse > b.threshold + cooler)
    v = make_verdict(record, outcome, "", baseline=b.center, change_pct=change * 100, tolerance=b.limit,
                 threshold=b.threshold, sigma=b.sigma, detectable=b.detectable, runs=b.runs, gates=b.gates,
                 basis=b.basis, fingerprint_changes=changes, throttled=throttle_reasons(m.info), failed=failed,
                 source=source, sigma_of=b.sigma_of, history_fingerprint=e.fingerprint,
                 history_throttled=e.throttled, at_temperature=at_temperature, warmth=warmth)
    v.message = _message(v, record)
    return v


def _message(v: Verdict, record: ResultRecord) -> str:
    """The sentence of a compared verdict, from its fields (rebuilt after confirmation, and once its
    clock-normalised partner is known)."""
    runs = f"median of {v.runs} runs" if (v.runs or 0) > 1 else "1 run"
    reference = v.source == "reference"
    if reference:
        runs += " of the reference for this GPU model"
    runs += "".join(f"{sep}{note}" for sep, note in ((", ", v.at_temperature), ("; ", v.warmth)) if note)
    msg = (f"{value_text(record)}, {v.source} {format_number(v.baseline)} {v.unit}".rstrip()
           + f" ({runs}): {(v.change_pct or 0):+.1f}%, ")
    if v.outcome == "noisy" and reference and v.sigma is None:
        msg += ("not judged: the reference has one run of it, so its run-to-run noise is unknown; "
                "reported only")
    elif v.outcome == "noisy" and reference:
        msg += (f"too noisy to judge against another board (run-to-run sigma {_sigma_text(v)} across the "
                f"reference's runs: its threshold would be {percent(v.threshold or 0)}, more than "
                f"{percent(REFERENCE_MAX)}); reported, not judged")
    elif v.outcome == "noisy":
        msg += (f"too noisy to gate (run-to-run CV {_sigma_text(v)} over {v.runs} runs: its threshold would be "
                f"{percent(v.threshold or 0)}, more than the {percent(v.tolerance or 0)} tolerance); reported, not judged")
    else:
        msg += _band_text(v)
    if v.confirmations:
        values = [v.value or 0.0] + list(v.confirmations)
        shown = ", ".join(format_number(x) for x in v.confirmations) + f" {v.unit}".rstrip()
        if v.at_temperature:
            shown += " (brought to this run's temperature, as its baseline)"
        med = statistics.median(values)
        med_change = (med - (v.baseline or 0)) / abs(v.baseline or 1) * 100
        if v.outcome == "transient":
            msg += (f"; a transient change, not a regression: re-measured {shown}, not every one beyond "
                    f"the threshold (median of the {len(values)} measurements {med_change:+.1f}%)")
        else:
            msg += (f"; confirmed: every re-measurement is beyond the threshold, {shown} (median of "
                    f"{len(values)} {med_change:+.1f}%)")
    if reference:
        msg += f"; the reference's fingerprint: {fingerprint_beside(v.history_fingerprint, record.fingerprint or {})}"
        if v.outcome in ("regressed", "improved"):
            msg += "; a local baseline (--mig-save-baseline) takes over with this GPU's own thresholds"
    elif v.fingerprint_changes:
        msg += "; since the baseline: " + ", ".join(v.fingerprint_changes)
    elif v.outcome in ("regressed", "improved"):
        msg += "; nothing in the fingerprint changed since the baseline"
    if v.throttled:
        msg += f"; GPU was throttled during the measurement ({', '.join(v.throttled)})"
        if v.outcome == "regressed" and not (v.clock is not None and v.clock.moved_too):
            msg += ": not blamed on the driver, the throttle is the likely cause"
    if v.history_throttled and v.outcome not in ("pass", "noisy"):
        msg += f"; the baseline's runs were recorded while throttled ({', '.join(v.history_throttled)})"
    if v.clock is not None:
        moved = f"{v.clock.metric} {v.clock.change_pct:+.1f}%"
        if v.clock.moved_too:  # not the throttle after all: the kernel is slower per cycle
            msg += (f"; per SM cycle it moved too ({moved}): the kernel itself is slower per cycle (library, driver "
                    f"or hardware), not only the clock")
        else:
            msg += (f"; per SM cycle it held ({moved}): the SM clock ran lower, so a power or clock cap is the "
                    f"likely cause, not a slower kernel")
    return msg


def confirm(verdict: Verdict, record: ResultRecord, values: Sequence[float], *,
            improvement_fails: bool = False) -> Verdict:
    """Re-judge a verdict that was beyond its threshold on its re-measurements.

    ``values`` are the re-measurements (the first measurement is the record's).  The outcome stays
    only when every re-measurement is beyond the threshold in the same direction (confirmed): a
    sustained change persists in each of them; a transient dip does not, and the verdict becomes
    ``transient``, which does not fail.  Re-measurements that are not finite are left out.
    """
    if verdict.outcome not in ("regressed", "improved") or verdict.baseline is None or verdict.threshold is None:
        return verdict
    extra = [float(x) for x in values if x is not None and math.isfinite(x)]
    if not extra:
        return verdict
    worse = [worse_by(x, verdict.baseline, verdict.direction) for x in extra]
    still = all(w > verdict.threshold for w in worse) if verdict.outcome == "regressed" \
        else all(-w > verdict.threshold for w in worse)
    v = replace(verdict, confirmations=extra)
    if not still:
        v.outcome, v.failed = "transient", False
    v.message = _message(v, record)
    return v


def explain_clock(records: Sequence[ResultRecord], verdicts: Sequence[Verdict]) -> list[Verdict]:
    """Say, in a failing throughput verdict, whether its clock-normalised partner moved too.

    A figure such as ``bf16_flop_per_sm_cycle`` names the figure it normalises (``info
    ["normalises"]``).  When that figure regressed (or improved beyond its threshold) and the
    per-cycle figure held, the SM clock ran lower: a power or clock cap, not a slower kernel.  When
    both moved, the kernel itself is slower (or faster) per cycle.
    """
    by_name = {v.metric: v for v in verdicts}
    by_metric = {r.metric.name: r for r in records}
    for rec, v in zip(records, verdicts):
        target = rec.metric.info.get("normalises") if isinstance(rec.metric.info, Mapping) else None
        main = by_name.get(str(target)) if target else None
        if main is None or main.outcome not in ("regressed", "improved") or v.change_pct is None \
                or main.change_pct is None or not main.change_pct:
            continue
        moved_too = v.change_pct / main.change_pct >= 0.5  # the per-cycle figure moved at least half as much
        main.clock = ClockNote(v.metric, v.change_pct, moved_too)
        main.message = _message(main, by_metric[main.metric])
    return list(verdicts)


def failing(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """The verdicts that fail their test."""
    return [v for v in verdicts if v.failed]


def failure_text(verdicts: Sequence[Verdict]) -> str:
    """The text a failing benchmark test shows: one line per failing metric."""
    return "\n".join(v.line() for v in failing(verdicts))


__all__ = [
    "DEFAULT_TOLERANCE", "compare", "compare_reference", "confirm", "explain_clock", "failing", "failure_text",
    "fingerprint_changes", "fingerprint_diff", "format_number", "percent",
    "incomparable_reason", "make_verdict", "parse_tolerance", "value_text", "worse_by",
]
