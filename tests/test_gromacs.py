"""GROMACS, where a site has it: its water-box inputs, its log parser, the argument lists, and the
skips (no gmx, no GPU support, MPS confinement under emulation).  A shell script stands in for gmx
here; mdrun itself runs only where a gmx binary is present."""

from __future__ import annotations

import os
import shutil

import pytest

from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError
from pytest_mig.workloads import gromacs as md

GIB = 2**30


def _gpu(memory_gib: float, sms: int, kind: str = "mig") -> Target:
    return Target(kind=kind, profile="1g.10gb" if kind == "mig" else "full", chosen_by="test", gpu_name="NVIDIA H200",
                  sms=sms, memory_bytes=int(memory_gib * GIB), compute_capability=(9, 0))


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


def test_gromacs_inputs_describe_the_water_box():
    files = md.gromacs_inputs(steps=1234, seed=5)
    top = files["topol.top"]
    assert '#include "oplsaa.ff/spce.itp"' in top and top.rstrip().endswith("SOL  {waters}")
    mdp = dict(line.split("=", 1) for line in files["md.mdp"].splitlines())
    mdp = {k.strip(): v.strip() for k, v in mdp.items()}
    assert mdp["nsteps"] == "1234" and mdp["cutoff-scheme"] == "Verlet" and mdp["coulombtype"] == "PME"
    assert float(mdp["dt"]) == md.GMX_DT_PS and mdp["gen-seed"] == "6" and mdp["tcoupl"] == "v-rescale"


def test_waters_in_a_solvated_box():
    gro = "water\n  648\n" + "\n".join(["    1SOL     OW    1   0.230   0.628   0.113"] * 648) + "\n   1.86206   1.86206   1.86206\n"
    assert md.waters_in(gro) == 216
    with pytest.raises(WorkloadError, match="not a whole number"):
        md.waters_in("x\n  10\n")
    with pytest.raises(WorkloadError, match="no readable conf.gro"):
        md.waters_in("")


def test_gromacs_command_is_an_argument_list():
    cmd = md.gromacs_command("/opt/gmx", nb="gpu", threads=4, steps=2000, maxh=0.01)
    assert cmd[:3] == ["/opt/gmx", "-quiet", "mdrun"]
    assert cmd[cmd.index("-nb") + 1] == "gpu" and cmd[cmd.index("-ntmpi") + 1] == "1"
    assert cmd[cmd.index("-ntomp") + 1] == "4" and cmd[cmd.index("-nsteps") + 1] == "2000"
    assert "-resethway" in cmd and cmd[cmd.index("-g") + 1] == "md.log"
    assert cmd[cmd.index("-pme") + 1] == "gpu"  # PME on the GPU too, as GROMACS's GPU benchmarks run it


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


def test_gromacs_under_emulation_needs_mps(monkeypatch):
    from pytest_mig.device import mps

    monkeypatch.setattr(mps, "shared", lambda: (_ for _ in ()).throw(mps.MpsUnavailable("nvidia-cuda-mps-control is not on PATH")))
    emulated = Target(kind="emulated", profile="1g.18gb", chosen_by="test", gpu_name="NVIDIA H200", sms=16,
                      memory_bytes=18 * GIB)
    with pytest.raises(DoesNotFit, match="GROMACS's mdrun makes its own CUDA context.*MPS could not confine it to the "
                                         "emulated 1g.18gb instead: nvidia-cuda-mps-control is not on PATH"):
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
    with pytest.raises(WorkloadError, match="(?s)gmx solvate failed .*something the user must read"):
        md.run_gromacs(cpu, gmx=fake)


STAND_IN = r'''
case "$2" in
  solvate) printf 'water\n  648\n' > conf.gro; i=0; while [ $i -lt 648 ]; do echo "    1SOL     OW    1   0.230   0.628   0.113" >> conf.gro; i=$((i+1)); done; echo "   3.0 3.0 3.0" >> conf.gro ;;
  grompp) grep -q "SOL  216" topol.top || exit 3; touch topol.tpr ;;
  mdrun) printf 'GROMACS version:    2024.1\n               Core t (s)   Wall t (s)        (%%)\n       Time:       10.000        2.500      400.0\n                 (ns/day)    (hour/ns)\nPerformance:       88.000        0.273\n' > md.log ;;
esac
echo "$@" >> "$LOG"
'''


def test_gromacs_through_a_stand_in(cpu, tmp_path, monkeypatch):
    fake = _fake_gmx(tmp_path, STAND_IN)
    monkeypatch.setenv("LOG", str(tmp_path / "calls"))
    work = tmp_path / "work"
    work.mkdir()
    metrics = {m.name: m for m in md.run_gromacs(cpu, gmx=fake, quick=True, workdir=work)}
    ns = metrics["gmx_ns_per_day"]
    assert ns.value == pytest.approx(88.0) and ns.unit == "ns/day" and ns.kind == "simulation"
    assert metrics["gmx_atoms"].value == 648 and ns.info["version"] == "2024.1" and not ns.info["scaling"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[1] for c in calls] == ["solvate", "grompp", "mdrun"]
    assert "-box 3 3 3" in calls[0] and "-nb cpu" in calls[2] and "-pme" not in calls[2]
    assert not os.listdir(work)  # the work folder is cleaned up


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
    assert 2400 < metrics["gmx_atoms"].value < 2800  # a 3 nm water cube
    assert ns.info["nb"] == "cpu" and not os.listdir(tmp_path)  # the work folder is cleaned up
