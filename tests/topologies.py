"""GPU topologies for the fake pynvml: real GPU models, real MIG profile tables, plain data.

A :class:`Topology` is what one machine shows through NVML: the driver, the GPUs, each GPU's MIG mode,
its live GPU-instance profile table (what ``nvmlDeviceGetGpuInstanceProfileInfo`` answers, i.e.
``nvidia-smi mig -lgip``), the MIG devices that exist, the processes running on them, and the
fingerprint values (VBIOS, InfoROM, GSP, power, clocks, throttle reasons).  ``tests/fake_pynvml.py``
turns one into a module that behaves like ``pynvml``.

Values come from ``/work/shared/reference/mig-profiles.md`` (NVIDIA's MIG user guide tables and
``nvidia-smi mig -lgip`` captures) and ``h200-probe.md`` (a real H200).  Profile memory is stored in
MiB as NVML reports it (``memorySizeMB``), i.e. the table's GiB x 1024.  Decoder/JPEG/OFA counts follow
the MIG user guide; the H200's were not in the probe and follow the H100's.  UUIDs are made up (uuid5)
but have the real shape: ``GPU-<8-4-4-4-12 hex>`` and, since R470, ``MIG-<8-4-4-4-12 hex>``.

Everything is frozen: make variants with the ``with_*`` helpers (``with_busy``, ``with_throttle``,
``with_error``, ...), which return new topologies.  ``to_json``/``from_json`` carry a topology (variants
included) to a subprocess, see ``fake_pynvml.subprocess_env``.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

# NVML's GPU-instance profile enums (pynvml.NVML_GPU_INSTANCE_PROFILE_*), the argument of
# nvmlDeviceGetGpuInstanceProfileInfo.  Repeated here so that this module stays plain data;
# tests/test_fake_pynvml.py checks them against the real module.
P_1_SLICE = 0
P_2_SLICE = 1
P_3_SLICE = 2
P_4_SLICE = 3
P_7_SLICE = 4
P_1_SLICE_REV1 = 7  # the +me variant (1g with the media engines)
P_1_SLICE_REV2 = 9  # the double-memory 1g (1g.10gb on A100-40GB, 1g.20gb on A100-80GB/H100, 1g.35gb on H200)

#: NVML's "not a MIG process" value for gpuInstanceId/computeInstanceId (0xFFFFFFFF).
NO_INSTANCE_ID = 0xFFFFFFFF

MIB = 1024 * 1024


@dataclass(frozen=True)
class ProfileRow:
    """One GPU-instance profile as ``nvmlDeviceGetGpuInstanceProfileInfo(h, enum)`` answers it."""

    name: str  # "1g.5gb"; NVML's v2 struct names it "MIG 1g.5gb"
    enum: int  # the NVML_GPU_INSTANCE_PROFILE_* value asked for
    id: int  # the profile id nvidia-smi shows (differs between GPU models: never hard-code it)
    slices: int
    instances: int  # the most instances of this profile the GPU can hold
    sms: int
    memory_mb: int
    copy_engines: int
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0
    p2p: bool = False


@dataclass(frozen=True)
class Process:
    """A compute process on a GPU or MIG device; ``used_mib=None`` is NVML's "not available"."""

    pid: int
    used_mib: int | None = 1024


@dataclass(frozen=True)
class MigInstance:
    """One MIG device (a compute instance inside a GPU instance), as its MIG handle shows it."""

    uuid: str  # "MIG-..."
    profile: str  # "3g.20gb", or "1c.3g.40gb" for a compute instance smaller than its GPU instance
    index: int  # the slot of nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
    gi_id: int
    ci_id: int
    sms: int
    memory_mb: int  # the GPU instance's memory (compute instances of one GI share it)
    gi_slices: int
    ci_slices: int
    copy_engines: int
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0
    reserved_mib: int = 13  # what an idle MIG device shows as used
    processes: tuple[Process, ...] = ()
    errors: tuple[tuple[str, int], ...] = ()  # (pynvml function name or "*", NVML error code)

    @property
    def busy(self) -> bool:
        return bool(self.processes)


