"""The training workload on the CPU: the transformers models it builds, peft's LoRA and the QLoRA
wiring, record shape, the loss checks, MFU arithmetic, memory planning and the max-batch search.

Nothing here measures speed.  The CPU runs the CPU-sized models (2 layers, d=64) in fp32; GPU-only
paths are exercised through pure functions (memory estimates against 10 GB and 141 GB Targets, MFU
on a 16-SM slice from a fake timing, the batch search against a fake out-of-memory predicate).
QLoRA needs bitsandbytes' CUDA kernels: its settings are checked here, its run on the GPU.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from pytest_mig.measure import Metric, Telemetry, Timer, Timing, timing_partners
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError
from pytest_mig.workloads import hf
from pytest_mig.workloads import training as tr

GIB = 2**30


def _slice(memory_gib: float, sms: int, *, kind: str = "mig", profile: str = "1g.10gb",
           gpu: str = "NVIDIA H100 80GB HBM3") -> Target:
    """A GPU Target that is never touched: only its numbers are read."""
    return Target(kind=kind, profile=profile, chosen_by="test", gpu_name=gpu, sms=sms,
                  memory_bytes=int(memory_gib * GIB), compute_capability=(9, 0))


H100_1G = dict(memory_gib=9.75, sms=16)
A100_1G5 = dict(memory_gib=4.75, sms=14, profile="1g.5gb", gpu="NVIDIA A100-SXM4-40GB")
H200_1G = dict(memory_gib=16.0, sms=16, profile="1g.18gb", gpu="NVIDIA H200")
H200_FULL = dict(memory_gib=139.8, sms=132, kind="full", profile="full", gpu="NVIDIA H200")


# --- record shape --------------------------------------------------------------------------------


@pytest.mark.parametrize("config, mode, batch", [("gpt2-small", "full", "fixed"), ("gpt2-small", "lora", "fixed"),
                                                 ("qwen1.5b", "lora", "maxbatch")])
def test_training_record_on_cpu(cpu, timer, config, mode, batch):
    metrics = tr.run_training(cpu, timer, config=config, mode=mode, batch=batch, quick=True)
    by_name = {m.name: m for m in metrics}
    assert len(by_name) == len(metrics), "metric names must be unique within a test"
    assert set(by_name) == {"tokens_per_s", "step_time_s", "step_time_p95_s", "batch_size", "peak_allocated_gb",
                            "peak_reserved_gb", "trainable_params"}  # no MFU: the CPU has no datasheet peak
    effort = tr.EFFORT[("cpu", True, batch)]
    cfg = tr.CONFIGS[config].tiny()

    tok, step = by_name["tokens_per_s"], by_name["step_time_s"]
    assert (tok.unit, tok.direction, tok.kind, tok.compare) == ("tokens/s", "higher", "training", True)
    if batch == "maxbatch":  # its batch is found anew on each stack and night, and a step's time grows with it
        assert (step.unit, step.direction, step.kind, step.compare) == ("s", "lower", "info", False)
    else:
        assert (step.unit, step.direction, step.kind, step.compare) == ("s", "lower", "training", True)
    assert len(step.samples) == len(tok.samples) == effort.repeats
    n_batch = int(by_name["batch_size"].value)
    tokens = n_batch * cfg.seq_len
    assert tok.samples == pytest.approx([tokens / s for s in step.samples])
    assert step.value == pytest.approx(sorted(step.samples)[len(step.samples) // 2], rel=0.5)
    assert by_name["step_time_p95_s"].value >= step.value
    for m in metrics:
        m.to_dict()  # serialisable
        if m.kind == "info":
            assert not m.compare
    assert by_name["peak_allocated_gb"].unit == by_name["peak_reserved_gb"].unit == "GB"
    assert "estimate" in by_name["peak_allocated_gb"].info["source"]

    info = tok.info
    assert info["config"] == cfg.name and info["mode"] == mode and info["batch"] == n_batch
    assert info["precision"] == "fp32" and info["steps"] == effort.repeats
    # where the case's seconds went (model, batch, timer): what the night's time is tuned from
    assert set(info["phases_s"]) == {"build", "batch", "timer"} and all(v >= 0 for v in info["phases_s"].values())
    assert info["loss_drop"] >= tr.MIN_LOSS_DROP and info["loss_last"] < info["loss_first"]
    assert abs(info["initial_loss"] - math.log(cfg.vocab)) <= tr.INITIAL_LOSS_TOLERANCE * math.log(cfg.vocab)
    if batch == "maxbatch":
        search = by_name["batch_size"].info["search"]
        assert search["batch"] == n_batch and search["tried"][-1] == [n_batch, True]
        assert n_batch == effort.max_batch and search["capped"]  # the 2 GiB CPU budget holds far more
    else:
        assert n_batch == cfg.fixed_batch


def test_energy_per_token_from_board_power(cpu):
    timer = Timer("cpu", Telemetry(read_power_w=lambda: 100.0, interval=0.005, window_s=0.05))
    metrics = tr.run_training(cpu, timer, config="gpt2-small", mode="full", quick=True)
    by_name = {m.name: m for m in metrics}
    tokens = by_name["step_time_s"].info["tokens_per_step"]
    energy = by_name["energy_j_per_token"]
    assert energy.unit == "J/token" and energy.direction == "lower" and energy.kind == "energy"
    window = energy.info
    assert window["calls"] >= 1
    assert energy.value == pytest.approx(100.0 * window["window_s"] / window["calls"] / tokens, rel=0.05)
    assert by_name["power_w"].value == pytest.approx(100.0) and not by_name["power_w"].compare


@pytest.mark.parametrize("batch, partners", [("fixed", ["tokens_per_s", "step_time_s"]),
                                             ("maxbatch", ["tokens_per_s"])])
def test_energy_per_token_shares_the_timing_of_the_rate_figures_its_case_compares(cpu, batch, partners):
    """At the largest batch the step time is informational, so J/token is never judged as loosely as it."""
    timer = Timer("cpu", Telemetry(read_power_w=lambda: 100.0, interval=0.005, window_s=0.05))
    metrics = tr.run_training(cpu, timer, config="gpt2-small", mode="full", batch=batch, quick=True)
    assert timing_partners("energy_j_per_token", "energy", [(m.name, m.kind) for m in metrics]) == partners


def test_measured_losses_are_the_repeats_before_the_energy_window():
    # 3 warm-up, 2 more calls (pytest-benchmark's estimate), 4 measured, 5 in the energy window
    losses = [10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.5, 1.4, 1.3, 1.2, 1.1]
    assert tr.measured_losses(losses, 4, 5) == [5.0, 4.0, 3.0, 2.0]
    assert tr.measured_losses(losses, 4, 0) == [1.4, 1.3, 1.2, 1.1]
    with pytest.raises(ValueError, match="cannot hold"):
        tr.measured_losses(losses[:6], 4, 5)


class _KeepBusy:
    """A layout's pace: 25 untimed steps after each timed call (as while slower slices time theirs)."""

    def timing(self):
        pass

    def timed(self, busy):
        for _ in range(25):
            busy()


