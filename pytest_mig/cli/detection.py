"""``pytest-mig detection``: the detection-power experiment of docs/detection.md
(:mod:`pytest_mig.night.detection`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from pytest_mig.cli.common import CliError, Command, path_arg, pytest_args, runs_arg
from pytest_mig.common.text import printable
from pytest_mig.night.detection import cmd_detection
from pytest_mig.night.calibrate import PytestRefused


class Detection(Command):
    name = "detection"
    help = "measure false alarms and detection on this GPU (docs/detection.md)"
    description = ("The detection-power experiment: UNCHANGED runs saved one after the other into a fresh baseline "
                   "history (each judged against the runs before it), then runs slowed on purpose to fewer SMs "
                   "judged against that history, then a replay that scales recorded runs; writes OUT/detection.md.")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--unchanged", type=runs_arg, default=15, help="unchanged runs (default 15)")
        parser.add_argument("--slow-sms", type=runs_arg, action="append", default=[], metavar="SMS",
                            help="also run slowed to this many SMs (repeatable)")
        parser.add_argument("--slow-runs", type=runs_arg, default=3, help="runs per --slow-sms (default 3)")
        parser.add_argument("--out", type=path_arg, default=Path(".mig-results") / "detection", help="working folder")
        parser.add_argument("--analyse-only", action="store_true", help="only replay the results files already in --out")
        parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        if args.analyse_only and not args.out.is_dir():
            raise CliError(f"--out {printable(args.out)}: no such folder (--analyse-only reads the results "
                           f"files that earlier runs left there)")
        given = [] if args.analyse_only else pytest_args(args.pytest_args)
        try:
            return cmd_detection(given, args.unchanged, args.slow_sms, args.slow_runs, args.out, args.analyse_only,
                                 out)
        except PytestRefused as exc:
            raise CliError(str(exc)) from None
