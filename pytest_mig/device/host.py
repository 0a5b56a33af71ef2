"""What the GPUs of one host share while copying to and from it: a turn, and the others' traffic.

Host-device copies go through the host's memory, its PCIe root ports and switches, which every GPU
of the host shares.  Four H200s of one host running the suite at once, each its own process
started together as a scheduler starts one job per GPU (docs/results/h200-quad-2026-11-28.tgz),
copied as little as 31 GB/s host-to-device and 28 GB/s device-to-host where one alone copies 55
(43% and 50% less); 10 of their 11 nights failed their host copies, confirmed by re-measurements
taken while the others still copied.  A nightly on every GPU of a node would fail so every night.  So:

* **pytest-mig processes of one host take turns at their host copies** (:func:`host_turn`): the
  turn is an abstract Unix socket name, bound by one process at a time and freed by the kernel when
  the process ends, however it ends (no file to leave stale, follow through a link, or lose).  A
  process waits up to ``TURN_WAIT_S`` for it; then it measures anyway, and the reading below tells.
* **The other GPUs' PCIe traffic is read while the copies run** (:class:`Neighbours`, NVML's PCIe
  throughput counters), for what a turn cannot see: another user's job.  Where the others moved
  more than ``NEIGHBOUR_GBS`` together, the figures say so (``info["shared_host"]``): they are
  judged ``incomparable`` with that sentence and never saved into a history or a reference
  (:func:`shared_host`).

Neither reaches across containers on its own: one pod per GPU has its own network namespace (no
shared turn) and an NVML that lists its own GPU only (no neighbours to read; the figures then say
that sharing was not checked, ``info["neighbours"]``).  ``--mig-host-lock FILE`` names a file every
run of the host sees (a hostPath volume): the turn is then also ``flock`` on it (:func:`open_host_lock`),
which the kernel frees however the process ends; the file is opened for reading only, never
written.  A process waits the whole ``TURN_WAIT_S`` once; after that, if the turn is still held, it
takes the turn only where it is free.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

from pytest_mig.common.files import kept_file
from pytest_mig.common.poller import Poller
from pytest_mig.common.text import printable, shown

T = TypeVar("T")

#: The turn's name in the abstract socket namespace (Linux), one per host and network namespace.
TURN_NAME = "\0pytest-mig/host-copies"
#: How long a process waits for its turn before it measures anyway: eight GPUs' normal host copies
#: take under a minute together, 56 MIG workers' (eight GPUs of 7 slices) about four.
TURN_WAIT_S = 300.0
#: Seconds between two attempts at the turn.
TURN_POLL_S = 0.05
#: The other GPUs' PCIe traffic (GB/s, both directions, together) above which a host copy was not
#: measured alone.  Between what was measured (docs/results/h200-turns-2026-11-28.tgz): three H200s
#: running the rest of the suite read 0.12-1.08 GB/s together and left a fourth's copies at 54.7-55.4
#: GB/s, as alone; another GPU's copies move 30-55 GB/s.
NEIGHBOUR_GBS = 2.0
#: Seconds between two readings of the other GPUs' traffic (each reading takes NVML's 20 ms
#: sample per counter).
SAMPLE_S = 0.1
#: The key a host-copy figure carries in its info when the host was shared during its measurement.
SHARED_HOST = "shared_host"
#: What a host-copy figure's info says of the host (:func:`Neighbours.info`, ``SHARED_HOST``): a report
#: keeps these where it drops the rest of the info.
HOST_INFO_KEYS = ("neighbours_pcie_gbs", "neighbours", SHARED_HOST)
#: Measurements taken again, after a pause, while the other GPUs were seen copying.
SHARED_RETRIES = 2
SHARED_PAUSE_S = 5.0


@dataclass
class Turn:
    """A process's turn at the host's copies: whether it has the host to itself among pytest-mig
    processes, and how long it waited."""

    held: bool
    waited_s: float = 0.0
    note: str = ""
    lock: Path | None = None  # --mig-host-lock's file, where the turn was also taken there

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host_turn": "held" if self.held else "not held", "host_turn_waited_s": round(self.waited_s, 2)}
        if self.lock is not None:
            out["host_turn_lock"] = shown(str(self.lock))
        if self.note:
            out["host_turn_note"] = self.note
        return out


class HostLockError(ValueError):
    """``--mig-host-lock`` names something that cannot be the turn's file; the message is one sentence."""