@dataclass(frozen=True)
class Gpu:
    """One physical GPU and everything NVML says about it."""

    name: str  # "NVIDIA A100-SXM4-40GB"
    uuid: str  # "GPU-..."
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_mode: tuple[int, int] | None  # (current, pending); None: a GPU without MIG (NotSupported)
    profiles: tuple[ProfileRow, ...] = ()  # the live profile table (answered even with MIG off)
    instances: tuple[MigInstance, ...] = ()  # only seen while MIG is on
    max_mig_devices: int = 7  # nvmlDeviceGetMaxMigDeviceCount while MIG is on (0 when off)
    processes: tuple[Process, ...] = ()  # processes on the whole GPU (MIG off)
    reserved_mib: int = 512
    vbios: str = ""
    inforom: str = ""
    gsp_firmware: bytes | None = None  # None: GSP firmware off (nvmlDeviceGetGspFirmwareVersion NotSupported)
    ecc_mode: tuple[int, int] = (1, 1)
    power_limit_mw: int = 400_000
    power_min_mw: int = 100_000
    power_max_mw: int = 400_000
    power_usage_mw: int = 60_000
    energy_mj: int = 100_000_000  # nvmlDeviceGetTotalEnergyConsumption when the fake starts
    sm_clock_mhz: int = 1410
    mem_clock_mhz: int = 1215
    video_clock_mhz: int = 1275
    max_sm_clock_mhz: int = 1410
    max_mem_clock_mhz: int = 1215
    max_video_clock_mhz: int = 1290
    memory_bus_width: int = 5120  # bits, as nvmlDeviceGetMemoryBusWidth reports it
    throttle_reasons: int = 0  # nvmlClocksEventReason* bitmask
    temperature_c: int = 33
    utilization: tuple[int, int] = (0, 0)  # (gpu %, memory %)
    pci_bus_id: str = "00000000:07:00.0"
    pci_device_id: int = 0
    pci_subsystem_id: int = 0
    serial: str = "1650123456789"
    # health: ECC error counts (volatile corrected, volatile uncorrected, aggregate corrected, aggregate
    # uncorrected); remapped rows (correctable, uncorrectable, pending, failure), None before Ampere;
    # retired pages (single-bit, double-bit, pending), read where remapped rows are not supported;
    # the PCIe link (current gen, width, max gen, max width); XIDs an event set returns, in order
    ecc_counts: tuple[int, int, int, int] = (0, 0, 0, 0)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    retired_pages: tuple[int, int, int] = (0, 0, 0)
    pcie_link: tuple[int, int, int, int] = (4, 16, 4, 16)
    pcie_throughput_kbs: tuple[int, int] = (12, 9)  # (TX, RX) KB/s now: NVML's counters of an idle link
    xids: tuple[int, ...] = ()
    errors: tuple[tuple[str, int], ...] = ()  # apply to this GPU's handle and its MIG handles

    @property
    def mig_enabled(self) -> bool:
        return self.mig_mode is not None and self.mig_mode[0] == 1


@dataclass(frozen=True)
class Topology:
    """A whole machine as NVML sees it."""

    name: str
    description: str
    gpus: tuple[Gpu, ...] = ()
    driver_version: str = ""
    cuda_driver_version: int = 0
    nvml_version: str = ""
    init_error: int | None = None  # NVML error code nvmlInit raises (no driver, driver not loaded)
    errors: tuple[tuple[str, int], ...] = ()  # apply to every call of that function

    def instances(self, profile: str | None = None) -> list[MigInstance]:
        """The MIG devices of all GPUs with MIG on, optionally only those of one profile."""
        return [i for _, i in iter_instances(self) if profile is None or i.profile == profile]

    def instance(self, uuid: str) -> MigInstance:
        """The MIG device with this UUID (KeyError if none)."""
        return find_instance(self, uuid)[1]


# --------------------------------------------------------------------------------------------
# Profile tables (nvidia-smi mig -lgip), in the order NVML's enums list them.


def _row(name: str, enum: int, pid: int, slices: int, n: int, sms: int, gib: float, ce: int,
         dec: int = 0, enc: int = 0, jpg: int = 0, ofa: int = 0) -> ProfileRow:
    return ProfileRow(name, enum, pid, slices, n, sms, round(gib * 1024), ce, dec, enc, jpg, ofa)


A100_40GB_PROFILES = (
    _row("1g.5gb", P_1_SLICE, 19, 1, 7, 14, 4.75, 1),
    _row("2g.10gb", P_2_SLICE, 14, 2, 3, 28, 9.75, 2, dec=1),
    _row("3g.20gb", P_3_SLICE, 9, 3, 2, 42, 19.625, 3, dec=2),
    _row("4g.20gb", P_4_SLICE, 5, 4, 1, 56, 19.625, 4, dec=2),
    _row("7g.40gb", P_7_SLICE, 0, 7, 1, 98, 39.25, 7, dec=5, jpg=1, ofa=1),
    _row("1g.5gb+me", P_1_SLICE_REV1, 20, 1, 1, 14, 4.75, 1, dec=1, jpg=1, ofa=1),
    _row("1g.10gb", P_1_SLICE_REV2, 15, 1, 4, 14, 9.625, 1, dec=1),
)

