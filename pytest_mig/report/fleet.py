"""A node's (or a fleet's) records read together: per-device rows, outlier devices, provider figures,
and k slices side by side against one bigger slice.

Nothing here measures or judges a history: it reads merged records (``--mig-device all``, or
``pytest-mig report`` over many files) and compares the devices of one GPU model and profile with
each other, the way an admin looks for the one board to pull.

- **Outlier device**: a figure worse than the median of the other devices of the same GPU model,
  profile and mode by more than max(5%, 5 x their robust spread).  With fewer than three other
  devices there is no spread to measure, and the bar is 10% or 5 x their half-range.  A 3x slow
  GPU stands out; so does a 10% slow one among 8 equal ones.
- **Provider figures** (Columbia/IBM's view of a shared GPU): the work per second of all devices
  together, and energy per unit of work as the board power of every board over the sum of the
  devices' rates (a board's power counted once, however many slices it holds).
- **Client figures**: each device's own rate, and its change against its baseline history, which
  solo runs made: the slowdown of running beside the others.
- **k slices against one**: Wulver's ``1g.10gb:3`` against ``3g.40gb``: the sum of k slices of one
  profile against one slice with k times its compute slices, ideal ratio 1.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from pytest_mig.measure import ENERGY_INFIX, RATE_KINDS  # a rate figure adds up across devices
from pytest_mig.device.profiles import ProfileError, parse_profile
from pytest_mig.store.results import ResultRecord
from pytest_mig.judge.verdict import format_number

#: An outlier device is worse than the others' median by more than max(MIN_GAP, SPREAD_K x spread).
MIN_GAP = 0.05
SPREAD_K = 5.0
#: With fewer than MIN_OTHERS other devices the bar is at least FEW_GAP.
MIN_OTHERS = 3
FEW_GAP = 0.10


def device_key(rec: ResultRecord) -> tuple[str, str]:
    """A device: its node and the UUID it ran on (a MIG instance's, or the GPU's)."""
    t = rec.target
    return rec.node, str(t.uuid or t.gpu_uuid or t.gpu_index or "")


def device_label(rec: ResultRecord) -> str:
    """How an admin finds the board: GPU index, PCI bus id, serial (and the slice, for MIG)."""
    t = rec.target
    if t.kind == "cpu":
        return f"CPU of {rec.node}"
    parts = [f"GPU {t.gpu_index}" if t.gpu_index is not None else "GPU ?"]
    extra = [f"bus {t.pci_bus_id}" if t.pci_bus_id else "",
             f"serial {t.gpu_serial}" if t.gpu_serial else ""]
    label = parts[0] + (f" ({', '.join(x for x in extra if x)})" if any(extra) else "")
    if t.kind == "mig":
        label += f" {t.profile} {t.uuid}"
    return label


def _group(records: Iterable[ResultRecord]) -> dict[tuple[str, str, str, str, str], dict[tuple[str, str], list[ResultRecord]]]:
    groups: dict[tuple[str, str, str, str, str], dict[tuple[str, str], list[ResultRecord]]] = defaultdict(dict)
    for r in records:
        if not r.metric.compare or not r.metric.value > 0 or r.target.emulated:
            continue
        key = (r.test, r.metric.name, str(r.target.gpu_name or ""), str(r.target.profile or ""), r.mode)
        groups[key].setdefault(device_key(r), []).append(r)
    return groups


@dataclass
class DeviceOutlier:
    test: str
    metric: str
    gpu: str
    profile: str
    device: str
    node: str
    value: float
    unit: str
    others_median: float
    others: int
    worse: float  # fraction worse than the others' median
    bar: float  # the fraction it had to exceed

    def line(self) -> str:
        return (f"OUTLIER {self.device} on {self.node}: {self.test} {self.metric} {format_number(self.value)} "
                f"{self.unit} is {self.worse * 100:.1f}% worse than the median {format_number(self.others_median)} "
                f"{self.unit} of {self.others} other {self.gpu} {self.profile} device(s) (bar {self.bar * 100:.1f}%)")


def median_without(ordered: Sequence[float], i: int) -> float:
    """The median of the sorted ``ordered`` without its element at index ``i`` (as statistics.median
    of the others gives it), in constant time: the fleet compares each of n devices with the n - 1
    others."""
    n = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j if j < i else j + 1]
    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _bars(ordered: list[float]) -> list[tuple[float, float]]:
    """For each value of the sorted ``ordered``: the others' median and the outlier bar, in n log n."""
    out = []
    deviations: dict[float, list[float]] = {}  # sorted |v - m| for each distinct others' median m
    for pos, value in enumerate(ordered):
        med = median_without(ordered, pos)
        if len(ordered) - 1 >= MIN_OTHERS:
            devs = deviations.get(med)
            if devs is None:
                devs = deviations[med] = sorted(abs(v - med) for v in ordered)
            spread = 1.4826 * median_without(devs, bisect.bisect_left(devs, abs(value - med))) / med
            out.append((med, max(MIN_GAP, SPREAD_K * spread)))
        else:
            others = ordered[:pos] + ordered[pos + 1:]
            out.append((med, max(FEW_GAP, SPREAD_K * (max(others) - min(others)) / 2 / med)))
    return out


