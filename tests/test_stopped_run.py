"""A run stopped partway keeps what it measured: the results file is written after every test that
recorded figures (what SIGKILL leaves), and SIGTERM, as a scheduler's time limit sends it, stops the
run as Ctrl-C does, with the file marked incomplete.  Real pytest runs on the fake H200, as in
test_verdict_flow.py; the signal is real, sent by the test to its own process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import fake_pynvml
import pytest
from test_verdict_flow import BENCH, QUIET

from pytest_mig.store import checkpoint
from pytest_mig.workloads import ddp

STOPPED = '''
import os
import shutil
import signal

from pytest_mig.measure import Metric


def test_first(mig_bench):
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0] * 3, kind="compute"))


def test_second(mig_bench):
    shutil.copy("night.json", "after_first.json")  # what a SIGKILL here would leave
    os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's time limit
    mig_bench.record(Metric("never", 1.0, "items/s", "higher", [1.0] * 3, kind="compute"))


def test_third(mig_bench):
    mig_bench.record(Metric("never_either", 1.0, "items/s", "higher", [1.0] * 3, kind="compute"))
'''


@pytest.fixture
def h200(mig_env: pytest.MonkeyPatch, stand_in_cuda: Callable[..., None], cuda_props_of: Callable[..., Any]) -> None:
    """The fake H200 of test_verdict_flow.py (NVML from a real H200's data, CUDA's answer stood in for)."""
    fake_pynvml.install(mig_env, "h200-mig-off")
    stand_in_cuda(cuda_props_of("h200-mig-off"))
    mig_env.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def run_stopped(pytester: pytest.Pytester, *options: str) -> pytest.RunResult:
    pytester.makepyfile(test_stop=STOPPED)
    return pytester.runpytest("test_stop.py", "--mig-profile", "full", *QUIET, "--mig-results", "night.json",
                              *options, no_reraise_ctrlc=True)


def figures(path: Path) -> tuple[list[str], dict[str, Any]]:
    doc = json.loads(path.read_text())
    return [r["metric"]["name"] for r in doc["records"]], doc["meta"]


def test_sigterm_stops_the_run_and_keeps_the_finished_tests_figures(h200: None, pytester: pytest.Pytester) -> None:
    result = run_stopped(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    names, meta = figures(pytester.path / "after_first.json")  # written after the first test, before the end
    assert names == ["rate"] and meta["complete"] is False and "stopped" not in meta
    names, meta = figures(pytester.path / "night.json")
    assert names == ["rate"] and meta["complete"] is False and meta["stopped"] == "SIGTERM"
    assert meta["target"]["gpu_name"] == "NVIDIA H200"
    result.stdout.fnmatch_lines(["*stopped (SIGTERM: a time limit or a cancelled job): the figures of the 1 test(s) "
                                 "that finished are kept, marked incomplete",
                                 "results: *night.json"])
    assert result.parseoutcomes() == {"passed": 1}  # the second test was stopped and the third never ran
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back at the session's end


def test_a_stopped_run_is_not_learned_by_save_if_passed(h200: None, pytester: pytest.Pytester) -> None:
    result = run_stopped(pytester, "--mig-save-if-passed")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["baseline: this run failed, so it was not added to the history*"])
    assert not (pytester.path / "baselines").exists()


def test_a_finished_run_is_marked_complete(h200: None, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH)
    pytester.runpytest("--mig-profile", "full", *QUIET, "--mig-results", "whole.json").assert_outcomes(passed=1)
    _, meta = figures(pytester.path / "whole.json")
    assert meta["complete"] is True and "stopped" not in meta


def test_a_handler_the_site_set_is_left_alone() -> None:
    def sites(signum: int, frame: Any) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, sites)
    try:
        stop = checkpoint.stop_on_sigterm()
        assert not stop.installed and signal.getsignal(signal.SIGTERM) is sites
        stop.restore()
        assert signal.getsignal(signal.SIGTERM) is sites
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_only_the_first_sigterm_stops_a_second_at_once_does_not_break_off_the_stopping() -> None:
    stop = checkpoint.SigtermStop()
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        stop._handler(signal.SIGTERM, None)
    stop._handler(signal.SIGTERM, None)  # Slurm's and a wrapper's: ignored while the results are written
    assert stop.received and stop.hold()


def test_a_sigterm_while_the_files_are_written_interrupts_nothing_and_stops_no_run() -> None:
    stop = checkpoint.SigtermStop()
    assert stop.hold() is False  # every test ended
    stop._handler(signal.SIGTERM, None)  # no KeyboardInterrupt inside the baseline save
    assert not stop.received  # the run was whole: its file is complete


def test_a_results_file_that_cannot_be_written_is_tried_once_as_the_run_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_verdict import record

    from pytest_mig.store.results import ResultsFileError

    tries = []

    def full_disk(path: Path, records: Any, meta: Any) -> None:
        tries.append(len(records))
        raise ResultsFileError(f"{path}: results not written (No space left on device)")

    monkeypatch.setattr(checkpoint, "write_results", full_disk)
    cp = checkpoint.Checkpoint(tmp_path / "night.json")
    cp.update([record(100.0)], {})
    cp.update([record(100.0), record(101.0)], {})  # not tried again after every test
    assert cp.failed and cp.written == 0 and tries == [1]
    with pytest.raises(ResultsFileError, match="No space left on device"):  # the session's end says it
        cp.finish([record(100.0)], {}, None)


def test_ddp_ranks_do_not_outlive_a_stopped_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen(cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:  # each rank sleeps, as a slow rank would
        started.append(real([sys.executable, "-c", "import time; time.sleep(60)"], **kw))
        return started[-1]

    monkeypatch.setattr(ddp.subprocess, "Popen", popen)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            ddp.run_count(["GPU-a", "GPU-b"], quick=True, folder=tmp_path)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(started) == 2 and all(p.poll() is not None for p in started)


NODE_BENCH = '''
import os
import signal
import time
from pathlib import Path

from pytest_mig.measure import Metric


def test_rate(mig_bench, pytestconfig):
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [100.0] * 3, kind="compute"))
    Path(f"done-{pytestconfig.getoption('mig_node_worker')}").write_text("")


def test_long(mig_bench, pytestconfig):
    if pytestconfig.getoption("mig_node_worker") == 0:  # Kubernetes: SIGTERM to the container's first process only
        while len(list(Path().glob("done-*"))) < 7:
            time.sleep(0.1)
        os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(120)  # every worker is still measuring when the runner is stopped
    mig_bench.record(Metric("never", 1.0, "items/s", "higher", [1.0] * 3, kind="compute"))
'''


def test_a_stopped_node_run_stops_every_worker_and_merges_what_they_measured(
        pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    from test_node import CONFTEST, SLOW_PLUGINS

    fake_pynvml.install_subprocess(mig_env, "h100-mig")
    mig_env.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_bench=NODE_BENCH)
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-profile", "1g.10gb", "--mig-device", "all",
                                           "--mig-results", "node.json", timeout=100)
    out = result.stdout.str()
    assert result.ret == 2, out
    assert "pytest-mig node: stopped (SIGTERM): every worker was asked to stop" in out
    assert out.count(": stopped (1 figures") == 7  # every worker kept its finished test's figure
    doc = json.loads((pytester.path / "node.json").read_text())
    assert [r["metric"]["name"] for r in doc["records"]] == ["rate"] * 7
    assert doc["meta"]["complete"] is False and doc["meta"]["stopped"] == "SIGTERM"


# --------------------------------------------------------------------------- SIGTERM at any instant

SWEEP_TEST = '''
import os
import time
from pathlib import Path

from pytest_mig.measure import Metric


def test_first(mig_bench):
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0] * 3, kind="compute"))
    Path("started").write_text("")  # the handler is installed: the parent times its SIGTERM from here


def test_second(mig_bench):
    time.sleep(0.05)
    mig_bench.record(Metric("rate2", 100.0, "items/s", "higher", [99.0, 100.0, 101.0] * 3, kind="compute"))
'''
SLOW_JUDGE = '''
import time

from pytest_mig.judge.pipeline import Pipeline

_judge = Pipeline.judge


def slow(self, *args, **kwargs):  # a judge that takes a while, so that SIGTERMs land inside it
    time.sleep(0.1)
    return _judge(self, *args, **kwargs)


Pipeline.judge = slow
'''
#: A parent that imports pytest, torch and the plugin once (what the plugin imports lazily, the
#: report and pandas, stays lazy) and forks one pytest run per delay, each sent SIGTERM that long
#: after its first test recorded a figure (a negative delay: at once, before any test).
SWEEP = '''
import json, os, signal, sys, time
from pathlib import Path

import pytest
import pytest_benchmark.plugin  # noqa: F401
import pytest_mig.plugin  # noqa: F401
import torch  # noqa: F401

assert "pandas" not in sys.modules and "pytest_mig.report.tables" not in sys.modules
t0 = time.monotonic()
root, delays = Path(sys.argv[1]), [float(d) for d in sys.argv[2].split(",")]
args = ["test_s.py", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-W",
        "ignore::pytest_benchmark.logger.PytestBenchmarkWarning", "--mig-results", "night.json"]
runs = []
for i, delay in enumerate(delays):
    folder = root / f"run{i}"
    folder.mkdir()
    for name in ("test_s.py", "conftest.py"):
        (folder / name).write_text((root / name).read_text())
    pid = os.fork()
    if pid == 0:
        os.chdir(folder)
        out = os.open("out.txt", os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        try:
            code = int(pytest.main(args))
        except BaseException:  # as python -m pytest would show it
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    start = time.monotonic()
    if delay >= 0:
        while not (folder / "started").exists() and time.monotonic() - start < 60:
            time.sleep(0.002)
    time.sleep(abs(delay))
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    runs.append({"delay": delay, "folder": str(folder), "code": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]),
                 "at": time.monotonic() - t0})
print(json.dumps(runs))
'''


def test_a_sigterm_at_any_instant_stops_the_run_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    """From the first figure to the terminal summary, 12 instants (the judging, the checkpoint, the
    session's end among them): each run exits 2 with its file marked stopped, or, where the SIGTERM
    came after the last test, finishes whole; none with a traceback.  Before the first benchmark
    SIGTERM keeps its default action."""
    from pytest_mig.store.results import read_results_file

    (tmp_path / "test_s.py").write_text(SWEEP_TEST)
    (tmp_path / "conftest.py").write_text(SLOW_JUDGE)
    (tmp_path / "sweep.py").write_text(SWEEP)
    delays = [-0.05] + [round(0.04 * i, 3) for i in range(12)]
    env = fake_pynvml.subprocess_env("no-gpu")
    done = subprocess.run([sys.executable, str(tmp_path / "sweep.py"), str(tmp_path), ",".join(map(str, delays))],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    codes = []
    for run in runs:
        folder = Path(run["folder"])
        out = (folder / "out.txt").read_text()
        codes.append(run["code"])
        assert "Traceback" not in out and "INTERNALERROR" not in out, (run, out)
        if run["delay"] < 0:  # no benchmark yet: SIGTERM's default action, nothing written
            assert run["code"] == -signal.SIGTERM and not (folder / "night.json").exists(), run
            continue
        records, meta = read_results_file(folder / "night.json")  # valid whatever the instant
        if run["code"] == pytest.ExitCode.INTERRUPTED:
            assert meta["complete"] is False and meta["stopped"] == "SIGTERM", (run, meta)
            assert "stopped (SIGTERM: a time limit or a cancelled job)" in out, (run, out)
        else:  # after the last test: the run ends whole (0), or after the session's end, SIGTERM's own action
            assert run["code"] in (0, -signal.SIGTERM), (run, out)
            assert meta["complete"] is True and "stopped" not in meta and len(records) == 2, (run, meta)
    assert codes.count(pytest.ExitCode.INTERRUPTED) >= 3, codes  # the sweep did stop runs midway


def test_a_sigterm_during_a_deferred_step_stops_the_run_at_its_end() -> None:
    stop = checkpoint.SigtermStop()
    steps = []
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"), stop.deferred():
        stop._handler(signal.SIGTERM, None)  # the judging is under way: it is not cut in half
        steps.append("judged")
        with stop.deferred():  # a step inside it raises nothing either
            stop._handler(signal.SIGTERM, None)
        steps.append("inner step ended")
    assert steps == ["judged", "inner step ended"] and stop.received and not stop.pending
    late = checkpoint.SigtermStop()
    with late.deferred():
        late._handler(signal.SIGTERM, None)
        late.hold()  # the session's end began: the pending SIGTERM no longer interrupts
    assert late.hold() is True  # but the run was stopped: its file is marked so
