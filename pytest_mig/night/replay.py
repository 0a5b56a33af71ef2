"""``pytest-mig replay``: the verdict rule replayed over recorded nights, night by night.

What a site would have seen had it run the suite on each recorded board from its first night:
every night of a board (a results file; the nights of one folder and board form its series, oldest
first) is judged, through the one :class:`~pytest_mig.judge.pipeline.Pipeline`, against the board's
earlier nights of that series (its last ``KEEP``), with the re-measurements the night itself took.
A figure that fails is a **false alarm**: the nights are unchanged runs.  Then each judged figure
is made 5% worse (direction-aware, its re-measurements alike) and judged again: **caught** or not.

The priors a short history is judged with (:mod:`pytest_mig.judge.prior`) are computed
**leave-one-out**, as a shipped reference computes them but from the other boards' nights only:
each other board's runs of each profile of the GPU model relative to their own median, pooled
(:func:`pytest_mig.judge.reference.pooled_sigma`), as the plugin judges a history of one board
(every replayed series is one board's); with ``--priors across-boards``, each profile's runs over
all the other boards instead.  Only runs at the size the night was measured at count (GEMM's
square), at least ``MIN_PRIOR_DOF`` degrees of freedom are asked, as the plugin asks of a prior, and
a figure's is the larger of its own and that of the rates timing the same work (an energy or cost
figure's, a GEMM headline's: :func:`pytest_mig.measure.timing_partners`).  For an emulated profile
no other board ran twice, never below its spread across the other boards
(:func:`pytest_mig.judge.reference.profile_spread`), as the plugin reads an emulated profile's
reference.  So no night is judged with noise measured on its own board.

A false alarm on a figure whose night recorded no re-measurement of it (it passed when it ran, so
the plugin took none) is counted, and named as unconfirmed: the plugin re-measures a figure before
it fails it, which the replay cannot.

Host copies are judged by their best copy, as the suite reports them now (:func:`as_reported_now`).
Runs slowed on purpose (``--mig-slowdown-sms``), tests that shared the GPU with another process
(their health note names it), host copies made while the host's other GPUs copied (marked so, or,
made before the host's turn existed, at the same time as another board's: :func:`copied_at_once`),
GEMM headlines timed over less than half the suite's window now (:func:`replaced_headlines`) are left
out, and so are files matching ``exclude`` (runs of another version of a workload kept beside the
current one for comparison) and tests whose id contains a text of ``exclude_tests`` (a workload the
suite has since replaced); a file that cannot be read is named and passed over.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence, TextIO

from pytest_mig.device.host import shared_host
from pytest_mig.device.target import EMULATED_SUFFIX
from pytest_mig.judge.noise import MIN_PRIOR_DOF, PRIOR_ELSEWHERE, Prior
from pytest_mig.judge.pipeline import Pipeline, RecordHistories
from pytest_mig.judge.reference import pooled_dof, pooled_sigma, profile_spread, sized, window_temperatures
from pytest_mig.judge.thermal import Slope, slope_of
from pytest_mig.measure.clocks import temperature_of
from pytest_mig.measure import BEST, best_rate, partner_keys
from pytest_mig.measure.rounds import rounds_iterations
from pytest_mig.report.axes import parse_time
from pytest_mig.store.baselines import measured_size, measured_value, meta_from_record
from pytest_mig.store.history import BaselineEntry
from pytest_mig.store.results import ResultRecord, ResultsFileError, read_results_file
from pytest_mig.store.verdicts import Verdict
from pytest_mig.workloads import HEADLINE_S
from pytest_mig.common.text import printable

#: Runs a history keeps (the store's default).
KEEP = 10
#: The loss each judged figure is made to show.
LOSS = 0.05
#: The tolerance a figure must gate within to count as gating.
GATE = 0.05
#: History lengths reported one by one; longer ones are counted with the last.
SHOWN = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)

Key = tuple[str, str, str]  # (test, metric, mode)
Series = tuple[str, str, str, str]  # (folder, board, baseline profile, mode)


@dataclass
class Night:
    """One board's unchanged night: its gating-eligible records."""

    series: Series
    model: str
    at: str
    records: list[ResultRecord]


