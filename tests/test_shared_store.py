"""A site's store where it is shared, long or not what it seems: a history written at once through two
baseline folders that link to one file, a hand-merged history longer than the keep, two calibrations in
one work folder, and histories, references and caches that are FIFOs, link loops, dangling links or
cut short.  Each is tried on real files and real processes."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

from pytest_mig.baselines import BaselineStore
from pytest_mig.measure import Metric
from pytest_mig.results import ResultRecord

SLUG, PROFILE = "nvidia-h200", "3g.71gb"
TARGET = {"kind": "mig", "profile": PROFILE, "baseline_profile": PROFILE, "gpu_name": "NVIDIA H200",
          "gpu_slug": SLUG, "emulated": False}


def _record(test: str, value: float = 100.0) -> ResultRecord:
    metric = Metric("rate", value, "items/s", "higher", [value * 0.99, value, value * 1.01])
    return ResultRecord(test, metric, dict(TARGET), {"driver": "580"}, "2026-01-01T00:00:00+00:00")


# 1. a shared history written through two folders --------------------------------------------------------


def _save_rounds(root: str, name: str, rounds: int, go: Any, out: Any) -> None:
    """One nightly's worker: waits for the others, then saves one figure per round into its folder."""
    go.wait(30)
    saved: list[str] = []
    try:
        for r in range(rounds):
            test = f"bench.py::test_{name}_{r}"
            BaselineStore(root).save([_record(test, 100.0 + r)])
            saved.append(test)
    finally:  # what it saved, even when a save failed: the test fails on what is missing, without waiting
        out.put(saved)


def test_a_history_shared_by_two_folders_keeps_every_figure_saved_at_once(tmp_path: Path) -> None:
    """12 processes, half through each of two baseline folders whose history links to one file on
    another disk, save 2 rounds at once: every figure each of them saved is in the shared file, and
    both links are still links."""
    shared = tmp_path / "shared-disk" / "h200-3g.json"
    shared.parent.mkdir()
    folders = [tmp_path / "site-a" / "baselines", tmp_path / "site-b" / "baselines"]
    for folder in folders:
        (folder / SLUG).mkdir(parents=True)
        (folder / SLUG / f"{PROFILE}.json").symlink_to(shared)
    BaselineStore(folders[0]).save([_record("bench.py::test_first")])
    ctx = multiprocessing.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_save_rounds, args=(str(folders[i % 2]), f"p{i}", 2, go, out)) for i in range(12)]
    for p in procs:
        p.start()
    go.set()
    reported = [t for _ in procs for t in out.get(timeout=120)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    held = set(json.loads(shared.read_text())["modes"]["normal"])
    assert len(reported) == 24 and set(reported) | {"bench.py::test_first"} == held
    for folder in folders:
        link = folder / SLUG / f"{PROFILE}.json"
        assert link.is_symlink() and os.readlink(link) == str(shared)
    assert sorted(p.name for p in shared.parent.iterdir()) == ["h200-3g.json"]  # no temporary file left