A100_80GB_PROFILES = (
    _row("1g.10gb", P_1_SLICE, 19, 1, 7, 14, 9.5, 1),
    _row("2g.20gb", P_2_SLICE, 14, 2, 3, 28, 19.5, 2, dec=1),
    _row("3g.40gb", P_3_SLICE, 9, 3, 2, 42, 39.25, 3, dec=2),
    _row("4g.40gb", P_4_SLICE, 5, 4, 1, 56, 39.25, 4, dec=2),
    _row("7g.80gb", P_7_SLICE, 0, 7, 1, 98, 79.0, 7, dec=5, jpg=1, ofa=1),
    _row("1g.10gb+me", P_1_SLICE_REV1, 20, 1, 1, 14, 9.5, 1, dec=1, jpg=1, ofa=1),
    _row("1g.20gb", P_1_SLICE_REV2, 15, 1, 4, 14, 19.5, 1, dec=1),
)

H100_80GB_PROFILES = (
    _row("1g.10gb", P_1_SLICE, 19, 1, 7, 16, 9.75, 1, dec=1, jpg=1),
    _row("2g.20gb", P_2_SLICE, 14, 2, 3, 32, 19.625, 2, dec=2, jpg=2),
    _row("3g.40gb", P_3_SLICE, 9, 3, 2, 60, 39.5, 3, dec=3, jpg=3),
    _row("4g.40gb", P_4_SLICE, 5, 4, 1, 64, 39.5, 4, dec=4, jpg=4),
    _row("7g.80gb", P_7_SLICE, 0, 7, 1, 132, 79.25, 8, dec=7, jpg=7, ofa=1),
    _row("1g.10gb+me", P_1_SLICE_REV1, 20, 1, 1, 16, 9.75, 1, dec=1, jpg=1, ofa=1),
    _row("1g.20gb", P_1_SLICE_REV2, 15, 1, 4, 26, 19.625, 1, dec=1, jpg=1),
)

#: Read on a real H200 (driver 580.159.04) with MIG mode disabled; see h200-probe.md.
H200_PROFILES = (
    _row("1g.18gb", P_1_SLICE, 19, 1, 7, 16, 16.0, 1, dec=1, jpg=1),
    _row("2g.35gb", P_2_SLICE, 14, 2, 3, 32, 32.5, 2, dec=2, jpg=2),
    _row("3g.71gb", P_3_SLICE, 9, 3, 2, 60, 69.75, 3, dec=3, jpg=3),
    _row("4g.71gb", P_4_SLICE, 5, 4, 1, 64, 69.75, 4, dec=4, jpg=4),
    _row("7g.141gb", P_7_SLICE, 0, 7, 1, 132, 140.0, 8, dec=7, jpg=7, ofa=1),
    _row("1g.18gb+me", P_1_SLICE_REV1, 20, 1, 1, 16, 16.0, 1, dec=1, jpg=1, ofa=1),
    _row("1g.35gb", P_1_SLICE_REV2, 15, 1, 4, 26, 32.5, 1, dec=1, jpg=1),
)


def profile_row(table: tuple[ProfileRow, ...], name: str) -> ProfileRow:
    """The row named ``name`` ("1g.5gb") of a profile table."""
    for row in table:
        if row.name == name:
            return row
    raise KeyError(f"no profile {name!r} in this table: {[r.name for r in table]}")


def mig_instance(table: tuple[ProfileRow, ...], profile: str, uuid: str, index: int, gi_id: int,
                 ci_id: int = 0, processes: tuple[Process, ...] = (), **overrides: Any) -> MigInstance:
    """A MIG device filled from its profile row.

    ``profile`` is a GPU-instance profile ("3g.40gb") or a compute-instance split ("1c.3g.40gb"):
    a split gets ``n`` of the GPU instance's compute slices and SMs in proportion (A100: 14 per
    slice), and shares the GPU instance's memory and engines.
    """
    ci_part, gi_name = profile.split(".", 1) if profile.count(".") == 2 else ("", profile)
    row = profile_row(table, gi_name)
    ci_slices = int(ci_part[:-1]) if ci_part else row.slices
    sms = row.sms * ci_slices // row.slices
    values: dict[str, Any] = dict(
        uuid=uuid, profile=profile, index=index, gi_id=gi_id, ci_id=ci_id, sms=sms,
        memory_mb=row.memory_mb, gi_slices=row.slices, ci_slices=ci_slices,
        copy_engines=row.copy_engines, decoders=row.decoders, encoders=row.encoders,
        jpegs=row.jpegs, ofas=row.ofas, processes=processes,
    )
    values.update(overrides)
    return MigInstance(**values)


