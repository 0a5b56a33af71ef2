"""The object behind the ``mig_bench`` fixture: pytest-benchmark's ``benchmark`` wrapped for GPUs.

It never replaces pytest-benchmark's fixture.  The first timed callable of a test goes through
``benchmark.pedantic`` (whose timer pytest-mig sets to :data:`pytest_mig.measure.gpu_clock`, a
CUDA-event clock), so pytest-benchmark's table and JSON hold the headline timing; any further
timed callables in the same test (a size sweep) are timed with CUDA events directly.  Metrics go
to ``benchmark.extra_info`` and to pytest-mig's own results.
"""

from __future__ import annotations

import gc
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_mig.measure.cost import WULVER, SUCoefficients, cost_metrics
from pytest_mig.measure import Metric, Pace, Telemetry, Timer, Timing, time_fn, timed_repeats
from pytest_mig.measure.rounds import rounds_iterations

from pytest_mig.device.target import Target
from pytest_mig.workloads.caches import Caches


def drop_failed_test() -> bool:
    """Free what the test before this one still holds because it failed; whether there was one.

    pytest keeps the last failure in ``sys.last_traceback`` (for post-mortem debugging) until the
    next test's call begins, and the failed frames, in a reference cycle with their exception, live
    until Python's cyclic collector happens to run.  Their tensors stay allocated meanwhile: in a
    normal-mode run on an emulated 1g.10gb, after the bf16 and fp16 GEMMs ran out of the slice's
    9.75 GiB, the fp32, fp64 and fp8 GEMMs and the host copies failed making their first tensors,
    with 9.7 GiB of it already allocated.
    """
    if not hasattr(sys, "last_value") and not hasattr(sys, "last_exc"):
        return False
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return True


class BenchTimer(Timer):
    """A Timer whose first measurement is pytest-benchmark's pedantic run."""

    def __init__(self, benchmark: Any, device: str, telemetry: Telemetry | None, pace: Pace | None = None) -> None:
        super().__init__(device, telemetry, pace)
        self._benchmark = benchmark
        self._used = False
        self._iterations = 1  # calls a sample of the last _timed averages: a pytest-benchmark round's

    def __call__(self, fn: Callable[[], Any], **kwargs: Any) -> Timing:
        self._iterations = 1
        timing = super().__call__(fn, **kwargs)
        timing.calls_per_sample = self._iterations
        return timing

    def _timed(self, fn: Callable[[], Any], warmup: int, repeats: int, min_time_s: float = 0.0) -> list[float]:
        bm = self._benchmark
        if self._used or bm is None or not getattr(bm, "enabled", False):
            return super()._timed(fn, warmup, repeats, min_time_s)
        self._used = True
        iterations = 1
        if self.device.startswith("cuda"):
            # pytest-benchmark synchronises around every round: make a round long enough that the
            # launch latency and the idle gap before it stay below a percent of what is measured.
            est = statistics.median(time_fn(fn, warmup=max(0, warmup), repeats=2, device=self.device,
                                            min_warmup_s=self.min_warmup_s))
            iterations = rounds_iterations(est)
            repeats = timed_repeats(est * iterations, repeats, min_time_s)
            warmup = 0
        bm.pedantic(fn, rounds=max(1, repeats), warmup_rounds=max(0, warmup), iterations=iterations)
        stats = getattr(bm, "stats", None)
        data = list(getattr(getattr(stats, "stats", None), "data", []) or [])
        if not data:  # pytest-benchmark kept no samples: time it ourselves rather than report nothing
            return super()._timed(fn, 0, repeats, min_time_s)
        self._iterations = iterations
        return [float(x) for x in data]


class MigBench:
    """Handed to benchmark tests: a timer for workloads and a place to record metrics."""

    def __init__(
        self,
        benchmark: Any,
        target: Target,
        telemetry: Telemetry | None = None,
        sink: Callable[[Metric], None] | None = None,
        quick: bool = False,
        su: SUCoefficients = WULVER,
        allocation: tuple[float, float] = (1.0, 4.0),
        read_link: Callable[[], dict[str, int] | None] | None = None,
        caches: Caches | None = None,
        pace: Pace | None = None,
        sizes: Callable[[str], int | None] | None = None,
        neighbours: Callable[[], Mapping[str, float]] | None = None,
        host_lock: Path | None = None,
    ) -> None:
        self.benchmark = benchmark
        self.read_link = read_link  # the board's PCIe link now (gen, width, max_gen, max_width), or None
        #: The host's other GPUs' PCIe traffic now, GB/s by GPU (pytest_mig.device.host), or None.
        self.neighbours = neighbours
        #: The file the host's runs take turns at host copies on, across containers (--mig-host-lock), or None.
        self.host_lock = host_lock
        #: Whether this run is one slice of a layout, timed in step with the others on the same GPU.
        self.in_layout = pace is not None
        self.target = target
        self.quick = quick
        self.su = su
        self.allocation = allocation  # (CPUs, RAM GB) billed with the GPU slice
        #: Where the workloads keep what they found from one night to the next (batches, built
        #: systems); a benchmark passes it on (``run_training(..., caches=mig_bench.caches)``).
        #: None keeps nothing.
        self.caches = caches
        self._sizes = sizes  # a figure's name -> the problem size its history (else reference) was measured at
        #: ``pace``: a layout's slice keeps its timed calls in step with the other slices' (Timer.pace).
        self.timer = BenchTimer(benchmark, target.device, telemetry, pace)
        self.metrics: list[Metric] = []
        self._sink = sink
        #: While the plugin re-measures a test (confirming a figure beyond its threshold), the
        #: metrics go here only: not to the results, the verdicts or pytest-benchmark's extra_info.
        self.remeasured: list[Metric] | None = None

    def size_of(self, metric: str) -> int | None:
        """The problem size this test's figure ``metric`` is judged at (that of its history, else of its
        reference; :meth:`pytest_mig.judge.pipeline.Pipeline.measured_size`): a workload that chooses a size
        each run measures at this one where it can.  None: none is known (a first night, a run outside
        the plugin)."""
        return self._sizes(metric) if self._sizes is not None else None

    def record(self, metric: Metric) -> Metric:
        """Keep one metric: results file, verdicts, pytest-benchmark's extra_info."""
        if self.remeasured is not None:
            self.remeasured.append(metric)
            return metric
        self.metrics.append(metric)
        if self.benchmark is not None:
            self.benchmark.extra_info[metric.name] = metric.value
            self.benchmark.extra_info[f"{metric.name}__unit"] = metric.unit
        if self._sink is not None:
            self._sink(metric)
        return metric

    def record_all(self, metrics: Iterable[Metric]) -> list[Metric]:
        return [self.record(m) for m in metrics]

    def cost(self, rate_per_s: float, unit: str, *, rate_samples: Sequence[float] = (),
             unit_count: float = 1e6) -> list[Metric]:
        """Record what the work costs in service units (Wulver's formula) at ``rate_per_s`` units/s."""
        cpus, ram_gb = self.allocation
        return self.record_all(cost_metrics(self.target, rate_per_s, unit, cpus, ram_gb, coeffs=self.su,
                                            unit_count=unit_count, rate_samples=rate_samples))

    def time(self, fn: Callable[[], Any], *, warmup: int = 3, repeats: int = 10, energy: bool = True,
             sustained: bool = False, min_time_s: float = 0.0) -> Timing:
        return self.timer(fn, warmup=warmup, repeats=repeats, energy=energy, sustained=sustained, min_time_s=min_time_s)
