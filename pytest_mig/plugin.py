"""pytest-mig's pytest hooks and fixtures, in the order pytest calls them.

Hooks stay thin: reading and checking options, ini values and markers lives in settings.py,
choosing and pinning the device in target.py, NVML in nvml.py, emulation in
emulation.py, timing in measure.py/bench.py, verdicts in baselines.py/verdict.py/scaling.py,
reports in report.py.  Precedence of settings: marker > command line > environment > ini.
"""

from __future__ import annotations

import math
import os
import re
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from pytest_mig.report import exports

from pytest_mig.device import mps

from pytest_mig.device import nvml

from pytest_mig.workloads import preload
from pytest_mig.device import target as _target
from pytest_mig.bench import MigBench, drop_failed_test
from pytest_mig.store.checkpoint import Checkpoint, stop_on_sigterm
from pytest_mig.common.files import FileProblem
from pytest_mig.measure import Metric, Telemetry
from pytest_mig.device.profiles import ProfileError, parse_profile
from pytest_mig.store.results import ResultRecord, ResultsFileError, default_results_path
from pytest_mig.settings import (
    HELP_BASELINE_DIR,
    HELP_KEEP,
    HELP_REFERENCE,
    HELP_SHRINK,
    HELP_TOLERANCE,
    PLOT_SUFFIXES,
    baseline_dir,
    baseline_keep,
    check_baseline_save,
    check_histories,
    check_output_paths,
    check_path_options,
    confirm_count,
    count_arg,
    explicit_tolerance,
    export_arg,
    ini_help,
    marker_tolerance,
    options,
    positive_int_arg,
    reference_store,
    resolve_output_paths,
    su_allocation,
    su_coefficients,
    tolerance_arg,
)
from pytest_mig.device.target import Options, Plan, SelectionError, Target, pin, plan_run, verify
from pytest_mig.common.text import SHOWN, printable, quoted
from pytest_mig.night.window import window_arg
from pytest_mig.workloads import DoesNotFit

HELP_PROFILE = ("MIG profile to pin the run to: 1g.10gb, 1g.10gb+me, 1c.3g.40gb, ..., 'full' (a whole GPU with MIG "
                "off) or 'all' (every profile of this GPU, with --mig-emulate). Env: PYTEST_MIG_PROFILE.")
HELP_DEVICE = ("one MIG instance or GPU: MIG-<uuid>, GPU-<uuid>, an NVML GPU index N, or N:M (MIG slot M of GPU N); "
               "'all': every GPU and slice of the node at once, one worker each, merged into one report.")
HELP_EMULATE = ("approximate the profile on a GPU whose MIG mode is off: a green context with the profile's SM count "
                "and a memory cap; results are labelled 'emulated' and never compared with real slices.")
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
HELP_IMPROVEMENT = "fail a test whose figure improved beyond tolerance: a stale baseline hides regressions."
HELP_REPORT = "write a report of this run's figures and verdicts: .md, .csv or .json by suffix."
HELP_RESULTS = "where this run's results JSON goes (default: .mig-results/results-<time>.json; 'none' to skip)."
HELP_SCALING_RESULTS = "results files of other slices' runs (same GPU model) for the scaling checks."
HELP_SU = ("service-unit coefficients of the cost figures, 'cpu=1,ram_gb=4,gpu=16,gpu_mem_gb=80' (Wulver's, the "
           "default): SU/h = max(cpu x CPUs, RAM / ram_gb) + gpu x GPU_mem / gpu_mem_gb.")
HELP_ALLOCATION = ("CPUs and RAM billed with the GPU, 'cpus=1,ram_gb=4' (default: Slurm's SLURM_CPUS_PER_TASK and "
                   "SLURM_MEM_PER_NODE when set, else 1 CPU and 4 GB as in Wulver's tables).")
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


@dataclass
class RunState:
    """Session state, kept in config.stash."""

    plan: Plan
    options: Options
    records: list[ResultRecord] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    board: Any = None  # nvml.BoardReader of the parent GPU
    emulator: Any = None
    errors: list[str] = field(default_factory=list)  # make the run fail (a baseline that could not be saved)
    unsaved: set[int] = field(default_factory=set)  # id() of records of tests that failed: never saved
    finished: set[int] = field(default_factory=set)  # id() of records of tests whose call ended and passed
    judge: Any = None  # judge.pipeline.Pipeline of the run (reads each baseline file once)
    references: Any = None  # reference.ReferenceStore for figures with no local history (None: --mig-reference none)
    messages: list[str] = field(default_factory=list)
    baseline_errors: list[str] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (title, text) for the terminal summary
    su: Any = None  # cost.SUCoefficients of the run
    health: Any = None  # health.Watch of the device (None on the CPU or without NVML)
    allocation: tuple[float, float] = (1.0, 4.0)  # (CPUs, RAM GB) billed with the GPU
    checkpoint: Checkpoint | None = None  # the results file, written as the run goes (None: --mig-results none)
    saved: bool = False  # this run's figures were added to the baseline history
    durations: dict[str, float] = field(default_factory=dict)  # node id -> seconds (setup, call, teardown)
    progress: Any = None  # night.Progress of the run's tests
    compile_cache: Path | None = None  # Inductor's and Triton's caches for this stack (night.compile_caches)
    window: Any = None  # window.Guard of --mig-window
    last_runs: tuple[dict[str, float], dict[str, float]] | None = None  # night.last_runs, read once per run
    sigterm: Any = None  # checkpoint.SigtermStop: SIGTERM stops the run as Ctrl-C does (from the first benchmark)