# --------------------------------------------------------------------------------------------
# GPU models: fingerprint values.  Driver-dependent strings (VBIOS, InfoROM) are plausible
# examples except on the H200, whose values were read on the real card.

A100_40GB = dict(
    name="NVIDIA A100-SXM4-40GB", memory_mib=40960, compute_capability=(8, 0), profiles=A100_40GB_PROFILES,
    vbios="92.00.36.00.02", inforom="G503.0201.00.03", gsp_firmware=None,
    power_limit_mw=400_000, power_min_mw=100_000, power_max_mw=400_000, power_usage_mw=61_523,
    sm_clock_mhz=1410, mem_clock_mhz=1215, video_clock_mhz=1275,
    max_sm_clock_mhz=1410, max_mem_clock_mhz=1215, max_video_clock_mhz=1290, memory_bus_width=5120,
    pci_device_id=0x20B010DE, pci_subsystem_id=0x134F10DE,
)

A100_80GB = dict(
    name="NVIDIA A100-SXM4-80GB", memory_mib=81920, compute_capability=(8, 0), profiles=A100_80GB_PROFILES,
    vbios="92.00.45.00.03", inforom="G506.0210.00.01", gsp_firmware=b"550.54.15",
    power_limit_mw=400_000, power_min_mw=100_000, power_max_mw=400_000, power_usage_mw=68_412,
    sm_clock_mhz=1410, mem_clock_mhz=1593, video_clock_mhz=1275,
    max_sm_clock_mhz=1410, max_mem_clock_mhz=1593, max_video_clock_mhz=1290, memory_bus_width=5120,
    pci_device_id=0x20B210DE, pci_subsystem_id=0x147F10DE,
)

H100_SXM5 = dict(
    name="NVIDIA H100 80GB HBM3", memory_mib=81559, compute_capability=(9, 0), profiles=H100_80GB_PROFILES,
    vbios="96.00.74.00.0D", inforom="G520.0200.00.05", gsp_firmware=b"550.54.15",
    power_limit_mw=700_000, power_min_mw=200_000, power_max_mw=700_000, power_usage_mw=72_880,
    sm_clock_mhz=1980, mem_clock_mhz=2619, video_clock_mhz=1545,
    max_sm_clock_mhz=1980, max_mem_clock_mhz=2619, max_video_clock_mhz=1545, memory_bus_width=5120,
    pcie_link=(5, 16, 5, 16), pci_device_id=0x233010DE, pci_subsystem_id=0x16C110DE,
)

#: Exactly as read on the real H200 (h200-probe.md); current clocks/power are an idle example.
H200 = dict(
    name="NVIDIA H200", memory_mib=143771, compute_capability=(9, 0), profiles=H200_PROFILES,
    vbios="96.00.A5.00.1A", inforom="G520.0282.02.02", gsp_firmware=b"580.159.04",
    power_limit_mw=700_000, power_min_mw=200_000, power_max_mw=700_000, power_usage_mw=77_964,
    sm_clock_mhz=1980, mem_clock_mhz=3201, video_clock_mhz=1545,
    max_sm_clock_mhz=1980, max_mem_clock_mhz=3201, max_video_clock_mhz=1545, memory_bus_width=6144,
    pcie_link=(5, 16, 5, 16), pci_device_id=0x233510DE, pci_subsystem_id=0x18BE10DE,
)

L40S = dict(
    name="NVIDIA L40S", memory_mib=46068, compute_capability=(8, 9), profiles=(),
    vbios="95.02.66.00.02", inforom="G133.0242.00.03", gsp_firmware=b"550.54.15",
    power_limit_mw=350_000, power_min_mw=100_000, power_max_mw=350_000, power_usage_mw=35_219,
    sm_clock_mhz=2520, mem_clock_mhz=9001, video_clock_mhz=1965,
    max_sm_clock_mhz=2520, max_mem_clock_mhz=9001, max_video_clock_mhz=1965, memory_bus_width=384,
    pci_device_id=0x26B910DE, pci_subsystem_id=0x185110DE,
)

