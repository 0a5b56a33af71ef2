"""The Hugging Face engine: models built by ``transformers`` from their configurations, LoRA through
``peft`` and QLoRA through ``bitsandbytes``, as Wulver's fine-tuning script builds them.

Nothing is downloaded.  :data:`CONFIGS` holds the shapes of two published models, GPT-2 small
(124M) and Qwen2.5-1.5B (1.54B, Wulver's fine-tuning workload), with their real vocabularies, so
the LM head and the loss cost what they cost in the real models; :func:`hf_config` turns one into
``GPT2Config`` or ``Qwen2Config`` and :func:`build_model` calls ``AutoModelForCausalLM.from_config``
(randomly initialised, the seed fixed, SDPA attention through :data:`ATTENTION`).

- Attention: PyTorch's SDPA with ``is_causal=True`` and no mask tensor, registered with transformers
  as :data:`ATTENTION` (``AttentionInterface`` and ``AttentionMaskInterface``).  transformers' own
  ``"sdpa"`` makes a 4-D causal mask under torch.compile with torch < 2.14 (it cannot tell compiling
  from exporting there), and a mask keeps SDPA off its fastest flash path: on an H100 it more than
  doubled compiled GPT-2's attention time (MFU 36.5% against 41.7% side by side;
  docs/results/h100-causal-sdpa-2026-11-23.tgz).
  Every sequence trained here is whole (no padding, no attention_mask), so the mask only ever says
  "causal".

- LoRA: ``peft.LoraConfig`` (rank 16, alpha 32, no dropout) on every attention and MLP projection
  (:data:`LORA_TARGETS`) and ``get_peft_model``.
- QLoRA, Wulver's way: ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
  bnb_4bit_compute_dtype=bfloat16)`` given to ``from_pretrained``, then
  ``prepare_model_for_kbit_training`` (which casts the unquantised weights to fp32 and turns on
  gradient checkpointing), then LoRA.  ``from_pretrained`` needs a checkpoint: the randomly
  initialised model is saved to a temporary folder first, so the weights go through the same
  loading and quantisation path as a downloaded model's.

:func:`missing` says, in one sentence with the ``pip install`` line, what a mode needs that is not
installed.
"""

from __future__ import annotations

import importlib.util
import tempfile
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

