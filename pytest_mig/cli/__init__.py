"""The ``pytest-mig`` command: what is not a test run.

    pytest-mig devices                       GPUs, MIG instances and this GPU's profiles (no GPU: says so)
    pytest-mig report FILES... [--out PATH]  merge results files of many runs/nodes into one table,
                                             flagging a node far worse than the others
    pytest-mig compare OLD... NEW            judge NEW's figures against the history the OLD results
                                             files make (oldest first), with the plugin's rule;
                                             exit 1 on a regression or when nothing could be compared
    pytest-mig compare --mig-reference shipped [OLD...] NEW
                                             figures with no history in OLD judged against the
                                             reference (shipped, or a folder), as a first night is
    pytest-mig reference FILES... --out DIR  add results files' figures to a reference folder (the form
                                             of the shipped references; --mig-reference DIR uses one);
                                             --drop-test TEST takes a test whose definition changed out
    pytest-mig reference-check [DIR]         judge each run of a reference folder against the others
    pytest-mig history FILES... [--mig-baseline-dir DIR] --out PAGE.html
                                             the trend page: every figure over the runs, its band,
                                             verdicts and fingerprint changes (static, no network)
    pytest-mig samples FILES...              how many samples each figure needs
    pytest-mig calibrate [-n RUNS] -- ARGS   run the suite RUNS times (pytest ARGS), each run saved
                                             into the baseline history; then each figure's CV,
                                             threshold, smallest detectable change and gating
    pytest-mig detection -- ARGS             the detection-power experiment of docs/detection.md

Each subcommand is a :class:`pytest_mig.cli.common.Command` in a module of its own, listed in
:data:`COMMANDS`; the parser is built from that table and a command is run by looking it up.
Bad input (a missing file, corrupt JSON, an unknown report suffix) is one sentence on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from pytest_mig.cli.calibrate import Calibrate
from pytest_mig.cli.common import PROG, CliError, Command
from pytest_mig.cli.compare import Compare, cmd_compare, compare_records
from pytest_mig.cli.detection import Detection
from pytest_mig.cli.devices import Devices, cmd_devices
from pytest_mig.cli.history import History, cmd_history
from pytest_mig.cli.reference import Reference, cmd_reference, judged_by, reference_lines
from pytest_mig.cli.reference_check import ReferenceCheck, cmd_reference_check
from pytest_mig.cli.replay import Replay
from pytest_mig.cli.report import REPORT_COLUMNS, Report, cmd_report
from pytest_mig.cli.samples import Samples, cmd_samples
from pytest_mig.common.files import FileProblem
from pytest_mig.report.tables import ReportError
from pytest_mig.store.history import BaselineError
from pytest_mig.store.results import ResultsFileError

__all__ = [
    "COMMANDS", "PROG", "REPORT_COLUMNS", "CliError", "build_parser", "cmd_compare", "cmd_devices",
    "cmd_history", "cmd_reference", "cmd_reference_check", "cmd_report", "cmd_samples", "compare_records",
    "judged_by", "main", "reference_lines",
]

#: Every subcommand by its name, in the order ``pytest-mig --help`` lists them.
COMMANDS: dict[str, type[Command]] = {c.name: c for c in (
    Devices, Report, Compare, Reference, ReferenceCheck, History, Samples, Calibrate, Detection, Replay)}

#: What a user's mistake raises: printed as one sentence, exit status 2.
USAGE_ERRORS = (ResultsFileError, BaselineError, ReportError, CliError, FileProblem)


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: one subparser per entry of :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(prog=PROG, description="pytest-mig: MIG-aware GPU benchmarks, reports and comparisons.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.setup_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (0 fine, 1 a regression/outlier, 2 bad input)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args, sys.stdout)
    except USAGE_ERRORS as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: {exc.filename or ''}: {exc.strerror or exc}".replace(": : ", ": "), file=sys.stderr)
        return 2
