"""``pytest-mig calibrate``: the suite run RUNS times (pytest ARGS), each run saved into the baseline
history; then each figure's CV, threshold, smallest detectable change and gating
(:mod:`pytest_mig.night.calibrate`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from pytest_mig.cli.common import BASELINE_DIR_HELP, CliError, Command, add_baseline_dir, hidden_alias, path_arg
from pytest_mig.cli.common import pytest_args, runs_arg
from pytest_mig.settings import HELP_KEEP, HELP_SHRINK
from pytest_mig.store.history import DEFAULT_KEEP
from pytest_mig.night import calibrate as calibration
from pytest_mig.common.text import printable
from pytest_mig.store.baselines import BaselineError


class Calibrate(Command):
    name = "calibrate"
    help = "run the suite N times into the baseline history and show thresholds"
    description = ("Run the suite RUNS times on this Target (each run its own pytest process), add every run to the "
                   "baseline history, then print per figure its run-to-run CV, threshold, smallest detectable change "
                   "and whether it gates. Put the pytest arguments after --, e.g. pytest-mig calibrate -n 10 -- "
                   "benchmarks --mig-profile 1g.10gb.")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-n", "--runs", type=runs_arg, default=DEFAULT_KEEP, help=f"runs (default {DEFAULT_KEEP})")
        add_baseline_dir(parser, Path("baselines"), BASELINE_DIR_HELP, "--baseline-dir")
        parser.add_argument("--mig-baseline-keep", dest="keep", type=runs_arg, default=None, metavar="KEEP",
                            help=HELP_KEEP)
        hidden_alias(parser, "--keep", "keep", type=runs_arg)
        parser.add_argument("--mig-baseline-shrink", dest="shrink", action="store_true", help=HELP_SHRINK)
        hidden_alias(parser, "--shrink", "shrink", action="store_true")
        parser.add_argument("--work-dir", type=path_arg, default=Path(".mig-results") / "calibrate",
                            help="each calibration's runs' results files and logs go to a new folder <time> in it, "
                                 "never over an earlier calibration's (default .mig-results/calibrate)")
        parser.add_argument("--show", action="store_true",
                            help="run nothing: print the thresholds of the histories already in the baseline folder")
        parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        if args.show:
            if args.pytest_args:
                raise CliError("--show runs nothing: give it no pytest arguments")
            if not args.baseline_dir.is_dir():
                raise CliError(f"--mig-baseline-dir {printable(args.baseline_dir)}: no such folder")
            try:
                return calibration.cmd_show(args.baseline_dir, out)
            except BaselineError as exc:
                raise CliError(str(exc)) from None
        given = pytest_args(args.pytest_args)
        try:
            calibration.check_pytest_args(given)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        try:  # the folder as the working directory names it, whatever rootdir each run's pytest finds
            return calibration.cmd_calibrate(given, args.runs, args.baseline_dir.resolve(), args.work_dir, args.keep,
                                             out, args.shrink)
        except calibration.PytestRefused as exc:  # every run would be refused: pytest's own sentence
            raise CliError(str(exc)) from None
