"""The Lennard-Jones MD workload and the GROMACS wrapper on the CPU: physics, checks, sizing, parsing.

Nothing here measures speed.  The integrator is checked by breaking it (force sign, a missing half
kick, a stale neighbour list) and asserting that the run's own checks catch each break; the
neighbour lists against all pairs; the forces against float64 all pairs.  GROMACS is exercised
through its input files and its log parser; mdrun itself runs only where a gmx binary is present.
"""

from __future__ import annotations

import math
import os
import shutil

import pytest
import torch

from pytest_mig.measure import PowerTrace, Timing
from pytest_mig.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError, md

GIB = 2**30


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny arrays: one thread beats a team


def _gpu(memory_gib: float, sms: int, kind: str = "mig") -> Target:
    return Target(kind=kind, profile="1g.10gb" if kind == "mig" else "full", chosen_by="test", gpu_name="NVIDIA H200",
                  sms=sms, memory_bytes=int(memory_gib * GIB), compute_capability=(9, 0))


def _melted(cells: int = 4, steps: int = 150, dtype: torch.dtype = torch.float64) -> md.LJSystem:
    system = md.LJSystem.fcc(cells, dtype=dtype)
    system.run(steps)
    return system


# --- set-up and units --------------------------------------------------------------------------


def test_fcc_lattice_density_spacing_and_box():
    pos, box = md.fcc_lattice(3)
    assert pos.shape == (108, 3)
    assert 108 / box**3 == pytest.approx(md.LJ.density, rel=1e-6)
    assert float(torch.tensor(box, dtype=torch.float32)) == box  # exact in float32
    assert bool((pos >= 0).all() and (pos < box).all())
    d = pos.unsqueeze(0) - pos.unsqueeze(1)
    md.minimum_image_(d, box)
    r = (d * d).sum(-1).sqrt() + torch.eye(108, dtype=torch.float64) * 1e9
    nearest = r.min(dim=1).values
    assert torch.allclose(nearest, torch.full_like(nearest, box / 3 / math.sqrt(2)))  # a / sqrt(2)
    assert int((r < box / 3 / math.sqrt(2) * 1.01).sum(dim=1).min()) == 12  # FCC: 12 nearest neighbours


