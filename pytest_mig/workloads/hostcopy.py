"""Host-device bandwidth: host-to-device, device-to-host and both at once, from pinned memory.

Transfers are large (1 GiB, 256 MiB in quick mode, never more than a quarter of the Target's
memory) so that the per-copy set-up vanishes and the link is saturated, as NVIDIA's
``bandwidthTest`` and nvbandwidth do; the host side is pinned (page-locked), as theirs is, so the
copy engines move the data by DMA.  Bidirectional runs both copies on two streams at once and
counts the bytes of both directions.

Each figure is put against the PCIe link's theoretical rate per direction from the generation and
width NVML reports as the link's maximum (:func:`pytest_mig.device.health.link_gbs`), read while copies
are in flight (links drop generation when idle).  A link trained down to x8 shows as about 50% of
that, and the link read under load is in each figure's info.  Every copy is checked: the bytes
that arrive are the bytes that were sent.  Each figure is the best of its copies
(:func:`pytest_mig.measure.best_rate`, as STREAM reports its best iteration): the host slows a copy
now and then, and nothing speeds one past the link, so the best moves far less from night to night
than the median (docs/detection.md); a link trained down, or a host that slows every copy, moves it.

The host's memory and PCIe switches are shared by its GPUs (:mod:`pytest_mig.device.host`): the
copies wait for the host's turn, so that pytest-mig runs on the other GPUs of the host copy before
or after, never meanwhile, and the other GPUs' PCIe traffic is read while they run.  A figure
measured while the others moved data is taken again after a pause (twice at most); still shared,
it carries the sentence that says so (``info["shared_host"]``) and is not judged.  A layout's
slices (``turn=False``) copy together on purpose: sharing the one GPU's link is what a layout
measures; they neither wait nor measure again (out of step with the others), only mark.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from pytest_mig.device.health import link_gbs
from pytest_mig.device.host import SHARED_HOST, SHARED_RETRIES, Neighbours, host_turn, measured_alone
from pytest_mig.measure import BEST, Metric, Timer, best_rate
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit, WorkloadError

#: Bytes per transfer (normal, quick), and the share of the Target's memory two buffers may take.
TRANSFER_BYTES = {False: 2**30, True: 2**28}
MEMORY_SHARE = 0.25
#: (warm-up, repeats) of each direction.
EFFORT = {False: (3, 20), True: (2, 8)}


def transfer_bytes(budget_bytes: int, quick: bool) -> int:
    """The transfer size: the mode's, within a share of the Target's memory, in whole MiB."""
    n = min(TRANSFER_BYTES[quick], int(budget_bytes * MEMORY_SHARE)) // 2**20 * 2**20
    if n < 2**26:
        raise DoesNotFit(f"host-device bandwidth: {n / 2**20:.0f} MiB buffers are too small to saturate a link")
    return n


def byte_pattern(n: int, device: str) -> torch.Tensor:
    """``n`` bytes ``i % 251`` on ``device``, made without an n-element int32 temporary (4 bytes per
    byte sent: 4 GiB beside a 1 GiB transfer, which a 10 GB slice could not hold with the buffers)."""
    return torch.arange(251, device=device, dtype=torch.uint8).repeat(-(-n // 251))[:n]


def _link_under_load(copy: Callable[[], Any], read_link: Callable[[], dict[str, int] | None] | None,
                     calls: int = 8) -> dict[str, int] | None:
    """The link's state read while ``calls`` copies are queued on the GPU (the best of three reads)."""
    if read_link is None:
        return None
    for _ in range(calls):
        copy()  # asynchronous: the host reads NVML while the copy engines work
    seen = [x for x in (read_link() for _ in range(3)) if x]
    torch.cuda.synchronize()
    return max(seen, key=lambda x: (x.get("gen", 0), x.get("width", 0))) if seen else None


def run_host_copies(target: Target, timer: Timer, *, quick: bool = False,
                    read_link: Callable[[], dict[str, int] | None] | None = None,
                    neighbours: Callable[[], Mapping[str, float]] | None = None, turn: bool = True,
                    lock: Path | None = None) -> list[Metric]:
    """H2D, D2H and bidirectional bandwidth in GB/s, each against the link's theoretical rate.

    ``neighbours`` reads the other GPUs' PCIe traffic now (GB/s by GPU); ``turn`` waits for the
    host's turn at host copies first (the module docstring), taken also on the file ``lock``
    (``--mig-host-lock``) where one is given."""
    if target.is_cpu or not torch.cuda.is_available():
        raise DoesNotFit("host-device bandwidth needs a GPU: there is no link to measure on the CPU")
    with host_turn(lock=lock) if turn else contextlib.nullcontext() as held:
        # a layout's slice never times out of step with the others: it is marked, not measured again
        metrics, watch, attempts = measured_alone(lambda: _copies(target, timer, quick, read_link), neighbours,
                                                  retries=SHARED_RETRIES if turn else 0)
    return mark_shared(metrics, watch, held, attempts)


