"""The Metric record every workload produces, its kinds, robust statistics, and which figures share a timing."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal, Mapping, Sequence

from pytest_mig.measure.clocks import Clocks

Direction = Literal["higher", "lower"]

#: Kinds of metric; the verdict and scaling layers pick tolerances and ideal bases by kind.
METRIC_KINDS = ("compute", "tensor", "memory", "training", "simulation", "energy", "cost", "info")
#: Kinds that rate a test's timed work (TFLOPS, GB/s, tokens/s, ns/day, or the time per unit of it).
RATE_KINDS = ("compute", "tensor", "memory", "training", "simulation")
#: ``energy_metrics`` names its figure ``<label>_energy_j_per_<unit>`` (no label: ``energy_j_per_<unit>``).
ENERGY_INFIX = "energy_j_per_"
#: A rate over the energy window itself is named ``<label>_sustained_<unit>`` (see timing_partners).
SUSTAINED = "sustained_"
#: A training step's time, which grows with the batch the step runs.
STEP_TIME = "step_time_s"
#: How the id of a test ends whose case runs at the largest batch its Target holds
#: (``benchmarks/test_training.py``: ``-maxbatch``, ``-compiled-maxbatch``).
LARGEST_BATCH = "maxbatch]"
#: ``info["statistic"]`` of a figure reported as the best of its repeats, not their median.
BEST = "best"


def best_rate(samples: Iterable[float]) -> float:
    """The best (largest) of a figure's rates per repeat; NaN where none is finite and positive.

    The figure of work that only something outside the GPU can slow and nothing can speed past its
    limit, as STREAM reports its best iteration: a host-device copy, which a stall of the host's
    memory or PCIe switch slows now and then (the median of 20 copies moved 1.0% from night to night
    on H100s where their best moved 0.12%: docs/detection.md)."""
    good = [float(s) for s in samples if math.isfinite(s) and s > 0]
    return max(good) if good else float("nan")


@dataclass
class Metric:
    """One named figure of one test: what the verdict layer compares and the reports print."""

    name: str
    value: float
    unit: str
    direction: Direction = "higher"
    samples: list[float] = field(default_factory=list)
    kind: str = "compute"
    info: dict[str, Any] = field(default_factory=dict)
    compare: bool = True  # False: informational (size at peak, power), never a regression

    def __post_init__(self) -> None:
        if self.direction not in ("higher", "lower"):
            raise ValueError(f"direction must be 'higher' or 'lower', not {self.direction!r}")
        if self.kind not in METRIC_KINDS:
            raise ValueError(f"kind must be one of {METRIC_KINDS}, not {self.kind!r}")
        self.value = float(self.value)
        self.samples = [float(s) for s in self.samples]

    @property
    def stats(self) -> "Stats | None":
        """Summary of the finite samples (a NaN sample is left out, never a crash); None without any."""
        finite = [x for x in self.samples if math.isfinite(x)]
        return Stats.of(finite) if finite else None

    @property
    def clocks(self) -> Clocks:
        """The SM clock it ran at and the throttle it met, as its ``info["clocks"]`` records them."""
        return Clocks.of(self.info)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        st = self.stats
        d["stats"] = asdict(st) if st else None
        return d


@dataclass(frozen=True)
class Stats:
    """Robust summary of repeated samples."""

    n: int
    median: float
    mean: float
    min: float
    max: float
    mad: float  # median absolute deviation
    iqr: float
    cv: float  # stdev / mean (0 for one sample)

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Stats":
        if not samples:
            raise ValueError("no samples")
        xs = sorted(float(s) for s in samples)
        med = statistics.median(xs)
        mean = statistics.fmean(xs)
        mad = statistics.median([abs(x - med) for x in xs])
        if len(xs) >= 2:
            q = statistics.quantiles(xs, n=4, method="inclusive")
            iqr = q[2] - q[0]
            cv = statistics.stdev(xs) / mean if mean else 0.0
        else:
            iqr, cv = 0.0, 0.0
        return cls(len(xs), med, mean, xs[0], xs[-1], mad, iqr, cv)


def within_run_noise(samples: Iterable[float]) -> float | None:
    """Relative robust spread (1.4826 x MAD / median) of one run's repeats; None with fewer than 2."""
    xs = [float(s) for s in samples if math.isfinite(s)]
    if len(xs) < 2:
        return None
    med = statistics.median(xs)
    if not med:
        return None
    return 1.4826 * statistics.median([abs(x - med) for x in xs]) / abs(med)


