"""Reference figures shipped with the package: verdicts on a first night, before a site has a history.

A site that installs pytest-mig has no baseline yet.  Rather than "no baseline" for every figure,
a figure with no local history is judged against the **reference** for its GPU model and profile:
runs of the same suite on a board of that model measured by the pytest-mig developers, kept with
their fingerprints (driver, CUDA, torch, clocks, power limit).  That is the health check DCGM's
diagnostics give against their SKU values, per profile and per figure.  The band is wide
(:func:`pytest_mig.judge.noise.reference_band`): another board of the model differs by a few percent, a
GPU 15% under the reference fails.  A local baseline, once saved, takes over figure by figure.

Layout: ``pytest_mig/references/<gpu-model-slug>/<profile>[-emulated].json``, each a baseline file
(schema 2, read by :func:`pytest_mig.store.reader.load_baseline_file`, so a broken one is an error
naming the file) with one more top-level block::

    "reference": {"sigma": {"quick": {"<test>": {"<metric>": 0.0052}}}, "runs": {"full": 5, ...}}

``sigma`` is each figure's run-to-run sigma pooled over every reference run of the GPU model (each
profile's runs relative to their own median): a figure too noisy on one profile is not judged on
any.  ``board_sigma`` is the same pooled over each board's runs of each profile, each relative to
their own median: the night-to-night noise one board shows, without the spread between boards,
kept where it is pooled from at least ``MIN_PRIOR_DOF`` degrees of freedom; a site's history of one
board is judged with it (:mod:`pytest_mig.judge.prior`).  Where a figure's runs name the problem
size they were measured at (GEMM's square), only those at the size it is judged at count
(:attr:`~pytest_mig.store.history.BaselineEntry.size`).  ``pytest-mig reference FILES... --out DIR``
builds such a folder from results files (the shipped one, or a site's own fleet reference, used with
``--mig-reference DIR``).  The boards' identities (UUIDs) are not kept: each run names its board by
an anonymous ``board`` in its fingerprint (:func:`board_name`), which tells one board's runs from
another's and nothing more.  A figure a run re-measured enters as the median of its measurements
(:func:`_as_reference`).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

from pytest_mig.common.files import folder_lock
from pytest_mig.device.fingerprint import FINGERPRINT_FIELDS, fingerprint_value
from pytest_mig.store.baselines import BaselineStore, history_exists, measured_size, measured_value, meta_from_record
from pytest_mig.store.history import Baseline, BaselineEntry, BaselineError, EntryKey
from pytest_mig.store.reader import check_baseline_text, load_baseline_file
from pytest_mig.common.files import MAX_NUMBER, FileProblem, path_problem, validate
from pytest_mig.measure.clocks import TEMPERATURE, after_temperature, temperature_of
from pytest_mig.measure.metric import timing_partners
from pytest_mig.judge.noise import MIN_PRIOR_DOF, REFERENCE_FLOOR, REFERENCE_MAX, Band, reference_band
from pytest_mig.store.results import ResultRecord, ResultsFileError, atomic_write_text, read_results, utc_now
from pytest_mig.store.schemas import REFERENCE
from pytest_mig.common.text import printable, shown

#: The references shipped with the package.
SHIPPED = Path(__file__).resolve().parent.parent / "references"
#: ``--mig-reference none``: judge only against the site's own baselines.
NONE = "none"
#: Runs a reference keeps per figure (all of a calibration campaign).
REFERENCE_KEEP = 50
#: Fingerprint keys that name one board, not the model: left out of a reference.
BOARD_KEYS = ("gpu_uuid",)
#: Fingerprint fields a verdict shows for the reference beside this GPU's; labels and units are
#: FINGERPRINT_FIELDS', but the driver's CUDA version is plain "CUDA" (the runtime is not shown).
SHOWN = ("driver", "cuda_driver", "torch", "vbios", "power_limit_w", "max_sm_clock_mhz", "max_mem_clock_mhz")
_LABELS = {key: (label, unit) for key, label, unit in FINGERPRINT_FIELDS} | {"cuda_driver": ("CUDA", "")}


def _shown(key: str, value: Any) -> str:
    """A shown field's value with its unit, as verdicts format fingerprints."""
    return fingerprint_value(key, value, _LABELS[key][1])


