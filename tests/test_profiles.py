from __future__ import annotations

import pytest

from pytest_mig.device.profiles import (
    CATALOG, ProfileError, ideal_ratio, ladder, lookup_model, model_slug, parse_profile, strip_mig_suffix,
)


@pytest.mark.parametrize("text,gi,ci,mem,media", [
    ("1g.10gb", 1, 1, 10, False),
    ("1g.10gb+me", 1, 1, 10, True),
    ("1c.3g.40gb", 3, 1, 40, False),
    ("7G.141GB", 7, 7, 141, False),
])
def test_parse_profile(text: str, gi: int, ci: int, mem: int, media: bool) -> None:
    p = parse_profile(text)
    assert (p.gpu_slices, p.compute_slices, p.memory_gb, p.media) == (gi, ci, mem, media)
    assert str(p) == text.lower()


@pytest.mark.parametrize("bad", ["1g10gb", "9g.10gb", "g.10gb", "1g.10", "4c.3g.40gb", "full-gpu", ""])
def test_parse_profile_rejects_malformed_names(bad: str) -> None:
    with pytest.raises(ProfileError):
        parse_profile(bad)


def test_catalog_profiles_parse_and_fit_their_gpu() -> None:
    for model in CATALOG:
        for p in model.profiles:
            assert p.parsed.gi_name == p.name
            assert p.memory_gib <= model.memory_gib
            assert p.sms is None or p.sms <= model.sms


@pytest.mark.parametrize("name,mib,key", [
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-SXM4-40GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None, "A100-SXM4-40GB"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM5-80GB"),
    ("NVIDIA H100 PCIe", 81559, "H100-PCIe-80GB"),
    ("NVIDIA H200", 143771, "H200-141GB"),
    ("NVIDIA A30", 24576, "A30"),
])
def test_lookup_model(name: str, mib: int | None, key: str) -> None:
    model = lookup_model(name, mib)
    assert model is not None and model.key == key


def test_lookup_unknown_gpu_is_none() -> None:
    assert lookup_model("NVIDIA GeForce RTX 4090") is None


def test_slug_strips_the_mig_suffix() -> None:
    assert strip_mig_suffix("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "NVIDIA A100-SXM4-40GB"
    assert model_slug("NVIDIA A100-SXM4-40GB MIG 3g.20gb") == "nvidia-a100-sxm4-40gb"
    assert model_slug("NVIDIA H200") == "nvidia-h200"


def test_ideal_ratios_follow_the_users_slice_ratios_and_sms() -> None:
    a100 = lookup_model("NVIDIA A100-SXM4-40GB")
    h200 = lookup_model("NVIDIA H200")
    assert a100 is not None and h200 is not None
    p = {x.name: x for x in a100.profiles}
    assert ideal_ratio(p["7g.40gb"], p["3g.20gb"]) == pytest.approx(7 / 3)
    assert ideal_ratio(p["3g.20gb"], p["2g.10gb"]) == pytest.approx(3 / 2)
    assert ideal_ratio(p["2g.10gb"], p["1g.5gb"]) == pytest.approx(2)
    assert ideal_ratio(p["3g.20gb"], p["1g.5gb"], "memory") == pytest.approx(4)
    q = {x.name: x for x in h200.profiles}
    assert ideal_ratio(q["7g.141gb"], q["3g.71gb"], "sms") == pytest.approx(2.2)
    with pytest.raises(ProfileError):
        ideal_ratio(q["7g.141gb"], q["3g.71gb"], "watts")  # type: ignore[arg-type]


def test_ladder_drops_media_variants_and_sorts_small_first() -> None:
    h200 = lookup_model("NVIDIA H200")
    assert h200 is not None
    assert [p.name for p in ladder(h200.profiles)] == ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
