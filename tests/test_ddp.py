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


@pytest.mark.parametrize("max_norm", [1.0, None])
def test_a_rank_clips_the_gradients_as_the_single_gpu_trainer_does(max_norm, monkeypatch: pytest.MonkeyPatch) -> None:
    """rank_step on the CPU (no DDP wrapper: the step around it is the same): a loss scaled so its
    gradients' norm is far over 1 reaches fused AdamW clipped to MAX_GRAD_NORM, seen in AdamW's first
    moment after one step (0.1 x the gradient it was given); with the clip switched off it is not."""
    import torch
    from test_training import _scaled_loss_trainer

    from pytest_mig.workloads import training as tr

    monkeypatch.setattr(tr, "MAX_GRAD_NORM", max_norm)
    trainer = _scaled_loss_trainer("full", fused=True)
    tokens = trainer.task.batch(2)
    loss = ddp.rank_step(trainer.step_model, trainer.params, trainer.opt, tokens, amp=False)
    moment = float(torch.linalg.vector_norm(torch.cat([trainer.opt.state[p]["exp_avg"].flatten()
                                                       for p in trainer.params])))
    if max_norm is None:
        assert moment > 100.0
    else:
        assert moment == pytest.approx(0.1 * max_norm, rel=1e-3)
    assert loss.requires_grad is False and torch.isfinite(loss)
    trainer.close()
