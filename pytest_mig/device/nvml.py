"""Everything pytest-mig reads through NVML; the only module that imports pynvml.

pynvml comes from the `nvidia-ml-py` distribution.  The module is imported lazily, inside
functions, so that tests can put a fake `pynvml` in ``sys.modules`` and so that a machine without
the NVIDIA driver still imports pytest-mig.  NVML quirks handled here: MIG slots that raise NotFound, ``nvmlDeviceIsMigDeviceHandle``
returning a c_uint object, bytes where str is expected, board-level power/clock readings that
must come from the parent GPU of a MIG instance.
"""

from __future__ import annotations

import importlib
import platform
import re
from dataclasses import dataclass
from typing import Any, Callable
from pytest_mig.common.text import printable
from importlib.metadata import PackageNotFoundError, version

#: NVML's GPU-instance profile enums (NVML_GPU_INSTANCE_PROFILE_*): 1, 2, 3, 4, 7, 8, 6 slices,
#: then 1-slice +me (REV1), 2-slice REV1, 1-slice double memory (REV2), and the newer ones.
GPU_INSTANCE_PROFILE_ENUMS = tuple(range(0, 16))

#: Names of the clock-event (throttle) reason bits, in NVML's order.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
}
#: Reasons that mean the GPU ran slower than it could (idle and settings are not a slowdown).
SLOWDOWN_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


@dataclass(frozen=True)
class MigInstance:
    """One MIG device (a compute instance inside a GPU instance) as NVML reports it."""

    uuid: str
    gpu_index: int
    mig_index: int  # slot on the parent, as nvmlDeviceGetMigDeviceHandleByIndex numbers it
    name: str
    profile: str  # "1g.10gb", "1c.3g.40gb" (derived the way Slurm names it)
    gpu_instance_id: int | None
    compute_instance_id: int | None
    sms: int | None
    memory_mb: int | None
    gi_slices: int | None
    ci_slices: int | None
    busy_pids: tuple[int, ...] = ()

    @property
    def free(self) -> bool:
        return not self.busy_pids


@dataclass(frozen=True)
class ProfileInfo:
    """One row of the GPU's own profile table (nvmlDeviceGetGpuInstanceProfileInfo)."""

    name: str  # "1g.18gb"
    profile_id: int
    slices: int
    instance_count: int
    sms: int
    memory_mb: int
    copy_engines: int | None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int
    mig_enabled: bool | None  # None: the GPU has no MIG at all
    instances: tuple[MigInstance, ...] = ()
    profiles: tuple[ProfileInfo, ...] = ()
    compute_capability: tuple[int, int] | None = None
    mig_pending: bool | None = None  # the MIG mode after the next GPU reset, where it differs from now
    busy_pids: tuple[int, ...] = ()  # compute processes on the whole GPU (MIG off)
    serial: str | None = None  # the board's serial number, as printed on it (to pull the right board)
    pci_bus_id: str | None = None  # "00000000:07:00.0"

    def state_words(self) -> str:
        """'MIG on', 'MIG off', 'no MIG', with a pending change said as one."""
        mig = {True: "MIG on", False: "MIG off", None: "no MIG"}[self.mig_enabled]
        if self.mig_pending is not None:
            mig += f" (MIG {'on' if self.mig_pending else 'off'} pending: a GPU reset is due before it applies)"
        return mig


@dataclass(frozen=True)
class Inventory:
    """What NVML saw on this machine (or why it saw nothing)."""

    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    cuda_driver: int | None = None
    error: str | None = None  # why there is no inventory: no NVML library, driver not loaded, ...
    problems: tuple[str, ...] = ()  # GPUs NVML listed but could not read ("GPU 1: NVMLError_GpuIsLost: ...")

    @property
    def instances(self) -> list[MigInstance]:
        return [i for g in self.gpus for i in g.instances]

    def find_instance(self, uuid: str) -> MigInstance | None:
        """A MIG instance by UUID, or by a prefix of one that names only it (as CUDA allows)."""
        for inst in self.instances:
            if inst.uuid == uuid or inst.uuid == f"MIG-{uuid}" or f"MIG-{inst.uuid}" == uuid:
                return inst
        return _unique_prefix(uuid, self.instances)

    def find_gpu(self, key: str) -> Gpu | None:
        """A GPU by NVML index ("0") or UUID ("GPU-..."; a prefix that names only it, as CUDA allows)."""
        for g in self.gpus:
            if key == str(g.index) or key == g.uuid or f"GPU-{key}" == g.uuid:
                return g
        return _unique_prefix(key, self.gpus) if key.startswith("GPU-") else None


