"""The ``pytest-mig`` command: what is not a test run.

    pytest-mig devices                       GPUs, MIG instances and this GPU's profiles (no GPU: says so)
    pytest-mig report FILES... [--out PATH]  merge results files of many runs/nodes into one table,
                                             flagging a node far worse than the others
    pytest-mig compare OLD... NEW            judge NEW's figures against the history the OLD results
                                             files make (oldest first), with the plugin's rule;
                                             exit 1 on a regression or when nothing could be compared
    pytest-mig compare --reference shipped [OLD...] NEW
                                             figures with no history in OLD judged against the
                                             reference (shipped, or a folder), as a first night is
    pytest-mig reference FILES... --out DIR  add results files' figures to a reference folder (the form
                                             of the shipped references; --mig-reference DIR uses one);
                                             --drop-test TEST takes a test whose definition changed out
    pytest-mig history FILES... [--baselines DIR] --out PAGE.html
                                             the trend page: every figure over the runs, its band,
                                             verdicts and fingerprint changes (static, no network)
    pytest-mig calibrate [-n RUNS] -- ARGS   run the suite RUNS times (pytest ARGS), each run saved
                                             into the baseline history; then each figure's CV,
                                             threshold, smallest detectable change and gating
    pytest-mig detection -- ARGS             the detection-power experiment of docs/detection.md

Bad input (a missing file, corrupt JSON, an unknown report suffix) is one sentence on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Sequence, TextIO

from pytest_mig.store.baselines import DEFAULT_KEEP, BaselineError
from pytest_mig.common.files import FileProblem, check_output, output_file, path_problem
from pytest_mig.device.profiles import model_slug
from pytest_mig.judge.reference import SHIPPED, ReferenceStore, UnknownTestError, build, count_range, store_for
from pytest_mig.report.tables import (
    OUTLIER_FACTOR,
    ReportError,
    find_outliers,
    frame_table,
    merged_frame,
    records_frame,
    report_format,
    write_report,
)
from pytest_mig.store.results import ResultRecord, ResultsFileError, read_results
from pytest_mig.judge.pipeline import Pipeline, RecordHistories
from pytest_mig.settings import MOST, tolerance_arg
from pytest_mig.common.text import SHOWN, printable, quoted, shown
from pytest_mig.judge.verdict import Verdict

PROG = "pytest-mig"

#: Columns the merged report prints on the terminal (files get every column).
REPORT_COLUMNS = ("test", "metric", "gpu", "profile", "node", "value", "unit", "verdict", "outlier")


class CliError(Exception):
    """A user's mistake on the command line: printed as one sentence, exit status 2."""


def _factor_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text, SHOWN)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{quoted(text, SHOWN)} is not a finite number (e.g. 1.5: 50% worse)")
    if value <= 1:
        raise argparse.ArgumentTypeError("the outlier factor must be above 1 (e.g. 1.5: 50% worse)")
    return value


