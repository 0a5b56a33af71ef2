"""Fake ``pynvml`` for subprocesses: put ``tests/fakenvml_site`` first on ``PYTHONPATH``.

``$PYTEST_MIG_FAKE_NVML`` names a topology from ``tests/topologies.py`` (or a JSON file written by
``topologies.to_json``, or ``no-pynvml`` to make this import fail as without nvidia-ml-py).  This module
loads ``tests/topologies.py`` and ``tests/fake_pynvml.py`` by path and replaces itself in
``sys.modules`` with the fake built from that topology, so ``import pynvml`` gets exactly what the
in-process tests get.  ``fake_pynvml.subprocess_env`` builds such an environment.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_TESTS = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    """Import tests/<name>.py under its plain name, unless it is already imported."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _TESTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_load("topologies")
sys.modules[__name__] = _load("fake_pynvml").module_from_env()