def find_device_outliers(records: Iterable[ResultRecord]) -> list[DeviceOutlier]:
    """Devices whose figure is far worse than that of the other devices of the same model and profile."""
    out = []
    for (test, metric, gpu, profile, _mode), devices in sorted(_group(records).items()):
        if len(devices) < 3:
            continue
        values = sorted(((statistics.median(r.metric.value for r in rs), d) for d, rs in devices.items()))
        found = []
        for (value, dev), (med, bar) in zip(values, _bars([v for v, _ in values])):
            first = devices[dev][0]
            worse = (med / value - 1) if first.metric.direction == "higher" else (value / med - 1)
            if worse > bar:
                found.append((dev, DeviceOutlier(test, metric, gpu, profile, device_label(first), first.node, value,
                                                 first.metric.unit, med, len(values) - 1, worse, bar)))
        out.extend(o for _, o in sorted(found, key=lambda x: x[0]))
    return out


@dataclass
class ProviderFigure:
    test: str
    metric: str
    unit: str
    devices: int
    total: float  # work per second of all devices together (or J per unit of work, for energy)
    per_device: list[float]
    mode: str


def provider_figures(records: Sequence[ResultRecord]) -> list[ProviderFigure]:
    """Work per second of all devices together, and energy per unit of work over all boards."""
    out = []
    by: dict[tuple[str, str, str], dict[tuple[str, str], ResultRecord]] = defaultdict(dict)
    for r in records:
        if r.metric.value > 0:
            by[(r.test, r.metric.name, r.mode)].setdefault(device_key(r), r)
    for (test, metric, mode), devs in sorted(by.items()):
        first = next(iter(devs.values())).metric
        if len(devs) < 2:
            continue
        if first.kind in RATE_KINDS and first.direction == "higher" and "cycle" not in first.unit \
                and first.unit != "fraction" and first.compare:
            values = [r.metric.value for r in devs.values()]
            out.append(ProviderFigure(test, metric, first.unit, len(values), sum(values), values, mode))
        elif first.kind == "energy" and ENERGY_INFIX in metric:
            fig = _provider_energy(test, metric, mode, devs, by)
            if fig is not None:
                out.append(fig)
    return out


def _provider_energy(test: str, metric: str, mode: str, devs: dict[tuple[str, str], ResultRecord],
                     by: dict[tuple[str, str, str], dict[tuple[str, str], ResultRecord]]) -> ProviderFigure | None:
    """J per unit of work of the node: each board's power once, over the sum of the devices' rates."""
    power_name = metric.split(ENERGY_INFIX)[0] + "power_w"
    powers = by.get((test, power_name, mode), {})
    boards: dict[tuple[str, str], list[float]] = defaultdict(list)
    rate = 0.0
    for dev, rec in devs.items():
        p = powers.get(dev)
        if p is None or not rec.metric.value > 0:
            return None
        rate += p.metric.value / rec.metric.value  # units of work per second over its window
        boards[(rec.node, str(rec.target.gpu_uuid or dev[1]))].append(p.metric.value)
    watts = sum(statistics.median(v) for v in boards.values())
    return ProviderFigure(test, metric, devs[next(iter(devs))].metric.unit, len(devs), watts / rate,
                          [r.metric.value for r in devs.values()], mode)


