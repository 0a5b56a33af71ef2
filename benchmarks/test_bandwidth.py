"""Memory bandwidth: BabelStream's Copy, Mul, Add, Triad and Dot, against a device-to-device copy ceiling.

Arrays are sized to the Target (several times the L2) and every kernel's result is checked against
BabelStream's analytic values.  Under emulation memory bandwidth is not partitioned: the figures
say so and stay out of the scaling checks.
"""

from __future__ import annotations

import pytest

from pytest_mig.bench import MigBench
from pytest_mig.workloads.stream import HEADLINE, STREAM_DTYPES, run_stream


@pytest.mark.parametrize("dtype", tuple(STREAM_DTYPES))
def test_stream(mig_bench: MigBench, dtype: str) -> None:
    metrics = mig_bench.record_all(run_stream(mig_bench.target, mig_bench.timer, dtype=dtype, quick=mig_bench.quick))
    triad = next(m for m in metrics if m.name == f"{dtype}_{HEADLINE}_gbs")
    assert triad.value > 0
