"""The largest batch a training case runs at: searched, grown for a compiled step, and remembered.

- :func:`max_batch_search`: Columbia/IBM's method, real steps at growing sizes until one runs out
  of memory, then bisection to a resolution.
- :func:`grow_batch`: a compiled step holds more than the eager one; its memory at the eager batch
  projects the larger batch it holds, which is tried.
- Remembered batches (:func:`recall`, :func:`remember`, :func:`confirm_batch`,
  :func:`confirm_growth`): on the same GPU model, profile and software stack the answer is the same
  every night, so it is kept in ``batches.json`` in the stack's folder (``Caches.stack``, made by
  :func:`pytest_mig.night.nights.compile_caches`: a new driver, CUDA or torch starts a fresh one).
  The next night confirms it with the probes that give the search's own guarantee (it fits, and
  the next size the search would have tried does not) instead of the whole search; where it fails
  either, the search runs as before.  A compiled batch is remembered only where the projection
  itself fitted, so a night whose growth fell back (another process holding memory, say) teaches
  nothing.  Nothing in the file is a measurement: a missing, unreadable or unwritable file only
  means the search runs.
- Seeded compiled batches (:func:`seed`): a compiled case with nothing remembered on its stack
  (a first night, or the first after a driver or CUDA update) takes a compiled batch found on the
  same GPU model, profile and search with the same torch and transformers, from another stack's
  folder beside its own or from the references' ``batches.json`` (the shipped ones under
  ``--mig-reference none``: a seed says where the search starts, nothing about judging; a night
  that grew its own batch measured another batch than the nights seeded), and confirms it like a
  remembered one: one compilation instead of two (one at the eager batch to measure the compiled
  step's memory, one at the batch it projects).  What a compiled step holds per sequence depends on
  torch and transformers, not on the driver.  A seed that does not fit is dropped, and the batch is
  grown as on any first night.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from pytest_mig.workloads import DoesNotFit
from pytest_mig.workloads.caches import Caches
from pytest_mig.common.files import FileProblem, atomic_write_text, folder_lock, read_json

#: The exception torch raises when the device runs out of memory.
OOM_ERROR: type[BaseException] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def is_oom(exc: BaseException) -> bool:
    """Whether an exception is the device running out of memory (torch's or cuBLAS's way of saying it)."""
    if isinstance(exc, OOM_ERROR):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text)


@dataclass
class BatchSearch:
    """Outcome of :func:`max_batch_search`: the batch, every size tried and whether it fitted."""

    batch: int
    tried: list[tuple[int, bool]] = field(default_factory=list)
    capped: bool = False  # the search reached its upper limit without running out of memory
    remembered: bool = False  # last night's batch on this stack, tried once instead of searching

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "tried": [[b, ok] for b, ok in self.tried], "capped": self.capped,
                "remembered": self.remembered}


def max_batch_search(
    try_batch: Callable[[int], object],
    *,
    start: int = 1,
    limit: int,
    resolution: float = 0.125,
    after_oom: Callable[[], None] | None = None,
) -> BatchSearch:
    """The largest batch in [1, limit] for which ``try_batch`` does not run out of memory.

    Doubles from ``start`` until a size fails or ``limit`` is reached, then bisects between the last
    size that fitted and the first that did not, until the gap is at most ``resolution`` of the
    fitting size (1 at least).  A start that fails is halved until one fits.  Any exception other
    than running out of memory (:func:`is_oom`) propagates; ``after_oom`` runs after each failure,
    outside the ``except`` block so the failed step's tensors are already unreachable.  Raises
    DoesNotFit when not even one sequence fits.
    """
    if limit < 1:
        raise ValueError(f"the batch limit must be at least 1, not {limit}")
    tried: list[tuple[int, bool]] = []

    def fits(b: int) -> bool:
        return _fits(try_batch, b, tried, after_oom)

    b = max(1, min(start, limit))
    while not fits(b):
        if b == 1:
            raise DoesNotFit("not even one sequence per step fits this Target's memory")
        b //= 2
    lo, hi = b, None
    while hi is None and lo < limit:
        nxt = min(2 * lo, limit)
        if fits(nxt):
            lo = nxt
        else:
            hi = nxt
    if hi is None:
        return BatchSearch(lo, tried, capped=True)
    while hi - lo > max(1, int(lo * resolution)):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return BatchSearch(lo, tried, capped=False)


def _fits(try_batch: Callable[[int], object], b: int, tried: list[tuple[int, bool]],
          after_oom: Callable[[], None] | None) -> bool:
    """Try ``b``; False where it ran out of memory (``after_oom`` then runs, outside the ``except``
    block, so the failed step's tensors are already unreachable).  Other errors propagate."""
    failed = False
    try:
        try_batch(b)
    except Exception as exc:
        if not is_oom(exc):
            raise
        failed = True
    if failed and after_oom is not None:
        after_oom()
    tried.append((b, not failed))
    return not failed


#: Share of the projected room a compiled batch may plan to fill (the projection is linear in the
#: batch; the allocator's rounding and fragmentation are not).
COMPILED_MARGIN = 0.95


@dataclass
class BatchGrowth:
    """How the compiled step's batch grew from the eager search's (:func:`grow_batch`)."""

    start: int  # the eager search's batch, at which the compiled step's memory was measured
    projected: int  # the largest batch the measured memory projects to fit
    batch: int  # the batch measured: the largest tried that fitted, or ``start``
    per_sequence_bytes: float
    tried: list[tuple[int, bool]] = field(default_factory=list)
    remembered: bool = False  # last night's batch on this stack (or a seed), tried once instead of growing
    seeded_from: str = ""  # where a seed came from (:func:`seed`); empty where it is this stack's own

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "projected": self.projected, "batch": self.batch,
                "per_sequence_gb": None if self.remembered else round(self.per_sequence_bytes / 1e9, 4), "tried": [[b, ok] for b, ok in self.tried],
                "remembered": self.remembered, **({"seeded_from": self.seeded_from} if self.seeded_from else {})}


