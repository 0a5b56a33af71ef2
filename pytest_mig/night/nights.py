"""The night's time: every second of a nightly run should buy detection.

A site runs the suite on every GPU or slice each night, often inside a maintenance window.  Three
things here keep that time honest:

- **Tests that gate nothing are not run by default** (:func:`gates_nothing`).  A test all of whose
  compared figures are reported as too noisy to gate, both in the site's own history and in the
  shipped reference for this GPU model, profile and mode, measures figures no verdict uses: the
  fixed small-batch training cases, whose step time moves with the host from run to run, are the
  example.  They are deselected with the reason; ``--mig-all-tests`` runs them (a site that
  wants them reported, or that builds the history that may let them gate).  A test the reference
  does not know (a GPU model without one) always runs.
- **Compilation and batch searches are paid once per stack** (:func:`compile_caches`): Inductor's FX graph and
  AOTAutograd caches, Triton's kernel cache and OpenMM's compiled kernels live in ``.mig-compile-cache/`` beside the baseline
  folder (a nightly's state folder keeps both), one per
  software stack (GPU model, driver, CUDA, torch, triton), so the second night on the same stack
  loads what the first compiled, and a new driver, CUDA or torch starts a fresh folder.  The largest
  batches the training cases found are kept there too (:mod:`pytest_mig.workloads.batch_search`),
  and, beside the stacks' folders since they depend on none of that, the OpenMM systems built
  (:mod:`pytest_mig.workloads.md_systems`).
- **Progress and time left** (:class:`Progress`): after each test that took a while, a line with
  the tests done, the time spent and the time left, estimated from each test's seconds the last
  time it ran on the same GPU model, profile and mode (:func:`last_runs`, from the results files'
  ``durations``) or else from this run's average.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import stat
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from pytest_mig.workloads.caches import Caches
from pytest_mig.store.results import NOT_RESULTS, ResultsFileError, read_results_file
from pytest_mig.store.history import BaselineError
from pytest_mig.judge.noise import band
from pytest_mig.judge.pipeline import Tolerance, tolerance_for
from pytest_mig.common.files import FileProblem

#: Fingerprint keys that make compiled code stale when they change.
STACK_KEYS = ("gpu_name", "driver", "cuda_driver", "cuda_runtime", "torch", "triton")
#: The cache folder, beside the baseline folder (never in it: that one is reviewed like code).
CACHE_FOLDER = ".mig-compile-cache"
#: Built OpenMM systems, in the cache folder beside the stacks' folders (workloads.md_systems).
BUILT_SYSTEMS = "openmm-systems"
#: A progress line is printed after a test that took at least this long, or this long after the last line.
PROGRESS_EVERY_S = 20.0


def stack_key(fingerprint: Mapping[str, Any]) -> str:
    """A short name for the software stack compiled code depends on (10 hex digits)."""
    text = json.dumps({k: fingerprint.get(k) for k in STACK_KEYS}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def compile_caches(baselines: Path, fingerprint: Mapping[str, Any], environ: Any = os.environ, *,
                   references: Path | None = None) -> Caches:
    """Point Inductor's, Triton's and OpenMM's kernel caches at ``.mig-compile-cache/<stack>`` beside the
    baseline folder (made if need be), unless the site set them itself in ``environ``; the run's
    :class:`~pytest_mig.workloads.caches.Caches`: that folder (``stack``, the largest batches found,
    :mod:`pytest_mig.workloads.batch_search`), the built OpenMM systems' folder beside it, and
    ``references``, the folder of references in use (the plugin gives the shipped one also where
    none judges), where compiled batches may be seeded from
    (:func:`pytest_mig.workloads.batch_search.seed`).  Where the folder cannot be made, the caches stay
    where the libraries put them and only ``references`` is given."""
    folder = Path(baselines).parent / CACHE_FOLDER / stack_key(fingerprint)
    check_cache(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return Caches(references=references)
    environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    environ.setdefault("TRITON_CACHE_DIR", str(folder / "triton"))
    # OpenMM's CUDA platform keeps the kernels it compiles in OPENMM_CACHE_DIR, else in its temporary
    # folder ($TMPDIR), which a batch job's scratch folder loses every night.  Kept per stack: a
    # kernel compiled by a newer NVRTC may not load under an older driver.
    if environ.setdefault("OPENMM_CACHE_DIR", str(folder / "openmm")) == str(folder / "openmm"):
        (folder / "openmm").mkdir(exist_ok=True)  # OpenMM writes its files there, it makes no folder
    # Built OpenMM systems depend on OpenMM and the system, not on the driver, CUDA or torch
    # (workloads.md_systems names each file by what it does depend on): kept across stacks, so that
    # the first night after a driver update does not build them again.
    return Caches(stack=folder, built_systems=folder.parent / BUILT_SYSTEMS, references=references)


def check_cache(folder: Path) -> None:
    """The cache's own entries (the cache folder, this stack's folder and its ``inductor``, ``triton`` and
    ``openmm`` folders, ``batches.json``, the built systems' folder) are what they must be where they
    exist: FileProblem naming one that is a file where a folder belongs, a folder, pipe or device where
    a file belongs, or a link that loops or leads nowhere.  A cache is made again, but what is in its
    place may be a site's own file: it is never removed, the run is refused with its name."""

    entries = [(folder.parent, True), (folder, True), (folder / "inductor", True), (folder / "triton", True),
               (folder / "openmm", True), (folder / "batches.json", False), (folder.parent / BUILT_SYSTEMS, True)]
    for path, is_folder in entries:
        if not os.path.lexists(path):
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            what = ("a link that leads back to itself (a link loop)" if exc.errno == errno.ELOOP else
                    f"a link to {os.readlink(path)}, which does not exist" if os.path.islink(path) else
                    f"cannot be read ({exc.strerror or exc})")
        else:
            if (stat.S_ISDIR(mode) if is_folder else stat.S_ISREG(mode)):
                continue
            what = ("a file" if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode) else
                    "a named pipe, socket or device")
        raise FileProblem(f"{path}: {what}, where pytest-mig keeps its compile cache "
                          f"({'a folder' if is_folder else 'a file'}); move it away or remove it (a cache is made "
                          f"again) and run again")