def _unique_prefix(key: str, items: Any) -> Any:
    if len(key) <= 4:  # "GPU-" or "MIG-" alone names nothing
        return None
    found = [x for x in items if x.uuid.startswith(key)]
    return found[0] if len(found) == 1 else None


def _text(value: Any) -> str:
    """An NVML string as pytest-mig prints and stores it: control characters (an escape sequence, a
    newline in a GPU's name) written as ``\\x1b``, so no terminal, report or log line is driven by them."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return printable(text)


def _int(value: Any) -> int:
    return int(getattr(value, "value", value))


def load() -> Any:
    """Import pynvml (raises ImportError when nvidia-ml-py is not installed)."""
    return importlib.import_module("pynvml")


class _Session:
    """nvmlInit/nvmlShutdown around a block, with one-sentence reasons for failure."""

    def __init__(self) -> None:
        self.nv: Any = None
        self.error: str | None = None

    def __enter__(self) -> "_Session":
        try:
            nv = load()
        except ImportError:
            self.error = "the pynvml module (package nvidia-ml-py) is not installed"
            return self
        except Exception as exc:  # a broken install or a stand-in module that raises as it loads
            self.error = (f"the pynvml module (package nvidia-ml-py) failed to load "
                          f"({type(exc).__name__}: {exc}); reinstall nvidia-ml-py")
            return self
        try:
            nv.nvmlInit()
        except Exception as exc:  # NVMLError subclasses; their names say what failed
            self.error = f"NVML could not start: {_nvml_reason(nv, exc)}"
            return self
        self.nv = nv
        return self

    def __exit__(self, *exc: object) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass


def _nvml_reason(nv: Any, exc: Exception) -> str:
    name = type(exc).__name__
    known = {
        "NVMLError_LibraryNotFound": "the NVML library (libnvidia-ml.so) was not found: no NVIDIA driver on this machine",
        "NVMLError_DriverNotLoaded": "the NVIDIA driver is not loaded",
        "NVMLError_NoPermission": "no permission to use NVML",
    }
    return known.get(name, f"{name}: {exc}")


def _try(fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    try:
        return fn(*args)
    except Exception:
        return default


#: Public names for the readers beside this module (health.py): the session and the guarded call.
Session = _Session
try_call = _try


def running_processes(nv: Any, handle: Any) -> list[int]:
    """The pids of the compute processes on a GPU or MIG device (raises on an NVML error)."""
    return [int(p.pid) for p in (nv.nvmlDeviceGetComputeRunningProcesses(handle) or [])]


def _profile_name_from_attributes(attrs: Any) -> str | None:
    """Name a MIG device the way Slurm does: '%ug.%lugb' from slice count and memory, 'Nc.' for a CI split."""
    gi = _try(lambda: int(attrs.gpuInstanceSliceCount))
    ci = _try(lambda: int(attrs.computeInstanceSliceCount))
    mem = _try(lambda: int(attrs.memorySizeMB))
    if not gi or not mem:
        return None
    name = f"{gi}g.{round(mem / 1024)}gb"
    if ci and ci != gi:
        name = f"{ci}c.{name}"
    return name


def _profile_name_from_device_name(name: str) -> str | None:
    """'NVIDIA A100-SXM4-40GB MIG 1g.5gb' -> '1g.5gb' (the authoritative name, +me and all)."""
    parts = name.rsplit(" MIG ", 1)
    return parts[1].strip() if len(parts) == 2 else None


def _instances(nv: Any, gpu_index: int, handle: Any) -> tuple[MigInstance, ...]:
    count = _try(nv.nvmlDeviceGetMaxMigDeviceCount, handle, default=0) or 0
    out = []
    for slot in range(int(count)):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            uuid = _text(nv.nvmlDeviceGetUUID(mh))
        except Exception:  # NotFound: an empty slot (and a device without a UUID cannot be pinned)
            continue
        name = _text(_try(nv.nvmlDeviceGetName, mh, default=""))
        attrs = _try(nv.nvmlDeviceGetAttributes, mh)
        profile = _profile_name_from_device_name(name) or (attrs and _profile_name_from_attributes(attrs)) or "unknown"
        procs = _try(nv.nvmlDeviceGetComputeRunningProcesses, mh, default=[]) or []
        out.append(
            MigInstance(
                uuid=uuid,
                gpu_index=gpu_index,
                mig_index=slot,
                name=name,
                profile=profile,
                gpu_instance_id=_try(lambda: _int(nv.nvmlDeviceGetGpuInstanceId(mh))),
                compute_instance_id=_try(lambda: _int(nv.nvmlDeviceGetComputeInstanceId(mh))),
                sms=_try(lambda: int(attrs.multiprocessorCount)),
                memory_mb=_try(lambda: int(attrs.memorySizeMB)),
                gi_slices=_try(lambda: int(attrs.gpuInstanceSliceCount)),
                ci_slices=_try(lambda: int(attrs.computeInstanceSliceCount)),
                busy_pids=tuple(int(p.pid) for p in procs),
            )
        )
    return tuple(out)


def _profile_table(nv: Any, handle: Any) -> tuple[ProfileInfo, ...]:
    """The GPU's own profile table; NVML answers this even with MIG mode off (seen on an H200)."""
    rows: dict[str, ProfileInfo] = {}
    for enum in GPU_INSTANCE_PROFILE_ENUMS:
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
        except Exception:
            continue
        raw_name = _text(getattr(info, "name", "") or "")
        name = raw_name.replace("MIG ", "").strip()
        slices, mem = int(info.sliceCount), int(info.memorySizeMB)
        if not name:
            name = f"{slices}g.{round(mem / 1024)}gb"
        if not slices or int(info.instanceCount) == 0:
            continue
        rows.setdefault(name, ProfileInfo(
            name=name,
            profile_id=int(info.id),
            slices=slices,
            instance_count=int(info.instanceCount),
            sms=int(info.multiprocessorCount),
            memory_mb=mem,
            copy_engines=_try(lambda: int(info.copyEngineCount)),
        ))
    return tuple(rows.values())


