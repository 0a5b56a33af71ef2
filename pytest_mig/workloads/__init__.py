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


class WorkloadError(AssertionError):
    """A workload computed a wrong result (or could not run on this Target for a stated reason)."""


class DoesNotFit(Exception):
    """The workload cannot fit this Target (e.g. a 1.5B model on a 10 GB slice): a skip with the reason."""


def check_close(name: str, rel_err: float, limit: float) -> None:
    """Fail a workload whose relative error is NaN or above ``limit``."""
    if not (rel_err <= limit):  # also catches NaN
        raise WorkloadError(f"{name}: relative error {rel_err:.3g} exceeds {limit:.3g}: wrong result")
