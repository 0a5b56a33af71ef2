"""Exports: github-action-benchmark's JSON and the Prometheus textfile, parsed back as JSON and with
prometheus-client's own parser; --mig-export's usage errors; a whole run that writes both."""

from __future__ import annotations

import json

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_mig.report import exports
from pytest_mig.measure import Metric
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.store.results import ResultRecord

TARGET = TargetInfo.from_dict({"kind": "mig", "profile": "1g.10gb", "gpu_name": "NVIDIA H100 80GB HBM3",
                              "uuid": "MIG-1234", "gpu_index": 0, "gpu_uuid": "GPU-5678",
                              "pci_bus_id": "00000000:18:00.0", "gpu_instance_id": 9,
                              "compute_instance_id": 0})  # as Target.to_dict writes a slice
FP = {"driver": "580.159.04", "cuda_driver": "13.0", "cuda_runtime": "13.0", "torch": "2.11.0", "python": "3.12.3"}


def _records() -> list[ResultRecord]:
    tflops = Metric("tflops", 101.5, "TFLOPS", "higher", [100.0, 101.5, 103.0], kind="tensor")
    step = Metric("step_time_s", 0.25, "s", "lower", [0.25, 0.26], kind="training")
    info = Metric("batch_size", 8, "sequences", "higher", [], kind="info", compare=False)
    return [
        ResultRecord("test_gemm[bf16]", tflops, TARGET, FP, verdict=Verdict.from_dict({"outcome": "regressed", "change_pct": -6.2})),
        ResultRecord("test_training[x]", step, TARGET, FP, verdict=Verdict.from_dict({"outcome": "pass", "change_pct": 0.4})),
        ResultRecord("test_training[x]", info, TARGET, FP),
    ]


#: github-action-benchmark's rule for a customBiggerIsBetter / customSmallerIsBetter file
#: (benchmark-action/github-action-benchmark, src/extract.ts at c38cce98: the zod schema
#: BenchmarkResults = z.array(BenchmarkResult), then extractResult refuses an empty list with "No
#: benchmark result was found"), as a JSON schema.  The action coerces name, unit, range and extra to
#: strings and value to a number; pytest-mig writes them as those types, so the schema asks for them.
ACTION_SCHEMA = {
    "type": "array", "minItems": 1,
    "items": {"type": "object", "required": ["name", "value", "unit"],
              "properties": {"name": {"type": "string", "minLength": 1}, "value": {"type": "number"},
                             "unit": {"type": "string"}, "range": {"type": "string"}, "extra": {"type": "string"}}},
}


def action_accepts(path) -> None:
    """The action's check of one file: parsed by a strict JSON reader (JSON.parse refuses NaN and
    Infinity), then the schema; names are unique so that each figure is one line of the chart."""
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path} holds {c}"))
    jsonschema.validate(doc, ACTION_SCHEMA)
    assert len({e["name"] for e in doc}) == len(doc), f"{path}: two entries of one name"


def test_the_action_rule_refuses_what_the_action_refuses(tmp_path):
    (tmp_path / "empty.json").write_text("[]\n")
    with pytest.raises(jsonschema.ValidationError, match="should be non-empty|is too short"):
        action_accepts(tmp_path / "empty.json")
    (tmp_path / "novalue.json").write_text('[{"name": "x", "unit": "s"}]\n')
    with pytest.raises(jsonschema.ValidationError, match="'value' is a required property"):
        action_accepts(tmp_path / "novalue.json")


def test_github_action_benchmark_json(tmp_path):
    paths, skipped = exports.write_github(_records(), tmp_path / "gab")
    assert skipped == []
    for p in paths:
        action_accepts(p)
    bigger, smaller = (json.loads(p.read_text()) for p in paths)
    assert [p.name for p in paths] == ["bigger-is-better.json", "smaller-is-better.json"]
    assert bigger == [{"name": "test_gemm[bf16] tflops [H100 80GB HBM3 1g.10gb]", "unit": "TFLOPS", "value": 101.5,
                       "range": pytest.approx(bigger[0]["range"]),
                       "extra": "mode normal; verdict regressed; driver 580.159.04; CUDA driver 13.0; torch 2.11.0"}]
    assert bigger[0]["range"] == "± 1.5"  # the samples' standard deviation
    assert [e["name"] for e in smaller] == ["test_training[x] step_time_s [H100 80GB HBM3 1g.10gb]"]
    # info figures are not exported
    assert all("batch_size" not in e["name"] for e in bigger + smaller)