def gates_nothing(test: str, mode: str, local: Any, reference: Any, tolerance: Tolerance = None) -> bool:
    """Whether no compared figure of ``test`` in ``mode`` would gate: each figure's band from the site's
    own history (a ``Baseline``) where it has one, else from the reference (a ``Reference``).  False
    where neither knows the test: a test nobody has measured here is run.  ``tolerance`` is what the
    test is judged with (its marker's, else the run's): a tolerance set makes a figure of the site's
    history gate, as it does when judged, so the test is run."""

    def gates(own: Any, metric: str) -> bool:
        explicit = tolerance_for(tolerance, metric)
        return band(own.values, tolerance=explicit if explicit is not None else own.tolerance).gates

    known = False
    for key, entry in (reference.baseline.entries.items() if reference is not None else ()):
        if key[0] != test or key[2] != mode:
            continue
        known = True
        own = local.get(*key) if local is not None else None
        if own is not None:
            if gates(own, key[1]):
                return False
        else:
            b = reference.band_for(entry)
            if b.gates or b.sigma is None:  # judged, or its noise not known yet (one reference run): run it
                return False
    if local is not None:
        for key, own in local.entries.items():
            if key[0] == test and key[2] == mode and (reference is None or reference.get(*key) is None):
                known = True
                if gates(own, key[1]):
                    return False
    return known


def ungated(tests: Iterable[tuple[Any, str, Any]], mode: str, store: Any, references: Any,
            tolerance_of: Callable[[Any], Tolerance] | None = None) -> list[Any]:
    """The items of ``tests`` ((item, test key, Target) triples) that gate nothing in ``mode`` on their
    Target (:func:`gates_nothing`, with the tolerance ``tolerance_of(item)`` judges it with); a history
    or reference that cannot be read decides nothing (the test runs, and its verdict names the file)."""

    out = []
    histories: dict[tuple[str, str], Any] = {}  # each history read once, not once per test
    for item, key, target in tests:
        where = (target.gpu_slug, target.baseline_profile)
        try:
            if where not in histories:
                histories[where] = store.load(*where)
            local = histories[where]
            ref = references.load(*where) if references is not None else None
        except BaselineError:
            continue
        if gates_nothing(key, mode, local, ref, tolerance_of(item) if tolerance_of is not None else None):
            out.append(item)
    return out