#: Not read on a real B200: NVIDIA's HGX B200 specifications (https://www.nvidia.com/en-us/data-center/hgx/:
#: 180 GB HBM3e at 7.7 TB/s per GPU, up to 1,000 W, PCIe Gen5), the name, memory (183359 MiB), 148 SMs and
#: compute capability 10.0 that public nvidia-smi and CUDA device queries show, and eight 1024-bit HBM3e
#: stacks.  The maximum memory clock is the datasheet bandwidth over that bus at 2 transfers per clock
#: (7.7 TB/s / 2 / 1024 B = 3760 MHz); the maximum SM clock is the 1965 MHz B200 users lock their clocks
#: to (nvidia-smi -lgc 1965).  No profile table: none was read on a B200.
B200 = dict(
    name="NVIDIA B200", memory_mib=183359, compute_capability=(10, 0), profiles=(),
    vbios="97.00.A7.00.01", inforom="G525.0210.00.02", gsp_firmware=b"580.159.04",
    power_limit_mw=1_000_000, power_min_mw=200_000, power_max_mw=1_000_000, power_usage_mw=141_210,
    sm_clock_mhz=1965, mem_clock_mhz=3760, video_clock_mhz=1650,
    max_sm_clock_mhz=1965, max_mem_clock_mhz=3760, max_video_clock_mhz=1650, memory_bus_width=8192,
    pcie_link=(5, 16, 5, 16), pci_device_id=0x290110DE, pci_subsystem_id=0x199910DE,
)


# --------------------------------------------------------------------------------------------
# The topologies.

#: UUIDs that tests refer to by role.
A100_40_GPU0 = "GPU-baa21c98-4867-5253-bca4-cbb28b081893"
A100_40_3G = "MIG-899404bf-cf45-5cb1-9e75-88bbd9515144"
A100_40_2G = "MIG-c2fe6b92-cb27-5e03-9091-5b81725e2e96"
A100_40_1G_BUSY = "MIG-46599572-3d3b-5d84-b5ae-334e647234ed"
A100_40_1G_FREE = "MIG-b7a45de1-2e26-5fb6-b4b8-6c942b824b84"
A100_40_GPU1 = "GPU-2cb28618-2063-5552-b78a-776c67f74864"
A100_40_BUSY_PID = 24817

A100_80_GPU0 = "GPU-f1ce29fd-5a60-5272-8bba-4c1c1e28c678"
A100_80_3G = "MIG-a803b9f4-d755-5f11-bf4e-04e6ddfc1978"
A100_80_2G = "MIG-5888e005-a62d-5176-8939-34d955b9c55f"
A100_80_1G_A = "MIG-1e4bd215-8964-5a4d-88ff-b435e77d6e1e"
A100_80_1G_B = "MIG-06988e5e-eb63-5b16-b9ac-f9b44b567b35"
A100_80_GPU1 = "GPU-78acd5cc-9391-5fa1-a216-58613af349e0"
A100_80_1C3G = "MIG-6ce0e963-be49-5086-9861-0b6b22f69ef0"
A100_80_2C3G = "MIG-6cc3f313-971d-5799-81c7-fab6a739cf2f"
A100_80_1G20 = "MIG-4b7356a7-0208-5b6b-bdde-9e344f05c115"
A100_80_1G_C = "MIG-6ccf1bbf-b17b-553c-ad22-079870538eaa"
A100_80_1G_D = "MIG-628d886a-f556-5caa-9bbc-83ffae6f3f4a"

H100_GPU0 = "GPU-252ba0ff-6a46-5876-a386-b7779fce17f8"
H100_1G = (
    "MIG-595f8f24-cd49-52a3-8cb4-57983517c145",
    "MIG-9b4f1337-2771-5628-86b6-d525bba371cd",
    "MIG-5269dfca-0c1e-555e-95ae-f204e0c14b73",
    "MIG-932e83ce-6224-5512-b0f3-783fb143d417",
    "MIG-7a6bcd33-486e-549e-ac05-3b7c107b48d6",
    "MIG-0c2822d5-28da-5332-9f21-f8fbb6939bd6",
    "MIG-047749b3-319e-56f0-89ba-07080d4601df",
)

