"""GEMM, FMA-chain and STREAM workloads on the CPU: record shapes, verification, sizing, error paths.

Nothing here measures speed.  GPU-only paths are exercised through pure functions (sizes planned
for a 10 GB slice and a 141 GB GPU, percentages from fake timings) and, for the Triton kernel,
through Triton's interpreter where Triton is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from triton_support import needs_triton

from pytest_mig.device.target import TargetInfo
from pytest_mig.measure import Metric, Timing
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError, all_finite, fma, gemm, stream

GIB = 2**30


def _slice(memory_gib: float, sms: int, *, kind: str = "mig", profile: str = "1g.10gb",
           gpu: str = "NVIDIA H100 80GB HBM3", cc: tuple[int, int] = (9, 0), **kw) -> Target:
    """A GPU Target that is never touched: only its numbers are read."""
    return Target(kind=kind, profile=profile, chosen_by="test", gpu_name=gpu, sms=sms,
                  memory_bytes=int(memory_gib * GIB), compute_capability=cc, **kw)


H100_1G = dict(memory_gib=9.75, sms=16)  # 1g.10gb on an H100
H200_FULL = dict(memory_gib=140.0, sms=132, kind="full", profile="full", gpu="NVIDIA H200")


def _check_well_formed(metrics: list[Metric], headline: str, kind: str, unit: str) -> dict[str, Metric]:
    by_name = {m.name: m for m in metrics}
    assert len(by_name) == len(metrics), "metric names must be unique within a test"
    head = by_name[headline]
    assert head.unit == unit and head.direction == "higher" and head.kind == kind and head.compare
    assert head.samples and all(s > 0 for s in head.samples)
    assert head.value == pytest.approx(sorted(head.samples)[len(head.samples) // 2], rel=1.0)
    assert head.value > 0
    for m in metrics:
        assert m.direction in ("higher", "lower")
        m.to_dict()  # serialisable
        if m.kind == "info":
            assert not m.compare
    return by_name


# --- GEMM ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bf16", "fp32", "fp64"])
def test_gemm_metrics_on_cpu(cpu, timer, dtype):
    metrics = gemm.run_gemm(cpu, timer, dtype=dtype, quick=True)
    prec = gemm.PRECISIONS[dtype]
    by_name = _check_well_formed(metrics, f"{dtype}_tflops", prec.kind, "TFLOPS")
    head = by_name[f"{dtype}_tflops"]
    assert head.info["rel_error"] <= prec.rel_limit
    assert by_name[f"{dtype}_size_at_peak"].value in gemm.CPU_SIZES_QUICK
    assert by_name[f"{dtype}_peak_memory_gb"].unit == "GB"
    assert f"{dtype}_pct_of_peak" not in by_name  # the CPU has no datasheet peak
    if prec.wide_sweep:
        best = by_name[f"{dtype}_best_sweep_tflops"]
        ratio = by_name[f"{dtype}_headline_vs_best"]
        assert best.value > 0 and ratio.value == pytest.approx(head.value / best.value)


def test_gemm_headline_is_the_work_over_the_timed_calls_gpu_time():
    prec = gemm.PRECISIONS["bf16"]
    flops = 2.0 * 1024**3
    timing = Timing(samples=[1.0, 1.0, 4.0])  # a median would read the two fast calls alone
    metrics = gemm._metrics(_slice(**H200_FULL), prec, timing, flops, 1024, 0.001, 1.0, "test",
                            [((1024, 1024, 1024), 1.0, 1.0)], [])
    head = next(m for m in metrics if m.name == "bf16_tflops")
    assert head.value == pytest.approx(flops * 3 / 6.0 / 1e12)
    assert sorted(head.samples) == pytest.approx([flops / 4.0 / 1e12, flops / 1e12, flops / 1e12])
    rounds = gemm._metrics(_slice(**H200_FULL), prec, Timing(samples=[1.0, 1.0, 4.0], calls_per_sample=7), flops,
                           1024, 0.001, 1.0, "test", [((1024, 1024, 1024), 1.0, 1.0)], [])
    assert next(m for m in rounds if m.name == "bf16_tflops").info["calls"] == 21  # 3 rounds of 7 calls
    # a sample no call can take (a clock step clamped to zero, no finite time) counts neither in the rates nor
    # the headline
    for odd in (0.0, float("inf")):
        got = gemm._metrics(_slice(**H200_FULL), prec, Timing(samples=[odd, 1.0, 1.0]), flops, 1024, 0.001, 1.0,
                            "test", [((1024, 1024, 1024), 1.0, 1.0)], [])
        head = next(m for m in got if m.name == "bf16_tflops")
        assert head.value == pytest.approx(flops / 1e12) and len(head.samples) == 2
    assert gemm.EFFORT[("gpu", False)].headline_s >= 2.0 > gemm.EFFORT[("gpu", True)].headline_s > 0


@pytest.mark.parametrize("dtype", ["fp8", "tf32", "fp16"])
def test_gemm_gpu_only_precisions_do_not_fit_the_cpu(cpu, timer, dtype):
    with pytest.raises(DoesNotFit, match="CPU"):
        gemm.run_gemm(cpu, timer, dtype=dtype)


def test_gemm_fp8_needs_ada_or_hopper():
    with pytest.raises(DoesNotFit, match=r"compute capability >= 8\.9; this GPU is 8\.0"):
        gemm.check_runnable(_slice(9.5, 14, cc=(8, 0), gpu="NVIDIA A100-SXM4-80GB"), gemm.PRECISIONS["fp8"])
    gemm.check_runnable(_slice(**H100_1G), gemm.PRECISIONS["fp8"])  # no error: Hopper, torch has _scaled_mm


def test_gemm_unknown_dtype(cpu, timer):
    with pytest.raises(ValueError, match="unknown GEMM precision 'int4'"):
        gemm.run_gemm(cpu, timer, dtype="int4")


def test_gemm_wrong_product_fails_verification(cpu, timer, monkeypatch):
    real = gemm._matmul

    def off_by_a_little(a, b, out):
        real(a, b, out)
        return out.mul_(1.001)  # 1e-3 relative: far above fp32's limit, far below "obviously broken"

    monkeypatch.setattr(gemm, "_matmul", off_by_a_little)
    with pytest.raises(WorkloadError, match="fp32 GEMM .* relative error"):
        gemm.run_gemm(cpu, timer, dtype="fp32", quick=True)


def test_gemm_tf32_sized_error_fails_fp32(cpu, timer, monkeypatch):
    real = gemm._matmul

    def tf32_like(a, b, out):  # round the inputs to 10 mantissa bits, as TF32 does
        def r(t):
            return (t.view(torch.int32) & ~0x1FFF).view(torch.float32)

        return real(r(a), r(b), out)

    monkeypatch.setattr(gemm, "_matmul", tf32_like)
    with pytest.raises(WorkloadError):
        gemm.run_gemm(cpu, timer, dtype="fp32", quick=True)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_finiteness_check_finds_one_bad_element_looking_at_a_block_at_a_time(monkeypatch, bad):
    seen: list[int] = []
    isfinite = torch.isfinite

    def counting(t):
        seen.append(t.numel())
        return isfinite(t)

    monkeypatch.setattr(torch, "isfinite", counting)
    c = torch.randn(300, 37, dtype=torch.bfloat16)
    assert all_finite(c, block=1000) and all_finite(c.t(), block=1000)
    assert seen and max(seen) <= 1000  # never the whole result at once: its temporaries are several times its size
    for where in ((0, 0), (150, 20), (299, 36)):
        d = c.clone()
        d[where] = bad
        assert not all_finite(d, block=1000) and not all_finite(d.t(), block=1000)
    assert max(seen) <= 1000


def test_gemm_nan_fails_verification(cpu, timer, monkeypatch):
    def nan_in_corner(a, b, out):
        torch.matmul(a, b, out=out)
        out[-1, -1] = float("nan")
        return out

    monkeypatch.setattr(gemm, "_matmul", nan_in_corner)
    with pytest.raises(WorkloadError, match="NaN"):
        gemm.run_gemm(cpu, timer, dtype="bf16", quick=True)


@pytest.mark.parametrize("target_kw", [H100_1G, H200_FULL], ids=["10GB", "141GB"])
@pytest.mark.parametrize("dtype", gemm.PRECISION_NAMES)
@pytest.mark.parametrize("quick", [False, True])
def test_gemm_sizes_fit_the_budget(target_kw, dtype, quick):
    target = _slice(**target_kw)
    prec = gemm.PRECISIONS[dtype]
    budget = target.memory_budget()
    sizes = gemm.gemm_sizes(budget, prec.plan_bytes, target.effective_sms, quick=quick)
    assert sizes and sizes == sorted(sizes)
    for n in sizes:
        assert n % gemm.ALIGN == 0
        assert prec.plan_bytes * n * n <= gemm.MEMORY_SHARE * budget
        assert (n // gemm.TILE) ** 2 >= gemm.MIN_TILES_PER_SM * target.effective_sms  # fills the SMs
    for m, n, k in gemm.wide_shapes(sizes[-1], budget, prec.plan_bytes, quick=quick):
        assert prec.plan_bytes / 3 * (m * k + k * n + m * n) <= gemm.MEMORY_SHARE * budget


def test_gemm_sizes_grow_with_memory():
    small = gemm.gemm_sizes(int(9.75 * GIB), 24, 16)  # fp64 on a 10 GB slice
    large = gemm.gemm_sizes(140 * GIB, 24, 132)  # fp64 on a whole H200
    assert max(small) < max(large)
    assert 16384 not in small and 20480 in large
    assert min(large) > min(small)  # 132 SMs need bigger problems to fill


def test_gemm_sizes_when_no_listed_size_fits():
    budget = 160 * 2**20  # three fp64 matrices in half of it: at most 1792, below every listed size
    cap = gemm.max_square_size(budget, 24)
    assert 0 < cap < min(gemm.GPU_SIZES)
    assert gemm.gemm_sizes(budget, 24, 16) == [cap]
    assert gemm.gemm_sizes(2**20, 24, 16) == []


def test_gemm_pct_of_peak_uses_the_slices_share_of_the_datasheet():
    target = _slice(**H100_1G)
    flops = 2.0 * 8192**3
    timing = Timing(samples=[flops / 100e12] * 5)  # 100 TFLOPS
    metrics = gemm._metrics(target, gemm.PRECISIONS["bf16"], timing, flops, 8192, 0.001, 1.2, "test",
                            [((8192, 8192, 8192), 100.0, 0.01)], [((8192, 8192, 16384), 104.0, 0.02)])
    by_name = {m.name: m for m in metrics}
    peak = target.peak_tflops("bf16")
    assert peak == pytest.approx(989.0 * 16 / 132)
    assert by_name["bf16_pct_of_peak"].value == pytest.approx(100 * 100.0 / peak)
    assert by_name["bf16_headline_vs_best"].value == pytest.approx(100.0 / 104.0)
    assert by_name["bf16_best_sweep_tflops"].info["shape_mnk"] == [8192, 8192, 16384]
    fp64 = gemm._metrics(target, gemm.PRECISIONS["fp64"], timing, flops, 8192, 0.0, 1.2, "test",
                         [((8192, 8192, 8192), 100.0, 0.01)], [])
    assert {m.name: m for m in fp64}["fp64_pct_of_peak"].info["peak_key"] == "fp64_tensor"


def test_gemm_headline_size_is_the_largest_within_five_percent_of_the_best() -> None:
    from pytest_mig.workloads.gemm import headline_size

    sweep = [((3072, 3072, 3072), 742.0, 0.0), ((8192, 8192, 8192), 720.0, 0.0), ((12288, 12288, 12288), 700.0, 0.0)]
    assert headline_size(sweep) == 8192  # 700 is 5.7% under a burst at 3072; 720 is within 3%
    assert headline_size(sweep, tie=0.06) == 12288
    assert headline_size([((256, 256, 256), 1.0, 0.0)]) == 256


def test_gemm_sustained_and_per_sm_cycle_figures_come_from_the_energy_window(cpu, timer, monkeypatch):
    from pytest_mig.measure import PowerTrace, Telemetry, Timer, Timing
    from pytest_mig.workloads.gemm import flop_per_sm_cycle

    # 100 calls of 2e12 FLOP in a 1 s window at a mean SM clock of 1500 MHz on 132 SMs
    timing = Timing(samples=[0.009], power=PowerTrace([600.0], 1.0, 600.0, "energy-counter", 700.0, [1400.0, 1600.0]),
                    energy_calls=100, window_calls=100)
    value, clock, sustained = flop_per_sm_cycle(timing, 2e12, 132)
    assert sustained == pytest.approx(2e14) and clock == pytest.approx(1500.0)
    assert value == pytest.approx(2e14 / (1500e6 * 132))
    assert flop_per_sm_cycle(Timing(samples=[0.009]), 2e12, 132) is None  # no window: no figure, not a guess
    ticks = {"mj": 0.0}

    def clocks() -> dict:
        return {"sm_clock_mhz": 1500, "throttle_reasons": [], "throttled": False}

    def energy() -> float:
        ticks["mj"] += 10.0
        return ticks["mj"]

    powered = Timer("cpu", Telemetry(read_power_w=lambda: 100.0, read_energy_mj=energy, read_clocks=clocks,
                                     interval=0.005, window_s=0.05, sustained_window_s=0.2))
    by = {m.name: m for m in gemm.run_gemm(cpu, powered, dtype="fp32", quick=True)}
    tflops, sustained_m = by["fp32_tflops"], by["fp32_sustained_tflops"]
    # GEMM's window times its sustained rate, so it runs the longer window, not the energy-only one
    assert sustained_m.info["window_s"] >= 0.2 and by["fp32_energy_j_per_tflop"].info["window_s"] >= 0.2
    plain = Timer("cpu", powered.telemetry)(lambda: time.sleep(0.001), warmup=0, repeats=2)
    assert plain.power is not None and 0.05 <= plain.power.seconds < 0.2  # other workloads: the short window
    assert sustained_m.unit == "TFLOPS" and sustained_m.compare and sustained_m.kind == tflops.kind
    # The same work timed over the window: on a busy 2-core CPU the two timings moved apart by 2.3x
    # once, and by 7.9x with a second test suite running beside it, so only the order of magnitude
    # is held: a wrong call count or FLOP count is off by 100x or more.
    assert 1 / 30 < sustained_m.value / tflops.value < 30
    assert "fp32_flop_per_sm_cycle" not in by  # the CPU has no SM count: no per-cycle figure rather than a guess


def test_gemm_window_figures_are_scaling_checked_as_the_hardware_allows():
    """An emulated H200 sweep, 4g (64 SMs at 1935 MHz) then 7g (132 SMs power-capped at 1485 MHz), as the
    2026-11-26 quick sweeps measured bf16.  Between profiles GEMM is judged on its sustained TFLOPS, at the
    clock sampled through its window (power-limited, not failed); the per-SM-cycle figure, already divided
    by SMs and clock, and the headline, whose few short repeats catch a capped clock moving, are left out
    of the ratios, each saying why (both failed 7g/4g on the GPU before)."""
    from pytest_mig.measure import PowerTrace
    from pytest_mig.store.results import ResultRecord
    from pytest_mig.judge.scaling import check_scaling

    def figures(profile: str, sms: int, mhz: float, tflops: float, *, window: bool = True) -> list[ResultRecord]:
        target = _slice(memory_gib=60.0, sms=sms, kind="emulated", profile=profile, gpu="NVIDIA H200")
        flops = 2.0 * 8192**3
        calls = 100
        trace = PowerTrace([600.0], calls * flops / (tflops * 1e12), None, "energy-counter", 700.0, [mhz - 40, mhz + 40])
        capped = mhz < 1900
        timing = Timing(samples=[flops / (tflops * 1e12)] * 5, power=trace if window else None,
                        clocks={"after": {"sm_clock_mhz": mhz + 200 if capped else mhz,  # read once the window ended
                                          "throttle_reasons": ["sw_power_cap"] if capped else [], "throttled": capped}},
                        energy_calls=calls if window else 0, window_calls=calls if window else 0)
        metrics = gemm._metrics(target, gemm.PRECISIONS["bf16"], timing, flops, 8192, 0.001, 1.2, "test",
                                [((8192, 8192, 8192), tflops, 0.01)], [])
        where = {"kind": "emulated", "emulated": True, "profile": profile, "gpu_name": "NVIDIA H200",
                 "gpu_slug": "nvidia-h200", "baseline_profile": f"{profile}-emulated", "sms_obtained": sms}
        return [ResultRecord("benchmarks/test_gemm.py::test_gemm[bf16]", m, TargetInfo.from_dict(where),
                             {"memory_total_mib": 143771})
                for m in metrics]

    records = figures("4g.71gb", 64, 1935.0, 425.0) + figures("7g.141gb", 132, 1485.0, 664.0)
    by = {r.metric.name: r.metric for r in records[: len(records) // 2]}
    assert by["bf16_flop_per_sm_cycle"].info["scaling"] is False and by["bf16_tflops"].info["scaling"] is False
    assert by["bf16_sustained_tflops"].info["clocks"]["window"]["sm_clock_mhz"] == 1935.0
    report = check_scaling(records)
    (row,) = report.rows
    assert row.metric == "bf16_sustained_tflops" and row.result == "power-limited" and not report.failures
    assert "SM clock 1485 vs 1935 MHz" in row.note  # the window's clock, not the 1685 read after it
    skipped = "\n".join(report.skipped)
    assert "bf16_flop_per_sm_cycle: not scaling-checked (per SM and per clock already" in skipped
    assert "bf16_tflops: not scaling-checked (between profiles bf16_sustained_tflops is judged" in skipped
    # a 7g that lost a quarter of its GEMM rate at the same capped clock is still caught
    slow = figures("4g.71gb", 64, 1935.0, 425.0) + figures("7g.141gb", 132, 1485.0, 0.75 * 664.0)
    assert [r.metric for r in check_scaling(slow).failures] == ["bf16_sustained_tflops"]
    # without an energy window (no board to read) there is no sustained figure: the headline is judged
    bare = figures("4g.71gb", 64, 1935.0, 425.0, window=False) + figures("7g.141gb", 132, 1485.0, 0.5 * 664.0, window=False)
    assert [r.metric for r in check_scaling(bare).failures] == ["bf16_tflops"]


def test_fp32_matmul_mode_restores_the_setting():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision if hasattr(matmul, "fp32_precision") else matmul.allow_tf32
    with gemm.fp32_matmul_mode(True):
        inside = matmul.fp32_precision if hasattr(matmul, "fp32_precision") else matmul.allow_tf32
        assert inside in ("tf32", True)
    after = matmul.fp32_precision if hasattr(matmul, "fp32_precision") else matmul.allow_tf32
    assert after == before


# --- FMA chains ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", fma.FMA_PRECISION_NAMES)
def test_fma_metrics_on_cpu(cpu, timer, dtype):
    metrics = fma.run_fma(cpu, timer, dtype=dtype, quick=True)
    by_name = _check_well_formed(metrics, f"{dtype}_fma_tflops", "compute", "TFLOPS")
    info = by_name[f"{dtype}_fma_tflops"].info
    assert info["rel_error"] <= fma.FMA_PRECISIONS[dtype].rel_limit
    assert info["iterations"] == fma.FMA_EFFORT[True].cpu_iters
    assert f"{dtype}_fma_pct_of_peak" not in by_name


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_fma_one_iteration_short_fails_the_exact_check(cpu, timer, monkeypatch, dtype):
    real = fma._torch_chains

    def one_short(out, a, b_scale, n_iters):
        return real(out, a, b_scale, n_iters - 1)

    monkeypatch.setattr(fma, "_torch_chains", one_short)
    with pytest.raises(WorkloadError, match=f"{dtype} FMA chains"):
        fma.run_fma(cpu, timer, dtype=dtype, quick=True)


@pytest.mark.parametrize("dtype", fma.FMA_PRECISION_NAMES)
def test_fma_unwritten_output_fails(cpu, timer, monkeypatch, dtype):
    monkeypatch.setattr(fma, "_torch_chains", lambda out, a, b_scale, n_iters: out)
    with pytest.raises(WorkloadError, match="NaN"):
        fma.run_fma(cpu, timer, dtype=dtype, quick=True)


def test_fma_fp16_wrong_constant_fails(cpu, timer, monkeypatch):
    real = fma._torch_chains
    monkeypatch.setattr(fma, "_torch_chains", lambda out, a, b_scale, n_iters: real(out, a, 2 * b_scale, n_iters))
    with pytest.raises(WorkloadError):
        fma.run_fma(cpu, timer, dtype="fp16", quick=True)


@pytest.mark.parametrize("a, n", [(1.0, 300), (0.5, 40), (0.75, 7)])
def test_fma_closed_form_matches_the_loop(a, n):
    idx = torch.arange(64)
    b_scale = 2.0**-12
    x, b = fma.initial_values(idx, b_scale)
    for _ in range(n):
        x = x * a + b
    assert torch.allclose(fma.expected_values(idx, n, a, b_scale), x, rtol=1e-13, atol=0)


@pytest.mark.parametrize("n_iters", [16, 4096, fma.MAX_ITERS])
def test_fma_exact_recurrence_stays_representable(n_iters):
    # |x| < 8 and every value a multiple of 2^-m with m + 3 <= 24: exact in fp32.
    m = fma.b_shift_for(fma.FMA_PRECISIONS["fp32"], n_iters)
    assert m >= 10 and m + 3 <= 24
    assert 0.5 + 8 * n_iters * 2.0**-m < 8


def test_fma_pct_of_peak_from_measured_clock_then_max_clock():
    target = _slice(**H100_1G, fingerprint={"max_sm_clock_mhz": 1980})
    flops = 1e12
    measured = Timing(samples=[flops / 5e12] * 3, clocks={"before": {}, "after": {"sm_clock_mhz": 1755,
                                                                                  "throttled": False}})
    by_name = {m.name: m for m in fma._metrics(target, fma.FMA_PRECISIONS["fp32"], measured, flops, {})}
    peak = fma.theoretical_tflops(16, 128, 1755)
    assert peak == pytest.approx(16 * 128 * 2 * 1755e6 / 1e12)
    pct = by_name["fp32_fma_pct_of_peak"]
    assert pct.value == pytest.approx(100 * 5.0 / peak)
    assert pct.info["clock_source"] == "measured after the run" and not pct.compare
    assert by_name["fp32_fma_tflops"].info["throttled"] is False

    no_clock = Timing(samples=[flops / 5e12] * 3)
    by_name = {m.name: m for m in fma._metrics(target, fma.FMA_PRECISIONS["fp64"], no_clock, flops, {})}
    assert by_name["fp64_fma_pct_of_peak"].info["sm_clock_mhz"] == 1980
    assert by_name["fp64_fma_pct_of_peak"].value == pytest.approx(100 * 5.0 / fma.theoretical_tflops(16, 64, 1980))

    unknown_cc = _slice(**H100_1G, cc=(7, 0))
    assert [m.name for m in fma._metrics(unknown_cc, fma.FMA_PRECISIONS["fp32"], no_clock, flops, {})] == [
        "fp32_fma_tflops"]


@needs_triton
def test_fma_triton_kernel_under_the_interpreter():
    code = textwrap.dedent(
        """
        import torch
        from pytest_mig.workloads import WorkloadError, fma
        for name, prec in fma.FMA_PRECISIONS.items():
            n = 4 * fma.UNROLL
            b_scale = 2.0 ** -fma.b_shift_for(prec, n)
            out = torch.full((2 * fma.PAIR_BLOCK,), float("nan"), dtype=prec.torch_dtype)
            a = torch.full((1,), prec.a, dtype=prec.torch_dtype)
            fma.launch_triton(out, n, a, b_scale)
            err = fma.verify_chains(out, n, prec, b_scale)
            caught = True
            if prec.exact:
                try:
                    fma.verify_chains(out, n + fma.UNROLL, prec, b_scale)
                    caught = False
                except WorkloadError:
                    pass
            print(name, err, caught)
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.split("\n") if line)
    assert set(lines) == set(fma.FMA_PRECISION_NAMES)
    for name, rest in lines.items():
        err, caught = rest.split()
        assert float(err) <= fma.FMA_PRECISIONS[name].rel_limit
        assert caught == "True"


