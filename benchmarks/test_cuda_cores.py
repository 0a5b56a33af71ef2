"""CUDA-core peak FLOPS (CERN's "fp16/fp32/fp64, CUDA cores" rows): a compute-bound FMA kernel, not a matmul.

The kernel's result is checked exactly (fp32, fp64) or to rounding (fp16); the record gives TFLOPS
and % of SMs x FMA/clock x 2 x the clock measured during the run.
"""

from __future__ import annotations

import pytest

from pytest_mig.bench import MigBench
from pytest_mig.workloads.fma import FMA_PRECISION_NAMES, run_fma


@pytest.mark.parametrize("dtype", FMA_PRECISION_NAMES)
def test_cuda_core_fma(mig_bench: MigBench, dtype: str) -> None:
    metrics = mig_bench.record_all(run_fma(mig_bench.target, mig_bench.timer, dtype=dtype, quick=mig_bench.quick))
    assert any(m.name == f"{dtype}_fma_tflops" and m.value > 0 for m in metrics), [m.name for m in metrics]
