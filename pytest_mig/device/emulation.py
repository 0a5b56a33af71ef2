"""Emulating a MIG profile on a GPU whose MIG mode is off: a green context with the profile's SMs
and a cap on memory.

Only SMs are partitioned: memory bandwidth, L2 and copy engines stay shared, so bandwidth figures
under emulation are labelled and kept out of scaling checks.  The driver rounds SM requests (Hopper
wants multiples of 8), so the SM count really obtained is read back and reported.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Iterator, Sequence

from pytest_mig.device.mps import current_context, current_context_sms, make_current
from pytest_mig.device.target import Target


def read_back_sms() -> tuple[int | None, str]:
    """SMs available to the current CUDA context, and how that was read.

    First the driver's own answer (cuCtxGetDevResource on the current context:
    :func:`mps.current_context_sms`); then an observation: a Triton kernel that writes each block's
    %smid, counted over many blocks.
    """
    n = current_context_sms()
    if n:
        return n, "driver (cuCtxGetDevResource)"
    n = _sms_observed()
    if n:
        return n, "observed (%smid of running blocks)"
    return None, "not read back"


_SMID_KERNEL: Any = None


def _smid_kernel() -> Any:
    global _SMID_KERNEL
    if _SMID_KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def smid_kernel(out_ptr, spin, BLOCK: tl.constexpr):
            lanes = tl.arange(0, BLOCK)
            sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [lanes], dtype=tl.int32, is_pure=False, pack=1)
            acc = lanes.to(tl.float32)
            for _ in range(spin):  # keep blocks resident long enough to spread over every SM
                acc = acc * 0.999 + 1.0
            tl.store(out_ptr + tl.program_id(0) * BLOCK + lanes, sm + (acc < -1.0).to(tl.int32))

        _SMID_KERNEL = smid_kernel
    return _SMID_KERNEL


def _sms_observed() -> int | None:
    try:
        import torch

        kernel = _smid_kernel()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        blocks = 16 * int(props.multi_processor_count)
        out = torch.full((blocks * 32,), -1, dtype=torch.int32, device="cuda")
        kernel[(blocks,)](out, 20000, BLOCK=32)
        torch.cuda.synchronize()
        ids = out.view(blocks, 32)[:, 0]
        if bool((ids < 0).any()):
            return None
        return int(torch.unique(ids).numel())
    except Exception:
        return None


def warm_up_blas(device_index: int = 0) -> None:
    """Run each matmul precision once in the primary context, before any green context.

    cuBLAS sizes some kernels from the SM count it sees when a kernel family is first used, for the
    rest of the process: on the H200, a TF32 matmul first run in a 16-SM green context ran at the
    16-SM speed (57 TFLOPS) in every context afterwards, the 132-SM one and the primary included,
    while after a first use in the primary context it gave 394 TFLOPS with 132 SMs, 205 with 64 and
    the same 57 with 16.  Warming up on the whole GPU keeps every profile of a sweep honest.
    """
    import torch

    device = f"cuda:{device_index}"
    keep = torch.backends.cuda.matmul.allow_tf32
    try:
        for dtype, tf32 in ((torch.float32, True), (torch.float32, False), (torch.float64, False),
                            (torch.bfloat16, False), (torch.float16, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.ones(1024, 1024, device=device, dtype=dtype)
            a @ a
        torch.cuda.synchronize(device_index)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = keep


@contextlib.contextmanager
def set_device_keeps_context(device_index: int) -> Iterator[None]:
    """While a green context of ``device_index`` is current, ``torch.cuda.set_device`` of that same
    device changes nothing.

    torch's ``set_device`` forces ``cudaSetDevice``, which makes the device's primary context current
    on the calling thread, even where the device already is the current one.  Inductor's generated
    code calls ``torch.cuda.set_device(0)`` before each compiled graph: on an H200, the first compiled
    GPT-2 step under a 60-SM green context left the thread in the primary context (132 SMs, read back
    with cuCtxGetDevResource) and the green context could not be popped.  The kernels still went to
    the green context's stream (the figures matched those after this guard to 0.01%), but any
    stream or context made from then on would have been the whole GPU's.  Asking for the device the
    green context lives on is already satisfied; another device is passed on (and then caught by
    :meth:`Emulator.escaped`).
    """
    import torch
    from torch.cuda._utils import _get_device_index

    original = torch.cuda.set_device

    def set_device(device: Any) -> None:
        if _get_device_index(device, optional=True) == device_index:
            return
        original(device)

    torch.cuda.set_device = set_device
    try:
        yield
    finally:
        torch.cuda.set_device = original


class Emulator:
    """Creates one green context per SM count (reused across tests) and activates it around a test."""

    def __init__(self, device_index: int = 0) -> None:
        import torch

        # A green context is carved from the device's primary context: start it first.
        torch.empty(1, device=f"cuda:{device_index}")
        warm_up_blas(device_index)
        self.device_index = device_index
        self._contexts: dict[int, Any] = {}
        self._obtained: dict[int, tuple[int | None, str]] = {}
        self._streams: dict[int, Any] = {}
        self._active: tuple[int, int] | None = None  # (the current green context's CUcontext, its SMs)

    def escaped(self) -> str | None:
        """Why the work on this thread is no longer in the active green context, None while it is
        (or where none is active): a figure measured after such an escape is not the profile's."""
        if self._active is None:
            return None
        context, sms = self._active
        if current_context() == context:
            return None
        now = current_context_sms()
        return (f"the test's CUDA work left the profile's green context of {sms} SMs (the thread's current context "
                f"now has {now if now else 'an unknown number of'} SMs), so its figures would be another "
                f"context's, not the profile's")

    def _context(self, sms: int) -> Any:
        if sms not in self._contexts:
            from torch.cuda.green_contexts import GreenContext

            self._contexts[sms] = GreenContext.create(num_sms=sms, device_id=self.device_index)
        return self._contexts[sms]

    def _stream(self, sms: int, ctx: Any) -> Any:
        """A stream of the green context's own, reused across tests.

        ``set_context`` leaves PyTorch on the legacy default stream, whose id is the same in every
        context, so the caching allocator takes the green context's null stream for the primary
        one's and reuses memory without ordering: on the H200 a cross-entropy backward in a 16-SM
        green context returned NaN gradients on its second call (and a cold cuBLASLt GEMM hit an
        illegal address), while on a green-context stream every result matched the primary
        context's to the last digit.
        """
        if sms not in self._streams:
            make = getattr(ctx, "Stream", None)
            self._streams[sms] = make() if callable(make) else None
        return self._streams[sms]

    @contextlib.contextmanager
    def _enter(self, sms: int, fraction: float) -> Iterator[tuple[int | None, str]]:
        """Make the green context of ``sms`` SMs current, with its own stream and a memory cap of
        ``fraction`` of the device; yields the SMs obtained and how that was read."""
        import torch

        ctx = self._context(sms)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(fraction, self.device_index)
        ctx.set_context()
        green = current_context()
        try:
            stream = self._stream(sms, ctx)
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(), \
                    set_device_keeps_context(self.device_index):
                if sms not in self._obtained:
                    self._obtained[sms] = read_back_sms()
                self._active = (green, sms) if green else None
                yield self._obtained[sms]
                torch.cuda.synchronize()
        finally:
            self._active = None
            torch.cuda.synchronize()
            if green and current_context() != green:  # something replaced it (escaped() said so): pop ours
                make_current(green)
            ctx.pop_context()
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(1.0, self.device_index)

    @contextlib.contextmanager
    def activate(self, target: Target) -> Iterator[Target]:
        """Run the block inside the profile's green context with its memory cap; restore afterwards."""
        import torch

        if not target.sms:
            raise RuntimeError(f"the SM count of {target.profile} is unknown, so it cannot be emulated")
        total = torch.cuda.get_device_properties(self.device_index).total_memory
        fraction = min(1.0, (target.memory_bytes or total) / total)
        with self._enter(target.sms, fraction) as (got, how):
            note = (f"green context: {target.sms} SMs asked, {got if got else '?'} obtained ({how}); "
                    f"memory capped at {fraction * total / 2**30:.1f} GiB")
            yield replace(target, sms_obtained=got, verified=note)

    @contextlib.contextmanager
    def slowed(self, target: Target, sms: int) -> Iterator[Target]:
        """Run a whole-GPU Target's test on only ``sms`` of its SMs (a green context, memory not
        capped): a real, physical slowdown for the detection experiment, judged as the whole GPU."""
        with self._enter(sms, 1.0) as (got, how):
            yield replace(target, verified=f"{target.verified}; slowed on purpose to a green context of {sms} SMs "
                                           f"({got if got else '?'} obtained, {how})")