def discover() -> Inventory:
    """Read every GPU, its MIG mode, instances and profile table.  Never raises."""
    with _Session() as s:
        if s.nv is None:
            return Inventory(error=s.error)
        nv = s.nv
        gpus = []
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            return Inventory(error=f"NVML could not count GPUs: {_nvml_reason(nv, exc)}")
        problems = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid, name = _text(nv.nvmlDeviceGetUUID(h)), _text(nv.nvmlDeviceGetName(h))
                mode = _mig_mode(nv, h)
            except Exception as exc:  # a GPU that is lost, or needs a reset: leave it out and say why
                problems.append(f"GPU {i}: {_nvml_reason(nv, exc)}")
                continue
            on = int(getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))
            mig_enabled = None if mode is None else bool(int(mode[0]) == on)
            pending = None if mode is None or int(mode[1]) == int(mode[0]) else bool(int(mode[1]) == on)
            procs = [] if mig_enabled else (_try(nv.nvmlDeviceGetComputeRunningProcesses, h, default=[]) or [])
            mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
            cc = _try(nv.nvmlDeviceGetCudaComputeCapability, h)
            gpus.append(Gpu(
                index=i,
                uuid=uuid,
                name=name,
                memory_mib=int(mem.total) // 2**20 if mem is not None else 0,
                mig_enabled=mig_enabled,
                instances=_instances(nv, i, h) if mig_enabled else (),
                profiles=_profile_table(nv, h) if mig_enabled is not None else (),
                compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
                mig_pending=pending,
                busy_pids=tuple(int(p.pid) for p in procs),
                serial=_try(lambda: _text(nv.nvmlDeviceGetSerial(h))),
                pci_bus_id=_try(lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId)),
            ))
        if problems and not gpus:
            return Inventory(error="NVML could not read any GPU: " + "; ".join(problems))
        return Inventory(
            gpus=tuple(gpus),
            driver=_try(lambda: _text(nv.nvmlSystemGetDriverVersion())),
            cuda_driver=_try(lambda: int(nv.nvmlSystemGetCudaDriverVersion_v2())),
            problems=tuple(problems),
        )


def _mig_mode(nv: Any, handle: Any) -> Any:
    """[current, pending], or None for a GPU without MIG; any other NVML error is the GPU's problem."""
    try:
        return nv.nvmlDeviceGetMigMode(handle)
    except Exception as exc:
        if type(exc).__name__ in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound"):
            return None
        raise


def _cuda_version_text(v: int | None) -> str | None:
    return None if not v else f"{v // 1000}.{(v % 1000) // 10}"


