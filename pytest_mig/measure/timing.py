"""Timing with CUDA events, board power and energy over a window of sustained work.

GPU work is timed with CUDA events on the current stream (under emulation that is the green
context's stream), after warm-up, over several repeats (or seconds) of them.
Nothing here imports pytest.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from pytest_mig.common.poller import Poller
from pytest_mig.measure.clocks import TEMPERATURE, temperature_of
from pytest_mig.measure.metric import ENERGY_INFIX, Metric, Stats


def _cuda_ready() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def synchronize() -> None:
    if _cuda_ready():
        import torch

        torch.cuda.synchronize()


def time_fn(fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 10, device: str = "cuda",
            min_warmup_s: float = 0.0, min_time_s: float = 0.0) -> list[float]:
    """Seconds per call of ``fn``: CUDA events around each call on a GPU, perf_counter on the CPU.

    ``min_warmup_s`` (GPU) keeps warming up, back to back, until about that much GPU time has passed:
    a GPU at its power limit lowers its clocks within tens of milliseconds of sustained load, so a
    short warm-up measures a burst, not the rate the work is done at.  ``min_time_s`` (GPU) times
    more than ``repeats`` calls where they would take less than that (:func:`timed_repeats`).
    """
    for _ in range(max(0, warmup)):
        fn()
    if device.startswith("cuda"):
        import torch

        if min_warmup_s > 0 or min_time_s > 0:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            per_call = start.elapsed_time(end) / 1e3
            for _ in range(min(100_000, math.ceil(min_warmup_s / per_call) - 1) if per_call > 0 else 0):
                fn()
            repeats = timed_repeats(per_call, repeats, min_time_s)
        torch.cuda.synchronize()
        pairs = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in pairs]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


MAX_TIMED_REPEATS = 10_000  # the most calls timed_repeats() asks for


def timed_repeats(seconds_per_call: float, repeats: int, min_time_s: float) -> int:
    """``repeats``, or more where that many calls would take under ``min_time_s`` (at most MAX_TIMED_REPEATS)."""
    ok = min_time_s > 0 and seconds_per_call > 0  # False for NaN: no time asked, or none known
    return max(repeats, math.ceil(min(min_time_s / seconds_per_call, MAX_TIMED_REPEATS))) if ok else repeats


class GpuClock:
    """A monotonic clock for pytest-benchmark that advances by CUDA-event time once CUDA is up.

    pytest-benchmark reads its timer before and after each round; with this clock the difference
    is the GPU time between two events on the current stream (the host waits for the second), so
    a round is timed by the device, not by launch overhead.  Before CUDA starts, and on the CPU,
    it advances with perf_counter.  It never goes backwards.
    """

    def __init__(self) -> None:
        self.__name__ = "gpu_clock"  # how pytest-benchmark's header names the timer
        self._value = 0.0
        self._last_event: Any = None
        self._last_host = time.perf_counter()

    def __call__(self) -> float:
        now_host = time.perf_counter()
        if _cuda_ready():
            import torch

            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            ev.synchronize()
            if self._last_event is not None:
                try:
                    self._value += max(0.0, self._last_event.elapsed_time(ev) / 1e3)
                except RuntimeError:  # events from different contexts/streams: fall back to host time
                    self._value += max(0.0, now_host - self._last_host)
            else:
                self._value += max(0.0, now_host - self._last_host)
            self._last_event = ev
        else:
            self._value += max(0.0, now_host - self._last_host)
            self._last_event = None
        self._last_host = time.perf_counter()
        return self._value


#: The clock pytest-mig hands to pytest-benchmark (``--benchmark-timer pytest_mig.measure.gpu_clock``).
gpu_clock = GpuClock()


@dataclass
class PowerTrace:
    """Board power samples taken during a measurement (NVML power is board-level, also on MIG)."""

    watts: list[float]
    seconds: float
    energy_j: float | None  # from the energy counter where the GPU has one
    source: str  # "energy-counter" or "power-samples"
    limit_w: float | None = None  # the board's enforced power limit, where known
    sm_clock_mhz: list[float] = field(default_factory=list)  # SM clock sampled during the window
    #: The window's first half read alone, (seconds, joules, calls): the figure a window half as long
    #: would have given, kept so that repeated runs show whether a shorter window holds its noise.
    first_half: tuple[float, float, int] | None = None

    @property
    def mean_w(self) -> float | None:
        if self.energy_j is not None and self.seconds > 0:
            return self.energy_j / self.seconds
        return statistics.fmean(self.watts) if self.watts else None

    @property
    def joules(self) -> float | None:
        if self.energy_j is not None:
            return self.energy_j
        m = statistics.fmean(self.watts) if self.watts else None
        return m * self.seconds if m is not None else None


class PowerSampler:
    """Samples board power every ``interval`` seconds in a thread while a measurement runs.

    ``read_power_w`` and ``read_energy_mj`` come from the nvml module (or a fake in tests); either
    may be None.  Used as a context manager; ``trace`` is set on exit.
    """

    def __init__(
        self,
        read_power_w: Callable[[], float | None] | None,
        read_energy_mj: Callable[[], float | None] | None = None,
        interval: float = 0.25,
        read_sm_clock_mhz: Callable[[], float | None] | None = None,
    ) -> None:
        self._read_power = read_power_w
        self._read_energy = read_energy_mj
        self._read_clock = read_sm_clock_mhz
        self.interval = interval
        self.trace: PowerTrace | None = None
        self._poller = Poller(self._sample, interval, "pytest-mig-power")
        self._samples: list[float] = []
        self._clocks: list[float] = []

    def _safe(self, fn: Callable[[], float | None] | None) -> float | None:
        if fn is None:
            return None
        try:
            return fn()
        except Exception:  # telemetry must never break a measurement
            return None

    def _sample(self) -> None:
        w = self._safe(self._read_power)
        if w is not None:
            self._samples.append(w)
        c = self._safe(self._read_clock)
        if c is not None:
            self._clocks.append(float(c))

    def __enter__(self) -> "PowerSampler":
        synchronize()
        self._e0 = self._safe(self._read_energy)
        self._t0 = time.perf_counter()
        if self._read_power is not None or self._read_clock is not None:
            self._poller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize()
        seconds = time.perf_counter() - self._t0
        e1 = self._safe(self._read_energy)
        self._poller.stop()
        energy = (e1 - self._e0) / 1e3 if (e1 is not None and self._e0 is not None and e1 > self._e0) else None
        source = "energy-counter" if energy is not None else "power-samples"
        self.trace = PowerTrace(list(self._samples), seconds, energy, source, sm_clock_mhz=list(self._clocks))


@dataclass
class Timing:
    """Seconds per repeat of one timed callable, with the telemetry taken while it ran."""

    samples: list[float]
    power: PowerTrace | None = None
    clocks: dict[str, Any] = field(default_factory=dict)  # before/after SM clock, throttle reasons
    energy_calls: int = 0  # calls made while ``power`` was read (the energy window); 0: the timed repeats
    window_calls: int = 0  # every call the energy window made, those before its first counter tick too
    busy_calls: int = 0  # calls made after all these, untimed, while a pace waited for other processes
    calls_per_sample: int = 1  # calls each sample is the mean of (a pytest-benchmark round's iterations)

    @property
    def window_seconds_per_call(self) -> float | None:
        """Seconds per call over the energy window (seconds of sustained work, not the short repeats)."""
        if self.power is None or not self.energy_calls or not self.power.seconds > 0:
            return None
        return self.power.seconds / self.energy_calls

    @property
    def window_sm_clock_mhz(self) -> float | None:
        """The mean SM clock sampled during the energy window."""
        if self.power is None or not self.power.sm_clock_mhz:
            return None
        return statistics.fmean(self.power.sm_clock_mhz)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def stats(self) -> Stats:
        return Stats.of(self.samples)

    def clock_info(self) -> dict[str, Any]:
        """What a metric's info records of the clocks: the before/after snapshots, the mean SM clock
        sampled during the energy window (``window``) and whether the GPU was throttled after the
        measurement (the verdicts and scaling checks read these)."""
        info: dict[str, Any] = {}
        clocks = dict(self.clocks)
        window = self.window_sm_clock_mhz
        if window is not None:  # the clock the work itself ran at, sampled all through its energy window
            clocks["window"] = {"sm_clock_mhz": round(window, 1)}
        if clocks:
            info["clocks"] = clocks
        after = self.clocks.get("after") or {}
        if "throttled" in after:
            info["throttled"] = bool(after["throttled"])
        return info

    def rate_samples(self, work: float) -> list[float]:
        """Work per second for each repeat (FLOPs/s for FLOPs per call); none for a time no call takes (0, inf)."""
        return [work / s for s in self.samples if s > 0 and math.isfinite(s)]


class Telemetry:
    """What a measurement can read from the board: power, energy, clocks, throttle reasons.

    The nvml module builds one for the Target's parent GPU; on the CPU every reader is None.
    """

    def __init__(
        self,
        read_power_w: Callable[[], float | None] | None = None,
        read_energy_mj: Callable[[], float | None] | None = None,
        read_clocks: Callable[[], dict[str, Any]] | None = None,
        interval: float = 0.1,
        window_s: float = 1.0,
        power_limit_w: float | None = None,
        sustained_window_s: float | None = None,
    ) -> None:
        self.read_power_w = read_power_w
        self.read_energy_mj = read_energy_mj
        self.read_clocks = read_clocks
        self.interval = interval
        self.window_s = window_s  # how long the energy window after a timing runs the work
        #: The window of a timing whose window also times a rate that is judged (GEMM's sustained
        #: TFLOPS at the clock the power cap settles on), its length set by that rate's references;
        #: ``window_s`` where None.
        self.sustained_window_s = sustained_window_s
        self.power_limit_w = power_limit_w  # the board's enforced limit: an average above it is an error

    @property
    def reads_power(self) -> bool:
        return self.read_power_w is not None or self.read_energy_mj is not None

    def clocks(self) -> dict[str, Any]:
        if self.read_clocks is None:
            return {}
        try:
            return dict(self.read_clocks())
        except Exception:
            return {}

    def sm_clock_mhz(self) -> float | None:
        """The SM clock now (None where clocks cannot be read)."""
        value = self.clocks().get("sm_clock_mhz") if self.read_clocks is not None else None
        return float(value) if isinstance(value, (int, float)) else None


class Pace(Protocol):
    """Keeps timed calls in step with other processes' (see :attr:`Timer.pace`)."""

    def timing(self) -> None:
        """Called before a timed call: returns once the others may time theirs too."""

    def timed(self, busy: Callable[[], None]) -> None:
        """Called after it: runs ``busy`` (more of the same work, untimed) while others still time."""


