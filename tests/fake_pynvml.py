"""A fake ``pynvml`` (nvidia-ml-py) that answers from a :mod:`topologies` topology.

It copies the real module's surface where the plugin touches it: the same function names and
parameter names, the same return types (ints from ``c_uint.value``, ``c_uint`` objects where the
real one returns them, ctypes structures with the real ``_fields_``, ``str`` where nvidia-ml-py
decodes and ``bytes`` where it does not), the same constants, and the same error classes (an
``NVMLError`` whose ``__new__`` maps a code to a per-code subclass such as ``NVMLError_NotSupported``).
``tests/test_fake_pynvml.py`` checks all of that against the installed nvidia-ml-py, so the fake
cannot silently drift from the real API.

Behaviour mirrored from NVML:

- every call before ``nvmlInit`` (or after the last ``nvmlShutdown``) raises ``NVMLError_Uninitialized``;
  ``nvmlInit`` is reference-counted; a topology's ``init_error`` makes ``nvmlInit`` raise
  (``NVMLError_LibraryNotFound`` without a driver, ``NVMLError_DriverNotLoaded``);
- handles are ``c_nvmlDevice_t`` pointers, a fresh object per call (compare UUIDs, never handles);
- ``nvmlDeviceGetMigDeviceHandleByIndex`` raises ``NotFound`` for an empty slot below
  ``nvmlDeviceGetMaxMigDeviceCount`` and ``InvalidArgument`` at or beyond it;
- ``nvmlDeviceIsMigDeviceHandle`` returns a ``c_uint`` (``bool()`` works, ``== 1`` is False);
- ``nvmlDeviceGetAttributes``/``GetGpuInstanceId``/``GetComputeInstanceId`` raise ``NotSupported``
  on a full GPU; ``nvmlDeviceGetMigMode`` raises ``NotSupported`` on a GPU without MIG;
- board-level reads (power, energy, clocks, throttle reasons, temperature, utilization, ECC, VBIOS,
  InfoROM, GSP, PCI, compute capability) raise ``NotSupported`` on a MIG handle: read them from the
  parent (the real driver refuses most of these on MIG handles; the fake refuses all, so that code
  which reads the parent is the only code that passes);
- ``nvmlDeviceGetGpuInstanceProfileInfo`` answers from the GPU's profile table (even with MIG off,
  as the H200 did) and raises ``NotSupported`` for a profile enum the GPU lacks;
- ``nvmlDeviceGetTotalEnergyConsumption`` grows between calls (power x elapsed time, and at least 1 mJ).

Where NVML's error for a misuse is not documented (e.g. a MIG handle passed to a parent-only call)
the fake raises ``NVMLError_InvalidArgument``; plugin code should catch ``NVMLError`` there.

Use :func:`install` in-process (``sys.modules["pynvml"]``), or :func:`subprocess_env` /
:func:`install_subprocess` for a child process, which then imports ``tests/fakenvml_site/pynvml.py``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import string
import sys
import time
import types
from ctypes import POINTER, Structure, c_char, c_int, c_uint, c_ulonglong, c_void_p, cast
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn, TypeVar

if TYPE_CHECKING:
    import pytest


def _load_sibling(name: str) -> types.ModuleType:
    """Import tests/<name>.py under its plain name (tests/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


try:
    import topologies
except ModuleNotFoundError:  # imported by path, e.g. from tests/fakenvml_site/pynvml.py
    topologies = _load_sibling("topologies")  # type: ignore[assignment]

Topology = topologies.Topology
Gpu = topologies.Gpu
MigInstance = topologies.MigInstance

#: The environment variable tests/fakenvml_site/pynvml.py reads: a topology name or a JSON file.
ENV_VAR = "PYTEST_MIG_FAKE_NVML"
#: Put this directory first on a subprocess's PYTHONPATH to give it the fake.
FAKE_SITE = Path(__file__).resolve().with_name("fakenvml_site")
#: Not a topology: ``install``/the site module make ``import pynvml`` fail, as without nvidia-ml-py.
NO_PYNVML = "no-pynvml"

# ---------------------------------------------------------------------------------------------
# Constants, copied from nvidia-ml-py 13.615.71 (test_fake_pynvml checks them against the real one).

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_GPU_MAX = 1
NVML_TEMPERATURE_COUNT = 2
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_CLOCK_COUNT = 4
NVML_INIT_FLAG_NO_GPUS = 1
NVML_INIT_FLAG_NO_ATTACH = 2
NVML_INIT_FLAG_FORCE_INIT = 4

NVML_DEVICE_INFOROM_VERSION_BUFFER_SIZE = 16
NVML_DEVICE_UUID_BUFFER_SIZE = 80
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80
NVML_DEVICE_NAME_BUFFER_SIZE = 64
NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_SERIAL_BUFFER_SIZE = 30
NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
NVML_GSP_FIRMWARE_VERSION_BUF_SIZE = 0x40
NVML_VALUE_NOT_AVAILABLE_ulonglong = c_ulonglong(-1)
NVML_VALUE_NOT_AVAILABLE_uint = c_uint(-1)

nvmlMemory_v2 = 0x02000028
nvmlGpuInstanceProfileInfo_v2 = 0x02000098

NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1
NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX = 0xA
NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX = 0xB
NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX = 0xC
NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME = 0xD
NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME = 0xE
NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME = 0xF
NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME = 0x10
NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX = 0x11
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL = 0x8
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9

NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
nvmlEventTypeXidCriticalError = 0x0000000000000008

nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonUserDefinedClocks = nvmlClocksEventReasonApplicationsClocksSetting
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSyncBoost = 0x0000000000000010
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksEventReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksEventReasonNone = 0x0000000000000000
nvmlClocksEventReasonAll = 0x00000000000001FF
nvmlClocksThrottleReasonGpuIdle = 0x0000000000000001
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksThrottleReasonUserDefinedClocks = nvmlClocksThrottleReasonApplicationsClocksSetting
nvmlClocksThrottleReasonSwPowerCap = 0x0000000000000004
nvmlClocksThrottleReasonHwSlowdown = 0x0000000000000008
nvmlClocksThrottleReasonSyncBoost = 0x0000000000000010
nvmlClocksThrottleReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksThrottleReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x0000000000000080
nvmlClocksThrottleReasonDisplayClockSetting = 0x0000000000000100
nvmlClocksThrottleReasonBoardLimit = 0x0000000000000200
nvmlClocksThrottleReasonReliability = 0x0000000000000400
nvmlClocksThrottleReasonNone = 0x0000000000000000
nvmlClocksThrottleReasonAll = 0x00000000000007FF

#: What NVML's own nvmlErrorString says for codes the real NVMLError class has no string for.
_C_ERROR_STRINGS = {
    NVML_SUCCESS: "Success",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_NO_DATA: "No data",
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: "ECC is not supported on vGPU",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    NVML_ERROR_FREQ_NOT_SUPPORTED: "Frequency not supported",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    NVML_ERROR_DEPRECATED: "Deprecated",
    NVML_ERROR_NOT_READY: "Not ready",
    NVML_ERROR_GPU_NOT_FOUND: "GPU not found",
    NVML_ERROR_INVALID_STATE: "Invalid state",
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: "Reset type not supported",
}

# ---------------------------------------------------------------------------------------------
# Structures, copied from nvidia-ml-py (same _fields_, same str/bytes conversion).


class _PrintableStructure(Structure):
    """ctypes.Structure that decodes bytes fields to str on access, as nvidia-ml-py's does."""

    _fmt_: dict[str, str] = {}

    def __str__(self) -> str:
        result = []
        for x in self._fields_:
            key = x[0]
            value = getattr(self, key)
            fmt = self._fmt_.get(key, self._fmt_.get("<default>", "%s"))
            result.append(("%s: " + fmt) % (key, value))
        return self.__class__.__name__ + "(" + ", ".join(result) + ")"

    def __getattribute__(self, name: str) -> Any:
        res = super().__getattribute__(name)
        if isinstance(res, bytes):
            return res.decode()
        return res

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, str):
            value = value.encode()
        super().__setattr__(name, value)


