"""Text from users and files, as pytest-mig prints it.

An option, a marker argument, a GPU's name or a key in a hand-edited file may hold control
characters: an escape sequence that recolours or retitles the terminal, a newline that forges a
second line in a log.  Every such text pytest-mig echoes goes through :func:`printable` (or
:func:`quoted`), which writes them as ``\\x1b``, ``\\n``: what the user typed, visibly, and nothing
that drives the terminal.
"""

from __future__ import annotations

from typing import Any


def printable(value: Any) -> str:
    """``value`` as text, each non-printable character written as its escape (``\\x1b``, ``\\n``)."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def quoted(value: Any) -> str:
    """:func:`printable` in single quotes, as an error message names what it refuses."""
    return f"'{printable(value)}'"


__all__ = ["printable", "quoted"]
