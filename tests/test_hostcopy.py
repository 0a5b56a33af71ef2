"""Host-device bandwidth on the CPU: sizes, the link arithmetic of its figures, and its skip."""

from __future__ import annotations

import pytest
import torch

from pytest_mig.device.health import link_gbs
from pytest_mig.measure import Timer
from pytest_mig.device.target import Target
from pytest_mig.workloads import DoesNotFit
from pytest_mig.workloads.hostcopy import _link_fractions, byte_pattern, run_host_copies, transfer_bytes


def test_transfers_are_a_gib_or_a_quarter_of_the_slice() -> None:
    assert transfer_bytes(80 * 2**30, quick=False) == 2**30
    assert transfer_bytes(80 * 2**30, quick=True) == 2**28
    assert transfer_bytes(int(1.5 * 2**30), quick=False) == 384 * 2**20  # a small slice: whole MiB, under a quarter


def test_the_bytes_sent_are_made_without_a_temporary_larger_than_the_buffer() -> None:
    n = 10**6 + 7
    got = byte_pattern(n, "cpu")
    assert got.dtype == torch.uint8 and got.is_contiguous() and got.numel() == n
    assert torch.equal(got, (torch.arange(n, dtype=torch.int64) % 251).to(torch.uint8))
    assert got.untyped_storage().nbytes() < n + 251  # not 4 bytes per byte, as an int32 arange took


def test_too_small_a_budget_does_not_fit() -> None:
    with pytest.raises(DoesNotFit, match="too small to saturate a link"):
        transfer_bytes(2**27, quick=False)


def test_on_the_cpu_there_is_no_link_to_measure(cpu: Target) -> None:
    with pytest.raises(DoesNotFit, match="needs a GPU"):
        run_host_copies(cpu, Timer("cpu"))


def test_a_link_trained_down_to_x8_shows_as_about_half() -> None:
    x8 = {"gen": 5, "width": 8, "max_gen": 5, "max_width": 16}
    rate = 0.9 * link_gbs(5, 8)  # what an x8 link delivers
    fractions = {m.name: m for m in _link_fractions({"h2d": rate, "d2h": rate, "bidir": 2 * rate}, x8)}
    assert fractions["h2d_fraction_of_link"].value == pytest.approx(0.45)
    assert fractions["bidir_fraction_of_link"].value == pytest.approx(0.45)  # both directions against twice the rate
    info = fractions["d2h_fraction_of_link"].info
    assert info["link_gbs"] == pytest.approx(63.02, abs=0.01) and info["link_now_gbs"] == pytest.approx(31.51, abs=0.01)
    assert not fractions["h2d_fraction_of_link"].compare  # informational: the GB/s figures gate


def test_without_a_link_reading_there_are_no_fractions() -> None:
    assert _link_fractions({"h2d": 50.0, "d2h": 50.0, "bidir": 100.0}, None) == []