@dataclass
class Progress:
    """Tests done, time spent and time left, for the line printed as a long run goes."""

    tests: list[str]  # the node ids this run will run, in order
    previous: dict[str, float] = field(default_factory=dict)  # node id -> seconds, from the last run
    started: float = field(default_factory=time.monotonic)
    done: dict[str, float] = field(default_factory=dict)
    last_line: float = field(default_factory=time.monotonic)

    def finished(self, nodeid: str, seconds: float, now: float | None = None) -> str | None:
        """Record a test's time; the line to print, when it is time for one."""
        now = time.monotonic() if now is None else now
        self.done[nodeid] = self.done.get(nodeid, 0.0) + seconds
        if seconds < PROGRESS_EVERY_S and now - self.last_line < PROGRESS_EVERY_S:
            return None
        self.last_line = now
        return self.line(now)

    def left_s(self) -> float | None:
        """Seconds the tests not yet run should take: each one's time in the last run, else this run's
        average; None before anything is known."""
        left = [t for t in self.tests if t not in self.done]
        if not left:
            return 0.0
        average = sum(self.done.values()) / len(self.done) if self.done else None
        if average is None and any(t not in self.previous for t in left):
            return None
        return sum(self.previous.get(t, average or 0.0) for t in left)

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        left = self.left_s()
        source = "the last runs' times" if any(t in self.previous for t in self.tests) else "this run's average"
        tail = "" if left is None else f"; about {duration_text(left)} left (from {source})"
        return (f"pytest-mig: {len(self.done)} of {len(self.tests)} tests done in {duration_text(now - self.started)}"
                f"{tail}")


def duration_text(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


#: Results files read for the last runs of each test: two weeks of nights.
RECENT_FILES = 14
#: A test's seconds are the median of its last this many times: with warm nights behind it, one
#: first night on a new stack (compiling again: 216 s for the two compiled cases, about 34 s warm,
#: on an H100) does not make the next night's estimate and window pessimistic.
RECENT_TIMES = 3


def last_runs(folder: Path | None, current: Path | None = None,
              where: tuple[str | None, str | None, str] | None = None,
              passed_over: list[str] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Per node id, from the newest :data:`RECENT_FILES` results files in ``folder``: the seconds it
    took (its meta's ``durations``; the median of the last :data:`RECENT_TIMES` times it ran), and
    when it last ran (the file's time).

    ``where`` (GPU model slug, profile, mode; None for any) keeps only the files with a record of
    that Target and mode: a folder shared by a whole GPU's nights and a slice's, or by quick and
    normal ones, gives each its own times.  A test a window left out of a night did not run in it
    (:mod:`pytest_mig.night.window`).  Files that cannot be read are passed over: they decide nothing; the
    sentence of each results file among them (not of other JSON files) is added to ``passed_over``."""

    times: dict[str, list[float]] = {}
    when: dict[str, float] = {}
    if folder is None:
        return {}, when
    try:
        files = sorted(((p.stat().st_mtime, p) for p in Path(folder).glob("*.json") if p != current), reverse=True)
    except OSError:
        return {}, when
    read = 0
    for mtime, path in files:
        if read == RECENT_FILES:
            break
        try:
            records, meta = read_results_file(path)
        except ResultsFileError as exc:
            if passed_over is not None and NOT_RESULTS not in str(exc):
                passed_over.append(str(exc))
            continue
        if where is not None and not any(_matches(r, where) for r in records):
            continue
        read += 1
        window = meta.get("window") if isinstance(meta.get("window"), dict) else {}
        left = set(window.get("left") or [])
        for nodeid, value in (meta.get("durations") or {}).items():
            if nodeid not in left and len(times.setdefault(nodeid, [])) < RECENT_TIMES and math.isfinite(value):
                times[nodeid].append(float(value))
                when.setdefault(nodeid, mtime)
    return {nodeid: statistics.median(t) for nodeid, t in times.items() if t}, when


def _matches(record: Any, where: tuple[str | None, str | None, str]) -> bool:
    slug, profile, mode = where
    t = record.target
    return (record.mode == mode and (slug is None or t.gpu_slug == slug)
            and (profile is None or (t.baseline_profile or t.profile) == profile))


__all__ = ["CACHE_FOLDER", "PROGRESS_EVERY_S", "Progress", "RECENT_FILES", "check_cache", "compile_caches", "duration_text",
           "gates_nothing", "last_runs", "stack_key", "ungated"]
