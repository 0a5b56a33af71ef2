"""What a measurement's clock readings say: the SM clock it ran at and the power or thermal throttle
it met.

A workload's timing writes the readings into its metric's ``info["clocks"]``
(:meth:`pytest_mig.measure.timing.Timing.info`): a snapshot ``before`` and ``after`` the
measurement (SM clock, NVML's clock-event reasons) and the mean SM clock sampled through its energy
``window``.  Everything that judges a figure reads them through :class:`Clocks`
(``metric.clocks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

#: NVML clock-event reasons that mean power or heat held the clocks down (names as the nvml module
#: writes them); idle, application-clock and sync-boost reasons do not slow a busy GPU.
THROTTLE_REASONS: tuple[str, ...] = ("sw_power_cap", "hw_power_brake", "hw_slowdown", "sw_thermal", "hw_thermal")


def throttle_reasons(info: Mapping[str, Any] | None) -> list[str]:
    """Power or thermal throttle reasons seen before or after a measurement (``info["clocks"]``).

    Reasons that do not slow a busy GPU (idle, application clocks, sync boost) are left out; a
    snapshot marked ``throttled`` with none of the known names still counts, under its own names.
    """
    found: list[str] = []
    clocks = (info or {}).get("clocks") or {}
    if not isinstance(clocks, Mapping):
        return found
    for phase in ("before", "after"):
        snap = clocks.get(phase) or {}
        if not isinstance(snap, Mapping):
            continue
        listed = snap.get("throttle_reasons")
        reasons = [str(r) for r in listed] if isinstance(listed, (list, tuple)) else []  # a file's 57 is none
        known = [r for r in reasons if r in THROTTLE_REASONS]
        if not known and snap.get("throttled"):
            known = reasons or ["throttled"]
        found.extend(r for r in known if r not in found)
    return found


def measured_clock(info: Mapping[str, Any] | None) -> float | None:
    """The SM clock a measurement ran at: the mean sampled through its energy window
    (``info["clocks"]["window"]``), else the snapshot read right after it.  On a power-capped GPU the
    two differ: the clock rises as soon as the sustained work ends (docs/benchmarks.md)."""
    clocks = (info or {}).get("clocks") or {}
    if not isinstance(clocks, Mapping):
        return None
    for phase in ("window", "after"):
        snap = clocks.get(phase)
        value = _number(snap.get("sm_clock_mhz") if isinstance(snap, Mapping) else None)
        if value is not None and value > 0:
            return value
    return None


def after_temperature(info: Mapping[str, Any] | None) -> float | None:
    """The GPU temperature read right after a measurement (``info["clocks"]["after"]``: for a timing
    that read energy, as its window ended), or None (:func:`temperature_of`)."""
    clocks = (info or {}).get("clocks") or {}
    return temperature_of(clocks.get("after")) if isinstance(clocks, Mapping) else None


def _number(value: Any) -> float | None:
    """A finite float of a number (not a bool); None for anything else, an int too large for a float too."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class Clocks:
    """The clocks of one measurement: its power or thermal throttle reasons and the SM clock it ran at."""

    throttled: tuple[str, ...] = ()
    sm_clock_mhz: float | None = None

    @classmethod
    def of(cls, info: Mapping[str, Any] | None) -> "Clocks":
        """The clocks a metric's ``info`` records (none where it records none)."""
        return cls(tuple(throttle_reasons(info)), measured_clock(info))

    def info(self) -> dict[str, Any]:
        """The ``info["clocks"]`` that :meth:`of` reads back as these clocks."""
        out: dict[str, Any] = {"after": {"throttle_reasons": list(self.throttled), "throttled": bool(self.throttled)}}
        if self.sm_clock_mhz:
            out["window"] = {"sm_clock_mhz": self.sm_clock_mhz}
        return out


#: The energy info's GPU temperature (degrees C), read as its window ended (docs/detection.md, "Energy").
TEMPERATURE = "temperature_c"


#: The temperatures a GPU can read (degrees C); a reading outside them is not kept.
TEMPERATURE_RANGE = (-100.0, 300.0)


def temperature_of(info: Any) -> float | None:
    """The temperature (degC) at ``info["temperature_c"]`` (None: none, or not one a GPU can read)."""
    value = _number(info.get(TEMPERATURE) if isinstance(info, dict) else None)
    low, high = TEMPERATURE_RANGE
    return value + 0.0 if value is not None and low <= value <= high else None  # + 0.0: never -0.0


__all__ = ["TEMPERATURE", "TEMPERATURE_RANGE", "THROTTLE_REASONS", "Clocks", "after_temperature", "measured_clock",
           "temperature_of",
           "throttle_reasons"]