class struct_c_nvmlDevice_t(Structure):
    pass  # opaque handle


c_nvmlDevice_t = POINTER(struct_c_nvmlDevice_t)


class c_nvmlMemory_t(_PrintableStructure):
    _fields_ = [
        ("total", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]
    _fmt_ = {"<default>": "%d B"}


class c_nvmlMemory_v2_t(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]
    _fmt_ = {"<default>": "%d B"}


class c_nvmlProcessInfo_v2_t(_PrintableStructure):
    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]
    _fmt_ = {"usedGpuMemory": "%d B"}


c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t
c_nvmlProcessInfo_t = c_nvmlProcessInfo_v3_t


class c_nvmlUtilization_t(_PrintableStructure):
    _fields_ = [
        ("gpu", c_uint),
        ("memory", c_uint),
    ]
    _fmt_ = {"<default>": "%d %%"}


class nvmlPciInfo_t(_PrintableStructure):
    _fields_ = [
        ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]
    _fmt_ = {
        "domain": "0x%08X",
        "bus": "0x%02X",
        "device": "0x%02X",
        "pciDeviceId": "0x%08X",
        "pciSubSystemId": "0x%08X",
    }


class c_nvmlGpuInstanceProfileInfo_t(Structure):
    _fields_ = [
        ("id", c_uint),
        ("isP2pSupported", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("copyEngineCount", c_uint),
        ("decoderCount", c_uint),
        ("encoderCount", c_uint),
        ("jpegCount", c_uint),
        ("ofaCount", c_uint),
        ("memorySizeMB", c_ulonglong),
    ]


class c_nvmlGpuInstanceProfileInfo_v2_t(_PrintableStructure):
    _fields_ = [
        ("version", c_uint),
        ("id", c_uint),
        ("isP2pSupported", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        ("multiprocessorCount", c_uint),
        ("copyEngineCount", c_uint),
        ("decoderCount", c_uint),
        ("encoderCount", c_uint),
        ("jpegCount", c_uint),
        ("ofaCount", c_uint),
        ("memorySizeMB", c_ulonglong),
        ("name", c_char * NVML_DEVICE_NAME_V2_BUFFER_SIZE),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuInstanceProfileInfo_v2)


class c_nvmlDeviceAttributes(Structure):
    _fields_ = [
        ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint),
        ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint),
        ("sharedOfaCount", c_uint),
        ("gpuInstanceSliceCount", c_uint),
        ("computeInstanceSliceCount", c_uint),
        ("memorySizeMB", c_ulonglong),
    ]


