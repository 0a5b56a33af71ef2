"""CUDA-core peak FLOPS: a compute-bound chain of fused multiply-adds, not a matmul.

CERN's "fp16/fp32/fp64, CUDA cores" rows need a kernel whose time is all FMA issue: a matmul with
TF32 off measures cuBLAS SGEMM instead.  The Triton kernel below keeps
``x = fma(x, a, b)`` chains in registers: each thread holds several independent chains (ILP), the
loop is unrolled, the grid is many programs per SM (several waves), only the final value is stored
(so the compiler must compute it) and nothing is loaded but one scalar.  FLOPs = 2 x FMAs.

The recurrence is chosen so that the result can be checked exactly:

- fp32 and fp64: ``a = 1`` (read from memory at run time, so the compiler cannot fold it) and
  ``b_e = (1 + e mod 8) * 2^-m``.  Every partial sum ``x0 + j b_e`` is a multiple of ``2^-m``
  below 8 in magnitude, hence exactly representable: the result is ``x0 + N b_e`` to the last bit,
  so one iteration too few (a miscounted FLOP total) fails the check.  ``m`` is chosen from N.
- fp16 has too few mantissa bits for that, so it contracts, ``a = 0.5``, towards ``2 b_e``; the
  check is then to rounding (1e-2) and does not see the iteration count.

fp16 and bf16 run paired (``fma.rn.f16x2`` / ``fma.rn.bf16x2`` through inline PTX: two FMAs per
instruction, how the datasheets count 16-bit CUDA-core FLOPS).  Each 32-bit register holds two
chains for the whole loop (elements ``2p`` in its low half and ``2p + 1`` in its high half), so the
loop body is nothing but paired FMAs: no unpacking between steps.  Where the paired instruction does
not compile the kernel falls back to scalar FMAs (at most half the paired peak) and says so in the
metric's info.

On the CPU (no GPU for Triton) the same recurrence runs as torch operations at a tiny size, so
the verification and the record shape are exercised; its rate means nothing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from pytest_mig.measure import Metric, Timer, Timing, energy_metrics, time_fn
from pytest_mig.device.architectures import fma_per_sm_per_clock
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError, all_finite, check_close
from pytest_mig.workloads.gemm import device_capability

try:  # Triton is optional: CPU-only installs (and CI) have none
    import triton
    import triton.language as tl

    TRITON_MISSING: str | None = None
except Exception as exc:  # noqa: BLE001 - a broken install is as good as none
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    TRITON_MISSING = f"{type(exc).__name__}: {exc}"

#: Threads per program = 32 x WARPS; each holds CHAINS independent chains.
WARPS = 4
CHAINS = 8
BLOCK = 32 * WARPS * CHAINS
#: Registers of two 16-bit chains per thread in the paired kernel: a paired FMA's latency needs
#: twice the independent chains of a scalar one (8 pairs per thread issue at 66% of the paired
#: peak on an H100, 16 pairs at 98%: docs/results/fma-paired-h100-2026-11-26.tgz).
PAIRS = 16
PAIR_BLOCK = 32 * WARPS * PAIRS
#: FMAs per chain per trip of the (runtime) loop: the unrolled body.
UNROLL = 16
#: Programs per SM: with 16 resident 4-warp programs per SM this is two full waves.
PROGRAMS_PER_SM = 32
#: The exact recurrence stays exact up to this many iterations in fp32 (see the module docstring).
MAX_ITERS = 2**20
#: Iterations of the calibration launch that sizes the real one.
CALIBRATION_ITERS = 2048


@dataclass(frozen=True)
class FmaPrecision:
    """One precision of the FMA chain: its recurrence and how closely it must match float64."""

    name: str
    dtype: str  # torch dtype name
    a: float  # multiplier of the recurrence
    exact: bool  # a == 1: the result is exact and checks the iteration count
    rel_limit: float
    b_shift: int | None = None  # fixed b scale 2^-b_shift (contracting recurrences); None: from N
    paired: str | None = None  # the PTX instruction doing two FMAs of this 16-bit type at once

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


FMA_PRECISIONS: dict[str, FmaPrecision] = {
    p.name: p
    for p in (
        FmaPrecision("fp32", "float32", 1.0, True, 1e-9),
        FmaPrecision("fp64", "float64", 1.0, True, 1e-12),
        FmaPrecision("fp16", "float16", 0.5, False, 1e-2, b_shift=4, paired="fma.rn.f16x2"),
        FmaPrecision("bf16", "bfloat16", 0.5, False, 2e-2, b_shift=4, paired="fma.rn.bf16x2"),
    )
}
FMA_PRECISION_NAMES: tuple[str, ...] = tuple(FMA_PRECISIONS)


@dataclass(frozen=True)
class FmaEffort:
    warmup: int
    repeats: int
    call_s: float  # time one launch should take on a GPU
    cpu_elements: int
    cpu_iters: int


FMA_EFFORT = {
    False: FmaEffort(warmup=3, repeats=20, call_s=0.025, cpu_elements=16384, cpu_iters=512),
    True: FmaEffort(warmup=1, repeats=5, call_s=0.010, cpu_elements=4096, cpu_iters=128),
}


def b_shift_for(prec: FmaPrecision, n_iters: int) -> int:
    """The m of ``b = c 2^-m``: for the exact recurrence, 8 N 2^-m <= 4 (so |x| < 8) and m >= 10 (x0's grid)."""
    if prec.b_shift is not None:
        return prec.b_shift
    return max(10, math.ceil(math.log2(8 * max(1, n_iters))) - 2)


def initial_values(index: torch.Tensor, b_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x0 and b of element ``index`` in float64: the kernel computes exactly these (exact in every dtype)."""
    e = index.to(torch.int64)
    x0 = (e % 1024).to(torch.float64) / 1024.0 - 0.5
    b = ((e % 8) + 1).to(torch.float64) * b_scale
    return x0, b


def expected_values(index: torch.Tensor, n_iters: int, a: float, b_scale: float) -> torch.Tensor:
    """The recurrence's value after ``n_iters`` steps, in closed form, float64."""
    x0, b = initial_values(index, b_scale)
    if a == 1.0:
        return x0 + n_iters * b
    an = a**n_iters
    return an * x0 + b * (1.0 - an) / (1.0 - a)


def verify_chains(out: torch.Tensor, n_iters: int, prec: FmaPrecision, b_scale: float, samples: int = 4096) -> float:
    """Relative error of sampled outputs against the closed form; WorkloadError when wrong or unwritten."""
    if not all_finite(out):
        raise WorkloadError(f"{prec.name} FMA chains: output holds NaN/Inf (unwritten or overflowed elements)")
    n = out.numel()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(11)
    idx = torch.randint(0, n, (min(samples, n),), generator=gen)
    idx = torch.cat([idx, torch.tensor([0, n - 1])])
    got = out.index_select(0, idx.to(out.device)).to(torch.float64).cpu()
    ref = expected_values(idx, n_iters, prec.a, b_scale)
    denom = float(ref.abs().max())
    err = float((got - ref).abs().max()) / denom if denom > 0 else float("nan")
    check_close(f"{prec.name} FMA chains ({n_iters} iterations)", err, prec.rel_limit)
    return err


def _torch_chains(out: torch.Tensor, a: float, b_scale: float, n_iters: int) -> torch.Tensor:
    """The recurrence with torch operations (CPU fallback): same values, not a peak measurement."""
    x0, b64 = initial_values(torch.arange(out.numel()), b_scale)
    x = x0.to(out.dtype)
    b = b64.to(out.dtype)
    for _ in range(n_iters):
        x.mul_(a).add_(b)
    out.copy_(x)
    return out


if triton is not None:

    @triton.jit
    def _fma_chains_kernel(out_ptr, a_ptr, b_scale, n_outer, DTYPE: tl.constexpr, BLOCK: tl.constexpr,
                           UNROLL: tl.constexpr):
        e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = ((e % 1024).to(tl.float32) * (1.0 / 1024.0) - 0.5).to(DTYPE)
        b = (((e % 8) + 1).to(tl.float32) * b_scale).to(DTYPE)
        a = tl.zeros((BLOCK,), DTYPE) + tl.load(a_ptr)  # loaded, so the compiler cannot fold a == 1
        for _ in range(n_outer):
            for _u in tl.static_range(UNROLL):
                x = tl.fma(x, a, b)
        tl.store(out_ptr + e, x)

    @triton.jit
    def _pair(lo, hi):
        """Two 16-bit floats in one int32: ``lo`` in the low half, ``hi`` in the high half."""
        return (lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)

    @triton.jit
    def _fma_pairs_kernel(out_ptr, a_ptr, b_scale, n_outer, DTYPE: tl.constexpr, INSTRUCTION: tl.constexpr,
                          BLOCK: tl.constexpr, UNROLL: tl.constexpr):
        p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # pair p holds elements 2p and 2p + 1
        e0 = 2 * p
        e1 = e0 + 1
        x = _pair(((e0 % 1024).to(tl.float32) * (1.0 / 1024.0) - 0.5).to(DTYPE),
                  ((e1 % 1024).to(tl.float32) * (1.0 / 1024.0) - 0.5).to(DTYPE))
        b = _pair((((e0 % 8) + 1).to(tl.float32) * b_scale).to(DTYPE), (((e1 % 8) + 1).to(tl.float32) * b_scale).to(DTYPE))
        a = tl.zeros((BLOCK,), tl.int32) + tl.load(a_ptr)  # a in both halves, loaded: not folded
        for _ in range(n_outer):
            for _u in tl.static_range(UNROLL):
                x = tl.inline_asm_elementwise(INSTRUCTION + " $0, $1, $2, $3;", "=r,r,r,r", [x, a, b],
                                              dtype=tl.int32, is_pure=True, pack=1)
        tl.store(out_ptr + p, x)


def _triton_dtype(dtype: torch.dtype) -> Any:
    return {torch.float32: tl.float32, torch.float64: tl.float64, torch.float16: tl.float16,
            torch.bfloat16: tl.bfloat16}[dtype]


def launch_triton(out: torch.Tensor, n_iters: int, a: torch.Tensor, b_scale: float, *, paired: str | None = None) -> None:
    """Run the FMA-chain kernel over ``out`` (a multiple of BLOCK elements), ``n_iters`` FMAs per element.

    ``a`` is a one-element tensor of ``out``'s dtype on ``out``'s device.  ``paired`` names the PTX
    instruction that does two 16-bit FMAs at once (``fma.rn.f16x2``): each pair of elements then
    lives in one 32-bit register for the whole loop, PAIRS registers per thread.  The scalar kernel also runs under
    TRITON_INTERPRET=1 with CPU tensors, which is how the unit tests check it.
    """
    if triton is None:
        raise DoesNotFit(f"the CUDA-core FMA kernel needs Triton, which is not importable here ({TRITON_MISSING})")
    if out.numel() % (2 * PAIR_BLOCK) or n_iters % UNROLL:
        raise ValueError(f"elements must be a multiple of {2 * PAIR_BLOCK} and iterations of {UNROLL}")
    if paired is None:
        _fma_chains_kernel[(out.numel() // BLOCK,)](out, a, b_scale, n_iters // UNROLL, DTYPE=_triton_dtype(out.dtype),
                                                    BLOCK=BLOCK, UNROLL=UNROLL, num_warps=WARPS)
        return
    a_pair = a.reshape(1).repeat(2).view(torch.int32)  # a in both halves of one 32-bit word
    _fma_pairs_kernel[(out.numel() // (2 * PAIR_BLOCK),)](out.view(torch.int32), a_pair, b_scale, n_iters // UNROLL,
                                                          DTYPE=_triton_dtype(out.dtype), INSTRUCTION=paired,
                                                          BLOCK=PAIR_BLOCK, UNROLL=UNROLL, num_warps=WARPS)


def _round_iters(n: float) -> int:
    return int(min(MAX_ITERS, max(UNROLL * 16, round(n / UNROLL) * UNROLL)))


def run_fma(target: Target, timer: Timer, *, dtype: str = "fp32", quick: bool = False) -> list[Metric]:
    """Peak CUDA-core TFLOPS of ``dtype`` FMAs on ``target``, verified, with % of SMs x FMA/clock x 2 x clock."""
    if dtype not in FMA_PRECISIONS:
        raise ValueError(f"unknown FMA precision '{dtype}': use one of {', '.join(FMA_PRECISION_NAMES)}")
    prec = FMA_PRECISIONS[dtype]
    effort = FMA_EFFORT[quick]
    device = target.device
    info: dict[str, Any] = {"dtype": dtype, "recurrence": f"x = x*{prec.a:g} + b", "exact_check": prec.exact}
    paired: str | None = None

    if target.is_cpu:
        n_iters = effort.cpu_iters
        b_scale = 2.0 ** -b_shift_for(prec, n_iters)
        out = torch.empty(effort.cpu_elements, dtype=prec.torch_dtype)

        def launch() -> None:
            _torch_chains(out, prec.a, b_scale, n_iters)

        info["backend"] = "torch (CPU fallback: checks the recurrence, not a peak)"
    else:
        if triton is None:
            raise DoesNotFit(f"the CUDA-core FMA peak needs Triton, which is not importable here ({TRITON_MISSING})")
        sms = target.effective_sms or torch.cuda.get_device_properties(0).multi_processor_count
        out = torch.empty(sms * PROGRAMS_PER_SM * BLOCK, dtype=prec.torch_dtype, device=device)
        a_dev = torch.full((1,), prec.a, dtype=prec.torch_dtype, device=device)
        paired = prec.paired
        if paired:
            try:
                launch_triton(out, UNROLL * 16, a_dev, 2.0 ** -b_shift_for(prec, UNROLL * 16), paired=paired)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - any compile failure: fall back to scalar FMAs
                paired = None
                info["paired_fallback_reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            info["paired"] = paired is not None
        info["backend"] = "triton" + (f" ({paired}, two FMAs per instruction)" if paired else "")
        # Calibrate: time a short launch, then size the real one to about effort.call_s.
        b_cal = 2.0 ** -b_shift_for(prec, CALIBRATION_ITERS)
        cal = time_fn(lambda: launch_triton(out, CALIBRATION_ITERS, a_dev, b_cal, paired=paired),
                      warmup=1, repeats=3, device=device)
        n_iters = _round_iters(CALIBRATION_ITERS * effort.call_s / max(statistics.median(cal), 1e-7))
        b_scale = 2.0 ** -b_shift_for(prec, n_iters)

        def launch() -> None:
            launch_triton(out, n_iters, a_dev, b_scale, paired=paired)

    timing = timer(launch, warmup=effort.warmup, repeats=effort.repeats)
    # Poison, run once more, check: every element must be written with the right value.
    out.fill_(float("nan"))
    launch()
    if not target.is_cpu:
        torch.cuda.synchronize()
    rel_err = verify_chains(out, n_iters, prec, b_scale)
    flops = 2.0 * out.numel() * n_iters
    info.update({"elements": out.numel(), "iterations": n_iters, "rel_error": rel_err, "rel_limit": prec.rel_limit,
                 "chains_per_thread": 2 * PAIRS if paired else CHAINS, "repeats": len(timing.samples)})
    del out
    if not target.is_cpu:
        torch.cuda.empty_cache()
    return _metrics(target, prec, timing, flops, info)


def peak_clock(target: Target, timing: Timing) -> tuple[float | None, str]:
    """The SM clock (MHz) for the theoretical peak: measured after the run, else the GPU's max clock."""
    after = (timing.clocks or {}).get("after") or {}
    mhz = after.get("sm_clock_mhz")
    if isinstance(mhz, (int, float)) and mhz > 0:
        return float(mhz), "measured after the run"
    mhz = (target.fingerprint or {}).get("max_sm_clock_mhz")
    if isinstance(mhz, (int, float)) and mhz > 0:
        return float(mhz), "max SM clock (fingerprint)"
    return None, "unknown"


def theoretical_tflops(sms: int, fma_per_clock: int, clock_mhz: float) -> float:
    """SMs x FMA/clock x 2 FLOPs x clock, in TFLOPS."""
    return sms * fma_per_clock * 2.0 * clock_mhz * 1e6 / 1e12


def _metrics(target: Target, prec: FmaPrecision, timing: Timing, flops: float, info: dict[str, Any]) -> list[Metric]:
    p = f"{prec.name}_fma"  # fp32_fma_tflops: never confused with the matmul's fp32_tflops
    samples = [r / 1e12 for r in timing.rate_samples(flops)]
    tflops = statistics.median(samples)
    after = (timing.clocks or {}).get("after") or {}
    if timing.clocks:
        info["clocks"] = timing.clocks
    if "throttled" in after:
        info["throttled"] = bool(after["throttled"])
    metrics = [Metric(f"{p}_tflops", tflops, "TFLOPS", "higher", samples, kind="compute", info=info)]
    cap = None if target.is_cpu else device_capability(target)
    per_clock = fma_per_sm_per_clock(cap, prec.name, target.gpu_name) if cap else None
    clock, source = peak_clock(target, timing)
    sms = target.effective_sms
    if per_clock and clock and sms and not target.is_cpu:
        peak = theoretical_tflops(sms, per_clock, clock)
        metrics.append(Metric(f"{p}_pct_of_peak", 100.0 * tflops / peak, "%", "higher", [], kind="info",
                              compare=False, info={"peak_tflops": peak, "sms": sms, "fma_per_sm_per_clock": per_clock,
                                                   "sm_clock_mhz": clock, "clock_source": source}))
    metrics.extend(energy_metrics(timing, flops / 1e12, "TFLOP", label=p))
    return metrics


__all__ = [
    "BLOCK",
    "FMA_PRECISIONS",
    "FMA_PRECISION_NAMES",
    "FmaPrecision",
    "TRITON_MISSING",
    "UNROLL",
    "b_shift_for",
    "expected_values",
    "launch_triton",
    "peak_clock",
    "run_fma",
    "theoretical_tflops",
    "verify_chains",
]
