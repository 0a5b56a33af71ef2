"""Exports to what sites already watch: github-action-benchmark's JSON and a Prometheus text file.

``--mig-export github=DIR`` writes ``DIR/bigger-is-better.json`` and ``DIR/smaller-is-better.json``
in github-action-benchmark's ``customBiggerIsBetter`` / ``customSmallerIsBetter`` format (a list of
``{"name", "unit", "value", "range", "extra"}``), one entry per compared figure; a direction with no
figure gets no file (the action refuses an empty list).

``--mig-export prometheus=FILE.prom`` writes a text file for node_exporter's textfile collector,
made with ``prometheus-client`` and written atomically (a temporary file renamed over the old one,
so the collector never reads half a file).  A series is labelled as NVIDIA's dcgm-exporter labels the
device's own series (its ``gpuMetricsFormat`` template and ``toMetric``): ``gpu`` (NVML index),
``UUID`` (the board's ``GPU-...`` id, also on a MIG slice), ``pci_bus_id``, ``device``
(``nvidia<index>``), ``modelName``, on a MIG slice only ``GPU_I_PROFILE`` (the GPU-instance profile)
and ``GPU_I_ID`` (its GPU-instance id), ``Hostname`` and ``DCGM_FI_DRIVER_VERSION`` (a label field in
dcgm-exporter's default counters).  A label pytest-mig does not know is left out, as dcgm-exporter
leaves out GPU_I_* on a whole GPU; so ``PYTEST_MIG_FIGURE * on(UUID, GPU_I_ID) group_left
DCGM_FI_DEV_SM_CLOCK`` pairs each figure with the clock of the slice or whole GPU it was measured on.
pytest-mig's own labels follow: ``profile`` (``full`` on a whole GPU, the emulated profile under
``--mig-emulate``), ``emulated``, ``mode``, ``test``, ``metric``, ``unit``, ``direction`` (``higher`` or
``lower`` is better: what recipes/prometheus-rules.yml needs to call a figure worse).

- ``PYTEST_MIG_FIGURE``: the measured value;
- ``PYTEST_MIG_CHANGE_PERCENT``: the change against the baseline, where there was one;
- ``PYTEST_MIG_REGRESSED``: 1 where the verdict was a regression, else 0;
- ``PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS``: when the run finished.

Only figures that are compared (``Metric.compare``) are exported; informational ones, and host
copies made while the host's other GPUs copied (:mod:`pytest_mig.device.host`: a dashboard would read
the neighbours' traffic as this GPU's loss), stay in the results file.
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_mig.device.host import shared_host
from pytest_mig.device.fingerprint import FINGERPRINT_FIELDS, fingerprint_value
from pytest_mig.device.profiles import ProfileError, parse_profile
from pytest_mig.common.files import atomic_write_text, output_file, path_problem
from pytest_mig.store.results import ResultRecord
from pytest_mig.common.text import SHOWN, printable, quoted

KINDS = ("github", "prometheus")
#: The file ``--mig-export prometheus=DIR/`` writes into DIR.
PROMETHEUS_NAME = "pytest-mig.prom"
#: The files ``--mig-export github=DIR`` writes into DIR, by direction.
GITHUB_NAMES = {"bigger": "bigger-is-better.json", "smaller": "smaller-is-better.json"}
#: Fingerprint fields a github-action-benchmark entry carries in its ``extra`` text.
EXTRA_FINGERPRINT = ("driver", "cuda_driver", "torch")
#: dcgm-exporter's labels of a device's series, in its order (``gpuMetricsFormat``); ``Hostname`` as its
#: releases up to 4.5.3-4.8.2 spell it.
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "Hostname",
               "DCGM_FI_DRIVER_VERSION")
#: pytest-mig's own labels of a figure's series, after dcgm-exporter's.
OWN_LABELS = ("profile", "emulated", "mode", "test", "metric", "unit", "direction")

class ExportError(Exception):
    """An export that could not be written; the message says which and why."""


def parse_export(text: str) -> tuple[str, Path]:
    """``KIND=PATH`` -> (kind, path); ValueError with one sentence for anything else."""
    kind, sep, path = text.partition("=")
    kind = kind.strip().lower()
    if not sep or not path.strip():
        raise ValueError(f"--mig-export {quoted(text, SHOWN)}: give KIND=PATH, KIND one of {', '.join(KINDS)}")
    if kind not in KINDS:
        raise ValueError(f"--mig-export {quoted(text, SHOWN)}: {quoted(kind, SHOWN)} is not an export; use one of {', '.join(KINDS)}")
    why = path_problem(path.strip())
    if why is not None:
        raise ValueError(f"--mig-export {quoted(text, SHOWN)}: {why}")
    if kind == "github":  # a folder of two files
        folder = Path(path.strip())
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--mig-export {quoted(text, SHOWN)}: {printable(folder)} is a file; github= names a folder to write "
                             f"bigger-is-better.json and smaller-is-better.json into")
        return kind, folder
    return kind, output_file(path.strip(), PROMETHEUS_NAME, "--mig-export prometheus=")


def _label(record: ResultRecord) -> str:
    t = record.target
    gpu = str(t.gpu_name or "CPU").replace("NVIDIA ", "")
    return f"{gpu} {t.profile or '?'}"


def _exported(records: Iterable[ResultRecord]) -> list[ResultRecord]:
    """The compared figures with a finite value: JSON.parse refuses a bare Infinity or NaN, and a
    dashboard has no use for one (the results file keeps every figure)."""
    return [r for r in records if r.metric.compare and isinstance(r.metric.value, (int, float))
            and math.isfinite(r.metric.value) and shared_host(r.metric.info) is None]


def github_benchmark(records: Iterable[ResultRecord]) -> dict[str, list[dict[str, Any]]]:
    """github-action-benchmark entries, split by direction: {"bigger": [...], "smaller": [...]}."""
    out: dict[str, list[dict[str, Any]]] = {"bigger": [], "smaller": []}
    for r in _exported(records):
        m = r.metric
        stats = m.stats
        entry: dict[str, Any] = {"name": f"{r.test} {m.name} [{_label(r)}]", "unit": m.unit, "value": float(m.value)}
        if stats is not None and stats.n > 1 and math.isfinite(stats.cv * stats.mean):
            entry["range"] = f"± {stats.cv * stats.mean:.4g}"  # the samples' standard deviation
        verdict = r.verdict.outcome if r.verdict is not None else None
        extra = [f"mode {r.mode}"] + ([f"verdict {verdict}"] if verdict else [])
        fp = r.fingerprint or {}
        extra += [f"{label} {fingerprint_value(k, fp[k], unit)}" for k, label, unit in FINGERPRINT_FIELDS
                  if k in EXTRA_FINGERPRINT and fp.get(k) is not None]
        entry["extra"] = "; ".join(extra)
        out["bigger" if m.direction == "higher" else "smaller"].append(entry)
    return out


def write_github(records: Iterable[ResultRecord], folder: Path) -> tuple[list[Path], list[str]]:
    """Write the file of each direction that has figures; (the files written, the files not written
    and why).  github-action-benchmark refuses an empty list ("No benchmark result was found"), so a
    direction with no figure gets no file, and one an earlier run left there is removed: a workflow
    charting it would push last night's figures as tonight's."""
    data = github_benchmark(records)
    folder.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for key, name in GITHUB_NAMES.items():
        path = folder / name
        if data[key]:
            atomic_write_text(path, json.dumps(data[key], indent=1, allow_nan=False) + "\n")
            written.append(path)
            continue
        old = path.is_file()
        if old:
            path.unlink()
        skipped.append(f"{name} not written: no {key}-is-better figure" + (" (the older file removed)" if old else ""))
    return written, skipped


def _gi_profile(profile: str) -> str:
    """The GPU-instance profile dcgm-exporter names a slice by (``1c.3g.40gb`` -> ``3g.40gb``)."""
    try:
        return parse_profile(profile).gi_name
    except ProfileError:
        return profile


def dcgm_labels(r: ResultRecord, host: str) -> dict[str, str]:
    """dcgm-exporter's labels for the device ``r`` was measured on; a label with no value is left out.

    ``UUID`` is the board's ``GPU-...`` id (``gpu_uuid``; a whole GPU's own ``uuid`` in records that
    lack it), never a slice's ``MIG-...`` id: dcgm-exporter names the slice by ``GPU_I_ID``.  An
    emulated profile runs on the whole GPU, so it joins the whole GPU's series (no GPU_I_*)."""
    t = r.target.to_dict()
    board = t.get("gpu_uuid") or (t.get("uuid") if str(t.get("uuid") or "").startswith("GPU-") else None)
    index = t.get("gpu_index")
    mig = t.get("kind") == "mig" and t.get("gpu_instance_id") is not None
    values = {
        "gpu": index, "UUID": board, "pci_bus_id": t.get("pci_bus_id"),
        "device": None if index is None else f"nvidia{index}",
        "modelName": t.get("gpu_name") or ("CPU" if t.get("kind") == "cpu" else None),
        "GPU_I_PROFILE": _gi_profile(str(t.get("profile"))) if mig else None,
        "GPU_I_ID": t.get("gpu_instance_id") if mig else None,
        "Hostname": host, "DCGM_FI_DRIVER_VERSION": (r.fingerprint or {}).get("driver"),
    }
    return {k: str(values[k]) for k in DCGM_LABELS if values[k] not in (None, "")}