@dataclass
class Reference:
    """One GPU model and profile's reference: its runs (a Baseline) and each figure's pooled sigma."""

    baseline: Baseline
    sigma: dict[EntryKey, float] = field(default_factory=dict)
    board_sigma: dict[EntryKey, float] = field(default_factory=dict)

    def get(self, test: str, metric: str, mode: str) -> BaselineEntry | None:
        return self.baseline.get(test, metric, mode)

    def sigma_for(self, entry: BaselineEntry) -> float | None:
        return self.sigma.get((entry.test, entry.metric, entry.mode))

    def board_sigma_for(self, entry: BaselineEntry) -> float | None:
        """The figure's night-to-night sigma on one board, or that of a rate figure that times the same
        work where larger; None where it or a partner has none (then only :meth:`band_for`'s
        sigma, across boards, speaks for its noise)."""
        sigmas = [self.board_sigma.get((e.test, e.metric, e.mode))
                  for e in (entry, *self.baseline.timing_partners(entry))]
        return None if any(s is None for s in sigmas) else max(s for s in sigmas if s is not None)

    def spread_for(self, entry: BaselineEntry) -> float | None:
        """For an emulated profile whose runs never repeat a board (the shipped references run each
        once per board): the figure's spread across its boards, or a timing partner's where larger
        (:func:`profile_spread`); a prior from this reference is never below it.  The model's boards
        agreeing on its other profiles does not show an emulated profile's do: in a 16-SM green context
        one H200's fp64 dot moved 6% between two nights, where a whole GPU's moves 0.1%.  None for
        any other profile, and where a board repeats."""
        if not self.baseline.meta.emulated:
            return None
        spreads = [profile_spread(e.values_by_board) for e in (entry, *self.baseline.timing_partners(entry))]
        known = [s for s in spreads if s is not None]
        return max(known) if known else None

    def band_for(self, entry: BaselineEntry) -> Band:
        """The reference band a verdict applies to ``entry`` (:func:`~pytest_mig.judge.noise.reference_band`):
        its pooled sigma, or that of a rate figure that times the same work where larger, about the median
        of its runs at the size it is judged at."""
        partners = {p.metric: self.sigma_for(p) for p in self.baseline.timing_partners(entry)}
        return reference_band(entry.values_at_size, self.sigma_for(entry), partners)

    def runs(self) -> dict[str, int]:
        """Runs per mode (the most any figure has), quick first: ``{"quick": 5, "normal": 2}``."""
        return {m: hi for m, (_lo, hi) in self.run_counts().items()}

    def run_counts(self) -> dict[str, tuple[int, int]]:
        """Per mode, the fewest and the most runs any figure has: ``{"normal": (2, 3)}`` where a
        later part-run added some figures only.  Quick first."""
        out: dict[str, tuple[int, int]] = {}
        for e in self.baseline.entries.values():
            lo, hi = out.get(e.mode, (len(e.runs), len(e.runs)))
            out[e.mode] = (min(lo, len(e.runs)), max(hi, len(e.runs)))
        return _quick_first(out)

    def judged_modes(self) -> set[str]:
        """The modes with a pooled sigma for some figure: those this reference can judge."""
        return {mode for _test, _metric, mode in self.sigma}

    def judged_counts(self) -> dict[str, tuple[int, int]]:
        """Per mode, how many of its figures a first night judges, and how many it holds:
        ``{"quick": (66, 75)}``.  A figure is judged where its band gates, the rule a verdict
        applies (:meth:`band_for`: a pooled sigma, and 5 sigma within the widest reference band).
        Quick first."""
        out: dict[str, tuple[int, int]] = {}
        for e in self.baseline.entries.values():
            finite = [v for v in e.values if math.isfinite(v)]
            gates = bool(finite) and self.band_for(e).gates
            judged, total = out.get(e.mode, (0, 0))
            out[e.mode] = (judged + gates, total + 1)
        return _quick_first(out)

    def describe(self, mode: str | None = None) -> str:
        """'5 runs of NVIDIA H100 80GB HBM3 full (quick), driver 580.159.04, CUDA 13.0, torch 2.11.0'."""
        meta = self.baseline.meta
        per_mode = {m: n for m, n in self.run_counts().items() if mode is None or m == mode}
        runs = count_range(min((lo for lo, _ in per_mode.values()), default=0),
                           max((hi for _, hi in per_mode.values()), default=0))
        modes = sorted(per_mode)
        fp = meta.fingerprint
        soft = ", ".join(f"{_LABELS[k][0]} {_shown(k, fp[k])}" for k in SHOWN[:3] if fp.get(k) is not None)
        return (f"{runs} run(s) of {meta.gpu_model} {meta.profile} ({', '.join(modes) or 'no figures'})"
                + (f", {soft}" if soft else ""))


