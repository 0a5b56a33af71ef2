"""GROMACS, where a site has it: a water box of the size of OpenMM's DHFR benchmark, ns/day from its log.

``gmx solvate`` fills a cube of :data:`GMX_BOX_NM` nm with GROMACS's own equilibrated SPC water
(``spc216.gro``, shipped with every GROMACS), topology from the shipped OPLS-AA force field's SPC/E
water, PME electrostatics at a 0.9 nm cutoff, 2 fs steps with SETTLE, v-rescale at 300 K; then
``gmx grompp`` and ``gmx mdrun -nb gpu -pme gpu`` on the Target's device (the subprocess inherits
the pinned CUDA_VISIBLE_DEVICES), and ns/day is read from the log's ``Performance:`` line
(GROMACS times the second half of its run, ``-resethway``).

Under ``--mig-emulate`` mdrun makes its own CUDA context, which a green context does not confine: it
runs as a CUDA MPS client with the profile's SM share and memory cap (:mod:`pytest_mig.device.mps`), the
share found by a probe client that saw exactly the profile's SMs.  Without a ``gmx`` binary the
test is skipped with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_mig.device import mps
from pytest_mig.measure import Metric, Timer, Timing
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError

#: Environment variable naming the GROMACS binary where it is not ``gmx`` on PATH (gmx_mpi, a module path).
GMX_ENV = "PYTEST_MIG_GMX"
#: Side of the water cube in nm: 6.2 nm holds about 23.5k atoms, DHFR's size; the CPU runs 3 nm.
GMX_BOX_NM = 6.2
GMX_CPU_BOX_NM = 3.0
#: mdrun steps (the second half is timed: -resethway) and a wall-clock cap in hours (-maxh); a run
#: the cap stopped is flagged in the metric's info (its figure may then include the start-up).
GMX_STEPS = {False: 10000, True: 2000}
GMX_MAXH = {False: 120.0 / 3600, True: 30.0 / 3600}
#: Seconds a grompp or mdrun call may take before it is killed.
GMX_TIMEOUT_S = 600
#: The integration step in ps (GROMACS's units).
GMX_DT_PS = 0.002


def gmx_binary() -> str | None:
    """The GROMACS binary: ``$PYTEST_MIG_GMX`` if set, else ``gmx`` on PATH; None if neither."""
    named = os.environ.get(GMX_ENV)
    if named:
        return shutil.which(named) or (named if os.path.isfile(named) and os.access(named, os.X_OK) else None)
    return shutil.which("gmx")


@dataclass(frozen=True)
class GromacsPerformance:
    """What a GROMACS log's closing lines say about speed."""

    ns_per_day: float
    hours_per_ns: float | None
    wall_s: float | None
    core_s: float | None


_UNIT_COLUMNS = re.compile(r"\(([^)]+)\)")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def parse_gromacs_performance(text: str) -> GromacsPerformance:
    """ns/day (and hour/ns, wall and core seconds) from md.log's closing lines::

                       Core t (s)   Wall t (s)        (%)
               Time:      123.456       30.864      400.0
                         (ns/day)    (hour/ns)
        Performance:      139.954        0.171

    The unit header is read so that a log whose columns differ (older GROMACS printed Mnbf/s and
    GFlops first) is still read right; the last Performance line of the file counts.  ValueError
    when there is none (mdrun did not finish)."""
    lines = text.splitlines()
    perf_at = [i for i, line in enumerate(lines) if line.lstrip().startswith("Performance:")]
    if not perf_at:
        raise ValueError("no 'Performance:' line in the GROMACS log: mdrun did not finish")
    i = perf_at[-1]
    values = [float(v) for v in re.findall(_NUMBER, lines[i].split(":", 1)[1])]
    units = _UNIT_COLUMNS.findall(lines[i - 1]) if i > 0 else []
    if "ns/day" not in units:
        raise ValueError(f"the GROMACS log's Performance line has no (ns/day) column: {lines[i - 1].strip()!r}")
    if len(values) != len(units):
        raise ValueError(f"the GROMACS log's Performance line does not match its units: {lines[i].strip()!r}")
    col = dict(zip(units, values))
    wall = core = None
    for line in reversed(lines[:i]):
        if line.lstrip().startswith("Time:"):
            nums = [float(v) for v in re.findall(_NUMBER, line.split(":", 1)[1])]
            if len(nums) >= 2:
                core, wall = nums[0], nums[1]
            break
    return GromacsPerformance(col["ns/day"], col.get("hour/ns"), wall, core)


