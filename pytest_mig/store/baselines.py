"""The baseline store: one reviewed JSON file per GPU model and profile, holding each figure's history.

``baselines/<gpu-model-slug>/<profile>.json`` keeps, per mode (``normal`` or ``quick``), test and
metric, the figures of the last N runs that were saved into it (``--mig-save-baseline``,
``pytest-mig calibrate``), each with its time, fingerprint and throttle state.  A history, not one
run, is what tells how much a figure moves between runs on this GPU model and profile; the verdict
rule (:mod:`pytest_mig.judge.noise`, :mod:`pytest_mig.judge.verdict`) takes its threshold from it.

Layout (schema 2), kept small and reviewable: stable key order, one line per run, fingerprints
written once in a table and named by a short hash::

    {"schema": "pytest-mig/baseline/2", "gpu_model": "NVIDIA H100 80GB HBM3", "profile": "full", ...,
     "keep": 10, "fingerprints": {"3f9c2a1b7e": {"driver": "580.159.04", ...}},
     "modes": {"normal": {"<test id>": {"bf16_tflops": {"direction": "higher", "kind": "tensor",
        "tolerance": null, "unit": "TFLOPS", "runs": [
          {"at": "2026-11-23T08:00:00+00:00", "fp": "3f9c2a1b7e", "noise": 0.0041, "value": 699.6},
          ...]}}}}}

Emulated profiles live under their own key (``3g.71gb-emulated``), so an emulated figure is never
compared with, or saved over, a real slice's.  Files of schema 1 (one value per entry) still read:
each entry becomes a history of one run, and the next save writes schema 2.

Files are read strictly: a hand-broken file is a :class:`BaselineError` naming the file and the
problem (a value that is not a positive number, a tolerance outside [0, 100%)), and a save never
replaces a file it could not read.  Saves hold a lock on the store's folder (``flock`` on the
folder itself: no lock file is left behind for ``git status`` or for a teammate's umask) and, for
each history, on the folder that really holds it (a link's target: baseline folders of several
nightlies linking to one shared history take the same lock), re-read and merge it under that lock, and write
through a temporary file and a rename, so a save that dies half-way leaves the old file as it was;
the next save removes such a dead save's temporary file.  Only ``json`` is used to read them: no
pickle, no eval.

Informational metrics (``Metric.compare is False``) and non-finite or non-positive figures are not
saved.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from pytest_mig.common.files import (
    LOCK_TIMEOUT_S,
    MAX_NUMBER,
    FileProblem,
    atomic_write_text,
    check_links,
    folder_lock,
    parse_json,
    path_problem,
    read_json,
    validate,
    write_target,
)
from pytest_mig.measure import METRIC_KINDS, Metric, partner_keys
from pytest_mig.device.profiles import CPU, FULL, model_slug
from pytest_mig.store.results import MODES, ResultRecord, utc_now
from pytest_mig.store.schemas import BASELINE, BASELINE_V1
from pytest_mig.common.text import SHOWN, quoted

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


def measured_clock(info: Mapping[str, Any] | None) -> float | None:
    """The SM clock a measurement ran at: the mean sampled through its energy window
    (``info["clocks"]["window"]``), else the snapshot read right after it.  On a power-capped GPU the
    two differ: an emulated 7g.141gb's fp64 GEMM sampled 1620 MHz through its window and read 1710 MHz
    once it ended (docs/benchmarks.md, sixth session)."""
    clocks = (info or {}).get("clocks") or {}
    if not isinstance(clocks, Mapping):
        return None
    for phase in ("window", "after"):
        snap = clocks.get(phase)
        value = snap.get("sm_clock_mhz") if isinstance(snap, Mapping) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            return float(value)
    return None


def measured_value(record: ResultRecord) -> float:
    """The value a run adds to its figure's history: its reading, or, where the run re-measured the
    figure (its first reading was beyond its threshold), the median of all its readings.

    A first reading the run itself found transient (a -36% dip re-measured within 0.3%) would
    otherwise enter the history as the run's value, and with a rolling history of a few runs one
    such dip sets the figure's sigma, widening its band.  A confirmed change moves the median too.
    """
    value = float(record.metric.value)
    taken = [float(x) for x in (record.verdict or {}).get("confirmations") or ()
             if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)]
    if taken and math.isfinite(value):
        return statistics.median([value, *taken])
    return value


def run_from_record(record: ResultRecord) -> Run:
    """The run a record adds to its figure's history (its value: :func:`measured_value`)."""
    m = record.metric
    return Run(value=measured_value(record), recorded_at=record.timestamp, fingerprint=dict(record.fingerprint or {}),
               noise=within_run_noise(m.samples), throttled=throttle_reasons(m.info), clock_mhz=measured_clock(m.info))


