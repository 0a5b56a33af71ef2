"""The baseline store: one reviewed JSON file per GPU model and profile.

``baselines/<gpu-model-slug>/<profile>.json`` holds, per test and metric, the value a known-good run
measured, with its unit, direction, the spread of its samples and the tolerance.  Emulated profiles
live under their own key (``3g.71gb-emulated``, :attr:`pytest_mig.target.Target.baseline_profile`), so
an emulated figure is never compared with, or saved over, a real slice's.

Files are read strictly: a hand-broken file is a :class:`BaselineError` naming the file and the
problem, and a save never replaces a file it could not read.  Saves merge into the existing file
(entries of tests not run are kept), hold one lock per store (``<root>/.pytest-mig.lock``) so two
runs saving at once both land, and write through a temporary file and a rename, so a save that dies
half-way leaves the old file as it was.  Only ``json`` is used to read them: no pickle, no eval.

Informational metrics (``Metric.compare is False``: size at peak, board power) are not saved: their
values change from run to run and would turn every re-save into noise in review.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from filelock import FileLock, Timeout

from .measure import METRIC_KINDS, Metric
from .profiles import CPU, FULL, model_slug
from .results import MODES, ResultRecord, atomic_write_text, utc_now

BASELINE_SCHEMA = "pytest-mig/baseline/1"

#: The tolerance a metric gets when neither a marker nor its baseline entry says otherwise.
DEFAULT_TOLERANCE = 0.05

#: Samples kept per entry: enough to show the spread in review, few enough to read.
MAX_KEPT_SAMPLES = 10

#: Seconds a save waits for another run's save to finish.
LOCK_TIMEOUT_S = 60.0

LOCK_NAME = ".pytest-mig.lock"
EMULATED_SUFFIX = "-emulated"

_SIGNIFICANT = 6  # digits written for values and samples: exact enough, short enough to review

#: NVML clock-event reasons that mean power or heat held the clocks down (names as the nvml module
#: writes them); idle, application-clock and sync-boost reasons do not slow a busy GPU.
THROTTLE_REASONS: tuple[str, ...] = ("sw_power_cap", "hw_power_brake", "hw_slowdown", "sw_thermal", "hw_thermal")


#: The least tolerance a new baseline entry gets, by kind of metric.  Board energy moves with the
#: GPU's temperature and power capping: two back-to-back bf16 GEMM runs on an H200 differed by 5.9%
#: in J/TFLOP with TFLOPS within 0.1%, so energy gets 10% where the default is 5%.
KIND_MIN_TOLERANCE: dict[str, float] = {"energy": 0.10}


class BaselineError(Exception):
    """A baseline file that cannot be used: one sentence naming the file and the problem."""


@dataclass(frozen=True)
class Spread:
    """Robust spread of the samples behind a baseline value (what the noise check uses)."""

    n: int
    median: float
    mad: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> "Spread | None":
        xs = sorted(float(s) for s in samples if math.isfinite(s))
        if not xs:
            return None
        med = statistics.median(xs)
        mad = statistics.median([abs(x - med) for x in xs])
        return cls(len(xs), med, mad, xs[0], xs[-1])

    @property
    def rel_sigma(self) -> float:
        """Robust standard deviation (1.4826 x MAD) relative to the median; 0 when unknown."""
        if self.n < 2 or not self.median:
            return 0.0
        return 1.4826 * self.mad / abs(self.median)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "median": _round(self.median), "mad": _round(self.mad),
                "min": _round(self.min), "max": _round(self.max)}


@dataclass
class BaselineEntry:
    """One test's metric as recorded in a baseline file."""

    test: str
    metric: str
    value: float
    unit: str
    direction: str
    kind: str = "compute"
    tolerance: float | None = None
    spread: Spread | None = None
    samples: list[float] = field(default_factory=list)
    recorded_at: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)  # what it was recorded under
    throttled: list[str] = field(default_factory=list)  # throttle reasons seen while recording
    mode: str = "normal"  # "normal" or "quick": recorded with --mig-quick (other sizes) or not

    def to_dict(self, file_fingerprint: Mapping[str, Any] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "value": _round(self.value),
            "unit": self.unit,
            "direction": self.direction,
            "kind": self.kind,
            "tolerance": self.tolerance,
            "spread": self.spread.to_dict() if self.spread else None,
            "samples": [_round(s) for s in self.samples],
            "recorded_at": self.recorded_at,
            "mode": self.mode,
        }
        # An entry kept from an older save remembers its own fingerprint; others share the file's.
        if self.fingerprint and dict(self.fingerprint) != dict(file_fingerprint or {}):
            d["fingerprint"] = dict(self.fingerprint)
        if self.throttled:
            d["throttled"] = list(self.throttled)
        return d


