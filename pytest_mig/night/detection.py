"""``pytest-mig detection``: how often the verdicts cry wolf, and what they catch, on this GPU.

The experiment behind docs/detection.md, re-runnable with one command:

1. **Unchanged runs**, one after another, each saved into a fresh baseline history
   (``--mig-save-baseline``) and judged, with re-measurement, against the runs before it: the real
   plugin flow of a site that keeps a rolling history.  Every run judged against at least
   ``noise.MIN_RUNS`` earlier runs is a nightly run; a figure that would have failed it is a false
   alarm.  The analysis judges each such run again with the rule of the installed version (so that
   runs recorded under an earlier rule are counted under today's), using the re-measurements the
   run itself took; a figure beyond the threshold for which the run took none counts as an alarm.
2. **Slowed runs** (``--mig-slowdown-sms S``): the whole GPU's tests on only S of its SMs, judged
   against that history.  A real, physical slowdown of compute-bound figures; each figure's true
   slowdown is taken from the slowed runs themselves (wave quantisation makes it more than the SM
   ratio, and memory-bound figures hardly move), and detection is reported against that size.
3. **Replay**: every figure's unchanged runs, made 3%, 5% and 10% worse (direction-aware), judged
   against the other runs with the same rule; the re-measurements are two other unchanged runs,
   scaled alike.  This gives detection at fixed sizes for every figure, memory-bound ones included,
   and a first-stage false-alarm rate (without re-measurement) for each.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence, TextIO

from pytest_mig.store.baselines import measured_value, saveable
from pytest_mig.night.calibrate import check_pytest_args, pytest_command, run_suite
from pytest_mig.judge.pipeline import Pipeline, RecordHistories
from pytest_mig.measure import Metric, partner_keys
from pytest_mig.judge.noise import MIN_RUNS, band
from pytest_mig.common.files import atomic_write_text
from pytest_mig.store.results import ResultRecord, ResultsFileError, read_results
from pytest_mig.judge.verdict import format_number

#: Slowdowns the replay applies.
SIZES = (0.03, 0.05, 0.10)
#: Runs a replayed history keeps (the store's default).
KEEP = 10

Key = tuple[str, str, str]  # (test, metric, mode)


@dataclass
class Figure:
    """What the experiment found for one figure."""

    key: Key
    unit: str
    direction: str
    kind: str
    unchanged: list[float] = field(default_factory=list)
    cv: float | None = None
    threshold: float | None = None
    detectable: float | None = None
    gates: bool = True
    flow_judged: int = 0  # unchanged runs judged in the plugin flow against >= MIN_RUNS runs
    flow_false: int = 0  # ... of which failed
    flow_transient: int = 0  # ... beyond the threshold first, cleared by re-measuring
    replay_first: int = 0  # replayed unchanged runs beyond the threshold on the first measurement
    replay_false: int = 0  # ... still beyond after the modelled re-measurement
    replay_n: int = 0
    detect: dict[float, tuple[int, int]] = field(default_factory=dict)  # size -> (caught, tried)
    slowed: dict[int, tuple[float, int, int]] = field(default_factory=dict)  # sms -> (true slowdown, caught, runs)
    alarm_runs: list[int] = field(default_factory=list)  # unchanged runs (1-based) in which it raised an alarm


def _scaled(rec: ResultRecord, size: float) -> ResultRecord:
    """The record made ``size`` worse (a rate lower, a time or an energy higher)."""
    m = rec.metric
    factor = (1 - size) if m.direction == "higher" else (1 + size)
    metric = Metric(m.name, m.value * factor, m.unit, m.direction, [x * factor for x in m.samples], m.kind,
                    dict(m.info), m.compare)  # type: ignore[arg-type]
    return ResultRecord(rec.test, metric, rec.target, dict(rec.fingerprint), rec.timestamp, rec.node,
                        None, rec.mode)


def _unjudged(rec: ResultRecord) -> ResultRecord:
    """A copy of a recorded figure to judge again, so that judging it leaves the run's own verdict as recorded."""
    return ResultRecord(rec.test, rec.metric, rec.target, rec.fingerprint, rec.timestamp, rec.node, None, rec.mode,
                        health=rec.health)


def _gating_records(records: Sequence[ResultRecord]) -> dict[Key, ResultRecord]:
    """A run's figures as a history would keep them (:func:`pytest_mig.store.baselines.saveable`: none
    informational, non-positive, or measured while the host was shared)."""
    return {(r.test, r.metric.name, r.mode): r for r in records if saveable(r) is None}