class Timer:
    """Times a callable on a Target's device with warm-up and repeats, sampling power meanwhile.

    Workloads take a Timer so that they stay free of pytest: the benchmark fixture hands them one
    that also feeds pytest-benchmark; scripts and unit tests use this plain one.
    """

    def __init__(self, device: str = "cpu", telemetry: Telemetry | None = None, pace: "Pace | None" = None) -> None:
        self.device = device
        self.telemetry = telemetry or Telemetry()
        #: Where other processes' timed work is kept in step with this one's (a layout's slices:
        #: :class:`pytest_mig.night.barrier.Barrier`); None times alone.
        self.pace = pace

    #: GPU warm-up before the timed repeats: long enough to reach the clocks sustained load runs at.
    min_warmup_s = 0.2

    def _timed(self, fn: Callable[[], Any], warmup: int, repeats: int, min_time_s: float = 0.0) -> list[float]:
        return time_fn(fn, warmup=warmup, repeats=repeats, device=self.device, min_warmup_s=self.min_warmup_s,
                       min_time_s=min_time_s)

    def __call__(self, fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 10, energy: bool = True,
                 sustained: bool = False, min_time_s: float = 0.0) -> Timing:
        """Time ``fn`` (``repeats`` calls, more on a GPU where they would last under ``min_time_s``); with
        ``energy`` (and a board to read), then read board energy over a window of sustained work of its own: the
        telemetry's ``sustained_window_s`` where ``sustained`` (the
        window also times a rate that is judged), else its ``window_s``."""
        if self.pace is not None:
            self.pace.timing()
        before = self.telemetry.clocks()
        samples = self._timed(fn, warmup, repeats, min_time_s)
        t = self.telemetry
        seconds = t.sustained_window_s if sustained and t.sustained_window_s is not None else t.window_s
        power, calls, total = self._energy_window(fn, samples, seconds) if energy else (None, 0, 0)
        after = self.telemetry.clocks()
        busy_calls = [0]
        if self.pace is not None:
            self.pace.timed(self._busy(fn, samples, busy_calls))
        clocks = {"before": before, "after": after} if (before or after) else {}
        return Timing(samples=samples, power=power, clocks=clocks, energy_calls=calls, window_calls=total,
                      busy_calls=busy_calls[0])

    #: Work between two host synchronisations in the energy window: short enough that the host's
    #: clock follows the GPU's, long enough that synchronising costs well under a percent.
    window_batch_s = 0.005

    def _busy(self, fn: Callable[[], Any], samples: list[float], made: list[int]) -> Callable[[], None]:
        """One batch of ``fn``, untimed, about ``window_batch_s`` long and synchronised: what keeps
        this process's share of the device busy while a pace waits for the others; ``made[0]``
        counts the calls (a workload that keeps a result per call tells its measured ones apart)."""
        batch = self._batch(samples)
        gpu = self.device.startswith("cuda")

        def busy() -> None:
            for _ in range(batch):
                fn()
                made[0] += 1
            if gpu:
                synchronize()

        return busy

    def _batch(self, samples: list[float]) -> int:
        """Calls of one timed sample's length making about ``window_batch_s`` of work."""
        per_call = statistics.median(samples) if samples else 0.0
        return max(1, min(1_000_000, math.ceil(self.window_batch_s / per_call))) if per_call > 0 else 1

    def _energy_window(self, fn: Callable[[], Any], samples: list[float],
                       window_s: float) -> tuple[PowerTrace | None, int, int]:
        """Run ``fn`` back to back for ``window_s`` seconds and read board energy over it.

        NVML's energy counter advances in steps (tens of milliseconds apart), so a difference read
        at two arbitrary instants is off by up to a step at each end, which over one second moves
        J/TFLOP by tens of percent between runs.  Here a thread polls the counter every 2 ms and
        keeps the instants at which it ticked; the mean power is the energy between the first and
        the last tick inside the window over the time between them, each tick at the instant of its
        counter step (:meth:`EnergyTicks.mean_power_w`: exact at both ends, whatever one call's
        length); the window's energy is that power times its length, over its calls.  Power is also
        sampled (the fallback with no counter), with the SM clock.  Returns the trace and the calls (twice).
        """
        t = self.telemetry
        if not t.reads_power or not samples:
            return None, 0, 0
        batch = self._batch(samples)
        gpu = self.device.startswith("cuda")
        sampler = PowerSampler(t.read_power_w, None, t.interval, t.sm_clock_mhz if t.read_clocks else None)
        ticks = EnergyTicks(t.read_energy_mj)
        calls = 0
        half: tuple[float, int] | None = None  # (instant, calls) where the window's first half ended
        with sampler, ticks:
            start = time.perf_counter()
            while (now := time.perf_counter()) - start < window_s:
                if half is None and now - start >= window_s / 2:
                    half = (now, calls)
                for _ in range(batch):
                    fn()
                if gpu:
                    synchronize()
                calls += batch
            end = time.perf_counter()
        seconds = end - start
        mean_w = ticks.mean_power_w(start + RAMP_S, end)
        watts = sampler.trace.watts if sampler.trace is not None else []
        clocks = sampler.trace.sm_clock_mhz if sampler.trace is not None else []
        joules = mean_w * seconds if mean_w is not None else None
        if joules is None and not watts:
            return None, 0, calls
        first_half = None
        if joules is not None and half is not None and half[1] > 0:
            half_w = ticks.mean_power_w(start + RAMP_S, half[0])
            if half_w is not None:
                first_half = (half[0] - start, half_w * (half[0] - start), half[1])
        return PowerTrace(watts, seconds, joules, "energy-counter" if joules is not None else "power-samples",
                          t.power_limit_w, clocks, first_half), calls, calls


