"""A fleet's night: ``pytest-mig report`` over many GPUs' results files (summary first, rows in the
file, the same bytes whether a pool of processes read the files or not, a refused file named as its
reader names it), the outlier rule in n log n, the compiled schema checks, and the recipes a fleet
watches with (Prometheus alerting rules run by promtool and by a live Prometheus, a Grafana dashboard).

The fleet is simulated from a real recorded H100 night (tests/fleet_nights.py: copies of
docs/results/h100-nights-2026-11-26.tgz's night2.json with new boards and 0.3% noise, one board 8% slow).
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import random
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from prometheus_client.parser import text_string_to_metric_families

import fleet_nights
from live_prometheus import needs_live, prometheus, wait_for
from pytest_mig.cli import main
from pytest_mig.measure import batch_bound
from pytest_mig.common.schema_check import compile_schema
from pytest_mig.report import exports
from pytest_mig.report.fleet import median_without
from pytest_mig.store import schemas
from pytest_mig.store import bulk_read
from pytest_mig.store.results import ResultRecord, ResultsFileError, read_results

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "recipes" / "prometheus-rules.yml"
DASHBOARD = ROOT / "recipes" / "grafana-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install "
                                    "prometheus; it is not on PyPI)")
SLOW = 3  # the slow board's index in the simulated fleet
NEW_DRIVER = "590.10"  # the driver one board is given in the test, to be named as a difference


@pytest.fixture(scope="module")
def night() -> dict[str, Any]:
    return fleet_nights.read_night(fleet_nights.ARCHIVE)


def _regressed_board(doc: dict[str, Any]) -> int:
    """Give board doc's first two compared figures a regressed verdict and a new driver; how many."""
    marked = 0
    for r in doc["records"]:
        r["fingerprint"]["driver"] = NEW_DRIVER
        if r["metric"]["compare"] and marked < 2:
            r["verdict"].update(outcome="regressed", change_pct=-7.5,
                                fingerprint_changes=[f"driver 580.159.04 -> {NEW_DRIVER}"])
            marked += 1
    return marked


