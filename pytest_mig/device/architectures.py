"""NVIDIA architectures' per-SM arithmetic rates and GPU models' facts, as data (architectures.json).

A device's ceiling is what its SMs, clocks and memory bus can do at most: SMs x SM clock x the
architecture's FLOP per SM per clock for a precision, and memory clock x transfers per clock x
bus width.  NVML and CUDA report the SMs, clocks, bus width and compute capability; the rates per
SM are not reported by anything, so they are kept in ``architectures.json``, each derived from a
table NVIDIA publishes (a product's TFLOPS over its SMs and clock) and kept with that table, so
that a test recomputes every rate from its source.

Keyed by architecture, not by compute-capability major: 8.0 (A100) and 8.6 (A40, RTX 30xx) differ
by 32x in FP64 and 2x in FP32 per SM.  A product of an architecture may run some maths at another
rate than the architecture's data-centre parts (GeForce and the L40: half-rate TF32 and
FP32-accumulate tensor maths); those are *variants*, matched on the device name.  Facts of GPU
models that NVML does not report (the host link a datasheet promises) or that older records lack
(the memory bus width) are in ``models``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

#: The data file beside this module.
DATA = Path(__file__).with_name("architectures.json")
#: The units of rates: "cuda" (vector FMA on the CUDA cores) and "tensor" (the tensor cores).
UNITS = ("cuda", "tensor")


@dataclass(frozen=True)
class Architecture:
    """One architecture (as one product of it runs): FLOP per SM per clock per unit and precision."""

    key: str  # "hopper"
    name: str  # "Hopper"
    compute_capabilities: tuple[tuple[int, int], ...]
    cuda: Mapping[str, int] = field(default_factory=dict)
    tensor: Mapping[str, int] = field(default_factory=dict)
    green_context_sm_multiple: int | None = None  # the SM counts a green context gives (None: unknown)
    variant: str | None = None  # why a product's rates differ from the architecture's (None: they do not)
    no_ceiling: str | None = None  # why this product has no ceiling at all (None: it has one)

    def rate(self, unit: str, precision: str) -> int | None:
        """FLOP per SM per clock of ``unit`` ("cuda" or "tensor") in ``precision`` (None: not published)."""
        table = self.cuda if unit == "cuda" else self.tensor if unit == "tensor" else {}
        return table.get(precision)


@dataclass(frozen=True)
class ModelFacts:
    """What a GPU model's datasheet says that NVML does not report, or that older records lack."""

    name: str
    architecture: str  # a key of the architectures table
    memory_bus_bits: int | None
    memory_gbs: float | None  # the datasheet's memory bandwidth
    host_link: tuple[int, int] | None  # (PCIe generation, lanes)
    source: str


@dataclass(frozen=True)
class Table:
    """The whole data file, read."""

    architectures: Mapping[str, Architecture]
    variants: tuple[Mapping[str, Any], ...]
    models: tuple[tuple[re.Pattern[str], ModelFacts], ...]
    transfers_per_clock: int
    raw: Mapping[str, Any]


@lru_cache(maxsize=1)
def table() -> Table:
    """The data file, read once."""
    raw = json.loads(DATA.read_text(encoding="utf-8"))
    archs = {key: Architecture(key=key, name=a["name"],
                               compute_capabilities=tuple(parse_capability(c) for c in a["compute_capability"]),
                               cuda=dict(a.get("cuda") or {}), tensor=dict(a.get("tensor") or {}),
                               green_context_sm_multiple=a.get("green_context_sm_multiple"))
             for key, a in raw["architectures"].items()}
    models = tuple((re.compile(m["match"], re.IGNORECASE),
                    ModelFacts(name=m["name"], architecture=m["architecture"], memory_bus_bits=m.get("memory_bus_bits"),
                               memory_gbs=m.get("memory_gbs"),
                               host_link=tuple(m["host_link"]) if m.get("host_link") else None,  # type: ignore[arg-type]
                               source=m["source"]))
                   for m in raw["models"])
    return Table(archs, tuple(raw.get("variants") or ()), models, int(raw["memory"]["transfers_per_clock"]), raw)


def parse_capability(value: Any) -> tuple[int, int] | None:
    """'9.0', (9, 0) or [9, 0] -> (9, 0); None for anything else."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        try:
            return int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", str(value)) if isinstance(value, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def model_facts(gpu_name: str | None) -> ModelFacts | None:
    """The datasheet facts of the model this device name belongs to (None: not in the table)."""
    if not gpu_name:
        return None
    return next((facts for pattern, facts in table().models if pattern.search(gpu_name)), None)


def architecture_for(capability: Any, gpu_name: str | None = None) -> Architecture | None:
    """The architecture of a device: by its compute capability (what NVML and CUDA report), else by
    its model's facts; with the rates of the product variant its name matches.  None: unknown."""
    t = table()
    cc = parse_capability(capability)
    arch = next((a for a in t.architectures.values() if cc in a.compute_capabilities), None) if cc else None
    if arch is None and cc is None:
        facts = model_facts(gpu_name)
        arch = t.architectures.get(facts.architecture) if facts else None
    if arch is None or not gpu_name:
        return arch
    for v in t.variants:
        if arch.key in v["architectures"] and re.search(v["match"], gpu_name, re.IGNORECASE):
            if v.get("no_ceiling"):
                return replace(arch, no_ceiling=v["why"])
            return replace(arch, cuda={**arch.cuda, **(v.get("cuda") or {})},
                           tensor={**arch.tensor, **(v.get("tensor") or {})}, variant=v["why"])
    return arch


def fma_per_sm_per_clock(capability: Any, precision: str, gpu_name: str | None = None) -> int | None:
    """CUDA-core FMA instructions' results per SM per clock (half the FLOP) in ``precision``."""
    arch = architecture_for(capability, gpu_name)
    flop = arch.rate("cuda", precision) if arch is not None and arch.no_ceiling is None else None
    return flop // 2 if flop else None


def transfers_per_clock() -> int:
    """Memory transfers per NVML memory clock (the data file's ``memory`` block says why)."""
    return table().transfers_per_clock


__all__ = ["Architecture", "DATA", "ModelFacts", "UNITS", "architecture_for", "fma_per_sm_per_clock",
           "model_facts", "parse_capability", "table", "transfers_per_clock"]
