"""A site's own benchmark: one training step of an in-house model, judged every night like the suite.

Run it with the suite's options (the CPU works too, at small sizes):

    pytest examples/own_benchmark --mig-profile 1g.10gb --mig-save-baseline   # the first nights: build history
    pytest examples/own_benchmark --mig-profile 1g.10gb                       # later nights: judged

It gets, with nothing else: the Target pinned and verified (``mig_device``), a CUDA-event timer with
warm-up and repeats (``mig_bench.time``), a history per GPU model and profile, verdicts with
thresholds from its own run-to-run noise, the trend page, reports and exports.
"""

from __future__ import annotations

import pytest
import torch

from pytest_mig.bench import MigBench
from pytest_mig.measure import Metric
from pytest_mig.target import Target


def our_model(width: int) -> torch.nn.Module:
    """Stands in for the site's model: replace with your own."""
    return torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))


@pytest.mark.mig_tolerance(0.10)  # a change beyond 10% fails even where its noise would allow a wider band
@pytest.mark.mig_min_memory(1)  # skipped, with the reason, on a Target with less than 1 GiB
def test_our_training_step(mig_device: Target, mig_bench: MigBench) -> None:
    device = mig_device.device  # the slice, the whole GPU, the emulated profile or the CPU
    width, batch = (1024, 256) if device != "cpu" else (256, 64)
    torch.manual_seed(0)
    model = our_model(width).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)
    target = torch.randn(batch, width, device=device)
    losses: list[float] = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))

    timing = mig_bench.time(step, warmup=3, repeats=20)
    assert losses[-1] < losses[0], "the model does not learn: a fast wrong answer is a failure"
    mig_bench.record(Metric("samples_per_s", batch / timing.median, "samples/s", "higher",
                            [batch / s for s in timing.samples], kind="training"))
    mig_bench.record(Metric("step_ms", timing.median * 1e3, "ms", "lower", [s * 1e3 for s in timing.samples],
                            kind="training"))
