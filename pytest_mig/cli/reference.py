"""``pytest-mig reference``: results files' figures added to a reference folder (the form of the
shipped references; ``--mig-reference DIR`` uses one), and the lines that say which GPU models have
references (``pytest-mig devices`` prints them too)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence, TextIO

from pytest_mig.cli.common import CliError, Command, path_arg
from pytest_mig.common.text import printable
from pytest_mig.device.profiles import model_slug
from pytest_mig.judge.reference import SHIPPED, Drop, ReferenceStore, UnknownTestError, build, count_range, drop_label
from pytest_mig.judge.reference_check import check_folder, summary
from pytest_mig.judge.noise import REFERENCE_FLOOR, REFERENCE_MAX


def judged_by(root: Path) -> dict[tuple[str, str, str], tuple[int, int]]:
    """Per (GPU model, profile, mode) of a reference folder: its figures judged and held."""
    store = ReferenceStore(root)
    return {(model, profile, mode): n
            for model, profiles in store.models().items() for profile in profiles
            for mode, n in store.load(model_slug(model), profile).judged_counts().items()}  # type: ignore[union-attr]


def reference_lines(gpu_names: Sequence[str], root: Path | None = None,
                    before: dict[tuple[str, str, str], tuple[int, int]] | None = None) -> list[str]:
    """Which GPU models have shipped references (first-night verdicts), and whether this machine's do.
    With ``before`` (:func:`judged_by` of the folder before a build), a count that changed says what it was."""

    store = ReferenceStore(root or SHIPPED)
    models = store.models()

    def shown(model: str, profile: str) -> str:  # "full (quick x5 66/75 judged, normal x2-3 99/124 judged)"
        ref = store.load(model_slug(model), profile)
        counts = ref.run_counts() if ref is not None else {}
        if ref is None or not counts:
            return profile
        judged = ref.judged_counts()

        def was(mode: str) -> str:
            old = (before or {}).get((model, profile, mode))
            return f" (was {old[0]}/{old[1]})" if old is not None and old != judged[mode] else ""

        modes = [f"{mode} x{count_range(lo, hi)} {judged[mode][0]}/{judged[mode][1]} judged{was(mode)}"
                 for mode, (lo, hi) in counts.items()]
        return f"{profile} ({', '.join(modes)})"

    lines = [f"references (figures with no local baseline are judged against them, in a band of at least "
             f"{REFERENCE_FLOOR:.0%}; per mode, runs (the fewest-most of any figure) and how many of its figures "
             f"are judged: those whose noise a second run of the model shows and whose band stays within "
             f"{REFERENCE_MAX:.0%}):"]
    lines += [f"  {model}: {', '.join(shown(model, p) for p in profiles)}"
              for model, profiles in models.items()] or ["  none"]
    have = {model_slug(m) for m in models}
    for name in dict.fromkeys(gpu_names):
        if model_slug(name) not in have:
            lines.append(f"  no reference for {name}: its first runs' compute and bandwidth figures are judged against "
                         f"the device's own ceiling where its architecture's rates are known, the others reported, "
                         f"not judged, until a baseline is saved (pytest-mig calibrate)")
    return lines


def cmd_reference(files: Sequence[Path], out_dir: Path, out: TextIO, drop: Sequence[Drop] = ()) -> int:
    """Add the figures of results files to a reference folder (``--mig-reference DIR`` uses it),
    after taking the ``drop`` tests' figures (or single figures: test id, name) out of it."""
    if not files and not drop:
        raise CliError("pytest-mig reference needs results files to add, or --drop-test (--drop-figure) to take a "
                       "test (a figure) out")
    before = judged_by(out_dir) if out_dir.is_dir() else {}
    try:
        built = build(files, out_dir, drop=drop)
    except UnknownTestError as exc:
        gone = exc.args[0]
        flag, what = ("--drop-test", "no figure of that test") if isinstance(gone, str) else ("--drop-figure", "no such figure")
        raise CliError(f"{flag} {printable(drop_label(gone))}: {what} in {out_dir} or the files given, nothing was "
                       f"changed (a test id as results files write it, e.g. "
                       f"'benchmarks/test_gemm.py::test_gemm[bf16]', then a figure's name for --drop-figure)") from None
    for gone, runs in built.dropped.items():
        print(f"dropped {printable(drop_label(gone))}: {runs} run(s)" + (" of its figures" if isinstance(gone, str) else ""),
              file=out)
    if not built.files:
        if not files or any(built.dropped.values()):
            print(f"{out_dir} holds no figures now", file=out)
            return 0
        print(f"no comparable figures in {len(files)} file(s); nothing written", file=out)
        return 1
    for line in reference_lines([], out_dir, before)[1:]:
        print(line, file=out)
    if built.repeated:
        print(f"{built.repeated} figure(s) not added again: their run is in the reference already (a results file "
              f"given twice)", file=out)
    print(f"reference written: {', '.join(str(p) for p in built.files)}", file=out)

    print(summary(check_folder(out_dir)), file=out)
    return 0


class Reference(Command):
    name = "reference"
    help = "build a reference folder from results files"
    description = ("Add the figures of results files (oldest first) to a reference folder, the form pytest-mig ships "
                   "its references in: a first run with no local baseline is judged against it (--mig-reference "
                   "DIR). The boards' UUIDs are left out; each figure's run-to-run sigma is pooled over the model's "
                   "profiles.")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("files", nargs="*", type=path_arg, metavar="FILE",
                            help="results JSON files (from --mig-results)")
        parser.add_argument("--out", type=path_arg, required=True, metavar="DIR", help="the reference folder to add to")
        parser.add_argument("--drop-test", action="append", default=[], metavar="TEST",
                            help="take this test's figures out of the folder and leave them out of the files (a test "
                                 "whose definition changed); its id as results files write it; may be repeated")
        parser.add_argument("--drop-figure", nargs=2, action="append", default=[], metavar=("TEST", "FIGURE"),
                            help="the same for one figure of a test (e.g. 'benchmarks/test_gemm.py::test_gemm[bf16]' "
                                 "bf16_tflops); may be repeated")

    @classmethod
    def run(cls, args: argparse.Namespace, out: TextIO) -> int:
        return cmd_reference(args.files, args.out, out, [*args.drop_test, *map(tuple, args.drop_figure)])
