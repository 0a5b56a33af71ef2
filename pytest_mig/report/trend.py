"""The trend page: every figure's history on one static HTML page (``pytest-mig history``).

As asv publishes its pages, but one self-contained file: inline CSS, inline SVG (``report.chart``)
and inline script (a filter, and the zoom of the time axis); no CDN, no network, so it opens from a
CI artifact or a shared folder.  Every text from a file is escaped for the place it goes (element
text, attribute); no file text goes into the script or the style, and the page's
Content-Security-Policy lets a browser run only that script and apply only that style (their SHA-256
hashes): nothing else, no inline handler, no remote resource.  Made from a baseline folder (every run
saved into a history) and results files (every run, with its verdict); a run found in both is drawn
once, with its verdict.

At the top: one state line over every group's latest run (what regressed, or that nothing could be
judged), the regressions, linked to their charts, and a table of each GPU model, profile and mode's
latest run.  Per figure: a chart of its runs on a time axis (``report.chart``).
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from pytest_mig.store.baselines import BaselineStore, meta_from_record
from pytest_mig.store.reader import load_baseline_file
from pytest_mig.store.results import ResultRecord, atomic_write_text, read_results_file, utc_now
from pytest_mig.store.verdicts import JUDGED
from pytest_mig.judge.verdict import fingerprint_changes, format_number
from pytest_mig.report.axes import parse_time
from pytest_mig.report.chart import COLOURS, ZOOM_SCRIPT, esc, outcome_class, svg

#: Fingerprint keys whose change is marked on the time axis (what a nightly is run to watch).
WATCHED = ("driver", "cuda_driver", "cuda_runtime", "vbios", "gsp", "inforom", "torch", "pytest_mig", "transformers",
           "peft", "bitsandbytes", "openmm", "gpu_uuid", "power_limit_w", "max_sm_clock_mhz", "ecc")



@dataclass
class Point:
    """One run of one figure."""

    at: str
    value: float
    outcome: str = "saved"  # a run known only from a baseline history has no verdict of its own
    baseline: float | None = None
    threshold: float | None = None
    message: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)
    node: str = ""
    run: str = ""  # the results file it came from ("": known only from a baseline history)
    stopped: str = ""  # the run was stopped partway ("SIGTERM", "interrupted"): its file is incomplete


@dataclass
class Series:
    """One figure of one GPU model and profile, in one mode, over the runs."""

    gpu_model: str
    profile: str
    mode: str
    test: str
    metric: str
    unit: str
    direction: str
    points: list[Point] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.gpu_model, self.profile, self.mode, self.test, self.metric)

    def changes(self) -> list[tuple[int, list[str], str]]:
        """(index of the first run after the change, what changed, a short label) per fingerprint change:
        ``["driver 580.159.04 -> 590.10.02"]`` and ``driver 590.10.02``."""
        out = []
        for i in range(1, len(self.points)):
            if self.points[i].run and self.points[i].run == self.points[i - 1].run:
                continue  # two devices of one node-mode run: not a change over time
            old = {k: v for k, v in self.points[i - 1].fingerprint.items() if k in WATCHED}
            new = {k: v for k, v in self.points[i].fingerprint.items() if k in WATCHED}
            changed = fingerprint_changes(old, new)
            if changed:
                out.append((i, [f"{label} {a} -> {b}" for label, a, b in changed],
                            ", ".join(f"{label} {_short(b)}" for label, _, b in changed)))
        return out


def _short(value: str) -> str:
    """A board's UUID cut to its first group ('GPU-4ea5a3af'); other values as they are."""
    return value[:12] if value.startswith(("GPU-", "MIG-")) else value


