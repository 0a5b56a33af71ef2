"""``pytest-mig calibrate``: run the suite N times on this Target and record every run into the
baseline history, then show what the history says of each figure (its run-to-run CV, the threshold
that follows, the smallest change it can detect, and whether it gates).

What an admin runs once after install, and again after a hardware change.  Each run is a separate
``python -m pytest`` process (an argument list, never a shell string), so each one is a fresh
process like a nightly run: run-to-run noise includes process start, cuBLAS heuristics, clocks
and temperature, which one process's repeats would not.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Sequence, TextIO

from pytest_mig.judge.verdict import DEFAULT_TOLERANCE, format_number
from pytest_mig.store.baselines import BaselineStore, meta_from_record
from pytest_mig.store.history import Baseline, BaselineError, board_of
from pytest_mig.store.reader import load_baseline_file
from pytest_mig.common.files import FileProblem
from pytest_mig.judge.noise import PRIOR_RUNS, REFERENCE_PRIORS, Band, band
from pytest_mig.judge.prior import Priors
from pytest_mig.judge.reference import Reference, ReferenceStore
from pytest_mig.store.results import ResultsFileError, read_results, read_results_file
from pytest_mig.common.text import printable
from pytest_mig.night.nights import gates_nothing
import statistics
import datetime as _dt

#: Options calibrate sets itself; given in the pytest arguments they would fight it.
OWN_OPTIONS = ("--mig-save-baseline", "--mig-save-if-passed", "--mig-results", "--mig-baseline-dir", "--mig-slowdown-sms",
               "--mig-baseline-keep", "--mig-baseline-shrink")


#: pytest's exit status when it refuses its arguments or options (pytest.ExitCode.USAGE_ERROR).
PYTEST_USAGE_ERROR = 4


class PytestRefused(ValueError):
    """pytest refused the arguments it was given (exit 4): every run would; one sentence, its own."""


@dataclass
class SuiteRun:
    """One run of the suite in its own process."""

    index: int
    returncode: int
    seconds: float
    results: Path

    def refusal(self, cmd: Sequence[str]) -> str:
        """Why pytest would not start, as it said it (its ``...: error: ...`` or ``ERROR: ...`` line in
        the run's log, escaped), or where to see it."""
        try:
            lines = [ln.strip() for ln in self.results.with_suffix(".log").read_text(errors="replace").splitlines()]
        except OSError:
            lines = []
        said = next((ln.split(": error: ", 1)[1] for ln in lines if ": error: " in ln),  # argparse's, after its usage
                    next((ln.removeprefix("ERROR:") for ln in lines if ln.startswith("ERROR:")), ""))
        if said.strip():
            return printable(said.strip())
        return f"run the command by hand to see why: {printable(' '.join(cmd))}"

    def check(self, cmd: Sequence[str]) -> None:
        """PytestRefused where pytest refused its arguments."""
        if self.returncode == PYTEST_USAGE_ERROR:
            raise PytestRefused(f"pytest refused its arguments (exit 4): {self.refusal(cmd)}")


def pytest_command(pytest_args: Sequence[str], *extra: str) -> list[str]:
    """``python -m pytest ARGS EXTRA`` as an argument list for subprocess."""
    return [sys.executable, "-m", "pytest", *pytest_args, *extra]


def run_suite(pytest_args: Sequence[str], results: Path, *extra: str, index: int = 0,
              runner: Callable[[list[str]], int] | None = None) -> SuiteRun:
    """Run the suite once, writing its results to ``results`` and its output to ``results`` with the
    suffix ``.log``; returns the exit status and time."""
    cmd = pytest_command(pytest_args, "--mig-results", str(results), *extra)
    start = time.monotonic()
    if runner is not None:
        rc = runner(cmd)
    else:  # the run's own output goes to a log beside its results file
        results.parent.mkdir(parents=True, exist_ok=True)
        with open(results.with_suffix(".log"), "w", encoding="utf-8") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    return SuiteRun(index, rc, time.monotonic() - start, results)


def check_pytest_args(pytest_args: Sequence[str]) -> None:
    """Refuse options calibrate sets itself (one sentence, before any run starts)."""
    for arg in pytest_args:
        name = arg.split("=", 1)[0]
        if name in OWN_OPTIONS:
            raise ValueError(f"{name} is set by pytest-mig itself here; leave it out of the pytest arguments")
        if name == "--mig-window":
            raise ValueError("--mig-window leaves tests out of a night, and each run here must run them all; "
                             "leave it out of the pytest arguments")


def calibration_folder(work_dir: Path) -> Path:
    """A new folder for one calibration's files, ``<work_dir>/<UTC time>`` (``-2``, ``-3`` ... after
    it where another calibration made that one in the same second): made here, exclusively, so that a
    second calibration never writes over the first one's results files and logs."""

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            folder = work_dir / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            return folder
    except OSError as exc:
        raise FileProblem(f"--work-dir {printable(str(work_dir))}: no folder for this calibration's files can be "
                          f"made there ({exc.strerror or exc}); nothing was run") from None
    raise FileProblem(f"--work-dir {printable(str(work_dir))}: a thousand calibrations started there in one second; "
                      f"nothing was run")


def calibrate(pytest_args: Sequence[str], runs: int, baseline_dir: Path, work_dir: Path, *,
              keep: int | None = None, shrink: bool = False, out: TextIO = sys.stdout,
              runner: Callable[[list[str]], int] | None = None) -> list[SuiteRun]:
    """Run the suite ``runs`` times, each saved into the baseline history; progress goes to ``out``.
    Each run's results file and log go to a new folder of ``work_dir`` (:func:`calibration_folder`)."""
    check_pytest_args(pytest_args)
    work_dir = calibration_folder(work_dir)
    print(f"calibrate: each run's results file and log go to {printable(str(work_dir))}", file=out, flush=True)
    extra = ["--mig-save-baseline", "--mig-baseline-dir", str(baseline_dir)]
    if keep is not None:
        extra += ["--mig-baseline-keep", str(keep)]
    if shrink:
        extra += ["--mig-baseline-shrink"]
    done: list[SuiteRun] = []
    for i in range(1, runs + 1):
        print(f"calibrate: run {i}/{runs} ...", file=out, flush=True)
        results = work_dir / f"calibrate-{i:02d}.json"
        # the working folder holds the latest calibration's runs: an earlier calibration's file of this
        # number (its figures already in the history) is removed, as --mig-results never replaces one
        results.unlink(missing_ok=True)
        r = run_suite(pytest_args, results, *extra, index=i, runner=runner)
        state = ("ok" if r.returncode == 0 else f"exit {r.returncode}: its failed tests' figures were not saved"
                 if r.returncode == 1 else f"exit {r.returncode}")
        eta = (runs - i) * r.seconds
        print(f"calibrate: run {i}/{runs} done in {r.seconds:.0f} s ({state}); about {eta:.0f} s to go",
              file=out, flush=True)
        done.append(r)
        r.check(pytest_command(pytest_args))  # a usage error repeats every time: one sentence, pytest's own
        if r.returncode not in (0, 1):  # so does an internal error: stop now
            print(f"calibrate: stopped, pytest exited {r.returncode} (run the command by hand to see why): "
                  f"{printable(' '.join(pytest_command(pytest_args)))}", file=out)
            break
    return done


def baselines_of(results: Iterable[Path], baseline_dir: Path) -> list[Baseline]:
    """The baseline files the runs' records belong to (read back after saving)."""
    store = BaselineStore(baseline_dir)
    seen: dict[Path, Baseline] = {}
    for path in results:
        try:
            records = read_results(path)
        except ResultsFileError:
            continue
        for rec in records:
            meta = meta_from_record(rec)
            p = store.path_for(meta.gpu_slug, meta.profile)
            if p not in seen and p.exists():
                seen[p] = load_baseline_file(p)
    return list(seen.values())


def _reference_of(base: Baseline, references: ReferenceStore | None) -> Reference | None:
    try:
        return references.load(base.meta.gpu_slug, base.meta.profile) if references is not None else None
    except BaselineError:
        return None


def threshold_rows(base: Baseline, default_tolerance: float = DEFAULT_TOLERANCE,
                   references: ReferenceStore | None = None) -> list[dict[str, object]]:
    """Per figure of one baseline: runs, median, CV, threshold, smallest detectable change, gates, as
    a verdict will judge it (a short history with the reference's sigma as its floor)."""
    rows: list[dict[str, object]] = []
    ref = _reference_of(base, references)
    priors = Priors(references)
    for (test, metric, mode), e in sorted(base.entries.items()):
        partners = {p.metric: p.values for p in base.timing_partners(e)}
        ref_entry = ref.get(test, metric, mode) if ref is not None else None
        one_board = e.last is not None and e.on_board(board_of(e.last.fingerprint))
        prior = priors.for_figure(base.meta, (test, metric, mode), one_board, e.kind)
        b = band(e.values, tolerance=e.tolerance, default_tolerance=default_tolerance, partners=partners,
                 prior=prior)
        first = ref.band_for(ref_entry) if ref is not None and ref_entry is not None else None
        nights = {1: _cell(first) if first is not None else "-"}
        for night in NIGHTS[1:]:
            runs = e.values[:night - 1]
            shared = {k: v[:night - 1] for k, v in partners.items()}
            nights[night] = _cell(band(runs, tolerance=e.tolerance, default_tolerance=default_tolerance,
                                       partners=shared, prior=prior), len(runs) < night - 1)
        rows.append({
            "test": test.split("::", 1)[-1], "metric": metric, "mode": mode, "runs": b.runs,
            "median": b.center, "unit": e.unit,
            "cv_pct": None if b.sigma is None else round(b.sigma * 100, 3),
            "cv_of": b.sigma_of,  # the CV of a rate timing the same work where that one's is larger
            "threshold_pct": round(b.threshold * 100, 2),
            "detects_pct": round(b.detectable * 100, 2) if b.gates else None,
            "gates": "yes" if b.gates else "no: too noisy",
            "basis": b.basis,
            "nights": nights,
        })
    return rows


#: The nights whose thresholds calibrate shows: the first (against the reference), the second (one
#: run of the site's own), the fifth (four) and the tenth (nine).
NIGHTS = (1, 2, 5, 10)


def _cell(b: Band, short: bool = False) -> str:
    """'±2.1%', '±10%' (a conservative band), or 'no' (too noisy to gate); '~' in front where the
    history holds fewer runs than that night would have (the band of all of them)."""
    text = f"±{b.threshold * 100:.1f}%" if b.gates else "no"
    return ("~" + text) if short else text


def _cv_cell(row: dict[str, object]) -> str:
    """'0.42%', or '5.10% (of tokens_per_s)' where a figure took the CV of a rate timing the same work."""
    if row["cv_pct"] is None:
        return "-"
    return f"{row['cv_pct']:.2f}%" + (f" (of {row['cv_of']})" if row["cv_of"] else "")


def test_seconds(results: Iterable[Path]) -> dict[str, float]:
    """Per test (node id), the median of its seconds over the runs (each results file's ``durations``)."""

    seen: dict[str, list[float]] = {}
    for path in results:
        try:
            _, meta = read_results_file(path)
        except ResultsFileError:
            continue
        for test, seconds in (meta.get("durations") or {}).items():
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                seen.setdefault(str(test), []).append(float(seconds))
    return {t: statistics.median(v) for t, v in seen.items()}


#: What the time budget says of a test that gates nothing, by what the next night does with it.
LEFT_OUT = "nothing: left out from the next night on (--mig-all-tests runs it)"
STILL_RUN = f"nothing yet: still run to build the history (the reference's sigma until {PRIOR_RUNS} runs)"


def left_out_tests(base: Baseline, reference: Reference | None) -> set[tuple[str, str]]:
    """(test, mode) pairs of ``base`` that the next night leaves out, by the plugin's own rule
    (:func:`pytest_mig.night.nights.gates_nothing`: the history's own band, else the reference's)."""

    pairs = {(test, mode) for test, _, mode in base.entries}
    return {(test.split("::", 1)[-1], mode) for test, mode in pairs if gates_nothing(test, mode, base, reference)}


def budget_rows(rows: Sequence[dict[str, object]], seconds: dict[str, float],
                left_out: Collection[tuple[str, str]] = ()) -> list[list[object]]:
    """Per test: its seconds, the figures it gates of those it reports, the smallest change the best of
    them detects, and for a test that gates nothing what the next night does with it (``left_out``: the
    tests it leaves out); the tests that gate nothing first, then by seconds, longest first."""
    per: dict[tuple[str, str], list[dict[str, object]]] = {}
    for r in rows:
        per.setdefault((str(r["test"]), str(r["mode"])), []).append(r)
    table = []
    for (test, mode), figs in per.items():
        gating = [f for f in figs if f["gates"] == "yes"]
        secs = next((v for k, v in seconds.items() if k.split("::", 1)[-1] == test), None)
        best = min((float(f["detects_pct"]) for f in gating), default=None)  # type: ignore[arg-type]
        buys = "" if gating else LEFT_OUT if (test, mode) in left_out else STILL_RUN
        table.append([test, mode, "-" if secs is None else f"{secs:.0f}", f"{len(gating)}/{len(figs)}",
                      "-" if best is None else f"{best:.1f}%", buys])
    return sorted(table, key=lambda r: (r[3].startswith("0/") is False, -float(r[2]) if r[2] != "-" else 0.0))


NIGHTS_NOTE = ("night N: the threshold a site's night N would be judged with (night 1 against the reference, "
               "night N against the first N-1 of these runs with the reference's sigma as a prior); 'no': too "
               "noisy to gate; '~': fewer runs here than that night has, so the band of all of them.")


#: What calibrate says of a CPU history instead of thresholds.
CPU_NOT_A_BASELINE = ("These are CPU figures, not a baseline: a CPU's speed moves with whatever else the host runs, "
                      "so their spread says nothing of a GPU's, and calibrate shows no threshold for them and calls "
                      "none gating. A later CPU run is compared with them only on this host, as a smoke check, never "
                      "with a GPU's. For thresholds that gate, calibrate on the GPU node or MIG slice: "
                      "pytest-mig calibrate -n 10 -- benchmarks --mig-profile <profile>.")


def print_cpu_figures(base: Baseline, out: TextIO, seconds: dict[str, float]) -> None:
    """A CPU history: each figure's runs, median and spread, the tests' seconds, and why none of it is
    a baseline (no threshold, detects or gates column)."""
    from tabulate import tabulate

    rows = threshold_rows(base)
    print(f"\n{base.meta.path}: {len(rows)} CPU figure(s)", file=out)
    table = [[r["test"], r["metric"], r["mode"], r["runs"], format_number(float(r["median"])),  # type: ignore[arg-type]
              r["unit"], _cv_cell(r)] for r in rows]
    print(tabulate(table, headers=["test", "metric", "mode", "runs", "median", "unit", "spread (CV)"],
                   disable_numparse=True), file=out)
    tests = sorted({str(r["test"]) for r in rows})
    times = [[t, next((f"{v:.0f}" for k, v in seconds.items() if k.split("::", 1)[-1] == t), "-")] for t in tests]
    print("\ntime (seconds per test, median of the runs):", file=out)
    print(tabulate(times, headers=["test", "seconds"], disable_numparse=True), file=out)
    print(f"{len(rows)} figure(s) of {len(tests)} test(s) on the CPU. {CPU_NOT_A_BASELINE}", file=out)


def print_thresholds(bases: Sequence[Baseline], out: TextIO, results: Iterable[Path] = ()) -> None:
    from tabulate import tabulate

    seconds = test_seconds(results)
    references = ReferenceStore()
    for base in bases:
        if base.meta.gpu_slug == "cpu":
            print_cpu_figures(base, out, seconds)
            continue
        rows = threshold_rows(base, references=references)
        print(f"\n{base.meta.path}: {len(rows)} figure(s)", file=out)
        table = [[r["test"], r["metric"], r["mode"], r["runs"], format_number(float(r["median"])),  # type: ignore[arg-type]
                  r["unit"], _cv_cell(r), f"±{r['threshold_pct']:.1f}%",
                  "-" if r["detects_pct"] is None else f"{r['detects_pct']:.1f}%", r["gates"],
                  *(r["nights"][n] for n in NIGHTS)] for r in rows]  # type: ignore[index]
        print(tabulate(table, headers=["test", "metric", "mode", "runs", "median", "unit", "CV", "threshold",
                                       "detects", "gates", *(f"night {n}" for n in NIGHTS)], disable_numparse=True),
              file=out)
        print(NIGHTS_NOTE, file=out)
        few = [r for r in rows if r["basis"] == "few-runs"]
        if few:
            print(f"{len(few)} figure(s) have fewer than 5 runs: their band is a conservative 10% or more (as wide as "
                  f"their runs differ) until they do.", file=out)
        borrowed = [r for r in rows if r["cv_of"] in REFERENCE_PRIORS]
        if borrowed:
            print(f"{len(borrowed)} figure(s) take the reference's sigma, larger than this history's own, until they "
                  f"have {PRIOR_RUNS} runs: a few runs back to back understate night-to-night noise.", file=out)
        budget = budget_rows(rows, seconds, left_out_tests(base, _reference_of(base, references)))
        print("\ntime budget (seconds per test, median of the runs; what each buys):", file=out)
        print(tabulate(budget, headers=["test", "mode", "seconds", "figures gating", "detects", "gates"],
                       disable_numparse=True), file=out)
        idle = [r for r in budget if r[5]]
        if idle:
            dropped = [r for r in idle if r[5] == LEFT_OUT]
            print(f"{len(idle)} test(s) gate nothing: {len(dropped)} left out of the next night "
                  f"({sum(float(r[2]) for r in dropped if r[2] != '-'):.0f} s), {len(idle) - len(dropped)} still run "
                  f"until their own history decides.", file=out)


def cmd_calibrate(pytest_args: Sequence[str], runs: int, baseline_dir: Path, work_dir: Path, keep: int | None,
                  out: TextIO, shrink: bool = False) -> int:
    done = calibrate(pytest_args, runs, baseline_dir, work_dir, keep=keep, shrink=shrink, out=out)
    try:
        bases = baselines_of([r.results for r in done], baseline_dir)
    except BaselineError as exc:
        print(f"calibrate: the baseline cannot be read back: {exc}", file=out)
        return 2
    if not bases:
        print("calibrate: no figure was saved (did every run fail? run the pytest command by hand)", file=out)
        return 1
    print_thresholds(bases, out, [r.results for r in done])
    failed = [r for r in done if r.returncode != 0]
    return 1 if failed else 0


def cmd_show(baseline_dir: Path, out: TextIO) -> int:
    """The thresholds of the histories already in ``baseline_dir``, running nothing: how sharp each
    figure's verdict is tonight and on nights 1, 2, 5 and 10."""
    store = BaselineStore(baseline_dir)
    bases = [load_baseline_file(path) for path in store.files()]
    if not bases:
        print(f"calibrate: {printable(baseline_dir)} holds no history yet: nothing to show (save a night with "
              f"--mig-save-if-passed, or run pytest-mig calibrate -n 10 -- ...)", file=out)
        return 1
    print_thresholds(bases, out)
    return 0