def test_the_untimed_steps_of_a_layout_slice_are_not_taken_for_the_measured_ones(cpu):
    def losses(pace):
        timer = Timer("cpu", pace=pace)
        timer.window_batch_s = 0.0  # one step per busy batch
        metrics = tr.run_training(cpu, timer, config="gpt2-small", mode="full", quick=True)
        info = next(m for m in metrics if m.name == "tokens_per_s").info
        return info["loss_first"], info["loss_last"], info["steps"]

    assert losses(_KeepBusy()) == losses(None)  # the same seeded steps were measured


# --- a model that does not train fails -----------------------------------------------------------


def test_zero_learning_rate_fails_the_loss_check(cpu, timer, monkeypatch):
    monkeypatch.setitem(tr.LR_CPU, "full", 0.0)
    with pytest.raises(WorkloadError, match="did not fall"):
        tr.run_training(cpu, timer, config="gpt2-small", mode="full", quick=True)


def test_an_optimizer_step_that_does_nothing_fails(cpu, timer, monkeypatch):
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, closure=None: None)
    with pytest.raises(WorkloadError, match="did not fall"):
        tr.run_training(cpu, timer, config="qwen1.5b", mode="lora", quick=True)


def test_adapters_whose_update_never_reaches_the_output_fail(cpu, timer, monkeypatch):
    from peft.tuners.lora import LoraModel

    real = LoraModel.__init__

    def muted(self, *args, **kwargs):  # every adapter's scaling at zero: B A x never reaches the output
        real(self, *args, **kwargs)
        for module in self.model.modules():
            if hasattr(module, "scaling") and isinstance(module.scaling, dict):
                module.scaling = {k: 0.0 for k in module.scaling}

    monkeypatch.setattr(LoraModel, "__init__", muted)
    with pytest.raises(WorkloadError, match="did not fall"):
        tr.run_training(cpu, timer, config="gpt2-small", mode="lora", quick=True)


def test_a_wrong_loss_fails_the_chance_check(cpu, timer, monkeypatch):
    real = tr._Trainer.step

    def tripled(self, tokens):  # the first step's loss read three times too high
        first = self.first_loss is None
        loss = real(self, tokens)
        if first:
            self.first_loss *= 3.0
        return loss

    monkeypatch.setattr(tr._Trainer, "step", tripled)
    with pytest.raises(WorkloadError, match="untrained model"):
        tr.run_training(cpu, timer, config="gpt2-small", mode="full", quick=True)


