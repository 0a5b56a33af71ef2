"""Text from users and files, as pytest-mig prints it.

An option, a marker argument, a GPU's name or a key in a hand-edited file may hold control
characters: an escape sequence that recolours or retitles the terminal, a newline that forges a
second line in a log.  Every such text pytest-mig echoes goes through :func:`printable` (or
:func:`quoted`), which writes them as ``\\x1b``, ``\\n``: what the user typed, visibly, and nothing
that drives the terminal.
"""

from __future__ import annotations

from typing import Any

#: Characters of an option's value a message shows; a longer value is cut, ending in "...".
SHOWN = 80


def printable(value: Any, limit: int | None = None) -> str:
    """``value`` as text, each non-printable character written as its escape (``\\x1b``, ``\\n``);
    with ``limit``, only its first ``limit`` characters, then "..." where it is longer."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    cut = limit is not None and len(text) > limit
    text = text[:limit] if cut else text
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text) + ("..." if cut else "")


def quoted(value: Any, limit: int | None = None) -> str:
    """:func:`printable` in single quotes, as an error message names what it refuses."""
    return f"'{printable(value, limit)}'"


def shown(value: Any) -> str:
    """An option's or a setting's value as a message echoes it: :func:`printable`, at most
    :data:`SHOWN` characters (a 100,000-character value is not written back whole)."""
    return printable(value, SHOWN)


__all__ = ["SHOWN", "printable", "quoted", "shown"]