def _judge_replayed(pipeline: Pipeline, rec: ResultRecord, confirmations: Sequence[ResultRecord]) -> tuple[bool, bool]:
    """(beyond on the first measurement, still beyond after re-measuring) for a replayed record."""
    v = pipeline.first(rec)
    if not v.failed:
        return False, False
    return True, pipeline.confirm(rec, v, [c.metric.value for c in confirmations]).failed


@dataclass
class _Partners:
    """The rate figures that time the same work as a figure (``mates``), read in the runs that
    hold the figure (``at``: indices into ``runs``)."""

    runs: Sequence[dict[Key, ResultRecord]]
    at: Sequence[int]
    key: Key
    mates: Sequence[Key]

    def __call__(self, picked: Iterable[int]) -> dict[str, list[float]]:
        """Their values, by name, in the figure's runs ``picked`` (indices into its series)."""
        rows = [self.runs[self.at[i]] for i in picked]
        return {k[1]: [measured_value(r[k]) for r in rows if k in r] for k in self.mates}

    def pipeline(self, picked: Iterable[int]) -> Pipeline:
        """The judging pipeline over the figure's runs ``picked`` (and its mates' in those runs)."""
        rows = [self.runs[self.at[i]] for i in picked]
        return Pipeline(RecordHistories([[r[k] for r in rows for k in (self.key, *self.mates) if k in r]]))


def analyse(unchanged: Sequence[Sequence[ResultRecord]], slowed: dict[int, list[Sequence[ResultRecord]]]) -> list[Figure]:
    """The experiment's numbers per figure, from the runs' results files (oldest first)."""
    runs = [_gating_records(r) for r in unchanged]
    keys = sorted({k for r in runs for k in r})
    kinds = {k: next(r[k] for r in runs if k in r).metric.kind for k in keys}
    figures: list[Figure] = []
    for key in keys:
        at = [j for j, r in enumerate(runs) if key in r]  # the runs that hold the figure
        series = [runs[j][key] for j in at]
        if len(series) < MIN_RUNS + 1:
            continue
        first = series[0].metric
        partners = _Partners(runs, at, key, partner_keys(key, first.kind, kinds))
        fig = Figure(key, first.unit, first.direction, first.kind, [s.metric.value for s in series])
        b = band(fig.unchanged[-KEEP:], partners=partners(range(len(series))[-KEEP:]))
        fig.cv, fig.threshold, fig.detectable, fig.gates = b.sigma, b.threshold, b.detectable, b.gates
        # 1. the plugin flow: each run judged against the runs saved before it, with its own re-measurements
        for i, rec in enumerate(series):
            if i < MIN_RUNS:
                continue
            fig.flow_judged += 1
            pipeline = partners.pipeline(range(max(0, i - KEEP), i))
            if not pipeline.first(rec).failed:
                continue
            taken = list(rec.verdict.confirmations) if rec.verdict is not None else []
            alarm = pipeline.judge([_unjudged(rec)], remeasure=lambda: {key[1]: taken})[0].failed
            fig.flow_false += alarm
            fig.flow_transient += not alarm
            if alarm:
                fig.alarm_runs.append(i + 1)
        # 3. replay: leave one out, re-measurements modelled by two other runs
        n = len(series)
        for i, rec in enumerate(series):
            picked = [j for j in range(n) if j != i][-KEEP:]
            conf = [series[(i + 1) % n], series[(i + 2) % n]]
            pipeline = partners.pipeline(picked)
            first_beyond, still = _judge_replayed(pipeline, rec, conf)
            fig.replay_n += 1
            fig.replay_first += first_beyond
            fig.replay_false += still
            for size in SIZES:
                _, caught = _judge_replayed(pipeline, _scaled(rec, size), [_scaled(c, size) for c in conf])
                got, tried = fig.detect.get(size, (0, 0))
                fig.detect[size] = (got + caught, tried + 1)
        # 2. slowed runs, judged in the plugin flow against the whole history
        center = statistics.median(fig.unchanged[-KEEP:])
        for sms, slow_runs in sorted(slowed.items()):
            recs = [r for run in slow_runs for r in run if (r.test, r.metric.name, r.mode) == key]
            if not recs:
                continue
            med = statistics.median(r.metric.value for r in recs)
            change = (med - center) / center
            true = -change if fig.direction == "higher" else change
            caught = sum(r.verdict is not None and r.verdict.failed for r in recs)
            fig.slowed[sms] = (true, caught, len(recs))
        figures.append(fig)
    return figures


def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x * 100:.{digits}f}%"


