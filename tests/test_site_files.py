"""Nothing a site keeps is ever lost or corrupted: the seven ways a careless or hostile input could
lose a history or a reference, each tried on real files (links, read-only folders, a real SIGTERM),
through the real plugin and command on the fake H200 of test_verdict_flow.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from test_stopped_run import h200 as h200_stop  # noqa: F401  (the fixture, for the stopped run)
from test_verdict_flow import QUIET, baseline_path, entry, h200  # noqa: F401

from pytest_mig import cli
from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.history import BaselineError
from pytest_mig.store.reader import load_baseline_file
from pytest_mig.common.files import FileProblem, atomic_write_text, output_file, parse_json
from pytest_mig.judge.reference import ReferenceStore

Run = Callable[..., pytest.RunResult]
ROOT_CAN_WRITE_ANYWHERE = os.geteuid() == 0 if hasattr(os, "geteuid") else False


def _history(h200: Run, mig_env: pytest.MonkeyPatch, rates: list[float]) -> None:
    for rate in rates:
        mig_env.setenv("RATE", str(rate))
        h200("--mig-save-baseline", "--mig-results", "none").assert_outcomes(passed=1)
    mig_env.delenv("RATE")


# 1. a malformed results file never reaches a reference folder --------------------------------------


def _results_file(tmp_path: Path, pytester: pytest.Pytester, h200: Run, name: str) -> Path:
    h200("--mig-results", name).assert_outcomes(passed=1)
    return pytester.path / name


@pytest.mark.parametrize("spoil, phrase", [
    (lambda r: r["metric"].update(unit=["items/s"]), "metric/unit: ['items/s'] is not of type 'string'"),
    (lambda r: r["metric"].update(value=float("inf"), samples=[float("inf")] * 3), "is inf, which no measurement gives"),
    (lambda r: r["metric"].update(name=["rate"]), "/metric/name"),
    (lambda r: r.update(verdict="pass"), "/verdict: 'pass' is not of type 'object', 'null'"),
    (lambda r: r["metric"].update(info="big"), "/metric/info"),
])
def test_a_malformed_results_file_changes_nothing_in_a_reference_folder(
        tmp_path: Path, pytester: pytest.Pytester, h200: Run, spoil: Callable[[dict[str, Any]], None], phrase: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    good = _results_file(tmp_path, pytester, h200, "good.json")
    folder = tmp_path / "fleet-ref"
    assert cli.main(["reference", str(good), "--out", str(folder)]) == 0
    before = {p: p.read_bytes() for p in folder.rglob("*.json")}
    doc = json.loads(good.read_text())
    for r in doc["records"]:
        spoil(r)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli.main(["reference", str(good), str(bad), "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pytest-mig: error: {bad}: ") and phrase in err and len(err.splitlines()) == 1
    assert {p: p.read_bytes() for p in folder.rglob("*.json")} == before  # every earlier run kept, byte for byte
    assert ReferenceStore(folder).load("nvidia-h200", "full") is not None  # and still read by its own reader


def test_a_file_the_reader_would_refuse_is_never_written(tmp_path: Path) -> None:
    """The read-back check runs on the bytes on disk before the rename: the old file stays."""
    path = tmp_path / "keep.json"
    path.write_text('{"runs": 6}\n')

    def refuse(text: str) -> None:
        raise BaselineError(f"{path}: would not read back")

    with pytest.raises(BaselineError):
        atomic_write_text(path, '{"runs": 2}\n', check=refuse)
    assert path.read_text() == '{"runs": 6}\n' and [p.name for p in tmp_path.iterdir()] == ["keep.json"]


# 2. links are written through, never replaced -------------------------------------------------------


def test_a_baseline_that_is_a_link_to_a_shared_history_keeps_receiving_runs(
        h200: Run, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shared = tmp_path / "shared-disk" / "full.json"
    _history(h200, mig_env, [100.0])
    path = baseline_path(pytester)
    shared.parent.mkdir()
    path.rename(shared)
    path.symlink_to(shared)
    _history(h200, mig_env, [101.0, 102.0])
    assert path.is_symlink() and os.readlink(path) == str(shared)  # the link is still a link
    assert [r["value"] for r in entry(shared)["runs"]] == [100.0, 101.0, 102.0]  # its target got the runs
    assert not list(pytester.path.joinpath("baselines", "nvidia-h200").glob(".*tmp"))


def test_report_and_trend_page_links_are_written_through(h200: Run, pytester: pytest.Pytester,
                                                         tmp_path: Path) -> None:
    shared = tmp_path / "www"
    shared.mkdir()
    (pytester.path / "night.md").symlink_to(shared / "night.md")  # dangling until the first write
    h200("--mig-report", "night.md", "--mig-results", "night.json").assert_outcomes(passed=1)
    assert (pytester.path / "night.md").is_symlink() and "rate" in (shared / "night.md").read_text()
    page = pytester.path / "trend.html"
    page.symlink_to(shared / "trend.html")
    assert cli.main(["history", str(pytester.path / "night.json"), "--out", str(page)]) == 0
    assert page.is_symlink() and (shared / "trend.html").read_text().startswith("<!DOCTYPE html>")


def test_a_dangling_link_into_no_folder_is_refused_at_start_up(h200: Run, pytester: pytest.Pytester,
                                                             tmp_path: Path) -> None:
    (pytester.path / "night.md").symlink_to(tmp_path / "gone" / "night.md")
    result = h200("--mig-report", "night.md")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --mig-report night.md: a link to {tmp_path}/gone/night.md, whose folder "
                                 f"{tmp_path}/gone does not exist; nothing was written*"])
    assert (pytester.path / "night.md").is_symlink() and not (tmp_path / "gone").exists()


# 3. (a keep below the runs a history holds: test_baselines.py and test_verdict_flow.py) --------------


def test_keep_1_on_a_ten_run_history_is_refused_and_the_history_stays(
        h200: Run, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    _history(h200, mig_env, [100.0 + i for i in range(10)])
    path = baseline_path(pytester)
    before = path.read_bytes()
    refused = h200("--mig-save-baseline", "--mig-baseline-keep", "1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR and path.read_bytes() == before
    refused.stderr.fnmatch_lines(["ERROR: * keeps 10 runs per figure and a keep of 1 would drop 18 older run(s) of its "
                                  "2 figure(s); nothing is saved: confirm with --mig-baseline-shrink*"])


# 4. a key given twice is refused, never read as empty and overwritten --------------------------------


def test_a_baseline_with_a_key_given_twice_is_refused_and_never_overwritten(
        h200: Run, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    _history(h200, mig_env, [100.0, 101.0])
    path = baseline_path(pytester)
    text = path.read_text()
    doubled = text.rstrip().rstrip("}") + ',\n  "modes": {}\n}\n'  # a merge gone wrong: "modes" twice
    path.write_text(doubled)
    with pytest.raises(BaselineError, match='the key "modes" is given twice in one object'):
        load_baseline_file(path)
    saving = h200("--mig-save-baseline")
    assert saving.ret == pytest.ExitCode.USAGE_ERROR and path.read_text() == doubled
    with pytest.raises(FileProblem, match='"a" is given twice'):
        parse_json('{"a": 1, "a": 2}', "x.json")


# 5. an output path that is a folder is said at start-up -----------------------------------------------


@pytest.mark.parametrize("option", ["--mig-results", "--mig-report", "--mig-export"])
def test_an_output_path_naming_a_folder_is_refused_before_the_run(h200: Run, pytester: pytest.Pytester,
                                                                  option: str) -> None:
    (pytester.path / "out.json").mkdir()
    (pytester.path / "out.md").mkdir()
    (pytester.path / "out.prom").mkdir()
    value = {"--mig-results": "out.json", "--mig-report": "out.md", "--mig-export": "prometheus=out.prom"}[option]
    result = h200(option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "a folder; name a file, or end it with / to write" in result.stderr.str()
    assert "test_bench.py" not in result.stdout.str()  # nothing ran


def test_a_trailing_slash_names_a_folder_to_write_into(h200: Run, pytester: pytest.Pytester) -> None:
    result = h200("--mig-results", "night/", "--mig-report", "reports/", "--mig-export", "prometheus=prom/")
    result.assert_outcomes(passed=1)
    (results,) = (pytester.path / "night").glob("results-*.json")
    assert json.loads(results.read_text())["records"]
    assert (pytester.path / "reports" / "pytest-mig-report.md").read_text().startswith("|")
    assert "PYTEST_MIG_FIGURE" in (pytester.path / "prom" / "pytest-mig.prom").read_text()
    assert output_file("a/", "x.json", "--o") == Path("a/x.json")


# 6. a test stopped by SIGTERM is never saved into the history ----------------------------------------


STOPPED_MIDWAY = '''
import os
import signal

from pytest_mig.measure import Metric


def test_first(mig_bench):
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0] * 3, kind="compute"))


def test_second(mig_bench):
    mig_bench.record(Metric("partial", 50.0, "items/s", "higher", [50.0] * 3, kind="compute"))
    os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's time limit, after a figure, before the test's end
    assert False, "never reached"
'''


def test_sigterm_during_a_test_saves_only_the_tests_that_finished_and_passed(
        h200_stop: None, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_stop=STOPPED_MIDWAY)
    result = pytester.runpytest("test_stop.py", "--mig-profile", "full", *QUIET, "--mig-results", "night.json",
                                "--mig-save-baseline", no_reraise_ctrlc=True)
    doc = json.loads(baseline_path(pytester).read_text())
    saved = {(t.split("::")[-1], m) for tests in doc["modes"].values() for t, ms in tests.items() for m in ms}
    assert saved == {("test_first", "rate")}  # test_second's figure was taken before it was stopped: not saved
    result.stdout.fnmatch_lines(["*the figures of 1 test(s) that failed or did not finish were not saved: "
                                 "test_stop.py::test_second*"])


# 7. a history folder that cannot be written is said once, truly, at start-up ---------------------------


@pytest.mark.skipif(ROOT_CAN_WRITE_ANYWHERE, reason="root writes into read-only folders")
def test_a_read_only_model_folder_is_one_true_sentence_at_start_up(h200: Run, pytester: pytest.Pytester,
                                                                  mig_env: pytest.MonkeyPatch) -> None:
    _history(h200, mig_env, [100.0])
    path = baseline_path(pytester)
    before = path.read_bytes()
    path.parent.chmod(0o555)
    try:
        result = h200("--mig-save-baseline")
    finally:
        path.parent.chmod(0o755)
    assert result.ret == pytest.ExitCode.USAGE_ERROR and path.read_bytes() == before
    assert "is not writable by this user" in result.stderr.str()
    assert "added to the baseline" not in result.stdout.str()


def test_a_failed_save_never_says_the_run_was_added(h200: Run, pytester: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever stops a save after the run (here a disk that fills up), the summary says one thing,
    the true one."""
    def full_disk(self: BaselineStore, records: Any, **kwargs: Any) -> Any:
        raise BaselineError("baselines/nvidia-h200/full.json: not saved, the file could not be written "
                            "(No space left on device); it is as it was before this save")

    monkeypatch.setattr(BaselineStore, "save", full_disk)
    result = h200("--mig-save-baseline")
    out = result.stdout.str()
    assert "this run was added to the baseline" not in out
    assert "this run was not added to the baseline" in out and "No space left on device" in out


def test_an_unwritable_model_folder_is_refused_at_start_up_even_for_root(
        h200: Run, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    """The same sentence where the check cannot be made real (CI runs as root, who writes anywhere): the
    folder is reported unwritable by os.access, as it is to any other user."""
    _history(h200, mig_env, [100.0])
    path = baseline_path(pytester)
    before = path.read_bytes()
    real_access = os.access
    mig_env.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == path.parent else real_access(p, mode))
    result = h200("--mig-save-baseline")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and path.read_bytes() == before
    result.stderr.fnmatch_lines([f"ERROR: {path}: the folder {path.parent} is not writable by this user, so this run "
                                 f"could not be added to the history; nothing is saved"])
    assert "added to the baseline" not in result.stdout.str()
