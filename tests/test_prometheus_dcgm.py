"""The Prometheus export beside dcgm-exporter's series: same device labels, so a PromQL join on
``UUID`` and ``GPU_I_ID`` pairs every figure with the series of the slice or whole GPU it ran on.

dcgm-exporter's side is rendered here as its ``gpuMetricsFormat`` template writes a device's series
(NVIDIA/dcgm-exporter, internal/pkg/rendermetrics/render_metrics.go): ``gpu``, ``UUID`` (the board's
``GPU-...`` id), ``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName``, on a GPU instance
``GPU_I_PROFILE`` and ``GPU_I_ID``, ``Hostname``, then its label fields (``DCGM_FI_DRIVER_VERSION``).
Its default "flexible" monitoring (internal/pkg/devicemonitoring) watches each GPU instance of a GPU
that has some, else the whole GPU.  The devices are the fake NVML's topologies; the Targets are made
by ``plan_run``, as a run makes them.  The join is evaluated twice: by its label-matching rule in
Python, and by Prometheus's own engine (``promtool test rules``) where promtool is installed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import topologies as topo
from live_prometheus import needs_live, prometheus, wait_for
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.device.plan import Options, plan_run
from pytest_mig.measure import Metric
from pytest_mig.report import exports
from pytest_mig.store.results import ResultRecord

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install "
                                    "prometheus; it is not on PyPI)")
HOST = "gpu-node-1"
JOIN = "PYTEST_MIG_FIGURE * on(UUID, GPU_I_ID) group_left {field}"
#: Where each figure ran: (topology, plan options).  A MIG slice, a compute instance of a GPU instance,
#: a whole GPU, and an emulated profile (on the whole GPU, so it joins the whole GPU's series).
RUNS = (("h100-mig", {"profile": "1g.10gb"}), ("a100-80gb-mixed", {"device": topo.A100_80_1C3G}),
        ("h200-mig-off", {"profile": "full"}))


def _gi_profile(inst: topo.MigInstance) -> str:
    """DCGM names a GPU instance by its GPU-instance profile: 1c.3g.40gb's instance is a 3g.40gb."""
    return inst.profile.split(".", 1)[1] if inst.ci_slices != inst.gi_slices else inst.profile


def dcgm_series(topology: topo.Topology, field: str, value: Any) -> list[str]:
    """One line per entity dcgm-exporter watches, as its template writes it; ``value(gpu, inst)``."""
    lines = []
    for index, gpu in enumerate(topology.gpus):
        head = (f'gpu="{index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",device="nvidia{index}",'
                f'modelName="{gpu.name}"')
        tail = f',Hostname="{HOST}",DCGM_FI_DRIVER_VERSION="{topology.driver_version}"'
        instances = {i.gi_id: i for i in gpu.instances} if gpu.mig_enabled else {}
        if not instances:
            lines.append(f"{field}{{{head}{tail}}} {value(gpu, None)}")
        for gi_id, inst in sorted(instances.items()):
            lines.append(f'{field}{{{head},GPU_I_PROFILE="{_gi_profile(inst)}",GPU_I_ID="{gi_id}"{tail}}} '
                         f"{value(gpu, inst)}")
    return lines


def sm_clock(gpu: topo.Gpu, inst: topo.MigInstance | None) -> int:
    return gpu.sm_clock_mhz


def fb_total(gpu: topo.Gpu, inst: topo.MigInstance | None) -> int:
    """Framebuffer of the entity: differs between a slice and its GPU, and between profiles."""
    return inst.memory_mb if inst is not None else gpu.memory_mib


@pytest.fixture
def planned(discover) -> list[tuple[topo.Topology, dict[str, Any]]]:
    """(topology, Target.to_dict) of each run in RUNS, plus an emulated 1g.18gb on the H200."""
    out = []
    for name, options in RUNS:
        topology = topo.get_topology(name)
        out.append((topology, plan_run(Options(**options), discover(topology), {}).targets[0].to_dict()))
    topology, whole = out[-1]
    out.append((topology, whole | {"kind": "emulated", "profile": "1g.18gb", "emulated": True}))
    return out


def _figures(planned: list[tuple[topo.Topology, dict[str, Any]]]) -> str:
    """The export of one figure per Target (the UUIDs tell the machines apart; one host name for all)."""
    records = [ResultRecord(f"test_gemm[{target['profile']}]", Metric("tflops", 100.0 + n, "TFLOPS", kind="tensor"),
                            TargetInfo.from_dict(target), {"driver": topology.driver_version},
                            verdict=Verdict.from_dict({"outcome": "pass", "change_pct": 0.5}))
               for n, (topology, target) in enumerate(planned)]
    return exports.prometheus_text(records, host=HOST, now=1.0)