@dataclass
class BaselineMeta:
    """What a baseline file is for: the verdict layer refuses to compare across any of these."""

    gpu_model: str
    gpu_slug: str
    profile: str  # the baseline profile key: "3g.71gb", "3g.71gb-emulated", "full", "cpu"
    emulated: bool
    fingerprint: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def target_profile(self) -> str:
        """The profile without the emulation suffix."""
        return self.profile[: -len(EMULATED_SUFFIX)] if self.profile.endswith(EMULATED_SUFFIX) else self.profile


@dataclass
class Baseline:
    """A loaded baseline file."""

    meta: BaselineMeta
    entries: dict[tuple[str, str], BaselineEntry] = field(default_factory=dict)
    updated_at: str = ""

    def get(self, test: str, metric: str) -> BaselineEntry | None:
        return self.entries.get((test, metric))

    def to_dict(self) -> dict[str, Any]:
        tests: dict[str, dict[str, Any]] = {}
        for (test, metric), entry in self.entries.items():
            tests.setdefault(test, {})[metric] = entry.to_dict(self.meta.fingerprint)
        return {
            "schema": BASELINE_SCHEMA,
            "gpu_model": self.meta.gpu_model,
            "gpu_slug": self.meta.gpu_slug,
            "profile": self.meta.profile,
            "emulated": self.meta.emulated,
            "fingerprint": self.meta.fingerprint,
            "updated_at": self.updated_at,
            "tests": tests,
        }

    def to_json(self) -> str:
        try:
            return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        except ValueError as exc:  # a NaN or infinity somewhere (the fingerprint): JSON cannot hold it
            where = self.meta.path or f"{self.meta.gpu_slug}/{self.meta.profile}"
            raise BaselineError(f"{where}: not saved, a value cannot be written as JSON ({exc})") from None


@dataclass
class SaveResult:
    """What one save did to one file, for the line the plugin prints."""

    path: Path
    written: int  # metrics written from this run
    kept: int  # entries of tests not in this run, left as they were
    skipped: list[str] = field(default_factory=list)  # "test::metric (why)"
    unchanged: bool = False  # the file already held exactly this: not rewritten

    def __str__(self) -> str:
        line = f"{self.path} ({self.written} metric(s) from this run, {self.kept} kept from earlier runs"
        if self.unchanged:
            line += "; unchanged, not rewritten"
        if self.skipped:
            more = "; ..." if len(self.skipped) > 3 else ""
            line += f"; {len(self.skipped)} not saved: {'; '.join(self.skipped[:3])}{more}"
        return line + ")"

    def describe(self) -> str:
        return f"baseline saved: {self}"


def _round(x: float) -> float:
    return float(f"{float(x):.{_SIGNIFICANT}g}")


def _keep_samples(samples: list[float]) -> list[float]:
    """At most MAX_KEPT_SAMPLES, spread evenly over the sorted samples so the shape survives."""
    xs = sorted(s for s in samples if math.isfinite(s))
    if len(xs) <= MAX_KEPT_SAMPLES:
        return xs
    step = (len(xs) - 1) / (MAX_KEPT_SAMPLES - 1)
    return [xs[round(i * step)] for i in range(MAX_KEPT_SAMPLES)]


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
        reasons = [str(r) for r in (snap.get("throttle_reasons") or [])]
        known = [r for r in reasons if r in THROTTLE_REASONS]
        if not known and snap.get("throttled"):
            known = reasons or ["throttled"]
        found.extend(r for r in known if r not in found)
    return found


def entry_from_record(record: ResultRecord, tolerance: float | None = None) -> BaselineEntry:
    """The baseline entry a record would become (also how ``pytest-mig compare`` uses an old run)."""
    m = record.metric
    samples = [float(s) for s in m.samples]
    return BaselineEntry(
        test=record.test,
        metric=m.name,
        value=float(m.value),
        unit=m.unit,
        direction=m.direction,
        kind=m.kind,
        tolerance=tolerance,
        spread=Spread.of(samples),
        samples=_keep_samples(samples),
        recorded_at=record.timestamp,
        fingerprint=dict(record.fingerprint or {}),
        throttled=throttle_reasons(m.info),
        mode=record.mode,
    )