def test_a_direction_with_no_figure_gets_no_file(tmp_path):
    """A night of bandwidth tests only: no smaller-is-better figure, so no smaller-is-better.json (the
    action refuses `[]`), and the file an earlier night left is removed rather than charted again."""
    folder = tmp_path / "gab"
    exports.write_github(_records(), folder)  # last night: both directions
    bigger_only = [r for r in _records() if r.metric.direction == "higher"]
    paths, skipped = exports.write_github(bigger_only, folder)
    assert [p.name for p in paths] == ["bigger-is-better.json"]
    action_accepts(paths[0])
    assert skipped == ["smaller-is-better.json not written: no smaller-is-better figure (the older file removed)"]
    assert sorted(p.name for p in folder.iterdir()) == ["bigger-is-better.json"]
    (line,) = exports.write([("github", folder)], [])
    assert line == ("export github-action-benchmark: nothing to chart; bigger-is-better.json not written: no "
                    "bigger-is-better figure (the older file removed); smaller-is-better.json not written: no "
                    "smaller-is-better figure")
    assert list(folder.iterdir()) == []


def test_prometheus_textfile_parses_back(tmp_path):
    path = exports.write_prometheus(_records(), tmp_path / "mig.prom")
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert set(families) == {"PYTEST_MIG_FIGURE", "PYTEST_MIG_CHANGE_PERCENT", "PYTEST_MIG_REGRESSED",
                             "PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS"}
    figures = {s.labels["metric"]: s for s in families["PYTEST_MIG_FIGURE"].samples}
    assert set(figures) == {"tflops", "step_time_s"}
    labels = figures["tflops"].labels
    assert figures["tflops"].value == 101.5 and labels["unit"] == "TFLOPS"
    assert (labels["gpu"], labels["UUID"], labels["pci_bus_id"], labels["device"], labels["modelName"],
            labels["GPU_I_PROFILE"], labels["GPU_I_ID"], labels["DCGM_FI_DRIVER_VERSION"]) == \
        ("0", "GPU-5678", "00000000:18:00.0", "nvidia0", "NVIDIA H100 80GB HBM3", "1g.10gb", "9", FP["driver"])
    regressed = {s.labels["metric"]: s.value for s in families["PYTEST_MIG_REGRESSED"].samples}
    assert regressed == {"tflops": 1.0, "step_time_s": 0.0}
    change = {s.labels["metric"]: s.value for s in families["PYTEST_MIG_CHANGE_PERCENT"].samples}
    assert change == {"tflops": -6.2, "step_time_s": 0.4}
    assert not list(tmp_path.glob(".mig.prom.*"))  # written through a temporary file, nothing left behind


def test_a_nan_figure_is_not_exported():
    nan = ResultRecord("t", Metric("x", float("nan"), "u"), TARGET, FP)
    text = exports.prometheus_text([nan], host="h", now=1.0)
    assert 'metric="x"' not in text and "PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS" in text


def test_host_copies_made_while_the_host_was_shared_are_not_exported():
    shared = ResultRecord("test_host_bandwidth", Metric("h2d_gbs", 31.2, "GB/s", "higher", [31.2], "memory",
                          info={"shared_host": "GPU 1 of this host moved up to 41.6 GB/s over PCIe"}), TARGET, FP)
    alone = ResultRecord("test_host_bandwidth", Metric("d2h_gbs", 55.2, "GB/s", "higher", [55.2], "memory"), TARGET, FP)
    text = exports.prometheus_text([shared, alone], host="h", now=1.0)
    assert 'metric="d2h_gbs"' in text and 'metric="h2d_gbs"' not in text  # a dashboard would read it as a loss
    assert [e["name"].split()[1] for e in exports.github_benchmark([shared, alone])["bigger"]] == ["d2h_gbs"]


