"""Particle tracking through an LHC-scale lattice (CERN's "simulation" rows, simpletrack).

One fused Triton kernel tracks every particle through all elements and turns in float64; each run
is checked against the NumPy reference.  Cases: a beam fitted to the Target (16k particles per SM,
10 turns) and CERN's 5M, 10M and 15M particles (one turn per call; the 10-turn time of CERN's
table is recorded alongside), skipped where they do not fit.  Records particle-turns/s,
microseconds per particle-turn (aim on a whole H200: <= 0.1), energy per particle-turn and
service units per 10^9 particle-turns.  Quick mode runs the fitted beam and the 5M case only;
10M and 15M need a 3g-sized Target (60 SMs) or larger.
"""

from __future__ import annotations

import pytest

from pytest_mig.bench import MigBench
from pytest_mig.workloads.tracking import CERN_SIZES, run_tracking

CASES = {"fitted": None, **{f"{n // 1_000_000}M": n for n in CERN_SIZES}}
#: On a small slice CERN's 10M and 15M beams take tens of seconds per measurement and add nothing:
#: the rate per particle-turn does not depend on the beam size (the fitted and 5M cases measure it).
MIN_SMS = {n: 60 for n in CERN_SIZES[1:]}


def _param(name: str, particles: int | None) -> object:
    marks = [pytest.mark.mig_min_sms(MIN_SMS[particles])] if particles in MIN_SMS else []
    return pytest.param(particles, id=name, marks=marks)


@pytest.mark.parametrize("particles", [_param(k, v) for k, v in CASES.items()])
def test_tracking(mig_bench: MigBench, particles: int | None) -> None:
    if mig_bench.quick and particles not in (None, CERN_SIZES[0]):
        pytest.skip(f"quick mode: {particles:,} particles are tracked in the full run only")
    metrics = mig_bench.record_all(run_tracking(mig_bench.target, mig_bench.timer, particles=particles,
                                                quick=mig_bench.quick))
    rate = next(m for m in metrics if m.name == "particle_turns_per_s")
    assert rate.value > 0
    mig_bench.cost(rate.value, "particle-turn", rate_samples=rate.samples, unit_count=1e9)
