"""pytest-mig's pytest hooks and fixtures, in the order pytest calls them.

Each hook delegates: options are defined in :mod:`pytest_mig.options`, read and checked once in
:mod:`pytest_mig.settings`; the run's state, stores and judge live in one
:class:`~pytest_mig.session.MigSession`, built in ``pytest_configure``; what markers say about a test
is :mod:`pytest_mig.markers`.  Precedence of settings: marker > command line > environment > ini.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

try:  # the LogXML that record_testsuite_property writes to (pytest's own, not public API)
    from _pytest.junitxml import xml_key
except ImportError:  # a pytest without it: figures stay out of the xunit2 file
    xml_key = None  # type: ignore[assignment]

from pytest_mig.bench import MigBench, drop_failed_test
from pytest_mig.device import nvml
from pytest_mig.device.plan import Plan
from pytest_mig.device.target import DoesNotFit, SelectionError, Target
from pytest_mig.options import MARKERS, add_options
from pytest_mig.session import MigSession
from pytest_mig.settings import (baseline_dir, check_path_options, host_lock, marker_tolerance, options,
                                 resolve_output_paths)
from pytest_mig.store.results import ResultRecord, ResultsFileError, read_results
from pytest_mig.workloads import preload
from pytest_mig.device.health import failing
from pytest_mig.night import layout, node

SESSION = pytest.StashKey[MigSession]()
BENCH = pytest.StashKey[MigBench]()

__all__ = ["SESSION", "add_summary_section", "baseline_dir", "mig_bench", "mig_device", "mig_plan",
           "mig_run_results", "session_of"]


def session_of(config: pytest.Config) -> MigSession | None:
    """The run's session (None where pytest-mig did not configure this run)."""
    return config.stash.get(SESSION, None)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--mig-device all``: one worker per GPU or slice of the node, at once, merged (night.node);
    ``--mig-layout``: one worker per slice of each layout (night.layout)."""
    if config.getoption("mig_layout") is not None and not (config.option.help or config.option.version):
        return _layout_main(config)
    device = config.getoption("mig_device")
    if device is None or device.strip().lower() != "all" or config.option.help or config.option.version:
        return None

    check_path_options(config)
    opts = options(config)
    resolve_output_paths(config)
    host_lock(config)  # every worker would refuse it: said once, here
    try:
        return node.main(config.invocation_params.args, nvml.discover(), opts.profile, opts.emulate,
                         config.getoption("mig_results"), config.getoption("mig_report"), sys.stdout,
                         Path(config.rootpath), config.getoption("mig_export"))
    except SelectionError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)


def _layout_main(config: pytest.Config) -> int:
    check_path_options(config)
    opts = options(config)
    resolve_output_paths(config)
    host_lock(config)  # every worker would refuse it: said once, here
    save = ("always" if config.getoption("mig_save_baseline") else
            "if-passed" if config.getoption("mig_save_if_passed") else None)
    try:
        if opts.profile or opts.device:
            raise SelectionError("--mig-layout names every slice of the run: drop "
                                 + ("--mig-profile" if opts.profile else "--mig-device") + ".")
        return layout.main(config.invocation_params.args, nvml.discover(), config.getoption("mig_layout"),
                           opts.emulate, config.getoption("mig_results"), config.getoption("mig_layout_plot"),
                           sys.stdout, Path(config.rootpath), baseline_dir(config), save)
    except SelectionError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return int(pytest.ExitCode.USAGE_ERROR)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    session = MigSession.configure(config)
    config.stash[SESSION] = session
    config.pluginmanager.register(session, "mig_session")
    # pytest-benchmark times rounds with our CUDA-event clock unless the user chose a timer.
    if getattr(config.option, "benchmark_timer", None) in (None, "time.perf_counter"):
        config.option.benchmark_timer = "pytest_mig.measure.gpu_clock"


def pytest_sessionstart(session: pytest.Session) -> None:
    mig = session_of(session.config)
    if mig is not None:
        mig.start(session)


def pytest_report_header(config: pytest.Config) -> list[str]:
    mig = session_of(config)
    return mig.header() if mig is not None else []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    mig = session_of(metafunc.config)
    if mig is None or "mig_device" not in metafunc.fixturenames or not mig.plan.sweep:
        return
    targets = mig.plan.targets
    metafunc.parametrize("mig_device", list(range(len(targets))), ids=[t.profile for t in targets], indirect=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip what does not fit its Target (every test, with or without mig_device); scaling checks last.
    After the other plugins' (pytest's own ``-k`` and ``-m``): what is left out and what the window
    plans are the tests the run selected."""
    for item in items:
        marker_tolerance(item)  # a malformed marker is a usage error at collection, with the test's id, not after it ran
    mig = session_of(config)
    if mig is not None:
        mig.select(items)
    last = [i for i in items if i.get_closest_marker("mig_scaling")]
    if last:
        items[:] = [i for i in items if not i.get_closest_marker("mig_scaling")] + last