@dataclass
class Length:
    """What nights judged against a history of one length found."""

    nights: int = 0
    alarmed: int = 0  # nights with at least one false alarm
    unconfirmed: int = 0  # ... of which every alarm is on a figure the night recorded no re-measurement of
    judged: int = 0  # figure-nights against a history (judged, or too noisy to gate)
    gating: int = 0  # ... of which gated at <= GATE
    caught: int = 0  # ... of those, a LOSS caught
    alarms: list[str] = field(default_factory=list)


def nights_of(paths: Iterable[Path], out: TextIO, exclude_tests: Sequence[str] = ()) -> list[Night]:
    """Every unchanged night in the results files ``paths``, each board's series oldest first, less
    the figures of tests whose id contains a text of ``exclude_tests``."""
    # The same night copied into two archives, or in part (its first record kept), is one night:
    # the copy holding the most of it.
    nights: dict[tuple[str, str, str, str], Night] = {}
    files: list[tuple[Path, list[ResultRecord], Mapping[str, object]]] = []
    left_out = 0
    for path in paths:
        try:
            records, meta = read_results_file(path)
        except (ResultsFileError, OSError) as exc:
            print(f"passed over {printable(path)}: {exc}", file=out)
            continue
        durations = meta.get("durations")
        records = window_temperatures(sized(records))
        replaced = replaced_headlines(records)
        left_out += len(replaced)
        files.append((path, [as_reported_now(r) for r in records if id(r) not in replaced],
                      durations if isinstance(durations, dict) else {}))
    if left_out:
        print(f"left out {left_out} GEMM headline record(s), with their SU, timed over less than half the suite's "
              f"headline window now ({', '.join(f'{s:g} s {m}' for m, s in HEADLINE_S.items())})", file=out)
    at_once = copied_at_once(files)
    for path, records, _ in files:
        by_board: dict[tuple[str, str, str], list[ResultRecord]] = {}
        for r in records:
            t = r.target
            if t.slowed_to_sms or not t.gpu_name or not r.metric.compare or _shared(r) or id(r) in at_once:
                continue
            if any(text in r.test for text in exclude_tests):
                continue
            by_board.setdefault((_board(r), meta_from_record(r).profile, r.mode), []).append(r)
        for (board, profile, mode), recs in by_board.items():
            at = min(r.timestamp for r in recs)
            held = nights.get((board, profile, mode, at))
            if held is None or len(recs) > len(held.records):
                model = meta_from_record(recs[0]).gpu_model
                nights[(board, profile, mode, at)] = Night((str(path.parent), board, profile, mode), model, at, recs)
    return sorted(nights.values(), key=lambda n: (n.series, n.at))


def replaced_headlines(records: Sequence[ResultRecord]) -> set[int]:
    """The ids of a results file's GEMM headlines (``<dtype>_tflops`` of a square of ``size``) timed
    over less than half the GPU time the suite times its headline now (:data:`HEADLINE_S`), and of
    the SU figures of those tests, which convert the headline.  Its ``calls`` are the calls timed, each
    the work over the rate (where not kept: its ``repeats``, pytest-benchmark rounds, each of
    :func:`pytest_mig.measure.rounds.rounds_iterations` calls).  20 rounds of a fast precision's calls (0.2 s)
    caught one phase of the power cap's clock cycle, a measurement the suite no longer makes, as a
    replaced workload's.  A headline of the window falls short of it only by its first calls'
    estimate (a few percent); one whose info does not say its rounds and size is kept."""
    short: set[tuple[str, str | None, str]] = set()
    out: set[int] = set()
    for r in records:
        info = r.metric.info
        size, rounds, calls = measured_size(info), info.get("repeats"), info.get("calls")
        window = HEADLINE_S.get(r.mode)
        if (r.metric.name != f"{info.get('dtype')}_tflops" or window is None or r.target.is_cpu
                or size is None or not _count(rounds) or not r.metric.value > 0):
            continue
        call_s = 2.0 * size ** 3 / (r.metric.value * 1e12)
        if not _count(calls):
            calls = rounds * rounds_iterations(call_s)  # recorded before headlines kept their calls
        if calls * call_s < 0.5 * window:
            short.add((r.test, r.target.baseline_profile, r.mode))
            out.add(id(r))
    out.update(id(r) for r in records
               if r.metric.kind == "cost" and (r.test, r.target.baseline_profile, r.mode) in short)
    return out