STATE = pytest.StashKey[RunState]()
BENCH = pytest.StashKey[MigBench]()
ITEM_RECORDS = pytest.StashKey[list[ResultRecord]]()

#: Seconds of back-to-back work over which board energy is read after each timing (normal, quick):
#: many ticks of the energy counter (tens of milliseconds apart; the power is read between the
#: first and last tick, measure.EnergyTicks).  1.5 s in both modes, measured (docs/benchmarks.md
#: "The night's time"): over five normal runs on an H100 the first half of a 1.5 s window gave the
#: same J/unit as the whole (within 1.5%), but STREAM's and training's varied two to three times as
#: much from run to run; a 0.75 s quick window did the same to them.
ENERGY_WINDOW_S = {"normal": 1.5, "quick": 1.5}
#: The window where it also times a rate that is judged (GEMM's sustained TFLOPS): the clock a
#: power-capped GPU settles on needs seconds (docs/detection.md: on 128 SMs the sustained rate lost
#: 6.1-6.4% over 1.5 s but 2.0-2.2% over 3 s).
SUSTAINED_WINDOW_S = {"normal": 3.0, "quick": 1.5}


# --------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("mig", "pytest-mig: NVIDIA MIG slices and GPUs")
    g.addoption("--mig-profile", dest="mig_profile", default=None, help=HELP_PROFILE)
    g.addoption("--mig-device", dest="mig_device", default=None, help=HELP_DEVICE)
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
    g.addoption("--mig-reference", dest="mig_reference", default=None, help=HELP_REFERENCE)
    g.addoption("--mig-baseline-keep", dest="mig_baseline_keep", type=positive_int_arg, default=None, help=HELP_KEEP)
    g.addoption("--mig-baseline-shrink", dest="mig_baseline_shrink", action="store_true", default=False,
                help=HELP_SHRINK)
    g.addoption("--mig-confirm", dest="mig_confirm", type=count_arg, default=None, help=HELP_CONFIRM)
    g.addoption("--mig-slowdown-sms", dest="mig_slowdown_sms", type=positive_int_arg, default=None, help=HELP_SLOWDOWN)
    g.addoption("--mig-tolerance", dest="mig_tolerance", type=tolerance_arg, default=None,
                help=HELP_TOLERANCE)
    g.addoption("--mig-fail-on-improvement", dest="mig_fail_on_improvement", action="store_true", default=False,
                help=HELP_IMPROVEMENT)
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
    parser.addini("mig_profile", HELP_PROFILE, default=None)
    parser.addini("mig_require_gpu", HELP_REQUIRE_GPU, default="")  # read by _ini_bool, to name the option
    parser.addini("mig_baseline_dir", HELP_BASELINE_DIR, default="baselines")
    parser.addini("mig_tolerance", ini_help(HELP_TOLERANCE), default="")
    parser.addini("mig_reference", ini_help(HELP_REFERENCE), default="")
    parser.addini("mig_baseline_keep", HELP_KEEP, default="")
    parser.addini("mig_confirm", HELP_CONFIRM, default="")
    parser.addini("mig_su_coefficients", HELP_SU, default="")