class nvmlFriendlyObject:
    """What nvidia-ml-py returns for process lists: a plain object with the struct's fields."""

    def __init__(self, dictionary: Mapping[str, Any]) -> None:
        for x in dictionary:
            setattr(self, x, dictionary[x])

    def __str__(self) -> str:
        return self.__dict__.__str__()


def nvmlStructToFriendlyObject(struct: Structure) -> nvmlFriendlyObject:
    d = {}
    for x in struct._fields_:
        key = x[0]
        value = getattr(struct, key)
        d[key] = value.decode() if isinstance(value, bytes) else value
    return nvmlFriendlyObject(d)


# ---------------------------------------------------------------------------------------------
# Errors: the real class hierarchy.  Built once and shared by every fake module, so an
# ``except pynvml.NVMLError`` written against one fake catches errors raised by another.


class NVMLError(Exception):
    """Base of all NVML errors; ``NVMLError(code)`` returns the per-code subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = dict()
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(typ, value: int) -> NVMLError:  # noqa: N804 - as in nvidia-ml-py
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return NVMLError._errcode_to_string.get(self.value) or _C_ERROR_STRINGS.get(
            self.value, "NVML Error with code %d" % self.value
        )

    def __eq__(self, other: object) -> bool:
        return self.value == other.value  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # nvidia-ml-py defines __eq__ only


NVMLError.__module__ = "pynvml"


class NVMLLibraryMismatchError(Exception):
    pass


NVMLLibraryMismatchError.__module__ = "pynvml"


def _error_classes() -> dict[str, type[NVMLError]]:
    """NVMLError_<Code> subclasses, named and built as nvidia-ml-py's _extractNVMLErrorsAsClasses does."""
    classes: dict[str, type[NVMLError]] = {}
    for err_name, err_val in sorted(globals().items()):
        if not err_name.startswith("NVML_ERROR_"):
            continue
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def gen_new(val: int) -> Callable[..., NVMLError]:
            def new(typ: type[NVMLError], *args: Any) -> NVMLError:
                return NVMLError.__new__(typ, val)

            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(err_val)})
        cls.__module__ = "pynvml"
        classes[class_name] = cls
        NVMLError._valClassMapping[err_val] = cls
    return classes


_ERRORS = _error_classes()
globals().update(_ERRORS)  # NVMLError_NotSupported etc. are importable from this module too


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    if nvmlErrorCode not in NVMLError._valClassMapping:
        raise ValueError("nvmlErrorCode %s is not valid" % nvmlErrorCode)
    return NVMLError._valClassMapping[nvmlErrorCode]


def _raise(code: int) -> NoReturn:
    raise NVMLError(code)

# ---------------------------------------------------------------------------------------------
# The fake library.

_F = TypeVar("_F", bound=Callable[..., Any])

#: Calls refused on a MIG handle (board-level: read them from the parent GPU).
_BOARD_LEVEL = "board"
#: Calls that only make sense on a parent GPU handle.
_PARENT_ONLY = "parent"


