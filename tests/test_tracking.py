"""LHC-scale particle tracking on the CPU: the generated lattice, the maps, the checks, the record.

The lattice must be what its LatticeSpec claims (for the default spec: the real LHC's element mix
and scale, reference/simpletrack.md).  Each element map is checked against values worked out by
hand from simpletrack's formulas; the torch path against the NumPy float64 reference; and the
comparison the GPU run relies on must catch a slightly wrong map.  The Triton kernel runs under
Triton's interpreter where Triton is importable.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from triton_support import needs_triton

from pytest_mig.measure import Timer, Timing
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError
from pytest_mig.workloads import lattice as lat
from pytest_mig.workloads import tracking as trk
from pytest_mig.workloads import tracking_maps as maps

GIB = 2**30
SMALL = lat.LHC.scaled(1 / 64)  # ~300 elements: quick to track in NumPy


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny arrays: one thread beats a team


@pytest.fixture(scope="module")
def lhc() -> lat.Lattice:
    return lat.generate_lattice(lat.LHC, seed=0)


@pytest.fixture(scope="module")
def small() -> lat.Lattice:
    return lat.generate_lattice(SMALL, seed=1)


# --- the lattice -------------------------------------------------------------------------------


def test_lhc_lattice_has_simpletracks_scale(lhc):
    assert lhc.counts() == {"drift": 8316, "multipole": 10137, "cavity": 12, "xyshift": 176, "srotation": 16,
                            "thick": 2572, "total": 18657}
    assert lhc.total_length == pytest.approx(26658.88, abs=0.01)
    assert lhc.total_bend == pytest.approx(2 * math.pi, rel=1e-12)  # a closed ring
    assert lhc.max_order == 15
    cav = lhc.offsets[lhc.types == lat.CAVITY]
    volts = lhc.params[cav]
    assert np.count_nonzero(volts == 2.0e6) == 8 and np.count_nonzero(volts == 0.0) == 4
    assert np.all(lhc.params[cav + 1] == pytest.approx(8.3999))


@pytest.mark.parametrize("factor", [1 / 8, 1 / 64, 1 / 200])
def test_scaled_lattices_meet_their_spec(factor):
    spec = lat.LHC.scaled(factor)
    built = lat.generate_lattice(spec, seed=2)
    counts = built.counts()
    assert counts == {"drift": spec.drifts, "multipole": spec.multipoles, "cavity": spec.cavities,
                      "xyshift": spec.xyshifts, "srotation": spec.srotations, "thick": spec.thick,
                      "total": spec.elements}
    assert built.total_length == pytest.approx(spec.length_m, rel=1e-12)
    assert built.total_bend == pytest.approx(spec.total_bend_rad, rel=1e-12)
    per_bend = spec.total_bend_rad / spec.thick
    assert per_bend == pytest.approx(2 * math.pi / lat.LHC.thick)  # an arc of the ring: the LHC's bends
    assert min(counts.values()) >= 1 and spec.xyshifts % 2 == 0 and spec.srotations % 2 == 0
    # the offsets and parameter counts tile the buffer exactly
    sizes = [lat.param_count(int(k), built.params, int(o)) for k, o in zip(built.types, built.offsets)]
    assert np.array_equal(built.offsets[1:], np.cumsum(sizes)[:-1]) and sum(sizes) == built.params.size


def test_misalignments_and_tilts_are_undone_in_pairs(lhc):
    shifts = lhc.params[lhc.offsets[lhc.types == lat.XYSHIFT]].sum()
    assert abs(shifts) < 1e-15  # each shift's partner is its negative
    rot = lhc.offsets[lhc.types == lat.SROTATION]
    sines = lhc.params[rot + 1]
    assert abs(sines.sum()) < 1e-15 and np.all(lhc.params[rot] ** 2 + sines**2 == pytest.approx(1.0))


def test_lattice_is_deterministic_from_its_seed():
    a, b, c = (lat.generate_lattice(SMALL, seed=s) for s in (5, 5, 6))
    assert np.array_equal(a.types, b.types) and np.array_equal(a.offsets, b.offsets)
    assert np.array_equal(a.params, b.params)
    assert np.array_equal(a.types, c.types)  # the same machine ...
    assert not np.array_equal(a.params, c.params)  # ... with other field errors


def test_too_many_cells_for_the_counts_is_refused():
    with pytest.raises(ValueError, match="use fewer cells"):
        lat.generate_lattice(dataclasses.replace(SMALL, drifts=10))


# --- the maps, element by element --------------------------------------------------------------


def _one(element: lat.Element) -> lat.Lattice:
    return lat.pack([element], SMALL, seed=0)


def _particle(**coords: float) -> maps.Particles:
    p = maps.simpletrack_particles(1)
    for name, value in coords.items():
        p.coords[getattr(maps, name.upper())] = value
    return maps.Particles(maps._with_delta(p.coords, maps.Beam()), p.lost, p.turn)


def test_drift_map():
    out = maps.track_reference(_one(lat.drift(2.0)), _particle(px=1e-3, py=-2e-3), 1)
    x, px, y, py, zeta = out.coords[:5, 0]
    assert (x, y, px, py) == pytest.approx((2e-3, -4e-3, 1e-3, -2e-3), rel=1e-15)
    assert zeta == pytest.approx(2.0 * (1.0 - (1 + (1e-6 + 4e-6) / 2)), rel=1e-9)  # rvv = 1 on momentum
    assert out.turn[0] == 1 and out.lost[0] == 0


def test_drift_aperture_loses_the_particle_and_freezes_it():
    elements = [lat.drift(1.0), lat.xyshift(0.5, 0.0)]
    out = maps.track_reference(lat.pack(elements, SMALL, 0), _particle(x=0.95, px=0.1), 2)
    assert out.lost[0] == 1 and out.turn[0] == 0
    assert out.coords[maps.X, 0] == pytest.approx(1.05)  # after the drift; the shift did not apply


def test_quadrupole_kick():
    k1 = 0.02
    out = maps.track_reference(_one(lat.multipole([0.0, k1])), _particle(x=1e-3, y=2e-3), 1)
    assert out.coords[maps.PX, 0] == pytest.approx(-k1 * 1e-3, rel=1e-14)  # focusing in x ...
    assert out.coords[maps.PY, 0] == pytest.approx(k1 * 2e-3, rel=1e-14)  # ... defocusing in y


def test_higher_order_horner_matches_the_complex_field():
    kn = [0.0, 0.01, 0.3, -2.0, 40.0]
    ks = [0.0, 0.002, -0.1, 1.0, 5.0]
    x, y = 1.2e-3, -0.7e-3
    out = maps.track_reference(_one(lat.multipole(kn, ks)), _particle(x=x, y=y), 1)
    z = complex(x, y)
    field = sum((kn[n] + 1j * ks[n]) * z**n / math.factorial(n) for n in range(len(kn)))
    assert out.coords[maps.PX, 0] == pytest.approx(-field.real, rel=1e-13)
    assert out.coords[maps.PY, 0] == pytest.approx(field.imag, rel=1e-13)


def test_bend_keeps_the_reference_orbit_and_bends_the_rest():
    angle, length = 2 * math.pi / 2572, 11.0
    bend = lat.multipole([angle], length=length, hxl=angle)
    on_axis = maps.track_reference(_one(bend), _particle(), 1)
    assert np.all(on_axis.coords[:5, 0] == 0.0)
    off = maps.track_reference(_one(bend), _particle(x=1e-3, delta=1e-4), 1)
    assert off.coords[maps.PX, 0] == pytest.approx(angle * 1e-4 - angle**2 * 1e-3 / length, rel=1e-12)
    assert off.coords[maps.ZETA, 0] == pytest.approx(-angle * 1e-3, rel=1e-12)


def test_xyshift_and_srotation():
    out = maps.track_reference(_one(lat.xyshift(1e-4, -2e-4)), _particle(x=1e-3, y=1e-3), 1)
    assert out.coords[maps.X, 0] == pytest.approx(0.9e-3) and out.coords[maps.Y, 0] == pytest.approx(1.2e-3)
    a = 0.3
    out = maps.track_reference(_one(lat.srotation(a)), _particle(x=1e-3, px=1e-5), 1)
    c, s = math.cos(a), math.sin(a)
    assert out.coords[maps.X, 0] == pytest.approx(c * 1e-3) and out.coords[maps.Y, 0] == pytest.approx(-s * 1e-3)
    assert out.coords[maps.PX, 0] == pytest.approx(c * 1e-5) and out.coords[maps.PY, 0] == pytest.approx(-s * 1e-5)


def test_cavity_gives_the_energy_of_its_phase():
    beam = maps.Beam()
    volt, kfreq, lag = 2.0e6, 8.3999, math.pi
    on_crest_zeta = 0.05
    out = maps.track_reference(_one(lat.cavity(volt, kfreq, lag)), _particle(zeta=on_crest_zeta), 1)
    tau = on_crest_zeta / 1.0 / beam.beta0  # rvv = 1 on momentum
    d_e = volt * math.sin(lag - kfreq * tau)
    e1 = math.hypot(beam.p0c, beam.mass0) + d_e
    p1 = math.sqrt(e1 * e1 - beam.mass0**2)
    assert out.coords[maps.DELTA, 0] == pytest.approx(p1 / beam.p0c - 1.0, rel=1e-9, abs=1e-15)
    assert out.coords[maps.RPP, 0] == pytest.approx(beam.p0c / p1, rel=1e-12)
    assert out.coords[maps.RVV, 0] == pytest.approx((p1 / e1) / beam.beta0, rel=1e-12)
    at_zero = maps.track_reference(_one(lat.cavity(volt, kfreq, lag)), _particle(), 1)
    assert abs(at_zero.coords[maps.DELTA, 0]) < 1e-15  # sin(pi) = 0: no kick on the synchronous particle


# --- whole-lattice tracking and its checks -----------------------------------------------------


def test_torch_path_matches_the_numpy_reference(small):
    src = maps.random_particles(24, seed=4)
    want = maps.track_reference(small, src, 2)
    got = maps.track_reference(small, src.to_torch("cpu"), 2, xp=torch)
    assert isinstance(got.coords, torch.Tensor) and got.coords.dtype == torch.float64
    assert maps.compare(got, want, trk.TORCH_LIMIT, "torch vs NumPy") <= trk.TORCH_LIMIT
    assert np.all(want.lost == 0) and np.all(want.turn == 2)
    assert np.all(np.abs(want.coords[maps.X]) > 0)  # every particle moved away from where it started


def test_simpletrack_beam_survives_and_stays_small(small):
    out = maps.track_reference(small, maps.simpletrack_particles(32), 3)
    assert np.all(out.lost == 0) and np.all(out.turn == 3) and np.all(np.isfinite(out.coords))
    assert np.max(np.abs(out.coords[maps.X])) < 1e-2  # a stable lattice: betatron motion, not runaway


def _perturbed(lattice: lat.Lattice, kind: int, index: int, field: int, rel: float) -> lat.Lattice:
    """A copy of ``lattice`` with one parameter of its index-th element of ``kind`` off by ``rel``."""
    params = lattice.params.copy()
    off = int(lattice.offsets[np.flatnonzero(lattice.types == kind)[index]])
    params[off + field] *= 1.0 + rel
    return lat.Lattice(lattice.types, lattice.offsets, params, lattice.spec, lattice.seed)


@pytest.mark.parametrize("kind, field, rel", [
    (lat.DRIFT, 0, 1e-7),  # one drift 1e-7 (relative) too long
    (lat.MULTIPOLE, lat.MULTIPOLE_HEADER + 2, 1e-6),  # one quadrupole's kn1 off by 1e-6
], ids=["drift length", "quadrupole strength"])
def test_comparison_catches_a_slightly_wrong_map(small, kind, field, rel):
    src = maps.random_particles(16, seed=1)
    want = maps.track_reference(small, src, 1)
    offsets = small.offsets[small.types == kind]
    index = int(np.flatnonzero(small.params[offsets + field] > 1e-3)[0])  # a drift; a focusing quadrupole
    broken = _perturbed(small, kind, index, field, rel)
    got = maps.track_reference(broken, src.to_torch("cpu"), 1, xp=torch)
    with pytest.raises(WorkloadError, match="differs from the reference"):  # the GPU run's own limit catches it
        maps.compare(got, want, trk.REFERENCE_LIMIT, "broken map")


def test_comparison_catches_lost_flags_and_nan():
    want = maps.random_particles(4)
    lost = maps.Particles(want.coords.copy(), want.lost.copy(), want.turn.copy())
    lost.lost[2] = 1
    with pytest.raises(WorkloadError, match="lost flags"):
        maps.compare(lost, want, 1e-11, "lost")
    nan = maps.Particles(want.coords.copy(), want.lost, want.turn)
    nan.coords[maps.PY, 1] = float("nan")
    with pytest.raises(WorkloadError, match="coordinate 3"):
        maps.compare(nan, want, 1e-11, "nan")


# --- the workload --------------------------------------------------------------------------------


def test_tracking_metrics_on_cpu(cpu):
    metrics = trk.run_tracking(cpu, Timer("cpu"), quick=True)
    by_name = {m.name: m for m in metrics}
    assert len(by_name) == len(metrics)
    rate = by_name["particle_turns_per_s"]
    us = by_name["us_per_particle_turn"]
    assert rate.unit == "particle-turns/s" and rate.kind == "simulation" and rate.direction == "higher" and rate.compare
    assert us.unit == "us" and us.kind == "simulation" and us.direction == "lower" and us.compare
    assert rate.samples and all(s > 0 for s in rate.samples)
    assert us.value == pytest.approx(1e6 / rate.value, rel=1e-9)
    info = rate.info
    assert info["path"] == "torch-cpu" and info["turns"] == 1 and info["particles"] == by_name["particles"].value
    assert info["elements"] == lat.LHC.scaled(1 / 16).elements
    assert by_name["seconds_per_10_turns"].kind == "info" and not by_name["seconds_per_10_turns"].compare
    for m in metrics:
        m.to_dict()


def test_tracking_metric_arithmetic():
    lattice = lat.pack([lat.drift(1.0)], SMALL, 0)
    timing = Timing(samples=[2.0, 2.5, 3.0])
    by_name = {m.name: m for m in trk._metrics(timing, 5_000_000, 1, lattice, "triton")}
    assert by_name["particle_turns_per_s"].value == pytest.approx(5e6 / 2.5)
    assert by_name["us_per_particle_turn"].value == pytest.approx(2.5e6 / 5e6)
    assert by_name["us_per_particle_turn"].samples == pytest.approx([0.4, 0.5, 0.6])
    assert by_name["seconds_per_10_turns"].value == pytest.approx(25.0)  # CERN's table: 10 turns
    assert "clocks" not in by_name["particle_turns_per_s"].info  # none read


def test_tracking_rates_keep_the_clock_and_temperature_they_ran_at():
    lattice = lat.pack([lat.drift(1.0)], SMALL, 0)
    snaps = {"before": {"sm_clock_mhz": 1980, "temperature_c": 44},
             "after": {"sm_clock_mhz": 1830, "temperature_c": 61, "throttled": True, "throttle_reasons": ["sw_power_cap"]}}
    by_name = {m.name: m for m in trk._metrics(Timing(samples=[2.0], clocks=snaps), 5_000_000, 1, lattice, "triton")}
    for name in ("particle_turns_per_s", "us_per_particle_turn"):
        info = by_name[name].info
        assert info["clocks"]["after"]["temperature_c"] == 61 and info["throttled"] is True
        assert info["particles"] == 5_000_000
    assert "clocks" not in by_name["particles"].info  # the informational figures are not timings


def _copies(p: maps.Particles, n: int = 3) -> list[tuple[maps.Particles, maps.Particles]]:
    return [(p, maps.Particles(p.coords.clone(), p.lost.clone(), p.turn.clone())) for _ in range(n)]


def test_buffer_sets_tracked_to_different_results_fail_the_run():
    beam = maps.simpletrack_particles(40).to_torch("cpu")
    for field in ("coords", "lost", "turn"):
        beams = _copies(beam)
        getattr(beams[2][1], field)[..., 7] += 1  # one value of the third set
        with pytest.raises(WorkloadError, match="different results"):
            trk._verify_run(None, beams, 1, SMALL, 0, "cpu", True)
    beams = _copies(beam)
    beams[1][1].coords[0, 0] = -0.0  # equal as a number, not as the bits a deterministic kernel writes
    with pytest.raises(WorkloadError, match="different results"):
        trk._verify_run(None, beams, 1, SMALL, 0, "cpu", True)
    beams = _copies(beam)
    for _, d in beams:
        d.coords[0, 3] = float("nan")  # the same NaN in every set is named as what it is
    with pytest.raises(WorkloadError, match="non-finite"):
        trk._verify_run(None, beams, 1, SMALL, 0, "cpu", True)


class _GpuLike:
    """A Target the GPU path takes, on the CPU: one SM (16,384 particles), a given memory budget."""

    is_cpu, device, effective_sms = False, "cpu", 1

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def memory_budget(self) -> int:
        return self.budget


@pytest.mark.parametrize("quick", [False, True])
def test_the_gpu_path_times_every_buffer_set_that_fits_alike(monkeypatch, quick):
    used: list[int] = []
    monkeypatch.setattr(trk, "triton", object())
    monkeypatch.setattr(trk, "track_triton", lambda lat, src, dst, turns: used.append(id(src)))
    monkeypatch.setattr(trk, "_verify_run", lambda lat, beams, *a: used.append(len(beams)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    need = 16384 * trk.BYTES_PER_PARTICLE
    for budget, sets, repeats in ((100 * need, 2 if quick else 4, 2 if quick else 4), (3 * need, 2, 2 if quick else 4),
                                  (need * 5 // 4, 1, 2 if quick else 3)):
        used.clear()
        metrics = trk.run_tracking(_GpuLike(budget), Timer("cpu"), quick=quick)
        assert used[-1] == sets  # every set verified
        timed = used[-1 - repeats:-1]
        assert len(set(timed)) == sets and all(timed.count(i) == repeats // sets for i in set(timed))
        rate = next(m for m in metrics if m.name == "particle_turns_per_s")
        assert rate.info["placements"] == sets and len(rate.samples) == repeats
    with pytest.raises(DoesNotFit, match="16,384 particles need"):
        trk.run_tracking(_GpuLike(need), Timer("cpu"), quick=quick)


def test_tracking_records_how_many_placements_it_timed():
    lattice = lat.pack([lat.drift(1.0)], SMALL, 0)
    metrics = trk._metrics(Timing(samples=[2.0] * 4), 5_000_000, 1, lattice, "triton", placements=4)
    assert {m.name: m.info["placements"] for m in metrics}["particle_turns_per_s"] == 4
    assert trk.PLACEMENTS == 4


def test_cern_sizes_are_gpu_cases(cpu):
    assert trk.CERN_SIZES == (5_000_000, 10_000_000, 15_000_000)
    with pytest.raises(DoesNotFit, match="GPU case"):
        trk.run_tracking(cpu, Timer("cpu"), particles=trk.CERN_SIZES[0])


def test_fitted_particles_fill_the_sms():
    h200 = Target(kind="full", profile="full", chosen_by="test", gpu_name="NVIDIA H200", sms=132,
                  memory_bytes=140 * GIB)
    one_g = Target(kind="mig", profile="1g.18gb", chosen_by="test", gpu_name="NVIDIA H200", sms=16,
                   memory_bytes=16 * GIB)
    assert trk.fitted_particles(h200) == 132 * trk.fitted_particles(one_g) // 16
    assert trk.fitted_particles(one_g) * trk.BYTES_PER_PARTICLE < one_g.memory_budget() / 10


def test_a_cern_size_that_does_not_fit_is_skipped():
    small_slice = Target(kind="mig", profile="1g.5gb", chosen_by="test", gpu_name="NVIDIA A100-SXM4-40GB", sms=14,
                         memory_bytes=GIB)
    with pytest.raises(DoesNotFit, match=r"15,000,000 particles need ~2\.2 GB|triton is not installed"):
        trk.run_tracking(small_slice, Timer("cpu"), particles=15_000_000)


# --- the Triton kernel, under the interpreter ----------------------------------------------------


@needs_triton
def test_tracking_triton_kernel_under_the_interpreter():
    code = textwrap.dedent(
        """
        import numpy as np
        from pytest_mig.workloads import WorkloadError, lattice as lat, tracking as trk
        lattice = lat.generate_lattice(lat.LHC.scaled(1 / 200), seed=3)
        kinds = sorted(set(int(k) for k in lattice.types))
        src = trk.random_particles(11, seed=3)  # fewer than the block: the mask is exercised
        src.lost[5] = 1  # a particle lost before the run stays where it is
        want = trk.track_reference(lattice, src, 2)
        dev = trk.DeviceLattice.of(lattice, trk.Beam(), "cpu")
        got = trk.empty_like(src.to_torch("cpu"))
        trk.track_triton(dev, src.to_torch("cpu"), got, 2, block=16)
        err = trk.compare(got, want, trk.TORCH_LIMIT, "Triton (interpreted) vs NumPy")
        frozen = bool(np.array_equal(got.numpy().coords[:, 5], src.coords[:, 5]))
        broken = trk.DeviceLattice.of(lattice, trk.Beam(p0c=7.0001e12), "cpu")  # a wrong beam constant
        trk.track_triton(broken, src.to_torch("cpu"), got, 1, block=16)
        try:
            trk.compare(got, trk.track_reference(lattice, src, 1), trk.REFERENCE_LIMIT, "broken")
            caught = False
        except WorkloadError:
            caught = True
        print(len(kinds), err, frozen, caught)
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds, err, frozen, caught = proc.stdout.split()
    assert int(kinds) == 5  # every element type went through the kernel
    assert float(err) <= trk.TORCH_LIMIT  # the interpreter runs NumPy: no FMA contraction
    assert frozen == "True" and caught == "True"
