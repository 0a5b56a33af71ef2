"""The trend page (``pytest-mig history``): runs gathered from results files and a baseline folder,
fingerprint changes on the time axis, the summary of the latest run, a page that needs no network,
and the page loaded in a real headless Chromium (where one is installed)."""

from __future__ import annotations

import base64
import hashlib
import html.parser
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_verdict import FP_OLD, TEST, record

from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.verdicts import Verdict
from pytest_mig.cli import main
from pytest_mig.report.trend import collect, render, write_page
from pytest_mig.store.results import write_results
from pytest_mig.judge.pipeline import Pipeline, StoreHistories

NEW_DRIVER = {**FP_OLD, "driver": "590.10.02"}


class _NoPriors:
    """No figure has a prior: these pages are judged on their own nights, whatever the shipped
    references say of the figures' noise."""

    def for_record(self, rec: Any, history: Any = None) -> None:
        return None

    def slope_for(self, rec: Any) -> None:
        return None


NO_PRIORS = _NoPriors()


def nights(tmp_path: Path, values: list[float], *, driver_from: int | None = None, save: bool = True,
           fingerprints: list[dict[str, Any]] | None = None) -> list[Path]:
    """One results file per night, each judged against (and then saved into) tmp_path/baselines;
    the driver updated from night ``driver_from`` on, or each night's own fingerprint."""
    store = BaselineStore(tmp_path / "baselines")
    paths = []
    for i, v in enumerate(values):
        fp = NEW_DRIVER if driver_from is not None and i >= driver_from else FP_OLD
        if fingerprints is not None:
            fp = fingerprints[i]
        recs = [record(v, fingerprint=dict(fp)), record(2.0, name="step_s", unit="s", direction="lower",
                                                        fingerprint=dict(fp))]
        for r in recs:
            r.timestamp = f"2026-11-{10 + i:02d}T02:00:00+00:00"
        Pipeline(StoreHistories(store), priors=NO_PRIORS).judge(recs)
        path = tmp_path / f"night-{i}.json"
        write_results(path, recs)
        if save:
            store.save(recs)
        paths.append(path)
    return paths


def test_runs_come_from_results_files_and_the_history_once_each(tmp_path: Path) -> None:
    files = nights(tmp_path, [100.0, 100.5, 99.8, 100.2, 100.1, 100.3])
    series = collect(tmp_path / "baselines", files[3:])  # the first three nights only in the history
    tflops = next(s for s in series if s.metric == "fp16_tflops")
    assert [p.value for p in tflops.points] == [100.0, 100.5, 99.8, 100.2, 100.1, 100.3]
    assert [p.outcome for p in tflops.points][:3] == ["saved"] * 3  # known only from the history
    assert tflops.points[4].outcome == "pass" and tflops.points[4].baseline is not None
    assert (tflops.gpu_model, tflops.profile, tflops.mode, tflops.test) == ("NVIDIA H200", "3g.71gb", "normal", TEST)


def test_a_driver_update_is_marked_where_it_happened_and_the_step_after_it_is_summarised(tmp_path: Path) -> None:
    files = nights(tmp_path, [100.0, 100.4, 99.8, 100.1, 100.2, 100.0, 91.0], driver_from=6)
    series = collect(None, files)
    tflops = next(s for s in series if s.metric == "fp16_tflops")
    ((index, diff, short),) = tflops.changes()
    assert index == 6 and diff == ["driver 550.54 -> 590.10.02"] and short == "driver 590.10.02"
    page = render(series, "night")
    assert page.count('class="fp-change"') == 2  # on both figures of the run
    assert "<title>driver 550.54 -&gt; 590.10.02</title>" in page
    assert re.search(r'<summary class="bad">1 regressed</summary><ul><li><code>test_gemm\[fp16\] fp16_tflops</code>: '
                     r'91\.00 TFLOPS, -9\.0% against 100\.\d</li>', page)
    assert 'class="figure regressed" data-figure="' + TEST + '::fp16_tflops"' in page
    assert page.count('class="run regressed"') == 1 and page.count('class="band"') == 12  # nights 2-7 had a band


