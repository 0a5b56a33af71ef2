"""The first night on a GPU that no reference covers: every compute and bandwidth figure judged against
the device's own ceiling, through the judging pipeline, on devices read through the fake pynvml (an
A100 with MIG on and a 1g.10gb slice, an L40S, a B200) and on the shipped H100 and H200 references'
own runs (none of which may fail: the no-false-alarm evidence on real data)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

import pytest

import fake_pynvml
import topologies as topo
from pytest_mig.device.target import TargetInfo
from pytest_mig.device import nvml
from pytest_mig.device.plan import Options, plan_run
from pytest_mig.device.target import CudaProps, verify
from pytest_mig.judge.ceiling import (
    MARGIN,
    Ceiling,
    Ceilings,
    Expectations,
    Point,
    ceiling,
    device_of_record,
    rule_of,
)
from pytest_mig.judge.pipeline import Pipeline, StoreHistories
from pytest_mig.judge.reference import SHIPPED, ReferenceStore, judged_against
from pytest_mig.measure import Metric
from pytest_mig.store.baselines import BaselineStore, meta_from_record
from pytest_mig.store.results import ResultRecord

#: The figures a normal night measures that have a ceiling, and some that do not, as the shipped
#: H100 reference holds them (test id, metric, unit, kind).
REFERENCE = ReferenceStore(SHIPPED)
H100_FULL = REFERENCE.load("nvidia-h100-80gb-hbm3", "full")
assert H100_FULL is not None
FIGURES = sorted({(e.test, e.metric, e.unit, e.kind, e.direction) for e in H100_FULL.baseline.entries.values()
                  if e.mode == "normal"})
CEILING_FIGURES = [f for f in FIGURES if rule_of(f[1], f[2], f[4])]
OTHER_FIGURES = [f for f in FIGURES if not rule_of(f[1], f[2], f[4])]
#: L40S: 142 SMs as its datasheet gives (18,176 CUDA cores / 128 per SM).
L40S_SMS = 142


@pytest.fixture(scope="module")
def ceilings() -> Ceilings:
    return Ceilings(REFERENCE)


def device_run(monkeypatch: pytest.MonkeyPatch, topology: str, props: Callable[[Any], CudaProps],
               **options: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(target dict, NVML fingerprint) of a run planned, verified and fingerprinted through the fake pynvml."""
    fake_pynvml.install(monkeypatch, topology)
    target = plan_run(Options(**options), nvml.discover(), {}).targets[0]
    target = verify(target, props(target))
    return target.to_dict(), nvml.fingerprint(target.gpu_index)


@pytest.fixture
def a100_1g(monkeypatch: pytest.MonkeyPatch, cuda_props_of) -> tuple[dict[str, Any], dict[str, Any]]:
    """A real 1g.10gb slice of an A100 80GB with MIG on (14 SMs, 1/8 of the memory)."""
    return device_run(monkeypatch, "a100-80gb-mixed", lambda t: cuda_props_of("a100-80gb-mixed", t.uuid),
                      profile="1g.10gb")


@pytest.fixture
def l40s(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any]]:
    gpu = topo.get_topology("l40s-no-mig").gpus[0]
    return device_run(monkeypatch, "l40s-no-mig",
                      lambda t: CudaProps(gpu.name, L40S_SMS, gpu.memory_mib * topo.MIB, gpu.compute_capability))


@pytest.fixture
def b200(monkeypatch: pytest.MonkeyPatch, cuda_props_of) -> tuple[dict[str, Any], dict[str, Any]]:
    return device_run(monkeypatch, "b200-mig-off", lambda t: cuda_props_of("b200-mig-off"))