def pytest_collection_finish(session: pytest.Session) -> None:
    """The run's tests, and their last runs' times, for the progress line."""
    mig = session_of(session.config)
    if mig is not None and not session.config.option.collectonly:
        mig.collected(session.items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """--mig-window: a test that would end outside the window is skipped, with the reason, before its fixtures."""
    mig = session_of(item.config)
    reason = mig.window.reason(item.nodeid) if mig is not None and mig.window is not None else None
    if reason:
        try:  # reported at the test, as a skip marker's reason is
            raise pytest.skip.Exception(reason, _use_item_location=True)
        except TypeError:  # a pytest without that keyword: reported at this line
            pytest.skip(reason)


# --------------------------------------------------------------------------- fixtures


def _session(config: pytest.Config) -> MigSession:
    return config.stash[SESSION]


@pytest.fixture(scope="session")
def mig_plan(pytestconfig: pytest.Config) -> Plan:
    """The run's Plan: its Target(s), how they were chosen and pinned."""
    return _session(pytestconfig).plan


@pytest.fixture
def mig_device(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The Target this test runs on; under emulation the test runs inside the profile's green context."""
    mig = _session(request.config)
    target = mig.plan.targets[getattr(request, "param", 0)]  # markers that do not fit it skipped the test
    slow = mig.settings.slowdown_sms
    drop_failed_test()  # a failed test's tensors must not take this one's memory
    if target.emulated and mig.emulator is not None:
        with mig.emulator.activate(target) as active:
            yield active
    elif slow and mig.emulator is not None:
        with mig.emulator.slowed(target, int(slow)) as active:
            yield active
    else:
        yield target


@pytest.fixture
def mig_bench(request: pytest.FixtureRequest, benchmark: Any, mig_device: Target) -> MigBench:
    """pytest-benchmark's ``benchmark`` wrapped for GPU work: a CUDA-event timer and metric records."""
    bench = _session(request.config).bench(request.node, benchmark, mig_device)
    request.node.stash[BENCH] = bench
    return bench


@pytest.fixture(scope="session")
def mig_run_results(pytestconfig: pytest.Config) -> list[ResultRecord]:
    """This run's records so far, plus those of the files given by --mig-scaling-results."""

    mig = _session(pytestconfig)
    out = list(mig.records)
    for f in mig.settings.scaling_results:
        try:
            out.extend(read_results(Path(f)))
        except ResultsFileError as exc:
            pytest.fail(str(exc), pytrace=False)
    return out


# --------------------------------------------------------------------------- running and judging a test


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    mig = session_of(item.config)
    watch = mig.health if mig is not None else None
    if watch is not None:
        watch.before_test()
    try:
        result = yield
    except DoesNotFit as exc:
        # reported at the test's own location, not at this line of the plugin
        raise pytest.skip.Exception(str(exc), _use_item_location=True) from None
    finally:
        if mig is not None:
            with mig.deferred():
                health = watch.after_test() if watch is not None else None
    if mig is None:
        return result
    failures = _judged(mig, item, health)
    if failures and mig.settings.save != "always":  # a save run is accepted, not judged
        pytest.fail("\n".join(failures), pytrace=False)
    return result


def _judged(mig: MigSession, item: pytest.Item, health: dict[str, Any] | None) -> list[str]:
    """The test's records judged; the lines that fail it (verdicts, then health signs); its metrics,
    units and verdicts as JUnit XML properties for CI dashboards (:func:`_junit`)."""
    records = mig.records_of(item)
    for rec in records:
        rec.health = health
    failures = mig.judge(item, item.stash.get(BENCH, None))
    with mig.deferred():  # a SIGTERM from here on stops the run once the verdicts are complete

        failures += failing(health)  # a health sign alone fails the test (an XID, uncorrected ECC errors)
        if records:
            _junit(item, records)
    return failures


def _junit(item: pytest.Item, records: list[ResultRecord]) -> None:
    """The records' JUnit properties where the junit family being written allows them: the test
    case's own under ``xunit1`` and ``legacy``; under ``xunit2`` (pytest's default), whose schema has
    properties only on the test suite, the suite's, named by the test's node id.  Without
    ``--junitxml`` they are the test's ``user_properties``, for the reporters that read those."""
    from pytest_mig.report.tables import junit_properties

    if not getattr(item.config.option, "xmlpath", None) or item.config.getini("junit_family") in ("xunit1", "legacy"):
        item.user_properties.extend(junit_properties(records))
        return
    if xml_key is None:
        return
    xml = item.config.stash.get(xml_key, None)
    if xml is None:  # an xdist worker: its suite properties never reach the controller (pytest #7767)
        return
    for name, value in junit_properties(records, prefix=item.nodeid):
        xml.add_global_property(name, value)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A failed test's figures never enter a baseline; each test's time, and the progress line."""
    report = yield
    mig = session_of(item.config)
    if mig is not None:
        with mig.deferred():
            mig.ended(item, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """A layout's slice begins each test with its neighbours; after every test that recorded figures,
    the results file holds them (a killed run keeps them)."""
    mig = session_of(item.config)
    if mig is not None:
        mig.with_neighbours(item)
    result = yield
    if mig is not None:
        mig.checkpoint_now()
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[Any]:
    """Every test has ended: a SIGTERM from here on no longer stops the run (the session's end writes
    the files), not even in pytest's own steps before :func:`pytest_sessionfinish`."""
    try:
        return (yield)
    finally:
        mig = session_of(session.config)
        if mig is not None and mig.sigterm is not None:
            mig.sigterm.hold()


#: What pytest-benchmark's machine_info leaves out of the Target: what the session learns only once
#: CUDA starts (verify, the green context), and who chose it (the plugin, or a scheduler's pin): not
#: the machine.
NOT_MACHINE_INFO = ("sms_obtained", "memory_bytes", "verified", "chosen_by")
MACHINE_INFO = pytest.StashKey[dict[str, Any]]()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """The Target as planned and the fingerprint, under ``pytest_mig``.  pytest-benchmark asks at
    configure time to compare (``--benchmark-compare``), before the session has read the fingerprint
    or verified the Target, and again when it saves: both answers are made of what is known before
    CUDA starts (the fingerprint read here if the session has not read it yet), so that a compare on
    an unchanged machine finds its machine_info the same as the saved file's."""
    mig = session_of(config)
    if mig is None:
        return
    info = config.stash.get(MACHINE_INFO, None)
    if info is None:
        target = mig.plan.targets[0]
        fingerprint = mig.fingerprint or nvml.fingerprint(target.gpu_index)
        info = {"target": {k: v for k, v in target.to_dict().items() if k not in NOT_MACHINE_INFO},
                "fingerprint": dict(fingerprint)}
        config.stash[MACHINE_INFO] = info
    machine_info["pytest_mig"] = info


# --------------------------------------------------------------------------- end of the run


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the results file and the report, save the baseline if asked; the summary prints the outcome."""
    mig = session_of(session.config)
    if mig is not None:
        mig.finish(session, exitstatus)


def add_summary_section(config: pytest.Config, title: str, text: str) -> None:
    """Print ``text`` under ``title`` in the terminal summary at the end of the run (the scaling table)."""
    mig = session_of(config)
    if mig is not None:
        mig.sections.append((title, text))


def pytest_unconfigure(config: pytest.Config) -> None:
    preload.forget()
    mig = session_of(config)
    if mig is not None and mig.sigterm is not None:  # SIGTERM's own action again, after the session's end
        mig.sigterm.restore()


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The results table and the lines naming the files written, before other plugins' summaries:
    pytest-benchmark's raises when ``--benchmark-compare-fail`` finds a regression, and what comes
    after it is never printed."""
    mig = session_of(config)
    if mig is not None:
        mig.summary(terminalreporter)
