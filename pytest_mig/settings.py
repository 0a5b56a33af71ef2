"""pytest-mig's settings: reading and checking every option, ini value and marker value, once, when
pytest starts (precedence: marker > command line > environment > ini).

A user's mistake here is one sentence, raised as pytest.UsageError (or argparse.ArgumentTypeError
for an option's type) before anything is measured: never a traceback, never a failure after the run.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_mig.device.host import HostLockError, check_host_lock
from pytest_mig.device.plan import Options
from pytest_mig.store.results import default_results_path
from pytest_mig.common.text import SHOWN, printable, quoted, shown
from pytest_mig.measure.cost import WULVER, SUCoefficients
from pytest_mig.judge.reference import SHIPPED, store_for
from pytest_mig.common.files import (FileProblem, check_output, check_path, distinct_outputs, output_file, same_file,
                                     writes_through)
from pytest_mig.store.history import BaselineError
from pytest_mig.report.exports import GITHUB_NAMES, parse_export
from pytest_mig.judge.verdict import parse_tolerance

#: Image formats --mig-scaling-plot writes.
PLOT_SUFFIXES = (".png", ".svg", ".pdf")

#: The help of the options the plugin and the ``pytest-mig`` command share (argparse %-formats an
#: option's help: a literal percent sign is written ``%%``; :func:`ini_help` gives the ini's text).
HELP_BASELINE_DIR = "folder of baselines/<gpu-model>/<profile>.json (default: baselines)."
HELP_KEEP = "runs a baseline keeps per figure (default 10): the history its noise and thresholds come from."
HELP_SHRINK = "consent to a --mig-baseline-keep below the runs a history holds: its oldest runs are dropped."
REFERENCE_VALUES = ("'shipped' (the references measured for this GPU model and profile, in a 10%% band) or a "
                    "folder made by 'pytest-mig reference'")
HELP_REFERENCE = f"what a figure with no local baseline is judged against (default: shipped): {REFERENCE_VALUES}, or 'none'."
HELP_TOLERANCE = ("the largest change a figure may hide, as a fraction or percent (0.05 or 5%%). Unset (default), "
                  "each figure's threshold comes from its run-to-run noise and a figure that cannot hold 5%% is "
                  "reported as too noisy to gate; set, it caps every threshold.")


def ini_help(text: str) -> str:
    """An option's help as an ini value's (pytest does not %-format an ini's help)."""
    return text.replace("%%", "%")


def tolerance_arg(text: str) -> float:
    """verdict.parse_tolerance's reading ('5%' or '0.05', below 100%) as an argparse type (the plugin's
    options and the pytest-mig command's)."""

    try:
        return parse_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: The largest count an option takes (runs kept, re-measurements, SMs): a file holds no larger one.
MOST = 10**6


def whole_number(text: str, least: int) -> int:
    """``text`` as a whole number from ``least`` to :data:`MOST`; argparse.ArgumentTypeError otherwise."""

    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text, SHOWN)} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is too small: use {least} or more")
    if value > MOST:
        raise argparse.ArgumentTypeError(f"{shown(value)} is too large: use {MOST:,} or fewer")
    return value


def positive_int_arg(text: str) -> int:
    return whole_number(text, 1)


def count_arg(text: str) -> int:
    return whole_number(text, 0)