# --- STREAM ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_stream_metrics_on_cpu(cpu, timer, dtype):
    metrics = stream.run_stream(cpu, timer, dtype=dtype, quick=True)
    by_name = _check_well_formed(metrics, f"{dtype}_triad_gbs", "memory", "GB/s")
    for k in stream.KERNEL_NAMES:
        m = by_name[f"{dtype}_{k}_gbs"]
        assert m.kind == "memory" and m.unit == "GB/s" and m.samples
        assert by_name[f"{dtype}_{k}_pct_of_copy"].kind == "info"
        assert f"{dtype}_{k}_pct_of_peak" not in by_name  # no datasheet on the CPU
    ceiling = by_name[f"{dtype}_d2d_copy_gbs"]
    assert ceiling.kind == "memory" and ceiling.samples
    assert by_name[f"{dtype}_triad_gbs"].info["elements"] == stream.STREAM_EFFORT[("cpu", True)].max_elements


def test_stream_byte_counting():
    n, b = 1000, 4
    assert {k: stream.kernel_bytes(k, n, b) for k in stream.KERNEL_NAMES} == {
        "copy": 2 * n * b, "mul": 2 * n * b, "add": 3 * n * b, "triad": 3 * n * b, "dot": 2 * n * b}
    with pytest.raises(ValueError, match="unknown STREAM kernel"):
        stream.kernel_bytes("nstream", n, b)


