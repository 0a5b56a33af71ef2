"""A short history judged with a prior: the band of 1-4 runs, and where the prior comes from."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_mig.judge.noise import FEW_RUNS_BAND, FLOOR, K, MIN_RUNS, PRIOR, PRIOR_BOARD, PRIOR_ELSEWHERE, Prior, band
from pytest_mig.judge.pipeline import Pipeline, RecordHistories
from pytest_mig.judge.prior import Priors
from pytest_mig.judge.reference import SHIPPED, ReferenceStore, build
from pytest_mig.measure import Metric
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.baselines import entry_from_records
from pytest_mig.store.results import ResultRecord, write_results

GEMM = "benchmarks/test_gemm.py::test_gemm[bf16]"
SUSTAINED_BF16 = "bf16_sustained_tflops"  # a figure every H100 reference run holds
FMA = "benchmarks/test_cuda_cores.py::test_cuda_core_fma[fp32]"


def rec(value: float, *, gpu: str = "NVIDIA H100 80GB HBM3", profile: str = "full", emulated: bool = False,
        test: str = GEMM, name: str = "bf16_tflops", kind: str = "tensor") -> ResultRecord:
    slug = gpu.lower().replace(" ", "-")
    target = {"kind": "emulated" if emulated else ("full" if profile == "full" else "mig"), "profile": profile,
              "baseline_profile": f"{profile}-emulated" if emulated else profile, "gpu_name": gpu,
              "gpu_slug": slug, "emulated": emulated}
    metric = Metric(name, value, "TFLOPS", "higher", [value] * 3, kind)  # type: ignore[arg-type]
    return ResultRecord(test, metric, TargetInfo.from_dict(target), {"driver": "580.159.04"}, "2026-01-01T00:00:00+00:00", "n1")


# --------------------------------------------------------------------------- the band of a short history


@pytest.mark.parametrize("runs", [1, 2, 3, 4])
def test_a_short_history_is_judged_with_the_prior_widened_for_its_own_few_runs(runs: int) -> None:
    b = band([100.0] * runs, prior=Prior(0.004))
    widen = math.sqrt(1 + 1 / runs)
    assert b.basis == "short" and b.gates and b.sigma == 0.004 and b.sigma_of == PRIOR
    assert b.threshold == pytest.approx(K * 0.004 * widen) and b.widen == pytest.approx(widen)
    assert b.threshold < FEW_RUNS_BAND / 2  # from the second night, far tighter than the flat band
    assert b.detectable == pytest.approx(b.threshold + 2.2 * 0.004 * widen)


def test_the_band_narrows_night_by_night_and_meets_the_full_rule_at_five_runs() -> None:
    thresholds = [band([100.0] * n, prior=0.006).threshold for n in range(1, MIN_RUNS + 1)]
    assert thresholds == sorted(thresholds, reverse=True) and len(set(thresholds)) == MIN_RUNS
    assert thresholds[-1] == pytest.approx(K * 0.006)  # 5 runs: the prior floors sigma, unwidened


def test_the_few_runs_own_spread_or_a_partner_widens_the_band_beyond_the_prior() -> None:
    wide = band([100.0, 100.4], prior=0.002)
    assert wide.sigma == pytest.approx(0.00283, rel=0.01) and wide.sigma_of is None and wide.basis == "short"
    shared = band([100.0, 100.0], prior=0.002, partners={"tokens_per_s": [100.0, 101.0, 99.5]})
    assert shared.sigma_of == "tokens_per_s" and shared.sigma > 0.002


def test_a_prior_too_wide_for_the_tolerance_keeps_the_conservative_band_never_a_narrower_one() -> None:
    b = band([100.0], prior=0.03)  # 5 x 3% x 1.41 = 21%: too wide to gate at 5%
    assert b.basis == "few-runs" and b.gates and b.threshold == pytest.approx(K * 0.03 * math.sqrt(2))
    assert band([100.0], prior=0.012).threshold == FEW_RUNS_BAND  # 8.5% by the prior: the flat 10% stands
    capped = band([100.0], prior=0.012, tolerance=0.05)  # a site's tolerance caps it, as for any history
    assert capped.threshold == 0.05 and capped.basis == "tolerance"


def test_without_a_prior_a_short_history_keeps_the_conservative_band() -> None:
    assert band([100.0]).threshold == FEW_RUNS_BAND and band([100.0]).basis == "few-runs"
    assert band([100.0], prior=None).sigma is None
    assert band([100.0], prior=float("nan")).basis == "few-runs"  # a prior that is not a number is none


def test_the_floor_holds_for_the_quietest_prior() -> None:
    assert band([100.0, 100.0, 100.0, 100.0], prior=0.0001).threshold == FLOOR


# --------------------------------------------------------------------------- where the prior comes from


def shipped_sigma(slug: str, profile: str, name: str = "bf16_tflops", test: str = GEMM) -> float:
    ref = ReferenceStore(SHIPPED).load(slug, profile)
    assert ref is not None
    entry = ref.get(test, name, "normal")
    assert entry is not None
    sigma = ref.band_for(entry).sigma
    assert sigma is not None
    return sigma


def test_the_prior_is_the_reference_of_the_figures_own_model_and_profile() -> None:
    p = Priors(ReferenceStore(SHIPPED)).for_record(rec(700.0, name=SUSTAINED_BF16))
    assert p is not None and (p.sigma, p.source) == (shipped_sigma("nvidia-h100-80gb-hbm3", "full", SUSTAINED_BF16), PRIOR)


def test_a_real_slice_borrows_its_models_emulated_profiles_sigma_and_says_so() -> None:
    p = Priors(ReferenceStore(SHIPPED)).for_record(rec(100.0, profile="3g.40gb", name=SUSTAINED_BF16))
    assert p is not None and p.sigma == shipped_sigma("nvidia-h100-80gb-hbm3", "full", SUSTAINED_BF16)
    assert p.source.startswith(PRIOR_ELSEWHERE) and "NVIDIA H100 80GB HBM3's other profiles" in p.source


def test_a_gpu_model_with_no_reference_borrows_the_largest_sigma_of_the_models_that_have_one() -> None:
    p = Priors(ReferenceStore(SHIPPED)).for_record(rec(250.0, gpu="NVIDIA A100-SXM4-80GB", profile="1g.10gb"))
    expected = max(shipped_sigma("nvidia-h100-80gb-hbm3", "full"), shipped_sigma("nvidia-h200", "full"))
    assert p is not None and p.sigma == expected
    assert "NVIDIA H100 80GB HBM3 and NVIDIA H200" in p.source and "no reference run of it for this GPU model" in p.source


def test_a_site_figure_no_reference_holds_has_no_prior() -> None:
    own = rec(1.0, test="benchmarks/test_site.py::test_own", name="own_rate")
    assert Priors(ReferenceStore(SHIPPED)).for_record(own) is None


def test_a_cpu_run_borrows_no_gpus_noise_so_its_short_history_keeps_the_conservative_band() -> None:
    target = {"kind": "cpu", "profile": "cpu", "baseline_profile": "cpu", "gpu_name": None, "gpu_slug": "cpu",
              "emulated": False}
    stream = "benchmarks/test_bandwidth.py::test_stream[fp32]"
    metric = Metric("fp32_triad_gbs", 0.4, "GB/s", "higher", [0.4] * 3, "memory")  # type: ignore[arg-type]
    cpu = ResultRecord(stream, metric, TargetInfo.from_dict(target), {}, "2026-01-01T00:00:00+00:00", "n1")
    gpu = rec(3000.0, test=stream, name="fp32_triad_gbs", kind="memory")
    assert Priors(ReferenceStore(SHIPPED)).for_record(gpu) is not None  # the figure has a GPU prior ...
    assert Priors(ReferenceStore(SHIPPED)).for_record(cpu) is None  # ... which a CPU's timings never borrow
    verdict = Pipeline(RecordHistories([[cpu]]), priors=Priors(ReferenceStore(SHIPPED))).judge_runs([cpu])[0]
    assert verdict.threshold == pytest.approx(FEW_RUNS_BAND) and verdict.gates


def test_the_shipped_references_still_give_noise_where_a_site_switched_references_off() -> None:
    p = Priors(None).for_record(rec(700.0, name=SUSTAINED_BF16))
    assert p is not None and (p.sigma, p.source) == (shipped_sigma("nvidia-h100-80gb-hbm3", "full", SUSTAINED_BF16), PRIOR)


def test_a_sites_own_reference_folder_speaks_for_its_models(tmp_path: Path) -> None:
    (tmp_path / "refs").mkdir()
    p = Priors(ReferenceStore(tmp_path / "refs")).for_record(rec(700.0))
    assert p is not None and p.source.startswith(PRIOR_ELSEWHERE)  # its folder is empty: the shipped ones speak


# --------------------------------------------------------------------------- through the pipeline


def test_the_second_night_on_an_unknown_gpu_catches_a_5_percent_loss_and_passes_an_unchanged_run() -> None:
    a100 = dict(gpu="NVIDIA A100-SXM4-80GB", profile="1g.10gb", test=FMA, name="fp32_fma_tflops", kind="compute")
    pipeline = Pipeline(RecordHistories([[rec(2.8, **a100)]]), references=ReferenceStore(SHIPPED))
    same = pipeline.judge([rec(2.79, **a100)])[0]
    assert same.outcome == "pass" and same.basis == "short" and same.runs == 1
    assert "for a baseline of 1 run(s)" in same.message and "no reference run of it for this GPU model" in same.message
    slow = pipeline.judge([rec(2.8 * 0.95, **a100)], remeasure=lambda: {"fp32_fma_tflops": [2.66, 2.661]})[0]
    assert slow.outcome == "regressed" and slow.failed and (slow.threshold or 1) < 0.05


def test_a_prior_pooled_from_too_few_runs_does_not_judge_a_short_history() -> None:
    thin = Prior(0.001, PRIOR, dof=1)  # two runs that happened to agree: no evidence the figure is quiet
    assert not thin.judges_short and band([100.0], prior=thin).threshold == FEW_RUNS_BAND
    assert band([100.0] * 6, prior=thin).sigma == pytest.approx(0.001)  # it may still only widen a longer one
    assert Prior(0.004, PRIOR, dof=4).judges_short and band([100.0], prior=Prior(0.004, PRIOR, dof=4)).basis == "short"


def test_the_priors_carry_the_degrees_of_freedom_their_reference_pooled() -> None:
    p = Priors(ReferenceStore(SHIPPED)).for_record(rec(700.0))
    assert p is not None and p.dof is not None and p.dof >= 4


# --------------------------------------------------------------------------- a history of one board


TRACK = "benchmarks/test_tracking.py::test_tracking[10M]"


def _on(record: ResultRecord, board: str) -> ResultRecord:
    return replace(record, fingerprint={**(record.fingerprint or {}), "gpu_uuid": board})


def _tracking(value: float, board: str) -> ResultRecord:
    r = rec(value, test=TRACK, name="energy_j_per_particle-turn", kind="energy")
    return _on(replace(r, metric=replace(r.metric, unit="J/particle-turn", direction="lower")), board)


def test_a_history_of_this_boards_runs_is_judged_with_the_references_noise_on_one_board() -> None:
    """The shipped H100 reference names each run's board: tracking's energy moves less from night to
    night on one board than between boards, and a history of one board takes the smaller sigma."""
    ref = ReferenceStore(SHIPPED).load("nvidia-h100-80gb-hbm3", "full")
    assert ref is not None
    entry = ref.get(TRACK, "energy_j_per_particle-turn", "normal")
    assert entry is not None and len({r.fingerprint.get("board") for r in entry.runs}) > 1
    board, across = ref.board_sigma_for(entry), ref.band_for(entry).sigma
    assert board is not None and across is not None and board < across
    history = entry_from_records([_tracking(0.5, "GPU-aaaa"), _tracking(0.501, "GPU-aaaa")])
    p = Priors(ReferenceStore(SHIPPED)).for_record(_tracking(0.5, "GPU-aaaa"), history)
    assert p is not None and (p.sigma, p.source) == (board, PRIOR_BOARD)
    mixed = entry_from_records([_tracking(0.5, "GPU-bbbb"), _tracking(0.501, "GPU-aaaa")])
    q = Priors(ReferenceStore(SHIPPED)).for_record(_tracking(0.5, "GPU-aaaa"), mixed)
    assert q is not None and (q.sigma, q.source) == (across, PRIOR)  # a folder shared between boards
    unnamed = entry_from_records([rec(0.5, test=TRACK, name="energy_j_per_particle-turn", kind="energy")])
    plain = Priors(ReferenceStore(SHIPPED)).for_record(_tracking(0.5, "GPU-aaaa"), unnamed)
    assert plain is not None and plain.source == PRIOR  # runs that name no board: not known to be one board's


def test_the_verdict_on_a_one_board_history_says_whose_noise_judged_it() -> None:
    """A figure whose noise on one board gates it from the second night where the noise across
    boards would not: the second night of a board gates at 5%; the same history judging another
    board's run keeps the conservative band."""
    ref = ReferenceStore(SHIPPED).load("nvidia-h100-80gb-hbm3", "full")
    assert ref is not None
    widen = K * math.sqrt(2)
    entry = next(e for e in ref.baseline.entries.values() if e.mode == "normal" and e.kind != "energy"
                 and (ref.board_sigma_for(e) or 1) * widen <= 0.05 < (ref.band_for(e).sigma or 0) * widen)
    metric = Metric(entry.metric, entry.value, entry.unit, entry.direction, [], entry.kind)  # type: ignore[arg-type]
    mine = _on(replace(rec(1.0, test=entry.test), metric=metric), "GPU-aaaa")
    pipeline = Pipeline(RecordHistories([[mine]]), references=ReferenceStore(SHIPPED))
    v = pipeline.judge([mine])[0]
    assert v.outcome == "pass" and v.sigma_of == PRIOR_BOARD and "night to night on one board" in v.message
    assert v.gates and (v.threshold or 1) <= 0.05
    other = pipeline.judge([_on(mine, "GPU-cccc")])[0]  # the same history judging another board's run
    assert other.sigma_of == PRIOR and (other.threshold or 0) > 0.05