def test_an_engine_upgrade_is_marked_like_a_driver_update(tmp_path: Path) -> None:
    before = {**FP_OLD, "transformers": "4.57.1", "pytest_mig": "0.1.0"}
    after = {**before, "transformers": "5.2.0"}
    files = nights(tmp_path, [100.0, 100.4, 99.8, 100.1, 112.0], fingerprints=[before] * 3 + [after] * 2)
    tflops = next(s for s in collect(None, files) if s.metric == "fp16_tflops")
    ((index, diff, short),) = tflops.changes()
    assert index == 3 and diff == ["transformers 4.57.1 -> 5.2.0"] and short == "transformers 5.2.0"


def test_the_page_needs_no_network_and_escapes_what_it_shows(tmp_path: Path) -> None:
    rec = record(5.0, name="<b>odd</b>")
    path = tmp_path / "r.json"
    write_results(path, [rec])
    page = render(collect(None, [path]))
    assert "<b>odd</b>" not in page and "&lt;b&gt;odd&lt;/b&gt;" in page
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page)  # no CDN, no remote anything
    assert "<script src" not in page and "@import" not in page


def test_the_command_writes_the_page_and_refuses_bad_input_in_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = nights(tmp_path, [100.0, 101.0])
    assert main(["history", *map(str, files), "--baselines", str(tmp_path / "baselines"),
                 "--out", str(tmp_path / "trend.html")]) == 0
    assert "trend page written: " in capsys.readouterr().out and (tmp_path / "trend.html").stat().st_size > 1000
    assert main(["history", "--out", str(tmp_path / "x.html")]) == 2
    assert main(["history", str(files[0]), "--out", str(tmp_path / "x.txt")]) == 2
    assert main(["history", "--baselines", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.html")]) == 2
    assert main(["history", str(files[0]), "--baselines", str(files[1]), "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["pytest-mig: error: give results files, --mig-baseline-dir DIR, or both: the page is made from them",
                   f"pytest-mig: error: --out {tmp_path / 'x.txt'}: the trend page is HTML, name it .html",
                   f"pytest-mig: error: --mig-baseline-dir {tmp_path / 'nowhere'}: no such folder",
                   f"pytest-mig: error: --mig-baseline-dir {files[1]}: not a folder"]


def test_a_baseline_folder_with_no_history_yet_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README's trend-page command right after its first run: the repository's own baselines/ (a README,
    no history), or, with results files, a folder no save has made yet."""
    files = nights(tmp_path, [100.0, 101.0])
    shipped = Path(__file__).resolve().parent.parent / "baselines"
    assert (shipped / "README.md").is_file()  # shipped, with no history until a site saves one
    assert main(["history", *map(str, files), "--mig-baseline-dir", str(shipped), "--out", str(tmp_path / "a.html")]) == 0
    assert main(["history", *map(str, files), "--mig-baseline-dir", str(tmp_path / "none-yet"),
                 "--out", str(tmp_path / "b.html")]) == 0
    out = capsys.readouterr().out
    assert f"--mig-baseline-dir {tmp_path / 'none-yet'}: no such folder yet, so no history: the page shows the results " \
           "files only" in out
    assert out.count("trend page written: ") == 2 and not (tmp_path / "none-yet").exists()


#: What a results file could hold to run script in the page: each breaks out of an attribute, of an
#: element's text or of a comment, and sets the title (a browser test looks for it).
PAYLOAD = """"'><script>document.title='pwned'</script><img src=x onerror="document.title='pwned'"><!--"""
PAYLOADS = [PAYLOAD, "</title><script>document.title='pwned'</script>", "\u2028</script><svg onload=alert(1)>"]


def hostile_results(tmp_path: Path) -> list[Path]:
    """Two nights whose every string field (test id, metric, unit, GPU, profile, node, timestamp,
    fingerprint, verdict outcome and message, the stop reason, the file's name) holds a payload."""
    paths = []
    for night, (driver, payload) in enumerate(zip(("550.54", PAYLOADS[1]), (PAYLOAD, PAYLOADS[2]))):
        rec = record(100.0 + night, name=payload, unit=payload, gpu=payload, profile=payload,
                     fingerprint={**FP_OLD, "driver": driver, "vbios": payload, "torch": payload})
        rec.test, rec.node, rec.timestamp = payload, payload, f"2026-11-1{night}T02:00:00{payload}"
        rec.verdict = Verdict.from_dict({"outcome": payload, "message": payload, "baseline": 100.0, "threshold": 0.05})
        path = tmp_path / f"night-{night}{'<script>x</script>' if night else ''}.json"
        write_results(path, [rec], meta={"complete": False, "stopped": payload})
        paths.append(path)
    return paths


class Elements(html.parser.HTMLParser):
    """Every element of a page, its attributes, and the text of its script and style elements."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: dict[str, list[str]] = {"script": [], "style": []}
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in = tag if tag in self.text else None
        if self._in:
            self.text[tag].append("")

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in:
            self.text[self._in][-1] += data


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_a_hostile_results_file_cannot_put_script_or_markup_in_the_page(tmp_path: Path) -> None:
    page = render(collect(None, hostile_results(tmp_path)), PAYLOAD)
    doc = Elements()
    doc.feed(page)
    doc.close()
    names = [tag for tag, _ in doc.tags]
    assert names.count("script") == 1 and "img" not in names  # its own script only, no element of a payload's
    assert not [(tag, a) for tag, attrs in doc.tags for a in attrs if a.lower().startswith("on")]
    assert not [(tag, a) for tag, attrs in doc.tags for a in attrs if a.lower() in ("style", "src", "href")]
    assert page.count("<script") == 1 and "<!--" not in page and all(p not in page for p in PAYLOADS)
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page  # shown, as text
    assert 'class="run other"' in page  # an outcome that is no verdict is no class name either
    (csp,) = [attrs for tag, attrs in doc.tags if tag == "meta" and attrs.get("http-equiv") == "Content-Security-Policy"]
    policy = dict(d.strip().split(" ", 1) for d in str(csp["content"]).split(";"))
    (script,), (style,) = doc.text["script"], doc.text["style"]
    assert policy["default-src"] == "'none'" and policy["img-src"] == "data:" and policy["base-uri"] == "'none'"
    assert policy["script-src"] == csp_hash(script) and policy["style-src"] == csp_hash(style)  # its own, no other
    assert "unsafe" not in csp["content"]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
#: Flags for a headless Chromium on a machine with no network and no display (as root in CI).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_a_real_headless_browser_loads_the_page_runs_its_script_and_finds_every_figure(tmp_path: Path) -> None:
    files = nights(tmp_path, [100.0, 100.4, 99.8, 100.1, 100.2, 91.0], driver_from=5)
    page = tmp_path / "trend.html"
    count = write_page(page, tmp_path / "baselines", files)
    base = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert 'data-ready="yes"' in dom  # the page's own script ran in the browser, offline
    assert f'<span id="figure-count">{count} figures</span>' in dom and count == 2
    assert dom.count('class="figure') == count and 'data-verdict="regressed"' in dom
    shot = tmp_path / "trend.png"
    subprocess.run([*base, "--window-size=1200,900", f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_a_real_headless_browser_runs_no_script_a_hostile_results_file_holds(tmp_path: Path) -> None:
    page = tmp_path / "hostile.html"
    write_page(page, None, hostile_results(tmp_path), title="hostile night")
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert 'data-ready="yes"' in dom  # the page's own script ran: the policy's hash is its script's
    assert "<title>hostile night</title>" in dom and "pwned" not in dom.split("</title>")[0]  # no payload ran
    parsed = Elements()
    parsed.feed(dom)
    assert [tag for tag, _ in parsed.tags].count("script") == 1 and "img" not in [tag for tag, _ in parsed.tags]


def test_a_page_from_a_baseline_folder_alone_summarises_each_figures_newest_saved_run(tmp_path: Path) -> None:
    nights(tmp_path, [100.0, 100.5, 99.8])
    page = render(collect(tmp_path / "baselines", []))
    assert "2026-11-12T02:00:00+00:00" in page and "nothing regressed" not in page  # the third night, saved
    assert "saved runs only (no results files), so no verdicts: nothing judged" in page  # no verdict to report
    assert page.count('class="run saved"') == 6 and 'class="band"' not in page  # no verdicts, no bands


def test_two_devices_of_one_node_mode_run_are_two_points_and_not_a_change(tmp_path: Path) -> None:
    boards = [{**FP_OLD, "gpu_uuid": f"GPU-{i}"} for i in range(2)]
    recs = [record(v, fingerprint=fp) for v, fp in zip((100.0, 97.0), boards)]
    for r in recs:
        r.timestamp = "2026-11-20T02:00:00+00:00"  # the same second
    path = tmp_path / "node.json"
    write_results(path, recs)
    BaselineStore(tmp_path / "baselines").save(recs)
    (s,) = collect(tmp_path / "baselines", [path])
    assert sorted(p.value for p in s.points) == [97.0, 100.0]  # each device once, not deduplicated away
    assert all(p.outcome != "saved" for p in s.points) and s.changes() == []


def test_a_night_stopped_partway_is_named_in_the_summary(tmp_path: Path) -> None:
    files = nights(tmp_path, [100.0, 100.2, 99.9])
    whole = render(collect(None, files), "night")
    assert "): incomplete" not in whole
    last = tmp_path / "stopped.json"  # a night cut off by its time limit (pytest_mig.store.checkpoint): one figure kept
    rec = record(100.1)
    rec.timestamp = "2026-11-20T02:00:00+00:00"
    write_results(last, [rec], meta={"complete": False, "stopped": "SIGTERM"})
    page = render(collect(None, [*files, last]), "night")
    assert re.search(r"<td>2026-11-20T02:00:00\+00:00 \(stopped\.json\) stopped \(SIGTERM\): incomplete</td>", page)


@pytest.mark.parametrize("spelling", ["--mig-baseline-dir", "--baselines"])
def test_the_page_takes_the_plugins_baseline_dir_and_the_old_spelling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spelling: str) -> None:
    """A relative folder is the working directory's; ``--baselines`` still names it, unlisted in --help."""
    nights(tmp_path, [100.0, 101.0, 99.0])
    monkeypatch.chdir(tmp_path)
    assert main(["history", spelling, "baselines", "--out", "trend.html"]) == 0
    assert capsys.readouterr().out == "trend page written: trend.html (2 figure(s))\n"
    with pytest.raises(SystemExit):
        main(["history", "--help"])
    assert "--baselines" not in capsys.readouterr().out


def day_of_nights(tmp_path: Path) -> list[Path]:
    """Four runs of one day after two earlier nights, each judged against a band that reaches below zero
    (threshold 240%): the page must stop it at zero."""
    paths = []
    for i, at in enumerate(["2026-11-24T02:00:00", "2026-11-25T02:00:00", "2026-11-26T02:00:00",
                            "2026-11-26T08:00:00", "2026-11-26T14:00:00", "2026-11-26T20:00:00"]):
        rec = record(300.0 + i, name="hbm_gbps", unit="GB/s")
        rec.timestamp = at + "+00:00"
        rec.verdict = Verdict.from_dict({"outcome": "pass", "baseline": 300.0, "threshold": 2.4, "message": "wide"})
        paths.append(tmp_path / f"night-{i}.json")
        write_results(paths[-1], [rec])
    return paths


def browse(tmp_path: Path, url: str) -> tuple[str, list[str]]:
    """The DOM a headless Chromium made of the page after its script ran, and every console line it logged."""
    run = subprocess.run([CHROMIUM, *FLAGS, "--enable-logging=stderr", "--v=0",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120, check=True)
    return run.stdout, [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


def charts(dom: str) -> list[dict[str, Any]]:
    """Per chart in a DOM: its x tick labels (date and time), y tick labels, the y of zero, band bottoms."""
    out = []
    for chunk in dom.split('<svg class="chart"')[1:]:
        chunk = chunk.split("</svg>")[0]
        attrs = dict(re.findall(r'data-(lo|hi|top|bottom)="([-\d.e]+)"', chunk.split(">")[0]))
        lo, hi, top, bottom = (float(attrs[k]) for k in ("lo", "hi", "top", "bottom"))
        bands = [re.search(r' y="([-\d.]+)"', r).group(1) + " " + re.search(r'height="([-\d.]+)"', r).group(1)  # type: ignore[union-attr]
                 for r in re.findall(r'<rect class="band"[^>]*>', chunk)]
        out.append({"x": [re.sub(r"<[^>]+>", " ", t).split() for t in re.findall(r'class="xtick"[^>]*>(.*?)</text>', chunk)],
                    "y": re.findall(r'class="ytick"[^>]*>([^<]*)<', chunk),
                    "zero": bottom - (bottom - top) * (0.0 - lo) / (hi - lo),
                    "band_bottoms": [float(y) + float(h) for y, h in (b.split() for b in bands)]})
    return out


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_the_browser_shows_dated_distinct_axis_labels_and_no_band_below_zero(tmp_path: Path) -> None:
    page = tmp_path / "trend.html"
    write_page(page, None, day_of_nights(tmp_path))
    dom, console = browse(tmp_path, page.as_uri())
    assert console == [] and 'data-ready="yes"' in dom  # the script ran, and nothing was logged or blocked
    (chart,) = charts(dom)
    assert len(chart["x"]) >= 3 and len({tuple(t) for t in chart["x"]}) == len(chart["x"])
    assert all(re.fullmatch(r"2026-11-\d\d", t[0]) for t in chart["x"])
    assert len(chart["y"]) >= 3 and len(set(chart["y"])) == len(chart["y"]) and chart["y"][0] == "0"
    assert len(chart["band_bottoms"]) == 6 and max(chart["band_bottoms"]) <= chart["zero"] + 0.1
    assert "1 figure(s) judged" in dom and "nothing regressed in the latest runs" in dom
    assert chart["x"] == charts(page.read_text())[0]["x"]  # the script's axis is the one the page was written with


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_the_browser_zooms_the_time_axis_to_the_last_day_by_its_address(tmp_path: Path) -> None:
    page = tmp_path / "trend.html"
    write_page(page, None, day_of_nights(tmp_path))
    dom, console = browse(tmp_path, page.as_uri() + "#last=1d")
    assert console == [] and 'data-zoom="1"' in dom
    (chart,) = charts(dom)
    assert {t[0] for t in chart["x"]} <= {"2026-11-25", "2026-11-26"} and len(chart["x"]) >= 3
    clocks = [t[1] for t in chart["x"]]  # one day: ticks read apart by their time of day
    assert all(re.fullmatch(r"\d\d:\d\d", c) for c in clocks) and len(set(clocks)) == len(clocks)
    assert dom.count('class="run pass out"') == 2  # the two earlier nights are outside the day shown


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")
def test_the_browser_shows_a_page_with_no_baseline_as_nothing_judged(tmp_path: Path) -> None:
    rec = record(300.0, name="hbm_gbps", unit="GB/s")
    write_results(tmp_path / "first.json", [rec])
    write_page(tmp_path / "first.html", None, [tmp_path / "first.json"])
    dom, console = browse(tmp_path, (tmp_path / "first.html").as_uri())
    assert console == [] and "no figure has a history yet: nothing judged" in dom
    assert "nothing regressed" not in dom and 'class="regressions"' not in dom
