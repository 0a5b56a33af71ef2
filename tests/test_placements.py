"""Timing on several buffer sets: how many fit, and that a timed run visits each exactly once."""

from __future__ import annotations

import pytest

from pytest_mig.measure import time_fn
from pytest_mig.measure.placements import SHARE, Rotation, fitting

GB = 10**9


def test_as_many_sets_as_wanted_where_they_fit():
    assert fitting(2 * GB, 140 * GB, 4) == 4


def test_fewer_sets_where_the_budget_is_tight():
    assert fitting(2 * GB, 10 * GB, 4) == 4  # 80% of 10 GB holds four, just
    assert fitting(2 * GB + 1, 10 * GB, 4) == 3
    assert fitting(3 * GB, 10 * GB, 4) == 2
    assert fitting(8 * GB, 10 * GB, 4) == 1  # exactly the share


def test_no_set_where_one_does_not_fit():
    assert fitting(int(SHARE * 10 * GB) + 1, 10 * GB, 4) == 0


def test_nothing_to_hold_takes_what_is_wanted():
    assert fitting(0, 10 * GB, 3) == 3


def test_a_timed_run_visits_every_set_once_after_any_warm_up():
    seen: list[str] = []
    rotation = Rotation([("a",), ("b",), ("c",), ("d",)], seen.append)
    for warmup in range(5):
        seen.clear()
        time_fn(rotation, warmup=warmup, repeats=4, device="cpu")
        assert sorted(seen[-4:]) == ["a", "b", "c", "d"]
        assert len(seen) == warmup + 4


def test_repeats_give_every_set_as_many_and_at_least_the_least():
    assert [Rotation([(i,) for i in range(k)], print).repeats(3) for k in (1, 2, 3, 4)] == [3, 4, 3, 4]
    assert Rotation([(1,), (2,)], print).repeats(0) == 2  # every set timed at least once


def test_a_rotation_passes_each_set_as_arguments():
    got = []
    rotation = Rotation([(1, 2), (3, 4)], lambda x, y: got.append(x + y) or x * y)
    assert [rotation() for _ in range(3)] == [2, 12, 2]
    assert got == [3, 7, 3]


def test_a_rotation_needs_a_set():
    with pytest.raises(ValueError, match="at least one"):
        Rotation([], print)
