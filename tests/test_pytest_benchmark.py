"""pytest-mig beside a real pytest-benchmark: its results table and the lines naming the files it
wrote still print when ``--benchmark-compare-fail`` raises from pytest-benchmark's summary, and a
compare on an unchanged machine finds pytest-mig's part of ``machine_info`` the same as the saved
file's (no "Benchmark machine_info is different" warning), on the CPU and on a MIG slice."""

from __future__ import annotations

import json
import warnings
from typing import Any, Callable

import pytest

import topologies as topo

#: A test timed by pytest-benchmark that also records a figure for pytest-mig; DELAY slows it down.
SUITE = """
import os
import time

from pytest_mig.measure import Metric


def test_sleep(benchmark, mig_bench):
    delay = float(os.environ.get("DELAY", "0"))
    benchmark.pedantic(time.sleep, args=(delay,), rounds=3, iterations=1)
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.0, 100.0, 101.0], kind="compute"))
"""
SLOW_PLUGINS = ("-p", "no:unraisableexception", "-p", "no:hypothesispytest", "-p", "no:randomly")


def test_the_results_print_before_compare_fail_raises(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("DELAY", "0")
    first = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-results", "none", "--benchmark-autosave")
    first.assert_outcomes(passed=1)
    monkeypatch.setenv("DELAY", "0.05")  # every round at least 50 ms where the saved ones took microseconds
    # pytest-mig loaded before pytest-benchmark, so that pluggy, calling the later one first, would
    # call pytest-benchmark's summary first but for pytest-mig's tryfirst
    second = pytester.runpytest_subprocess(*SLOW_PLUGINS, "-p", "no:mig", "-p", "pytest_mig.plugin",
                                           "--mig-results", "night.json", "--mig-export", "github=gab",
                                           "--benchmark-compare", "--benchmark-compare-fail=min:50%")
    out = second.stdout.str() + second.stderr.str()
    assert "Performance has regressed" in out  # pytest-benchmark did raise
    second.stdout.fnmatch_lines(["*pytest-mig results*", "test_sleep*rate*100.0*items/s*", "*results: night.json*",
                                 "*export github-action-benchmark: gab/bigger-is-better.json*"])
    assert out.index("pytest-mig results") < out.index("Performance has regressed")
    assert (pytester.path / "night.json").exists()


def _saved_and_compared(pytester: pytest.Pytester, *args: str) -> tuple[list[str], dict[str, Any]]:
    """A run that saves, then one that compares with it: the warnings of the second (pytest-benchmark
    warns at configure time, before an in-process run catches warnings) and the saved pytest_mig part."""
    pytester.makepyfile(test_suite=SUITE)
    first = pytester.runpytest(*SLOW_PLUGINS, "--mig-results", "none", "--benchmark-autosave", *args)
    first.assert_outcomes(passed=1)
    (saved,) = (pytester.path / ".benchmarks").rglob("*.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = pytester.runpytest(*SLOW_PLUGINS, "--mig-results", "none", "--benchmark-compare", *args)
    second.assert_outcomes(passed=1)
    shown = [str(w.message) for w in caught] + [second.stdout.str() + second.stderr.str()]
    return shown, json.loads(saved.read_text())["machine_info"]["pytest_mig"]


def test_an_unchanged_cpu_compares_without_a_machine_info_warning(pytester: pytest.Pytester, mig_env):
    shown, saved = _saved_and_compared(pytester)
    assert not [w for w in shown if "machine_info is different" in w]
    assert saved["target"]["kind"] == "cpu" and saved["fingerprint"]["python"]


def test_an_unchanged_mig_slice_compares_without_a_machine_info_warning(pytester: pytest.Pytester,
                                                                        machine: Callable[..., None]):
    """The slice's fingerprint (driver, VBIOS, ...) from NVML, its Target verified against CUDA only in
    the session: what pytest-benchmark reads at configure time and what it saves agree."""
    machine("h100-mig", cuda=topo.H100_1G[0])
    shown, saved = _saved_and_compared(pytester, "--mig-profile", "1g.10gb")
    assert not [w for w in shown if "machine_info is different" in w]
    fp = saved["fingerprint"]
    assert fp["driver"] == topo.get_topology("h100-mig").driver_version and fp["gpu_uuid"] == topo.H100_GPU0
    assert saved["target"]["uuid"] == topo.H100_1G[0] and "sms_obtained" not in saved["target"]