def meta_from_record(record: ResultRecord, path: Path | None = None) -> BaselineMeta:
    """The meta a baseline recorded from this record's Target would carry."""
    t = record.target
    emulated = bool(t.get("emulated")) or t.get("kind") == "emulated"
    profile = str(t.get("baseline_profile") or t.get("profile") or "")
    if emulated and not profile.endswith(EMULATED_SUFFIX):
        profile += EMULATED_SUFFIX
    slug = str(t.get("gpu_slug") or (CPU if t.get("kind") == CPU or not t.get("gpu_name") else model_slug(t["gpu_name"])))
    gpu_name = "CPU" if slug == CPU else str(t.get("gpu_name") or slug)
    return BaselineMeta(gpu_name, slug, profile, emulated, dict(record.fingerprint or {}), path)


class BaselineStore:
    """The folder of baselines: ``<root>/<gpu-model-slug>/<profile>.json``."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"BaselineStore({str(self.root)!r})"

    # -- paths -----------------------------------------------------------------------------------

    def path_for(self, gpu_slug: str, baseline_profile: str) -> Path:
        """Where the baseline of one GPU model and profile lives (it may not exist yet)."""
        for part in (gpu_slug, baseline_profile):
            if not part or "/" in part or "\\" in part or part.startswith("."):
                raise BaselineError(f"'{part}' cannot name a baseline file: a GPU slug or profile without slashes is needed")
        return self.root / gpu_slug / f"{baseline_profile}.json"

    def files(self) -> list[Path]:
        """Every baseline file in the store, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("*/*.json") if not p.name.startswith("."))

    # -- reading ---------------------------------------------------------------------------------

    def load(self, gpu_slug: str, baseline_profile: str) -> Baseline | None:
        """The baseline for this GPU model and profile; None when there is none yet."""
        path = self.path_for(gpu_slug, baseline_profile)
        if not path.exists():
            return None
        return load_baseline_file(path)

    def records(self, gpu_slug: str | None = None) -> tuple[list[ResultRecord], list[str]]:
        """Baseline entries as result records (for scaling checks against other profiles), and a
        line for each file that could not be read (those files are left out, not guessed at)."""
        out: list[ResultRecord] = []
        problems: list[str] = []
        for path in self.files():
            if gpu_slug is not None and path.parent.name != gpu_slug:
                continue
            try:
                base = load_baseline_file(path)
            except BaselineError as exc:
                problems.append(str(exc))
                continue
            out.extend(_records_of(base))
        return out, problems

    # -- writing ---------------------------------------------------------------------------------

    def save(
        self,
        records: Iterable[ResultRecord],
        default_tolerance: float = DEFAULT_TOLERANCE,
    ) -> list[SaveResult]:
        """Merge this run's records into their baseline files and write them.

        A metric's entry is replaced by this run's figure; a tolerance already in the file (perhaps
        tuned by hand in review) is kept, else ``default_tolerance`` is written.  Entries of tests
        not in ``records`` stay.  Informational metrics and non-finite values are not saved.  Raises
        BaselineError (and writes nothing for that file) when the existing file cannot be read or
        belongs to another GPU model, profile or kind of target.
        """
        _check_tolerance(default_tolerance, "the default tolerance")
        groups: dict[tuple[str, str], list[ResultRecord]] = {}
        skipped: dict[tuple[str, str], list[str]] = {}
        for rec in records:
            meta = meta_from_record(rec)
            key = (meta.gpu_slug, meta.profile)
            if not rec.metric.compare:
                skipped.setdefault(key, []).append(f"{rec.test}::{rec.metric.name} (informational)")
                continue
            if not math.isfinite(rec.metric.value):
                skipped.setdefault(key, []).append(f"{rec.test}::{rec.metric.name} (value {rec.metric.value})")
                continue
            groups.setdefault(key, []).append(rec)
        results: list[SaveResult] = []
        if not groups:
            return results
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.root / LOCK_NAME), timeout=LOCK_TIMEOUT_S):
                for (slug, profile), recs in sorted(groups.items()):
                    results.append(self._save_group(slug, profile, recs, default_tolerance, skipped.get((slug, profile), [])))
        except Timeout:
            raise BaselineError(
                f"{self.root / LOCK_NAME}: another run held the baseline lock for {LOCK_TIMEOUT_S:.0f} s; "
                f"nothing was saved, try again when it has finished"
            ) from None
        except OSError as exc:  # the folder or its lock cannot be created: a user's setting, not a crash
            raise BaselineError(f"{self.root}: baselines cannot be written there ({exc.strerror or exc})") from None
        return results

    def _save_group(
        self, slug: str, profile: str, recs: list[ResultRecord], default_tolerance: float, skipped: list[str]
    ) -> SaveResult:
        path = self.path_for(slug, profile)
        new_meta = meta_from_record(recs[-1], path)
        existing = load_baseline_file(path) if path.exists() else None
        if existing is not None:
            old = existing.meta
            if old.emulated != new_meta.emulated:
                raise BaselineError(
                    f"{path}: holds {'emulated' if old.emulated else 'real'} figures and this run's are "
                    f"{'emulated' if new_meta.emulated else 'real'}; not saved, they are never mixed"
                )
            entries = dict(existing.entries)
            for entry in entries.values():  # kept entries remember the fingerprint they were recorded under
                if not entry.fingerprint:
                    entry.fingerprint = dict(old.fingerprint)
        else:
            entries = {}
        if new_meta.emulated and not profile.endswith(EMULATED_SUFFIX):
            raise BaselineError(f"{path}: emulated figures cannot be saved into a real profile's baseline")
        written = 0
        for rec in recs:
            key = (rec.test, rec.metric.name)
            previous = entries.get(key)
            tol = (previous.tolerance if previous is not None and previous.tolerance is not None
                   else max(default_tolerance, KIND_MIN_TOLERANCE.get(rec.metric.kind, 0.0)))
            entries[key] = entry_from_record(rec, tol)
            written += 1
        run_keys = {(r.test, r.metric.name) for r in recs}
        kept = sum(1 for k in entries if k not in run_keys)
        base = Baseline(new_meta, dict(sorted(entries.items())), existing.updated_at if existing else "")
        if existing is not None and base.to_json() == path.read_text(encoding="utf-8"):
            # Saving what the file already holds changes nothing, not even its date: no diff to review.
            return SaveResult(path, written, kept, list(skipped), unchanged=True)
        base.updated_at = utc_now()
        text = base.to_json()  # serialise fully before touching the file
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        try:
            atomic_write_text(path, text)
            os.chmod(path, mode)  # the temporary file was created 0600; keep the file readable by the team
        except OSError as exc:  # disk full, read-only folder: the rename never happened, the old file stands
            raise BaselineError(f"{path}: not saved, the file could not be written ({exc.strerror or exc}); "
                                f"it is as it was before this save") from None
        return SaveResult(path, written, kept, list(skipped))