def _path_arg(text: str) -> Path:
    """A path argument; one no file system takes (a name over 255 bytes, a NUL byte) is a usage error
    here, not an OSError from the first call that touches it."""
    why = path_problem(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{shown(text)}: {why}")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="pytest-mig: MIG-aware GPU benchmarks, reports and comparisons.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("devices", help="list GPUs, MIG instances and this GPU's profiles",
                   description="List the GPUs NVML sees, their MIG instances and profiles. Works without a GPU.")

    rep = sub.add_parser("report", help="merge results files from many runs or nodes into one table",
                         description="Merge pytest-mig results files into one table and flag outlier nodes.")
    rep.add_argument("files", nargs="+", type=_path_arg, metavar="FILE", help="results JSON files (from --mig-results)")
    rep.add_argument("--out", type=_path_arg, metavar="PATH", help="also write the table: .md, .csv or .json")
    rep.add_argument("--outlier-factor", type=_factor_arg, default=OUTLIER_FACTOR, metavar="X",
                     help=f"flag a node X times worse than the median of the others (default {OUTLIER_FACTOR})")
    rep.add_argument("--fail-on-outlier", action="store_true", help="exit 1 when a node is flagged")

    cmp_ = sub.add_parser("compare", help="judge a results file against the history of earlier ones",
                          description="Judge the last results file against the history the earlier ones make "
                                      "(oldest first), with the plugin's rule; exit 1 on a regression, or when "
                                      "nothing could be compared. With --reference, a figure with no history "
                                      "in the earlier files is judged against the reference for its GPU model "
                                      "and profile, as the plugin judges a first night.")
    cmp_.add_argument("files", nargs="+", type=_path_arg, metavar="FILE",
                      help="OLD1 [OLD2 ...] NEW: earlier results files, then the one to judge "
                           "(with --reference, NEW alone will do)")
    cmp_.add_argument("--reference", default=None, metavar="R",
                      help="judge figures with no earlier history against references: 'shipped' (the "
                           "package's) or a folder made by 'pytest-mig reference'")
    cmp_.add_argument("--tolerance", type=tolerance_arg, default=None, metavar="PCT",
                      help="cap every threshold at this change, e.g. 5%% or 0.05 (default: thresholds from "
                           "the noise of the history, figures that cannot hold 5%% are too noisy to gate)")
    cmp_.add_argument("--fail-on-improvement", action="store_true",
                      help="also exit 1 when a metric improved beyond its threshold (a stale baseline)")

    ref = sub.add_parser("reference", help="build a reference folder from results files",
                         description="Add the figures of results files (oldest first) to a reference folder, "
                                     "the form pytest-mig ships its references in: a first run with no local "
                                     "baseline is judged against it (--mig-reference DIR). The boards' UUIDs "
                                     "are left out; each figure's run-to-run sigma is pooled over the model's "
                                     "profiles.")
    ref.add_argument("files", nargs="*", type=_path_arg, metavar="FILE", help="results JSON files (from --mig-results)")
    ref.add_argument("--out", type=_path_arg, required=True, metavar="DIR", help="the reference folder to add to")
    ref.add_argument("--drop-test", action="append", default=[], metavar="TEST",
                     help="take this test's figures out of the folder and leave them out of the files (a test "
                          "whose definition changed); its id as results files write it; may be repeated")

    chk = sub.add_parser("reference-check", help="judge each run of a reference folder against the others",
                         description="Take each run of each figure out of the reference folder in turn and judge "
                                     "it against the rest, as a first night is judged: an unchanged GPU of the "
                                     "model, so a failure is a false alarm. Then the same run after a loss: "
                                     "how many such losses fail. Exit 1 where a false alarm is found.")
    chk.add_argument("folder", nargs="?", type=_path_arg, default=None, metavar="DIR",
                     help="the reference folder (default: the references shipped with pytest-mig)")
    chk.add_argument("--loss", type=tolerance_arg, default=None, metavar="PCT",
                     help="the loss applied to each run, e.g. 15%% (default) or 0.1")

    his = sub.add_parser("history", help="write the trend page of every figure (one static HTML file)",
                         description="Write one static HTML page (no network needed to open it) with every "
                                     "figure's values over the runs, the band each run was judged against, its "
                                     "verdict and the fingerprint changes on the time axis, grouped by GPU model, "
                                     "profile and test, with what regressed in the latest run at the top.")
    his.add_argument("files", nargs="*", type=_path_arg, metavar="FILE", help="results JSON files (from --mig-results)")
    his.add_argument("--baselines", type=_path_arg, default=None, metavar="DIR",
                     help="also the runs kept in this baseline folder (e.g. baselines)")
    his.add_argument("--out", type=_path_arg, required=True, metavar="PAGE", help="the HTML file to write")
    his.add_argument("--title", default="pytest-mig trend", help="the page's title")

    smp = sub.add_parser("samples", help="how many samples each figure needs, from repeated runs' results files",
                         description="For each figure that is the median of its samples, the run-to-run CV as if "
                                     "only the first k samples had been measured, pooled over GPU models, profiles "
                                     "and cases, and the fewest samples whose CV keeps the threshold "
                                     "(docs/benchmarks.md, 'The night's time').")
    smp.add_argument("files", nargs="+", type=_path_arg, metavar="FILE",
                     help="results JSON files of repeated runs (a calibration's, or a reference's)")

    cal = sub.add_parser("calibrate", help="run the suite N times into the baseline history and show thresholds",
                         description="Run the suite RUNS times on this Target (each run its own pytest process), "
                                     "add every run to the baseline history, then print per figure its run-to-run "
                                     "CV, threshold, smallest detectable change and whether it gates. Put the "
                                     "pytest arguments after --, e.g. pytest-mig calibrate -n 10 -- benchmarks "
                                     "--mig-profile 1g.10gb.")
    cal.add_argument("-n", "--runs", type=_runs_arg, default=DEFAULT_KEEP, help=f"runs (default {DEFAULT_KEEP})")
    cal.add_argument("--baseline-dir", type=_path_arg, default=Path("baselines"), help="default: baselines")
    cal.add_argument("--keep", type=_runs_arg, default=None, help="runs the history keeps per figure")
    cal.add_argument("--shrink", action="store_true",
                     help="consent to a --keep below the runs a history holds: its oldest runs are dropped")
    cal.add_argument("--work-dir", type=_path_arg, default=Path(".mig-results") / "calibrate",
                     help="each calibration's runs' results files and logs go to a new folder <time> in it, "
                          "never over an earlier calibration's (default .mig-results/calibrate)")
    cal.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments")

    det = sub.add_parser("detection", help="measure false alarms and detection on this GPU (docs/detection.md)",
                         description="The detection-power experiment: UNCHANGED runs saved one after the other "
                                     "into a fresh baseline history (each judged against the runs before it), "
                                     "then runs slowed on purpose to fewer SMs judged against that history, "
                                     "then a replay that scales recorded runs; writes OUT/detection.md.")
    det.add_argument("--unchanged", type=_runs_arg, default=15, help="unchanged runs (default 15)")
    det.add_argument("--slow-sms", type=_runs_arg, action="append", default=[], metavar="SMS",
                     help="also run slowed to this many SMs (repeatable)")
    det.add_argument("--slow-runs", type=_runs_arg, default=3, help="runs per --slow-sms (default 3)")
    det.add_argument("--out", type=_path_arg, default=Path(".mig-results") / "detection", help="working folder")
    det.add_argument("--analyse-only", action="store_true", help="only replay the results files already in --out")
    det.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments")
    return parser


def _runs_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text, SHOWN)} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("give 1 or more")
    if value > MOST:
        raise argparse.ArgumentTypeError(f"{shown(value)} is too large: give {MOST:,} or fewer")
    return value


