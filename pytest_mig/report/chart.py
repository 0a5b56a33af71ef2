"""One figure of the trend page as an inline SVG, and the page script that zooms its time axis.

The x axis is time (UTC), proportional, with date and time-of-day tick labels (:mod:`report.axes`);
where a run's time cannot be read the chart falls back to the run's index ("run 3").  The y axis has
"nice" labelled ticks and gridlines.  A figure none of whose values or baselines is negative cannot be
negative: its axis and its bands stop at zero.

Every element the zoom moves carries its time in a ``data-`` attribute (``data-t``: a point, a
fingerprint change; ``data-a``/``data-b``: the edges of a run's band), the values line its
``data-pts``; :data:`ZOOM_SCRIPT` redraws them and the x ticks for a time range.  Every text from a
file is escaped (:func:`esc`); the script reads only numbers the page wrote.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_mig.judge.verdict import format_number
from pytest_mig.report.axes import TIME_STEPS, TIME_TICKS, nice_ticks, parse_time, tick_label, time_domain, time_ticks

if TYPE_CHECKING:
    from pytest_mig.report.trend import Point, Series

#: Point colours per verdict outcome.
COLOURS = {"pass": "#2e7d32", "regressed": "#c62828", "improved": "#1565c0", "transient": "#ef6c00",
           "noisy": "#9e9e9e", "no-baseline": "#616161", "incomparable": "#616161", "saved": "#455a64"}
WIDTH, HEIGHT = 540, 200
LEFT, RIGHT, TOP, BOTTOM = 58, 506, 24, 166  # the plot area inside the SVG (room for the labels around it)


def esc(x: Any) -> str:
    """Text for the page's element text and quoted attribute values: ``<``, ``>``, ``&`` and both quotes escaped."""
    return html.escape(str(x), quote=True)


def outcome_class(outcome: str) -> str:
    """A verdict outcome as a class name: one of :data:`COLOURS`' keys, or ``other`` for any text a file holds."""
    return outcome if outcome in COLOURS else "other"


def band(p: "Point", floor: float | None) -> tuple[float, float] | None:
    """The band a run was judged against (baseline times one minus and plus the threshold), its bottom
    raised to ``floor`` where one is given; None for a run with no baseline."""
    if p.baseline is None or p.threshold is None:
        return None
    low, high = sorted((p.baseline * (1 - p.threshold), p.baseline * (1 + p.threshold)))
    return (low if floor is None else max(low, floor)), high


def non_negative(s: "Series") -> bool:
    """Whether the figure is drawn as one that cannot be negative: none of its values or baselines is."""
    return all(p.value >= 0 and (p.baseline is None or p.baseline >= 0) for p in s.points)


@dataclass
class Frame:
    """A chart's scales: time (or run index) ``t0..t1`` across, ``lo..hi`` up; ``kind`` "time" or "index"."""

    kind: str
    times: list[float]
    t0: float
    t1: float
    lo: float
    hi: float
    yticks: list[float]

    def x(self, t: float) -> float:
        return LEFT + (RIGHT - LEFT) * (t - self.t0) / (self.t1 - self.t0)

    def y(self, v: float) -> float:
        return BOTTOM - (BOTTOM - TOP) * (v - self.lo) / (self.hi - self.lo)

    def edges(self) -> list[tuple[float, float]]:
        """Each run's stretch of the time axis: halfway to the runs before and after it (runs of one time share it)."""
        unique = sorted(set(self.times))
        gap = (unique[1] - unique[0]) if len(unique) > 1 else (self.t1 - self.t0) / 2
        last_gap = (unique[-1] - unique[-2]) if len(unique) > 1 else gap
        cut = [unique[0] - gap / 2] + [(a + b) / 2 for a, b in zip(unique, unique[1:])] + [unique[-1] + last_gap / 2]
        where = {t: (cut[i], cut[i + 1]) for i, t in enumerate(unique)}
        return [where[t] for t in self.times]


