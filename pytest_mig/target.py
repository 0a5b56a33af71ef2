"""What a site's own benchmark imports to type the ``mig_device`` fixture: ``from pytest_mig.target import Target``.

The device layer holds it (:mod:`pytest_mig.device.target`); this name is part of the public API.
"""

from __future__ import annotations

from pytest_mig.device.target import Target

__all__ = ["Target"]
