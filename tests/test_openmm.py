"""OpenMM on the CPU platform: the systems it builds from its own files, the checks every run makes
(forces against the Reference platform, NVE energy conservation), the worker protocol, the skips
(no OpenMM, no CUDA plugin, precision variants on the CPU) and the emulation's confinement rule.
Nothing here measures speed."""

from __future__ import annotations

import math

import pytest

from pytest_mig.device import mps
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError
from pytest_mig.workloads import openmm_md as om

openmm = pytest.importorskip("openmm", reason="OpenMM is not installed (pip install openmm)")

GIB = 2**30
EMULATED = Target(kind="emulated", profile="1g.10gb", chosen_by="test", gpu_name="NVIDIA H100 80GB HBM3", sms=16,
                  memory_bytes=int(9.75 * GIB), compute_capability=(9, 0))


def test_openmm_on_the_cpu_platform(cpu):
    metrics = {m.name: m for m in om.run_openmm(cpu, quick=True)}
    rate = metrics["ns_per_day"]
    assert (rate.unit, rate.direction, rate.kind, rate.compare) == ("ns/day", "higher", "simulation", True)
    effort = om.MD_EFFORT[("cpu", True)]
    assert len(rate.samples) == effort.repeats and rate.value > 0
    steps = rate.info["steps_per_sample"]
    assert metrics["ms_per_step"].value == pytest.approx(86400.0 * om.TIMESTEP_FS * 1e-3 / rate.value, rel=0.2)
    assert rate.info["platform"] == "CPU" and rate.info["system"] == "water-cpu" and steps >= 10
    assert 1200 < metrics["atoms"].value < 1800 and metrics["atoms"].value % 3 == 0  # a 2.5 nm water cube
    checks = rate.info["checks"]
    assert 0 < checks["force_rel_rms"] <= om.FORCE_LIMIT["mixed"] and checks["energy_rel"] <= om.CPU_ENERGY_LIMIT
    assert 0 <= checks["nve_deviation"] <= om.NVE_LIMIT["mixed"] and checks["nve_steps"] == effort.nve_steps
    assert metrics["force_rel_rms"].value == checks["force_rel_rms"] and not metrics["force_rel_rms"].compare
    assert rate.info["engine"] == f"OpenMM {openmm.__version__}" and not rate.info["scaling"]  # the CPU box
    assert min(rate.samples) <= rate.info["ns_per_day_overall"] <= max(rate.samples)
    assert [s.name for s in om.SYSTEMS.values() if s.scales] == ["water-92k"]  # the others cannot fill a GPU
    for m in metrics.values():
        m.to_dict()
    assert "energy_j_per_ns" not in metrics  # no board to read on the CPU


@pytest.mark.parametrize(("limit_w", "compared"), [(700.0, True), (200.0, False)])
def test_board_energy_is_read_over_the_workers_timed_chunks(cpu, limit_w, compared):
    """A stand-in board at a steady 250 W: the parent polls its energy counter while the worker runs,
    on the same monotonic clock as the worker's timed window."""
    import time

    from pytest_mig.measure import Telemetry

    board = Telemetry(read_energy_mj=lambda: time.perf_counter() * 250_000.0, power_limit_w=limit_w)
    metrics = {m.name: m for m in om.run_openmm(cpu, quick=True, telemetry=board)}
    assert metrics["power_w"].value == pytest.approx(250.0, rel=0.02)
    rate = metrics["ns_per_day"]
    ns = len(rate.samples) * rate.info["steps_per_sample"] * om.TIMESTEP_FS * 1e-6
    seconds = sum(86400.0 * rate.info["steps_per_sample"] * om.TIMESTEP_FS * 1e-6 / r for r in rate.samples)
    energy = metrics["energy_j_per_ns"]
    assert (energy.unit, energy.direction, energy.kind) == ("J/ns", "lower", "energy")
    assert energy.value == pytest.approx(250.0 * seconds / ns, rel=0.05)
    assert energy.compare is compared  # 250 W above a 200 W limit cannot be real: shown, not compared
    if not compared:
        assert "above the enforced 200 W limit" in energy.info["error"]