def markdown(figures: Sequence[Figure], unchanged: Sequence[Sequence[ResultRecord]],
             slowed: dict[int, list[Sequence[ResultRecord]]]) -> str:
    """The tables of docs/detection.md."""
    lines: list[str] = []
    judged_runs = max(0, len(unchanged) - MIN_RUNS)
    alarm_runs = sorted({i for f in figures for i in f.alarm_runs})
    gating = [f for f in figures if f.gates]
    which = f" (run(s) {', '.join(map(str, alarm_runs))}: " + ", ".join(
        f"{f.key[1]}" for f in figures if f.alarm_runs) + ")" if alarm_runs else ""
    lines.append(f"Unchanged runs: {len(unchanged)}; judged as nightly runs (against >= {MIN_RUNS} earlier runs): "
                 f"{judged_runs}; runs with a false alarm: **{len(alarm_runs)}**{which}.")
    lines.append(f"Figures: {len(figures)}, of which {len(gating)} gate and {len(figures) - len(gating)} are too "
                 f"noisy to gate.")
    lines.append("")
    head = ["test", "metric", "mode", "kind", "CV", "threshold", "detects", "gates",
            "nightly: alarms / judged (transient)", "replay: beyond / confirmed of n",
            *[f"caught at {int(s * 100)}%" for s in SIZES]]
    slow_sms = sorted(slowed)
    head += [f"{s} SMs: true slowdown, caught" for s in slow_sms]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for f in figures:
        test, metric, mode = f.key
        row = [test.split("::", 1)[-1], metric, mode, f.kind, _pct(f.cv), _pct(f.threshold, 1),
               _pct(f.detectable, 1) if f.gates else "-", "yes" if f.gates else "no",
               f"{f.flow_false} / {f.flow_judged} ({f.flow_transient})",
               f"{f.replay_first} / {f.replay_false} of {f.replay_n}"]
        for s in SIZES:
            got, tried = f.detect.get(s, (0, 0))
            row.append(f"{got}/{tried}" if f.gates else f"({got}/{tried})")
        for s in slow_sms:
            if s in f.slowed:
                true, caught, n = f.slowed[s]
                row.append(f"{true * 100:+.1f}%, {caught}/{n}")
            else:
                row.append("-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _read_many(paths: Sequence[Path]) -> list[list[ResultRecord]]:
    out = []
    for p in paths:
        try:
            out.append(read_results(p))
        except ResultsFileError:
            continue
    return out


def cmd_detection(pytest_args: Sequence[str], unchanged: int, slow_sms: Sequence[int], slow_runs: int, out_dir: Path,
                  analyse_only: bool, out: TextIO) -> int:
    if not analyse_only:
        out_dir.mkdir(parents=True, exist_ok=True)
    baselines = (out_dir / "baselines").resolve()
    if not analyse_only:
        check_pytest_args(pytest_args)
        for i in range(1, unchanged + 1):
            path = out_dir / f"unchanged-{i:02d}.json"
            if path.exists():  # resumable: a run already made is kept
                continue
            r = run_suite(pytest_args, path, "--mig-save-baseline", "--mig-baseline-dir", str(baselines), index=i)
            r.check(pytest_command(pytest_args))  # PytestRefused: every run would be refused the same way
            print(f"detection: unchanged run {i}/{unchanged}: exit {r.returncode}, {r.seconds:.0f} s", file=out, flush=True)
        for sms in slow_sms:
            for j in range(1, slow_runs + 1):
                path = out_dir / f"slow-{sms}-{j:02d}.json"
                if path.exists():
                    continue
                r = run_suite(pytest_args, path, "--mig-baseline-dir", str(baselines), "--mig-slowdown-sms", str(sms),
                              index=j)
                r.check(pytest_command(pytest_args))
                print(f"detection: run on {sms} SMs {j}/{slow_runs}: exit {r.returncode}, {r.seconds:.0f} s",
                      file=out, flush=True)
    runs = _read_many(sorted(out_dir.glob("unchanged-*.json")))
    slowed: dict[int, list[Sequence[ResultRecord]]] = {}
    for p in sorted(out_dir.glob("slow-*-*.json")):
        sms = int(p.name.split("-")[1])
        slowed.setdefault(sms, []).extend(_read_many([p]))
    if len(runs) < MIN_RUNS + 1:
        print(f"detection: {len(runs)} unchanged run(s) in {out_dir}: at least {MIN_RUNS + 1} are needed", file=out)
        return 1
    figures = analyse(runs, slowed)
    text = markdown(figures, runs, slowed)
    atomic_write_text(out_dir / "detection.md", text)
    print(text, file=out)
    print(f"detection: written to {out_dir / 'detection.md'}", file=out)
    return 0


__all__ = ["Figure", "SIZES", "analyse", "cmd_detection", "markdown", "format_number"]