def test_report_names_a_board_whose_host_copies_were_made_while_the_host_was_shared(
        tmp_path: Path, night: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Each such night is `incomparable` on its own; over a fleet's nights, the summary says how often."""
    sentence = "GPU 1 of this host moved up to 41.0 GB/s over PCIe while it was measured"
    files = []
    for day, shared in ((26, False), (27, True), (28, True)):
        doc = copy.deepcopy(night)
        for r in doc["records"]:
            r["timestamp"] = r["timestamp"].replace("2026-11-26", f"2026-11-{day}")
            if r["test"].endswith("test_host_bandwidth") and r["metric"]["unit"] == "GB/s":
                r["metric"]["info"].update({"neighbours_pcie_gbs": 41.0 if shared else 0.2, "neighbour_readings": 16})
                if shared:
                    r["metric"]["info"]["shared_host"] = sentence
        files.append(tmp_path / f"night-{day}.json")
        files[-1].write_text(json.dumps(doc))
    assert main(["report", *map(str, files), "--out", str(tmp_path / "nights.md")]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("HOST COPIES NOT JUDGED: 1 device(s)")
    assert lines[at + 1].startswith("  GPU 0 ") and lines[at + 1].endswith(
        f": made while the host was shared in 2 of 3 run(s), so not judged; the last: {sentence}")
    assert main(["report", str(files[0]), "--out", str(tmp_path / "alone.md")]) == 0
    assert "HOST COPIES NOT JUDGED" not in capsys.readouterr().out  # a night measured alone: nothing to say


def test_a_time_with_no_zone_is_read_as_utc_so_one_run_stays_one_run(
        tmp_path: Path, night: dict[str, Any], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A results file whose times name no zone (written by another tool) beside one that does: the
    same moment, so one run, wherever the report is read (here five hours west of UTC)."""
    monkeypatch.setenv("TZ", "EST+05")
    time.tzset()
    try:
        doc = copy.deepcopy(night)
        copies = [r for r in doc["records"]
                  if r["test"].endswith("test_host_bandwidth") and r["metric"]["unit"] == "GB/s"]
        assert len(copies) >= 2
        for i, r in enumerate(copies):
            r["metric"]["info"]["shared_host"] = "GPU 1 of this host copied meanwhile"
            r["timestamp"] = "2026-11-26T01:00:00" + ("" if i % 2 else "+00:00")
        path = tmp_path / "night.json"
        path.write_text(json.dumps(doc))
        assert main(["report", str(path), "--out", str(tmp_path / "night.md")]) == 0
        out = capsys.readouterr().out
        assert "made while the host was shared in 1 of 1 run(s)" in out
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_report_of_a_fleet_prints_the_summary_first_and_keeps_the_rows_in_the_file(
        tmp_path: Path, night: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    files = fleet_nights.write_fleet(night, tmp_path / "fleet", 6, slow_gpu=SLOW)
    doc = json.loads(files[1].read_text())
    regressed = _regressed_board(doc)
    files[1].write_text(json.dumps(doc))
    out_path = tmp_path / "fleet.md"
    assert main(["report", *map(str, files), "--out", str(out_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    n = len(night["records"]) * 6
    assert lines[0].startswith(f"{n} metric(s) from 6 file(s): 6 device(s) on 1 node(s); verdicts: ")
    heads = [line.split(":")[0] for line in lines if not line.startswith(" ")]
    assert heads[1:] == ["OUTLIER BOARDS", "REGRESSIONS", "FINGERPRINTS", f"{n} row(s), one per device and figure, "
                                                                          f"written to {out_path}"]
    boards = lines[lines.index("OUTLIER BOARDS: 1") + 1]
    assert f"serial {1650000000000 + SLOW}" in boards and boards.startswith(f"  GPU {SLOW} ")
    compared = sum(1 for r in night["records"] if r["metric"]["compare"] and r["metric"]["value"] > 0
                   and not batch_bound(r["test"], r["metric"]["name"]))  # read as informational
    assert f": {compared} figure(s) worse than the other NVIDIA H100 80GB HBM3 full devices" in boards
    assert f"REGRESSIONS: {regressed} figure(s) on 1 device(s)" in lines
    assert any(line.startswith("  GPU 1 (") and f"{regressed} regressed" in line for line in lines)
    assert f"  driver differs: 580.159.04 on 5; {NEW_DRIVER} on 1 (node-000 GPU 1)" in lines
    assert f"  since the baseline: driver 580.159.04 -> {NEW_DRIVER} (1 device(s), {regressed} figure(s))" in lines
    assert not any(line.startswith("benchmarks/") or line.startswith("| ") for line in lines)  # no rows here
    rows = out_path.read_text().splitlines()[2:]
    assert len(rows) == n
    marked = [r for r in rows if "% worse than 5 devices" in r]  # the outlier column (markdown escapes its <<)
    assert len(marked) == compared and all(f"serial {1650000000000 + SLOW}" in r for r in marked)


def test_report_without_out_says_where_the_rows_go_when_they_are_many(
        tmp_path: Path, night: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    files = fleet_nights.write_fleet(night, tmp_path / "fleet", 3, slow_gpu=None)
    assert main(["report", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (f"{len(night['records']) * 3} row(s), one per device and figure, not printed: "
                                    f"give --out report.md (or .csv, .json) to keep them")


#: sha256 of what ``pytest-mig report`` wrote for _small_fleet (8 boards, one 8% slow, one regressed on a new
#: driver) before its reading was put in a pool of processes: the report file, then the terminal's lines (the
#: folder written as <tmp>), the largest batch's step time read as informational (its rows of kind info, the slow
#: board 99 figures worse, not 103).  A change here is a change in the report's bytes: make it on purpose or not at all.
UNCHANGED = {
    "md": ("bb3e68be9239f5711d0906fe2bd3d37a8807e27c7ba0b9a8849f0016a629e08e",
           "eaabfe5efbdda76fb6d05ca90285be6f2b2ee63b323264ea9a1ddce0d6f6dd6c"),
    "csv": ("c4ac2c1a05eaaf8c8bfe26b34e45464cc29748eb9d92e9ff031c2521d8ae1d14",
            "7369d03f8fdeba290a7ce82a8e2cc6afd03ae2374fb78a7e3dc9e4e68ae8cc7f"),
    "json": ("99085e8d7aa607b995657d03feb3f5eaacaa542dd8e16e04db7a704489550f4f",
             "04ae83eecd95631cb3c8a6a0633c445cfba62d3cd6b874ae2514c1ab19077d00"),
}


def _small_fleet(night: dict[str, Any], folder: Path) -> list[Path]:
    files = fleet_nights.write_fleet(night, folder, 8, slow_gpu=SLOW)
    doc = json.loads(files[1].read_text())
    _regressed_board(doc)
    files[1].write_text(json.dumps(doc))
    return files


@pytest.mark.parametrize("pool", [False, True], ids=["read-here", "read-by-2-workers"])
def test_a_fleet_report_is_byte_for_byte_what_it_was(tmp_path: Path, night: dict[str, Any], pool: bool,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    files = _small_fleet(night, tmp_path / "fleet")
    monkeypatch.setattr(bulk_read, "workers_for", lambda files: 2 if pool else 0)
    for suffix, (file_hash, lines_hash) in UNCHANGED.items():
        out = tmp_path / f"fleet.{suffix}"
        assert main(["report", *map(str, files), "--out", str(out)]) == 0
        said = capsys.readouterr().out.replace(str(tmp_path), "<tmp>")
        assert (hashlib.sha256(out.read_bytes()).hexdigest(), hashlib.sha256(said.encode()).hexdigest()) == \
            (file_hash, lines_hash), f"the {suffix} report changed:\n{said}"
    assert gc.isenabled()  # the collector, held off while the records were made, runs again


def test_the_workers_hand_back_the_records_the_reader_reads(tmp_path: Path, night: dict[str, Any]) -> None:
    files = fleet_nights.write_fleet(night, tmp_path / "fleet", 3, slow_gpu=None)
    here = bulk_read.read_report_records(files, workers=0)
    assert bulk_read.read_report_records(files, workers=2) == here
    full = [r for f in files for r in read_results(f)]
    assert len(here) == len(full) and full[0].health and full[0].metric.samples
    for lean, r in zip(here, full):  # all but what no report shows
        assert (lean.health, lean.metric.samples, lean.metric.info) == (None, [], {})
        assert replace(lean, health=r.health, metric=replace(lean.metric, samples=r.metric.samples,
                                                             info=r.metric.info)) == r
    assert len({id(r.target) for r in here}) == len(files)  # a file's records share one Target


@pytest.mark.parametrize("workers", [0, 2])
def test_the_first_refused_file_is_named_as_its_reader_names_it(tmp_path: Path, night: dict[str, Any],
                                                                workers: int) -> None:
    files = fleet_nights.write_fleet(night, tmp_path / "fleet", 4, slow_gpu=None)
    text = files[1].read_text()
    files[1].write_text(text.replace('"schema": "pytest-mig/results/1"', '"schema": "pytest-mig/results/1", '
                                     '"schema": "pytest-mig/results/1"', 1))  # a key given twice
    files[2].write_text(text[:1000])  # cut short
    with pytest.raises(ResultsFileError) as alone:
        read_results(files[1])
    with pytest.raises(ResultsFileError) as among:
        bulk_read.read_report_records(files, workers=workers)
    assert str(among.value) == str(alone.value) and "given twice" in str(alone.value)
    assert gc.isenabled()


def test_median_without_is_the_median_of_the_others() -> None:
    rng = random.Random(7)
    for n in range(2, 12):
        values = sorted(rng.choice([rng.random(), 1.0, 2.0]) for _ in range(n))
        assert [median_without(values, i) for i in range(n)] == \
            [statistics.median(values[:i] + values[i + 1:]) for i in range(n)]


def _mutations(doc: Any, rng: random.Random) -> Any:
    """A copy of ``doc`` with one value somewhere replaced or one key dropped."""
    palette = [None, True, False, 0, -1, 1.5, 2.0, 1e301, float("nan"), "", "x", "higher", "quick", [], {}, [1, "a"],
               [1.0, 2], [1.0, True], ["a", "b"], ["a", None], {"a": 1}]
    doc = copy.deepcopy(doc)
    node, parents = doc, []
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        parents.append((node, key))
        node = node[key]
    if not parents:
        return doc
    parent, key = parents[-1]
    if isinstance(parent, dict) and rng.random() < 0.25:
        del parent[key]
    else:
        parent[key] = rng.choice(palette)
    return doc


@pytest.mark.parametrize("schema, name", [(schemas.RESULTS, "results"), (schemas.RECORD, "record")])
def test_compiled_checks_agree_with_jsonschema(night: dict[str, Any], schema: dict[str, Any], name: str) -> None:
    check = compile_schema(schema)
    assert check is not None
    small = dict(night, records=night["records"][:3])
    seeds = [small] if name == "results" else small["records"]
    rng = random.Random(1)
    validator = Draft202012Validator(schema)
    verdicts = set()
    for i in range(600):
        doc = _mutations(seeds[i % len(seeds)], rng)
        assert check(doc) == validator.is_valid(doc), json.dumps(doc, default=str)[:300]
        verdicts.add(check(doc))
    assert verdicts == {True, False}  # the mutations made both valid and invalid documents
    assert compile_schema({"type": "string", "pattern": "^a"}) is None  # a keyword not compiled: jsonschema's


# --------------------------------------------------------------------------- Prometheus and Grafana


def _fleet_series(night: dict[str, Any], gpus: int) -> tuple[list[dict[str, str]], str, str, int]:
    """promtool input series of ``gpus`` boards' textfiles (six figures each), the slow board's UUID,
    the regressed board's UUID and the number of figures per board."""
    keep = [r for r in night["records"] if r["metric"]["compare"]][:6]
    small = dict(night, records=keep)
    series, slow_uuid, regressed_uuid = [], "", ""
    for i in range(gpus):
        doc = fleet_nights.simulate(small, i, noise=0.003, slow=0.08 if i == SLOW else 0.0, seed=0)
        if i == 1:
            doc["records"][0]["verdict"]["outcome"] = "regressed"
        records = [ResultRecord.from_dict(r) for r in doc["records"]]
        uuid = records[0].target.gpu_uuid
        slow_uuid, regressed_uuid = (uuid if i == SLOW else slow_uuid), (uuid if i == 1 else regressed_uuid)
        text = exports.prometheus_text(records, host=doc["records"][0]["node"], now=0.0)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f'{k}={json.dumps(v)}' for k, v in sorted(s.labels.items()))
                series.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value!r}+0x10"})
    return series, slow_uuid, regressed_uuid, len(keep)


@needs_promtool
def test_alerting_rules_fire_on_the_slow_board_only(tmp_path: Path, night: dict[str, Any]) -> None:
    series, slow, regressed, figures = _fleet_series(night, 12)
    tests = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": 'count by (UUID) (ALERTS{alertname="PytestMigOutlierBoard", alertstate="firing"})',
             "eval_time": "5m", "exp_samples": [{"labels": f'{{UUID="{slow}"}}', "value": figures}]},
            {"expr": 'count by (UUID) (ALERTS{alertname="PytestMigRegressed", alertstate="firing"})',
             "eval_time": "5m", "exp_samples": [{"labels": f'{{UUID="{regressed}"}}', "value": 1}]},
            {"expr": 'count(ALERTS{alertname="PytestMigNightMissing"})', "eval_time": "5m", "exp_samples": []},
        ]}]}
    path = tmp_path / "fleet-tests.yml"
    path.write_text(json.dumps(tests))  # JSON is YAML
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.e2e
@needs_live
def test_a_live_prometheus_loading_many_gpus_textfiles_alerts_on_the_slow_and_the_regressed_board(
        tmp_path: Path, night: dict[str, Any]) -> None:
    """The rules in a real Prometheus that scrapes node_exporter's textfile collector holding twelve
    GPUs' exports (one file per GPU, as nodes write them): the outlier alert fires for every figure of
    the 8% slow board and for no other board, the regressed alert for the regressed board only, and
    no night is missing."""
    keep = [r for r in night["records"] if r["metric"]["compare"]][:6]
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    slow, regressed = "", ""
    for i in range(12):
        doc = fleet_nights.simulate(dict(night, records=keep), i, noise=0.003, slow=0.08 if i == SLOW else 0.0, seed=0)
        if i == 1:
            doc["records"][0]["verdict"]["outcome"] = "regressed"
        records = [ResultRecord.from_dict(r) for r in doc["records"]]
        uuid = records[0].target.gpu_uuid
        slow, regressed = (uuid if i == SLOW else slow), (uuid if i == 1 else regressed)
        text = exports.prometheus_text(records, host=doc["records"][0]["node"])
        (textfiles / f"gpu-{i}.prom").write_text(text)
    with prometheus(tmp_path, textfiles, rule_files=[RULES]) as api:
        def firing() -> dict[str, list[str]]:
            alerts = [a for a in api("alerts", {})["alerts"] if a["state"] == "firing"]
            return {name: sorted(a["labels"].get("UUID", "") for a in alerts if a["labels"]["alertname"] == name)
                    for name in ("PytestMigOutlierBoard", "PytestMigRegressed", "PytestMigNightMissing")}
        got = wait_for(firing, lambda f: len(f["PytestMigOutlierBoard"]) >= len(keep) and f["PytestMigRegressed"],
                       tmp_path)
        time.sleep(3)  # three more evaluations: nothing else fires
        got = firing()
    assert got == {"PytestMigOutlierBoard": [slow] * len(keep), "PytestMigRegressed": [regressed],
                   "PytestMigNightMissing": []}


