"""--mig-layout: layouts named and resolved on each GPU's own profiles, checked against the instances
the fake NVML shows, run end to end (alone, then together), the layout figures, and the CUDA MPS
daemon of an emulated layout stopped when the run is stopped midway."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import fake_pynvml
import pytest
import topologies as topo

from pytest_mig.device import nvml
from pytest_mig.device.layout import mps_percentage, parse_layouts, resolve, sms_check
from pytest_mig.device.profiles import CATALOG
from pytest_mig.device.target import SelectionError, TargetInfo
from pytest_mig.measure import Metric
from pytest_mig.night.layout import plan_layouts
from pytest_mig.report.layouts import derived_records, layout_figures, layout_lines
from pytest_mig.store.results import ResultRecord, read_results

#: Columbia/IBM's five layouts on the A100-40GB, as the seed names them, and 1g on all seven slices.
PAPER_A100_40GB = ["7g.40gb", "4g.20gb+3g.20gb", "4g.20gb+2g.10gb+1g.10gb", "3g.20gb+2g.10gbx2",
                   "2g.10gbx3+1g.10gb", "1g.5gbx7"]


def _model(key: str) -> Any:
    return next(m for m in CATALOG if m.key == key)


def _preset(name: str, key: str) -> list[str]:
    m = _model(key)
    return [resolve(a, items, m.profiles, key).name for a, items in parse_layouts(name)]


def test_the_paper_preset_is_the_papers_layouts_on_the_a100_40gb_and_each_gpus_own_profiles():
    assert _preset("paper", "A100-SXM4-40GB") == PAPER_A100_40GB
    h100 = _preset("paper", "H100-SXM5-80GB")
    assert h100[0] == "7g.80gb" and h100[1] == "4g.40gb+3g.40gb" and h100[-1] == "1g.10gbx7"
    assert _preset("paper", "H200-141GB")[-1] == "1g.18gbx7"
    assert _preset("wulver", "A100-80GB") == ["1g.10gbx3", "3g.40gb"]


@pytest.mark.parametrize(("text", "sentence"), [
    ("4g.40gb+banana", "'banana' is not a slice"),
    ("4g+4g", "does not fit H100-SXM5-80GB: 8 compute slices of 7"),
    ("3g.40gbx3", "9 compute slices of 7; 12 memory slices of 8; 3g.40gb x3 (at most 2)"),
    ("5g", "H100-SXM5-80GB has no 5g profile"),
])
def test_a_layout_that_is_not_one_is_one_sentence(text, sentence):
    with pytest.raises(Exception, match=None) as exc:
        _preset(text, "H100-SXM5-80GB")
    assert sentence in str(exc.value) and str(exc.value).count(". ") == 0


def test_a_media_engine_profile_is_one_slice():
    assert parse_layouts("1g.10gb+me+3g.40gb") == [("1g.10gb+me+3g.40gb", ["1g.10gb+me", "3g.40gb"])]


def test_the_mps_share_never_loses_a_tpc_to_rounding():
    for sms, total in ((16, 132), (32, 132), (60, 132), (64, 132), (14, 108), (42, 108)):
        pct = mps_percentage(sms, total)
        assert pct * total / 100 >= sms and (pct - 0.01) * total / 100 < sms
    assert mps_percentage(132, 132) == 100.0


def test_a_worker_that_gets_other_sms_says_so():
    assert sms_check("3g.40gb", 60, {"sms": 60})[1] == "MPS client: 60 SMs obtained, as 3g.40gb has"
    got, line = sms_check("3g.40gb", 60, {"sms": 58})
    assert got == 58 and line == "MPS gave this worker 58 SMs where 3g.40gb has 60: its figures are of 58 SMs"
    assert sms_check("3g.40gb", 60, {"error": "libcuda is not loadable"})[0] is None


# --------------------------------------------------------------------------- MIG on: the instances must exist


def _plan(monkeypatch, topology, text, emulate=False):
    fake_pynvml.install(monkeypatch, topology)
    return plan_layouts(nvml.discover(), text, emulate, None)


def test_layouts_of_the_instances_there_are_accepted(monkeypatch):
    (a100,) = _plan(monkeypatch, "a100-80gb-mixed", "3g+2g+1gx2")  # Wulver's GPU 0
    assert a100.layout.name == "3g.40gb+2g.20gb+1g.10gbx2" and a100.gpu.index == 0
    assert a100.instances == [topo.A100_80_3G, topo.A100_80_2G, topo.A100_80_1G_A, topo.A100_80_1G_B]
    (h100,) = _plan(monkeypatch, "h100-mig", "1g.10gbx7")
    assert h100.instances == list(topo.H100_1G)
    (a40,) = _plan(monkeypatch, "a100-40gb-mixed", "3g.20gb+2g.10gb+1g.5gbx2")
    assert a40.layout.profiles == ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")


def test_a_layout_that_is_not_there_names_what_is_missing_and_extra(monkeypatch):
    with pytest.raises(SelectionError) as exc:
        _plan(monkeypatch, "h100-mig", "4g.40gb+3g.40gb")
    assert str(exc.value).startswith("--mig-layout 4g.40gb+3g.40gb: the instances of GPU 0 (NVIDIA H100 80GB HBM3, "
                                     "MIG on) are not this layout (missing 3g.40gb x1, 4g.40gb x1; extra 1g.10gb x7)")
    assert "never creates or destroys instances" in str(exc.value)


def test_mig_off_needs_emulation_and_emulation_needs_mig_off(monkeypatch):
    with pytest.raises(SelectionError, match="has MIG mode off, so there are no instances.*add --mig-emulate"):
        _plan(monkeypatch, "h200-mig-off", "paper")
    with pytest.raises(SelectionError, match="needs a GPU with MIG mode off"):
        _plan(monkeypatch, "h100-mig", "paper", emulate=True)
    plans = _plan(monkeypatch, "h200-mig-off", "paper", emulate=True)
    assert [p.layout.name for p in plans][:2] == ["7g.141gb", "4g.71gb+3g.71gb"] and not plans[0].instances


# --------------------------------------------------------------------------- the figures


def _rec(layout, phase, slot, profile, name, value, unit="items/s", kind="compute", direction="higher"):
    t = TargetInfo(kind="emulated", profile=profile, gpu_name="NVIDIA H200", emulated=True, uuid=topo.H200_GPU0,
                   board={"gpu_uuid": topo.H200_GPU0},
                   extra={"layout": layout, "layout_phase": phase, "layout_slot": slot})
    return ResultRecord("t.py::test_x", Metric(name, value, unit, direction, [value], kind=kind), t, {})


def test_provider_energy_and_isolation_against_the_whole_gpu():
    recs = [_rec("7g.141gb", "together", 0, "7g.141gb", "rate", 100.0),
            _rec("7g.141gb", "together", 0, "7g.141gb", "power_w", 500.0, "W", "info"),
            _rec("7g.141gb", "together", 0, "7g.141gb", "energy_j_per_item", 5.0, "J/item", "energy", "lower")]
    for slot, profile, alone, together in ((0, "4g.71gb", 70.0, 63.0), (1, "3g.71gb", 60.0, 54.0)):
        recs += [_rec("4g.71gb+3g.71gb", "alone", slot, profile, "rate", alone),
                 _rec("4g.71gb+3g.71gb", "together", slot, profile, "rate", together),
                 _rec("4g.71gb+3g.71gb", "together", slot, profile, "power_w", 585.0, "W", "info"),
                 _rec("4g.71gb+3g.71gb", "together", slot, profile, "energy_j_per_item", 585.0 / together,
                      "J/item", "energy", "lower")]
    figs = {f.layout: f for f in layout_figures(recs)}
    split = figs["4g.71gb+3g.71gb"]
    assert split.total == 117.0 and split.vs_whole == pytest.approx(1.17)
    assert split.energy == pytest.approx(5.0) and split.energy_vs_whole == pytest.approx(1.0)
    assert [s.isolation_pct for s in split.slices] == [pytest.approx(90.0), pytest.approx(90.0)]
    derived = {r.metric.name: r for r in derived_records(list(figs.values()), recs) if r.target.profile == split.layout}
    assert set(derived) == {"rate_provider", "rate_provider_vs_whole", "energy_j_per_item_provider",
                            "energy_j_per_item_provider_vs_whole", "rate_isolation_slot0", "rate_isolation_slot1"}
    assert derived["rate_isolation_slot1"].metric.value == pytest.approx(90.0)
    assert derived["rate_provider"].target.history_profile == "layout-4g.71gb+3g.71gb-emulated"


def test_a_figure_not_every_slice_gave_has_no_provider_total():
    recs = [_rec("7g.141gb", "together", 0, "7g.141gb", "rate", 100.0),
            _rec("4g.71gb+3g.71gb", "alone", 0, "4g.71gb", "rate", 70.0),
            _rec("4g.71gb+3g.71gb", "together", 0, "4g.71gb", "rate", 63.0)]  # the 3g slice's test failed
    split = next(f for f in layout_figures(recs) if f.layout == "4g.71gb+3g.71gb")
    assert (split.expected, split.complete) == (2, False)
    derived = [r.metric.name for r in derived_records([split], recs)]
    assert derived == ["rate_isolation_slot0"]  # the slice's isolation stands; no provider total of one slice
    assert layout_lines([split]) == ["4g.71gb+3g.71gb (emulated: MPS shares memory bandwidth and L2, MIG does not): "
                                     "test_x rate: only 1 of the 2 slices gave it, so no provider figure; slices: "
                                     "4g.71gb 63.00 (90.0% of alone)"]


# --------------------------------------------------------------------------- end to end, through the fake NVML


H100 = "NVIDIA H100 80GB HBM3"
CONFTEST = (
    "import pytest_mig.device.target as target\n\n"
    f"target.cuda_props = lambda: target.CudaProps('{H100} MIG 1g.10gb', 16, 9984 * 2**20, (9, 0))\n"
)
BENCH = '''
from pytest_mig.measure import Metric


def test_rate(mig_bench, pytestconfig):
    rate = 80.0 if "/together/" in pytestconfig.getoption("mig_layout_slot") else 100.0
    mig_bench.record(Metric("rate", rate, "items/s", "higher", [rate] * 3, kind="compute"))
'''
SLOW_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                "-W", "ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


def two_1g_h100() -> topo.Topology:
    base = topo.get_topology("h100-mig")
    return replace(base, gpus=(replace(base.gpus[0], instances=base.gpus[0].instances[:2]),))


def _two_slices(pytester, mig_env, bench: str) -> None:
    """Two 1g.10gb instances of an H100 behind the fake NVML, and ``bench`` as the tests to run."""
    fake_pynvml.install_subprocess(mig_env, two_1g_h100(), json_path=pytester.path / "topology.json")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_bench=bench)


def test_a_layout_runs_each_slice_alone_then_together_and_judges_its_figures(pytester, mig_env):
    _two_slices(pytester, mig_env, BENCH)
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-layout", "1gx2", "--mig-results", "layout.json")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert out.count("1g.10gbx2 on GPU 0, alone: 1g.10gb") == 2 and "1g.10gbx2 on GPU 0, together: 1g.10gb, 1g.10gb" in out
    assert "1g.10gbx2: test_rate rate 160.0 items/s together; slices: 1g.10gb 80.00 (80.0% of alone), " \
           "1g.10gb 80.00 (80.0% of alone)" in out
    records = read_results(pytester.path / "layout.json")
    together = [r for r in records if r.target.extra.get("layout_phase") == "together"]
    assert sorted(r.target.uuid for r in together) == sorted(topo.H100_1G[:2])
    assert {r.target.history_profile for r in together} == {"1g.10gb@1g.10gbx2.together"}
    derived = {r.metric.name: r.metric.value for r in records if r.target.profile == "1g.10gbx2"}
    assert derived == {"rate_provider": 160.0, "rate_isolation_slot0": 80.0, "rate_isolation_slot1": 80.0}


STAGGERED = '''
import time
from pathlib import Path

from pytest_mig.measure import Metric


def _begin(config, name):
    slot = config.getoption("mig_layout_slot")
    Path(slot.replace("/", "-") + "-" + name).write_text(repr(time.time()))
    return slot


def test_a(mig_bench, pytestconfig):
    slot = _begin(pytestconfig, "a")
    if slot.endswith("/together/1/mig"):
        time.sleep(1.5)  # the second slice is slower at the first test
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [100.0] * 3, kind="compute"))


def test_b(mig_bench, pytestconfig):
    _begin(pytestconfig, "b")
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [100.0] * 3, kind="compute"))
'''


def test_the_slices_of_a_layout_begin_each_test_together(pytester, mig_env):
    _two_slices(pytester, mig_env, STAGGERED)
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-layout", "1gx2", "--mig-results", "layout.json")
    assert result.ret == 0, result.stdout.str()
    began = {p.name: float(p.read_text()) for p in pytester.path.glob("1g.10gbx2-together-*")}
    assert len(began) == 4, sorted(began)
    # slot 1 spent 1.5 s more in test_a; slot 0 waited for it, so both began test_b together
    assert abs(began["1g.10gbx2-together-0-mig-b"] - began["1g.10gbx2-together-1-mig-b"]) < 0.5
    assert abs(began["1g.10gbx2-together-0-mig-a"] - began["1g.10gbx2-together-1-mig-a"]) < 0.5
    logs = "".join(p.read_text() for p in Path(_worker_folder(result.stdout.str())).glob("device*.log"))
    assert logs.count("layout barrier: each test and each timed call began with the other slices'") == 2


PACED = '''
import time
from pathlib import Path

from pytest_mig.measure import Metric


def test_a(mig_bench, pytestconfig):
    slot = pytestconfig.getoption("mig_layout_slot")
    slow = slot.endswith("/together/1/mig")
    if slow:
        time.sleep(1.0)  # the second slice's set-up is slower
    calls = []

    def work():
        calls.append(time.time())
        time.sleep(0.3 if slow else 0.01)  # and so is its work

    mig_bench.timer.device = "cpu"  # the fake NVML's slices have no CUDA: time on the host's clock
    mig_bench.time(work, warmup=0, repeats=3, energy=False)
    name = slot.replace("/", "-")
    Path(name).write_text(repr([calls[0], calls[-1], len(calls)]))
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [100.0] * 3, kind="compute"))
'''


def test_the_slices_time_together_and_a_faster_one_keeps_working_until_the_others_have_timed(pytester, mig_env):
    _two_slices(pytester, mig_env, PACED)
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-layout", "1gx2", "--mig-results", "layout.json")
    assert result.ret == 0, result.stdout.str()
    fast = _written(pytester.path / "1g.10gbx2-together-0-mig")
    slow = _written(pytester.path / "1g.10gbx2-together-1-mig")
    assert abs(fast[0] - slow[0]) < 0.5  # the fast slice's timing waited for the slow one's 1 s set-up
    assert fast[1] >= slow[1] and fast[2] > 10  # and it worked on, untimed, until the slow one had timed
    alone = _written(pytester.path / "1g.10gbx2-alone-0-mig")
    assert alone[2] <= 4  # alone (its pytest-benchmark round included), nobody to keep pace with
    logs = "".join(p.read_text() for p in Path(_worker_folder(result.stdout.str())).glob("device*.log"))
    assert "while slower slices timed theirs" in logs


def _written(path: Path) -> list[float]:
    """A worker's [first call, last call, calls] as it wrote them (JSON numbers)."""
    return json.loads(path.read_text())