def entry_from_records(records: Iterable[ResultRecord], tolerance: float | None = None) -> BaselineEntry:
    """A history made of earlier runs' records of one figure, oldest first (``pytest-mig compare``)."""
    recs = list(records)
    if not recs:
        raise ValueError("no records")
    m = recs[-1].metric
    return BaselineEntry(test=recs[-1].test, metric=m.name, unit=m.unit, direction=m.direction, kind=m.kind,
                         tolerance=tolerance, runs=[run_from_record(r) for r in recs], mode=recs[-1].mode)


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


def saveable(record: ResultRecord) -> str | None:
    """Why a record must not enter a history (None: it may)."""
    m = record.metric
    if not m.compare:
        return "informational"
    if not math.isfinite(m.value):
        return f"value {m.value}"
    if m.value <= 0:
        return f"value {m.value} is not positive"
    if record.mode not in MODES:
        return f"mode {record.mode!r}"
    return None


class BaselineStore:
    """The folder of baselines: ``<root>/<gpu-model-slug>/<profile>.json``."""

    def __init__(self, root: Path | str, keep: int | None = None, *, shrink: bool = False) -> None:
        self.root = Path(root)
        self.keep = keep  # None: the file's own setting, else DEFAULT_KEEP
        self.shrink = shrink  # a keep below a file's own may drop its older runs (--mig-baseline-shrink)

    def __repr__(self) -> str:
        return f"BaselineStore({str(self.root)!r})"

    def path_for(self, gpu_slug: str, baseline_profile: str) -> Path:
        """Where the baseline of one GPU model and profile lives (it may not exist yet)."""
        for part in (gpu_slug, baseline_profile):  # from a file's data: each must be one plain name
            why = path_problem(f"{part}.json") if part else None  # a NUL byte, a name too long for the disk
            if not part or "/" in part or "\\" in part or part.startswith(".") or why:
                raise BaselineError(f"{quoted(part, SHOWN)} cannot name a baseline file: a GPU slug or profile of one "
                                    f"name (no slashes, no NUL byte, not starting with a dot, at most 250 bytes) "
                                    f"is needed")
        return self.root / gpu_slug / f"{baseline_profile}.json"

    def files(self) -> list[Path]:
        """Every baseline file in the store, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("*/*.json") if not p.name.startswith("."))

    def load(self, gpu_slug: str, baseline_profile: str) -> Baseline | None:
        """The baseline for this GPU model and profile; None when there is none yet."""
        path = self.path_for(gpu_slug, baseline_profile)
        if not history_exists(path):
            return None
        return load_baseline_file(path)

    def check_save(self, gpu_slug: str, baseline_profile: str) -> Baseline | None:
        """What a save into this GPU model and profile's file would meet, checked before a run measures
        anything: the file must read, its folder be writable (a link is written through), and a keep
        below the file's own needs ``shrink``.  BaselineError with one sentence; the file as it is."""
        path = self.path_for(gpu_slug, baseline_profile)
        try:
            check_links(path)
            real = write_target(path)
        except FileProblem as exc:
            raise BaselineError(str(exc)) from None
        existing = load_baseline_file(path) if history_exists(path) else None
        folder = real.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not os.access(folder, os.W_OK | os.X_OK):
            raise BaselineError(f"{path}: the folder {folder} is not writable by this user, so this run could "
                                f"not be added to the history; nothing is saved")
        lost = 0 if existing is None or self.keep is None or self.shrink else \
            sum(max(0, len(_kept(e.runs + [e.runs[-1]], existing.keep)) - self.keep) for e in existing.entries.values())
        if lost:  # runs a save without a keep would have kept: the history shrinks only with consent
            most = max([existing.keep, *(len(e.runs) for e in existing.entries.values())])
            raise BaselineError(
                f"{path} keeps {most} runs per figure and a keep of {self.keep} would drop {lost} older "
                f"run(s) of its {len(existing.entries)} figure(s); nothing is saved: confirm with "
                f"--mig-baseline-shrink (to pytest or to pytest-mig calibrate), or leave the keep as it is")
        return existing

    def records(self, gpu_slug: str | None = None) -> tuple[list[ResultRecord], list[str]]:
        """Each figure's baseline (the median of its runs) as a result record, for scaling checks
        against other profiles, and a line for each file that could not be read (left out)."""
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

    def save(self, records: Iterable[ResultRecord], *, once: bool = False) -> list[SaveResult]:
        """Add this run's figures to their histories and write the files.

        Each figure's history gains this run and keeps the last ``keep`` runs; a tolerance set in
        the file is kept; entries of tests not in ``records`` stay.  With ``once``, a record whose run
        (its time and value) is in the history already is not added again: results files added
        twice (``pytest-mig reference``) would count one measurement as two runs, and equal runs
        shrink a figure's sigma below its noise.  Raises BaselineError (and writes nothing for that
        file) when the existing file cannot be read or belongs to another GPU model, profile or
        kind of target.
        """
        groups: dict[tuple[str, str], list[ResultRecord]] = {}
        skipped: dict[tuple[str, str], list[str]] = {}
        for rec in records:
            meta = meta_from_record(rec)
            key = (meta.gpu_slug, meta.profile)
            why = saveable(rec)
            if why:
                skipped.setdefault(key, []).append(f"{rec.test}::{rec.metric.name} ({why})")
            else:
                groups.setdefault(key, []).append(rec)
        if not groups:
            return []
        results: list[SaveResult] = []
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with folder_lock(self.root, LOCK_TIMEOUT_S):
                for (slug, profile), recs in sorted(groups.items()):
                    with self._history_lock(self.path_for(slug, profile)) as real:
                        results.append(self._save_group(slug, profile, recs, skipped.get((slug, profile), []),
                                                        once, real))
        except TimeoutError as exc:
            raise BaselineError(
                f"{exc}: another run held the baseline folder's lock for {LOCK_TIMEOUT_S:.0f} s; "
                f"nothing was saved, try again when it has finished"
            ) from None
        except OSError as exc:  # the folder cannot be created or opened: a user's setting, not a crash
            raise BaselineError(f"{self.root}: baselines cannot be written there ({exc.strerror or exc})") from None
        return results

    @contextlib.contextmanager
    def _history_lock(self, path: Path) -> Iterator[Path]:
        """The lock on the file a save to ``path`` really writes (a link's target, :func:`write_target`),
        held on the folder that really holds it, whatever baseline folder the writer came through: two
        sites' folders whose histories link to one shared file take the same lock.  The file itself is
        replaced by a rename at each save, so it cannot carry the lock.  Yields the file to write; the
        link is resolved again under the lock and must still name it."""
        for _ in range(3):
            try:
                real = write_target(path)
            except FileProblem as exc:
                raise BaselineError(f"{exc}; nothing was saved") from None
            real.parent.mkdir(parents=True, exist_ok=True)
            if _same_folder(real.parent, self.root):  # the store's own lock, held already
                yield real
                return
            with folder_lock(real.parent, LOCK_TIMEOUT_S):
                if write_target(path) == real:
                    yield real
                    return
        raise BaselineError(f"{path}: the link changed its target three times while this run saved; nothing was "
                            f"saved, try again when whatever moves it has finished")

    def _save_group(self, slug: str, profile: str, recs: list[ResultRecord], skipped: list[str],
                    once: bool, real: Path) -> SaveResult:
        """Read, merge and write one history, under :meth:`_history_lock` (``real``: the file written)."""
        path = self.path_for(slug, profile)
        existing = self.check_save(slug, profile)
        _remove_dead_temporaries(real)
        new_meta = meta_from_record(recs[-1], path)
        if existing is not None and existing.meta.emulated != new_meta.emulated:
            raise BaselineError(
                f"{path}: holds {'emulated' if existing.meta.emulated else 'real'} figures and this run's are "
                f"{'emulated' if new_meta.emulated else 'real'}; not saved, they are never mixed"
            )
        if new_meta.emulated and not profile.endswith(EMULATED_SUFFIX):
            raise BaselineError(f"{path}: emulated figures cannot be saved into a real profile's baseline")
        keep = self.keep or (existing.keep if existing else DEFAULT_KEEP)
        entries = dict(existing.entries) if existing else {}
        restarted: list[str] = []
        touched: set[EntryKey] = set()
        repeats = 0
        for rec in recs:
            m = rec.metric
            key = (rec.test, m.name, rec.mode)
            old = entries.get(key)
            runs = list(old.runs) if old is not None else []
            if old is not None and (old.unit != m.unit or old.direction != m.direction):
                restarted.append(f"{rec.test}::{m.name} ({old.unit}, {old.direction} -> {m.unit}, {m.direction})")
                runs = []
            run = run_from_record(rec)
            if once and any(r.recorded_at == run.recorded_at and r.value == _round(run.value) for r in runs):
                repeats += 1
                continue
            runs.append(run)
            entries[key] = BaselineEntry(rec.test, m.name, m.unit, m.direction, m.kind,
                                         old.tolerance if old is not None else None,
                                         runs[-keep:] if self.keep else _kept(runs, keep), rec.mode)
            touched.add(key)
        base = Baseline(new_meta, dict(sorted(entries.items())), utc_now(), keep)
        text = base.to_json()  # serialise fully before touching the file
        try:  # read back as the next run will read it, before it replaces the old file
            atomic_write_text(real, text, check=check_baseline_text(path))
        except FileProblem as exc:
            raise BaselineError(f"not saved: {exc}") from None
        except OSError as exc:  # disk full, read-only folder: the rename never happened, the old file stands
            raise BaselineError(f"{path}: not saved, the file could not be written ({exc.strerror or exc}); "
                                f"it is as it was before this save") from None
        fewest = min(len(entries[(r.test, r.metric.name, r.mode)].runs) for r in recs)
        return SaveResult(path, len(touched), len(entries) - len(touched), list(skipped), restarted, fewest, repeats)


