"""Shipped references: the band against another board, building a reference folder from results
files, reading it strictly, and judging a figure with no local history against it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_verdict import FP_OLD, TEST, record

from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.history import BaselineError
from pytest_mig.cli import main, reference_lines
from pytest_mig.measure import Metric
from pytest_mig.judge.noise import DETECT_Z, PRIOR_BOARD, PRIOR_SPREAD, REFERENCE_FLOOR, REFERENCE_MAX, K, reference_band
from pytest_mig.judge.reference import (
    SHIPPED,
    ReferenceStore,
    board_name,
    build,
    fingerprint_beside,
    judged_against,
    pooled_sigma,
    profile_spread,
)
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.verdicts import Verdict
from pytest_mig.store.results import ResultRecord, write_results
from pytest_mig.judge.pipeline import Pipeline, RecordHistories, StoreHistories
from pytest_mig.judge.verdict import compare_reference

BOARD = {**FP_OLD, "gpu_uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000001"}


def results_file(tmp_path: Path, name: str, values: dict[str, float], **kw) -> Path:
    """A results file of one run: figure name -> value (higher is better, TFLOPS)."""
    path = tmp_path / f"{name}.json"
    recs = [record(v, name=metric, fingerprint=dict(BOARD), **kw) for metric, v in values.items()]
    recs.append(record(8192, name="size_at_peak", unit="n", kind="info", compare_=False, fingerprint=dict(BOARD), **kw))
    write_results(path, recs)
    return path


@pytest.fixture
def refs(tmp_path: Path) -> ReferenceStore:
    """A reference of an H200's 3g.71gb made of five runs: a quiet figure and a noisy one."""
    quiet = [100.0, 100.4, 99.7, 100.2, 99.9]
    noisy = [100.0, 91.0, 108.0, 96.0, 104.0]
    files = [results_file(tmp_path, f"run{i}", {"fp16_tflops": q, "small_batch_tflops": n})
             for i, (q, n) in enumerate(zip(quiet, noisy))]
    build(files, tmp_path / "ref")
    return ReferenceStore(tmp_path / "ref")


# --------------------------------------------------------------------------- the band


def test_the_reference_band_is_at_least_the_board_to_board_floor() -> None:
    b = reference_band([100.0, 100.5, 99.5], 0.004)
    assert b.threshold == REFERENCE_FLOOR and b.gates and b.basis == "reference"
    assert b.detectable == pytest.approx(REFERENCE_FLOOR + DETECT_Z * 0.004)


def test_a_noisier_figure_gets_a_wider_band_and_one_beyond_the_maximum_is_not_judged() -> None:
    wide = reference_band([100.0], 0.022)
    assert wide.threshold == pytest.approx(K * 0.022) and wide.gates
    assert not reference_band([100.0], REFERENCE_MAX / K + 0.001).gates
    unknown = reference_band([100.0], None)  # one run: its noise is unknown, so it is shown, not judged
    assert unknown.sigma is None and not unknown.gates


def test_sigma_is_pooled_over_profiles_each_relative_to_its_own_median() -> None:
    assert pooled_sigma([[100.0], [7.0]]) is None  # no repeat anywhere
    same = pooled_sigma([[99.0, 101.0], [9.9, 10.1]])
    assert same == pytest.approx(math.sqrt((4 * 0.01 ** 2) / 2))


# --------------------------------------------------------------------------- building and reading


def test_build_writes_a_baseline_file_per_profile_without_the_board_and_with_pooled_sigma(
        tmp_path: Path, refs: ReferenceStore) -> None:
    path = tmp_path / "ref" / "nvidia-h200" / "3g.71gb.json"
    doc = json.loads(path.read_text())
    assert doc["schema"] == "pytest-mig/baseline/2" and doc["profile"] == "3g.71gb"
    (fp,) = doc["fingerprints"].values()
    assert "gpu_uuid" not in fp and fp["driver"] == FP_OLD["driver"]  # the model, not one board ...
    assert fp["board"] == board_name(BOARD["gpu_uuid"]) != BOARD["gpu_uuid"]  # ... named by an anonymous tag
    assert doc["reference"]["runs"] == {"normal": 5}
    sigma = doc["reference"]["sigma"]["normal"][TEST]
    assert doc["reference"]["board_sigma"]["normal"][TEST] == sigma  # one board: its noise is all there is
    assert 0.002 < sigma["fp16_tflops"] < 0.005 and sigma["small_batch_tflops"] > 0.05
    assert "size_at_peak" not in doc["modes"]["normal"][TEST]  # informational figures are not references
    ref = refs.load("nvidia-h200", "3g.71gb")
    assert ref is not None and ref.sigma_for(ref.get(TEST, "fp16_tflops", "normal")) == sigma["fp16_tflops"]
    assert refs.models() == {"NVIDIA H200": ["3g.71gb"]}


