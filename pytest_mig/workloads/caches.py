"""The folders a workload may keep what it found in, from one night to the next.

The plugin sets them up once per run (:func:`pytest_mig.night.nights.compile_caches`) and hands them
to the benchmarks through ``mig_bench.caches``; a benchmark passes them to its workload
(``run_training(..., caches=mig_bench.caches)``).  A workload called without them (a CPU run, a
unit test, a site's own script) keeps nothing and runs every search and build in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Caches:
    """Where this run keeps what is not a measurement.  A folder that is None keeps nothing."""

    #: This software stack's folder: ``batches.json``, the largest batches the training cases found
    #: (:mod:`pytest_mig.workloads.batch_search`).
    stack: Path | None = None
    #: Built OpenMM systems (:mod:`pytest_mig.workloads.md_systems`), kept across stacks.
    built_systems: Path | None = None
    #: The folder of references in use (the shipped one also under ``--mig-reference none``), whose
    #: ``batches.json`` seeds compiled batches (:func:`pytest_mig.workloads.batch_search.seed`).
    references: Path | None = None


__all__ = ["Caches"]
