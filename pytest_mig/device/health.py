"""Health context: what NVML says about a device's health, read before and after each test.

A slow figure is most often one sick GPU: a stray process on it, ECC errors, rows that could not be
remapped, a PCIe link trained down, a hardware slowdown, an XID.  The reader takes a
:class:`Snapshot` of those signs; :func:`signs` turns a run's or a test's snapshots into
:class:`Sign` sentences.  A ``fail`` sign fails the run on its own, as DCGM diagnostics and IBM's
Autopilot do; a ``warn`` sign is named in the verdict of a figure that regressed while it was
present, as the likely cause.  Reading never raises: what NVML cannot tell is left out, and said.

What is read (board-level counters from the parent GPU of a MIG instance, processes from the device
the run is pinned to):
- compute processes other than this run's;
- ECC errors, volatile (since the driver loaded) and aggregate (lifetime), corrected and uncorrected;
- remapped rows with their pending and failure flags (Ampere on), or retired pages (earlier GPUs);
- the PCIe link's current and maximum generation and width;
- clock event reasons (hardware slowdown, thermal, power brake);
- XID errors, through an NVML event set registered for the run, where the driver allows it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal, Sequence

from pytest_mig.device import nvml

#: Per-lane transfer rate in GT/s and line-code efficiency of each PCIe generation (PCI-SIG):
#: 8b/10b up to Gen2, 128b/130b for Gen3-5, FLIT mode (242 of 256 bytes carry data) for Gen6.
PCIE_GEN = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
            5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}

#: Clock event reasons that are a health sign (a power cap is a normal state of a busy GPU).
HW_REASONS = ("hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal")

Level = Literal["fail", "warn", "info"]


def link_gbs(gen: int | None, width: int | None) -> float | None:
    """Theoretical data rate of a PCIe link in GB/s per direction (Gen5 x16: 63.0)."""
    if gen not in PCIE_GEN or not width or width <= 0:
        return None
    gts, efficiency = PCIE_GEN[gen]
    return gts * width * efficiency / 8


@dataclass
class Snapshot:
    """One reading of a device's health signs; None where NVML could not tell."""

    gpu_index: int | None = None
    device: str = ""  # "GPU 0" or "GPU 0 MIG-..." as verdicts name it
    others: list[int] = field(default_factory=list)  # compute pids on the device not of this run
    ecc: dict[str, int] | None = None  # volatile/aggregate x corrected/uncorrected
    remapped_rows: dict[str, Any] | None = None  # correctable, uncorrectable, pending, failure
    retired_pages: dict[str, Any] | None = None  # single_bit, double_bit, pending (before Ampere)
    pcie: dict[str, int] | None = None  # gen, width, max_gen, max_width
    clock_events: list[str] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)  # XID events since the last reading
    unavailable: list[str] = field(default_factory=list)  # what NVML could not tell

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sign:
    """A health sign in one sentence, with how much it weighs."""

    level: Level
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"level": self.level, "text": self.text}


