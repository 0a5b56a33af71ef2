"""MIG profile names, the catalog of known GPUs' profiles, and ideal ratios between profiles.

The catalog describes GPUs that are not at hand (for tests, for `pytest-mig devices` on a machine
without the GPU, and as a fallback when NVML cannot answer).  On a real GPU the live profile table
read through NVML wins: see :func:`pytest_mig.device.nvml.discover`.  Values come from the NVIDIA MIG user
guide and `nvidia-smi mig -lgip` captures; the H200 rows were read on a real H200.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Literal

from pytest_mig.common.text import SHOWN, quoted

FULL = "full"
ALL = "all"
CPU = "cpu"

_PROFILE_RE = re.compile(
    r"(?:(?P<ci>[1-8])c\.)?(?P<gi>[1-8])g\.(?P<mem>[0-9]{1,5})gb(?P<me>\+me)?\Z", re.IGNORECASE
)


class ProfileError(ValueError):
    """A profile name that is malformed or unknown: a user's mistake, reported in one sentence."""


@dataclass(frozen=True, order=True)
class ProfileName:
    """A parsed MIG profile name such as ``1g.10gb``, ``1g.10gb+me`` or ``1c.3g.40gb``."""

    gpu_slices: int
    memory_gb: int
    compute_slices: int
    media: bool = False

    @property
    def gi_name(self) -> str:
        """The GPU-instance part of the name (``1c.3g.40gb`` -> ``3g.40gb``)."""
        return f"{self.gpu_slices}g.{self.memory_gb}gb" + ("+me" if self.media else "")

    @property
    def is_compute_instance(self) -> bool:
        return self.compute_slices != self.gpu_slices

    def __str__(self) -> str:
        prefix = f"{self.compute_slices}c." if self.is_compute_instance else ""
        return prefix + self.gi_name


def parse_profile(text: str) -> ProfileName:
    """Parse ``<X>g.<Y>gb[+me]`` or ``<n>c.<X>g.<Y>gb``; raise ProfileError with the expected form."""
    m = _PROFILE_RE.match(text.strip())
    if not m:
        raise ProfileError(
            f"{quoted(text, SHOWN)} is not a MIG profile name: expected <slices>g.<memory>gb such as 1g.10gb, "
            f"1g.10gb+me or 1c.3g.40gb, or 'full' or 'all'"
        )
    gi = int(m["gi"])
    ci = int(m["ci"]) if m["ci"] else gi
    if ci > gi:
        raise ProfileError(f"{quoted(text, SHOWN)}: a compute instance cannot have more slices ({ci}) than its GPU instance ({gi})")
    return ProfileName(gpu_slices=gi, memory_gb=int(m["mem"]), compute_slices=ci, media=bool(m["me"]))


