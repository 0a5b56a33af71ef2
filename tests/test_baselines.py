"""The baseline store on synthetic records: the history of runs per figure and mode, stable
reviewable JSON, schema 1 files still read, strict reading of hand-broken files (range checks
included), concurrent, interrupted and killed saves, never crossing GPU models."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest
from pytest_mig.store import baselines
from pytest_mig.common.files import folder_lock
from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.history import BASELINE_SCHEMA, BaselineError
from pytest_mig.store.reader import load_baseline_file
from pytest_mig.measure import Metric
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.store.results import ResultRecord
from pytest_mig.judge.pipeline import Pipeline, StoreHistories
from pytest_mig.judge.verdict import compare

FP = {"driver": "580.159.04", "cuda_driver": "13.0", "vbios": "96.00.B5.00.02", "gsp": "580.159.04",
      "ecc": "on", "power_limit_w": 700, "torch": "2.13.0", "gpu_name": "NVIDIA H200", "memory_total_mib": 143771}
GEMM = "benchmarks/test_gemm.py::test_gemm[fp16]"
STREAM = "benchmarks/test_bandwidth.py::test_stream"


def rec(
    value: float = 151.7,
    *,
    test: str = GEMM,
    name: str = "fp16_tflops",
    unit: str = "TFLOPS",
    direction: str = "higher",
    kind: str = "tensor",
    gpu: str = "NVIDIA H200",
    slug: str = "nvidia-h200",
    profile: str = "3g.71gb",
    emulated: bool = False,
    samples: list[float] | None = None,
    fingerprint: dict[str, Any] | None = None,
    compare_: bool = True,
    timestamp: str = "2025-01-01T00:00:00+00:00",
    mode: str = "normal",
) -> ResultRecord:
    """A record as the mig_bench fixture makes it (Target.to_dict() shape), with fixed timestamp."""
    target = {"kind": "emulated" if emulated else "mig", "profile": profile,
              "baseline_profile": f"{profile}-emulated" if emulated else profile,
              "gpu_name": gpu, "gpu_slug": slug, "emulated": emulated}
    xs = [value * (1 + 0.002 * (i % 5 - 2)) for i in range(12)] if samples is None else samples
    metric = Metric(name, value, unit, direction, xs, kind, {}, compare_)  # type: ignore[arg-type]
    return ResultRecord(test, metric, TargetInfo.from_dict(target), dict(FP if fingerprint is None else fingerprint), timestamp, node="n1",
                        mode=mode)


@pytest.fixture
def store(tmp_path: Path) -> BaselineStore:
    return BaselineStore(tmp_path / "baselines")


def saved(store: BaselineStore, *records: ResultRecord) -> Path:
    results = store.save(records)
    assert len(results) == 1
    return results[0].path


# --------------------------------------------------------------------------- layout and format


def runs_of(path: Path, test: str = GEMM, metric: str = "fp16_tflops", mode: str = "normal") -> list[dict[str, Any]]:
    return json.loads(path.read_text())["modes"][mode][test][metric]["runs"]


def test_file_per_gpu_model_and_profile_with_emulated_kept_apart(store: BaselineStore) -> None:
    results = store.save([rec(), rec(120.0, emulated=True), rec(40.0, profile="1g.18gb"),
                          rec(300.0, gpu="NVIDIA H100 80GB HBM3", slug="nvidia-h100-80gb-hbm3", profile="3g.40gb")])
    assert sorted(str(r.path.relative_to(store.root)) for r in results) == [
        "nvidia-h100-80gb-hbm3/3g.40gb.json",
        "nvidia-h200/1g.18gb.json",
        "nvidia-h200/3g.71gb-emulated.json",
        "nvidia-h200/3g.71gb.json",
    ]
    assert store.files() == sorted(r.path for r in results)
    assert sorted(p.name for p in store.root.iterdir()) == ["nvidia-h100-80gb-hbm3", "nvidia-h200"]  # no lock file
    real = json.loads((store.root / "nvidia-h200/3g.71gb.json").read_text())
    emulated = json.loads((store.root / "nvidia-h200/3g.71gb-emulated.json").read_text())
    assert (real["profile"], real["emulated"]) == ("3g.71gb", False)
    assert (emulated["profile"], emulated["emulated"]) == ("3g.71gb-emulated", True)
    assert runs_of(store.root / "nvidia-h200/3g.71gb.json")[0]["value"] == 151.7
    assert runs_of(store.root / "nvidia-h200/3g.71gb-emulated.json")[0]["value"] == 120.0


def test_each_save_adds_a_run_and_the_last_n_are_kept(store: BaselineStore) -> None:
    for i in range(12):
        store.save([rec(150.0 + i, timestamp=f"2025-01-{i + 1:02d}T00:00:00+00:00")])
    path = store.path_for("nvidia-h200", "3g.71gb")
    runs = runs_of(path)
    assert [r["value"] for r in runs] == [152.0 + i for i in range(10)]  # the last 10, oldest first
    assert runs[0]["at"] == "2025-01-03T00:00:00+00:00"
    base = store.load("nvidia-h200", "3g.71gb")
    assert base is not None
    e = base.get(GEMM, "fp16_tflops")
    assert e is not None and e.value == pytest.approx(156.5) and len(e.runs) == 10  # the median of the runs
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=r"keeps 10 runs per figure and a keep of 3 would drop 7 older run\(s\) "
                                            r"of its 1 figure\(s\); nothing is saved: confirm with --mig-baseline-shrink"):
        BaselineStore(store.root, keep=3).save([rec(170.0)])
    assert path.read_bytes() == before  # shrinking a history needs consent
    kept3 = BaselineStore(store.root, keep=3, shrink=True)
    result = kept3.save([rec(170.0)])[0]
    assert [r["value"] for r in runs_of(path)] == [160.0, 161.0, 170.0]
    assert json.loads(path.read_text())["keep"] == 3 and result.runs == 3
    store.save([rec(171.0)])  # the file remembers its own keep
    assert len(runs_of(path)) == 3


def test_each_run_keeps_the_problem_size_it_was_measured_at_and_the_entry_names_the_usual_one(
    store: BaselineStore,
) -> None:
    for i, size in enumerate([16384, 20480, 16384, None]):
        r = rec(150.0 + i, timestamp=f"2025-01-{i + 1:02d}T00:00:00+00:00")
        if size:
            r.metric.info["size"] = size
        store.save([r])
    path = store.path_for("nvidia-h200", "3g.71gb")
    assert [r.get("size") for r in runs_of(path)] == [16384, 20480, 16384, None]
    entry = store.load("nvidia-h200", "3g.71gb").get(GEMM, "fp16_tflops")
    assert entry.size == 16384 and entry.values_at_size == [150.0, 152.0]
    tie = baselines.entry_from_records([rec(1.0), rec(2.0)])
    tie.runs[0].size, tie.runs[1].size = 16384, 20480
    assert tie.size == 20480  # a tie: the latest
    assert tie.values_at_size == [2.0]
    assert baselines.entry_from_records([rec(1.0), rec(2.0)]).values_at_size == [1.0, 2.0]  # no size named
    old = baselines.entry_from_records([rec(1.0), rec(2.0), rec(3.0)])  # two runs saved before sizes were kept
    old.runs[2].size = 20480
    assert old.size is None and old.values_at_size == [1.0, 2.0, 3.0]  # under half name one: measured as it was
    old.runs[1].size = 16384
    assert old.size == 20480  # two of three name one: the latest on a tie


def test_a_run_that_re_measured_a_figure_adds_the_median_of_its_readings(store: BaselineStore) -> None:
    """Transient (a dip, re-measured twice near the history) or confirmed (every reading low), the
    history gains the median of the run's readings; a non-finite re-measurement is left out."""
    dip = rec(64.0)
    dip.verdict = Verdict.from_dict({"outcome": "transient", "confirmations": [151.9, 151.5, float("nan")]})
    low = rec(95.2, name="bf16_tflops")
    low.verdict = Verdict.from_dict({"outcome": "regressed", "confirmations": [94.8, 95.0]})
    plain = rec(20.0, name="tf32_tflops")
    path = saved(store, dip, low, plain)
    assert runs_of(path)[0]["value"] == 151.5
    assert runs_of(path, metric="bf16_tflops")[0]["value"] == 95.0
    assert runs_of(path, metric="tf32_tflops")[0]["value"] == 20.0
    assert baselines.measured_value(dip) == 151.5 and dip.metric.value == 64.0  # the record keeps its first reading