def fingerprint(gpu_index: int | None) -> dict[str, Any]:
    """What a verdict must name when it changes: driver, firmware, board settings, software versions."""
    # the host's CPU too: launch-bound figures (small-batch training) follow it, not the GPU
    fp: dict[str, Any] = {"python": platform.python_version(), **software_versions(), "cpu_model": cpu_model()}
    if gpu_index is None:
        return fp
    with _Session() as s:
        if s.nv is None:
            return fp
        nv = s.nv
        h = _try(nv.nvmlDeviceGetHandleByIndex, gpu_index)
        if h is None:
            return fp
        ecc = _try(nv.nvmlDeviceGetEccMode, h)
        limit = _try(nv.nvmlDeviceGetEnforcedPowerLimit, h) or _try(nv.nvmlDeviceGetPowerManagementLimit, h)
        mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
        cc = _try(nv.nvmlDeviceGetCudaComputeCapability, h)
        fp.update({
            "gpu_name": _try(lambda: _text(nv.nvmlDeviceGetName(h))),
            # the board itself: figures such as energy per unit of work differ between boards of one model
            "gpu_uuid": _try(lambda: _text(nv.nvmlDeviceGetUUID(h))),
            "memory_total_mib": int(mem.total) // 2**20 if mem is not None else None,
            "driver": _try(lambda: _text(nv.nvmlSystemGetDriverVersion())),
            "cuda_driver": _cuda_version_text(_try(lambda: int(nv.nvmlSystemGetCudaDriverVersion_v2()))),
            "vbios": _try(lambda: _text(nv.nvmlDeviceGetVbiosVersion(h))),
            "inforom": _try(lambda: _text(nv.nvmlDeviceGetInforomImageVersion(h))),
            "gsp": _try(lambda: _text(nv.nvmlDeviceGetGspFirmwareVersion(h))),
            "ecc": None if ecc is None else ("on" if int(ecc[0]) else "off"),
            "power_limit_w": None if limit is None else round(int(limit) / 1000),
            "max_sm_clock_mhz": _try(lambda: int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM))),
            "max_mem_clock_mhz": _try(lambda: int(nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM))),
            # what the device's ceiling is computed from (judge/ceiling.py), besides the SMs and clocks
            "compute_capability": f"{int(cc[0])}.{int(cc[1])}" if cc else None,
            "memory_bus_width_bits": _try(lambda: int(nv.nvmlDeviceGetMemoryBusWidth(h))),
        })
    return fp