# --------------------------------------------------------------------------- node mode


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--mig-device all``: one worker per GPU or slice of the node, at once, merged (node.py)."""
    device = config.getoption("mig_device")
    if device is None or device.strip().lower() != "all" or config.option.help or config.option.version:
        return None
    import sys

    from pytest_mig.night import node

    check_path_options(config)
    opts = options(config)
    resolve_output_paths(config)
    try:
        return node.main(config.invocation_params.args, nvml.discover(), opts.profile, opts.emulate,
                         config.getoption("mig_results"), config.getoption("mig_report"), sys.stdout,
                         Path(config.rootpath), config.getoption("mig_export"))
    except SelectionError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)


# --------------------------------------------------------------------------- configure, session start, header


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    check_path_options(config)  # a path no file system takes: one sentence, before anything touches it
    opts = options(config)
    try:
        plan = plan_run(opts, nvml.discover(), os.environ)
        pin(plan, os.environ)
    except SelectionError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[STATE] = RunState(plan=plan, options=opts)
    # parsed once, here: a malformed value is a usage error now, not in the first benchmark
    state = config.stash[STATE]
    state.su, state.allocation = su_coefficients(config), su_allocation(config)
    explicit_tolerance(config), confirm_count(config), baseline_keep(config)  # bad ini values: said now
    if config.getoption("mig_save_baseline") and config.getoption("mig_save_if_passed"):
        raise pytest.UsageError("--mig-save-baseline adds a run whatever its verdicts and --mig-save-if-passed only "
                                "a run that passed: give one of them")
    state.references = reference_store(config)
    resolve_output_paths(config)  # DIR/ names a folder to write into; a folder without the / is a mistake
    slow = config.getoption("mig_slowdown_sms")
    if slow is not None:
        t = plan.targets[0]
        if t.kind != "full" or plan.sweep:
            raise pytest.UsageError("--mig-slowdown-sms slows a whole GPU for the detection experiment: use it with "
                                    "--mig-profile full on a GPU whose MIG mode is off")
        if config.getoption("mig_save_baseline") or config.getoption("mig_save_if_passed"):
            raise pytest.UsageError("--mig-slowdown-sms measures a GPU slowed on purpose: its figures are never "
                                    "saved as a baseline; drop --mig-save-baseline and --mig-save-if-passed")
        if t.sms and slow >= t.sms:
            raise pytest.UsageError(f"--mig-slowdown-sms {slow}: the GPU has {t.sms} SMs; ask for fewer")
    plot = config.getoption("mig_scaling_plot")
    if plot:
        if Path(plot).suffix.lower() not in PLOT_SUFFIXES:
            raise pytest.UsageError(f"--mig-scaling-plot {printable(plot)}: cannot tell the image format from "
                                    f"{quoted(Path(plot).suffix or 'no suffix', SHOWN)}; use one of "
                                    f"{', '.join(PLOT_SUFFIXES)}")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise pytest.UsageError("--mig-scaling-plot needs matplotlib, which is not installed: "
                                    "pip install 'pytest-mig[plot]'") from None
    report = config.getoption("mig_report")
    if report:  # a report path pytest-mig cannot write is said now, not after an hour of benchmarks
        from pytest_mig.report.tables import ReportError, report_format

        try:
            report_format(report)
        except ReportError as exc:
            raise pytest.UsageError(f"--mig-report {exc}") from None
    check_output_paths(config)
    check_baseline_save(config, plan.targets)
    check_histories(config, plan.targets, state.references)
    # pytest-benchmark times rounds with our CUDA-event clock unless the user chose a timer.
    if getattr(config.option, "benchmark_timer", None) in (None, "time.perf_counter"):
        config.option.benchmark_timer = "pytest_mig.measure.gpu_clock"


def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    results = session.config.getoption("mig_results")
    if results != "none":
        state.checkpoint = Checkpoint(Path(results) if results else default_results_path(Path(session.config.rootpath)))
    plan = state.plan
    first = plan.targets[0]
    state.fingerprint = nvml.fingerprint(first.gpu_index)
    if first.is_cpu:
        plan.targets = [replace(t, fingerprint=state.fingerprint, verified="CPU run: nothing to verify")
                        for t in plan.targets]
        return
    from pytest_mig.night.nights import compile_caches

    try:
        state.compile_cache = compile_caches(baseline_dir(session.config), state.fingerprint,  # before anything compiles
                                             references=state.references.root if state.references is not None else None)
    except FileProblem as exc:
        raise pytest.UsageError(f"{exc}.") from None
    from pytest_mig.device.health import Reader, Watch

    reader = Reader(first.gpu_index, first.uuid) if first.gpu_index is not None else None
    before_cuda = (reader.processes() or []) if reader is not None else []  # read before this process starts CUDA
    try:
        props = _target.cuda_props()  # looked up on the module, so that tests can stand in for CUDA
        plan.targets = [replace(verify(t, props), fingerprint=state.fingerprint) for t in plan.targets]
    except SelectionError as exc:
        raise pytest.UsageError(str(exc)) from None
    if reader is not None and reader.available:
        state.health = Watch(reader, before_cuda)
    elif reader is not None:
        reader.close()
    if first.gpu_index is not None:
        board = nvml.BoardReader(first.gpu_index)
        state.board = board if board.available else None
    if first.emulated or session.config.getoption("mig_slowdown_sms"):
        from pytest_mig.device.emulation import Emulator

        state.emulator = Emulator(0)
        # Create every profile's green context now, so the header says how many SMs each really got
        # (not when only collecting).
        checked = []
        for t in ([] if session.config.option.collectonly or not first.emulated else plan.targets):
            try:
                with state.emulator.activate(t) as active:
                    checked.append(replace(t, sms_obtained=active.sms_obtained,
                                           verified=f"{t.verified}: {active.verified}"))
            except Exception as exc:  # the driver refused the green context: one sentence, no traceback
                raise pytest.UsageError(f"--mig-emulate: a green context for {t.profile} ({t.sms} SMs) could not "
                                        f"be created on this GPU: {exc}") from None
        plan.targets = checked or plan.targets
        if plan.sweep and not session.config.getoption("mig_all_tests"):
            from pytest_mig.device.emulation import distinct_contexts

            plan.targets, plan.left_out = distinct_contexts(plan.targets)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = config.stash.get(STATE, None)
    if state is None:
        return []
    plan, fp = state.plan, state.fingerprint
    lines = [f"pytest-mig: {h}" for h in plan.header]
    t = plan.targets[0]
    if t.is_cpu:
        lines.append(f"pytest-mig: target CPU; torch {fp.get('torch')}")
        return lines
    lines.append(f"pytest-mig: GPU {t.gpu_index}: {t.gpu_name}, driver {fp.get('driver')}, CUDA {fp.get('cuda_driver')}, "
                 f"VBIOS {fp.get('vbios')}, torch {fp.get('torch')} (CUDA {fp.get('cuda_runtime')})")
    if plan.sweep:
        names = ", ".join(f"{x.profile} ({x.sms} SMs)" for x in plan.targets)
        lines.append(f"pytest-mig: emulated sweep over every profile: {names}; chosen by emulation")
    else:
        where = f" {t.uuid}" if t.uuid else ""
        lines.append(f"pytest-mig: profile {t.profile} ({t.kind}){where}, chosen by {t.chosen_by}")
    if t.emulated:
        lines.append("pytest-mig: emulation partitions SMs only (green context) and caps memory; memory bandwidth, L2 "
                     "and copy engines stay shared, so bandwidth figures are labelled emulated and left out of "
                     "scaling checks")
    if plan.sweep and t.emulated:
        got = ", ".join(f"{x.profile} {x.sms} -> {x.sms_obtained or '?'}" for x in plan.targets)
        lines.append(f"pytest-mig: green contexts, SMs asked -> obtained: {got}")
    lines.extend(f"pytest-mig: {line}" for line in plan.left_out)
    lines.append(f"pytest-mig: check: {t.verified}")
    from pytest_mig.store.baselines import BaselineStore
    from pytest_mig.judge.reference import judged_against

    mode = _mode(config)
    store = BaselineStore(baseline_dir(config))
    lines.extend(f"pytest-mig: {line}" for line in judged_against(plan.targets, store, state.references, mode))
    slow = config.getoption("mig_slowdown_sms")
    if state.health is not None:
        lines.extend(f"pytest-mig: {line}" for line in state.health.header())
    if state.compile_cache is not None:
        lines.append(f"pytest-mig: compile cache: {state.compile_cache} (Inductor, Triton and OpenMM, this software "
                     f"stack's: a second night compiles nothing the first did)")
    if slow:
        lines.append(f"pytest-mig: SLOWED ON PURPOSE: every test runs on {slow} of the GPU's {t.sms} SMs (a green "
                     f"context) and is judged as the whole GPU (--mig-slowdown-sms, detection experiments)")
    return lines


# --------------------------------------------------------------------------- collection


def _state(config: pytest.Config) -> RunState:
    return config.stash[STATE]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash.get(STATE, None)
    if state is None or "mig_device" not in metafunc.fixturenames or not state.plan.sweep:
        return
    targets = state.plan.targets
    metafunc.parametrize("mig_device", list(range(len(targets))), ids=[t.profile for t in targets], indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip what does not fit its Target (every test, with or without mig_device); scaling checks last."""
    state = config.stash.get(STATE, None)
    for item in items:
        marker_tolerance(item)  # a malformed marker is a usage error now, with the test's id, not after it ran
    if state is not None:
        for item in items:
            reason = _skip_reason(item, _item_target(item, state.plan))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
        if not config.getoption("mig_all_tests"):
            _deselect_ungated(config, state, items)
        if config.getoption("mig_window") is not None:
            _plan_window(config, state, items)
    last = [i for i in items if i.get_closest_marker("mig_scaling")]
    if last:
        items[:] = [i for i in items if not i.get_closest_marker("mig_scaling")] + last