def _quick_first(per_mode: dict[str, Any]) -> dict[str, Any]:
    """The same per-mode mapping, quick mode first, then the others by name."""
    return {m: per_mode[m] for m in sorted(per_mode, key=lambda m: (m != "quick", m))}


def count_range(lo: int, hi: int) -> str:
    """'2' or '2-3'."""
    return str(hi) if lo == hi else f"{lo}-{hi}"


def fingerprint_beside(reference: dict[str, Any], mine: dict[str, Any]) -> str:
    """The reference's fingerprint with this GPU's beside it where they differ, e.g. ``driver
    580.159.04 (this GPU 590.10.02), CUDA 13.0, torch 2.11.0, power limit 700 W (this GPU 500 W)``."""
    parts = []
    for key in SHOWN:
        if reference.get(key) is None:
            continue
        theirs = _shown(key, reference[key])
        text = f"{_LABELS[key][0]} {theirs}"
        if mine.get(key) is not None and _shown(key, mine[key]) != theirs:
            text += f" (this GPU {_shown(key, mine[key])})"
        parts.append(text)
    return ", ".join(parts)


class ReferenceStore:
    """A folder of references (``<root>/<gpu-model-slug>/<profile>.json``), read-only."""

    def __init__(self, root: Path | str = SHIPPED) -> None:
        self.root = Path(root)
        self._baselines = BaselineStore(self.root)
        self._loaded: dict[tuple[str, str], Reference | None] = {}

    def __repr__(self) -> str:
        return f"ReferenceStore({str(self.root)!r})"

    def load(self, gpu_slug: str, baseline_profile: str) -> Reference | None:
        """The reference of this GPU model and profile (None: none).  A broken file is a BaselineError."""
        key = (gpu_slug, baseline_profile)
        if key not in self._loaded:
            path = self._baselines.path_for(gpu_slug, baseline_profile)
            self._loaded[key] = _read(path) if history_exists(path) else None
        return self._loaded[key]

    def for_record(self, record: ResultRecord) -> Reference | None:
        meta = meta_from_record(record)
        return self.load(meta.gpu_slug, meta.profile)

    def holding(self, record: ResultRecord) -> Reference | None:
        """The reference of this record's GPU model and profile where it holds the record's figure
        (its test, metric and mode); None otherwise."""
        ref = self.for_record(record)
        return ref if ref is not None and ref.get(record.test, record.metric.name, record.mode) is not None else None

    def references(self, *, skip_broken: bool = False) -> list[Reference]:
        """Every reference of the folder (each GPU model and profile), in the folder's order.  One that
        cannot be read is a BaselineError, or, with ``skip_broken``, passed over (where a figure's first
        night is judged, reading it again says what is wrong with it)."""
        out = []
        for path in self._baselines.files():
            try:
                ref = self.load(path.parent.name, path.stem)
            except BaselineError:
                if not skip_broken:
                    raise
                continue
            if ref is not None:
                out.append(ref)
        return out

    def models(self) -> dict[str, list[str]]:
        """GPU model name -> the profiles it has references for (``1g.10gb-emulated``, ``full``)."""
        out: dict[str, list[str]] = {}
        for path in self._baselines.files():
            ref = self.load(path.parent.name, path.stem)  # cached: a listing's later lookups read nothing again
            if ref is not None:
                out.setdefault(ref.baseline.meta.gpu_model, []).append(ref.baseline.meta.profile)
        return {k: sorted(v, key=_profile_order) for k, v in sorted(out.items())}


