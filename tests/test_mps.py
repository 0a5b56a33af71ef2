"""CUDA MPS for engines with their own CUDA context: the client environment, the search for the thread
percentage that gives a profile's SMs, and the daemon's life (a site's left alone, ours started on
private folders and stopped).  A shell script stands in for nvidia-cuda-mps-control; the real
daemon runs on the GPU (docs/benchmarks.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_mig.device import mps


def test_client_env_adds_the_pipe_the_share_and_the_cap():
    daemon = mps.Mps("/tmp/p", "/tmp/l", owned=True)
    env = daemon.client_env({"PATH": "/bin"}, percentage=13, memory_limit_bytes=int(9.75 * 2**30))
    assert env == {"PATH": "/bin", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/p", "CUDA_MPS_LOG_DIRECTORY": "/tmp/l",
                   "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "13", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=9984M"}
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in daemon.client_env({})


def test_our_daemons_clients_leave_cuda_visible_devices_to_the_daemon():
    # Slurm gave the job its second GPU: our daemon's server sees that GPU alone, as its device 0,
    # and a client that kept "1" would ask the server for a second device it does not have
    ours = mps.Mps("/tmp/p", None, owned=True).client_env({"CUDA_VISIBLE_DEVICES": "1"}, percentage=25)
    assert "CUDA_VISIBLE_DEVICES" not in ours and ours["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    sites = mps.Mps("/tmp/p", None, owned=False).client_env({"CUDA_VISIBLE_DEVICES": "1"})
    assert sites["CUDA_VISIBLE_DEVICES"] == "1"  # a site's daemon: its layout is the site's to know


def test_candidate_percentages_start_at_the_share():
    assert mps.candidate_percentages(16, 132)[:3] == [13.0, 14.0, 12.0]
    assert mps.candidate_percentages(132, 132)[0] == 100.0
    assert all(1.0 <= p <= 100.0 for p in mps.candidate_percentages(1, 132))


def _tpc_probe(total: int, calls: list[str]):
    """A probe that answers as MPS does: the share of SMs rounded down to whole TPCs (2 SMs)."""
    def probe(env):
        pct = float(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
        calls.append(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
        return {"sms": int(pct * total / 100) // 2 * 2, "sms_source": "cuCtxGetDevResource"}
    return probe


def test_percentage_for_finds_the_profiles_sms_and_remembers(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(mps, "probe", _tpc_probe(132, calls))
    daemon = mps.Mps("/tmp/p", None, owned=False)
    pct, report = daemon.percentage_for(16, 132, {})
    assert pct == 13 and report["sms"] == 16 and calls == ["13"]
    pct, _ = daemon.percentage_for(60, 132, {})  # 46% -> 60 SMs
    assert int(pct * 132 / 100) // 2 * 2 == 60
    n = len(calls)
    daemon.percentage_for(16, 132, {})
    assert len(calls) == n  # probed once per SM count


def test_percentage_for_says_what_each_try_gave(monkeypatch):
    monkeypatch.setattr(mps, "probe", lambda env: {"sms": 132})  # a daemon that does not confine
    with pytest.raises(mps.MpsUnavailable, match=r"no MPS thread percentage gave exactly 16 of 132 SMs \(13% -> 132 SMs, "):
        mps.Mps("/tmp/p", None, owned=False).percentage_for(16, 132, {})


def test_a_probe_client_that_cannot_start_is_named_once_with_its_error(monkeypatch):
    monkeypatch.setattr(mps, "probe", lambda env: {"error": "the MPS probe client failed (exit 1): "
                                                            "cuDeviceGet returned 101"})
    with pytest.raises(mps.MpsUnavailable) as info:
        mps.Mps("/tmp/p", None, owned=True).percentage_for(32, 132, {})
    assert str(info.value) == ("the MPS probe client failed at every thread percentage tried: "
                               "the MPS probe client failed (exit 1): cuDeviceGet returned 101")


def test_errors_among_other_tries_are_listed_with_them(monkeypatch):
    answers = iter([{"error": "timed out"}] + [{"sms": 30}] * 10)
    monkeypatch.setattr(mps, "probe", lambda env: next(answers))
    with pytest.raises(mps.MpsUnavailable, match=r"\(25% -> timed out, 26% -> 30 SMs, "):
        mps.Mps("/tmp/p", None, owned=True).percentage_for(32, 132, {})


def test_a_client_on_another_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(mps, "probe", lambda env: {"sms": 16, "uuid": "GPU-bbbb"})
    daemon = mps.Mps("/tmp/p", None, owned=False)
    with pytest.raises(mps.MpsUnavailable, match="the MPS client ran on GPU-bbbb, not on the Target's GPU GPU-aaaa"):
        daemon.percentage_for(16, 132, {}, "GPU-aaaa")
    assert daemon.percentage_for(16, 132, {}, "GPU-bbbb")[1]["uuid"] == "GPU-bbbb"


def test_a_cuuuid_is_written_as_nvml_writes_a_gpu_uuid():
    raw = bytes.fromhex("f24f0055de382b0dc2f32701da2d8e51")
    assert mps.format_uuid(raw) == "GPU-f24f0055-de38-2b0d-c2f3-2701da2d8e51"


def test_a_sites_daemon_is_used_and_left_alone(tmp_path, monkeypatch):
    (tmp_path / "control").write_text("")
    monkeypatch.setattr(mps.shutil, "which", lambda name: pytest.fail("no daemon may be started"))
    daemon = mps.start({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert daemon.pipe_dir == str(tmp_path) and not daemon.owned
    monkeypatch.setattr(mps.subprocess, "run", lambda *a, **k: pytest.fail("a site's daemon is never stopped"))
    daemon.stop()
    assert (tmp_path / "control").exists()


def test_without_the_control_binary_mps_is_unavailable(monkeypatch):
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIRECTORY", "/nonexistent-pytest-mig")
    monkeypatch.setattr(mps.shutil, "which", lambda name: None)
    with pytest.raises(mps.MpsUnavailable, match="needs CUDA MPS, and nvidia-cuda-mps-control is not on PATH"):
        mps.start({})


STAND_IN = """#!/bin/sh
# nvidia-cuda-mps-control: -d makes the control pipe; 'quit' on stdin removes it
echo "$@ pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$MPS_CALLS"
echo "${CUDA_VISIBLE_DEVICES-unset}" >> "$MPS_CALLS.cvd"
if [ "$1" = "-d" ]; then [ -n "$FAIL" ] && { echo "cannot start: $FAIL" >&2; exit 1; }; touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
read cmd; [ "$cmd" = "quit" ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(STAND_IN)
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_CALLS", str(tmp_path / "calls"))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIRECTORY", str(tmp_path / "no-site-daemon"))
    return tmp_path / "calls"