H200_GPU0 = "GPU-29a2971f-983e-542c-94c8-c6e1dc28c573"
L40S_GPU0 = "GPU-5ee179e9-bbf6-5e7f-8170-74c048184fad"
B200_GPU0 = "GPU-8f3c2d1e-5a4b-5c6d-9e7f-0a1b2c3d4e5f"

# NVML error codes used below (pynvml.NVML_ERROR_*).
_ERROR_DRIVER_NOT_LOADED = 9
_ERROR_LIBRARY_NOT_FOUND = 12


def _a100_40gb_mixed() -> Topology:
    t = A100_40GB_PROFILES
    gpu0 = Gpu(
        uuid=A100_40_GPU0, mig_mode=(1, 1), pci_bus_id="00000000:07:00.0", **A100_40GB,
        instances=(
            mig_instance(t, "3g.20gb", A100_40_3G, index=0, gi_id=2),
            mig_instance(t, "2g.10gb", A100_40_2G, index=1, gi_id=3),
            mig_instance(t, "1g.5gb", A100_40_1G_BUSY, index=2, gi_id=9,
                         processes=(Process(A100_40_BUSY_PID, used_mib=2048),)),
            mig_instance(t, "1g.5gb", A100_40_1G_FREE, index=3, gi_id=10),
        ),
    )
    gpu1 = Gpu(uuid=A100_40_GPU1, mig_mode=(0, 0), pci_bus_id="00000000:0F:00.0",
               **{**A100_40GB, "power_usage_mw": 55_107, "energy_mj": 87_000_000})
    return Topology(
        name="a100-40gb-mixed",
        description="2x A100-SXM4-40GB: GPU 0 MIG on (3g.20gb, 2g.10gb, 1g.5gb busy, 1g.5gb free), GPU 1 MIG off",
        gpus=(gpu0, gpu1), driver_version="535.183.01", cuda_driver_version=12020, nvml_version="12.535.183.01",
    )


def _a100_80gb_mixed() -> Topology:
    t = A100_80GB_PROFILES
    wulver = Gpu(
        uuid=A100_80_GPU0, mig_mode=(1, 1), pci_bus_id="00000000:07:00.0", **A100_80GB,
        instances=(
            mig_instance(t, "3g.40gb", A100_80_3G, index=0, gi_id=2),
            mig_instance(t, "2g.20gb", A100_80_2G, index=1, gi_id=3),
            mig_instance(t, "1g.10gb", A100_80_1G_A, index=2, gi_id=9),
            mig_instance(t, "1g.10gb", A100_80_1G_B, index=3, gi_id=10),
        ),
    )
    split = Gpu(
        uuid=A100_80_GPU1, mig_mode=(1, 1), pci_bus_id="00000000:0F:00.0",
        **{**A100_80GB, "power_usage_mw": 70_245, "energy_mj": 91_000_000},
        instances=(
            mig_instance(t, "1c.3g.40gb", A100_80_1C3G, index=0, gi_id=1, ci_id=0),
            mig_instance(t, "2c.3g.40gb", A100_80_2C3G, index=1, gi_id=1, ci_id=1),
            mig_instance(t, "1g.20gb", A100_80_1G20, index=2, gi_id=11),
            mig_instance(t, "1g.10gb", A100_80_1G_C, index=3, gi_id=12),
            mig_instance(t, "1g.10gb", A100_80_1G_D, index=4, gi_id=13),
        ),
    )
    return Topology(
        name="a100-80gb-mixed",
        description=("2x A100-SXM4-80GB, MIG on: GPU 0 as on Wulver (3g.40gb, 2g.20gb, 2x 1g.10gb); "
                     "GPU 1 a 3g.40gb GPU instance split into 1c.3g.40gb + 2c.3g.40gb compute instances, "
                     "1g.20gb, 2x 1g.10gb; all free"),
        gpus=(wulver, split), driver_version="550.54.15", cuda_driver_version=12040, nvml_version="12.550.54.15",
    )


def _h100_mig() -> Topology:
    t = H100_80GB_PROFILES
    gpu = Gpu(
        uuid=H100_GPU0, mig_mode=(1, 1), pci_bus_id="00000000:18:00.0", **H100_SXM5,
        instances=tuple(mig_instance(t, "1g.10gb", uuid, index=i, gi_id=7 + i) for i, uuid in enumerate(H100_1G)),
    )
    return Topology(
        name="h100-mig", description="1x H100 80GB HBM3, MIG on: 7x 1g.10gb (16 SMs each), all free",
        gpus=(gpu,), driver_version="550.54.15", cuda_driver_version=12040, nvml_version="12.550.54.15",
    )


