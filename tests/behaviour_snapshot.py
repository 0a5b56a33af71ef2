"""Print what pytest-mig's commands say about the recorded GPU results in docs/results.

A refactor that must leave behaviour unchanged is checked by running this before and after it and
comparing the two outputs (timestamps, temporary paths and durations are normalised away):

    python tests/behaviour_snapshot.py > before.txt
    ... change ...
    python tests/behaviour_snapshot.py > after.txt
    diff before.txt after.txt && echo unchanged

It runs `pytest-mig compare`, `report`, `history`, `reference`, `reference-check`, `samples` and
`detection --analyse-only` on the archives the docs cite, and prints each command's exit code,
output and written files.  No GPU is needed.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"

#: Text that differs from one run of the same command to the next.
VOLATILE = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)?(?: UTC)?"), "<time>"),
    (re.compile(r"\b\d+(?:\.\d+)? ?s\b(?= \(|$|\))"), "<seconds>"),
    (re.compile(r"sha256-[A-Za-z0-9+/=]+"), "sha256-<hash>"),
]


def _normalise(text: str, work: Path) -> str:
    text = text.replace(str(work), "<work>")
    for pattern, repl in VOLATILE:
        text = pattern.sub(repl, text)
    return text


def _unpack(archive: str, work: Path) -> Path:
    dest = work / archive.removesuffix(".tgz")
    dest.mkdir(parents=True)
    with tarfile.open(RESULTS / archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _run(title: str, args: list[str], work: Path, outputs: list[Path] = ()) -> None:
    proc = subprocess.run([sys.executable, "-m", "pytest_mig.cli", *args], capture_output=True, text=True,
                          cwd=work, check=False)
    print(f"### {title}\n$ pytest-mig {' '.join(_normalise(a, work) for a in args)}\nexit {proc.returncode}")
    print(_normalise(proc.stdout + proc.stderr, work).rstrip())
    for path in outputs:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file())
        else:
            files = [path] if path.exists() else []
        for f in files:
            body = _normalise(f.read_text(errors="replace"), work)
            digest = hashlib.sha256(body.encode()).hexdigest()[:16]
            print(f"--- {_normalise(str(f), work)} ({len(body)} chars, normalised sha256 {digest})")
            if f.suffix in {".md", ".csv", ".txt"}:
                print(body.rstrip())
    print()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mig-snapshot-") as tmp:
        work = Path(tmp)
        det = _unpack("h100-detection-history-15.tgz", work)
        unchanged = sorted(str(p) for p in det.glob("unchanged-*.json"))
        slow = sorted(str(p) for p in det.glob("slow-*.json"))
        fleet = _unpack("h200x2-fleet.tgz", work) / "f"
        refs = _unpack("normal-refs-2026-11-24.tgz", work)
        ref_files = sorted(str(p) for p in refs.rglob("*.json") if "baselines" not in p.parts)

        _run("compare: an unchanged night against 14", ["compare", *unchanged], work)
        _run("compare: a slowed night against 15", ["compare", *unchanged, slow[0]], work)
        _run("compare: a night alone against the shipped reference",
             ["compare", "--mig-reference", "shipped", unchanged[0]], work)
        _run("compare: with a tolerance", ["compare", "--mig-tolerance", "3%", *unchanged[:5], slow[-1]], work)
        _run("report: two H200 nodes", ["report", str(fleet / "node-1.json"), str(fleet / "node-2.json"),
                                        "--out", str(work / "fleet.md")], work, [work / "fleet.md"])
        _run("report: the detection nights as CSV", ["report", *unchanged, *slow, "--out", str(work / "det.csv")],
             work, [work / "det.csv"])
        _run("history: the detection nights", ["history", *unchanged, *slow, "--baselines", str(det / "baselines"),
                                               "--out", str(work / "trend.html")], work, [work / "trend.html"])
        _run("samples: the detection nights", ["samples", *unchanged], work)
        _run("reference: built from recorded runs", ["reference", "--out", str(work / "ref"), *ref_files], work,
             [work / "ref"])
        _run("reference-check: the shipped references", ["reference-check"], work)
        _run("reference-check: the folder built above", ["reference-check", str(work / "ref")], work)
        analysis = work / "analysis"
        analysis.mkdir()
        for p in unchanged + slow:
            (analysis / Path(p).name).write_bytes(Path(p).read_bytes())
        _run("detection: replay of the recorded nights", ["detection", "--analyse-only", "--out", str(analysis)], work,
             [analysis / "detection.md"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