def record(run: tuple[dict[str, Any], dict[str, Any]], figure: tuple[str, ...], value: float,
           mode: str = "normal") -> ResultRecord:
    """A record of ``figure`` (test, metric, unit, kind[, direction]) measured on ``run``'s device, with the
    PCIe link its topology has as the health reading before the test."""
    test, name, unit, kind = figure[:4]
    direction = figure[4] if len(figure) > 4 else "higher"
    target, fp = run
    gpu = next((g for t in topo.TOPOLOGIES.values() for g in t.gpus if g.name == target.get("gpu_name")), None)
    link = dict(zip(("gen", "width", "max_gen", "max_width"), gpu.pcie_link)) if gpu else None
    return ResultRecord(test, Metric(name, value, unit, direction, [value] * 3, kind), TargetInfo.from_dict(target), dict(fp),
                        mode=mode, health={"before": {"pcie": link}} if link else None)


def pipeline(tmp_path, ceilings: Ceilings | None) -> Pipeline:
    """The plugin's pipeline with no local baseline and no reference (``--mig-reference none``)."""
    return Pipeline(StoreHistories(BaselineStore(tmp_path / "baselines")), references=None, ceilings=ceilings)


def expected_value(ceilings: Ceilings, rec: ResultRecord) -> tuple[float, Ceiling] | None:
    """The figure's expected value on its device: its expected fraction (from the references) x its ceiling."""
    device = device_of_record(rec)
    c = ceiling(device, rec.metric.name, rec.metric.unit) if device else None
    if not isinstance(c, Ceiling):
        return None
    exp = ceilings.expectations.expected(rec, device, c.rule)  # type: ignore[arg-type]
    return (exp.fraction * c.value, c) if not isinstance(exp, str) else None


def judge_one(tmp_path, ceilings: Ceilings, rec: ResultRecord):
    (v,) = pipeline(tmp_path, ceilings).judge([rec])
    return v


def check_device(tmp_path, ceilings: Ceilings, run, unjudged: dict[str, str]) -> int:
    """Every ceiling figure of a normal night on this device: a healthy one passes, one at 75% of its
    expected fraction fails and names the ceiling; the figures in ``unjudged`` (metric -> why) stay
    no-baseline saying why.  Returns how many were judged."""
    judged = 0
    for figure in CEILING_FIGURES:
        probe = record(run, figure, 1.0)
        if figure[1] in unjudged:
            v = judge_one(tmp_path, ceilings, probe)
            assert v.outcome == "no-baseline" and unjudged[figure[1]] in v.message, (figure, v.message)
            continue
        got = expected_value(ceilings, probe)
        assert got is not None, figure
        value, c = got
        healthy = judge_one(tmp_path, ceilings, record(run, figure, value))
        assert healthy.outcome == "pass" and healthy.source == "ceiling" and not healthy.failed, healthy.message
        assert f"of this device's ceiling of" in healthy.message and c.how in healthy.message
        assert "judged against the device's ceiling" in healthy.message
        slow = judge_one(tmp_path, ceilings, record(run, figure, 0.75 * value))
        assert slow.outcome == "regressed" and slow.failed and "below it" in slow.message, slow.message
        judged += 1
    for figure in OTHER_FIGURES:
        v = judge_one(tmp_path, ceilings, record(run, figure, 1.0))
        assert v.outcome == "no-baseline", (figure, v.message)
        assert "has no device ceiling: it is judged from the first night after a baseline holds it" in v.message
    return judged


def test_a100_mig_1g_slice_is_judged_against_its_ceiling(tmp_path, ceilings, a100_1g):
    target, fp = a100_1g
    assert target["kind"] == "mig" and target["profile"] == "1g.10gb" and target["sms_obtained"] == 14
    assert fp["compute_capability"] == "8.0" and fp["memory_bus_width_bits"] == 5120
    host = "a real MIG slice's host copies are bound by its copy engines"
    judged = check_device(tmp_path, ceilings, a100_1g, {"h2d_gbs": host, "d2h_gbs": host, "bidir_gbs": host,
                                                          "fp8_tflops": "NVIDIA publishes no fp8 tensor rate",
                                                          "fp8_sustained_tflops": "NVIDIA publishes no fp8",
                                                          "fp8_flop_per_sm_cycle": "NVIDIA publishes no fp8"})
    assert judged == len(CEILING_FIGURES) - 6
    bf16 = record(a100_1g, ("benchmarks/test_gemm.py::test_gemm[bf16]", "bf16_tflops", "TFLOPS", "tensor"), 20.0)
    v = judge_one(tmp_path, ceilings, bf16)
    assert "14 SMs x 1410 MHz x 2048 FLOP per SM per clock: bf16 tensor, Ampere GA100" in v.message
    triad = record(a100_1g, ("benchmarks/test_bandwidth.py::test_stream[fp32]", "fp32_triad_gbs", "GB/s", "memory"), 200)
    v = judge_one(tmp_path, ceilings, triad)
    assert "1593 MHz x 2 transfers x 5120-bit bus x 0.125 of the memory slices (1g.10gb)" in v.message
    assert "on whole GPUs" in v.message  # a real slice's memory is its own: as a whole GPU's fraction


