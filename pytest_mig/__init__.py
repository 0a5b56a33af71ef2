"""pytest-mig: pin a pytest run to an NVIDIA MIG slice (or emulate one), benchmark it, and judge the
figures against baselines of the same GPU model and profile.

The public API of a site's own benchmark: :class:`Metric`, :class:`MigBench` (the ``mig_bench``
fixture's object), :class:`Target` (the ``mig_device`` fixture's), also importable from
``pytest_mig.measure``, ``pytest_mig.bench`` and ``pytest_mig.target``.  The plugin is
:mod:`pytest_mig.plugin` (entry point ``mig``); the layers are described in docs/architecture.md.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from pytest_mig.bench import MigBench
from pytest_mig.device.target import Target
from pytest_mig.measure import Metric
from pytest_mig.store.results import ResultRecord

try:
    __version__ = version("pytest-mig")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Metric", "MigBench", "ResultRecord", "Target", "__version__"]
