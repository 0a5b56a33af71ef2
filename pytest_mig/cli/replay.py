"""``pytest-mig replay``: the verdict rule replayed over recorded nights (:mod:`pytest_mig.night.replay`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from pytest_mig.cli.common import CliError, Command, path_arg
from pytest_mig.common.text import printable
from pytest_mig.night.replay import cmd_replay


class Replay(Command):
    name = "replay"
    help = "replay the verdicts over recorded unchanged nights: false alarms and 5%% losses caught, night by night"
    description = ("Judges every recorded night of each board against that board's earlier nights, with priors "
                   "from the other boards only (leave-one-out), then the same nights made 5% worse; prints one row "
                   "per history length (docs/detection.md).")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", type=path_arg, metavar="PATH",
                            help="results files, or folders searched for them")
        parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                            help="leave out files whose path matches GLOB (repeatable)")
        parser.add_argument("--exclude-test", action="append", default=[], metavar="TEXT",
                            help="leave out the figures of tests whose id contains TEXT, e.g. a workload the suite "
                                 "has since replaced: 'qwen1.5b-full-fixed]' (repeatable)")
        parser.add_argument("--priors", choices=("within-boards", "across-boards"), default="within-boards",
                            help="the priors' noise: each other board's runs about its own median, as the plugin "
                                 "judges a history of one board (default), or each profile's runs over the other "
                                 "boards")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        missing = [p for p in args.paths if not Path(p).exists()]
        if missing:
            raise CliError(f"{printable(missing[0])}: no such file or folder")
        return cmd_replay(args.paths, args.exclude, out, args.priors == "within-boards", args.exclude_test)
