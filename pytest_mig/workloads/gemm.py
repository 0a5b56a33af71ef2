"""GEMM throughput per precision: the TFLOPS a Target's tensor cores (or FP32/FP64 units) give torch.matmul.

Method (that of mamf-finder and Wulver's sweep; docs/benchmarks.md): square, tile-aligned sizes that
fit three matrices in the Target's memory with headroom and are large enough to give every SM
several tiles; random inputs (never zeros, which run faster); a quick pass over the sizes with CUDA
events; then the headline at the best size through the timer (the measurement pytest-benchmark
keeps): the work of at least 2 s of calls (0.5 s quick) over their GPU time.  FLOPs = 2 m n k.

Every product is verified: a random block of output rows and columns against a float64 product
of the same (already rounded) inputs, with a limit per precision that sits below the error of the
next cheaper mode (fp32's limit fails a run where TF32 silently took over).

For bf16/fp16 a wider sweep (non-square shapes around the best size) is also timed, so the
headline can be judged against the best torch.matmul shape of the same run (the issue's
"within 3% of the best shape" target): ``<dtype>_best_sweep_tflops`` and ``<dtype>_headline_vs_best``.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from pytest_mig.measure import SUSTAINED, Metric, Timer, Timing, energy_metrics, time_fn
from pytest_mig.device.target import Target
from pytest_mig.workloads import HEADLINE_S, DoesNotFit, WorkloadError, all_finite, check_close

#: Share of the Target's memory the three matrices may take; the rest is for cuBLAS's workspace,
#: the verification, the caching allocator's rounding and whatever earlier tests left cached.
MEMORY_SHARE = 0.5
#: Sizes are multiples of this (whole tensor-core tiles, 128-byte rows in every precision).
ALIGN = 256
#: Output tile edge assumed when asking that every SM gets several tiles.
TILE = 128
#: GPU warm-up of every sweep shape before its timed calls (seconds of back-to-back calls).
SWEEP_WARMUP_S = 0.25
#: The headline size is the largest square whose sweep rate is within this of the best one.  A
#: small size "wins" a sweep only by a burst of clock or by noise, and then the headline jumps
#: between sizes from run to run: of five H200 runs, four chose 12288 and one 3072, which alone
#: made bf16's run-to-run CV 2.5% (docs/results/h200-full-5-runs.csv).
SIZE_TIE = 0.05
#: Tiles per SM a candidate size must give at least (whole waves; tiny sizes leave SMs idle).
MIN_TILES_PER_SM = 2
#: Rows and columns of the output block checked against float64.
CHECK_BLOCK = 64


@dataclass(frozen=True)
class GemmPrecision:
    """How one precision is run, sized, checked and compared with the datasheet."""

    name: str
    input_dtype: str  # torch dtype name of A and B
    output_dtype: str  # torch dtype name of C
    kind: str  # metric kind: "tensor" (tensor cores) or "compute"
    peak_keys: tuple[str, ...]  # datasheet keys (GpuModel.peak_tflops), first one known wins
    rel_limit: float  # relative error of the checked block against float64
    tf32: bool | None = None  # True/False: set cuBLAS's FP32 mode for the run; None: leave it
    min_capability: tuple[int, int] | None = None
    on_cpu: bool = True
    wide_sweep: bool = False
    plan_bytes: float = 0.0  # bytes per matrix element planned for A + B + C (+ conversion temporaries)

    @property
    def torch_input(self) -> torch.dtype:
        return getattr(torch, self.input_dtype)

    @property
    def torch_output(self) -> torch.dtype:
        return getattr(torch, self.output_dtype)


PRECISIONS: dict[str, GemmPrecision] = {
    p.name: p
    for p in (
        GemmPrecision("bf16", "bfloat16", "bfloat16", "tensor", ("bf16",), 1e-2, wide_sweep=True, plan_bytes=6),
        # The CPU has no fast fp16 matmul (a few GFLOPS): fp16 runs on GPUs only.
        GemmPrecision("fp16", "float16", "float16", "tensor", ("fp16",), 1e-2, on_cpu=False, wide_sweep=True,
                      plan_bytes=6),
        # TF32 rounds inputs to 10 mantissa bits: ~3e-4 relative error on random data.
        GemmPrecision("tf32", "float32", "float32", "tensor", ("tf32",), 2e-3, tf32=True, min_capability=(8, 0),
                      on_cpu=False, plan_bytes=12),
        # Well below TF32's error, so a run where TF32 was silently on fails verification.
        GemmPrecision("fp32", "float32", "float32", "compute", ("fp32",), 5e-5, tf32=False, plan_bytes=12),
        # cuBLAS DGEMM runs on the FP64 tensor cores where the GPU has them (A100, H100).
        GemmPrecision("fp64", "float64", "float64", "compute", ("fp64_tensor", "fp64"), 1e-10, plan_bytes=24),
        # Inputs are quantised to e4m3 before the reference is taken, so only accumulation and the
        # bf16 output rounding count; the limit is loose all the same.
        GemmPrecision("fp8", "float8_e4m3fn", "bfloat16", "tensor", ("fp8",), 2e-2, min_capability=(8, 9),
                      on_cpu=False, wide_sweep=False, plan_bytes=6),
    )
}
PRECISION_NAMES: tuple[str, ...] = tuple(PRECISIONS)

#: Square sizes tried on a GPU (filtered by memory and SM count; Wulver's best fp16 size on 1g.10gb was 12288).
GPU_SIZES = (2048, 3072, 4096, 6144, 8192, 12288, 16384, 20480)
GPU_SIZES_QUICK = (4096, 8192)
CPU_SIZES = (128, 256, 512)
CPU_SIZES_QUICK = (128, 256)


@dataclass(frozen=True)
class Effort:
    """Repeats and time limits of one mode (default or quick), on a GPU or the CPU."""

    sweep_warmup: int
    sweep_repeats: int
    warmup: int
    repeats: int
    max_call_s: float  # a candidate whose one call takes longer ends the sweep upwards
    headline_s: float = 0.0  # the headline times at least this long (more calls than ``repeats``)


#: The headline's timed calls span at least ``headline_s``: a GPU at its power limit moves its clock in
#: a cycle of a few hundred ms, so 20 calls of 13 ms caught one phase of it or another (H200 bf16, five
#: processes: CV 0.83% over 20 calls, 0.43% over 240; fp16 0.97% and 0.22%; the 3 s window 0.37% and 0.26%).
EFFORT = {
    ("gpu", False): Effort(sweep_warmup=2, sweep_repeats=5, warmup=5, repeats=20, max_call_s=0.25,
                           headline_s=HEADLINE_S["normal"]),
    ("gpu", True): Effort(sweep_warmup=1, sweep_repeats=3, warmup=2, repeats=5, max_call_s=0.08,
                          headline_s=HEADLINE_S["quick"]),
    ("cpu", False): Effort(sweep_warmup=1, sweep_repeats=3, warmup=1, repeats=5, max_call_s=0.5),
    ("cpu", True): Effort(sweep_warmup=1, sweep_repeats=2, warmup=1, repeats=3, max_call_s=0.2),
}


def max_square_size(budget_bytes: int, plan_bytes: float, share: float = MEMORY_SHARE, align: int = ALIGN) -> int:
    """The largest multiple of ``align`` whose three matrices fit ``share`` of the budget (0 if none)."""
    if budget_bytes <= 0 or plan_bytes <= 0:
        return 0
    n = int(math.isqrt(int(budget_bytes * share / plan_bytes)))
    return (n // align) * align


def min_fill_size(sms: int | None, tile: int = TILE, tiles_per_sm: int = MIN_TILES_PER_SM, align: int = ALIGN) -> int:
    """The smallest aligned size that gives every SM ``tiles_per_sm`` output tiles."""
    if not sms:
        return align
    n = tile * math.sqrt(tiles_per_sm * sms)
    return max(align, int(math.ceil(n / align)) * align)


def gemm_sizes(
    budget_bytes: int, plan_bytes: float, sms: int | None, *, quick: bool = False, cpu: bool = False
) -> list[int]:
    """Candidate square sizes for a Target: fit the memory budget, fill the SMs, ascending.

    A pure function of the budget and SM count so that a 10 GB slice and a 141 GB GPU can be
    planned (and tested) without touching either.  Where no listed size fits, the largest aligned
    size that does is used; where none does at all, the result is empty.
    """
    if cpu:
        candidates = CPU_SIZES_QUICK if quick else CPU_SIZES
        cap = max_square_size(budget_bytes, plan_bytes, align=64)
        return [n for n in candidates if n <= cap]
    cap = max_square_size(budget_bytes, plan_bytes)
    if cap < ALIGN:
        return []
    floor = min(min_fill_size(sms), cap)
    sizes = [n for n in (GPU_SIZES_QUICK if quick else GPU_SIZES) if floor <= n <= cap]
    if not sizes:
        sizes = [cap]
    return sizes


def wide_shapes(best: int, budget_bytes: int, plan_bytes: float, *, quick: bool) -> list[tuple[int, int, int]]:
    """Non-square (m, n, k) shapes around the best square size that fit the same memory share.

    A deeper k raises arithmetic intensity; a taller or wider output changes the wave count.
    Together with the squares they are the "wide sweep" the headline is compared with.
    """
    half = max(ALIGN, (best // 2) // ALIGN * ALIGN)
    shapes = [(best, best, 2 * best), (2 * best, best, best), (best, 2 * best, best), (best, best, half),
              (2 * best, 2 * best, half)]
    if quick:
        shapes = shapes[:2]
    limit = budget_bytes * MEMORY_SHARE
    per_elem = plan_bytes / 3  # plan_bytes covers three equal matrices
    return [(m, n, k) for m, n, k in shapes if per_elem * (m * k + k * n + m * n) <= limit]


@contextlib.contextmanager
def fp32_matmul_mode(tf32: bool | None) -> Iterator[None]:
    """Set cuBLAS's FP32 matmul mode (TF32 or IEEE) for the duration, and restore what was there.

    PyTorch >= 2.9 has ``fp32_precision`` and raises if the legacy ``allow_tf32`` flag is mixed
    with it, so the new setting is used where it exists.
    """
    if tf32 is None:
        yield
        return
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        saved = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if tf32 else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = saved
    else:  # pragma: no cover - older PyTorch
        saved_flag = matmul.allow_tf32
        matmul.allow_tf32 = tf32
        try:
            yield
        finally:
            matmul.allow_tf32 = saved_flag


def _matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """C = A B into a preallocated C (no allocation inside the timed loop)."""
    return torch.matmul(a, b, out=out)


def _scaled_matmul(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """FP8 product through torch._scaled_mm (B column-major, per-tensor scales of 1)."""
    return torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=out_dtype)


def device_capability(target: Target) -> tuple[int, int] | None:
    """The Target's compute capability, asked of CUDA where the Target does not carry it."""
    if target.compute_capability is not None:
        return tuple(target.compute_capability)  # type: ignore[return-value]
    if target.is_cpu or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def check_runnable(target: Target, prec: GemmPrecision) -> None:
    """Raise DoesNotFit, with the reason, where this precision cannot run on this Target."""
    if target.is_cpu and not prec.on_cpu:
        raise DoesNotFit(f"{prec.name} GEMM needs a GPU's tensor cores; this run is on the CPU")
    if prec.name == "fp8" and not (hasattr(torch, "_scaled_mm") and hasattr(torch, prec.input_dtype)):
        raise DoesNotFit(f"fp8 GEMM needs torch._scaled_mm and torch.{prec.input_dtype}; torch {torch.__version__} has not")
    if not target.is_cpu and prec.min_capability is not None:
        cap = device_capability(target)
        if cap is not None and cap < prec.min_capability:
            need = ".".join(map(str, prec.min_capability))
            raise DoesNotFit(f"{prec.name} GEMM needs compute capability >= {need}; this GPU is {cap[0]}.{cap[1]}")