def _scaled_loss_trainer(mode: str, *, fused: bool, scale: float = 1e4) -> tr._Trainer:
    """A CPU trainer whose loss is multiplied by ``scale``, so its gradients' norm is far over 1."""
    torch.manual_seed(0)
    trainer = tr._Trainer(tr.CONFIGS["gpt2-small"].tiny(), mode, "cpu", fused=fused)
    model = trainer.model
    trainer.step_model = lambda **kw: SimpleNamespace(loss=model(**kw).loss * scale)
    return trainer


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_gradients_are_clipped_before_the_optimizer_step(mode, monkeypatch):
    """The Trainer's max_grad_norm (unfused AdamW): whatever the loss's scale, AdamW sees a norm of at most 1."""
    seen: list[float] = []
    real_step = torch.optim.AdamW.step

    def recording(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return real_step(self, closure)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording)
    trainer = _scaled_loss_trainer(mode, fused=False)
    tokens = trainer.task.batch(2)
    trainer.step(tokens)
    assert seen[-1] == pytest.approx(tr.MAX_GRAD_NORM, rel=1e-3)
    trainer.max_grad_norm = None  # the same step unclipped: the scaled loss's gradients are large
    trainer.step(tokens)
    assert seen[-1] > 10 * tr.MAX_GRAD_NORM
    trainer.close()


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_fused_adamw_clips_as_clip_grad_norm_does(mode):
    """GPU path: the clip folded into fused AdamW's grad_scale feeds AdamW the gradients clip_grad_norm_ makes.

    Compared through AdamW's first moment after one step (0.1 x the gradient it was given); the
    weights themselves are no test: Adam's first update is about lr x sign(gradient) whatever its scale.
    """
    fused, plain = _scaled_loss_trainer(mode, fused=True), _scaled_loss_trainer(mode, fused=True)
    plain.clip_gradients = lambda: torch.nn.utils.clip_grad_norm_(plain.params, tr.MAX_GRAD_NORM)  # scales the grads
    unclipped = _scaled_loss_trainer(mode, fused=True)
    unclipped.max_grad_norm = None
    tokens = plain.task.batch(2)
    for trainer in (fused, plain, unclipped):
        trainer.step(tokens)

    def first_moments(trainer):
        return torch.cat([trainer.opt.state[p]["exp_avg"].flatten() for p in trainer.params])

    clipped = first_moments(plain)
    torch.testing.assert_close(first_moments(fused), clipped, rtol=1e-5, atol=1e-12)
    assert float(torch.linalg.vector_norm(clipped)) == pytest.approx(0.1 * tr.MAX_GRAD_NORM, rel=1e-3)
    assert float(torch.linalg.vector_norm(first_moments(unclipped))) > 100 * tr.MAX_GRAD_NORM  # could fail
    for trainer in (fused, plain, unclipped):
        trainer.close()


def test_check_loss():
    assert tr.check_loss([6.0, 5.9, 5.0, 4.0, 3.1, 3.0]) == pytest.approx((5.95 - 3.05) / 5.95)
    with pytest.raises(WorkloadError, match="did not fall"):
        tr.check_loss([5.0, 5.01, 4.99, 5.0, 4.98, 4.97])  # under 5%: noise, not training
    with pytest.raises(WorkloadError, match="did not fall"):
        tr.check_loss([3.0, 3.5, 4.0, 4.5, 5.0, 5.5])  # diverging
    with pytest.raises(WorkloadError, match="non-finite"):
        tr.check_loss([5.0, 4.0, float("nan"), 2.0, 1.0, 0.5])
    with pytest.raises(ValueError, match="at least 3"):
        tr.check_loss([5.0, 4.0])


def test_check_initial_loss():
    tr.check_initial_loss(math.log(50304) * 1.05, 50304)
    with pytest.raises(WorkloadError, match="chance is ln"):
        tr.check_initial_loss(0.5, 50304)


# --- MFU -------------------------------------------------------------------------------------------


def test_flops_per_token_by_hand():
    cfg = tr.CONFIGS["gpt2-small"]
    per_block = 768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768
    n = 12 * per_block + 50304 * 768
    assert cfg.matmul_params() == n == 123_568_128
    attention = 12 * 12 * 768 * 1024
    assert tr.model_flops_per_token(cfg, "full") == 6 * n + attention
    n_lora = 12 * 16 * ((768 + 2304) + (768 + 768) + (768 + 3072) + (3072 + 768))
    assert tr.lora_params(cfg) == n_lora == 2_359_296
    assert tr.model_flops_per_token(cfg, "lora") == 4 * n + 6 * n_lora + attention

    qwen = tr.CONFIGS["qwen1.5b"]  # 12 query heads of 128, 2 key/value heads: q 1536, k and v 256 each
    q_block = 1536 * 1536 + 2 * 1536 * 256 + 1536 * 1536 + 2 * 1536 * 8960 + 8960 * 1536
    assert qwen.matmul_params() == 28 * q_block + 151936 * 1536
    q_lora = 28 * 16 * (2 * (1536 + 1536) + 2 * (1536 + 256) + 2 * (1536 + 8960) + (8960 + 1536))
    assert tr.lora_params(qwen) == q_lora  # one adapter per q, k, v, o, gate, up, down projection


