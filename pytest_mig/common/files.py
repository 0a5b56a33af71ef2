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
  :mod:`pytest_mig.store.schemas`), with jsonschema, before any field is used.
- **Written atomically** (:func:`atomic_write_text`): through a temporary file in the same folder,
  flushed to disk, **read back and checked** by the caller's reader where one is given, and only
  then renamed over the old file, whose permissions it keeps.  A write that dies, or text the reader
  would refuse, leaves the old file exactly as it was.
- **Links are written through, never replaced** (:func:`write_target`): a baseline or page that is
  a symbolic link (a shared history on another disk) is written at the link's target, so the link
  keeps receiving runs.  A dangling link whose target's folder does not exist, and a path that is a
  folder, are refused.
- **Device nodes are never replaced** (:func:`writes_through`): a character device or a pipe
  (``/dev/null``, a FIFO) or one of the process's own streams (``/dev/stdout``) is opened and
  appended to, as a shell's ``>>`` would; a block device, a socket or any other node that is not a
  regular file is refused.
- **An output never replaces what a site keeps** (:func:`check_output`, :func:`distinct_outputs`):
  before the run, each output path that exists is read for what it is; a baseline history, a
  reference file, a results file, or a JSON file inside the baseline folder or a reference folder is
  refused, as are two outputs of one run naming the same file.  An output's own earlier file (last
  night's report or ``.prom``) is replaced as before.

Nothing is ever loaded with pickle or eval.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from pytest_mig.common.huge_numbers import may_hold_huge
from pytest_mig.common.nesting import MAX_DEPTH, depth, text_depth
from pytest_mig.common.schema_check import Check, compile_schema
from pytest_mig.common.text import printable, shown

#: A file larger than this is not read to learn what it is: no history, reference or results file
#: comes near it.
KIND_READ_LIMIT = 256 * 2**20
#: Most digits an integer in a pytest-mig file has (a byte count, a nanosecond time: under 20); a
#: longer one is refused before Python converts it (past 4300 digits ``int()`` itself refuses it).
MAX_INT_DIGITS = 30
#: Largest magnitude a number in a pytest-mig file has; the schemas bound their fields by it, so
#: that no figure's square or ratio overflows a float.
MAX_NUMBER = 1e300
#: The largest problem size a run may name (a GEMM's square edge); a larger one is an edited file.
MAX_SIZE = 1 << 31


class FileProblem(ValueError):
    """A file that cannot be read or written as asked: one sentence naming it and the problem."""


def _no_duplicates(where: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) == len(pairs):
            return out
        out = {}
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

    made = 0  # how many were ever made: a parse that made none has none to look for

    def __init__(self, why: str) -> None:
        self.why = why
        _Unreadable.made += 1


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