@dataclass
class SlicesVsOne:
    gpu: str
    test: str
    metric: str
    small: str  # "1g.10gb"
    k: int
    together: float  # the k slices' sum
    big: str  # "3g.40gb"
    alone: float
    unit: str

    @property
    def ratio(self) -> float:
        return self.together / self.alone

    def line(self) -> str:
        return (f"{self.gpu} {self.test} {self.metric}: {self.small} x{self.k} together {format_number(self.together)} "
                f"{self.unit}, {self.big} alone {format_number(self.alone)} {self.unit}: ratio {self.ratio:.2f} "
                f"(ideal 1.00 by compute slices)")


def _slices(profile: str) -> int | None:
    try:
        return parse_profile(profile).gpu_slices
    except ProfileError:
        return None


def slices_vs_one(records: Sequence[ResultRecord]) -> list[SlicesVsOne]:
    """k slices of one profile run together (summed) against one slice of k times their compute slices."""
    sums: dict[tuple[str, str, str, str, str], dict[tuple[str, str], float]] = defaultdict(dict)
    units: dict[tuple[str, str, str], str] = {}
    for r in records:
        t = r.target
        m = r.metric
        if t.kind != "mig" or m.kind not in RATE_KINDS or m.direction != "higher" or not m.compare \
                or "cycle" in m.unit:
            continue
        key = (str(t.gpu_name), r.test, m.name, str(t.profile), r.mode)
        sums[key].setdefault(device_key(r), m.value)
        units[(r.test, m.name, r.mode)] = m.unit
    out = []
    for (gpu, test, metric, small, mode), devs in sorted(sums.items()):
        k, s = len(devs), _slices(small)
        if k < 2 or s is None:
            continue
        for (gpu2, test2, metric2, big, mode2), alone in sorted(sums.items()):
            if (gpu2, test2, metric2, mode2) == (gpu, test, metric, mode) and len(alone) == 1 \
                    and _slices(big) == k * s:
                out.append(SlicesVsOne(gpu, test, metric, small, k, sum(devs.values()), big,
                                       next(iter(alone.values())), units[(test, metric, mode)]))
    return out


def device_rows(records: Sequence[ResultRecord]) -> list[dict[str, Any]]:
    """One row per device and figure: the client view (its own rate and change against its history)."""
    rows = []
    for r in records:
        if not r.metric.compare:
            continue
        v = r.verdict
        rows.append({"device": device_label(r), "node": r.node, "test": r.test.split("::")[-1], "metric": r.metric.name,
                     "value": r.metric.value, "unit": r.metric.unit, "change_pct": v.change_pct if v else None,
                     "verdict": (v.outcome if v else "") or "-"})
    return sorted(rows, key=lambda x: (x["test"], x["metric"], x["node"], x["device"]))


def provider_lines(figures: Sequence[ProviderFigure]) -> list[str]:
    out = []
    for f in figures:
        each = ", ".join(format_number(x) for x in f.per_device)
        what = "node energy per unit of work" if f.unit.startswith("J/") else "all devices together"
        out.append(f"{f.test.split('::')[-1]} {f.metric}: {format_number(f.total)} {f.unit} ({what}, "
                   f"{f.devices} devices: {each})")
    return out


__all__ = ["DeviceOutlier", "ProviderFigure", "SlicesVsOne", "device_key", "device_label", "device_rows",
           "find_device_outliers", "median_without", "provider_figures", "provider_lines", "slices_vs_one"]
