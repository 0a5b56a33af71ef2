"""Reports: the terminal summary, markdown/CSV/JSON tables, JUnit properties, outlier nodes, plots.

Everything here takes :class:`~pytest_mig.store.results.ResultRecord` lists (whose ``verdict`` the
verdict layer has filled in) and produces text or files; nothing measures or judges.  pandas builds
the tables (like the seeds' tables), tabulate formats them, matplotlib is imported only to plot
(the optional ``plot`` extra).
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import pandas as pd

from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord, atomic_write_text
from pytest_mig.store.verdicts import OUTCOMES, Verdict
from pytest_mig.common.text import SHOWN, printable, quoted
from pytest_mig.judge.noise import PRIOR_RUNS, REFERENCE_FLOOR
from pytest_mig.judge.verdict import DEFAULT_TOLERANCE, format_number, percent
from pytest_mig.report.fleet import DeviceOutlier, device_label, median_without

if TYPE_CHECKING:
    from pytest_mig.judge.scaling import ScalingReport

#: Columns of every table, in order.
COLUMNS: tuple[str, ...] = (
    "test", "metric", "value", "unit", "baseline", "change_pct", "threshold_pct", "detectable_pct", "runs", "verdict",
    "source", "profile", "gpu", "node", "kind", "direction", "emulated", "mode", "timestamp",
)

#: Report file suffixes and the format each one writes.
REPORT_FORMATS: dict[str, str] = {".md": "markdown", ".markdown": "markdown", ".csv": "csv", ".json": "json"}

#: A node whose figure is this many times worse than the median of the other nodes is an outlier.
OUTLIER_FACTOR = 1.5


class ReportError(ValueError):
    """A report that cannot be written (unknown suffix, no matplotlib): one sentence."""


def _profile(target: TargetInfo) -> str:
    return str(target.baseline_profile or target.profile or "")


def _gpu(target: TargetInfo) -> str:
    return str(target.gpu_name or ("CPU" if target.kind == "cpu" else ""))


def _row(rec: ResultRecord) -> dict[str, Any]:
    v = rec.verdict
    return {
        "test": rec.test,
        "metric": rec.metric.name,
        "value": rec.metric.value,
        "unit": rec.metric.unit,
        "baseline": v.baseline if v else None,
        "change_pct": None if v is None or v.change_pct is None else round(float(v.change_pct), 2),
        "threshold_pct": _pct_or_none(v.threshold if v else None),
        "detectable_pct": _pct_or_none(v.detectable if v else None),
        "runs": v.runs if v else None,
        "verdict": str(v.outcome) if v else "",
        "source": v.source if v else None,  # "baseline" (the site's history) or "reference" (shipped)
        "profile": _profile(rec.target),
        "gpu": _gpu(rec.target),
        "node": rec.node,
        "kind": rec.metric.kind,
        "direction": rec.metric.direction,
        "emulated": bool(rec.target.emulated),
        "mode": rec.mode,
        "timestamp": rec.timestamp,
    }


def _pct_or_none(fraction: Any) -> float | None:
    return None if fraction is None else round(float(fraction) * 100, 2)


def _band(v: Verdict | None) -> tuple[str, str]:
    """The threshold and smallest detectable change columns of the summary ("-" where not judged)."""
    thr, det = (v.threshold, v.detectable) if v else (None, None)
    return (f"±{float(thr) * 100:.1f}%" if thr is not None else "-",
            f"{float(det) * 100:.1f}%" if det is not None and v is not None and v.gates is not False else "-")


def records_frame(records: Iterable[ResultRecord]) -> pd.DataFrame:
    """One row per record with :data:`COLUMNS`: the table every report is made from."""
    rows = [_IN_ORDER(_row(r)) for r in records]  # tuples: pandas builds a fleet's table from them quicker
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS))


#: A row's values in the order of COLUMNS.
_IN_ORDER = operator.itemgetter(*COLUMNS)


def verdict_counts(records: Iterable[ResultRecord]) -> dict[str, int]:
    """How many records got each outcome ("not judged" for records without a verdict)."""
    c = Counter(str(r.verdict.outcome or "not judged") if r.verdict else "not judged" for r in records)
    return {k: c[k] for k in (*OUTCOMES, "not judged") if c[k]}


def _short_test(test: str) -> str:
    return test.split("::", 1)[-1] if "::" in test else test


def summary_table(records: Sequence[ResultRecord], *, tablefmt: str = "simple") -> str:
    """The terminal summary: test, metric, value, unit, baseline, change, verdict (and profile
    when the run covered several)."""
    from tabulate import tabulate

    if not records:
        return "(no metrics recorded)"
    several = len({_profile(r.target) for r in records}) > 1
    headers = ["test", "metric", "value", "unit", "baseline", "change", "threshold", "detects", "verdict"] \
        + (["profile"] if several else [])
    rows = []
    for r in records:
        v = r.verdict
        outcome = str(v.outcome or "-") if v else "-"
        if v and v.throttled:
            outcome += " (throttled)"
        change = v.change_pct if v else None
        row = [_short_test(r.test), r.metric.name, format_number(r.metric.value), r.metric.unit,
               _baseline_cell(v), f"{change:+.1f}%" if change is not None else "-", *_band(v), outcome]
        if several:
            row.append(_profile(r.target))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True)


def verdict_notes(records: Sequence[ResultRecord]) -> list[str]:
    """What the table has no room for: each incomparable verdict with its reason, as a failing test's
    line reads (``INCOMPARABLE test rate 80.0 items/s not compared: measured with --mig-quick ...``)."""
    return [f"INCOMPARABLE {r.test} {r.verdict.message or r.metric.name}" for r in records
            if r.verdict is not None and r.verdict.outcome == "incomparable"]


def sharpness_line(records: Sequence[ResultRecord], limit: float | None = None) -> str | None:
    """How sharp the run's verdicts were, in one line of ASCII (None where nothing was judged): how
    many judged figures gate within ``limit`` (the run's ``--mig-tolerance`` or ini tolerance, else
    the default 5%; a marker's tolerance for one test is not this limit), how many of those would
    catch a loss of that size in 95% of runs (a known sigma, and their "detects" within it), how
    many were judged at a wider band or were too noisy to gate; then what the bands stood on where
    it was not a history of the site's own runs that measures each figure's noise (a reference,
    the device's ceiling, a history still short)."""
    verdicts = [r.verdict for r in records if r.verdict is not None and r.verdict.judged]
    if not verdicts:
        return None
    limit = DEFAULT_TOLERANCE if limit is None else limit
    pct = percent(limit)
    within = sum(1 for v in verdicts if v.gates_within(limit))
    caught = sum(1 for v in verdicts if v.catches(limit))
    noisy = sum(1 for v in verdicts if v.outcome == "noisy")
    wider = len(verdicts) - within - noisy
    parts = [f"how sharp: {within} of {len(verdicts)} judged figure(s) gate within {pct}"
             + (f", {caught} of them catching a {pct} loss (detects <= {pct})" if within else "")]
    if wider:
        parts.append(f"{wider} judged at a wider band")
    if noisy:
        parts.append(f"{noisy} too noisy to gate")
    line = "; ".join(parts) + "."
    sources = Counter(v.source for v in verdicts)
    if sources["reference"]:
        line += (f" {sources['reference']} against a reference of other runs (at least {percent(REFERENCE_FLOOR)}): "
                 "a history of the site's own runs narrows each band to the figure's noise.")
    if sources["ceiling"]:
        line += f" {sources['ceiling']} against the device's ceiling (no reference holds them)."
    runs = [v.runs for v in verdicts if v.source not in ("reference", "ceiling") and v.runs]
    if runs and min(runs) < PRIOR_RUNS:
        held = f"{min(runs)}-{max(runs)}" if max(runs) > min(runs) else f"{min(runs)}"
        line += (f" The history holds {held} run(s): each band narrows as it grows (to the figure's own "
                 f"noise alone from {PRIOR_RUNS} runs).")
    return line


def _baseline_cell(v: Verdict | None) -> str:
    """The baseline a verdict compared with; ``(ref)`` when it was the shipped reference."""
    if v is None or v.baseline is None:
        return "-"
    return format_number(v.baseline) + {"reference": " (ref)", "ceiling": " (ceiling)"}.get(v.source or "", "")


def summary_lines(records: Sequence[ResultRecord]) -> list[str]:
    """The lines pytest_terminal_summary prints: the table, then the counts."""
    counts = verdict_counts(records)
    tail = ", ".join(f"{n} {k}" for k, n in counts.items()) or "nothing"
    return [*summary_table(records).splitlines(), f"{len(records)} metric(s): {tail}"]


def _frame_of(data: Iterable[ResultRecord] | pd.DataFrame) -> pd.DataFrame:
    return data if isinstance(data, pd.DataFrame) else records_frame(data)


def _json_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    rows = frame.astype(object).to_dict(orient="records")
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()} for row in rows]