def test_a_model_with_no_reference_borrows_the_one_board_sigma_for_a_one_board_history() -> None:
    a100 = dict(gpu="NVIDIA A100-SXM4-80GB", profile="1g.10gb", test=TRACK, name="energy_j_per_particle-turn",
                kind="energy")
    first = _on(rec(0.4, **a100), "GPU-a100")  # type: ignore[arg-type]
    one = Priors(ReferenceStore(SHIPPED)).for_record(first, entry_from_records([first]))
    across = Priors(ReferenceStore(SHIPPED)).for_record(first)
    assert one is not None and across is not None and one.sigma < across.sigma
    assert "night to night on one board" in one.source and "across nights and boards" in across.source


# --------------------------------------------------------------------------- a reference too thin to say


def reference_folder(tmp_path: Path, runs: dict[str, list[float]]) -> ReferenceStore:
    """A reference folder (tmp_path/ref, beside an empty tmp_path/none) holding fp32 FMA TFLOPS of each
    GPU model at these values, its runs on two boards in turn."""
    files = []
    for gpu, values in runs.items():
        for n, value in enumerate(values):
            r = rec(value, gpu=gpu, test=FMA, name="fp32_fma_tflops", kind="compute")
            fp = {"driver": "580.159.04", "gpu_uuid": f"GPU-{gpu[-4:]}-{n % 2}"}
            path = tmp_path / f"{gpu[-4:]}-{n}.json"
            write_results(path, [replace(r, fingerprint=fp, timestamp=f"2026-01-{n + 1:02d}T00:00:00+00:00")])
            files.append(path)
    build(files, tmp_path / "ref")
    (tmp_path / "none").mkdir()
    return ReferenceStore(tmp_path / "ref")