@dataclass(frozen=True)
class ProfileSpec:
    """One GPU-instance profile of one GPU model."""

    name: str
    sms: int | None  # None where no public table gives it; NVML answers on the real GPU
    memory_gib: float
    memory_fraction: Fraction  # of the GPU's memory slices (1/8 on most, 1/4 on A30)
    copy_engines: int | None
    max_instances: int
    approximate: bool = False  # memory or SMs estimated, not read from a real table

    @property
    def parsed(self) -> ProfileName:
        return parse_profile(self.name)

    @property
    def slices(self) -> int:
        return self.parsed.gpu_slices

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model in the catalog: how NVML names it and its MIG profiles."""

    key: str
    name_pattern: str  # regex on the NVML/torch device name
    memory_gib: float  # whole-GPU memory, to tell 40 GB from 80 GB parts
    sms: int  # with MIG off
    profiles: tuple[ProfileSpec, ...]
    peak_tflops: dict[str, float] | None = None  # dense datasheet peaks, whole GPU
    peak_memory_tbs: float | None = None

    def profile(self, name: str) -> ProfileSpec | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    @property
    def profile_names(self) -> list[str]:
        return [p.name for p in self.profiles]


def _p(name: str, sms: int | None, gib: float, frac: str, ce: int | None, n: int, approx: bool = False) -> ProfileSpec:
    return ProfileSpec(name, sms, gib, Fraction(frac), ce, n, approx)


_HOPPER_PEAKS = {"fp64": 34.0, "fp64_tensor": 67.0, "fp32": 67.0, "tf32": 495.0, "bf16": 989.0, "fp16": 989.0, "fp8": 1979.0}
_AMPERE_PEAKS = {"fp64": 9.7, "fp64_tensor": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}

CATALOG: tuple[GpuModel, ...] = (
    GpuModel("A100-SXM4-40GB", r"A100.*40GB|A100-(SXM4|PCIE)-40GB", 40, 108, (
        _p("1g.5gb", 14, 4.75, "1/8", 1, 7), _p("1g.5gb+me", 14, 4.75, "1/8", 1, 1),
        _p("1g.10gb", 14, 9.75, "2/8", 1, 4), _p("2g.10gb", 28, 9.75, "2/8", 2, 3),
        _p("3g.20gb", 42, 19.62, "4/8", 3, 2), _p("4g.20gb", 56, 19.62, "4/8", 4, 1),
        _p("7g.40gb", 98, 39.25, "8/8", 7, 1),
    ), _AMPERE_PEAKS, 1.555),
    GpuModel("A100-80GB", r"A100.*80GB", 80, 108, (
        _p("1g.10gb", 14, 9.5, "1/8", 1, 7), _p("1g.10gb+me", 14, 9.5, "1/8", 1, 1),
        _p("1g.20gb", 14, 19.5, "2/8", 1, 4), _p("2g.20gb", 28, 19.5, "2/8", 2, 3),
        _p("3g.40gb", 42, 39.25, "4/8", 3, 2), _p("4g.40gb", 56, 39.25, "4/8", 4, 1),
        _p("7g.80gb", 98, 79.0, "8/8", 7, 1),
    ), _AMPERE_PEAKS, 2.039),
    GpuModel("A30", r"\bA30\b", 24, 56, (
        _p("1g.6gb", 14, 5.81, "1/4", 1, 4), _p("1g.6gb+me", 14, 5.81, "1/4", 1, 1),
        _p("2g.12gb", 28, 11.69, "2/4", 2, 2), _p("2g.12gb+me", 28, 11.69, "2/4", 2, 1),
        _p("4g.24gb", 56, 23.44, "4/4", 4, 1),
    ), {"fp64": 5.2, "fp32": 10.3, "tf32": 82.0, "bf16": 165.0, "fp16": 165.0}, 0.933),
    GpuModel("H100-SXM5-80GB", r"H100 80GB HBM3|H100-SXM|H100 SXM", 80, 132, (
        _p("1g.10gb", 16, 9.75, "1/8", 1, 7), _p("1g.10gb+me", 16, 9.75, "1/8", 1, 1),
        _p("1g.20gb", 26, 19.62, "2/8", 1, 4), _p("2g.20gb", 32, 19.62, "2/8", 2, 3),
        _p("3g.40gb", 60, 39.5, "4/8", 3, 2), _p("4g.40gb", 64, 39.5, "4/8", 4, 1),
        _p("7g.80gb", 132, 79.25, "8/8", 8, 1),
    ), _HOPPER_PEAKS, 3.35),
    GpuModel("H100-PCIe-80GB", r"H100 PCIe|H100-PCIE", 80, 114, (
        _p("1g.10gb", 14, 9.75, "1/8", 1, 7), _p("1g.10gb+me", 14, 9.75, "1/8", 1, 1),
        _p("1g.20gb", 14, 19.62, "2/8", 1, 4), _p("2g.20gb", 30, 19.62, "2/8", 2, 3),
        _p("3g.40gb", 46, 39.5, "4/8", 3, 2), _p("4g.40gb", 62, 39.5, "4/8", 4, 1),
        _p("7g.80gb", 114, 79.25, "8/8", 7, 1),
    ), {"fp64": 26.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}, 2.0),
    GpuModel("H100-NVL-94GB", r"H100 NVL", 94, 132, (
        _p("1g.12gb", 16, 10.75, "1/8", 1, 7), _p("1g.12gb+me", 16, 10.75, "1/8", 1, 1),
        _p("1g.24gb", 26, 21.62, "2/8", 1, 4, True), _p("2g.24gb", 32, 21.62, "2/8", 2, 3, True),
        _p("3g.47gb", 60, 46.38, "4/8", 3, 2, True), _p("4g.47gb", 64, 46.38, "4/8", 4, 1, True),
        _p("7g.94gb", 132, 93.12, "8/8", 8, 1),
    ), _HOPPER_PEAKS, 3.9),
    GpuModel("GH200-96GB", r"GH200", 96, 132, (
        _p("1g.12gb", 16, 11.0, "1/8", 1, 7, True), _p("1g.12gb+me", 16, 11.0, "1/8", 1, 1, True),
        _p("1g.24gb", 26, 23.0, "2/8", 1, 4, True), _p("2g.24gb", 32, 23.0, "2/8", 2, 3, True),
        _p("3g.48gb", 60, 46.75, "4/8", 3, 2, True), _p("4g.48gb", 64, 46.75, "4/8", 4, 1, True),
        _p("7g.96gb", 132, 94.5, "8/8", 8, 1, True),
    ), _HOPPER_PEAKS, 4.0),
    GpuModel("H200-141GB", r"H200", 141, 132, (
        _p("1g.18gb", 16, 16.0, "1/8", 1, 7), _p("1g.18gb+me", 16, 16.0, "1/8", 1, 1),
        _p("1g.35gb", 26, 32.5, "2/8", 1, 4), _p("2g.35gb", 32, 32.5, "2/8", 2, 3),
        _p("3g.71gb", 60, 69.75, "4/8", 3, 2), _p("4g.71gb", 64, 69.75, "4/8", 4, 1),
        _p("7g.141gb", 132, 140.0, "8/8", 8, 1),
    ), _HOPPER_PEAKS, 4.8),
    GpuModel("B200-180GB", r"B200", 180, 148, (
        _p("1g.23gb", 18, 22.0, "1/8", 1, 7, True), _p("1g.23gb+me", 18, 22.0, "1/8", 1, 1, True),
        _p("1g.45gb", None, 44.0, "2/8", 1, 4, True), _p("2g.45gb", None, 44.0, "2/8", 2, 3, True),
        _p("3g.90gb", None, 88.0, "4/8", 3, 2, True), _p("4g.90gb", None, 88.0, "4/8", 4, 1, True),
        _p("7g.180gb", 148, 176.0, "8/8", 8, 1, True),
    ), None, 8.0),
)


def lookup_model(gpu_name: str, memory_mib: float | None = None) -> GpuModel | None:
    """The catalog entry for a device name such as 'NVIDIA A100-SXM4-40GB' (memory breaks ties)."""
    base = strip_mig_suffix(gpu_name)
    candidates = [m for m in CATALOG if re.search(m.name_pattern, base, re.IGNORECASE)]
    if not candidates:
        return None
    if memory_mib is None or len(candidates) == 1:
        return candidates[0]
    gib = memory_mib / 1024
    return min(candidates, key=lambda m: abs(m.memory_gib - gib))


def strip_mig_suffix(device_name: str) -> str:
    """'NVIDIA A100-SXM4-40GB MIG 1g.5gb' -> 'NVIDIA A100-SXM4-40GB'."""
    return re.sub(r"\s+MIG\s+\S+$", "", device_name.strip())


def model_slug(device_name: str) -> str:
    """Directory name for a GPU model's baselines: 'NVIDIA H200' -> 'nvidia-h200'."""
    base = strip_mig_suffix(device_name)
    return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-") or "unknown-gpu"