def report_format(path: Path | str) -> str:
    """The format a report path asks for by its suffix ("markdown", "csv" or "json"); a ReportError
    otherwise, so that callers can check an option before the run rather than after it."""
    path = Path(path)
    fmt = REPORT_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ReportError(f"{printable(path)}: cannot tell the report format from "
                          f"{quoted(path.suffix or 'no suffix', SHOWN)}; "
                          f"use one of {', '.join(REPORT_FORMATS)}")
    return fmt


#: What a spreadsheet reads as the start of a formula (OWASP's CSV injection list).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A text cell a spreadsheet shows as text: one that would start a formula gets a leading ``'``
    (OWASP's advice); numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def markdown_cell(value: Any) -> Any:
    """A text cell that stays one cell of a markdown table and shows as text: ``|`` escaped, line breaks
    as spaces, HTML's ``<``, ``>`` and ``&`` as entities."""
    if not isinstance(value, str):
        return value
    text = " ".join(value.splitlines())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\\", "\\\\").replace("|", "\\|")


_FLOATS = (float, np.float64)


def _markdown_text(value: Any) -> str:
    """One distinct value of a column as a markdown cell: numbers as tabulate's ``g`` writes them."""
    if type(value) in _FLOATS:  # a fleet's hundreds of thousands of figures, without the ABC checks below
        return format(float(value), "g")
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return format(float(value), "g")
    return str(markdown_cell(value if isinstance(value, str) else str(value)))


def _cell_text(value: Any) -> str:
    """One distinct value as its markdown cell; ``-`` where pandas counts it missing (None, NaN)."""
    if type(value) is float:
        return "-" if value != value else format(value, "g")
    return "-" if pd.isna(value) else _markdown_text(value)


def markdown_table(frame: pd.DataFrame) -> str:
    """The frame as a markdown (pipe) table: each distinct value of a column made a cell once (equal
    values are one, as pandas' factorize has them), so a fleet's hundreds of thousands of rows take
    about a second; a missing value is ``-``."""
    cells = []
    for col in frame.columns:
        values = frame[col].tolist()
        text = dict.fromkeys(values)
        for value in text:
            text[value] = _cell_text(value)
        cells.append(list(map(text.__getitem__, values)))
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in frame.columns]
    lines = ["| " + " | ".join(str(markdown_cell(str(c))) for c in frame.columns) + " |",
             "|" + "|".join("---:" if n else ":---" for n in numeric) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in zip(*cells))
    return "\n".join(lines) + "\n"