def test_quick_and_normal_runs_have_histories_of_their_own(store: BaselineStore) -> None:
    store.save([rec(151.7)])
    store.save([rec(120.0, mode="quick")])
    path = store.path_for("nvidia-h200", "3g.71gb")
    assert [r["value"] for r in runs_of(path)] == [151.7]
    assert [r["value"] for r in runs_of(path, mode="quick")] == [120.0]
    base = store.load("nvidia-h200", "3g.71gb")
    assert base is not None
    assert base.get(GEMM, "fp16_tflops", "quick").value == 120.0  # type: ignore[union-attr]
    assert base.other_mode(GEMM, "copy", "normal") is None
    store.save([rec(3.9, name="copy", unit="TB/s", kind="memory", mode="quick")])
    base = store.load("nvidia-h200", "3g.71gb")
    assert base is not None and base.get(GEMM, "copy") is None and base.other_mode(GEMM, "copy", "normal") == "quick"


def test_one_small_line_per_run_and_each_fingerprint_written_once(store: BaselineStore) -> None:
    newer = {**FP, "driver": "590.10"}
    store.save([rec(151.7, samples=[151.0, 151.7, 152.4])])
    store.save([rec(150.0)])
    path = saved(store, rec(149.0, fingerprint=newer))
    text = path.read_text()
    doc = json.loads(text)
    assert doc["schema"] == BASELINE_SCHEMA and text.endswith("}\n")
    run_lines = [line.strip() for line in text.splitlines() if line.strip().startswith('{"at"')]
    assert len(run_lines) == 3 and all(len(line) < 140 for line in run_lines)
    assert len(doc["fingerprints"]) == 2 and FP in doc["fingerprints"].values() and newer in doc["fingerprints"].values()
    runs = runs_of(path)
    assert runs[0]["fp"] == runs[1]["fp"] != runs[2]["fp"]
    assert runs[0]["noise"] == pytest.approx(1.4826 * 0.7 / 151.7, rel=1e-3)  # the run's own spread, for review
    assert list(doc) == sorted(doc)  # stable key order
    base = load_baseline_file(path)
    assert base.meta.fingerprint == newer  # the newest run's
    e = base.get(GEMM, "fp16_tflops")
    assert e is not None and e.fingerprint == newer and e.runs[0].fingerprint == FP


