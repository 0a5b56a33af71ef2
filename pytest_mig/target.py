"""The Target a run measures: a real MIG instance, a whole GPU, an emulated profile, or the CPU.

This module chooses the Target from the options, the environment (CUDA_VISIBLE_DEVICES set by
Slurm or Kubernetes) and the NVML inventory; pins it (CUDA_VISIBLE_DEVICES before CUDA starts);
and verifies it once CUDA is up (SM count and memory as CUDA sees them).  A user's mistake is a
:class:`SelectionError` with one sentence; the plugin turns it into ``pytest.UsageError``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .profiles import ALL, CPU, FULL, GpuModel, ProfileError, ProfileSpec, ladder, lookup_model, model_slug, parse_profile

TargetKind = Literal["mig", "full", "emulated", "cpu"]

#: Memory a CPU run lets its workloads use: the CPU is a correctness and smoke target, not measured for speed.
CPU_MEMORY_BUDGET = 2 * 2**30


class SelectionError(Exception):
    """A user's mistake in choosing the device: one sentence, shown without a traceback."""


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
        }