def _pytest_args(raw: Sequence[str]) -> list[str]:
    args = list(raw)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise CliError("give the pytest arguments after --, e.g. -- benchmarks --mig-profile full")
    return args


# -- devices -------------------------------------------------------------------------------------


def cmd_devices(out: TextIO) -> int:
    """Describe what NVML sees; without a GPU or driver it says so and succeeds."""
    try:
        from pytest_mig.device.nvml import describe_inventory, discover
    except ImportError as exc:
        print(f"no GPU information: the NVML layer cannot be loaded ({exc})", file=out)
        return 0
    try:
        inv = discover()
    except Exception as exc:  # no driver, no library, no permission: a machine without a GPU is normal
        print(f"no NVIDIA GPU visible: {exc}", file=out)
        return 0
    lines = list(describe_inventory(inv))
    for line in lines or ["no NVIDIA GPU visible"]:
        print(line, file=out)
    for line in reference_lines([g.name for g in inv.gpus]):
        print(line, file=out)
    return 0


def judged_by(root: Path) -> dict[tuple[str, str, str], tuple[int, int]]:
    """Per (GPU model, profile, mode) of a reference folder: its figures judged and held."""
    store = ReferenceStore(root)
    return {(model, profile, mode): n
            for model, profiles in store.models().items() for profile in profiles
            for mode, n in store.load(model_slug(model), profile).judged_counts().items()}  # type: ignore[union-attr]


