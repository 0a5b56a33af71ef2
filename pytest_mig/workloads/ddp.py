"""Multi-GPU training scaling (SparkTrainer's DDP table): the GPT-2-small training over 1, 2, 4 ... N GPUs.

Each GPU count runs as N fresh processes, one per GPU (``CUDA_VISIBLE_DEVICES`` set to that GPU's
UUID, as torchrun's one-process-per-GPU layout), joined by ``torch.distributed`` over NCCL and
training one model with DistributedDataParallel: bf16 autocast, fused AdamW, the gradients' global
norm clipped to 1.0 as the single-GPU trainer clips it (:func:`rank_step`), the cycle task with a
different stream of batches on every rank.  Rank 0 times the measured steps between barriers.

Checked on every count: the loss falls, and after training the parameters are identical on every
rank (DDP's all-reduce keeps the replicas in step; a checksum that differs is a wrong result).

NVLink multicast (NCCL's NVLS, PyTorch's symmetric memory, NVSHMEM) is off unless the caller set it: on shared hosts it has taken GPUs
out of service.  Figures: tokens/s at each count, and scaling efficiency = tokens/s at N over N
times tokens/s at 1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from pytest_mig.measure import Metric
from pytest_mig.workloads import WorkloadError

#: Per-GPU batch (sequences of 1024 tokens) and (warm-up, measured) steps, normal and quick.
BATCH = 8
STEPS = {False: (5, 30), True: (3, 12)}
#: Environment every rank gets unless the caller set it (see the module docstring).
NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
#: Seconds a count may take before its ranks are stopped.
TIMEOUT_S = 600


def gpu_counts(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself (SparkTrainer's 1, 2, 4, 8)."""
    out, k = [], 1
    while k < n:
        out.append(k)
        k *= 2
    return out + [n]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_count(devices: Sequence[str], quick: bool, folder: Path, python: str = sys.executable) -> list[dict]:
    """Train on ``devices`` (one process each) and return every rank's report."""
    port = _free_port()
    procs, outs = [], []
    for rank, dev in enumerate(devices):
        out = folder / f"ddp{len(devices)}-rank{rank}.json"
        outs.append(out)
        env = {**os.environ, **{k: os.environ.get(k, v) for k, v in NCCL_DEFAULTS.items()},
               "CUDA_VISIBLE_DEVICES": dev, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "WORLD_SIZE": str(len(devices))}
        cmd = [python, "-m", "pytest_mig.workloads.ddp", "--out", str(out)] + (["--quick"] if quick else [])
        log = open(folder / f"ddp{len(devices)}-rank{rank}.log", "wb")
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    codes = []
    try:
        for p, _ in procs:
            try:
                codes.append(p.wait(timeout=TIMEOUT_S))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(-9)
    except BaseException:  # the run is stopping (SIGTERM, Ctrl-C): no rank outlives it
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        raise
    finally:
        for _, log in procs:
            log.close()
    if any(codes):
        tail = (folder / f"ddp{len(devices)}-rank0.log").read_text(errors="replace").strip().splitlines()[-3:]
        raise WorkloadError(f"DDP on {len(devices)} GPU(s): ranks exited {codes}: {' | '.join(tail)}")
    return [json.loads(o.read_text()) for o in outs]


def run_ddp_scaling(devices: Sequence[str], *, quick: bool, folder: Path) -> list[Metric]:
    """Tokens/s and scaling efficiency for every GPU count up to len(devices)."""
    metrics: list[Metric] = []
    single = None
    for n in gpu_counts(len(devices)):
        reports = run_count(devices[:n], quick, folder)
        sums = {r["param_checksum"] for r in reports}
        if len(sums) != 1:
            raise WorkloadError(f"DDP on {n} GPUs: the ranks' parameters differ after training ({sorted(sums)}): "
                                "the gradients were not all-reduced")
        from pytest_mig.workloads.training import check_loss

        check_loss(reports[0]["losses"])
        tps = float(reports[0]["tokens_per_s"])
        info = {"gpus": n, "batch_per_gpu": BATCH, "steps": reports[0]["steps"], "nccl_nvls": reports[0]["nvls"]}
        metrics.append(Metric(f"ddp{n}_tokens_per_s", tps, "tokens/s", "higher", reports[0]["step_rates"],
                              kind="training", info=info))
        if n == 1:
            single = tps
        elif single:
            metrics.append(Metric(f"ddp{n}_scaling_efficiency", tps / (n * single), "fraction", "higher", [],
                                  kind="training", info={**info, "ideal": 1.0}))
    return metrics


def rank_step(model: Any, params: list[Any], opt: Any, tokens: Any, *, amp: bool = True) -> Any:
    """One rank's training step: the single-GPU trainer's (``training.optimizer_step``; DDP all-reduces
    the gradients in backward), their global norm clipped to ``training.MAX_GRAD_NORM`` (folded into
    fused AdamW).  Returns the loss, detached, with no host sync."""
    from pytest_mig.workloads.training import MAX_GRAD_NORM, clip_gradients, optimizer_step

    return optimizer_step(model, opt, tokens, amp=amp,
                          clip=lambda: clip_gradients(params, opt, MAX_GRAD_NORM, fused=True))


def _rank_main(out: Path, quick: bool) -> None:
    """One rank: train GPT-2-small under DDP, write tokens/s, losses and a parameter checksum."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from pytest_mig.workloads import hf
    from pytest_mig.workloads.training import CONFIGS, SEED, CycleTask

    dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = CONFIGS["gpt2-small"]
    # transformers' GPT-2, the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = hf.build_model(cfg, "cuda:0", torch.float32, seed=SEED)
    ddp = DistributedDataParallel(model, device_ids=[0])
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4, fused=True)
    task = CycleTask(cfg.vocab, cfg.seq_len, "cuda:0", seed=SEED + rank)
    warmup, steps = STEPS[quick]
    losses, times = [], []
    for i in range(warmup + steps):
        tokens_in = task.batch(BATCH)
        if i == warmup:
            dist.barrier()
            torch.cuda.synchronize()
            start = time.perf_counter()
        t0 = time.perf_counter()
        loss = rank_step(ddp, params, opt, tokens_in)
        if i >= warmup:
            losses.append(loss)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    dist.barrier()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    tokens = world * BATCH * cfg.seq_len
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    out.write_text(json.dumps({
        "rank": rank, "world": world, "steps": steps, "tokens_per_s": tokens * steps / elapsed,
        "step_rates": [tokens / t for t in times], "losses": [float(x) for x in losses],
        "param_checksum": f"{checksum:.10e}", "nvls": os.environ.get("NCCL_NVLS_ENABLE"),
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of pytest-mig's DDP scaling benchmark")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    a = parser.parse_args()
    _rank_main(a.out, a.quick)