def _deselect_ungated(config: pytest.Config, state: RunState, items: list[pytest.Item]) -> None:
    """Leave out the tests that gate nothing in this mode on their Target (night.ungated)."""
    from pytest_mig.store.baselines import BaselineStore
    from pytest_mig.night.nights import ungated

    mode = _mode(config)
    chosen = [(i, _item_target(i, state.plan)) for i in items if not i.get_closest_marker("skip") and _uses_bench(i)]
    left_out = ungated([(i, _test_key(i, t), t) for i, t in chosen], mode, BaselineStore(baseline_dir(config)),
                       state.references)
    if left_out:
        items[:] = [i for i in items if i not in left_out]
        config.hook.pytest_deselected(items=left_out)
        state.messages.append(f"{len(left_out)} test(s) not run: every figure of theirs is too noisy to gate in "
                              f"{mode} mode here (in the history, else the reference), so they would buy no "
                              f"verdict; --mig-all-tests runs them: "
                              + ", ".join(i.nodeid.split("::")[-1] for i in left_out))


def _plan_window(config: pytest.Config, state: RunState, items: list[pytest.Item]) -> None:
    """--mig-window: the stalest tests that fit the window run; the rest are left for the next night (window.py)."""
    from pytest_mig.night.window import Guard, plan

    seconds, when = _last_runs(config, state)
    benchmarks = [i.nodeid for i in items if not i.get_closest_marker("skip") and _uses_bench(i)]
    try:
        night = plan(benchmarks, config.getoption("mig_window"), seconds, when)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    waiting = set(night.left)
    left = [i for i in items if i.nodeid in waiting]
    if left:
        items[:] = [i for i in items if i not in left]
        config.hook.pytest_deselected(items=left)
    message = night.message()
    if message:
        state.messages.append(message)
    state.window = Guard(night)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """--mig-window: a test that would end outside the window is skipped, with the reason, before its fixtures."""
    state = item.config.stash.get(STATE, None)
    reason = state.window.reason(item.nodeid) if state is not None and state.window is not None else None
    if reason:
        try:  # reported at the test, as a skip marker's reason is
            raise pytest.skip.Exception(reason, _use_item_location=True)
        except TypeError:  # a pytest without that keyword: reported at this line
            pytest.skip(reason)


