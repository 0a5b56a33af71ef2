"""pytest-mig's options, ini values and markers, each defined once with its help text.

The plugin's ``pytest_addoption`` calls :func:`add_options`; ``pytest-mig compare`` takes the options
that judge a figure from :func:`add_judging_options`, as the plugin does, and the other ``pytest-mig``
commands reuse the help texts and argument types (:mod:`pytest_mig.settings`), so an option is spelt
and reads the same everywhere.
Precedence of a setting: marker > command line > environment > ini.
"""

from __future__ import annotations

import argparse

import pytest

from typing import Any, Callable

from pytest_mig.night.window import window_arg
from pytest_mig.settings import (
    HELP_BASELINE_DIR,
    HELP_KEEP,
    HELP_REFERENCE,
    HELP_SHRINK,
    HELP_TOLERANCE,
    count_arg,
    export_arg,
    ini_help,
    positive_int_arg,
    tolerance_arg,
)

HELP_PROFILE = ("MIG profile to pin the run to: 1g.10gb, 1g.10gb+me, 1c.3g.40gb, ..., 'full' (a whole GPU with MIG "
                "off) or 'all' (every profile of this GPU, with --mig-emulate). Env: PYTEST_MIG_PROFILE.")
HELP_DEVICE = ("one MIG instance or GPU: MIG-<uuid>, GPU-<uuid>, an NVML GPU index N, or N:M (MIG slot M of GPU N); "
               "'all': every GPU and slice of the node at once, one worker each, merged into one report.")
HELP_EMULATE = ("approximate the profile on a GPU whose MIG mode is off: a green context with the profile's SM count "
                "and a memory cap; results are labelled 'emulated' and never compared with real slices.")
HELP_LAYOUT = ("run identical copies of the tests on every slice of a MIG layout at once, one worker per slice: "
               "'4g.40gb+3g.40gb', '1g.10gbx7', '4g+2g+1g' (the GPU's own profiles), several separated by commas, or "
               "a preset: 'paper' (Columbia/IBM's five layouts and 1g x7), 'wulver' (1g x3 against 3g). MIG on: the "
               "instances must exist; MIG off: with --mig-emulate, CUDA MPS confines each slice.")
HELP_REQUIRE_GPU = "fail (instead of running on the CPU) when no usable GPU is found; for nightly GPU runners."
HELP_QUICK = "quick mode: fewer sizes and repeats, about a minute per profile."
HELP_SAVE = ("add this run's figures to the baseline history of this GPU model and profile (tests that ran and "
             "passed; the last N runs are kept, see --mig-baseline-keep).")
HELP_SAVE_IF_PASSED = ("judge this run as usual and, only if every test passed, add it to the baseline history: a "
                       "nightly's rolling history that never learns a failing night.")
HELP_CONFIRM = ("re-measure a figure beyond its threshold this many times before the test fails (default 2; 0: "
                "fail on the first measurement); it fails only if every re-measurement is beyond it too.")
HELP_SLOWDOWN = ("detection experiments only: run a whole GPU's tests on just N of its SMs (a green context) and "
                 "judge them as the whole GPU, a real slowdown for measuring what the verdicts catch.")
HELP_IMPROVEMENT = ("also fail on a figure that improved beyond its threshold (the plugin: its test; pytest-mig compare: "
                    "exit 1): a stale baseline hides regressions.")
HELP_REPORT = "write a report of this run's figures and verdicts: .md, .csv or .json by suffix."
HELP_RESULTS = "where this run's results JSON goes (default: .mig-results/results-<time>.json; 'none' to skip)."
HELP_SCALING_RESULTS = "results files of other slices' runs (same GPU model) for the scaling checks."
HELP_SU = ("service-unit coefficients of the cost figures, 'cpu=1,ram_gb=4,gpu=16,gpu_mem_gb=80' (Wulver's, the "
           "default): SU/h = max(cpu x CPUs, RAM / ram_gb) + gpu x GPU_mem / gpu_mem_gb.")
HELP_ALLOCATION = ("CPUs and RAM billed with the GPU, 'cpus=1,ram_gb=4' (default: Slurm's SLURM_CPUS_PER_TASK and "
                   "SLURM_MEM_PER_NODE when set, else 1 CPU and 4 GB as in Wulver's tables).")
HELP_HOST_LOCK = ("a file every run of this host sees (a hostPath volume): runs in separate containers, such as one "
                  "pod per GPU, take turns at their host copies on it as runs of one container do by themselves; "
                  "opened for reading only, never written.")
HELP_SCALING_BASIS = "ideal scaling between profiles: slices (7/3, 3/2, 2/1; default), sms, or memory."

MARKERS = (
    "mig_profiles(*names): run the test only on these profiles ('full', '1g.10gb', ...); skipped elsewhere",
    "mig_min_memory(gb): skip the test on a Target with less memory than gb GiB",
    "mig_min_sms(n): skip the test on a Target with fewer than n SMs",
    "mig_gpu_only: skip the test on the CPU",
    "mig_tolerance(fraction): the regression tolerance of this test's metrics (e.g. 0.1 for 10%)",
    "mig_scaling: a cross-profile scaling check, run after all other tests",
    "mig_imports(*modules): modules the test imports, which may be imported earlier while the run waits on a worker",
)


def add_judging_options(add: Callable[..., Any], *, prefix: str = "mig_", reference_help: str = HELP_REFERENCE) -> None:
    """The options that say how a figure is judged, through ``add`` (pytest's ``addoption`` or an
    argparse parser's ``add_argument``), each value under ``prefix`` + its name; ``reference_help``
    where a command's default reference differs from the plugin's."""
    add("--mig-reference", dest=f"{prefix}reference", default=None, help=reference_help)
    add("--mig-tolerance", dest=f"{prefix}tolerance", type=tolerance_arg, default=None, help=HELP_TOLERANCE)
    add("--mig-fail-on-improvement", dest=f"{prefix}fail_on_improvement", action="store_true", default=False,
        help=HELP_IMPROVEMENT)