def test_mfu_on_a_slice_uses_its_share_of_the_datasheet():
    target = _slice(**H100_1G)
    cfg = tr.CONFIGS["gpt2-small"]
    tokens = 4 * 1024
    run = tr._Run(batch=4, timing=Timing(samples=[tokens / 50_000.0] * 5), losses=[], peak_allocated=5e9,
                  peak_reserved=6e9, memory_source="test", estimate=tr.estimate_memory(cfg, "full", 4), search=None)
    info = {"batch_policy": "fixed"}
    by_name = {m.name: m for m in tr._metrics(target, cfg, "full", run, info, 124_000_000)}
    assert by_name["tokens_per_s"].value == pytest.approx(50_000.0)
    peak = 989.0 * 16 / 132  # H100 SXM bf16 dense, 16 of 132 SMs
    flops = 6 * 123_568_128 + 12 * 12 * 768 * 1024
    mfu = by_name["mfu_pct"]
    assert mfu.value == pytest.approx(100 * 50_000.0 * flops / (peak * 1e12))
    assert mfu.unit == "%" and mfu.kind == "info" and not mfu.compare
    assert mfu.info["peak_tflops"] == pytest.approx(peak)
    assert by_name["peak_reserved_gb"].value == pytest.approx(6.0)
    assert tr.mfu_percent(1e6, 1e9, 1000.0) == pytest.approx(100.0)


# --- memory planning -------------------------------------------------------------------------------


def test_full_fine_tune_memory_by_hand():
    cfg = tr.CONFIGS["gpt2-small"].tiny()
    est = tr.estimate_memory(cfg, "full", 4, cpu=True)
    n = cfg.param_count()
    assert est.weights == 4 * n and est.gradients == 4 * n and est.optimizer == 8 * n
    assert est.logits == 4 * cfg.seq_len * cfg.vocab * tr.LOGIT_BYTES
    assert est.activations == pytest.approx(4 * cfg.seq_len * tr.activation_bytes_per_token(cfg, "full", cpu=True))
    gpu = tr.estimate_memory(cfg, "full", 4)
    assert gpu.weights == 4 * n + 2 * cfg.matmul_params()  # autocast's bf16 copies
    lora = tr.estimate_memory(cfg, "lora", 4)
    assert lora.gradients == 4 * tr.lora_params(cfg) and lora.optimizer == 8 * tr.lora_params(cfg)
    assert lora.weights < gpu.weights


@pytest.mark.parametrize("config, mode, target_kw, fits", [
    ("qwen1.5b", "full", H200_1G, False),  # ~16 bytes per parameter: 25 GB before any activation
    ("qwen1.5b", "full", H200_FULL, True),
    ("qwen1.5b", "lora", A100_1G5, False),
    ("qwen1.5b", "lora", H200_1G, True),
    ("qwen1.5b", "qlora", H100_1G, True),
    ("qwen1.5b", "qlora", A100_1G5, False),
    ("gpt2-small", "full", H100_1G, True),  # the fixed GPT-2 cases run on every slice
    ("gpt2-small", "lora", H100_1G, True),
])
def test_fixed_batches_fit_where_they_should(config, mode, target_kw, fits):
    cfg = tr.CONFIGS[config]
    budget = _slice(**target_kw).memory_budget()
    if fits:
        est = tr.check_fits(cfg, mode, cfg.fixed_batch, budget)
        assert est.total <= tr.usable_bytes(budget)
    else:
        with pytest.raises(DoesNotFit, match=rf"{config} {mode} fine-tune at batch {cfg.fixed_batch} x "):
            tr.check_fits(cfg, mode, cfg.fixed_batch, budget)


def test_does_not_fit_is_raised_before_anything_is_allocated(timer, monkeypatch):
    def no_allocation(*args, **kwargs):
        raise AssertionError("the model was built although the estimate says it cannot fit")

    monkeypatch.setattr(tr._Trainer, "__init__", no_allocation)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DoesNotFit, match=r"needs about .* GB .* but this Target has 9\.8 GiB"):
        tr.run_training(_slice(**H100_1G), timer, config="qwen1.5b", mode="full")
    with pytest.raises(DoesNotFit, match="at batch 1 x 512"):  # maxbatch: not even one sequence
        tr.run_training(_slice(memory_gib=4.0, sms=16), timer, config="qwen1.5b", mode="lora", batch="maxbatch")


def test_out_of_memory_at_run_time_is_a_skip_with_the_reason(cpu, timer, monkeypatch):
    def oom(self, tokens):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 30.70 GiB")

    monkeypatch.setattr(tr._Trainer, "step", oom)
    with pytest.raises(DoesNotFit, match="ran out of memory .* Tried to allocate 30.70 GiB"):
        tr.run_training(cpu, timer, config="gpt2-small", mode="full", quick=True)


# --- max-batch search ------------------------------------------------------------------------------


def _fits_up_to(threshold: int, error: type[BaseException] = torch.OutOfMemoryError):
    calls: list[int] = []

    def try_batch(b: int) -> None:
        calls.append(b)
        if b > threshold:
            raise error(f"CUDA out of memory at batch {b}")

    return try_batch, calls


