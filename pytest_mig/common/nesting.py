"""How deeply a JSON document nests, so that the strict reader refuses far deeper input before any
reader recurses into it: from the parsed document (:func:`depth`, a walk over every value), or from
its text (:func:`text_depth`, the same number from the brackets, about six times quicker on a
results file; what :func:`pytest_mig.common.files.parse_json` uses)."""

from __future__ import annotations

import re
from typing import Any

#: Deepest nesting any pytest-mig file has (a baseline: modes > tests > metrics > runs > fingerprint);
#: far deeper input is refused before any reader recurses into it.
MAX_DEPTH = 32


def depth(doc: Any) -> int:
    """How deeply lists and objects nest in ``doc`` (a scalar: 0), found without recursion, a level of
    containers at a time (a scalar is never held), stopping past MAX_DEPTH."""
    level, containers = 0, [doc] if isinstance(doc, (dict, list)) else []
    while containers and level <= MAX_DEPTH:
        level += 1
        below: list[Any] = []
        for node in containers:
            below.extend(c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, (dict, list)))
        containers = below
    return level


#: Every byte but the brackets and the quote: what :func:`text_depth` deletes before it counts.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
#: An innermost pair of brackets, removed a level at a time.
_INNERMOST = re.compile(rb"\[\]|\{\}")


def text_depth(text: str) -> int:
    """How deeply lists and objects nest in the JSON ``text``, which json has parsed (so well formed):
    :func:`depth` of its document, read from the brackets outside strings instead of a walk over
    every value, stopping past MAX_DEPTH.  Escaped backslashes, then escaped quotes, are dropped, so
    that every quote left opens or closes a string; only brackets and quotes are kept; two quotes
    side by side are dropped (an empty string, or two strings with nothing between them made one),
    then what lies between quotes; then each pass removes the innermost pairs, a level at a time."""
    raw = text.encode("utf-8", "surrogatepass")
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = raw.translate(None, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in marks:
        marks = b"".join(marks.split(b'"')[::2])
    level = 0
    while marks and level <= MAX_DEPTH:
        level += 1
        marks = _INNERMOST.sub(b"", marks)
    return level


__all__ = ["MAX_DEPTH", "depth", "text_depth"]
