"""Tensor-core and FP32/FP64 matmul TFLOPS per precision (Wulver's matmul table, CERN's tensor-core rows).

Each test sweeps square sizes that fit the Target, times the best one through pytest-benchmark with
CUDA events, verifies the product against float64 and records TFLOPS, the size and memory at the
peak, % of the Target's theoretical peak, energy per TFLOP and service units per 1M TFLOP.
"""

from __future__ import annotations

import pytest

from pytest_mig.bench import MigBench
from pytest_mig.workloads.gemm import PRECISION_NAMES, run_gemm


@pytest.mark.parametrize("dtype", PRECISION_NAMES)
def test_gemm(mig_bench: MigBench, dtype: str) -> None:
    metrics = mig_bench.record_all(run_gemm(mig_bench.target, mig_bench.timer, dtype=dtype, quick=mig_bench.quick,
                                            size=mig_bench.size_of(f"{dtype}_tflops")))
    tflops = next(m for m in metrics if m.name == f"{dtype}_tflops")
    assert tflops.value > 0
    mig_bench.cost(tflops.value, "TFLOP", rate_samples=tflops.samples, unit_count=1e6)
