"""The Target a run measures: a real MIG instance, a whole GPU, an emulated profile, or the CPU.

This module holds the Target; :mod:`pytest_mig.device.plan` chooses it from the options, the
environment (CUDA_VISIBLE_DEVICES set by Slurm or Kubernetes) and the NVML inventory.  Here it is
pinned (CUDA_VISIBLE_DEVICES before CUDA starts) and verified once CUDA is up (SM count and memory
as CUDA sees them).  A user's mistake is a :class:`SelectionError` with one sentence; the plugin
turns it into ``pytest.UsageError``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from pytest_mig.device.profiles import GpuModel, ProfileSpec, lookup_model, model_slug

if TYPE_CHECKING:
    from pytest_mig.device.plan import Plan

TargetKind = Literal["mig", "full", "emulated", "cpu"]

#: Memory a CPU run lets its workloads use: the CPU is a correctness and smoke target, not measured for speed.
CPU_MEMORY_BUDGET = 2 * 2**30


class SelectionError(Exception):
    """A user's mistake in choosing the device: one sentence, shown without a traceback."""


class DoesNotFit(Exception):
    """The work cannot fit this Target (e.g. a 1.5B model on a 10 GB slice): a skip with the reason."""


@dataclass
class Target:
    """What a test runs on.  Workloads size themselves from ``sms`` and ``memory_bytes``."""

    kind: TargetKind
    profile: str  # "1g.10gb", "full" or "cpu"
    chosen_by: str  # "plugin", "scheduler (CUDA_VISIBLE_DEVICES)", "emulation", "--mig-device", "no GPU"
    gpu_name: str | None = None  # the parent GPU's name, e.g. "NVIDIA H200"
    uuid: str | None = None  # MIG-... for a slice, GPU-... for a whole GPU
    gpu_index: int | None = None  # NVML index of the parent GPU
    sms: int | None = None  # what the profile (or the whole GPU) should have
    sms_obtained: int | None = None  # what CUDA or the green context really gave
    memory_bytes: int | None = None  # the profile's memory, or the device's
    spec: ProfileSpec | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    verified: str = "not checked"  # outcome of the SM/memory check, in words
    notes: list[str] = field(default_factory=list)
    compute_capability: tuple[int, int] | None = None
    board: dict[str, Any] = field(default_factory=dict)  # the parent GPU: gpu_uuid, serial, pci_bus_id
    instance: dict[str, Any] = field(default_factory=dict)  # a MIG instance: gpu_instance_id, compute_instance_id

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def emulated(self) -> bool:
        return self.kind == "emulated"

    @property
    def device(self) -> str:
        """The torch device string: the pinned GPU is always cuda:0 in this process."""
        return "cpu" if self.is_cpu else "cuda:0"

    @property
    def gpu_slug(self) -> str:
        return "cpu" if self.is_cpu or not self.gpu_name else model_slug(self.gpu_name)

    @property
    def baseline_profile(self) -> str:
        """The key under which baselines are kept: emulated profiles apart from real slices."""
        return f"{self.profile}-emulated" if self.emulated else self.profile

    @property
    def model(self) -> GpuModel | None:
        """The catalog entry of the parent GPU (datasheet peaks, profile table), if known."""
        if self.is_cpu or not self.gpu_name:
            return None
        mib = self.fingerprint.get("memory_total_mib") if self.fingerprint else None
        return lookup_model(self.gpu_name, mib)

    def peak_tflops(self, precision: str) -> float | None:
        """Datasheet dense peak of this Target: the whole GPU's, scaled by the SMs it has."""
        model = self.model
        if model is None or not model.peak_tflops or precision not in model.peak_tflops:
            return None
        sms = self.effective_sms or model.sms
        return model.peak_tflops[precision] * sms / model.sms

    @property
    def effective_sms(self) -> int | None:
        return self.sms_obtained or self.sms

    def memory_budget(self) -> int:
        """Bytes a workload may plan to use (it still leaves headroom for the allocator)."""
        if self.is_cpu or not self.memory_bytes:
            return CPU_MEMORY_BUDGET
        return self.memory_bytes

    def label(self) -> str:
        if self.is_cpu:
            return "CPU"
        name = (self.gpu_name or "GPU").replace("NVIDIA ", "")
        if self.kind == "full":
            return f"{name} (whole GPU)"
        sms = f", {self.effective_sms} SMs" if self.effective_sms else ""
        return f"{name} {self.profile}" + (" (emulated" + sms + ")" if self.emulated else f" (MIG{sms})")

    def to_dict(self) -> dict[str, Any]:
        """The Target as it goes into result records and reports."""
        return {
            "kind": self.kind,
            "profile": self.profile,
            "baseline_profile": self.baseline_profile,
            "chosen_by": self.chosen_by,
            "gpu_name": self.gpu_name,
            "gpu_slug": self.gpu_slug,
            "uuid": self.uuid,
            "sms": self.sms,
            "sms_obtained": self.sms_obtained,
            "memory_bytes": self.memory_bytes,
            "verified": self.verified,
            "emulated": self.emulated,
            # which board, so that a report can name the one to pull (index, bus id, serial)
            "gpu_index": self.gpu_index,
            **self.board,
            **self.instance,
        }