def collect(baseline_dir: Path | None, results: Sequence[Path]) -> list[Series]:
    """Every compared figure's runs, oldest first.  ResultsFileError / BaselineError on a bad file."""
    series: dict[tuple[str, str, str, str, str], Series] = {}
    from_results: set[tuple[Any, ...]] = set()  # (figure, time, board) of every run a results file holds

    def add(s: Series, p: Point) -> None:
        series.setdefault(s.key, s).points.append(p)

    for path in results:  # verdicts first: a run that is also in a history keeps its verdict
        records, meta = read_results_file(path)
        stopped = str(meta.get("stopped") or "")
        for rec in records:
            if rec.metric.compare and math.isfinite(rec.metric.value):
                s, p = _series_of(rec), _point_of(rec, str(path), stopped)
                from_results.add((s.key, p.at, p.fingerprint.get("gpu_uuid")))
                add(s, p)  # several devices of a node-mode file may share a second: each is a point
    if baseline_dir is not None:
        for path in BaselineStore(baseline_dir).files():
            base = load_baseline_file(path)
            for e in base.entries.values():
                s = Series(base.meta.gpu_model, base.meta.profile, e.mode, e.test, e.metric, e.unit, e.direction)
                for run in e.runs:
                    if (s.key, run.recorded_at, run.fingerprint.get("gpu_uuid")) not in from_results:
                        add(s, Point(run.recorded_at, run.value, fingerprint=dict(run.fingerprint)))
    for s in series.values():
        s.points.sort(key=lambda p: p.at)
    return sorted(series.values(), key=lambda s: s.key)


def _series_of(rec: ResultRecord) -> Series:
    meta = meta_from_record(rec)
    m = rec.metric
    return Series(meta.gpu_model, meta.profile, rec.mode, rec.test, m.name, m.unit, m.direction)


def _point_of(rec: ResultRecord, run: str, stopped: str = "") -> Point:
    v = rec.verdict
    if v is None:
        return Point(rec.timestamp, float(rec.metric.value), "no-baseline", None, None, "", dict(rec.fingerprint or {}),
                     rec.node, run, stopped)
    return Point(rec.timestamp, float(rec.metric.value), str(v.outcome or "no-baseline"), v.baseline, v.threshold,
                 v.message, dict(rec.fingerprint or {}), rec.node, run, stopped)