def thin_and_full(tmp_path: Path, runs_a100: int) -> ReferenceStore:
    """A reference folder where the H200 holds an FMA figure from two runs (1 degree of freedom) and
    an A100 from ``runs_a100`` runs of two boards."""
    return reference_folder(tmp_path, {
        "NVIDIA H200": [19.0 * (1 + 0.0001 * (n % 3 - 1)) for n in range(2)],
        "NVIDIA A100-SXM4-80GB": [19.0 * (1 + 0.004 * (n % 3 - 1)) for n in range(runs_a100)]})


def priors(tmp_path: Path) -> Priors:
    """Priors from that folder alone (no shipped reference asked)."""
    return Priors(ReferenceStore(tmp_path / "ref"), shipped=ReferenceStore(tmp_path / "none"))


def test_a_model_whose_reference_holds_a_figure_from_too_few_runs_borrows_a_model_that_knows_it(
        tmp_path: Path) -> None:
    """The H200 reference holds the figure from two runs that happen to agree: no evidence of its noise.
    The A100's, from ten runs, judges its short history instead, and the verdict says so."""
    refs = thin_and_full(tmp_path, 10)
    h200 = rec(19.0, gpu="NVIDIA H200", test=FMA, name="fp32_fma_tflops", kind="compute")
    p = priors(tmp_path).for_record(h200)
    a100 = priors(tmp_path).for_record(rec(19.0, gpu="NVIDIA A100-SXM4-80GB", test=FMA,
                                                     name="fp32_fma_tflops", kind="compute"))
    assert p is not None and a100 is not None and p.judges_short and p.sigma == a100.sigma
    assert p.source.startswith(PRIOR_ELSEWHERE) and "the noise across nights and boards of NVIDIA A100-SXM4-80GB;" in p.source
    assert "this GPU model's reference holds too few runs of the figure (1 degree of freedom)" in p.source
    pipeline = Pipeline(RecordHistories([[h200]]), references=refs, priors=priors(tmp_path))
    slow = pipeline.judge([replace(h200, metric=replace(h200.metric, value=19.0 * 0.91))],
                          remeasure=lambda: {"fp32_fma_tflops": [17.3, 17.29]})[0]
    assert slow.outcome == "regressed" and slow.basis == "short"  # a 9% loss: the flat 10% band missed it