def grow_batch(
    try_batch: Callable[[int], object],
    *,
    start: int,
    resting_bytes: float,
    peak_bytes: float,
    room_bytes: float,
    limit: int,
    margin: float = COMPILED_MARGIN,
    after_oom: Callable[[], None] | None = None,
) -> BatchGrowth:
    """The largest batch a compiled step holds, projected from its memory at the eager search's batch.

    torch.compile's step keeps far less for backward than the eager one (Qwen2.5-1.5B on an H100:
    batch 32 compiled where eager holds 18), so the eager search's batch leaves a compiled case
    short of the largest batch it can run.  Searching again would compile every size tried (tens of
    seconds each); instead the compiled step's peak at ``start`` (``peak_bytes``, with the
    weights and optimizer state, ``resting_bytes``, that every batch needs) gives the bytes per
    sequence, and ``margin`` of the room they leave gives the projection.  It is tried (one more
    compilation), then halfway between ``start`` and it; ``start``, which ran already, is the
    answer if neither fits.  Errors other than running out of memory propagate.
    """
    per_seq = (peak_bytes - resting_bytes) / start if start > 0 else 0.0
    if per_seq <= 0 or room_bytes <= resting_bytes:
        return BatchGrowth(start, start, start, max(per_seq, 0.0))
    projected = max(start, min(limit, int(margin * (room_bytes - resting_bytes) / per_seq)))
    tried: list[tuple[int, bool]] = []
    for b in dict.fromkeys((projected, (start + projected) // 2)):
        if b > start and _fits(try_batch, b, tried, after_oom):
            return BatchGrowth(start, projected, b, per_seq, tried)
    return BatchGrowth(start, projected, start, per_seq, tried)


def confirm_batch(
    try_batch: Callable[[int], object],
    batch: int,
    *,
    limit: int,
    resolution: float,
    after_oom: Callable[[], None] | None = None,
) -> BatchSearch | None:
    """A remembered batch, confirmed as :func:`max_batch_search` would have ended on it: ``batch``
    fits and the size one resolution step above does not (at ``limit`` nothing above is tried).
    None where either fails, and the search must run."""
    if not 1 <= batch <= limit:
        return None
    tried: list[tuple[int, bool]] = []
    if not _fits(try_batch, batch, tried, after_oom):
        return None
    if batch == limit:
        return BatchSearch(batch, tried, capped=True, remembered=True)
    if _fits(try_batch, min(limit, batch + max(1, int(batch * resolution))), tried, after_oom):
        return None  # more fits than last night: the search finds how much
    return BatchSearch(batch, tried, remembered=True)


def confirm_growth(
    try_batch: Callable[[int], object],
    start: int,
    batch: int,
    *,
    after_oom: Callable[[], None] | None = None,
) -> BatchGrowth | None:
    """A remembered compiled batch (last night's projection, which fitted): it fits again, or None."""
    tried: list[tuple[int, bool]] = []
    if batch >= start and _fits(try_batch, batch, tried, after_oom):
        return BatchGrowth(start, batch, batch, 0.0, tried, remembered=True)
    return None


# --------------------------------------------------------------------------- remembered batches

FILE = "batches.json"


def _path(caches: Caches | None) -> Path | None:
    """``batches.json`` in the stack's folder of ``caches``; None where there is none (nothing is kept)."""
    return caches.stack / FILE if caches is not None and caches.stack is not None else None


def key(config: str, mode: str, compiled: bool, search: str, target: Any) -> str:
    """One case on one Target: model, mode, compiled or eager, the search's limits (quick and normal
    differ), GPU model, profile, SMs and memory."""
    return "|".join(str(x) for x in (config, mode, "compiled" if compiled else "eager", search, target.gpu_slug,
                                     target.baseline_profile, target.effective_sms, target.memory_budget()))


def recall(case: str, caches: Caches | None = None) -> dict[str, int]:
    """The batches remembered for ``case`` (``{"eager": 48, "compiled": 126}``) in the stack's folder of
    ``caches``; empty when none."""

    path = _path(caches)
    if path is None or not path.exists():
        return {}
    try:
        doc = read_json(path)
    except FileProblem:
        return {}
    return _batches(doc, case)


#: Largest batch a ``batches.json`` may name; a larger one is an edited file, passed over.
MAX_BATCH = 1 << 20


def _batches(doc: Any, case: str) -> dict[str, int]:
    """The eager and compiled batches ``doc`` (a ``batches.json``) holds for ``case``: integers from 1
    to :data:`MAX_BATCH` only."""
    entry = doc.get(case) if isinstance(doc, dict) else None
    if not isinstance(entry, dict):
        return {}
    return {k: v for k, v in entry.items() if k in ("eager", "compiled") and isinstance(v, int)
            and not isinstance(v, bool) and 0 < v <= MAX_BATCH}


def remember(case: str, versions: dict[str, str] | None = None, *, caches: Caches | None = None,
             **batches: int | None) -> None:
    """Keep the batches found for ``case`` in the stack's folder of ``caches`` (under the folder's lock:
    node mode's workers share the file), with the ``versions`` they were found under (what :func:`seed`
    matches in another stack's file).  Without a stack's folder nothing is kept."""

    path = _path(caches)
    found = {k: v for k, v in batches.items() if v}
    if path is None or not found:
        return
    with contextlib.suppress(OSError, TimeoutError, FileProblem):
        path.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(path.parent, timeout=10.0):
            try:
                doc = read_json(path) if path.exists() else {}
            except FileProblem:
                doc = {}  # a cache that cannot be read is rebuilt, never a reason to fail a run
            doc = doc if isinstance(doc, dict) else {}
            doc[case] = {**(doc.get(case) if isinstance(doc.get(case), dict) else {}), **found, **(versions or {})}
            atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


#: The references' seeds: ``SEEDS`` in the folder of references in use (``Caches.references``).
SEEDS = "batches.json"


def _entry(doc: Any, case: str, versions: dict[str, str]) -> int | None:
    """The compiled batch ``doc`` holds for ``case`` under exactly ``versions``, else None."""
    entry = doc.get(case) if isinstance(doc, dict) else None
    if not isinstance(entry, dict) or any(entry.get(k) != v for k, v in versions.items()):
        return None
    return _batches(doc, case).get("compiled")


def seed(case: str, versions: dict[str, str], caches: Caches | None = None) -> tuple[int, str] | None:
    """A compiled batch for ``case`` found elsewhere under the same ``versions`` (torch, transformers),
    and where: another stack's folder beside the stack's folder of ``caches`` (the newest first), else
    the ``batches.json`` of its references.  None where neither has one; a file that cannot be read is
    passed over."""

    if not versions:
        return None
    own = _path(caches)
    places: list[tuple[Path, str]] = []
    if own is not None and own.parent.parent.is_dir():
        others = [p for p in own.parent.parent.glob(f"*/{FILE}") if p.parent != own.parent]
        with contextlib.suppress(OSError):
            others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        places += [(p, f"stack {p.parent.name}") for p in others]
    if caches is not None and caches.references is not None:
        places.append((caches.references / SEEDS, "reference"))
    for path, name in places:
        try:
            found = _entry(read_json(path), case, versions) if path.is_file() else None
        except (FileProblem, OSError):
            continue
        if found:
            return found, name
    return None


__all__ = ["BatchGrowth", "BatchSearch", "COMPILED_MARGIN", "FILE", "MAX_BATCH", "OOM_ERROR", "SEEDS", "confirm_batch",
           "confirm_growth", "grow_batch", "is_oom", "key", "max_batch_search", "recall", "remember", "seed"]
