"""``pytest-mig samples``: how many samples each figure needs, from repeated runs' results files
(:mod:`pytest_mig.report.samples`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence, TextIO

from pytest_mig.cli.common import CliError, Command, path_arg
from pytest_mig.store.results import read_results
from pytest_mig.report.samples import MIN_RUNS, analyse, energy_windows, lines, window_lines


def cmd_samples(files: Sequence[Path], out: TextIO) -> int:
    """The samples table (:mod:`pytest_mig.report.samples`); exit 2 where no figure has runs enough."""

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


class Samples(Command):
    name = "samples"
    help = "how many samples each figure needs, from repeated runs' results files"
    description = ("For each figure that is the median of its samples, the run-to-run CV as if only the first k "
                   "samples had been measured, pooled over GPU models, profiles and cases, and the fewest samples "
                   "whose CV keeps the threshold (docs/benchmarks.md, 'The night's time').")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("files", nargs="+", type=path_arg, metavar="FILE",
                            help="results JSON files of repeated runs (a calibration's, or a reference's)")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        return cmd_samples(args.files, out)
