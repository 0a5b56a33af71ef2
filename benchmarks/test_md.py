"""Molecular dynamics (Wulver's GROMACS row): a Lennard-Jones fluid in torch, and GROMACS where installed.

The torch fluid (FCC start at density 0.8442 melting to T* ~ 0.72, cutoff 2.5 sigma, Verlet list
with a 0.3 sigma skin, velocity Verlet) is sized to the Target (~8k atoms per SM), checked for
energy and momentum conservation and against float64 all-pairs forces, and records atom-steps/s,
ns/day in argon units (tau = 2.156 ps), ms per step, energy per atom-step and service units per
10^9 atom-steps.  GROMACS runs an argon box of the same density with ``-nb gpu`` on the same
device and reports the ns/day of its log; without a ``gmx`` binary it is skipped with the reason.
"""

from __future__ import annotations

import pytest

from pytest_mig.bench import MigBench
from pytest_mig.workloads.md import PRECISION_NAMES, run_gromacs, run_md


@pytest.mark.parametrize("precision", PRECISION_NAMES)
def test_lj_fluid(mig_bench: MigBench, precision: str) -> None:
    metrics = mig_bench.record_all(run_md(mig_bench.target, mig_bench.timer, precision=precision, quick=mig_bench.quick))
    rate = next(m for m in metrics if m.name == f"lj_{precision}_atom_steps_per_s")
    assert rate.value > 0
    mig_bench.cost(rate.value, "atom-step", rate_samples=rate.samples, unit_count=1e9)


def test_gromacs(mig_bench: MigBench) -> None:
    metrics = mig_bench.record_all(run_gromacs(mig_bench.target, mig_bench.timer, quick=mig_bench.quick))
    rate = next(m for m in metrics if m.name == "gmx_atom_steps_per_s")
    assert rate.value > 0
    mig_bench.cost(rate.value, "atom-step", unit_count=1e9)