def _ecc(nv: Any, h: Any) -> dict[str, int] | None:
    out = {}
    for counter, cname in ((nv.NVML_VOLATILE_ECC, "volatile"), (nv.NVML_AGGREGATE_ECC, "aggregate")):
        for etype, ename in ((nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                             (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
            n = nvml.try_call(nv.nvmlDeviceGetTotalEccErrors, h, etype, counter)
            if n is None:
                return None
            out[f"{cname}_{ename}"] = int(n)
    return out


def _remapped(nv: Any, h: Any) -> dict[str, Any] | None:
    rows = nvml.try_call(nv.nvmlDeviceGetRemappedRows, h)
    if rows is None:
        return None
    corr, unc, pending, failure = (int(x) for x in rows)
    return {"correctable": corr, "uncorrectable": unc, "pending": bool(pending), "failure": bool(failure)}


def _retired(nv: Any, h: Any) -> dict[str, Any] | None:
    single = nvml.try_call(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    double = nvml.try_call(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = nvml.try_call(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if single is None and double is None:
        return None
    return {"single_bit": len(single or []), "double_bit": len(double or []),
            "pending": bool(int(pending)) if pending is not None else False}


class Reader:
    """Reads the health of the device a run is pinned to; keeps NVML open and an XID event set.

    ``device_uuid`` names a MIG instance (processes are read there) or None for the whole GPU.
    ``own_pids`` are this run's processes as NVML numbers them (a container's PID namespace may
    number them otherwise than ``os.getpid()``: see :meth:`learn_own_pids`).
    """

    def __init__(self, gpu_index: int, device_uuid: str | None = None) -> None:
        self._session = nvml.Session().__enter__()
        self._nv = nv = self._session.nv
        self.gpu_index = gpu_index
        self.device_uuid = device_uuid
        self.own_pids: set[int] = {os.getpid()}
        self._h = nvml.try_call(nv.nvmlDeviceGetHandleByIndex, gpu_index) if nv is not None else None
        self._dev = self._h
        if nv is not None and device_uuid and device_uuid.startswith("MIG-"):
            self._dev = nvml.try_call(nv.nvmlDeviceGetHandleByUUID, device_uuid)
        self._events = None
        self.xid_note = "XID events: not read (no NVML)"
        if self._h is not None:
            self._events = self._register_xids()

    @property
    def available(self) -> bool:
        return self._h is not None

    def _register_xids(self) -> Any:
        nv = self._nv
        es = nvml.try_call(nv.nvmlEventSetCreate)
        if es is None:
            self.xid_note = "XID events: not available through NVML here"
            return None
        try:
            nv.nvmlDeviceRegisterEvents(self._h, nv.nvmlEventTypeXidCriticalError, es)
        except Exception as exc:
            nvml.try_call(nv.nvmlEventSetFree, es)
            self.xid_note = f"XID events: not available through NVML here ({type(exc).__name__})"
            return None
        self.xid_note = "XID events: watched"
        return es

    def _drain_xids(self) -> list[int]:
        out: list[int] = []
        if self._events is None:
            return out
        nv = self._nv
        for _ in range(64):  # a storm of XIDs is reported by its first 64
            data = nvml.try_call(nv.nvmlEventSetWait_v2, self._events, 0)
            if data is None:  # NVMLError_Timeout: nothing pending
                break
            out.append(int(getattr(data, "eventData", 0)))
        return out

    def processes(self) -> list[int] | None:
        if self._dev is None:
            return None
        procs = nvml.try_call(nvml.running_processes, self._nv, self._dev)
        return None if procs is None else sorted(procs)

    def learn_own_pids(self, before_cuda: Iterable[int]) -> None:
        """Own pids from the device's process list: this pid if NVML shows it, else the pids that
        appeared since ``before_cuda`` (read before this process started CUDA)."""
        now = self.processes() or []
        if os.getpid() not in now:
            self.own_pids |= set(now) - set(before_cuda)

    def read(self) -> Snapshot:
        snap = Snapshot(gpu_index=self.gpu_index, device=device_name(self.gpu_index, self.device_uuid))
        if not self.available:
            snap.unavailable.append("NVML")
            return snap
        nv, h = self._nv, self._h
        procs = self.processes()
        if procs is None:
            snap.unavailable.append("processes")
        else:
            snap.others = [p for p in procs if p not in self.own_pids]
        snap.ecc = _ecc(nv, h)
        if snap.ecc is None:
            snap.unavailable.append("ECC counts")
        snap.remapped_rows = _remapped(nv, h)
        if snap.remapped_rows is None:
            snap.retired_pages = _retired(nv, h)
            if snap.retired_pages is None:
                snap.unavailable.append("remapped rows and retired pages")
        snap.pcie = nvml.BoardReader.link(nv, h)
        if snap.pcie is None:
            snap.unavailable.append("PCIe link")
        snap.clock_events = [r for r in nvml.BoardReader.reasons(nv, h) if r in HW_REASONS]
        snap.xids = self._drain_xids()
        return snap

    def close(self) -> None:
        if self._events is not None:
            nvml.try_call(self._nv.nvmlEventSetFree, self._events)
            self._events = None
        self._session.__exit__(None, None, None)


def device_name(gpu_index: int | None, uuid: str | None) -> str:
    gpu = f"GPU {gpu_index}" if gpu_index is not None else "the GPU"
    return f"{gpu} {uuid}" if uuid and uuid.startswith("MIG-") else gpu


def _link_text(p: dict[str, int]) -> str:
    return f"PCIe link at Gen{p['gen']} x{p['width']}, max Gen{p['max_gen']} x{p['max_width']}"


def state_signs(s: Snapshot) -> list[Sign]:
    """Signs a single reading shows: what is wrong with the device now, whatever happened before."""
    out: list[Sign] = []
    if s.ecc and s.ecc["volatile_uncorrected"]:
        out.append(Sign("fail", f"{s.ecc['volatile_uncorrected']} uncorrected ECC error(s) on {s.device} since the "
                                "driver loaded (volatile count)"))
    r = s.remapped_rows
    if r and r["failure"]:
        out.append(Sign("fail", f"row remapping failed on {s.device}: the board has run out of spare rows (RMA)"))
    if r and r["pending"]:
        out.append(Sign("warn", f"remapped rows pending on {s.device}: a GPU reset is due to apply them"))
    p = s.retired_pages
    if p and p["pending"]:
        out.append(Sign("warn", f"retired pages pending on {s.device}: a GPU reset is due to retire them"))
    link = s.pcie
    if link and link["width"] < link["max_width"]:
        out.append(Sign("fail", f"{_link_text(link)} on {s.device}: the link trained down to fewer lanes"))
    return out


def change_signs(before: Snapshot, after: Snapshot) -> list[Sign]:
    """Signs of something that happened between two readings (during a test, or a run)."""
    out: list[Sign] = []
    others = sorted(set(before.others) | set(after.others))
    if others:
        pids = ", ".join(map(str, others))
        out.append(Sign("warn", f"another process (pid {pids}) used {after.device} during the measurement"))
    if before.ecc and after.ecc:
        unc = after.ecc["volatile_uncorrected"] - before.ecc["volatile_uncorrected"]
        cor = after.ecc["volatile_corrected"] - before.ecc["volatile_corrected"]
        if unc > 0:
            out.append(Sign("fail", f"{unc} uncorrected ECC error(s) on {after.device} during the measurement"))
        if cor > 0:
            out.append(Sign("warn", f"{cor} corrected ECC error(s) on {after.device} during the measurement"))
    rb, ra = before.remapped_rows, after.remapped_rows
    if rb and ra and ra["uncorrectable"] > rb["uncorrectable"]:
        out.append(Sign("warn", f"{ra['uncorrectable'] - rb['uncorrectable']} row(s) remapped on {after.device} "
                                "for uncorrectable errors during the measurement"))
    if after.clock_events:
        out.append(Sign("warn", f"clock events on {after.device}: {', '.join(after.clock_events)}"))
    if after.xids:
        out.append(Sign("fail", f"XID {', '.join(map(str, after.xids))} on {after.device} during the measurement"))
    return out


def link_note(s: Snapshot) -> str | None:
    """The link's generation when it reads below its maximum: links drop generation when idle to
    save power, so this is a note, and the host-bandwidth test checks it under load."""
    p = s.pcie
    if p and p["gen"] < p["max_gen"] and p["width"] >= p["max_width"]:
        return f"{_link_text(p)} (links drop generation when idle; test_host_bandwidth reads it under load)"
    return None


def summary(s: Snapshot) -> str:
    """One line of a device's health, for the header and docs."""
    parts = [s.device + ":"]
    parts.append(f"other processes {', '.join(map(str, s.others))}" if s.others else "no other process")
    if s.ecc:
        parts.append(f"ECC uncorrected {s.ecc['volatile_uncorrected']} volatile / {s.ecc['aggregate_uncorrected']} "
                     f"lifetime, corrected {s.ecc['volatile_corrected']} / {s.ecc['aggregate_corrected']}")
    r = s.remapped_rows
    if r:
        flags = [w for w, on in (("pending", r["pending"]), ("FAILED", r["failure"])) if on]
        parts.append(f"remapped rows {r['correctable']} correctable, {r['uncorrectable']} uncorrectable"
                     + (f" ({', '.join(flags)})" if flags else ""))
    if s.retired_pages:
        parts.append(f"retired pages {s.retired_pages['single_bit']} single-bit, "
                     f"{s.retired_pages['double_bit']} double-bit")
    if s.pcie:
        parts.append(_link_text(s.pcie))
    if s.clock_events:
        parts.append("clock events " + ", ".join(s.clock_events))
    if s.unavailable:
        parts.append("not readable: " + ", ".join(s.unavailable))
    return " ".join(parts[:1]) + " " + "; ".join(parts[1:])


def likely_cause(signs: Sequence[Sign | dict[str, str]]) -> str:
    """The text a regressed verdict gets when health signs were present while it was measured."""
    texts = [s.text if isinstance(s, Sign) else str(s.get("text")) for s in signs]
    texts = [t for t in texts if t]
    if not texts:
        return ""
    return "; health: " + "; ".join(texts) + (": the likely cause" if len(texts) == 1 else ": likely causes")


class Watch:
    """The health context of one run: read at its start, around each test, and at its end.

    ``before_cuda`` are the device's compute pids read before this process started CUDA, so that
    this run's own process is told from others even where NVML numbers pids in another namespace.
    """

    def __init__(self, reader: Reader, before_cuda: Iterable[int] = ()) -> None:
        self.reader = reader
        reader.learn_own_pids(before_cuda)
        self.start = reader.read()
        self._before: Snapshot | None = None

    def header(self) -> list[str]:
        lines = [f"health {summary(self.start)}; {self.reader.xid_note}"]
        lines += [f"health {s.level.upper()}: {s.text}" for s in state_signs(self.start)]
        note = link_note(self.start)
        return lines + ([f"health note: {note}"] if note else [])

    def before_test(self) -> None:
        self._before = self.reader.read()

    def after_test(self) -> dict[str, Any] | None:
        """The test's health record: both readings and the signs of what happened in between."""
        if self._before is None:
            return None
        before, self._before = self._before, None
        after = self.reader.read()
        found = change_signs(before, after)
        return {"before": before.to_dict(), "after": after.to_dict(), "signs": [s.to_dict() for s in found]}

    def finish(self) -> list[Sign]:
        """The run's health signs at its end: the state of the device then (new XIDs included)."""
        end = self.reader.read()
        out = state_signs(end)
        if end.xids:
            out.append(Sign("fail", f"XID {', '.join(map(str, end.xids))} on {end.device} during the run"))
        self.reader.close()
        return out


def failing(health: dict[str, Any] | None) -> list[str]:
    """The lines of a test's fail-level health signs: each fails the test whatever its figures."""
    return [f"HEALTH {s['text']}" for s in (health or {}).get("signs", []) if s.get("level") == "fail"]


def annotate(verdicts: Sequence[Any], health: dict[str, Any] | None) -> None:
    """Name the test's health signs in each regressed verdict, as the likely cause."""
    signs = [s for s in (health or {}).get("signs", []) if s.get("level") in ("fail", "warn")]
    note = likely_cause(signs)
    if not note:
        return
    for v in verdicts:
        if v.outcome in ("regressed", "transient") and note not in v.message:
            v.message += note


__all__ = ["HW_REASONS", "PCIE_GEN", "Reader", "Sign", "Snapshot", "Watch", "annotate", "change_signs",
           "device_name", "failing", "likely_cause", "link_gbs", "link_note", "state_signs", "summary"]
