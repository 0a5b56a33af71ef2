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
saved.  A file's records (:class:`~pytest_mig.store.history.Baseline`, ``BaselineEntry``, ``Run``) live
in :mod:`pytest_mig.store.history`, its strict reader in :mod:`pytest_mig.store.reader` (schema 1:
:mod:`pytest_mig.store.legacy`); this module turns results into runs and keeps, merges and writes
the files.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from pathlib import Path
from typing import Any, Iterable, Iterator

from pytest_mig.device.host import shared_host
from pytest_mig.common.files import (
    LOCK_TIMEOUT_S,
    FileProblem,
    atomic_write_text,
    check_links,
    folder_lock,
    path_problem,
    write_target,
)
from pytest_mig.common.text import SHOWN, quoted
from pytest_mig.device.profiles import CPU, FULL
from pytest_mig.device.target import EMULATED_SUFFIX, TargetInfo
from pytest_mig.measure import Metric, within_run_noise
from pytest_mig.measure.clocks import Clocks, measured_clock, temperature_of, throttle_reasons
from pytest_mig.store.history import (
    DEFAULT_KEEP,
    Baseline,
    BaselineEntry,
    BaselineError,
    BaselineMeta,
    EntryKey,
    Run,
    SaveResult,
    is_size,
    round_figure,
)
from pytest_mig.store.reader import check_baseline_text, load_baseline_file
from pytest_mig.store.results import MODES, ResultRecord, utc_now


def measured_value(record: ResultRecord) -> float:
    """The value a run adds to its figure's history: its reading, or, where the run re-measured the
    figure (its first reading was beyond its threshold), the median of all its readings.

    A first reading the run itself found transient (a deep dip whose re-measurements came back) would
    otherwise enter the history as the run's value, and with a rolling history of a few runs one
    such dip sets the figure's sigma, widening its band.  A confirmed change moves the median too.
    """
    value = float(record.metric.value)
    taken = [float(x) for x in (record.verdict.confirmations if record.verdict is not None else ())
             if math.isfinite(x)]
    if taken and math.isfinite(value):
        return statistics.median([value, *taken])
    return value


def run_from_record(record: ResultRecord) -> Run:
    """The run a record adds to its figure's history (its value: :func:`measured_value`)."""
    m = record.metric
    return Run(value=measured_value(record), recorded_at=record.timestamp, fingerprint=dict(record.fingerprint or {}),
               noise=within_run_noise(m.samples), throttled=throttle_reasons(m.info), clock_mhz=measured_clock(m.info),
               size=measured_size(m.info), temperature_c=temperature_of(m.info) if m.kind == "energy" else None)


def measured_size(info: Any) -> int | None:
    """The problem size a figure was measured at (its info's ``size``, as GEMM records its square's edge),
    where it is one (:func:`~pytest_mig.store.history.is_size`); else None."""
    size = info.get("size") if isinstance(info, dict) else None
    return size if is_size(size) else None


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
    return BaselineMeta(t.model_name, t.history_slug, t.history_profile, t.is_emulated, dict(record.fingerprint or {}),
                        path)


def saveable(record: ResultRecord) -> str | None:
    """Why a record must not enter a history (None: it may)."""
    m = record.metric
    if not m.compare:
        return "informational"
    if shared_host(m.info):
        return "measured while the host's other GPUs copied (not this GPU's own figure)"
    if not math.isfinite(m.value):
        return f"value {m.value}"
    if m.value <= 0:
        return f"value {m.value} is not positive"
    if record.mode not in MODES:
        return f"mode {record.mode!r}"
    return None


#: What a save refused for shortening a history says to do, where the caller is pytest or calibrate.
SHRINK_CONSENT = "confirm with --mig-baseline-shrink (to pytest or to pytest-mig calibrate), or leave the keep as it is"


class BaselineStore:
    """The folder of baselines: ``<root>/<gpu-model-slug>/<profile>.json``."""

    def __init__(self, root: Path | str, keep: int | None = None, *, shrink: bool = False,
                 consent: str = SHRINK_CONSENT) -> None:
        self.root = Path(root)
        self.keep = keep  # None: the file's own setting, else DEFAULT_KEEP
        self.shrink = shrink  # a keep below a file's own may drop its older runs (--mig-baseline-shrink)
        self.consent = consent  # what a refusal to shorten a history says to do: the caller's own options

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
                f"run(s) of its {len(existing.entries)} figure(s); nothing is saved: {self.consent}")
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
        entries = {**existing.entries, **existing.retired} if existing else {}  # the retired written back too
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
            if once and any(r.recorded_at == run.recorded_at and r.value == round_figure(run.value) for r in runs):
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
    target = TargetInfo(kind, profile, meta.profile, gpu_name=meta.gpu_model, gpu_slug=meta.gpu_slug,
                        emulated=meta.emulated, extra={"source": f"baseline {meta.path}"})
    for e in base.entries.values():
        # What the scaling check needs of the runs' clocks: their SM clock, where saved, and their throttle reasons
        # (a stored 7g at the power cap against this run's 4g is `power-limited`, not failed).
        ran_at = [r.clock_mhz for r in e.runs if r.clock_mhz]
        clocks = Clocks(tuple(e.throttled), statistics.median(ran_at) if ran_at else None)
        metric = Metric(e.metric, e.value, e.unit, e.direction, e.values, e.kind,  # type: ignore[arg-type]
                        info={"clocks": clocks.info()})
        yield ResultRecord(e.test, metric, target, e.fingerprint or dict(meta.fingerprint),
                           e.recorded_at, node="baseline", mode=e.mode)


__all__ = [
    "BaselineStore", "entry_from_records", "history_exists", "measured_size", "measured_value", "meta_from_record", "run_from_record",
    "saveable",
]
