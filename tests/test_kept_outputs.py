"""No output replaces what a site keeps: each output option pointed at a history, a reference, another
run's results file, another output of the same run, or a device node, through the real plugin and
command on the fake H200 of test_verdict_flow.py, on real files (links, hard links, FIFOs, sockets,
device nodes made with os.mknod where this user may)."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import stat
import threading
from pathlib import Path
from typing import Callable

import pytest
from test_verdict_flow import baseline_path, h200  # noqa: F401

from pytest_mig import cli
from pytest_mig.night.calibrate import calibrate
from pytest_mig.common.files import atomic_write_text
from pytest_mig.judge.reference import SHIPPED

Run = Callable[..., pytest.RunResult]
IS_ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _kept(h200: Run, pytester: pytest.Pytester, tmp_path: Path, kind: str) -> tuple[Path, list[str]]:
    """A file of ``kind`` the site keeps, and the options the run needs to know it as such."""
    h200("--mig-save-baseline", "--mig-results", "first.json").assert_outcomes(passed=1)
    first = pytester.path / "first.json"
    if kind == "history":
        return baseline_path(pytester), []
    if kind == "results":
        return first, []
    folder = tmp_path / "fleet-ref"
    assert cli.main(["reference", str(first), "--out", str(folder)]) == 0
    if kind == "reference":
        return folder / "nvidia-h200" / "full.json", ["--mig-reference", str(folder)]
    spoiled = folder / "nvidia-h200" / "notes.json"  # no reader would take it: kept for where it is
    spoiled.write_text("{not json")
    return spoiled, ["--mig-reference", str(folder)]


def _value(option: str, path: Path) -> list[str]:
    if option == "github":  # the folder's bigger-is-better.json is the kept file
        return ["--mig-export", f"github={path.parent}"]
    if option == "prometheus":
        return ["--mig-export", f"prometheus={path}"]
    return [option, str(path)]


@pytest.mark.parametrize("kind, what", [("history", "a baseline history"), ("reference", "a reference file"),
                                        ("results", "a results file"), ("spoiled", "a file of the reference folder")])
@pytest.mark.parametrize("option", ["--mig-results", "--mig-report", "prometheus", "github"])
def test_an_output_naming_a_kept_file_is_refused_at_start_up_and_the_file_stays(
        h200: Run, pytester: pytest.Pytester, tmp_path: Path, kind: str, what: str, option: str) -> None:
    kept, extra = _kept(h200, pytester, tmp_path, kind)
    if option == "github":
        named = tmp_path / "gh" / "bigger-is-better.json"
        named.parent.mkdir()
        named.symlink_to(kept)  # a link under the export's name: a write would go through it
    else:
        named = kept
    before = kept.read_bytes()
    result = h200(*extra, *_value(option, named))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    (line,) = [x for x in err.splitlines() if x.startswith("ERROR: ")]
    shown = {"github": "--mig-export github=", "prometheus": "--mig-export prometheus="}.get(option, option + " ")
    assert line.startswith(f"ERROR: {shown}{named}: "), line
    if option == "--mig-results" and kind == "results":
        assert "the results file of another run, which a new run never replaces" in line
        assert "a folder ending in /" in line
    else:
        assert f": {what}" in line and "which an output never replaces; name another file" in line, line
    assert kept.read_bytes() == before and named.read_bytes() == before
    assert "test_bench.py" not in result.stdout.str()  # nothing ran


def test_the_shipped_references_are_known_as_references() -> None:
    from pytest_mig.common.files import kept_file

    full = next(SHIPPED.glob("*/full.json"))
    assert kept_file(full) == "a reference file"
    shipped = [(SHIPPED, "the shipped references")]
    assert kept_file(SHIPPED / "batches.json", shipped) == "a file of the shipped references"
    assert kept_file(SHIPPED / "batches.json") is None  # by its place only


def test_results_and_report_naming_one_file_are_refused(h200: Run, pytester: pytest.Pytester) -> None:
    result = h200("--mig-report", "r.json", "--mig-results", "r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([("ERROR: --mig-results r.json and --mig-report r.json name the same file, so one "
                                  "output would replace the other; give each its own file.")])
    assert not (pytester.path / "r.json").exists()


def test_two_outputs_naming_one_file_by_other_spellings_are_refused(h200: Run, pytester: pytest.Pytester,
                                                                    tmp_path: Path) -> None:
    (pytester.path / "out").mkdir()
    (pytester.path / "prom.json").symlink_to(pytester.path / "out" / "night.json")  # dangling until written
    result = h200("--mig-results", "out/../out/night.json", "--mig-export", "prometheus=prom.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "name the same file, so one output would replace the other" in result.stderr.str()
    last_night = pytester.path / "last.json"
    last_night.write_text("[]\n")  # last night's report: an ordinary file either option may replace
    os.link(last_night, pytester.path / "twin.json")
    result = h200("--mig-report", "last.json", "--mig-export", "prometheus=twin.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--mig-report last.json and --mig-export prometheus=twin.json name the same file" in result.stderr.str()
    assert last_night.read_text() == "[]\n"


def test_last_nights_outputs_are_replaced_and_each_run_writes_its_own_results(
        h200: Run, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    written: list[tuple[str, str, str]] = []
    for rate in ("123.25", "456.75"):
        mig_env.setenv("RATE", rate)
        h200("--mig-report", "night.json", "--mig-export", "prometheus=night.prom", "--mig-export",
             "github=gh").assert_outcomes(passed=1)
        written.append(tuple((pytester.path / name).read_text()  # type: ignore[misc]
                             for name in ("night.json", "night.prom", "gh/bigger-is-better.json")))
    for last, this in zip(*written):
        assert "456.75" not in last and "456.75" in this  # each replaced by the second night's figures
    assert len(list((pytester.path / ".mig-results").glob("results-*.json"))) == 2
    for _ in range(2):
        h200("--mig-results", "night/").assert_outcomes(passed=1)
    assert len(list((pytester.path / "night").glob("results-*.json"))) == 2


def _reader(path: Path, got: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as fh:
            got.append(fh.read())
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_fifo_is_written_through_with_the_whole_run(h200: Run, pytester: pytest.Pytester) -> None:
    fifo = pytester.path / "results.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    thread = _reader(fifo, got)
    h200("--mig-results", str(fifo)).assert_outcomes(passed=1)
    thread.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the pipe
    doc = json.loads(got[0])  # one whole document: no half-run checkpoint before it
    assert doc["meta"]["complete"] is True and doc["records"]


@pytest.mark.skipif(not IS_ROOT, reason="os.mknod of a character device needs root")
@pytest.mark.parametrize("option", ["--mig-results", "prometheus"])
def test_a_character_device_is_written_through_never_replaced(h200: Run, pytester: pytest.Pytester,
                                                               option: str) -> None:
    null = pytester.path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    h200(*_value(option, null)).assert_outcomes(passed=1)
    info = os.lstat(null)
    assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3)
    assert [p.name for p in pytester.path.iterdir() if p.name.startswith(".null")] == []  # no temporary left


@pytest.mark.skipif(not IS_ROOT, reason="os.mknod of a block device needs root")
def test_a_block_device_is_refused_at_start_up(h200: Run, pytester: pytest.Pytester) -> None:
    disk = pytester.path / "disk"
    os.mknod(disk, stat.S_IFBLK | 0o600, os.makedev(7, 200))  # a loop device number no one uses
    result = h200("--mig-results", str(disk))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--mig-results {disk}: a block device, not a file; nothing was written" in result.stderr.str()
    assert stat.S_ISBLK(os.lstat(disk).st_mode)


def test_a_socket_is_refused_at_start_up(h200: Run, pytester: pytest.Pytester, tmp_path: Path) -> None:
    path = tmp_path / "s.prom"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path))
        result = h200("--mig-export", f"prometheus={path}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert f"{path}: a socket, not a file" in result.stderr.str()
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        sock.close()


def test_a_pipe_is_written_through_by_the_atomic_write_itself(tmp_path: Path) -> None:
    """A baseline or page written to a FIFO: the text goes down the pipe, checked first, and the pipe stays."""
    fifo = tmp_path / "page.html"
    os.mkfifo(fifo)
    got: list[bytes] = []
    thread = _reader(fifo, got)
    checked: list[str] = []
    assert atomic_write_text(fifo, "x\n", check=checked.append) == fifo
    thread.join(10)
    assert got == [b"x\n"] and checked == ["x\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


@pytest.mark.parametrize("make, phrase", [
    (lambda p: p.mkdir(), "a folder, where this output writes a file"),
    (lambda p: p.symlink_to(p.parent / "gone" / p.name), "whose folder"),
])
def test_a_github_export_file_that_cannot_be_written_is_refused_at_start_up(
        h200: Run, pytester: pytest.Pytester, make: Callable[[Path], None], phrase: str) -> None:
    folder = pytester.path / "gh"
    folder.mkdir()
    make(folder / "smaller-is-better.json")
    result = h200("--mig-export", "github=gh")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    (line,) = [x for x in result.stderr.str().splitlines() if x.startswith("ERROR: ")]
    assert line.startswith("ERROR: --mig-export github=") and "smaller-is-better.json" in line and phrase in line
    assert "test_bench.py" not in result.stdout.str()
    assert not (folder / "bigger-is-better.json").exists()


def test_the_report_command_never_replaces_a_results_file_or_a_history(
        h200: Run, pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    h200("--mig-save-baseline", "--mig-results", "a.json").assert_outcomes(passed=1)
    h200("--mig-results", "b.json").assert_outcomes(passed=1)
    a, b, history = pytester.path / "a.json", pytester.path / "b.json", baseline_path(pytester)
    before = {p: p.read_bytes() for p in (a, b, history)}
    for out in (b, history):
        capsys.readouterr()
        assert cli.main(["report", str(a), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"pytest-mig: error: --out {out}: ") and len(err.splitlines()) == 1
        assert "which an output never replaces; name another file" in err
    assert {p: p.read_bytes() for p in before} == before
    report = pytester.path / "fleet.json"
    for _ in range(2):  # last night's report is replaced
        assert cli.main(["report", str(a), str(b), "--out", str(report)]) == 0
    assert json.loads(report.read_text())


def test_the_trend_page_never_replaces_a_kept_file(h200: Run, pytester: pytest.Pytester,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    h200("--mig-save-baseline", "--mig-results", "a.json").assert_outcomes(passed=1)
    page = pytester.path / "baselines" / "nvidia-h200" / "page.html"
    shutil.copy(pytester.path / "a.json", page)  # a results file, whatever its name
    before = page.read_bytes()
    assert cli.main(["history", str(pytester.path / "a.json"), "--baselines", "baselines", "--out", str(page)]) == 2
    assert "a results file, which an output never replaces" in capsys.readouterr().err
    assert page.read_bytes() == before


def test_report_and_trend_page_make_a_missing_folder_but_never_one_inside_a_kept_folder(
        h200: Run, pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    h200("--mig-save-baseline", "--mig-results", "a.json").assert_outcomes(passed=1)
    a = str(pytester.path / "a.json")
    report, page = pytester.path / "reports" / "2026-11-26" / "fleet.md", pytester.path / "pages" / "new" / "trend.html"
    assert cli.main(["report", a, "--out", str(report)]) == 0 and report.read_text().startswith("| test |")
    assert cli.main(["history", a, "--mig-baseline-dir", "baselines", "--out", str(page)]) == 0 and page.exists()
    kept = pytester.path / "baselines"
    (pytester.path / "to-baselines").symlink_to(kept)  # a link that leads into the baseline folder
    before = sorted(p.relative_to(kept) for p in kept.rglob("*"))
    inside = pytester.path / "to-baselines" / "pages" / "trend.html"
    capsys.readouterr()
    assert cli.main(["history", a, "--mig-baseline-dir", "baselines", "--out", str(inside)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pytest-mig: error: --out {inside}: its folder {inside.parent} would be made inside the "
                          f"baseline folder baselines") and len(err.splitlines()) == 1
    (pytester.path / "to-shipped").symlink_to(SHIPPED)
    assert cli.main(["report", a, "--out", str(pytester.path / "to-shipped" / "x" / "fleet.md")]) == 2
    assert "would be made inside the shipped references" in capsys.readouterr().err
    assert sorted(p.relative_to(kept) for p in kept.rglob("*")) == before and not (SHIPPED / "x").exists()


def test_calibrate_starts_each_run_on_a_new_results_file(tmp_path: Path) -> None:
    """--mig-results never replaces a results file, so calibrate removes its own earlier run's first."""
    work = tmp_path / "work"
    work.mkdir()
    for i in (1, 2):
        (work / f"calibrate-{i:02d}.json").write_text('{"schema": "pytest-mig/results/1", "records": []}')
    seen: list[bool] = []

    def runner(cmd: list[str]) -> int:
        seen.append(Path(cmd[cmd.index("--mig-results") + 1]).exists())
        return 0

    calibrate(["benchmarks"], 2, tmp_path / "baselines", work, runner=runner, out=io.StringIO())
    assert seen == [False, False]


def test_a_stream_sent_into_a_file_is_added_to_never_replaced(tmp_path: Path) -> None:
    """/dev/stdout of a job whose output a shell sent into a log: the log gets the text at its end."""
    log = tmp_path / "job.log"
    log.write_text("pytest output\n")
    inode = log.stat().st_ino
    with open(log, "a") as fh:
        atomic_write_text(Path(f"/dev/fd/{fh.fileno()}"), '{"records": []}\n')
    assert log.read_text() == 'pytest output\n{"records": []}\n' and log.stat().st_ino == inode