def store_for(text: str, base: Path) -> ReferenceStore | None:
    """The references a setting names: '' or 'shipped' the package's, 'none' None, else a folder
    (relative to ``base``).  ValueError ("DIR: no such folder") when that folder does not exist."""
    text = text.strip()
    if not text or text == "shipped":
        return ReferenceStore(SHIPPED)
    if text.lower() == NONE:
        return None
    why = path_problem(text)
    if why is not None:
        raise ValueError(f"{shown(text)}: {why}")
    path = Path(text) if Path(text).is_absolute() else base / text
    if not path.is_dir():
        raise ValueError(f"{printable(text)}: no such folder")
    return ReferenceStore(path)


def _profile_order(profile: str) -> tuple[int, str]:
    head = profile.split(".", 1)[0].rstrip("gc")
    return (int(head) if head.isdigit() else 99, profile)


def _read(path: Path) -> Reference:
    return _reference_of(load_baseline_file(path), path)


def _check_text(path: Path) -> Any:
    """A check for :func:`~pytest_mig.common.files.atomic_write_text`: the text about to become ``path`` must
    read back as a reference (never a file the next night's reader refuses)."""
    as_baseline = check_baseline_text(path)
    return lambda text: _reference_of(as_baseline(text), path)


def _reference_of(base: Baseline, path: Path) -> Reference:
    block = base.extra.get("reference") or {}
    sigma, board_sigma = _sigma_block(block, "sigma", path), _sigma_block(block, "board_sigma", path)
    try:  # what the loops, which name the figure, did not look at
        validate(block, REFERENCE, f"{path}: its 'reference' block")
    except FileProblem as exc:
        raise BaselineError(str(exc)) from None
    return Reference(base, sigma, board_sigma)


def _sigma_block(block: Any, name: str, path: Path) -> dict[EntryKey, float]:
    """The figures' sigmas in the reference block's ``name`` (modes to tests to metrics to a number)."""
    sigma: dict[EntryKey, float] = {}
    raw = block.get(name) if isinstance(block, dict) else None
    if raw is not None and not isinstance(raw, dict):
        raise BaselineError(f"{path}: 'reference.{name}' must map modes to tests to metrics to a number")
    for mode, tests in (raw or {}).items():
        for test, metrics in (tests or {}).items() if isinstance(tests, dict) else ():
            for metric, value in (metrics or {}).items() if isinstance(metrics, dict) else ():
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                        or value < 0:
                    raise BaselineError(f"{path}: reference {name.replace('_', ' ')} of {test} {metric} ({mode}) is "
                                        f"{json.dumps(value)}, not a number of 0 or more")
                sigma[(test, metric, mode)] = float(value)
    return sigma


def judged_against(targets: Iterable[Any], store: BaselineStore, references: ReferenceStore | None,
                   mode: str, *, ceilings: Any = None, fingerprint: dict[str, Any] | None = None) -> list[str]:
    """The header's line per Target (a ``pytest_mig.device.target.Target``): what its figures are judged
    against, the local baseline file or else the reference, and when neither: the device's ceiling
    (``ceilings``, a :class:`pytest_mig.judge.ceiling.Ceilings`, with the run's NVML ``fingerprint``)
    where it has one."""
    lines = []
    for t in targets:
        unjudged = "figures are reported, not judged"
        ceiling = ceilings.header(t.to_dict(), fingerprint) if ceilings is not None else None
        if ceiling:
            unjudged = ceiling
        name = t.baseline_profile
        path = store.path_for(t.gpu_slug, name)
        if path.exists():
            lines.append(f"verdicts for {name}: against the local baseline {path}")
            continue
        try:
            ref = references.load(t.gpu_slug, name) if references is not None else None
        except BaselineError as exc:
            lines.append(f"verdicts for {name}: reference unusable: {exc}")
            continue
        if ref is None:
            lines.append(f"verdicts for {name}: no local baseline ({path}) and no reference for {t.gpu_name} {name}: "
                         f"{unjudged}; record a baseline with --mig-save-baseline")
        elif not any(e.mode == mode for e in ref.baseline.entries.values()):
            other = "quick runs (--mig-quick)" if mode == "normal" else "normal runs"
            lines.append(f"verdicts for {name}: no local baseline ({path}), and the reference for {t.gpu_name} {name} "
                         f"holds {other} only: this run's {unjudged}; record a baseline with --mig-save-baseline")
        elif (judged := ref.judged_counts()[mode])[0] == 0:
            why = (f"no figure of this mode has a second reference run of {t.gpu_name} to show its run-to-run noise"
                   if mode not in ref.judged_modes() else
                   f"every figure of this mode varies across the reference's runs more than a band of "
                   f"{REFERENCE_MAX:.0%} allows")
            lines.append(f"verdicts for {name}: no local baseline yet ({path}): shown beside the reference, "
                         f"{ref.describe(mode)}, but not judged: {why}; record a baseline with --mig-save-baseline")
        else:
            which = (f"all {judged[1]} of its {mode} figures" if judged[0] == judged[1] else
                     f"{judged[0]} of its {judged[1]} {mode} figures, the others reported only (too noisy across the "
                     f"reference's runs, or with one run)")
            lines.append(f"verdicts for {name}: no local baseline yet ({path}): judged against the reference, "
                         f"{ref.describe(mode)}, in a band of at least {REFERENCE_FLOOR:.0%} (another board): {which}; "
                         f"a saved baseline (--mig-save-baseline, pytest-mig calibrate) takes over")
    return lines