def test_the_noise_on_one_board_leaves_out_the_step_between_boards(tmp_path: Path) -> None:
    """Two boards 4% apart, each quiet: the sigma across boards holds the step, the sigma on one
    board does not; with fewer than 4 degrees of freedom on one board none is written."""
    files = []
    for b, level in enumerate((100.0, 104.0)):
        fp = {**FP_OLD, "gpu_uuid": f"GPU-board-{b}"}
        for n in range(3):
            path = tmp_path / f"b{b}n{n}.json"
            r = record(level * (1 + 0.001 * (n - 1)), name="fp16_tflops", fingerprint=fp)
            write_results(path, [replace(r, timestamp=f"2026-01-0{n + 1}T0{b}:00:00+00:00")])
            files.append(path)
    build(files, tmp_path / "ref")
    ref = ReferenceStore(tmp_path / "ref").load("nvidia-h200", "3g.71gb")
    assert ref is not None
    entry = ref.get(TEST, "fp16_tflops", "normal")
    assert entry is not None and len({r.fingerprint["board"] for r in entry.runs}) == 2
    assert ref.sigma_for(entry) > 0.015 and ref.board_sigma_for(entry) == pytest.approx(0.001, rel=0.05)
    build(files[:2] + files[3:5], tmp_path / "thin")  # two runs a board: 2 degrees of freedom
    thin = ReferenceStore(tmp_path / "thin").load("nvidia-h200", "3g.71gb")
    assert thin is not None and thin.sigma and not thin.board_sigma


def _two_profiles(tmp_path: Path, once: str, thrice: str, apart: float = 2.0) -> ReferenceStore:
    """A reference of two profiles of one model: ``thrice`` run three nights on each of three boards,
    quiet (0.1%); ``once`` run once on each of the same boards, ``apart`` percent apart."""
    files = []
    for b in range(3):
        fp = {**FP_OLD, "gpu_uuid": f"GPU-board-{b}"}
        for n in range(3):
            r = record(100.0 * (1 + 0.001 * (n - 1)), name="fp16_tflops", fingerprint=fp, **_profile(thrice))
            files.append(tmp_path / f"thrice-b{b}n{n}.json")
            write_results(files[-1], [replace(r, timestamp=f"2026-01-0{n + 1}T0{b}:00:00+00:00")])
        r = record(100.0 + apart * (b - 1), name="fp16_tflops", fingerprint=fp, **_profile(once))
        files.append(tmp_path / f"once-b{b}.json")
        write_results(files[-1], [replace(r, timestamp=f"2026-01-05T0{b}:00:00+00:00")])
    build(files, tmp_path / "ref")
    return ReferenceStore(tmp_path / "ref")


def _profile(name: str) -> dict[str, str]:
    """``record``'s profile arguments for a baseline profile name: 'full', '3g.71gb', '2g.35gb-emulated'."""
    if name == "full":
        return {"profile": "full", "target_kind": "full"}
    if name.endswith("-emulated"):
        return {"profile": name.removesuffix("-emulated"), "target_kind": "emulated"}
    return {"profile": name, "target_kind": "mig"}


def _judged(store: ReferenceStore, profile: str, boards: tuple[str, ...]) -> Verdict:
    """A second night of ``profile`` on board 0, judged against a night on each of ``boards``."""
    history = [record(100.0, name="fp16_tflops", fingerprint={**FP_OLD, "gpu_uuid": f"GPU-board-{b}"},
                      **_profile(profile)) for b in boards]
    return Pipeline(RecordHistories([history]), references=store).judge([replace(history[0])])[0]


def test_an_emulated_profile_run_once_a_board_is_judged_with_no_less_than_its_spread(tmp_path: Path) -> None:
    """Nothing shows an emulated profile's boards agree night to night where the reference ran each
    once: a history of one board of it, or of several, is judged with no less than their 2% spread
    across boards, and the verdict says whose; the whole GPU keeps its 0.1% on one board."""
    store = _two_profiles(tmp_path, "2g.35gb-emulated", "full")
    full, emulated = store.load("nvidia-h200", "full"), store.load("nvidia-h200", "2g.35gb-emulated")
    assert full is not None and emulated is not None
    part = emulated.get(TEST, "fp16_tflops", "normal")
    assert part is not None and emulated.spread_for(part) == pytest.approx(pooled_sigma([[98.0, 100.0, 102.0]]))
    whole = _judged(store, "full", ("0",))
    assert whole.sigma_of == PRIOR_BOARD and whole.threshold == pytest.approx(0.01)  # the floor
    for boards in (("0",), ("1",)):  # this board's night, another board's
        v = _judged(store, "2g.35gb-emulated", boards)
        assert v.sigma_of == PRIOR_SPREAD and v.threshold == pytest.approx(K * 0.02 * math.sqrt(2), rel=1e-6)
        assert "x the run-to-run sigma of the reference, across this profile's boards" in v.message
    quiet = _judged(_two_profiles(tmp_path / "quiet", "2g.35gb-emulated", "full", apart=0.5), "2g.35gb-emulated", ("0",))
    assert quiet.sigma_of == PRIOR_SPREAD and quiet.gates and (quiet.threshold or 1) < 0.05  # 5 x 0.5% x 1.41
    assert "(the reference's for this GPU model, this emulated profile's spread across its boards" in quiet.message
    assert profile_spread({"a": [98.0], "b": [102.0, 101.0]}) is None  # a board repeats: its runs show the noise
    assert profile_spread({"a": [98.0]}) is None  # one board: no spread to read