def add_options(parser: pytest.Parser) -> None:
    """Every option and ini value of the plugin, defined here once (the hook calls this)."""
    g = parser.getgroup("mig", "pytest-mig: NVIDIA MIG slices and GPUs")
    g.addoption("--mig-profile", dest="mig_profile", default=None, help=HELP_PROFILE)
    g.addoption("--mig-device", dest="mig_device", default=None, help=HELP_DEVICE)
    g.addoption("--mig-layout", dest="mig_layout", default=None, metavar="LAYOUT", help=HELP_LAYOUT)
    g.addoption("--mig-layout-plot", dest="mig_layout_plot", default=None,
                help="with --mig-layout: draw energy per unit of work against time per unit of work, one point per "
                     "layout, the whole GPU marked, to this image (.png, .svg, .pdf; needs matplotlib).")
    g.addoption("--mig-emulate", dest="mig_emulate", action="store_true", default=False, help=HELP_EMULATE)
    g.addoption("--mig-require-gpu", dest="mig_require_gpu", action="store_true", default=None, help=HELP_REQUIRE_GPU)
    g.addoption("--mig-quick", dest="mig_quick", action="store_true", default=False, help=HELP_QUICK)
    g.addoption("--mig-all-tests", dest="mig_all_tests", action="store_true", default=False,
                help="also run the tests that gate nothing in this mode here (every figure too noisy to gate in the "
                     "history and the reference): they are reported, never judged.")
    g.addoption("--mig-window", dest="mig_window", type=window_arg, default=None, metavar="TIME",
                help="fit the night into TIME (300, 5m, 1.5h): the tests that ran longest ago first, as many as "
                     "their recent times fit; the rest are named and run first the next night.")
    g.addoption("--mig-save-baseline", dest="mig_save_baseline", action="store_true", default=False, help=HELP_SAVE)
    g.addoption("--mig-save-if-passed", dest="mig_save_if_passed", action="store_true", default=False,
                help=HELP_SAVE_IF_PASSED)
    g.addoption("--mig-baseline-dir", dest="mig_baseline_dir", default=None, help=HELP_BASELINE_DIR)
    g.addoption("--mig-baseline-keep", dest="mig_baseline_keep", type=positive_int_arg, default=None, help=HELP_KEEP)
    g.addoption("--mig-baseline-shrink", dest="mig_baseline_shrink", action="store_true", default=False,
                help=HELP_SHRINK)
    g.addoption("--mig-confirm", dest="mig_confirm", type=count_arg, default=None, help=HELP_CONFIRM)
    g.addoption("--mig-slowdown-sms", dest="mig_slowdown_sms", type=positive_int_arg, default=None, help=HELP_SLOWDOWN)
    g.addoption("--mig-host-lock", dest="mig_host_lock", default=None, metavar="FILE", help=HELP_HOST_LOCK)
    add_judging_options(g.addoption)
    g.addoption("--mig-report", dest="mig_report", default=None, help=HELP_REPORT)
    g.addoption("--mig-results", dest="mig_results", default=None, help=HELP_RESULTS)
    g.addoption("--mig-export", dest="mig_export", type=export_arg, action="append", default=[],
                help="also write the figures as github=DIR (github-action-benchmark JSON) or prometheus=FILE.prom "
                     "(node_exporter textfile, DCGM-style labels); repeatable.")
    g.addoption("--mig-scaling-results", dest="mig_scaling_results", nargs="+", default=[], help=HELP_SCALING_RESULTS)
    g.addoption("--mig-su-coefficients", dest="mig_su_coefficients", default=None, help=HELP_SU)
    g.addoption("--mig-su-allocation", dest="mig_su_allocation", default=None, help=HELP_ALLOCATION)
    g.addoption("--mig-scaling-plot", dest="mig_scaling_plot", default=None,
                help="also draw the scaling checks against ideal to this image (.png, .svg, .pdf; needs matplotlib).")
    g.addoption("--mig-scaling-basis", dest="mig_scaling_basis", choices=("slices", "sms", "memory"),
                default="slices", help=HELP_SCALING_BASIS)
    # Given by node mode's runner to each worker (night/node.run_workers), not by a user: hidden from --help.
    g.addoption("--mig-node-worker", dest="mig_node_worker", type=int, default=None, help=argparse.SUPPRESS)
    g.addoption("--mig-nights", dest="mig_nights", default=None, help=argparse.SUPPRESS)
    g.addoption("--mig-layout-slot", dest="mig_layout_slot", default=None, help=argparse.SUPPRESS)
    g.addoption("--mig-layout-barrier", dest="mig_layout_barrier", default=None, help=argparse.SUPPRESS)
    parser.addini("mig_profile", HELP_PROFILE, default=None)
    parser.addini("mig_require_gpu", HELP_REQUIRE_GPU, default="")  # read by _ini_bool, to name the option
    parser.addini("mig_baseline_dir", HELP_BASELINE_DIR, default="baselines")
    parser.addini("mig_tolerance", ini_help(HELP_TOLERANCE), default="")
    parser.addini("mig_reference", ini_help(HELP_REFERENCE), default="")
    parser.addini("mig_baseline_keep", HELP_KEEP, default="")
    parser.addini("mig_confirm", HELP_CONFIRM, default="")
    parser.addini("mig_su_coefficients", HELP_SU, default="")
    parser.addini("mig_host_lock", HELP_HOST_LOCK, default="")
