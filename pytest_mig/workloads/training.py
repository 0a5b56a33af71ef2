"""Transformer training throughput through the field's own stack: transformers, peft and bitsandbytes.

What is measured (reference/measurement.md, "Training"; the Wulver, SparkTrainer and Columbia/IBM seeds):

- The models are built by ``transformers`` from the configurations of GPT-2 small and
  Qwen2.5-1.5B (:mod:`.hf`: random weights, no downloads, SDPA attention with no mask tensor).
  Full fine-tune: fp32 master weights under bf16 autocast and fused AdamW, as the Trainer's ``bf16=True`` runs it.
  Every mode clips the gradients' global norm at 1.0 before the optimizer step, the Trainer's
  default ``max_grad_norm``.
  LoRA: ``peft`` adapters on every attention and MLP projection of a frozen bf16 base.  QLoRA,
  Wulver's setup: the base loaded in bitsandbytes NF4 with bf16 compute,
  ``prepare_model_for_kbit_training`` (gradient checkpointing on), then LoRA.
- Batch policies: ``fixed`` (a small constant batch, the same on every profile so profiles compare
  at equal work per step; Columbia/IBM found small constant batches are where MIG gains most; on a
  GPU its measured steps replay the whole step captured as one CUDA graph, so they time the GPU's
  work, not the host's Python: :meth:`_Trainer.graphed_step_fn`) and
  ``maxbatch`` (Columbia/IBM's method: the largest batch that fits the slice, found by trying real
  steps and catching out-of-memory errors: :func:`max_batch_search`).  A compiled ``maxbatch``
  case runs at the larger batch its compiled step holds, projected from that step's memory at the
  eager search's batch and tried (:func:`grow_batch`); where a batch found under the same torch and
  transformers is at hand (another stack's folder, the references' ``batches.json``) it is
  confirmed instead, one compilation instead of two (:func:`batch_search.seed`).
- Figures: tokens/s and step time p50 (kind ``training``; per-step samples), step time p95, MFU,
  batch size, peak allocated and peak reserved memory (Wulver: allocated is the honest figure,
  reserved grows with the slice), energy per token where power is read.

MFU (the PaLM / nanoGPT convention, :func:`model_flops_per_token`): per token, 2 FLOPs per weight
of every matmul (blocks and LM head; embedding look-ups are not matmuls) forward and 4 backward, so
``6 N`` for a full fine-tune; a frozen weight needs no weight gradient, so LoRA/QLoRA count ``4 N``
plus ``6`` per adapter weight; attention scores and values add ``12 L d_attn T`` (forward and
backward, the full T x T square as nanoGPT counts it, although the causal kernels skip half).
Divided by the Target's bf16 dense datasheet peak, already scaled to its SMs
(:meth:`Target.peak_tflops`).  QLoRA's recomputation (gradient checkpointing) is not counted:
MFU counts the model's FLOPs, not the hardware's.

Correctness: the tokens follow a hidden cycle over a subset of the vocabulary (each token is
followed by its successor), a task with a loss floor of zero that a working model learns at once;
the loss is the model's own (``labels=input_ids``).  The first loss must sit near chance
(ln vocab), and the loss must fall over the measured steps by :data:`MIN_LOSS_DROP`; otherwise
:class:`WorkloadError` (a fast wrong answer is a failure).

A case that cannot fit the Target raises :class:`DoesNotFit` before anything is allocated, from
:func:`estimate_memory` (weights, gradients, optimizer state, activations, logits) against
:meth:`Target.memory_budget`; an out-of-memory error at run time is reported the same way.  A
missing engine is a DoesNotFit with the ``pip install`` line.  On the CPU every config runs as a
tiny model of the same layout in fp32.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from pytest_mig.measure import Metric, Timer, Timing, energy_metrics, percentile
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError, batch_search, hf
from pytest_mig.workloads.batch_search import OOM_ERROR, BatchGrowth, BatchSearch, grow_batch, is_oom, max_batch_search
from pytest_mig.workloads.caches import Caches
from pytest_mig.workloads.hf import CONFIG_NAMES, CONFIGS, LORA, LoraSpec, ModelConfig

MODES: tuple[str, ...] = ("full", "lora", "qlora")
BATCH_POLICIES: tuple[str, ...] = ("fixed", "maxbatch")


@dataclass(frozen=True)
class Effort:
    """Steps of one run: warm-up, measured steps, and the batch search's limits."""

    warmup: int
    repeats: int
    max_batch: int  # upper end of the max-batch search (sequences)
    search_resolution: float  # stop bisecting when the gap is at most this share of the batch