def test_a_real_profile_run_once_a_board_keeps_the_noise_on_one_board(tmp_path: Path) -> None:
    """A site's own reference of the whole GPU run once a board (its slices nightly): the boards'
    spread is theirs, not a night's, and a history of one board still gates on the model's 0.1%."""
    store = _two_profiles(tmp_path, "full", "3g.71gb")
    full = store.load("nvidia-h200", "full")
    entry = full.get(TEST, "fp16_tflops", "normal") if full is not None else None
    assert full is not None and entry is not None and full.spread_for(entry) is None
    v = _judged(store, "full", ("0",))
    assert v.sigma_of == PRIOR_BOARD and v.threshold == pytest.approx(0.01)


def test_a_reference_whose_board_sigma_is_not_a_number_is_an_error_naming_the_file(
        tmp_path: Path, refs: ReferenceStore) -> None:
    path = tmp_path / "ref" / "nvidia-h200" / "3g.71gb.json"
    doc = json.loads(path.read_text())
    doc["reference"]["board_sigma"]["normal"][TEST]["fp16_tflops"] = -0.1
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"3g\.71gb\.json: reference board sigma of .*fp16_tflops .*-0\.1"):
        ReferenceStore(tmp_path / "ref").load("nvidia-h200", "3g.71gb")


def test_a_profile_keeps_the_sigma_of_its_own_figures_only(tmp_path: Path, refs: ReferenceStore) -> None:
    """A profile measured in quick mode only holds no normal-mode sigma, not an empty one per test."""
    for i, v in enumerate((50.0, 50.2)):
        build([results_file(tmp_path, f"quick{i}", {"fp16_tflops": v}, profile="1g.18gb", mode="quick")],
              tmp_path / "ref")
    quick = json.loads((tmp_path / "ref" / "nvidia-h200" / "1g.18gb.json").read_text())["reference"]
    normal = json.loads((tmp_path / "ref" / "nvidia-h200" / "3g.71gb.json").read_text())["reference"]
    assert list(quick["sigma"]) == ["quick"] and quick["sigma"]["quick"][TEST]["fp16_tflops"] > 0
    assert list(normal["sigma"]) == ["normal"] and set(normal["sigma"]["normal"][TEST]) == {
        "fp16_tflops", "small_batch_tflops"}


def test_build_rewrites_the_sigma_under_the_folder_lock_a_concurrent_save_waits_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_mig.judge.reference as reference
    from pytest_mig.common.files import folder_lock

    out, held = tmp_path / "ref", []
    real_write = reference.atomic_write_text

    def write(path: Path, text: str, **kwargs: Any) -> None:  # another process's save would try the lock now
        try:
            with folder_lock(out, timeout=0.1):
                held.append(False)
        except TimeoutError:
            held.append(True)
        real_write(path, text, **kwargs)

    monkeypatch.setattr(reference, "atomic_write_text", write)
    build([results_file(tmp_path, "run0", {"fp16_tflops": 100.0})], out)
    assert held == [True]


def test_a_figure_its_run_re_measured_enters_as_the_median_of_its_measurements(tmp_path: Path) -> None:
    """A first reading the run itself found transient (re-measured within 0.3%) must not set the
    figure's pooled sigma: it enters the reference as the median of the run's three measurements."""
    calm = results_file(tmp_path, "calm", {"fp16_tflops": 100.0})
    dipped = tmp_path / "dipped.json"
    rec = record(64.0, name="fp16_tflops", fingerprint=dict(BOARD))
    rec.verdict = Verdict.from_dict({"outcome": "transient", "confirmations": [100.3, 100.1, float("nan")]})
    write_results(dipped, [rec])
    build([calm, dipped], tmp_path / "ref")
    ref = ReferenceStore(tmp_path / "ref").load("nvidia-h200", "3g.71gb")
    entry = ref.get(TEST, "fp16_tflops", "normal")
    assert sorted(entry.values) == [100.0, 100.1]
    assert ref.sigma_for(entry) < 0.002  # the dip would have made it about 25%


