"""``python -m pytest_mig.cli``: the ``pytest-mig`` command."""

from __future__ import annotations

import sys

from pytest_mig.cli import main

sys.exit(main())