def cpu_model() -> str | None:
    """The CPU's model name (what a CPU run's baseline was measured on)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


#: Distributions whose installed versions a run's fingerprint records (key, distribution name): the
#: suite itself, whose workloads can change between versions, and the engines the workloads run
#: through, so that a verdict after an upgrade of transformers or OpenMM names it.
PACKAGES = (("pytest_mig", "pytest-mig"), ("transformers", "transformers"), ("peft", "peft"),
            ("bitsandbytes", "bitsandbytes"), ("openmm", "openmm"))


def package_versions() -> dict[str, str]:
    """Versions of the installed :data:`PACKAGES`, from their metadata (nothing is imported); a
    package that is not installed is left out."""

    out: dict[str, str] = {}
    for key, dist in PACKAGES:
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def software_versions() -> dict[str, Any]:
    """torch and its CUDA runtime (read without starting CUDA), and :func:`package_versions`."""
    try:
        import torch
    except ImportError:
        return {"torch": None, "cuda_runtime": None, **package_versions()}
    return {"torch": torch.__version__.split("+")[0], "cuda_runtime": torch.version.cuda, **package_versions()}


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


class BoardReader:
    """Board-level telemetry of one GPU (the parent, for a MIG instance): power, energy, clocks.

    Keeps NVML initialised for the session; every read returns None on failure, never raises.
    """

    def __init__(self, gpu_index: int) -> None:
        self._session = _Session().__enter__()
        nv = self._session.nv
        self._nv = nv
        self.gpu_index = gpu_index
        self._h = _try(nv.nvmlDeviceGetHandleByIndex, gpu_index) if nv is not None else None

    @property
    def available(self) -> bool:
        return self._h is not None

    def power_w(self) -> float | None:
        mw = _try(self._nv.nvmlDeviceGetPowerUsage, self._h) if self.available else None
        return None if mw is None else int(mw) / 1000.0

    def energy_mj(self) -> float | None:
        mj = _try(self._nv.nvmlDeviceGetTotalEnergyConsumption, self._h) if self.available else None
        return None if mj is None else float(int(mj))

    @staticmethod
    def reasons(nv: Any, h: Any) -> list[str]:
        """The clock event (throttle) reasons active now, by name."""
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = _try(reasons_fn, h) if reasons_fn else None
        return throttle_names(int(mask)) if mask is not None else []

    def pcie(self) -> dict[str, int] | None:
        """The PCIe link now and at most: gen, width, max_gen, max_width (None where NVML cannot tell)."""
        return self.link(self._nv, self._h) if self.available else None

    def neighbours_pcie_gbs(self) -> dict[str, float]:
        """Each other GPU's PCIe traffic now, both directions together, in GB/s, by name ("GPU 1"):
        NVML's throughput counters (KB/s over a 20 ms sample).  GPUs whose counters cannot be read
        are left out; {} where NVML is not there (:mod:`pytest_mig.device.host`)."""
        if not self.available:
            return {}
        nv = self._nv
        count = _try(nv.nvmlDeviceGetCount)
        fn = getattr(nv, "nvmlDeviceGetPcieThroughput", None)
        if not count or fn is None:
            return {}
        out: dict[str, float] = {}
        for i in range(int(count)):
            if i == self.gpu_index:
                continue
            h = _try(nv.nvmlDeviceGetHandleByIndex, i)
            tx = _try(fn, h, nv.NVML_PCIE_UTIL_TX_BYTES) if h is not None else None
            rx = _try(fn, h, nv.NVML_PCIE_UTIL_RX_BYTES) if h is not None else None
            if tx is not None and rx is not None:
                out[f"GPU {i}"] = (int(tx) + int(rx)) * 1024 / 1e9
        return out

    @staticmethod
    def link(nv: Any, h: Any) -> dict[str, int] | None:
        """The PCIe link of a GPU handle: current and maximum (for this GPU in this slot) gen and width."""
        values = {"gen": _try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                  "width": _try(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
                  "max_gen": _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                  "max_width": _try(nv.nvmlDeviceGetMaxPcieLinkWidth, h)}
        return None if any(v is None for v in values.values()) else {k: int(v) for k, v in values.items()}

    def clocks(self) -> dict[str, Any]:
        if not self.available:
            return {}
        nv, h = self._nv, self._h
        names = self.reasons(nv, h)
        return {
            "sm_clock_mhz": _try(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            "mem_clock_mhz": _try(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))),
            "temperature_c": _try(lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            "throttle_reasons": names,
            "throttled": bool(SLOWDOWN_REASONS.intersection(names)),
        }

    def close(self) -> None:
        self._session.__exit__(None, None, None)


def describe_inventory(inv: Inventory) -> list[str]:
    """Human lines for `pytest-mig devices`."""
    if inv.error:
        return [f"No GPU: {inv.error}."]
    if not inv.gpus:
        return ["No GPU: NVML found no NVIDIA GPU on this machine."]
    lines = [f"driver {inv.driver or '?'}, CUDA driver {_cuda_version_text(inv.cuda_driver) or '?'}"]
    for g in inv.gpus:
        busy = f", busy (pids {', '.join(map(str, g.busy_pids))})" if g.busy_pids else ""
        lines.append(f"GPU {g.index}: {g.name}, {g.memory_mib} MiB, {g.state_words()}, {g.uuid}{busy}")
        for inst in g.instances:
            state = "free" if inst.free else f"busy (pids {', '.join(map(str, inst.busy_pids))})"
            lines.append(f"  MIG {inst.profile:<12} {inst.uuid}  --mig-device {g.index}:{inst.mig_index}, "
                         f"{inst.sms or '?'} SMs, {inst.memory_mb or '?'} MB, {state}")
        if g.profiles:
            lines.append("  profiles: " + ", ".join(f"{p.name} ({p.sms} SMs, x{p.instance_count})" for p in g.profiles))
    lines.extend(f"NVML could not read {problem}; left out" for problem in inv.problems)
    return lines


def cuda_visible(cvd: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES read as CUDA reads it (None when unset), each entry an index ("0") or a
    UUID ("GPU-..."/"MIG-...", a unique prefix allowed).

    As measured on an H100 (driver 580, CUDA 13.0, torch 2.11, one process per value): an index is
    read like strtol, so "0:2", "0a", " 0" and "0 " are GPU 0 (never MIG slot 2); a UUID is taken as
    written, case and spaces included, so " GPU-..." or "gpu-..." names nothing; the first entry
    that is empty or cannot be read ends the list (",0" shows no GPU, "0,,1" only GPU 0; "-1",
    "none", "all" show none); an index named twice ("0,0") hides every GPU.
    """
    if cvd is None:
        return None
    entries: list[str] = []
    for raw in cvd.split(","):
        digits = re.match(r"\s*(\d+)", raw)
        if digits:
            entries.append(str(int(digits.group(1))))
        elif raw.startswith(("GPU-", "MIG-")) and len(raw) > 4 and raw == raw.strip():
            entries.append(raw)
        else:
            break
    indices = [e for e in entries if e.isdigit()]
    return [] if len(indices) != len(set(indices)) else entries