def export_arg(text: str) -> tuple[str, Path]:
    """``--mig-export KIND=PATH``: a malformed one is a usage error in one sentence."""

    try:
        return parse_export(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0", "")


def ini_bool(config: pytest.Config, name: str) -> bool:
    text = str(config.getini(name) or "").strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise pytest.UsageError(f"ini option {name}: {quoted(config.getini(name), SHOWN)} is not true or false; use true "
                            f"or false.")


def given(value: str | None, where: str, what: str) -> str | None:
    """A setting that was given must say something: an empty one is a mistake (an unset shell variable
    in `--mig-profile "$P"`), not a reason to measure whatever comes first."""
    if value is None:
        return None
    if not value.strip():
        raise pytest.UsageError(f"{where} is empty: give {what} (is the shell variable it came from unset?)")
    return value.strip()


def options(config: pytest.Config) -> Options:
    what = "a profile such as 1g.10gb, 'full' or 'all'"
    profile = (given(config.getoption("mig_profile"), "--mig-profile", what)
               or given(os.environ.get("PYTEST_MIG_PROFILE"), "PYTEST_MIG_PROFILE", what)
               or str(config.getini("mig_profile") or "").strip() or None)
    device = given(config.getoption("mig_device"), "--mig-device",
                    "a MIG-<uuid>, GPU-<uuid>, a GPU index N or N:M")
    require = config.getoption("mig_require_gpu")
    if require is None:
        require = ini_bool(config, "mig_require_gpu")
    slot = config.getoption("mig_layout_slot", None)
    return Options(profile=profile, device=device, emulate=bool(config.getoption("mig_emulate")),
                   require_gpu=bool(require), by_mps=bool(slot) and str(slot).endswith("/mps"))


def check_path_options(config: pytest.Config) -> None:
    """Every path an option or ini value names is one a file system can take (no name longer than
    255 bytes, no NUL byte: :func:`pytest_mig.common.files.path_problem`), said now in one sentence rather
    than as an OSError from the first call that touches it (``--mig-export`` is checked as it is
    parsed)."""

    paths = [("--mig-baseline-dir", config.getoption("mig_baseline_dir") or config.getini("mig_baseline_dir")),
             ("--mig-reference", config.getoption("mig_reference") or config.getini("mig_reference")),
             ("--mig-report", config.getoption("mig_report")), ("--mig-results", config.getoption("mig_results")),
             ("--mig-scaling-plot", config.getoption("mig_scaling_plot"))]
    paths += [("--mig-scaling-results", f) for f in config.getoption("mig_scaling_results") or []]
    try:
        for option, value in paths:
            if value:
                check_path(option, str(value))
    except FileProblem as exc:
        raise pytest.UsageError(f"{exc}.") from None


#: What an output option writes into a folder named with a trailing ``/``.
DEFAULT_NAMES = {"mig_report": "pytest-mig-report.md", "mig_scaling_plot": "scaling.png"}


def resolve_output_paths(config: pytest.Config) -> None:
    """Every output option made a file path now (:func:`pytest_mig.common.files.output_file`): ``DIR/`` is a
    folder to write into, an existing folder without the ``/`` is a usage error.  The options are
    rewritten in place, so everything after reads the file it will write (``--mig-export`` is checked as
    it is parsed, :func:`pytest_mig.report.exports.parse_export`).  Then every file the run will write is
    checked against what the site keeps (:func:`pytest_mig.common.files.check_output`: never a history, a
    reference or another run's results file) and against the run's other outputs
    (:func:`pytest_mig.common.files.distinct_outputs`)."""

    try:
        for dest, option in (("mig_report", "--mig-report"), ("mig_scaling_plot", "--mig-scaling-plot")):
            value = config.getoption(dest)
            if value:
                setattr(config.option, dest, str(output_file(str(value), DEFAULT_NAMES[dest], option)))
        results = config.getoption("mig_results")
        if results and results != "none":
            stamp = default_results_path(Path(".")).name
            config.option.mig_results = str(output_file(str(results), stamp, "--mig-results"))
        outputs = output_paths(config)
        folders = kept_folders(config)
        for option, path in outputs:
            check_output(path, option, folders, results=option == "--mig-results")
        distinct_outputs(outputs)
    except FileProblem as exc:
        raise pytest.UsageError(f"{exc}.") from None


def output_paths(config: pytest.Config) -> list[tuple[str, Path]]:
    """Each file the run writes besides its history, with the option that names it (a github export:
    its two files)."""

    out = []
    results = config.getoption("mig_results")
    if results and results != "none":
        out.append(("--mig-results", Path(results)))
    for dest, option in (("mig_report", "--mig-report"), ("mig_scaling_plot", "--mig-scaling-plot")):
        if config.getoption(dest):
            out.append((option, Path(config.getoption(dest))))
    for kind, path in config.getoption("mig_export") or []:
        if kind == "github":
            out.extend((f"--mig-export {kind}=", Path(path) / name) for name in GITHUB_NAMES.values())
        else:
            out.append((f"--mig-export {kind}=", Path(path)))
    return out


def kept_folders(config: pytest.Config) -> list[tuple[Path, str]]:
    """The folders whose JSON files no output replaces: the baseline folder, the shipped references
    and the run's own reference folder (:func:`pytest_mig.common.files.kept_file`)."""

    folders = [(baseline_dir(config), f"the baseline folder {printable(baseline_dir(config))}"),
               (SHIPPED, "the shipped references")]
    store = reference_store(config)
    if store is not None and Path(store.root) != SHIPPED:
        folders.append((Path(store.root), f"the reference folder {printable(store.root)} (--mig-reference)"))
    return folders


def check_output_paths(config: pytest.Config) -> None:
    """Every file or folder the run will write is checked now, not after an hour of benchmarks."""
    paths = [("--mig-report", config.getoption("mig_report")), ("--mig-scaling-plot", config.getoption("mig_scaling_plot"))]
    results = config.getoption("mig_results")
    if results and results != "none":
        paths.append(("--mig-results", results))
    for option, value in paths:
        if value:
            check_writable(option, Path(value), Path(value).parent)
    for kind, path in config.getoption("mig_export") or []:
        folder = path if kind == "github" else path.parent
        check_writable(f"--mig-export {kind}=", path, folder)
    if config.getoption("mig_save_baseline") or config.getoption("mig_save_if_passed"):
        folder = baseline_dir(config)
        check_writable("--mig-baseline-dir", folder, folder)


def check_baseline_save(saving: bool, store: Any, targets: Any) -> None:
    """When this run will be saved, each Target's history must take it: the file reads, its folder is
    writable, and a keep below the runs it holds has consent (--mig-baseline-shrink).  Said now, so a
    run never ends in 'added to the baseline' and 'not saved' at once."""
    if not saving:
        return

    for t in targets:
        try:
            store.check_save(t.gpu_slug, t.baseline_profile)
        except BaselineError as exc:
            raise pytest.UsageError(str(exc)) from None


def check_histories(store: Any, targets: Any, references: Any) -> None:
    """Each Target's history and reference, read and checked now (a file cut short, hand-broken, a
    named pipe, a link that loops or leads to no folder): one sentence before any test runs, not every
    test failed after an hour of benchmarks.  A history not made yet is none, as it was."""

    for t in targets:
        try:
            store.load(t.gpu_slug, t.baseline_profile)
            if references is not None:
                references.load(t.gpu_slug, t.baseline_profile)
        except BaselineError as exc:
            raise pytest.UsageError(f"{exc}; nothing was run.") from None


def check_writable(option: str, path: Path, folder: Path) -> None:
    """The folder must be one this user can write, or one that can be made in such a folder; a
    character device or a pipe written through (``/dev/null``) must itself be writable."""

    if writes_through(path):
        if not os.access(path, os.W_OK):
            raise pytest.UsageError(f"{option} {path}: not writable by this user.")
        return
    folder = folder if str(folder) else Path(".")
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise pytest.UsageError(f"{option} {printable(path)}: {printable(probe)} is a file, not a folder, so nothing can be "
                                f"written there.")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == folder else f" (the nearest existing folder of {folder})"
        raise pytest.UsageError(f"{option} {printable(path)}: the folder {printable(probe)}{printable(where)} is not "
                                f"writable by this user.")


def baseline_dir(config: pytest.Config) -> Path:
    d = config.getoption("mig_baseline_dir") or config.getini("mig_baseline_dir") or "baselines"
    p = Path(d)
    return p if p.is_absolute() else Path(config.rootpath) / p


def reference_store(config: pytest.Config) -> Any:
    """The references figures without a local history are judged against (``--mig-reference``, ini
    ``mig_reference``): the shipped ones by default, a site's own folder, or None for ``none``.  A
    folder that does not exist is a usage error at start-up."""

    raw = config.getoption("mig_reference") or config.getini("mig_reference") or ""
    try:
        return store_for(str(raw), Path(config.rootpath))
    except ValueError as exc:
        raise pytest.UsageError(f"--mig-reference {exc}; give a folder made by 'pytest-mig reference', "
                                f"'shipped' (the default) or 'none'.") from None


def explicit_tolerance(config: pytest.Config) -> float | None:
    """The tolerance a site set (command line, else ini); None: thresholds come from the noise alone."""
    cli = config.getoption("mig_tolerance")
    if cli is not None:
        return float(cli)
    text = str(config.getini("mig_tolerance") or "").strip()
    if not text:
        return None
    try:
        return tolerance_arg(text)
    except Exception as exc:
        raise pytest.UsageError(f"ini option mig_tolerance: {exc}") from None


def ini_count(config: pytest.Config, option: str, ini: str, default: int, least: int) -> int:
    value = config.getoption(option)
    if value is not None:
        return int(value)
    text = str(config.getini(ini) or "").strip()
    if not text:
        return default
    try:
        return whole_number(text, least)
    except Exception as exc:
        raise pytest.UsageError(f"ini option {ini}: {exc}") from None


def confirm_count(config: pytest.Config) -> int:
    """How many times a figure beyond its threshold is re-measured before its test fails."""
    return ini_count(config, "mig_confirm", "mig_confirm", 2, 0)


def baseline_keep(config: pytest.Config) -> int | None:
    """Runs kept per figure when saving (None: the file's own setting)."""
    if config.getoption("mig_baseline_keep") is None and not str(config.getini("mig_baseline_keep") or "").strip():
        return None
    return ini_count(config, "mig_baseline_keep", "mig_baseline_keep", 10, 1)


def su_coefficients(config: pytest.Config) -> Any:

    text = config.getoption("mig_su_coefficients") or config.getini("mig_su_coefficients")
    if not text:
        return WULVER
    try:
        return SUCoefficients.from_string(str(text))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def su_allocation(config: pytest.Config, env: Any = os.environ) -> tuple[float, float]:
    """(CPUs, RAM GB) billed with the GPU: the option, else Slurm's allocation, else 1 CPU and 4 GB."""
    text = config.getoption("mig_su_allocation")
    cpus, ram = 1.0, 4.0
    if not text:
        try:
            cpus = float(env.get("SLURM_CPUS_PER_TASK") or 1)
            ram = float(env["SLURM_MEM_PER_NODE"]) / 1024 if env.get("SLURM_MEM_PER_NODE") else 4.0
        except ValueError:
            return 1.0, 4.0
        if not (math.isfinite(cpus) and math.isfinite(ram) and cpus > 0 and ram > 0):
            return 1.0, 4.0
        return cpus, ram
    form = "expected 'cpus=N,ram_gb=G'"
    values = {"cpus": cpus, "ram_gb": ram}
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        key, _, raw = part.partition("=")
        try:
            if key.strip() not in values or not math.isfinite(float(raw)) or not 0 < float(raw) <= 1e6:
                raise ValueError
            values[key.strip()] = float(raw)
        except ValueError:
            raise pytest.UsageError(f"--mig-su-allocation {quoted(text, SHOWN)}: {quoted(part, SHOWN)} is not understood; {form}") from None
    return values["cpus"], values["ram_gb"]


def marker_tolerance(item: pytest.Item) -> Any:
    """The mig_tolerance marker's fraction (or {metric: fraction}); a malformed one is a usage error
    naming the test."""
    marker = item.get_closest_marker("mig_tolerance")
    if not marker:
        return None
    raw = marker.kwargs.get("tolerance", marker.args[0] if marker.args else None)
    example = "e.g. @pytest.mark.mig_tolerance(0.05), mig_tolerance('5%') or mig_tolerance({'fp16_tflops': 0.03})"
    values = raw if isinstance(raw, dict) else {None: raw}
    out: dict[Any, float] = {}
    for key, value in values.items():
        try:
            if value is None or isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError(f"{quoted(value)} is not a tolerance")
            out[key] = tolerance_arg(str(value)) if isinstance(value, str) else tolerance_value(float(value))
        except Exception as exc:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.mig_tolerance({raw!r}) is not a tolerance below "
                                    f"100% ({exc}); {example}.") from None
    return out[None] if None in out else out