def _records_of(base: Baseline) -> Iterator[ResultRecord]:
    meta = base.meta
    profile = meta.target_profile
    kind = "emulated" if meta.emulated else (FULL if profile == FULL else CPU if profile == CPU else "mig")
    target = {
        "kind": kind, "profile": profile, "baseline_profile": meta.profile, "gpu_name": meta.gpu_model,
        "gpu_slug": meta.gpu_slug, "emulated": meta.emulated, "source": f"baseline {meta.path}",
    }
    for e in base.entries.values():
        metric = Metric(e.metric, e.value, e.unit, e.direction, list(e.samples), e.kind)  # type: ignore[arg-type]
        yield ResultRecord(e.test, metric, dict(target), dict(e.fingerprint or meta.fingerprint),
                           e.recorded_at, node="baseline", mode=e.mode)


# -- strict reading ------------------------------------------------------------------------------


def _check_tolerance(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BaselineError(f"{what} must be a non-negative fraction such as 0.05, not {value!r}")
    return float(value)


def _number(path: Path, where: str, value: Any, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BaselineError(f"{path}: {where} is {json.dumps(value)}, not a number; fix it or delete the entry")
    return float(value)


def load_baseline_file(path: Path) -> Baseline:
    """Read and check one baseline file; every problem is one BaselineError sentence naming it."""
    path = Path(path)
    advice = "fix or delete it (pytest-mig never overwrites a file it cannot read)"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot be read ({exc})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: not valid JSON ({exc}); {advice}") from None
    if not isinstance(doc, dict):
        raise BaselineError(f"{path}: not a baseline file (a JSON object is expected at the top); {advice}")
    if doc.get("schema") != BASELINE_SCHEMA:
        raise BaselineError(
            f"{path}: schema is {json.dumps(doc.get('schema'))}, expected \"{BASELINE_SCHEMA}\"; {advice}"
        )
    for key, typ, name in (("gpu_model", str, "a string"), ("gpu_slug", str, "a string"),
                           ("profile", str, "a string"), ("emulated", bool, "true or false"),
                           ("tests", dict, "an object")):
        if not isinstance(doc.get(key), typ):
            raise BaselineError(f"{path}: '{key}' must be {name}, found {json.dumps(doc.get(key))}; {advice}")
    fingerprint = {} if doc.get("fingerprint") is None else doc["fingerprint"]
    if not isinstance(fingerprint, dict):
        raise BaselineError(f"{path}: 'fingerprint' must be an object; {advice}")
    folder = path.parent.name
    if doc["gpu_slug"] != folder or model_slug(doc["gpu_model"]) != folder:
        raise BaselineError(
            f"{path}: recorded on GPU model '{doc['gpu_model']}' ({doc['gpu_slug']}) but kept in folder "
            f"'{folder}'; a baseline of another GPU model is never used, move it to its own folder"
        )
    if doc["profile"] != path.stem:
        raise BaselineError(f"{path}: recorded for profile '{doc['profile']}' but named '{path.name}'; rename or fix it")
    if doc["emulated"] != doc["profile"].endswith(EMULATED_SUFFIX):
        raise BaselineError(
            f"{path}: 'emulated' is {json.dumps(doc['emulated'])} but the profile is '{doc['profile']}'; "
            f"emulated baselines are named <profile>{EMULATED_SUFFIX}"
        )
    meta = BaselineMeta(doc["gpu_model"], doc["gpu_slug"], doc["profile"], doc["emulated"], dict(fingerprint), path)
    entries: dict[tuple[str, str], BaselineEntry] = {}
    for test, metrics in doc["tests"].items():
        if not isinstance(metrics, dict):
            raise BaselineError(f"{path}: test '{test}' must map metric names to entries; {advice}")
        for name, e in metrics.items():
            where = f"test '{test}' metric '{name}'"
            if not isinstance(e, dict):
                raise BaselineError(f"{path}: {where} must be an object; {advice}")
            if "value" not in e:
                raise BaselineError(f"{path}: {where} has no 'value'; {advice}")
            value = _number(path, f"{where} value", e["value"])
            if e.get("direction") not in ("higher", "lower"):
                raise BaselineError(
                    f"{path}: {where} has direction {json.dumps(e.get('direction'))}; use \"higher\" or \"lower\""
                )
            tol = _number(path, f"{where} tolerance", e.get("tolerance"), allow_none=True)
            if tol is not None and tol < 0:
                raise BaselineError(f"{path}: {where} tolerance {tol} is negative; use a fraction such as 0.05")
            samples_raw = [] if e.get("samples") is None else e["samples"]
            if not isinstance(samples_raw, list):
                raise BaselineError(f"{path}: {where} samples must be a list of numbers; {advice}")
            samples = [_number(path, f"{where} sample", s) for s in samples_raw]
            spread = _read_spread(path, where, e.get("spread"))
            fp = meta.fingerprint if e.get("fingerprint") is None else e["fingerprint"]
            if not isinstance(fp, dict):
                raise BaselineError(f"{path}: {where} fingerprint must be an object; {advice}")
            throttled = [] if e.get("throttled") is None else e["throttled"]
            if not isinstance(throttled, list):
                raise BaselineError(f"{path}: {where} throttled must be a list of reasons; {advice}")
            if not isinstance(e.get("unit"), str):
                what = "has no 'unit'" if "unit" not in e else f"has unit {json.dumps(e['unit'])}, not a string"
                raise BaselineError(f"{path}: {where} {what} (use \"\" for a unitless figure); {advice}")
            unit = e["unit"]
            kind = e.get("kind") or "compute"
            if kind not in METRIC_KINDS:
                raise BaselineError(
                    f"{path}: {where} has kind {json.dumps(kind)}; use one of {', '.join(METRIC_KINDS)}"
                )
            mode = e.get("mode") or "normal"  # files saved before modes were recorded: normal runs
            if mode not in MODES:
                raise BaselineError(f"{path}: {where} has mode {json.dumps(mode)}; use \"normal\" or \"quick\"")
            entries[(test, name)] = BaselineEntry(
                test=test, metric=name, value=float(value or 0.0), unit=unit, direction=e["direction"],
                kind=str(kind), tolerance=tol, spread=spread,
                samples=[float(s or 0.0) for s in samples], recorded_at=str(e.get("recorded_at") or ""),
                fingerprint=dict(fp), throttled=[str(t) for t in throttled], mode=str(mode),
            )
    return Baseline(meta, entries, str(doc.get("updated_at") or ""))


def _read_spread(path: Path, where: str, raw: Any) -> Spread | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BaselineError(f"{path}: {where} spread must be an object with n, median, mad, min and max")
    vals = {k: _number(path, f"{where} spread {k}", raw.get(k)) for k in ("median", "mad", "min", "max")}
    n = raw.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise BaselineError(f"{path}: {where} spread n is {json.dumps(n)}, not a count")
    return Spread(n, vals["median"] or 0.0, vals["mad"] or 0.0, vals["min"] or 0.0, vals["max"] or 0.0)