# -- the page --------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#212121;background:#fafafa}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ccc}
h3{font-size:15px;margin:18px 0 6px;font-family:monospace}
.meta{color:#616161} .grid{display:flex;flex-wrap:wrap;gap:12px}
.figure{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
.figure .name{font-family:monospace;font-size:13px} .figure.regressed{border-color:#c62828}
table.summary{border-collapse:collapse;margin:8px 0} table.summary td,table.summary th{border:1px solid #ddd;
padding:4px 8px;text-align:left;vertical-align:top} .bad{color:#c62828;font-weight:600} .ok{color:#2e7d32}
.none{color:#616161;font-weight:600} .state{font-size:16px;margin:12px 0}
.legend span{display:inline-block;margin-right:12px} .dot{display:inline-block;width:10px;height:10px;
border-radius:50%;margin-right:4px;vertical-align:middle} .hidden{display:none} .fp{color:#6a1b9a}
svg.chart{cursor:crosshair;user-select:none} svg.chart .out{display:none} .zoom button{margin-right:4px}
""" + "".join(f".dot.o-{k}{{background:{c}}} .v-{k}{{color:{c}}}\n" for k, c in COLOURS.items())

SCRIPT = """
(function () {
  var figures = document.querySelectorAll('.figure');
  var box = document.getElementById('only-regressed');
  function apply() {
    figures.forEach(function (f) {
      f.classList.toggle('hidden', box.checked && !f.classList.contains('regressed'));
    });
  }
  box.addEventListener('change', apply);
  document.getElementById('figure-count').textContent = figures.length + ' figures';
})();
""" + ZOOM_SCRIPT + """document.body.dataset.ready = 'yes';
"""
#: The zoom buttons: (label, days; 0 is every run).
RANGES = (("all", 0), ("90 days", 90), ("30 days", 30), ("7 days", 7), ("2 days", 2), ("1 day", 1))


def _sha256(text: str) -> str:
    """A CSP source expression for an inline script or style: ``'sha256-<base64>'`` of its UTF-8 text."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def csp() -> str:
    """The page's Content-Security-Policy: its own script and style (by hash), nothing else."""
    return (f"default-src 'none'; script-src {_sha256(SCRIPT)}; style-src {_sha256(CSS)}; img-src data:; "
            "base-uri 'none'; form-action 'none'")


def _figure(s: Series, ident: str) -> str:
    last = s.points[-1]
    better = "higher is better" if s.direction == "higher" else "lower is better"
    cls = "figure regressed" if last.outcome == "regressed" else "figure"
    return (f'<div class="{cls}" data-figure="{esc(s.test + "::" + s.metric)}" data-last="{last.value!r}" '
            f'data-verdict="{esc(last.outcome)}" id="{ident}"><div class="name">{esc(s.metric)} ({esc(s.unit)}, {better}): '
            f'last {esc(format_number(last.value))}, <span class="v-{outcome_class(last.outcome)}">'
            f'{esc(last.outcome)}</span></div>{svg(s, ident)}</div>')


def _verdict_cell(now: list[tuple[Series, Point]]) -> str:
    """What regressed in a group's latest run; "nothing judged" where no figure of it had a verdict."""
    bad = [(s, p) for s, p in now if p.outcome == "regressed"]
    if bad:
        items = "".join(f"<li><code>{esc(s.test.split('::')[-1])} {esc(s.metric)}</code>: "
                        f"{esc(format_number(p.value))} {esc(s.unit)}, {esc(_change(p))}</li>" for s, p in bad)
        shown = " open" if len(bad) <= 8 else ""
        return f'<details{shown}><summary class="bad">{len(bad)} regressed</summary><ul>{items}</ul></details>'
    if any(p.outcome in JUDGED for _, p in now):
        return '<span class="ok">nothing regressed</span>'
    return '<span class="none">nothing judged</span>'


def _summary(latest: dict[tuple[str, str, str], tuple[str, list[tuple[Series, Point]]]]) -> str:
    rows = []
    for (gpu, profile, mode), (when, now) in latest.items():
        counts: dict[str, int] = {}
        for _, p in now:
            counts[p.outcome] = counts.get(p.outcome, 0) + 1
        what = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        stopped = next((p.stopped for _, p in now if p.stopped), "")
        if stopped:  # fewer figures than a whole night: say why, beside what it did measure
            when += f" stopped ({stopped}): incomplete"
        rows.append(f"<tr><td>{esc(gpu)}</td><td>{esc(profile)}</td><td>{esc(mode)}</td><td>{esc(when)}</td>"
                    f"<td>{_verdict_cell(now)}</td><td>{esc(what)}</td></tr>")
    return ('<table class="summary"><tr><th>GPU model</th><th>profile</th><th>mode</th><th>latest run</th>'
            '<th>what regressed in it</th><th>its verdicts</th></tr>' + "".join(rows) + "</table>")


def _state(now: list[tuple[Series, Point]]) -> str:
    """The page's one-line state over every group's latest run: what regressed, or that nothing was judged."""
    outcomes = [p.outcome for _, p in now]
    judged = sum(o in JUDGED for o in outcomes)
    regressed, unbased = outcomes.count("regressed"), outcomes.count("no-baseline")
    if regressed:
        return f'<p class="state bad">{regressed} figure(s) regressed in the latest runs ({judged} judged)</p>'
    if judged:
        rest = f"; {unbased} with no baseline yet" if unbased else ""
        return f'<p class="state ok">nothing regressed in the latest runs: {judged} figure(s) judged{rest}</p>'
    if unbased:
        return (f'<p class="state none">no figure has a history yet: nothing judged ({unbased} figure(s) measured '
                f'with no baseline to judge them against)</p>')
    if outcomes and all(o == "saved" for o in outcomes):
        return '<p class="state none">saved runs only (no results files), so no verdicts: nothing judged</p>'
    return f'<p class="state none">nothing judged ({len(outcomes)} figure(s), none with a verdict)</p>'


def _regressions(now: list[tuple[Series, Point]], ids: dict[tuple[str, ...], str]) -> str:
    """Every figure that regressed in its group's latest run, linked to its chart."""
    bad = [(s, p) for s, p in now if p.outcome == "regressed"]
    if not bad:
        return ""
    items = "".join(f'<li><a href="#{ids[s.key]}"><code>{esc(s.test)} {esc(s.metric)}</code></a> '
                    f"({esc(s.gpu_model)} &middot; {esc(s.profile)} &middot; {esc(s.mode)}): "
                    f"{esc(format_number(p.value))} {esc(s.unit)}, {esc(_change(p))}</li>" for s, p in bad)
    return f'<h2>Regressions</h2><ol class="regressions">{items}</ol>'


def _latest_run(series: list[Series]) -> tuple[str, list[tuple[Series, Point]]]:
    """The group's latest run (the results file whose figures are newest) and its points; with no
    results files, each figure's newest saved run."""
    ends: dict[str, str] = {}
    for s in series:
        for p in s.points:
            if p.run:
                ends[p.run] = max(ends.get(p.run, ""), p.at)
    if not ends:
        return max(s.points[-1].at for s in series), [(s, s.points[-1]) for s in series]
    run = max(ends, key=lambda r: ends[r])
    return f"{ends[run]} ({Path(run).name})", [(s, p) for s in series for p in s.points if p.run == run]


def _change(p: Point) -> str:
    if p.baseline is None or not p.baseline:
        return "no baseline"
    return f"{(p.value - p.baseline) / abs(p.baseline) * 100:+.1f}% against {format_number(p.baseline)}"


def _head(title: str) -> str:
    legend = "".join(f'<span><i class="dot o-{k}"></i>{esc(k)}</span>' for k in COLOURS)
    zoom = "".join(f'<button type="button" data-days="{days}">{label}</button>' for label, days in RANGES)
    return (f"<h1>{esc(title)}</h1>"
            f'<p class="meta">made {esc(utc_now())} by pytest-mig history; <span id="figure-count"></span>; '
            f'<label><input type="checkbox" id="only-regressed"> only figures whose last run regressed</label></p>'
            f'<p class="legend">{legend}<span>shaded: the band each run was judged against (baseline and '
            f'threshold)</span><span class="fp">dashed: the fingerprint changed</span><span>times in UTC</span></p>'
            f'<p class="zoom meta">time axis: {zoom} or drag across a chart to zoom it, double-click to go back</p>')


def render(series: Iterable[Series], title: str = "pytest-mig trend") -> str:
    """The whole page as one HTML string."""
    groups: dict[tuple[str, str, str], list[Series]] = {}
    for s in series:
        if s.points:
            groups.setdefault((s.gpu_model, s.profile, s.mode), []).append(s)
    latest = {key: _latest_run(items) for key, items in groups.items()}
    now = [sp for _, points in latest.values() for sp in points]
    ids = {s.key: f"f-{i}" for i, s in enumerate(s for items in groups.values() for s in items)}
    times = [t for items in groups.values() for s in items for t in (parse_time(p.at) for p in s.points) if t is not None]
    body = [_head(title), _state(now) if groups else '<p class="state none">No figures.</p>', _regressions(now, ids),
            "<h2>Latest runs</h2>", _summary(latest) if groups else ""]
    for (gpu, profile, mode), items in groups.items():
        body.append(f"<h2>{esc(gpu)} &middot; {esc(profile)} &middot; {esc(mode)}</h2>")
        by_test: dict[str, list[Series]] = {}
        for s in items:
            by_test.setdefault(s.test, []).append(s)
        for test, figs in by_test.items():
            body.append(f'<h3>{esc(test)}</h3><div class="grid">' + "".join(_figure(s, ids[s.key]) for s in figs)
                        + "</div>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(csp())}"><title>{esc(title)}</title>'
            f'<style>{CSS}</style></head><body data-latest="{max(times, default=0.0)!r}">{"".join(body)}'
            f"<script>{SCRIPT}</script></body></html>\n")


def write_page(out: Path, baseline_dir: Path | None, results: Sequence[Path], title: str = "pytest-mig trend") -> int:
    """Write the page; the number of figures drawn."""
    series = collect(baseline_dir, results)
    atomic_write_text(out, render(series, title))
    return len(series)


__all__ = ["COLOURS", "Point", "Series", "WATCHED", "collect", "csp", "render", "write_page"]
