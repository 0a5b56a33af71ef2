"""``pytest-mig history``: the trend page, every figure over the runs, its band, verdicts and
fingerprint changes (one static HTML file, no network needed to open it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence, TextIO

from pytest_mig.cli.common import CliError, Command, add_baseline_dir, kept_folders, make_out_folder, path_arg
from pytest_mig.common.files import check_output, output_file
from pytest_mig.report.trend import write_page


def cmd_history(files: Sequence[Path], baselines: Path | None, page: Path, title: str, out: TextIO) -> int:
    """Write the trend page from results files and a baseline folder.  A folder with no history yet
    is accepted (an empty one, the repository's own ``baselines/``, or with results files, one that
    no save has made yet); a missing folder with nothing else to draw from is an error."""

    if not files and baselines is None:
        raise CliError("give results files, --mig-baseline-dir DIR, or both: the page is made from them")
    if baselines is not None and not baselines.is_dir():
        if baselines.exists():
            raise CliError(f"--mig-baseline-dir {baselines}: not a folder")
        if not files:
            raise CliError(f"--mig-baseline-dir {baselines}: no such folder")
        # no run saved yet (the folder is made by the first save): the results files alone
        print(f"--mig-baseline-dir {baselines}: no such folder yet, so no history: the page shows the results "
              f"files only", file=out)
        baselines = None
    if page.suffix.lower() not in (".html", ".htm"):
        raise CliError(f"--out {page}: the trend page is HTML, name it .html")
    output_file(str(page), "trend.html", "--out")  # a folder or a dangling link: said before anything is read
    check_output(page, "--out", kept_folders(baselines))
    make_out_folder(page, "--out", kept_folders(baselines))
    count = write_page(page, baselines, files, title)
    print(f"trend page written: {page} ({count} figure(s))", file=out)
    return 0


class History(Command):
    name = "history"
    help = "write the trend page of every figure (one static HTML file)"
    description = ("Write one static HTML page (no network needed to open it) with every figure's values over the "
                   "runs, the band each run was judged against, its verdict and the fingerprint changes on the time "
                   "axis, grouped by GPU model, profile and test, with what regressed in the latest run at the top.")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("files", nargs="*", type=path_arg, metavar="FILE",
                            help="results JSON files (from --mig-results)")
        add_baseline_dir(parser, None, "also the runs kept in this baseline folder "
                                       "(e.g. baselines; relative to the working directory)", "--baselines")
        parser.add_argument("--out", type=path_arg, required=True, metavar="PAGE", help="the HTML file to write")
        parser.add_argument("--title", default="pytest-mig trend", help="the page's title")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        return cmd_history(args.files, args.baseline_dir, args.out, args.title, out)