#: Folders whose files are a different one in every process or are no files at all: no lock there holds.
PSEUDO_FOLDERS = ("/proc/", "/sys/")


def open_host_lock(path: Path) -> int:
    """A descriptor of ``path`` for the host's turn (``--mig-host-lock``): a plain file, made empty
    (mode 644) where it is missing, opened for reading only (never written: a file a site keeps
    stays as it is), never through a link, nothing else opened first.  HostLockError says in one
    sentence why ``path`` cannot be it."""
    where = shown(str(path))
    try:
        seen: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        seen = None
    except (OSError, ValueError) as exc:
        raise HostLockError(f"--mig-host-lock {where} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if seen is not None:  # what it is, before anything opens it (a device may act on being opened)
        if stat.S_ISLNK(seen.st_mode):
            raise HostLockError(f"--mig-host-lock {where} is a link: name the file itself")
        if stat.S_ISDIR(seen.st_mode):
            raise HostLockError(f"--mig-host-lock {where} is a folder: name a file in it, such as pytest-mig.lock")
        if not stat.S_ISREG(seen.st_mode):
            raise HostLockError(f"--mig-host-lock {where} is not a plain file")
    if (os.path.realpath(path) + "/").startswith(PSEUDO_FOLDERS):
        raise HostLockError(f"--mig-host-lock {where} is in /proc or /sys, whose files take no lock that holds "
                            f"between runs: name a file on a local file system")
    kept = kept_file(path)
    if kept:  # never written here, but replaced whole when saved: a lock on the old file would not hold
        raise HostLockError(f"--mig-host-lock {where} is {kept}, which pytest-mig replaces as it saves: name a "
                            f"file of its own, such as pytest-mig.lock")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO must not hold the run
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            with contextlib.suppress(OSError):  # every run of the host opens it, whatever this one's umask
                os.fchmod(fd, 0o644)
        except FileExistsError:
            fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostLockError(f"--mig-host-lock {where} is a link: name the file itself") from None
        raise HostLockError(f"--mig-host-lock {where} cannot be opened: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise HostLockError(f"--mig-host-lock {where} is not a plain file")
    return fd


def _fcntl() -> Any:
    """The ``fcntl`` module (POSIX only; imported where it is used, as docs/architecture.md says)."""
    try:
        import fcntl
    except ImportError:
        raise HostLockError("--mig-host-lock needs POSIX file locks (fcntl), which this system has not") from None
    return fcntl


def check_host_lock(path: Path) -> None:
    """At start-up: ``path`` can be the host's turn: it opens, and its file system gives an exclusive
    lock on a file opened for reading (NFS gives none); HostLockError otherwise."""
    fcntl = _fcntl()
    fd = open_host_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except BlockingIOError:
        pass  # another run holds the turn now: the file takes locks
    except OSError as exc:
        raise HostLockError(f"--mig-host-lock {shown(str(path))}: its file system gives no lock on it "
                            f"({exc.strerror or exc}); name a file on a local file system") from None
    finally:
        os.close(fd)


class _Claim:
    """One lock a turn takes.  ``take`` returns whether it is now held (False: another holds it, or
    it can never be taken here, which ``unavailable`` then says; it is passed over after that)."""

    unavailable = ""

    def take(self) -> bool:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.release()


class _SocketClaim(_Claim):
    """An abstract Unix socket name: one per host and network namespace."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sock: socket.socket | None = None

    def take(self) -> bool:
        try:
            candidate = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except (AttributeError, OSError) as exc:  # no Unix sockets here
            self.unavailable = f"no turn taken: {exc}"
            return False
        try:
            candidate.bind(self.name)
        except OSError as exc:
            candidate.close()
            if exc.errno != errno.EADDRINUSE:
                self.unavailable = f"no turn taken: {exc.strerror or exc}"  # no abstract namespace (not Linux)
            return False
        self.sock = candidate
        return True

    def release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class _FileClaim(_Claim):
    """``flock`` on ``--mig-host-lock``'s file (:func:`open_host_lock`): the turn across network
    namespaces.  The kernel frees it when the process ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def take(self) -> bool:
        try:
            fcntl = _fcntl()
            for _ in range(3):
                if self.fd is None:
                    self.fd = open_host_lock(self.path)
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if self._still_the_file():
                    return True
                self.close()  # replaced or removed since it was opened: a lock on it excludes no one
            return False
        except BlockingIOError:
            return False
        except HostLockError as exc:
            self.unavailable = f"no turn taken: {exc}"
            return False
        except OSError as exc:
            self.unavailable = f"no turn taken: --mig-host-lock {shown(str(self.path))}: {exc.strerror or exc}"
            return False

    def _still_the_file(self) -> bool:
        try:
            now, held = os.stat(self.path), os.fstat(self.fd) if self.fd is not None else None
        except OSError:
            return False
        return held is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        if self.fd is not None:
            fcntl = _fcntl()
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # frees the lock too
            self.fd = None


#: Turns whose whole wait ran out in this process: a second wait would only add as much again.
_WAITED_OUT: set[tuple[str, Path | None]] = set()


@contextlib.contextmanager
def host_turn(name: str = TURN_NAME, wait_s: float = TURN_WAIT_S, poll_s: float = TURN_POLL_S,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep, lock: Path | None = None) -> Iterator[Turn]:
    """Hold the host's turn at host copies while the block runs (see the module docstring): the
    abstract socket ``name`` and, with ``lock``, ``flock`` on that file; both at once or neither, so
    that two runs never each hold one and wait for the other.

    Never raises for the turn itself: where a lock cannot be taken here, or the wait runs out, the
    block runs without it and ``Turn.note`` says why.  Once a wait has run out in this process, later
    ones take the turn only if it is free (a stuck holder costs one wait a night, not one per
    re-measurement)."""
    key = (name, lock)
    if key in _WAITED_OUT:
        wait_s = 0.0
    claims: list[_Claim] = [_SocketClaim(name)] + ([_FileClaim(lock)] if lock is not None else [])
    start = clock()
    busy, note = False, ""
    try:
        while True:
            busy = False
            for claim in claims:
                if not claim.unavailable and not claim.take() and not claim.unavailable:
                    busy = True
                    break
            if not busy:
                break
            for claim in claims:
                claim.release()
            if clock() - start >= wait_s:
                note = (f"no turn taken: another process held the host's copies for over {wait_s:g} s" if wait_s
                        else "no turn taken: another process held the host's copies, as it did for this run's whole wait")
                _WAITED_OUT.add(key)
                break
            sleep(poll_s)
        missing = [c.unavailable for c in claims if c.unavailable]
        # held: nothing busy, something taken, and the file where one was asked for
        held = not busy and len(missing) < len(claims) and not any(isinstance(c, _FileClaim) and c.unavailable
                                                                    for c in claims)
        yield Turn(held, clock() - start, "; ".join([*missing, note] if note else missing), lock)
    finally:
        for claim in claims:
            claim.close()


@dataclass
class Neighbours:
    """Reads the other GPUs' PCIe traffic in a thread while a measurement runs.

    ``read`` returns each other GPU's traffic now, in GB/s both directions together, by name
    (``{"GPU 1": 41.2}``); an empty mapping where there is none to read.  ``peak`` keeps the most
    the others moved together in one reading, ``by_gpu`` each one's most."""

    read: Callable[[], Mapping[str, float]]
    every_s: float = SAMPLE_S
    join_s: float = 5.0  # the most the measurement waits for a reading at its end
    peak: float = 0.0
    by_gpu: dict[str, float] = field(default_factory=dict)
    readings: int = 0
    _final: tuple[float, dict[str, float], int] | None = None
    _poller: Poller | None = None

    def sample(self) -> None:
        """Take one reading (the thread's step; callable directly).  A reading that fails, or in which
        no other GPU answered, is no reading."""
        try:
            now = {str(k): float(v) for k, v in self.read().items() if v is not None and math.isfinite(v)}
        except Exception:  # a reading that fails is no reading; the measurement goes on
            return
        if not now:
            return
        self.readings += 1
        self.peak = max(self.peak, sum(now.values()))
        for k, v in now.items():
            self.by_gpu[k] = max(self.by_gpu.get(k, 0.0), v)

    def __enter__(self) -> Neighbours:
        # One reading after the stop too, so that a short measurement has at least one.
        self._poller = Poller(self.sample, self.every_s, "pytest-mig-neighbours", join_s=self.join_s, last_step=True)
        self._poller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._poller is not None:
            self._poller.stop()  # a reading NVML never answers does not hold the test
        # What was read by the end is what the figure says: a reading that lands later changes nothing.
        self._final = (self.peak, dict(self.by_gpu), self.readings)

    def _state(self) -> tuple[float, dict[str, float], int]:
        return self._final if self._final is not None else (self.peak, dict(self.by_gpu), self.readings)

    def shared(self, limit: float = NEIGHBOUR_GBS) -> str | None:
        """The sentence a figure carries when the others moved more than ``limit`` (None: alone)."""
        peak, by_gpu, _ = self._state()
        if peak <= limit:
            return None
        busy = sorted((k for k, v in by_gpu.items() if v > 0.1 * limit), key=_gpu_order)
        who = ", ".join(busy) if busy else "the other GPUs"
        return (f"{who} of this host moved up to {peak:.1f} GB/s over PCIe while it was measured (over "
                f"{limit:g} GB/s): host copies share the host's memory and PCIe switches, so this is not this "
                f"GPU's link alone; measure it with the host's other GPUs idle")

    def info(self) -> dict[str, Any]:
        peak, _, readings = self._state()
        if not readings:
            return {"neighbours": "no other GPU's PCIe traffic could be read (none visible to NVML, or no "
                                  "answer): sharing not checked"}
        return {"neighbours_pcie_gbs": round(peak, 2), "neighbour_readings": readings}


def measured_alone(measure: Callable[[], T], read: Callable[[], Mapping[str, float]] | None,
                   retries: int = SHARED_RETRIES, pause_s: float = SHARED_PAUSE_S,
                   sleep: Callable[[float], None] = time.sleep) -> tuple[T, Neighbours, int]:
    """``measure()`` while the other GPUs' traffic is read; taken again after a pause, up to
    ``retries`` times, while they were seen copying.  Returns the last result, its reading and the
    attempts made: a result whose reading is still shared is not this GPU's alone."""
    attempt = 0
    while True:
        attempt += 1
        watch = Neighbours(read or (lambda: {}))
        with watch:
            result = measure()
        if attempt > retries or watch.shared() is None:
            return result, watch, attempt
        sleep(pause_s)


def _gpu_order(name: str) -> tuple[int, str]:
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits) if digits else 1 << 30, name)


#: The most of a file's ``shared_host`` sentence a verdict repeats.
SENTENCE_LIMIT = 400


def shared_host(info: Any) -> str | None:
    """The sentence of a figure measured while the host's other GPUs copied, printable and at most
    ``SENTENCE_LIMIT`` characters (None: measured alone)."""
    if not isinstance(info, Mapping):
        return None
    text = info.get(SHARED_HOST)
    if not isinstance(text, str) or not text.strip():
        return None
    shown = printable(text.strip())  # escaped first, so that the limit holds what is printed
    return shown if len(shown) <= SENTENCE_LIMIT else shown[:SENTENCE_LIMIT - 3] + "..."


__all__ = ["HOST_INFO_KEYS", "NEIGHBOUR_GBS", "SHARED_HOST", "SHARED_PAUSE_S", "SHARED_RETRIES", "TURN_NAME", "TURN_WAIT_S", "HostLockError",
           "Neighbours", "Turn", "check_host_lock", "host_turn", "measured_alone", "open_host_lock", "shared_host"]
