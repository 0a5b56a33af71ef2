"""Verdicts: one run's figure against its baseline, in words a person can act on.

The rule (one place, used by the plugin and by ``pytest-mig compare``):

* Never compared: informational metrics (outcome ``info``); figures of another GPU model, another
  profile, or emulated against real (``incomparable``); different units or directions
  (``incomparable``: the metric was redefined, re-record the baseline).
* ``worse`` is the relative change in the bad direction (a TFLOPS drop, a time increase).
* The tolerance is, in this order: the test's marker (``tolerance=``), the baseline entry's
  ``tolerance``, then the ini default (5%).
* Significance, from the samples (this run's and the ones kept in the baseline entry):
  - with at least ``MW_MIN_SAMPLES`` (7) on both sides, a two-sided Mann-Whitney U test (normal
    approximation with tie and continuity corrections) must give p < ``MW_ALPHA`` (0.002), as asv
    does.  Each side's samples are first scaled so that their median is that side's value: the
    value is what is compared (a baseline edited by hand to claim 10% more fails a run that
    matches the old samples), the samples give the shape of the noise around it;
  - with fewer, the change must exceed the noise band ``NOISE_K`` (2) x the combined robust relative
    spread, ``2 * sqrt(s_run**2 + s_base**2)`` with ``s = 1.4826 * MAD / median``: the spread of
    the samples themselves, not the standard error of the median, because repeats inside one run
    share clocks and temperature and understate run-to-run variation;
  - without samples on either side the tolerance alone decides.
  Simulated on synthetic samples (10 per side): an unchanged metric with an 8% spread is called
  regressed in fewer than 1 in 1000 comparisons; a 10% drop with a 3% spread is caught in more than
  99% (the spread band alone caught 78%); a 5% drop with a 0.3% spread is always caught at a 3%
  tolerance.
* ``regressed`` when worse by more than the tolerance AND significant; ``improved`` when better by
  more than the tolerance AND significant; otherwise ``pass`` (the message says when a change beyond
  the tolerance was not significant).
* A throttled measurement (power or thermal clock-event reasons before or after it) is still judged,
  and a regression still fails (users get the slow GPU, and the cooling or power cap needs fixing),
  but the message says the throttle is the likely cause, so it is not blamed on the driver.
* ``improved`` fails only with ``improvement_fails`` (``--mig-fail-on-improvement``): a stale
  baseline hides regressions.

The message names the metric, value, baseline, change, tolerance and what differs in the
fingerprint since the baseline was recorded, e.g.
``fp16_tflops 138.2 TFLOPS, baseline 151.7 TFLOPS (-8.9%, tolerance 5%); since the baseline:
driver 550.54 -> 560.35``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

from .baselines import (
    DEFAULT_TOLERANCE,
    EMULATED_SUFFIX,
    Baseline,
    BaselineEntry,
    BaselineMeta,
    BaselineStore,
    Spread,
    meta_from_record,
    throttle_reasons,
)
from .profiles import CPU
from .results import ResultRecord

Outcome = Literal["pass", "regressed", "improved", "no-baseline", "incomparable", "info"]
OUTCOMES: tuple[str, ...] = ("pass", "regressed", "improved", "no-baseline", "incomparable", "info")

#: How many combined robust sigmas a change must exceed to count as more than noise (few samples).
NOISE_K = 2.0

#: Samples needed on both sides for the rank test, and its significance level.
MW_MIN_SAMPLES = 7
MW_ALPHA = 0.002

#: Fingerprint keys in the order a verdict names them (likely culprits first), with their labels
#: and units.  Keys not listed here are still diffed, after these, in sorted order.
FINGERPRINT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("driver", "driver", ""),
    ("cuda_driver", "CUDA driver", ""),
    ("cuda_runtime", "CUDA runtime", ""),
    ("vbios", "VBIOS", ""),
    ("inforom", "InfoROM", ""),
    ("gsp", "GSP firmware", ""),
    ("ecc", "ECC", ""),
    ("power_limit_w", "power limit", " W"),
    ("max_sm_clock_mhz", "max SM clock", " MHz"),
    ("max_mem_clock_mhz", "max memory clock", " MHz"),
    ("torch", "torch", ""),
    ("python", "Python", ""),
    ("gpu_name", "GPU", ""),
    ("memory_total_mib", "memory", " MiB"),
)


@dataclass
class Verdict:
    """The outcome for one metric of one test, and the sentence that explains it."""

    outcome: Outcome
    metric: str
    value: float | None
    baseline: float | None
    change_pct: float | None  # signed change of the value in percent (-8.9 = 8.9% lower)
    tolerance: float | None  # fraction
    noise: float | None  # the noise band as a fraction (0 when there were no samples)
    p_value: float | None = None  # Mann-Whitney p of this run's samples against the baseline's, when used
    fingerprint_changes: list[str] = field(default_factory=list)
    throttled: list[str] = field(default_factory=list)
    message: str = ""
    unit: str = ""
    test: str = ""
    failed: bool = False  # does this verdict fail the test?

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """The message with its outcome in front, as a failing test shows it."""
        return f"{self.outcome.upper()} {self.test + ' ' if self.test else ''}{self.message}".rstrip()


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


def _pct(fraction: float) -> str:
    """0.05 -> '5%', 0.0063 -> '0.63%', 0.125 -> '12.5%', 1.0 -> '100%' (never an exponent)."""
    pct = fraction * 100
    if abs(pct) >= 10:
        return f"{pct:.1f}".rstrip("0").rstrip(".") + "%"
    return f"{pct:.2g}%"


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p of the Mann-Whitney U test (normal approximation, tie and continuity corrected).

    Rank-based, so it needs no assumption about the shape of timing noise and works on samples
    in any unit monotonic in the metric (seconds for a TFLOPS figure flip the sign, not the p).
    """
    n1, n2 = len(a), len(b)
    if not n1 or not n2:
        return 1.0
    pooled = sorted([(float(x), 0) for x in a] + [(float(x), 1) for x in b])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0)
    u = r1 - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    n = n1 + n2
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0 if u == mu else 0.0
    z = max(0.0, abs(u - mu) - 0.5) / math.sqrt(var)
    return math.erfc(z / math.sqrt(2))


