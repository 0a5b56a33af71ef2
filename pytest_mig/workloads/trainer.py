"""The training step and what it trains: the data task, the loss checks, the gradients' clip, the
optimizer step and :class:`_Trainer` (a transformers model, its adapters and optimizer, its eager,
compiled or CUDA-graph step).  :mod:`pytest_mig.workloads.training` sizes, times and reports the
runs built from these.
"""

from __future__ import annotations

import gc
import math
import statistics
from typing import Any, Callable

import torch

from pytest_mig.workloads import WorkloadError, hf
from pytest_mig.workloads.batch_search import OOM_ERROR
from pytest_mig.workloads.hf import ModelConfig

#: Learning rates (constant, no schedule: the run is tens of steps).  On a GPU they keep the loss
#: falling through the first few tens of steps for both configs (higher rates reach the
#: next-token-frequency plateau within the warm-up, or diverge); the CPU-sized models learn at higher rates.
LR = {"full": 3e-4, "lora": 5e-4, "qlora": 5e-4}
LR_CPU = {"full": 3e-3, "lora": 3e-3, "qlora": 3e-3}
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
#: The gradients' global norm is clipped to this before each optimizer step (transformers' Trainer
#: default).  Without it, Qwen2.5-1.5B's full fine-tune at the batch of 5 that a 40 GB slice holds
#: diverged under torch.compile (the loss fell from 6.4 to 4.3, then rose: the last 3 of 10 measured
#: steps averaged 7.25).
MAX_GRAD_NORM = 1.0
#: The loss must fall by this share between the first and the last third of the measured steps.
MIN_LOSS_DROP = 0.05
#: The first loss must lie within this share of ln(vocab): the model starts at chance.
INITIAL_LOSS_TOLERANCE = 0.2
#: Tokens of the hidden cycle the data follows (at most half the vocabulary).
ALPHABET = 64
#: Distinct batches cycled through the timed steps (made before timing: no data loading is timed).
DATA_POOL = 4
#: Eager steps on a side stream before the step is captured (:meth:`_Trainer.graphed_step_fn`).
GRAPH_WARMUP_STEPS = 3
SEED = 20240611


# --------------------------------------------------------------------------- data