def test_a_results_file_given_twice_is_one_run_not_two(tmp_path: Path) -> None:
    """Two copies of one measurement would agree exactly and shrink the figure's sigma: a band
    tighter than its noise.  The second time, the run is recognised (its time and value) and left out."""
    files = [results_file(tmp_path, f"run{i}", {"fp16_tflops": v}) for i, v in enumerate((100.0, 96.0))]
    first = build(files, tmp_path / "ref")
    assert first.repeated == 0 and len(first.files) == 1
    doc = json.loads(first.files[0].read_text())
    again = build([files[1], files[0], results_file(tmp_path, "run2", {"fp16_tflops": 104.0})], tmp_path / "ref")
    assert again.repeated == 2  # the two earlier runs' fp16_tflops; only run2 is new
    after = json.loads(again.files[0].read_text())
    runs = after["modes"]["normal"][TEST]["fp16_tflops"]["runs"]
    assert sorted(r["value"] for r in runs) == [96.0, 100.0, 104.0]
    assert after["reference"]["runs"] == {"normal": 3}
    assert after["reference"]["sigma"]["normal"][TEST]["fp16_tflops"] > \
        doc["reference"]["sigma"]["normal"][TEST]["fp16_tflops"] * 0.9  # not shrunk by copies


def test_a_reference_whose_sigma_is_not_a_number_is_an_error_naming_the_file(tmp_path: Path,
                                                                             refs: ReferenceStore) -> None:
    path = tmp_path / "ref" / "nvidia-h200" / "3g.71gb.json"
    doc = json.loads(path.read_text())
    doc["reference"]["sigma"]["normal"][TEST]["fp16_tflops"] = "tiny"
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"3g\.71gb\.json: reference sigma of .*fp16_tflops .*\"tiny\""):
        ReferenceStore(tmp_path / "ref").load("nvidia-h200", "3g.71gb")


def test_the_shipped_references_read_and_every_judged_figure_has_its_sigma() -> None:
    store = ReferenceStore(SHIPPED)
    models = store.models()
    assert "full" in models["NVIDIA H100 80GB HBM3"] and "full" in models["NVIDIA H200"]
    for path in BaselineStore(SHIPPED).files():
        ref = store.load(path.parent.name, path.stem)
        assert ref is not None and ref.baseline.entries
        for entry in ref.baseline.entries.values():
            assert "gpu_uuid" not in entry.fingerprint
            assert all(str(r.fingerprint.get("board", "")).startswith("b-") for r in entry.runs)  # each names its board
            assert entry.mode in ("quick", "normal")
        # a figure some profile of the model has run twice has its pooled sigma; one with a single run
        # of each profile has none (not judged: verdict.py says so)
        siblings = [store.load(path.parent.name, q.stem) for q in path.parent.glob("*.json")]
        for e in ref.baseline.entries.values():
            repeated = any(len(s.baseline.entries[k].runs) > 1 for s in siblings
                           if (k := (e.test, e.metric, e.mode)) in s.baseline.entries)
            assert (ref.sigma_for(e) is not None) == repeated, (path.name, e.test, e.metric, e.mode)
        judged = [e for e in ref.baseline.entries.values() if ref.sigma_for(e) is not None]
        assert judged  # every shipped profile judges something


def test_the_shipped_judged_counts_are_what_a_first_night_judges() -> None:
    """``pytest-mig devices`` says how many figures each reference judges: that count must be the
    verdict's own, a figure at the reference's median judged (pass) exactly where it is counted."""
    store = ReferenceStore(SHIPPED)
    for path in BaselineStore(SHIPPED).files():
        ref = store.load(path.parent.name, path.stem)
        assert ref is not None
        meta = ref.baseline.meta
        target = {"kind": "emulated" if meta.emulated else "gpu", "profile": meta.target_profile,
                  "gpu_name": meta.gpu_model, "gpu_slug": meta.gpu_slug, "emulated": meta.emulated,
                  "baseline_profile": meta.profile}
        outcomes: dict[str, list[str]] = {}
        for e in ref.baseline.entries.values():
            metric = Metric(e.metric, e.value, e.unit, e.direction, [e.value] * 3, e.kind)  # type: ignore[arg-type]
            rec = ResultRecord(e.test, metric, TargetInfo.from_dict(target), dict(meta.fingerprint), mode=e.mode)
            outcomes.setdefault(e.mode, []).append(compare_reference(rec, ref).outcome)
        counts = ref.judged_counts()
        assert set(counts) == set(outcomes)
        for mode, got in outcomes.items():
            assert set(got) <= {"pass", "noisy"}, (path.name, mode, set(got))
            assert counts[mode] == (got.count("pass"), len(got)), (path.name, mode)
            assert counts[mode][0] > 0, (path.name, mode)  # every shipped mode judges something


def test_the_header_says_how_many_figures_the_reference_judges(tmp_path: Path, refs: ReferenceStore) -> None:
    target = SimpleNamespace(baseline_profile="3g.71gb", gpu_slug="nvidia-h200", gpu_name="NVIDIA H200")
    store = BaselineStore(tmp_path / "none")
    (line,) = judged_against([target], store, refs, "normal")
    assert "judged against the reference, 5 run(s) of NVIDIA H200 3g.71gb (normal)" in line
    assert ("in a band of at least 10% (another board): 1 of its 2 normal figures, the others reported only (too "
            "noisy across the reference's runs, or with one run);") in line
    loud = results_file(tmp_path, "loud", {"small_batch_tflops": 60.0})  # only the noisy figure
    build([results_file(tmp_path, "loud0", {"small_batch_tflops": 100.0}), loud], tmp_path / "loud-ref")
    (none,) = judged_against([target], store, ReferenceStore(tmp_path / "loud-ref"), "normal")
    assert "shown beside the reference" in none and "but not judged: every figure of this mode varies" in none