def _count(value: object) -> bool:
    """Whether ``value`` is a count of something done: a whole number above 0, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


#: The figures of the suite's host copies (``benchmarks/test_host_bandwidth.py``).
HOST_COPIES = ("h2d_gbs", "d2h_gbs", "bidir_gbs")


def _host_copy(rec: ResultRecord) -> bool:
    return rec.metric.name in HOST_COPIES and bool(rec.metric.info.get("pinned")) and rec.metric.direction == "higher"


def as_reported_now(rec: ResultRecord) -> ResultRecord:
    """A host copy recorded as the median of its copies, judged by their best, as the suite reports it
    now (:func:`pytest_mig.measure.best_rate`).  Its re-measurements were medians too and are not kept:
    an alarm on it counts as unconfirmed."""
    info = rec.metric.info
    if not _host_copy(rec) or info.get("statistic") == BEST:
        return rec
    best = best_rate(rec.metric.samples)
    if not math.isfinite(best):
        return rec
    verdict = None if rec.verdict is None else replace(rec.verdict, confirmations=[])
    return replace(rec, metric=replace(rec.metric, value=best, info={**info, "statistic": BEST}), verdict=verdict)


def _board(rec: ResultRecord) -> str:
    return str(rec.target.uuid or (rec.fingerprint or {}).get("gpu_uuid") or rec.node)


#: What a host copy's info holds where the host's other GPUs were watched or waited for.
WATCHED = ("host_turn", "neighbours", "neighbour_readings")
#: A host-copy test's seconds where its file does not say them: about the longest one takes alone.
UNKNOWN_SPAN_S = 10.0
#: The most seconds a test's recorded duration is believed (more is no test's: unknown).
LONGEST_S = 86400.0


def _seconds(rec: ResultRecord, durations: Mapping[str, object]) -> float:
    """The seconds the record's test took, by its id or its id with the profile (a sweep's), else
    :data:`UNKNOWN_SPAN_S`."""
    for key in (rec.test, f"{rec.test}[{rec.target.profile}]"):
        seconds = durations.get(key)
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds <= LONGEST_S:
            return float(seconds)
    return UNKNOWN_SPAN_S


def copied_at_once(files: Iterable[tuple[Path, Sequence[ResultRecord], Mapping[str, object]]]) -> set[int]:
    """The ids of the host-copy records that neither took the host's turn nor read the other GPUs'
    traffic, whose test ran while another board's such test ran on the same node: copies made before
    the turn existed, several GPUs of a host at once, are not one GPU's figures.  A test's copies lie
    within its seconds (the file's ``durations``, else :data:`UNKNOWN_SPAN_S`) either side of its
    record's time (the figure is written after the copies, a re-measurement's copies come after it).
    The node is the host's name as the record holds it: machines that share one are read as one host."""
    spans: list[tuple[float, float, str, str, int]] = []
    for _, records, durations in files:
        for r in records:
            at = parse_time(r.timestamp)
            if not _host_copy(r) or any(k in r.metric.info for k in WATCHED) or at is None:
                continue
            seconds = _seconds(r, durations)
            spans.append((at - seconds, at + seconds, r.node, _board(r), id(r)))
    spans.sort()
    out: set[int] = set()
    for i, (start, end, node, board, rid) in enumerate(spans):
        for other in spans[i + 1:]:
            if other[0] >= end:
                break
            if other[2] == node and other[3] != board:
                out.update((rid, other[4]))
    return out