# -- building a reference folder from results files ------------------------------------------------


def pooled_sigma(groups: Iterable[Sequence[float]]) -> float | None:
    """Run-to-run sigma pooled over groups (profiles), each relative to its own median: the square
    root of the summed squared relative deviations over (runs - groups).  None with no repeat, and
    None where the deviations are too large for a float (runs 1e160 times their median): no band."""
    total, dof = 0.0, 0
    for values in groups:
        xs = [float(v) for v in values if math.isfinite(v)]
        if len(xs) < 2:
            continue
        med = statistics.median(xs)
        if not med:
            continue
        total += math.fsum((x / med - 1.0) * (x / med - 1.0) for x in xs)  # inf, never OverflowError
        dof += len(xs) - 1
    sigma = math.sqrt(total / dof) if dof else None
    return sigma if sigma is not None and sigma <= MAX_NUMBER else None


def profile_spread(by_board: Mapping[str, Sequence[float]]) -> float | None:
    """The spread across boards of one profile's runs of a figure (``{board: values}``), where no
    board ran it twice: then nothing tells its night-to-night noise from the boards' differences.
    None where a board repeats (its own runs show the noise) or fewer than two boards ran it."""
    if any(len(values) > 1 for values in by_board.values()):
        return None
    return pooled_sigma([[v for values in by_board.values() for v in values]])


def pooled_dof(groups: Iterable[Sequence[float]]) -> int:
    """The degrees of freedom runs in ``groups`` give a pooled sigma: each group's runs less one."""
    return sum(len(g) - 1 for g in groups if g)


def sized(records: Sequence[ResultRecord]) -> list[ResultRecord]:
    """The records, each compared figure of a test's run given the size the run measured at where one
    of its figures names a single one (results files keep it with the headline only: GEMM's
    sustained, energy and cost figures were measured at the headline's size)."""
    sizes: dict[tuple[str, str, str], set[int]] = {}
    for r in records:
        size = measured_size(r.metric.info)
        if size:
            sizes.setdefault((r.test, r.mode, r.timestamp), set()).add(size)
    out = []
    for r in records:
        named = sizes.get((r.test, r.mode, r.timestamp), set())
        if r.metric.compare and len(named) == 1 and not measured_size(r.metric.info):
            r = replace(r, metric=replace(r.metric, info={**r.metric.info, "size": next(iter(named))}))
        out.append(r)
    return out


def window_temperatures(records: Sequence[ResultRecord]) -> list[ResultRecord]:
    """The records, each energy figure whose info keeps no temperature (results files written before
    energy figures kept one) given the temperature its window's timing read as it ended: the clocks'
    ``after`` temperature of the one rate figure of its test's run that times the same work
    (:func:`~pytest_mig.measure.metric.timing_partners`), which is that same read."""
    runs: dict[tuple[object, ...], list[ResultRecord]] = {}
    for r in records:
        runs.setdefault(_test_run(r), []).append(r)
    out = []
    for r in records:
        m = r.metric
        if m.kind == "energy" and temperature_of(m.info) is None:
            same = runs[_test_run(r)]
            names = set(timing_partners(m.name, m.kind, [(x.metric.name, x.metric.kind) for x in same]))
            read = [t for x in same if x.metric.name in names if (t := after_temperature(x.metric.info)) is not None]
            if len(names) == 1 and len(read) == 1:
                r = replace(r, metric=replace(m, info={**m.info, TEMPERATURE: read[0]}))
        out.append(r)
    return out


