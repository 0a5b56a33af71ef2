"""Service units: what a measurement costs on a cluster that bills GPU slices, and cost per unit of work.

The formula is Wulver's (NJIT), published with its MIG benchmarks:

    SU = (max(CPUs, RAM / 4 GB) + 16 x GPU_memory / 80 GB) x hours

so a MIG slice is billed by its share of the GPU's memory.  The coefficients are data
(:class:`SUCoefficients`), so a site with other weights sets them once (``from_string``) and every
cost figure follows.  How the formula reproduces Wulver's published tables
(reference/wulver/*.csv), checked in tests/test_cost.py:

- llm-finetuning.csv, "SU Total" = (1 CPU, 4 GB RAM, 10/20/40/80 GB GPU) rate x "Walltime (h)":
  3, 5, 9 and 17 SU per hour.  Its "SU per 1M Tokens" column is 1-4% below SU Total / tokens
  (the page does not say which token count or time it divided by), so it is matched only loosely.
- pytorch_training.csv, "SU Rate (/hr)" 3/5/9 = 1 CPU + 16 x (10/20/40)/80, and
  "SU" = rate x training seconds / 3600.
- gromacs_performance.csv, "SU Consumption" 6/8/12/20 is the hourly rate with 4 CPUs (the run's
  4 threads), and "Cost/Performance" is SU per simulated ns: rate x 24 / (ns/day).
- matrix_multiplication.csv, "SU Usage Factor" 2/4/8/16 for 10/20/40/80 GB is the GPU term alone,
  16 x GPU_memory / 80.

Nothing here imports pytest or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Sequence

from pytest_mig.measure import Metric
from pytest_mig.device.profiles import ProfileError, parse_profile
from pytest_mig.device.target import Target
from pytest_mig.common.text import SHOWN, quoted

SECONDS_PER_HOUR = 3600.0
#: No site bills 10^6 SU per CPU hour; a larger coefficient is a typo, and 1e308 would make SU infinite.
MAX_COEFFICIENT = 1e6


@dataclass(frozen=True)
class SUCoefficients:
    """The weights of the SU formula: ``(max(cpu x CPUs, RAM / ram_gb) + gpu x GPU_mem / gpu_mem_gb) x hours``."""

    cpu: float = 1.0  # SU per CPU core per hour
    ram_gb: float = 4.0  # GB of RAM that are billed like one CPU core
    gpu: float = 16.0  # SU per hour of one whole GPU's worth of memory
    gpu_mem_gb: float = 80.0  # GB of GPU memory that count as one whole GPU

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= MAX_COEFFICIENT:
                raise ValueError(f"SU coefficient {f.name} must be a number from 0 to {MAX_COEFFICIENT:g}, not {value!r}")
        if self.ram_gb <= 0 or self.gpu_mem_gb <= 0:
            raise ValueError("SU coefficients ram_gb and gpu_mem_gb divide the formula and must be greater than 0")

    @classmethod
    def from_string(cls, text: str) -> "SUCoefficients":
        """Parse ``"cpu=1,ram_gb=4,gpu=16,gpu_mem_gb=80"`` (any subset; the rest keep Wulver's values).

        Meant for an ini value or a command-line option; bad input raises ValueError with one
        sentence that names the problem and the expected form.
        """
        known = [f.name for f in fields(cls)]
        form = "expected comma-separated key=value pairs such as 'cpu=1,ram_gb=4,gpu=16,gpu_mem_gb=80'"
        values: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, sep, raw = part.partition("=")
            key, raw = key.strip(), raw.strip()
            if not sep or not key or not raw:
                raise ValueError(f"SU coefficients {quoted(text, SHOWN)}: {quoted(part, SHOWN)} is not key=value; {form}")
            if key not in known:
                raise ValueError(f"SU coefficients {quoted(text, SHOWN)}: unknown key {quoted(key)} (known: {', '.join(known)}); {form}")
            if key in values:
                raise ValueError(f"SU coefficients {quoted(text, SHOWN)}: {quoted(key)} is given twice; {form}")
            try:
                values[key] = float(raw)
            except ValueError:
                raise ValueError(f"SU coefficients {quoted(text, SHOWN)}: {quoted(raw, SHOWN)} for {quoted(key)} is not a number; {form}") from None
        if not values:
            raise ValueError(f"SU coefficients {quoted(text, SHOWN)}: nothing given; {form}")
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"SU coefficients {quoted(text, SHOWN)}: {exc}") from None

    def to_string(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name):g}" for f in fields(self))


#: NJIT Wulver's published coefficients.
WULVER = SUCoefficients()


def su_per_hour(cpus: float, ram_gb: float, gpu_mem_gb: float, coeffs: SUCoefficients = WULVER) -> float:
    """SU charged per hour for an allocation of ``cpus`` cores, ``ram_gb`` of RAM and ``gpu_mem_gb`` of GPU memory."""
    if cpus < 0 or ram_gb < 0 or gpu_mem_gb < 0:
        raise ValueError(f"an allocation cannot be negative (cpus={cpus}, ram_gb={ram_gb}, gpu_mem_gb={gpu_mem_gb})")
    return max(coeffs.cpu * cpus, ram_gb / coeffs.ram_gb) + coeffs.gpu * gpu_mem_gb / coeffs.gpu_mem_gb


def su_for(seconds: float, cpus: float, ram_gb: float, gpu_mem_gb: float, coeffs: SUCoefficients = WULVER) -> float:
    """SU charged for holding the allocation ``seconds`` long (Wulver bills walltime, not busy time)."""
    if seconds < 0:
        raise ValueError(f"walltime cannot be negative ({seconds} s)")
    return su_per_hour(cpus, ram_gb, gpu_mem_gb, coeffs) * seconds / SECONDS_PER_HOUR


def su_per_unit(
    work_per_second: float,
    unit_count: float = 1e6,
    *,
    cpus: float = 1,
    ram_gb: float = 4.0,
    gpu_mem_gb: float = 0.0,
    coeffs: SUCoefficients = WULVER,
) -> float:
    """SU per ``unit_count`` units of work (e.g. SU per 1M tokens) at a rate of ``work_per_second``.

    This is the figure that lets a user pick a slice: a smaller slice is slower but may cost
    less per token (Wulver: 2g.20gb was cheapest per token, the whole GPU dearest).
    """
    if not (work_per_second > 0) or not math.isfinite(work_per_second):
        raise ValueError(f"a work rate must be a positive number to be priced, not {work_per_second!r}")
    if not (unit_count > 0):
        raise ValueError(f"unit_count must be positive, not {unit_count!r}")
    hours_per_unit_count = unit_count / work_per_second / SECONDS_PER_HOUR
    return su_per_hour(cpus, ram_gb, gpu_mem_gb, coeffs) * hours_per_unit_count


def target_gpu_memory_gb(target: Target) -> float:
    """The GPU memory a Target is billed for: the profile's nominal GB (10 for 1g.10gb), the GPU's for a whole GPU."""
    if target.is_cpu:
        return 0.0
    if target.kind in ("mig", "emulated"):
        try:
            return float(parse_profile(target.profile).memory_gb)
        except ProfileError:
            pass
    model = target.model
    if model is not None:
        return float(model.memory_gib)
    if target.memory_bytes:
        return round(target.memory_bytes / 2**30)
    return 0.0


def _count_label(unit_count: float) -> str:
    """1e6 -> '1M', 1e3 -> '1k', 1 -> '1': the number in a metric name such as su_per_1M_tokens."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if unit_count >= scale and (unit_count / scale).is_integer():
            return f"{int(unit_count / scale)}{suffix}"
    return f"{unit_count:g}"


def cost_metrics(
    target: Target,
    rate_per_s: float,
    unit: str,
    cpus: float = 1,
    ram_gb: float = 4.0,
    *,
    coeffs: SUCoefficients = WULVER,
    unit_count: float = 1e6,
    gpu_mem_gb: float | None = None,
    rate_samples: Sequence[float] = (),
) -> list[Metric]:
    """Cost metrics of a workload that did ``rate_per_s`` units of ``unit`` per second on ``target``.

    Returns the allocation's SU per hour (informational: a property of the slice, not measured)
    and SU per ``unit_count`` units (kind "cost", lower is better), e.g. ``su_per_1M_tokens``.
    ``rate_samples`` (per-repeat rates) give the cost metric its own samples, so its noise is known.
    """
    gpu_gb = target_gpu_memory_gb(target) if gpu_mem_gb is None else gpu_mem_gb
    per_hour = su_per_hour(cpus, ram_gb, gpu_gb, coeffs)
    per_unit = su_per_unit(rate_per_s, unit_count, cpus=cpus, ram_gb=ram_gb, gpu_mem_gb=gpu_gb, coeffs=coeffs)
    samples = [
        su_per_unit(r, unit_count, cpus=cpus, ram_gb=ram_gb, gpu_mem_gb=gpu_gb, coeffs=coeffs)
        for r in rate_samples
        if r > 0 and math.isfinite(r)
    ]
    plural = unit if unit.endswith("s") else unit + "s"
    info = {
        "cpus": cpus,
        "ram_gb": ram_gb,
        "gpu_mem_gb": gpu_gb,
        "coefficients": coeffs.to_string(),
        "rate_per_s": rate_per_s,
        "unit": unit,
    }
    return [
        Metric("su_per_hour", per_hour, "SU/h", "lower", [], kind="cost", info=info, compare=False),
        Metric(f"su_per_{_count_label(unit_count)}_{plural}", per_unit, f"SU/{_count_label(unit_count)} {plural}",
               "lower", samples, kind="cost", info=info),
    ]