def test_the_shipped_systems_build(monkeypatch):
    topology, _, system = om.build(om.SYSTEMS["popc-membrane"])
    assert topology.getNumAtoms() == system.getNumParticles() == 32512
    assert {r.name for r in topology.residues()} == {"POP", "HOH"}
    forces = {type(f).__name__ for f in system.getForces()}
    nb = next(f for f in system.getForces() if type(f).__name__ == "NonbondedForce")
    assert "NonbondedForce" in forces and nb.getNonbondedMethod() == openmm.NonbondedForce.PME
    assert nb.getCutoffDistance().value_in_unit(openmm.unit.nanometer) == pytest.approx(om.CUTOFF_NM)
    assert system.getNumConstraints() > 0  # rigid water, bonds to hydrogen


def test_ns_per_day_arithmetic():
    assert om.ns_per_day(1000, 1.0, 4.0) == pytest.approx(4e-3 * 86400)  # 4 ps per second
    assert om.nve_deviation([100.0, 101.0, 99.5], 50.0) == pytest.approx(0.02)
    assert math.isnan(om.nve_deviation([100.0, float("nan")], 50.0))
    assert math.isnan(om.nve_deviation([], 50.0))


def _simulate_small(monkeypatch):
    monkeypatch.setitem(om.MD_EFFORT, ("cpu", True), om.MdEffort(minimize_iterations=20, warmup_s=0.05, chunk_s=0.05,
                                                                repeats=3, nve_steps=40, nve_every=20))
    return om.simulate({"device": "cpu", "system": "water-23k", "precision": "mixed", "quick": True})


def test_wrong_forces_fail_the_run(monkeypatch):
    real = om.compare_to_reference
    monkeypatch.setattr(om, "compare_to_reference", lambda *a: {**real(*a), "force_rel_rms": 0.3})
    with pytest.raises(WorkloadError, match="OpenMM forces: relative RMS force error against the Reference platform 0.3 exceeds"):
        _simulate_small(monkeypatch)


def test_a_wrong_energy_fails_the_run_on_the_cpu_platform_too(monkeypatch):
    """The CPU platform's own limit (its PME sits ~1e-6 from the Reference's) still fails an energy
    off by what a dropped term or neighbour gives."""
    real = om.compare_to_reference
    monkeypatch.setattr(om, "compare_to_reference", lambda *a: {**real(*a), "energy_rel": 3e-5})
    with pytest.raises(WorkloadError, match="OpenMM energy: relative potential-energy error against the Reference "
                                            "platform 3e-05 exceeds 1e-05"):
        _simulate_small(monkeypatch)


def test_energy_that_is_not_conserved_fails_the_run(monkeypatch):
    monkeypatch.setitem(om.NVE_LIMIT, "mixed", 0.0)
    with pytest.raises(WorkloadError, match="OpenMM energy conservation: NVE total-energy deviation over 40 steps"):
        _simulate_small(monkeypatch)


def test_nan_energy_fails_the_run(monkeypatch):
    monkeypatch.setattr(om, "nve_deviation", lambda energies, kinetic: float("nan"))
    with pytest.raises(WorkloadError, match="nan exceeds"):
        _simulate_small(monkeypatch)


def test_worker_reports_what_went_wrong(cpu, monkeypatch):
    with pytest.raises(WorkloadError, match="the OpenMM worker failed: KeyError: 'no-such-box'"):
        om._run_worker({"device": "cuda", "system": "no-such-box", "precision": "mixed", "quick": True}, {})
    monkeypatch.setattr(om.sys, "executable", "/bin/false")  # a worker that dies without a word
    with pytest.raises(WorkloadError, match=r"the OpenMM worker died \(exit 1\) before reporting"):
        om._run_worker({"device": "cpu"}, {})