def _test_run(r: ResultRecord) -> tuple[object, ...]:
    """What tells one test's run from another's in a results file: the test, mode and start, and the
    node, GPU and profile it ran on (a layout's slices, or a host's GPUs, start together)."""
    return (r.test, r.mode, r.timestamp, r.node, r.target.uuid, r.target.profile, r.target.gpu_index)


def board_name(uuid: str) -> str:
    """The anonymous name a reference gives a board: ``b-`` and 10 hex digits of its UUID's SHA-256."""
    return "b-" + hashlib.sha256(uuid.encode()).hexdigest()[:10]


def _as_reference(record: ResultRecord) -> ResultRecord:
    """A run's record as a reference keeps it: its board by an anonymous name, no verdict, and the run's own
    re-measurements counted (:func:`~pytest_mig.store.baselines.measured_value`, as a local history
    counts them): with two or three runs per profile one transient dip would set the figure's
    pooled sigma, widening its band past what is judged.
    """
    fp = {k: v for k, v in (record.fingerprint or {}).items() if k not in BOARD_KEYS}
    uuid = (record.fingerprint or {}).get("gpu_uuid") or record.target.gpu_uuid
    if isinstance(uuid, str) and uuid:
        fp["board"] = board_name(uuid)
    metric = replace(record.metric, value=measured_value(record))
    return replace(record, metric=metric, fingerprint=fp, verdict=None, health=None)


class UnknownTestError(ValueError):
    """A test (or figure) to drop that neither the reference folder nor the files given hold: the
    :data:`Drop` is its argument."""


#: What a reference build may drop: a test's id (all its figures), or (a test's id, one figure's name).
Drop = Union[str, tuple[str, str]]


def drop_label(drop: Drop) -> str:
    """A dropped test's id, or a dropped figure's test id and name."""
    return drop if isinstance(drop, str) else " ".join(drop)


def _matching(drops: Sequence[Drop], test: str, metric: str) -> Drop | None:
    """The drop a test's figure falls under: the figure's own where one names it, else its test's."""
    return (test, metric) if (test, metric) in drops else test if test in drops else None


@dataclass
class Built:
    """What :func:`build` did: the files written, figures whose run the folder held already, and
    the runs of dropped tests or figures taken out of the folder or left out of the files, per drop."""

    files: list[Path]
    repeated: int = 0
    dropped: dict[Drop, int] = field(default_factory=dict)


def build(paths: Sequence[Path], out: Path, *, drop: Sequence[Drop] = ()) -> Built:
    """Add the figures of these results files (oldest first) to the reference folder ``out`` and
    recompute every figure's pooled sigma.  A run the folder holds already (the same file given
    again) is not added twice.  The tests named in ``drop`` (their ids as results files write
    them), or single figures of them (test id, figure name), are taken out of the folder and left out
    of the files: a test or figure whose definition changed, so that runs of the old and the new one
    never share a band.  ResultsFileError or BaselineError on a file that cannot be read."""
    dropped: dict[Drop, int] = dict.fromkeys(drop, 0)
    records: list[ResultRecord] = []
    for path in paths:  # every file read and checked whole before anything is written
        for r in window_temperatures(sized(read_results(path))):
            if (gone := _matching(drop, r.test, r.metric.name)) is not None:
                dropped[gone] += int(r.metric.compare)  # the runs a reference would keep: not informational figures
                continue
            if r.metric.compare and abs(r.metric.value) > MAX_NUMBER:  # no GPU measures 1e300: a spoilt file
                raise ResultsFileError(f"{printable(path)}: {printable(r.test)} {printable(r.metric.name)} is "
                                       f"{r.metric.value:g}, which no measurement gives; nothing was written (leave "
                                       f"this file out or fix it)")
            records.append(_as_reference(r))
    store = BaselineStore(out, keep=REFERENCE_KEEP, consent=(
        f"a reference keeps {REFERENCE_KEEP} runs per figure and pytest-mig reference never shortens a history: "
        f"give --out a new folder, or move this file out of {printable(out)}"))
    if dropped:  # before anything is written: a mistyped id changes nothing
        held = {key[:2] for path in store.files() for base in [load_baseline_file(path)]
                for key in [*base.entries, *base.retired]}
        unknown = [d for d, n in dropped.items() if not n and not any(_matching([d], *k) for k in held)]
        if unknown:
            raise UnknownTestError(unknown[0])
    saved = store.save(sorted(records, key=lambda r: r.timestamp), once=True) if records else []
    if not out.is_dir():  # every figure of the files given dropped, into a folder that is not there yet
        return Built([], 0, dropped)
    # Read back and rewritten under the folder's lock: another build's runs saved meanwhile are kept.
    with folder_lock(out):
        if dropped:
            _drop(store, dropped)
        return Built(_write_sigma(store), sum(s.repeated for s in saved), dropped)


