"""Result records: one per metric of one test, with the Target and fingerprint it was measured on.

Every run writes them to a results JSON file (for merging across nodes and slices with
``pytest-mig report``), and the verdict layer compares them with baselines.  A record is typed
(its :class:`~pytest_mig.device.target.TargetInfo`, its :class:`~pytest_mig.store.verdicts.Verdict`)
from the plugin to the file and back: dicts only where a results file is written or read.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from pytest_mig.common.files import FileProblem, atomic_write_text, read_json, validate
from pytest_mig.device.target import TargetInfo
from pytest_mig.measure import Metric, batch_bound
from pytest_mig.store.schemas import RESULTS
from pytest_mig.store.verdicts import Verdict

RESULTS_SCHEMA = "pytest-mig/results/1"
#: What :func:`read_results_file` says of a JSON file that is not a results file at all.
NOT_RESULTS = "not a pytest-mig results file"

#: How a figure was measured: a normal run, or ``--mig-quick`` (smaller sizes, fewer repeats).  The
#: workloads' sizes differ between the two, so figures of different modes are never compared.
MODES: tuple[str, ...] = ("normal", "quick")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class ResultRecord:
    """One metric of one test on one Target."""

    test: str  # the test's key: node id without the profile parameter (same across profiles)
    metric: Metric
    target: TargetInfo  # Target.info()
    fingerprint: dict[str, Any]
    timestamp: str = field(default_factory=utc_now)
    node: str = field(default_factory=lambda: os.uname().nodename)
    verdict: Verdict | None = None  # filled by the judging pipeline
    mode: str = "normal"  # "normal" or "quick" (--mig-quick): see MODES
    health: dict[str, Any] | None = None  # the test's health readings and signs (health.Watch.after_test)

    @property
    def key(self) -> tuple[str, str]:
        return (self.test, self.metric.name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "metric": self.metric.to_dict(),
            "target": self.target.to_dict(),
            "fingerprint": self.fingerprint,
            "timestamp": self.timestamp,
            "node": self.node,
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "mode": self.mode,
            "health": self.health,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ResultRecord":
        m = dict(d["metric"])
        m.pop("stats", None)
        metric = Metric(**m)
        if metric.compare and batch_bound(str(d["test"]), metric.name):  # written when it was compared
            metric = replace(metric, kind="info", compare=False)
        return cls(
            test=str(d["test"]),
            metric=metric,
            target=TargetInfo.from_dict(d.get("target")),
            fingerprint=dict(d.get("fingerprint") or {}),
            timestamp=str(d.get("timestamp", "")),
            node=str(d.get("node", "")),
            verdict=Verdict.from_dict(d["verdict"]) if d.get("verdict") is not None else None,
            mode=str(d.get("mode") or "normal"),  # files written before modes were recorded: normal runs
            health=d.get("health"),
        )


class ResultsFileError(Exception):
    """A results file that cannot be read or written: one sentence naming the file and the problem."""


def write_results(path: Path, records: Iterable[ResultRecord], meta: dict[str, Any] | None = None) -> None:
    """Write the records atomically, read back as :func:`read_results_file` reads them before the rename;
    a path that cannot be written is a ResultsFileError."""
    doc = {"schema": RESULTS_SCHEMA, "meta": meta or {}, "records": [r.to_dict() for r in records]}
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    try:
        atomic_write_text(Path(path), text, check=lambda back: _parse(json.loads(back), Path(path)))
    except FileProblem as exc:
        raise ResultsFileError(f"results not written: {exc}") from None
    except OSError as exc:
        raise ResultsFileError(f"{path}: results not written ({exc.strerror or exc})") from None


def read_results(path: Path) -> list[ResultRecord]:
    return read_results_file(path)[0]


def read_results_file(path: Path) -> tuple[list[ResultRecord], dict[str, Any]]:
    """The records of a results file and its meta (``complete`` false, ``stopped`` set: a run stopped
    partway, :mod:`pytest_mig.store.checkpoint`).  ResultsFileError with one sentence on a bad file: read
    strictly (:func:`pytest_mig.common.files.read_json`; a failed workload's NaN is allowed) and checked
    against :data:`pytest_mig.store.schemas.RESULTS` before any record is made."""
    path = Path(path)
    try:
        doc = read_json(path, allow_nan=True)
    except FileProblem as exc:
        raise ResultsFileError(str(exc).replace(": no such file", ": no such results file")
                               .replace(": not valid JSON", ": not a readable JSON results file")) from None
    return _parse(doc, path)


def _parse(doc: Any, path: Path) -> tuple[list[ResultRecord], dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("schema") != RESULTS_SCHEMA or not isinstance(doc.get("records"), list):
        raise ResultsFileError(f"{path}: {NOT_RESULTS} (schema {RESULTS_SCHEMA} expected)")
    try:
        validate(doc, RESULTS, str(path))
    except FileProblem as exc:
        raise ResultsFileError(f"{str(exc).replace(': at records/', ': a record is malformed at records/', 1)}; "
                               f"not as pytest-mig writes a results file") from None
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    try:
        return [ResultRecord.from_dict(r) for r in doc["records"]], meta
    except (KeyError, TypeError, ValueError) as exc:
        raise ResultsFileError(f"{path}: a record is malformed ({exc})") from None


def default_results_path(root: Path) -> Path:
    """``.mig-results/results-<UTC time to the microsecond>-<pid>.json``: two runs finishing in the
    same second (two slices of one node) never write the same file."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    return root / ".mig-results" / f"results-{stamp}-{os.getpid()}.json"