def tolerance_value(value: float) -> float:
    if not math.isfinite(value) or not 0 <= value < 1:
        raise ValueError(f"{value:g} is outside 0 up to 1 (a fraction: 0.05 is 5%)")
    return value




@dataclass(frozen=True)
class Settings:
    """Every option and ini value of a run, read and checked once (:func:`read_settings`)."""

    options: Options
    mode: str  # "normal" or "quick" (--mig-quick), as records and baselines name it
    baseline_dir: Path
    keep: int | None  # runs kept per figure when saving; None: the file's own setting
    shrink: bool  # consent to a keep below the runs a history holds
    save: str | None  # "always" (--mig-save-baseline), "if-passed" (--mig-save-if-passed) or None
    confirm: int  # re-measurements before a figure beyond its threshold fails its test
    tolerance: float | None  # the site's explicit tolerance; None: thresholds from the noise alone
    fail_on_improvement: bool
    all_tests: bool  # run tests that gate nothing here too
    window: float | None  # seconds of --mig-window
    slowdown_sms: int | None  # detection experiments: a whole GPU on this many SMs
    host_lock: Path | None  # --mig-host-lock: the file the host's runs take turns on at host copies
    results: str | None  # the results file; None: .mig-results/results-<time>.json; "none": none
    report: str | None
    exports: tuple[tuple[str, Path], ...]
    scaling_results: tuple[str, ...]
    su: Any  # measure.cost.SUCoefficients
    allocation: tuple[float, float]  # (CPUs, RAM GB) billed with the GPU

    @property
    def saving(self) -> bool:
        return self.save is not None