def history_exists(path: Path) -> bool:
    """Whether a history or reference file is there to read (:func:`load_baseline_file` says whether it
    reads); False for none, or a link to a file not written yet (a shared history's first night).
    BaselineError where the file or a folder on the way is a link that loops or leads to no folder:
    such a history is neither read nor silently taken for none."""
    try:
        check_links(path)
    except FileProblem as exc:
        raise BaselineError(str(exc)) from None
    return path.exists()


def _kept(runs: list[Run], keep: int) -> list[Run]:
    """The runs a history keeps after a save that named no keep (``runs``: with the new run last): the
    last ``keep``, or, in a history that held more before this run (hand-merged from two sites), as
    many as it held, the oldest giving way to the new run.  Only an explicit keep with consent
    (``--mig-baseline-shrink``) makes a history shorter."""
    return runs[-max(keep, len(runs) - 1):]


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _remove_dead_temporaries(path: Path) -> None:
    """Temporary files of a save that was killed before its rename (``.<name>.*.tmp``, this tool's
    naming): under the folder lock nobody else is writing this file, so they are dead."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def _records_of(base: Baseline) -> Iterator[ResultRecord]:
    meta = base.meta
    profile = meta.target_profile
    kind = "emulated" if meta.emulated else (FULL if profile == FULL else CPU if profile == CPU else "mig")
    target = {
        "kind": kind, "profile": profile, "baseline_profile": meta.profile, "gpu_name": meta.gpu_model,
        "gpu_slug": meta.gpu_slug, "emulated": meta.emulated, "source": f"baseline {meta.path}",
    }
    for e in base.entries.values():
        # What the scaling check needs of the runs' clocks: their SM clock, where saved, and their throttle reasons
        # (a stored 7g at the power cap against this run's 4g is `power-limited`, not failed).
        clocks: dict[str, Any] = {"after": {"throttle_reasons": e.throttled, "throttled": bool(e.throttled)}}
        ran_at = [r.clock_mhz for r in e.runs if r.clock_mhz]
        if ran_at:
            clocks["window"] = {"sm_clock_mhz": statistics.median(ran_at)}
        metric = Metric(e.metric, e.value, e.unit, e.direction, e.values, e.kind,  # type: ignore[arg-type]
                        info={"clocks": clocks})
        yield ResultRecord(e.test, metric, dict(target), e.fingerprint or dict(meta.fingerprint),
                           e.recorded_at, node="baseline", mode=e.mode)


# -- strict reading ------------------------------------------------------------------------------

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