#: The first moments of the energy window are left out of its power: the GPU is still ramping up.
RAMP_S = 0.05


class EnergyTicks:
    """Polls a cumulative energy counter (mJ) in a thread and keeps the instants it advanced at."""

    def __init__(self, read_energy_mj: Callable[[], float | None] | None, interval: float = 0.002) -> None:
        self._read = read_energy_mj
        self.interval = interval
        self.ticks: list[tuple[float, float]] = []  # (perf_counter seconds, mJ) at each change
        self._last: float | None = None
        self._poller = Poller(self._tick, interval, "pytest-mig-energy")

    def _value(self) -> float | None:
        try:
            v = self._read() if self._read is not None else None
        except Exception:  # telemetry must never break a measurement
            return None
        return float(v) if v is not None else None

    def _tick(self) -> None:
        v = self._value()
        if v is not None and v != self._last:
            self.ticks.append((time.perf_counter(), v))
            self._last = v

    def __enter__(self) -> "EnergyTicks":
        if self._read is not None:
            self._last = self._value()  # the counter as the window opens: a tick is a step from it
            self._poller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._poller.stop()

    def mean_power_w(self, start: float, end: float) -> float | None:
        """Watts between the first and last tick inside [start, end], each at the instant its counter
        step belongs to (:func:`counter_instants`); None with fewer than two."""
        seen = [(ts, e) for ts, e in self.ticks if start <= ts <= end]
        inside = [(ts, e) for ts, e in counter_instants(seen, MIN_PERIOD_POLLS * self.interval) if start <= ts <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0] or inside[-1][1] <= inside[0][1]:
            return None
        (t0, e0), (t1, e1) = inside[0], inside[-1]
        return (e1 - e0) / 1e3 / (t1 - t0)