def test_l40s_is_judged_against_its_ceiling(tmp_path, ceilings, l40s):
    target, fp = l40s
    assert target["kind"] == "full" and fp["compute_capability"] == "8.9" and fp["memory_bus_width_bits"] == 384
    judged = check_device(tmp_path, ceilings, l40s, {})
    assert judged == len(CEILING_FIGURES)
    fp64 = record(l40s, ("benchmarks/test_gemm.py::test_gemm[fp64]", "fp64_tflops", "TFLOPS", "compute"), 1.0)
    v = judge_one(tmp_path, ceilings, fp64)  # no FP64 tensor cores on Ada: the CUDA cores' rate
    assert f"{L40S_SMS} SMs x 2520 MHz x 4 FLOP per SM per clock: fp64 CUDA-core, Ada Lovelace" in v.message
    copy = record(l40s, ("benchmarks/test_bandwidth.py::test_stream[fp32]", "fp32_copy_gbs", "GB/s", "memory"), 700)
    assert "9001 MHz x 2 transfers x 384-bit bus" in judge_one(tmp_path, ceilings, copy).message
    h2d = record(l40s, ("benchmarks/test_host_bandwidth.py::test_host_bandwidth", "h2d_gbs", "GB/s", "memory"), 25)
    assert "PCIe Gen4 x16: 31.5 GB/s per direction" in judge_one(tmp_path, ceilings, h2d).message


def test_b200_is_judged_against_its_ceiling(tmp_path, ceilings, b200):
    target, fp = b200
    assert target["kind"] == "full" and target["sms_obtained"] == 148 and fp["compute_capability"] == "10.0"
    unjudged = {f"{p}_fma_tflops": f"NVIDIA publishes no {p} CUDA-core rate for Blackwell" for p in ("fp16", "bf16")}
    unjudged = {k: v for k, v in unjudged.items() if any(f[1] == k for f in CEILING_FIGURES)}
    judged = check_device(tmp_path, ceilings, b200, unjudged)
    assert judged == len(CEILING_FIGURES) - len(unjudged) and "bf16_fma_tflops" in unjudged
    fp8 = record(b200, ("benchmarks/test_gemm.py::test_gemm[fp8]", "fp8_tflops", "TFLOPS", "tensor"), 3000)
    assert "148 SMs x 1965 MHz x 16384 FLOP per SM per clock: fp8 tensor, Blackwell" in judge_one(
        tmp_path, ceilings, fp8).message


def test_the_verdict_line_names_ceiling_floor_and_why(tmp_path, ceilings, l40s):
    figure = ("benchmarks/test_gemm.py::test_gemm[bf16]", "bf16_tflops", "TFLOPS", "tensor")
    value, c = expected_value(ceilings, record(l40s, figure, 1.0))  # type: ignore[misc]
    v = judge_one(tmp_path, ceilings, record(l40s, figure, 0.7 * value))
    fraction = 0.7 * value / c.value
    assert v.line().startswith(f"REGRESSED {figure[0]} bf16_tflops ")
    assert f": {fraction * 100:.0f}% of this device's ceiling of " in v.message
    assert f"floor {MARGIN * value / c.value * 100:.0f}% ({MARGIN:g} x {value / c.value * 100:.0f}%" in v.message
    assert "the least the H100 80GB HBM3 and H200 references reached on whole GPUs" in v.message
    assert "no history or reference run of it for L40S full yet" in v.message
    assert v.basis == "ceiling" and v.baseline == pytest.approx(value) and v.threshold == pytest.approx(1 - MARGIN)


