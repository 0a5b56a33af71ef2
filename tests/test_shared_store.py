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

import pytest

from pytest_mig.baselines import BaselineError, BaselineStore
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


# 2. a history longer than the keep ----------------------------------------------------------------------


def _hand_merged(root: Path, runs: int) -> Path:
    """A history of ``runs`` runs of one figure, as two sites' files merged by hand make it (keep 10)."""
    store = BaselineStore(root)
    for i in range(10):
        store.save([_record("bench.py::test_rate", 100.0 + i)])
    path = store.path_for(SLUG, PROFILE)
    doc = json.loads(path.read_text())
    held = doc["modes"]["normal"]["bench.py::test_rate"]["rate"]["runs"]
    merged = [dict(held[0], at=f"2025-12-{d:02d}T00:00:00+00:00", value=90.0 + d) for d in range(1, runs - 9)]
    doc["modes"]["normal"]["bench.py::test_rate"]["rate"]["runs"] = merged + held
    path.write_text(json.dumps(doc))
    assert doc["keep"] == 10 and len(merged + held) == runs
    return path


def _values(path: Path) -> list[float]:
    return [r["value"] for r in json.loads(path.read_text())["modes"]["normal"]["bench.py::test_rate"]["rate"]["runs"]]


def test_a_hand_merged_history_longer_than_the_keep_keeps_its_length_with_the_default_keep(tmp_path: Path) -> None:
    """15 runs in a file that keeps 10, saved with no --mig-baseline-keep: still 15 runs, the new one
    last and only the oldest gone; the file's own keep is as it was."""
    path = _hand_merged(tmp_path / "baselines", 15)
    before = _values(path)
    result = BaselineStore(tmp_path / "baselines").save([_record("bench.py::test_rate", 120.0)])
    assert _values(path) == before[1:] + [120.0] and result[0].runs == 15
    assert json.loads(path.read_text())["keep"] == 10
    BaselineStore(tmp_path / "baselines").save([_record("bench.py::test_other", 50.0)])  # another figure's save
    assert len(_values(path)) == 15


def test_an_explicit_keep_below_a_hand_merged_history_needs_consent(tmp_path: Path) -> None:
    """--mig-baseline-keep 10 on a 15-run history would drop 5 runs: refused before the run without
    --mig-baseline-shrink, saying so; with it, the history is cut to 10."""
    path = _hand_merged(tmp_path / "baselines", 15)
    before = path.read_bytes()
    store = BaselineStore(tmp_path / "baselines", keep=10)
    with pytest.raises(BaselineError, match=r"3g\.71gb\.json keeps 15 runs per figure and a keep of 10 would drop "
                                            r"5 older run\(s\) of its 1 figure\(s\); nothing is saved: confirm with "
                                            r"--mig-baseline-shrink"):
        store.check_save(SLUG, PROFILE)
    with pytest.raises(BaselineError):
        store.save([_record("bench.py::test_rate", 120.0)])
    assert path.read_bytes() == before
    BaselineStore(tmp_path / "baselines", keep=10, shrink=True).save([_record("bench.py::test_rate", 120.0)])
    assert len(_values(path)) == 10
