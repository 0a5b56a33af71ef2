"""Multi-GPU training scaling: GPT-2-small with DistributedDataParallel over 1, 2, 4 ... N whole GPUs.

Runs on the GPUs of the allocation (CUDA_VISIBLE_DEVICES where the scheduler set it, else every GPU
of the node with MIG off and of the pinned GPU's model), one process per GPU over NCCL with NVLink
multicast off.  Skipped, with the reason, on one GPU, on MIG slices, under emulation, and inside
``--mig-device all`` (whose workers already use every GPU).
"""

from __future__ import annotations

import os

import pytest

from pytest_mig.device import nvml
from pytest_mig.bench import MigBench
from pytest_mig.device.plan import Plan
from pytest_mig.workloads.ddp import run_ddp_scaling


def allocated_gpus(plan: Plan, model: str | None) -> list[str]:
    """The whole GPUs this job may use: the scheduler's list, or the node's GPUs of this model."""
    visible = nvml.cuda_visible(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if plan.pin is None and visible:  # the scheduler chose them
        return visible
    inv = nvml.discover()
    return [g.uuid for g in inv.gpus if g.mig_enabled is not True and g.name == model and not g.busy_pids]


@pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")  # timed in its ranks
def test_ddp_scaling(mig_bench: MigBench, mig_plan: Plan, tmp_path, pytestconfig: pytest.Config) -> None:
    t = mig_bench.target
    if t.is_cpu or t.kind != "full" or pytestconfig.getoption("mig_node_worker") is not None:
        pytest.skip("DDP scaling trains on whole GPUs of this job: not on the CPU, a MIG slice, an emulated "
                    "profile, or inside --mig-device all (whose workers hold every GPU)")
    gpus = allocated_gpus(mig_plan, t.gpu_name)
    if len(gpus) < 2:
        pytest.skip(f"DDP scaling needs 2 or more free whole GPUs; this job has {len(gpus)}")
    metrics = mig_bench.record_all(run_ddp_scaling(gpus, quick=mig_bench.quick, folder=tmp_path))
    assert all(m.value > 0 for m in metrics)