class _Problem:
    """One GEMM's operands and output, with the callable that computes it."""

    def __init__(self, prec: GemmPrecision, m: int, n: int, k: int, device: str, generator: torch.Generator) -> None:
        self.prec, self.m, self.n, self.k = prec, m, n, k
        self.flops = 2.0 * m * n * k
        if prec.name == "fp8":
            self.a = torch.randn(m, k, device=device, dtype=torch.float16, generator=generator).to(prec.torch_input)
            # _scaled_mm wants B column-major: the transpose of a row-major (n, k) matrix.
            self.b = torch.randn(n, k, device=device, dtype=torch.float16, generator=generator).to(prec.torch_input).t()
            self.scale = torch.ones((), device=device, dtype=torch.float32)
            self.c = torch.empty(m, n, device=device, dtype=prec.torch_output)
        else:
            self.a = torch.randn(m, k, device=device, dtype=prec.torch_input, generator=generator)
            self.b = torch.randn(k, n, device=device, dtype=prec.torch_input, generator=generator)
            self.c = torch.empty(m, n, device=device, dtype=prec.torch_output)

    def __call__(self) -> torch.Tensor:
        if self.prec.name == "fp8":
            self.c = _scaled_matmul(self.a, self.b, self.scale, self.prec.torch_output)
            return self.c
        return _matmul(self.a, self.b, self.c)

    def verify(self, generator: torch.Generator) -> float:
        """Relative error of a random output block against float64; raises WorkloadError when wrong."""
        err = self.rel_error(generator)
        if math.isinf(err):
            raise WorkloadError(f"{self.prec.name} GEMM {self.m}x{self.n}x{self.k}: result holds NaN or Inf")
        check_close(f"{self.prec.name} GEMM {self.m}x{self.n}x{self.k}", err, self.prec.rel_limit)
        return err

    def rel_error(self, generator: torch.Generator) -> float:
        """Relative error of a random output block against float64 (inf where the output holds NaN or
        Inf, NaN where the block is zero)."""
        c = self.c
        if not all_finite(c):
            return math.inf
        dev = c.device
        rows = torch.randperm(self.m, generator=generator, device="cpu")[:CHECK_BLOCK].to(dev)
        cols = torch.randperm(self.n, generator=generator, device="cpu")[:CHECK_BLOCK].to(dev)
        a_blk = _as_float64(_take(self.a, 0, rows))
        b_blk = _as_float64(_take(self.b, 1, cols))
        ref = a_blk @ b_blk
        got = c.index_select(0, rows).index_select(1, cols).to(torch.float64)
        denom = float(torch.linalg.vector_norm(ref))
        return float(torch.linalg.vector_norm(got - ref)) / denom if denom > 0 else float("nan")