#: A counter whose ticks come at least this many polls apart updates on a period of its own; one that
#: changes at (nearly) every read is read when it changes, and its instants are the reads'.
MIN_PERIOD_POLLS = 5
#: Fewer ticks than this are taken as seen: a line through them would say little.
MIN_FIT_TICKS = 4
#: A tick farther than this share of a period from the line was seen too late to place: it is left out.
FIT_SLACK = 0.4
#: Ticks whose RMS distance from the line is above this share of a period do not come on a period (an
#: H100's: 5-9% of its 100 ms): they are taken as seen.
FIT_SPREAD = 0.2


def _line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ys against xs (xs not all equal)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def _steps(times: list[float], period: float) -> list[int] | None:
    """Each tick's counter step, from the line through the ticks (None where no line with a positive
    period fits them)."""
    steps = [0]
    for gap in (b - a for a, b in zip(times, times[1:])):  # a gap of about two periods is a step the poller missed
        steps.append(steps[-1] + max(1, round(gap / period)))
    for _ in range(2):  # then each tick's step from the line itself, not from its neighbour's
        origin, period = _line(steps, times)
        if not period > 0:
            return None
        steps = [round((t - origin) / period) for t in times]
        if len(set(steps)) < 2:
            return None
    return steps


def counter_instants(ticks: list[tuple[float, float]], min_period_s: float) -> list[tuple[float, float]]:
    """The (seconds, mJ) ticks of an energy counter, each at the instant its value belongs to.

    An H100's counter advances every 100 ms, each step the energy of its own period (steady to
    0.6-1.3% from step to step under steady load), but the host sees each step late by a delay that
    varies: the gaps between ticks as read ran from 67 to 136 ms (33 to 150 ms in a separate process
    polling every millisecond), so a step's energy over its gap as seen varied by 9-14%
    (docs/detection.md, "Energy").  The energy between the first and last tick of a
    1.5 s window, over the time between them as seen, was off by that delay at each end.  Where the
    ticks come on a period (at least ``min_period_s`` apart), each is given the instant of the
    least-squares line through the tick times against their step numbers; a tick farther than
    :data:`FIT_SLACK` of a period from the line (seen very late), or on a step another tick holds, is
    left out.  Where more than a fifth would be left out or more than a fifth of the steps went
    unseen (ticks at random instants fit a short enough period), the rest lie farther from the line than
    :data:`FIT_SPREAD` of a period (RMS), or too few are there to fit, the ticks are returned as seen.
    """
    if len(ticks) < MIN_FIT_TICKS:
        return list(ticks)
    times = [t for t, _ in ticks]
    period = statistics.median(b - a for a, b in zip(times, times[1:]))
    steps = _steps(times, period) if period >= min_period_s else None
    if steps is None:
        return list(ticks)
    origin, period = _line(steps, times)
    best: dict[int, int] = {}  # step -> the index of the tick nearest the line on it
    for i, (n, t) in enumerate(zip(steps, times)):
        off = abs(t - origin - period * n)
        if off <= FIT_SLACK * period and (n not in best or off < abs(times[best[n]] - origin - period * n)):
            best[n] = i
    keep = sorted(best.values())
    if (len(keep) < max(MIN_FIT_TICKS, 0.8 * len(ticks)) or len({steps[i] for i in keep}) < 2
            or steps[keep[-1]] - steps[keep[0]] > 1.25 * (len(keep) - 1)):  # a fifth of the steps unseen: no period
        return list(ticks)
    origin, period = _line([steps[i] for i in keep], [times[i] for i in keep])
    spread = statistics.fmean((times[i] - origin - period * steps[i]) ** 2 for i in keep) ** 0.5
    if not period > 0 or spread > FIT_SPREAD * period:
        return list(ticks)
    return [(origin + period * steps[i], ticks[i][1]) for i in keep]