def read_settings(config: pytest.Config, opts: Options) -> Settings:
    """The run's settings from the command line, environment and ini values; a mistake in any of them
    is one sentence now, not in the first benchmark.  Output options are made file paths first
    (:func:`resolve_output_paths`)."""
    su, allocation = su_coefficients(config), su_allocation(config)
    tolerance, confirm, keep = explicit_tolerance(config), confirm_count(config), baseline_keep(config)
    if config.getoption("mig_save_baseline") and config.getoption("mig_save_if_passed"):
        raise pytest.UsageError("--mig-save-baseline adds a run whatever its verdicts and --mig-save-if-passed only "
                                "a run that passed: give one of them")
    save = "always" if config.getoption("mig_save_baseline") else "if-passed" if config.getoption(
        "mig_save_if_passed") else None
    resolve_output_paths(config)  # DIR/ names a folder to write into; a folder without the / is a mistake
    return Settings(
        options=opts, mode="quick" if config.getoption("mig_quick") else "normal", baseline_dir=baseline_dir(config),
        keep=keep, shrink=bool(config.getoption("mig_baseline_shrink")), save=save, confirm=confirm,
        tolerance=tolerance, fail_on_improvement=bool(config.getoption("mig_fail_on_improvement")),
        all_tests=bool(config.getoption("mig_all_tests")), window=config.getoption("mig_window"),
        slowdown_sms=config.getoption("mig_slowdown_sms"), results=config.getoption("mig_results"),
        report=config.getoption("mig_report"), exports=tuple(config.getoption("mig_export") or ()),
        scaling_results=tuple(config.getoption("mig_scaling_results") or ()), su=su, allocation=allocation,
        host_lock=host_lock(config))