#: Sizes of the half-precision products :func:`half_precision_check` tries (under CUDA MPS on an H100,
#: cuBLAS gave wrong fp16 and bf16 products at some of them, at clients of 26, 52, 58 and 60 SMs).
PROBE_SIZES = (1024, 2048, 4096)


def half_precision_check(device: str = "cuda", sizes: tuple[int, ...] = PROBE_SIZES) -> tuple[str, int, float] | None:
    """The first (precision, size, relative error) at which an fp16 or bf16 square product is wrong on
    ``device`` (a random block of it against float64, as every GEMM's check); None where all are right."""
    gen = torch.Generator(device=device).manual_seed(0)
    check_gen = torch.Generator(device="cpu").manual_seed(1)  # the rows and columns checked
    for name in ("bf16", "fp16"):
        prec = PRECISIONS[name]
        for n in sizes:
            problem = _Problem(prec, n, n, n, device, gen)
            problem()
            err = problem.rel_error(check_gen)
            del problem
            if not err <= prec.rel_limit:  # also NaN
                return name, n, err
    return None


def half_precision_problem(sms: int | None) -> str | None:
    """A sentence where cuBLAS's fp16 or bf16 products are wrong in this MPS client of ``sms`` SMs
    (:func:`half_precision_check`); None where they are right."""
    try:
        found = half_precision_check()
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # the check itself must not end the run
        return f"the check of cuBLAS's fp16 and bf16 products in this MPS client could not run: {str(exc)[:200]}"
    if found is None:
        return None
    name, n, err = found
    return (f"cuBLAS gives wrong {name} matrix products in this MPS client of {sms} SMs (relative error {err:.2g} "
            f"at {n}x{n}x{n}, 1% allowed): the tests that use them fail their own check. CUDA MPS does this at "
            "some SM counts and not at others (docs/fleet.md); whether a MIG instance of the profile does is not known")