def _api(kind: str | None = None, needs_init: bool = True) -> Callable[[_F], _F]:
    """Wrap an API method: initialisation check, injected errors, MIG-handle rules.

    functools.wraps keeps the signature visible to inspect (the drift test relies on it).
    """

    def decorate(method: _F) -> _F:
        name = method.__name__

        @functools.wraps(method)
        def wrapper(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
            if needs_init:
                self._check_initialized()
            self._inject(name, None, None)
            if args and isinstance(args[0], c_nvmlDevice_t):
                gpu_index, inst = self._resolve(args[0])
                self._inject(name, self.topology.gpus[gpu_index], inst)
                if inst is not None and kind == _BOARD_LEVEL:
                    _raise(NVML_ERROR_NOT_SUPPORTED)
                if inst is not None and kind == _PARENT_ONLY:
                    _raise(NVML_ERROR_INVALID_ARGUMENT)
            return method(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


class FakeNvml:
    """The state behind one fake module: a topology, the init count, the energy counters.

    Its public ``nvml*`` methods become the module's functions.  Tests may replace
    ``topology`` at any time (e.g. ``fake._fake.topology = with_busy(...)``) to simulate a
    process starting between two calls.
    """

    _GPU_STRIDE = 1 << 20  # handle address of GPU i: (i + 1) << 20; MIG slot k adds (k + 1) << 8

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.init_count = 0
        self._t0 = time.monotonic()
        self._energy_calls: dict[int, int] = {}

    # -- plumbing -----------------------------------------------------------------------------

    def _check_initialized(self) -> None:
        if self.init_count == 0:
            _raise(NVML_ERROR_UNINITIALIZED)

    def _inject(self, name: str, gpu: Gpu | None, inst: MigInstance | None) -> None:
        if gpu is None:
            errors = self.topology.errors
        else:
            errors = gpu.errors + (inst.errors if inst is not None else ())
        for function, code in errors:
            if function in (name, "*"):
                _raise(code)

    def _handle(self, gpu_index: int, slot: int | None = None) -> Any:
        address = (gpu_index + 1) * self._GPU_STRIDE + (0 if slot is None else (slot + 1) << 8)
        return cast(c_void_p(address), c_nvmlDevice_t)

    def _resolve(self, handle: Any) -> tuple[int, MigInstance | None]:
        """(gpu index, MIG device or None) for a handle; InvalidArgument for anything else."""
        if not isinstance(handle, c_nvmlDevice_t):
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        address = cast(handle, c_void_p).value or 0
        gpu_index, rest = divmod(address, self._GPU_STRIDE)
        gpu_index -= 1
        if not 0 <= gpu_index < len(self.topology.gpus) or rest & 0xFF:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        if rest == 0:
            return gpu_index, None
        slot = (rest >> 8) - 1
        gpu = self.topology.gpus[gpu_index]
        for inst in gpu.instances if gpu.mig_enabled else ():
            if inst.index == slot:
                return gpu_index, inst
        _raise(NVML_ERROR_INVALID_ARGUMENT)  # the MIG device is gone: the handle is stale

    def _gpu(self, handle: Any) -> Gpu:
        return self.topology.gpus[self._resolve(handle)[0]]

    def _mig(self, handle: Any) -> tuple[Gpu, MigInstance]:
        """The MIG device behind a handle; NotSupported on a full GPU."""
        gpu_index, inst = self._resolve(handle)
        if inst is None:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        return self.topology.gpus[gpu_index], inst

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    # -- library ------------------------------------------------------------------------------

    @_api(needs_init=False)
    def nvmlInitWithFlags(self, flags: int) -> None:
        if self.topology.init_error is not None:
            _raise(self.topology.init_error)
        self.init_count += 1
        return None

    @_api(needs_init=False)
    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)
        return None

    @_api()
    def nvmlShutdown(self) -> None:
        self.init_count -= 1
        return None

    @_api(needs_init=False)
    def nvmlErrorString(self, result: int) -> str:
        if self.topology.init_error == NVML_ERROR_LIBRARY_NOT_FOUND:
            _raise(NVML_ERROR_UNINITIALIZED)  # the real wrapper needs the library loaded
        known = {**_C_ERROR_STRINGS, **NVMLError._errcode_to_string}
        return known.get(result, "Unknown Error")

    @_api()
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.topology.driver_version

    @_api()
    def nvmlSystemGetNVMLVersion(self) -> str:
        return self.topology.nvml_version

    @_api()
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.topology.cuda_driver_version

    @_api()
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.topology.cuda_driver_version

    # -- enumeration --------------------------------------------------------------------------

    @_api()
    def nvmlDeviceGetCount(self) -> int:
        return len(self.topology.gpus)

    @_api()
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not isinstance(index, int) or not 0 <= index < len(self.topology.gpus):
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        self._inject("nvmlDeviceGetHandleByIndex", self.topology.gpus[index], None)
        return self._handle(index)

    @_api()
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = self._text(uuid)
        for gpu_index, gpu in enumerate(self.topology.gpus):
            if gpu.uuid == text:
                self._inject("nvmlDeviceGetHandleByUUID", gpu, None)
                return self._handle(gpu_index)
            for inst in gpu.instances if gpu.mig_enabled else ():
                legacy = f"MIG-{gpu.uuid}/{inst.gi_id}/{inst.ci_id}"  # the pre-R470 form
                if text in (inst.uuid, legacy):
                    self._inject("nvmlDeviceGetHandleByUUID", gpu, inst)
                    return self._handle(gpu_index, inst.index)
        if text.startswith(("GPU-", "MIG-")):
            _raise(NVML_ERROR_NOT_FOUND)
        _raise(NVML_ERROR_INVALID_ARGUMENT)

    @_api()
    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        wanted = _normalise_bus_id(self._text(pciBusId))
        for gpu_index, gpu in enumerate(self.topology.gpus):
            if _normalise_bus_id(gpu.pci_bus_id) == wanted:
                return self._handle(gpu_index)
        _raise(NVML_ERROR_NOT_FOUND)

    @_api()
    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu_index, inst = self._resolve(handle)
        name = self.topology.gpus[gpu_index].name
        return name if inst is None else f"{name} MIG {inst.profile}"

    @_api()
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu_index, inst = self._resolve(handle)
        return self.topology.gpus[gpu_index].uuid if inst is None else inst.uuid

    @_api()
    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        gpu_index, inst = self._resolve(handle)
        return gpu_index if inst is None else inst.index  # a MIG handle's index is its slot

    @_api()
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu_index, inst = self._resolve(handle)
        gpu = self.topology.gpus[gpu_index]
        if inst is not None:
            total_mib, reserved_mib, procs = inst.memory_mb, inst.reserved_mib, inst.processes
        else:
            total_mib, reserved_mib = gpu.memory_mib, gpu.reserved_mib
            procs = tuple(p for i in gpu.instances for p in i.processes) if gpu.mig_enabled else gpu.processes
            if gpu.mig_enabled:
                reserved_mib += sum(i.reserved_mib for i in gpu.instances)
        total = total_mib * topologies.MIB
        reserved = reserved_mib * topologies.MIB
        used = sum((p.used_mib or 0) for p in procs) * topologies.MIB
        if not version:
            return c_nvmlMemory_t(total=total, free=total - reserved - used, used=reserved + used)
        if version != nvmlMemory_v2:
            _raise(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved, free=total - reserved - used,
                                 used=used)

    # -- MIG ------------------------------------------------------------------------------------

    @_api(_PARENT_ONLY)
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._gpu(device)
        if gpu.mig_mode is None:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode[0], gpu.mig_mode[1]]

    @_api(_PARENT_ONLY)
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._gpu(device)
        return gpu.max_mig_devices if gpu.mig_enabled else 0

    @_api(_PARENT_ONLY)
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu_index, _ = self._resolve(device)
        gpu = self.topology.gpus[gpu_index]
        count = gpu.max_mig_devices if gpu.mig_enabled else 0
        if not isinstance(index, int) or not 0 <= index < count:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        for inst in gpu.instances:
            if inst.index == index:
                return self._handle(gpu_index, index)
        _raise(NVML_ERROR_NOT_FOUND)

    @_api()
    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> c_uint:
        return c_uint(0 if self._resolve(device)[1] is None else 1)

    @_api()
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        gpu_index, inst = self._resolve(migDevice)
        if inst is None:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        return self._handle(gpu_index)

    @_api()
    def nvmlDeviceGetAttributes_v2(self, device: Any) -> c_nvmlDeviceAttributes:
        _, inst = self._mig(device)
        return c_nvmlDeviceAttributes(
            multiprocessorCount=inst.sms,
            sharedCopyEngineCount=inst.copy_engines,
            sharedDecoderCount=inst.decoders,
            sharedEncoderCount=inst.encoders,
            sharedJpegCount=inst.jpegs,
            sharedOfaCount=inst.ofas,
            gpuInstanceSliceCount=inst.gi_slices,
            computeInstanceSliceCount=inst.ci_slices,
            memorySizeMB=inst.memory_mb,
        )

    @_api()
    def nvmlDeviceGetAttributes(self, device: Any) -> c_nvmlDeviceAttributes:
        return self.nvmlDeviceGetAttributes_v2(device)

    @_api()
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device)[1].gi_id

    @_api()
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig(device)[1].ci_id

    @_api(_PARENT_ONLY)
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: Any, profile: int, version: int = 2) -> Any:
        gpu = self._gpu(device)
        if version == 2:
            info: Any = c_nvmlGpuInstanceProfileInfo_v2_t()
        elif version == 1:
            info = c_nvmlGpuInstanceProfileInfo_t()
        else:
            _raise(NVML_ERROR_FUNCTION_NOT_FOUND)
        if not isinstance(profile, int) or not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        row = next((r for r in gpu.profiles if r.enum == profile), None)
        if gpu.mig_mode is None or row is None:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        info.id = row.id
        info.isP2pSupported = int(row.p2p)
        info.sliceCount = row.slices
        info.instanceCount = row.instances
        info.multiprocessorCount = row.sms
        info.copyEngineCount = row.copy_engines
        info.decoderCount = row.decoders
        info.encoderCount = row.encoders
        info.jpegCount = row.jpegs
        info.ofaCount = row.ofas
        info.memorySizeMB = row.memory_mb
        if version == 2:
            info.name = f"MIG {row.name}"
        return info

    # -- processes ------------------------------------------------------------------------------

    @_api()
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[nvmlFriendlyObject]:
        gpu_index, inst = self._resolve(handle)
        gpu = self.topology.gpus[gpu_index]
        if inst is not None:
            rows = [(p, inst) for p in inst.processes]
        elif gpu.mig_enabled:
            rows = [(p, i) for i in gpu.instances for p in i.processes]
        else:
            rows = [(p, None) for p in gpu.processes]
        procs = []
        for proc, owner in rows:
            used = NVML_VALUE_NOT_AVAILABLE_ulonglong.value if proc.used_mib is None else proc.used_mib * topologies.MIB
            struct = c_nvmlProcessInfo_v3_t(
                pid=proc.pid,
                usedGpuMemory=used,
                gpuInstanceId=topologies.NO_INSTANCE_ID if owner is None else owner.gi_id,
                computeInstanceId=topologies.NO_INSTANCE_ID if owner is None else owner.ci_id,
            )
            obj = nvmlStructToFriendlyObject(struct)
            if obj.usedGpuMemory == NVML_VALUE_NOT_AVAILABLE_ulonglong.value:  # type: ignore[attr-defined]
                obj.usedGpuMemory = None  # type: ignore[attr-defined]
            procs.append(obj)
        return procs

    @_api()
    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[nvmlFriendlyObject]:
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    @_api()
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[nvmlFriendlyObject]:
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    # -- fingerprint (board level: refused on MIG handles) -------------------------------------

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return self._gpu(handle).vbios

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetInforomImageVersion(self, handle: Any) -> str:
        return self._gpu(handle).inforom

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetGspFirmwareVersion(self, handle: Any, version: Any = None) -> bytes | int:
        gsp = self._gpu(handle).gsp_firmware
        if gsp is None:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        if version is not None:  # the caller's own c_char buffer, filled in place
            version.value = gsp
            return NVML_SUCCESS
        buffer = (c_char * NVML_GSP_FIRMWARE_VERSION_BUF_SIZE)()
        buffer.value = gsp
        return buffer.value  # bytes, as nvidia-ml-py returns it

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        ecc = self._gpu(handle).ecc_mode
        return [ecc[0], ecc[1]]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        major, minor = self._gpu(handle).compute_capability
        return (c_int(major).value, c_int(minor).value)

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> nvmlPciInfo_t:
        gpu = self._gpu(handle)
        bus_id = _normalise_bus_id(gpu.pci_bus_id)
        domain, bus, rest = bus_id.split(":")
        device = rest.split(".")[0]
        return nvmlPciInfo_t(
            busIdLegacy=f"{int(domain, 16):04X}:{bus}:{rest}".encode(),
            domain=int(domain, 16), bus=int(bus, 16), device=int(device, 16),
            pciDeviceId=gpu.pci_device_id, pciSubSystemId=gpu.pci_subsystem_id, busId=bus_id.encode(),
        )

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetPciInfo(self, handle: Any) -> nvmlPciInfo_t:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    # -- power, energy ----------------------------------------------------------------------------

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._gpu(handle).power_limit_mw

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        gpu = self._gpu(handle)
        return [gpu.power_min_mw, gpu.power_max_mw]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._gpu(handle).power_max_mw

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle).power_limit_mw

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu(handle).power_usage_mw

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu_index, _ = self._resolve(handle)
        gpu = self.topology.gpus[gpu_index]
        calls = self._energy_calls[gpu_index] = self._energy_calls.get(gpu_index, 0) + 1
        elapsed_s = time.monotonic() - self._t0
        return gpu.energy_mj + int(gpu.power_usage_mw * elapsed_s) + calls  # mW x s = mJ

    # -- clocks, throttling, temperature, utilization --------------------------------------------

    def _clock(self, gpu: Gpu, type: int, maximum: bool) -> int:
        values = {
            NVML_CLOCK_GRAPHICS: (gpu.sm_clock_mhz, gpu.max_sm_clock_mhz),
            NVML_CLOCK_SM: (gpu.sm_clock_mhz, gpu.max_sm_clock_mhz),
            NVML_CLOCK_MEM: (gpu.mem_clock_mhz, gpu.max_mem_clock_mhz),
            NVML_CLOCK_VIDEO: (gpu.video_clock_mhz, gpu.max_video_clock_mhz),
        }
        if type not in values:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        return values[type][1 if maximum else 0]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return self._clock(self._gpu(handle), type, maximum=False)

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        return self._clock(self._gpu(handle), type, maximum=True)

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetMemoryBusWidth(self, device: Any) -> int:
        return self._gpu(device).memory_bus_width

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle).throttle_reasons

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu(handle).throttle_reasons

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any) -> int:
        self._gpu(handle)
        return nvmlClocksEventReasonAll

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetSupportedClocksThrottleReasons(self, handle: Any) -> int:
        self._gpu(handle)
        return nvmlClocksEventReasonAll

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle)
        if sensor != NVML_TEMPERATURE_GPU:
            _raise(NVML_ERROR_NOT_SUPPORTED if sensor == NVML_TEMPERATURE_GPU_MAX else NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> c_nvmlUtilization_t:
        gpu_pct, mem_pct = self._gpu(handle).utilization
        return c_nvmlUtilization_t(gpu=gpu_pct, memory=mem_pct)


    # -- health: serial, ECC, remapped rows, retired pages, PCIe link, XID events -------------------

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._gpu(handle).serial

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle)
        if gpu.ecc_mode[0] != 1:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        if errorType not in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED) \
                or counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc_counts[2 * counterType + errorType]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        rows = self._gpu(device).remapped_rows
        if rows is None:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        return rows

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        gpu = self._gpu(device)
        if gpu.remapped_rows is not None:  # Ampere on: pages are not retired, rows are remapped
            _raise(NVML_ERROR_NOT_SUPPORTED)
        count = gpu.retired_pages[0 if sourceFilter == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else 1]
        return [0x1000 * (i + 1) for i in range(count)]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        gpu = self._gpu(device)
        if gpu.remapped_rows is not None:
            _raise(NVML_ERROR_NOT_SUPPORTED)
        return gpu.retired_pages[2]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle).pcie_link[0]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle).pcie_link[1]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle).pcie_link[2]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle).pcie_link[3]

    @_api(_BOARD_LEVEL)
    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        if counter not in (NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES):
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu(device).pcie_throughput_kbs[counter]

    @_api()
    def nvmlEventSetCreate(self) -> Any:
        self._event_sets = getattr(self, "_event_sets", {})
        key = len(self._event_sets) + 1
        self._event_sets[key] = []
        return c_void_p(key)

    @_api(_PARENT_ONLY)
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu(handle)
        if eventTypes & nvmlEventTypeXidCriticalError:
            self._event_sets[eventSet.value].extend(gpu.xids)

    @_api()
    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        pending = self._event_sets.get(eventSet.value)
        if pending is None:
            _raise(NVML_ERROR_INVALID_ARGUMENT)
        if not pending:
            _raise(NVML_ERROR_TIMEOUT)
        return nvmlFriendlyObject({"eventType": nvmlEventTypeXidCriticalError, "eventData": pending.pop(0)})

    @_api()
    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._event_sets.pop(eventSet.value, None)


