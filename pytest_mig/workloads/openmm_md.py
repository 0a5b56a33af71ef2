"""Molecular dynamics through OpenMM: ns/day on explicit-solvent systems built from files OpenMM ships.

Systems (:data:`SYSTEMS`; nothing is downloaded):

- ``water-23k``: a 6.2 nm cube of TIP3P-FB water, 23,568 atoms, the size of OpenMM's DHFR benchmark;
- ``water-92k``: a 9.78 nm cube, about 92k atoms, the size of the ApoA1 benchmark;
- ``popc-membrane``: the pre-equilibrated POPC bilayer patch OpenMM ships for ``addMembrane``
  (128 lipids in 5,120 waters, 32,512 atoms), with the amber14 lipid17 parameters.

Settings as OpenMM's own benchmark runs its PME systems: amber14 force field, PME with a 0.9 nm
cutoff, bonds to hydrogen constrained, rigid water, hydrogen mass 1.5 amu, LangevinMiddleIntegrator
at 300 K and 4 fs; mixed precision by default, single and double as variants.  On the CPU the same
test runs a 2.5 nm box on OpenMM's CPU platform.

Every run is checked before its figure counts (a fast wrong answer is a failure):

- forces and potential energy of the measuring platform against OpenMM's Reference platform
  (double precision) on the same coordinates, after a short minimisation: relative RMS force
  error at most :data:`FORCE_LIMIT` and relative energy error at most :data:`ENERGY_LIMIT`
  (:data:`CPU_ENERGY_LIMIT` on OpenMM's CPU platform);
- energy conservation: after the timed run the same context integrates NVE (velocity Verlet at
  1 fs) and the total energy may move from its start by at most :data:`NVE_LIMIT` of the kinetic
  energy.

The work runs in a worker process (``python -m pytest_mig.workloads.openmm_md REQUEST RESULT``,
JSON in and out), because OpenMM makes its own CUDA context: under ``--mig-emulate`` the worker is a
CUDA MPS client with the profile's SM share and memory cap (:mod:`pytest_mig.device.mps`), and it reports
the SMs its context really had.  A figure whose confinement could not be verified is skipped with
the reason, never reported as the profile's.  Timing: chunks of steps of about
:data:`CHUNK_S` seconds each, each ended by reading the state back (so the GPU has finished),
timed by the host clock; every chunk is one sample of ns/day and the figure is their median (a
launch-bound run has a few chunks slowed by host-side stalls, which the median leaves out;
``ns_per_day_overall`` in the info is all steps over all seconds, what a script timing one long run
reports).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_mig.device import mps

from pytest_mig.workloads import preload
from pytest_mig.measure import (
    RAMP_S,
    EnergyTicks,
    Metric,
    PowerTrace,
    Telemetry,
    Timing,
    energy_metrics,
)
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError, md_systems
from pytest_mig.workloads.caches import Caches
import traceback
from pytest_mig.device.mps import context_resources


@dataclass(frozen=True)
class MdSystem:
    """One benchmark system: a cubic water box of ``box_nm``, or a PDB file OpenMM ships."""

    name: str
    description: str
    box_nm: float | None = None
    pdb: str | None = None
    #: Judged against ideal scaling between profiles.  A 23.5k-atom system cannot fill a whole
    #: H100: emulated on it, water-23k gave 2g/1g 1.63, 3g/2g 1.39, full/3g 1.16 (ideal 2, 2, 2.06
    #: by the SMs obtained): judging it would fail every sweep on a system that is too small, as
    #: Wulver's GROMACS full/3g did.
    scales: bool = False


SYSTEMS: dict[str, MdSystem] = {
    s.name: s
    for s in (
        MdSystem("water-23k", "TIP3P-FB water box, 6.2 nm (DHFR-size, 23,568 atoms)", box_nm=6.2),
        MdSystem("water-92k", "TIP3P-FB water box, 9.78 nm (ApoA1-size, about 92k atoms)", box_nm=9.78, scales=True),
        MdSystem("popc-membrane", "POPC bilayer, 128 lipids in 5,120 waters (OpenMM's POPC.pdb, 32,512 atoms)",
                 pdb="POPC.pdb"),
    )
}
SYSTEM_NAMES = tuple(SYSTEMS)
#: What the CPU runs in place of every system: small enough for CI's two cores.
CPU_SYSTEM = MdSystem("water-cpu", "TIP3P-FB water box, 2.5 nm (CPU-sized)", box_nm=2.5)

PRECISIONS = ("mixed", "single", "double")
FORCE_FIELD = ("amber14-all.xml", "amber14/tip3pfb.xml")
CUTOFF_NM = 0.9
TIMESTEP_FS = 4.0
TEMPERATURE_K = 300.0
FRICTION_PER_PS = 1.0
HYDROGEN_MASS_AMU = 1.5
NVE_TIMESTEP_FS = 1.0
SEED = 20240611
#: What a built System depends on besides the system itself (md_systems keys its cache by them).
BUILD_SETTINGS = {"force_field": list(FORCE_FIELD), "cutoff_nm": CUTOFF_NM, "constraints": "HBonds",
                  "rigid_water": True, "hydrogen_mass_amu": HYDROGEN_MASS_AMU, "water_model": "tip3p"}

#: Relative RMS force error and relative potential-energy error against the Reference platform,
#: by precision, about ten times what the H100 showed (mixed: forces 5e-6 to 5e-5, energy 1e-7 to
#: 2e-7 over the three systems; the energy differs by ~1e-7 in double too: the PME grids are the
#: platforms' own).  A neighbour missed or a term dropped moves either by far more.
FORCE_LIMIT = {"mixed": 5e-4, "single": 5e-4, "double": 1e-4}
ENERGY_LIMIT = {"mixed": 2e-6, "single": 2e-6, "double": 2e-6}
#: The same for OpenMM's CPU platform (a run with no GPU), whose PME in single precision is further
#: from the Reference platform's: 0.8e-6 to 1.1e-6 over 18 quick runs on a 2-core machine, once
#: 2.1e-6 in CI; ten times the typical, still far below what a dropped term or neighbour gives.
CPU_ENERGY_LIMIT = 1e-5
#: NVE: the largest move of the total energy from its start, as a share of the kinetic energy.
NVE_LIMIT = {"mixed": 0.01, "single": 0.05, "double": 0.01}


@dataclass(frozen=True)
class MdEffort:
    minimize_iterations: int
    warmup_s: float
    chunk_s: float
    repeats: int
    nve_steps: int
    nve_every: int


CHUNK_S = 0.5
MD_EFFORT = {
    ("gpu", False): MdEffort(minimize_iterations=200, warmup_s=2.0, chunk_s=CHUNK_S, repeats=16, nve_steps=2000, nve_every=100),
    ("gpu", True): MdEffort(minimize_iterations=200, warmup_s=1.0, chunk_s=CHUNK_S, repeats=6, nve_steps=1000, nve_every=100),
    ("cpu", False): MdEffort(minimize_iterations=100, warmup_s=0.5, chunk_s=0.25, repeats=5, nve_steps=200, nve_every=20),
    ("cpu", True): MdEffort(minimize_iterations=100, warmup_s=0.3, chunk_s=0.2, repeats=4, nve_steps=100, nve_every=20),
}
#: Seconds the worker may take before it is killed (building, checks and timing included).
WORKER_TIMEOUT_S = 900


# --------------------------------------------------------------------------- what is installed


def installed() -> bool:
    return importlib.util.find_spec("openmm") is not None


def cuda_extra() -> str:
    """The pip extra of OpenMM's CUDA plugin that matches this PyTorch's CUDA (12 or 13)."""
    try:
        import torch

        major = int(str(torch.version.cuda or "13").split(".")[0])
    except Exception:  # pragma: no cover - torch is a dependency
        major = 13
    return "cuda12" if major <= 12 else "cuda13"


def install_line(gpu: bool) -> str:
    extra = cuda_extra()
    return f"pip install 'pytest-mig[{extra}]'  (openmm[{extra}])" if gpu else "pip install openmm"


# --------------------------------------------------------------------------- inside the worker


def build(system: MdSystem) -> tuple[Any, Any, Any]:
    """(topology, positions, System) of ``system`` with the benchmark's force field and settings."""
    import openmm
    import openmm.app as app
    import openmm.unit as unit

    ff = app.ForceField(*FORCE_FIELD)
    if system.pdb is not None:
        pdb = app.PDBFile(os.path.join(os.path.dirname(app.__file__), "data", system.pdb))
        topology, positions = pdb.topology, pdb.positions
    else:
        modeller = app.Modeller(app.Topology(), [])
        side = system.box_nm
        modeller.addSolvent(ff, model="tip3p", boxSize=openmm.Vec3(side, side, side) * unit.nanometer)
        topology, positions = modeller.topology, modeller.positions
    mm_system = ff.createSystem(topology, nonbondedMethod=app.PME, nonbondedCutoff=CUTOFF_NM * unit.nanometer,
                                constraints=app.HBonds, rigidWater=True, hydrogenMass=HYDROGEN_MASS_AMU * unit.amu)
    return topology, positions, mm_system