def _last_runs(config: pytest.Config, state: RunState) -> tuple[dict[str, float], dict[str, float]]:
    """Each test's seconds (the median of its last three runs) and when it last ran, on this Target and
    mode (night.last_runs), from this run's results folder, or the node's for a node-mode worker
    (window.NIGHTS_ENV); read once."""
    if state.last_runs is None:
        from pytest_mig.night.nights import last_runs
        from pytest_mig.night.window import NIGHTS_ENV

        current = state.checkpoint.path if state.checkpoint is not None else None
        folder = os.environ.get(NIGHTS_ENV) or (current.parent if current is not None else None)
        passed_over: list[str] = []
        state.last_runs = last_runs(Path(folder) if folder else None, current, _where(config, state), passed_over)
        state.messages.extend(f"earlier results passed over (their times are not used): {why}"
                              for why in passed_over)
    return state.last_runs


def _where(config: pytest.Config, state: RunState) -> tuple[str | None, str | None, str]:
    """The GPU model, profile (None: a sweep's every one) and mode whose earlier nights time this one."""
    t = state.plan.targets[0]
    return t.gpu_slug, None if state.plan.sweep else t.baseline_profile, _mode(config)


def _mode(config: pytest.Config) -> str:
    """The run's mode, as records and baselines name it."""
    return "quick" if config.getoption("mig_quick") else "normal"


def _uses_bench(item: pytest.Item) -> bool:
    return "mig_bench" in getattr(item, "fixturenames", ())


# --------------------------------------------------------------------------- fixtures


def _item_target(item: pytest.Item, plan: Plan) -> Target:
    """The Target an item runs on: its profile's under a sweep, else the run's."""
    callspec = getattr(item, "callspec", None)
    index = callspec.params.get("mig_device", 0) if callspec is not None else 0
    return plan.targets[index] if isinstance(index, int) and 0 <= index < len(plan.targets) else plan.targets[0]


def _marker_number(item: pytest.Item, name: str, unit: str, example: str) -> float | None:
    """The one positive number a mig_min_* marker carries; a malformed marker is a usage error."""
    m = item.get_closest_marker(name)
    if m is None:
        return None
    values = list(m.args) + list(m.kwargs.values())
    try:
        if len(values) != 1 or isinstance(values[0], bool) or not math.isfinite(float(values[0])) \
                or float(values[0]) <= 0:
            raise ValueError
        return float(values[0])
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs one positive number of {unit}, e.g. "
                                f"@pytest.mark.{name}({example}); got {m.args or m.kwargs or '()'}.") from None


def _known_profile(name: str) -> bool:
    """A name a profile marker can hold: 'full', 'cpu' or one that parses as a MIG profile (emulated or not)."""
    name = name.removesuffix("-emulated")
    if name in ("full", "cpu"):
        return True
    try:
        parse_profile(name)
    except ProfileError:
        return False
    return True


def _skip_reason(item: pytest.Item, t: Target) -> str | None:
    need_gib = _marker_number(item, "mig_min_memory", "GiB", "20")
    need_sms = _marker_number(item, "mig_min_sms", "SMs", "32")
    m = item.get_closest_marker("mig_profiles")
    if m and (not m.args or m.kwargs or not all(isinstance(p, str) and _known_profile(p) for p in m.args)):
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.mig_profiles needs the names of the profiles the test "
                                f"runs on, e.g. @pytest.mark.mig_profiles('1g.10gb', 'full'); got "
                                f"{m.args or m.kwargs or '()'}.")
    if m and t.profile not in m.args and t.baseline_profile not in m.args:
        return f"runs only on profiles {', '.join(map(str, m.args))}; this is {t.profile}"
    m = item.get_closest_marker("mig_gpu_only")
    if m and t.is_cpu:
        return "needs a GPU; this run is on the CPU"
    if need_gib is not None and not t.is_cpu and (t.memory_bytes or 0) < need_gib * 2**30:
        return f"needs {need_gib:g} GiB; {t.profile} has {(t.memory_bytes or 0) / 2**30:.1f} GiB"
    profile_sms = t.sms or t.effective_sms  # the profile's SMs, not what a green context rounded them to
    if need_sms is not None and not t.is_cpu and (profile_sms or 0) < need_sms:
        return f"needs {need_sms:g} SMs; {t.profile} has {profile_sms}"
    return None


@pytest.fixture(scope="session")
def mig_plan(pytestconfig: pytest.Config) -> Plan:
    """The run's Plan: its Target(s), how they were chosen and pinned."""
    return _state(pytestconfig).plan