DIPS = '''
from pathlib import Path

from pytest_mig.measure import Metric


def test_rate(mig_bench, pytestconfig):
    counter = Path(pytestconfig.getoption("mig_layout_slot").replace("/", "-") + ".calls")
    calls = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(calls + 1))
    rate = 70.0 if Path("dip").exists() and calls == 0 else 100.0  # the first measurement only
    mig_bench.record(Metric("rate", rate, "items/s", "higher", [rate] * 3, kind="compute"))
'''


def test_together_a_slice_does_not_re_measure_without_its_neighbours(pytester, mig_env):
    _two_slices(pytester, mig_env, DIPS)
    args = (*SLOW_PLUGINS, "--mig-layout", "1gx2", "--mig-baseline-dir", "bl", "--mig-save-baseline")
    assert pytester.runpytest_subprocess(*args).ret == 0
    for f in pytester.path.glob("*.calls"):
        f.unlink()
    (pytester.path / "dip").write_text("")
    result = pytester.runpytest_subprocess(*args[:-1])
    assert result.ret != 0
    logs = {p.name: p.read_text() for p in Path(_worker_folder(result.stdout.str())).glob("device*.log")}
    calls = {f.name: int(f.read_text()) for f in pytester.path.glob("*.calls")}
    # alone, the dip was re-measured (twice) and cleared; together, the others had gone on: not re-measured
    assert calls == {"1g.10gbx2-alone-0-mig.calls": 3, "1g.10gbx2-alone-1-mig.calls": 3,
                     "1g.10gbx2-together-0-mig.calls": 1, "1g.10gbx2-together-1-mig.calls": 1}, calls
    assert sum("regressed" in t for t in logs.values()) == 2, sorted(logs)