def test_a_changed_unit_or_direction_begins_the_history_anew(store: BaselineStore) -> None:
    store.save([rec(151.7)])
    result = store.save([rec(0.15, unit="PFLOPS")])[0]
    assert result.restarted == [f"{GEMM}::fp16_tflops (TFLOPS, higher -> PFLOPS, higher)"]
    assert [r["value"] for r in runs_of(result.path)] == [0.15]


def test_entries_of_tests_not_in_this_run_are_kept(store: BaselineStore) -> None:
    saved(store, rec(test=GEMM))
    results = store.save([rec(3.9, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory")])
    assert (results[0].written, results[0].kept) == (1, 1)
    assert "1 figure(s) added to their history, 1 kept from earlier runs" in str(results[0])
    assert set(json.loads(results[0].path.read_text())["modes"]["normal"]) == {GEMM, STREAM}


def test_a_tolerance_set_in_review_survives_later_saves(store: BaselineStore) -> None:
    path = saved(store, rec())
    doc = json.loads(path.read_text())
    doc["modes"]["normal"][GEMM]["fp16_tflops"]["tolerance"] = 0.03
    path.write_text(json.dumps(doc))
    store.save([rec(149.0)])
    assert json.loads(path.read_text())["modes"]["normal"][GEMM]["fp16_tflops"]["tolerance"] == 0.03


def test_informational_non_finite_and_non_positive_figures_are_not_saved(store: BaselineStore) -> None:
    results = store.save([rec(), rec(12288, name="size_at_peak", unit="n", compare_=False),
                          rec(math.nan, name="broken", samples=[]), rec(0.0, name="zero", samples=[])])
    doc = json.loads(results[0].path.read_text())
    assert set(doc["modes"]["normal"][GEMM]) == {"fp16_tflops"}
    assert results[0].skipped == [f"{GEMM}::size_at_peak (informational)", f"{GEMM}::broken (value nan)",
                                  f"{GEMM}::zero (value 0.0 is not positive)"]
    assert store.save([rec(1.0, name="size_at_peak", compare_=False)]) == []  # nothing to save: no file touched


def test_unsafe_names_are_refused(store: BaselineStore) -> None:
    for slug, profile in (("../etc", "full"), ("nvidia-h200", "a/b"), ("", "full"), (".hidden", "full")):
        with pytest.raises(BaselineError, match="cannot name a baseline file"):
            store.path_for(slug, profile)
    assert not store.root.exists()


def test_a_fingerprint_json_cannot_hold_is_a_baseline_error(store: BaselineStore) -> None:
    with pytest.raises(BaselineError, match=r"3g\.71gb\.json: not saved, a value cannot be written as JSON"):
        store.save([rec(fingerprint={**FP, "power_limit_w": math.nan})])
    assert store.files() == []


# --------------------------------------------------------------------------- schema 1 files


V1 = {"schema": "pytest-mig/baseline/1", "gpu_model": "NVIDIA H200", "gpu_slug": "nvidia-h200", "profile": "3g.71gb",
      "emulated": False, "fingerprint": FP, "updated_at": "2025-01-01T00:00:00+00:00",
      "tests": {GEMM: {"fp16_tflops": {"value": 151.7, "unit": "TFLOPS", "direction": "higher", "kind": "tensor",
                                       "tolerance": 0.05, "samples": [151.0, 151.7, 152.4],
                                       "spread": {"n": 3, "median": 151.7, "mad": 0.7, "min": 151.0, "max": 152.4},
                                       "recorded_at": "2025-01-01T00:00:00+00:00", "mode": "quick"},
                       "tuned": {"value": 3.0, "unit": "s", "direction": "lower", "tolerance": 0.12}}}}


def test_a_schema_1_file_reads_as_one_run_per_figure_and_is_upgraded_on_save(store: BaselineStore) -> None:
    path = store.path_for("nvidia-h200", "3g.71gb")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(V1))
    base = load_baseline_file(path)
    e = base.get(GEMM, "fp16_tflops", "quick")
    assert e is not None and e.values == [151.7] and e.tolerance is None  # schema 1's default was not a choice
    assert e.runs[0].fingerprint == FP and e.runs[0].recorded_at == "2025-01-01T00:00:00+00:00"
    assert base.get(GEMM, "tuned").tolerance == 0.12  # type: ignore[union-attr]  # a tuned one was
    store.save([rec(150.0, mode="quick")])
    doc = json.loads(path.read_text())
    assert doc["schema"] == BASELINE_SCHEMA
    assert [r["value"] for r in runs_of(path, mode="quick")] == [151.7, 150.0]
    assert doc["modes"]["normal"][GEMM]["tuned"]["tolerance"] == 0.12


# --------------------------------------------------------------------------- strict reading


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


def _entry(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["modes"]["normal"][GEMM]["fp16_tflops"]


def _run(doc: dict[str, Any]) -> dict[str, Any]:
    return _entry(doc)["runs"][0]


CORRUPTIONS: list[tuple[str, Callable[[Path], None], str]] = [
    ("truncated", lambda p: p.write_text(p.read_text()[:40]), "not valid JSON"),
    ("empty", lambda p: p.write_text(""), "not valid JSON"),
    ("not utf-8", lambda p: p.write_bytes(b"\xff\xfe{}"), "cannot be read"),
    ("a list", lambda p: p.write_text("[1, 2]"), "a JSON object is expected"),
    ("other schema", lambda p: _edit(p, lambda d: d.update(schema="pytest-mig/baseline/9")),
     'schema is "pytest-mig/baseline/9"'),
    ("no modes", lambda p: _edit(p, lambda d: d.pop("modes")), "'modes' must be an object"),
    ("emulated not a bool", lambda p: _edit(p, lambda d: d.update(emulated="no")), "'emulated' must be true or false"),
    ("bad keep", lambda p: _edit(p, lambda d: d.update(keep=0)), "'keep' is 0"),
    ("bad mode", lambda p: _edit(p, lambda d: d["modes"].update(fast=d["modes"].pop("normal"))), 'mode "fast"'),
    ("no runs", lambda p: _edit(p, lambda d: _entry(d).update(runs=[])), "needs 'runs', a list of at least one run"),
    ("run without value", lambda p: _edit(p, lambda d: _run(d).pop("value")), "has a run without a 'value'"),
    ("NaN value", lambda p: p.write_text(p.read_text().replace('"value": 151.7', '"value": NaN')),
     "run value is NaN, not a number"),
    ("string value", lambda p: _edit(p, lambda d: _run(d).update(value="151.7")), 'value is "151.7", not a number'),
    ("negative value", lambda p: _edit(p, lambda d: _run(d).update(value=-151.7)), "a figure must be above 0"),
    ("zero value", lambda p: _edit(p, lambda d: _run(d).update(value=0)), "a figure must be above 0"),
    ("size of 0", lambda p: _edit(p, lambda d: _run(d).update(size=0)), "run size is 0, not a problem size"),
    ("fractional size", lambda p: _edit(p, lambda d: _run(d).update(size=1.5)), "run size is 1.5, not a problem size"),
    ("size true", lambda p: _edit(p, lambda d: _run(d).update(size=True)), "run size is true, not a problem size"),
    ("huge size", lambda p: _edit(p, lambda d: _run(d).update(size=2**40)), "a whole number from 1 to 2147483648"),
    ("unknown fingerprint", lambda p: _edit(p, lambda d: _run(d).update(fp="0000000000")),
     'names fingerprint "0000000000"'),
    ("negative tolerance", lambda p: _edit(p, lambda d: _entry(d).update(tolerance=-0.05)),
     "tolerance must be a fraction from 0 up to (not including) 1"),
    ("tolerance of 50", lambda p: _edit(p, lambda d: _entry(d).update(tolerance=50.0)), "found 50.0"),
    ("string tolerance", lambda p: _edit(p, lambda d: _entry(d).update(tolerance="5%")), 'found "5%"'),
    ("no direction", lambda p: _edit(p, lambda d: _entry(d).pop("direction")), "direction null"),
    ("bad direction", lambda p: _edit(p, lambda d: _entry(d).update(direction="up")), 'direction "up"'),
    ("no unit", lambda p: _edit(p, lambda d: _entry(d).pop("unit")), "has no 'unit'"),
    ("bad kind", lambda p: _edit(p, lambda d: _entry(d).update(kind="fast")), 'has kind "fast"'),
    ("entry not an object", lambda p: _edit(p, lambda d: d["modes"]["normal"][GEMM].update(fp16_tflops=151.7)),
     "must be an object"),
    ("another GPU model", lambda p: _edit(p, lambda d: d.update(gpu_model="NVIDIA A100-SXM4-80GB",
                                                                 gpu_slug="nvidia-a100-sxm4-80gb")),
     "recorded on GPU model 'NVIDIA A100-SXM4-80GB'"),
    ("slug of another model", lambda p: _edit(p, lambda d: d.update(gpu_model="NVIDIA H100 80GB HBM3")),
     "a baseline of another GPU model is never used"),
    ("another profile", lambda p: _edit(p, lambda d: d.update(profile="1g.18gb")),
     "recorded for profile '1g.18gb' but named '3g.71gb.json'"),
    ("claims emulated", lambda p: _edit(p, lambda d: d.update(emulated=True)), "emulated baselines are named"),
]


@pytest.mark.parametrize(("how", "corrupt", "phrase"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_corrupt_file_is_one_sentence_naming_it_and_never_overwritten(
    store: BaselineStore, how: str, corrupt: Callable[[Path], None], phrase: str
) -> None:
    path = saved(store, rec())
    corrupt(path)
    broken = path.read_bytes()
    with pytest.raises(BaselineError) as info:
        load_baseline_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert phrase in message
    assert "\n" not in message and "Traceback" not in message
    with pytest.raises(BaselineError) as refused:
        store.save([rec(149.0)])
    assert str(refused.value) == message
    assert path.read_bytes() == broken  # the save refused; the file is as the person left it
    with pytest.raises(BaselineError):  # nor is it judged against: a broken baseline is an error to fix
        Pipeline(StoreHistories(store)).judge([rec(149.0)])
    records, problems = store.records()
    assert records == [] and problems == [message]


def test_other_files_of_the_store_are_still_read(store: BaselineStore) -> None:
    store.save([rec(), rec(40.0, profile="1g.18gb")])
    (store.root / "nvidia-h200" / "1g.18gb.json").write_text("{")
    records, problems = store.records("nvidia-h200")
    assert [(r.target.profile, r.metric.value) for r in records] == [("3g.71gb", 151.7)]
    assert len(problems) == 1 and "1g.18gb.json: not valid JSON" in problems[0]
    assert records[0].node == "baseline" and records[0].target.gpu_slug == "nvidia-h200"
    assert store.records("nvidia-a100-sxm4-80gb") == ([], [])


# --------------------------------------------------------------------------- another GPU model


def test_baseline_of_another_gpu_model_is_never_compared(store: BaselineStore) -> None:
    store.save([rec(100.0, profile="3g.40gb", gpu="NVIDIA A100-SXM4-80GB", slug="nvidia-a100-sxm4-80gb")])
    h100 = rec(50.0, profile="3g.40gb", gpu="NVIDIA H100 80GB HBM3", slug="nvidia-h100-80gb-hbm3")
    v = Pipeline(StoreHistories(store)).judge([h100])[0]
    assert v.outcome == "no-baseline" and not v.failed and v.baseline is None and v.change_pct is None
    assert "nvidia-h100-80gb-hbm3/3g.40gb.json" in v.message

    a100 = store.load("nvidia-a100-sxm4-80gb", "3g.40gb")
    assert a100 is not None
    v = compare(h100, a100)  # handed another model's baseline directly: still not compared
    assert v.outcome == "incomparable" and v.change_pct is None and not v.failed

    # the A100 file copied into the H100 folder: refused, not used
    target = store.path_for("nvidia-h100-80gb-hbm3", "3g.40gb")
    target.parent.mkdir(parents=True)
    target.write_bytes(a100.meta.path.read_bytes())  # type: ignore[union-attr]
    with pytest.raises(BaselineError, match="kept in folder 'nvidia-h100-80gb-hbm3'"):
        Pipeline(StoreHistories(store)).judge([h100])


def test_an_emulated_run_is_not_saved_into_or_judged_against_a_real_slice(store: BaselineStore) -> None:
    saved(store, rec(151.7))
    emulated = rec(60.0, emulated=True)
    v = Pipeline(StoreHistories(store)).judge([emulated])[0]
    assert v.outcome == "no-baseline" and "3g.71gb-emulated.json" in v.message
    store.save([emulated])
    base = store.load("nvidia-h200", "3g.71gb")
    assert base is not None and base.get(GEMM, "fp16_tflops").value == 151.7  # type: ignore[union-attr]


# --------------------------------------------------------------------------- concurrency and interruption

_SAVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pytest_mig.store.baselines import BaselineStore
    from pytest_mig.measure import Metric
    from pytest_mig.store.results import ResultRecord
    from pytest_mig.device.target import TargetInfo

    root, prefix, go, count = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    target = {"kind": "mig", "profile": "3g.71gb", "baseline_profile": "3g.71gb", "gpu_name": "NVIDIA H200",
              "gpu_slug": "nvidia-h200", "emulated": False}
    store = BaselineStore(root)
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    for i in range(count):
        metric = Metric("rate", 100.0 + i, "items/s", "higher", [99.0, 100.0, 101.0])
        store.save([ResultRecord(f"{prefix}{i}", metric, TargetInfo.from_dict(target), {"driver": "580"})])
""")


def test_two_processes_saving_at_once_both_land(store: BaselineStore, tmp_path: Path) -> None:
    """Each process saves its own tests one by one into the same file; without the lock one
    process's read-merge-write loses the other's entries."""
    go = tmp_path / "go"
    count = 15
    procs = [subprocess.Popen([sys.executable, "-c", _SAVER, str(store.root), prefix, str(go), str(count)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for prefix in ("a", "b")]
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    doc = json.loads(store.path_for("nvidia-h200", "3g.71gb").read_text())
    assert set(doc["modes"]["normal"]) == {f"{p}{i}" for p in "ab" for i in range(count)}
    assert [p.name for p in store.path_for("nvidia-h200", "3g.71gb").parent.iterdir()] == ["3g.71gb.json"]


def test_a_save_waiting_too_long_for_the_lock_says_so(store: BaselineStore, monkeypatch: pytest.MonkeyPatch) -> None:
    path = saved(store, rec())
    before = path.read_bytes()
    with folder_lock(store.root):  # another run is saving
        with pytest.raises(BaselineError, match=r"baselines: another run held the baseline folder's lock for 0 s"):
            with monkeypatch.context() as m:
                m.setattr(baselines, "LOCK_TIMEOUT_S", 0.05)
                store.save([rec(140.0)])
    assert path.read_bytes() == before
    store.save([rec(140.0)])  # released: the next save goes through
    assert len(runs_of(path)) == 2


@pytest.mark.parametrize(("failure", "raised"), [(OSError(28, "No space left on device"), BaselineError),
                                                 (KeyboardInterrupt(), KeyboardInterrupt)], ids=["disk-full", "ctrl-c"])
def test_an_interrupted_save_leaves_the_old_file_and_no_partial_file(
    store: BaselineStore, monkeypatch: pytest.MonkeyPatch, failure: BaseException, raised: type[BaseException]
) -> None:
    path = saved(store, rec())
    before = path.read_bytes()
    real_replace = os.replace

    def dies(src: Any, dst: Any) -> None:
        assert Path(src).read_text().startswith("{")  # the new content was fully written to the temporary file
        raise failure

    monkeypatch.setattr(os, "replace", dies)
    with pytest.raises(raised) as info:
        store.save([rec(140.0)])
    if raised is BaselineError:  # one sentence for the plugin to print, not a traceback
        assert str(info.value) == (f"{path}: not saved, the file could not be written (No space left on device); "
                                   f"it is as it was before this save")
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["3g.71gb.json"]  # no temporary file left
    with pytest.raises(raised):  # a first save of another profile leaves nothing at all
        store.save([rec(40.0, profile="1g.18gb")])
    assert sorted(p.name for p in path.parent.iterdir()) == ["3g.71gb.json"]

    monkeypatch.setattr(os, "replace", real_replace)
    store.save([rec(140.0)])  # the lock was released: the next save works
    assert runs_of(path)[-1]["value"] == 140.0


def test_a_save_dying_while_writing_the_temporary_file_leaves_nothing(
    store: BaselineStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = saved(store, rec())
    before = path.read_bytes()

    def no_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", no_fsync)
    with pytest.raises(BaselineError, match=r"3g\.71gb\.json: not saved, the file could not be written \(Input/output"):
        store.save([rec(140.0)])
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["3g.71gb.json"]


def test_a_baseline_folder_that_cannot_be_created_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    store = BaselineStore(tmp_path / "a-file" / "baselines")
    with pytest.raises(BaselineError, match=r"a-file/baselines: baselines cannot be written there \(Not a directory\)"):
        store.save([rec()])


def test_saved_file_keeps_its_permissions(store: BaselineStore) -> None:
    path = saved(store, rec())
    assert path.stat().st_mode & 0o777 == 0o644  # readable by the team, not the temporary file's 0600
    path.chmod(0o664)
    store.save([rec(150.0)])
    assert path.stat().st_mode & 0o777 == 0o664


def test_a_killed_save_s_temporary_file_is_removed_by_the_next_save(store: BaselineStore) -> None:
    path = saved(store, rec())
    dead = path.parent / f".{path.name}.abc123.tmp"  # what atomic_write_text leaves when killed mid-write
    dead.write_text('{"half": ')
    other = path.parent / ".someone-else.tmp"  # not this tool's naming: left alone
    other.write_text("")
    store.save([rec(150.0)])
    assert not dead.exists() and other.exists()


def test_an_energy_figures_temperature_is_kept_with_its_run_and_an_impossible_one_is_not(store: BaselineStore) -> None:
    def energy(value: float, temperature: Any, at: str) -> ResultRecord:
        r = rec(value, name="fp16_energy_j_per_tflop", unit="J/TFLOP", direction="lower", kind="energy", timestamp=at)
        r.metric.info["temperature_c"] = temperature
        return r

    store.save([energy(1.50, 57.0, "2025-01-01T00:00:00+00:00"), energy(1.52, 1e308, "2025-01-02T00:00:00+00:00"),
                energy(1.51, float("nan"), "2025-01-03T00:00:00+00:00")])
    runs = store.load("nvidia-h200", "3g.71gb").get(GEMM, "fp16_energy_j_per_tflop", "normal").runs
    assert [r.temperature_c for r in runs] == [57.0, None, None]  # the file read back whole, as the schema checks it
    gemm = rec()
    gemm.metric.info["temperature_c"] = 60.0  # a rate figure's is not an energy reading: not kept
    store.save([gemm])
    assert store.load("nvidia-h200", "3g.71gb").get(GEMM, "fp16_tflops", "normal").runs[-1].temperature_c is None