def _normalise_bus_id(bus_id: str) -> str:
    """'0000:07:00.0' or '00000000:07:00.0' -> '00000000:07:00.0' (upper-case hex)."""
    domain, _, rest = bus_id.strip().upper().partition(":")
    return f"{int(domain, 16):08X}:{rest}"


#: Public names of the fake library's API (every one exists in nvidia-ml-py with the same parameters).
API_FUNCTIONS: tuple[str, ...] = tuple(name for name in vars(FakeNvml) if name.startswith("nvml"))

_MODULE_LEVEL_NAMES = (
    [n for n in list(globals()) if n.startswith(("NVML_", "nvmlClocks", "nvmlEventType"))]
    + ["nvmlMemory_v2", "nvmlGpuInstanceProfileInfo_v2", "NVMLError", "NVMLLibraryMismatchError",
       "nvmlExceptionClass", "nvmlFriendlyObject", "nvmlStructToFriendlyObject",
       "struct_c_nvmlDevice_t", "c_nvmlDevice_t", "c_nvmlMemory_t", "c_nvmlMemory_v2_t",
       "c_nvmlProcessInfo_v2_t", "c_nvmlProcessInfo_v3_t", "c_nvmlProcessInfo_t", "c_nvmlUtilization_t",
       "nvmlPciInfo_t", "c_nvmlGpuInstanceProfileInfo_t", "c_nvmlGpuInstanceProfileInfo_v2_t",
       "c_nvmlDeviceAttributes", "_PrintableStructure"]
    + list(_ERRORS)
)