def test_initial_velocities_zero_momentum_exact_temperature_and_seeded():
    v = md.initial_velocities(500, 1.44, seed=3)
    assert torch.allclose(v.sum(dim=0), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    assert float((v * v).sum()) / (3 * 500 - 3) == pytest.approx(1.44, rel=1e-12)
    assert torch.equal(v, md.initial_velocities(500, 1.44, seed=3))
    assert not torch.equal(v, md.initial_velocities(500, 1.44, seed=4))


def test_argon_units_and_ns_per_day():
    assert md.ARGON.tau_ps == pytest.approx(2.156, abs=5e-4)
    # 1 step/s at dt* = 0.005 is 10.78 fs/s: 0.9315 ns/day.
    assert md.ns_per_day(1.0) == pytest.approx(0.005 * md.ARGON.tau_ps * 86400 / 1000)
    assert md.ns_per_day(2.0) == pytest.approx(2 * md.ns_per_day(1.0))


def test_cells_for_atoms():
    assert md.cells_for_atoms(500) == 5
    assert md.cells_for_atoms(499) == 4
    assert md.cells_for_atoms(10) == 4  # never below 4 a side: a box of twice the list radius
    assert 4 * md.cells_for_atoms(132 * md.ATOMS_PER_SM) ** 3 <= 132 * md.ATOMS_PER_SM


# --- forces and neighbour lists ----------------------------------------------------------------


def test_pair_force_is_minus_the_energy_gradient():
    r = torch.linspace(0.95, 2.45, 31, dtype=torch.float64)
    inside, f_over_r = md.pair_terms(r * r, md.LJ.cutoff**2)
    assert bool(inside.all())
    u = lambda x: 4 * (x**-12 - x**-6)
    h = 1e-6
    numeric = -(u(r + h) - u(r - h)) / (2 * h)
    assert torch.allclose(f_over_r * r, numeric, rtol=1e-7)
    e = md.pair_energy(torch.tensor([md.LJ.cutoff**2 * (1 - 1e-12)], dtype=torch.float64),
                       torch.tensor([True]), md.LJ.energy_shift())
    assert abs(float(e)) < 1e-10  # shifted to zero at the cutoff
    padded, zero = md.pair_terms(torch.zeros(2, dtype=torch.float64), md.LJ.cutoff**2)
    assert not bool(padded.any()) and bool((zero == 0).all())  # r^2 = 0 is padding, not a pair


@pytest.mark.parametrize("dtype, precision", [(torch.float32, "fp32"), (torch.float64, "fp64")])
def test_forces_match_float64_all_pairs(dtype, precision):
    system = _melted(cells=4, steps=100)
    limit = md.force_limit(precision, system.box)
    assert limit < 2 * md.FORCE_LIMIT[precision]  # a small box: little boundary allowance
    pos = system.pos.to(dtype)
    nl = md.build_neighbours(pos, system.box)
    forces, pe = md.lj_forces(pos, nl.nbr, system.box, energy=True)
    ref, pe_ref, edge = md.reference_forces(pos, system.box)
    assert int(edge.sum()) == 0
    err = float(torch.linalg.vector_norm(forces.double() - ref) / torch.linalg.vector_norm(ref))
    assert err <= limit
    assert abs(float(pe) - float(pe_ref)) / abs(float(pe_ref)) <= limit
    assert torch.allclose(ref.sum(dim=0), torch.zeros(3, dtype=torch.float64), atol=1e-9)  # Newton's third law


def _rows(nl: md.NeighbourList) -> list[set[int]]:
    """Each atom's neighbours as a set of atom indices."""
    atoms = nl.atoms()
    return [set(atoms[i, : int(nl.counts[i])].tolist()) for i in range(atoms.shape[0])]


def test_cell_list_equals_all_pairs_and_is_symmetric():
    _, box = md.fcc_lattice(6)  # 864 atoms: 3 cells a side
    gen = torch.Generator().manual_seed(1)
    pos = torch.rand(864, 3, generator=gen, dtype=torch.float64) * box  # a fluid's disorder, without the MD
    system = type("S", (), {"pos": pos, "box": box, "n": 864})
    cells = md.build_neighbours(system.pos, system.box, chunk=200)  # several chunks
    brute = md.build_neighbours(system.pos, system.box, force_all_pairs=True)
    assert cells.method == "cells" and cells.cells_per_side == 3 and brute.method == "all-pairs"
    a, b = _rows(cells), _rows(brute)
    assert a == b
    assert torch.equal(cells.counts, brute.counts)
    for i in (0, 431, 863):  # the same images too
        assert set(cells.nbr[i, : int(cells.counts[i])].tolist()) == set(brute.nbr[i, : int(brute.counts[i])].tolist())
    assert all(i not in s for i, s in enumerate(a))
    assert all(i in a[j] for i, s in enumerate(a) for j in s)  # a full list: j in i's row iff i in j's
    # the padding is the atom's own far image, sqrt(3) boxes away: outside every cutoff
    i = int(torch.argmin(cells.counts))
    assert set(cells.nbr[i, int(cells.counts[i]):].tolist()) == {i + md.IMAGE_FAR * 865}
    assert md.IMAGES[md.IMAGE_FAR] == (1, 1, 1) and md.IMAGES[md.IMAGE_ZERO] == (0, 0, 0)
    # every listed entry's image places j within the list radius of i
    img = md.images(pos, box)
    d = img[cells.nbr[i, : int(cells.counts[i])]] - pos[i]
    assert bool(((d * d).sum(-1) < md.LJ.list_radius**2).all())
    # every pair within cutoff + skin is listed, none beyond
    d = system.pos.unsqueeze(0) - system.pos.unsqueeze(1)
    md.minimum_image_(d, system.box)
    r2 = (d * d).sum(-1)
    within = (r2 < md.LJ.list_radius**2) & ~torch.eye(system.n, dtype=torch.bool)
    assert torch.equal(within.sum(dim=1), cells.counts)


def test_neighbour_list_grows_its_width():
    system = md.LJSystem.fcc(4)
    nl = md.build_neighbours(system.pos, system.box, width=8)
    assert nl.max_neighbours >= int(nl.counts.max()) > 8
    assert _rows(nl) == _rows(md.build_neighbours(system.pos, system.box))


def test_rebuild_only_after_half_the_skin():
    system = md.LJSystem.fcc(4)
    built = system.nlist
    system.pos[0, 0] += 0.99 * md.LJ.skin / 2
    system.maybe_rebuild()
    assert system.nlist is built and system.rebuilds == 1
    system.pos[0, 0] += 0.02 * md.LJ.skin / 2
    system.maybe_rebuild()
    assert system.nlist is not built and system.rebuilds == 2
    assert torch.equal(system.nlist.built_at, system.pos)


# --- the integrator and the run's checks -------------------------------------------------------


def _energies_every(system: md.LJSystem, calls: int, steps: int) -> list[float]:
    out = []
    for k in range(calls + 1):
        if k:
            system.run(steps)
        ke, pe = system.energies()
        out.append(float(ke + pe))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_correct_integrator_conserves_energy_and_momentum(dtype):
    system = md.LJSystem.fcc(4, dtype=dtype)
    check = md.energy_drift(_energies_every(system, 4, 50), 50)
    md.check_energy(check, "test")
    assert check.drift_per_1000 * check.steps / 1000 < md.DRIFT_LIMIT / 10  # a wide margin, not a near miss
    assert check.deviation < md.DEVIATION_LIMIT / 10
    precision = "fp32" if dtype == torch.float32 else "fp64"
    md.check_momentum(system, precision)
    assert system.rebuilds > 5  # the fluid moves: lists are rebuilt


def _no_second_half_kick(system: md.LJSystem) -> None:
    md.half_kick(system)
    system.pos.add_(system.vel, alpha=system.setup.dt)
    system.maybe_rebuild()
    system.forces, _ = md.lj_forces(system.pos, system.nlist.nbr, system.box, system.setup)
    system.steps += 1


def _flipped(real):
    def forces(*args, **kwargs):
        f, pe = real(*args, **kwargs)
        return -f, pe

    return forces


@pytest.mark.parametrize("broken", ["force sign", "missing half kick"])
def test_broken_integrator_fails_the_energy_check(monkeypatch, broken):
    system = md.LJSystem.fcc(4)  # built (first forces) before the break
    if broken == "force sign":
        monkeypatch.setattr(md, "lj_forces", _flipped(md.lj_forces))
    else:
        monkeypatch.setattr(md, "verlet_step", _no_second_half_kick)
    with pytest.raises(WorkloadError, match="total energy|positions became NaN"):  # whichever notices first
        md.check_energy(md.energy_drift(_energies_every(system, 4, 25), 25), "test")


def test_stale_neighbour_list_fails_the_force_check(monkeypatch):
    system = md.LJSystem.fcc(6)  # a cell list over 864 atoms
    monkeypatch.setattr(md.LJSystem, "maybe_rebuild", lambda self: None)
    system.run(120)
    with pytest.raises(WorkloadError, match="forces .* vs float64 all pairs"):
        md.check_forces(system, "fp64")


def test_energy_drift_fit_and_limits():
    flat = md.energy_drift([-100.0, -100.001, -99.999, -100.0], 100)
    assert flat.drift_per_1000 < 1e-4 and flat.deviation == pytest.approx(1e-5)
    md.check_energy(flat, "flat")
    ramp = md.energy_drift([-100.0 + 0.05 * k for k in range(6)], 200)  # +0.05 per 200 steps
    assert ramp.drift_per_1000 == pytest.approx(0.25 / 100)
    with pytest.raises(WorkloadError, match="drifted"):
        md.check_energy(ramp, "ramp")
    # a short run is judged on its own length: 100 steps may change by 1e-3 in all
    short = md.energy_drift([-100.0, -100.0 + 0.05], 100)
    md.check_energy(short, "short")
    assert math.isnan(md.energy_drift([-1.0, float("nan")], 10).drift_per_1000)
    with pytest.raises(WorkloadError):
        md.check_energy(md.energy_drift([-1.0, float("nan")], 10), "nan")


def test_momentum_check_catches_a_kick():
    system = md.LJSystem.fcc(4)
    md.check_momentum(system, "fp32")
    system.vel[0] += 0.1
    with pytest.raises(WorkloadError, match="momentum"):
        md.check_momentum(system, "fp32")


# --- the workload --------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", md.PRECISION_NAMES)
def test_md_metrics_on_cpu(cpu, timer, precision):
    metrics = md.run_md(cpu, timer, precision=precision, quick=True)
    by_name = {m.name: m for m in metrics}
    assert len(by_name) == len(metrics)
    tag = f"lj_{precision}"
    head = by_name[f"{tag}_atom_steps_per_s"]
    assert head.kind == "simulation" and head.unit == "atom-steps/s" and head.direction == "higher" and head.compare
    effort = md.MD_EFFORT[("cpu", True)]
    assert len(head.samples) == effort.repeats and all(s > 0 for s in head.samples)
    ns = by_name[f"{tag}_ns_per_day"]
    assert ns.kind == "simulation" and ns.unit == "ns/day" and ns.compare
    assert ns.value == pytest.approx(md.ns_per_day(head.value / 256), rel=1e-9)
    assert "tau 2.156 ps" in ns.info["units"]
    step = by_name[f"{tag}_ms_per_step"]
    assert step.direction == "lower" and len(step.samples) == effort.repeats and not step.compare
    assert by_name[f"{tag}_atoms"].value == 4 * md.CPU_CELLS**3
    info = head.info
    assert info["steps_per_call"] == effort.steps and info["calls"] == effort.warmup + effort.repeats
    assert info["force_rel_error"] <= info["force_limit"] == md.force_limit(precision, info["box_sigma"])
    assert info["force_rows"] == md.FORCE_CHECK_ATOMS
    assert info["energy_drift_per_1000_steps"] * min(1.0, effort.steps * info["calls"] / 1000) <= md.DRIFT_LIMIT
    for m in metrics:
        m.to_dict()
        if m.kind == "info":
            assert not m.compare


def test_md_unknown_precision(cpu, timer):
    with pytest.raises(ValueError, match="unknown MD precision 'fp16'"):
        md.run_md(cpu, timer, precision="fp16")


def test_md_broken_forces_fail_the_run(cpu, timer, monkeypatch):
    monkeypatch.setattr(md, "lj_forces", _flipped(md.lj_forces))
    with pytest.raises(WorkloadError):
        md.run_md(cpu, timer, quick=True)


def test_md_energy_metrics_when_power_was_read():
    timing = Timing(samples=[0.5, 0.5, 0.5], power=PowerTrace([600.0, 600.0], 2.0, None, "power-samples"))
    info = {"energy_drift_per_1000_steps": 1e-6, "energy_deviation": 1e-6, "fcc_cells": 64}
    metrics = {m.name: m for m in md._metrics(timing, 1_048_576, 100, "fp32", info)}
    e = metrics["lj_fp32_energy_j_per_atom-step"]
    assert e.unit == "J/atom-step" and e.value == pytest.approx(600.0 * 0.5 / (1_048_576 * 100))
    assert metrics["lj_fp32_atom_steps_per_s"].value == pytest.approx(1_048_576 * 100 / 0.5)
    assert metrics["lj_fp32_ms_per_step"].value == pytest.approx(5.0)


@pytest.mark.parametrize("memory_gib, sms", [(9.75, 16), (16.5, 16), (140.0, 132)])
@pytest.mark.parametrize("precision", md.PRECISION_NAMES)
@pytest.mark.parametrize("quick", [False, True])
def test_md_sizes_fit_the_budget_and_scale_with_sms(memory_gib, sms, precision, quick):
    budget = int(memory_gib * GIB)
    cells = md.md_cells(budget, sms, precision, quick=quick)
    atoms = 4 * cells**3
    assert atoms * md.BYTES_PER_ATOM[precision] <= md.MEMORY_SHARE * budget
    assert atoms <= sms * md.ATOMS_PER_SM
    assert atoms >= 0.5 * sms * md.ATOMS_PER_SM / (2 if quick else 1)  # each SM has work
    chunk = md.build_chunk(budget)
    assert 1024 <= chunk <= 65536 and chunk & (chunk - 1) == 0


def test_md_sizes_grow_with_the_slice():
    small = md.md_cells(int(9.75 * GIB), 16, "fp32")
    large = md.md_cells(140 * GIB, 132, "fp32")
    assert 4 * large**3 > 7 * 4 * small**3  # ~8x the SMs, ~8x the atoms
    assert 4 * large**3 >= 1_000_000  # about a million atoms on a whole H200


def test_md_does_not_fit_a_tiny_budget():
    with pytest.raises(DoesNotFit, match="256 atoms"):
        md.md_cells(2**20, 16, "fp64")


def test_steps_per_call_calibration():
    effort = md.MD_EFFORT[("gpu", False)]
    assert md.steps_per_call(0.001, effort) == round(effort.call_s / 0.001)
    assert md.steps_per_call(10.0, effort) == effort.steps
    assert md.steps_per_call(1e-7, effort) == effort.max_steps
    assert md.steps_per_call(0.001, md.MD_EFFORT[("cpu", True)]) == md.MD_EFFORT[("cpu", True)].steps


# --- GROMACS -------------------------------------------------------------------------------------

LOG_2023 = """\
        M E G A - F L O P S   A C C O U N T I N G
 ...
               Core t (s)   Wall t (s)        (%)
       Time:      246.812       30.852      800.0
                 (ns/day)    (hour/ns)
Performance:      139.977        0.171
Finished mdrun on rank 0 Tue Mar  5 10:11:12 2024
"""

LOG_OLD_COLUMNS = """\
               NODE (s)   Real (s)      (%)
       Time:     12.000     12.500     96.0
               (Mnbf/s)   (GFlops)   (ns/day)  (hour/ns)
Performance:    512.345     40.123     14.400      1.667
"""


def test_parse_gromacs_performance():
    perf = md.parse_gromacs_performance(LOG_2023)
    assert perf.ns_per_day == pytest.approx(139.977) and perf.hours_per_ns == pytest.approx(0.171)
    assert perf.wall_s == pytest.approx(30.852) and perf.core_s == pytest.approx(246.812)
    old = md.parse_gromacs_performance(LOG_OLD_COLUMNS)
    assert old.ns_per_day == pytest.approx(14.4) and old.hours_per_ns == pytest.approx(1.667)
    # the last Performance line counts (a log appended to by a restart)
    twice = LOG_OLD_COLUMNS + LOG_2023.replace("139.977", "141.500")
    assert md.parse_gromacs_performance(twice).ns_per_day == pytest.approx(141.5)


@pytest.mark.parametrize("text, match", [
    ("Started mdrun\nStep 100\n", "did not finish"),
    ("                 (hour/ns)\nPerformance:        0.171\n", "no \\(ns/day\\) column"),
    ("                 (ns/day)    (hour/ns)\nPerformance:      139.977\n", "does not match"),
])
def test_parse_gromacs_performance_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        md.parse_gromacs_performance(text)


def test_gromacs_inputs_describe_the_torch_system():
    files = md.gromacs_inputs(3, steps=1234, seed=5)
    gro = files["conf.gro"].splitlines()
    assert int(gro[1]) == 108 and len(gro) == 108 + 3
    box = [float(v) for v in gro[-1].split()]
    _, box_sigma = md.fcc_lattice(3)
    assert box == pytest.approx([box_sigma * md.ARGON.sigma_nm] * 3, abs=1e-5)
    first = gro[2]
    assert first[5:10].strip() == "AR" and len(first) == 44  # fixed .gro columns: 20 + 3 x 8
    assert all(0 <= float(first[20 + 8 * k:28 + 8 * k]) < box[k] for k in range(3))
    top = files["topol.top"]
    assert "AR  108" in top and f"{md.ARGON.sigma_nm:.5f}" in top and f"{md.ARGON.epsilon_kj_mol:.6f}" in top
    mdp = dict(line.split("=", 1) for line in files["md.mdp"].splitlines())
    mdp = {k.strip(): v.strip() for k, v in mdp.items()}
    assert mdp["nsteps"] == "1234" and mdp["cutoff-scheme"] == "Verlet"
    assert float(mdp["rvdw"]) == pytest.approx(md.LJ.cutoff * md.ARGON.sigma_nm, abs=1e-4)
    assert float(mdp["gen-temp"]) == pytest.approx(md.LJ.initial_temperature * md.ARGON.epsilon_over_kb_k, abs=0.01)
    assert mdp["vdw-modifier"] == "Potential-shift" and mdp["tcoupl"] == "no"


def test_gromacs_command_is_an_argument_list():
    cmd = md.gromacs_command("/opt/gmx", nb="gpu", threads=4, steps=2000, maxh=0.01)
    assert cmd[:3] == ["/opt/gmx", "-quiet", "mdrun"]
    assert cmd[cmd.index("-nb") + 1] == "gpu" and cmd[cmd.index("-ntmpi") + 1] == "1"
    assert cmd[cmd.index("-ntomp") + 1] == "4" and cmd[cmd.index("-nsteps") + 1] == "2000"
    assert "-resethway" in cmd and cmd[cmd.index("-g") + 1] == "md.log"


def test_gromacs_skips_without_gmx(cpu, monkeypatch):
    monkeypatch.delenv(md.GMX_ENV, raising=False)
    monkeypatch.setenv("PATH", "")
    assert md.gmx_binary() is None
    with pytest.raises(DoesNotFit, match="gmx not on PATH"):
        md.run_gromacs(cpu)


def test_gromacs_binary_from_the_environment(tmp_path, monkeypatch):
    fake = tmp_path / "gmx_mpi"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv(md.GMX_ENV, str(fake))
    assert md.gmx_binary() == str(fake)
    monkeypatch.setenv(md.GMX_ENV, str(tmp_path / "missing"))
    assert md.gmx_binary() is None


def test_gromacs_refuses_emulation():
    emulated = Target(kind="emulated", profile="1g.18gb", chosen_by="test", gpu_name="NVIDIA H200", sms=16,
                      memory_bytes=18 * GIB)
    with pytest.raises(DoesNotFit, match="green context"):
        md.run_gromacs(emulated, gmx="/bin/true")


def _fake_gmx(tmp_path, body: str) -> str:
    """A shell script standing in for gmx: ``--version`` answers like a CPU-only build; ``body`` runs otherwise."""
    fake = tmp_path / "gmx"
    fake.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then\n  echo "GROMACS version:    2024.1"\n'
                    '  echo "GPU support:        disabled"\n  exit 0\nfi\n' + body)
    fake.chmod(0o755)
    return str(fake)


