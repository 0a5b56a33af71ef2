"""``pytest-mig reference-check``: each run of a reference folder judged against the others
(:mod:`pytest_mig.judge.reference_check`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from pytest_mig.cli.common import CliError, Command, path_arg
from pytest_mig.judge.reference import SHIPPED
from pytest_mig.settings import tolerance_arg
from pytest_mig.judge.reference_check import LOSS, check_folder, check_lines


def cmd_reference_check(folder: Path | None, loss: float | None, out: TextIO) -> int:
    """Each run of a reference folder judged against the others (:mod:`pytest_mig.judge.reference_check`)."""

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


class ReferenceCheck(Command):
    name = "reference-check"
    help = "judge each run of a reference folder against the others"
    description = ("Take each run of each figure out of the reference folder in turn and judge it against the rest, "
                   "as a first night is judged: an unchanged GPU of the model, so a failure is a false alarm. Then "
                   "the same run after a loss: how many such losses fail. Exit 1 where a false alarm is found.")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("folder", nargs="?", type=path_arg, default=None, metavar="DIR",
                            help="the reference folder (default: the references shipped with pytest-mig)")
        parser.add_argument("--loss", type=tolerance_arg, default=None, metavar="PCT",
                            help="the loss applied to each run, e.g. 15%% (default) or 0.1")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        return cmd_reference_check(args.folder, args.loss, out)