def percentile(samples: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile, p in [0, 100]."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("no samples")
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def batch_bound(test: str, metric: str) -> bool:
    """Whether figure ``metric`` of ``test`` is the step time of a case at the largest batch its Target
    holds.  The training workload records it as informational: that batch is found anew on each stack
    (a compiled case's grown from the memory measured that night: 27, 28 or 30 sequences for
    Qwen2.5-1.5B on an H100), and a step's time grows with it where tokens/s hardly moves (their
    sigma 4.5% and 1.2%).  Histories and references saved before hold it as a compared figure: their
    reader keeps it apart (:attr:`pytest_mig.store.history.Baseline.retired`), never judged, paired
    with an energy figure or counted; results files written before are read with it informational
    (:meth:`pytest_mig.store.results.ResultRecord.from_dict`)."""
    return metric == STEP_TIME and test.endswith(LARGEST_BATCH)


def timing_partners(metric: str, kind: str, figures: Iterable[tuple[str, str]]) -> list[str]:
    """Of one test's figures, given as (name, kind) pairs, the rate figures that time the same work as
    figure ``metric`` (of ``kind``) over a window at least as long, so that ``metric`` is never judged
    more tightly than they are:

    * **energy per unit of work** (``<label>_energy_j_per_<unit>``): the rate figures with its label
      (``fp32_triad_energy_j_per_gb``: ``fp32_triad_gbs``; ``energy_j_per_token``: every rate figure of
      the test, ``tokens_per_s`` and, at a fixed batch, ``step_time_s``).  Energy is power x time / work,
      so it moves with that timing: a training step slowed by the host draws less power but not
      proportionally less (an H100's 4g.40gb-sized slice: tokens/s -15.5%, power -6%, J/token +11.9%).
    * **cost per unit of work** (kind ``cost``, ``su_per_1M_tokens``): every rate figure of the test,
      whose rate it converts to service units.
    * **a headline rate beside the rate over a longer window of the same work**: ``<label>_<unit>``
      beside ``<label>_sustained_<unit>`` (GEMM's headline of about 2 s of calls beside its rate over
      the energy window, at the same size and power cap), that one.

    For energy and cost, where one of those rate figures is the rate over the energy window itself
    (``<label>_sustained_<unit>``, beside a headline and a per-cycle figure), that one alone: GEMM's SU
    converts its headline, whose sigma is never below the sustained rate's either.  Empty for any
    other figure.
    """
    rates = [name for name, k in figures if k in RATE_KINDS]
    if kind == "energy" and ENERGY_INFIX in metric:
        label = metric.split(ENERGY_INFIX, 1)[0]
        rates = [name for name in rates if name.startswith(label)]
        window = [name for name in rates if name.startswith(label + SUSTAINED)]
    elif kind == "cost":
        window = [name for name in rates if SUSTAINED in name]
    elif kind in RATE_KINDS and SUSTAINED not in metric:
        return [name for name in rates if SUSTAINED in name and name.replace(SUSTAINED, "", 1) == metric]
    else:
        return []
    return window or rates


def partner_keys(key: tuple[str, str, str], kind: str,
                 kinds: Mapping[tuple[str, str, str], str]) -> list[tuple[str, str, str]]:
    """:func:`timing_partners` over figures keyed (test, metric, mode), each with its kind: the keys of
    the rate figures of ``key``'s test and mode that time the same work as figure ``key`` (of ``kind``)."""
    test, metric, mode = key
    same = {k: v for k, v in kinds.items() if k[0] == test and k[2] == mode}
    names = set(timing_partners(metric, kind, ((k[1], v) for k, v in same.items())))
    return [k for k in same if k[1] in names]
