"""Imports a later test needs, made while this process only waits on a worker.

The first transformers model a process builds imports transformers' modelling stack: most of GPT-2
small's time in quick mode (its ``build`` phase in ``phases_s``; docs/benchmarks.md), paid in the
middle of the night by a test that measures nothing during it.  OpenMM's tests run in a worker
process, and this process does nothing but wait for it (and poll the energy counter, which sleeps
between reads).  So the plugin tells this module, once the run's tests are known, which modules
its tests will import (:func:`expect`, from each test's ``mig_imports`` marker), and code that waits
on a worker imports them in a thread meanwhile (:func:`while_waiting`).  Nothing this process times
runs during the import: the thread is joined before the waiting code returns (for at most
:data:`JOIN_TIMEOUT_S`: an import that hangs must not hang the night).  The one thread of this
process that runs beside it is the energy poller, which sleeps between reads: while the import holds
the interpreter a counter tick may be stamped up to Python's switch interval (5 ms) late, against
timed windows of several seconds.

An import that fails is left alone here: the test that needs the module imports it again and
reports the failure in its own words.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections.abc import Iterable, Iterator

_expected: list[str] = []
#: The longest the waiting code waits for the import after its own wait has ended.
JOIN_TIMEOUT_S = 120.0


def expect(modules: Iterable[str]) -> None:
    """Modules a test later in this run will import (duplicates and the already imported are dropped)."""
    for name in modules:
        if name not in _expected:
            _expected.append(name)


def pending() -> list[str]:
    """The expected modules not yet imported."""
    return [m for m in _expected if m not in sys.modules]


def forget() -> None:
    """No module is expected any more (the end of a run)."""
    _expected.clear()


def _import_all(names: list[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # the test that needs it imports it again and says what is wrong
            continue


@contextlib.contextmanager
def while_waiting() -> Iterator[None]:
    """Import the :func:`pending` modules in a thread while the body waits on another process; the
    thread is joined before the body's caller goes on, so it never overlaps a measurement here."""
    names = pending()
    if not names:
        yield
        return
    thread = threading.Thread(target=_import_all, args=(names,), name="pytest-mig-preload", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(JOIN_TIMEOUT_S)
