"""The trend page's axes (``report.axes``) and one chart's SVG (``report.chart``): nice value ticks,
dated time ticks that read apart within one day, bands that stop at zero, the index fallback."""

from __future__ import annotations

import random
import re
from datetime import datetime, timezone

import pytest

from pytest_mig.report.axes import (DAY, HOUR, nice_step, nice_ticks, parse_time, tick_label, time_domain,
                                    time_step, time_ticks)
from pytest_mig.report.chart import BOTTOM, TOP, frame_of, svg
from pytest_mig.report.trend import Point, Series


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize("span,target,step", [(10, 5, 2), (1, 4, 0.25), (0.03, 5, 0.01), (8.8, 5, 2), (420, 5, 100),
                                              (7, 5, 2), (1e-6, 4, 2.5e-7)])
def test_a_nice_step_is_1_2_2_5_or_5_times_a_power_of_ten(span: float, target: int, step: float) -> None:
    assert nice_step(span, target) == pytest.approx(step)


def test_nice_ticks_cover_the_range_in_equal_steps_with_distinct_labels() -> None:
    rng = random.Random(49)
    for _ in range(2000):
        lo = rng.uniform(-1e4, 1e4) * 10 ** rng.randint(-6, 3)
        hi = lo + abs(rng.gauss(0, 1)) * 10 ** rng.randint(-6, 4) + 1e-12
        bottom, top, ticks = nice_ticks(lo, hi)
        assert bottom <= lo and top >= hi and ticks[0] == bottom and ticks[-1] == top
        assert 2 <= len(ticks) <= 7, (lo, hi, ticks)
        step = ticks[1] - ticks[0]
        assert all(b - a == pytest.approx(step, rel=1e-6, abs=1e-12 * abs(a)) for a, b in zip(ticks, ticks[1:]))
        labels = [tick_label(t, step) for t in ticks]
        assert len(set(labels)) == len(labels), (lo, hi, labels)