def test_a_profile_whose_model_holds_the_figure_thinly_elsewhere_borrows_a_model_that_knows_it(
        tmp_path: Path) -> None:
    """No reference run of the figure for this profile, and the model's other profiles hold it from too
    few runs (a redefined figure: the GEMM headline's new runs): as for its own profile, a model that
    knows the figure's noise judges the short history."""
    thin_and_full(tmp_path, 10)
    real_slice = rec(19.0, gpu="NVIDIA H200", profile="3g.71gb", test=FMA, name="fp32_fma_tflops", kind="compute")
    p = priors(tmp_path).for_record(real_slice)
    a100 = priors(tmp_path).for_record(rec(19.0, gpu="NVIDIA A100-SXM4-80GB", test=FMA,
                                           name="fp32_fma_tflops", kind="compute"))
    assert p is not None and a100 is not None and p.judges_short and p.sigma == a100.sigma
    assert "this GPU model's reference holds too few runs of the figure (1 degree of freedom)" in p.source


@pytest.mark.parametrize("one_board", [True, False])
def test_a_headline_its_profile_does_not_hold_takes_no_less_than_its_sustained_rates_prior(one_board: bool) -> None:
    """The GEMM headline times the same work as its sustained rate: on every shipped profile whose
    reference holds no run of the redefined headline (the emulated ones), its prior, borrowed from
    another profile or model, is at least the sustained rate's there, the profile's spread across its
    boards included."""
    priors, checked = Priors(ReferenceStore(SHIPPED)), 0
    for ref in ReferenceStore(SHIPPED).references():
        meta = ref.baseline.meta
        for e in ref.baseline.entries.values():
            name = e.metric.replace("sustained_", "")
            if not e.metric.endswith("_sustained_tflops") or ref.get(e.test, name, e.mode) is not None:
                continue
            headline = priors.for_figure(meta, (e.test, name, e.mode), one_board, e.kind)
            sustained = priors.for_figure(meta, (e.test, e.metric, e.mode), one_board, e.kind)
            if headline is not None and sustained is not None and headline.judges_short and sustained.judges_short:
                assert headline.sigma >= sustained.sigma, (meta.gpu_model, meta.profile, e.metric, e.mode)
                checked += 1
    assert checked >= 20