@pytest.mark.parametrize("threshold", [1, 3, 7, 100, 129, 255])
@pytest.mark.parametrize("resolution", [0.0, 0.125])
def test_max_batch_search_finds_the_threshold(threshold, resolution):
    try_batch, calls = _fits_up_to(threshold)
    oom_cleanups = []
    found = tr.max_batch_search(try_batch, start=4, limit=256, resolution=resolution,
                                after_oom=lambda: oom_cleanups.append(1))
    assert found.batch <= threshold < found.batch + max(1, int(found.batch * resolution))
    if resolution == 0.0:
        assert found.batch == threshold
    assert not found.capped
    assert [b for b, _ in found.tried] == calls
    assert all(ok == (b <= threshold) for b, ok in found.tried)
    assert len(oom_cleanups) == sum(not ok for _, ok in found.tried)
    assert len(calls) <= 2 * math.log2(256) + 2  # doubling then bisection, not a linear scan


def test_max_batch_search_stops_at_the_limit():
    try_batch, calls = _fits_up_to(10_000)
    found = tr.max_batch_search(try_batch, start=3, limit=40)
    assert found.batch == 40 and found.capped and calls == [3, 6, 12, 24, 40]


def test_max_batch_search_counts_cublas_and_runtime_oom_messages():
    for message in ("CUDA error: out of memory", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"):
        def try_batch(b: int, message: str = message) -> None:
            if b > 5:
                raise RuntimeError(message)

        assert tr.max_batch_search(try_batch, limit=64, resolution=0.0).batch == 5


def test_max_batch_search_lets_other_errors_through():
    def broken(b: int) -> None:
        if b > 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        tr.max_batch_search(broken, limit=64)


def test_max_batch_search_when_nothing_fits():
    try_batch, calls = _fits_up_to(0)
    with pytest.raises(DoesNotFit, match="not even one sequence"):
        tr.max_batch_search(try_batch, start=8, limit=64)
    assert calls == [8, 4, 2, 1]


# --- the compiled step's batch, grown from the eager search's ---------------------------------------


GB = 1e9


def _grow(threshold: int, **kw):
    try_batch, calls = _fits_up_to(threshold)
    cleanups = []
    args = dict(start=10, resting_bytes=20 * GB, peak_bytes=40 * GB, room_bytes=100 * GB, limit=256)
    args.update(kw)
    grown = tr.grow_batch(try_batch, after_oom=lambda: cleanups.append(1), **args)
    return grown, calls, cleanups


def test_grow_batch_projects_from_the_compiled_steps_memory():
    # 2 GB per sequence above 20 GB of weights and optimizer state; 95% of the 80 GB left holds 38.
    grown, calls, cleanups = _grow(50)
    assert (grown.start, grown.projected, grown.batch) == (10, 38, 38)
    assert grown.per_sequence_bytes == pytest.approx(2 * GB)
    assert calls == [38] and grown.tried == [(38, True)] and not cleanups
    assert grown.to_dict() == {"start": 10, "projected": 38, "batch": 38, "per_sequence_gb": 2.0, "tried": [[38, True]],
                               "remembered": False}


def test_grow_batch_falls_back_halfway_then_to_the_start():
    grown, calls, cleanups = _grow(30)
    assert grown.batch == 24 and calls == [38, 24] and grown.tried == [(38, False), (24, True)] and cleanups == [1]
    grown, calls, cleanups = _grow(15)
    assert grown.batch == 10 and calls == [38, 24] and len(cleanups) == 2  # the start ran already: not tried again


def test_grow_batch_keeps_the_start_where_nothing_more_is_projected():
    for kw in (dict(peak_bytes=104 * GB),  # 8.4 GB a sequence: 95% of 80 GB holds 9
               dict(peak_bytes=20 * GB),  # no memory per sequence measured
               dict(room_bytes=15 * GB)):  # the weights alone fill the room
        grown, calls, _ = _grow(1000, **kw)
        assert grown.batch == 10 and calls == [] and grown.tried == []


def test_grow_batch_respects_the_limit_and_tries_a_size_once():
    grown, calls, _ = _grow(1000, limit=16)
    assert grown.projected == 16 and grown.batch == 16 and calls == [16]
    grown, calls, _ = _grow(10, limit=11)  # projected 11, halfway 10 is the start: one try only
    assert grown.batch == 10 and calls == [11]


def test_grow_batch_lets_other_errors_through():
    def broken(b: int) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        tr.grow_batch(broken, start=10, resting_bytes=20 * GB, peak_bytes=40 * GB, room_bytes=100 * GB, limit=256)


def test_moments_reset_in_place_train_as_a_fresh_optimizer_does():
    """After the batch search's probes (learning rate 0, moments built), the measured run's optimizer
    starts as a fresh one would: its moments zeroed where they lie, so the first step is the same."""
    cfg = tr.CONFIGS["gpt2-small"].tiny()
    probed, fresh = tr._Trainer(cfg, "full", "cpu"), tr._Trainer(cfg, "full", "cpu")
    probed.probe(2, steps=2)
    before = {id(v): v for st in probed.opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)}
    assert any(v.abs().sum() > 0 for v in before.values())  # the probes left moments behind
    probed.reset_moments()
    after = [v for st in probed.opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    assert all(id(v) in before and not v.any() for v in after)  # the same tensors, zeroed
    assert all(torch.equal(a, b) for a, b in zip(probed.model.parameters(), fresh.model.parameters()))
    tokens = probed.task.batch(2)
    probed.step(tokens)
    fresh.step(tokens)
    for a, b in zip(probed.model.parameters(), fresh.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    probed.close()
    fresh.close()


def test_compiled_cases_have_ids_of_their_own():
    from benchmarks.test_training import CASES

    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids)
    compiled = [c.id for c in CASES if c.compiled]
    assert compiled == ["gpt2-small-full-compiled-maxbatch", "qwen1.5b-full-compiled-maxbatch"]
    assert not any(i.endswith("-maxbatch-compiled") for i in ids)  # the old ids ran at the eager batch


def test_is_oom():
    assert tr.is_oom(torch.OutOfMemoryError("x"))
    assert tr.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not tr.is_oom(RuntimeError("shape mismatch"))
    assert not tr.is_oom(ValueError("out of memory"))  # not a runtime error: a bug, not the device


# --- the models transformers builds, LoRA through peft, QLoRA's settings ---------------------------


@pytest.mark.parametrize("config, expected", [("gpt2-small", 2 * 16 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))),
                                              ("qwen1.5b", 2 * 16 * (2 * (64 + 64) + 2 * (64 + 32) + 2 * (64 + 172) + (172 + 64)))])
