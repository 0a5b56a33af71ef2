"""The baseline store on synthetic records: file layout, stable human-readable JSON, merging,
strict reading of hand-broken files, concurrent and interrupted saves, never crossing GPU models."""

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
from filelock import FileLock

from pytest_mig import baselines
from pytest_mig.baselines import (
    BASELINE_SCHEMA,
    LOCK_NAME,
    MAX_KEPT_SAMPLES,
    BaselineError,
    BaselineStore,
    load_baseline_file,
)
from pytest_mig.measure import Metric
from pytest_mig.results import ResultRecord
from pytest_mig.verdict import compare, judge

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
) -> ResultRecord:
    """A record as the mig_bench fixture makes it (Target.to_dict() shape), with fixed timestamp."""
    target = {"kind": "emulated" if emulated else "mig", "profile": profile,
              "baseline_profile": f"{profile}-emulated" if emulated else profile,
              "gpu_name": gpu, "gpu_slug": slug, "emulated": emulated}
    xs = [value * (1 + 0.002 * (i % 5 - 2)) for i in range(12)] if samples is None else samples
    metric = Metric(name, value, unit, direction, xs, kind, {}, compare_)  # type: ignore[arg-type]
    return ResultRecord(test, metric, target, dict(FP if fingerprint is None else fingerprint), timestamp, node="n1")


@pytest.fixture
def store(tmp_path: Path) -> BaselineStore:
    return BaselineStore(tmp_path / "baselines")


def saved(store: BaselineStore, *records: ResultRecord) -> Path:
    results = store.save(records)
    assert len(results) == 1
    return results[0].path


# --------------------------------------------------------------------------- layout and format


def test_file_per_gpu_model_and_profile_with_emulated_kept_apart(store: BaselineStore) -> None:
    results = store.save([rec(), rec(120.0, emulated=True), rec(40.0, profile="1g.18gb"),
                          rec(300.0, gpu="NVIDIA H100 80GB HBM3", slug="nvidia-h100-80gb-hbm3", profile="3g.40gb")])
    assert sorted(str(r.path.relative_to(store.root)) for r in results) == [
        "nvidia-h100-80gb-hbm3/3g.40gb.json",
        "nvidia-h200/1g.18gb.json",
        "nvidia-h200/3g.71gb-emulated.json",
        "nvidia-h200/3g.71gb.json",
    ]
    assert store.files() == sorted(r.path for r in results)  # the lock file is not a baseline
    real = json.loads((store.root / "nvidia-h200/3g.71gb.json").read_text())
    emulated = json.loads((store.root / "nvidia-h200/3g.71gb-emulated.json").read_text())
    assert (real["profile"], real["emulated"]) == ("3g.71gb", False)
    assert (emulated["profile"], emulated["emulated"]) == ("3g.71gb-emulated", True)
    assert real["tests"][GEMM]["fp16_tflops"]["value"] == 151.7
    assert emulated["tests"][GEMM]["fp16_tflops"]["value"] == 120.0


def test_file_holds_fingerprint_and_per_metric_value_unit_direction_spread_tolerance(store: BaselineStore) -> None:
    path = saved(store, rec(samples=[150.0 + i for i in range(15)]),
                 rec(3.91, name="copy_tbs", unit="TB/s", kind="memory", samples=[3.9, 3.91, 3.92]))
    doc = json.loads(path.read_text())
    assert doc["schema"] == BASELINE_SCHEMA
    assert (doc["gpu_model"], doc["gpu_slug"], doc["profile"]) == ("NVIDIA H200", "nvidia-h200", "3g.71gb")
    assert doc["fingerprint"] == FP
    gemm = doc["tests"][GEMM]["fp16_tflops"]
    assert (gemm["value"], gemm["unit"], gemm["direction"], gemm["kind"], gemm["tolerance"]) == (
        151.7, "TFLOPS", "higher", "tensor", 0.05)
    assert gemm["spread"] == {"n": 15, "median": 157.0, "mad": 4.0, "min": 150.0, "max": 164.0}
    assert len(gemm["samples"]) == MAX_KEPT_SAMPLES and gemm["samples"][0] == 150.0 and gemm["samples"][-1] == 164.0
    assert "fingerprint" not in gemm  # shared with the file
    assert doc["tests"][GEMM]["copy_tbs"]["unit"] == "TB/s"