@needs_promtool
def test_alerting_rules_pass_promtool_check() -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


EXPORTED = ("PYTEST_MIG_FIGURE", "PYTEST_MIG_CHANGE_PERCENT", "PYTEST_MIG_REGRESSED",
            "PYTEST_MIG_LAST_RUN_TIMESTAMP_SECONDS")


def test_grafana_dashboard_loads_and_queries_the_exported_series() -> None:
    """What Grafana needs to import a dashboard (no dashboard linter is on PyPI: grafana/dashboard-linter
    is a Go tool): a title, a uid, a schema version, panels with an id, a type, a place and targets whose
    PromQL names the exported series; every template variable a query uses is defined."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] and re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dash["uid"]) and dash["schemaVersion"] >= 36
    variables = {v["name"] for v in dash["templating"]["list"]}
    used = set()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 4
    for p in dash["panels"]:
        assert p["type"] in ("table", "timeseries", "stat") and set(p["gridPos"]) == {"x", "y", "w", "h"}
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 and p["targets"]
        for t in p["targets"]:
            assert any(name in t["expr"] for name in EXPORTED), t["expr"]
            labels = set(re.findall(r"(\w+)\s*[=!]~?\s*\"", t["expr"])) | set(re.findall(r"by \(([^)]*)\)", t["expr"]))
            labels = {x.strip() for group in labels for x in group.split(",")}
            assert labels <= set(exports.DCGM_LABELS) | set(exports.OWN_LABELS), labels
            used |= set(re.findall(r"\$(\w+)", t["expr"] + json.dumps(p["datasource"])))
    assert used <= variables and "datasource" in variables
