"""Transformer training throughput through the field's own stack: transformers, peft and bitsandbytes.

What is measured (docs/benchmarks.md; the method of the Wulver, SparkTrainer and Columbia/IBM studies):

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
- Figures: tokens/s and step time p50 (kind ``training``; per-step samples; at the largest batch the
  step time is informational, :func:`pytest_mig.measure.batch_bound`), step time p95, MFU,
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

import importlib.util
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from pytest_mig.measure import STEP_TIME, Metric, Timer, Timing, energy_metrics, percentile
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, batch_search, hf
from pytest_mig.workloads.batch_search import OOM_ERROR, BatchGrowth, BatchSearch, grow_batch, is_oom, max_batch_search
from pytest_mig.workloads.caches import Caches
from pytest_mig.workloads.hf import CONFIG_NAMES, CONFIGS, LORA, LoraSpec, ModelConfig
from pytest_mig.workloads.training_plan import (LOGIT_BYTES, MEMORY_SHARE, MFU_FORMULA, OVERHEAD_BYTES,
    MemoryEstimate, activation_bytes_per_token, check_fits, estimate_memory, lora_params, mfu_percent,
    model_flops_per_token, usable_bytes)
from pytest_mig.workloads.trainer import (ALPHABET, BETAS, DATA_POOL, GRAPH_WARMUP_STEPS, INITIAL_LOSS_TOLERANCE, LR,
    LR_CPU, MAX_GRAD_NORM, MIN_LOSS_DROP, SEED, WEIGHT_DECAY, CycleTask, check_initial_loss, check_loss,
    clip_gradients, optimizer_step, _Trainer, _release)
from pytest_mig.device.nvml import package_versions

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

#: Modes whose fixed-batch steps on a GPU replay a CUDA graph of the whole step (:func:`uses_graph`).
GRAPH_MODES: tuple[str, ...] = ("full", "lora", "qlora")


# --------------------------------------------------------------------------- the run


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
            raise _out_of_memory(cfg, mode, budget, estimate, out_of_memory)
        assert trainer is not None and trainer.first_loss is not None
        info = _checked_info(trainer, target, run, batch, effort, compile_model, graphs)
        trainable = trainer.trainable
    finally:
        if trainer is not None:
            trainer.close()
        del trainer
        _release(device)
    return _metrics(target, cfg, mode, run, info, trainable)


def _out_of_memory(cfg: ModelConfig, mode: str, budget: int, estimate: MemoryEstimate, error: str) -> DoesNotFit:
    """The skip of a case that ran out of memory, with the budget, the estimate and the error's first line."""
    return DoesNotFit(f"{cfg.name} {mode} fine-tune ran out of memory on this Target ({budget / 2**30:.1f} GiB; "
                      f"{estimate.total / 1e9:.1f} GB estimated for the smallest batch; if this case ran here "
                      f"before, its memory use grew): {error}")


def _checked_info(trainer: _Trainer, target: Target, run: _Run, batch: str, effort: Effort, compile_model: bool,
                  graphs: int) -> dict[str, Any]:
    """Check that the model started at chance and learned (WorkloadError otherwise); the run's info."""
    cfg, mode, device = trainer.cfg, trainer.mode, target.device
    assert trainer.first_loss is not None
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
    return info


def _compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own count; 0 where it keeps none)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    stats = sys.modules["torch._dynamo"].utils.counters.get("stats", {})
    return int(stats.get("unique_graphs", 0))


def _engine_versions(mode: str) -> dict[str, str]:
    """Versions of the packages the mode ran through (they go into the record beside torch's)."""

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
    after = timing.window_calls + timing.busy_calls  # the energy window's steps, then a layout's untimed ones
    return _Run(n_batch, timing, measured_losses(losses, len(timing.samples), after), alloc, reserved,
                source, estimate, search, growth, phases)


def uses_graph(device: str, mode: str, batch: str, compile_model: bool) -> bool:
    """Whether the measured steps replay a CUDA graph of the whole step (:meth:`_Trainer.graphed_step_fn`):
    the eager fixed-batch cases on a GPU (full, LoRA and QLoRA, whose bitsandbytes kernels and
    gradient checkpointing capture too).  The largest batches keep eager steps (the GPU already
    waits on nothing there, and a graph's private memory pool beside the eager cache might not fit
    the batch the search found with eager steps); compiled cases run Inductor's code."""
    return device.startswith("cuda") and batch == "fixed" and mode in GRAPH_MODES and not compile_model


def measured_losses(losses: list[float], repeats: int, after: int) -> list[float]:
    """The losses of the measured steps among every step a timer call made.

    A timer runs warm-up calls (and, under pytest-benchmark, a short estimate and perhaps several
    calls per round), then the measured repeats, then the energy window's calls and, in a layout's
    slice, the untimed calls it made while the other slices timed theirs (``after``: all of those):
    the ``repeats`` calls just before them were all measured.
    """
    end = len(losses) - after
    if repeats < 1 or end < repeats:
        raise ValueError(f"{len(losses)} steps cannot hold {repeats} measured and {after} later steps")
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
    # For the same reason the step time there is informational (measure.batch_bound): that batch is
    # found anew on each stack and night, and a step's time grows with it where tokens/s does not.
    largest = info.get("batch_policy") == "maxbatch"
    step_kind, step_compared = ("info", False) if largest else ("training", True)
    metrics = [
        Metric("tokens_per_s", tok_s, "tokens/s", "higher", rates, kind="training", info={**info, "scaling": largest}),
        Metric(STEP_TIME, statistics.median(steps), "s", "lower", steps, kind=step_kind, compare=step_compared,
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
    "ALPHABET",
    "BATCH_POLICIES",
    "BETAS",
    "CONFIGS",
    "CONFIG_NAMES",
    "DATA_POOL",
    "GRAPH_WARMUP_STEPS",
    "INITIAL_LOSS_TOLERANCE",
    "LOGIT_BYTES",
    "LR",
    "LR_CPU",
    "MAX_GRAD_NORM",
    "MEMORY_SHARE",
    "MFU_FORMULA",
    "MIN_LOSS_DROP",
    "MODES",
    "OVERHEAD_BYTES",
    "SEED",
    "WEIGHT_DECAY",
    "BatchGrowth",
    "BatchSearch",
    "CycleTask",
    "LoraSpec",
    "MemoryEstimate",
    "ModelConfig",
    "activation_bytes_per_token",
    "check_fits",
    "check_initial_loss",
    "check_loss",
    "clip_gradients",
    "estimate_memory",
    "grow_batch",
    "is_oom",
    "lora_params",
    "max_batch_search",
    "measured_losses",
    "mfu_percent",
    "model_flops_per_token",
    "optimizer_step",
    "run_training",
    "usable_bytes",
]
