"""The fake pynvml behaves like nvidia-ml-py where the plugin depends on it.

The drift tests load the installed nvidia-ml-py (without initialising it: no GPU needed) and
compare names, parameters, constants, structures and error classes with the fake.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import subprocess
import sys
import types
from ctypes import Structure, _SimpleCData, c_char, c_uint, sizeof
from pathlib import Path
from typing import Any, Iterator

import pytest

import fake_pynvml
import topologies as topo
from fake_pynvml import API_FUNCTIONS, FAKE_SITE, build_module, install


# ------------------------------------------------------------------------------------------------
# Helpers and fixtures.


def _load_real_pynvml() -> types.ModuleType | None:
    """The installed nvidia-ml-py, loaded from its file whatever sys.modules["pynvml"] holds now."""
    search = [p for p in sys.path if Path(p or ".").resolve() != FAKE_SITE]
    spec = importlib.machinery.PathFinder.find_spec("pynvml", search)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = module  # its error classes are built on sys.modules[__name__]
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["pynvml"]
        else:
            sys.modules["pynvml"] = saved
    return module


@pytest.fixture(scope="module")
def real() -> types.ModuleType:
    module = _load_real_pynvml()
    if module is None:
        pytest.skip("nvidia-ml-py is not installed: nothing to compare the fake with")
    return module


@pytest.fixture
def nvml(request: pytest.FixtureRequest) -> Iterator[types.ModuleType]:
    """An initialised fake; the topology comes from @pytest.mark.parametrize("nvml", [...], indirect=True)."""
    module = build_module(getattr(request, "param", "a100-40gb-mixed"))
    module.nvmlInit()
    yield module


def mig_devices(nvml: types.ModuleType, gpu: Any) -> list[Any]:
    """The MIG handles of a GPU, found the way the plugin must: range(max), skipping NotFound."""
    handles = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, i))
        except nvml.NVMLError_NotFound:
            continue
    return handles


def by_uuid(nvml: types.ModuleType, uuid: str) -> Any:
    return nvml.nvmlDeviceGetHandleByUUID(uuid)


# ------------------------------------------------------------------------------------------------
# Drift: the fake's surface is the real module's.


def test_every_fake_function_exists_in_real_pynvml_with_the_same_parameters(real: types.ModuleType) -> None:
    module = build_module("h200-mig-off")
    names = [n for n in dir(module) if n.startswith("nvml") and inspect.isroutine(getattr(module, n))]
    assert set(API_FUNCTIONS) <= set(names)
    for name in names:
        assert hasattr(real, name), f"{name} is not in nvidia-ml-py"
        fake_params = inspect.signature(getattr(module, name)).parameters
        real_params = inspect.signature(getattr(real, name)).parameters
        assert list(fake_params) == list(real_params), name
        for p in fake_params:
            fake_default, real_default = fake_params[p].default, real_params[p].default
            assert fake_default == real_default, f"{name}({p}=...) default differs"


def test_constants_have_the_real_values(real: types.ModuleType) -> None:
    module = build_module("no-gpu")
    names = [n for n in dir(module)
             if n.startswith(("NVML_", "nvmlClocks")) or n in ("nvmlMemory_v2", "nvmlGpuInstanceProfileInfo_v2")]
    assert "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2" in names and "nvmlClocksEventReasonSwPowerCap" in names
    for name in names:
        fake_value, real_value = getattr(module, name), getattr(real, name)
        if isinstance(real_value, _SimpleCData):  # NVML_VALUE_NOT_AVAILABLE_*: ctypes objects
            assert type(fake_value).__name__ == type(real_value).__name__ and fake_value.value == real_value.value
        else:
            assert fake_value == real_value, name


def test_every_real_error_code_is_in_the_fake(real: types.ModuleType) -> None:
    real_codes = {n for n in dir(real) if n.startswith("NVML_ERROR_")}
    assert real_codes <= set(dir(build_module("no-gpu")))


def test_profile_enums_in_topologies_are_nvmls(real: types.ModuleType) -> None:
    assert topo.P_1_SLICE == real.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    assert topo.P_2_SLICE == real.NVML_GPU_INSTANCE_PROFILE_2_SLICE
    assert topo.P_3_SLICE == real.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    assert topo.P_4_SLICE == real.NVML_GPU_INSTANCE_PROFILE_4_SLICE
    assert topo.P_7_SLICE == real.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    assert topo.P_1_SLICE_REV1 == real.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    assert topo.P_1_SLICE_REV2 == real.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert topo.NO_INSTANCE_ID == real.NVML_VALUE_NOT_AVAILABLE_uint.value


def test_structures_have_the_real_fields(real: types.ModuleType) -> None:
    module = build_module("no-gpu")
    structs = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Structure)]
    assert "c_nvmlDeviceAttributes" in structs and "c_nvmlGpuInstanceProfileInfo_v2_t" in structs
    for name in structs:
        fake_cls, real_cls = getattr(module, name), getattr(real, name)
        fake_fields = [(f[0], type(f[1]).__name__ if isinstance(f[1], type) else f[1], getattr(f[1], "__name__", ""))
                       for f in getattr(fake_cls, "_fields_", [])]
        real_fields = [(f[0], type(f[1]).__name__ if isinstance(f[1], type) else f[1], getattr(f[1], "__name__", ""))
                       for f in getattr(real_cls, "_fields_", [])]
        assert fake_fields == real_fields, name
        assert sizeof(fake_cls) == sizeof(real_cls), name


def test_error_classes_are_the_real_hierarchy(real: types.ModuleType) -> None:
    module = build_module("no-gpu")
    real_classes = {n for n in dir(real) if n.startswith("NVMLError_")}
    fake_classes = {n for n in dir(module) if n.startswith("NVMLError_")}
    assert fake_classes == real_classes
    for name in sorted(real_classes):
        fake_cls, real_cls = getattr(module, name), getattr(real, name)
        assert issubclass(fake_cls, module.NVMLError)
        assert fake_cls.__module__ == real_cls.__module__ == "pynvml"
        assert fake_cls().value == real_cls().value  # per-code classes take no argument
        assert str(fake_cls()) == str(real_cls()) or real_cls().value not in real.NVMLError._errcode_to_string


def test_str_is_returned_where_nvidia_ml_py_decodes_and_bytes_where_it_does_not(real: types.ModuleType) -> None:
    """nvidia-ml-py wraps string getters in convertStrBytes (-> str); the GSP version is not wrapped (-> bytes)."""
    marker = real.convertStrBytes(lambda: None).__code__
    decoded = {n for n in API_FUNCTIONS if getattr(getattr(real, n), "__code__", None) is marker}
    assert {"nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlSystemGetDriverVersion",
            "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetInforomImageVersion"} <= decoded
    assert "nvmlDeviceGetGspFirmwareVersion" not in decoded

    nvml = build_module("h200-mig-off")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    for name in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetVbiosVersion",
                 "nvmlDeviceGetInforomImageVersion"):
        assert type(getattr(nvml, name)(h)) is str, name
    assert type(nvml.nvmlSystemGetDriverVersion()) is str
    assert type(nvml.nvmlSystemGetNVMLVersion()) is str
    assert nvml.nvmlDeviceGetGspFirmwareVersion(h) == b"580.159.04"


# ------------------------------------------------------------------------------------------------
# Errors, initialisation.


def test_nvmlerror_maps_codes_to_subclasses_with_value() -> None:
    nvml = build_module("no-gpu")
    err = nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(err) is nvml.NVMLError_NotSupported
    assert isinstance(err, nvml.NVMLError) and err.value == 3 and str(err) == "Not Supported"
    assert nvml.NVMLError_NotFound().value == nvml.NVML_ERROR_NOT_FOUND == 6
    assert nvml.NVMLError_NoPermission().value == 4
    assert nvml.NVMLError_DriverNotLoaded().value == 9
    assert nvml.NVMLError_LibraryNotFound().value == 12
    assert nvml.NVMLError_FunctionNotFound().value == 13
    assert nvml.NVMLError_GpuIsLost().value == 15
    assert nvml.nvmlExceptionClass(15) is nvml.NVMLError_GpuIsLost
    assert str(nvml.NVMLError(12345)) == "NVML Error with code 12345"
    nvml.nvmlInit()
    assert nvml.nvmlErrorString(nvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert nvml.nvmlErrorString(12345) == "Unknown Error"


def test_error_classes_are_shared_between_fake_modules() -> None:
    """An ``except pynvml.NVMLError_NotFound`` bound to one fake catches errors from another."""
    assert build_module("no-gpu").NVMLError_NotFound is build_module("h100-mig").NVMLError_NotFound


def test_calls_before_init_and_after_shutdown_raise_uninitialized() -> None:
    nvml = build_module("h200-mig-off")
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()
    nvml.nvmlInit()
    nvml.nvmlInit()  # reference-counted like the real library
    nvml.nvmlShutdown()
    assert nvml.nvmlDeviceGetCount() == 1
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlSystemGetDriverVersion()


@pytest.mark.parametrize(("name", "error"), [("no-nvml", "NVMLError_LibraryNotFound"),
                                             ("driver-not-loaded", "NVMLError_DriverNotLoaded")])
def test_init_fails_without_a_working_driver(name: str, error: str) -> None:
    nvml = build_module(name)
    with pytest.raises(getattr(nvml, error)) as info:
        nvml.nvmlInit()
    assert isinstance(info.value, nvml.NVMLError)
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


@pytest.mark.parametrize("nvml", ["no-gpu"], indirect=True)
def test_no_gpu_has_count_zero(nvml: types.ModuleType) -> None:
    assert nvml.nvmlDeviceGetCount() == 0
    assert nvml.nvmlSystemGetDriverVersion() == "550.54.15"
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(0)


# ------------------------------------------------------------------------------------------------
# MIG enumeration (A100 40GB mixed).


def test_a100_40gb_mixed_enumerates_like_the_driver(nvml: types.ModuleType) -> None:
    assert nvml.nvmlDeviceGetCount() == 2
    gpu0, gpu1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetName(gpu0) == "NVIDIA A100-SXM4-40GB"
    assert nvml.nvmlDeviceGetMigMode(gpu0) == [nvml.NVML_DEVICE_MIG_ENABLE, nvml.NVML_DEVICE_MIG_ENABLE]
    assert nvml.nvmlDeviceGetMigMode(gpu1) == [nvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(gpu0) == 7
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(gpu1) == 0

    migs = mig_devices(nvml, gpu0)
    seen = []
    for m in migs:
        attrs = nvml.nvmlDeviceGetAttributes(m)
        seen.append((nvml.nvmlDeviceGetName(m), nvml.nvmlDeviceGetUUID(m), attrs.multiprocessorCount,
                     attrs.memorySizeMB, attrs.gpuInstanceSliceCount, nvml.nvmlDeviceGetGpuInstanceId(m),
                     nvml.nvmlDeviceGetComputeInstanceId(m)))
    assert seen == [
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", topo.A100_40_3G, 42, 20096, 3, 2, 0),
        ("NVIDIA A100-SXM4-40GB MIG 2g.10gb", topo.A100_40_2G, 28, 9984, 2, 3, 0),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", topo.A100_40_1G_BUSY, 14, 4864, 1, 9, 0),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", topo.A100_40_1G_FREE, 14, 4864, 1, 10, 0),
    ]
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 4)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 7)


def test_is_mig_device_handle_returns_a_c_uint(nvml: types.ModuleType) -> None:
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    mig = by_uuid(nvml, topo.A100_40_3G)
    flag = nvml.nvmlDeviceIsMigDeviceHandle(mig)
    assert isinstance(flag, c_uint)
    assert bool(flag) and flag.value == 1
    assert not flag == 1  # noqa: SIM201 - the trap the plugin must avoid
    assert not nvml.nvmlDeviceIsMigDeviceHandle(gpu)


def test_handles_are_ctypes_pointers_and_fresh_per_call(nvml: types.ModuleType) -> None:
    a, b = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(a, nvml.c_nvmlDevice_t)
    assert a is not b and nvml.nvmlDeviceGetUUID(a) == nvml.nvmlDeviceGetUUID(b)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetName(0)


def test_mig_handle_leads_back_to_its_parent(nvml: types.ModuleType) -> None:
    mig = by_uuid(nvml, topo.A100_40_2G)
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert nvml.nvmlDeviceGetUUID(parent) == topo.A100_40_GPU0
    assert nvml.nvmlDeviceGetIndex(parent) == 0
    assert nvml.nvmlDeviceGetIndex(mig) == 1  # its slot under the parent
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(parent)


def test_handle_by_uuid_accepts_gpu_mig_legacy_and_bytes(nvml: types.ModuleType) -> None:
    assert nvml.nvmlDeviceGetIndex(by_uuid(nvml, topo.A100_40_GPU1)) == 1
    assert nvml.nvmlDeviceGetUUID(by_uuid(nvml, topo.A100_40_1G_FREE.encode())) == topo.A100_40_1G_FREE
    legacy = f"MIG-{topo.A100_40_GPU0}/9/0"
    assert nvml.nvmlDeviceGetUUID(by_uuid(nvml, legacy)) == topo.A100_40_1G_BUSY
    with pytest.raises(nvml.NVMLError_NotFound):
        by_uuid(nvml, "MIG-00000000-0000-0000-0000-000000000000")


def test_attributes_and_instance_ids_not_supported_on_a_full_gpu(nvml: types.ModuleType) -> None:
    for index in (0, 1):
        gpu = nvml.nvmlDeviceGetHandleByIndex(index)
        for fn in (nvml.nvmlDeviceGetAttributes, nvml.nvmlDeviceGetAttributes_v2,
                   nvml.nvmlDeviceGetGpuInstanceId, nvml.nvmlDeviceGetComputeInstanceId):
            with pytest.raises(nvml.NVMLError_NotSupported):
                fn(gpu)


def test_processes_show_on_the_mig_device_and_its_parent(nvml: types.ModuleType) -> None:
    busy, free = by_uuid(nvml, topo.A100_40_1G_BUSY), by_uuid(nvml, topo.A100_40_1G_FREE)
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(busy)
    assert (proc.pid, proc.usedGpuMemory, proc.gpuInstanceId, proc.computeInstanceId) == (
        topo.A100_40_BUSY_PID, 2048 * 2**20, 9, 0)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(free) == []
    parent_pids = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(0))]
    assert parent_pids == [topo.A100_40_BUSY_PID]
    assert nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(1)) == []


def test_memory_info_of_a_mig_device_is_its_slice(nvml: types.ModuleType) -> None:
    busy = nvml.nvmlDeviceGetMemoryInfo(by_uuid(nvml, topo.A100_40_1G_BUSY))
    assert busy.total == 4864 * 2**20 and busy.used == (13 + 2048) * 2**20 and busy.free == busy.total - busy.used
    v2 = nvml.nvmlDeviceGetMemoryInfo(by_uuid(nvml, topo.A100_40_1G_BUSY), version=nvml.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used) == (4864 * 2**20, 13 * 2**20, 2048 * 2**20)
    assert nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(1)).total == 40960 * 2**20


def test_board_level_reads_are_refused_on_mig_handles(nvml: types.ModuleType) -> None:
    mig, gpu = by_uuid(nvml, topo.A100_40_3G), nvml.nvmlDeviceGetHandleByIndex(0)
    calls = [
        ("nvmlDeviceGetPowerUsage", ()), ("nvmlDeviceGetTotalEnergyConsumption", ()),
        ("nvmlDeviceGetEnforcedPowerLimit", ()), ("nvmlDeviceGetPowerManagementLimit", ()),
        ("nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_SM,)), ("nvmlDeviceGetMaxClockInfo", (nvml.NVML_CLOCK_MEM,)),
        ("nvmlDeviceGetCurrentClocksEventReasons", ()), ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
        ("nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,)), ("nvmlDeviceGetUtilizationRates", ()),
        ("nvmlDeviceGetVbiosVersion", ()), ("nvmlDeviceGetEccMode", ()),
    ]
    for name, args in calls:
        with pytest.raises(nvml.NVMLError_NotSupported):
            getattr(nvml, name)(mig, *args)
        getattr(nvml, name)(gpu, *args)  # the parent answers


def test_energy_grows_between_calls(nvml: types.ModuleType) -> None:
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    first = nvml.nvmlDeviceGetTotalEnergyConsumption(gpu)
    second = nvml.nvmlDeviceGetTotalEnergyConsumption(gpu)
    assert isinstance(first, int) and second > first >= 100_000_000


def test_gsp_not_supported_where_the_topology_has_none(nvml: types.ModuleType) -> None:
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGspFirmwareVersion(nvml.nvmlDeviceGetHandleByIndex(0))


# ------------------------------------------------------------------------------------------------
# A100 80GB: Wulver layout and a compute-instance split.


@pytest.mark.parametrize("nvml", ["a100-80gb-mixed"], indirect=True)
def test_a100_80gb_mixed_has_wulver_profiles_and_a_ci_split(nvml: types.ModuleType) -> None:
    gpus = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    names = [[nvml.nvmlDeviceGetName(m).split(" MIG ")[1] for m in mig_devices(nvml, gpu)] for gpu in gpus]
    assert names == [["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
                     ["1c.3g.40gb", "2c.3g.40gb", "1g.20gb", "1g.10gb", "1g.10gb"]]
    one_c = nvml.nvmlDeviceGetAttributes(by_uuid(nvml, topo.A100_80_1C3G))
    assert (one_c.multiprocessorCount, one_c.gpuInstanceSliceCount, one_c.computeInstanceSliceCount,
            one_c.memorySizeMB) == (14, 3, 1, 40192)
    two_c = by_uuid(nvml, topo.A100_80_2C3G)
    assert nvml.nvmlDeviceGetGpuInstanceId(two_c) == 1 and nvml.nvmlDeviceGetComputeInstanceId(two_c) == 1
    assert nvml.nvmlDeviceGetAttributes(two_c).multiprocessorCount == 28
    assert nvml.nvmlDeviceGetAttributes(by_uuid(nvml, topo.A100_80_1G_A)).memorySizeMB == 9728


# ------------------------------------------------------------------------------------------------
# H100 with MIG, H200 as probed, a GPU without MIG.


@pytest.mark.parametrize("nvml", ["h100-mig"], indirect=True)
def test_h100_has_seven_free_1g_10gb(nvml: types.ModuleType) -> None:
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    migs = mig_devices(nvml, gpu)
    assert [nvml.nvmlDeviceGetUUID(m) for m in migs] == list(topo.H100_1G)
    for m in migs:
        assert nvml.nvmlDeviceGetName(m) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        assert nvml.nvmlDeviceGetAttributes(m).multiprocessorCount == 16
        assert nvml.nvmlDeviceGetComputeRunningProcesses(m) == []
    assert nvml.nvmlDeviceGetCudaComputeCapability(gpu) == (9, 0)


@pytest.mark.parametrize("nvml", ["h200-mig-off"], indirect=True)
def test_h200_fingerprint_is_the_probe(nvml: types.ModuleType) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA H200"
    assert nvml.nvmlDeviceGetMemoryInfo(h).total == 143771 * 2**20
    assert nvml.nvmlSystemGetDriverVersion() == "580.159.04"
    assert nvml.nvmlSystemGetCudaDriverVersion_v2() == nvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert nvml.nvmlDeviceGetVbiosVersion(h) == "96.00.A5.00.1A"
    assert nvml.nvmlDeviceGetInforomImageVersion(h) == "G520.0282.02.02"
    assert nvml.nvmlDeviceGetGspFirmwareVersion(h) == b"580.159.04"
    assert nvml.nvmlDeviceGetPowerManagementLimit(h) == nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert nvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 700_000]
    assert nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_MEM) == 3201
    assert nvml.nvmlDeviceGetMigMode(h) == [0, 0]
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    assert mig_devices(nvml, h) == []
    assert nvml.nvmlDeviceGetEccMode(h) == [1, 1]
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetAttributes(h)
    buffer = (c_char * nvml.NVML_GSP_FIRMWARE_VERSION_BUF_SIZE)()
    assert nvml.nvmlDeviceGetGspFirmwareVersion(h, buffer) == nvml.NVML_SUCCESS and buffer.value == b"580.159.04"


@pytest.mark.parametrize("nvml", ["h200-mig-off"], indirect=True)
def test_h200_answers_its_profile_table_with_mig_off(nvml: types.ModuleType) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    table = {}
    for enum in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
        except nvml.NVMLError_NotSupported:
            continue
        table[info.name] = (info.id, info.sliceCount, info.instanceCount, info.multiprocessorCount,
                            info.memorySizeMB, info.copyEngineCount)
    assert table == {
        "MIG 1g.18gb": (19, 1, 7, 16, 16384, 1),
        "MIG 1g.18gb+me": (20, 1, 1, 16, 16384, 1),
        "MIG 1g.35gb": (15, 1, 4, 26, 33280, 1),
        "MIG 2g.35gb": (14, 2, 3, 32, 33280, 2),
        "MIG 3g.71gb": (9, 3, 2, 60, 71424, 3),
        "MIG 4g.71gb": (5, 4, 1, 64, 71424, 4),
        "MIG 7g.141gb": (0, 7, 1, 132, 143360, 8),
    }
    v1 = nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, version=1)
    assert isinstance(v1, nvml.c_nvmlGpuInstanceProfileInfo_t) and not hasattr(v1, "name") and v1.id == 19
    with pytest.raises(nvml.NVMLError_FunctionNotFound):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 0, version=3)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


@pytest.mark.parametrize("nvml", ["l40s-no-mig"], indirect=True)
def test_a_gpu_without_mig_refuses_mig_calls(nvml: types.ModuleType) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMigMode(h)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetGpuInstanceProfileInfo(h, nvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert nvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    assert not nvml.nvmlDeviceIsMigDeviceHandle(h)


# ------------------------------------------------------------------------------------------------
# Variants.


def test_with_busy_with_free_and_with_throttle() -> None:
    base = topo.get_topology("h100-mig")
    busy = topo.with_busy(base, topo.H100_1G[3], pid=999, used_mib=None)
    throttled = topo.with_throttle(topo.with_free(busy, topo.H100_1G[3]), 0x4 | 0x40)
    nvml = build_module(busy)
    nvml.nvmlInit()
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(by_uuid(nvml, topo.H100_1G[3]))
    assert proc.pid == 999 and proc.usedGpuMemory is None  # NVML's "not available"
    nvml = build_module(throttled)
    nvml.nvmlInit()
    gpu = nvml.nvmlDeviceGetHandleByIndex(0)
    mask = nvml.nvmlDeviceGetCurrentClocksEventReasons(gpu)
    assert mask == nvml.nvmlDeviceGetCurrentClocksThrottleReasons(gpu)
    assert mask & nvml.nvmlClocksEventReasonSwPowerCap and mask & nvml.nvmlClocksEventReasonHwThermalSlowdown
    assert nvml.nvmlDeviceGetComputeRunningProcesses(gpu) == []
    assert topo.with_all_free(topo.get_topology("a100-40gb-mixed")).instance(topo.A100_40_1G_BUSY).processes == ()


def test_with_error_injects_nvml_errors() -> None:
    t = topo.with_error(topo.get_topology("a100-40gb-mixed"), "nvmlDeviceGetPowerUsage",
                        fake_pynvml.NVML_ERROR_GPU_IS_LOST, uuid=topo.A100_40_GPU1)
    t = topo.with_error(t, "nvmlDeviceGetHandleByUUID", fake_pynvml.NVML_ERROR_NO_PERMISSION, uuid=topo.A100_40_2G)
    t = topo.with_error(t, "nvmlSystemGetDriverVersion", fake_pynvml.NVML_ERROR_UNKNOWN)
    nvml = build_module(t)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0)) == 61_523
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(1))
    with pytest.raises(nvml.NVMLError_NoPermission):
        by_uuid(nvml, topo.A100_40_2G)
    with pytest.raises(nvml.NVMLError_Unknown):
        nvml.nvmlSystemGetDriverVersion()


def test_topology_can_change_between_calls(nvml: types.ModuleType) -> None:
    free = by_uuid(nvml, topo.A100_40_1G_FREE)
    nvml._fake.topology = topo.with_busy(nvml._fake.topology, topo.A100_40_1G_FREE, pid=4321)
    assert [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(free)] == [4321]


def test_variants_keep_mig_mode_and_driver_changes() -> None:
    t = topo.with_mig_mode(topo.get_topology("h200-mig-off"), 0, 0, 1)
    t = topo.with_driver(t, "580.200.01", 13010)
    nvml = build_module(t)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(0)) == [0, 1]
    assert (nvml.nvmlSystemGetDriverVersion(), nvml.nvmlSystemGetCudaDriverVersion_v2()) == ("580.200.01", 13010)


@pytest.mark.parametrize("name", sorted(topo.TOPOLOGIES))
def test_topologies_survive_json(name: str) -> None:
    t = topo.get_topology(name)
    assert topo.from_json(topo.to_json(t)) == t


def test_profile_tables_are_consistent() -> None:
    for name, table in [("A100-40", topo.A100_40GB_PROFILES), ("A100-80", topo.A100_80GB_PROFILES),
                        ("H100", topo.H100_80GB_PROFILES), ("H200", topo.H200_PROFILES)]:
        assert len({r.enum for r in table}) == len({r.id for r in table}) == len(table) == 7, name
        for row in table:
            assert row.name.startswith(f"{row.slices}g."), (name, row)
    for t in topo.TOPOLOGIES.values():
        for gpu in t.gpus:
            assert len({i.index for i in gpu.instances}) == len(gpu.instances)
            assert sum(i.ci_slices for i in gpu.instances) <= 7


# ------------------------------------------------------------------------------------------------
# Installing: in-process and for subprocesses.


def test_install_puts_the_fake_in_sys_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install(monkeypatch, "h100-mig")
    import pynvml

    assert pynvml is module and pynvml._fake_topology.name == "h100-mig"


def test_install_no_pynvml_makes_the_import_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fake_pynvml.NO_PYNVML)
    with pytest.raises(ImportError):
        import pynvml  # noqa: F401


_CHILD = (
    "import pynvml as p; p.nvmlInit(); h = p.nvmlDeviceGetHandleByIndex(0);"
    "m = p.nvmlDeviceGetMigDeviceHandleByIndex(h, 2);"
    "print(p.__name__, p.nvmlDeviceGetName(h), p.nvmlDeviceGetUUID(m),"
    " [x.pid for x in p.nvmlDeviceGetComputeRunningProcesses(m)])"
)


def test_subprocess_gets_the_fake_by_name_and_by_json(tmp_path: Path) -> None:
    env = fake_pynvml.subprocess_env("a100-40gb-mixed")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["pynvml", "NVIDIA", "A100-SXM4-40GB", topo.A100_40_1G_BUSY, f"[{topo.A100_40_BUSY_PID}]"]

    variant = topo.with_free(topo.get_topology("a100-40gb-mixed"), topo.A100_40_1G_BUSY)
    env = fake_pynvml.subprocess_env(variant, json_path=tmp_path / "variant.json")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "[]"


def test_subprocess_without_the_variable_fails_loudly() -> None:
    env = fake_pynvml.subprocess_env("no-gpu")
    del env[fake_pynvml.ENV_VAR]
    result = subprocess.run([sys.executable, "-c", "import pynvml"], env=env, capture_output=True, text=True)
    assert result.returncode != 0 and fake_pynvml.ENV_VAR in result.stderr


def test_install_subprocess_sets_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    fake_pynvml.install_subprocess(monkeypatch, "no-nvml")
    assert os.environ[fake_pynvml.ENV_VAR] == "no-nvml"
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(FAKE_SITE)