def _cells(frame: pd.DataFrame, safe: Any) -> pd.DataFrame:
    """The frame with every text cell (and column name) passed through ``safe``."""
    out = frame.copy()
    for col in out.columns:
        if pd.api.types.is_object_dtype(out[col]) or pd.api.types.is_string_dtype(out[col]):
            out[col] = out[col].map(safe)
    return out.rename(columns={c: safe(c) for c in out.columns})


def write_report(path: Path | str, data: Iterable[ResultRecord] | pd.DataFrame) -> Path:
    """Write the table to ``path`` as markdown, CSV or JSON (a list of row objects) by its suffix."""
    path = Path(path)
    fmt = report_format(path)
    frame = _frame_of(data)
    if fmt == "markdown":
        text = markdown_table(frame)
    elif fmt == "csv":
        text = _cells(frame, csv_cell).to_csv(index=False)
    else:
        text = json.dumps(_json_rows(frame), indent=2, allow_nan=False) + "\n"
    atomic_write_text(path, text)
    return path


def junit_properties(records: Sequence[ResultRecord], prefix: str | None = None) -> list[tuple[str, Any]]:
    """(name, value) pairs of JUnit XML properties: each metric's value, unit, verdict, baseline and
    change, then the Target's profile and GPU.  Names get ``prefix::`` in front (a test suite's
    properties, named by the test's node id), else the test's key when the records span several tests."""
    several = len({r.test for r in records}) > 1
    out: list[tuple[str, Any]] = []
    for r in records:
        name = f"{prefix}::{r.metric.name}" if prefix else f"{r.test}::{r.metric.name}" if several else r.metric.name
        out.append((name, r.metric.value))
        out.append((f"{name}.unit", r.metric.unit))
        v = r.verdict
        if v is None:
            continue
        if v.outcome:
            out.append((f"{name}.verdict", v.outcome))
        if v.baseline is not None:
            out.append((f"{name}.baseline", v.baseline))
            out.append((f"{name}.baseline_source", v.source or "baseline"))
        if v.change_pct is not None:
            out.append((f"{name}.change_pct", round(float(v.change_pct), 2)))
    if records:
        mig = f"{prefix}::mig" if prefix else "mig"
        out.append((f"{mig}.profile", _profile(records[0].target)))
        out.append((f"{mig}.gpu", _gpu(records[0].target)))
    return out


