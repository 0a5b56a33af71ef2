"""Measurement: the Metric record every workload produces, timing with CUDA events, power and energy.

The public names a site's own benchmark uses are imported here (``from pytest_mig.measure import Metric``).
"""

from pytest_mig.measure.metric import (
    BEST,
    ENERGY_INFIX,
    LARGEST_BATCH,
    METRIC_KINDS,
    RATE_KINDS,
    STEP_TIME,
    SUSTAINED,
    Direction,
    Metric,
    Stats,
    batch_bound,
    best_rate,
    partner_keys,
    percentile,
    timing_partners,
    within_run_noise,
)
from pytest_mig.measure.timing import (
    POWER_LIMIT_SLACK,
    RAMP_S,
    EnergyTicks,
    GpuClock,
    Pace,
    PowerSampler,
    PowerTrace,
    Telemetry,
    Timer,
    Timing,
    energy_metrics,
    gpu_clock,
    synchronize,
    time_fn,
    timed_repeats,
)

__all__ = [
    "BEST", "ENERGY_INFIX", "LARGEST_BATCH", "METRIC_KINDS", "POWER_LIMIT_SLACK", "RAMP_S", "RATE_KINDS", "STEP_TIME",
    "SUSTAINED", "Direction", "EnergyTicks", "GpuClock", "Metric", "Pace", "PowerSampler", "PowerTrace", "Stats",
    "Telemetry", "Timer", "Timing", "batch_bound", "best_rate", "energy_metrics", "gpu_clock", "partner_keys", "percentile",
    "synchronize", "time_fn", "timed_repeats", "timing_partners", "within_run_noise",
]