def frame_of(s: "Series") -> Frame:
    """The scales of one figure's chart."""
    parsed = [parse_time(p.at) for p in s.points]
    kind = "time" if all(t is not None for t in parsed) else "index"
    times = [float(t) for t in parsed] if kind == "time" else [float(i) for i in range(len(s.points))]  # type: ignore[arg-type]
    if kind == "time":
        t0, t1 = time_domain(times)
    else:
        t0, t1 = -0.5, max(len(times) - 0.5, 0.5)
    floor = 0.0 if non_negative(s) else None
    spans = [b for b in (band(p, floor) for p in s.points) if b is not None]
    values = [p.value for p in s.points] + [v for b in spans for v in b]
    lo, hi, ticks = nice_ticks(min(values), max(values))
    return Frame(kind, times, t0, t1, lo, hi, ticks)


def x_ticks(f: Frame, t0: float, t1: float) -> str:
    """The x ticks and their gridlines between ``t0`` and ``t1`` (the markup :data:`ZOOM_SCRIPT` also writes)."""
    if f.kind == "time":
        ticks = time_ticks(t0, t1)
    else:
        step = max(1, -(-(t1 - t0) // 5))
        ticks = [(float(i), f"run {i + 1}", "") for i in range(int(-(-t0 // step) * step), int(t1) + 1, int(step))]
    out = []
    for t, day, clock in ticks:
        x = f.x(t)
        out.append(f'<line class="vgrid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{BOTTOM}" stroke="#eeeeee"/>'
                   f'<text class="xtick" x="{x:.1f}" y="{BOTTOM + 13}" font-size="10" fill="#616161" '
                   f'text-anchor="middle"><tspan x="{x:.1f}">{esc(day)}</tspan>'
                   f'<tspan x="{x:.1f}" dy="11">{esc(clock)}</tspan></text>')
    return "".join(out)


def y_ticks(f: Frame) -> str:
    """The labelled y ticks, each with its gridline across the plot."""
    step = f.yticks[1] - f.yticks[0] if len(f.yticks) > 1 else 1.0
    out = []
    for v in f.yticks:
        y = f.y(v)
        out.append(f'<line class="hgrid" x1="{LEFT}" x2="{RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
                   f'<text class="ytick" x="{LEFT - 4}" y="{y + 3:.1f}" font-size="10" fill="#616161" '
                   f'text-anchor="end">{esc(tick_label(v, step))}</text>')
    return "".join(out)


def _bands(s: "Series", f: Frame) -> str:
    floor = 0.0 if non_negative(s) else None
    out = []
    for p, (a, b) in zip(s.points, f.edges()):
        span = band(p, floor)
        if span is None or p.baseline is None:
            continue
        top, bottom, xa, xb = f.y(span[1]), f.y(span[0]), f.x(a), f.x(b)
        out.append(f'<rect class="band" data-a="{a!r}" data-b="{b!r}" x="{xa:.1f}" y="{top:.1f}" '
                   f'width="{xb - xa:.1f}" height="{bottom - top:.1f}" fill="#90caf9" fill-opacity="0.35"/>'
                   f'<line class="base" data-a="{a!r}" data-b="{b!r}" x1="{xa:.1f}" x2="{xb:.1f}" '
                   f'y1="{f.y(p.baseline):.1f}" y2="{f.y(p.baseline):.1f}" stroke="#1e88e5" stroke-width="1"/>')
    return "".join(out)


def _changes(s: "Series", f: Frame) -> str:
    out = []
    for i, diff, short in s.changes():
        t = (f.times[i - 1] + f.times[i]) / 2
        cx = f.x(t)
        short = short if len(short) <= 48 else short[:46] + "..."
        out.append(f'<line class="fp-change" data-t="{t!r}" x1="{cx:.1f}" x2="{cx:.1f}" y1="{TOP - 6}" '
                   f'y2="{BOTTOM + 4}" stroke="#6a1b9a" stroke-dasharray="4 3"><title>{esc(", ".join(diff))}</title>'
                   f'</line><text class="fp-label" data-t="{t!r}" x="{cx + 3:.1f}" y="{TOP - 8}" font-size="9" '
                   f'fill="#6a1b9a">{esc(short)}</text>')
    return "".join(out)


def _runs(s: "Series", f: Frame) -> str:
    out = []
    if len(s.points) > 1:
        d = " ".join(f"{'M' if i == 0 else 'L'}{f.x(t):.1f},{f.y(p.value):.1f}" for i, (t, p) in enumerate(zip(f.times, s.points)))
        pts = " ".join(f"{t!r},{f.y(p.value):.1f}" for t, p in zip(f.times, s.points))
        out.append(f'<path class="values" d="{d}" data-pts="{pts}" fill="none" stroke="#424242" stroke-width="1.2"/>')
    for t, p in zip(f.times, s.points):
        tip = f"{p.at} {p.node}: {format_number(p.value)} {s.unit}, {p.outcome}" + (f"\n{p.message}" if p.message else "")
        out.append(f'<circle class="run {outcome_class(p.outcome)}" data-t="{t!r}" cx="{f.x(t):.1f}" '
                   f'cy="{f.y(p.value):.1f}" r="4" fill="{COLOURS.get(p.outcome, "#616161")}"><title>{esc(tip)}</title>'
                   f'</circle>')
    return "".join(out)


def svg(s: "Series", ident: str) -> str:
    """An inline SVG of one figure: the axes, the bands, the values, the verdicts, the fingerprint changes;
    ``ident`` names its clip path (unique on the page)."""
    f = frame_of(s)
    return (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
            f'data-kind="{f.kind}" data-f0="{f.t0!r}" data-f1="{f.t1!r}" data-l="{LEFT}" data-r="{RIGHT}" '
            f'data-top="{TOP}" data-bottom="{BOTTOM}" data-lo="{f.lo!r}" data-hi="{f.hi!r}">'
            f'<clipPath id="clip-{ident}"><rect x="{LEFT}" y="0" width="{RIGHT - LEFT}" '
            f'height="{BOTTOM + 4}"/></clipPath>{y_ticks(f)}<g class="xticks">{x_ticks(f, f.t0, f.t1)}</g>'
            f'<line x1="{LEFT}" x2="{RIGHT}" y1="{BOTTOM}" y2="{BOTTOM}" stroke="#9e9e9e"/>'
            f'<g clip-path="url(#clip-{ident})">{_bands(s, f)}{_changes(s, f)}{_runs(s, f)}</g>'
            f'<rect class="sel" x="0" y="{TOP}" width="0" height="{BOTTOM - TOP}" fill="#1565c0" fill-opacity="0.15"/>'
            "</svg>")


#: The page script's zoom: range buttons and ``#last=7d`` (every time chart), drag across a chart
#: (that chart), double-click (back to the page's range).  It redraws the x ticks as :func:`x_ticks` does.
ZOOM_SCRIPT = """
(function () {
  var STEPS = %STEPS%, TICKS = %TICKS%, DAY = 86400, NS = 'http://www.w3.org/2000/svg';
  var charts = document.querySelectorAll('svg.chart'), latest = parseFloat(document.body.dataset.latest);
  function num(el, k) { return parseFloat(el.getAttribute('data-' + k)); }
  function set(el, attrs) { for (var k in attrs) el.setAttribute(k, attrs[k]); return el; }
  function step(span, kind) {
    if (kind === 'index') return Math.max(1, Math.ceil(span / 5));
    for (var i = 0; i < STEPS.length; i++) if (span / STEPS[i] <= TICKS) return STEPS[i];
    var big = STEPS[STEPS.length - 1];
    return big * Math.ceil(span / (big * TICKS));
  }
  function label(t, s, kind) {
    if (kind === 'index') return ['run ' + Math.round(t + 1), ''];
    var iso = new Date(t * 1000).toISOString();
    return [iso.slice(0, 10), s >= DAY ? '' : iso.slice(11, s < 60 ? 19 : 16)];
  }
  function draw(svg, t0, t1) {
    var L = num(svg, 'l'), R = num(svg, 'r'), top = num(svg, 'top'), bottom = num(svg, 'bottom');
    var kind = svg.getAttribute('data-kind');
    function x(t) { return (L + (t - t0) / (t1 - t0) * (R - L)).toFixed(1); }
    svg.setAttribute('data-v0', t0); svg.setAttribute('data-v1', t1);
    svg.querySelectorAll('[data-t]').forEach(function (el) {
      var t = num(el, 't');
      el.classList.toggle('out', t < t0 || t > t1);
      if (el.tagName === 'circle') set(el, {cx: x(t)});
      else if (el.tagName === 'line') set(el, {x1: x(t), x2: x(t)});
      else set(el, {x: (parseFloat(x(t)) + 3).toFixed(1)});
    });
    svg.querySelectorAll('[data-a]').forEach(function (el) {
      var a = x(num(el, 'a')), b = x(num(el, 'b'));
      if (el.tagName === 'rect') set(el, {x: a, width: (b - a).toFixed(1)}); else set(el, {x1: a, x2: b});
    });
    var path = svg.querySelector('path.values');
    if (path) path.setAttribute('d', path.getAttribute('data-pts').split(' ').map(function (p, i) {
      var q = p.split(','); return (i ? 'L' : 'M') + x(parseFloat(q[0])) + ',' + q[1];
    }).join(' '));
    var g = svg.querySelector('g.xticks'), s = step(t1 - t0, kind);
    while (g.firstChild) g.removeChild(g.firstChild);
    for (var t = Math.ceil(t0 / s) * s; t <= t1 + 1e-6; t += s) {
      var lines = label(t, s, kind), text = set(document.createElementNS(NS, 'text'), {'class': 'xtick', x: x(t),
        y: bottom + 13, 'font-size': 10, fill: '#616161', 'text-anchor': 'middle'});
      g.appendChild(set(document.createElementNS(NS, 'line'), {'class': 'vgrid', x1: x(t), x2: x(t), y1: top,
        y2: bottom, stroke: '#eeeeee'}));
      lines.forEach(function (line, i) {
        var span = set(document.createElementNS(NS, 'tspan'), {x: x(t)});
        if (i) span.setAttribute('dy', 11);
        span.textContent = line; text.appendChild(span);
      });
      g.appendChild(text);
    }
  }
  function range(svg) {
    var days = parseFloat(document.body.dataset.zoom || '0');
    if (!days || svg.getAttribute('data-kind') !== 'time') return [num(svg, 'f0'), num(svg, 'f1')];
    return [latest - days * DAY, latest + days * DAY * 0.03];
  }
  function zoomAll() {
    var m = /last=([0-9.]+)d/.exec(location.hash);
    document.body.dataset.zoom = m ? m[1] : '0';
    charts.forEach(function (svg) { var r = range(svg); draw(svg, r[0], r[1]); });
  }
  function at(svg, e) {
    var box = svg.getBoundingClientRect(), px = (e.clientX - box.left) * svg.viewBox.baseVal.width / box.width;
    return Math.min(Math.max(px, num(svg, 'l')), num(svg, 'r'));
  }
  charts.forEach(function (svg) {
    var sel = svg.querySelector('rect.sel'), from = null;
    svg.addEventListener('mousedown', function (e) { from = at(svg, e); e.preventDefault(); });
    svg.addEventListener('mousemove', function (e) {
      if (from === null) return;
      var to = at(svg, e); set(sel, {x: Math.min(from, to), width: Math.abs(to - from)});
    });
    svg.addEventListener('mouseup', function (e) {
      var to = at(svg, e), L = num(svg, 'l'), R = num(svg, 'r'), v0 = num(svg, 'v0'), v1 = num(svg, 'v1');
      set(sel, {width: 0});
      if (from !== null && Math.abs(to - from) > 4) {
        var a = v0 + (Math.min(from, to) - L) / (R - L) * (v1 - v0), b = v0 + (Math.max(from, to) - L) / (R - L) * (v1 - v0);
        draw(svg, a, b);
      }
      from = null;
    });
    svg.addEventListener('dblclick', function () { var r = range(svg); draw(svg, r[0], r[1]); });
  });
  document.querySelectorAll('button[data-days]').forEach(function (b) {
    b.addEventListener('click', function () { location.hash = 'last=' + b.getAttribute('data-days') + 'd'; });
  });
  window.addEventListener('hashchange', zoomAll);
  zoomAll();
})();
""".replace("%STEPS%", json.dumps(list(TIME_STEPS))).replace("%TICKS%", str(TIME_TICKS))


__all__ = ["COLOURS", "Frame", "ZOOM_SCRIPT", "band", "esc", "frame_of", "non_negative", "outcome_class", "svg",
           "x_ticks", "y_ticks"]