def reference_lines(gpu_names: Sequence[str], root: Path | None = None,
                    before: dict[tuple[str, str, str], tuple[int, int]] | None = None) -> list[str]:
    """Which GPU models have shipped references (first-night verdicts), and whether this machine's do.
    With ``before`` (:func:`judged_by` of the folder before a build), a count that changed says what it was."""
    from pytest_mig.judge.noise import REFERENCE_FLOOR, REFERENCE_MAX

    store = ReferenceStore(root or SHIPPED)
    models = store.models()

    def shown(model: str, profile: str) -> str:  # "full (quick x5 66/75 judged, normal x2-3 99/124 judged)"
        ref = store.load(model_slug(model), profile)
        counts = ref.run_counts() if ref is not None else {}
        if ref is None or not counts:
            return profile
        judged = ref.judged_counts()

        def was(mode: str) -> str:
            old = (before or {}).get((model, profile, mode))
            return f" (was {old[0]}/{old[1]})" if old is not None and old != judged[mode] else ""

        modes = [f"{mode} x{count_range(lo, hi)} {judged[mode][0]}/{judged[mode][1]} judged{was(mode)}"
                 for mode, (lo, hi) in counts.items()]
        return f"{profile} ({', '.join(modes)})"

    lines = [f"references (figures with no local baseline are judged against them, in a band of at least "
             f"{REFERENCE_FLOOR:.0%}; per mode, runs (the fewest-most of any figure) and how many of its figures "
             f"are judged: those whose noise a second run of the model shows and whose band stays within "
             f"{REFERENCE_MAX:.0%}):"]
    lines += [f"  {model}: {', '.join(shown(model, p) for p in profiles)}"
              for model, profiles in models.items()] or ["  none"]
    have = {model_slug(m) for m in models}
    for name in dict.fromkeys(gpu_names):
        if model_slug(name) not in have:
            lines.append(f"  no reference for {name}: its first runs are reported, not judged, until a baseline "
                         f"is saved (pytest-mig calibrate)")
    return lines


# -- history -------------------------------------------------------------------------------------


def _kept_folders(baselines: Path | None) -> list[tuple[Path, str]]:
    """The folders whose JSON files a command's --out never replaces (:func:`pytest_mig.common.files.kept_file`)."""
    folders = [(SHIPPED, "the shipped references")]
    return folders + ([(baselines, f"the baseline folder {printable(baselines)}")] if baselines is not None else [])


def cmd_history(files: Sequence[Path], baselines: Path | None, page: Path, title: str, out: TextIO) -> int:
    """Write the trend page from results files and a baseline folder."""
    from pytest_mig.report.trend import write_page

    if not files and baselines is None:
        raise CliError("give results files, --baselines DIR, or both: the page is made from them")
    if baselines is not None and not baselines.is_dir():
        raise CliError(f"--baselines {baselines}: no such folder")
    if page.suffix.lower() not in (".html", ".htm"):
        raise CliError(f"--out {page}: the trend page is HTML, name it .html")
    output_file(str(page), "trend.html", "--out")  # a folder or a dangling link: said before anything is read
    check_output(page, "--out", _kept_folders(baselines))
    count = write_page(page, baselines, files, title)
    print(f"trend page written: {page} ({count} figure(s))", file=out)
    return 0


def cmd_samples(files: Sequence[Path], out: TextIO) -> int:
    """The samples table (:mod:`pytest_mig.report.samples`); exit 2 where no figure has runs enough."""
    from pytest_mig.report.samples import MIN_RUNS, analyse, energy_windows, lines, window_lines

    records = [r for path in files for r in read_results(path)]
    rows, windows = analyse(records), energy_windows(records)
    if not rows and not windows:
        raise CliError(f"no figure that is the median of its samples, and no energy figure, has {MIN_RUNS} runs or "
                       f"more on one GPU model, profile and case in these {len(files)} file(s): give the results files "
                       f"of repeated runs")
    for line in lines(rows) if rows else []:
        print(line, file=out)
    if windows:
        print(("\n" if rows else "") + "energy windows: the first half of each window against the whole", file=out)
        for line in window_lines(windows):
            print(line, file=out)
    return 0


# -- reference -----------------------------------------------------------------------------------


def cmd_reference(files: Sequence[Path], out_dir: Path, out: TextIO, drop: Sequence[str] = ()) -> int:
    """Add the figures of results files to a reference folder (``--mig-reference DIR`` uses it),
    after taking the figures of the ``drop`` tests out of it."""
    if not files and not drop:
        raise CliError("pytest-mig reference needs results files to add, or --drop-test to take a test out")
    before = judged_by(out_dir) if out_dir.is_dir() else {}
    try:
        built = build(files, out_dir, drop=drop)
    except UnknownTestError as exc:
        raise CliError(f"--drop-test {exc}: no figure of that test in {out_dir} or the files given, nothing was "
                       f"changed (a test id as results files write it, e.g. "
                       f"'benchmarks/test_gemm.py::test_gemm[bf16]')") from None
    for test, runs in built.dropped.items():
        print(f"dropped {test}: {runs} run(s) of its figures", file=out)
    if not built.files:
        if not files:
            print(f"{out_dir} holds no figures now", file=out)
            return 0
        print(f"no comparable figures in {len(files)} file(s); nothing written", file=out)
        return 1
    for line in reference_lines([], out_dir, before)[1:]:
        print(line, file=out)
    if built.repeated:
        print(f"{built.repeated} figure(s) not added again: their run is in the reference already (a results file "
              f"given twice)", file=out)
    print(f"reference written: {', '.join(str(p) for p in built.files)}", file=out)
    from pytest_mig.judge.reference_check import check_folder, summary

    print(summary(check_folder(out_dir)), file=out)
    return 0


