"""Many results files read at once, as ``pytest-mig report`` reads a fleet's nights: every file read
and checked exactly as :func:`~pytest_mig.store.results.read_results_file` reads one, by a pool of
worker processes where the files are many, and each record kept with what a report shows.

- **Checked as one file is**: each worker calls :func:`~pytest_mig.store.results.read_results` (the
  strict parse, the schema, the records); a file it refuses is refused here with the same sentence,
  the first such file in the order given, and nothing is reported.
- **What a report shows**: a record comes back without its samples, its ``info`` and its health
  readings (most of a night's bytes; no report column or summary line reads them), and the Target
  and fingerprint that a file's records share are one object.
- **Workers**: one per CPU this process may use (at most :data:`MAX_WORKERS`), started fresh
  (``spawn``: no copy of a process that runs threads) where the files hold more than
  :data:`POOL_BYTES`; fewer files are read in this process, which is quicker than starting the pool.
  A worker is given a file's path and hands back its records through the pool's own pipe (pickled by
  ``multiprocessing``, between this command's processes): a file's text is only ever parsed as JSON.
  A script that calls this keeps its own work under ``if __name__ == "__main__":``, as every
  ``spawn`` pool asks (``pytest-mig`` and ``python -m pytest_mig.cli`` do).
- The cyclic garbage collector is held off while records are made
  (:func:`~pytest_mig.common.collector.collector_paused`).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

from pytest_mig.common.collector import collector_paused
from pytest_mig.device.host import HOST_INFO_KEYS
from pytest_mig.store.results import ResultRecord, ResultsFileError, read_results

#: Most worker processes: past a few, the records coming back, not the reading, take the time.
MAX_WORKERS = 8
#: Files holding fewer bytes than this in all are read in this process: starting the workers (a fresh
#: interpreter each) takes about as long as reading this much.
POOL_BYTES = 48 * 2**20

#: A file's records as a report reads them, or the sentence its reader refused it with.
Read = tuple[list[ResultRecord], str | None]


def report_view(records: list[ResultRecord]) -> list[ResultRecord]:
    """``records`` (one file's) with only what a report shows: no samples, health readings or info
    but what a host copy says of the host (:data:`~pytest_mig.device.host.HOST_INFO_KEYS`), and one
    Target and one fingerprint object for each run of records that hold equal ones."""
    target, fingerprint = None, None
    for r in records:
        r.health = None
        r.metric.samples = []
        info = r.metric.info
        r.metric.info = {k: info[k] for k in HOST_INFO_KEYS if k in info} if isinstance(info, dict) and info else {}
        if r.target == target:
            r.target = target
        target = r.target
        if r.fingerprint == fingerprint:
            r.fingerprint = fingerprint
        fingerprint = r.fingerprint
    return records


def read_for_report(path: str) -> Read:
    """One results file read for a report (in a worker, or here); its refusal is returned, not raised,
    so that the files' order decides which refusal is said."""
    with collector_paused():
        try:
            return report_view(read_results(Path(path))), None
        except ResultsFileError as exc:
            return [], str(exc)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as ``taskset`` or a Slurm job sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except (OSError, ValueError):
        return 0  # its reader says what is wrong with it


def workers_for(files: Sequence[Path]) -> int:
    """How many worker processes read ``files``: 0 (read here) where they hold less than POOL_BYTES
    or one CPU is all there is, else one per usable CPU, at most MAX_WORKERS and one per file."""
    cpus = min(usable_cpus(), MAX_WORKERS, len(files))
    if cpus < 2 or sum(_size(f) for f in files) < POOL_BYTES:
        return 0
    return cpus


def read_report_records(files: Sequence[Path], workers: int | None = None) -> list[ResultRecord]:
    """The records of ``files``, in order, as a report reads them (:func:`report_view`): read by
    ``workers`` processes (default :func:`workers_for`; 0, here).  ResultsFileError for the first file
    (in the order given) that its reader refuses."""
    n = workers_for(files) if workers is None else workers
    paths = [str(f) for f in files]
    records: list[ResultRecord] = []
    with collector_paused():
        if n < 1:
            _collect(map(read_for_report, paths), records)
            return records
        pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
        try:
            _collect(pool.map(read_for_report, paths), records)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # a refused file: the files not yet read are not
    return records


def _collect(reads: Iterable[Read], into: list[ResultRecord]) -> None:
    for got, refused in reads:
        if refused is not None:
            raise ResultsFileError(refused)
        into.extend(got)


__all__ = ["MAX_WORKERS", "POOL_BYTES", "read_for_report", "read_report_records", "report_view", "usable_cpus",
           "workers_for"]