def gromacs_inputs(*, steps: int = 1000, seed: int = 0) -> dict[str, str]:
    """topol.top and md.mdp of the water box (``gmx solvate`` writes conf.gro; :func:`set_water_count`
    fills in the number of waters it placed)."""
    top = "\n".join([
        "; SPC/E water from GROMACS's own OPLS-AA force field files",
        '#include "oplsaa.ff/forcefield.itp"',
        '#include "oplsaa.ff/spce.itp"',
        "",
        "[ system ]",
        "water box",
        "",
        "[ molecules ]",
        "SOL  {waters}",
    ]) + "\n"
    mdp = "\n".join([
        "integrator               = md",
        f"dt                       = {GMX_DT_PS}",
        f"nsteps                   = {steps}",
        "cutoff-scheme            = Verlet",
        "nstlist                  = 100",
        "pbc                      = xyz",
        "coulombtype              = PME",
        "rcoulomb                 = 0.9",
        "vdwtype                  = Cut-off",
        "rvdw                     = 0.9",
        "constraints              = h-bonds",
        "tcoupl                   = v-rescale",
        "tc-grps                  = System",
        "tau-t                    = 1.0",
        "ref-t                    = 300",
        "pcoupl                   = no",
        "gen-vel                  = yes",
        "gen-temp                 = 300",
        f"gen-seed                 = {seed + 1}",
        "nstcalcenergy            = 100",
        "nstenergy                = 0",
        "nstlog                   = 0",
        "nstxout                  = 0",
        "nstvout                  = 0",
        "nstfout                  = 0",
        "nstxout-compressed       = 0",
    ]) + "\n"
    return {"topol.top": top, "md.mdp": mdp}


def waters_in(gro: str) -> int:
    """Water molecules in a .gro file that holds only 3-site water (its atom count over 3)."""
    lines = gro.splitlines()
    if len(lines) < 2 or not lines[1].strip().isdigit():
        raise WorkloadError("gmx solvate wrote no readable conf.gro")
    atoms = int(lines[1].strip())
    if atoms % 3:
        raise WorkloadError(f"gmx solvate wrote {atoms} atoms, not a whole number of 3-site waters")
    return atoms // 3