def _shared(rec: ResultRecord) -> bool:
    """Whether another process used the GPU during the record's test (its health note names one),
    or the host's other GPUs copied while it copied: a real slowdown, not an unchanged night."""
    health = rec.health if isinstance(rec.health, dict) else {}
    return any(isinstance(part, dict) and part.get("others") for part in health.values()) \
        or shared_host(rec.metric.info) is not None


class LeaveOneOut:
    """Priors from every series but the judged board's (the module docstring).  ``within_boards``:
    each other board's runs relative to their own median, as the plugin judges a history of one
    board; else each profile's runs over all the other boards (``--priors across-boards``)."""

    def __init__(self, nights: Sequence[Night], within_boards: bool = True) -> None:
        self.within_boards = within_boards
        #: each run's (size, value, temperature) by (model, figure) and (profile, board)
        self._values: dict[tuple[str, Key], dict[tuple[str, str], list[tuple[int | None, float, float | None]]]] = {}
        self._kinds: dict[Key, str] = {}
        self._models = {night.model for night in nights}
        for night in nights:
            for r in night.records:
                key = (r.test, r.metric.name, r.mode)
                self._kinds[key] = r.metric.kind
                groups = self._values.setdefault((night.model, key), {})
                groups.setdefault((night.series[2], night.series[1]), []).append(
                    (measured_size(r.metric.info), measured_value(r), temperature_of(r.metric.info)))
        self.board: str | None = None
        self._cache: dict[tuple[str | None, str, Key, int | None, bool], tuple[float | None, int]] = {}

    def _sigma(self, model: str, key: Key, size: int | None, within: bool,
               thin: bool = False) -> float | None:
        """The figure's pooled sigma on ``model``'s other boards; from fewer than ``MIN_PRIOR_DOF``
        degrees of freedom only where ``thin`` (else None)."""
        memo = (self.board, model, key, size, within)
        if memo not in self._cache:
            by_group: dict[str | tuple[str, str], list[float]] = {}
            for (profile, board), runs in self._values.get((model, key), {}).items():
                if board != self.board:
                    values = [v for s, v, _ in runs if size is None or s is None or s == size]
                    by_group.setdefault((profile, board) if within else profile, []).extend(values)
            groups = list(by_group.values())
            self._cache[memo] = (pooled_sigma(groups), pooled_dof(groups))
        sigma, dof = self._cache[memo]
        return sigma if thin or dof >= MIN_PRIOR_DOF else None

    def _spread(self, model: str, key: Key, size: int | None, profile: str) -> float | None:
        """The figure's spread across ``model``'s other boards of an emulated ``profile`` where none of
        them ran it twice (:func:`pytest_mig.judge.reference.profile_spread`)."""
        if not profile.endswith(EMULATED_SUFFIX):
            return None
        by_board = {board: [v for s, v, _ in runs if size is None or s is None or s == size]
                    for (p, board), runs in self._values.get((model, key), {}).items()
                    if p == profile and board != self.board}
        return profile_spread(by_board)

    def _pooled(self, rec: ResultRecord, model: str, within: bool, thin: bool = False) -> float | None:
        """The figure's sigma on ``model``'s other boards, the larger of its own and that of the rates
        timing the same work (None: one is unknown); of the night's own model, never below the spread
        of an emulated profile whose other boards never repeat, as the plugin reads a reference."""
        key = (rec.test, rec.metric.name, rec.mode)
        size = measured_size(rec.metric.info)
        meta = meta_from_record(rec)
        sigmas = []
        for k in [key, *partner_keys(key, rec.metric.kind, self._kinds)]:
            sigma = self._sigma(model, k, size, within, thin)
            if sigma is None:
                return None
            spread = self._spread(model, k, size, meta.profile) if model == meta.gpu_model else None
            sigmas.append(sigma if spread is None else max(sigma, spread))
        return max(sigmas)

    def _on(self, rec: ResultRecord, model: str) -> tuple[float | None, str]:
        """On one board where ``model``'s other boards show it, else across boards, as the plugin
        falls back where a reference's runs name no board."""
        sigma = self._pooled(rec, model, True) if self.within_boards else None
        if sigma is not None:
            return sigma, "on one board"
        return self._pooled(rec, model, False), "across boards"

    def for_record(self, rec: ResultRecord, history: BaselineEntry | None = None) -> Prior | None:
        """The other boards' sigma of the judged board's GPU model; where they hold too few runs of
        the figure, the largest of the other GPU models' that hold enough, never below that of the
        few runs, as the plugin borrows them."""
        model = meta_from_record(rec).gpu_model
        sigma, where = self._on(rec, model)
        if sigma is None:
            borrowed = [s for m in sorted(self._models - {model}) for s, _ in [self._on(rec, m)] if s is not None]
            if borrowed:
                thin = self._pooled(rec, model, False, thin=True)
                sigma, where = max([*borrowed, *([thin] if thin is not None else [])]), "of other GPU models"
        return None if sigma is None else Prior(sigma, f"{PRIOR_ELSEWHERE}the other boards', {where} (leave-one-out)")

    def slope_for(self, rec: ResultRecord) -> Slope | None:
        """The leakage slope of the record's energy figure within the other boards' runs of its GPU
        model and profile, as the plugin fits it within the reference's boards."""
        if rec.metric.kind != "energy":
            return None
        meta = meta_from_record(rec)
        key = (rec.test, rec.metric.name, rec.mode)
        size = measured_size(rec.metric.info)
        by_board = {board: [(t, v) for s, v, t in runs if size is None or s is None or s == size]
                    for (profile, board), runs in self._values.get((meta.gpu_model, key), {}).items()
                    if profile == meta.profile and board != self.board}
        return slope_of(by_board)


