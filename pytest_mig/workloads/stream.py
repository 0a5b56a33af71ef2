"""Memory bandwidth: BabelStream's kernels through single fused torch operations, and a copy ceiling.

BabelStream's kernels (docs/benchmarks.md): Copy ``c = a``, Mul ``b = s c``, Add ``c = a + b``,
Triad ``a = b + s c``, Dot ``sum(a b)``; bytes counted as Copy/Mul 2N, Add/Triad 3N, Dot 2N
elements; arrays initialised to 0.1, 0.2, 0.0 with s = 0.4 and the results checked against the
analytic values.  Each torch call here is one kernel (``torch.add(b, c, alpha=s, out=a)`` is
Triad), so the figure is what a PyTorch user gets from the slice.  Arrays are several times the
L2 (or the cache is measured), sized to the Target's memory: up to 2^28 elements each.

A device-to-device copy of a large buffer (``Tensor.copy_``, read + write counted) measured in the
same run is the ceiling each kernel is put against; the datasheet bandwidth, scaled by the slice's
share of memory, is the other reference.  Under emulation memory bandwidth is not partitioned
(only SMs are): those figures carry ``emulated_bandwidth_not_partitioned`` and the whole GPU's
datasheet figure.

The constants are BabelStream's, not random: a memory-bound kernel's speed does not depend on the
values, and known values make the check exact.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from pytest_mig.measure import Metric, Timer, Timing, energy_metrics, time_fn
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError, check_close

#: BabelStream's initial values and scalar.
START_A, START_B, START_C, SCALAR = 0.1, 0.2, 0.0, 0.4
#: Share of the Target's memory the three arrays may take (the copy ceiling's two buffers, measured
#: before them, take at most the same).
MEMORY_SHARE = 0.5
#: Arrays must be at least this many times the L2 cache.
MIN_L2_MULTIPLE = 4
#: Array lengths are multiples of this (whole 16-byte vectors in every block).
GRAIN = 2**20
#: Assumed L2 when the device does not say (the largest of the supported GPUs: H200's 60 MB).
DEFAULT_L2_BYTES = 60 * 10**6


@dataclass(frozen=True)
class StreamKernel:
    """One BabelStream kernel: its name and how many arrays of N elements it moves."""

    name: str
    arrays_moved: int
    formula: str


KERNELS: tuple[StreamKernel, ...] = (
    StreamKernel("copy", 2, "c = a"),
    StreamKernel("mul", 2, "b = s*c"),
    StreamKernel("add", 3, "c = a + b"),
    StreamKernel("triad", 3, "a = b + s*c"),
    StreamKernel("dot", 2, "sum(a*b)"),
)
KERNEL_NAMES: tuple[str, ...] = tuple(k.name for k in KERNELS)
#: The kernel whose measurement is the headline (the timer's first call, kept by pytest-benchmark).
HEADLINE = "triad"

STREAM_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp64": torch.float64}
#: Relative error allowed for the arrays (BabelStream: 100 epsilon) and for Dot's long sum.
ARRAY_LIMIT = {"fp32": 100 * float(np.finfo(np.float32).eps), "fp64": 100 * float(np.finfo(np.float64).eps)}
DOT_LIMIT = {"fp32": 1e-3, "fp64": 1e-10}


@dataclass(frozen=True)
class StreamEffort:
    max_elements: int
    warmup: int
    repeats: int


STREAM_EFFORT = {
    ("gpu", False): StreamEffort(max_elements=2**28, warmup=5, repeats=50),
    ("gpu", True): StreamEffort(max_elements=2**26, warmup=2, repeats=10),
    ("cpu", False): StreamEffort(max_elements=2**20, warmup=1, repeats=5),
    ("cpu", True): StreamEffort(max_elements=2**18, warmup=1, repeats=3),
}


def kernel_bytes(kernel: str, n: int, element_bytes: int) -> int:
    """Bytes one call of ``kernel`` moves over N-element arrays (BabelStream's counting)."""
    for k in KERNELS:
        if k.name == kernel:
            return k.arrays_moved * n * element_bytes
    raise ValueError(f"unknown STREAM kernel '{kernel}': use one of {', '.join(KERNEL_NAMES)}")


def stream_elements(
    budget_bytes: int, element_bytes: int, l2_bytes: int | None, *, quick: bool = False, cpu: bool = False
) -> int:
    """Elements per array: the mode's cap, within a share of the memory budget, several times the L2.

    A pure function so that a 10 GB slice and a 141 GB GPU can be planned (and tested) without one.
    Raises DoesNotFit when the budget cannot hold arrays large enough to leave the L2 behind.
    """
    effort = STREAM_EFFORT[("cpu" if cpu else "gpu", quick)]
    fit = int(budget_bytes * MEMORY_SHARE // (3 * element_bytes))
    if cpu:
        return max(1, min(effort.max_elements, fit))
    n = min(effort.max_elements, fit) // GRAIN * GRAIN
    need = MIN_L2_MULTIPLE * (l2_bytes or DEFAULT_L2_BYTES)
    if n * element_bytes < need:
        raise DoesNotFit(
            f"STREAM: arrays of {n * element_bytes / 1e6:.0f} MB (all that fits {budget_bytes / 2**30:.1f} GiB) "
            f"are not {MIN_L2_MULTIPLE}x the {need / MIN_L2_MULTIPLE / 1e6:.0f} MB L2"
        )
    return n


def ceiling_bytes(array_bytes: int, budget_bytes: int) -> int:
    """Size of each of the copy ceiling's two buffers: twice an array where the budget allows, never less than one."""
    return max(array_bytes, min(2 * array_bytes, int(budget_bytes * MEMORY_SHARE / 2)))


def l2_cache_bytes(target: Target) -> int | None:
    """The L2 size CUDA reports for the pinned device (None on the CPU or where torch does not say)."""
    if target.is_cpu or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    value = getattr(props, "L2_cache_size", None)
    return int(value) if value else None


def datasheet_gbs(target: Target) -> tuple[float | None, dict[str, Any]]:
    """The Target's share of the datasheet bandwidth in GB/s, and how it was derived.

    A MIG slice gets its memory slices' share (1/8 per slice on most GPUs); an emulated profile
    gets the whole GPU's, because emulation does not partition bandwidth.
    """
    model = target.model
    if model is None or not model.peak_memory_tbs:
        return None, {}
    fraction = 1.0
    how: dict[str, Any] = {"gpu_peak_tbs": model.peak_memory_tbs}
    if target.emulated:
        how["emulated_bandwidth_not_partitioned"] = True
    elif target.kind == "mig":
        spec = target.spec or model.profile(target.profile)
        if spec is None:
            return None, {}
        fraction = float(spec.memory_fraction)
        how["memory_fraction"] = str(spec.memory_fraction)
    return model.peak_memory_tbs * 1000.0 * fraction, how


class _Arrays:
    """BabelStream's three arrays and its kernels as callables over them."""

    def __init__(self, n: int, dtype: torch.dtype, device: str) -> None:
        self.a = torch.empty(n, dtype=dtype, device=device)
        self.b = torch.empty(n, dtype=dtype, device=device)
        self.c = torch.empty(n, dtype=dtype, device=device)
        self.dot_result: torch.Tensor | None = None
        self.init()

    def init(self) -> None:
        self.a.fill_(START_A)
        self.b.fill_(START_B)
        self.c.fill_(START_C)

    def kernel(self, name: str) -> Callable[[], Any]:
        return {"copy": self.copy, "mul": self.mul, "add": self.add, "triad": self.triad, "dot": self.dot}[name]

    def copy(self) -> None:
        self.c.copy_(self.a)

    def mul(self) -> None:
        torch.mul(self.c, SCALAR, out=self.b)

    def add(self) -> None:
        torch.add(self.a, self.b, out=self.c)

    def triad(self) -> None:
        torch.add(self.b, self.c, alpha=SCALAR, out=self.a)

    def dot(self) -> None:
        self.dot_result = torch.dot(self.a, self.b)


def expected_after_one_pass(dtype: str) -> dict[str, float]:
    """Values of a, b, c and the dot product per element after copy, mul, add, triad, dot once, in ``dtype``."""
    t = np.float32 if dtype == "fp32" else np.float64
    a, b, c, s = t(START_A), t(START_B), t(START_C), t(SCALAR)
    c = a
    b = t(s * c)
    c = t(a + b)
    a = t(b + s * c)
    return {"a": float(a), "b": float(b), "c": float(c), "dot_per_element": float(a) * float(b)}


def verify_stream(arrays: _Arrays, dtype: str) -> dict[str, float]:
    """Re-initialise, run every kernel once in BabelStream's order, check against the analytic values."""
    arrays.init()
    for k in KERNELS:
        arrays.kernel(k.name)()
    gold = expected_after_one_pass(dtype)
    errors: dict[str, float] = {}
    for name in ("a", "b", "c"):
        x = getattr(arrays, name)
        err = float((x.to(torch.float64) - gold[name]).abs().max()) / abs(gold[name])
        check_close(f"STREAM array {name} after one pass", err, ARRAY_LIMIT[dtype])
        errors[name] = err
    if arrays.dot_result is None:
        raise WorkloadError("STREAM dot: no result was produced")
    n = arrays.a.numel()
    dot_gold = gold["dot_per_element"] * n
    err = abs(float(arrays.dot_result) - dot_gold) / abs(dot_gold)
    check_close("STREAM dot", err, DOT_LIMIT[dtype])
    errors["dot"] = err
    return errors


def _release(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measure_copy_ceiling(nbytes: int, device: str, warmup: int, repeats: int) -> list[float]:
    """GB/s of ``dst.copy_(src)`` over two ``nbytes`` buffers, counting bytes read + written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(0x5A)
    dst = torch.empty_like(src)
    try:
        seconds = time_fn(lambda: dst.copy_(src), warmup=warmup, repeats=repeats, device=device)
        if not bool(torch.equal(dst[:4096], src[:4096])) or not bool(torch.equal(dst[-4096:], src[-4096:])):
            raise WorkloadError("device-to-device copy: destination differs from source")
    finally:
        del src, dst
        _release(device)
    return [2 * nbytes / s / 1e9 for s in seconds if s > 0]


def run_stream(target: Target, timer: Timer, *, dtype: str = "fp32", quick: bool = False) -> list[Metric]:
    """GB/s of BabelStream's five kernels on ``target`` (Triad the headline), the copy ceiling, and shares of both ceilings."""
    if dtype not in STREAM_DTYPES:
        raise ValueError(f"unknown STREAM precision '{dtype}': use one of {', '.join(STREAM_DTYPES)}")
    torch_dtype = STREAM_DTYPES[dtype]
    element_bytes = torch.empty((), dtype=torch_dtype).element_size()
    device = target.device
    cpu = target.is_cpu
    effort = STREAM_EFFORT[("cpu" if cpu else "gpu", quick)]
    budget = target.memory_budget()
    l2 = l2_cache_bytes(target)
    n = stream_elements(budget, element_bytes, l2, quick=quick, cpu=cpu)

    ceiling_samples = measure_copy_ceiling(ceiling_bytes(n * element_bytes, budget), device, effort.warmup,
                                           effort.repeats)
    timings: dict[str, Timing] = {}
    try:
        arrays = _Arrays(n, torch_dtype, device)
        order = [HEADLINE] + [k for k in KERNEL_NAMES if k != HEADLINE]
        for name in order:
            # board energy is read over the headline kernel's window only: one window per test
            timings[name] = timer(arrays.kernel(name), warmup=effort.warmup, repeats=effort.repeats,
                                  energy=name == HEADLINE)
        errors = verify_stream(arrays, dtype)
        del arrays
    finally:
        _release(device)
    return _metrics(target, dtype, n, element_bytes, l2, timings, ceiling_samples, errors)


def _metrics(
    target: Target,
    dtype: str,
    n: int,
    element_bytes: int,
    l2: int | None,
    timings: dict[str, Timing],
    ceiling_samples: list[float],
    errors: dict[str, float],
) -> list[Metric]:
    datasheet, how = datasheet_gbs(target)
    common: dict[str, Any] = {"dtype": dtype, "elements": n, "array_mb": n * element_bytes / 1e6, "l2_bytes": l2}
    if target.emulated:
        common["emulated_bandwidth_not_partitioned"] = True
    ceiling = statistics.median(ceiling_samples)
    metrics = [Metric(f"{dtype}_d2d_copy_gbs", ceiling, "GB/s", "higher", ceiling_samples, kind="memory",
                      info={**common, "method": "Tensor.copy_ of a uint8 buffer, read + write counted"})]
    for k in KERNELS:
        timing = timings[k.name]
        nbytes = kernel_bytes(k.name, n, element_bytes)
        samples = [r / 1e9 for r in timing.rate_samples(nbytes)]
        gbs = statistics.median(samples)
        info = {**common, "formula": k.formula, "bytes_per_call": nbytes, "best_gbs": max(samples),
                "rel_errors": errors, "repeats": len(samples)}
        if timing.clocks:
            info["clocks"] = timing.clocks
        metrics.append(Metric(f"{dtype}_{k.name}_gbs", gbs, "GB/s", "higher", samples, kind="memory", info=info))
        metrics.append(Metric(f"{dtype}_{k.name}_pct_of_copy", 100.0 * gbs / ceiling, "%", "higher", [], kind="info",
                              compare=False, info={**common, "ceiling_gbs": ceiling}))
        if datasheet:
            metrics.append(Metric(f"{dtype}_{k.name}_pct_of_peak", 100.0 * gbs / datasheet, "%", "higher", [],
                                  kind="info", compare=False, info={**common, **how, "peak_gbs": datasheet}))
    headline = timings[HEADLINE]
    metrics.extend(energy_metrics(headline, kernel_bytes(HEADLINE, n, element_bytes) / 1e9, "GB",
                                  label=f"{dtype}_{HEADLINE}"))
    return metrics


__all__ = [
    "HEADLINE",
    "KERNELS",
    "KERNEL_NAMES",
    "STREAM_DTYPES",
    "StreamKernel",
    "ceiling_bytes",
    "datasheet_gbs",
    "expected_after_one_pass",
    "kernel_bytes",
    "l2_cache_bytes",
    "run_stream",
    "stream_elements",
    "verify_stream",
]