def test_names_and_skips(cpu, monkeypatch):
    with pytest.raises(ValueError, match="unknown MD system 'lysozyme'"):
        om.run_openmm(cpu, system="lysozyme")
    with pytest.raises(ValueError, match="unknown OpenMM precision 'half'"):
        om.run_openmm(cpu, precision="half")
    with pytest.raises(DoesNotFit, match="CPU platform has no 'double' precision setting"):
        om.run_openmm(cpu, precision="double")
    monkeypatch.setattr(om, "installed", lambda: False)
    with pytest.raises(DoesNotFit, match=r"^OpenMM is not installed: pip install openmm$"):
        om.run_openmm(cpu)
    with pytest.raises(DoesNotFit, match=r"OpenMM is not installed: pip install 'pytest-mig\[cuda1[23]\]'"):
        om.run_openmm(EMULATED)


def test_no_cuda_plugin_names_the_extra(monkeypatch):
    if "CUDA" in [openmm.Platform.getPlatform(i).getName() for i in range(openmm.Platform.getNumPlatforms())]:
        pytest.skip("this machine has OpenMM's CUDA platform")
    with pytest.raises(DoesNotFit, match=r"OpenMM has no CUDA platform .*pip install 'pytest-mig\[cuda1[23]\]'"):
        om.platform_for("cuda", "mixed")


def test_cuda_extra_follows_torchs_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert om.cuda_extra() == "cuda12"
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert om.cuda_extra() == "cuda13"


def test_emulation_without_mps_is_a_skip_with_the_reason(monkeypatch):
    def unavailable():
        raise mps.MpsUnavailable("nvidia-cuda-mps-control is not on PATH")

    monkeypatch.setattr(mps, "shared", unavailable)
    with pytest.raises(DoesNotFit, match="OpenMM makes its own CUDA context, which a green context does not confine, "
                                         "and MPS could not confine it to the emulated 1g.10gb instead"):
        om.run_openmm(EMULATED)


def test_a_figure_whose_confinement_is_not_verified_is_never_the_profiles(monkeypatch):
    monkeypatch.setattr(mps, "confine_engine", lambda target, base, engine: (base, {"active_thread_percentage": 13}))
    result = {"resources": {"sms": 132}}
    monkeypatch.setattr(om, "_run_worker", lambda request, env: result)
    with pytest.raises(DoesNotFit, match="could not be verified: its worker saw 132 SMs where the profile has 16 "
                                         r"\(MPS at 13%\)"):
        om.run_openmm(EMULATED)
    result["resources"] = {"error": "libcuda is not loadable"}
    with pytest.raises(DoesNotFit, match="saw an unknown number of SMs"):
        om.run_openmm(EMULATED)


# --- built systems kept across nights (md_systems) -----------------------------------------------------

def _reference_energy(system, positions_nm) -> float:
    ctx = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
    ctx.setPositions([openmm.Vec3(*p) for p in positions_nm] * openmm.unit.nanometer)
    return ctx.getState(getEnergy=True).getPotentialEnergy().value_in_unit(openmm.unit.kilojoule_per_mole)


def test_a_built_system_is_kept_and_read_back_the_same(tmp_path):
    from pytest_mig.workloads import md_systems

    folder = tmp_path / "built"
    built = []

    def build():
        built.append(1)
        return om._built(om.CPU_SYSTEM)

    first, pos1, cached1 = md_systems.cached_build(om.CPU_SYSTEM, om.BUILD_SETTINGS, build, folder)
    second, pos2, cached2 = md_systems.cached_build(om.CPU_SYSTEM, om.BUILD_SETTINGS, build, folder)
    assert (cached1, cached2, len(built)) == (False, True, 1)  # built once, then read back
    assert pos1 == pos2 and second.getNumParticles() == first.getNumParticles() == len(pos1)
    assert _reference_energy(second, pos2) == pytest.approx(_reference_energy(first, pos1), rel=1e-9)
    # another build (other settings, another OpenMM) has a file of its own: never read as this one's
    other = {**om.BUILD_SETTINGS, "cutoff_nm": 1.0}
    assert md_systems.cached_build(om.CPU_SYSTEM, other, build, folder)[2] is False and len(built) == 2
    assert len(list((tmp_path / "built").glob("*.json"))) == 2