def _samples(text: str, name: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _key(labels: dict[str, str]) -> tuple[str, str]:
    """What ``on(UUID, GPU_I_ID)`` compares: an absent label and an empty one are the same."""
    return labels.get("UUID", ""), labels.get("GPU_I_ID", "")


def test_each_figure_carries_the_labels_of_the_device_it_ran_on(planned):
    figures = {s.labels["profile"]: s.labels for s in _samples(_figures(planned), "PYTEST_MIG_FIGURE")}
    h100, a100, h200 = (topo.get_topology(n) for n, _ in RUNS)
    gi = planned[0][1]["gpu_instance_id"]
    assert {k: figures["1g.10gb"].get(k) for k in exports.DCGM_LABELS} == {
        "gpu": "0", "UUID": topo.H100_GPU0, "pci_bus_id": h100.gpus[0].pci_bus_id, "device": "nvidia0",
        "modelName": h100.gpus[0].name, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": str(gi), "Hostname": HOST,
        "DCGM_FI_DRIVER_VERSION": h100.driver_version}
    split = a100.instance(topo.A100_80_1C3G)
    assert (figures["1c.3g.40gb"]["UUID"], figures["1c.3g.40gb"]["GPU_I_ID"], figures["1c.3g.40gb"]["GPU_I_PROFILE"],
            figures["1c.3g.40gb"]["device"]) == (topo.A100_80_GPU1, str(split.gi_id), "3g.40gb", "nvidia1")
    for profile in ("full", "1g.18gb"):  # a whole GPU, and an emulated profile on it: no GPU_I_* labels
        assert figures[profile]["UUID"] == topo.H200_GPU0 and figures[profile]["pci_bus_id"] == h200.gpus[0].pci_bus_id
        assert "GPU_I_ID" not in figures[profile] and "GPU_I_PROFILE" not in figures[profile]
    assert figures["1g.18gb"]["emulated"] == "true" and figures["full"]["emulated"] == "false"
    assert not any(v.startswith("MIG-") for labels in figures.values() for v in labels.values())


@pytest.mark.parametrize("field, value", [("DCGM_FI_DEV_SM_CLOCK", sm_clock), ("DCGM_FI_DEV_FB_TOTAL", fb_total)])
def test_the_join_pairs_each_figure_with_its_own_device(planned, field, value):
    """``on(UUID, GPU_I_ID) group_left``: each figure meets exactly one DCGM series, the one of its
    slice (not its GPU's other slices) or of its whole GPU, with the same model, bus id and index."""
    dcgm = [s for t in {t.name: t for t, _ in planned}.values() for s in
            _samples("\n".join(dcgm_series(t, field, value)) + "\n", field)]
    for fig in _samples(_figures(planned), "PYTEST_MIG_FIGURE"):
        (match,) = [d for d in dcgm if _key(d.labels) == _key(fig.labels)]
        for label in ("gpu", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "Hostname", "DCGM_FI_DRIVER_VERSION"):
            assert fig.labels.get(label) == match.labels.get(label), label


def _series(sample: Any) -> str:
    labels = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}}"


def _expected(figures: list[Any], dcgm: list[Any]) -> list[dict[str, Any]]:
    out = []
    for fig in figures:
        (match,) = [d for d in dcgm if _key(d.labels) == _key(fig.labels)]
        labels = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(fig.labels.items()))
        out.append({"labels": f"{{{labels}}}", "value": fig.value * match.value})
    return out


@needs_promtool
@pytest.mark.parametrize("field, value", [("DCGM_FI_DEV_SM_CLOCK", sm_clock), ("DCGM_FI_DEV_FB_TOTAL", fb_total)])
def test_prometheus_evaluates_the_join(planned, field, value, tmp_path: Path):
    """Prometheus's engine (``promtool test rules``) evaluates the join over both sets of series: its
    answer is each figure with its own labels, times its device's value, and nothing else."""
    figures = _samples(_figures(planned), "PYTEST_MIG_FIGURE")
    dcgm = [s for t in {t.name: t for t, _ in planned}.values() for s in
            _samples("\n".join(dcgm_series(t, field, value)) + "\n", field)]
    assert len(dcgm) > len(figures)  # the GPUs' other slices are there to be missed
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": _series(s), "values": repr(float(s.value))} for s in figures + dcgm],
        "promql_expr_test": [{"expr": JOIN.format(field=field), "eval_time": "0m",
                              "exp_samples": _expected(figures, dcgm)}]}]}
    path = tmp_path / "join.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _lint(text: str) -> set[str]:
    """promtool's lint problems of an exposition, without the metric names."""
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 3: lint problems found
    return {line.split(" ", 1)[1] for line in (done.stdout + done.stderr).splitlines() if " " in line}


@needs_promtool
def test_promtool_finds_nothing_dcgm_exporter_does_not_trigger_itself(planned):
    ours = _lint(_figures(planned))
    theirs = _lint("# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n"
                   + "\n".join(dcgm_series(planned[0][0], "DCGM_FI_DEV_SM_CLOCK", sm_clock)) + "\n")
    assert ours <= theirs, ours - theirs



# --------------------------------------------------------------------------- live: scraped, then joined


@pytest.mark.e2e
@needs_live
def test_a_live_prometheus_joins_the_textfile_export_with_dcgm_exporters_series(planned, tmp_path: Path):
    """A real Prometheus scrapes node_exporter's textfile collector (the export file, as a site deploys
    it) and a dcgm-exporter endpoint on loopback; the join, asked through its HTTP API, pairs every
    figure with its own device's series and nothing else, whatever job and instance labels the
    scrapes added."""
    field = "DCGM_FI_DEV_FB_TOTAL"  # differs between a slice, its GPU and another profile
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    export = _figures(planned)
    (textfiles / "pytest_mig.prom").write_text(export)
    dcgm_text = "".join(f"{line}\n" for t in {t.name: t for t, _ in planned}.values()
                        for line in dcgm_series(t, field, fb_total))
    figures = _samples(export, "PYTEST_MIG_FIGURE")
    with prometheus(tmp_path, textfiles, endpoints=[dcgm_text]) as api:
        result = wait_for(lambda: api("query", {"query": JOIN.format(field=field)})["result"],
                          lambda r: len(r) >= len(figures), tmp_path)
    expected = {e.labels["test"]: e.value * d.value for e in figures
                for d in _samples(dcgm_text, field) if _key(d.labels) == _key(e.labels)}
    got = {r["metric"]["test"]: float(r["value"][1]) for r in result}
    assert len(expected) == len(figures) and got == pytest.approx(expected)
    for r in result:  # the figure's own labels, and the scrape's job: the node_exporter's
        assert r["metric"]["job"] == "node" and r["metric"]["test"].startswith("test_gemm[")
