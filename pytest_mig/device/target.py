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
from typing import TYPE_CHECKING, Any, Literal, Mapping

from pytest_mig.device.profiles import GpuModel, ProfileSpec, lookup_model, model_slug

if TYPE_CHECKING:
    from pytest_mig.device.plan import Plan

TargetKind = Literal["mig", "full", "emulated", "cpu"]

#: What marks an emulated profile's history apart from a real slice's: ``3g.71gb-emulated``.
EMULATED_SUFFIX = "-emulated"

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
        return f"{self.profile}{EMULATED_SUFFIX}" if self.emulated else self.profile

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

    def info(self) -> "TargetInfo":
        """What a result record keeps of this Target."""
        return TargetInfo(self.kind, self.profile, self.baseline_profile, self.chosen_by, self.gpu_name, self.gpu_slug,
                          self.uuid, self.sms, self.sms_obtained, self.memory_bytes, self.verified, self.emulated,
                          self.gpu_index, dict(self.board), dict(self.instance))

    def to_dict(self) -> dict[str, Any]:
        """The Target as it goes into result files and reports."""
        return self.info().to_dict()


#: The keys of a recorded Target whose values :class:`TargetInfo` holds as its own fields, in the order written.
TARGET_KEYS: tuple[str, ...] = ("kind", "profile", "baseline_profile", "chosen_by", "gpu_name", "gpu_slug", "uuid", "sms",
                                "sms_obtained", "memory_bytes", "verified", "emulated", "gpu_index")
#: The parent GPU's keys (a report names the board to pull by them) and a MIG instance's.
BOARD_KEYS: tuple[str, ...] = ("gpu_uuid", "gpu_serial", "pci_bus_id")
INSTANCE_KEYS: tuple[str, ...] = ("mig_index", "gpu_instance_id", "compute_instance_id")


@dataclass(frozen=True)
class TargetInfo:
    """The Target a figure was measured on, as its result record keeps it.

    Built from a live :class:`Target` (:meth:`Target.info`) or from a results file's ``target`` object
    (:meth:`from_dict`), where any key may be missing: a missing one is None here, and the properties
    below work out what a history needs from what is there.  ``board`` holds the parent GPU's keys
    present (:data:`BOARD_KEYS`), ``instance`` a MIG instance's (:data:`INSTANCE_KEYS`), ``extra``
    any other key, written back as they were.
    """

    kind: str | None = None  # "mig", "full", "emulated" or "cpu"
    profile: str | None = None
    baseline_profile: str | None = None
    chosen_by: str | None = None
    gpu_name: str | None = None
    gpu_slug: str | None = None
    uuid: str | None = None
    sms: int | None = None
    sms_obtained: int | None = None
    memory_bytes: int | None = None
    verified: str | None = None
    emulated: bool | None = None
    gpu_index: int | None = None
    board: Mapping[str, Any] = field(default_factory=dict)
    instance: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_emulated(self) -> bool:
        return bool(self.emulated) or self.kind == "emulated"

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def history_profile(self) -> str:
        """The profile its figures' history is kept under: emulated profiles apart (``3g.71gb-emulated``)."""
        profile = str(self.baseline_profile or self.profile or "")
        return profile + EMULATED_SUFFIX if self.is_emulated and not profile.endswith(EMULATED_SUFFIX) else profile

    @property
    def history_slug(self) -> str:
        """The GPU model's slug its figures' history is kept under (``cpu`` for the CPU)."""
        if self.gpu_slug:
            return self.gpu_slug
        return "cpu" if self.is_cpu or not self.gpu_name else model_slug(self.gpu_name)

    @property
    def model_name(self) -> str:
        """The GPU model's name (``CPU`` for the CPU)."""
        slug = self.history_slug
        return "CPU" if slug == "cpu" else str(self.gpu_name or slug)

    @property
    def gpu_uuid(self) -> str | None:
        return self.board.get("gpu_uuid")

    @property
    def gpu_serial(self) -> str | None:
        return self.board.get("gpu_serial")

    @property
    def pci_bus_id(self) -> str | None:
        return self.board.get("pci_bus_id")

    @property
    def gpu_instance_id(self) -> int | None:
        return self.instance.get("gpu_instance_id")

    @property
    def slowed_to_sms(self) -> int | None:
        """The SMs a detection experiment slowed a whole GPU to (``--mig-slowdown-sms``), else None."""
        return self.extra.get("slowed_to_sms")

    def to_dict(self) -> dict[str, Any]:
        """The ``target`` object of a results file."""
        return {**{k: getattr(self, k) for k in TARGET_KEYS}, **self.board, **self.instance, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "TargetInfo":
        """A results file's ``target`` object, its types checked already by the file's schema
        (:data:`pytest_mig.store.schemas.TARGET`)."""
        d = dict(d or {})
        return cls(**{k: d.pop(k) for k in TARGET_KEYS if k in d},
                   board={k: d.pop(k) for k in BOARD_KEYS if k in d},
                   instance={k: d.pop(k) for k in INSTANCE_KEYS if k in d}, extra=d)


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
