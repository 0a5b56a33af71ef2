"""The fingerprint's words: which facts a verdict names when they change, in what order, with what
labels and units (:func:`pytest_mig.device.nvml.fingerprint` reads the facts)."""

from __future__ import annotations

from typing import Any

#: Fingerprint keys in the order a verdict names them (likely culprits first), with their labels
#: and units.  Keys not listed here are still diffed, after these, in sorted order.
FINGERPRINT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("driver", "driver", ""),
    ("cuda_driver", "CUDA driver", ""),
    ("cuda_runtime", "CUDA runtime", ""),
    ("vbios", "VBIOS", ""),
    ("inforom", "InfoROM", ""),
    ("gsp", "GSP firmware", ""),
    ("ecc", "ECC", ""),
    ("power_limit_w", "power limit", " W"),
    ("max_sm_clock_mhz", "max SM clock", " MHz"),
    ("max_mem_clock_mhz", "max memory clock", " MHz"),
    ("memory_bus_width_bits", "memory bus", " bit"),
    ("compute_capability", "compute capability", ""),
    ("torch", "torch", ""),
    ("pytest_mig", "pytest-mig", ""),
    ("transformers", "transformers", ""),
    ("peft", "peft", ""),
    ("bitsandbytes", "bitsandbytes", ""),
    ("openmm", "OpenMM", ""),
    ("python", "Python", ""),
    ("gpu_name", "GPU", ""),
    ("gpu_uuid", "GPU board", ""),
    ("memory_total_mib", "memory", " MiB"),
    ("cpu_model", "CPU", ""),
)


def fingerprint_value(key: str, value: Any, unit: str = "") -> str:
    """A fingerprint value as verdicts show it: ``n/a``, ``on``/``off``, NVML's 12040 as ``12.4``, with its unit."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "on" if value else "off"
    if key in ("cuda_driver", "cuda_runtime") and isinstance(value, int) and value >= 1000:
        return f"{value // 1000}.{(value % 1000) // 10}"  # NVML's 12040 -> 12.4
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"


__all__ = ["FINGERPRINT_FIELDS", "fingerprint_value"]