def test_a_model_with_no_reference_names_the_one_model_it_borrows_from_once(tmp_path: Path) -> None:
    reference_folder(tmp_path, {"NVIDIA A100-SXM4-80GB": [19.0 * (1 + 0.004 * (n % 3 - 1)) for n in range(10)]})
    p = priors(tmp_path).for_record(rec(19.0, gpu="NVIDIA H200", test=FMA, name="fp32_fma_tflops", kind="compute"))
    assert p is not None and p.source == (f"{PRIOR_ELSEWHERE}the noise across nights and boards of NVIDIA A100-SXM4-80GB; "
                                          "no reference run of it for this GPU model")


def test_a_thin_prior_with_no_model_to_borrow_from_leaves_the_conservative_band(tmp_path: Path) -> None:
    thin_and_full(tmp_path, 3)  # the A100 too: 2 degrees of freedom
    h200 = rec(19.0, gpu="NVIDIA H200", test=FMA, name="fp32_fma_tflops", kind="compute")
    p = priors(tmp_path).for_record(h200)
    assert p is not None and p.source == PRIOR and not p.judges_short
    verdict = Pipeline(RecordHistories([[h200]]), priors=priors(tmp_path)).judge([h200])[0]
    assert verdict.threshold == pytest.approx(FEW_RUNS_BAND) and verdict.basis == "few-runs"