def _built(system: MdSystem) -> tuple[Any, Any]:
    """(System, positions) of :func:`build`, the pair md_systems keeps."""
    _, positions, mm_system = build(system)
    return mm_system, positions


def check_cpu_precision(precision: str) -> None:
    """OpenMM's CPU platform has one precision: the variants are a skip with the reason there."""
    if precision != "mixed":
        raise DoesNotFit(f"OpenMM's CPU platform has no '{precision}' precision setting; the precision variants run on GPUs")


def platform_for(device: str, precision: str) -> tuple[Any, dict[str, str]]:
    """OpenMM's CUDA platform (device 0 of what this process sees) or its CPU platform."""
    import openmm

    if device == "cpu":
        check_cpu_precision(precision)
        return openmm.Platform.getPlatformByName("CPU"), {}
    try:
        platform = openmm.Platform.getPlatformByName("CUDA")
    except Exception:
        failures = "; ".join(openmm.Platform.getPluginLoadFailures()) or "no CUDA plugin installed"
        raise DoesNotFit(f"OpenMM has no CUDA platform ({failures[:300]}): {install_line(True)}") from None
    # Spin while waiting for the GPU: the platform's default (a blocking wait, the host thread asleep) made
    # water-23k mixed 12% slower and its chunks 2-4x noisier on an H200 host (1628-1685 ns/day against
    # 1855-1870 spinning, fresh processes alternately), as it wakes at every step of a host-bound system.
    return platform, {"Precision": precision, "DeviceIndex": "0", "UseBlockingSync": "false"}