Basis = Literal["slices", "sms", "memory"]


def ideal_ratio(bigger: ProfileSpec, smaller: ProfileSpec, basis: Basis = "slices") -> float:
    """Ideal ratio of a metric between two profiles (throughput-like: bigger over smaller).

    'slices' is the user's default (7/3, 3/2, 2/1); 'sms' is exact for compute-bound work where
    the SM counts differ from the slice ratio (H100/H200: 132/60); 'memory' follows memory slices
    for bandwidth-bound work.
    """
    if basis == "slices":
        return bigger.slices / smaller.slices
    if basis == "sms":
        if not bigger.sms or not smaller.sms:
            raise ProfileError(f"SM counts of {bigger.name} or {smaller.name} are unknown")
        return bigger.sms / smaller.sms
    if basis == "memory":
        return float(bigger.memory_fraction / smaller.memory_fraction)
    raise ProfileError(f"unknown scaling basis {quoted(basis)}: use slices, sms or memory")


def ladder(profiles: Iterable[ProfileSpec]) -> list[ProfileSpec]:
    """The profiles of a sweep, smallest first: one per name, media-engine variants left out
    (they have the same compute and memory as their plain twin)."""
    chosen = [p for p in profiles if not p.parsed.media]
    return sorted(chosen, key=lambda p: (p.slices, p.memory_fraction, p.name))