def _worse(rec: ResultRecord, loss: float) -> ResultRecord:
    """The record made ``loss`` worse, its re-measurements alike."""
    factor = 1 - loss if rec.metric.direction == "higher" else 1 + loss
    verdict = None if rec.verdict is None else \
        replace(rec.verdict, confirmations=[x * factor for x in rec.verdict.confirmations])
    return replace(rec, metric=replace(rec.metric, value=rec.metric.value * factor), verdict=verdict)


def _judge(pipeline: Pipeline, records: Sequence[ResultRecord]) -> list[Verdict]:
    """The records' verdicts, in their order, each test re-judged on the re-measurements its night
    took (copies are judged: the night's own records stay as recorded, for the nights after it)."""
    return pipeline.judge_runs([replace(r) for r in records])


def replay(nights: Sequence[Night], priors: LeaveOneOut) -> dict[int, Length]:
    """The nights judged one by one against their series' earlier nights: per history length."""
    by_series: dict[Series, list[Night]] = {}
    for n in nights:
        by_series.setdefault(n.series, []).append(n)
    lengths: dict[int, Length] = {n: Length() for n in SHOWN}
    for series, runs in by_series.items():
        priors.board = series[1]
        for i in range(1, len(runs)):
            history = [n.records for n in runs[max(0, i - KEEP):i]]
            _one_night(Pipeline(RecordHistories(history), priors=priors), runs[i], lengths[min(i, SHOWN[-1])])
    return lengths