def test_a_regression_is_confirmed_or_found_transient_on_remeasurement(tmp_path, ceilings, l40s):
    figure = ("benchmarks/test_gemm.py::test_gemm[fp16]", "fp16_tflops", "TFLOPS", "tensor")
    value, _ = expected_value(ceilings, record(l40s, figure, 1.0))  # type: ignore[misc]
    pipe = pipeline(tmp_path, ceilings)
    (held,) = pipe.judge([record(l40s, figure, 0.7 * value)], remeasure=lambda: {"fp16_tflops": [0.7 * value] * 2})
    assert held.outcome == "regressed" and held.failed and "confirmed: every re-measurement is below the floor" in held.message
    (dip,) = pipe.judge([record(l40s, figure, 0.7 * value)], remeasure=lambda: {"fp16_tflops": [value, 0.7 * value]})
    assert dip.outcome == "transient" and not dip.failed and "a transient dip, not a regression" in dip.message


def test_above_the_ceiling_is_not_judged(tmp_path, ceilings, l40s):
    figure = ("benchmarks/test_gemm.py::test_gemm[bf16]", "bf16_tflops", "TFLOPS", "tensor")
    _, c = expected_value(ceilings, record(l40s, figure, 1.0))  # type: ignore[misc]
    v = judge_one(tmp_path, ceilings, record(l40s, figure, 1.2 * c.value))
    assert v.outcome == "incomparable" and not v.failed and "above the ceiling" in v.message