def compare_to_reference(system: Any, positions: Any, state: Any) -> dict[str, float]:
    """Relative RMS force error and relative potential-energy error of ``state`` against the Reference platform."""
    import numpy as np
    import openmm
    import openmm.unit as unit

    ref = openmm.Context(system, openmm.VerletIntegrator(0.001), openmm.Platform.getPlatformByName("Reference"))
    ref.setPositions(positions)
    rstate = ref.getState(getForces=True, getEnergy=True)
    kj_nm = unit.kilojoule_per_mole / unit.nanometer
    f = np.asarray(state.getForces(asNumpy=True).value_in_unit(kj_nm), dtype=np.float64)
    fr = np.asarray(rstate.getForces(asNumpy=True).value_in_unit(kj_nm), dtype=np.float64)
    e = state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
    er = rstate.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
    del ref
    return {"force_rel_rms": float(np.linalg.norm(f - fr) / np.linalg.norm(fr)),
            "energy_rel": float(abs(e - er) / abs(er)), "energy_kj_mol": float(e), "reference_energy_kj_mol": float(er)}


def nve_deviation(energies: list[float], kinetic: float) -> float:
    """The largest move of the total energy from its first value, as a share of the kinetic energy."""
    if not energies or not kinetic > 0 or not all(math.isfinite(x) for x in energies):
        return float("nan")
    return max(abs(x - energies[0]) for x in energies) / kinetic


def check(name: str, value: float, limit: float, what: str) -> None:
    if not (value <= limit):  # NaN fails too
        raise WorkloadError(f"OpenMM {what}: {name} {value:.3g} exceeds {limit:.3g}: wrong result")


def ns_per_day(steps: int, seconds: float, timestep_fs: float = TIMESTEP_FS) -> float:
    return steps * timestep_fs * 1e-6 / seconds * 86400.0


