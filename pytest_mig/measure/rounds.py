"""How a pytest-benchmark round is cut on a GPU: calls per round (:class:`pytest_mig.bench.BenchTimer`),
kept here, below the plugin, for what reads a recorded figure's rounds back (``pytest-mig replay``)."""

from __future__ import annotations

import math

#: A pytest-benchmark round on a GPU lasts at least this long (several calls when one is short).
MIN_ROUND_S = 0.01
MAX_ITERATIONS = 1000


def rounds_iterations(seconds_per_call: float, min_round_s: float = MIN_ROUND_S) -> int:
    """Calls per pytest-benchmark round so that a round lasts at least ``min_round_s``."""
    if not seconds_per_call > 0:
        return 1
    return max(1, min(MAX_ITERATIONS, math.ceil(min_round_s / seconds_per_call)))


__all__ = ["MAX_ITERATIONS", "MIN_ROUND_S", "rounds_iterations"]