@pytest.fixture
def mig_device(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The Target this test runs on; under emulation the test runs inside the profile's green context."""
    state = _state(request.config)
    index = getattr(request, "param", 0)
    target = state.plan.targets[index]  # markers that do not fit it skipped the test at collection
    slow = request.config.getoption("mig_slowdown_sms")
    drop_failed_test()  # a failed test's tensors must not take this one's memory
    if target.emulated and state.emulator is not None:
        with state.emulator.activate(target) as active:
            yield active
    elif slow and state.emulator is not None:
        with state.emulator.slowed(target, int(slow)) as active:
            yield active
    else:
        yield target


def _test_key(item: pytest.Item, target: Target) -> str:
    """The node id without the profile parameter, so one test has one key across profiles."""
    key = item.nodeid
    if _state(item.config).plan.sweep:
        p = re.escape(target.profile)
        key = re.sub(rf"\[{p}\]$", "", key)
        key = re.sub(rf"(?<=[\[-]){p}-|-{p}(?=\])", "", key)
    return key


@pytest.fixture
def mig_bench(request: pytest.FixtureRequest, benchmark: Any, mig_device: Target) -> MigBench:
    """pytest-benchmark's ``benchmark`` wrapped for GPU work: a CUDA-event timer and metric records."""
    state = _state(request.config)
    if state.sigterm is None:  # from the first benchmark on, not in every pytest session that loads the plugin
        # what the judging and the session's end import, imported whole first: a SIGTERM that cut an
        # import in half (pandas' C extensions) would leave a module that fails at the next import
        from pytest_mig.device import health  # noqa: F401
        from pytest_mig.judge import pipeline, verdict  # noqa: F401
        from pytest_mig.report import tables  # noqa: F401
        from pytest_mig.store import baselines, results  # noqa: F401

        state.sigterm = stop_on_sigterm()
    item = request.node
    records = item.stash.setdefault(ITEM_RECORDS, [])
    mode = _mode(request.config)
    telemetry = None
    if state.board is not None:
        telemetry = Telemetry(state.board.power_w, state.board.energy_mj, state.board.clocks,
                              window_s=ENERGY_WINDOW_S[mode], sustained_window_s=SUSTAINED_WINDOW_S[mode],
                              power_limit_w=state.fingerprint.get("power_limit_w"))
    slow = request.config.getoption("mig_slowdown_sms")

    def sink(metric: Metric) -> None:
        escaped = state.emulator.escaped() if state.emulator is not None else None
        if escaped:  # measured outside the profile's green context: never recorded as the profile's
            pytest.fail(f"{escaped}; this test's figures are not recorded", pytrace=False)
        target = mig_device.to_dict()
        if slow:
            target["slowed_to_sms"] = int(slow)
        rec = ResultRecord(test=_test_key(item, mig_device), metric=metric, target=target,
                           fingerprint=dict(state.fingerprint),
                           mode=mode)
        records.append(rec)
        state.records.append(rec)

    bench = MigBench(benchmark, mig_device, telemetry, sink, quick=mode == "quick", su=state.su,
                     allocation=state.allocation, read_link=state.board.pcie if state.board is not None else None)
    item.stash[BENCH] = bench
    return bench


@pytest.fixture(scope="session")
def mig_run_results(pytestconfig: pytest.Config) -> list[ResultRecord]:
    """This run's records so far, plus those of the files given by --mig-scaling-results."""
    from pytest_mig.store.results import ResultsFileError, read_results

    out = list(_state(pytestconfig).records)
    for f in pytestconfig.getoption("mig_scaling_results"):
        try:
            out.extend(read_results(Path(f)))
        except ResultsFileError as exc:
            pytest.fail(str(exc), pytrace=False)
    return out


# --------------------------------------------------------------------------- running and judging a test


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    state = item.config.stash.get(STATE, None)
    watch = state.health if state is not None else None
    if watch is not None:
        watch.before_test()
    try:
        result = yield
    except DoesNotFit as exc:
        # reported at the test's own location, not at this line of the plugin
        raise pytest.skip.Exception(str(exc), _use_item_location=True) from None
    finally:
        with _deferred(state):
            health = watch.after_test() if watch is not None else None
    records = item.stash.get(ITEM_RECORDS, [])
    for rec in records:
        rec.health = health
    failures = _judge(item, records)
    with _deferred(state):  # a SIGTERM from here on stops the run once the verdicts are complete
        from pytest_mig.device.health import failing

        failures += failing(health)  # a health sign alone fails the test (an XID, uncorrected ECC errors)
        if records:  # metrics, units and verdicts as JUnit XML properties for CI dashboards
            from pytest_mig.report.tables import junit_properties

            item.user_properties.extend(junit_properties(records))
    if failures and not item.config.getoption("mig_save_baseline"):  # a save run is accepted, not judged
        pytest.fail("\n".join(failures), pytrace=False)
    return result


def _judge(item: pytest.Item, records: list[ResultRecord]) -> list[str]:
    """Judge this test's records through the run's pipeline, re-measuring a figure beyond its
    threshold before it fails; the lines of every failing verdict."""
    if not records:
        return []
    from pytest_mig.store.baselines import BaselineError, BaselineStore
    from pytest_mig.judge.pipeline import Pipeline, StoreHistories

    config = item.config
    state = _state(config)
    if state.judge is None:
        state.judge = Pipeline(StoreHistories(BaselineStore(baseline_dir(config))), references=state.references,
                               improvement_fails=bool(config.getoption("mig_fail_on_improvement")))
    tolerance = marker_tolerance(item)
    if tolerance is None:
        tolerance = explicit_tolerance(config)
    times = confirm_count(config)

    def remeasure() -> dict[str, list[float]]:
        with _interruptible(state):  # the re-measuring is the test's own work: SIGTERM stops it at once
            return _remeasure(item, times)

    try:  # a SIGTERM while a verdict is made stops the run at its end
        with _deferred(state):
            verdicts = state.judge.judge(records, tolerance=tolerance, remeasure=remeasure if times else None)
    except BaselineError as exc:
        msg = str(exc)
        if msg not in state.baseline_errors:
            state.baseline_errors.append(msg)
        return [f"baseline unusable: {msg}"]
    return [v.line() for v in verdicts if v.failed]


def _remeasure(item: pytest.Item, times: int) -> dict[str, list[float]]:
    """Run the test's body ``times`` more times, same sizes, and return each metric's new values.

    The re-measurements go neither to the results nor to the baseline: they only confirm or clear
    the first measurement.  A re-run that raises ends the re-measuring (what was measured counts).
    """
    bench = item.stash.get(BENCH, None)
    values: dict[str, list[float]] = {}
    if bench is None:
        return values
    for _ in range(times):
        bench.remeasured = []
        try:
            item.runtest()
        except (Exception, pytest.fail.Exception, pytest.skip.Exception):
            break
        finally:
            got, bench.remeasured = bench.remeasured or [], None
        for metric in got:
            values.setdefault(metric.name, []).append(metric.value)
    return values


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Remember the records of a test that failed: a failed test's figures never enter a baseline."""
    report = yield
    state = item.config.stash.get(STATE, None)
    with _deferred(state):
        if state is not None and report.failed:
            state.unsaved.update(id(r) for r in item.stash.get(ITEM_RECORDS, []))
        elif state is not None and report.when == "call" and report.passed:  # a test stopped midway never gets here
            state.finished.update(id(r) for r in item.stash.get(ITEM_RECORDS, []))
        if state is not None:
            _timed(item, state, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """After every test that recorded figures, the results file holds them (a killed run keeps them)."""
    result = yield
    state = item.config.stash.get(STATE, None)
    if state is not None and state.checkpoint is not None and state.records:
        with _deferred(state):
            state.checkpoint.update(state.records, _results_meta(state))
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[Any]:
    """Every test has ended: a SIGTERM from here on no longer stops the run (the session's end writes
    the files), not even in pytest's own steps before :func:`pytest_sessionfinish`."""
    try:
        return (yield)
    finally:
        state = session.config.stash.get(STATE, None)
        if state is not None and state.sigterm is not None:
            state.sigterm.hold()


def _deferred(state: RunState | None) -> Any:
    """A step SIGTERM must not cut in half (checkpoint.SigtermStop.deferred); nothing before the first benchmark."""
    return state.sigterm.deferred() if state is not None and state.sigterm is not None else nullcontext()


def _interruptible(state: RunState | None) -> Any:
    """Work inside a deferred step that SIGTERM stops at once (checkpoint.SigtermStop.interruptible)."""
    return state.sigterm.interruptible() if state is not None and state.sigterm is not None else nullcontext()


def _results_meta(state: RunState) -> dict[str, Any]:
    meta = {"target": state.plan.targets[0].to_dict(), "fingerprint": state.fingerprint,
            "durations": {k: round(v, 2) for k, v in state.durations.items()}}
    if state.window is not None:
        meta["window"] = state.window.plan.to_meta(state.window.skipped)
    if state.plan.left_out:
        meta["left_out"] = list(state.plan.left_out)  # a sweep's profiles measured as their twin, and why
    return meta


def pytest_collection_finish(session: pytest.Session) -> None:
    """The run's tests, and their last runs' times, for the progress line."""
    state = session.config.stash.get(STATE, None)
    if state is None or session.config.option.collectonly:
        return
    from pytest_mig.night.nights import Progress

    previous = _last_runs(session.config, state)[0]
    benchmarks = [i.nodeid for i in session.items if _uses_bench(i)]  # not a plugin's own unit tests
    state.progress = Progress(benchmarks, previous) if benchmarks else None
    imports = _marked_imports(session.items)
    if not state.plan.targets[0].is_cpu:  # on the CPU a worker's engine uses every core: nothing to overlap
        preload.expect(imports)


def _marked_imports(items: list[pytest.Item]) -> list[str]:
    """The modules the run's tests name in ``mig_imports`` markers, in test order."""
    names: list[str] = []
    for item in items:
        for m in item.iter_markers("mig_imports"):
            if m.kwargs or not all(isinstance(a, str) and a for a in m.args):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.mig_imports needs module names, e.g. "
                                        f"@pytest.mark.mig_imports('transformers.modeling_utils'); got "
                                        f"{m.args or m.kwargs or '()'}.")
            names.extend(a for a in m.args if a not in names)
    return names


def _timed(item: pytest.Item, state: RunState, report: pytest.TestReport) -> None:
    """Each test's time (kept in the results file), and a progress line after a long one."""
    state.durations[item.nodeid] = state.durations.get(item.nodeid, 0.0) + float(report.duration or 0.0)
    if report.when != "teardown" or state.progress is None or item.nodeid not in state.progress.tests:
        return
    line = state.progress.finished(item.nodeid, state.durations[item.nodeid])
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line)


