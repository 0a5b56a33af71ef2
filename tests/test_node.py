"""Node mode (--mig-device all) and the fleet view: fan-out, merge, outlier devices, provider figures,
k slices against one, and the mistakes said at start-up; through the fake NVML."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import fake_pynvml
import pytest
import topologies as topo

from pytest_mig.device import nvml
from pytest_mig.report.fleet import find_device_outliers, provider_figures, slices_vs_one
from pytest_mig.measure import Metric
from pytest_mig.night.node import Device, devices, worker_args
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord, read_results
from pytest_mig.device.target import SelectionError

H100 = "NVIDIA H100 80GB HBM3"


def inventory(monkeypatch: pytest.MonkeyPatch, topology: Any) -> nvml.Inventory:
    fake_pynvml.install(monkeypatch, topology)
    return nvml.discover()


def eight_h200() -> topo.Topology:
    base = topo.get_topology("h200-mig-off")
    g = base.gpus[0]
    gpus = tuple(replace(g, uuid=f"GPU-{i:08x}-0000-4000-8000-000000000000", pci_bus_id=f"00000000:{0x19 + i:02X}:00.0",
                         serial=f"16501234567{i:02d}") for i in range(8))
    return replace(base, gpus=gpus)


# --------------------------------------------------------------------------- which devices


def test_every_gpu_with_mig_off_and_every_slice_of_a_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    devs = devices(inventory(monkeypatch, eight_h200()), None, False, None)
    assert [d.gpu_index for d in devs] == list(range(8))
    assert devs[3].label == "GPU 3 (bus 00000000:1C:00.0, serial 1650123456703)"
    slices = devices(inventory(monkeypatch, "h100-mig"), "1g.10gb", False, None)
    assert [d.uuid for d in slices] == list(topo.H100_1G)


def test_cuda_visible_devices_limits_the_node_to_the_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory(monkeypatch, eight_h200())
    assert [d.gpu_index for d in devices(inv, "full", False, "2,5")] == [2, 5]


@pytest.mark.parametrize(("topology", "profile", "emulate", "sentence"), [
    ("h200-mig-off", "1g.18gb", True, "under --mig-emulate the green contexts of one GPU share its memory bandwidth "
                                      "and power, so they are not independent devices"),
    ("h200-mig-off", "all", False, "--mig-device all with --mig-profile all: name one profile"),
    ("h100-mig", "3g.40gb", False, "--mig-device all found no 3g.40gb instance on this node."),
    ("no-gpu", None, False, "--mig-device all found no GPU: NVML found no NVIDIA GPU"),
])
def test_mistakes_are_one_sentence(monkeypatch: pytest.MonkeyPatch, topology: str, profile: str | None,
                                   emulate: bool, sentence: str) -> None:
    with pytest.raises(SelectionError, match=sentence.replace("(", r"\(").replace(")", r"\)")):
        devices(inventory(monkeypatch, topology), profile, emulate, None)


def test_a_worker_gets_the_user_s_options_pinned_to_its_device() -> None:
    d = Device("MIG-abc", 0, "GPU 0 1g.10gb MIG-abc")
    args = ["benchmarks", "--mig-device", "all", "--mig-results=night.json", "--mig-report", "r.md", "-k", "gemm",
            "--junitxml=out/junit.xml", "--mig-quick", "--mig-export", "prometheus=n.prom", "--mig-export=github=gab"]
    assert worker_args(args, d, Path("/tmp/d2.json"), 2) == [
        "benchmarks", "-k", "gemm", "--junitxml=out/junit.device2.xml", "--mig-quick",
        "--mig-device", "MIG-abc", "--mig-results", "/tmp/d2.json", "--mig-node-worker", "2"]
    # the worker's index and the node's nights folder are options, never the environment
    assert worker_args([*args, "--mig-node-worker", "7", "--mig-nights=x"], d, Path("/tmp/d2.json"), 2,
                       Path("/site/nights"))[-3:] == ["--mig-node-worker", "2", "--mig-nights=/site/nights"]


# --------------------------------------------------------------------------- a node run, end to end


CONFTEST = (
    "import pytest_mig.device.target as target\n\n"
    f"target.cuda_props = lambda: target.CudaProps('{H100} MIG 1g.10gb', 16, 9984 * 2**20, (9, 0))\n"
)
BENCH = f'''
import os

from pytest_mig.measure import Metric


def test_rate(mig_bench, pytestconfig):
    slow = os.environ["CUDA_VISIBLE_DEVICES"] == {topo.H100_1G[3]!r}
    rate = 30.0 if slow else 100.0 + pytestconfig.getoption("mig_node_worker") * 0.1
    mig_bench.record(Metric("rate", rate, "items/s", "higher", [rate] * 3, kind="compute"))
'''
SLOW_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                "-W", "ignore::pytest_benchmark.logger.PytestBenchmarkWarning")


def node_run(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch, topology: Any, *options: str) -> Any:
    if isinstance(topology, str):
        fake_pynvml.install_subprocess(mig_env, topology)
    else:
        fake_pynvml.install_subprocess(mig_env, topology, json_path=pytester.path / "topology.json")
    mig_env.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_bench=BENCH)
    return pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-profile", "1g.10gb", "--mig-device", "all", *options)


def test_every_slice_runs_at_once_and_merges_into_one_report(pytester: pytest.Pytester,
                                                             mig_env: pytest.MonkeyPatch) -> None:
    result = node_run(pytester, mig_env, "h100-mig", "--mig-results", "node.json", "--mig-report", "node.md",
                      "--mig-export", "prometheus=node.prom")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "pytest-mig node: 7 worker(s) started" in out and out.count(": passed (1 figures") == 7
    records = read_results(pytester.path / "node.json")
    assert sorted(r.target.uuid for r in records) == sorted(topo.H100_1G)  # one record per slice, merged
    assert {r.target.gpu_serial for r in records} == {"1650123456789"}
    result.stdout.fnmatch_lines([
        "provider figures (Columbia/IBM: all devices at once):",
        "  test_rate rate: 631.8 items/s (all devices together, 7 devices: 100.0, 100.1, 100.2, 30.00, 100.4, 100.5, "
        "100.6)",
        f"OUTLIER GPU 0 (bus 00000000:18:00.0, serial 1650123456789) 1g.10gb {topo.H100_1G[3]} on *: "
        "test_bench.py::test_rate rate 30.00 items/s is 234.3% worse than the median 100.3 items/s of 6 other "
        f"{H100} 1g.10gb device(s)*",
    ])
    assert (pytester.path / "node.md").read_text().count("test_rate") == 7
    prom = (pytester.path / "node.prom").read_text()  # the node writes one export with every slice's figure
    figures = [line for line in prom.splitlines() if line.startswith("PYTEST_MIG_FIGURE{")]
    # one board (UUID, as dcgm-exporter names it), seven GPU instances
    assert len(figures) == 7 and len({line.split('UUID="')[1].split('"')[0] for line in figures}) == 1
    assert len({line.split('GPU_I_ID="')[1].split('"')[0] for line in figures}) == 7
    logs = {Path(m).parent for m in re.findall(r", log (\S+)", out)}
    assert len(logs) == 1 and not next(iter(logs)).exists()  # a clean night leaves no worker folder behind
    assert "the workers' logs are kept" not in out


def test_a_busy_slice_is_named_and_the_others_still_run(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    busy = topo.with_busy(topo.get_topology("h100-mig"), topo.H100_1G[5], pid=4321)
    result = node_run(pytester, mig_env, busy, "--mig-results", "node.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"pytest-mig node: GPU 0 (*) 1g.10gb {topo.H100_1G[5]} is busy (pids 4321): not run",
                                 "pytest-mig node: 6 worker(s) started*",
                                 f"pytest-mig node: GPU 0 (*) 1g.10gb {topo.H100_1G[5]}: busy, not run"])
    assert len(read_results(pytester.path / "node.json")) == 6
    kept = re.search(r"the workers' logs are kept in (\S+)", result.stdout.str())
    assert kept and Path(kept.group(1)).is_dir()  # a night with a problem keeps the logs that say why


def test_a_node_in_a_window_plans_every_device_from_the_nodes_own_nights(pytester: pytest.Pytester,
                                                                         mig_env: pytest.MonkeyPatch) -> None:
    """Workers write to a scratch folder; each reads the test's last time from the node's results folder."""
    nights = pytester.path / "nights"
    nights.mkdir()
    slice_ = {"gpu_slug": "nvidia-h100-80gb-hbm3", "profile": "1g.10gb", "baseline_profile": "1g.10gb"}
    record = {"test": "test_bench.py::test_rate", "metric": {"name": "rate", "value": 100.0, "unit": "items/s"},
              "target": slice_, "mode": "normal"}
    (nights / "last.json").write_text(json.dumps({"schema": "pytest-mig/results/1", "records": [record],
                                                  "meta": {"durations": {"test_bench.py::test_rate": 700.0}}}))
    too_short = node_run(pytester, mig_env, "h100-mig", "--mig-results", "nights/n1.json", "--mig-window", "10m")
    assert too_short.ret != 0
    assert too_short.stdout.str().count("--mig-window 10 min 00 s holds none of the 1 test(s): the shortest took "
                                        "11 min 40 s") == 7  # every worker planned from the node's file
    (nights / "last.json").unlink()
    fits = node_run(pytester, mig_env, "h100-mig", "--mig-results", "nights/n2.json", "--mig-window", "10m")
    assert fits.ret == 0, fits.stdout.str()
    meta = json.loads((nights / "n2.json").read_text())["meta"]
    assert meta["window"] == {"seconds": 600.0, "left": []}
    assert set(meta["durations"]) == {"test_bench.py::test_rate"}  # the longest of the seven, for the next night


def test_node_mode_under_emulation_is_a_usage_error(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    fake_pynvml.install_subprocess(mig_env, "h200-mig-off")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-profile", "1g.18gb", "--mig-emulate",
                                           "--mig-device", "all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --mig-device all runs identical copies on every real GPU or slice at once;*"])
    assert "Traceback" not in result.stderr.str()


# --------------------------------------------------------------------------- outlier devices


def rec(value: float, index: int, *, metric: str = "bf16_tflops", unit: str = "TFLOPS", kind: str = "tensor",
        profile: str = "full", uuid: str | None = None, node: str = "n1", direction: str = "higher",
        board: str | None = None) -> ResultRecord:
    target = {"kind": "mig" if profile != "full" else "full", "profile": profile, "gpu_name": H100,
              "uuid": uuid or f"GPU-{index}", "gpu_uuid": board or f"GPU-{index}", "gpu_index": index,
              "pci_bus_id": f"00000000:{index + 0x18:02X}:00.0", "gpu_serial": f"serial-{index}"}
    return ResultRecord("bench.py::test_gemm[bf16]", Metric(metric, value, unit, direction, [], kind=kind),
                        TargetInfo.from_dict(target), {}, node=node)


def test_a_3x_slow_gpu_stands_out() -> None:
    records = [rec(700.0, i) for i in range(3)] + [rec(700.0 / 3, 3)]
    (o,) = find_device_outliers(records)
    assert o.device == "GPU 3 (bus 00000000:1B:00.0, serial serial-3)" and o.worse == pytest.approx(2.0)


def test_a_10_percent_slow_gpu_among_8_stands_out_and_the_equal_ones_do_not() -> None:
    values = [700.0, 702.1, 698.3, 701.0, 699.4, 700.6, 697.9]  # 7 equal boards, within 0.3%
    records = [rec(v, i) for i, v in enumerate(values)] + [rec(630.0, 7)]
    (o,) = find_device_outliers(records)
    assert o.device.startswith("GPU 7 ") and o.worse == pytest.approx(700.3 / 630 - 1, abs=1e-3)
    assert o.bar == pytest.approx(0.05) and o.others == 7


def test_a_lower_is_better_figure_is_an_outlier_when_higher() -> None:
    records = [rec(1.0, i, metric="step_time_s", unit="s", kind="training", direction="lower") for i in range(4)]
    records.append(rec(1.5, 4, metric="step_time_s", unit="s", kind="training", direction="lower"))
    assert [o.device.split()[1] for o in find_device_outliers(records)] == ["4"]


def test_devices_of_other_models_or_profiles_are_not_compared() -> None:
    records = [rec(700.0, 0), rec(700.0, 1), rec(100.0, 2, profile="1g.10gb", uuid="MIG-x")]
    assert find_device_outliers(records) == []


# --------------------------------------------------------------------------- provider figures, k slices


def test_provider_rate_is_the_sum_and_board_power_counts_once() -> None:
    slices = [f"MIG-{i}" for i in range(3)]
    records = []
    for i, u in enumerate(slices):  # three slices of one board, each doing 1000 tokens/s
        records.append(rec(1000.0, 0, metric="tokens_per_s", unit="tokens/s", kind="training", profile="1g.10gb",
                           uuid=u, board="GPU-0"))
        records.append(rec(300.0 + i, 0, metric="power_w", unit="W", kind="energy", profile="1g.10gb", uuid=u,
                           board="GPU-0"))
        records.append(rec((300.0 + i) / 1000.0, 0, metric="energy_j_per_token", unit="J/token", kind="energy",
                           profile="1g.10gb", uuid=u, board="GPU-0"))
    figures = {f.metric: f for f in provider_figures(records)}
    assert figures["tokens_per_s"].total == 3000.0 and figures["tokens_per_s"].devices == 3
    # the board drew ~301 W for all three slices: 0.1 J/token for the node, not 0.3
    assert figures["energy_j_per_token"].total == pytest.approx(301.0 / 3000.0)


def test_three_1g_slices_together_against_one_3g_slice() -> None:
    records = [rec(100.0, 0, profile="1g.10gb", uuid=f"MIG-{i}") for i in range(3)]
    records.append(rec(330.0, 0, profile="3g.40gb", uuid="MIG-big"))
    (row,) = slices_vs_one(records)
    assert (row.small, row.k, row.big) == ("1g.10gb", 3, "3g.40gb") and row.ratio == pytest.approx(300 / 330)
    assert row.line().endswith("1g.10gb x3 together 300.0 TFLOPS, 3g.40gb alone 330.0 TFLOPS: ratio 0.91 "
                               "(ideal 1.00 by compute slices)")


def test_k_slices_need_a_slice_of_k_times_their_size() -> None:
    records = [rec(100.0, 0, profile="1g.10gb", uuid=f"MIG-{i}") for i in range(2)]
    records.append(rec(330.0, 0, profile="3g.40gb", uuid="MIG-big"))
    assert slices_vs_one(records) == []


def test_merged_results_keep_every_device_s_identity(tmp_path: Path) -> None:
    from pytest_mig.store.results import write_results

    write_results(tmp_path / "r.json", [rec(1.0, 5)])
    target = json.loads((tmp_path / "r.json").read_text())["records"][0]["target"]
    assert (target["gpu_index"], target["pci_bus_id"], target["gpu_serial"]) == (5, "00000000:1D:00.0", "serial-5")


def test_the_report_command_names_outlier_devices_and_puts_k_slices_against_one(tmp_path: Path) -> None:
    import io

    from pytest_mig.cli import cmd_report
    from pytest_mig.store.results import write_results

    slices = [rec(100.0, 0, profile="1g.10gb", uuid=f"MIG-{i}") for i in range(3)]
    write_results(tmp_path / "1g.json", slices)
    write_results(tmp_path / "3g.json", [rec(330.0, 0, profile="3g.40gb", uuid="MIG-big")])
    write_results(tmp_path / "gpus.json", [rec(700.0, i) for i in range(3)] + [rec(600.0, 3)])
    out = io.StringIO()
    code = cmd_report([tmp_path / "1g.json", tmp_path / "3g.json", tmp_path / "gpus.json"], None, 1.5, True, out)
    text = out.getvalue()
    assert "OUTLIER BOARDS: 1\n  GPU 3 (bus 00000000:1B:00.0, serial serial-3) on n1: 1 figure(s) worse than the other " \
           "NVIDIA H100 80GB HBM3 full devices; worst test_gemm[bf16] bf16_tflops 600.0 TFLOPS, 16.7% worse than the " \
           "median of 3" in text
    assert "1g.10gb x3 together 300.0 TFLOPS, 3g.40gb alone 330.0 TFLOPS: ratio 0.91" in text
    assert code == 1  # --fail-on-outlier: an outlier device fails the report too
