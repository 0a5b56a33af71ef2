"""The parts of the Emulator that need no GPU: one green-context stream per SM count, reused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_mig.device import emulation
from pytest_mig.device.emulation import Emulator, set_device_keeps_context


class FakeGreenContext:
    def __init__(self) -> None:
        self.made = 0

    def Stream(self) -> object:  # noqa: N802 - torch's name
        self.made += 1
        return object()


def test_each_green_context_gets_one_stream_of_its_own_reused_across_tests() -> None:
    em = Emulator.__new__(Emulator)  # no CUDA here: only the stream bookkeeping is exercised
    em._streams = {}
    ctx16, ctx32 = FakeGreenContext(), FakeGreenContext()
    first = em._stream(16, ctx16)
    assert em._stream(16, ctx16) is first and ctx16.made == 1
    assert em._stream(32, ctx32) is not first and ctx32.made == 1


def test_a_torch_without_green_context_streams_falls_back_to_the_default_stream() -> None:
    em = Emulator.__new__(Emulator)
    em._streams = {}
    assert em._stream(16, object()) is None


def test_set_device_of_the_green_contexts_own_device_changes_nothing_and_another_is_passed_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(torch.cuda, "set_device", asked.append)
    original = torch.cuda.set_device
    with set_device_keeps_context(0):
        torch.cuda.set_device(0)  # what inductor's generated code calls before each compiled graph
        torch.cuda.set_device(torch.device("cuda:0"))
        torch.cuda.set_device("cuda:0")
        assert asked == []
        torch.cuda.set_device(1)
        assert asked == [1]
    assert torch.cuda.set_device is original
    torch.cuda.set_device(0)
    assert asked == [1, 0]


def test_the_guard_is_given_back_when_the_test_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    original = torch.cuda.set_device
    with pytest.raises(RuntimeError), set_device_keeps_context(0):
        raise RuntimeError("a failing test")
    assert torch.cuda.set_device is original


def test_escaped_says_so_only_when_the_current_context_is_no_longer_the_active_green_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    em = Emulator.__new__(Emulator)
    em._active = None
    current = [0x2000]
    monkeypatch.setattr(emulation, "current_context", lambda: current[0])
    monkeypatch.setattr(emulation, "current_context_sms", lambda: 132)
    assert em.escaped() is None  # no green context active: nothing to leave
    em._active = (0x2000, 64)
    assert em.escaped() is None
    current[0] = 0x1000  # the primary context, as a forced cudaSetDevice leaves it
    why = em.escaped()
    assert why is not None and "green context of 64 SMs" in why and "now has 132 SMs" in why


def _emulated(profile: str, asked: int, got: int | None, memory_bytes: int) -> Any:
    from pytest_mig.device.target import Target

    return Target("emulated", profile, "emulation", gpu_name="NVIDIA H100 80GB HBM3", sms=asked, sms_obtained=got,
                  memory_bytes=memory_bytes)


def test_a_sweep_keeps_one_profile_per_green_context_the_one_that_got_what_it_asked() -> None:
    """An H100's ladder as its reference runs read it back (SMs asked, obtained, memory cap): 1g.20gb asks
    26 SMs and gets 2g.20gb's 32 with the same memory; 3g.40gb asks 60 and gets 4g.40gb's 64."""
    ladder = [_emulated("1g.10gb", 16, 16, 10468982784), _emulated("1g.20gb", 26, 32, 21072183296),
              _emulated("2g.20gb", 32, 32, 21072183296), _emulated("3g.40gb", 60, 64, 42412802048),
              _emulated("4g.40gb", 64, 64, 42412802048), _emulated("7g.80gb", 132, 132, 85094039552)]
    kept, left = emulation.distinct_contexts(ladder)
    assert [t.profile for t in kept] == ["1g.10gb", "2g.20gb", "4g.40gb", "7g.80gb"]
    assert left == ["1g.20gb left out of the sweep: its green context obtained the same 32 SMs and 19.6 GiB as "
                    "2g.20gb's (26 asked), so it would measure the same configuration again; measured once, as "
                    "2g.20gb (--mig-all-tests measures both)",
                    "3g.40gb left out of the sweep: its green context obtained the same 64 SMs and 39.5 GiB as "
                    "4g.40gb's (60 asked), so it would measure the same configuration again; measured once, as "
                    "4g.40gb (--mig-all-tests measures both)"]
    # the order of the ladder does not decide which twin stays: the one whose SMs were obtained as asked
    kept, _ = emulation.distinct_contexts(list(reversed(ladder)))
    assert [t.profile for t in kept] == ["7g.80gb", "4g.40gb", "2g.20gb", "1g.10gb"]


def test_the_same_sms_with_other_memory_are_two_contexts_both_measured() -> None:
    """The largest batches differ with the memory cap, so the same SMs alone make no twin."""
    two = [_emulated("a", 16, 16, 10 * 2**30), _emulated("b", 16, 16, 20 * 2**30)]
    assert emulation.distinct_contexts(two) == (two, [])


def test_twins_that_both_were_rounded_keep_the_first_and_unknown_sms_are_never_merged() -> None:
    both_rounded = [_emulated("a", 26, 32, 35 * 2**30), _emulated("b", 30, 32, 35 * 2**30)]
    kept, left = emulation.distinct_contexts(both_rounded)
    assert [t.profile for t in kept] == ["a"] and len(left) == 1 and left[0].startswith("b left out")
    unread = [_emulated("a", 26, None, 35 * 2**30), _emulated("b", 26, None, 35 * 2**30)]
    assert emulation.distinct_contexts(unread) == (unread, [])
