"""What the ``pytest-mig`` subcommands share: the user's-mistake exception, the argument types, the
hidden old spellings of an option, and the folders no ``--out`` replaces."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any, ClassVar, Sequence, TextIO

from pytest_mig.common.files import FileProblem, check_links, folder_holding, path_problem, writes_through
from pytest_mig.common.text import SHOWN, printable, quoted, shown
from pytest_mig.judge.reference import SHIPPED
from pytest_mig.settings import HELP_BASELINE_DIR, positive_int_arg

PROG = "pytest-mig"

#: Where a relative baseline folder given to the command is found (pytest's own option takes its rootdir).
BASELINE_DIR_HELP = (f"{HELP_BASELINE_DIR[:-1]}; a relative folder is relative to the working directory and is "
                     f"given to each pytest run as an absolute path.")

#: A count of runs, samples or SMs: the plugin's parser of such counts (1 or more).
runs_arg = positive_int_arg


class CliError(Exception):
    """A user's mistake on the command line: printed as one sentence, exit status 2."""


class Command:
    """One subcommand: its name, its arguments and what it does (``run`` returns the exit status)."""

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str]

    @classmethod
    def setup_arguments(cls, subparsers: Any) -> argparse.ArgumentParser:
        """The subcommand's parser, its arguments added by :meth:`add_arguments`."""
        parser: argparse.ArgumentParser = subparsers.add_parser(cls.name, help=cls.help, description=cls.description)
        cls.add_arguments(parser)
        return parser

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Nothing: a subcommand with arguments adds them."""

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        raise NotImplementedError


def factor_arg(text: str) -> float:
    """The outlier factor: a finite number above 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text, SHOWN)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{quoted(text, SHOWN)} is not a finite number (e.g. 1.5: 50% worse)")
    if value <= 1:
        raise argparse.ArgumentTypeError("the outlier factor must be above 1 (e.g. 1.5: 50% worse)")
    return value


def path_arg(text: str) -> Path:
    """A path argument; one no file system takes (a name over 255 bytes, a NUL byte) is a usage error
    here, not an OSError from the first call that touches it."""
    why = path_problem(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{shown(text)}: {why}")
    return Path(text)


def hidden_alias(parser: argparse.ArgumentParser, spelling: str, dest: str, **kwargs: Any) -> None:
    """An older spelling of an option that still works (same ``dest``), left out of ``--help``; its
    default is the documented spelling's."""
    parser.add_argument(spelling, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_baseline_dir(parser: argparse.ArgumentParser, default: Path | None, help: str, old: str) -> None:
    """``--mig-baseline-dir``, the plugin's spelling, and ``old``, the command's earlier one, hidden."""
    parser.add_argument("--mig-baseline-dir", dest="baseline_dir", type=path_arg, default=default, metavar="DIR",
                        help=help)
    hidden_alias(parser, old, "baseline_dir", type=path_arg, metavar="DIR")


def pytest_args(raw: Sequence[str]) -> list[str]:
    """The pytest arguments given after ``--``; none is a usage error."""
    args = list(raw)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        raise CliError("give the pytest arguments after --, e.g. -- benchmarks --mig-profile full")
    return args


def kept_folders(baselines: Path | None) -> list[tuple[Path, str]]:
    """The folders whose JSON files a command's --out never replaces (:func:`pytest_mig.common.files.kept_file`)."""
    folders = [(SHIPPED, "the shipped references")]
    return folders + ([(baselines, f"the baseline folder {printable(baselines)}")] if baselines is not None else [])


def make_out_folder(path: Path, option: str, folders: list[tuple[Path, str]]) -> None:
    """Make the missing folders of an output file's path before anything is read, so that ``--out
    reports/2026-11-26/fleet.md`` works on a first night.  Refused, one sentence (FileProblem): a link
    on the way that loops or leads nowhere (:func:`~pytest_mig.common.files.check_links`), and folders
    that would be made inside one of ``folders`` (:func:`kept_folders`: a folder there reads as a GPU
    model's), wherever a link on the way leads; nothing is made then."""
    if writes_through(path):
        return
    check_links(path)
    folder = Path(path).parent
    if folder.is_dir():
        return
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    what = folder_holding(existing, folders)
    if what is not None:
        raise FileProblem(f"{option} {printable(path)}: its folder {printable(folder)} would be made inside {what} "
                          f"({printable(Path(os.path.realpath(existing)))}), where no output goes; name another folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FileProblem(f"{option} {printable(path)}: its folder {printable(folder)} cannot be made "
                          f"({exc.strerror or exc})") from None
