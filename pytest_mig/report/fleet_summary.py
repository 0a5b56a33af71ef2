"""What an admin reads first of a fleet's night (``pytest-mig report`` over many GPUs' results files):
the outlier boards, the regressions, and what differs or changed in the fingerprints.  The rows, one
per device and figure, go to the report file; this is the summary printed above everything else.

- **Outlier boards**: the devices :func:`pytest_mig.report.fleet.find_device_outliers` names, one line
  per board (how many of its figures, the worst), worst first.
- **Slow nodes**: the nodes :func:`pytest_mig.report.tables.find_outliers` names, one line per node.
- **Regressions**: the records whose verdict is ``regressed``, one line per device, most first.
- **Host copies not judged**: devices whose host copies were made while the host's other GPUs copied
  (:func:`pytest_mig.device.host.shared_host`), in how many of their runs here: a node whose
  neighbours copy every night would otherwise never have them judged, one ``incomparable`` at a time.
- **Fingerprints**: each field whose value differs between devices, with how many devices hold each
  value (the fewest named); and the changes since the baseline the verdicts name, with how many
  devices and figures each.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Iterable, Sequence

from pytest_mig.device.fingerprint import FINGERPRINT_FIELDS, fingerprint_value
from pytest_mig.device.host import HOST_INFO_KEYS, shared_host
from pytest_mig.judge.verdict import format_number
from pytest_mig.report.axes import parse_time
from pytest_mig.report.fleet import DeviceOutlier, device_key, device_label
from pytest_mig.store.results import ResultRecord

if TYPE_CHECKING:
    from pytest_mig.report.tables import Outlier

#: Lines each section prints at most; the rest are counted (every row is in the report file).
SHOWN_LINES = 10
#: Devices named beside a fingerprint value held by few of them.
NAMED = 3
#: Fingerprint fields that name the board itself, so differ on every device by design.
OWN_FIELDS = ("gpu_uuid",)


def _short(test: str) -> str:
    return test.split("::", 1)[-1]


def _capped(lines: list[str], what: str) -> list[str]:
    more = len(lines) - SHOWN_LINES
    return lines[:SHOWN_LINES] + ([f"  ... and {more} more {what} (the report file has every row)"] if more > 0 else [])


def board_lines(outliers: Sequence[DeviceOutlier]) -> list[str]:
    """One line per outlier board: how many figures, the worst of them, worst board first."""
    boards: dict[tuple[str, str], list[DeviceOutlier]] = defaultdict(list)
    for o in outliers:
        boards[(o.node, o.device)].append(o)
    ranked = sorted(boards.items(), key=lambda kv: -max(o.worse for o in kv[1]))
    lines = []
    for (node, device), figs in ranked:
        w = max(figs, key=lambda o: o.worse)
        lines.append(f"  {device} on {node}: {len(figs)} figure(s) worse than the other {w.gpu} {w.profile} devices; "
                     f"worst {_short(w.test)} {w.metric} {format_number(w.value)} {w.unit}, {w.worse * 100:.1f}% worse "
                     f"than the median of {w.others} (bar {w.bar * 100:.1f}%)")
    return [f"OUTLIER BOARDS: {len(lines)}", *_capped(lines, "board(s)")]


def node_lines(outliers: Sequence["Outlier"]) -> list[str]:
    """One line per outlier node: how many figures, the worst of them."""
    nodes: dict[str, list["Outlier"]] = defaultdict(list)
    for o in outliers:
        nodes[o.node].append(o)
    lines = [f"  {max(figs, key=lambda o: o.factor).line()} ({len(figs)} figure(s) in all)"
             for node, figs in sorted(nodes.items(), key=lambda kv: -max(o.factor for o in kv[1]))]
    return [f"SLOW NODES: {len(lines)}", *_capped(lines, "node(s)")] if lines else []


def regression_lines(records: Iterable[ResultRecord]) -> list[str]:
    """One line per device with regressed figures, most first, naming its largest changes."""
    by: dict[tuple[str, str], list[ResultRecord]] = defaultdict(list)
    for r in records:
        if r.verdict is not None and r.verdict.outcome == "regressed":
            by[device_key(r)].append(r)
    lines = []
    for recs in sorted(by.values(), key=lambda rs: (-len(rs), device_key(rs[0]))):
        worst = sorted(recs, key=lambda r: -abs(r.verdict.change_pct or 0) if r.verdict else 0)[:3]
        named = ", ".join(f"{_short(r.test)} {r.metric.name} {(r.verdict.change_pct or 0):+.1f}%"
                          for r in worst if r.verdict is not None)
        lines.append(f"  {device_label(recs[0])} on {recs[0].node}: {len(recs)} regressed ({named}"
                     f"{', ...' if len(recs) > len(worst) else ''})")
    total = sum(len(v) for v in by.values())
    return [f"REGRESSIONS: {total} figure(s) on {len(by)} device(s)", *_capped(lines, "device(s)")]


#: Seconds between two host-copy records of one device beyond which they belong to two runs.
RUN_GAP_S = 60.0


def _seconds(stamp: str) -> float:
    """The record's time in seconds since the epoch (:func:`pytest_mig.report.axes.parse_time`), NaN
    where it does not read."""
    at = parse_time(stamp)
    return math.nan if at is None else at


def _runs(marks: list[tuple[float, str, ResultRecord, str | None]]) -> list[list[tuple[float, str, ResultRecord, str | None]]]:
    """A device's host-copy records, oldest first, split where two are more than ``RUN_GAP_S`` apart
    (a time that does not read is a run of its own)."""
    runs: list[list[tuple[float, str, ResultRecord, str | None]]] = []
    for mark in sorted(marks, key=lambda m: (m[1], m[0])):
        if not runs or not abs(mark[0] - runs[-1][-1][0]) <= RUN_GAP_S:
            runs.append([])
        runs[-1].append(mark)
    return runs


def shared_host_lines(records: Iterable[ResultRecord]) -> list[str]:
    """One line per device whose host copies were made while the host was shared: in how many of its
    runs here (a run: its host-copy records, under a minute apart), with the last such run's
    sentence.  Nothing where no device's were."""
    seen: dict[tuple[str, str], list[tuple[float, str, ResultRecord, str | None]]] = defaultdict(list)
    for r in records:
        info = r.metric.info if isinstance(r.metric.info, dict) else {}
        if any(k in info for k in HOST_INFO_KEYS):
            seen[device_key(r)].append((_seconds(r.timestamp), r.timestamp, r, shared_host(info)))
    found = []
    for key, marks in seen.items():
        runs = _runs(marks)
        said = [[(rec, sentence) for _, _, rec, sentence in run if sentence] for run in runs]
        shared_runs = [run for run in said if run]
        if shared_runs:
            found.append((len(shared_runs), len(runs), key, shared_runs[-1][-1]))
    lines = [f"  {device_label(rec)} on {rec.node}: made while the host was shared in {shared} of {runs} run(s), so "
             f"not judged; the last: {sentence}"
             for shared, runs, key, (rec, sentence) in sorted(found, key=lambda f: (-f[0], f[2]))]
    return [f"HOST COPIES NOT JUDGED: {len(lines)} device(s)", *_capped(lines, "device(s)")] if lines else []