def host_lock(config: pytest.Config) -> Path | None:
    """``--mig-host-lock`` (ini ``mig_host_lock``): a file that every run of the host sees, relative to
    the rootdir as the other paths are, checked now: it can be locked
    (:func:`pytest_mig.device.host.check_host_lock`) and is none of the files this run writes."""
    given = config.getoption("mig_host_lock")
    if given is not None and not given.strip():
        raise pytest.UsageError("--mig-host-lock is empty: name a file every run of the host sees, or leave the option out.")
    raw = str(given or config.getini("mig_host_lock") or "").strip()
    if not raw:
        return None
    try:
        check_path("--mig-host-lock", raw)  # a NUL byte, a name too long: before any call on it
        try:
            path = Path(raw).expanduser()
        except RuntimeError:  # ~user with no such user, or no home
            raise FileProblem(f"--mig-host-lock {shown(raw)}: its ~ names no home folder here") from None
        path = path if path.is_absolute() else Path(config.rootpath) / path
        check_path("--mig-host-lock", str(path))
        for option, out in output_paths(config):
            if same_file(out, path):
                raise FileProblem(f"--mig-host-lock {shown(str(path))} is also {option}, which this run writes: "
                                  f"name a file of its own, such as pytest-mig.lock")
        check_host_lock(path)
    except (FileProblem, HostLockError) as exc:
        raise pytest.UsageError(f"{exc}.") from None
    return path


def check_slowdown(settings: Settings, plan: Any) -> None:
    """--mig-slowdown-sms slows a whole GPU for the detection experiment, and is never saved."""
    slow = settings.slowdown_sms
    if slow is None:
        return
    t = plan.targets[0]
    if t.kind != "full" or plan.sweep:
        raise pytest.UsageError("--mig-slowdown-sms slows a whole GPU for the detection experiment: use it with "
                                "--mig-profile full on a GPU whose MIG mode is off")
    if settings.saving:
        raise pytest.UsageError("--mig-slowdown-sms measures a GPU slowed on purpose: its figures are never "
                                "saved as a baseline; drop --mig-save-baseline and --mig-save-if-passed")
    if t.sms and slow >= t.sms:
        raise pytest.UsageError(f"--mig-slowdown-sms {slow}: the GPU has {t.sms} SMs; ask for fewer")


def check_plot_and_report(config: pytest.Config) -> None:
    """An image format or report suffix pytest-mig cannot write is said now, not after the benchmarks."""
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
    if report:
        from pytest_mig.report.tables import ReportError, report_format

        try:
            report_format(report)
        except ReportError as exc:
            raise pytest.UsageError(f"--mig-report {exc}") from None