def parse_json(text: str, where: str, *, allow_nan: bool = False) -> Any:
    """JSON text as a reader may trust it: no duplicate keys, no deeper than MAX_DEPTH, no integer of
    more than MAX_INT_DIGITS digits, no decimal that overflows a float, and no NaN or Infinity unless
    ``allow_nan`` (results files carry a failed workload's NaN).  FileProblem otherwise, naming the
    field of a number it refuses."""
    where = printable(where)
    kwargs: dict[str, Any] = {"object_pairs_hook": _no_duplicates(where)}
    if may_hold_huge(text):  # a number json itself would read as a huge int or an infinity
        kwargs |= {"parse_int": _bounded_int, "parse_float": _bounded_float}
    if not allow_nan:
        kwargs["parse_constant"] = _no_constant(where)
    made = _Unreadable.made
    try:
        doc = json.loads(text, **kwargs)
    except json.JSONDecodeError as exc:
        raise FileProblem(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise FileProblem(f"{where}: nested too deeply to be a pytest-mig file") from None
    if text_depth(text) > MAX_DEPTH:
        raise FileProblem(f"{where}: nested more than {MAX_DEPTH} levels deep, which no pytest-mig file is")
    bad = _first_unreadable(doc) if _Unreadable.made != made else None
    if bad is not None:
        at, why = bad
        raise FileProblem(f"{where}: {'at ' + printable(at) + ': ' if at else ''}{why}, not a number any pytest-mig "
                          f"file holds (fix or remove this file)")
    return doc


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def read_text(path: Path) -> str:
    """A regular file's text.  Opened without blocking and checked before a byte is read, so that a
    named pipe, a device or a socket in a file's place is a FileProblem naming it, never a start-up
    that waits for a writer forever; a link that loops or leads nowhere is one too."""
    path = Path(path)
    shown_path = printable(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        if path.is_symlink():
            raise FileProblem(f"{shown_path}: a link to {printable(os.readlink(path))}, which does not exist") from None
        raise FileProblem(f"{shown_path}: no such file") from None
    except ValueError:  # a NUL byte in the name, which no file system takes
        raise FileProblem(f"{shown_path}: cannot be read (a NUL byte in its name)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileProblem(f"{shown_path}: a link that leads back to itself (a link loop), not a file") from None
        if exc.errno == errno.EISDIR:
            raise FileProblem(f"{shown_path}: a folder, not a file") from None
        raise FileProblem(f"{shown_path}: cannot be read ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise FileProblem(f"{shown_path}: a folder, not a file")
        raise FileProblem(f"{shown_path}: {_kind(mode)}, not a file; nothing was read from it")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read()
        except OSError as exc:
            raise FileProblem(f"{shown_path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileProblem(f"{shown_path}: cannot be read (not UTF-8 text, so not a pytest-mig file)") from None


def read_json(path: Path, *, allow_nan: bool = False) -> Any:
    """Read (:func:`read_text`) and parse one file strictly (:func:`parse_json`)."""
    return parse_json(read_text(path), str(path), allow_nan=allow_nan)


def check_links(path: Path) -> None:
    """FileProblem where a folder on the way to ``path`` is a link that loops or leads nowhere, or
    ``path`` itself is a link that loops: found before a run, not when its history is written after
    it.  A dangling link in ``path``'s own place is :func:`write_target`'s to judge (a shared history
    not written yet)."""
    path = Path(path)
    for p in [*reversed(path.parents), path]:
        try:
            os.stat(p)
        except FileNotFoundError:
            if p != path and p.is_symlink():
                raise FileProblem(f"{printable(p)}: a link to the folder {printable(os.readlink(p))}, which does not exist; make that "
                                  f"folder or remove the link") from None
            if not p.is_symlink():
                return  # nothing from here on exists yet: it is made when written
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FileProblem(f"{printable(p)}: a link that leads back to itself (a link loop); point it at a real "
                                  f"{'file' if p == path else 'folder'} or remove it") from None
            return  # not readable: the writability checks name it


#: Each schema's compiled checks (:mod:`pytest_mig.common.schema_check`), by the schema's id; the schema
#: is kept beside them so that its id is never reused.
_CHECKS: dict[int, tuple[Mapping[str, Any], Check | None]] = {}


def _compiled(schema: Mapping[str, Any]) -> Check | None:
    got = _CHECKS.get(id(schema))
    if got is None or got[0] is not schema:
        got = _CHECKS[id(schema)] = (schema, compile_schema(schema))
    return got[1]


def validate(doc: Any, schema: Mapping[str, Any], where: str) -> None:
    """Check ``doc`` against a JSON schema; the first problem found is a FileProblem naming where in
    the file it is.  The schema's compiled checks pass a valid document; jsonschema names the problem
    of one they refuse (and checks a schema they do not compile)."""
    check = _compiled(schema)
    if check is not None and check(doc):
        return  # valid; a document the compiled checks refuse gets jsonschema's sentence below
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


#: Paths that name one of the process's open files (its output, wherever a shell sent it).
STREAMS = ("/dev/stdout", "/dev/stderr")
STREAM_FOLDERS = ("/dev/fd/", "/proc/self/fd/")


def writes_through(path: Path) -> bool:
    """Whether ``path`` (links followed) is a character device or a pipe (``/dev/null``, a FIFO), or
    names one of the process's open files (``/dev/stdout``, ``/dev/fd/3``, even where a shell sent it
    into a file).  Such a path is opened and appended to, never replaced by a regular file."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    text = str(path)
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or text in STREAMS or text.startswith(STREAM_FOLDERS)


def _odd_node(path: Path) -> str | None:
    """What ``path`` (links followed) is when it is neither a regular file, a folder, a character
    device nor a pipe ('a block device', 'a socket'); None otherwise or when it does not exist."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return None
    return "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file"


def write_target(path: Path) -> Path:
    """The file a write to ``path`` lands in: a symbolic link's target (followed to the end), so that a
    link to a shared history keeps receiving runs.  FileProblem for a folder, a link loop, a dangling
    link whose target's folder does not exist, or a block device, socket or other node that is not a
    file (a character device or a pipe is written through by :func:`atomic_write_text`, not here)."""
    path = Path(path)
    odd = _odd_node(path)
    if odd:
        raise FileProblem(f"{printable(path)}: {odd}, not a file; nothing was written (pytest-mig writes regular "
                          f"files, or through a character device or a pipe such as /dev/null)")
    if path.is_symlink():
        check_links(path)  # a link loop: no file to write, and the link must never be replaced
        target = Path(os.path.realpath(path))
        if target.is_dir():
            raise FileProblem(f"{printable(path)}: a link to the folder {printable(target)}, not to a file; name a file")
        if not target.parent.is_dir():
            raise FileProblem(f"{printable(path)}: a link to {printable(target)}, whose folder {printable(target.parent)} does not exist; "
                              f"nothing was written (make that folder, or remove the link)")
        return target
    if path.is_dir():
        raise FileProblem(f"{printable(path)}: a folder, not a file; name a file (or end the path with / where a folder "
                          f"to write into is meant)")
    return path


def kept_file(path: Path, folders: Sequence[tuple[Path, str]] = ()) -> str | None:
    """What an existing regular file at ``path`` is, when it is something a site keeps: 'a baseline
    history', 'a reference file', 'a results file' (by the ``schema`` its reader checks, read leniently
    here so that a damaged one is still known), or 'a file of <folder>' for any JSON file inside one
    of ``folders`` ((folder, what it is) pairs: the baseline folder, the reference folders), whatever
    it holds.  None for anything else: a path that does not exist, a device, a file of another kind
    (last night's report)."""
    path = Path(path)
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    schema, doc = None, None
    if 0 < info.st_size <= KIND_READ_LIMIT:
        try:  # read leniently: a history with a key given twice is still a history to keep
            doc = json.loads(path.read_bytes().decode("utf-8", errors="replace"))
        except (OSError, ValueError, RecursionError):
            doc = None
        schema = doc.get("schema") if isinstance(doc, dict) else None
    if isinstance(schema, str) and isinstance(doc, dict):
        if schema.startswith("pytest-mig/results/"):
            return "a results file"
        if schema.startswith("pytest-mig/baseline/"):
            return "a reference file" if "reference" in doc else "a baseline history"
        if schema.startswith("pytest-mig/"):
            return "a pytest-mig file"
    real = Path(os.path.realpath(path))
    if real.suffix.lower() == ".json":
        what = folder_holding(real, folders)
        if what is not None:
            return f"a file of {what}"
    return None


def folder_holding(path: Path, folders: Sequence[tuple[Path, str]]) -> str | None:
    """What the first of ``folders`` ((folder, what it is) pairs) that holds ``path`` is, wherever
    links on the way lead (both are resolved); None where none holds it."""
    real = os.path.realpath(path)
    for folder, what in folders:
        if Path(real).is_relative_to(os.path.realpath(folder)):
            return what
    return None


def check_output(path: Path, option: str, folders: Sequence[tuple[Path, str]] = (), *, results: bool = False) -> None:
    """Refuse, before the run, an output path that names something no output may replace: a folder, a
    dangling link into no folder, a block device or socket, or what :func:`kept_file` finds (a
    history, a reference, a results file, a JSON file of the baseline or a reference folder).  A new
    path, an ordinary file (the option's own earlier output) and a path written through
    (:func:`writes_through`) pass.  ``results``: the path is --mig-results, whose existing results
    file is another run's.  FileProblem: one sentence naming the option and the file."""
    path = Path(path)
    shown = f"{option}{'' if option.endswith('=') else ' '}{printable(path)}"
    if writes_through(path):
        return
    if path.is_dir():
        raise FileProblem(f"{shown}: a folder, where this output writes a file; move it or name another path")
    try:
        write_target(path)
    except FileProblem as exc:
        raise FileProblem(f"{option}{'' if option.endswith('=') else ' '}{exc}") from None
    kind = kept_file(path, folders)
    if kind is None:
        return
    if results and kind == "a results file":
        raise FileProblem(f"{shown}: the results file of another run, which a new run never replaces; name a new "
                          f"file, or a folder ending in / (each run writes its own results-<time>.json there)")
    raise FileProblem(f"{shown}: {kind}, which an output never replaces; name another file")


def _identity(path: Path) -> tuple[Any, ...]:
    try:
        info = os.stat(path)
        return ("inode", info.st_dev, info.st_ino)
    except (OSError, ValueError):
        return ("path", os.path.realpath(path))


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same file where both exist (through a link, a hard link),
    else the same path once links are followed."""
    return _identity(Path(a)) == _identity(Path(b))


def distinct_outputs(outputs: Sequence[tuple[str, Path]]) -> None:
    """Refuse two outputs of one run that name the same file (the same path spelled twice, through a
    link, or a hard link): the second would replace the first.  Outputs written through
    (:func:`writes_through`: ``/dev/null``, ``/dev/stdout``) may share it.  FileProblem naming both options."""
    seen: dict[tuple[Any, ...], tuple[str, Path]] = {}
    for option, path in outputs:
        if writes_through(path):
            continue
        key = _identity(Path(path))
        if key in seen:
            first, where = seen[key]
            raise FileProblem(f"{first}{'' if first.endswith('=') else ' '}{printable(where)} and "
                              f"{option}{'' if option.endswith('=') else ' '}{printable(path)} name the same file, "
                              f"so one output would replace the other; give each its own file")
        seen[key] = (option, Path(path))


def output_file(text: str, default_name: str, option: str) -> Path:
    """The file an output option names, decided before the run: a value ending in ``/`` is a folder to
    write ``default_name`` into (made if need be); an existing folder named without the ``/``, a link
    to a folder or a dangling link into no folder are refused (FileProblem), not found out after an
    hour of benchmarks."""
    if text.endswith(("/", os.sep)):
        folder = Path(text)
        if folder.exists() and not folder.is_dir():
            raise FileProblem(f"{option} {printable(text)}: {folder.resolve()} is a file, not a folder to write into")
        return folder / default_name
    path = Path(text)
    if path.is_dir() and not path.is_symlink():
        raise FileProblem(f"{option} {printable(text)}: a folder; name a file, or end it with / to write {default_name} into it")
    if writes_through(path):  # /dev/null, /dev/stdout, a FIFO: written through
        return path
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
    the path written (a link's target).  A character device or a pipe (:func:`writes_through`) is
    opened and written instead, after ``check`` has read the text: the node is never replaced."""
    if writes_through(path):
        if check is not None:
            check(text)
        with open(path, "a", encoding="utf-8") as fh:  # a log /dev/stdout was sent to is added to, not cut
            fh.write(text)
        return Path(path)
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



#: The lock file used only where a folder cannot be locked itself (see folder_lock).
LOCK_FILE_NAME = ".pytest-mig.lock"
#: Seconds a save waits for another run's lock on a folder.
LOCK_TIMEOUT_S = 60.0


@contextlib.contextmanager
def folder_lock(root: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive lock on the folder itself (``flock`` on its descriptor), held while a save runs.

    Nothing is created, so no lock file is left for ``git status`` to show or for another user's
    umask to make unwritable.  Where the file system cannot lock a folder (some network file
    systems), a lock file ``.pytest-mig.lock`` made writable by all is used instead.
    """
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        yield
        return
    fd = os.open(root, os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    with _lock_file(root, max(0.0, deadline - time.monotonic())):
                        yield
                    return
                if time.monotonic() >= deadline:
                    raise TimeoutError(str(root)) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextlib.contextmanager
def _lock_file(root: Path, timeout: float) -> Iterator[None]:
    from filelock import FileLock, Timeout

    lock = root / LOCK_FILE_NAME
    if os.path.lexists(lock) and (lock.is_symlink() or not lock.is_file()):  # never opened, truncated or followed
        raise OSError(errno.EEXIST, f"{lock} is a link or not a regular file, where pytest-mig keeps its lock file; "
                                    f"remove it")
    try:
        with FileLock(str(lock), timeout=timeout, mode=0o666):
            yield
    except Timeout:
        raise TimeoutError(str(root)) from None


__all__ = ["FileProblem", "KIND_READ_LIMIT", "LOCK_FILE_NAME", "LOCK_TIMEOUT_S", "MAX_DEPTH", "MAX_INT_DIGITS", "MAX_SIZE",
           "MAX_NUMBER", "NAME_MAX", "PATH_MAX", "STREAMS", "STREAM_FOLDERS", "atomic_write_text", "check_links",
           "check_output", "check_path", "depth", "distinct_outputs", "folder_holding", "folder_lock", "kept_file",
           "output_file", "parse_json", "path_problem", "read_json", "read_text", "same_file", "validate", "write_target",
           "writes_through"]
