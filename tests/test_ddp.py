"""DDP scaling on the CPU: the GPU counts, and the checks on the ranks' reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_mig.workloads import WorkloadError, ddp


@pytest.mark.parametrize(("n", "counts"), [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_gpu_counts_double_up_to_every_gpu(n: int, counts: list[int]) -> None:
    assert ddp.gpu_counts(n) == counts


def report(rank: int, tps: float, checksum: str = "1.0e+00") -> dict:
    return {"rank": rank, "world": 1, "steps": 12, "tokens_per_s": tps, "step_rates": [tps] * 12,
            "losses": [10.0 - i * 0.5 for i in range(12)], "param_checksum": checksum, "nvls": "0"}


def test_tokens_per_s_and_scaling_efficiency(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rates = {1: 100_000.0, 2: 190_000.0}
    monkeypatch.setattr(ddp, "run_count", lambda devs, quick, folder: [report(r, rates[len(devs)])
                                                                       for r in range(len(devs))])
    m = {x.name: x for x in ddp.run_ddp_scaling(["GPU-a", "GPU-b"], quick=True, folder=tmp_path)}
    assert m["ddp1_tokens_per_s"].value == 100_000.0 and m["ddp2_tokens_per_s"].value == 190_000.0
    assert m["ddp2_scaling_efficiency"].value == pytest.approx(0.95) and m["ddp2_scaling_efficiency"].compare
    assert m["ddp2_tokens_per_s"].info["nccl_nvls"] == "0"


def test_replicas_that_differ_after_training_are_a_wrong_result(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setattr(ddp, "run_count", lambda devs, quick, folder: [report(r, 1.0, checksum=f"{r}.0")
                                                                       for r in range(len(devs))])
    with pytest.raises(WorkloadError, match="the ranks' parameters differ after training"):
        ddp.run_ddp_scaling(["GPU-a", "GPU-b"], quick=True, folder=tmp_path)


def test_nvlink_multicast_stays_off_unless_the_caller_set_it() -> None:
    assert ddp.NCCL_DEFAULTS == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                 "NVSHMEM_DISABLE_NVLS": "1"}
