"""What a training case needs: its memory, checked against the Target's budget before anything is
allocated, and its FLOPs per token, for MFU (the conventions are set out in
:mod:`pytest_mig.workloads.training`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_mig.workloads import DoesNotFit
from pytest_mig.workloads.hf import LORA, LoraSpec, ModelConfig

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
