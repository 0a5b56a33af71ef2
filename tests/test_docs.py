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