# --------------------------------------------------------------------------- pinning and verifying


def cuda_initialized() -> bool:
    """Whether this process already started CUDA (then CUDA_VISIBLE_DEVICES can no longer pin it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def pin(plan: Plan, environ: "os._Environ[str] | dict[str, str]") -> None:
    """Set CUDA_VISIBLE_DEVICES before CUDA starts; refuse if CUDA started already on another device."""
    if plan.pin is None:
        return
    if cuda_initialized() and environ.get("CUDA_VISIBLE_DEVICES") != plan.pin:
        raise SelectionError(f"CUDA was initialised in this process before pytest-mig could pin {plan.pin}: "
                             "something (a conftest, a plugin) touched the GPU at import time; move that code "
                             "into a fixture or set CUDA_VISIBLE_DEVICES yourself.")
    environ["CUDA_VISIBLE_DEVICES"] = plan.pin


@dataclass(frozen=True)
class CudaProps:
    """What CUDA reports for device 0 of this process."""

    name: str
    sms: int
    total_memory: int
    capability: tuple[int, int]


def cuda_props() -> CudaProps | None:
    """Start CUDA on the pinned device and read it; None when this torch has no CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return CudaProps(p.name, int(p.multi_processor_count), int(p.total_memory), (int(p.major), int(p.minor)))


class VerificationError(SelectionError):
    """The device CUDA gave is not the one asked for."""


def verify(target: Target, props: CudaProps | None) -> Target:
    """Check SMs and memory as CUDA sees them against the Target; returns the Target with the outcome.

    MIG: SMs must match exactly and memory within 10%.  Whole GPU: SMs match the catalog's count.
    Emulated: CUDA sees the whole GPU; the SMs really obtained are read back by the emulator.
    """
    if target.is_cpu:
        return replace(target, verified="CPU run: nothing to verify")
    if props is None:
        raise VerificationError(f"NVML sees {target.gpu_name} but this PyTorch cannot use CUDA (is it a CPU-only "
                                "build?): install a CUDA build of torch, or hide the GPU with CUDA_VISIBLE_DEVICES=''.")
    t = replace(target, compute_capability=props.capability)
    if target.kind == "emulated":
        return replace(t, verified=f"CUDA sees the whole GPU ({props.sms} SMs); the green context limits it")
    problems = []
    if t.sms and props.sms != t.sms:
        problems.append(f"{props.sms} SMs where {t.profile} has {t.sms}")
    if t.memory_bytes and not (0.85 * t.memory_bytes <= props.total_memory <= 1.1 * t.memory_bytes):
        problems.append(f"{props.total_memory / 2**30:.1f} GiB where {t.profile} has {t.memory_bytes / 2**30:.1f} GiB")
    if target.kind == "mig" and " MIG " in props.name:
        cuda_profile = props.name.rsplit(" MIG ", 1)[1].strip()
        if cuda_profile.lower() != target.profile.lower():
            problems.append(f"CUDA names it '{props.name}'")
    if problems:
        raise VerificationError(f"the device CUDA gave is not the {t.profile} asked for: {'; '.join(problems)}.")
    return replace(t, sms_obtained=props.sms, memory_bytes=min(t.memory_bytes or props.total_memory, props.total_memory),
                   verified=f"ok: CUDA sees {props.sms} SMs and {props.total_memory / 2**30:.1f} GiB")