def _h200_mig_off() -> Topology:
    gpu = Gpu(uuid=H200_GPU0, mig_mode=(0, 0), pci_bus_id="00000000:19:00.0", energy_mj=152_331_870, **H200)
    return Topology(
        name="h200-mig-off",
        description="1x H200 (143771 MiB), MIG off, as probed on the real card (driver 580.159.04)",
        gpus=(gpu,), driver_version="580.159.04", cuda_driver_version=13000, nvml_version="13.580.159.04",
    )


def _l40s_no_mig() -> Topology:
    gpu = Gpu(uuid=L40S_GPU0, mig_mode=None, max_mig_devices=0, pci_bus_id="00000000:41:00.0", **L40S)
    return Topology(
        name="l40s-no-mig", description="1x L40S: a GPU without MIG (nvmlDeviceGetMigMode NotSupported)",
        gpus=(gpu,), driver_version="550.54.15", cuda_driver_version=12040, nvml_version="12.550.54.15",
    )


def _b200_mig_off() -> Topology:
    gpu = Gpu(uuid=B200_GPU0, mig_mode=(0, 0), max_mig_devices=0, pci_bus_id="00000000:1B:00.0", **B200)
    return Topology(
        name="b200-mig-off", description="1x B200 (183359 MiB, 148 SMs), MIG off; from NVIDIA's published specs",
        gpus=(gpu,), driver_version="580.159.04", cuda_driver_version=13000, nvml_version="13.580.159.04",
    )


TOPOLOGIES: dict[str, Topology] = {
    t.name: t
    for t in (
        _a100_40gb_mixed(),
        _a100_80gb_mixed(),
        _h100_mig(),
        _h200_mig_off(),
        _l40s_no_mig(),
        _b200_mig_off(),
        Topology(name="no-gpu", description="NVML loads, no GPU (device count 0)", driver_version="550.54.15",
                 cuda_driver_version=12040, nvml_version="12.550.54.15"),
        Topology(name="no-nvml", description="no NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound",
                 init_error=_ERROR_LIBRARY_NOT_FOUND),
        Topology(name="driver-not-loaded", description="libnvidia-ml is there, the kernel driver is not: "
                 "nvmlInit raises NVMLError_DriverNotLoaded", init_error=_ERROR_DRIVER_NOT_LOADED),
    )
}


def get_topology(name: str) -> Topology:
    """The registered topology called ``name``."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise KeyError(f"no fake topology {name!r}; known: {', '.join(TOPOLOGIES)}") from None


# --------------------------------------------------------------------------------------------
# Lookups and variants.


def iter_instances(topology: Topology) -> Iterator[tuple[int, MigInstance]]:
    """(gpu index, MIG device) for every MIG device of every GPU with MIG on."""
    for gpu_index, gpu in enumerate(topology.gpus):
        if gpu.mig_enabled:
            for inst in gpu.instances:
                yield gpu_index, inst


def find_instance(topology: Topology, uuid: str) -> tuple[int, MigInstance]:
    """(gpu index, MIG device) for a MIG UUID."""
    for gpu_index, inst in iter_instances(topology):
        if inst.uuid == uuid:
            return gpu_index, inst
    raise KeyError(f"no MIG device {uuid} in topology {topology.name!r}")


def find_gpu(topology: Topology, uuid: str) -> int:
    """The index of the GPU with this UUID."""
    for i, gpu in enumerate(topology.gpus):
        if gpu.uuid == uuid:
            return i
    raise KeyError(f"no GPU {uuid} in topology {topology.name!r}")


def with_gpu(topology: Topology, index: int, **changes: Any) -> Topology:
    """A copy with GPU ``index``'s fields changed (``with_gpu(t, 0, power_usage_mw=650_000)``)."""
    gpus = list(topology.gpus)
    gpus[index] = replace(gpus[index], **changes)
    return replace(topology, gpus=tuple(gpus))


def with_instance(topology: Topology, uuid: str, **changes: Any) -> Topology:
    """A copy with the MIG device ``uuid``'s fields changed."""
    gpu_index, _ = find_instance(topology, uuid)
    gpu = topology.gpus[gpu_index]
    instances = tuple(replace(i, **changes) if i.uuid == uuid else i for i in gpu.instances)
    return with_gpu(topology, gpu_index, instances=instances)


