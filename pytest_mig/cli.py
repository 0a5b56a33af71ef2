"""The ``pytest-mig`` command: what is not a test run.

    pytest-mig devices                       GPUs, MIG instances and this GPU's profiles (no GPU: says so)
    pytest-mig report FILES... [--out PATH]  merge results files of many runs/nodes into one table,
                                             flagging a node far worse than the others
    pytest-mig compare OLD NEW               per metric change and verdict between two results files;
                                             exit 1 when something regressed

Bad input (a missing file, corrupt JSON, an unknown report suffix) is one sentence on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence, TextIO

from .baselines import DEFAULT_TOLERANCE, BaselineError, entry_from_record, meta_from_record
from .report import (
    OUTLIER_FACTOR,
    ReportError,
    find_outliers,
    frame_table,
    merged_frame,
    records_frame,
    report_format,
    write_report,
)
from .results import ResultRecord, ResultsFileError, read_results
from .verdict import Verdict, compare, format_number, parse_tolerance

PROG = "pytest-mig"

#: Columns the merged report prints on the terminal (files get every column).
REPORT_COLUMNS = ("test", "metric", "gpu", "profile", "node", "value", "unit", "verdict", "outlier")


class CliError(Exception):
    """A user's mistake on the command line: printed as one sentence, exit status 2."""


def _tolerance_arg(text: str) -> float:
    try:
        return parse_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _factor_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if value <= 1:
        raise argparse.ArgumentTypeError("the outlier factor must be above 1 (e.g. 1.5: 50% worse)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="pytest-mig: MIG-aware GPU benchmarks, reports and comparisons.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("devices", help="list GPUs, MIG instances and this GPU's profiles",
                   description="List the GPUs NVML sees, their MIG instances and profiles. Works without a GPU.")

    rep = sub.add_parser("report", help="merge results files from many runs or nodes into one table",
                         description="Merge pytest-mig results files into one table and flag outlier nodes.")
    rep.add_argument("files", nargs="+", type=Path, metavar="FILE", help="results JSON files (from --mig-results)")
    rep.add_argument("--out", type=Path, metavar="PATH", help="also write the table: .md, .csv or .json")
    rep.add_argument("--outlier-factor", type=_factor_arg, default=OUTLIER_FACTOR, metavar="X",
                     help=f"flag a node X times worse than the median of the others (default {OUTLIER_FACTOR})")
    rep.add_argument("--fail-on-outlier", action="store_true", help="exit 1 when a node is flagged")

    cmp_ = sub.add_parser("compare", help="compare two results files metric by metric",
                          description="Judge NEW against OLD as a baseline, metric by metric; exit 1 on a regression.")
    cmp_.add_argument("old", type=Path, metavar="OLD", help="the results file to compare against")
    cmp_.add_argument("new", type=Path, metavar="NEW", help="the results file to judge")
    cmp_.add_argument("--tolerance", type=_tolerance_arg, default=None, metavar="PCT",
                      help=f"allowed change, e.g. 5%% or 0.05 (default {DEFAULT_TOLERANCE:.0%})")
    cmp_.add_argument("--fail-on-improvement", action="store_true",
                      help="also exit 1 when a metric improved beyond the tolerance (a stale baseline)")
    return parser


# -- devices -------------------------------------------------------------------------------------


def cmd_devices(out: TextIO) -> int:
    """Describe what NVML sees; without a GPU or driver it says so and succeeds."""
    try:
        from .nvml import describe_inventory, discover
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
    return 0


# -- report --------------------------------------------------------------------------------------


def _read_all(files: Sequence[Path]) -> list[ResultRecord]:
    records: list[ResultRecord] = []
    for f in files:
        records.extend(read_results(f))
    return records


def cmd_report(files: Sequence[Path], out_path: Path | None, factor: float, fail_on_outlier: bool, out: TextIO) -> int:
    if out_path is not None:
        report_format(out_path)  # a wrong suffix is said before anything is read or printed
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
    if out_path is not None:
        write_report(out_path, frame)
        print(f"report written to {out_path}", file=out)
    return 1 if (outliers and fail_on_outlier) else 0


# -- compare -------------------------------------------------------------------------------------


def compare_records(
    old: Sequence[ResultRecord],
    new: Sequence[ResultRecord],
    *,
    tolerance: float | None = None,
    improvement_fails: bool = False,
) -> list[Verdict]:
    """Each NEW record judged against the OLD record of the same test and metric (the one on the
    same GPU model and profile when several; another one is reported as incomparable)."""
    by_key: dict[tuple[str, str], list[ResultRecord]] = {}
    for r in old:
        by_key.setdefault(r.key, []).append(r)
    verdicts = []
    for rec in new:
        candidates = by_key.get(rec.key, [])
        mine = meta_from_record(rec)
        match = next((c for c in candidates if (meta_from_record(c).gpu_slug, meta_from_record(c).profile)
                      == (mine.gpu_slug, mine.profile)), candidates[0] if candidates else None)
        if match is None:
            v = compare(rec, None, None)
            if v.outcome == "no-baseline":
                v.message = f"{rec.metric.name} {format_number(rec.metric.value)} {rec.metric.unit}: not in the old file"
        else:
            v = compare(rec, entry_from_record(match), meta_from_record(match), tolerance=tolerance,
                        improvement_fails=improvement_fails)
        rec.verdict = v.to_dict()
        verdicts.append(v)
    return verdicts


def cmd_compare(old_path: Path, new_path: Path, tolerance: float | None, improvement_fails: bool, out: TextIO) -> int:
    old, new = read_results(old_path), read_results(new_path)
    verdicts = compare_records(old, new, tolerance=tolerance, improvement_fails=improvement_fails)
    frame = records_frame(new)
    print(frame_table(frame, ("test", "metric", "profile", "value", "unit", "baseline", "change_pct", "verdict")), file=out)
    for v in verdicts:
        if v.outcome in ("regressed", "improved", "incomparable"):
            print(v.line(), file=out)
    failed = [v for v in verdicts if v.failed]
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.outcome] = counts.get(v.outcome, 0) + 1
    print(f"{len(verdicts)} metric(s): " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), file=out)
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
        if args.command == "compare":
            return cmd_compare(args.old, args.new, args.tolerance, args.fail_on_improvement, out)
    except (ResultsFileError, BaselineError, ReportError, CliError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: {exc.filename or ''}: {exc.strerror or exc}".replace(": : ", ": "), file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2  # not reached: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