class CycleTask:
    """Sequences that walk a hidden cycle over ``alphabet`` tokens of the vocabulary.

    Every token is followed by its successor on the cycle, so the next token is a function of the
    current one: chance loss is ln(vocab), the floor is zero, and a model that trains at all
    learns it within a few steps.  Batches start at random points of the cycle.
    """

    def __init__(self, vocab: int, seq_len: int, device: str, *, alphabet: int | None = None, seed: int = SEED) -> None:
        self.gen = torch.Generator(device="cpu")
        self.gen.manual_seed(seed)
        self.alphabet = max(2, min(ALPHABET if alphabet is None else alphabet, vocab // 2))
        self.cycle = torch.randperm(vocab, generator=self.gen)[: self.alphabet].to(device)
        self.seq_len = seq_len
        self.device = device

    def batch(self, n: int) -> torch.Tensor:
        """(n, T) token ids, int64 on the device: inputs, and labels (the model shifts them itself)."""
        starts = torch.randint(self.alphabet, (n, 1), generator=self.gen).to(self.device)
        pos = (starts + torch.arange(self.seq_len, device=self.device)) % self.alphabet
        return self.cycle[pos].contiguous()


# --------------------------------------------------------------------------- the step


def check_loss(losses: list[float], *, min_drop: float = MIN_LOSS_DROP) -> float:
    """Relative drop of the loss from the first third of the measured steps to the last third.

    Raises WorkloadError where a loss is not finite or the drop is below ``min_drop``.
    """
    if len(losses) < 3:
        raise ValueError(f"need at least 3 measured losses to judge training, got {len(losses)}")
    if not all(math.isfinite(x) for x in losses):
        raise WorkloadError(f"training produced a non-finite loss: {[round(x, 4) for x in losses]}")
    third = max(1, len(losses) // 3)
    first, last = statistics.fmean(losses[:third]), statistics.fmean(losses[-third:])
    drop = (first - last) / first if first > 0 else float("nan")
    if not (drop >= min_drop):
        raise WorkloadError(f"the loss did not fall over the {len(losses)} measured steps "
                            f"({first:.4f} -> {last:.4f}, {100 * drop:.1f}% where at least {100 * min_drop:.0f}% "
                            f"is expected): the model or the optimizer is not training")
    return drop


def check_initial_loss(loss: float, vocab: int, *, tolerance: float = INITIAL_LOSS_TOLERANCE) -> None:
    """The untrained model must predict at chance: its loss near ln(vocab)."""
    chance = math.log(vocab)
    if not (abs(loss - chance) <= tolerance * chance):
        raise WorkloadError(f"the loss of the untrained model is {loss:.4f} where chance is ln({vocab}) = {chance:.4f}: "
                            "the loss or the forward pass is wrong")


def clip_gradients(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, max_grad_norm: float | None, *,
                   fused: bool) -> None:
    """Clip the gradients' global norm to ``max_grad_norm``, as ``clip_grad_norm_`` does, with no host sync
    (None: no clip).  Every trainer here calls it between backward and the optimizer step, the DDP ranks too.

    With fused AdamW the scaling is left to the optimizer's kernel: it divides every gradient by
    its ``grad_scale`` tensor (what ``GradScaler`` sets to unscale fp16 gradients), so the clip
    costs one read of the gradients for the norm.  ``clip_grad_norm_`` reads them twice more and
    writes them once to scale them, which costs a step of the largest batches several percent of
    its tokens/s on some boards (docs/results/README.md, the gradient clip).
    """
    if max_grad_norm is None:
        opt.grad_scale = None  # type: ignore[attr-defined]  # no scale left from an earlier step
        return
    if not fused:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        return
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    coef = torch.clamp(max_grad_norm / (norm.float() + 1e-6), max=1.0)  # clip_grad_norm_'s coefficient
    opt.grad_scale = 1.0 / coef  # type: ignore[attr-defined]


def optimizer_step(model: Callable[..., Any], opt: torch.optim.Optimizer, tokens: torch.Tensor, *, amp: bool,
                   clip: Callable[[], None], autocast_cache: bool = True) -> torch.Tensor:
    """One training step as every trainer here takes it, the DDP ranks too: the gradients zeroed, the
    forward under bf16 autocast (``amp``), backward, ``clip()`` (:func:`clip_gradients`), the optimizer
    step.  Returns the loss, detached, with no host sync.  ``autocast_cache`` False: autocast casts a
    weight at each use instead of once per step (what a step captured in a CUDA graph needs)."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=autocast_cache):
        loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    clip()
    opt.step()
    return loss.detach()


class _Trainer:
    """A transformers model (with peft adapters for LoRA/QLoRA), its optimizer, the task, one step."""

    def __init__(self, cfg: ModelConfig, mode: str, device: str, *, fused: bool | None = None) -> None:
        self.cfg, self.mode, self.device = cfg, mode, device
        cuda = device.startswith("cuda")
        self.fused = cuda if fused is None else fused  # fused AdamW on a GPU (one kernel for every tensor)
        self.amp = cuda  # bf16 autocast on a GPU; fp32 on the CPU
        if mode == "qlora":
            model = hf.build_qlora(cfg, device, seed=SEED)
            gc.collect()
            torch.cuda.empty_cache()
        else:
            base_dtype = torch.bfloat16 if (cuda and mode == "lora") else torch.float32
            model = hf.build_model(cfg, device, base_dtype, seed=SEED)
            if mode == "lora":
                model = hf.add_lora(model, cfg)
        model.train()
        self.trainable = hf.trainable_count(model)
        self.gradient_checkpointing = hf.checkpointing(model)
        self.model = model
        self.step_model: Callable[..., Any] = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.params = params
        self.max_grad_norm: float | None = MAX_GRAD_NORM
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.lr = (LR if cuda else LR_CPU)[mode]
        self.opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=self.lr, betas=BETAS,
                                     **({"fused": True} if self.fused else {}))
        self.task = CycleTask(cfg.vocab, cfg.seq_len, device)
        self.losses: list[torch.Tensor] = []
        self.first_loss: float | None = None
        self._graph: torch.cuda.CUDAGraph | None = None  # the captured step of graphed_step_fn

    def step(self, tokens: torch.Tensor, *, autocast_cache: bool = True) -> torch.Tensor:
        loss = optimizer_step(self.step_model, self.opt, tokens, amp=self.amp, clip=self.clip_gradients,
                              autocast_cache=autocast_cache)
        if self.first_loss is None:
            self.first_loss = float(loss)
        return loss

    def clip_gradients(self) -> None:
        """Clip the gradients' global norm to ``max_grad_norm`` (:func:`clip_gradients`)."""
        clip_gradients(self.params, self.opt, self.max_grad_norm, fused=self.fused)

    def compile(self) -> None:
        """Run the model through torch.compile from the next step on, a static graph for each batch size
        (``dynamic=False``: a second size compiles its own graph).  A symbolic batch, one graph for
        every size, is not taken: its graph holds more memory per sequence, so the largest batch that
        fits is smaller and slower, and the first night's compilation is longer, not shorter
        (docs/benchmarks.md, "The night's time").
        """
        self.step_model = torch.compile(self.model, dynamic=False)

    def uncompile(self) -> None:
        """Eager steps again (a remembered compiled batch that no longer fits: the search runs eager)."""
        self.step_model = self.model

    def set_lr(self, lr: float) -> None:
        for g in self.opt.param_groups:
            g["lr"] = lr

    def probe(self, batch: int, limit_bytes: float | None = None, *, steps: int = 1) -> None:
        """``steps`` steps at ``batch`` with the learning rate at zero: memory as in training, weights unchanged.

        On a GPU a probe whose peak reserved memory exceeds ``limit_bytes`` counts as out of memory:
        a batch that fills the device to the last byte fails later, on a fragmented cache.
        """
        cuda = self.device.startswith("cuda")
        if cuda:
            _release(self.device)
            torch.cuda.reset_peak_memory_stats()
        tokens = self.task.batch(batch)
        self.set_lr(0.0)
        try:
            for _ in range(steps):
                self.step(tokens)
            if cuda:
                torch.cuda.synchronize()
        finally:
            self.set_lr(self.lr)
            self.opt.zero_grad(set_to_none=True)
        if cuda and limit_bytes is not None:
            reserved = torch.cuda.max_memory_reserved()
            if reserved > limit_bytes:
                raise OOM_ERROR(f"batch {batch} reserved {reserved / 1e9:.1f} GB, over the "
                                 f"{limit_bytes / 1e9:.1f} GB a step may fill")

    def reset_moments(self) -> None:
        """AdamW's state as a fresh optimizer makes it (zero moments, step 0), zeroed where it lies:
        the measured run's memory stays laid out as the probes' was (a state made anew among the
        first step's freed blocks fragmented GPT-2's compiled batch of 126 into running out of memory)."""
        with torch.no_grad():
            for state in self.opt.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        value.zero_()

    def after_oom(self) -> None:
        """After a probe ran out of memory: its gradients dropped and the allocator's cache emptied."""
        self.opt.zero_grad(set_to_none=True)
        _release(self.device)

    def timed_step_fn(self, batch: int, *, graph: bool = False) -> Callable[[], None]:
        """One training step per call over :data:`DATA_POOL` batches made here, its loss kept in
        ``losses`` with no host sync; ``graph``: the whole step replayed as one CUDA graph
        (:meth:`graphed_step_fn`)."""
        pool = [self.task.batch(batch) for _ in range(DATA_POOL)]
        if graph:
            return self.graphed_step_fn(pool)
        counter = [0]

        def step() -> None:
            tokens = pool[counter[0] % len(pool)]
            counter[0] += 1
            self.losses.append(self.step(tokens))  # no host sync inside the timed step

        return step

    def graphed_step_fn(self, pool: list[torch.Tensor]) -> Callable[[], None]:
        """The whole training step (gradients zeroed, forward, backward, clip, fused AdamW) captured
        once in a CUDA graph; each call copies the next batch of ``pool`` into the graph's input,
        replays it and keeps a copy of its loss.

        A small batch's eager step is bound by the host: eager, a small LoRA step takes several
        times its replayed time, so the eager tokens/s measures the host's Python and moves between
        runs by far more than the GPU's work does (docs/benchmarks.md, "Fixed-batch training: the
        step as one CUDA graph").  Replayed, the step is the GPU's work alone.  Before the capture,
        :data:`GRAPH_WARMUP_STEPS` eager steps run on the capture stream (what capture needs: the
        optimizer's state, cuBLAS's workspaces and autograd's streams are made there); they train.
        The capture stream is a new one where the current stream is the legacy default stream (which
        cannot capture), else the current stream itself: under emulation that is the green context's
        own stream, where a new stream could be the whole GPU's (:mod:`..emulation`).
        """
        static = pool[0].clone()
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream() if current == torch.cuda.default_stream() else current
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for i in range(GRAPH_WARMUP_STEPS):
                static.copy_(pool[i % len(pool)])
                self.losses.append(self.step(static, autocast_cache=False))
        current.wait_stream(side)
        for group in self.opt.param_groups:  # fused AdamW keeps its step count on the GPU already
            group["capturable"] = True
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            loss = self.step(static, autocast_cache=False)
        counter = [GRAPH_WARMUP_STEPS]

        def step() -> None:
            static.copy_(pool[counter[0] % len(pool)])
            counter[0] += 1
            graph.replay()
            self.losses.append(loss.clone())  # the graph's loss is overwritten by the next replay

        self._graph = graph  # kept alive (and released in close) with the trainer
        return step

    def close(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self._graph = None
        del self.opt, self.model, self.step_model, self.losses, self.params


def _release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