def _one_night(pipeline: Pipeline, night: Night, into: Length) -> None:
    records = [r for r in night.records if r.metric.compare]
    verdicts = _judge(pipeline, records)
    judged = [(r, v) for r, v in zip(records, verdicts) if v.judged]
    if not judged:
        return
    into.nights += 1
    alarms = [(r, v) for r, v in judged if v.failed]
    if alarms:
        into.alarmed += 1
        into.unconfirmed += not any(_remeasured(r) for r, _ in alarms)
        into.alarms += [f"{night.series[1][:12]} {night.at[:16]} {v.test} {v.metric} {v.change_pct:+.1f}% "
                        f"(threshold {100 * (v.threshold or 0):.1f}%){'' if _remeasured(r) else ', unconfirmed'}"
                        for r, v in alarms]
    gating = [(r, v) for r, v in judged if v.gates_within(GATE)]
    into.judged += len(judged)
    into.gating += len(gating)
    if gating:
        worse = [_worse(r, LOSS) for r, _ in gating]
        caught = _judge(pipeline, worse)
        into.caught += sum(1 for v in caught if v.outcome == "regressed")


def _remeasured(rec: ResultRecord) -> bool:
    """Whether the night recorded re-measurements of the record's figure."""
    return rec.verdict is not None and bool(rec.verdict.confirmations)


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"


def markdown(lengths: Mapping[int, Length], nights: Sequence[Night]) -> str:
    """The replay's table, one row per history length, and every false alarm."""
    boards = {n.series[1] for n in nights}
    models = sorted({n.model for n in nights})
    lines = [f"{len(nights)} unchanged nights of {len(boards)} boards ({', '.join(models)}), "
             f"{len({n.series for n in nights})} series; each night judged against the earlier nights of its series "
             f"(at most {KEEP}), priors leave-one-out.", "",
             "| night | history runs | nights judged | nights with a false alarm | figures with a history | gate at <= 5% | "
             "5% loss caught (of gating) |", "|---|---|---|---|---|---|---|"]
    for n, row in lengths.items():
        runs = f"{n}+" if n == SHOWN[-1] else str(n)
        lines.append(f"| {n + 1}{'+' if n == SHOWN[-1] else ''} | {runs} | {row.nights} | {row.alarmed} | {row.judged} | "
                     f"{row.gating} ({_pct(row.gating, row.judged)}) | {row.caught} ({_pct(row.caught, row.gating)}) |")
    total = Length()
    for row in lengths.values():
        total.nights += row.nights
        total.alarmed += row.alarmed
        total.unconfirmed += row.unconfirmed
        total.alarms += row.alarms
    unconfirmed = (f" ({total.unconfirmed} of them unconfirmed: no re-measurement recorded, where the plugin "
                   f"re-measures before it fails a figure)") if total.unconfirmed else ""
    lines += ["", f"False alarms: {total.alarmed} night(s) of {total.nights}{unconfirmed}."]
    lines += [f"- {a}" for a in total.alarms]
    return "\n".join(lines) + "\n"


def results_files(paths: Sequence[Path], exclude: Sequence[str] = ()) -> list[Path]:
    """The .json files named, and those under the folders named, in a stable order, less those
    whose path matches a glob of ``exclude``."""
    out: list[Path] = []
    for p in paths:
        out += sorted(p.rglob("*.json")) if p.is_dir() else [p]
    return [p for p in out if not any(fnmatch.fnmatch(str(p), pattern) for pattern in exclude)]


def cmd_replay(paths: Sequence[Path], exclude: Sequence[str], out: TextIO, within_boards: bool = False,
               exclude_tests: Sequence[str] = ()) -> int:
    nights = nights_of(results_files(paths, exclude), out, exclude_tests)
    if not nights:
        print("no unchanged GPU nights in the files given", file=out)
        return 1
    lengths = replay(nights, LeaveOneOut(nights, within_boards))
    out.write(markdown(lengths, nights))
    return 0


__all__ = ["KEEP", "LOSS", "LeaveOneOut", "Length", "Night", "cmd_replay", "markdown", "nights_of", "replay",
           "replaced_headlines", "results_files"]
