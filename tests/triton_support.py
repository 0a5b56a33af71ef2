"""Whether Triton can run here (under its CPU interpreter), probed once per test session.

Importing triton.language can fail on a machine without a CUDA toolchain even when the package is
installed, and a failed import can leave the process half-initialised: the probe runs in a child.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def triton_importable() -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import triton.language"], capture_output=True, timeout=120,
                           check=False)
    return probe.returncode == 0


needs_triton = pytest.mark.skipif(not triton_importable(),
                                  reason="Triton is not installed (CI installs only the project's dependencies)")