def build_module(topology: Topology | str) -> types.ModuleType:
    """A fresh module named ``pynvml`` that answers from ``topology`` (an object or a registered name).

    The module also carries ``_fake`` (the :class:`FakeNvml` state, whose ``topology`` tests may
    swap mid-run) and ``_fake_topology`` (the topology it was built with).
    """
    topo = topologies.get_topology(topology) if isinstance(topology, str) else topology
    fake = FakeNvml(topo)
    module = types.ModuleType("pynvml", f"Fake pynvml (tests/fake_pynvml.py), topology {topo.name!r}.")
    module.__file__ = __file__
    namespace = module.__dict__
    for name in _MODULE_LEVEL_NAMES:
        namespace[name] = globals()[name]
    for name in API_FUNCTIONS:
        namespace[name] = getattr(fake, name)
    namespace["_fake"] = fake
    namespace["_fake_topology"] = topo
    return module


def install(monkeypatch: pytest.MonkeyPatch, topology: Topology | str) -> types.ModuleType:
    """Put a fake built from ``topology`` in ``sys.modules["pynvml"]`` for this test and return it.

    ``install(monkeypatch, NO_PYNVML)`` instead makes ``import pynvml`` fail (nvidia-ml-py missing)
    and returns an empty module.
    """
    if topology == NO_PYNVML:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # type: ignore[arg-type]
        return types.ModuleType("pynvml")
    module = build_module(topology)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def subprocess_env(topology: Topology | str, base: Mapping[str, str] | None = None,
                   json_path: str | Path | None = None) -> dict[str, str]:
    """An environment in which a child Python process's ``import pynvml`` gets this fake.

    A registered name travels as is; a topology object (e.g. a ``with_busy`` variant) is written
    to ``json_path`` (required then) and the child reads it from there.
    """
    env = dict(os.environ if base is None else base)
    if isinstance(topology, str):
        value = topology
    else:
        if json_path is None:
            raise ValueError("subprocess_env needs json_path to hand a topology object to a subprocess")
        Path(json_path).write_text(topologies.to_json(topology))
        value = str(json_path)
    env[ENV_VAR] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAKE_SITE), env.get("PYTHONPATH", "")) if p)
    return env


def install_subprocess(monkeypatch: pytest.MonkeyPatch, topology: Topology | str,
                       json_path: str | Path | None = None) -> None:
    """Set this test's environment so that subprocesses (pytester.runpytest_subprocess) get the fake."""
    env = subprocess_env(topology, base={"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, json_path=json_path)
    monkeypatch.setenv(ENV_VAR, env[ENV_VAR])
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])


def module_from_env(environ: Mapping[str, str] | None = None) -> types.ModuleType:
    """The fake for a subprocess: ``$PYTEST_MIG_FAKE_NVML`` names a topology or a JSON file."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_VAR)
    if not value:
        raise RuntimeError(
            f"tests/fakenvml_site is on sys.path but {ENV_VAR} is not set: set it to a topology name "
            f"({', '.join(topologies.TOPOLOGIES)}) or a JSON file from topologies.to_json"
        )
    if value == NO_PYNVML:
        raise ModuleNotFoundError("No module named 'pynvml'", name="pynvml")
    if value.endswith(".json"):
        return build_module(topologies.load(value))
    return build_module(value)