def test_a_sites_folder_copied_from_the_shipped_one_does_not_count_its_runs_twice(tmp_path: Path) -> None:
    """A site that copied the shipped folder and gives it as --mig-reference: each model's runs are
    counted from one folder, so two runs stay too few to judge with."""
    import shutil

    thin_and_full(tmp_path, 3)  # the H200 from 2 runs, the A100 from 3: neither known well enough
    shutil.copytree(tmp_path / "ref", tmp_path / "copy")
    doubled = Priors(ReferenceStore(tmp_path / "copy"), shipped=ReferenceStore(tmp_path / "ref"))
    h200 = rec(19.0, gpu="NVIDIA H200", test=FMA, name="fp32_fma_tflops", kind="compute")
    p = doubled.for_record(h200)
    assert p is not None and p.dof == 1 and not p.judges_short
    assert doubled.for_record(h200) == priors(tmp_path).for_record(h200)


def test_a_thin_prior_larger_than_the_borrowed_one_is_kept(tmp_path: Path) -> None:
    """Two runs 4% apart say the figure is noisy as surely as two that agree say nothing: the
    borrowed sigma never replaces a larger thin one (a 3.5% dip would otherwise fail at 1%)."""
    reference_folder(tmp_path, {"NVIDIA H200": [19.0, 19.76], "NVIDIA A100-SXM4-80GB": [19.0, 19.01, 18.99] * 3})
    h200 = rec(19.0, gpu="NVIDIA H200", test=FMA, name="fp32_fma_tflops", kind="compute")
    p = priors(tmp_path).for_record(h200)
    assert p is not None and p.sigma > 0.02 and p.judges_short
    assert "this GPU model's reference, from too few runs (1 degree of freedom), larger than" in p.source
    pipeline = Pipeline(RecordHistories([[h200], [h200]]), priors=priors(tmp_path))
    dip = pipeline.judge([replace(h200, metric=replace(h200.metric, value=19.0 * 0.965))],
                         remeasure=lambda: {"fp32_fma_tflops": [18.34, 18.33]})[0]
    assert dip.outcome == "pass" and (dip.threshold or 0) >= FEW_RUNS_BAND


def test_a_site_folder_holding_a_model_thinly_borrows_its_shipped_reference_first(tmp_path: Path) -> None:
    """A site's folder with two H100 runs of a figure hides the shipped H100 reference: the thin
    branch asks it before other models (it knows this model's noise)."""
    site = tmp_path / "site"
    files = []
    for n in range(2):
        path = tmp_path / f"h100-{n}.json"
        write_results(path, [replace(rec(65.0, test=FMA, name="fp32_fma_tflops", kind="compute"),
                                     timestamp=f"2026-01-{n + 1:02d}T00:00:00+00:00")])
        files.append(path)
    build(files, site)
    h100 = rec(65.0, test=FMA, name="fp32_fma_tflops", kind="compute")
    p = Priors(ReferenceStore(site)).for_record(h100)  # the shipped references asked too
    shipped = Priors(None).for_record(h100)
    assert p is not None and shipped is not None and p.judges_short
    assert "NVIDIA H100 80GB HBM3's shipped reference" in p.source and p.sigma >= shipped.sigma
