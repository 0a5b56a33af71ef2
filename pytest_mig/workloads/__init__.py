"""Workloads: plain functions, no pytest inside, each sized by the Target and checking its result.

Contract every workload follows:

    def run_<name>(target: Target, timer: Timer, *, quick: bool = False, **options) -> list[Metric]

- Size from ``target.memory_budget()`` and ``target.effective_sms`` (tiny sizes when
  ``target.is_cpu``); use ``target.device`` for tensors.
- Time with ``timer(fn, warmup=..., repeats=...)`` (CUDA events on a GPU); the first call is the
  headline measurement that pytest-benchmark also records.
- Verify the numerical result; on a wrong answer raise :class:`WorkloadError` (the test fails
  whatever the speed).
- Return Metrics with name, value, unit, direction, per-repeat samples and kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_mig.device.target import DoesNotFit as DoesNotFit  # the workloads raise it from here

if TYPE_CHECKING:
    import torch

#: Seconds of GPU time a GEMM headline's timed calls span at least on a GPU, by mode
#: (:mod:`pytest_mig.workloads.gemm`); kept here, beside no torch import, for the replay to tell a
#: headline recorded before it was timed so long (:func:`pytest_mig.night.replay.replaced_headlines`).
HEADLINE_S = {"normal": 2.0, "quick": 0.5}

#: Elements of a result checked for NaN/Inf at a time (see :func:`all_finite`).
FINITE_BLOCK = 1 << 24


class WorkloadError(AssertionError):
    """A workload computed a wrong result (or could not run on this Target for a stated reason)."""


def check_close(name: str, rel_err: float, limit: float) -> None:
    """Fail a workload whose relative error is NaN or above ``limit``."""
    if not (rel_err <= limit):  # also catches NaN
        raise WorkloadError(f"{name}: relative error {rel_err:.3g} exceeds {limit:.3g}: wrong result")


def all_finite(t: torch.Tensor, block: int = FINITE_BLOCK) -> bool:
    """Whether every element of ``t`` is finite, checked ``block`` elements at a time.

    ``torch.isfinite`` on a whole result makes temporaries of several times its size (its absolute
    value and two masks): on an emulated 1g.10gb, the check of a 40960 x 40960 bf16 GEMM output
    (3.1 GiB) ran out of the slice's 9.75 GiB that its operands and output fit with half to spare.
    Checked in blocks, the temporaries stay under a few hundred MB, with one synchronisation.
    """
    import torch

    if t.is_contiguous() or t.dim() < 2:
        parts = t.reshape(-1).split(block)
    else:  # rows at a time: a strided tensor is not copied whole
        parts = t.split(max(1, block // max(1, t[0].numel())))
    ok = torch.ones((), dtype=torch.bool, device=t.device)
    for part in parts:
        ok &= torch.isfinite(part).all()
    return bool(ok)
