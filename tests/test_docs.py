"""The docs a site admin reads: README within its size and free of lab-notebook detail, and the docs
site building with MkDocs in strict mode, so that a broken link or anchor fails CI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_is_a_users_guide_of_at_most_12000_characters() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) <= 12_000, f"README.md is {len(text)} characters"
    assert not re.search(r"GPU-[0-9a-f]{8}", text), "a board's UUID belongs in the lab notebook (docs/results)"
    for heading in ("## The two commands", "## Every night", "## Your own benchmark", "## Options"):
        assert heading in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):  # every page README points at exists
        assert (ROOT / link).exists(), link


def test_the_docs_build_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extra: pip install -e '.[test]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "own-benchmark" / "index.html").exists()


def test_every_raw_file_is_cited_and_every_citation_exists() -> None:
    docs = ROOT / "docs"
    pages = {p: p.read_text(encoding="utf-8") for p in [*docs.glob("*.md"), docs / "results" / "README.md",
                                                        ROOT / "README.md"]}
    text = "\n".join(pages.values())
    for page, body in pages.items():  # a page's link into docs/results names a file that is there
        for name in re.findall(r"results/([\w.+-]+\.(?:tgz|txt|csv|json|html))", body):
            assert (docs / "results" / name).exists(), f"{page.name} cites results/{name}, which is not there"
    uncited = [p.name for p in (docs / "results").iterdir() if p.name != "README.md" and p.name not in text]
    assert not uncited, f"raw files no page cites (git rm them or cite them): {uncited}"


def test_the_docs_stay_within_60000_characters() -> None:
    total = sum(len(p.read_text(encoding="utf-8")) for p in (ROOT / "docs").glob("*.md"))
    assert total <= 60_000, f"docs/*.md hold {total} characters"
