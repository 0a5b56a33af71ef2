"""The parts of the Emulator that need no GPU: one green-context stream per SM count, reused."""

from __future__ import annotations

from pytest_mig.emulation import Emulator


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