def _take(t: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """index_select that also works on float8 tensors (through a same-size integer view)."""
    if t.element_size() == 1 and t.is_floating_point():
        return t.view(torch.uint8).index_select(dim, index).view(t.dtype)
    return t.index_select(dim, index)


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    """Exact upcast (float8 converts to float64 through float32)."""
    if t.dtype == torch.float64:
        return t
    return t.to(torch.float32).to(torch.float64)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _peak_memory_gb(device: str, problem: _Problem) -> tuple[float, str]:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 1e9, "torch.cuda.max_memory_allocated"
    nbytes = sum(t.numel() * t.element_size() for t in (problem.a, problem.b, problem.c))
    return nbytes / 1e9, "tensor sizes (CPU)"


def _release(device: str) -> None:
    """Give cached blocks back so the next test on a small slice starts with its memory free."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _sweep(
    shapes: list[tuple[int, int, int]],
    prec: GemmPrecision,
    device: str,
    gen: torch.Generator,
    check_gen: torch.Generator,
    effort: Effort,
    stop_when_slow: bool,
) -> list[tuple[tuple[int, int, int], float, float]]:
    """(shape, median TFLOPS, seconds per call) for each shape timed; each result verified."""
    out: list[tuple[tuple[int, int, int], float, float]] = []
    for m, n, k in shapes:
        problem = _Problem(prec, m, n, k, device, gen)
        # Every shape is timed at the clocks sustained load runs at (a GPU at its power limit slows
        # within tens of ms), so the sweep's best and the headline are measured alike.
        seconds = time_fn(problem, warmup=effort.sweep_warmup, repeats=effort.sweep_repeats, device=device,
                          min_warmup_s=SWEEP_WARMUP_S if device.startswith("cuda") else 0.0)
        problem.verify(check_gen)
        med = _median(seconds)
        out.append(((m, n, k), problem.flops / med / 1e12, med))
        del problem
        if stop_when_slow and med > effort.max_call_s:
            break  # larger sizes only cost time: the rate has long stopped growing by then
    return out


def headline_size(squares: list[tuple[tuple[int, int, int], float, float]], tie: float = SIZE_TIE) -> int:
    """The square size the headline is timed at: the largest within ``tie`` of the best sweep rate."""
    best = max(rate for _, rate, _ in squares)
    return max(shape[0] for shape, rate, _ in squares if rate >= best * (1 - tie))


def run_gemm(target: Target, timer: Timer, *, dtype: str = "bf16", quick: bool = False,
             size: int | None = None) -> list[Metric]:
    """Peak torch.matmul TFLOPS of ``dtype`` on ``target``, verified, with the size and memory at the peak.

    ``size``: the square size the figure's history was measured at (``MigBench.size_of``).  Where it is
    one of this Target's candidate sizes the headline is timed there, not at the size this run's sweep
    prefers: two sizes within ``SIZE_TIE`` of each other in the sweep can differ by 8% in the headline
    (a power-capped H100's fp16 read 703 TFLOPS at 16384 and 648 at 20480, the sweep choosing 20480 in
    10 of 51 normal runs), which a night must not read as a change."""
    if dtype not in PRECISIONS:
        raise ValueError(f"unknown GEMM precision '{dtype}': use one of {', '.join(PRECISION_NAMES)}")
    prec = PRECISIONS[dtype]
    check_runnable(target, prec)
    device = target.device
    cpu = target.is_cpu
    effort = EFFORT[("cpu" if cpu else "gpu", quick)]
    budget = target.memory_budget()
    sizes = gemm_sizes(budget, prec.plan_bytes, target.effective_sms, quick=quick, cpu=cpu)
    if not sizes:
        raise DoesNotFit(f"{dtype} GEMM: not even a {ALIGN}x{ALIGN} problem fits {budget / 2**30:.1f} GiB")
    gen = torch.Generator(device=device)
    gen.manual_seed(20240611)
    check_gen = torch.Generator(device="cpu")
    check_gen.manual_seed(7)
    try:
        with fp32_matmul_mode(prec.tf32):
            squares = _sweep([(n, n, n) for n in sizes], prec, device, gen, check_gen, effort, stop_when_slow=True)
            pinned = size in sizes
            best_n = size if pinned else headline_size(squares)

            # The headline: fresh random operands at the best size, through the timer.
            if device.startswith("cuda"):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            problem = _Problem(prec, best_n, best_n, best_n, device, gen)
            timing = timer(problem, warmup=effort.warmup, repeats=effort.repeats, sustained=True,
                           min_time_s=effort.headline_s)
            rel_err = problem.verify(check_gen)
            peak_gb, peak_source = _peak_memory_gb(device, problem)
            flops = problem.flops
            del problem

            wide: list[tuple[tuple[int, int, int], float, float]] = []
            if prec.wide_sweep:
                wide = _sweep(wide_shapes(best_n, budget, prec.plan_bytes, quick=quick), prec, device, gen, check_gen, effort,
                              stop_when_slow=False)
    finally:
        _release(device)
    return _metrics(target, prec, timing, flops, best_n, rel_err, peak_gb, peak_source, squares, wide, pinned=pinned)


_Shapes = list[tuple[tuple[int, int, int], float, float]]


def _metrics(
    target: Target,
    prec: GemmPrecision,
    timing: Timing,
    flops: float,
    best_n: int,
    rel_err: float,
    peak_gb: float,
    peak_source: str,
    squares: _Shapes,
    wide: _Shapes,
    *,
    pinned: bool = False,
) -> list[Metric]:
    p = prec.name
    samples = [r / 1e12 for r in timing.rate_samples(flops)]
    # The work over the calls' GPU time (the harmonic mean of their rates): the median of calls that alternate
    # between two clocks of the power cap's cycle sits in one cluster or the other (0.22% against 0.53% for
    # H200 fp16's 240 calls).
    tflops = statistics.harmonic_mean(samples) if samples else float("nan")
    peak_key = next((k for k in prec.peak_keys if target.peak_tflops(k) is not None), None)
    peak = target.peak_tflops(peak_key) if peak_key else None
    info = _headline_info(prec, timing, best_n, rel_err, squares, peak, peak_key)
    metrics = [
        Metric(f"{p}_tflops", tflops, "TFLOPS", "higher", samples, kind=prec.kind, info=info),
        Metric(f"{p}_size_at_peak", best_n, "n", "higher", [], kind="info", compare=False,
               info={"candidates": [s[0][0] for s in squares],
                     "chosen_by": "the size it is judged at" if pinned else "this run's sweep"}),
        Metric(f"{p}_peak_memory_gb", peak_gb, "GB", "lower", [], kind="info", compare=False,
               info={"source": peak_source, "size": best_n}),
    ]
    if peak:
        metrics.append(Metric(f"{p}_pct_of_peak", 100.0 * tflops / peak, "%", "higher", [], kind="info",
                              compare=False, info={"peak_tflops": peak, "peak_key": peak_key,
                                                   "sms": target.effective_sms}))
    if prec.wide_sweep:
        metrics += _sweep_metrics(p, tflops, squares + wide)
    metrics += _window_metrics(target, prec, timing, flops)
    metrics.extend(energy_metrics(timing, flops / 1e12, "TFLOP", label=p))
    for m in metrics:
        if m.compare:  # every figure of the headline was measured at its size: the history keeps it with each run
            m.info.setdefault("size", best_n)
    return metrics


def _headline_info(prec: GemmPrecision, timing: Timing, best_n: int, rel_err: float, squares: _Shapes,
                   peak: float | None, peak_key: str | None) -> dict[str, Any]:
    """The headline figure's info: size, error, the sweep, the peak and the clocks."""
    p = prec.name
    info: dict[str, Any] = {
        "dtype": p,
        "size": best_n,
        "rel_error": rel_err,
        "rel_limit": prec.rel_limit,
        "repeats": len(timing.samples),
        "calls": len(timing.samples) * timing.calls_per_sample,  # a pytest-benchmark round's several
        "sweep": {str(n[0]): round(t, 4) for n, t, _ in squares},
        "peak_tflops": peak,
        "peak_key": peak_key,
        **timing.clock_info(),
    }
    if timing.window_seconds_per_call:
        # Between profiles, the sustained rate is judged: on a power-capped context the few short repeats
        # of the headline catch the clock moving (an emulated 7g.141gb's quick fp64 headline gave 46.7-54.4
        # TFLOPS in six runs, its sustained rate 53.2-55.4), which failed 7g/4g against the clock-scaled ideal.
        info.update(scaling=False, scaling_note=f"between profiles {p}_{SUSTAINED}tflops is judged: the rate over "
                    f"the whole window, at the clock sampled through it")
    return info


def _sweep_metrics(p: str, tflops: float, everything: _Shapes) -> list[Metric]:
    """The best shape of the whole sweep, and the headline against it."""
    (shape, best, _) = max(everything, key=lambda r: r[1])
    return [
        Metric(f"{p}_best_sweep_tflops", best, "TFLOPS", "higher", [], kind="info", compare=False,
               info={"shape_mnk": list(shape), "shapes": len(everything)}),
        Metric(f"{p}_headline_vs_best", tflops / best if best > 0 else float("nan"), "ratio",
               "higher", [], kind="info", compare=False,
               info={"target": "headline within 3% of the best shape (ratio >= 0.97)"}),
    ]


def _window_metrics(target: Target, prec: GemmPrecision, timing: Timing, flops: float) -> list[Metric]:
    """The figures of the sustained energy window: its rate, and FLOP per SM per cycle."""
    p = prec.name
    metrics: list[Metric] = []
    if timing.window_seconds_per_call:
        # The rate over the whole (sustained) energy window (1.5 s quick, 3 s normal), at the clocks the power cap
        # settles on: on a power-capped H100 its run-to-run sigma was 0.4-0.5% for bf16, fp16 and tf32,
        # where the few short timed repeats of the headline gave 0.9-2.4% for fp16 and tf32
        # (docs/results/h100-gemm-repeats-ab.tgz).
        metrics.append(Metric(f"{p}_{SUSTAINED}tflops", flops / timing.window_seconds_per_call / 1e12, "TFLOPS",
                              "higher", [], kind=prec.kind,
                              info={"window_s": round(timing.power.seconds, 3) if timing.power else None,
                                    "calls": timing.energy_calls, **timing.clock_info()}))
    per_cycle = flop_per_sm_cycle(timing, flops, target.effective_sms)
    if per_cycle is not None:
        value, clock_mhz, sustained = per_cycle
        metrics.append(Metric(f"{p}_flop_per_sm_cycle", value, "FLOP/SM/cycle", "higher", [], kind=prec.kind,
                              info={"normalises": f"{p}_tflops", "scaling": False,
                                    "scaling_note": "per SM and per clock already: the same on every profile",
                                    "sm_clock_mhz": round(clock_mhz, 1),
                                    "sustained_tflops": round(sustained / 1e12, 3), "sms": target.effective_sms,
                                    "window_s": round(timing.power.seconds, 3) if timing.power else None}))
    return metrics


def flop_per_sm_cycle(timing: Timing, flops_per_call: float, sms: int | None) -> tuple[float, float, float] | None:
    """FLOP per SM per cycle over the energy window: its sustained rate over the SM clock sampled
    meanwhile, times the SMs.  A power-capped run keeps this figure and loses TFLOPS; a slower
    kernel loses both.  Returns (FLOP/SM/cycle, mean SM clock in MHz, sustained FLOP/s), or None
    where the window or the clock was not read."""
    seconds = timing.window_seconds_per_call
    clock = timing.window_sm_clock_mhz
    if not seconds or not clock or not sms:
        return None
    sustained = flops_per_call / seconds
    return sustained / (clock * 1e6 * sms), clock, sustained


__all__ = [
    "GemmPrecision",
    "flop_per_sm_cycle",
    "headline_size",
    "PRECISIONS",
    "PRECISION_NAMES",
    "check_runnable",
    "device_capability",
    "fp32_matmul_mode",
    "gemm_sizes",
    "max_square_size",
    "min_fill_size",
    "run_gemm",
    "wide_shapes",
]

