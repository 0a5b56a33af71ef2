"""Particle tracking through an LHC-scale lattice: CERN's "simulation" workload (simpletrack).

Each particle is tracked, element by element, turn by turn, in float64 (reference/simpletrack.md
gives the maps).  On a GPU one fused Triton kernel does all elements of all turns in one launch:
one program per block of particles, each element dispatching on its type code, so the benchmark
measures the GPU and not the Python launcher.  The NumPy implementation of the same maps
(:mod:`pytest_mig.workloads.tracking_maps`) is the reference the kernel is checked against; the
same code on torch tensors is the CPU path.

Figures of merit: particle-turns per second and microseconds per particle-turn, as in
simpletrack's and CERN's tables.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_mig.measure import Metric, Timer, Timing, energy_metrics
from pytest_mig.measure.placements import Rotation, fitting
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError
from pytest_mig.workloads.lattice import LHC, Lattice, LatticeSpec, generate_lattice
from pytest_mig.workloads.tracking_maps import (
    NCOORD,
    Beam,
    Particles,
    compare,
    random_particles,
    simpletrack_particles,
    track_reference,
)

try:  # optional: the fused GPU kernel needs it; CI installs only the project's dependencies
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001  # pragma: no cover - a broken install is as good as none
    triton = None
    tl = None

#: Bytes of device memory per particle: coordinates in and out, lost flag and turn counter in and out.
BYTES_PER_PARTICLE = 2 * (NCOORD * 8 + 4 + 4)
#: Buffer sets a GPU run times at most, each as often (quick mode: two): the figure is the median
#: over placements in device memory (pytest_mig.measure.placements).
PLACEMENTS = 4
#: The particle counts of CERN's simpletrack table (A100 40GB, 10 turns).
CERN_SIZES = (5_000_000, 10_000_000, 15_000_000)
#: Largest error of the Triton kernel against the NumPy reference, relative to each coordinate's
#: largest magnitude.  The GPU contracts a*b + c into FMAs, and zeta's path-length term
#: (rvv - 1 - (x'^2 + y'^2)/2) cancels, so zeta differs most (after 2 LHC turns on an H200, by a
#: few percent of this limit).  A map off by 1e-7 in one drift or 1e-6 in one quadrupole shows as
#: 1e-8 or more (tests/test_tracking.py).
REFERENCE_LIMIT = 1e-9
#: The torch CPU path runs the very same operations as NumPy (no FMA contraction): near-exact.
TORCH_LIMIT = 1e-12
#: Particles tracked again on their own must end where the big run put them.  Not bit for bit:
#: with several particles per thread the compiler may contract the lanes' a*b + c differently, so
#: a particle at another place in its block rounds differently (chaotically amplified over the
#: turns).  An indexing bug (block, mask, stride) is wrong by far more than this.
SAME_PARTICLES_LIMIT = 1e-11


# ---------------------------------------------------------------------------------------------
# The fused GPU kernel.  Python floats become fp32 kernel arguments in Triton, so every float64
# constant (the beam's, the lattice's) is read from a float64 buffer instead.


def _track_kernel(
    cin, cout, lost_in, lost_out, turn_in, turn_out,  # particles: [8, stride] float64, [stride] int32
    el_types, el_offsets, el_params, beam,  # lattice SoA and beam constants (float64); not named
    # 'params': Triton's argument binder has a local of that name, and a kernel argument shadowing it
    # fails with "failed to specialize argument of type: dict" (Triton 3.6)
    n_part, stride, n_elem, n_turns,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    m = idx < n_part
    x = tl.load(cin + 0 * stride + idx, mask=m, other=0.0)
    px = tl.load(cin + 1 * stride + idx, mask=m, other=0.0)
    y = tl.load(cin + 2 * stride + idx, mask=m, other=0.0)
    py = tl.load(cin + 3 * stride + idx, mask=m, other=0.0)
    zeta = tl.load(cin + 4 * stride + idx, mask=m, other=0.0)
    delta = tl.load(cin + 5 * stride + idx, mask=m, other=0.0)
    rpp = tl.load(cin + 6 * stride + idx, mask=m, other=1.0)
    rvv = tl.load(cin + 7 * stride + idx, mask=m, other=1.0)
    lost = tl.load(lost_in + idx, mask=m, other=1)
    turn = tl.load(turn_in + idx, mask=m, other=0)
    beta0 = tl.load(beam + 0)
    p0c = tl.load(beam + 1)
    charge0 = tl.load(beam + 2)
    chi = tl.load(beam + 3)
    inv_beta0_sq = tl.load(beam + 4)
    mratio_sq = tl.load(beam + 5)
    for _t in range(n_turns):
        for e in range(n_elem):
            kind = tl.load(el_types + e)
            off = tl.load(el_offsets + e)
            alive = lost == 0
            if kind == 0:  # DRIFT
                length = tl.load(el_params + off)
                xpr = px * rpp
                ypr = py * rpp
                x = tl.where(alive, x + xpr * length, x)
                y = tl.where(alive, y + ypr * length, y)
                zeta = tl.where(alive, zeta + length * (rvv - (1.0 + (xpr * xpr + ypr * ypr) * 0.5)), zeta)
                out = (tl.abs(x) >= 1.0) | (tl.abs(y) >= 1.0)
                lost = tl.where(alive & out, 1, lost)
            elif kind == 1:  # MULTIPOLE
                order = tl.load(el_params + off).to(tl.int32)
                length = tl.load(el_params + off + 1)
                hxl = tl.load(el_params + off + 2)
                hyl = tl.load(el_params + off + 3)
                bal = el_params + off + 4
                dpx = x * 0.0 + tl.load(bal + 2 * order)
                dpy = x * 0.0 + tl.load(bal + 2 * order + 1)
                for j in range(order):
                    i = order - 1 - j
                    zre = dpx * x - dpy * y
                    zim = dpx * y + dpy * x
                    dpx = tl.load(bal + 2 * i) + zre
                    dpy = tl.load(bal + 2 * i + 1) + zim
                dpx = -chi * dpx
                dpy = chi * dpy
                if length > 0.0:
                    hxx = hxl / length * x
                    hyy = hyl / length * y
                    dpx = dpx + (hxl + hxl * delta - chi * tl.load(bal) * hxx)
                    dpy = dpy - (hyl + hyl * delta - chi * tl.load(bal + 1) * hyy)
                    zeta = tl.where(alive, zeta - chi * (hxx - hyy) * length, zeta)
                px = tl.where(alive, px + dpx, px)
                py = tl.where(alive, py + dpy, py)
            elif kind == 2:  # CAVITY
                volt = tl.load(el_params + off)
                kfreq = tl.load(el_params + off + 1)
                lag = tl.load(el_params + off + 2)
                tau = zeta / (rvv * beta0)
                phase = lag - kfreq * tau
                de = chi * charge0 * volt * tl.sin(phase)
                rep = tl.sqrt(delta * delta + 2.0 * delta + inv_beta0_sq) + de / p0c
                irpp = tl.sqrt(rep * rep - mratio_sq)
                beta = irpp / rep
                delta = tl.where(alive, irpp - 1.0, delta)
                rpp = tl.where(alive, 1.0 / irpp, rpp)
                rvv = tl.where(alive, beta / beta0, rvv)
                zeta = tl.where(alive, tau * beta, zeta)
            elif kind == 3:  # XYSHIFT
                x = tl.where(alive, x - tl.load(el_params + off), x)
                y = tl.where(alive, y - tl.load(el_params + off + 1), y)
            elif kind == 4:  # SROTATION
                cs = tl.load(el_params + off)
                sn = tl.load(el_params + off + 1)
                xn = cs * x + sn * y
                yn = -sn * x + cs * y
                pxn = cs * px + sn * py
                pyn = -sn * px + cs * py
                x = tl.where(alive, xn, x)
                y = tl.where(alive, yn, y)
                px = tl.where(alive, pxn, px)
                py = tl.where(alive, pyn, py)
        turn = tl.where(lost == 0, turn + 1, turn)
    tl.store(cout + 0 * stride + idx, x, mask=m)
    tl.store(cout + 1 * stride + idx, px, mask=m)
    tl.store(cout + 2 * stride + idx, y, mask=m)
    tl.store(cout + 3 * stride + idx, py, mask=m)
    tl.store(cout + 4 * stride + idx, zeta, mask=m)
    tl.store(cout + 5 * stride + idx, delta, mask=m)
    tl.store(cout + 6 * stride + idx, rpp, mask=m)
    tl.store(cout + 7 * stride + idx, rvv, mask=m)
    tl.store(lost_out + idx, lost, mask=m)
    tl.store(turn_out + idx, turn, mask=m)


@functools.lru_cache(maxsize=1)
def _jitted() -> Any:
    if triton is None:
        raise DoesNotFit("triton is not installed: the fused tracking kernel needs it")
    return triton.jit(_track_kernel)


@dataclass
class DeviceLattice:
    """A lattice and beam constants as torch tensors on one device, for the kernel."""

    types: Any
    offsets: Any
    params: Any
    beam: Any
    n_elem: int

    @classmethod
    def of(cls, lattice: Lattice, beam: Beam, device: str) -> DeviceLattice:
        import torch

        return cls(
            torch.as_tensor(lattice.types, device=device),
            torch.as_tensor(lattice.offsets, device=device),
            torch.as_tensor(lattice.params, device=device),
            torch.tensor(beam.constants(), dtype=torch.float64, device=device),
            len(lattice),
        )


#: Particles per program and warps per program: 4 particles per thread.  Independent particles in
#: one thread hide the latency of the per-element parameter loads: on an H200 this tracked about
#: a third faster than one particle per thread (block 128, 4 warps), and more per thread gained nothing.
BLOCK = 512
NUM_WARPS = 4


def track_triton(lat: DeviceLattice, src: Particles, dst: Particles, turns: int, *, block: int = BLOCK,
                 num_warps: int = NUM_WARPS) -> None:
    """Track ``src`` into ``dst`` (torch tensors on the kernel's device) in one kernel launch."""
    n = src.n
    grid = ((n + block - 1) // block,)
    _jitted()[grid](
        src.coords, dst.coords, src.lost, dst.lost, src.turn, dst.turn,
        lat.types, lat.offsets, lat.params, lat.beam,
        n, src.coords.stride(0), lat.n_elem, turns,
        BLOCK=block, num_warps=num_warps,
    )


def empty_like(p: Particles) -> Particles:
    import torch

    return Particles(torch.empty_like(p.coords), torch.empty_like(p.lost), torch.empty_like(p.turn))


# ---------------------------------------------------------------------------------------------
# Verification


@functools.lru_cache(maxsize=8)
def reference_result(spec: LatticeSpec, seed: int, n: int, turns: int) -> Particles:
    """NumPy tracking of ``random_particles(n)``: computed once per process and case."""
    return track_reference(lattice_for(spec, seed), random_particles(n, seed=seed), turns)


@functools.lru_cache(maxsize=4)
def lattice_for(spec: LatticeSpec, seed: int) -> Lattice:
    return generate_lattice(spec, seed)


# ---------------------------------------------------------------------------------------------
# The workload


def fitted_particles(target: Target) -> int:
    """Enough particles to fill every SM many times over (32 programs of BLOCK particles per SM)."""
    return max(1, target.effective_sms or 1) * 16384


def run_tracking(
    target: Target,
    timer: Timer,
    *,
    particles: int | None = None,
    turns: int | None = None,
    quick: bool = False,
    seed: int = 0,
    spec: LatticeSpec = LHC,
) -> list[Metric]:
    """Track a beam through the LHC-scale lattice; particle-turns/s and µs per particle-turn.

    ``particles=None`` sizes the beam to the Target (10 turns, simpletrack's count); a given
    count (CERN's 5M/10M/15M) runs 1 turn per call: the rate per particle-turn does not depend on
    the number of turns, and the figure for CERN's 10 turns is recorded alongside.
    """
    if target.is_cpu:
        return _run_cpu(target, timer, particles=particles, quick=quick, seed=seed)
    import torch

    if triton is None:
        raise DoesNotFit("triton is not installed: the fused tracking kernel needs it")
    n = particles or fitted_particles(target)
    if turns is None:
        turns = (2 if quick else 10) if particles is None else 1
    need, budget = n * BYTES_PER_PARTICLE, target.memory_budget()
    sets = fitting(need, budget, 2 if quick else PLACEMENTS)
    if not sets:
        raise DoesNotFit(f"{n:,} particles need ~{need / 1e9:.1f} GB, the Target has {budget / 1e9:.1f} GB")

    lattice, host = lattice_for(spec, seed), simpletrack_particles(n)
    lat = DeviceLattice.of(lattice, Beam(), target.device)
    beams = [(src, empty_like(src)) for src in (host.to_torch(target.device) for _ in range(sets))]
    rotation = Rotation(beams, lambda src, dst: track_triton(lat, src, dst, turns))
    timing = timer(rotation, warmup=1, repeats=rotation.repeats(2 if (quick or particles) else 3))
    torch.cuda.synchronize()

    _verify_run(lat, beams, turns, spec, seed, target.device, quick)
    return _metrics(timing, n, turns, lattice, "triton", placements=len(beams))


def _verify_run(lat: DeviceLattice, beams: list[tuple[Particles, Particles]], turns: int, spec: LatticeSpec,
                seed: int, device: str, quick: bool) -> None:
    """Four checks: the beam survived and is finite; every buffer set tracked it to the same bits;
    particles picked across the whole beam, tracked alone, end where the big run put them (blocks,
    masks, strides); random particles agree with the NumPy reference to REFERENCE_LIMIT (float64, FMAs)."""
    import torch

    src, dst = beams[0]
    if not bool(dst.coords.isfinite().all()):
        raise WorkloadError("tracking produced non-finite coordinates")
    same = (torch.equal(d.coords.view(torch.int64), dst.coords.view(torch.int64))  # bits: -0.0 is not 0.0
            and torch.equal(d.lost, dst.lost) and torch.equal(d.turn, dst.turn) for _, d in beams[1:])
    if not all(same):
        raise WorkloadError("buffer sets holding the same beam were tracked to different results")
    nlost = int(dst.lost.sum())
    if nlost:
        raise WorkloadError(f"{nlost} of {dst.n} particles were lost: simpletrack's beam must survive")
    if not bool((dst.turn == turns).all()):
        raise WorkloadError("turn counters do not equal the number of turns tracked")
    picks = np.unique(np.linspace(0, src.n - 1, min(src.n, 61)).astype(np.int64))
    sub = src.take(picks)
    sub_out = empty_like(sub)
    track_triton(lat, sub, sub_out, turns)
    compare(sub_out, dst.take(picks), SAME_PARTICLES_LIMIT, "the same particles tracked alone")

    ref_turns = 1 if quick else 2
    want = reference_result(spec, seed, 32, ref_turns)
    rnd = random_particles(32, seed=seed).to_torch(device)
    rnd_out = empty_like(rnd)
    track_triton(lat, rnd, rnd_out, ref_turns)
    compare(rnd_out, want, REFERENCE_LIMIT, "Triton kernel vs NumPy reference")


def _run_cpu(target: Target, timer: Timer, *, particles: int | None, quick: bool, seed: int) -> list[Metric]:
    """The CPU smoke path: the reference maps on torch tensors, a 1/16-scale lattice, few particles."""
    import torch

    if particles is not None:
        raise DoesNotFit(f"{particles:,} particles is a GPU case; a CPU run tracks only the fitted tiny case")
    spec = LHC.scaled(1 / 16)
    lattice = lattice_for(spec, seed)
    n, turns = (256, 1) if quick else (1024, 1)
    src = simpletrack_particles(n).to_torch("cpu")
    result: list[Particles] = []

    def step() -> None:
        result[:] = [track_reference(lattice, src, turns, xp=torch)]

    timing = timer(step, warmup=0, repeats=1 if quick else 2)
    out = result[0].numpy()
    if not np.all(np.isfinite(out.coords)) or int(out.lost.sum()):
        raise WorkloadError("CPU tracking lost particles or produced non-finite coordinates")
    rnd = random_particles(16, seed=seed)
    compare(track_reference(lattice, rnd.to_torch("cpu"), 1, xp=torch), reference_result(spec, seed, 16, 1), TORCH_LIMIT, "torch vs NumPy reference")
    return _metrics(timing, n, turns, lattice, "torch-cpu")


def _metrics(timing: Timing, n: int, turns: int, lattice: Lattice, path: str, placements: int = 1) -> list[Metric]:
    work = n * turns
    info = {"particles": n, "turns": turns, "elements": len(lattice), "path": path, "lattice_seed": lattice.seed,
            "placements": placements}
    rates = timing.rate_samples(work)
    us = [s * 1e6 / work for s in timing.samples]
    timed = {**info, **timing.clock_info()}  # the SM clock and temperature it ran at, and any throttle
    metrics = [
        Metric("particle_turns_per_s", work / timing.median, "particle-turns/s", "higher", rates, kind="simulation",
               info=timed),
        Metric("us_per_particle_turn", timing.median * 1e6 / work, "us", "lower", us, kind="simulation", info=timed),
        Metric("seconds_per_10_turns", timing.median / turns * 10, "s", "lower", [], kind="info", info=info, compare=False),
        Metric("particles", n, "particles", "higher", [], kind="info", info=info, compare=False),
    ]
    return metrics + energy_metrics(timing, work, "particle-turn")