def test_stream_analytic_values():
    gold = stream.expected_after_one_pass("fp64")
    assert gold["a"] == pytest.approx(0.096) and gold["b"] == pytest.approx(0.04) and gold["c"] == pytest.approx(0.14)
    assert gold["dot_per_element"] == pytest.approx(0.096 * 0.04)


@pytest.mark.parametrize("broken", ["triad", "mul", "dot"])
def test_stream_wrong_kernel_fails_verification(cpu, timer, monkeypatch, broken):
    if broken == "triad":
        monkeypatch.setattr(stream._Arrays, "triad",
                            lambda self: torch.add(self.b, self.c, alpha=stream.SCALAR * 1.01, out=self.a))
    elif broken == "mul":
        monkeypatch.setattr(stream._Arrays, "mul", lambda self: self.b[: self.b.numel() // 2].mul_(1.0))
    else:
        def half_dot(self):
            self.dot_result = torch.dot(self.a[::2], self.b[::2])

        monkeypatch.setattr(stream._Arrays, "dot", half_dot)
    with pytest.raises(WorkloadError):
        stream.run_stream(cpu, timer, dtype="fp32", quick=True)


@pytest.mark.parametrize("target_kw, l2", [(H100_1G, 50 * 10**6), (H200_FULL, 60 * 10**6)], ids=["10GB", "141GB"])
@pytest.mark.parametrize("dtype, element_bytes", [("fp32", 4), ("fp64", 8)])
@pytest.mark.parametrize("quick", [False, True])
def test_stream_sizes_fit_the_budget_and_leave_the_l2(target_kw, l2, dtype, element_bytes, quick):
    target = _slice(**target_kw)
    budget = target.memory_budget()
    n = stream.stream_elements(budget, element_bytes, l2, quick=quick)
    assert n % stream.GRAIN == 0
    assert 3 * n * element_bytes <= stream.MEMORY_SHARE * budget
    assert n * element_bytes >= stream.MIN_L2_MULTIPLE * l2
    assert n <= stream.STREAM_EFFORT[("gpu", quick)].max_elements
    c = stream.ceiling_bytes(n * element_bytes, budget)
    assert n * element_bytes <= c and 2 * c <= max(stream.MEMORY_SHARE * budget, 2 * n * element_bytes)


def test_stream_sizes_reach_the_cap_on_a_big_gpu_only():
    assert stream.stream_elements(140 * GIB, 8, 60 * 10**6) == 2**28
    assert stream.stream_elements(int(9.75 * GIB), 8, 50 * 10**6) < 2**28


def test_stream_too_small_for_the_l2():
    with pytest.raises(DoesNotFit, match="L2"):
        stream.stream_elements(512 * 2**20, 4, 60 * 10**6)


def test_stream_datasheet_share_and_emulation_flag():
    mig = _slice(**H100_1G)
    peak, how = stream.datasheet_gbs(mig)
    assert peak == pytest.approx(3350.0 / 8) and how["memory_fraction"] == "1/8"
    emulated = _slice(**H100_1G, kind="emulated")
    peak, how = stream.datasheet_gbs(emulated)
    assert peak == pytest.approx(3350.0) and how["emulated_bandwidth_not_partitioned"] is True

    n, eb = 2**26, 4
    timings = {k: Timing(samples=[stream.kernel_bytes(k, n, eb) / 300e9] * 3) for k in stream.KERNEL_NAMES}
    metrics = stream._metrics(emulated, "fp32", n, eb, 50 * 10**6, timings, [600.0, 600.0], {"a": 0.0})
    by_name = {m.name: m for m in metrics}
    assert by_name["fp32_triad_gbs"].value == pytest.approx(300.0)
    assert by_name["fp32_triad_pct_of_copy"].value == pytest.approx(50.0)
    assert by_name["fp32_triad_pct_of_peak"].value == pytest.approx(100 * 300 / 3350)
    assert all(m.info.get("emulated_bandwidth_not_partitioned") for m in metrics if m.name.startswith("fp32_"))


def test_gemm_times_its_headline_at_the_size_it_is_judged_at(cpu, timer, monkeypatch):
    """Given the size its history was measured at, the headline is timed there whatever this run's sweep
    prefers, and every compared figure carries the size (what a history keeps with each run); a size
    that is not one of the Target's candidates leaves the choice to the sweep."""
    monkeypatch.setattr(gemm, "headline_size", lambda squares, tie=gemm.SIZE_TIE: gemm.CPU_SIZES_QUICK[-1])
    swept = {m.name: m for m in gemm.run_gemm(cpu, timer, dtype="fp32", quick=True)}
    assert swept["fp32_size_at_peak"].value == gemm.CPU_SIZES_QUICK[-1]
    assert swept["fp32_size_at_peak"].info["chosen_by"] == "this run's sweep"

    pinned = {m.name: m for m in gemm.run_gemm(cpu, timer, dtype="fp32", quick=True, size=gemm.CPU_SIZES_QUICK[0])}
    assert pinned["fp32_size_at_peak"].value == gemm.CPU_SIZES_QUICK[0]
    assert pinned["fp32_size_at_peak"].info["chosen_by"] == "the size it is judged at"
    assert pinned["fp32_tflops"].info["size"] == gemm.CPU_SIZES_QUICK[0]
    assert {m.info.get("size") for m in pinned.values() if m.compare} == {gemm.CPU_SIZES_QUICK[0]}

    other = {m.name: m for m in gemm.run_gemm(cpu, timer, dtype="fp32", quick=True, size=gemm.CPU_SIZES_QUICK[0] + 64)}
    assert other["fp32_size_at_peak"].value == gemm.CPU_SIZES_QUICK[-1]
