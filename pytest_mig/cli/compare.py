"""``pytest-mig compare``: the last results file judged against the history the earlier ones make
(oldest first), with the plugin's rule and its options; with ``--mig-reference``, a figure with no such history is
judged against the reference of its GPU model and profile, as a first night is."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence, TextIO

from pytest_mig.cli.common import CliError, Command, path_arg
from pytest_mig.judge.ceiling import Ceilings
from pytest_mig.judge.pipeline import Pipeline, RecordHistories
from pytest_mig.judge.reference import ReferenceStore, store_for, window_temperatures
from pytest_mig.store.verdicts import Verdict
from pytest_mig.report.tables import frame_table, records_frame, sharpness_line
from pytest_mig.options import add_judging_options
from pytest_mig.settings import REFERENCE_VALUES
from pytest_mig.store.results import ResultRecord, read_results


def compare_records(
    old: Sequence[ResultRecord] | Sequence[Sequence[ResultRecord]],
    new: Sequence[ResultRecord],
    *,
    tolerance: float | None = None,
    improvement_fails: bool = False,
    references: ReferenceStore | None = None,
) -> list[Verdict]:
    """Each NEW record judged against the history of the same test, metric and mode in OLD, through
    the plugin's pipeline (:class:`pytest_mig.judge.pipeline.Pipeline`).

    ``old`` is one run's records or a list of runs' records, oldest first; a figure's history is
    its records on the same GPU model and profile (another one is reported as incomparable).  A
    figure with no such history is judged against ``references`` (the reference of its GPU model
    and profile, in the reference band) where one holds it, else, given ``references``, a compute or
    bandwidth figure against its device's ceiling, as the plugin judges a first night.  A
    figure beyond its threshold is re-judged on the re-measurements its own run took, where the
    results file holds them (the plugin records them), as the plugin would have.
    """
    runs: list[Sequence[ResultRecord]]
    runs = [old] if not old or isinstance(old[0], ResultRecord) else list(old)  # type: ignore[list-item]
    pipeline = Pipeline(RecordHistories(runs), references=references, improvement_fails=improvement_fails,
                        ceilings=Ceilings() if references is not None else None)
    return pipeline.judge_runs(new, tolerance=tolerance)


def cmd_compare(paths: Sequence[Path], tolerance: float | None, improvement_fails: bool, out: TextIO,
                reference: str | None = None) -> int:
    references = None
    if reference is not None:
        try:
            references = store_for(reference, Path.cwd())
        except ValueError as exc:
            raise CliError(f"--mig-reference {exc}; give 'shipped' or a folder made by 'pytest-mig reference'") from None
    if len(paths) < 2 and references is None:
        raise CliError("compare needs at least two results files: the earlier ones, then the one to judge "
                       "(or one file with --mig-reference shipped)")
    old = [window_temperatures(read_results(p)) for p in paths[:-1]]  # as the replay and reference builds read them
    new = window_temperatures(read_results(paths[-1]))
    verdicts = compare_records(old, new, tolerance=tolerance, improvement_fails=improvement_fails,
                               references=references)
    frame = records_frame(new)
    print(frame_table(frame, ("test", "metric", "profile", "value", "unit", "baseline", "change_pct", "threshold_pct",
                              "verdict")), file=out)
    for v in verdicts:
        if v.outcome in ("regressed", "improved", "incomparable", "noisy"):
            print(v.line(), file=out)
    failed = [v for v in verdicts if v.failed]
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.outcome] = counts.get(v.outcome, 0) + 1
    against = f"{len(old)} earlier run(s)" + (f" and the references in {references.root}" if references else "")
    sharp = sharpness_line(new, tolerance)
    if sharp:
        print(sharp, file=out)
    print(f"{len(verdicts)} metric(s) against {against}: "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), file=out)
    if verdicts and not any(v.judged for v in verdicts):
        where = " or a reference" if references else ""
        why = (f"each figure of {paths[-1]} is incomparable (the reasons above) or has no history in the earlier files"
               f"{where}" if "incomparable" in counts else f"no figure of {paths[-1]} has a history in the earlier "
               f"files{where} on the same GPU model, profile and mode")
        print(f"nothing could be compared: {why}", file=out)
        return 1
    return 1 if failed else 0


class Compare(Command):
    name = "compare"
    help = "judge a results file against the history of earlier ones"
    description = ("Judge the last results file against the history the earlier ones make (oldest first), with the "
                   "plugin's rule; exit 1 on a regression, or when nothing could be compared. With --mig-reference, a "
                   "figure with no history in the earlier files is judged against the reference for its GPU model "
                   "and profile, as the plugin judges a first night.")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("files", nargs="+", type=path_arg, metavar="FILE",
                            help="OLD1 [OLD2 ...] NEW: earlier results files, then the one to judge "
                                 "(with --mig-reference, NEW alone will do)")
        add_judging_options(parser.add_argument, prefix="", reference_help=(
            f"judge figures with no earlier history against references (default: none): {REFERENCE_VALUES}"))

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        return cmd_compare(args.files, args.tolerance, args.fail_on_improvement, out, args.reference)