EFFORT: dict[tuple[str, bool, str], Effort] = {
    ("gpu", False, "fixed"): Effort(warmup=3, repeats=20, max_batch=256, search_resolution=0.125),
    # 10 measured steps at the largest batch.  5 would give tokens/s the same run-to-run CV (`pytest-mig
    # samples`: ratio 0.94 over 187 runs), but not the loss check: at its largest batch Qwen2.5-1.5B's
    # loss rose over the 5 measured steps in nine of ten H100 runs, eager and compiled (8.76 -> 10.60),
    # so a right answer could not be told from a wrong one (docs/benchmarks.md "The night's time").
    ("gpu", False, "maxbatch"): Effort(warmup=2, repeats=10, max_batch=256, search_resolution=0.125),
    ("gpu", True, "fixed"): Effort(warmup=2, repeats=8, max_batch=256, search_resolution=0.25),
    ("gpu", True, "maxbatch"): Effort(warmup=2, repeats=6, max_batch=128, search_resolution=0.25),
    ("cpu", False, "fixed"): Effort(warmup=1, repeats=8, max_batch=8, search_resolution=0.25),
    ("cpu", False, "maxbatch"): Effort(warmup=1, repeats=6, max_batch=8, search_resolution=0.25),
    ("cpu", True, "fixed"): Effort(warmup=1, repeats=6, max_batch=8, search_resolution=0.25),
    ("cpu", True, "maxbatch"): Effort(warmup=1, repeats=6, max_batch=8, search_resolution=0.25),
}

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
#: Modes whose fixed-batch steps on a GPU replay a CUDA graph of the whole step (:func:`uses_graph`).
GRAPH_MODES: tuple[str, ...] = ("full", "lora", "qlora")
#: Eager steps on a side stream before the step is captured (:meth:`_Trainer.graphed_step_fn`).
GRAPH_WARMUP_STEPS = 3
SEED = 20240611


# --------------------------------------------------------------------------- memory planning

#: Share of the Target's memory a case may plan to use, and what the CUDA context, cuBLAS
#: workspaces and the allocator's rounding take besides (outside torch's own accounting).
MEMORY_SHARE = 0.92
OVERHEAD_BYTES = 768 * 2**20
#: Bytes per token per vocabulary entry at the loss: under autocast the bf16 logits are cast to
#: fp32 for the cross-entropy, whose log-probabilities are kept for backward, and backward makes
#: an fp32 and a bf16 gradient; not all of them are live at once.
LOGIT_BYTES = 12


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a training case needs, by part; what is checked against the budget before allocating."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits

    def to_dict(self) -> dict[str, float]:
        parts = {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                 "activations": self.activations, "logits": self.logits, "total": self.total}
        return {k: round(v / 1e9, 3) for k, v in parts.items()}


def lora_params(cfg: ModelConfig, lora: LoraSpec = LORA) -> int:
    """Adapter weights: rank x (in + out) for every projection of every block."""
    return cfg.n_layers * sum(lora.rank * (i + o) for i, o in cfg.projections())