def test_our_daemon_runs_on_private_folders_and_is_stopped(stand_in):
    daemon = mps.start()
    assert daemon.owned and Path(daemon.pipe_dir, "control").exists()
    assert os.path.basename(os.path.dirname(daemon.pipe_dir)).startswith("pytest-mig-mps-")
    root = os.path.dirname(daemon.pipe_dir)
    daemon.stop()
    assert not os.path.exists(root)  # the pipe and log folders are removed
    calls = stand_in.read_text().splitlines()
    assert calls[0] == f"-d pipe={daemon.pipe_dir} log={daemon.log_dir}"
    assert calls[1].startswith(f" pipe={daemon.pipe_dir}")  # quit went to our daemon's pipe
    daemon.stop()  # a second stop does nothing
    assert len(stand_in.read_text().splitlines()) == 2


def test_our_daemon_serves_the_jobs_gpu(stand_in):
    daemon = mps.start({**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-d69698fb"})
    daemon.stop()
    assert Path(f"{stand_in}.cvd").read_text().splitlines()[0] == "GPU-d69698fb"


def test_a_daemon_that_does_not_start_says_why(stand_in, monkeypatch):
    monkeypatch.setenv("FAIL", "MPS is not supported on this GPU")
    with pytest.raises(mps.MpsUnavailable, match=r"did not start \(exit 1: cannot start: MPS is not supported"):
        mps.start()


def test_shared_daemon_is_started_once_and_shut_down(stand_in, monkeypatch):
    monkeypatch.setattr(mps, "_SHARED", None)
    first = mps.shared()
    assert mps.shared() is first
    mps.shutdown()
    assert not Path(first.pipe_dir, "control").exists() and mps._SHARED is None


def test_confine_sets_the_share_found_and_the_cap(monkeypatch):
    monkeypatch.setattr(mps, "shared", lambda: mps.Mps("/tmp/p", None, owned=True))
    monkeypatch.setattr(mps, "probe", _tpc_probe(132, []))
    env, record = mps.confine(16, 132, 10 * 2**30, {"A": "1"})
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "13" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert record["probe"]["sms"] == 16 and record["daemon"] == "started by pytest-mig"
    with pytest.raises(mps.MpsUnavailable, match="SM count"):
        mps.confine(None, 132, 1, {})


def test_an_engine_is_confined_on_the_targets_own_board(monkeypatch):
    from pytest_mig.device.target import Target

    asked = []
    monkeypatch.setattr(mps, "confine", lambda *a: asked.append(a) or ({}, {}))
    target = Target(kind="emulated", profile="1g.18gb", chosen_by="emulation", gpu_name="NVIDIA H200",
                    uuid="GPU-d69698fb", sms=16, memory_bytes=2**30, board={"gpu_uuid": "GPU-d69698fb"})
    mps.confine_engine(target, {}, "OpenMM")
    assert asked[0][-1] == "GPU-d69698fb"


def test_probe_client_reports_an_error_without_a_driver():
    report = mps.probe(dict(os.environ, LD_LIBRARY_PATH="/nonexistent"))
    if "sms" in report:
        pytest.skip("this machine has a CUDA driver")
    assert "error" in report
    assert mps.main(["bogus"]) == 2


class _FakeDriver:
    """libcuda's two calls that current_context_sms makes, writing through ctypes.byref as the driver does."""

    def __init__(self, ctx: int, sms: int, rc: int = 0) -> None:
        self.ctx, self.sms, self.rc, self.asked = ctx, sms, rc, []

    def cuCtxGetCurrent(self, ref):  # noqa: N802 - the driver's name
        ref._obj.value = self.ctx
        return 0

    def cuCtxGetDevResource(self, ctx, ref, kind):  # noqa: N802
        self.asked.append((ctx.value, kind.value))
        ref._obj.sm_count = self.sms
        return self.rc


def test_current_context_sms_reads_the_current_contexts_sm_resource(monkeypatch):
    driver = _FakeDriver(ctx=0x1234, sms=16)
    monkeypatch.setattr(mps, "_libcuda", lambda: driver)
    assert mps.current_context_sms() == 16
    assert driver.asked == [(0x1234, 1)]  # CU_DEV_RESOURCE_TYPE_SM of that context


@pytest.mark.parametrize("driver", [None, _FakeDriver(ctx=0, sms=16), _FakeDriver(ctx=0x1234, sms=16, rc=801)],
                         ids=["no-libcuda", "no-current-context", "driver-cannot-say"])
def test_current_context_sms_is_none_where_the_driver_cannot_tell(monkeypatch, driver):
    monkeypatch.setattr(mps, "_libcuda", lambda: driver)
    assert mps.current_context_sms() is None


def test_emulation_reads_back_through_the_driver_before_observing(monkeypatch):
    from pytest_mig.device import emulation

    monkeypatch.setattr(emulation, "current_context_sms", lambda: 32)
    monkeypatch.setattr(emulation, "_sms_observed", lambda: pytest.fail("observed although the driver answered"))
    assert emulation.read_back_sms() == (32, "driver (cuCtxGetDevResource)")
    monkeypatch.setattr(emulation, "current_context_sms", lambda: None)
    monkeypatch.setattr(emulation, "_sms_observed", lambda: 30)
    assert emulation.read_back_sms() == (30, "observed (%smid of running blocks)")