def test_a_range_that_cannot_be_negative_starts_at_zero_not_below() -> None:
    assert nice_ticks(0.0, 420.0) == (0.0, 500.0, [0.0, 100.0, 200.0, 300.0, 400.0, 500.0])
    assert nice_ticks(3.0, 97.0)[0] == 0.0 and nice_ticks(0.0, 0.0) == (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    bottom, top, ticks = nice_ticks(5.0, 5.0)  # one value: widened around it
    assert bottom < 5.0 < top and len(ticks) >= 3


def test_tick_labels_carry_the_decimals_their_step_needs() -> None:
    assert [tick_label(v, 0.25) for v in (100.0, 100.25, 100.5)] == ["100.00", "100.25", "100.50"]
    assert [tick_label(v, 250.0) for v in (0.0, 1250.0)] == ["0", "1250"] and tick_label(25.0, 25.0) == "25"
    assert tick_label(2.5, 2.5) == "2.5" and tick_label(300.0, 100.0) == "300" and tick_label(-0.0, 1.0) == "0"


def test_times_parse_as_utc_and_a_time_that_is_none_is_none() -> None:
    assert parse_time("2026-11-26T02:00:00+00:00") == epoch("2026-11-26T02:00:00")
    assert parse_time("2026-11-26T02:00:00Z") == parse_time("2026-11-26T02:00:00") == epoch("2026-11-26T02:00:00")
    assert parse_time("2026-11-26T03:00:00+01:00") == epoch("2026-11-26T02:00:00")
    assert parse_time("") is None and parse_time("yesterday") is None


def test_four_runs_of_one_day_get_ticks_with_distinct_times_of_day() -> None:
    runs = [epoch(f"2026-11-26T{h:02d}:00:00") for h in (2, 8, 14, 20)]
    t0, t1 = time_domain(runs)
    ticks = time_ticks(t0, t1)
    assert 3 <= len(ticks) <= 6 and all(t0 <= t <= t1 for t, _, _ in ticks)
    assert {day for _, day, _ in ticks} == {"2026-11-26"}  # one day ...
    clocks = [clock for _, _, clock in ticks]
    assert all(re.fullmatch(r"\d\d:\d\d", c) for c in clocks) and len(set(clocks)) == len(clocks)  # ... read apart


def test_a_long_history_is_labelled_by_dates_and_seconds_show_under_a_minute() -> None:
    start = epoch("2026-01-01T02:00:00")
    ticks = time_ticks(start, start + 120 * DAY)
    assert all(clock == "" for _, _, clock in ticks) and len({d for _, d, _ in ticks}) == len(ticks) >= 3
    assert time_step(120 * DAY) == 28 * DAY and time_step(10 * 364 * DAY) % (364 * DAY) == 0
    short = time_ticks(start, start + 40)
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", clock) for _, _, clock in short) and len(short) >= 3
    assert time_domain([start]) == (start - HOUR, start + HOUR)
    with pytest.raises(ValueError):
        time_ticks(start, start)


def series(points: list[Point]) -> Series:
    return Series("NVIDIA H100", "1g.10gb", "normal", "benchmarks/test_bw.py::test_hbm", "hbm_gbps", "GB/s", "higher",
                  points)


def rects(page: str) -> list[tuple[float, float]]:
    """Each band's top and bottom in the SVG's coordinates."""
    return [(float(y), float(y) + float(h)) for y, h in re.findall(r'<rect class="band"[^>]* y="([-\d.]+)" '
                                                                    r'width="[-\d.]+" height="([-\d.]+)"', page)]


def test_a_band_that_would_reach_below_zero_stops_at_zero_on_a_figure_that_cannot_be_negative() -> None:
    wide = [Point(f"2026-11-{10 + i}T02:00:00+00:00", v, "pass", 300.0, 2.4) for i, v in enumerate((290.0, 310.0, 305.0))]
    frame = frame_of(series(wide))
    assert frame.lo == 0.0 and frame.y(0.0) == BOTTOM  # 300 * (1 - 2.4) = -420: not drawn
    page = svg(series(wide), "f-0")
    assert len(rects(page)) == 3 and all(TOP <= top and bottom <= BOTTOM + 0.05 for top, bottom in rects(page))
    assert not re.search(r'class="ytick"[^>]*>-', page)  # no negative tick label
    signed = [Point(f"2026-11-{10 + i}T02:00:00+00:00", v, "pass", 1.0, 2.4) for i, v in enumerate((-0.5, 1.0, 0.8))]
    assert frame_of(series(signed)).lo < -1.0  # a figure that was negative once keeps its whole band


def test_the_chart_has_labelled_y_ticks_with_gridlines_and_dated_x_ticks() -> None:
    points = [Point(f"2026-11-26T{h:02d}:00:00+00:00", v) for h, v in ((2, 401.0), (8, 405.5), (14, 399.2), (20, 402.4))]
    page = svg(series(points), "f-0")
    labels = re.findall(r'class="ytick"[^>]*>([^<]+)<', page)
    assert len(labels) >= 3 and len(set(labels)) == len(labels) and page.count('class="hgrid"') == len(labels)
    ticks = re.findall(r'class="xtick"[^>]*><tspan[^>]*>([^<]*)</tspan><tspan[^>]*>([^<]*)</tspan>', page)
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks) and all(day == "2026-11-26" for day, _ in ticks)
    xs = [float(x) for x in re.findall(r'<circle class="run saved" data-t="[^"]+" cx="([\d.]+)"', page)]
    gaps = [b - a for a, b in zip(xs, xs[1:])]
    assert len(xs) == 4 and max(gaps) - min(gaps) < 0.2  # six hours apart each: equal steps, in time


def test_runs_with_no_readable_time_fall_back_to_the_run_index() -> None:
    points = [Point("", 10.0), Point("not a time", 11.0), Point("2026-11-26T02:00:00+00:00", 12.0)]
    frame = frame_of(series(points))
    assert frame.kind == "index" and frame.times == [0.0, 1.0, 2.0]
    page = svg(series(points), "f-0")
    assert 'data-kind="index"' in page and ">run 1</tspan>" in page and ">run 3</tspan>" in page