# --------------------------------------------------------------------------- judging


def test_with_no_local_history_a_figure_is_judged_against_the_reference(tmp_path: Path,
                                                                        refs: ReferenceStore) -> None:
    judge = Pipeline(StoreHistories(BaselineStore(tmp_path / "baselines")), references=refs)
    (ok,) = judge.judge([record(95.0, fingerprint=dict(BOARD))])
    assert ok.outcome == "pass" and ok.source == "reference" and ok.threshold == REFERENCE_FLOOR
    (bad,) = judge.judge([record(85.0)])
    assert bad.outcome == "regressed" and bad.failed and bad.change_pct == pytest.approx(-15.0, abs=0.1)
    assert "reference 100.0 TFLOPS (median of 5 runs of the reference for this GPU model): -15.0%" in bad.message
    assert "threshold 10% (against another board" in bad.message
    assert "a local baseline (--mig-save-baseline) takes over" in bad.message


def test_a_figure_too_noisy_across_the_reference_runs_is_reported_not_judged(tmp_path: Path,
                                                                            refs: ReferenceStore) -> None:
    (v,) = Pipeline(StoreHistories(None), references=refs).judge([record(70.0, name="small_batch_tflops")])
    assert v.outcome == "noisy" and not v.failed
    assert "too noisy to judge against another board" in v.message


def test_the_reference_fingerprint_is_shown_beside_this_gpus() -> None:
    mine = {**FP_OLD, "driver": "590.10.02", "power_limit_w": 600}
    text = fingerprint_beside(FP_OLD, mine)
    assert text.startswith(f"driver {FP_OLD['driver']} (this GPU 590.10.02), CUDA 12.4, torch 2.4.0")
    assert "power limit 700 W (this GPU 600 W)" in text and "max SM clock 1980 MHz," in text


def test_a_local_baseline_takes_over_figure_by_figure(tmp_path: Path, refs: ReferenceStore) -> None:
    store = BaselineStore(tmp_path / "baselines")
    store.save([record(85.0)])  # this GPU's own history of fp16_tflops: one run at 85
    judge = Pipeline(StoreHistories(store), references=refs)
    own, other = judge.judge([record(85.0), record(100.0, name="small_batch_tflops")])
    assert own.source == "baseline" and own.outcome == "pass"  # against its own 85, not the reference's 100
    assert other.source == "reference"  # no local history of this figure yet


def test_a_reference_regression_is_re_measured_against_the_reference(tmp_path: Path, refs: ReferenceStore) -> None:
    judge = Pipeline(StoreHistories(BaselineStore(tmp_path / "none")), references=refs)
    rec = record(80.0)
    (v,) = judge.judge([rec])
    assert judge.confirm(rec, v, [99.0, 98.0]).outcome == "transient"
    assert judge.confirm(rec, v, [81.0, 82.0]).outcome == "regressed"


def test_another_profile_or_mode_is_never_compared_with_a_reference(refs: ReferenceStore) -> None:
    judge = Pipeline(StoreHistories(None), references=refs)
    (quick,) = judge.judge([record(100.0, mode="quick")])
    (other,) = judge.judge([record(100.0, profile="1g.18gb")])
    assert quick.outcome == other.outcome == "no-baseline"
    ref = refs.load("nvidia-h200", "3g.71gb")
    assert compare_reference(record(100.0, target_kind="emulated"), ref).outcome == "incomparable"


# --------------------------------------------------------------------------- the command


