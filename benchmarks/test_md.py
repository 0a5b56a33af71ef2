"""Molecular dynamics through the field's engines (Wulver's GROMACS row): OpenMM, and GROMACS where installed.

OpenMM runs explicit-solvent systems built from its own files (a DHFR-size water box, an
ApoA1-size one, a POPC membrane) with its benchmark's settings (amber14, PME 0.9 nm, 4 fs,
mixed precision; single and double as variants) and reports ns/day; each run's forces are checked
against OpenMM's Reference platform and its energy conservation in a short NVE run.  Under
``--mig-emulate`` OpenMM runs as a CUDA MPS client confined to the profile, and a figure whose
confinement cannot be verified is skipped with the reason.  On the CPU a small water box runs on
OpenMM's CPU platform.  GROMACS runs a DHFR-size water box with ``-nb gpu -pme gpu``; without a
``gmx`` binary it is skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_mig.bench import MigBench
from pytest_mig.workloads.gromacs import run_gromacs
from pytest_mig.workloads.openmm_md import run_openmm

# The engines time themselves (OpenMM in its worker, GROMACS in its log): the benchmark fixture is not used.
pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


@dataclass(frozen=True)
class Case:
    system: str
    precision: str = "mixed"
    in_quick: bool = False

    @property
    def id(self) -> str:
        return f"{self.system}-{self.precision}"


CASES = (
    Case("water-23k", in_quick=True),
    Case("water-92k"),
    Case("popc-membrane"),
    Case("water-23k", "single"),
    Case("water-23k", "double"),
)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_openmm(mig_bench: MigBench, case: Case) -> None:
    if mig_bench.quick and not case.in_quick:
        pytest.skip(f"{case.id} is not run in quick mode (--mig-quick runs the DHFR-size box at mixed precision)")
    metrics = mig_bench.record_all(run_openmm(mig_bench.target, system=case.system, precision=case.precision,
                                              quick=mig_bench.quick, telemetry=mig_bench.timer.telemetry,
                                              caches=mig_bench.caches))
    rate = next(m for m in metrics if m.name == "ns_per_day")
    assert rate.value > 0 and rate.samples
    mig_bench.cost(rate.value / 86400.0, "ns", rate_samples=[r / 86400.0 for r in rate.samples], unit_count=1)


def test_gromacs(mig_bench: MigBench) -> None:
    metrics = mig_bench.record_all(run_gromacs(mig_bench.target, mig_bench.timer, quick=mig_bench.quick))
    rate = next(m for m in metrics if m.name == "gmx_ns_per_day")
    assert rate.value > 0
    mig_bench.cost(rate.value / 86400.0, "ns", unit_count=1)