def cmd_reference_check(folder: Path | None, loss: float | None, out: TextIO) -> int:
    """Each run of a reference folder judged against the others (:mod:`pytest_mig.judge.reference_check`)."""
    from pytest_mig.judge.reference_check import LOSS, check_folder, check_lines

    root = folder if folder is not None else SHIPPED
    if not root.is_dir():
        raise CliError(f"{root} is not a folder: give a reference folder (pytest-mig reference --out DIR builds one)")
    loss = LOSS if loss is None else loss
    tallies = check_folder(root, loss=loss)
    if not any(t.cases for t in tallies):
        print(f"no figure in {root} has two runs on one profile: nothing to judge one run against", file=out)
        return 1
    for line in check_lines(tallies, loss):
        print(line, file=out)
    return 1 if any(t.false_alarms for t in tallies) else 0


# -- report --------------------------------------------------------------------------------------


def _read_all(files: Sequence[Path]) -> list[ResultRecord]:
    records: list[ResultRecord] = []
    for f in files:
        records.extend(read_results(f))
    return records


def cmd_report(files: Sequence[Path], out_path: Path | None, factor: float, fail_on_outlier: bool, out: TextIO) -> int:
    if out_path is not None:
        report_format(out_path)  # a wrong suffix is said before anything is read or printed
        output_file(str(out_path), "report.md", "--out")
        check_output(out_path, "--out", _kept_folders(None))  # never a results file, history or reference
    records = _read_all(files)
    if not records:
        print(f"no metrics in {len(files)} file(s)", file=out)
        return 0
    outliers = find_outliers(records, factor)
    frame = merged_frame(records, outliers)
    if not outliers:
        frame_cols = [c for c in REPORT_COLUMNS if c != "outlier"]
    else:
        frame_cols = list(REPORT_COLUMNS)
    print(frame_table(frame, frame_cols), file=out)
    nodes = sorted({r.node for r in records})
    print(f"{len(records)} metric(s) from {len(files)} file(s), {len(nodes)} node(s): {', '.join(nodes)}", file=out)
    for o in outliers:
        print(o.line(), file=out)
    from pytest_mig.report.fleet import find_device_outliers, slices_vs_one

    # a board far off the others of its model and profile (records that name their board; a node
    # already flagged as a whole is not flagged again as its device)
    flagged = {(o.node, o.test, o.metric) for o in outliers}
    devices = [d for d in find_device_outliers(r for r in records if r.target.get("gpu_index") is not None)
               if (d.node, d.test, d.metric) not in flagged]
    for d in devices:
        print(d.line(), file=out)
    for row in slices_vs_one(records):  # Wulver's 1g.10gb:3 against 3g.40gb
        print(row.line(), file=out)
    outliers = [*outliers, *devices]
    if out_path is not None:
        write_report(out_path, frame)
        print(f"report written to {out_path}", file=out)
    return 1 if (outliers and fail_on_outlier) else 0


# -- compare -------------------------------------------------------------------------------------


def compare_records(
    old: Sequence[ResultRecord] | Sequence[Sequence[ResultRecord]],
    new: Sequence[ResultRecord],
    *,
    tolerance: float | None = None,
    improvement_fails: bool = False,
    references: ReferenceStore | None = None,
) -> list[Verdict]:
    """Each NEW record judged against the history of the same test, metric and mode in OLD, through
    the plugin's pipeline (:class:`pytest_mig.judge.pipeline.Pipeline`).

    ``old`` is one run's records or a list of runs' records, oldest first; a figure's history is
    its records on the same GPU model and profile (another one is reported as incomparable).  A
    figure with no such history is judged against ``references`` (the reference of its GPU model
    and profile, in the reference band) where one holds it, as the plugin judges a first night.  A
    figure beyond its threshold is re-judged on the re-measurements its own run took, where the
    results file holds them (the plugin records them), as the plugin would have.
    """
    runs: list[Sequence[ResultRecord]]
    runs = [old] if not old or isinstance(old[0], ResultRecord) else list(old)  # type: ignore[list-item]
    pipeline = Pipeline(RecordHistories(runs), references=references, improvement_fails=improvement_fails)
    return pipeline.judge_runs(new, tolerance=tolerance)