def activation_bytes_per_token(cfg: ModelConfig, mode: str, *, cpu: bool = False) -> float:
    """Bytes one token's activations keep for backward, over all layers.

    Per layer, the tensors autograd saves: the two norm inputs (the residual stream, fp32 under
    autocast with fp32 weights) and their fp32 statistics, the bf16 inputs of the projections,
    q, k and v (and, with RoPE, their rotated copies), the attention output and the output
    projection's input, and the MLP's hidden activations (GPT-2's GELU: its input, output and the
    intermediates of transformers' elementwise tanh approximation; SwiGLU: gate and up outputs, the
    activated gate and their product).  With LoRA each adapter keeps its
    rank-r intermediate.  QLoRA runs with gradient checkpointing (``prepare_model_for_kbit_training``):
    only each layer's fp32 input is kept, and one layer's activations are rebuilt at a time.  On
    the CPU everything is fp32.
    """
    d, ff = cfg.d_model, cfg.d_ff
    a = 4 if cpu else 2  # bytes per activation element
    per_layer = 2 * 4 * d + 2 * a * d  # norm inputs (fp32); projection inputs
    per_layer += a * cfg.qkv_dim + (a * (d + cfg.kv_dim) if cfg.layout == "qwen2" else 0)
    per_layer += 2 * a * d  # attention output and the output projection's input
    # MLP.  GPT-2's tanh GELU is a chain of elementwise ops in transformers, each saving its input:
    # on the H100 a GPT-2 step at batch 48 x 1024 held 20.7 GB more than two ff-wide tensors per
    # layer explain, about six more.  SwiGLU: gate and up outputs, the activated gate, their product.
    per_layer += a * (8 * ff if cfg.layout == "gpt2" else 4 * ff)
    if mode in ("lora", "qlora"):  # each adapter keeps its rank-r intermediate
        per_layer += a * LORA.rank * len(cfg.projections())
    if mode == "qlora":  # checkpointed: every layer's input, plus one layer rebuilt for its backward
        return float(cfg.n_layers * 4 * d + per_layer)
    return float(cfg.n_layers * per_layer)


def estimate_memory(cfg: ModelConfig, mode: str, batch: int, *, cpu: bool = False) -> MemoryEstimate:
    """What a step of ``batch`` sequences needs at its peak (weights resident, optimizer state built)."""
    n_all = cfg.param_count()
    n_proj = cfg.matmul_params() - cfg.vocab * cfg.d_model  # block projections
    tokens = batch * cfg.seq_len
    if mode == "full":
        # fp32 master weights, fp32 gradients, AdamW's two moments, and autocast's bf16 weight copies.
        weights = 4.0 * n_all + (0 if cpu else 2.0 * cfg.matmul_params())
        grads, optim = 4.0 * n_all, 8.0 * n_all
    else:
        n_lora = lora_params(cfg)
        if mode == "qlora":
            # NF4 projections (half a byte per weight plus block scales) and one dequantised weight;
            # prepare_model_for_kbit_training casts every other weight (embedding, norms) to fp32.
            largest = max(i * o for i, o in cfg.projections())
            base = (n_all - n_proj) * 4.0 + n_proj * (0.5 + 4 / 64) + 2.0 * largest
        else:
            base = n_all * (4.0 if cpu else 2.0)
        weights = base + 4.0 * n_lora
        grads, optim = 4.0 * n_lora, 8.0 * n_lora
    acts = tokens * activation_bytes_per_token(cfg, mode, cpu=cpu)
    logits = float(tokens * cfg.vocab * LOGIT_BYTES)
    return MemoryEstimate(weights, grads, optim, acts, logits)


def usable_bytes(budget: int) -> float:
    """What a case may plan to use of a Target's memory budget."""
    return MEMORY_SHARE * budget - OVERHEAD_BYTES


def check_fits(cfg: ModelConfig, mode: str, batch: int, budget: int, *, cpu: bool = False) -> MemoryEstimate:
    """Raise DoesNotFit, with the estimate and the budget, where ``batch`` sequences cannot fit."""
    est = estimate_memory(cfg, mode, batch, cpu=cpu)
    room = usable_bytes(budget)
    if est.total > room:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in est.to_dict().items() if k != "total")
        raise DoesNotFit(f"{cfg.name} {mode} fine-tune at batch {batch} x {cfg.seq_len} needs about "
                         f"{est.total / 1e9:.1f} GB ({parts} GB) but this Target has {budget / 2**30:.1f} GiB "
                         f"(about {max(room, 0) / 1e9:.1f} GB usable)")
    return est


