"""The site's files, treated as a database treats its pages: read strictly, written atomically.

Baseline histories and reference folders are a site's memory of its GPUs; results files, reports,
trend pages and exports are what its dashboards read.  Every file pytest-mig reads or writes goes
through this module, so that one set of rules holds everywhere:

- **Read strictly** (:func:`read_json`, :func:`parse_json`): a key given twice in one object, a
  nesting deeper than :data:`MAX_DEPTH`, ``NaN`` or ``Infinity`` where the file type has no use for
  them, bytes that are not UTF-8, a number no figure can be (an integer of more than
  :data:`MAX_INT_DIGITS` digits, a decimal that overflows a float such as ``1e999``): each is a
  :class:`FileProblem`, one sentence naming the file, the field and what is wrong.  Python's ``json`` would keep the last of two ``"modes"`` keys and so read a
  six-run history as empty; this reader refuses it, and nothing is written over it.
- **Validated against one schema per file type** (:func:`validate`, schemas in
  :mod:`pytest_mig.schemas`), with jsonschema, before any field is used.
- **Written atomically** (:func:`atomic_write_text`): through a temporary file in the same folder,
  flushed to disk, **read back and checked** by the caller's reader where one is given, and only
  then renamed over the old file, whose permissions it keeps.  A write that dies, or text the reader
  would refuse, leaves the old file exactly as it was.
- **Links are written through, never replaced** (:func:`write_target`): a baseline or page that is
  a symbolic link (a shared history on another disk) is written at the link's target, so the link
  keeps receiving runs.  A dangling link whose target's folder does not exist, and a path that is a
  folder, are refused.

Nothing is ever loaded with pickle or eval.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from .text import printable, shown

#: Deepest nesting any pytest-mig file has (a baseline: modes > tests > metrics > runs > fingerprint);
#: far deeper input is refused before any reader recurses into it.
MAX_DEPTH = 32
#: Most digits an integer in a pytest-mig file has (a byte count, a nanosecond time: under 20); a
#: longer one is refused before Python converts it (past 4300 digits ``int()`` itself refuses it).
MAX_INT_DIGITS = 30
#: Largest magnitude a number in a pytest-mig file has; the schemas bound their fields by it, so
#: that no figure's square or ratio overflows a float.
MAX_NUMBER = 1e300


class FileProblem(ValueError):
    """A file that cannot be read or written as asked: one sentence naming it and the problem."""


def _no_duplicates(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise FileProblem(f"{where}: the key {json.dumps(key)} is given twice in one object, so which one "
                                  f"holds is ambiguous; remove one (pytest-mig never overwrites a file it cannot read)")
            out[key] = value
        return out
    return hook


def _no_constant(where: str) -> Callable[[str], Any]:
    def hook(name: str) -> Any:
        raise FileProblem(f"{where}: holds {name}, which is not a number JSON can carry; a figure must be finite")
    return hook


class _Unreadable:
    """A number the parser met that no field can hold, kept as text until its place is known."""

    def __init__(self, why: str) -> None:
        self.why = why


def _bounded_int(text: str) -> Any:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Unreadable(f"an integer of {digits} digits")
    return int(text)


def _bounded_float(text: str) -> Any:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 24 else text[:20] + "..."
        return _Unreadable(f"{shown}, too large for a float")
    return value


def _first_unreadable(doc: Any) -> tuple[str, str] | None:
    """Where in ``doc`` the first :class:`_Unreadable` number sits (its path, keys and indices
    joined by /) and why, found without recursion; None when there is none."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(doc, ())]
    while stack:
        node, at = stack.pop()
        if isinstance(node, _Unreadable):
            return "/".join(at), node.why
        if isinstance(node, dict):
            stack.extend((v, at + (str(k),)) for k, v in reversed(list(node.items())))
        elif isinstance(node, list):
            stack.extend((v, at + (str(i),)) for i, v in reversed(list(enumerate(node))))
    return None