@pytest.mark.parametrize("damage", ["truncated", "not json", "other key", "nan", "fewer positions", "bad xml",
                                    "link"])
def test_a_damaged_system_file_is_built_again_and_rewritten(tmp_path, damage):
    import json

    from pytest_mig.workloads import md_systems

    folder = tmp_path / "built"
    md_systems.cached_build(om.CPU_SYSTEM, om.BUILD_SETTINGS, lambda: om._built(om.CPU_SYSTEM), folder)
    (path,) = (tmp_path / "built").glob("*.json")
    text = path.read_text()
    doc = json.loads(text)
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "not json":
        path.write_text("<System/>")
    elif damage == "other key":
        path.write_text(json.dumps({**doc, "key": "0" * 16}))
    elif damage == "nan":
        doc["positions_nm"][0][0] = float("nan")
        path.write_text(json.dumps(doc))
    elif damage == "fewer positions":
        path.write_text(json.dumps({**doc, "positions_nm": doc["positions_nm"][:-3]}))
    elif damage == "bad xml":
        path.write_text(json.dumps({**doc, "system_xml": "<System><Particles>"}))
    else:
        elsewhere = tmp_path / "elsewhere.json"  # a site's link to a file elsewhere, damaged there
        elsewhere.write_text(text[:100])
        path.unlink()
        path.symlink_to(elsewhere)
    built = []
    system, positions, cached = md_systems.cached_build(
        om.CPU_SYSTEM, om.BUILD_SETTINGS, lambda: built.append(1) or om._built(om.CPU_SYSTEM), folder)
    assert cached is False and built == [1] and system.getNumParticles() == len(positions)
    # the file is whole again (a link is written through, never replaced): the next night reads it
    assert md_systems.cached_build(om.CPU_SYSTEM, om.BUILD_SETTINGS, lambda: pytest.fail("built again"),
                                   folder)[2] is True
    if damage == "link":
        assert path.is_symlink() and len(elsewhere.read_text()) == len(text)


def test_without_a_folder_the_system_is_built_every_time(tmp_path, monkeypatch):
    from pytest_mig.workloads import md_systems

    monkeypatch.chdir(tmp_path)
    built = []
    for _ in range(2):
        assert md_systems.cached_build(om.CPU_SYSTEM, om.BUILD_SETTINGS,
                                       lambda: built.append(1) or om._built(om.CPU_SYSTEM))[2] is False
    assert built == [1, 1] and not list(tmp_path.iterdir())


def test_the_worker_reads_the_kept_system_on_a_second_run(cpu, tmp_path):
    from pytest_mig.workloads.caches import Caches

    caches = Caches(built_systems=tmp_path / "built")
    first = {m.name: m for m in om.run_openmm(cpu, quick=True, caches=caches)}["ns_per_day"]
    second = {m.name: m for m in om.run_openmm(cpu, quick=True, caches=caches)}["ns_per_day"]
    assert (first.info["system_from_cache"], second.info["system_from_cache"]) == (False, True)
    assert second.value > 0 and second.info["checks"]["force_rel_rms"] <= om.FORCE_LIMIT["mixed"]


def test_the_cuda_platform_spin_waits_for_the_gpu(monkeypatch):
    fake = object()
    monkeypatch.setattr(openmm.Platform, "getPlatformByName", staticmethod(lambda name: fake if name == "CUDA" else None))
    platform, properties = om.platform_for("cuda", "mixed")
    assert platform is fake
    assert properties == {"Precision": "mixed", "DeviceIndex": "0", "UseBlockingSync": "false"}