@pytest.mark.parametrize("text, message", [
    ("prometheus", "give KIND=PATH"),
    ("grafana=x.json", "'grafana' is not an export; use one of github, prometheus"),
    ("github=", "give KIND=PATH"),
])
def test_parse_export_errors(text, message):
    with pytest.raises(ValueError, match=message):
        exports.parse_export(text)
    assert exports.parse_export(" Prometheus = /x/y.prom") == ("prometheus", exports.Path("/x/y.prom"))


def test_a_run_writes_both_exports(pytester):
    pytester.makepyfile(test_bench="""
        from pytest_mig.measure import Metric

        def test_fast(mig_bench):
            mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0], kind="compute"))
    """)
    result = pytester.runpytest("-p", "no:randomly", "--mig-results", "none", "--mig-export", "github=gab",
                                "--mig-export", "prometheus=out/mig.prom")
    result.assert_outcomes(passed=1)
    bigger = json.loads((pytester.path / "gab" / "bigger-is-better.json").read_text())
    assert [e["value"] for e in bigger] == [100.0]
    assert not (pytester.path / "gab" / "smaller-is-better.json").exists()
    result.stdout.fnmatch_lines(["*export github-action-benchmark: gab/bigger-is-better.json; smaller-is-better.json "
                                 "not written: no smaller-is-better figure"])
    text = (pytester.path / "out" / "mig.prom").read_text()
    assert 'metric="rate"' in text and "PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS" in text
    result.stdout.fnmatch_lines(["*export prometheus: out/mig.prom*"])


def test_a_bad_export_is_one_sentence_at_start_up(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--mig-export", "influx=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--mig-export 'influx=x': 'influx' is not an export; use one of github, prometheus*"])
    assert "Traceback" not in result.stderr.str()


def test_prometheus_labels_a_slice_made_by_the_code_that_makes_targets(tmp_path, discover):
    """GPU_I_ID comes from the Target that plan_run makes for a real MIG slice (an H100 with MIG on,
    through the fake pynvml), not from a target written by hand: Target.to_dict flattens the instance."""
    import topologies as topo
    from pytest_mig.device.plan import Options, plan_run

    topology = topo.get_topology("h100-mig")
    plan = plan_run(Options(profile="1g.10gb"), discover(topology), {})
    target = plan.targets[0].info()
    assert target.kind == "mig" and target.gpu_instance_id is not None
    rec = ResultRecord("test_gemm[bf16]", Metric("tflops", 101.5, "TFLOPS", kind="tensor"), target, FP)
    path = exports.write_prometheus([rec], tmp_path / "mig.prom")
    (family,) = [f for f in text_string_to_metric_families(path.read_text()) if f.name == "PYTEST_MIG_FIGURE"]
    labels = family.samples[0].labels
    assert labels["GPU_I_ID"] == str(target.gpu_instance_id) and labels["GPU_I_PROFILE"] == "1g.10gb"
    assert labels["UUID"] == target.gpu_uuid and labels["UUID"].startswith("GPU-")  # the board, as dcgm-exporter


def test_non_finite_figures_never_reach_an_export(tmp_path):
    """A figure made infinite (SU coefficients of 1e308) or NaN stays in the results file, out of the
    exports: github-action-benchmark's JSON.parse refuses a bare Infinity."""
    records = _records() + [ResultRecord("test_cost[x]", Metric("su", float("inf"), "SU", "lower", kind="cost"),
                                         TARGET, FP),
                            ResultRecord("test_cost[x]", Metric("su_nan", float("nan"), "SU", "lower", kind="cost"),
                                         TARGET, FP)]
    paths, _ = exports.write_github(records, tmp_path / "gab")
    for p in paths:
        action_accepts(p)
        text = p.read_text()
        assert "Infinity" not in text and "NaN" not in text
        json.loads(text, parse_constant=lambda c: pytest.fail(f"{p} holds {c}"))
    prom = exports.write_prometheus(records, tmp_path / "mig.prom").read_text()
    assert 'metric="su"' not in prom and 'metric="su_nan"' not in prom