def _omp_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _run_gmx(args: list[str], cwd: Path, what: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=GMX_TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired:
        raise WorkloadError(f"{what} did not finish in {GMX_TIMEOUT_S} s: {' '.join(args)}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise WorkloadError(f"{what} failed (exit {proc.returncode}): {' '.join(args)}\n{tail}")
    return proc


def gmx_gpu_support(version_text: str) -> str | None:
    """The "GPU support:" value of ``gmx --version`` (CUDA, SYCL, OpenCL, disabled), or None."""
    m = re.search(r"^\s*GPU support:\s*(.+?)\s*$", version_text, re.MULTILINE)
    return m.group(1) if m else None


def gromacs_command(gmx: str, *, nb: str, threads: int, steps: int, maxh: float) -> list[str]:
    """The mdrun argument list (no shell): one thread-MPI rank, ``threads`` OpenMP threads,
    non-bonded and PME work on ``nb`` ("gpu" or "cpu"), the second half timed."""
    pme = ["-pme", nb] if nb == "gpu" else []
    return [gmx, "-quiet", "mdrun", "-s", "topol.tpr", "-deffnm", "md", "-g", "md.log", "-nb", nb, *pme,
            "-ntmpi", "1", "-ntomp", str(threads), "-nsteps", str(steps), "-resethway", "-noconfout",
            "-maxh", f"{maxh:.6f}"]


def run_gromacs(target: Target, timer: Timer | None = None, *, quick: bool = False, gmx: str | None = None,
                box_nm: float | None = None, workdir: str | os.PathLike[str] | None = None,
                env: dict[str, str] | None = None) -> list[Metric]:
    """GROMACS mdrun on the water box, on the Target's device: ns/day from md.log.

    The figure is GROMACS's own (the second half of the run, ``-resethway``); ``timer`` times the
    whole mdrun once (start-up included), which is what pytest-benchmark records for this test.
    Skipped (DoesNotFit) without a GROMACS binary; under emulation mdrun is an MPS client confined
    to the profile (skipped with the reason where that cannot be set up and verified)."""
    gmx = gmx or gmx_binary()
    if gmx is None:
        raise DoesNotFit(f"gmx not on PATH (or set {GMX_ENV} to a GROMACS binary)")
    run_env = dict(os.environ if env is None else env)
    confinement: dict[str, Any] = {}
    if target.emulated:
        run_env, confinement = mps.confine_engine(target, run_env, "GROMACS's mdrun")
    nb = "cpu" if target.is_cpu else "gpu"
    _check_gpu_build(gmx, nb, run_env)
    side = box_nm or (GMX_CPU_BOX_NM if target.is_cpu else GMX_BOX_NM)
    steps = GMX_STEPS[quick] // (10 if target.is_cpu else 1)
    threads = _omp_threads()
    with tempfile.TemporaryDirectory(prefix="pytest-mig-gmx-", dir=workdir) as tmp:
        wd = Path(tmp)
        waters = _prepare_water_box(gmx, wd, side, steps, run_env)
        mdrun = gromacs_command(gmx, nb=nb, threads=threads, steps=steps, maxh=GMX_MAXH[quick])
        timing = (timer or Timer(target.device))(lambda: _run_gmx(mdrun, wd, "gmx mdrun", run_env), warmup=0,
                                                 repeats=1, energy=False)
        log = (wd / "md.log").read_text(errors="replace")
    try:
        perf = parse_gromacs_performance(log)
    except ValueError as exc:
        raise WorkloadError(f"gmx mdrun: {exc}") from None
    if not perf.ns_per_day > 0:
        raise WorkloadError(f"gmx mdrun reported {perf.ns_per_day} ns/day")
    atoms = 3 * waters
    info = _mdrun_info(gmx, log, perf, timing, atoms=atoms, nb=nb, threads=threads, steps=steps, side=side)
    if confinement:
        info["confinement"] = confinement
    return [
        Metric("gmx_ns_per_day", perf.ns_per_day, "ns/day", "higher", [], kind="simulation", info=info),
        Metric("gmx_atoms", atoms, "atoms", "higher", [], kind="info", compare=False, info={"box_nm": side}),
    ]


def _check_gpu_build(gmx: str, nb: str, run_env: dict[str, str]) -> None:
    """Refuse (DoesNotFit) a GROMACS built without GPU support for a run on the GPU."""
    version = _run_gmx([gmx, "--version"], Path.cwd(), "gmx --version", run_env).stdout
    if nb == "gpu" and (gmx_gpu_support(version) or "").lower() in ("disabled", "none"):
        raise DoesNotFit(f"{gmx} was built without GPU support (its --version says 'GPU support: "
                         f"{gmx_gpu_support(version)}'): set {GMX_ENV} to a CUDA build of GROMACS")


def _prepare_water_box(gmx: str, wd: Path, side: float, steps: int, run_env: dict[str, str]) -> int:
    """Solvate a cubic box of ``side`` nm in ``wd`` and preprocess it into topol.tpr; returns the waters."""
    files = gromacs_inputs(steps=steps)
    _run_gmx([gmx, "-quiet", "solvate", "-cs", "spc216.gro", "-box", *[f"{side:g}"] * 3, "-o", "conf.gro"], wd,
             "gmx solvate", run_env)
    waters = waters_in((wd / "conf.gro").read_text(errors="replace"))
    (wd / "topol.top").write_text(files["topol.top"].replace("{waters}", str(waters)))
    (wd / "md.mdp").write_text(files["md.mdp"])
    _run_gmx([gmx, "-quiet", "grompp", "-f", "md.mdp", "-c", "conf.gro", "-p", "topol.top", "-o", "topol.tpr",
              "-po", "mdout.mdp"], wd, "gmx grompp", run_env)
    return waters


def _mdrun_info(gmx: str, log: str, perf: GromacsPerformance, timing: Timing, *, atoms: int, nb: str,
                threads: int, steps: int, side: float) -> dict[str, Any]:
    """The ns/day figure's info: the binary, the system, and GROMACS's and our own wall times."""
    info: dict[str, Any] = {
        "gmx": gmx,
        "version": _gmx_version(log),
        "atoms": atoms,
        "nb": nb,
        "ntomp": threads,
        "nsteps": steps,
        "dt_ps": GMX_DT_PS,
        "hour_per_ns": perf.hours_per_ns,
        "timed_wall_s": perf.wall_s,  # GROMACS's: the second half of the run
        "mdrun_wall_s": timing.samples[0] if timing.samples else None,  # the whole mdrun, start-up included
        "system": f"SPC/E water box, {side:g} nm, PME 0.9 nm, 2 fs, v-rescale 300 K",
        "stopped_by_maxh": "Run time exceeded" in log,
        "scaling": False,  # DHFR-size: too small to fill a whole GPU (see openmm_md.MdSystem.scales)
    }
    return info


def _gmx_version(log: str) -> str | None:
    m = re.search(r"^\s*GROMACS version:\s*(.+)$", log, re.MULTILINE)
    return m.group(1).strip() if m else None


__all__ = [
    "GMX_ENV",
    "GromacsPerformance",
    "gmx_binary",
    "gmx_gpu_support",
    "gromacs_command",
    "gromacs_inputs",
    "parse_gromacs_performance",
    "run_gromacs",
    "waters_in",
]