def _drop(store: BaselineStore, dropped: dict[Drop, int]) -> None:
    """Take the figures of the tests (or the single figures) in ``dropped`` out of every file of the
    folder (a file left with none is removed), counting each figure's runs into ``dropped``."""
    drops = list(dropped)
    for path in store.files():
        base = load_baseline_file(path)
        gone = [(held, key, d) for held in (base.entries, base.retired) for key in held
                if (d := _matching(drops, key[0], key[1])) is not None]
        if not gone:
            continue
        for held, key, d in gone:
            dropped[d] += len(held.pop(key).runs)
        if not base.entries and not base.retired:
            path.unlink()
            continue
        base.updated_at = utc_now()
        atomic_write_text(path, base.to_json(), check=_check_text(path))


def _write_sigma(store: BaselineStore) -> list[Path]:
    """Every file of the folder with the ``reference`` block of its figures' pooled sigma."""
    written: list[Path] = []
    by_model: dict[str, list[Path]] = {}
    for path in store.files():
        by_model.setdefault(path.parent.name, []).append(path)
    for files in by_model.values():
        bases = [load_baseline_file(p) for p in files]
        groups: dict[EntryKey, list[list[float]]] = {}
        by_board: dict[EntryKey, list[list[float]]] = {}
        for base in bases:
            for key, entry in base.entries.items():
                groups.setdefault(key, []).append(entry.values_at_size)  # another size is another workload
                by_board.setdefault(key, []).extend(entry.values_by_board.values())
        sigma = _nested(groups)
        board_sigma = _nested({k: g for k, g in by_board.items() if pooled_dof(g) >= MIN_PRIOR_DOF})
        for path, base in zip(files, bases):
            block: dict[str, Any] = {"runs": Reference(base).runs(), "sigma": _held(sigma, base)}
            on_one_board = _held(board_sigma, base)
            if on_one_board:
                block["board_sigma"] = on_one_board
            base.extra = {"reference": block}
            atomic_write_text(path, base.to_json(), check=_check_text(path))
            written.append(path)
    return written


def _nested(groups: dict[EntryKey, list[list[float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each figure's pooled sigma of its groups (:func:`pooled_sigma`), as modes to tests to metrics."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (test, metric, mode), values in sorted(groups.items()):
        s = pooled_sigma(values)
        if s is not None:
            out.setdefault(mode, {}).setdefault(test, {})[metric] = float(f"{s:.4g}")
    return out


def _held(sigma: dict[str, dict[str, dict[str, float]]], base: Baseline) -> dict[str, dict[str, dict[str, float]]]:
    """The sigmas of the figures ``base`` holds: no empty tests or modes."""
    own: dict[str, dict[str, dict[str, float]]] = {}
    for mode, tests in sigma.items():
        for t, ms in tests.items():
            mine = {m: v for m, v in ms.items() if (t, m, mode) in base.entries}
            if mine:
                own.setdefault(mode, {})[t] = mine
    return own


__all__ = ["NONE", "REFERENCE_KEEP", "Built", "Drop", "Reference", "ReferenceStore", "SHIPPED", "UnknownTestError", "board_name",
           "build", "count_range", "drop_label", "fingerprint_beside", "judged_against", "pooled_dof", "pooled_sigma", "profile_spread", "sized",
           "store_for", "window_temperatures"]
