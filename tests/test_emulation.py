"""The parts of the Emulator that need no GPU: one green-context stream per SM count, reused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_mig import emulation
from pytest_mig.emulation import Emulator, set_device_keeps_context


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