# -- merged reports across nodes -----------------------------------------------------------------


@dataclass
class Outlier:
    """A node whose figure is far worse than the same test's on the other nodes."""

    node: str
    test: str
    metric: str
    gpu: str
    profile: str
    value: float
    unit: str
    others_median: float
    others: int
    factor: float  # how many times worse
    mode: str = "normal"

    def line(self) -> str:
        quick = " (quick)" if self.mode == "quick" else ""
        return (f"OUTLIER node {self.node}: {self.test} {self.metric} {format_number(self.value)} {self.unit} "
                f"on {self.gpu} {self.profile}{quick} is {self.factor:.1f}x worse than the median "
                f"{format_number(self.others_median)} {self.unit} of {self.others} other node(s)")


def find_outliers(records: Iterable[ResultRecord], factor: float = OUTLIER_FACTOR) -> list[Outlier]:
    """Nodes at least ``factor`` times worse than the median of the other nodes, for the same test,
    metric, GPU model and profile (several records of one node are reduced to their median)."""
    groups: dict[tuple[str, str, str, str, str], dict[str, list[ResultRecord]]] = {}
    for r in records:
        if not r.metric.compare or not math.isfinite(r.metric.value):
            continue
        key = (r.test, r.metric.name, _gpu(r.target), _profile(r.target), r.mode)  # quick runs measure other sizes
        groups.setdefault(key, {}).setdefault(r.node, []).append(r)
    out: list[Outlier] = []
    for (test, metric, gpu, profile, mode), nodes in sorted(groups.items()):
        if len(nodes) < 2:
            continue
        values = sorted((statistics.median(x.metric.value for x in rs), n) for n, rs in nodes.items())
        ordered = [v for v, _ in values]
        first = next(iter(nodes.values()))[0].metric
        found = []
        for pos, (value, node) in enumerate(values):
            med = median_without(ordered, pos)  # the other nodes' median
            if value <= 0 or med <= 0:
                continue
            worse = med / value if first.direction == "higher" else value / med
            if worse >= factor:
                found.append(Outlier(node, test, metric, gpu, profile, value, first.unit, med, len(values) - 1, worse,
                                     mode))
        out.extend(sorted(found, key=lambda o: o.node))
    return out


