"""A site's store where it is shared, long or not what it seems: a history written at once through two
baseline folders that link to one file, a hand-merged history longer than the keep, and histories,
references, caches and lock files that are FIFOs, link loops, dangling links or cut short.  Each is
tried on real files and real processes (two calibrations in one work folder: test_calibrate_detection.py)."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from test_verdict_flow import baseline_path, h200  # noqa: F401  (the fixture: a whole H200, fake NVML)

from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.history import BaselineError
from pytest_mig.measure import Metric
from pytest_mig.night.nights import BUILT_SYSTEMS, CACHE_FOLDER
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord

Run = Callable[..., pytest.RunResult]

SLUG, PROFILE = "nvidia-h200", "3g.71gb"
TARGET = {"kind": "mig", "profile": PROFILE, "baseline_profile": PROFILE, "gpu_name": "NVIDIA H200",
          "gpu_slug": SLUG, "emulated": False}


def _record(test: str, value: float = 100.0) -> ResultRecord:
    metric = Metric("rate", value, "items/s", "higher", [value * 0.99, value, value * 1.01])
    return ResultRecord(test, metric, TargetInfo.from_dict(TARGET), {"driver": "580"}, "2026-01-01T00:00:00+00:00")


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


# 4. files that are not what they seem: one sentence at start-up, nothing run -------------------------------


def _refused(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines
    result.stderr.fnmatch_lines(list(lines))
    assert "Traceback" not in result.stderr.str() and "INTERNALERROR" not in result.stdout.str()
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()  # nothing ran


class _Writer(threading.Thread):
    """Opens a named pipe for writing, once a reader has it open, and closes it: a reader that would
    wait for a writer forever (the FIFO read in place of a history) is released after ``after`` s,
    so that such a reader fails its test instead of hanging it."""

    def __init__(self, fifo: Path, after: float = 15.0) -> None:
        super().__init__(daemon=True)
        self.fifo, self.after, self.done = fifo, after, threading.Event()

    def run(self) -> None:
        if self.done.wait(self.after):
            return
        while not self.done.is_set():
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                time.sleep(0.05)


@pytest.mark.parametrize("save", [False, True], ids=["judging", "saving"])
def test_a_history_that_is_a_named_pipe_is_one_sentence_at_start_up(
        h200: Run, pytester: pytest.Pytester, save: bool) -> None:
    path = baseline_path(pytester)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    writer = _Writer(path)
    writer.start()
    try:
        result = h200(*(["--mig-save-baseline"] if save else []))
    finally:
        writer.done.set()
    _refused(result, f"ERROR: {path}: a named pipe (FIFO), not a file; nothing was read from it*")
    assert stat.S_ISFIFO(os.lstat(path).st_mode)  # the site's pipe is left as it is


@pytest.mark.parametrize("save", [False, True], ids=["judging", "saving"])
def test_a_history_or_its_folder_that_is_a_link_loop_is_one_sentence_at_start_up(
        h200: Run, pytester: pytest.Pytester, save: bool) -> None:
    path = baseline_path(pytester)
    path.parent.mkdir(parents=True)
    path.symlink_to(path)
    _refused(h200(*(["--mig-save-baseline"] if save else [])),
             f"ERROR: {path}: a link that leads back to itself (a link loop)*")
    assert os.readlink(path) == str(path)
    path.unlink()
    path.parent.rmdir()
    path.parent.symlink_to(path.parent)  # the GPU model's folder links to itself
    _refused(h200(*(["--mig-save-baseline"] if save else [])),
             f"ERROR: {path.parent}: a link that leads back to itself (a link loop)*")


def test_a_history_folder_that_is_a_dangling_link_is_refused_and_a_history_file_link_is_written_through(
        h200: Run, pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A GPU model's folder linking to a folder that does not exist is refused before the run; a history
    file linking to a file not written yet, in a folder that exists, is a history not made yet: judged
    as none, and the first save writes it through the link."""
    path = baseline_path(pytester)
    path.parent.parent.mkdir()
    path.parent.symlink_to(tmp_path / "unmounted" / "nvidia-h200")
    for options in ([], ["--mig-save-baseline"]):
        _refused(h200(*options), f"ERROR: {path.parent}: a link to the folder {tmp_path}/unmounted/nvidia-h200, "
                                 f"which does not exist; make that folder or remove the link*")
    path.parent.unlink()
    path.parent.mkdir()
    shared = tmp_path / "shared-disk" / "full.json"
    shared.parent.mkdir()
    path.symlink_to(shared)
    h200().assert_outcomes(passed=1)
    h200("--mig-save-baseline").assert_outcomes(passed=1)
    assert path.is_symlink() and json.loads(shared.read_text())["profile"] == "full"


