"""The run's session: one object, built once in ``pytest_configure``, that owns a run's settings, its
Target(s), the baseline store, the references, the judging pipeline and everything the run records.

The plugin's hooks (:mod:`pytest_mig.plugin`) delegate to it; it is registered with pytest's plugin
manager as ``mig_session`` (``config.pluginmanager.get_plugin("mig_session")``), as pytest-benchmark
registers its ``BenchmarkSession``.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ContextManager

import pytest

from pytest_mig.bench import MigBench
from pytest_mig.device import emulation, host, mps, nvml
from pytest_mig.device import target as _target
from pytest_mig.device.layout import SlotTag, sms_check
from pytest_mig.device.plan import Plan, plan_run
from pytest_mig.device.target import SelectionError, Target, pin, verify
from pytest_mig.judge.ceiling import Ceilings
from pytest_mig.judge.pipeline import Pipeline, Remeasured, StoreHistories
from pytest_mig.judge.reference import SHIPPED, ReferenceStore, judged_against
from pytest_mig.markers import history_key, item_target, marked_imports, skip_reason
from pytest_mig.measure import Metric, Telemetry
from pytest_mig.settings import (Settings, check_baseline_save, check_histories, check_output_paths, check_path_options,
                                 check_plot_and_report, check_slowdown, marker_tolerance, options, read_settings,
                                 reference_store)
from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.history import BaselineError
from pytest_mig.store.checkpoint import Checkpoint, SigtermStop, stop_on_sigterm
from pytest_mig.store.results import ResultRecord, ResultsFileError, default_results_path
from pytest_mig.workloads import preload
from pytest_mig.workloads.caches import Caches
from pytest_mig.report import exports
from pytest_mig.night.nights import Progress, compile_caches, last_runs, ungated
from pytest_mig.night.window import Guard, plan
from pytest_mig.night.barrier import Barrier
from pytest_mig.device.health import Reader, Watch
from pytest_mig.common.files import FileProblem

#: Seconds of back-to-back work over which board energy is read after each timing (normal, quick):
#: about 25 steps of the energy counter (100 ms apart on an H100; the power is read between the first
#: and last step, each at its own instant, measure.EnergyTicks).  Over six quick runs on an H100 the
#: run-to-run CV of the energy figures outside GEMM fell from 0.86% (RMS) over 1.5 s to 0.75% over
#: 2.5 s and stayed there over 3.5 s: what is left is the board's temperature, not the window
#: (docs/results/energy-window-h100-2026-11-26.tgz; docs/detection.md, "Energy").
ENERGY_WINDOW_S = {"normal": 2.5, "quick": 2.5}
#: The window where it also times a rate that is judged (GEMM's sustained TFLOPS): the clock a
#: power-capped GPU settles on needs seconds: over a short window the sustained rate is caught still
#: falling with the clock (docs/detection.md); quick mode keeps the 1.5 s its shipped references
#: were measured over (its J/TFLOP: CV 0.44-0.64% over six quick runs on an H100,
#: docs/results/energy-window-h100-2026-11-26.tgz).
SUSTAINED_WINDOW_S = {"normal": 3.0, "quick": 1.5}


@dataclass
class ItemRun:
    """One test's records and how it ended: only a test whose call passed, and that failed in no
    phase, has its figures saved."""

    records: list[ResultRecord] = field(default_factory=list)
    passed: bool = False  # its call ended and passed (a test stopped midway never does)
    failed: bool = False  # it failed in setup, call or teardown

    @property
    def saveable(self) -> bool:
        return self.passed and not self.failed


class MigSession:
    """A run of pytest-mig: its settings, Target(s), stores, judge, records and messages."""

    def __init__(self, config: pytest.Config, settings: Settings, plan: Plan) -> None:
        self.config = config
        self.settings = settings
        self.plan = plan
        self.store = BaselineStore(settings.baseline_dir, keep=settings.keep, shrink=settings.shrink)
        self.references: ReferenceStore | None = reference_store(config)
        # the floors of the device's ceiling come from the shipped references, whichever --mig-reference names
        shipped = self.references if self.references is not None and self.references.root == SHIPPED else None
        self.ceilings = Ceilings(shipped)
        self.pipeline = Pipeline(StoreHistories(self.store), references=self.references, ceilings=self.ceilings,
                                 improvement_fails=settings.fail_on_improvement)
        self.tests: dict[str, ItemRun] = {}
        self.records: list[ResultRecord] = []
        self.fingerprint: dict[str, Any] = {}
        self.board: Any = None  # nvml.BoardReader of the parent GPU
        self.emulator: Any = None  # emulation.Emulator
        self.health: Any = None  # health.Watch of the device (None on the CPU or without NVML)
        self.checkpoint: Checkpoint | None = None  # the results file, written as the run goes
        self.caches: Caches | None = None  # this stack's cache folders, for the header and the workloads
        self.window: Any = None  # night.window.Guard of --mig-window
        self.progress: Any = None  # night.nights.Progress of the run's tests
        self.sigterm: SigtermStop | None = None  # SIGTERM stops the run as Ctrl-C does, from the first benchmark
        self.durations: dict[str, float] = {}  # node id -> seconds (setup, call, teardown)
        self.messages: list[str] = []
        self.errors: list[str] = []  # each makes the run fail (a baseline that could not be saved)
        self.baseline_errors: list[str] = []
        self.sections: list[tuple[str, str]] = []  # (title, text) for the terminal summary
        self.saved = False  # this run's figures were added to the baseline history
        self._last_runs: tuple[dict[str, float], dict[str, float]] | None = None
        slot = config.getoption("mig_layout_slot", None)  # a layout's worker: its slice (night.layout)
        self.slot: SlotTag | None = SlotTag.parse(slot) if slot else None
        self.slot_problem: str | None = None  # what an MPS client's start-up check found wrong
        barrier = config.getoption("mig_layout_barrier", None)  # the phase's workers start each test together
        try:
            self.barrier: Barrier | None = (Barrier(Path(barrier), self.slot.slot)
                                            if barrier and self.slot is not None else None)
        except (FileProblem, ValueError) as exc:
            raise pytest.UsageError(f"--mig-layout-barrier: {exc}") from None

    # ------------------------------------------------------------------ configure and start

    @classmethod
    def configure(cls, config: pytest.Config) -> MigSession:
        """Read and check every setting, plan and pin the Target(s): one sentence for any mistake."""
        check_path_options(config)  # a path no file system takes: one sentence, before anything touches it
        opts = options(config)
        try:
            plan = plan_run(opts, nvml.discover(), os.environ)
            pin(plan, os.environ)
        except SelectionError as exc:
            raise pytest.UsageError(str(exc)) from None
        settings = read_settings(config, opts)
        session = cls(config, settings, plan)
        check_slowdown(settings, plan)
        check_plot_and_report(config)
        check_output_paths(config)
        check_baseline_save(settings.saving, session.store, plan.targets)
        check_histories(session.store, plan.targets, session.references)
        return session

    def start(self, session: pytest.Session) -> None:
        """The results file, the fingerprint, the compile caches; the Target(s) verified against what
        CUDA sees; the health watch, the board reader and the green contexts."""
        if self.settings.results != "none":
            root = Path(session.config.rootpath)
            self.checkpoint = Checkpoint(Path(self.settings.results) if self.settings.results
                                         else default_results_path(root))
        first = self.plan.targets[0]
        self.fingerprint = nvml.fingerprint(first.gpu_index)
        if first.is_cpu:
            self.plan.targets = [replace(t, fingerprint=self.fingerprint, verified="CPU run: nothing to verify")
                                 for t in self.plan.targets]
            return
        self._compile_caches()
        self._verify(first)
        if first.gpu_index is not None:
            board = nvml.BoardReader(first.gpu_index)
            self.board = board if board.available else None
        if self.slot is not None and self.slot.confined_by == "mps":
            got, line = sms_check(first.profile, first.sms, mps.context_resources())
            self.plan.targets = [replace(first, sms_obtained=got, verified=line)]
            self.messages.append(line)
            from pytest_mig.workloads.gemm import half_precision_problem

            self.slot_problem = half_precision_problem(got)
            if self.slot_problem:
                self.messages.append(self.slot_problem)
        elif first.emulated or self.settings.slowdown_sms:
            self._emulate(first, collect_only=bool(session.config.option.collectonly))

    def _compile_caches(self) -> None:
        # The seeds of compiled batches are where a search starts, not something a figure is judged
        # against: without references (--mig-reference none) the shipped ones are still read.
        refs = self.references.root if self.references is not None else SHIPPED
        try:  # before anything compiles
            self.caches = compile_caches(self.settings.baseline_dir, self.fingerprint, references=refs)
        except FileProblem as exc:
            raise pytest.UsageError(f"{exc}.") from None

    def _verify(self, first: Target) -> None:
        reader = Reader(first.gpu_index, first.uuid) if first.gpu_index is not None else None
        before_cuda = (reader.processes() or []) if reader is not None else []  # before this process starts CUDA
        try:
            props = _target.cuda_props()  # looked up on the module, so that tests can stand in for CUDA
            self.plan.targets = [replace(verify(t, props), fingerprint=self.fingerprint) for t in self.plan.targets]
        except SelectionError as exc:
            raise pytest.UsageError(str(exc)) from None
        if reader is not None and reader.available:
            self.health = Watch(reader, before_cuda)
        elif reader is not None:
            reader.close()

    def _emulate(self, first: Target, *, collect_only: bool) -> None:
        """Every profile's green context made now, so the header says how many SMs each really got
        (not when only collecting); a sweep measures each distinct context once."""
        self.emulator = emulation.Emulator(0)
        checked = []
        for t in ([] if collect_only or not first.emulated else self.plan.targets):
            try:
                with self.emulator.activate(t) as active:
                    checked.append(replace(t, sms_obtained=active.sms_obtained,
                                           verified=f"{t.verified}: {active.verified}"))
            except Exception as exc:  # the driver refused the green context: one sentence, no traceback
                raise pytest.UsageError(f"--mig-emulate: a green context for {t.profile} ({t.sms} SMs) could not "
                                        f"be created on this GPU: {exc}") from None
        self.plan.targets = checked or self.plan.targets
        if self.plan.sweep and not self.settings.all_tests:
            self.plan.targets, self.plan.left_out = emulation.distinct_contexts(self.plan.targets)

    # ------------------------------------------------------------------ the header

    def header(self) -> list[str]:
        plan, fp, t = self.plan, self.fingerprint, self.plan.targets[0]
        lines = [f"pytest-mig: {h}" for h in plan.header]
        if t.is_cpu:
            return [*lines, f"pytest-mig: target CPU; torch {fp.get('torch')}"]
        lines.append(f"pytest-mig: GPU {t.gpu_index}: {t.gpu_name}, driver {fp.get('driver')}, CUDA "
                     f"{fp.get('cuda_driver')}, VBIOS {fp.get('vbios')}, torch {fp.get('torch')} (CUDA "
                     f"{fp.get('cuda_runtime')})")
        if plan.sweep:
            names = ", ".join(f"{x.profile} ({x.sms} SMs)" for x in plan.targets)
            lines.append(f"pytest-mig: emulated sweep over every profile: {names}; chosen by emulation")
        else:
            where = f" {t.uuid}" if t.uuid else ""
            lines.append(f"pytest-mig: profile {t.profile} ({t.kind}){where}, chosen by {t.chosen_by}")
        lines += [f"pytest-mig: {line}" for line in self._device_lines(t)]
        return lines

    def _device_lines(self, t: Target) -> list[str]:
        lines = []
        if t.emulated:
            lines.append("emulation partitions SMs only (green context) and caps memory; memory bandwidth, L2 and "
                         "copy engines stay shared, so bandwidth figures are labelled emulated and left out of "
                         "scaling checks")
        if self.plan.sweep and t.emulated:
            got = ", ".join(f"{x.profile} {x.sms} -> {x.sms_obtained or '?'}" for x in self.plan.targets)
            lines.append(f"green contexts, SMs asked -> obtained: {got}")
        lines += list(self.plan.left_out)
        lines.append(f"check: {t.verified}")
        lines += judged_against(self.plan.targets, self.store, self.references, self.settings.mode,
                                ceilings=self.ceilings, fingerprint=self.fingerprint)
        if self.health is not None:
            lines += self.health.header()
        if self.caches is not None and self.caches.stack is not None:
            lines.append(f"compile cache: {self.caches.stack} (Inductor, Triton and OpenMM, this software stack's: "
                         f"a second night compiles nothing the first did)")
        slow = self.settings.slowdown_sms
        if slow:
            lines.append(f"SLOWED ON PURPOSE: every test runs on {slow} of the GPU's {t.sms} SMs (a green context) "
                         f"and is judged as the whole GPU (--mig-slowdown-sms, detection experiments)")
        return lines

    # ------------------------------------------------------------------ collection

    def select(self, items: list[pytest.Item]) -> None:
        """Skip what does not fit its Target; leave out what gates nothing here and what the window
        cannot hold."""
        for item in items:
            reason = skip_reason(item, item_target(item, self.plan))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
        if not self.settings.all_tests:
            self._deselect_ungated(items)
        if self.settings.window is not None:
            self._plan_window(items)

    def tolerance_of(self, item: pytest.Item) -> Any:
        """The tolerance ``item``'s figures are judged with: its marker's, else the run's."""
        marked = marker_tolerance(item)
        return marked if marked is not None else self.settings.tolerance

    def _deselect_ungated(self, items: list[pytest.Item]) -> None:
        """Leave out the tests that gate nothing in this mode on their Target (night.nights.ungated)."""

        mode = self.settings.mode
        chosen = [(i, item_target(i, self.plan)) for i in items if not i.get_closest_marker("skip") and uses_bench(i)]
        left_out = ungated([(i, self.key(i, t), t) for i, t in chosen], mode, self.store, self.references,
                           self.tolerance_of)
        if left_out:
            items[:] = [i for i in items if i not in left_out]
            self.config.hook.pytest_deselected(items=left_out)
            self.messages.append(f"{len(left_out)} test(s) not run: every figure of theirs is too noisy to gate in "
                                 f"{mode} mode here (in the history, else the reference), so they would buy no "
                                 f"verdict; --mig-all-tests runs them: "
                                 + ", ".join(i.nodeid.split("::")[-1] for i in left_out))

    def _plan_window(self, items: list[pytest.Item]) -> None:
        """--mig-window: the stalest tests that fit the window run; the rest are left for the next night."""

        seconds, when = self.last_runs()
        benchmarks = [i.nodeid for i in items if not i.get_closest_marker("skip") and uses_bench(i)]
        try:
            night = plan(benchmarks, self.settings.window, seconds, when)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        waiting = set(night.left)
        left = [i for i in items if i.nodeid in waiting]
        if left:
            items[:] = [i for i in items if i not in left]
            self.config.hook.pytest_deselected(items=left)
        self.window = Guard(night)  # its summary line is written at the end, with what ran (finish)

    def collected(self, items: list[pytest.Item]) -> None:
        """The run's tests, and their last runs' times, for the progress line; the imports to overlap."""

        previous = self.last_runs()[0]
        benchmarks = [i.nodeid for i in items if uses_bench(i)]  # not a plugin's own unit tests
        if self.barrier is not None:
            self.barrier.collected([i.nodeid for i in items])
        self.progress = Progress(benchmarks, previous) if benchmarks else None
        imports = marked_imports(items)
        if not self.plan.targets[0].is_cpu:  # on the CPU a worker's engine uses every core: nothing to overlap
            preload.expect(imports)

    def with_neighbours(self, item: pytest.Item) -> None:
        """A layout's slice in its together phase: wait until every other slice has begun this test."""
        if self.barrier is not None:
            note = self.barrier.wait(item.nodeid)
            if note:
                self.messages.append(note)

    def last_runs(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each test's seconds (the median of its last three runs) and when it last ran, on this Target
        and mode (night.nights.last_runs), from this run's results folder, or the node's for a node-mode
        worker (``--mig-nights``, given by the node's runner); read once."""
        if self._last_runs is None:

            current = self.checkpoint.path if self.checkpoint is not None else None
            folder = self.config.getoption("mig_nights") or (current.parent if current is not None else None)
            t = self.plan.targets[0]
            where = (t.gpu_slug, None if self.plan.sweep else t.baseline_profile, self.settings.mode)
            passed_over: list[str] = []
            self._last_runs = last_runs(Path(folder) if folder else None, current, where, passed_over)
            self.messages.extend(f"earlier results passed over (their times are not used): {why}"
                                 for why in passed_over)
        return self._last_runs

    def key(self, item: pytest.Item, target: Target) -> str:
        """A test's key in the histories: its node id without the profile parameter."""
        return history_key(item, target, self.plan.sweep)

    # ------------------------------------------------------------------ a test

    def bench(self, item: pytest.Item, benchmark: Any, target: Target) -> MigBench:
        """The ``mig_bench`` fixture's object: a CUDA-event timer with the board's telemetry, whose
        metrics become this test's records."""
        if self.sigterm is None:  # from the first benchmark on, not in every pytest session that loads the plugin
            self.sigterm = _stop_on_sigterm()
        mode, run = self.settings.mode, self.tests.setdefault(item.nodeid, ItemRun())
        telemetry = None
        if self.board is not None:
            telemetry = Telemetry(self.board.power_w, self.board.energy_mj, self.board.clocks,
                                  window_s=ENERGY_WINDOW_S[mode], sustained_window_s=SUSTAINED_WINDOW_S[mode],
                                  power_limit_w=self.fingerprint.get("power_limit_w"))

        def record(metric: Metric) -> ResultRecord:
            where = target.info()
            if self.settings.slowdown_sms:
                where = replace(where, extra={**where.extra, "slowed_to_sms": int(self.settings.slowdown_sms)})
            if self.slot is not None:  # a layout's slice: its history apart from the profile's solo runs
                extra = {**where.extra, **self.slot.extra(),
                         **({"layout_slot_problem": self.slot_problem} if self.slot_problem else {})}
                where = replace(where, baseline_profile=self.slot.history_profile(str(where.profile)), extra=extra)
            return ResultRecord(test=self.key(item, target), metric=metric, target=where,
                                fingerprint=dict(self.fingerprint), mode=mode)

        def sink(metric: Metric) -> None:
            escaped = self.emulator.escaped() if self.emulator is not None else None
            if escaped:  # measured outside the profile's green context: never recorded as the profile's
                pytest.fail(f"{escaped}; this test's figures are not recorded", pytrace=False)
            run.records.append(record(metric))
            self.records.append(run.records[-1])

        board = self.board
        return MigBench(benchmark, target, telemetry, sink, quick=mode == "quick", su=self.settings.su,
                        allocation=self.settings.allocation, read_link=board.pcie if board else None, caches=self.caches,
                        neighbours=board.neighbours_pcie_gbs if board else None, pace=self.barrier,
                        host_lock=self.settings.host_lock,
                        sizes=lambda name: self.pipeline.measured_size(record(Metric(name, 1.0, ""))))

    def judge(self, item: pytest.Item, bench: MigBench | None) -> list[str]:
        """Judge this test's records through the pipeline, re-measuring a figure beyond its threshold
        before it fails; the lines of every failing verdict."""
        records = self.records_of(item)
        if not records:
            return []
        tolerance = self.tolerance_of(item)
        times = self.settings.confirm

        def remeasure() -> Remeasured:
            with self.interruptible():  # the re-measuring is the test's own work: SIGTERM stops it at once
                return _remeasure(item, bench, times)

        try:  # a SIGTERM while a verdict is made stops the run at its end
            with self.deferred():
                verdicts = self.pipeline.judge(records, tolerance=tolerance, remeasure=remeasure if times else None)
        except BaselineError as exc:
            msg = str(exc)
            if msg not in self.baseline_errors:
                self.baseline_errors.append(msg)
            return [f"baseline unusable: {msg}"]
        return [v.line() for v in verdicts if v.failed]

    def records_of(self, item: pytest.Item) -> list[ResultRecord]:
        run = self.tests.get(item.nodeid)
        return run.records if run is not None else []

    def ended(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """A phase of a test ended: whether its figures may be saved, its time, the progress line."""
        run = self.tests.get(item.nodeid)
        if run is not None and report.failed:
            run.failed = True
        elif run is not None and report.when == "call" and report.passed:  # a test stopped midway never gets here
            run.passed = True
        self.durations[item.nodeid] = self.durations.get(item.nodeid, 0.0) + float(report.duration or 0.0)
        if report.when != "teardown" or self.progress is None or item.nodeid not in self.progress.tests:
            return
        line = self.progress.finished(item.nodeid, self.durations[item.nodeid])
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if line and reporter is not None:
            reporter.write_line(line)

    def checkpoint_now(self) -> None:
        """After every test that recorded figures, the results file holds them (a killed run keeps them)."""
        if self.checkpoint is not None and self.records:
            with self.deferred():
                self.checkpoint.update(self.records, self.results_meta())

    def results_meta(self) -> dict[str, Any]:
        meta = {"target": self.plan.targets[0].to_dict(), "fingerprint": self.fingerprint,
                "durations": {k: round(v, 2) for k, v in self.durations.items()}}
        if self.window is not None:
            meta["window"] = self.window.plan.to_meta(self.window.skipped)
        if self.plan.left_out:
            meta["left_out"] = list(self.plan.left_out)  # a sweep's profiles measured as their twin, and why
        return meta

    def deferred(self) -> ContextManager[None]:
        """A step SIGTERM must not cut in half (checkpoint.SigtermStop.deferred); nothing before the first benchmark."""
        return self.sigterm.deferred() if self.sigterm is not None else nullcontext()

    def interruptible(self) -> ContextManager[None]:
        """Work inside a deferred step that SIGTERM stops at once (checkpoint.SigtermStop.interruptible)."""
        return self.sigterm.interruptible() if self.sigterm is not None else nullcontext()

    # ------------------------------------------------------------------ the end of the run

    def finish(self, session: pytest.Session, exitstatus: int) -> None:
        """Write the results file, the exports and the report, save the baseline if asked; the
        summary prints the outcome."""
        # every test has ended: a SIGTERM from here on lets the files below be written (SIGKILL stays the hard stop)
        stopped = ("SIGTERM" if self.sigterm is not None and self.sigterm.hold()
                   else "interrupted" if exitstatus == pytest.ExitCode.INTERRUPTED else None)
        if self.barrier is not None:
            self.barrier.end()
            self.messages.append(f"layout barrier: each test and each timed call began with the other slices'; "
                                 f"waited {self.barrier.waited_s:.1f} s for them in all, and ran "
                                 f"{self.barrier.busy_s:.1f} s of work untimed while slower slices timed theirs")
            self.messages.extend(self.barrier.notes)
        self._release_device(session)
        if self.window is not None and self.window.message():
            self.messages.append(self.window.message())
        if stopped and self.records:
            tests = len({r.test for r in self.records})
            why = "SIGTERM: a time limit or a cancelled job" if stopped == "SIGTERM" else stopped
            self.messages.append(f"stopped ({why}): the figures of the {tests} test(s) that finished are kept, "
                                 "marked incomplete")
        if not self.records:
            return
        self._write_outputs(stopped)
        if self.settings.save == "always":
            self._save_baseline()
        elif self.settings.save == "if-passed":
            if session.exitstatus == 0 and not self.errors:
                self._save_baseline()
            else:
                self.messages.append("baseline: this run failed, so it was not added to the history "
                                     "(--mig-save-if-passed); the history is as it was")
        if self.errors and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _release_device(self, session: pytest.Session) -> None:
        """The board reader closed, the MPS daemon an engine started stopped; the health watch's last
        reading (a health sign alone fails the run, as DCGM's diagnostics do)."""
        if self.board is not None:
            self.board.close()
            self.board = None
        mps.shutdown()  # the MPS daemon an engine's emulation started, if any (a site's own is left alone)
        if self.health is not None:
            for sign in self.health.finish():
                (self.errors if sign.level == "fail" else self.messages).append(
                    f"health {sign.level.upper()}: {sign.text}")
            self.health = None
            if self.errors and session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _write_outputs(self, stopped: str | None) -> None:
        if self.checkpoint is not None:
            try:
                self.checkpoint.finish(self.records, self.results_meta(), stopped)
                self.messages.append(f"results: {self.checkpoint.path}")
            except ResultsFileError as exc:  # the report and the baseline are still written
                self.errors.append(str(exc))
        if self.settings.exports:
            try:
                self.messages.extend(exports.write(list(self.settings.exports), self.records))
            except exports.ExportError as exc:
                self.errors.append(str(exc))
        report = self.settings.report
        if report:
            from pytest_mig.report.tables import write_report

            try:
                write_report(Path(report), self.records)
                self.messages.append(f"report: {report}")
            except (OSError, ValueError) as exc:
                self.errors.append(f"report not written: {exc}")

    def _save_baseline(self) -> None:
        passed = [r for run in self.tests.values() if run.saveable for r in run.records]
        left_out = sorted({r.test for run in self.tests.values() if not run.saveable for r in run.records})
        if left_out:
            self.messages.append(f"baseline: the figures of {len(left_out)} test(s) that failed or did not finish "
                                 f"were not saved: " + ", ".join(left_out[:5]) + (", ..." if len(left_out) > 5 else ""))
        try:
            paths = self.store.save(passed)
        except BaselineError as exc:
            self.errors.append(f"baseline not saved: {exc}")
            return
        self.saved = bool(paths)
        self.messages.extend(p.describe() for p in paths)

    def summary(self, tr: Any) -> None:
        """The terminal summary: sections other tests added, the results table, the messages."""
        for title, text in self.sections:
            tr.section(title)
            tr.write_line(text)
        if not self.records:
            for msg in self.messages + self.errors:  # health signs of a run that recorded nothing
                tr.write_line(msg, red=msg in self.errors)
            return
        from pytest_mig.report.tables import sharpness_line, summary_table, verdict_notes

        tr.section("pytest-mig results")
        if self.plan.targets[0].is_cpu:
            tr.write_line("CPU run: real CPU measurements at small sizes, compared only with a CPU baseline "
                          "(baselines/cpu/), never with a GPU's.")
        tr.write_line(summary_table(self.records))
        for line in verdict_notes(self.records):
            tr.write_line(line)
        sharp = sharpness_line(self.records, self.settings.tolerance)
        if sharp:
            tr.write_line(sharp)
        if self.settings.save == "always":
            tr.write_line("this run was added to the baseline: its verdicts against the earlier runs are shown, none "
                          "of them fails it" if self.saved else "this run was not added to the baseline (see below); "
                          "its verdicts against the earlier runs are shown, none of them fails it")
        for msg in self.messages:
            tr.write_line(msg)
        for msg in self.baseline_errors + self.errors:
            tr.write_line(msg, red=True)


def uses_bench(item: pytest.Item) -> bool:
    """Whether a test measures (uses the ``mig_bench`` fixture): a benchmark, not a plugin's unit test."""
    return "mig_bench" in getattr(item, "fixturenames", ())


def _stop_on_sigterm() -> SigtermStop:
    """The SIGTERM handler, installed once the reports' tables are imported whole (pandas, which the
    plugin does not load before): a SIGTERM that cut an import in half (pandas' C extensions) would
    leave a module that fails at the next import.  The rest of what the judging and the session's
    end need is imported with this module."""
    from pytest_mig.report import tables  # noqa: F401

    return stop_on_sigterm()


def _remeasure(item: pytest.Item, bench: MigBench | None, times: int) -> Remeasured:
    """Run the test's body ``times`` more times, same sizes, and return each metric's new values.

    The re-measurements go neither to the results nor to the baseline: they only confirm or clear
    the first measurement.  A re-run that raises ends the re-measuring (what was measured counts).
    """
    values = Remeasured()
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
            values.keep(metric, bool(host.shared_host(metric.info)))
    return values


__all__ = ["ENERGY_WINDOW_S", "SUSTAINED_WINDOW_S", "MigSession", "ItemRun", "uses_bench"]