def merged_frame(records: Sequence[ResultRecord], outliers: Sequence[Outlier],
                 devices: Sequence[DeviceOutlier] = ()) -> pd.DataFrame:
    """The merged table, a ``device`` column naming each row's board, and an ``outlier`` column marking
    the rows of outlier nodes (``<< 3.0x worse``) and outlier devices (``<< 8.1% worse``)."""
    labels: dict[tuple[int, str], str] = {}  # a fleet's records share a Target object per file: labelled once
    device = []
    for r in records:
        label = labels.get((id(r.target), r.node))
        if label is None:
            label = labels[(id(r.target), r.node)] = device_label(r)
        device.append(label)
    marks = {(o.test, o.metric, o.gpu, o.profile, o.mode, o.node): f"<< {o.factor:.1f}x worse" for o in outliers}
    boards = {(d.test, d.metric, d.node, d.device): f"<< {d.worse * 100:.1f}% worse than {d.others} devices"
              for d in devices}
    nodes, boards_at = {o.node for o in outliers}, {(d.node, d.device) for d in devices}  # most rows: neither
    outlier = [(r.node in nodes and marks.get((r.test, r.metric.name, _gpu(r.target), _profile(r.target), r.mode,
                                               r.node)))
               or ((r.node, d) in boards_at and boards.get((r.test, r.metric.name, r.node, d))) or ""
               for r, d in zip(records, device)]
    frame = records_frame(records)
    frame.insert(frame.columns.get_loc("node") + 1, "device", device)
    frame["outlier"] = outlier
    frame = frame.sort_values(["test", "metric", "gpu", "profile", "node", "device"], kind="stable")
    return frame.reset_index(drop=True)


def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"  # no baseline, no change: as the summary table shows it
    return format_number(v) if isinstance(v, float) else v


def frame_table(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    """A DataFrame as a terminal table (numbers in four significant figures)."""
    from tabulate import tabulate

    cols = [c for c in (columns or frame.columns) if c in frame.columns]
    rows = [[_cell(v) for v in row] for row in frame[cols].astype(object).itertuples(index=False)]
    return tabulate(rows, headers=cols, tablefmt="simple", disable_numparse=True)


# -- plots ---------------------------------------------------------------------------------------


def plot_scaling(report: "ScalingReport", path: Path | str) -> Path:
    """Speed-up over the smallest profile against the ideal, one panel per metric (PNG/SVG/PDF).

    Needs matplotlib (``pip install 'pytest-mig[plot]'``); uses its object API and the Agg canvas,
    so it neither needs a display nor changes the caller's pyplot backend.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("plotting needs matplotlib, which is not installed: pip install 'pytest-mig[plot]'") from None
    if not report.groups:
        raise ReportError("nothing to plot: no metric was measured on two or more profiles of one GPU model")
    path = Path(path)
    n = len(report.groups)
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(5 * ncols, 3.6 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    row_of_pair = {(r.gpu, r.test, r.metric, r.family, r.bigger, r.smaller): r for r in report.rows}
    for i, g in enumerate(report.groups):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        base = g.rungs[0].value
        measured = [(r.value / base) if g.direction == "higher" else (base / r.value) for r in g.rungs]
        pairs = [row_of_pair.get((g.gpu, g.test, g.metric, g.family, big.profile, small.profile))
                 for small, big in zip(g.rungs, g.rungs[1:])]
        ideal = [1.0]
        for row in pairs:
            ideal.append(ideal[-1] * row.ideal if row is not None else float("nan"))
        xs = list(range(len(g.rungs)))
        ax.plot(xs, ideal, "--", color="grey", marker="o", label=f"ideal ({g.basis})")
        ax.plot(xs, measured, "-", color="tab:blue", marker="s", label="measured")
        for x, row in enumerate(pairs, start=1):
            result = row.result if row is not None else "ok"
            if result != "ok":  # FAIL, power-limited, bandwidth-shared: say so at the point
                ax.annotate(result, (x, measured[x]), textcoords="offset points", xytext=(-4, 6), ha="right",
                            fontsize=7, color="tab:red" if result == "FAIL" else "tab:orange")
        ax.set_xticks(xs, [r.profile for r in g.rungs], rotation=30, ha="right")
        ax.set_ylabel(f"speed-up over {g.rungs[0].profile}")
        ax.set_title(f"{_short_test(g.test)} {g.metric}\n{g.gpu} ({g.family})", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