def simulate(request: dict[str, Any]) -> dict[str, Any]:
    """Build, check and time one system (runs in the worker; returns what the parent reports)."""
    import openmm
    import openmm.unit as unit

    device, precision, quick = request["device"], request["precision"], bool(request["quick"])
    system = CPU_SYSTEM if device == "cpu" else SYSTEMS[request["system"]]
    effort = MD_EFFORT[("cpu" if device == "cpu" else "gpu", quick)]
    t0 = time.perf_counter()
    platform, props = platform_for(device, precision)
    built = Path(request["built_systems"]) if request.get("built_systems") else None
    mm_system, positions_nm, from_cache = md_systems.cached_build(system, BUILD_SETTINGS, lambda: _built(system), built)
    positions = [openmm.Vec3(*p) for p in positions_nm] * unit.nanometer
    system_s = time.perf_counter() - t0
    integrator = _integrator()
    context = openmm.Context(mm_system, integrator, platform, props)
    resources = _resources(device)
    context.setPositions(positions)
    openmm.LocalEnergyMinimizer.minimize(context, 10.0, effort.minimize_iterations)
    built_s = time.perf_counter() - t0

    forces = _checked_forces(mm_system, context, precision)
    context.setVelocitiesToTemperature(TEMPERATURE_K * unit.kelvin, SEED)
    integrator.setCurrentIntegrator(0)
    chunk, samples, window = _timed_chunks(context, integrator, effort)
    integrator.setCurrentIntegrator(1)
    deviation = _checked_nve(context, integrator, effort, precision)
    return {
        "system": system.name, "description": system.description, "atoms": mm_system.getNumParticles(),
        "precision": precision, "platform": platform.getName(),
        "platform_properties": {k: platform.getPropertyValue(context, k) for k in platform.getPropertyNames()
                                if k in ("Precision", "DeviceIndex", "DeviceName", "Threads", "UseBlockingSync")},
        "openmm": openmm.__version__, "steps_per_chunk": chunk, "chunk_seconds": samples, "timed_window": window,
        "timestep_fs": TIMESTEP_FS, "build_s": round(built_s, 2), "resources": resources,
        "system_s": round(system_s, 2), "system_from_cache": from_cache,
        "checks": {**forces, "nve_deviation": deviation, "nve_steps": effort.nve_steps,
                   "nve_timestep_fs": NVE_TIMESTEP_FS},
    }


def _integrator() -> Any:
    """Langevin dynamics (integrator 0) for the timed steps and velocity Verlet (integrator 1) for the NVE check."""
    import openmm
    import openmm.unit as unit

    langevin = openmm.LangevinMiddleIntegrator(TEMPERATURE_K * unit.kelvin, FRICTION_PER_PS / unit.picosecond,
                                               TIMESTEP_FS * unit.femtosecond)
    langevin.setRandomNumberSeed(SEED)
    verlet = openmm.VerletIntegrator(NVE_TIMESTEP_FS * unit.femtosecond)
    integrator = openmm.CompoundIntegrator()
    integrator.addIntegrator(langevin)
    integrator.addIntegrator(verlet)
    return integrator


def _checked_forces(mm_system: Any, context: Any, precision: str) -> dict[str, float]:
    """Forces and potential energy against the Reference platform's; a WorkloadError beyond the limits."""
    state = context.getState(getForces=True, getEnergy=True, getPositions=True)
    forces = compare_to_reference(mm_system, state.getPositions(), state)
    check("relative RMS force error against the Reference platform", forces["force_rel_rms"], FORCE_LIMIT[precision], "forces")
    limit = CPU_ENERGY_LIMIT if context.getPlatform().getName() == "CPU" else ENERGY_LIMIT[precision]
    check("relative potential-energy error against the Reference platform", forces["energy_rel"], limit, "energy")
    return forces


def _timed_chunks(context: Any, integrator: Any, effort: MdEffort) -> tuple[int, list[float], list[float]]:
    """Probe the step time, warm up for ``effort.warmup_s`` in chunks of about ``effort.chunk_s``,
    then time ``effort.repeats`` chunks: (steps per chunk, seconds per chunk, the timed window)."""

    def run(steps: int) -> float:
        start = time.perf_counter()
        integrator.step(steps)
        context.getState(getPositions=True)  # returns once the GPU has finished the steps
        return time.perf_counter() - start

    def chunk_for(per_step: float) -> int:  # steps of about effort.chunk_s, a multiple of 10
        return max(10, int(round(effort.chunk_s / per_step, -1)))

    probe_steps = 20
    chunk = chunk_for(run(probe_steps) / probe_steps)
    per_step = 0.0
    warm_until = time.perf_counter() + effort.warmup_s
    while time.perf_counter() < warm_until:
        per_step = run(chunk) / chunk
    chunk = chunk_for(per_step) if per_step else chunk
    window_start = time.perf_counter()  # CLOCK_MONOTONIC: the parent reads board energy on the same clock
    samples = [run(chunk) for _ in range(effort.repeats)]
    window = [window_start, time.perf_counter()]
    return chunk, samples, window