def _labels(r: ResultRecord, host: str) -> dict[str, str]:
    t = r.target.to_dict()
    own = {"profile": str(t.get("profile") or ""), "emulated": "true" if t.get("kind") == "emulated" else "false",
           "mode": r.mode, "test": r.test, "metric": r.metric.name, "unit": r.metric.unit,
           "direction": r.metric.direction}
    return dcgm_labels(r, host) | {k: v for k, v in own.items() if v}


class _Families:
    """A collector of ready metric families: the label sets differ between series (a whole GPU has no
    GPU_I_*), which prometheus-client's Gauge, with one fixed list of label names, cannot write."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> list[Any]:
        return self._families


def prometheus_text(records: Iterable[ResultRecord], *, host: str | None = None, now: float | None = None) -> str:
    """The exposition text of the run's compared figures (prometheus-client's own writer)."""
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily

    host = host or socket.gethostname()
    figure = GaugeMetricFamily("PYTEST_MIG_FIGURE", "A figure pytest-mig measured (its unit in the unit label).")
    change = GaugeMetricFamily("PYTEST_MIG_CHANGE_PERCENT", "Change against the stored baseline, in percent.")
    regressed = GaugeMetricFamily("PYTEST_MIG_REGRESSED", "1 where the verdict was a regression, else 0.")
    last = GaugeMetricFamily("PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS", "When the pytest-mig run finished (Unix time).")
    for r in _exported(records):
        labels = _labels(r, host)
        figure.add_sample(figure.name, labels, float(r.metric.value))
        pct = r.verdict.change_pct if r.verdict is not None else None
        if pct is not None and math.isfinite(pct):
            change.add_sample(change.name, labels, float(pct))
        regressed.add_sample(regressed.name, labels,
                             1.0 if r.verdict is not None and r.verdict.outcome == "regressed" else 0.0)
    last.add_sample(last.name, {"Hostname": host}, time.time() if now is None else now)
    return generate_latest(_Families([figure, change, regressed, last])).decode()


def write_prometheus(records: Iterable[ResultRecord], path: Path) -> Path:
    atomic_write_text(path, prometheus_text(records))
    return path


def write(exports: Iterable[tuple[str, Path]], records: list[ResultRecord]) -> list[str]:
    """Write every export; the lines to print (what was written, or why not)."""
    lines = []
    for kind, path in exports:
        try:
            if kind == "github":
                written, skipped = write_github(records, path)
                lines.append(f"export github-action-benchmark: {', '.join(str(p) for p in written) or 'nothing to chart'}"
                             + "".join(f"; {why}" for why in skipped))
            else:
                lines.append(f"export prometheus: {write_prometheus(records, path)}")
        except OSError as exc:
            raise ExportError(f"--mig-export {kind}={path}: could not be written ({exc.strerror or exc})") from None
    return lines


__all__ = ["DCGM_LABELS", "GITHUB_NAMES", "KINDS", "ExportError", "dcgm_labels", "github_benchmark", "parse_export", "prometheus_text", "write", "write_github",
           "write_prometheus"]