def test_gromacs_failure_is_a_workload_error(cpu, tmp_path):
    fake = _fake_gmx(tmp_path, "echo 'Fatal error: something the user must read' >&2\nexit 1\n")
    with pytest.raises(WorkloadError, match="(?s)gmx grompp failed .*something the user must read"):
        md.run_gromacs(cpu, gmx=fake)


def test_gromacs_without_gpu_support_skips_on_a_gpu(tmp_path):
    fake = _fake_gmx(tmp_path, "exit 1\n")
    with pytest.raises(DoesNotFit, match="built without GPU support .*GPU support: disabled"):
        md.run_gromacs(_gpu(9.75, 16), gmx=fake)
    assert md.gmx_gpu_support("GPU support:        CUDA\nSIMD instructions: AVX2") == "CUDA"
    assert md.gmx_gpu_support("no such line") is None


@pytest.mark.skipif(shutil.which("gmx") is None, reason="gmx not on PATH")
def test_gromacs_runs_on_the_cpu(cpu, tmp_path):
    metrics = {m.name: m for m in md.run_gromacs(cpu, quick=True, workdir=tmp_path)}
    ns = metrics["gmx_ns_per_day"]
    assert ns.value > 0 and ns.unit == "ns/day" and ns.kind == "simulation"
    assert metrics["gmx_atoms"].value == 4 * md.GMX_CPU_CELLS**3
    assert ns.info["nb"] == "cpu" and not os.listdir(tmp_path)  # the work folder is cleaned up


def test_force_limit_allows_boundary_rounding_in_big_float32_boxes():
    _, big = md.fcc_lattice(64)  # ~1M atoms
    assert big == pytest.approx(107.5, abs=0.1)
    assert md.force_limit("fp32", big) == pytest.approx(1e-5 + 10 * 2.0**-23 * big)
    f_rc = 24 * (2 * 2.5**-13 - 2.5**-7)  # the force one pair at the cutoff contributes
    typical = math.sqrt(md.FORCE_CHECK_ATOMS) * 20.0  # norm of 64 forces of ~20 epsilon/sigma
    assert md.force_limit("fp32", big) < abs(f_rc) / typical  # one missing pair still fails the check
    assert md.force_limit("fp64", big) < 1e-11