def test_a_history_cut_short_is_one_sentence_at_start_up_when_only_judging(
        h200: Run, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    for rate in (100.0, 101.0):
        mig_env.setenv("RATE", str(rate))
        h200("--mig-save-baseline", "--mig-results", "none").assert_outcomes(passed=1)
    path = baseline_path(pytester)
    text = path.read_bytes()
    path.write_bytes(text[: len(text) // 2])  # a copy cut short by a full disk
    _refused(h200(), f"ERROR: {path}: not valid JSON (*); nothing was run.")
    assert path.read_bytes() == text[: len(text) // 2]


def test_a_corrupt_reference_is_one_sentence_at_start_up(h200: Run, pytester: pytest.Pytester, tmp_path: Path) -> None:
    ref = tmp_path / "site-ref" / "nvidia-h200" / "full.json"
    ref.parent.mkdir(parents=True)
    ref.write_text('{"schema": "pytest-mig/baseline/2", "gpu_model": "NVIDIA H200", "modes": {')
    _refused(h200("--mig-reference", str(tmp_path / "site-ref")), f"ERROR: {ref}: not valid JSON (*); nothing was run.")


def _stack_folder(pytester: pytest.Pytester) -> Path:
    (folder,) = [p for p in (pytester.path / CACHE_FOLDER).iterdir() if p.name != BUILT_SYSTEMS]
    return folder


@pytest.mark.parametrize("spoil, what", [
    (lambda p: p.write_text("a site's notes\n"), "a file"),
    (lambda p: p.symlink_to(p.parent / "gone"), "a link to */gone, which does not exist"),
    (lambda p: p.symlink_to(p), "a link that leads back to itself (a link loop)"),
], ids=["file", "dangling-link", "link-loop"])
def test_a_compile_cache_entry_that_is_not_a_folder_is_one_sentence_and_left_as_it_is(
        h200: Run, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch, spoil: Callable[[Path], None],
        what: str) -> None:
    for name in ("OPENMM_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # as a new process finds them; undone after
        mig_env.setenv(name, "")
        mig_env.delenv(name)
    h200().assert_outcomes(passed=1)
    entry = _stack_folder(pytester) / "openmm"
    entry.rmdir()
    mig_env.delenv("OPENMM_CACHE_DIR")  # the first run set it, as the next night's process would not find it
    spoil(entry)
    before = os.readlink(entry) if entry.is_symlink() else entry.read_text()
    _refused(h200(), f"ERROR: {entry}: {what}, where pytest-mig keeps its compile cache (a folder); move it away or "
                     f"remove it (a cache is made again) and run again.")
    assert (os.readlink(entry) if entry.is_symlink() else entry.read_text()) == before


def test_a_lock_file_that_is_a_link_is_never_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a folder cannot be locked itself (a network file system) a lock file is used: one that is a
    link to a site's file is refused, naming it, and the file it points at is left byte for byte."""
    import fcntl

    flock = fcntl.flock

    def no_folder_locks(fd: int, op: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(37, "No locks available")  # ENOLCK, as NFS without lockd answers
        flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", no_folder_locks)
    root = tmp_path / "baselines"
    store = BaselineStore(root)
    store.save([_record("bench.py::test_rate")])  # the lock file fallback works
    precious = tmp_path / "notes.txt"
    precious.write_text("a site's notes\n")
    (root / ".pytest-mig.lock").unlink()
    (root / ".pytest-mig.lock").symlink_to(precious)
    with pytest.raises(BaselineError, match=r"\.pytest-mig\.lock is a link or not a regular file, where pytest-mig "
                                            r"keeps its lock file; remove it"):
        store.save([_record("bench.py::test_rate", 101.0)])
    assert precious.read_text() == "a site's notes\n" and len(_values(store.path_for(SLUG, PROFILE))) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="making a character device needs root")
def test_a_device_or_folder_in_a_history_s_place_is_named_never_read(tmp_path: Path) -> None:
    from pytest_mig.common.files import FileProblem, read_json

    device = tmp_path / "full.json"
    os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers: a read would never end
    with pytest.raises(FileProblem, match=r"full\.json: a character device, not a file; nothing was read from it"):
        read_json(device)
    with pytest.raises(FileProblem, match=r": a folder, not a file$"):
        read_json(tmp_path)