# --------------------------------------------------------------------------- pytest-benchmark integration


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    machine_info["pytest_mig"] = {"target": state.plan.targets[0].to_dict(), "fingerprint": state.fingerprint}


# --------------------------------------------------------------------------- end of the run


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the results file and the report, save the baseline if asked; the summary prints the outcome."""
    config = session.config
    state = config.stash.get(STATE, None)
    if state is None:
        return
    # every test has ended: a SIGTERM from here on lets the files below be written (SIGKILL stays the hard stop)
    stopped = ("SIGTERM" if state.sigterm is not None and state.sigterm.hold()
               else "interrupted" if exitstatus == pytest.ExitCode.INTERRUPTED else None)
    if state.board is not None:
        state.board.close()
        state.board = None
    mps.shutdown()  # the MPS daemon an engine's emulation started, if any (a site's own is left alone)
    if state.health is not None:  # a health sign alone fails the run, as DCGM's diagnostics do
        for sign in state.health.finish():
            (state.errors if sign.level == "fail" else state.messages).append(f"health {sign.level.upper()}: {sign.text}")
        state.health = None
        if state.errors and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if stopped and state.records:
        tests = len({r.test for r in state.records})
        why = "SIGTERM: a time limit or a cancelled job" if stopped == "SIGTERM" else stopped
        state.messages.append(f"stopped ({why}): the figures of the {tests} test(s) that finished are kept, "
                              "marked incomplete")
    if not state.records:
        return
    if state.checkpoint is not None:
        try:
            state.checkpoint.finish(state.records, _results_meta(state), stopped)
            state.messages.append(f"results: {state.checkpoint.path}")
        except ResultsFileError as exc:  # the report and the baseline are still written
            state.errors.append(str(exc))
    if config.getoption("mig_export"):
        try:
            state.messages.extend(exports.write(config.getoption("mig_export"), state.records))
        except exports.ExportError as exc:
            state.errors.append(str(exc))
    report = config.getoption("mig_report")
    if report:
        from pytest_mig.report.tables import write_report

        try:
            write_report(Path(report), state.records)
            state.messages.append(f"report: {report}")
        except (OSError, ValueError) as exc:
            state.errors.append(f"report not written: {exc}")
    if config.getoption("mig_save_baseline"):
        _save_baseline(config, state)
    elif config.getoption("mig_save_if_passed"):
        if session.exitstatus == 0 and not state.errors:
            _save_baseline(config, state)
        else:
            state.messages.append("baseline: this run failed, so it was not added to the history "
                                  "(--mig-save-if-passed); the history is as it was")
    if state.errors and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _save_baseline(config: pytest.Config, state: RunState) -> None:
    from pytest_mig.store.baselines import BaselineError, BaselineStore

    passed = [r for r in state.records if id(r) in state.finished and id(r) not in state.unsaved]
    left_out = sorted({r.test for r in state.records if id(r) not in state.finished or id(r) in state.unsaved})
    if left_out:
        state.messages.append(f"baseline: the figures of {len(left_out)} test(s) that failed or did not finish "
                              f"were not saved: " + ", ".join(left_out[:5]) + (", ..." if len(left_out) > 5 else ""))
    store = BaselineStore(baseline_dir(config), keep=baseline_keep(config),
                          shrink=config.getoption("mig_baseline_shrink"))
    try:
        paths = store.save(passed)
    except BaselineError as exc:
        state.errors.append(f"baseline not saved: {exc}")
        return
    state.saved = bool(paths)
    state.messages.extend(p.describe() for p in paths)


def add_summary_section(config: pytest.Config, title: str, text: str) -> None:
    """Print ``text`` under ``title`` in the terminal summary at the end of the run (the scaling table)."""
    state = config.stash.get(STATE, None)
    if state is not None:
        state.sections.append((title, text))


def pytest_unconfigure(config: pytest.Config) -> None:
    preload.forget()
    state = config.stash.get(STATE, None)
    if state is not None and state.sigterm is not None:  # SIGTERM's own action again, after the session's end
        state.sigterm.restore()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    for title, text in state.sections:
        terminalreporter.section(title)
        terminalreporter.write_line(text)
    if not state.records:
        for msg in state.messages + state.errors:  # health signs of a run that recorded nothing
            terminalreporter.write_line(msg, red=msg in state.errors)
        return
    from pytest_mig.report.tables import summary_table

    tr = terminalreporter
    tr.section("pytest-mig results")
    if state.plan.targets[0].is_cpu:
        tr.write_line("CPU run: real CPU measurements at small sizes, compared only with a CPU baseline "
                      "(baselines/cpu/), never with a GPU's.")
    tr.write_line(summary_table(state.records))
    if config.getoption("mig_save_baseline"):
        tr.write_line("this run was added to the baseline: its verdicts against the earlier runs are shown, none of "
                      "them fails it" if state.saved else "this run was not added to the baseline (see below); its "
                      "verdicts against the earlier runs are shown, none of them fails it")
    for msg in state.messages:
        tr.write_line(msg)
    for msg in state.baseline_errors + state.errors:
        tr.write_line(msg, red=True)