# --------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class ModelConfig:
    """One decoder's shape, its layout and the batch it trains with by default."""

    name: str
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    seq_len: int
    fixed_batch: int  # sequences per step of the ``fixed`` policy
    layout: Literal["gpt2", "qwen2"] = "gpt2"
    rope_theta: float = 1e6
    norm_eps: float = 1e-5
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return self.d_model + 2 * self.kv_dim

    def projections(self) -> list[tuple[int, int]]:
        """(in, out) of every projection in one block, as the transformers model holds them.

        GPT-2: the fused c_attn, attention c_proj, MLP c_fc and c_proj.  Qwen2: q, k, v, o, gate,
        up and down projections.  LoRA puts one adapter on each.
        """
        d, kv, ff = self.d_model, self.kv_dim, self.d_ff
        if self.layout == "qwen2":
            return [(d, d), (d, kv), (d, kv), (d, d), (d, ff), (d, ff), (ff, d)]
        return [(d, self.qkv_dim), (d, d), (d, ff), (ff, d)]

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token: every block projection plus the LM head."""
        per_block = sum(i * o for i, o in self.projections())
        return self.n_layers * per_block + self.vocab * self.d_model

    def param_count(self) -> int:
        """Every parameter (the LM head is tied to the token embedding, so counted once)."""
        d = self.d_model
        per_block = sum(i * o for i, o in self.projections())
        if self.layout == "gpt2":
            per_block += sum(o for _, o in self.projections()) + 4 * d  # biases, two LayerNorms
            extra = self.seq_len * d + 2 * d  # learned positions, final LayerNorm
        else:
            per_block += self.qkv_dim + 2 * d  # q, k and v biases, two RMSNorms
            extra = d
        return self.n_layers * per_block + self.vocab * d + extra

    def tiny(self) -> ModelConfig:
        """The same layout at CPU size: 2 layers, d=64, sequences of 32, a 256-token vocabulary."""
        heads, kv = 4, (2 if self.n_kv_heads < self.n_heads else 4)
        d_ff = 172 if self.layout == "qwen2" else 256
        return replace(self, name=f"{self.name} (CPU-sized)", vocab=256, d_model=64, n_layers=2, n_heads=heads,
                       n_kv_heads=kv, d_ff=d_ff, seq_len=32, fixed_batch=4, init_std=TINY_INIT_STD)


#: Initial weight scale of the CPU-sized models: with 0.02 a frozen 64-wide embedding cannot give
#: logits far from zero, so LoRA, which cannot change it, could hardly lower the loss.
TINY_INIT_STD = 0.1

#: GPT-2 small (124M; vocabulary padded from 50257 to a multiple of 64, as nanoGPT does, for whole
#: tensor-core tiles in the LM head) and Qwen2.5-1.5B (1.54B; 12 query and 2 key/value heads of 128).
#: Fixed batches are small, so that a case fits a 10 GB slice wherever its weights and optimizer state do.
CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("gpt2-small", vocab=50304, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, d_ff=3072,
                    seq_len=1024, fixed_batch=4, layout="gpt2"),
        ModelConfig("qwen1.5b", vocab=151936, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2, d_ff=8960,
                    seq_len=512, fixed_batch=2, layout="qwen2", rope_theta=1e6, norm_eps=1e-6),
    )
}
CONFIG_NAMES: tuple[str, ...] = tuple(CONFIGS)


@dataclass(frozen=True)
class LoraSpec:
    """Rank, scaling and dropout of the adapters (PEFT's usual rank 16, alpha 32)."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0  # none: the loss check and the step time stay deterministic


LORA = LoraSpec()

#: The projections LoRA adapts: every attention and MLP projection, as Wulver's script targets them.
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    "gpt2": ("c_attn", "c_proj", "c_fc"),  # c_proj: the attention's and the MLP's
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}

# --------------------------------------------------------------------------- what is installed

#: pip lines for what each mode needs (the README's extras install them).
INSTALL = {
    "transformers": "pip install transformers peft",
    "peft": "pip install peft",
    "bitsandbytes": "pip install 'pytest-mig[qlora]'  (bitsandbytes)",
}


#: What building a model of each layout imports, beyond torch: transformers' modelling stack is most
#: of the first build's seconds in a process.  The training tests name them (``mig_imports``) so the
#: plugin can import them while the main process waits on OpenMM's worker (:mod:`pytest_mig.workloads.preload`).
IMPORTS: dict[str, tuple[str, ...]] = {
    layout: ("transformers.modeling_utils", "transformers.integrations.sdpa_attention",
             "transformers.models.auto.modeling_auto", f"transformers.models.{layout}.modeling_{layout}")
    for layout in ("gpt2", "qwen2")
}


def imports(config: str, mode: str) -> tuple[str, ...]:
    """The modules a training case of ``config`` in ``mode`` imports (:data:`IMPORTS`, and peft for adapters)."""
    return IMPORTS[CONFIGS[config].layout] + (("peft",) if mode in ("lora", "qlora") else ())


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing(mode: str) -> str | None:
    """What ``mode`` (full, lora, qlora) needs that is not installed, as one sentence; None if nothing."""
    needs = ["transformers"] + (["peft"] if mode in ("lora", "qlora") else []) + (["bitsandbytes"] if mode == "qlora" else [])
    absent = [m for m in needs if not installed(m)]
    if not absent:
        return None
    first = absent[0]
    return f"{mode} training needs {', '.join(absent)}, which {'is' if len(absent) == 1 else 'are'} not installed: {INSTALL[first]}"


# --------------------------------------------------------------------------- building