def _worker_folder(out: str) -> str:
    return out.split("the workers' logs are in ")[1].split()[0]


def test_a_layout_that_is_not_there_is_refused_at_start_up(pytester, mig_env):
    fake_pynvml.install_subprocess(mig_env, "h100-mig")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-layout", "4g.40gb+3g.40gb")
    assert result.ret == 4
    err = [line for line in result.stderr.lines if line.strip()]
    assert len(err) == 1 and err[0].startswith("ERROR: --mig-layout 4g.40gb+3g.40gb: the instances of GPU 0")
    assert "Traceback" not in result.stderr.str()


STAND_IN = """#!/bin/sh
# nvidia-cuda-mps-control: -d makes the control pipe and a daemon that lives while it exists; quit removes it
echo "$@" >> "$MPS_CALLS"
if [ "$1" = "-d" ]; then
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  ( while [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; do sleep 0.1; done ) </dev/null >/dev/null 2>&1 &
  echo $! > "$MPS_CALLS.pid"
  exit 0
fi
read cmd; echo "$cmd" >> "$MPS_CALLS"; [ "$cmd" = "quit" ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
"""
SLEEPER = "import time\n\ndef test_long():\n    time.sleep(60)\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()[:1] \
        not in ("Z", "")


def test_an_emulated_layout_stopped_midway_quits_its_mps_daemon(pytester, mig_env):
    fake_pynvml.install_subprocess(mig_env, "h200-mig-off")
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-cuda-mps-control").write_text(STAND_IN)
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    calls = pytester.path / "calls"
    mig_env.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    mig_env.setenv("MPS_CALLS", str(calls))
    mig_env.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    pytester.makepyfile(test_sleep=SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *SLOW_PLUGINS, "--mig-layout", "1g.18gbx2",
                             "--mig-emulate", "--mig-results", "none"], cwd=pytester.path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (calls.exists() and "-d" in calls.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the first worker is running
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 2, out
    assert calls.read_text().splitlines()[0] == "-d" and "quit" in calls.read_text().splitlines()
    assert "CUDA MPS daemon stopped (quit)" in out
    pid = int((pytester.path / "calls.pid").read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)  # no daemon is left


def test_the_mps_client_check_finds_wrong_half_precision_products(monkeypatch):
    from pytest_mig.workloads import gemm

    assert gemm.half_precision_check("cpu", sizes=(64,)) is None
    real = gemm._matmul

    def wrong(a, b, out):  # a product with a quarter of its columns lost, as cuBLAS gave under MPS
        c = real(a, b, out)
        c[:, : c.shape[1] // 4] = 0
        return c

    monkeypatch.setattr(gemm, "_matmul", wrong)
    name, n, err = gemm.half_precision_check("cpu", sizes=(64,))
    assert (name, n) == ("bf16", 64) and err > 0.2


def test_a_wrong_half_precision_product_is_one_sentence_in_the_worker_and_the_layout(monkeypatch):
    from pytest_mig.workloads import gemm

    monkeypatch.setattr(gemm, "half_precision_check", lambda: ("fp16", 2048, 0.217))
    line = gemm.half_precision_problem(60)
    assert line.startswith("cuBLAS gives wrong fp16 matrix products in this MPS client of 60 SMs (relative error "
                           "0.22 at 2048x2048x2048, 1% allowed): the tests that use them fail their own check.")
    monkeypatch.setattr(gemm, "half_precision_check", lambda: None)
    assert gemm.half_precision_problem(64) is None


def test_the_layout_summary_names_each_slice_whose_products_were_wrong_once():
    from pytest_mig.night.layout import slot_problems

    wrong = "cuBLAS gives wrong bf16 matrix products in this MPS client of 60 SMs"
    recs = [_rec("4g.71gb+3g.71gb", phase, 1, "3g.71gb", name, 1.0) for phase in ("alone", "together")
            for name in ("rate", "power_w")]
    recs = [replace(r, target=replace(r.target, extra={**r.target.extra, "layout_slot_problem": wrong})) for r in recs]
    recs.append(_rec("4g.71gb+3g.71gb", "together", 0, "4g.71gb", "rate", 1.0))
    assert slot_problems(recs) == [f"4g.71gb+3g.71gb, 3g.71gb: {wrong}"]
    assert slot_problems(recs[-1:]) == []
