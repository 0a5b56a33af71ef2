"""Exports to what sites already watch: github-action-benchmark's JSON and a Prometheus text file.

``--mig-export github=DIR`` writes ``DIR/bigger-is-better.json`` and ``DIR/smaller-is-better.json``
in github-action-benchmark's ``customBiggerIsBetter`` / ``customSmallerIsBetter`` format (a list of
``{"name", "unit", "value", "range", "extra"}``), one entry per compared figure.

``--mig-export prometheus=FILE.prom`` writes a text file for node_exporter's textfile collector,
made with ``prometheus-client`` and written atomically (a temporary file renamed over the old one,
so the collector never reads half a file).  Names and labels follow NVIDIA's DCGM exporter
(``gpu``, ``UUID``, ``modelName``, ``Hostname``, ``GPU_I_PROFILE``, ``GPU_I_ID``), so a Grafana board
that shows DCGM can show these beside it:

- ``PYTEST_MIG_FIGURE``: the measured value, labelled also by ``test``, ``metric`` and ``unit``;
- ``PYTEST_MIG_CHANGE_PERCENT``: the change against the baseline, where there was one;
- ``PYTEST_MIG_REGRESSED``: 1 where the verdict was a regression, else 0;
- ``PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS``: when the run finished.

Only figures that are compared (``Metric.compare``) are exported; informational ones stay in the
results file.
"""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_mig.device.fingerprint import FINGERPRINT_FIELDS, fingerprint_value
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
#: Labels of every figure's series: DCGM exporter's names for the device, then the figure's own.
LABELS = ("gpu", "UUID", "modelName", "Hostname", "GPU_I_PROFILE", "GPU_I_ID", "emulated", "mode", "test", "metric",
          "unit")


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
            and math.isfinite(r.metric.value)]


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


def write_github(records: Iterable[ResultRecord], folder: Path) -> list[Path]:
    data = github_benchmark(records)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, name in GITHUB_NAMES.items():
        path = folder / name
        atomic_write_text(path, json.dumps(data[key], indent=1, allow_nan=False) + "\n")
        paths.append(path)
    return paths


def _labels(r: ResultRecord, host: str) -> dict[str, str]:
    t = r.target
    return {
        "gpu": "" if t.gpu_index is None else str(t.gpu_index),
        "UUID": str(t.uuid or ""),
        "modelName": str(t.gpu_name or "CPU"),
        "Hostname": host,
        "GPU_I_PROFILE": str(t.profile or ""),
        "GPU_I_ID": "" if t.gpu_instance_id is None else str(t.gpu_instance_id),
        "emulated": "true" if t.kind == "emulated" else "false",
        "mode": r.mode,
        "test": r.test,
        "metric": r.metric.name,
        "unit": r.metric.unit,
    }


def prometheus_text(records: Iterable[ResultRecord], *, host: str | None = None, now: float | None = None) -> str:
    """The exposition text of the run's compared figures (prometheus-client's own writer)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    host = host or socket.gethostname()
    registry = CollectorRegistry()
    names = list(LABELS)
    figure = Gauge("PYTEST_MIG_FIGURE", "A figure pytest-mig measured (its unit in the unit label).", names,
                   registry=registry)
    change = Gauge("PYTEST_MIG_CHANGE_PERCENT", "Change against the stored baseline, in percent.", names,
                   registry=registry)
    regressed = Gauge("PYTEST_MIG_REGRESSED", "1 where the verdict was a regression, else 0.", names, registry=registry)
    last = Gauge("PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS", "When the pytest-mig run finished (Unix time).",
                 ["Hostname"], registry=registry)
    for r in _exported(records):
        labels = _labels(r, host)
        figure.labels(**labels).set(float(r.metric.value))
        pct = r.verdict.change_pct if r.verdict is not None else None
        if pct is not None and pct == pct:
            change.labels(**labels).set(float(pct))
        regressed.labels(**labels).set(1.0 if r.verdict is not None and r.verdict.outcome == "regressed" else 0.0)
    last.labels(Hostname=host).set(time.time() if now is None else now)
    return generate_latest(registry).decode()


def write_prometheus(records: Iterable[ResultRecord], path: Path) -> Path:
    atomic_write_text(path, prometheus_text(records))
    return path


def write(exports: Iterable[tuple[str, Path]], records: list[ResultRecord]) -> list[str]:
    """Write every export; the lines to print (what was written, or why not)."""
    lines = []
    for kind, path in exports:
        try:
            if kind == "github":
                written = write_github(records, path)
                lines.append(f"export github-action-benchmark: {', '.join(str(p) for p in written)}")
            else:
                lines.append(f"export prometheus: {write_prometheus(records, path)}")
        except OSError as exc:
            raise ExportError(f"--mig-export {kind}={path}: could not be written ({exc.strerror or exc})") from None
    return lines


__all__ = ["GITHUB_NAMES", "KINDS", "ExportError", "github_benchmark", "parse_export", "prometheus_text", "write", "write_github",
           "write_prometheus"]