def _checked_nve(context: Any, integrator: Any, effort: MdEffort, precision: str) -> float:
    """Run the NVE steps, reading the total energy every ``effort.nve_every``; returns its largest
    deviation (share of the kinetic energy), a WorkloadError beyond the limit."""
    import openmm.unit as unit

    energies: list[float] = []
    kinetic = float("nan")
    for i in range(effort.nve_steps // effort.nve_every + 1):
        if i:
            integrator.step(effort.nve_every)
        st = context.getState(getEnergy=True)
        ke = st.getKineticEnergy().value_in_unit(unit.kilojoule_per_mole)
        pe = st.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
        if i == 0:
            kinetic = ke
        energies.append(ke + pe)
    deviation = nve_deviation(energies, kinetic)
    check(f"NVE total-energy deviation over {effort.nve_steps} steps of {NVE_TIMESTEP_FS:g} fs (share of kinetic energy)",
          deviation, NVE_LIMIT[precision], "energy conservation")
    return deviation

def _resources(device: str) -> dict[str, Any]:
    if device == "cpu":
        return {}

    return context_resources()


def worker_main(argv: list[str]) -> int:
    """``python -m pytest_mig.workloads.openmm_md REQUEST.json RESULT.json``."""
    if len(argv) != 2:
        print("usage: python -m pytest_mig.workloads.openmm_md REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = json.loads(Path(argv[0]).read_text())
    try:
        result: dict[str, Any] = {"ok": simulate(request)}
    except DoesNotFit as exc:
        result = {"does_not_fit": str(exc)}
    except WorkloadError as exc:
        result = {"workload_error": str(exc)}
    except Exception as exc:  # reported by the parent with its type; the worker's traceback is on stderr

        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    Path(argv[1]).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- in the pytest process


def run_openmm(target: Target, *, system: str = "water-23k", precision: str = "mixed", quick: bool = False,
               env: dict[str, str] | None = None, telemetry: Telemetry | None = None,
               caches: Caches | None = None) -> list[Metric]:
    """Run ``system`` at ``precision`` on the Target in a worker process and report ns/day.

    The worker reads the built System from the built systems' folder of ``caches`` where it was kept
    there, and keeps it there otherwise (:mod:`pytest_mig.workloads.md_systems`); without one it builds
    the System and keeps nothing.

    With ``telemetry`` that reads the board's energy counter, this process polls it while the worker
    runs, and the board energy between the first and last counter tick inside the worker's timed
    chunks (both on the system's monotonic clock) gives the power and the energy per ns simulated.

    DoesNotFit (a skip with the reason) without OpenMM or its CUDA plugin, or where an emulated
    profile's confinement cannot be set up or verified; WorkloadError where a check fails.
    """
    if system not in SYSTEMS:
        raise ValueError(f"unknown MD system '{system}': use one of {', '.join(SYSTEM_NAMES)}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown OpenMM precision '{precision}': use one of {', '.join(PRECISIONS)}")
    if not installed():
        raise DoesNotFit(f"OpenMM is not installed: {install_line(not target.is_cpu)}")
    if target.is_cpu:
        check_cpu_precision(precision)  # before a worker is started for nothing
    base = dict(os.environ if env is None else env)
    confinement: dict[str, Any] = {}
    if target.emulated:
        base, confinement = mps.confine_engine(target, base, "OpenMM")
    built = caches.built_systems if caches is not None else None
    request = {"device": "cpu" if target.is_cpu else "cuda", "system": system, "precision": precision, "quick": quick,
               "built_systems": str(built) if built is not None else None}
    # this process only waits: the imports a later test needs are made meanwhile (pytest_mig.workloads.preload)
    with EnergyTicks(telemetry.read_energy_mj if telemetry is not None else None) as ticks, preload.while_waiting():
        result = _run_worker(request, base)
    if target.emulated:
        _verify_confinement(target, result, confinement)
    return _metrics(target, result, confinement) + _energy(result, ticks, telemetry)


def _energy(result: dict[str, Any], ticks: EnergyTicks, telemetry: Telemetry | None) -> list[Metric]:
    """Board power and J/ns over the worker's timed chunks (none where the counter did not tick twice)."""
    window = result.get("timed_window")
    if telemetry is None or not isinstance(window, list) or len(window) != 2:
        return []
    start, end = float(window[0]), float(window[1])
    mean_w = ticks.mean_power_w(start + RAMP_S, end)
    if mean_w is None:
        return []
    seconds = [float(s) for s in result["chunk_seconds"]]
    ns_per_chunk = int(result["steps_per_chunk"]) * float(result["timestep_fs"]) * 1e-6
    trace = PowerTrace([], end - start, mean_w * (end - start), "energy-counter", telemetry.power_limit_w)
    return energy_metrics(Timing(samples=seconds, power=trace, energy_calls=len(seconds)), ns_per_chunk, "ns")


def _run_worker(request: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pytest-mig-openmm-") as tmp:
        req, res = Path(tmp, "request.json"), Path(tmp, "result.json")
        req.write_text(json.dumps(request))
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest_mig.workloads.openmm_md", str(req), str(res)], env=env,
                                  capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise WorkloadError(f"the OpenMM worker did not finish in {WORKER_TIMEOUT_S} s") from None
        if not res.exists():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise WorkloadError(f"the OpenMM worker died (exit {proc.returncode}) before reporting:\n{tail}")
        result: dict[str, Any] = json.loads(res.read_text())
    if "does_not_fit" in result:
        raise DoesNotFit(result["does_not_fit"])
    if "workload_error" in result:
        raise WorkloadError(result["workload_error"])
    if "error" in result:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise WorkloadError(f"the OpenMM worker failed: {result['error']}\n{tail}")
    ok: dict[str, Any] = result["ok"]
    return ok


def _verify_confinement(target: Target, result: dict[str, Any], confinement: dict[str, Any]) -> None:
    """The worker's context must have had the profile's SMs, read by the driver in the worker itself."""
    seen = (result.get("resources") or {}).get("sms")
    want = target.effective_sms
    if seen != want:
        raise DoesNotFit(f"OpenMM's confinement to the emulated {target.profile} could not be verified: its worker "
                         f"saw {seen if seen is not None else 'an unknown number of'} SMs where the profile has {want} "
                         f"(MPS at {confinement.get('active_thread_percentage')}%); the figure would not be the profile's")


def _metrics(target: Target, result: dict[str, Any], confinement: dict[str, Any]) -> list[Metric]:
    seconds = [float(s) for s in result["chunk_seconds"]]
    steps = int(result["steps_per_chunk"])
    rates = [ns_per_day(steps, s, result["timestep_fs"]) for s in seconds]
    atoms = int(result["atoms"])
    info: dict[str, Any] = {
        "engine": f"OpenMM {result['openmm']}", "platform": result["platform"],
        "platform_properties": result["platform_properties"], "system": result["system"],
        "description": result["description"], "atoms": atoms, "precision": result["precision"],
        "timestep_fs": result["timestep_fs"], "steps_per_sample": steps, "build_s": result["build_s"],
        "system_s": result.get("system_s"), "system_from_cache": result.get("system_from_cache"),
        "ns_per_day_overall": ns_per_day(steps * len(seconds), sum(seconds), result["timestep_fs"]),
        "checks": result["checks"], "worker_resources": result["resources"],
        "settings": f"amber14 + TIP3P-FB, PME {CUTOFF_NM} nm, HBonds, HMR {HYDROGEN_MASS_AMU} amu, "
                    f"LangevinMiddle {TEMPERATURE_K:g} K",
        "scaling": SYSTEMS[result["system"]].scales if result["system"] in SYSTEMS else False,
    }
    if confinement:
        info["confinement"] = confinement
    step_ms = [1e3 * s / steps for s in seconds]
    checks = result["checks"]
    return [
        Metric("ns_per_day", statistics.median(rates), "ns/day", "higher", rates, kind="simulation", info=info),
        Metric("ms_per_step", statistics.median(step_ms), "ms", "lower", [], kind="info", compare=False,
               info={"statistic": "median", "samples": len(step_ms)}),
        Metric("atoms", atoms, "atoms", "higher", [], kind="info", compare=False, info={"system": result["system"]}),
        Metric("force_rel_rms", checks["force_rel_rms"], "ratio", "lower", [], kind="info", compare=False,
               info={"against": "OpenMM Reference platform", "limit": FORCE_LIMIT[result["precision"]]}),
        Metric("nve_deviation", checks["nve_deviation"], "ratio", "lower", [], kind="info", compare=False,
               info={"steps": checks["nve_steps"], "timestep_fs": checks["nve_timestep_fs"],
                     "limit": NVE_LIMIT[result["precision"]]}),
    ]


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