def energy_metrics(timing: Timing, work_per_call: float, unit: str, *, label: str | None = None) -> list[Metric]:
    """Average board power and energy per unit of work (J/token, J/TFLOP, ...), where power was read.

    ``unit`` names the work (``"token"``, ``"TFLOP"``); NVML power is board-level, also on a MIG slice.
    """
    if timing.power is None or timing.power.joules is None or not timing.samples:
        return []
    mean_w = timing.power.mean_w
    if mean_w is None or not mean_w > 0:
        return []  # no reading refreshed during the window: no figure rather than a zero
    if timing.energy_calls:
        joules_per_call = timing.power.joules / timing.energy_calls
    else:  # power read during the timed repeats themselves: their busy time at the mean power
        joules_per_call = mean_w * sum(timing.samples) / len(timing.samples)
    tag = f"{label}_" if label else ""  # timing_partners() relies on this prefix
    info: dict[str, Any] = {"scope": "board", "source": timing.power.source, "samples": len(timing.power.watts),
                            "window_s": round(timing.power.seconds, 3),
                            "calls": timing.energy_calls or len(timing.samples)}
    if (temperature := temperature_of(timing.clocks.get("after"))) is not None:  # read as the window ended:
        info[TEMPERATURE] = temperature  # leakage power rises with it, what moves energy between nights
    half = timing.power.first_half
    if half is not None and timing.energy_calls:
        info["first_half"] = {"window_s": round(half[0], 3), "calls": half[2],
                              "value": half[1] / half[2] / work_per_call}
    limit = timing.power.limit_w
    valid = not (limit and mean_w > limit * POWER_LIMIT_SLACK)
    if not valid:
        info["error"] = (f"mean board power {mean_w:.0f} W is above the enforced {limit:.0f} W limit: a measurement "
                         f"error, so this energy figure is not compared")
    return [
        Metric(f"{tag}power_w", mean_w, "W", "lower", [], kind="energy", info=info, compare=False),
        Metric(f"{tag}{ENERGY_INFIX}{unit.lower()}", joules_per_call / work_per_call, f"J/{unit}", "lower",
               [], kind="energy", info=info, compare=valid),
    ]


#: An average above the enforced power limit by more than NVML's stated accuracy (+-5%) cannot be real.
POWER_LIMIT_SLACK = 1.05
