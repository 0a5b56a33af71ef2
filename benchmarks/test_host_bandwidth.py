"""Host-device bandwidth: H2D, D2H and both at once over the GPU's PCIe link, from pinned memory.

Each figure is set against the link's theoretical rate (generation x width, read under load), so a
link trained down to x8 shows as about 50%.  The copies wait for the host's turn (runs on the host's
other GPUs copy before or after), and a figure measured while the other GPUs moved data is not
judged (pytest_mig.device.host).  Skipped on the CPU: there is no link there.
"""

from __future__ import annotations

from pytest_mig.bench import MigBench
from pytest_mig.workloads.hostcopy import run_host_copies


def test_host_bandwidth(mig_bench: MigBench) -> None:
    metrics = mig_bench.record_all(run_host_copies(mig_bench.target, mig_bench.timer, quick=mig_bench.quick,
                                                   read_link=mig_bench.read_link, neighbours=mig_bench.neighbours,
                                                   turn=not mig_bench.in_layout, lock=mig_bench.host_lock))
    assert all(m.value > 0 for m in metrics if m.unit == "GB/s")
