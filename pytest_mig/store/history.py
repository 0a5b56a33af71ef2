"""A baseline history as it lies in its file: the runs of one figure (:class:`Run`,
:class:`BaselineEntry`), the file's header (:class:`BaselineMeta`), the whole file
(:class:`Baseline`), and the checks of one field that its readers share (``check_*``).
:mod:`pytest_mig.store.reader` reads the files strictly, :mod:`pytest_mig.store.baselines` keeps,
merges and writes them.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pytest_mig.common.files import MAX_NUMBER, MAX_SIZE
from pytest_mig.common.text import quoted
from pytest_mig.device.target import EMULATED_SUFFIX
from pytest_mig.measure import METRIC_KINDS, partner_keys
from pytest_mig.store.results import MODES

BASELINE_SCHEMA = "pytest-mig/baseline/2"

#: Runs kept per figure unless the file or ``--mig-baseline-keep`` says otherwise.
DEFAULT_KEEP = 10

_SIGNIFICANT = 6  # digits written for values: exact enough, short enough to review


class BaselineError(Exception):
    """A baseline file that cannot be used: one sentence naming the file and the problem."""


def round_figure(x: float) -> float:
    """A figure as a history file writes it: to 6 significant digits."""
    return float(f"{float(x):.{_SIGNIFICANT}g}")


def fingerprint_id(fp: Mapping[str, Any]) -> str:
    """A short, stable name for a fingerprint (the first 10 hex digits of its sorted JSON's SHA-256)."""
    text = json.dumps(dict(fp), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


#: The fingerprint keys that name the board a run was measured on: a local run's ``gpu_uuid``, a
#: reference run's ``board`` (an anonymous name for it, :func:`pytest_mig.judge.reference.board_name`).
BOARD_FIELDS = ("gpu_uuid", "board")


def board_of(fingerprint: Mapping[str, Any] | None) -> str | None:
    """The board a fingerprint names (None: it names none)."""
    for key in BOARD_FIELDS:
        value = (fingerprint or {}).get(key)
        if isinstance(value, str) and value:
            return value
    return None


@dataclass
class Run:
    """One saved run of one figure."""

    value: float
    recorded_at: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    noise: float | None = None  # the run's own within-run spread (relative); informs, never sets, thresholds
    throttled: list[str] = field(default_factory=list)
    clock_mhz: float | None = None  # the SM clock it ran at (:func:`pytest_mig.measure.clocks.measured_clock`), for scaling checks
    size: int | None = None  # the problem size it was measured at, where its workload chooses one (GEMM's square)
    temperature_c: float | None = None  # an energy figure's GPU temperature: brings it to a run's (judge.thermal)

    def to_dict(self, fp_id: str | None) -> dict[str, Any]:
        d: dict[str, Any] = {"at": self.recorded_at, "value": round_figure(self.value)}
        if fp_id:
            d["fp"] = fp_id
        if self.noise is not None and math.isfinite(self.noise):
            d["noise"] = round_figure(self.noise)
        if self.throttled:
            d["throttled"] = list(self.throttled)
        if self.clock_mhz is not None and math.isfinite(self.clock_mhz) and self.clock_mhz > 0:
            d["clock_mhz"] = round(self.clock_mhz, 1)
        if self.size:
            d["size"] = int(self.size)
        if self.temperature_c is not None and math.isfinite(self.temperature_c):
            d["temperature_c"] = round(self.temperature_c, 1) + 0.0  # never -0.0
        return d


@dataclass
class BaselineEntry:
    """One figure's history in one mode: its unit, direction, kind, tolerance and the runs kept."""

    test: str
    metric: str
    unit: str
    direction: str
    kind: str = "compute"
    tolerance: float | None = None  # set by a person in review; None: the rule's default applies
    runs: list[Run] = field(default_factory=list)
    mode: str = "normal"

    @property
    def values(self) -> list[float]:
        return [r.value for r in self.runs]

    @property
    def value(self) -> float:
        """The baseline figure: the median of the runs kept."""
        return float(statistics.median(self.values)) if self.runs else math.nan

    @property
    def last(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    @property
    def values_at_size(self) -> list[float]:
        """The values of the runs measured at :attr:`size` (all of them where no run names a size)."""
        size = self.size
        return [r.value for r in self.runs if size is None or r.size == size]

    @property
    def runs_by_board(self) -> dict[str, list[Run]]:
        """The runs at :attr:`size` by the board each was measured on (:func:`board_of`); runs that
        name none are left out."""
        size = self.size
        out: dict[str, list[Run]] = {}
        for r in self.runs:
            board = board_of(r.fingerprint)
            if board is not None and (size is None or r.size == size):
                out.setdefault(board, []).append(r)
        return out

    @property
    def values_by_board(self) -> dict[str, list[float]]:
        """The values of :attr:`runs_by_board`."""
        return {board: [r.value for r in runs] for board, runs in self.runs_by_board.items()}

    def on_board(self, board: str | None) -> bool:
        """Whether every run was measured on ``board`` (a history of one board's nights, which a
        prior of night-to-night noise on one board speaks for)."""
        return board is not None and bool(self.runs) and all(board_of(r.fingerprint) == board for r in self.runs)

    @property
    def size(self) -> int | None:
        """The problem size its runs were measured at: the most common one, the latest on a tie.  None
        where fewer than half of its runs name one (a history saved before runs kept their size is
        measured as it was until half of it names one: a first night's choice of the less usual size
        would otherwise be kept, and judged every night against runs mostly of the other)."""
        sizes = [r.size for r in self.runs if r.size]
        return max(reversed(sizes), key=sizes.count) if sizes and 2 * len(sizes) >= len(self.runs) else None

    @property
    def fingerprint(self) -> dict[str, Any]:
        return dict(self.last.fingerprint) if self.last else {}

    @property
    def recorded_at(self) -> str:
        return self.last.recorded_at if self.last else ""

    @property
    def throttled(self) -> list[str]:
        """Throttle reasons seen in any kept run."""
        out: list[str] = []
        for r in self.runs:
            out.extend(t for t in r.throttled if t not in out)
        return out

    def to_dict(self, fp_ids: Mapping[str, str]) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "direction": self.direction,
            "kind": self.kind,
            "tolerance": self.tolerance,
            "runs": [r.to_dict(fp_ids.get(fingerprint_id(r.fingerprint)) if r.fingerprint else None)
                     for r in self.runs],
        }


@dataclass
class BaselineMeta:
    """What a baseline file is for: the verdict layer refuses to compare across any of these."""

    gpu_model: str
    gpu_slug: str
    profile: str  # the baseline profile key: "3g.71gb", "3g.71gb-emulated", "full", "cpu"
    emulated: bool
    fingerprint: dict[str, Any] = field(default_factory=dict)  # the newest run's
    path: Path | None = None

    @property
    def target_profile(self) -> str:
        """The profile without the emulation suffix."""
        return self.profile[: -len(EMULATED_SUFFIX)] if self.profile.endswith(EMULATED_SUFFIX) else self.profile


EntryKey = tuple[str, str, str]  # (test, metric, mode)


@dataclass
class Baseline:
    """A loaded baseline file."""

    meta: BaselineMeta
    entries: dict[EntryKey, BaselineEntry] = field(default_factory=dict)
    updated_at: str = ""
    keep: int = DEFAULT_KEEP
    extra: dict[str, Any] = field(default_factory=dict)  # further top-level blocks written (a reference's)
    #: Figures the file holds as compared that the suite now records as informational
    #: (:func:`pytest_mig.measure.batch_bound`): written back, never judged, paired or counted.
    retired: dict[EntryKey, BaselineEntry] = field(default_factory=dict)

    def get(self, test: str, metric: str, mode: str = "normal") -> BaselineEntry | None:
        return self.entries.get((test, metric, mode))

    def timing_partners(self, entry: BaselineEntry) -> list[BaselineEntry]:
        """The rate figures of the same test and mode that time the same work as ``entry`` (an energy or
        cost figure, or a headline beside a sustained rate: :func:`pytest_mig.measure.timing_partners`)."""
        kinds = {k: e.kind for k, e in self.entries.items()}
        return [self.entries[k] for k in partner_keys((entry.test, entry.metric, entry.mode), entry.kind, kinds)]

    def other_mode(self, test: str, metric: str, mode: str) -> str | None:
        """The mode in which this figure was recorded, when it was not recorded in ``mode``."""
        for m in MODES:
            if m != mode and (test, metric, m) in self.entries:
                return m
        return None

    def to_dict(self) -> dict[str, Any]:
        fps: dict[str, dict[str, Any]] = {}
        for e in [*self.entries.values(), *self.retired.values()]:
            for r in e.runs:
                if r.fingerprint:
                    fps.setdefault(fingerprint_id(r.fingerprint), dict(r.fingerprint))
        ids = {k: k for k in fps}
        modes: dict[str, dict[str, dict[str, Any]]] = {}
        for (test, metric, mode), entry in sorted({**self.entries, **self.retired}.items()):
            modes.setdefault(mode, {}).setdefault(test, {})[metric] = entry.to_dict(ids)
        return {
            "schema": BASELINE_SCHEMA,
            "gpu_model": self.meta.gpu_model,
            "gpu_slug": self.meta.gpu_slug,
            "profile": self.meta.profile,
            "emulated": self.meta.emulated,
            "keep": self.keep,
            "updated_at": self.updated_at,
            "fingerprints": fps,
            "modes": modes,
            **self.extra,
        }

    def to_json(self) -> str:
        try:
            return _dump(self.to_dict()) + "\n"
        except ValueError as exc:  # a NaN or infinity somewhere (a fingerprint): JSON cannot hold it
            where = self.meta.path or f"{self.meta.gpu_slug}/{self.meta.profile}"
            raise BaselineError(f"{where}: not saved, a value cannot be written as JSON ({exc})") from None


def _dump(obj: Any, indent: int = 0) -> str:
    """Indented, key-sorted JSON with each run on one line (a history of 10 runs stays 10 lines)."""
    pad = "  " * (indent + 1)
    if isinstance(obj, dict) and obj:
        if "at" in obj and "value" in obj:  # a run
            return json.dumps(obj, sort_keys=True, allow_nan=False)
        items = [f"{pad}{json.dumps(k)}: {_dump(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(obj, list) and obj and any(isinstance(x, dict) for x in obj):
        items = [f"{pad}{_dump(x, indent + 1)}" for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(obj, sort_keys=True, allow_nan=False)


@dataclass
class SaveResult:
    """What one save did to one file, for the line the plugin prints."""

    path: Path
    written: int  # figures of this run added to their history
    kept: int  # figures of tests not in this run, left as they were
    skipped: list[str] = field(default_factory=list)  # "test::metric (why)"
    restarted: list[str] = field(default_factory=list)  # histories begun anew (unit or direction changed)
    runs: int = 0  # the fewest runs any figure of this save now has
    repeated: int = 0  # records whose run was in the history already (save(..., once=True)): not added again

    def __str__(self) -> str:
        line = (f"{self.path} ({self.written} figure(s) added to their history, {self.kept} kept from earlier "
                f"runs; the fewest runs of a figure is now {self.runs}")
        if self.restarted:
            line += f"; {len(self.restarted)} history(ies) begun anew, the unit or direction changed: " \
                    + "; ".join(self.restarted[:3])
        if self.skipped:
            more = "; ..." if len(self.skipped) > 3 else ""
            line += f"; {len(self.skipped)} not saved: {'; '.join(self.skipped[:3])}{more}"
        return line + ")"

    def describe(self) -> str:
        return f"baseline saved: {self}"


ADVICE = "fix or delete it (pytest-mig never overwrites a file it cannot read)"


def check_tolerance(value: Any, what: str) -> float:
    """A tolerance is a fraction in [0, 1): 50.0 would let a -99% drop pass."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value < 1:
        raise BaselineError(f"{what} must be a fraction from 0 up to (not including) 1, such as 0.05; "
                            f"found {json.dumps(value)}")
    return float(value)


def check_number(path: Path, where: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}, not a number; fix it or delete the entry")
    if abs(value) > MAX_NUMBER:
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}, beyond any figure pytest-mig keeps "
                            f"({MAX_NUMBER:g}); fix it or delete the entry")
    if positive and value <= 0:
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}; a figure must be above 0, fix it or delete the entry")
    return float(value)


def is_size(value: Any) -> bool:
    """Whether ``value`` is a problem size: a whole number (not a bool) from 1 to ``MAX_SIZE``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SIZE


def check_size(path: Path, where: str, value: Any) -> int | None:
    """A run's problem size: None, or a whole number from 1 to ``MAX_SIZE``."""
    if value is None:
        return None
    if not is_size(value):
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}, not a problem size (a whole number from 1 to "
                            f"{MAX_SIZE}); fix it or delete the entry")
    return value


def check_header(path: Path, where: str, e: Any) -> tuple[str, str, str, float | None]:
    """unit, direction, kind and tolerance of an entry, checked."""
    if not isinstance(e, dict):
        raise BaselineError(f"{path}: {where} must be an object; {ADVICE}")
    if e.get("direction") not in ("higher", "lower"):
        raise BaselineError(f"{path}: {where} has direction {json.dumps(e.get('direction'))}; use \"higher\" or \"lower\"")
    if not isinstance(e.get("unit"), str):
        what = "has no 'unit'" if "unit" not in e else f"has unit {json.dumps(e['unit'])}, not a string"
        raise BaselineError(f"{path}: {where} {what} (use \"\" for a unitless figure); {ADVICE}")
    kind = e.get("kind") or "compute"
    if kind not in METRIC_KINDS:
        raise BaselineError(f"{path}: {where} has kind {json.dumps(kind)}; use one of {', '.join(METRIC_KINDS)}")
    tol = e.get("tolerance")
    if tol is not None:
        try:
            tol = check_tolerance(tol, f"{where} tolerance")
        except BaselineError as exc:
            raise BaselineError(f"{path}: {exc}") from None
    return e["unit"], e["direction"], str(kind), tol


def check_fingerprint(path: Path, where: str, fp: Any) -> dict[str, Any]:
    if not isinstance(fp, dict):
        raise BaselineError(f"{path}: {where} fingerprint must be an object; {ADVICE}")
    for key, value in fp.items():  # a NaN here would be found only when the next save cannot write it
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= MAX_NUMBER):
            raise BaselineError(f"{path}: {where} fingerprint's {quoted(key)} is {json.dumps(value)}, not a finite "
                                f"number; {ADVICE}")
    return dict(fp)


def check_throttled(path: Path, where: str, raw: Any) -> list[str]:
    throttled = [] if raw is None else raw
    if not isinstance(throttled, list):
        raise BaselineError(f"{path}: {where} throttled must be a list of reasons; {ADVICE}")
    return [str(t) for t in throttled]


__all__ = [
    "ADVICE", "BASELINE_SCHEMA", "BOARD_FIELDS", "DEFAULT_KEEP", "Baseline", "BaselineEntry", "BaselineError", "BaselineMeta", "EntryKey",
    "Run", "SaveResult", "check_fingerprint", "check_header", "check_number", "check_size", "check_throttled", "check_tolerance",
    "board_of", "fingerprint_id", "is_size", "round_figure",
]