def distinct_contexts(targets: Sequence[Target]) -> tuple[list[Target], list[str]]:
    """An emulated sweep's Targets with each green context measured once, and a sentence per profile left out.

    The driver rounds an SM request (Hopper: to a multiple of 8), so two profiles can obtain the same
    context: an H100's 3g.40gb asks 60 SMs and gets the 64 of its 4g.40gb, with the same memory cap.
    Their tests would measure one configuration twice, which buys no verdict.  Of profiles whose
    contexts obtained the same SMs and the same memory, the one that got the SMs it asked for stands
    for the others (else the first in ladder order).  A Target whose SMs were not read back is kept.
    """
    groups: dict[tuple[int, int | None], list[Target]] = {}
    for t in targets:
        if t.emulated and t.sms_obtained:
            groups.setdefault((t.sms_obtained, t.memory_bytes), []).append(t)
    left: dict[str, str] = {}
    for (sms, memory), same in groups.items():
        if len(same) < 2:
            continue
        kept = next((t for t in same if t.sms == t.sms_obtained), same[0])
        for t in same:
            if t is not kept:
                gib = f" and {memory / 2**30:.1f} GiB" if memory else ""
                left[t.profile] = (f"{t.profile} left out of the sweep: its green context obtained the same {sms} "
                                   f"SMs{gib} as {kept.profile}'s ({t.sms} asked), so it would measure the same "
                                   f"configuration again; measured once, as {kept.profile} (--mig-all-tests "
                                   f"measures both)")
    return [t for t in targets if t.profile not in left], list(left.values())