def test_pytest_mig_reference_builds_a_folder_and_devices_names_the_models(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = results_file(tmp_path, "night", {"fp16_tflops": 100.0})
    assert main(["reference", str(f), "--out", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    assert "  NVIDIA H200: 3g.71gb (normal x1 0/1 judged)" in out and "reference written:" in out
    assert "no figure has runs enough left to be judged" in out  # one run: nothing to judge it against
    g = results_file(tmp_path, "quick", {"fp16_tflops": 50.0}, mode="quick")
    assert main(["reference", str(g), "--out", str(tmp_path / "mine")]) == 0
    lines = reference_lines(["NVIDIA H200", "NVIDIA A100-SXM4-40GB"], tmp_path / "mine")
    assert lines[1] == "  NVIDIA H200: 3g.71gb (quick x1 0/1 judged, normal x1 0/1 judged)"
    h = results_file(tmp_path, "quick2", {"fp16_tflops": 50.5}, mode="quick")  # a second run tells the noise
    capsys.readouterr()
    assert main(["reference", str(h), "--out", str(tmp_path / "mine")]) == 0
    # the build says what it changed: the quick figure is judged now, the normal one as before
    built = capsys.readouterr().out
    assert "  NVIDIA H200: 3g.71gb (quick x2 1/1 judged (was 0/1), normal x1 0/1 judged)" in built
    assert "no figure has runs enough left" in built  # with one of the two runs out, its noise is unknown
    assert reference_lines(["NVIDIA H200"], tmp_path / "mine")[1] == ("  NVIDIA H200: 3g.71gb "
                                                                      "(quick x2 1/1 judged, normal x1 0/1 judged)")
    # A part-run (another test, or one case re-run) adds some figures only: the count says so.
    k = results_file(tmp_path, "quick3", {"fp16_tflops": 50.2, "bf16_tflops": 60.0}, mode="quick")
    assert main(["reference", str(k), "--out", str(tmp_path / "mine")]) == 0
    # and what its runs are worth, each judged against the other two (pytest-mig reference-check)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "checked (pytest-mig reference-check): each run judged against the others, no false alarm in 3 judged "
        "figures; a 15% loss fails 3 of them")
    assert reference_lines(["NVIDIA H200"], tmp_path / "mine")[1] == ("  NVIDIA H200: 3g.71gb "
                                                                      "(quick x1-3 1/2 judged, normal x1 0/1 judged)")
    # A second run of bf16 that differs by a third: its sigma needs a band far over 12%, so it stays unjudged.
    n = results_file(tmp_path, "quick4", {"fp16_tflops": 50.1, "bf16_tflops": 80.0}, mode="quick")
    assert main(["reference", str(n), "--out", str(tmp_path / "mine")]) == 0
    noisy = ReferenceStore(tmp_path / "mine").load("nvidia-h200", "3g.71gb")
    assert noisy is not None and noisy.judged_counts() == {"quick": (1, 2), "normal": (0, 1)}
    assert reference_lines(["NVIDIA H200"], tmp_path / "mine")[1] == ("  NVIDIA H200: 3g.71gb "
                                                                      "(quick x2-4 1/2 judged, normal x1 0/1 judged)")
    ref = ReferenceStore(tmp_path / "mine").load("nvidia-h200", "3g.71gb")
    assert ref is not None and ref.describe("quick").startswith("2-4 run(s) of NVIDIA H200 3g.71gb (quick)")
    assert ref.describe("normal").startswith("1 run(s) of NVIDIA H200 3g.71gb (normal)")
    assert lines[2].startswith("  no reference for NVIDIA A100-SXM4-40GB: its first runs' compute and bandwidth figures "
                               "are judged against the device's own ceiling")
    assert main(["reference", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x")]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_a_reference_that_would_lose_runs_names_what_pytest_mig_reference_offers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A reference file keeping more runs than a reference does (edited, or built another way) is never
    cut by ``pytest-mig reference``: the refusal names that command's --out, not the plugin's shrink."""
    out = tmp_path / "mine"
    assert main(["reference", str(results_file(tmp_path, "night", {"fp16_tflops": 100.0})), "--out", str(out)]) == 0
    (path,) = out.rglob("*.json")
    doc = json.loads(path.read_text())
    doc["keep"] = 60
    for tests in doc["modes"].values():
        for metrics in tests.values():
            for entry in metrics.values():
                entry["runs"] = entry["runs"] * 55
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["reference", str(results_file(tmp_path, "next", {"fp16_tflops": 100.2})), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "keeps 60 runs per figure and a keep of 50 would drop" in err and "--mig-baseline-shrink" not in err
    assert f"a reference keeps 50 runs per figure and pytest-mig reference never shortens a history: give --out a " \
           f"new folder, or move this file out of {out}" in err
    assert path.read_bytes() == before


def test_drop_test_takes_a_changed_test_out_of_the_folder_and_the_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A test whose definition changed leaves the reference, its old runs in later files too, while
    the other tests' figures and their sigma stay; a mistyped id is one sentence and changes nothing."""
    from dataclasses import replace

    old = "benchmarks/test_training.py::test_training[qwen1.5b-full-maxbatch-compiled]"

    def night(name: str, fp16: float, changed: float) -> Path:
        path = tmp_path / f"{name}.json"
        write_results(path, [record(fp16, fingerprint=dict(BOARD)),
                             replace(record(changed, name="tokens_per_s", fingerprint=dict(BOARD)), test=old)])
        return path

    out = tmp_path / "ref"
    assert main(["reference", str(night("a", 100.0, 50.0)), str(night("b", 100.4, 51.0)), "--out", str(out)]) == 0
    path = out / "nvidia-h200" / "3g.71gb.json"
    before = json.loads(path.read_text())
    assert old in before["modes"]["normal"] and old in before["reference"]["sigma"]["normal"]
    capsys.readouterr()

    assert main(["reference", "--drop-test", "benchmarks/test_training.py::test_training[typo]", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--drop-test benchmarks/test_training.py::test_training[typo]: no figure" in err
    assert "nothing was changed" in err and json.loads(path.read_text()) == before

    # the old test dropped, and a third night's runs of it left out as they are added
    assert main(["reference", str(night("c", 99.8, 52.0)), "--drop-test", old, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"dropped {old}: 3 run(s) of its figures" in said  # two from the folder, one from the file
    after = json.loads(path.read_text())
    assert old not in after["modes"]["normal"] and old not in after["reference"]["sigma"]["normal"]
    runs = after["modes"]["normal"][TEST]["fp16_tflops"]["runs"]
    assert [r["value"] for r in runs] == [100.0, 100.4, 99.8]
    assert after["reference"]["sigma"]["normal"][TEST]["fp16_tflops"] > 0
    assert main(["reference", "--out", str(out)]) == 2
    assert "needs results files to add, or --drop-test" in capsys.readouterr().err
    # a profile left with no figure at all is removed, not kept as an empty file
    assert main(["reference", "--drop-test", TEST, "--out", str(out)]) == 0
    assert not path.exists() and "holds no figures now" in capsys.readouterr().out


def test_drop_figure_takes_one_changed_figure_out_and_keeps_the_tests_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A figure whose definition changed leaves the reference (its old runs, and those of the files
    given with it) while its test's other figures stay; a later build adds its new runs afresh; a
    figure the folder does not hold is one sentence and changes nothing."""
    out = tmp_path / "ref"
    old = [results_file(tmp_path, n, {"fp16_tflops": v, "fp16_sustained_tflops": v - 1}) for n, v in
           (("a", 100.0), ("b", 104.0))]
    assert main(["reference", *map(str, old), "--out", str(out)]) == 0
    path = out / "nvidia-h200" / "3g.71gb.json"
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["reference", "--drop-figure", TEST, "fp16_tflop", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--drop-figure {TEST} fp16_tflop: no such figure" in err
    assert path.read_bytes() == before

    third = results_file(tmp_path, "c", {"fp16_tflops": 90.0, "fp16_sustained_tflops": 101.0})
    assert main(["reference", str(third), "--drop-figure", TEST, "fp16_tflops", "--out", str(out)]) == 0
    assert f"dropped {TEST} fp16_tflops: 3 run(s)\n" in capsys.readouterr().out  # two held, one in the file
    doc = json.loads(path.read_text())["modes"]["normal"][TEST]
    assert "fp16_tflops" not in doc
    assert [r["value"] for r in doc["fp16_sustained_tflops"]["runs"]] == [99.0, 103.0, 101.0]
    assert main(["reference", str(results_file(tmp_path, "d", {"fp16_tflops": 95.0})), "--out", str(out)]) == 0
    doc = json.loads(path.read_text())["modes"]["normal"][TEST]
    assert [r["value"] for r in doc["fp16_tflops"]["runs"]] == [95.0]

    # with its test dropped too, each counts its own runs: the figure's file-only runs are not "no such figure"
    fresh = tmp_path / "fresh"
    capsys.readouterr()
    assert main(["reference", str(third), "--drop-test", TEST, "--drop-figure", TEST, "fp16_tflops",
                 "--out", str(fresh)]) == 0
    said = capsys.readouterr().out
    assert f"dropped {TEST}: 1 run(s) of its figures" in said and f"dropped {TEST} fp16_tflops: 1 run(s)\n" in said
    # the folder's last figure dropped while the file given holds only it: the folder changed, so not "nothing written"
    assert main(["reference", "--drop-figure", TEST, "fp16_sustained_tflops", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["reference", str(results_file(tmp_path, "e", {"fp16_tflops": 96.0})), "--drop-figure", TEST,
                 "fp16_tflops", "--out", str(out)]) == 0
    assert not path.exists() and "holds no figures now" in capsys.readouterr().out


def test_a_dropped_figures_line_escapes_what_its_names_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = "benchmarks/test_x.py::test_x[\x1b[2J\n]"
    path = tmp_path / "odd.json"
    write_results(path, [replace(record(100.0, fingerprint=dict(BOARD)), test=odd)])
    out = tmp_path / "ref"
    assert main(["reference", str(path), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["reference", "--drop-figure", odd, "fp16_tflops", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "\x1b" not in said and said.startswith("dropped benchmarks/test_x.py::test_x[") and said.count("\n") == 2


def test_devices_lists_the_shipped_references_without_a_gpu(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_mig.device.nvml as nvml

    monkeypatch.setattr(nvml, "discover", lambda: nvml.Inventory(error="no NVIDIA driver on this machine"))
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "references (figures with no local baseline are judged against them" in out
    h100 = next(line for line in out.splitlines() if line.startswith("  NVIDIA H100 80GB HBM3: "))
    shipped = sorted(p.stem for p in (SHIPPED / "nvidia-h100-80gb-hbm3").glob("*.json"))
    listed = dict(p.rstrip(")").split(" (") for p in h100.split(": ", 1)[1].split("), "))
    assert sorted(listed) == shipped
    assert {"1g.10gb-emulated", "full"} <= set(shipped)
    assert listed["full"].startswith("quick x") and "normal x" in listed["full"]  # both modes shipped


def test_every_shipped_reference_names_a_test_the_suite_still_has() -> None:
    """A renamed or removed benchmark leaves its reference behind: rebuild the references when a
    workload changes (pytest-mig reference on new GPU runs)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    listed = subprocess.run([sys.executable, "-m", "pytest", "benchmarks", "--collect-only", "-q", "--mig-quick",
                             "-p", "no:cacheprovider"], cwd=root, capture_output=True, text=True, timeout=300)
    collected = {line.strip() for line in listed.stdout.splitlines() if "::" in line}
    assert len(collected) > 20, listed.stdout[-2000:]
    store = ReferenceStore(SHIPPED)
    for path in BaselineStore(SHIPPED).files():
        ref = store.load(path.parent.name, path.stem)
        missing = {e.test for e in ref.baseline.entries.values()} - collected
        assert not missing, f"{path} names tests the suite no longer has: {sorted(missing)}"


def test_a_figure_is_measured_at_the_size_of_its_history_else_of_its_reference_and_sigma_counts_that_size(
        tmp_path: Path) -> None:
    """The reference keeps each run's size; its sigma pools only the runs at the size the figure is judged
    at (another size is another workload); a site's own history, once it has the figure, names the size."""
    values = [(100.0, 16384), (100.4, 16384), (92.0, 20480), (99.7, 16384), (100.2, 16384)]
    files = [results_file(tmp_path, f"run{i}", {"fp16_tflops": v}, info={"size": n})
             for i, (v, n) in enumerate(values)]
    build(files, tmp_path / "ref")
    refs = ReferenceStore(tmp_path / "ref")
    ref = refs.load("nvidia-h200", "3g.71gb")
    entry = ref.get(TEST, "fp16_tflops", "normal")
    assert [r.size for r in entry.runs] == [16384, 16384, 20480, 16384, 16384] and entry.size == 16384
    assert ref.sigma_for(entry) == pytest.approx(pooled_sigma([[100.0, 100.4, 99.7, 100.2]]), rel=1e-3)
    assert ref.sigma_for(entry) < 0.005  # with the 20480 run it would be about 3.5%

    store = BaselineStore(tmp_path / "baselines")
    judge = Pipeline(StoreHistories(store), references=refs)
    assert judge.measured_size(record(1.0)) == 16384  # no history: the reference's
    assert judge.measured_size(record(1.0, name="other_tflops")) is None  # neither holds the figure
    store.save([record(99.0)])  # a history saved before runs kept their size: measured as it was
    judge = Pipeline(StoreHistories(store), references=refs)
    assert judge.measured_size(record(1.0)) is None
    store.save([record(99.0, info={"size": 12288})])  # half of it names one: the site's own
    judge = Pipeline(StoreHistories(store), references=refs)
    assert judge.measured_size(record(1.0)) == 12288


def test_a_history_that_cannot_be_read_names_no_size_and_the_workload_sizes_itself(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "baselines")
    store.save([record(99.0, info={"size": 12288})])
    path = store.path_for("nvidia-h200", "3g.71gb")
    path.write_text("{broken")
    judge = Pipeline(StoreHistories(store))
    assert judge.measured_size(record(1.0)) is None
    with pytest.raises(BaselineError):  # the verdict still names the broken file
        judge.judge([record(1.0)])


def test_every_figure_of_a_run_takes_the_size_its_headline_names_and_a_run_at_another_size_is_not_checked(
        tmp_path: Path) -> None:
    """Results files keep the size with the headline only; the builder gives it to the run's other compared
    figures (measured at the headline's size), never where the run names two.  reference-check leaves out
    a run at another size than the figure is judged at: judged there, 15% slower, it was a false alarm."""
    from pytest_mig.judge.reference_check import check_folder

    files = []
    for i, (v, n) in enumerate([(100.0, 16384), (100.3, 16384), (85.0, 20480), (99.8, 16384), (100.1, 16384)]):
        path = tmp_path / f"run{i}.json"
        recs = [record(v, info={"size": n}, fingerprint=dict(BOARD)),
                record(1.0 + i / 1000, name="fp16_energy_j_per_tflop", unit="J/TFLOP", direction="lower", kind="energy",
                       fingerprint=dict(BOARD))]
        if i == 4:  # a run that names two sizes gives its other figures none
            recs.append(record(1.0, name="fp16_peak_memory_gb", unit="GB", kind="info", compare_=False,
                               info={"size": 8192}, fingerprint=dict(BOARD)))
        write_results(path, recs)
        files.append(path)
    build(files, tmp_path / "ref")
    ref = ReferenceStore(tmp_path / "ref").load("nvidia-h200", "3g.71gb")
    energy = ref.get(TEST, "fp16_energy_j_per_tflop", "normal")
    assert [r.size for r in energy.runs] == [16384, 16384, 20480, 16384, None]
    headline = ref.get(TEST, "fp16_tflops", "normal")
    assert ref.band_for(headline).center == pytest.approx(100.05)  # the median of the runs at 16384
    (tally,) = check_folder(tmp_path / "ref")
    assert tally.false_alarms == [] and tally.cases == 7  # the runs at 16384: 4 headline, 3 energy