# --------------------------------------------------------------------------- FLOPs and MFU


def model_flops_per_token(cfg: ModelConfig, mode: str, *, lora: LoraSpec = LORA) -> float:
    """Model FLOPs of one training token (forward and backward), the numerator of MFU.

    Full: ``6 N + 12 L d T`` with N the matmul weights (blocks and LM head).  LoRA/QLoRA: frozen
    weights need no weight gradient, so ``4 N + 6 N_lora + 12 L d T``.
    """
    n = cfg.matmul_params()
    attention = 12.0 * cfg.n_layers * cfg.d_model * cfg.seq_len
    if mode == "full":
        return 6.0 * n + attention
    return 4.0 * n + 6.0 * lora_params(cfg, lora) + attention


MFU_FORMULA = "6 N + 12 L d T FLOPs per token (LoRA: 4 N + 6 N_lora + 12 L d T); N = matmul weights incl. LM head"


def mfu_percent(tokens_per_s: float, flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation in percent of the peak."""
    return 100.0 * tokens_per_s * flops_per_token / (peak_tflops * 1e12)


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


# --------------------------------------------------------------------------- the run


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
    writes them once to scale them (it cost a Qwen2.5-1.5B step at batch 12 on an H100 3.5% on one
    board and 0.6% on another; docs/benchmarks.md).
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
        every size, was measured on an H100 and not taken: compiled GPT-2 small's step held 18% more
        memory per sequence, so its largest batch fell from 126 to 107 and its tokens/s by 2.9%, and
        the first night's compilation took longer, not shorter (docs/benchmarks.md, "The night's time").
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

        A small batch's eager step is bound by the host: on a whole H100 Qwen2.5-1.5B's LoRA step
        at batch 2 took 0.15-0.19 s eager and 0.045 s replayed, so the eager tokens/s measured the
        host's Python and moved by 5-17% between runs (docs/benchmarks.md, "Fixed-batch training:
        the step as one CUDA graph").  Replayed, the step is the GPU's work alone.  Before the capture,
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


def resolve_config(config: str, target: Target) -> ModelConfig:
    if config not in CONFIGS:
        raise ValueError(f"unknown training config '{config}': use one of {', '.join(CONFIG_NAMES)}")
    cfg = CONFIGS[config]
    return cfg.tiny() if target.is_cpu else cfg


def check_runnable(target: Target, mode: str, *, compile_model: bool = False) -> None:
    """Raise DoesNotFit, with the reason, where ``mode`` cannot run on this Target at all."""
    if mode == "qlora" and target.is_cpu:
        raise DoesNotFit("QLoRA needs bitsandbytes' 4-bit CUDA kernels; this run is on the CPU")
    absent = hf.missing(mode)
    if absent:
        raise DoesNotFit(absent)
    if compile_model:
        if target.is_cpu:
            raise DoesNotFit("the torch.compile case runs on GPUs only (on the CPU it would measure the C++ compiler)")
        if importlib.util.find_spec("triton") is None:
            raise DoesNotFit("torch.compile on a GPU needs Triton, which is not installed")
    if not target.is_cpu and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise DoesNotFit("bf16 autocast training needs a GPU with bf16 support (Ampere or newer)")


@dataclass
class _Run:
    """What one measured run produced, for the metrics."""

    batch: int
    timing: Timing
    losses: list[float]  # of the measured steps
    peak_allocated: float
    peak_reserved: float
    memory_source: str
    estimate: MemoryEstimate
    search: BatchSearch | None
    growth: BatchGrowth | None = None
    phases_s: dict[str, float] = field(default_factory=dict)  # seconds of the batch and the timer (run_training adds build)


def run_training(
    target: Target,
    timer: Timer,
    *,
    config: str = "gpt2-small",
    mode: str = "full",
    batch: str = "fixed",
    quick: bool = False,
    compile_model: bool = False,
    caches: Caches | None = None,
) -> list[Metric]:
    """Train ``config`` on ``target`` (``mode``: full, lora, qlora; ``batch``: fixed, maxbatch) and report its speed.

    Raises DoesNotFit where the case cannot fit or run on the Target and WorkloadError where the
    model does not train.  ``compile_model`` runs the measured steps through torch.compile; with
    ``maxbatch`` the batch search runs eagerly first, and the compiled step's memory there projects
    the larger batch it holds (:func:`grow_batch`: one or two more compilations).  Compiling takes
    longer than the measurement, so it is off by default.  ``maxbatch`` remembers the batches it finds
    in the stack's folder of ``caches`` (:mod:`pytest_mig.workloads.batch_search`); without one it
    searches in full every time.
    """
    if mode not in MODES:
        raise ValueError(f"unknown training mode '{mode}': use one of {', '.join(MODES)}")
    if batch not in BATCH_POLICIES:
        raise ValueError(f"unknown batch policy '{batch}': use one of {', '.join(BATCH_POLICIES)}")
    cfg = resolve_config(config, target)
    check_runnable(target, mode, compile_model=compile_model)
    device = target.device
    effort = EFFORT[("cpu" if target.is_cpu else "gpu", quick, batch)]
    budget = target.memory_budget()
    # Before anything is allocated: does the smallest batch this policy runs fit at all?
    estimate = check_fits(cfg, mode, cfg.fixed_batch if batch == "fixed" else 1, budget, cpu=target.is_cpu)

    trainer: _Trainer | None = None
    out_of_memory: str | None = None
    try:
        try:
            graphs = _compiled_graphs()
            started = time.perf_counter()
            trainer = _Trainer(cfg, mode, device)
            built_s = time.perf_counter() - started
            run = _train(trainer, target, timer, batch, effort, compile_model, caches)
            run.phases_s = {"build": round(built_s, 2), **run.phases_s}
        except Exception as exc:
            if not is_oom(exc):
                raise
            out_of_memory = str(exc).split("\n")[0][:300]
        if out_of_memory is not None:  # raised here, where the failed step's tensors are gone
            raise DoesNotFit(f"{cfg.name} {mode} fine-tune ran out of memory on this Target ({budget / 2**30:.1f} GiB; "
                             f"{estimate.total / 1e9:.1f} GB estimated for the smallest batch; if this case ran here "
                             f"before, its memory use grew): {out_of_memory}")
        assert trainer is not None and trainer.first_loss is not None
        check_initial_loss(trainer.first_loss, cfg.vocab)
        measured = run.losses
        drop = check_loss(measured)
        info: dict[str, Any] = {
            "config": cfg.name, "mode": mode, "batch_policy": batch, "batch": run.batch, "seq_len": cfg.seq_len,
            "tokens_per_step": run.batch * cfg.seq_len, "layers": cfg.n_layers, "d_model": cfg.d_model,
            "vocab": cfg.vocab, "params": cfg.param_count(), "trainable_params": trainer.trainable,
            "precision": "fp32" if target.is_cpu else "bf16 autocast", "compiled": compile_model,
            "cuda_graph": uses_graph(device, mode, batch, compile_model),
            "initial_loss": round(trainer.first_loss, 4), "loss_first": round(measured[0], 4),
            "loss_last": round(measured[-1], 4), "loss_drop": round(drop, 4), "steps": len(measured),
            "warmup": effort.warmup, "lr": trainer.lr, "engine": _engine_versions(mode),
            "attention": "SDPA, is_causal, no mask tensor", "gradient_checkpointing": trainer.gradient_checkpointing,
            "phases_s": run.phases_s,
        }
        if compile_model:  # graphs dynamo compiled for this case: a first night's growth compiles a second batch
            info["compiled_graphs"] = _compiled_graphs() - graphs
        if mode != "full":
            info["lora_rank"] = LORA.rank
            info["lora_targets"] = list(hf.LORA_TARGETS[cfg.layout])
        if mode == "qlora":
            info["quantization"] = "bitsandbytes NF4, bf16 compute"
        trainable = trainer.trainable
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        _release(device)
    return _metrics(target, cfg, mode, run, info, trainable)


def _compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own count; 0 where it keeps none)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    stats = sys.modules["torch._dynamo"].utils.counters.get("stats", {})
    return int(stats.get("unique_graphs", 0))


def _engine_versions(mode: str) -> dict[str, str]:
    """Versions of the packages the mode ran through (they go into the record beside torch's)."""
    from pytest_mig.device.nvml import package_versions

    names = ["transformers"] + (["peft"] if mode != "full" else []) + (["bitsandbytes"] if mode == "qlora" else [])
    installed = package_versions()
    return {name: installed.get(name, "unknown") for name in names}


def _train(trainer: _Trainer, target: Target, timer: Timer, batch: str, effort: Effort, compile_model: bool,
           caches: Caches | None = None) -> _Run:
    """Find the batch (maxbatch), then time warm-up and measured steps through the timer."""
    cfg, mode, device = trainer.cfg, trainer.mode, trainer.device
    cuda = device.startswith("cuda")
    search: BatchSearch | None = None
    growth: BatchGrowth | None = None
    started = time.perf_counter()
    if batch == "maxbatch":
        search, growth = _find_batch(trainer, target, effort, compile_model, caches)
        n_batch = growth.batch if growth is not None else search.batch
        trainer.reset_moments()  # the measured run starts with fresh moments, as the fixed one does
        _release(device)
    else:
        n_batch = cfg.fixed_batch
        if compile_model:
            trainer.compile()
    estimate = estimate_memory(cfg, mode, n_batch, cpu=target.is_cpu)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = len(trainer.losses)
    timed = time.perf_counter()
    graph = uses_graph(trainer.device, mode, batch, compile_model)
    timing = timer(trainer.timed_step_fn(n_batch, graph=graph), warmup=effort.warmup, repeats=effort.repeats)
    phases = {"batch": round(timed - started, 2), "timer": round(time.perf_counter() - timed, 2)}
    alloc, reserved, source = _peak_memory(cuda, estimate)
    losses = [float(x) for x in torch.stack(trainer.losses[start:]).tolist()]
    return _Run(n_batch, timing, measured_losses(losses, len(timing.samples), timing.window_calls), alloc, reserved,
                source, estimate, search, growth, phases)


def uses_graph(device: str, mode: str, batch: str, compile_model: bool) -> bool:
    """Whether the measured steps replay a CUDA graph of the whole step (:meth:`_Trainer.graphed_step_fn`):
    the eager fixed-batch cases on a GPU (full, LoRA and QLoRA, whose bitsandbytes kernels and
    gradient checkpointing capture too).  The largest batches keep eager steps (the GPU already
    waits on nothing there, and a graph's private memory pool beside the eager cache might not fit
    the batch the search found with eager steps); compiled cases run Inductor's code."""
    return device.startswith("cuda") and batch == "fixed" and mode in GRAPH_MODES and not compile_model


def measured_losses(losses: list[float], repeats: int, energy_calls: int) -> list[float]:
    """The losses of the measured steps among every step a timer call made.

    A timer runs warm-up calls (and, under pytest-benchmark, a short estimate and perhaps several
    calls per round), then the measured repeats, then the energy window's calls (``energy_calls``:
    every call it made): the ``repeats`` calls just before the energy window were all measured.
    """
    end = len(losses) - energy_calls
    if repeats < 1 or end < repeats:
        raise ValueError(f"{len(losses)} steps cannot hold {repeats} measured and {energy_calls} energy-window steps")
    return losses[end - repeats:end]


def _find_batch(trainer: _Trainer, target: Target, effort: Effort, compile_model: bool,
                caches: Caches | None = None) -> tuple[BatchSearch, BatchGrowth | None]:
    """The largest batch (eager search, then the compiled step's growth), last night's where the
    stack's folder of ``caches`` remembers it and it is confirmed (:mod:`.batch_search`)."""
    cfg, mode, cuda = trainer.cfg, trainer.mode, trainer.device.startswith("cuda")
    trainer.probe(1)  # builds the optimizer state, which every later probe must fit beside
    room = usable_bytes(target.memory_budget())
    limits = f"max {effort.max_batch}, resolution {effort.search_resolution}"
    case = batch_search.key(cfg.name, mode, compile_model, limits, target) if cuda else ""
    known = batch_search.recall(case, caches) if case else {}
    versions = _batch_versions() if case else {}  # kept with the batches; a seed must match them
    if compile_model and case and not known.get("eager"):
        # The eager case of the same model and limits (run before this one, tonight or earlier)
        # searched the same eager steps: its batch, confirmed, is this search's answer.
        eager = batch_search.recall(batch_search.key(cfg.name, mode, False, limits, target), caches).get("eager")
        known = {**known, "eager": eager} if eager else known
    seeded = None
    if compile_model and case and known.get("eager") and not known.get("compiled"):
        # nothing compiled remembered on this stack: a batch found under the same torch and
        # transformers elsewhere (another stack's folder, the references) spares one compilation
        seeded = batch_search.seed(case, versions, caches)
        known = {**known, "compiled": seeded[0]} if seeded else known
    if compile_model and known.get("compiled") and known.get("eager"):
        trainer.compile()
        growth = batch_search.confirm_growth(lambda b: trainer.probe(b, room, steps=COMPILED_PROBE_STEPS),
                                             known["eager"], known["compiled"], after_oom=trainer.after_oom)
        if growth is not None:
            if seeded:
                growth.seeded_from = seeded[1]
                batch_search.remember(case, versions, caches=caches, eager=known["eager"], compiled=growth.batch)
            return BatchSearch(known["eager"], remembered=True), growth
        trainer.uncompile()  # it no longer fits: search again, eager steps first
    search = None
    if known.get("eager"):
        search = batch_search.confirm_batch(lambda b: trainer.probe(b, room), known["eager"], limit=effort.max_batch,
                                            resolution=effort.search_resolution, after_oom=trainer.after_oom)
    search = search or _search(trainer, cfg, mode, target.memory_budget(), target.is_cpu, effort)  # eager steps
    growth = None
    if compile_model:
        trainer.compile()
        if cuda:  # the compiled step holds more: grow the batch, the optimizer state still built
            growth = _grow_compiled(trainer, search.batch, room, effort.max_batch)
    if case:  # a compiled batch only where its projection fitted: a fallback may be another process's doing
        batch_search.remember(case, versions, caches=caches, eager=search.batch,
                              compiled=growth.batch if growth is not None and growth.batch == growth.projected else None)
    return search, growth


def _batch_versions() -> dict[str, str]:
    """What a compiled step's memory per sequence depends on besides the model and the GPU: the
    versions a seeded batch must share (:func:`batch_search.seed`)."""
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def _search(trainer: _Trainer, cfg: ModelConfig, mode: str, budget: int, cpu: bool, effort: Effort) -> BatchSearch:
    """Columbia/IBM's largest batch: real steps on a GPU; the memory estimate on the CPU (which never runs out)."""
    if cpu:
        room = usable_bytes(budget)

        def try_batch(b: int) -> None:
            if estimate_memory(cfg, mode, b, cpu=True).total > room:
                raise OOM_ERROR(f"estimated out of memory at batch {b}")
            trainer.probe(b)

        return max_batch_search(try_batch, start=cfg.fixed_batch, limit=effort.max_batch,
                                resolution=effort.search_resolution)

    start = min(cfg.fixed_batch, effort.max_batch)
    room = usable_bytes(budget)
    return max_batch_search(lambda b: trainer.probe(b, room), start=start, limit=effort.max_batch, resolution=effort.search_resolution,
                            after_oom=trainer.after_oom)


#: Steps of each probe of a compiled batch: the allocator's cache settles over the first steps, and
#: one step's peak let GPT-2 small's projected batch through (126 on an H100) to run out of memory
#: in the measured run.
COMPILED_PROBE_STEPS = 3


def _grow_compiled(trainer: _Trainer, start: int, room: float, limit: int) -> BatchGrowth:
    """:func:`grow_batch` for a compiled trainer: its steps' peak reserved memory at ``start``
    (compiled there, the optimizer state built), then compiled steps at the larger batches."""
    _release(trainer.device)
    resting = float(torch.cuda.memory_allocated())  # weights and optimizer state; no gradients between steps
    trainer.probe(start, room, steps=COMPILED_PROBE_STEPS)  # compiles at this batch; out of memory here is the case's
    peak = float(torch.cuda.max_memory_reserved())
    return grow_batch(lambda b: trainer.probe(b, room, steps=COMPILED_PROBE_STEPS), start=start, resting_bytes=resting,
                      peak_bytes=peak, room_bytes=room, limit=limit, after_oom=trainer.after_oom)


def _peak_memory(cuda: bool, estimate: MemoryEstimate) -> tuple[float, float, str]:
    """Peak allocated and reserved bytes of the measured run (the estimate on the CPU)."""
    if cuda:
        return float(torch.cuda.max_memory_allocated()), float(torch.cuda.max_memory_reserved()), \
            "torch.cuda.max_memory_allocated / max_memory_reserved"
    return estimate.total, estimate.total, "estimate (the CPU keeps no allocator statistics)"


def _metrics(target: Target, cfg: ModelConfig, mode: str, run: _Run, info: dict[str, Any], trainable: int) -> list[Metric]:
    tokens = run.batch * cfg.seq_len
    rates = run.timing.rate_samples(tokens)
    tok_s = statistics.median(rates)
    steps = list(run.timing.samples)
    info = {**info, **run.timing.clock_info()}
    # Scaling between profiles is judged on tokens/s at the largest batch each profile holds: a fixed
    # small batch underuses a big profile (Columbia/IBM's finding), and step time follows the batch.
    scaling = info.get("batch_policy") == "maxbatch"
    metrics = [
        Metric("tokens_per_s", tok_s, "tokens/s", "higher", rates, kind="training", info={**info, "scaling": scaling}),
        Metric("step_time_s", statistics.median(steps), "s", "lower", steps, kind="training",
               info={"statistic": "p50", "batch": run.batch, "tokens_per_step": tokens, "scaling": False}),
        Metric("step_time_p95_s", percentile(steps, 95), "s", "lower", [], kind="info", compare=False,
               info={"statistic": "p95", "steps": len(steps)}),
        Metric("batch_size", run.batch, "sequences", "higher", [], kind="info", compare=False,
               info={"policy": info["batch_policy"], "seq_len": cfg.seq_len,
                     **({"search": run.search.to_dict()} if run.search else {}),
                     **({"compiled_growth": run.growth.to_dict()} if run.growth else {})}),
        Metric("peak_allocated_gb", run.peak_allocated / 1e9, "GB", "lower", [], kind="info", compare=False,
               info={"source": run.memory_source, "estimate_gb": run.estimate.to_dict()}),
        Metric("peak_reserved_gb", run.peak_reserved / 1e9, "GB", "lower", [], kind="info", compare=False,
               info={"source": run.memory_source}),
        Metric("trainable_params", trainable, "params", "higher", [], kind="info", compare=False,
               info={"mode": mode, "total_params": cfg.param_count()}),
    ]
    peak = target.peak_tflops("bf16")
    if peak:
        fpt = model_flops_per_token(cfg, mode)
        metrics.append(Metric("mfu_pct", mfu_percent(tok_s, fpt, peak), "%", "higher", [], kind="info", compare=False,
                              info={"flops_per_token": fpt, "peak_tflops": peak, "peak_key": "bf16",
                                    "sms": target.effective_sms, "formula": MFU_FORMULA}))
    metrics.extend(energy_metrics(run.timing, tokens, "token"))
    return metrics


__all__ = [
    "BATCH_POLICIES",
    "CONFIGS",
    "CONFIG_NAMES",
    "MODES",
    "BatchGrowth",
    "BatchSearch",
    "CycleTask",
    "LoraSpec",
    "MemoryEstimate",
    "ModelConfig",
    "check_fits",
    "check_initial_loss",
    "check_loss",
    "estimate_memory",
    "grow_batch",
    "is_oom",
    "lora_params",
    "max_batch_search",
    "measured_losses",
    "mfu_percent",
    "model_flops_per_token",
    "run_training",
]