def test_json_is_sorted_indented_and_ends_with_a_newline(store: BaselineStore) -> None:
    path = saved(store, rec(), rec(3.9, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory"))
    text = path.read_text()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert '\n  "fingerprint": {\n    "cuda_driver": "13.0",' in text  # one key per line, for review


def test_resaving_unchanged_data_gives_identical_bytes(store: BaselineStore, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [rec(), rec(3.9, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory")]
    monkeypatch.setattr(baselines, "utc_now", lambda: "2025-01-01T00:00:00+00:00")
    path = saved(store, *records)
    first = path.read_bytes()
    monkeypatch.setattr(baselines, "utc_now", lambda: "2025-06-30T12:00:00+00:00")  # a later save
    again = store.save(records)
    assert path.read_bytes() == first
    assert again[0].unchanged and "unchanged" in str(again[0])
    # a real change is written, with the new date
    store.save([rec(152.0)])
    doc = json.loads(path.read_text())
    assert doc["updated_at"] == "2025-06-30T12:00:00+00:00"
    assert doc["tests"][GEMM]["fp16_tflops"]["value"] == 152.0


def test_saved_file_loads_back(store: BaselineStore) -> None:
    saved(store, rec(151.73456789, samples=[151.7, 151.8, 151.6]))
    base = store.load("nvidia-h200", "3g.71gb")
    assert base is not None
    e = base.get(GEMM, "fp16_tflops")
    assert e is not None
    assert e.value == pytest.approx(151.735)  # six significant digits
    assert (e.unit, e.direction, e.kind, e.tolerance) == ("TFLOPS", "higher", "tensor", 0.05)
    assert e.spread is not None and e.spread.n == 3 and e.spread.median == pytest.approx(151.7)
    assert e.fingerprint == FP
    assert base.meta.path == store.path_for("nvidia-h200", "3g.71gb")
    assert store.load("nvidia-h200", "1g.18gb") is None


# --------------------------------------------------------------------------- merging


def test_tolerance_tuned_in_the_file_survives_a_resave(store: BaselineStore) -> None:
    path = saved(store, rec())
    doc = json.loads(path.read_text())
    doc["tests"][GEMM]["fp16_tflops"]["tolerance"] = 0.12  # tuned by hand in review
    path.write_text(json.dumps(doc, indent=2))
    store.save([rec(149.0), rec(3.9, name="copy_tbs", unit="TB/s", kind="memory")], default_tolerance=0.03)
    doc = json.loads(path.read_text())
    assert doc["tests"][GEMM]["fp16_tflops"]["value"] == 149.0
    assert doc["tests"][GEMM]["fp16_tflops"]["tolerance"] == 0.12
    assert doc["tests"][GEMM]["copy_tbs"]["tolerance"] == 0.03  # a new metric gets the default


def test_entries_of_tests_not_in_this_run_are_kept_with_their_fingerprint(store: BaselineStore) -> None:
    saved(store, rec(test=GEMM))
    newer = {**FP, "driver": "590.10"}
    results = store.save([rec(3.9, test=STREAM, name="copy_tbs", unit="TB/s", kind="memory", fingerprint=newer)])
    assert (results[0].written, results[0].kept) == (1, 1)
    assert "1 metric(s) from this run, 1 kept from earlier runs" in str(results[0])
    doc = json.loads(results[0].path.read_text())
    assert set(doc["tests"]) == {GEMM, STREAM}
    assert doc["fingerprint"]["driver"] == "590.10"
    assert doc["tests"][GEMM]["fp16_tflops"]["fingerprint"]["driver"] == "580.159.04"  # what it was recorded under
    assert "fingerprint" not in doc["tests"][STREAM]["copy_tbs"]
    base = store.load("nvidia-h200", "3g.71gb")
    assert base is not None and base.get(GEMM, "fp16_tflops").fingerprint["driver"] == "580.159.04"  # type: ignore[union-attr]


def test_informational_and_non_finite_metrics_are_not_saved(store: BaselineStore) -> None:
    results = store.save([rec(), rec(12288, name="size_at_peak", unit="n", compare_=False),
                          rec(math.nan, name="broken", samples=[])])
    doc = json.loads(results[0].path.read_text())
    assert set(doc["tests"][GEMM]) == {"fp16_tflops"}
    assert results[0].skipped == [f"{GEMM}::size_at_peak (informational)", f"{GEMM}::broken (value nan)"]
    assert store.save([rec(1.0, name="size_at_peak", compare_=False)]) == []  # nothing to save: no file touched


def test_bad_default_tolerance_and_unsafe_names_are_refused(store: BaselineStore) -> None:
    with pytest.raises(BaselineError, match="non-negative fraction"):
        store.save([rec()], default_tolerance=-0.05)
    for slug, profile in (("../etc", "full"), ("nvidia-h200", "a/b"), ("", "full"), (".hidden", "full")):
        with pytest.raises(BaselineError, match="cannot name a baseline file"):
            store.path_for(slug, profile)
    assert not store.root.exists()


def test_a_fingerprint_json_cannot_hold_is_a_baseline_error(store: BaselineStore) -> None:
    with pytest.raises(BaselineError, match=r"3g\.71gb\.json: not saved, a value cannot be written as JSON"):
        store.save([rec(fingerprint={**FP, "power_limit_w": math.nan})])
    assert store.files() == []


# --------------------------------------------------------------------------- strict reading


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=2))


def _entry(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["tests"][GEMM]["fp16_tflops"]


CORRUPTIONS: list[tuple[str, Callable[[Path], None], str]] = [
    ("truncated", lambda p: p.write_text(p.read_text()[:40]), "not valid JSON"),
    ("empty", lambda p: p.write_text(""), "not valid JSON"),
    ("not utf-8", lambda p: p.write_bytes(b"\xff\xfe{}"), "cannot be read"),
    ("a list", lambda p: p.write_text("[1, 2]"), "a JSON object is expected"),
    ("other schema", lambda p: _edit(p, lambda d: d.update(schema="pytest-mig/baseline/9")),
     'schema is "pytest-mig/baseline/9"'),
    ("no tests", lambda p: _edit(p, lambda d: d.pop("tests")), "'tests' must be an object"),
    ("emulated not a bool", lambda p: _edit(p, lambda d: d.update(emulated="no")), "'emulated' must be true or false"),
    ("fingerprint a list", lambda p: _edit(p, lambda d: d.update(fingerprint=[])), "'fingerprint' must be an object"),
    ("no value", lambda p: _edit(p, lambda d: _entry(d).pop("value")), "metric 'fp16_tflops' has no 'value'"),
    ("NaN value", lambda p: p.write_text(p.read_text().replace('"value": 151.7', '"value": NaN')),
     "value is NaN, not a number"),
    ("string value", lambda p: _edit(p, lambda d: _entry(d).update(value="151.7")), 'value is "151.7", not a number'),
    ("bool value", lambda p: _edit(p, lambda d: _entry(d).update(value=True)), "value is true, not a number"),
    ("negative tolerance", lambda p: _edit(p, lambda d: _entry(d).update(tolerance=-0.05)),
     "tolerance -0.05 is negative"),
    ("string tolerance", lambda p: _edit(p, lambda d: _entry(d).update(tolerance="5%")), "tolerance is \"5%\""),
    ("no direction", lambda p: _edit(p, lambda d: _entry(d).pop("direction")), "direction null"),
    ("bad direction", lambda p: _edit(p, lambda d: _entry(d).update(direction="up")), 'direction "up"'),
    ("no unit", lambda p: _edit(p, lambda d: _entry(d).pop("unit")), "has no 'unit'"),
    ("bad kind", lambda p: _edit(p, lambda d: _entry(d).update(kind="fast")), 'has kind "fast"'),
    ("bad mode", lambda p: _edit(p, lambda d: _entry(d).update(mode="fast")), 'has mode "fast"; use "normal" or "quick"'),
    ("string sample", lambda p: _edit(p, lambda d: _entry(d)["samples"].append("x")), 'sample is "x", not a number'),
    ("samples not a list", lambda p: _edit(p, lambda d: _entry(d).update(samples=0)), "samples must be a list"),
    ("spread count", lambda p: _edit(p, lambda d: _entry(d)["spread"].update(n=-1)), "spread n is -1, not a count"),
    ("entry not an object", lambda p: _edit(p, lambda d: d["tests"][GEMM].update(fp16_tflops=151.7)),
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
    with pytest.raises(BaselineError, match="not valid JSON|must|not a|no '|negative|direction|kind|mode|recorded|"
                                            "emulated|schema|cannot"):
        store.save([rec(149.0)])
    assert path.read_bytes() == broken  # the save refused; the file is as the person left it
    with pytest.raises(BaselineError):  # nor is it judged against: a broken baseline is an error to fix
        judge([rec(149.0)], store)
    records, problems = store.records()
    assert records == [] and problems == [message]


def test_other_files_of_the_store_are_still_read(store: BaselineStore) -> None:
    store.save([rec(), rec(40.0, profile="1g.18gb")])
    (store.root / "nvidia-h200" / "1g.18gb.json").write_text("{")
    records, problems = store.records("nvidia-h200")
    assert [(r.target["profile"], r.metric.value) for r in records] == [("3g.71gb", 151.7)]
    assert len(problems) == 1 and "1g.18gb.json: not valid JSON" in problems[0]
    assert records[0].node == "baseline" and records[0].target["gpu_slug"] == "nvidia-h200"
    assert store.records("nvidia-a100-sxm4-80gb") == ([], [])


# --------------------------------------------------------------------------- another GPU model


def test_baseline_of_another_gpu_model_is_never_compared(store: BaselineStore) -> None:
    store.save([rec(100.0, profile="3g.40gb", gpu="NVIDIA A100-SXM4-80GB", slug="nvidia-a100-sxm4-80gb")])
    h100 = rec(50.0, profile="3g.40gb", gpu="NVIDIA H100 80GB HBM3", slug="nvidia-h100-80gb-hbm3")
    v = judge([h100], store)[0]
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
        judge([h100], store)


def test_an_emulated_run_is_not_saved_into_or_judged_against_a_real_slice(store: BaselineStore) -> None:
    saved(store, rec(151.7))
    emulated = rec(60.0, emulated=True)
    v = judge([emulated], store)[0]
    assert v.outcome == "no-baseline" and "3g.71gb-emulated.json" in v.message
    store.save([emulated])
    base = store.load("nvidia-h200", "3g.71gb")
    assert base is not None and base.get(GEMM, "fp16_tflops").value == 151.7  # type: ignore[union-attr]


# --------------------------------------------------------------------------- concurrency and interruption

_SAVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pytest_mig.baselines import BaselineStore
    from pytest_mig.measure import Metric
    from pytest_mig.results import ResultRecord

    root, prefix, go, count = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    target = {"kind": "mig", "profile": "3g.71gb", "baseline_profile": "3g.71gb", "gpu_name": "NVIDIA H200",
              "gpu_slug": "nvidia-h200", "emulated": False}
    store = BaselineStore(root)
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    for i in range(count):
        metric = Metric("rate", 100.0 + i, "items/s", "higher", [99.0, 100.0, 101.0])
        store.save([ResultRecord(f"{prefix}{i}", metric, target, {"driver": "580"})])
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
    assert set(doc["tests"]) == {f"{p}{i}" for p in "ab" for i in range(count)}
    assert [p.name for p in store.path_for("nvidia-h200", "3g.71gb").parent.iterdir()] == ["3g.71gb.json"]


def test_a_save_waiting_too_long_for_the_lock_says_so(store: BaselineStore, monkeypatch: pytest.MonkeyPatch) -> None:
    path = saved(store, rec())
    before = path.read_bytes()
    monkeypatch.setattr(baselines, "LOCK_TIMEOUT_S", 0.05)
    with FileLock(str(store.root / LOCK_NAME)):  # another run is saving
        with pytest.raises(BaselineError, match=r"\.pytest-mig\.lock: another run held the baseline lock"):
            store.save([rec(140.0)])
    assert path.read_bytes() == before


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
    assert json.loads(path.read_text())["tests"][GEMM]["fp16_tflops"]["value"] == 140.0


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


def test_energy_entries_get_at_least_the_energy_tolerance(tmp_path: Path) -> None:
    from pytest_mig.baselines import KIND_MIN_TOLERANCE
    from pytest_mig.measure import Metric as _Metric
    from pytest_mig.results import ResultRecord as _Record

    target = {"kind": "full", "profile": "full", "gpu_name": "NVIDIA H200", "gpu_slug": "nvidia-h200",
              "emulated": False, "baseline_profile": "full"}
    records = [_Record("t", _Metric("j_per_tflop", 1.0, "J/TFLOP", "lower", [], kind="energy"), target, {}),
               _Record("t", _Metric("tflops", 1.0, "TFLOPS", "higher", [], kind="tensor"), target, {})]
    store = BaselineStore(tmp_path)
    store.save(records, default_tolerance=0.05)
    base = store.load("nvidia-h200", "full")
    assert base is not None
    assert base.get("t", "j_per_tflop").tolerance == KIND_MIN_TOLERANCE["energy"] > 0.05
    assert base.get("t", "tflops").tolerance == 0.05
