"""pytest-mig: pin a pytest run to an NVIDIA MIG slice (or emulate one), benchmark it, and judge the
figures against baselines of the same GPU model and profile.

The plugin lives in :mod:`pytest_mig.plugin` (entry point ``mig``); workloads in
:mod:`pytest_mig.workloads`; the ``pytest-mig`` command in :mod:`pytest_mig.cli`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from pytest_mig.measure import Metric
from pytest_mig.store.results import ResultRecord
from pytest_mig.device.target import Target

try:
    __version__ = version("pytest-mig")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Metric", "ResultRecord", "Target", "__version__"]