def test_lora_trains_only_the_adapters(config, expected):
    cfg = tr.CONFIGS[config].tiny()
    model = hf.build_model(cfg, "cpu", torch.float32, seed=0)
    tokens = tr.CycleTask(cfg.vocab, cfg.seq_len, "cpu").batch(2)
    with torch.no_grad():
        before = model(input_ids=tokens, labels=tokens).loss
    base = {name: p.detach().clone() for name, p in model.named_parameters()}

    model = hf.add_lora(model, cfg)
    assert hf.trainable_count(model) == expected == tr.lora_params(cfg)
    with torch.no_grad():
        assert model(input_ids=tokens, labels=tokens).loss == pytest.approx(float(before))  # B = 0: starts at the base
    model(input_ids=tokens, labels=tokens).loss.backward()
    with_grad = {name for name, p in model.named_parameters() if p.grad is not None}
    assert with_grad == {name for name, p in model.named_parameters() if "lora_" in name}
    assert len(with_grad) == 2 * len(cfg.projections()) * cfg.n_layers  # A and B of every projection
    assert all(float(p.grad.abs().sum()) > 0 for name, p in model.named_parameters() if "lora_B" in name)
    frozen = {name.replace("base_model.model.", "").replace(".base_layer", ""): p
              for name, p in model.named_parameters() if "lora_" not in name}
    assert set(frozen) == set(base)
    assert all(not p.requires_grad for p in frozen.values())


def test_lora_run_reports_the_adapter_count(cpu, timer):
    metrics = tr.run_training(cpu, timer, config="gpt2-small", mode="lora", quick=True)
    by_name = {m.name: m for m in metrics}
    cfg = tr.CONFIGS["gpt2-small"].tiny()
    assert by_name["trainable_params"].value == tr.lora_params(cfg)
    info = by_name["tokens_per_s"].info
    assert info["lora_rank"] == tr.LORA.rank and info["lora_targets"] == ["c_attn", "c_proj", "c_fc"]
    assert set(info["engine"]) == {"transformers", "peft"} and not info["gradient_checkpointing"]


@pytest.mark.parametrize("config", tr.CONFIG_NAMES)
def test_transformers_builds_the_published_shapes(config):
    cfg = tr.CONFIGS[config]
    with torch.device("meta"):  # the real sizes, without the memory
        model = hf.build_model(cfg, "meta", torch.float32, seed=0)
    assert sum(p.numel() for p in model.parameters()) == cfg.param_count()
    assert type(model).__name__ == {"gpt2": "GPT2LMHeadModel", "qwen2": "Qwen2ForCausalLM"}[cfg.layout]
    assert model.config._attn_implementation == hf.ATTENTION and model.config.use_cache is False
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied
    tiny = hf.build_model(cfg.tiny(), "cpu", torch.float32, seed=0)
    assert sum(p.numel() for p in tiny.parameters()) == cfg.tiny().param_count()
    names = {n.rsplit(".", 1)[-1] for n, _ in tiny.named_modules()}
    assert set(hf.LORA_TARGETS[cfg.layout]) <= names  # every LoRA target exists in the model


