"""``pytest-mig report``: results files of many runs, nodes or GPUs merged: the summary first (outlier
boards and nodes, regressions, fingerprints), the rows in the report file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence, TextIO

from pytest_mig.cli.common import Command, factor_arg, kept_folders, make_out_folder, path_arg
from pytest_mig.common.collector import collector_paused
from pytest_mig.common.files import check_output, output_file
from pytest_mig.report.tables import (
    OUTLIER_FACTOR,
    find_outliers,
    frame_table,
    merged_frame,
    report_format,
    verdict_counts,
    write_report,
)
from pytest_mig.store.bulk_read import read_report_records
from pytest_mig.report.fleet import find_device_outliers, slices_vs_one
from pytest_mig.report.fleet_summary import summary_lines

#: Columns the merged report prints on the terminal (files get every column).
REPORT_COLUMNS = ("test", "metric", "gpu", "profile", "node", "device", "value", "unit", "verdict", "outlier")
#: Without --out, a merged table of at most this many rows is printed below the summary; a larger one
#: (a fleet's) is said to need --out.
TERMINAL_ROWS = 500


def cmd_report(files: Sequence[Path], out_path: Path | None, factor: float, fail_on_outlier: bool, out: TextIO) -> int:
    """The summary first (outlier boards and nodes, regressions, fingerprints), then the rows: into
    ``out_path`` where given, else on the terminal where they are few.  The files are read by a pool of
    processes where they are many (:func:`~pytest_mig.store.bulk_read.read_report_records`)."""
    if out_path is not None:
        report_format(out_path)  # a wrong suffix is said before anything is read or printed
        output_file(str(out_path), "report.md", "--out")
        check_output(out_path, "--out", kept_folders(None))  # never a results file, history or reference
        make_out_folder(out_path, "--out", kept_folders(None))
    with collector_paused():  # a fleet's records: a million objects, no cycle among them
        return _report(files, out_path, factor, fail_on_outlier, out)


def _report(files: Sequence[Path], out_path: Path | None, factor: float, fail_on_outlier: bool, out: TextIO) -> int:
    records = read_report_records(files)
    if not records:
        print(f"no metrics in {len(files)} file(s)", file=out)
        return 0
    outliers = find_outliers(records, factor)
    # a board far off the others of its model and profile (records that name their board; a node
    # already flagged as a whole is not flagged again as its device)
    flagged = {(o.node, o.test, o.metric) for o in outliers}
    devices = [d for d in find_device_outliers(r for r in records if r.target.gpu_index is not None)
               if (d.node, d.test, d.metric) not in flagged]
    for line in summary_lines(records, len(files), outliers, devices, verdict_counts(records)):
        print(line, file=out)
    for row in slices_vs_one(records):  # Wulver's 1g.10gb:3 against 3g.40gb
        print(row.line(), file=out)
    frame = merged_frame(records, outliers, devices)
    if out_path is not None:
        write_report(out_path, frame)
        print(f"{len(frame)} row(s), one per device and figure, written to {out_path}", file=out)
    elif len(frame) <= TERMINAL_ROWS:
        cols = [c for c in REPORT_COLUMNS if c != "outlier" or outliers or devices]
        print(frame_table(frame, cols), file=out)
    else:
        print(f"{len(frame)} row(s), one per device and figure, not printed: give --out report.md "
              f"(or .csv, .json) to keep them", file=out)
    return 1 if ((outliers or devices) and fail_on_outlier) else 0


class Report(Command):
    name = "report"
    help = "merge results files from many runs or nodes into one table"
    description = "Merge pytest-mig results files into one table and flag outlier nodes."

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("files", nargs="+", type=path_arg, metavar="FILE",
                            help="results JSON files (from --mig-results)")
        parser.add_argument("--out", type=path_arg, metavar="PATH", help="write the rows, one per device and figure: .md, .csv or .json")
        parser.add_argument("--outlier-factor", type=factor_arg, default=OUTLIER_FACTOR, metavar="X",
                            help=f"flag a node X times worse than the median of the others (default {OUTLIER_FACTOR})")
        parser.add_argument("--fail-on-outlier", action="store_true", help="exit 1 when a node or a board is flagged")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        return cmd_report(args.files, args.out, args.outlier_factor, args.fail_on_outlier, out)
