"""The architecture table (pytest_mig/device/architectures.json): every per-SM rate recomputed from the
NVIDIA table it cites, the memory bus facts against the datasheets' bandwidth, and how a device
(compute capability, name) finds its architecture and product variant."""

from __future__ import annotations

import pytest

import topologies as topo
from pytest_mig.device.architectures import (
    UNITS,
    architecture_for,
    fma_per_sm_per_clock,
    model_facts,
    parse_capability,
    table,
    transfers_per_clock,
)

#: How far NVIDIA's rounded TFLOPS may sit from SMs x clock x rate (the L40S's FP16 tensor figure is 1.2%
#: below 142 SMs x 2520 MHz x 1024; the HGX B200's TF32 one 2.3% below its FP16 one's clock).
PUBLISHED_SLACK = 0.03


def _published_rows():
    raw = table().raw
    for key, arch in raw["architectures"].items():
        for pub in arch["published"]:
            yield key, arch, pub
    for variant in raw["variants"]:
        for pub in variant.get("published", ()):
            yield variant["match"], variant, pub


@pytest.mark.parametrize(("where", "rates", "pub"), list(_published_rows()),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_every_rate_is_its_published_figure_over_sms_and_clock(where, rates, pub):
    """rate x SMs x the clock the table was computed at gives NVIDIA's published TFLOPS."""
    assert pub["source"].startswith("https://") and pub["table"]
    for figure, tflops in pub["tflops"].items():
        unit, precision = figure.split(".")
        rate = rates[unit][precision]
        mhz = pub["mhz"].get(figure, pub["mhz"][unit])
        recomputed = rate * pub["sms"] * mhz / 1e6
        assert recomputed == pytest.approx(tflops, rel=PUBLISHED_SLACK), (where, pub["product"], figure)


def test_every_rate_has_a_published_source():
    """No rate without the table it comes from: each is in some 'published' row of its architecture."""
    raw = table().raw
    for key, arch in raw["architectures"].items():
        sourced = {figure for pub in arch["published"] for figure in pub["tflops"]}
        for unit in UNITS:
            for precision in arch.get(unit, {}):
                assert f"{unit}.{precision}" in sourced, (key, unit, precision)
    for variant in raw["variants"]:
        sourced = {figure for pub in variant.get("published", ()) for figure in pub["tflops"]}
        for unit in UNITS:
            for precision in variant.get(unit, {}):
                assert f"{unit}.{precision}" in sourced, (variant["match"], unit, precision)


@pytest.mark.parametrize("gpu", [g for t in topo.TOPOLOGIES.values() for g in t.gpus[:1]], ids=lambda g: g.name)
def test_nvml_memory_clock_times_two_times_bus_is_the_datasheet_bandwidth(gpu):
    """Each fake GPU's NVML memory clock x 2 transfers x bus width within 3% of its model's datasheet
    bandwidth (HBM, and GDDR6, which NVML reports at half its per-pin rate: the L40S's 9001 MHz)."""
    facts = model_facts(gpu.name)
    assert facts is not None and facts.memory_bus_bits == gpu.memory_bus_width
    gbs = gpu.max_mem_clock_mhz * 1e6 * transfers_per_clock() * gpu.memory_bus_width / 8 / 1e9
    assert gbs == pytest.approx(facts.memory_gbs, rel=0.03)


def test_architecture_by_compute_capability_not_by_major():
    """8.0 and 8.6 are different architectures: 32x apart in FP64, 2x in FP32 per SM."""
    ga100, ga10x = architecture_for("8.0"), architecture_for((8, 6))
    assert ga100 is not None and ga10x is not None and ga100.key != ga10x.key
    assert ga100.rate("cuda", "fp64") == 16 * ga10x.rate("cuda", "fp64")  # type: ignore[operator]
    assert 2 * ga100.rate("cuda", "fp32") == ga10x.rate("cuda", "fp32")  # type: ignore[operator]
    assert architecture_for("9.0").name == "Hopper"  # type: ignore[union-attr]
    assert architecture_for("12.0", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition") is None
    assert architecture_for(None, "NVIDIA H200").key == "hopper"  # type: ignore[union-attr]  # by its model's facts
    assert architecture_for(None, "Some Unknown GPU") is None
    assert parse_capability("10.0") == (10, 0) and parse_capability("x") is None and parse_capability([9, 0]) == (9, 0)


def test_product_variants_take_their_own_rates():
    """GeForce and the L40 run FP32-accumulate tensor maths at half the L40S's rate; an H800 has no ceiling."""
    l40s, l40 = architecture_for("8.9", "NVIDIA L40S"), architecture_for("8.9", "NVIDIA L40")
    rtx = architecture_for("8.9", "NVIDIA GeForce RTX 4090")
    assert l40s is not None and l40 is not None and rtx is not None
    assert l40s.variant is None and l40.variant and rtx.variant
    assert l40.rate("tensor", "bf16") * 2 == l40s.rate("tensor", "bf16")  # type: ignore[operator]
    assert rtx.rate("cuda", "fp32") == l40s.rate("cuda", "fp32")
    assert architecture_for("9.0", "NVIDIA H800").no_ceiling  # type: ignore[union-attr]
    assert architecture_for("9.0", "NVIDIA H200").no_ceiling is None  # type: ignore[union-attr]


def test_fma_per_sm_per_clock_is_half_the_cuda_flop():
    """The FMA chain's peak: A100 pairs fp16 (256 FMA per SM per clock) but not bf16 (128); GA10x has
    128 FP32 FMA per SM; Blackwell publishes no 16-bit CUDA-core rate."""
    assert fma_per_sm_per_clock("8.0", "fp16") == 256 and fma_per_sm_per_clock("8.0", "bf16") == 128
    assert fma_per_sm_per_clock("8.6", "fp32") == 128 and fma_per_sm_per_clock("8.6", "fp64") == 2
    assert fma_per_sm_per_clock("9.0", "bf16") == 256
    assert fma_per_sm_per_clock("10.0", "fp16") is None and fma_per_sm_per_clock("10.0", "fp32") == 128