def _sdpa_calls(model, tokens):
    """The scaled_dot_product_attention calls of ``model`` as torch.compile traces it (dynamo, no inductor)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(model, backend=backend, fullgraph=False)(input_ids=tokens)
    finally:
        torch._dynamo.reset()
    return [n for gm in graphs for n in gm.graph.nodes
            if n.op == "call_function" and "scaled_dot_product_attention" in str(n.target)]


@pytest.mark.parametrize("config", tr.CONFIG_NAMES)
def test_compiled_attention_is_causal_sdpa_without_a_mask_tensor(config):
    """Under torch.compile transformers' own "sdpa" makes a 4-D mask (torch < 2.14), which keeps SDPA
    off its fastest flash kernel (on an H100 it doubled GPT-2's attention time); the models are built
    so that every attention call is is_causal with no mask, and compute what transformers' sdpa does."""
    cfg = tr.CONFIGS[config].tiny()
    model = hf.build_model(cfg, "cpu", torch.float32, seed=0).eval()
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    calls = _sdpa_calls(model, tokens)
    assert len(calls) == cfg.n_layers
    for node in calls:
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        assert mask is None and node.kwargs.get("is_causal") is True
    import transformers

    torch.manual_seed(0)
    with torch.device("cpu"):
        theirs = transformers.AutoModelForCausalLM.from_config(hf.hf_config(cfg), attn_implementation="eager",
                                                               dtype=torch.float32).eval()
    theirs.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=tokens).logits, theirs(input_ids=tokens).logits,
                                   rtol=1e-4, atol=1e-4)


def test_the_same_seed_builds_the_same_model():
    cfg = tr.CONFIGS["qwen1.5b"].tiny()
    a, b = (hf.build_model(cfg, "cpu", torch.float32, seed=7) for _ in range(2))
    c = hf.build_model(cfg, "cpu", torch.float32, seed=8)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_published_model_sizes():
    assert 124e6 < tr.CONFIGS["gpt2-small"].param_count() < 125e6  # GPT-2 small: 124M (vocabulary padded)
    assert 1.5e9 < tr.CONFIGS["qwen1.5b"].param_count() < 1.6e9  # Qwen2.5-1.5B: 1.54B