def depth(doc: Any) -> int:
    """How deeply lists and objects nest in ``doc`` (a scalar: 0), found without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > MAX_DEPTH:
            break
        stack.extend((c, level + 1) for c in children)
    return deepest


def parse_json(text: str, where: str, *, allow_nan: bool = False) -> Any:
    """JSON text as a reader may trust it: no duplicate keys, no deeper than MAX_DEPTH, no integer of
    more than MAX_INT_DIGITS digits, no decimal that overflows a float, and no NaN or Infinity unless
    ``allow_nan`` (results files carry a failed workload's NaN).  FileProblem otherwise, naming the
    field of a number it refuses."""
    where = printable(where)
    kwargs: dict[str, Any] = {"object_pairs_hook": _no_duplicates(where), "parse_int": _bounded_int,
                              "parse_float": _bounded_float}
    if not allow_nan:
        kwargs["parse_constant"] = _no_constant(where)
    try:
        doc = json.loads(text, **kwargs)
    except json.JSONDecodeError as exc:
        raise FileProblem(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise FileProblem(f"{where}: nested too deeply to be a pytest-mig file") from None
    if depth(doc) > MAX_DEPTH:
        raise FileProblem(f"{where}: nested more than {MAX_DEPTH} levels deep, which no pytest-mig file is")
    bad = _first_unreadable(doc)
    if bad is not None:
        at, why = bad
        raise FileProblem(f"{where}: {'at ' + printable(at) + ': ' if at else ''}{why}, not a number any pytest-mig "
                          f"file holds (fix or remove this file)")
    return doc


def read_json(path: Path, *, allow_nan: bool = False) -> Any:
    """Read and parse one file strictly (:func:`parse_json`)."""
    path = Path(path)
    shown_path = printable(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileProblem(f"{shown_path}: no such file") from None
    except IsADirectoryError:
        raise FileProblem(f"{shown_path}: a folder, not a file") from None
    except UnicodeDecodeError:
        raise FileProblem(f"{shown_path}: cannot be read (not UTF-8 text, so not a pytest-mig file)") from None
    except OSError as exc:
        raise FileProblem(f"{shown_path}: cannot be read ({exc.strerror or exc})") from None
    except ValueError:  # a NUL byte in the name, which no file system takes
        raise FileProblem(f"{shown_path}: cannot be read (a NUL byte in its name)") from None
    return parse_json(text, str(path), allow_nan=allow_nan)


def validate(doc: Any, schema: Mapping[str, Any], where: str) -> None:
    """Check ``doc`` against a JSON schema (jsonschema); the first problem found is a FileProblem
    naming where in the file it is."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    error = best_match(Draft202012Validator(schema).iter_errors(doc))
    if error is None:
        return
    at = "/".join(str(p) for p in error.absolute_path)
    shown = json.dumps(error.instance, default=str)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    what = f"{error.message}" if len(error.message) <= 120 else f"{shown} is not what this field holds"
    raise FileProblem(f"{where}: {'at ' + printable(at) + ': ' if at else ''}{printable(what)}")


#: Longest file name, and longest whole path, in bytes, that Linux file systems take (NAME_MAX, PATH_MAX).
NAME_MAX = 255
PATH_MAX = 4096


def path_problem(text: str) -> str | None:
    """Why no file system takes ``text`` as a path, in words, or None: a NUL byte, a character no
    file name is written in (a lone surrogate), a name longer than :data:`NAME_MAX` bytes or a whole
    path of :data:`PATH_MAX` bytes or more.  Asked before any call that would raise ENAMETOOLONG."""
    if "\x00" in text:
        return "it holds a NUL byte, which no path can"
    try:
        raw = os.fsencode(text)
    except UnicodeEncodeError:
        return "it holds a character no file name can be written in"
    if len(raw) >= PATH_MAX:
        return f"it is {len(raw)} bytes long, longer than any path can be ({PATH_MAX - 1})"
    longest = max(len(name) for name in raw.split(b"/"))
    if longest > NAME_MAX:
        return f"a name in it is {longest} bytes long, longer than a file name can be ({NAME_MAX})"
    return None


def check_path(option: str, text: str) -> None:
    """FileProblem, naming ``option`` and the value (cut for display), for a path no file system
    takes (:func:`path_problem`)."""
    why = path_problem(str(text))
    if why is not None:
        raise FileProblem(f"{option} {shown(text)}: {why}")


def write_target(path: Path) -> Path:
    """The file a write to ``path`` lands in: a symbolic link's target (followed to the end), so that a
    link to a shared history keeps receiving runs.  FileProblem for a folder, or a dangling link whose
    target's folder does not exist."""
    path = Path(path)
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        if target.is_dir():
            raise FileProblem(f"{path}: a link to the folder {target}, not to a file; name a file")
        if not target.parent.is_dir():
            raise FileProblem(f"{path}: a link to {target}, whose folder {target.parent} does not exist; "
                              f"nothing was written (make that folder, or remove the link)")
        return target
    if path.is_dir():
        raise FileProblem(f"{path}: a folder, not a file; name a file (or end the path with / where a folder "
                          f"to write into is meant)")
    return path


def output_file(text: str, default_name: str, option: str) -> Path:
    """The file an output option names, decided before the run: a value ending in ``/`` is a folder to
    write ``default_name`` into (made if need be); an existing folder named without the ``/``, a link
    to a folder or a dangling link into no folder are refused (FileProblem), not found out after an
    hour of benchmarks."""
    if text.endswith(("/", os.sep)):
        folder = Path(text)
        if folder.exists() and not folder.is_dir():
            raise FileProblem(f"{option} {text}: {folder.resolve()} is a file, not a folder to write into")
        return folder / default_name
    path = Path(text)
    if path.is_dir() and not path.is_symlink():
        raise FileProblem(f"{option} {text}: a folder; name a file, or end it with / to write {default_name} into it")
    try:
        write_target(path)
    except FileProblem as exc:
        raise FileProblem(f"{option} {exc}") from None
    return path


def atomic_write_text(path: Path, text: str, check: Callable[[str], Any] | None = None) -> Path:
    """Write ``text`` so that a reader never sees half a file and a bad one never replaces a good one.

    The text goes to a temporary file beside the target (:func:`write_target`: a link is written
    through), is flushed to disk, read back and, where ``check`` is given, handed to it (the file
    type's own reader, which raises on anything it would refuse), and only then renamed over the old
    file.  An existing file keeps its permissions; a new one gets what open() would give it.  Returns
    the path written (a link's target)."""
    real = write_target(path)
    real.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = real.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if check is not None:
            check(Path(tmp).read_text(encoding="utf-8"))  # what is on disk, as the reader will see it
        os.chmod(tmp, mode)  # mkstemp creates 0600: reports and results are read by the whole team
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _sync_folder(real.parent)
    return real


def _sync_folder(folder: Path) -> None:
    """Flush the rename itself to disk (POSIX), so that a power cut after it keeps the new file."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["MAX_DEPTH", "MAX_INT_DIGITS", "MAX_NUMBER", "NAME_MAX", "PATH_MAX", "FileProblem", "atomic_write_text",
           "check_path", "depth", "output_file", "parse_json", "path_problem", "read_json", "validate",
           "write_target"]