#: Outcomes that mean a figure was actually compared.
COMPARED = ("pass", "regressed", "improved", "noisy", "transient")


def cmd_compare(paths: Sequence[Path], tolerance: float | None, improvement_fails: bool, out: TextIO,
                reference: str | None = None) -> int:
    references = None
    if reference is not None:
        try:
            references = store_for(reference, Path.cwd())
        except ValueError as exc:
            raise CliError(f"--reference {exc}; give 'shipped' or a folder made by 'pytest-mig reference'") from None
    if len(paths) < 2 and references is None:
        raise CliError("compare needs at least two results files: the earlier ones, then the one to judge "
                       "(or one file with --reference shipped)")
    old = [read_results(p) for p in paths[:-1]]
    new = read_results(paths[-1])
    verdicts = compare_records(old, new, tolerance=tolerance, improvement_fails=improvement_fails,
                               references=references)
    frame = records_frame(new)
    print(frame_table(frame, ("test", "metric", "profile", "value", "unit", "baseline", "change_pct", "threshold_pct",
                              "verdict")), file=out)
    for v in verdicts:
        if v.outcome in ("regressed", "improved", "incomparable", "noisy"):
            print(v.line(), file=out)
    failed = [v for v in verdicts if v.failed]
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.outcome] = counts.get(v.outcome, 0) + 1
    against = f"{len(old)} earlier run(s)" + (f" and the references in {references.root}" if references else "")
    print(f"{len(verdicts)} metric(s) against {against}: "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), file=out)
    if verdicts and not any(v.outcome in COMPARED for v in verdicts):
        print(f"nothing could be compared: no figure of {paths[-1]} has a history in the earlier files"
              + (" or a reference" if references else "") + " on the same GPU model, profile and mode", file=out)
        return 1
    return 1 if failed else 0


# -- entry point ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (0 fine, 1 a regression/outlier, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    out = sys.stdout
    try:
        if args.command == "devices":
            return cmd_devices(out)
        if args.command == "report":
            return cmd_report(args.files, args.out, args.outlier_factor, args.fail_on_outlier, out)
        if args.command == "history":
            return cmd_history(args.files, args.baselines, args.out, args.title, out)
        if args.command == "reference":
            return cmd_reference(args.files, args.out, out, args.drop_test)
        if args.command == "reference-check":
            return cmd_reference_check(args.folder, args.loss, out)
        if args.command == "compare":
            return cmd_compare(args.files, args.tolerance, args.fail_on_improvement, out, args.reference)
        if args.command == "samples":
            return cmd_samples(args.files, out)
        if args.command == "calibrate":
            from pytest_mig.night.calibrate import PytestRefused, check_pytest_args, cmd_calibrate

            pytest_args = _pytest_args(args.pytest_args)
            try:
                check_pytest_args(pytest_args)
            except ValueError as exc:
                raise CliError(str(exc)) from None
            try:
                return cmd_calibrate(pytest_args, args.runs, args.baseline_dir.resolve(), args.work_dir, args.keep,
                                     out, args.shrink)
            except PytestRefused as exc:  # every run would be refused: pytest's own sentence
                raise CliError(str(exc)) from None
        if args.command == "detection":
            from pytest_mig.night.calibrate import PytestRefused
            from pytest_mig.night.detection import cmd_detection

            if args.analyse_only and not args.out.is_dir():
                raise CliError(f"--out {printable(args.out)}: no such folder (--analyse-only reads the results "
                               f"files that earlier runs left there)")
            pytest_args = [] if args.analyse_only else _pytest_args(args.pytest_args)
            try:
                return cmd_detection(pytest_args, args.unchanged, args.slow_sms, args.slow_runs, args.out,
                                     args.analyse_only, out)
            except PytestRefused as exc:
                raise CliError(str(exc)) from None
    except (ResultsFileError, BaselineError, ReportError, CliError, FileProblem) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: {exc.filename or ''}: {exc.strerror or exc}".replace(": : ", ": "), file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2  # not reached: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