@pytest.mark.skipif(not hf.installed("transformers"), reason="transformers is not installed")
def test_qlora_is_wulvers_setting():
    q = hf.qlora_quantization()
    assert q.load_in_4bit and not q.load_in_8bit
    assert q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_compute_dtype == torch.bfloat16
    lc = hf.lora_config(tr.CONFIGS["qwen1.5b"])
    assert (lc.r, lc.lora_alpha, lc.lora_dropout, lc.bias) == (16, 32, 0.0, "none")
    assert set(lc.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert hf.lora_config(tr.CONFIGS["gpt2-small"]).fan_in_fan_out  # GPT-2's Conv1D weights are transposed


def test_qlora_memory_counts_fp32_casts_and_checkpointing():
    cfg = tr.CONFIGS["qwen1.5b"]
    q, lo = tr.estimate_memory(cfg, "qlora", 2), tr.estimate_memory(cfg, "lora", 2)
    n_other = cfg.param_count() - (cfg.matmul_params() - cfg.vocab * cfg.d_model)
    assert q.weights > 4.0 * n_other  # the embedding and norms in fp32 (prepare_model_for_kbit_training)
    assert q.weights < lo.weights  # NF4 projections
    assert q.activations < lo.activations / 5  # gradient checkpointing keeps one layer's activations
    assert q.gradients == lo.gradients and q.optimizer == lo.optimizer


def test_cycle_task_is_a_function_of_the_current_token():
    task = tr.CycleTask(vocab=1000, seq_len=50, device="cpu", alphabet=37)
    tokens = task.batch(16)
    assert tokens.shape == (16, 50) and tokens.dtype == torch.int64
    successor = {}
    for row in tokens.tolist():
        for a, b in zip(row, row[1:]):
            assert successor.setdefault(a, b) == b
    assert set(successor) <= set(task.cycle.tolist()) and len(task.cycle) == 37
    assert len(set(tokens[:, 0].tolist())) > 1  # sequences start at different points


# --- what cannot run -------------------------------------------------------------------------------


def test_unknown_names(cpu, timer):
    with pytest.raises(ValueError, match="unknown training config 'gpt5'"):
        tr.run_training(cpu, timer, config="gpt5")
    with pytest.raises(ValueError, match="unknown training mode 'dora'"):
        tr.run_training(cpu, timer, mode="dora")
    with pytest.raises(ValueError, match="unknown batch policy 'huge'"):
        tr.run_training(cpu, timer, batch="huge")


def test_qlora_and_compile_need_what_they_need(cpu, timer, monkeypatch):
    with pytest.raises(DoesNotFit, match="QLoRA needs bitsandbytes' 4-bit CUDA kernels; this run is on the CPU"):
        tr.run_training(cpu, timer, mode="qlora")
    with pytest.raises(DoesNotFit, match="GPUs only"):
        tr.run_training(cpu, timer, compile_model=True)
    monkeypatch.setattr(hf, "installed", lambda module: module != "bitsandbytes")
    with pytest.raises(DoesNotFit, match=r"^qlora training needs bitsandbytes, which is not installed: "
                                         r"pip install 'pytest-mig\[qlora\]'"):
        tr.check_runnable(_slice(**H100_1G), "qlora")
    tr.check_runnable(_slice(**H100_1G), "lora")  # LoRA does not need it


def test_missing_engines_name_the_pip_line(monkeypatch):
    monkeypatch.setattr(hf, "installed", lambda module: False)
    assert hf.missing("full") == "full training needs transformers, which is not installed: pip install transformers peft"
    assert hf.missing("qlora").startswith("qlora training needs transformers, peft, bitsandbytes, which are not installed")
    monkeypatch.setattr(hf, "installed", lambda module: True)
    assert hf.missing("qlora") is None


def test_metric_kinds_are_known():
    for kind in ("training", "info", "energy"):
        Metric("x", 1.0, "u", kind=kind)  # raises if the measure module does not know the kind


def test_the_record_counts_the_graphs_torch_compile_made():
    """``compiled_graphs`` in a compiled case's info: a first night's growth compiles a second static batch
    (two graphs where a second night, its batch remembered, makes one)."""
    f = torch.compile(lambda x: (x * 2).sum(), backend="eager", dynamic=False)
    before = tr._compiled_graphs()
    f(torch.ones(3))
    f(torch.ones(3))  # the same shape: no new graph
    assert tr._compiled_graphs() - before == 1
    f(torch.ones(5))  # static shapes: another size, another graph
    assert tr._compiled_graphs() - before == 2


# --- the captured step of the fixed batches --------------------------------------------------------


@pytest.mark.parametrize("device, mode, batch, compiled, expected", [
    ("cuda", "full", "fixed", False, True),
    ("cuda:0", "lora", "fixed", False, True),
    ("cuda", "qlora", "fixed", False, True),
    ("cuda", "full", "maxbatch", False, False),  # the largest batch: eager, GPU-bound already
    ("cuda", "lora", "maxbatch", False, False),
    ("cuda", "full", "fixed", True, False),  # compiled: Inductor's own
    ("cpu", "full", "fixed", False, False),
])
def test_fixed_batch_steps_on_a_gpu_replay_a_cuda_graph(device, mode, batch, compiled, expected):
    assert tr.uses_graph(device, mode, batch, compiled) is expected


def test_the_run_times_the_graphed_step_where_uses_graph_says_so(cpu, timer, monkeypatch):
    """run_training hands the timer the graphed step (one call per step, DATA_POOL batches) and records it."""
    pools: list[list[torch.Tensor]] = []

    def graphed(self, pool):  # the CPU cannot capture: a stand-in that steps eagerly over the same pool
        pools.append(pool)
        counter = [0]

        def step():
            self.losses.append(self.step(pool[counter[0] % len(pool)]))
            counter[0] += 1

        return step

    monkeypatch.setattr(tr, "uses_graph", lambda device, mode, batch, compiled: batch == "fixed")
    monkeypatch.setattr(tr._Trainer, "graphed_step_fn", graphed)
    metrics = tr.run_training(cpu, timer, config="gpt2-small", mode="full", batch="fixed", quick=True)
    tokens = next(m for m in metrics if m.name == "tokens_per_s")
    assert tokens.info["cuda_graph"] is True
    cfg = tr.CONFIGS["gpt2-small"].tiny()
    assert len(pools) == 1 and len(pools[0]) == tr.DATA_POOL
    assert all(t.shape == (cfg.fixed_batch, cfg.seq_len) for t in pools[0])
    pools.clear()
    metrics = tr.run_training(cpu, timer, config="qwen1.5b", mode="lora", batch="maxbatch", quick=True)
    assert next(m for m in metrics if m.name == "tokens_per_s").info["cuda_graph"] is False
    assert pools == []  # the largest batch steps eagerly


def test_a_cpu_run_records_eager_steps(cpu, timer):
    metrics = tr.run_training(cpu, timer, config="gpt2-small", mode="lora", batch="fixed", quick=True)
    assert next(m for m in metrics if m.name == "tokens_per_s").info["cuda_graph"] is False


@pytest.mark.parametrize("cache", [True, False])
def test_the_step_passes_autocast_cache_through(cache, monkeypatch):
    """A captured step runs autocast without its weight cache; an eager one keeps the cache."""
    seen: list[bool] = []
    real = torch.autocast

    def recording(*args, **kwargs):
        seen.append(kwargs.get("cache_enabled"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "autocast", recording)
    trainer = tr._Trainer(tr.CONFIGS["gpt2-small"].tiny(), "full", "cpu")
    tokens = trainer.task.batch(2)
    trainer.step(tokens, autocast_cache=cache)
    trainer.step(tokens)
    assert seen == [cache, True]