def with_busy(topology: Topology, uuid: str, pid: int = 31337, used_mib: int | None = 1024) -> Topology:
    """A copy with a compute process (``pid``) running on the MIG device or GPU ``uuid``."""
    proc = Process(pid, used_mib)
    if uuid.startswith("MIG-"):
        inst = topology.instance(uuid)
        return with_instance(topology, uuid, processes=inst.processes + (proc,))
    index = find_gpu(topology, uuid)
    return with_gpu(topology, index, processes=topology.gpus[index].processes + (proc,))


def with_free(topology: Topology, uuid: str) -> Topology:
    """A copy with no process on the MIG device or GPU ``uuid``."""
    if uuid.startswith("MIG-"):
        return with_instance(topology, uuid, processes=())
    return with_gpu(topology, find_gpu(topology, uuid), processes=())


def with_all_free(topology: Topology) -> Topology:
    """A copy with no process anywhere."""
    gpus = tuple(replace(g, processes=(), instances=tuple(replace(i, processes=()) for i in g.instances))
                 for g in topology.gpus)
    return replace(topology, gpus=gpus)


def with_throttle(topology: Topology, mask: int, gpu: int | None = None) -> Topology:
    """A copy whose GPU ``gpu`` (default: every GPU) reports clocks-event reasons ``mask``."""
    indices = range(len(topology.gpus)) if gpu is None else [gpu]
    for i in indices:
        topology = with_gpu(topology, i, throttle_reasons=mask)
    return topology


def with_mig_mode(topology: Topology, gpu: int, current: int, pending: int | None = None) -> Topology:
    """A copy with GPU ``gpu``'s MIG mode set (pending defaults to current)."""
    return with_gpu(topology, gpu, mig_mode=(current, current if pending is None else pending))


def with_error(topology: Topology, function: str, code: int, uuid: str | None = None) -> Topology:
    """A copy where ``function`` (a pynvml name, or "*" for all) raises NVML error ``code``.

    With ``uuid`` it fails only for that GPU (and its MIG devices) or that MIG device; without,
    for every call.  Example: ``with_error(t, "nvmlDeviceGetPowerUsage", NVML_ERROR_GPU_IS_LOST)``.
    """
    entry = ((function, code),)
    if uuid is None:
        return replace(topology, errors=topology.errors + entry)
    if uuid.startswith("MIG-"):
        return with_instance(topology, uuid, errors=topology.instance(uuid).errors + entry)
    index = find_gpu(topology, uuid)
    return with_gpu(topology, index, errors=topology.gpus[index].errors + entry)


def with_driver(topology: Topology, driver_version: str, cuda_driver_version: int | None = None) -> Topology:
    """A copy with another driver (and CUDA driver) version, e.g. to test fingerprint diffs."""
    cuda = topology.cuda_driver_version if cuda_driver_version is None else cuda_driver_version
    return replace(topology, driver_version=driver_version, cuda_driver_version=cuda)


def renamed(topology: Topology, name: str) -> Topology:
    """A copy under another name."""
    return replace(topology, name=name)


# --------------------------------------------------------------------------------------------
# JSON, to hand a topology (or a variant) to a subprocess.


def to_json(topology: Topology) -> str:
    """The topology as JSON (bytes fields as {"__bytes__": "..."})."""
    def encode(value: Any) -> Any:
        if isinstance(value, bytes):
            return {"__bytes__": value.decode()}
        if isinstance(value, dict):
            return {k: encode(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [encode(v) for v in value]
        return value

    return json.dumps(encode(dataclasses.asdict(topology)), indent=1)


def from_json(text: str) -> Topology:
    """The inverse of :func:`to_json`."""
    return _build(Topology, json.loads(text))


def load(path: str | Path) -> Topology:
    """A topology from a JSON file written with :func:`to_json`."""
    return from_json(Path(path).read_text())


def _build(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: _convert(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data})


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        tp = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value)  # type: ignore[arg-type]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value))
    if tp is bytes:
        return value["__bytes__"].encode()
    return value


__all__ = [
    "Gpu", "MigInstance", "ProfileRow", "Process", "Topology", "TOPOLOGIES", "get_topology",
    "find_gpu", "find_instance", "iter_instances", "mig_instance", "profile_row",
    "with_all_free", "with_busy", "with_driver", "with_error", "with_free", "with_gpu", "with_instance",
    "with_mig_mode", "with_throttle", "renamed", "to_json", "from_json", "load",
]
