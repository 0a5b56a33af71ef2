"""How far a figure may move before it is called changed: thresholds from run-to-run noise.

Plain numbers in, a :class:`Band` out; no files, no pytest.  The rule (what docs/detection.md
measures on the GPU):

* The baseline is the **median of the runs kept** in the figure's history (the last 10 by default).
* Its run-to-run noise (sigma) is the larger of two spreads of those runs, relative to the median:
  the robust one, ``scipy.stats.median_abs_deviation(scale="normal")`` (1.4826 x MAD), and the sample
  standard deviation (``numpy.std(ddof=1)``).  From 5 to 10 runs the MAD alone can come out far too
  small by chance: on an H100 five runs of fp32 FMA energy gave a MAD sigma of 0.15% where seven runs'
  standard deviation was 1.0%, and the next run raised a false alarm at the 1% floor.  The standard
  deviation errs the other way (a wider band: a missed detection rather than a false alarm, the side
  a nightly must err on), but one transient dip kept in the history would blind a figure for ten
  nights: bf16 GEMM, 0.30% CV with one 5% dip in 10 runs, would not gate.  So from ``TRIM_FROM`` (8)
  runs on, the one run farthest from the median is left out of the standard deviation (never out
  of the MAD): one dip is what re-measurement is for, two are a pattern.  Sigma comes from separate runs,
  never from one run's repeats: repeats share a process, clocks and temperature and understate how
  much a figure moves between nights (the within-run spread is kept in the history for review only).
* **Threshold** = max(``FLOOR`` 1%, ``K`` x sigma), ``K`` = 5.  Like conbench's lookback z-score
  (z = 5) with a floor, as asv's factor and Otava's minimum magnitude do, so that sub-noise wiggles
  of very quiet figures never fail.  Why 5: a nightly suite has about 100 gating figures and may
  raise at most 1 false alarm in 100 runs, so one figure may raise about 1 in 10^4.  For a normal
  figure whose sigma were known that is 3.7 sigma; sigma is estimated from 10 runs or fewer, and a
  run's own dips are not normal, so 5 leaves room for both.  A figure beyond its threshold is then
  re-measured (see pytest_mig.judge.verdict), which removes transient dips, the cases where 5 alone was
  seen to fail on the GPU.
* **A short history** (1 to ``MIN_RUNS`` - 1 = 4 runs) cannot measure its own sigma, so it is judged
  with a **prior** (:class:`Prior`): the figure's run-to-run sigma measured in the shipped reference
  of its GPU model and profile (night to night on one board where the history is one board's, else
  across boards) or, for a GPU model with no reference, on the models that have one (see
  :mod:`pytest_mig.judge.prior`), pooled from at least ``MIN_PRIOR_DOF`` (4) degrees of freedom.
  Sigma is the larger of the prior, the few runs' own sample standard deviation and their timing
  partners', and the threshold is ``K`` x sigma x sqrt(1 + 1/n): a new run differs from the mean
  of n runs by sigma x sqrt(1 + 1/n), so one run in the history widens the band by 41%, four by
  12%.  Where that threshold is within the tolerance the figure gates from the second night; where
  it is wider, the band is the conservative
  one below (it never judges a noisy figure at its tolerance on a handful of runs).  With no prior
  at all (no reference knows the figure or its kind), **too few runs** give no usable estimate of
  sigma: the band is at least ``FEW_RUNS_BAND`` (10%), wider when the few runs already differ
  (``K`` x their sample standard deviation), and the verdict says so.
* **A short history borrows the reference's noise**: from ``MIN_RUNS`` up to ``PRIOR_RUNS`` (10)
  runs, sigma is never below that prior.  Runs taken back to back understate night-to-night noise:
  on an H100, ``pytest-mig calibrate -n 5`` gave bf16 GEMM a sigma of 0.20% and a 1% threshold, and
  the very next unchanged run failed at -1.3%; with ten runs its sigma was 0.68% and six unchanged
  runs passed.  From ``PRIOR_RUNS`` runs on the site's own history alone sets sigma.
* **Tolerance**: a site's explicit tolerance (marker, ``--mig-tolerance``, ini, or a tolerance set
  in the baseline file) caps the threshold: the site asks that changes beyond it fail, and accepts
  the false alarms its noise may then bring.  Without one, a figure whose threshold would exceed the
  default tolerance (5%) **does not gate**: it is reported as too noisy to gate, with its CV, and
  never as regressed.
* **Smallest detectable change** = threshold + ``DETECT_Z`` (2.2) x sigma: a sustained change of that
  size lands beyond the threshold in 98.6% of measurements, so a verdict that needs all three
  measurements beyond (the first and two re-measurements) catches it in >= 95% of runs whether the
  three are independent (0.986^3) or not.
* **Against a shipped reference** (:func:`reference_band`; a first night, before a site has a
  history of its own): the reference is the median of runs of *another* board of the same model, so
  the band must also hold what differs from board to board, which the reference's own runs cannot
  show.  On two H100 80GB HBM3 boards (docs/detection.md) throughput figures differed by up to 4.9%
  (fp32 GEMM) and energy per unit of work by up to 6.6%; so the threshold is at least
  ``REFERENCE_FLOOR`` (10%), wider where the figure's run-to-run sigma across the reference's runs
  (``K`` x sigma) is wider, and a figure whose threshold would exceed ``REFERENCE_MAX`` (12%) is too
  noisy to judge against another board: reported, not judged.  A GPU 15% under the reference fails.
* **Shared work**: energy per unit of work is power x time / work, so a figure such as
  J/token moves with the step time it divides.  Its runs alone can look quieter than they are (a
  host-bound step that ran slower drew less power in the reference runs, and not in the next one:
  on an H100, small-batch GPT-2 training's J/token had a pooled sigma of 1.9% while its tokens/s had
  5.1%, and an unchanged run then read tokens/s -15.5% and J/token +11.9%, a false alarm at the 10%
  band).  So its sigma is never below that of the rate figures that time the same work
  (``partners``: :func:`pytest_mig.measure.timing_partners`), and the band names the one that set it.
  For quiet kernels (GEMM, STREAM, OpenMM) the energy figure's own sigma is the larger and nothing
  changes; a figure whose throughput is too noisy to gate does not gate its energy either.  The same
  holds for cost per unit of work (SU), and for GEMM's headline (about 2 s of calls) beside its
  sustained rate (the same calls' size over the longer energy window): on four H200s one board's
  headline moved -1.15% between two nights where three other boards' nights had agreed to 0.15%,
  which made their prior a 1% band (docs/results/h200x4-nights-2026-11-28.tgz).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

#: From this many runs on, the run farthest from the median is left out of the standard deviation.
TRIM_FROM = 8
#: Thresholds in units of the run-to-run sigma.
K = 5.0
#: No threshold is tighter than this (relative).
FLOOR = 0.01
#: Runs needed before the history's spread is trusted.
MIN_RUNS = 5
#: Until a history has this many runs, its sigma is never below the reference's (``band(prior=...)``).
PRIOR_RUNS = 10
#: ``Band.sigma_of`` where the reference's sigma for the figure's own GPU model and profile (the prior) was the larger.
PRIOR = "the reference"
#: ``Band.sigma_of`` where the reference's sigma on one board (a history of one board's nights) was the larger.
PRIOR_BOARD = "the reference, on one board"
#: ``Band.sigma_of`` where an emulated profile's spread across the reference's boards, each run once,
#: was the larger (:meth:`pytest_mig.judge.reference.Reference.spread_for`).
PRIOR_SPREAD = "the reference, across this profile's boards"
#: The priors from the reference of the figure's own GPU model and profile.
REFERENCE_PRIORS = (PRIOR, PRIOR_BOARD, PRIOR_SPREAD)
#: Degrees of freedom a prior needs before it judges a short history.
MIN_PRIOR_DOF = 4
#: How ``Band.sigma_of`` starts where a prior from other GPU models was the larger (see :class:`Prior`).
PRIOR_ELSEWHERE = "prior: "
#: The threshold while a history has fewer than MIN_RUNS runs.
FEW_RUNS_BAND = 0.10
#: The narrowest band against a shipped reference (another board of the model): board-to-board spread.
REFERENCE_FLOOR = 0.10
#: A figure whose band against a reference would be wider than this is not judged against it.
REFERENCE_MAX = 0.12
#: Sigmas between the threshold and a change caught in >= 95% of runs (re-measured, see the docstring).
DETECT_Z = 2.2


@dataclass(frozen=True)
class Prior:
    """A figure's run-to-run sigma known before its history can measure it, and whose it is:
    ``PRIOR`` (the reference of its own GPU model and profile), ``PRIOR_BOARD`` (the same, on one
    board), ``PRIOR_SPREAD`` (an emulated profile's spread across its boards) or a phrase starting with ``PRIOR_ELSEWHERE`` that a verdict shows as it is."""

    sigma: float
    source: str = PRIOR
    dof: int | None = None  # the runs it was pooled from, less one per group (None: unknown)

    @property
    def judges_short(self) -> bool:
        """Whether it is known well enough to judge a history of fewer than MIN_RUNS runs: pooled
        from at least ``MIN_PRIOR_DOF`` degrees of freedom (a sigma from two runs can be near zero by
        chance, and a band built on it would cry wolf)."""
        return self.dof is None or self.dof >= MIN_PRIOR_DOF


def is_prior(sigma_of: str | None) -> bool:
    """Whether ``Band.sigma_of`` names a prior rather than a timing partner."""
    return sigma_of is not None and (sigma_of in REFERENCE_PRIORS or sigma_of.startswith(PRIOR_ELSEWHERE))


@dataclass(frozen=True)
class Band:
    """The threshold of one figure, and what it says about the figure."""

    center: float  # the baseline: median of the runs
    runs: int
    sigma: float | None  # relative run-to-run sigma; None with fewer than MIN_RUNS runs
    threshold: float  # relative change beyond which the figure is called changed
    detectable: float  # the smallest sustained change caught in >= 95% of runs
    gates: bool  # False: too noisy to gate at the tolerance
    basis: str  # "noise", "floor", "short" (a prior), "few-runs", "tolerance" (capped by an explicit tolerance), "reference"
    limit: float  # the tolerance the threshold was held to
    sigma_of: str | None = None  # the partner figure or prior whose larger spread set the sigma (None: its own)
    widen: float = 1.0  # sqrt(1 + 1/n) for a short history judged with a prior

    @property
    def cv(self) -> float | None:
        return self.sigma


def run_sigma(values: Sequence[float]) -> float:
    """Relative run-to-run sigma: max(1.4826 x MAD, sample SD) / |median| (0 when unknown); from
    TRIM_FROM runs on, the SD leaves out the one run farthest from the median."""
    xs = np.asarray([float(v) for v in values if math.isfinite(v)], dtype=float)
    if xs.size < 2:
        return 0.0
    med = float(np.median(xs))
    if med == 0:
        return 0.0
    from scipy import stats  # here: its import takes most of a second, which every pytest-mig command would pay

    mad = float(stats.median_abs_deviation(xs, scale="normal"))
    rest = np.delete(xs, int(np.argmax(np.abs(xs - med)))) if xs.size >= TRIM_FROM else xs
    return max(mad, float(np.std(rest, ddof=1))) / abs(med)


def spread(values: Sequence[float]) -> float:
    """A history's relative spread as :func:`band` reads it: :func:`run_sigma` from ``MIN_RUNS``
    runs on, below that the sample standard deviation over the median (0 with fewer than two)."""
    xs = [float(v) for v in values if math.isfinite(v)]
    if len(xs) >= MIN_RUNS:
        return run_sigma(xs)
    center = statistics.median(xs) if xs else 0.0
    return statistics.stdev(xs) / abs(center) if len(xs) >= 2 and center else 0.0


def _widest(own: float, partners: Mapping[str, float]) -> tuple[float, str | None]:
    """The larger of a figure's own sigma and its partners' (ties keep its own), and whose it is."""
    name, value = max(partners.items(), key=lambda kv: kv[1], default=(None, -1.0))
    return (value, name) if value > own else (own, None)


def _as_prior(prior: Prior | float | None) -> Prior | None:
    if isinstance(prior, Prior):
        return prior if _known(prior.sigma) else None
    return Prior(float(prior)) if _known(prior) else None


def band(values: Sequence[float], *, tolerance: float | None = None,
         default_tolerance: float = 0.05, partners: Mapping[str, Sequence[float]] | None = None,
         prior: Prior | float | None = None) -> Band:
    """The band of a figure whose kept runs are ``values`` (oldest first).

    ``tolerance`` is a site's explicit tolerance (it caps the threshold); ``default_tolerance`` is
    what a figure must be able to hold to gate when no tolerance was set.  ``partners`` are the
    histories of the rate figures that time the same work (an energy or cost figure's, a headline's), by name: its sigma is at
    least each one's :func:`spread`.  ``prior`` is the figure's sigma known from elsewhere (a float:
    the shipped reference's): a history of fewer than ``PRIOR_RUNS`` runs is never judged with a
    smaller one, and one of fewer than ``MIN_RUNS`` runs is judged with it (the module docstring).
    """
    xs = [float(v) for v in values if math.isfinite(v)]
    if not xs:
        raise ValueError("a band needs at least one finite run")
    center = float(statistics.median(xs))
    n = len(xs)
    limit = tolerance if tolerance is not None else default_tolerance
    shared = {name: spread(v) for name, v in (partners or {}).items()}
    known = _as_prior(prior)
    if n < MIN_RUNS:
        return _short_band(xs, center, shared, known, tolerance, limit)
    sigma, sigma_of = _widest(run_sigma(xs), shared)
    if n < PRIOR_RUNS and known is not None and known.sigma > sigma:
        sigma, sigma_of = known.sigma, known.source
    noise_threshold = K * sigma
    threshold, basis = (noise_threshold, "noise") if noise_threshold > FLOOR else (FLOOR, "floor")
    gates = True
    if tolerance is not None:
        if tolerance < threshold:
            threshold, basis = tolerance, "tolerance"
    elif threshold > default_tolerance:
        gates = False
    return Band(center, n, sigma, threshold, threshold + DETECT_Z * sigma, gates, basis, limit, sigma_of)


def _short_band(xs: list[float], center: float, shared: Mapping[str, float], prior: Prior | None,
                tolerance: float | None, limit: float) -> Band:
    """The band of a history of fewer than MIN_RUNS runs (the module docstring)."""
    n = len(xs)
    own, sigma_of = _widest(spread(xs), shared)
    few = max(FEW_RUNS_BAND, K * own)
    if prior is not None and prior.judges_short:
        sigma = own
        if prior.sigma > own:
            sigma, sigma_of = prior.sigma, prior.source
        widen = math.sqrt(1.0 + 1.0 / n)
        threshold = max(FLOOR, K * sigma * widen)
        if threshold <= limit or (tolerance is not None and threshold <= FEW_RUNS_BAND):
            basis = "short"
            if tolerance is not None and tolerance < threshold:
                threshold, basis = tolerance, "tolerance"
            return Band(center, n, sigma, threshold, threshold + DETECT_Z * sigma * widen, True, basis, limit,
                        sigma_of, widen)
        few = max(few, threshold)
    basis = "few-runs"
    if tolerance is not None and tolerance < few:
        few, basis = tolerance, "tolerance"
    return Band(center, n, None, few, few, True, basis, limit, sigma_of)


def _known(sigma: float | None) -> bool:
    return sigma is not None and math.isfinite(sigma) and sigma >= 0


def reference_band(values: Sequence[float], sigma: float | None,
                   partners: Mapping[str, float | None] | None = None) -> Band:
    """The band of a figure judged against a shipped reference whose runs are ``values``.

    ``sigma`` is the figure's relative run-to-run sigma across the reference's runs (pooled over the
    model's profiles when it was built).  None (a single run: its noise unknown): the figure is
    shown against the reference but not judged, since a noisy figure would raise false alarms.
    ``partners``: the pooled sigmas of the rate figures that time the same work, by
    name; the larger one is its sigma, and one that is unknown leaves its noise unknown too.
    """
    xs = [float(v) for v in values if math.isfinite(v)]
    if not xs:
        raise ValueError("a band needs at least one finite run")
    partners = partners or {}
    known = _known(sigma) and all(_known(p) for p in partners.values())
    s, sigma_of = _widest(float(sigma), {k: float(v) for k, v in partners.items()}) if known else (0.0, None)  # type: ignore[arg-type]
    threshold = max(REFERENCE_FLOOR, K * s)
    return Band(float(statistics.median(xs)), len(xs), s if known else None, threshold, threshold + DETECT_Z * s,
                known and threshold <= REFERENCE_MAX, "reference", REFERENCE_MAX, sigma_of)


__all__ = ["Band", "DETECT_Z", "FEW_RUNS_BAND", "FLOOR", "K", "MIN_PRIOR_DOF", "MIN_RUNS", "PRIOR", "PRIOR_BOARD",
           "PRIOR_ELSEWHERE", "PRIOR_RUNS", "PRIOR_SPREAD", "Prior", "REFERENCE_FLOOR", "REFERENCE_MAX",
           "REFERENCE_PRIORS", "TRIM_FROM", "band", "is_prior", "reference_band", "run_sigma", "spread"]