def _devices(records: Iterable[ResultRecord]) -> dict[tuple[str, str], ResultRecord]:
    first: dict[tuple[str, str], ResultRecord] = {}
    for r in records:
        first.setdefault(device_key(r), r)
    return first


def fingerprint_lines(records: Sequence[ResultRecord]) -> list[str]:
    """Fields that differ between devices (each value's count, the rarest values' devices named), then
    the changes since the baseline that the verdicts name."""
    devices = _devices(records)
    lines = []
    for key, label, unit in FINGERPRINT_FIELDS:
        if key in OWN_FIELDS:
            continue
        held: dict[str, list[ResultRecord]] = defaultdict(list)
        for r in devices.values():
            held[fingerprint_value(key, (r.fingerprint or {}).get(key), unit)].append(r)
        if len(held) < 2:
            continue
        parts = []
        for value, recs in sorted(held.items(), key=lambda kv: -len(kv[1])):
            who = ", ".join(f"{r.node} {device_label(r).split(' (')[0]}" for r in recs[:NAMED])
            parts.append(f"{value} on {len(recs)}" + (f" ({who}{', ...' if len(recs) > NAMED else ''})"
                                                       if len(recs) < len(devices) / 2 else ""))
        lines.append(f"  {label} differs: {'; '.join(parts)}")
    changes: dict[str, set[tuple[str, str]]] = defaultdict(set)
    figures: Counter[str] = Counter()
    for r in records:
        for change in (r.verdict.fingerprint_changes if r.verdict is not None else []):
            changes[change].add(device_key(r))
            figures[change] += 1
    for change, devs in sorted(changes.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  since the baseline: {change} ({len(devs)} device(s), {figures[change]} figure(s))")
    head = f"FINGERPRINTS: {len(lines)} difference(s) or change(s) across {len(devices)} device(s)"
    return [head, *_capped(lines, "difference(s)")]


def summary_lines(records: Sequence[ResultRecord], files: int, nodes: Sequence["Outlier"],
                  boards: Sequence[DeviceOutlier], counts: dict[str, int]) -> list[str]:
    """The summary, in the order an admin acts on it."""
    devices = len(_devices(records))
    node_names = len({r.node for r in records})
    tally = ", ".join(f"{n} {k}" for k, n in counts.items()) or "none"
    return [f"{len(records)} metric(s) from {files} file(s): {devices} device(s) on {node_names} node(s); "
            f"verdicts: {tally}",
            *board_lines(boards), *node_lines(nodes), *regression_lines(records), *shared_host_lines(records),
            *fingerprint_lines(records)]


__all__ = ["board_lines", "fingerprint_lines", "node_lines", "regression_lines", "shared_host_lines", "summary_lines"]