def mark_shared(metrics: list[Metric], watch: Neighbours, held: Any = None, attempts: int = 1) -> list[Metric]:
    """The figures with what the host's other GPUs did meanwhile in their info (and the attempts,
    where the copies were taken again); the GB/s figures carry ``shared_host`` where the others moved
    more than the host module's limit."""
    shared = watch.shared()
    for m in metrics:
        if m.unit != "GB/s":
            continue
        m.info.update(watch.info())
        if held is not None:
            m.info.update(held.info())
        if attempts > 1:
            m.info["host_copy_attempts"] = attempts
        if shared:
            m.info[SHARED_HOST] = shared
    return metrics


def _copies(target: Target, timer: Timer, quick: bool,
            read_link: Callable[[], dict[str, int] | None] | None) -> list[Metric]:
    n = transfer_bytes(target.memory_budget(), quick)
    dev_src = byte_pattern(n, target.device)
    dev_dst = torch.empty(n, dtype=torch.uint8, device=target.device)
    host_src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host_src.copy_(dev_src)
    host_dst = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def h2d() -> None:
        dev_dst.copy_(host_src, non_blocking=True)

    def d2h() -> None:
        host_dst.copy_(dev_src, non_blocking=True)

    def both() -> None:
        main = torch.cuda.current_stream()
        up.wait_stream(main)
        down.wait_stream(main)
        with torch.cuda.stream(up):
            h2d()
        with torch.cuda.stream(down):
            d2h()
        main.wait_stream(up)
        main.wait_stream(down)

    link = _link_under_load(h2d, read_link)
    warmup, repeats = EFFORT[quick]
    out: list[Metric] = []
    rates: dict[str, float] = {}
    for name, fn, moved in (("h2d", h2d, n), ("d2h", d2h, n), ("bidir", both, 2 * n)):
        dev_dst.zero_()
        host_dst.zero_()
        timing = timer(fn, warmup=warmup, repeats=repeats, energy=False)
        torch.cuda.synchronize()
        _verify(name, dev_src, dev_dst, host_src, host_dst)
        samples = timing.rate_samples(moved / 1e9)
        rates[name] = best_rate(samples)
        if not math.isfinite(rates[name]):
            raise WorkloadError(f"host-device bandwidth: no {name} copy took a time that can be measured")
        info: dict[str, Any] = {"bytes": moved, "pinned": True, "statistic": BEST, "copies": len(samples),
                                **timing.clock_info()}
        if link:
            info["link_under_load"] = link
        out.append(Metric(f"{name}_gbs", rates[name], "GB/s", "higher", samples, kind="memory", info=info))
    out += _link_fractions(rates, link)
    return out


def _verify(name: str, dev_src: torch.Tensor, dev_dst: torch.Tensor, host_src: torch.Tensor,
            host_dst: torch.Tensor) -> None:
    """The bytes that arrived are those sent (a fast copy of the wrong bytes is a failure)."""
    if name in ("h2d", "bidir") and not torch.equal(dev_dst, dev_src):
        raise WorkloadError(f"host-device bandwidth: the {name} copy to the GPU delivered other bytes than were sent")
    if name in ("d2h", "bidir") and not torch.equal(host_dst, host_src):
        raise WorkloadError(f"host-device bandwidth: the {name} copy to the host delivered other bytes than were sent")


def _link_fractions(rates: dict[str, float], link: dict[str, int] | None) -> list[Metric]:
    """Each direction's share of the link's theoretical rate per direction (informational)."""
    if not link:
        return []
    full = link_gbs(link.get("max_gen"), link.get("max_width"))
    now = link_gbs(link.get("gen"), link.get("width"))
    if not full:
        return []
    info = {"link_gbs": round(full, 2), "link_now_gbs": round(now, 2) if now else None, "link_under_load": link}
    return [Metric(f"{name}_fraction_of_link", rates[name] / (full * (2 if name == "bidir" else 1)), "fraction",
                   "higher", [], kind="info", info=dict(info), compare=False) for name in ("h2d", "d2h", "bidir")]