def test_cpu_and_unknown_architectures_have_no_ceiling(tmp_path, ceilings, l40s):
    figure = ("benchmarks/test_gemm.py::test_gemm[bf16]", "bf16_tflops", "TFLOPS", "tensor")
    cpu = record(({"kind": "cpu", "profile": "cpu", "gpu_name": None}, {}), figure, 1.0)
    v = judge_one(tmp_path, ceilings, cpu)
    assert v.outcome == "no-baseline" and "ceiling" not in v.message
    target, fp = l40s
    blackwell_pro = ({**target, "gpu_name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "gpu_slug": "rtx"},
                     {**fp, "compute_capability": "12.0"})
    v = judge_one(tmp_path, ceilings, record(blackwell_pro, figure, 100.0))
    assert v.outcome == "no-baseline"
    assert "no device ceiling: compute capability 12.0 is not in the architecture table" in v.message


def test_a_reference_or_a_history_comes_before_the_ceiling(tmp_path, ceilings):
    """On an H100 with the shipped reference the reference judges; only without it the ceiling does."""
    entry = H100_FULL.get("benchmarks/test_gemm.py::test_gemm[bf16]", "bf16_tflops", "normal")
    assert entry is not None
    target = {"kind": "full", "profile": "full", "gpu_name": "NVIDIA H100 80GB HBM3", "sms": 132, "sms_obtained": 132}
    rec = ResultRecord(entry.test, Metric(entry.metric, entry.value, entry.unit, "higher", [entry.value], entry.kind),
                       TargetInfo.from_dict(target), dict(entry.fingerprint))
    with_ref = Pipeline(StoreHistories(BaselineStore(tmp_path / "b")), references=REFERENCE, ceilings=ceilings)
    assert with_ref.judge([rec])[0].source == "reference"
    assert pipeline(tmp_path, ceilings).judge([rec])[0].source == "ceiling"
    assert pipeline(tmp_path, None).judge([rec])[0].outcome == "no-baseline"


def test_the_header_says_what_a_first_night_is_judged_against(tmp_path, ceilings, monkeypatch):
    fake_pynvml.install(monkeypatch, "l40s-no-mig")
    gpu = topo.get_topology("l40s-no-mig").gpus[0]
    t = verify(plan_run(Options(), nvml.discover(), {}).targets[0],
               CudaProps(gpu.name, L40S_SMS, gpu.memory_mib * topo.MIB, gpu.compute_capability))
    (line,) = judged_against([t], BaselineStore(tmp_path), None, "normal", ceilings=ceilings,
                             fingerprint=nvml.fingerprint(t.gpu_index))
    assert "compute and bandwidth figures judged against this device's ceiling (Ada Lovelace, 142 SMs at up to " \
           "2520 MHz, memory 864.1 GB/s)" in line
    assert line.endswith("; the other figures are reported, not judged; record a baseline with --mig-save-baseline")


def _reference_records():
    """Every run of a compute or bandwidth figure in the shipped references, as the record a night on
    that GPU and profile would have written (SMs from the profile table; emulated profiles whose SM
    count the driver rounds are left out, as the expected fractions leave them out)."""
    from pytest_mig.device.profiles import lookup_model, parse_profile

    for ref in REFERENCE.references():
        meta = ref.baseline.meta
        model = lookup_model(meta.gpu_model)
        assert model is not None
        profile = meta.target_profile
        sms = model.sms if profile == "full" else model.profile(parse_profile(profile).gi_name).sms  # type: ignore[union-attr]
        if meta.emulated and sms % 8 and sms != model.sms:
            continue
        kind = "emulated" if meta.emulated else "full"
        target = {"kind": kind, "profile": profile, "gpu_name": meta.gpu_model, "emulated": meta.emulated,
                  "sms": sms, "sms_obtained": sms}
        for e in ref.baseline.entries.values():
            if rule_of(e.metric, e.unit, e.direction) is None:
                continue
            for run in e.runs:
                link = {"max_gen": 5, "max_width": 16}  # the reference boards' link: Gen5 x16 (their health records)
                yield ResultRecord(e.test, Metric(e.metric, run.value, e.unit, "higher", [run.value], e.kind,
                                                  {"link_under_load": link}), TargetInfo.from_dict(target),
                                   dict(run.fingerprint),
                                   mode=e.mode)


def test_no_run_of_the_shipped_references_falls_below_its_floor(tmp_path, ceilings):
    """The H100 and H200 references' own runs, judged with the reference hidden (--mig-reference none):
    every compute and bandwidth figure gets a ceiling verdict, and none fails."""
    records = list(_reference_records())
    assert len(records) > 2000
    pipe = pipeline(tmp_path, ceilings)
    worst = math.inf
    for rec in records:
        (v,) = pipe.judge([rec])
        assert v.source == "ceiling" and v.outcome == "pass", v.message
        worst = min(worst, (rec.metric.value / v.baseline) / MARGIN)  # type: ignore[operator]
    assert worst >= 1 / MARGIN - 1e-9  # each run is at least the least run of its comparable references
    assert {meta_from_record(r).gpu_slug for r in records} == {"nvidia-h100-80gb-hbm3", "nvidia-h200"}


def test_a_headline_no_reference_holds_takes_its_sustained_rates_fraction_not_its_familys(l40s):
    """A GEMM headline with no reference run (references that dropped a redefined headline) is expected to
    reach what its sustained rate reached, the same kernel and precision, not what the CUDA-core fp32
    GEMM of its family reached: a tensor-core GEMM reaches less of its ceiling at the power cap."""
    fp8, fp32 = "benchmarks/test_gemm.py::test_gemm[fp8]", "benchmarks/test_gemm.py::test_gemm[fp32]"
    exp = Expectations(ReferenceStore(SHIPPED))
    exp._points = {(fp8, "fp8_sustained_tflops", "quick"): [Point("NVIDIA H200", "full", 1.0, 0.55, 3)],
                   (fp32, "fp32_tflops", "quick"): [Point("NVIDIA H200", "full", 1.0, 0.71, 3)]}
    rec = record(l40s, (fp8, "fp8_tflops", "TFLOPS", "tensor"), 100.0, mode="quick")
    device = device_of_record(rec)
    assert device is not None
    got = exp.expected(rec, device, "gemm")
    assert not isinstance(got, str) and (got.fraction, got.family) == (0.55, "fp8_sustained_tflops")
    del exp._points[(fp8, "fp8_sustained_tflops", "quick")]  # no sustained rate held: its family speaks
    got = exp.expected(rec, device, "gemm")
    assert not isinstance(got, str) and (got.fraction, got.family) == (0.71, "fp32_tflops")


def test_a_first_night_catches_a_headline_loss_on_profiles_whose_references_hold_no_headline(tmp_path):
    """The emulated profiles' references hold the sustained GEMM rate but not the redefined headline: a
    first night judges the headline against the device's ceiling, expecting what the sustained rate
    reached on targets of its share (a 16-SM slice about 90% of its ceiling, a whole GPU 61-63%):
    a headline at the sustained rate's value passes, one at 0.7 of it fails."""
    pipe, checked = Pipeline(StoreHistories(BaselineStore(tmp_path / "b")), references=REFERENCE,
                             ceilings=Ceilings(REFERENCE)), 0
    for rec in _reference_records():
        name = rec.metric.name
        if not name.endswith("_sustained_tflops") or rec.target.kind != "emulated":
            continue
        ref = REFERENCE.load(meta_from_record(rec).gpu_slug, meta_from_record(rec).profile)
        headline = name.replace("sustained_", "")
        if ref is None or ref.get(rec.test, headline, rec.mode) is not None:
            continue
        for factor, outcome in ((1.0, "pass"), (0.7, "regressed")):
            value = rec.metric.value * factor
            (v,) = pipe.judge([replace(rec, metric=replace(rec.metric, name=headline, value=value, samples=[value]))])
            assert (v.outcome, v.source) == (outcome, "ceiling"), (rec.target.gpu_name, rec.target.profile, headline, v.message)
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize(("judged", "by"), [("nvidia-h100-80gb-hbm3", "nvidia-h200"),
                                             ("nvidia-h200", "nvidia-h100-80gb-hbm3")])
def test_one_models_runs_pass_the_floors_set_by_the_other_model_alone(tmp_path, judged, by):
    """A GPU model the floors were not calibrated on, as a new GPU is: each model's reference runs against
    floors from the other model's references only.  Every compute, per-cycle, whole-GPU memory and
    one-way host figure passes; an emulated profile's memory bandwidth is not judged across models (a
    green context's bandwidth follows its SMs' load rate, which differs between models).  Bidirectional
    host copies follow the host's root complex more than the link: the H100's host reached less of twice
    the link than the H200's, so a few of its runs fall below the H200's floor; they are counted here."""
    import shutil

    shutil.copytree(SHIPPED / by, tmp_path / "refs" / by)
    pipe = pipeline(tmp_path, Ceilings(ReferenceStore(tmp_path / "refs")))
    outcomes: dict[tuple[str, str, str], int] = {}
    for rec in _reference_records():
        if meta_from_record(rec).gpu_slug != judged:
            continue
        (v,) = pipe.judge([rec])
        rule = rule_of(rec.metric.name, rec.metric.unit)[0]  # type: ignore[index]
        key = (rule if rec.metric.name != "bidir_gbs" else "bidir", rec.target.kind, v.outcome)
        outcomes[key] = outcomes.get(key, 0) + 1
    judged_kinds = {(rule, kind) for rule, kind, _ in outcomes}
    assert {("gemm", "full"), ("gemm", "emulated"), ("cuda", "full"), ("per-cycle", "emulated"), ("memory", "full"),
            ("host", "full"), ("host", "emulated")} <= judged_kinds
    for (rule, kind, outcome), n in outcomes.items():
        if rule == "memory" and kind == "emulated":
            assert outcome == "no-baseline"
        elif rule == "bidir":
            assert outcome in ("pass", "regressed")
        else:
            assert outcome == "pass", (rule, kind, outcome, n)
    bidir_failed = sum(n for (rule, _, outcome), n in outcomes.items() if rule == "bidir" and outcome == "regressed")
    bidir_all = sum(n for (rule, _, _), n in outcomes.items() if rule == "bidir")
    assert bidir_failed < bidir_all / 10  # the H100's runs against the H200's floor: 3 of 33
