"""Baseline files of schema 1, which held one value per figure: each entry is read as a history of one
run, and the next save writes schema 2 (:mod:`pytest_mig.store.reader` checks the file against
:data:`pytest_mig.store.schemas.BASELINE_V1` first)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_mig.common.text import quoted
from pytest_mig.measure import within_run_noise
from pytest_mig.store.history import (
    ADVICE,
    BaselineEntry,
    BaselineError,
    EntryKey,
    Run,
    check_fingerprint,
    check_header,
    check_number,
    check_throttled,
)
from pytest_mig.store.results import MODES

BASELINE_SCHEMA_V1 = "pytest-mig/baseline/1"

#: The defaults schema 1 wrote into every entry (5%, energy 10%): read back as "not set".
V1_DEFAULT_TOLERANCES = (0.05, 0.10)


def read_v1(path: Path, doc: dict[str, Any]) -> dict[EntryKey, BaselineEntry]:
    """Schema 1: one value per figure, with its within-run spread; each becomes a history of one run."""
    file_fp = doc.get("fingerprint") or {}
    file_fp = check_fingerprint(path, "the file's", file_fp)
    entries: dict[EntryKey, BaselineEntry] = {}
    for test, metrics in doc["tests"].items():
        if not isinstance(metrics, dict):
            raise BaselineError(f"{path}: test {quoted(test)} must map metric names to entries; {ADVICE}")
        for name, e in metrics.items():
            where = f"test {quoted(test)} metric {quoted(name)}"
            if isinstance(e, dict) and "value" not in e:
                raise BaselineError(f"{path}: {where} has no 'value'; {ADVICE}")
            unit, direction, kind, tol = check_header(path, where, e)
            value = check_number(path, f"{where} value", e["value"], positive=True)
            mode = e.get("mode") or "normal"  # files saved before modes were recorded: normal runs
            if mode not in MODES:
                raise BaselineError(f"{path}: {where} has mode {json.dumps(mode)}; use \"normal\" or \"quick\"")
            samples = e.get("samples") or []
            if not isinstance(samples, list):
                raise BaselineError(f"{path}: {where} samples must be a list of numbers; {ADVICE}")
            samples = [check_number(path, f"{where} sample", s) for s in samples]
            fp = file_fp if e.get("fingerprint") is None else check_fingerprint(path, where, e["fingerprint"])
            if tol in V1_DEFAULT_TOLERANCES:  # schema 1 wrote its defaults everywhere: not a person's choice
                tol = None
            run = Run(value, str(e.get("recorded_at") or ""), dict(fp), within_run_noise(samples),
                      check_throttled(path, where, e.get("throttled")))
            entries[(test, name, str(mode))] = BaselineEntry(test, name, unit, direction, kind, tol, [run], str(mode))
    return entries


__all__ = ["BASELINE_SCHEMA_V1", "V1_DEFAULT_TOLERANCES", "read_v1"]