def parse_tolerance(text: str | float) -> float:
    """'5%' or '0.05' -> 0.05.  A bare number above 1 is refused: write 5% or 0.05."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        try:
            value = float(s[:-1]) / 100 if s.endswith("%") else float(s)
        except ValueError:
            raise ValueError(f"tolerance '{text}' is not a number: write a percentage such as 5% or a fraction such as 0.05") from None
        if not s.endswith("%") and value > 1:
            raise ValueError(f"tolerance '{text}' is ambiguous: write {s}% or {value / 100:g}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"tolerance '{text}' must be zero or positive")
    return value


def _show(key: str, value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "on" if value else "off"
    if key in ("cuda_driver", "cuda_runtime") and isinstance(value, int) and value >= 1000:
        return f"{value // 1000}.{(value % 1000) // 10}"  # NVML's 12040 -> 12.4
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"


def fingerprint_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """What changed between two fingerprints, e.g. ``["driver 550.54 -> 560.35", "torch 2.4.0 -> 2.5.1"]``.

    A key absent from either side is not reported (an older file may not have recorded it); a key
    present on both sides whose value became unknown is (``GSP firmware 550.54 -> n/a``).
    """
    old, new = dict(old or {}), dict(new or {})
    known = [k for k, _, _ in FINGERPRINT_FIELDS]
    labels = {k: (label, unit) for k, label, unit in FINGERPRINT_FIELDS}
    keys = known + sorted(k for k in set(old) & set(new) if k not in labels)
    out: list[str] = []
    for key in keys:
        if key not in old or key not in new or old[key] == new[key]:
            continue
        label, unit = labels.get(key, (key, ""))
        a, b = _show(key, old[key], unit), _show(key, new[key], unit)
        if a != b:
            out.append(f"{label} {a} -> {b}")
    return out


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


def _value_text(record: ResultRecord) -> str:
    m = record.metric
    return f"{m.name} {format_number(m.value)} {m.unit}".rstrip()


def _verdict(record: ResultRecord, outcome: Outcome, message: str, **kw: Any) -> Verdict:
    m = record.metric
    fields: dict[str, Any] = dict(baseline=None, change_pct=None, tolerance=None, noise=None, p_value=None)
    fields.update(kw)
    return Verdict(outcome=outcome, metric=m.name, value=m.value, unit=m.unit, test=record.test,
                   message=message, **fields)


def _centred(samples: Sequence[float], value: float) -> list[float]:
    """Samples scaled so their median is ``value``: the figure (reviewed in the baseline file,
    perhaps edited by hand, perhaps a peak over sizes) is what is compared; the samples only give
    the shape of the noise around it."""
    med = statistics.median(samples)
    return [s * value / med for s in samples] if med else list(samples)


def compare(
    record: ResultRecord,
    baseline_entry: BaselineEntry | Baseline | None,
    baseline_meta: BaselineMeta | Baseline | None = None,
    *,
    tolerance: float | None = None,
    improvement_fails: bool = False,
    default_tolerance: float = DEFAULT_TOLERANCE,
) -> Verdict:
    """Judge one record against its baseline entry (see the module docstring for the rule).

    ``tolerance`` is the marker's (it wins); ``baseline_meta`` says what the baseline file is for,
    so a figure of another GPU model, profile or kind of target is never compared.  A whole
    :class:`Baseline` may be passed instead of the entry: its entry for this test and metric and
    its meta are used.
    """
    m = record.metric
    if isinstance(baseline_entry, Baseline):
        baseline_meta = baseline_meta or baseline_entry
        baseline_entry = baseline_entry.get(record.test, m.name)
    meta = baseline_meta.meta if isinstance(baseline_meta, Baseline) else baseline_meta
    throttled = throttle_reasons(m.info)
    value_text = _value_text(record)
    if not m.compare:
        return _verdict(record, "info", f"{value_text} (informational, not compared)", throttled=throttled)
    if meta is not None:
        reason = incomparable_reason(record, meta)
        if reason:
            return _verdict(record, "incomparable", f"{value_text} not compared: {reason}", throttled=throttled)
    if baseline_entry is None:
        where = f" in {meta.path or f'{meta.gpu_model} {meta.profile}'}" if meta else ""
        return _verdict(record, "no-baseline", f"{value_text}: no baseline{where} (record one with --mig-save-baseline)",
                        throttled=throttled)
    e = baseline_entry
    if e.mode != record.mode:  # no baseline value shown: a figure of other sizes would read as a change
        run_mode = "with --mig-quick" if record.mode == "quick" else "without --mig-quick"
        base_mode = "a quick run (--mig-quick)" if e.mode == "quick" else "a normal run"
        return _verdict(record, "incomparable",
                        f"{value_text} not compared: measured {run_mode} but the baseline was recorded in "
                        f"{base_mode}, and the workloads' sizes differ; run as the baseline was recorded, or "
                        f"record this mode's with --mig-save-baseline", throttled=throttled)
    if e.unit != m.unit or e.direction != m.direction:
        return _verdict(record, "incomparable",
                        f"{value_text} not compared: the baseline is in {e.unit or 'no unit'}, {e.direction} is better, "
                        f"this run in {m.unit or 'no unit'}, {m.direction} is better; re-record the baseline",
                        baseline=e.value, throttled=throttled)
    if not math.isfinite(m.value) or e.value == 0:
        bad = f"this run's value is {m.value}" if not math.isfinite(m.value) else "the baseline value is 0"
        return _verdict(record, "incomparable", f"{value_text} not compared: {bad}", baseline=e.value,
                        throttled=throttled)

    tol = tolerance if tolerance is not None else e.tolerance if e.tolerance is not None else default_tolerance
    change = (m.value - e.value) / abs(e.value)
    worse = -change if m.direction == "higher" else change
    run_spread = Spread.of(m.samples)
    s_run = run_spread.rel_sigma if run_spread else 0.0
    s_base = e.spread.rel_sigma if e.spread else 0.0
    noise = NOISE_K * math.hypot(s_run, s_base)
    p_value: float | None = None
    if len(m.samples) >= MW_MIN_SAMPLES and len(e.samples) >= MW_MIN_SAMPLES:
        p_value = mann_whitney_p(_centred(m.samples, m.value), _centred(e.samples, e.value))
        significant = p_value < MW_ALPHA
    else:
        significant = abs(worse) > noise
    old_fp = e.fingerprint or (meta.fingerprint if meta else {})
    changes = fingerprint_diff(old_fp, record.fingerprint)

    if worse > tol and significant:
        outcome: Outcome = "regressed"
    elif -worse > tol and significant:
        outcome = "improved"
    else:
        outcome = "pass"

    noise_text = f", noise ±{_pct(noise)}" if noise > 0 else ""
    msg = (f"{value_text}, baseline {format_number(e.value)} {e.unit}".rstrip()
           + f" ({change * 100:+.1f}%, tolerance {_pct(tol)}{noise_text})")
    if outcome == "pass" and abs(worse) > tol:
        why = (f"not significant against the samples (Mann-Whitney p={p_value:.2g})" if p_value is not None
               else f"within the measured noise (±{_pct(noise)})")
        msg += f"; {why}, so not called a {'regression' if worse > 0 else 'change'}"
    if changes:
        msg += "; since the baseline: " + ", ".join(changes)
    elif outcome in ("regressed", "improved"):
        msg += "; nothing in the fingerprint changed since the baseline"
    if throttled:
        msg += f"; GPU was throttled during the measurement ({', '.join(throttled)})"
        if outcome == "regressed":
            msg += ": not blamed on the driver, the throttle is the likely cause"
    if e.throttled and outcome != "pass":
        msg += f"; the baseline was recorded while throttled ({', '.join(e.throttled)})"
    failed = outcome == "regressed" or (outcome == "improved" and improvement_fails)
    return _verdict(record, outcome, msg, baseline=e.value, change_pct=change * 100, tolerance=tol, noise=noise,
                    p_value=p_value, fingerprint_changes=changes, throttled=throttled, failed=failed)


def _tolerance_for(tolerance: float | Mapping[str, float] | None, metric: str) -> float | None:
    if tolerance is None or isinstance(tolerance, (int, float)):
        return tolerance
    return tolerance.get(metric)


def judge(
    records: Iterable[ResultRecord],
    store: BaselineStore | None,
    *,
    tolerance: float | Mapping[str, float] | None = None,
    default_tolerance: float = DEFAULT_TOLERANCE,
    improvement_fails: bool = False,
    compare_cpu: bool = False,
) -> list[Verdict]:
    """Verdicts for one test's records against the store; sets each ``record.verdict``.

    ``tolerance`` is the marker's: one fraction for all metrics or a mapping from metric name to
    fraction.  CPU runs are not compared unless ``compare_cpu`` (CPU timings say nothing about a
    GPU driver).  A baseline file that cannot be read raises BaselineError: a broken baseline is
    an error to fix, not a reason to pass.
    """
    verdicts: list[Verdict] = []
    for rec in records:
        meta = meta_from_record(rec)
        if not rec.metric.compare:
            v = compare(rec, None, None)
        elif meta.gpu_slug == CPU and not compare_cpu:
            v = _verdict(rec, "info", f"{_value_text(rec)}: measured on the CPU, not compared with a baseline")
        else:
            base = store.load(meta.gpu_slug, meta.profile) if store is not None else None
            if base is None:
                where = f" {store.path_for(meta.gpu_slug, meta.profile)}" if store is not None else ""
                v = _verdict(rec, "no-baseline",
                             f"{_value_text(rec)}: no baseline file{where} (record one with --mig-save-baseline)",
                             throttled=throttle_reasons(rec.metric.info))
            else:
                v = compare(rec, base.get(rec.test, rec.metric.name), base.meta,
                            tolerance=_tolerance_for(tolerance, rec.metric.name),
                            improvement_fails=improvement_fails, default_tolerance=default_tolerance)
        rec.verdict = v.to_dict()
        verdicts.append(v)
    return verdicts


def failing(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """The verdicts that fail their test."""
    return [v for v in verdicts if v.failed]


def failure_text(verdicts: Sequence[Verdict]) -> str:
    """The text a failing benchmark test shows: one line per failing metric."""
    return "\n".join(v.line() for v in failing(verdicts))


__all__ = [
    "DEFAULT_TOLERANCE", "EMULATED_SUFFIX", "FINGERPRINT_FIELDS", "NOISE_K", "OUTCOMES", "Outcome", "Verdict",
    "MW_ALPHA", "MW_MIN_SAMPLES", "compare", "failing", "failure_text", "fingerprint_diff", "format_number",
    "incomparable_reason", "judge", "mann_whitney_p",
    "parse_tolerance",
]