#: The attention implementation the models are built with (see the module's docstring).
ATTENTION = "causal_sdpa"


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask of :data:`ATTENTION`: none; causality is SDPA's ``is_causal`` (sequences are never padded)."""
    return None


def register_attention() -> str:
    """Register :data:`ATTENTION` with transformers (idempotent) and return its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(ATTENTION, sdpa_attention_forward)
    AttentionMaskInterface.register(ATTENTION, _no_mask)
    return ATTENTION


def hf_config(cfg: ModelConfig) -> Any:
    """The transformers configuration of ``cfg``: GPT2Config or Qwen2Config, no dropout, no KV cache."""
    import transformers

    if cfg.layout == "gpt2":
        return transformers.GPT2Config(
            vocab_size=cfg.vocab, n_positions=cfg.seq_len, n_embd=cfg.d_model, n_layer=cfg.n_layers,
            n_head=cfg.n_heads, n_inner=cfg.d_ff, activation_function="gelu_new", layer_norm_epsilon=cfg.norm_eps,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=cfg.init_std,
            tie_word_embeddings=True, use_cache=False, bos_token_id=None, eos_token_id=None)
    return transformers.Qwen2Config(
        vocab_size=cfg.vocab, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, max_position_embeddings=max(cfg.seq_len, 32768),
        rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps, hidden_act="silu", attention_dropout=0.0,
        initializer_range=cfg.init_std, tie_word_embeddings=True, use_cache=False)


def build_model(cfg: ModelConfig, device: str, dtype: torch.dtype, *, seed: int) -> Any:
    """``AutoModelForCausalLM.from_config``: random weights (seeded) made directly on ``device``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation=register_attention(), dtype=dtype)
    return model


def lora_config(cfg: ModelConfig, lora: LoraSpec = LORA) -> Any:
    """peft's LoraConfig for ``cfg``: every attention and MLP projection (GPT-2's Conv1D layers
    store their weights transposed: ``fan_in_fan_out``)."""
    from peft import LoraConfig

    return LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                      target_modules=list(LORA_TARGETS[cfg.layout]), fan_in_fan_out=cfg.layout == "gpt2",
                      task_type="CAUSAL_LM")


def add_lora(model: Any, cfg: ModelConfig, lora: LoraSpec = LORA) -> Any:
    """``get_peft_model``: the base frozen, rank-r adapters (fp32) on every projection."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(cfg, lora))


def qlora_quantization() -> Any:
    """Wulver's 4-bit setting: NF4 weights, bf16 compute."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)


def build_qlora(cfg: ModelConfig, device: str, *, seed: int, lora: LoraSpec = LORA) -> Any:
    """QLoRA as Wulver builds it: a checkpoint loaded through ``from_pretrained`` with
    :func:`qlora_quantization`, ``prepare_model_for_kbit_training``, then LoRA.

    The checkpoint is this seed's random model, written (bf16 safetensors) to a temporary folder
    that is removed once the quantised model is loaded.
    """
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="pytest-mig-qlora-") as tmp:
        base = build_model(cfg, device, torch.bfloat16, seed=seed)
        base.save_pretrained(tmp)
        del base
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        index = torch.device(device).index or 0
        model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=qlora_quantization(),
                                                     attn_implementation=register_attention(), dtype=torch.bfloat16,
                                                     device_map={"": index})
    # PyTorch asks for use_reentrant to be named; non-reentrant is what it recommends.
    model = prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs={"use_reentrant": False})
    return add_lora(model, cfg, lora)


def checkpointing(model: Any) -> bool:
    """Whether the model recomputes activations in backward (transformers marks the modules it checkpoints)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def trainable_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = [
    "ATTENTION",
    "CONFIGS",
    "CONFIG_NAMES",
    "LORA",
    "LORA_TARGETS",
    "LoraSpec",
    "ModelConfig",
    "add_lora",
    "build_model",
    "build_qlora",
    "checkpointing",
    "hf_config",
    "installed",
    "lora_config",
    "missing",
    "qlora_quantization",
    "register_attention",
    "trainable_count",
]
