"""A baseline history as it lies in its file: the runs of one figure (:class:`Run`,
:class:`BaselineEntry`), the file's header (:class:`BaselineMeta`), the whole file
(:class:`Baseline`) and its strict reader (:func:`load_baseline_file`, :func:`parse_baseline`:
version 2 and the older version 1).  :mod:`pytest_mig.store.baselines` keeps, merges and writes them.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pytest_mig.common.files import (
    MAX_NUMBER,
    FileProblem,
    parse_json,
    read_json,
    validate,
)
from pytest_mig.measure import METRIC_KINDS, partner_keys
from pytest_mig.device.profiles import model_slug
from pytest_mig.store.results import MODES
from pytest_mig.store.schemas import BASELINE, BASELINE_V1
from pytest_mig.common.text import quoted

BASELINE_SCHEMA = "pytest-mig/baseline/2"
BASELINE_SCHEMA_V1 = "pytest-mig/baseline/1"

#: Runs kept per figure unless the file or ``--mig-baseline-keep`` says otherwise.
DEFAULT_KEEP = 10

#: The tolerance a figure is held to when nobody set one: a figure whose run-to-run noise needs a
#: wider threshold than this is reported as too noisy to gate (see pytest_mig.judge.noise).
DEFAULT_TOLERANCE = 0.05

#: The defaults schema 1 wrote into every entry (5%, energy 10%): read back as "not set".
_V1_DEFAULT_TOLERANCES = (0.05, 0.10)


EMULATED_SUFFIX = "-emulated"


_SIGNIFICANT = 6  # digits written for values: exact enough, short enough to review

#: NVML clock-event reasons that mean power or heat held the clocks down (names as the nvml module
#: writes them); idle, application-clock and sync-boost reasons do not slow a busy GPU.
THROTTLE_REASONS: tuple[str, ...] = ("sw_power_cap", "hw_power_brake", "hw_slowdown", "sw_thermal", "hw_thermal")


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


class BaselineError(Exception):
    """A baseline file that cannot be used: one sentence naming the file and the problem."""


def _round(x: float) -> float:
    return float(f"{float(x):.{_SIGNIFICANT}g}")


def fingerprint_id(fp: Mapping[str, Any]) -> str:
    """A short, stable name for a fingerprint (the first 10 hex digits of its sorted JSON's SHA-256)."""
    text = json.dumps(dict(fp), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def within_run_noise(samples: Iterable[float]) -> float | None:
    """Relative robust spread (1.4826 x MAD / median) of one run's repeats; None with fewer than 2."""
    xs = [float(s) for s in samples if math.isfinite(s)]
    if len(xs) < 2:
        return None
    med = statistics.median(xs)
    if not med:
        return None
    return 1.4826 * statistics.median([abs(x - med) for x in xs]) / abs(med)


@dataclass
class Run:
    """One saved run of one figure."""

    value: float
    recorded_at: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    noise: float | None = None  # the run's own within-run spread (relative); informs, never sets, thresholds
    throttled: list[str] = field(default_factory=list)
    clock_mhz: float | None = None  # the SM clock it ran at (:func:`measured_clock`), for scaling checks

    def to_dict(self, fp_id: str | None) -> dict[str, Any]:
        d: dict[str, Any] = {"at": self.recorded_at, "value": _round(self.value)}
        if fp_id:
            d["fp"] = fp_id
        if self.noise is not None and math.isfinite(self.noise):
            d["noise"] = _round(self.noise)
        if self.throttled:
            d["throttled"] = list(self.throttled)
        if self.clock_mhz is not None and math.isfinite(self.clock_mhz) and self.clock_mhz > 0:
            d["clock_mhz"] = round(self.clock_mhz, 1)
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

    def get(self, test: str, metric: str, mode: str = "normal") -> BaselineEntry | None:
        return self.entries.get((test, metric, mode))

    def timing_partners(self, entry: BaselineEntry) -> list[BaselineEntry]:
        """The rate figures of the same test and mode whose timing energy figure ``entry`` shares
        (:func:`pytest_mig.measure.timing_partners`); none for any other figure."""
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
        for e in self.entries.values():
            for r in e.runs:
                if r.fingerprint:
                    fps.setdefault(fingerprint_id(r.fingerprint), dict(r.fingerprint))
        ids = {k: k for k in fps}
        modes: dict[str, dict[str, dict[str, Any]]] = {}
        for (test, metric, mode), entry in sorted(self.entries.items()):
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


_ADVICE = "fix or delete it (pytest-mig never overwrites a file it cannot read)"


def check_tolerance(value: Any, what: str) -> float:
    """A tolerance is a fraction in [0, 1): 50.0 would let a -99% drop pass."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value < 1:
        raise BaselineError(f"{what} must be a fraction from 0 up to (not including) 1, such as 0.05; "
                            f"found {json.dumps(value)}")
    return float(value)


def _number(path: Path, where: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}, not a number; fix it or delete the entry")
    if abs(value) > MAX_NUMBER:
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}, beyond any figure pytest-mig keeps "
                            f"({MAX_NUMBER:g}); fix it or delete the entry")
    if positive and value <= 0:
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}; a figure must be above 0, fix it or delete the entry")
    return float(value)


def load_baseline_file(path: Path) -> Baseline:
    """Read and check one baseline file (schema 2, or schema 1 read as one run per figure)."""
    path = Path(path)
    try:
        doc = read_json(path, allow_nan=True)  # a NaN figure is named by the checks below, in the store's words
    except FileProblem as exc:
        raise BaselineError(f"{exc}; {_ADVICE}") from None
    return parse_baseline(doc, path)


def check_baseline_text(path: Path) -> Callable[[str], Baseline]:
    """A check for :func:`~pytest_mig.common.files.atomic_write_text`: the text about to become ``path`` read
    back as :func:`load_baseline_file` will read it, so that a file its own reader refuses is never
    written."""
    def check(text: str) -> Baseline:
        try:
            doc = parse_json(text, str(path))
        except FileProblem as exc:
            raise BaselineError(f"not saved, the text would not read back: {exc}") from None
        return parse_baseline(doc, path)
    return check


def parse_baseline(doc: Any, path: Path) -> Baseline:
    """A baseline file's parsed JSON, checked against its schema (:data:`pytest_mig.store.schemas.BASELINE`)
    before any field is used, then for what a schema cannot say (the folder and name matching its GPU
    model and profile, fingerprints the runs name)."""
    if not isinstance(doc, dict):
        raise BaselineError(f"{path}: not a baseline file (a JSON object is expected at the top); {_ADVICE}")
    schema = doc.get("schema")
    if schema not in (BASELINE_SCHEMA, BASELINE_SCHEMA_V1):
        raise BaselineError(f"{path}: schema is {json.dumps(schema)}, expected \"{BASELINE_SCHEMA}\"; {_ADVICE}")
    try:
        validate(doc, BASELINE if schema == BASELINE_SCHEMA else BASELINE_V1, str(path))
    except FileProblem as exc:
        try:  # the checks below name most problems in the store's own words: say it so where they can
            _parse_valid(doc, path, schema)
        except BaselineError as named:
            raise named from None
        except Exception:  # noqa: BLE001  (they assume a file that passed the schema: its words stand)
            pass
        raise BaselineError(f"{exc}; {_ADVICE}") from None
    return _parse_valid(doc, path, schema)


def _parse_valid(doc: dict[str, Any], path: Path, schema: str) -> Baseline:
    body_key = "modes" if schema == BASELINE_SCHEMA else "tests"
    for key, typ, name in (("gpu_model", str, "a string"), ("gpu_slug", str, "a string"),
                           ("profile", str, "a string"), ("emulated", bool, "true or false"),
                           (body_key, dict, "an object")):
        if not isinstance(doc.get(key), typ):
            raise BaselineError(f"{path}: {quoted(key)} must be {name}, found {json.dumps(doc.get(key))}; {_ADVICE}")
    folder = path.parent.name
    if doc["gpu_slug"] != folder or model_slug(doc["gpu_model"]) != folder:
        raise BaselineError(
            f"{path}: recorded on GPU model {quoted(doc['gpu_model'])} ({quoted(doc['gpu_slug'])}) but kept in folder "
            f"{quoted(folder)}; a baseline of another GPU model is never used, move it to its own folder"
        )
    if doc["profile"] != path.stem:
        raise BaselineError(f"{path}: recorded for profile {quoted(doc['profile'])} but named {quoted(path.name)}; "
                            "rename or fix it")
    if doc["emulated"] != doc["profile"].endswith(EMULATED_SUFFIX):
        raise BaselineError(
            f"{path}: 'emulated' is {json.dumps(doc['emulated'])} but the profile is '{doc['profile']}'; "
            f"emulated baselines are named <profile>{EMULATED_SUFFIX}"
        )
    meta = BaselineMeta(doc["gpu_model"], doc["gpu_slug"], doc["profile"], doc["emulated"], {}, path)
    if schema == BASELINE_SCHEMA:
        keep = doc.get("keep", DEFAULT_KEEP)
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise BaselineError(f"{path}: 'keep' is {json.dumps(keep)}; use a whole number of runs, 1 or more")
        entries = _read_v2(path, doc)
    else:
        keep, entries = DEFAULT_KEEP, _read_v1(path, doc)
    newest = max((e.last for e in entries.values() if e.last), key=lambda r: r.recorded_at, default=None)
    meta.fingerprint = dict(newest.fingerprint) if newest else {}
    extra = {"reference": doc["reference"]} if "reference" in doc else {}  # a shipped reference's block
    return Baseline(meta, entries, str(doc.get("updated_at") or ""), keep, extra)


def _header(path: Path, where: str, e: Any) -> tuple[str, str, str, float | None]:
    """unit, direction, kind and tolerance of an entry, checked."""
    if not isinstance(e, dict):
        raise BaselineError(f"{path}: {where} must be an object; {_ADVICE}")
    if e.get("direction") not in ("higher", "lower"):
        raise BaselineError(f"{path}: {where} has direction {json.dumps(e.get('direction'))}; use \"higher\" or \"lower\"")
    if not isinstance(e.get("unit"), str):
        what = "has no 'unit'" if "unit" not in e else f"has unit {json.dumps(e['unit'])}, not a string"
        raise BaselineError(f"{path}: {where} {what} (use \"\" for a unitless figure); {_ADVICE}")
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


def _fingerprint(path: Path, where: str, fp: Any) -> dict[str, Any]:
    if not isinstance(fp, dict):
        raise BaselineError(f"{path}: {where} fingerprint must be an object; {_ADVICE}")
    for key, value in fp.items():  # a NaN here would be found only when the next save cannot write it
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= MAX_NUMBER):
            raise BaselineError(f"{path}: {where} fingerprint's {quoted(key)} is {json.dumps(value)}, not a finite "
                                f"number; {_ADVICE}")
    return dict(fp)


def _throttled(path: Path, where: str, raw: Any) -> list[str]:
    throttled = [] if raw is None else raw
    if not isinstance(throttled, list):
        raise BaselineError(f"{path}: {where} throttled must be a list of reasons; {_ADVICE}")
    return [str(t) for t in throttled]


def _read_v2(path: Path, doc: dict[str, Any]) -> dict[EntryKey, BaselineEntry]:
    fps_raw = doc.get("fingerprints") or {}
    if not isinstance(fps_raw, dict):
        raise BaselineError(f"{path}: 'fingerprints' must be an object; {_ADVICE}")
    fps = {str(k): _fingerprint(path, f"fingerprint {quoted(k)}", v) for k, v in fps_raw.items()}
    entries: dict[EntryKey, BaselineEntry] = {}
    for mode, tests in doc["modes"].items():
        if mode not in MODES:
            raise BaselineError(f"{path}: mode {json.dumps(mode)}; use \"normal\" or \"quick\"")
        if not isinstance(tests, dict):
            raise BaselineError(f"{path}: mode {quoted(mode)} must map tests to their figures; {_ADVICE}")
        for test, metrics in tests.items():
            if not isinstance(metrics, dict):
                raise BaselineError(f"{path}: test {quoted(test)} must map metric names to entries; {_ADVICE}")
            for name, e in metrics.items():
                where = f"test {quoted(test)} metric {quoted(name)} ({mode})"
                unit, direction, kind, tol = _header(path, where, e)
                runs_raw = e.get("runs")
                if not isinstance(runs_raw, list) or not runs_raw:
                    raise BaselineError(f"{path}: {where} needs 'runs', a list of at least one run; {_ADVICE}")
                runs = []
                for r in runs_raw:
                    if not isinstance(r, dict) or "value" not in r:
                        raise BaselineError(f"{path}: {where} has a run without a 'value'; {_ADVICE}")
                    fp_id = r.get("fp")
                    if fp_id is not None and fp_id not in fps:
                        raise BaselineError(f"{path}: {where} names fingerprint {json.dumps(fp_id)}, which the "
                                            f"file's 'fingerprints' does not hold; {_ADVICE}")
                    noise = r.get("noise")
                    runs.append(Run(
                        value=_number(path, f"{where} run value", r["value"], positive=True),
                        recorded_at=str(r.get("at") or ""),
                        fingerprint=dict(fps[fp_id]) if fp_id is not None else {},
                        noise=None if noise is None else abs(_number(path, f"{where} run noise", noise)),
                        throttled=_throttled(path, where, r.get("throttled")),
                        clock_mhz=None if r.get("clock_mhz") is None else _number(path, f"{where} run clock_mhz",
                                                                                 r["clock_mhz"], positive=True),
                    ))
                entries[(test, name, mode)] = BaselineEntry(test, name, unit, direction, kind, tol, runs, mode)
    return entries


def _read_v1(path: Path, doc: dict[str, Any]) -> dict[EntryKey, BaselineEntry]:
    """Schema 1: one value per figure, with its within-run spread; each becomes a history of one run."""
    file_fp = doc.get("fingerprint") or {}
    file_fp = _fingerprint(path, "the file's", file_fp)
    entries: dict[EntryKey, BaselineEntry] = {}
    for test, metrics in doc["tests"].items():
        if not isinstance(metrics, dict):
            raise BaselineError(f"{path}: test {quoted(test)} must map metric names to entries; {_ADVICE}")
        for name, e in metrics.items():
            where = f"test {quoted(test)} metric {quoted(name)}"
            if isinstance(e, dict) and "value" not in e:
                raise BaselineError(f"{path}: {where} has no 'value'; {_ADVICE}")
            unit, direction, kind, tol = _header(path, where, e)
            value = _number(path, f"{where} value", e["value"], positive=True)
            mode = e.get("mode") or "normal"  # files saved before modes were recorded: normal runs
            if mode not in MODES:
                raise BaselineError(f"{path}: {where} has mode {json.dumps(mode)}; use \"normal\" or \"quick\"")
            samples = e.get("samples") or []
            if not isinstance(samples, list):
                raise BaselineError(f"{path}: {where} samples must be a list of numbers; {_ADVICE}")
            samples = [_number(path, f"{where} sample", s) for s in samples]
            fp = file_fp if e.get("fingerprint") is None else _fingerprint(path, where, e["fingerprint"])
            if tol in _V1_DEFAULT_TOLERANCES:  # schema 1 wrote its defaults everywhere: not a person's choice
                tol = None
            run = Run(value, str(e.get("recorded_at") or ""), dict(fp), within_run_noise(samples),
                      _throttled(path, where, e.get("throttled")))
            entries[(test, name, str(mode))] = BaselineEntry(test, name, unit, direction, kind, tol, [run], str(mode))
    return entries
