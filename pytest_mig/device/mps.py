"""CUDA MPS for emulating a profile with engines that make their own CUDA context (OpenMM, GROMACS).

A green context confines the kernels of this process's PyTorch only: OpenMM in the same process,
or gmx in a child, creates its own context and would run on the whole GPU (on the H100 a 23.5k-atom
box ran at the same ns/day "inside" a 16-SM green context as on the whole GPU).  An MPS client is
confined by the server instead: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` limits the SMs its contexts
get (in whole TPCs, so the percentage is searched until a probe client sees exactly the profile's
SMs: :func:`Mps.percentage_for`), and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` caps its memory.

How it differs from MIG, as green contexts do: memory bandwidth, L2 and the copy engines stay
shared; only SMs and the memory capacity are partitioned.

The daemon (:func:`shared`): where a site already runs one (``CUDA_MPS_PIPE_DIRECTORY`` names a
folder with a control pipe, or the default ``/tmp/nvidia-mps`` has one), it is used and left alone.
Otherwise pytest-mig starts ``nvidia-cuda-mps-control -d`` on private pipe and log folders the
first time an engine needs it and stops it (``quit``) at the end of the session (:func:`shutdown`,
also registered with atexit).  Only clients given that pipe folder reach it: nothing else on the
node becomes an MPS client.  Our daemon inherits the job's ``CUDA_VISIBLE_DEVICES`` (so its server
sees the job's GPU alone, and two jobs on two GPUs of a node each run their own), and its clients
are started without one, as NVIDIA's MPS guide asks.  The probe reports the UUID of the GPU the
client ran on; a client on any GPU but the Target's is refused.

``python -m pytest_mig.device.mps probe`` is the probe client: it creates a context through the driver
API and prints, as JSON, the SMs and memory it was given.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from pytest_mig.device.target import DoesNotFit

if TYPE_CHECKING:
    from pytest_mig.device.target import Target

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
#: Seconds to wait for a started daemon's control pipe, and for a probe client.
START_TIMEOUT_S = 20.0
PROBE_TIMEOUT_S = 60.0


class MpsUnavailable(Exception):
    """MPS cannot confine an engine here; the message says why, in one sentence."""


@dataclass
class Mps:
    """A running MPS control daemon: its pipe folder, and whether this run started it."""

    pipe_dir: str
    log_dir: str | None
    owned: bool
    _tmp: str | None = None
    _percentages: dict[tuple[int, int], tuple[float, dict[str, Any]]] = field(default_factory=dict)

    def client_env(self, base: Mapping[str, str], *, percentage: float | None = None,
                   memory_limit_bytes: int | None = None) -> dict[str, str]:
        """``base`` plus what makes a process a client of this daemon with an SM share and a memory cap."""
        env = dict(base)
        if self.owned:
            # Our daemon was started with the job's CUDA_VISIBLE_DEVICES, so its server sees that GPU
            # alone; a client reads its own CUDA_VISIBLE_DEVICES against the server's devices, where
            # "1" (Slurm's second GPU) names none.  NVIDIA's MPS guide: not set in the client.
            env.pop("CUDA_VISIBLE_DEVICES", None)
        env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        if percentage is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = format_percentage(percentage)
        if memory_limit_bytes is not None:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, memory_limit_bytes // 2**20)}M"
        return env

    def percentage_for(self, sms: int, total_sms: int, base: Mapping[str, str],
                       gpu_uuid: str | None = None) -> tuple[float, dict[str, Any]]:
        """The thread percentage under which a client sees exactly ``sms`` of ``total_sms`` SMs, and the
        probe's report.  Raises MpsUnavailable when no percentage near ``sms / total_sms`` gives it, or
        when the client's GPU is not ``gpu_uuid`` (the Target's board)."""
        key = (sms, total_sms)
        if key in self._percentages:
            return self._percentages[key]
        seen: list[str] = []
        errors: list[str] = []
        for pct in candidate_percentages(sms, total_sms):
            report = probe(self.client_env(base, percentage=pct))
            if "error" in report:
                errors.append(report["error"])
                seen.append(f"{format_percentage(pct)}% -> {report['error']}")
                continue
            if gpu_uuid and report.get("uuid") and report["uuid"] != gpu_uuid:
                raise MpsUnavailable(f"the MPS client ran on {report['uuid']}, not on the Target's GPU {gpu_uuid}")
            got = report.get("sms")
            seen.append(f"{format_percentage(pct)}% -> {got} SMs")
            if got == sms:
                self._percentages[key] = (pct, report)
                return pct, report
        if len(errors) == len(seen) and len(set(errors)) == 1:  # the client never started: say so once
            raise MpsUnavailable(f"the MPS probe client failed at every thread percentage tried: {errors[0]}")
        raise MpsUnavailable(f"no MPS thread percentage gave exactly {sms} of {total_sms} SMs ({', '.join(seen)})")

    def stop(self) -> None:
        if not self.owned:
            return
        env = self.client_env(os.environ)
        try:
            subprocess.run([CONTROL], input="quit\n", text=True, env=env, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
        control = Path(self.pipe_dir) / "control"
        deadline = time.monotonic() + 10
        while control.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.owned = False
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def format_percentage(pct: float) -> str:
    return f"{pct:g}"


def candidate_percentages(sms: int, total_sms: int) -> list[float]:
    """Percentages to try, nearest the share first: MPS gives SMs in whole TPCs, rounding down."""
    share = 100.0 * sms / total_sms
    start = math.ceil(share)
    out: list[float] = []
    for p in (start, start + 1, start - 1, start + 2, start + 3, share, start - 2):
        p = min(100.0, max(1.0, float(p)))
        if p not in out:
            out.append(p)
    return out


def site_pipe_directory(env: Mapping[str, str]) -> str | None:
    """The pipe folder of an MPS daemon the site already runs, if any."""
    named = env.get("CUDA_MPS_PIPE_DIRECTORY")
    for folder in ([named] if named else []) + [DEFAULT_PIPE_DIRECTORY]:
        if folder and (Path(folder) / "control").exists():
            return folder
    return None


def start(env: Mapping[str, str] | None = None, *, private: bool = False) -> Mps:
    """Use the site's daemon, or start one on private folders (``private``: always).  Raises
    MpsUnavailable with the reason."""
    env = dict(os.environ if env is None else env)
    existing = None if private else site_pipe_directory(env)
    if existing:
        return Mps(existing, env.get("CUDA_MPS_LOG_DIRECTORY"), owned=False)
    control = shutil.which(CONTROL)
    if control is None:
        raise MpsUnavailable(f"emulating a profile for an engine with its own CUDA context needs CUDA MPS, "
                             f"and {CONTROL} is not on PATH")
    tmp = tempfile.mkdtemp(prefix="pytest-mig-mps-")
    pipe, log = os.path.join(tmp, "pipe"), os.path.join(tmp, "log")
    os.makedirs(pipe)
    os.makedirs(log)
    daemon_env = {**env, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
    proc = subprocess.run([control, "-d"], env=daemon_env, capture_output=True, text=True, timeout=30, check=False)
    deadline = time.monotonic() + START_TIMEOUT_S
    while proc.returncode == 0 and not (Path(pipe) / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.returncode != 0 or not (Path(pipe) / "control").exists():
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()
        shutil.rmtree(tmp, ignore_errors=True)
        raise MpsUnavailable(f"the CUDA MPS control daemon did not start (exit {proc.returncode}"
                             + (f": {detail[-1]}" if detail else "") + ")")
    return Mps(pipe, log, owned=True, _tmp=tmp)


_SHARED: Mps | None = None


def shared() -> Mps:
    """The session's daemon, started (or found) on first use."""
    global _SHARED
    if _SHARED is None:
        _SHARED = start()
    return _SHARED


def shutdown() -> None:
    """Stop the daemon this session started; a site's own daemon is left running."""
    global _SHARED
    if _SHARED is not None:
        _SHARED.stop()
        _SHARED = None


atexit.register(shutdown)


def confine(sms: int | None, total_sms: int | None, memory_limit_bytes: int,
            base: Mapping[str, str], gpu_uuid: str | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment of an MPS client with ``sms`` SMs and a memory cap on the GPU ``gpu_uuid``, and
    what was set (for the record).  Raises MpsUnavailable with the reason."""
    if not sms or not total_sms:
        raise MpsUnavailable("the profile's SM count or the GPU's is unknown")
    daemon = shared()
    pct, report = daemon.percentage_for(sms, total_sms, base, gpu_uuid)
    env = daemon.client_env(base, percentage=pct, memory_limit_bytes=memory_limit_bytes)
    return env, {"method": "CUDA MPS client", "active_thread_percentage": pct,
                 "memory_limit_bytes": memory_limit_bytes, "probe": report,
                 "daemon": "started by pytest-mig" if daemon.owned else "the site's"}


def confine_engine(target: Target, base: Mapping[str, str], engine: str) -> tuple[dict[str, str], dict[str, Any]]:
    """:func:`confine` for an engine (OpenMM, GROMACS's mdrun) on an emulated Target: its SMs and
    memory budget; DoesNotFit (a skip) with the reason where MPS cannot confine it."""

    try:
        return confine(target.effective_sms, _total_sms(target), target.memory_budget(), base,
                       target.board.get("gpu_uuid") or target.uuid)
    except MpsUnavailable as exc:
        raise DoesNotFit(f"{engine} makes its own CUDA context, which a green context does not confine, and MPS "
                         f"could not confine it to the emulated {target.profile} instead: {exc}") from None


def _total_sms(target: Target) -> int | None:
    """The whole GPU's SMs: the model's table, else what CUDA reports."""
    model = target.model
    if model is not None and model.sms:
        return int(model.sms)
    try:
        import torch

        return int(torch.cuda.get_device_properties(0).multi_processor_count)
    except Exception:
        return None


def probe(env: Mapping[str, str]) -> dict[str, Any]:
    """Run the probe client under ``env``; its report, or {"error": ...}."""
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest_mig.device.mps", "probe"], env=dict(env), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"the MPS probe client did not answer in {PROBE_TIMEOUT_S:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": f"the MPS probe client failed (exit {proc.returncode})" + (f": {tail[-1]}" if tail else "")}
    report: dict[str, Any] = json.loads(lines[-1])
    return report


# --------------------------------------------------------------------------- the driver, read in this process

_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


@functools.cache
def _libcuda() -> Any:
    """The CUDA driver library, loaded once: the emulator asks for the current context before every
    figure it records."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def context_resources(device: int = 0) -> dict[str, Any]:
    """SMs and memory that a context of this process gets, read through the driver API.

    The primary context is created (as every engine's is), then the SM count is read from the
    context's own SM resource where the driver has cuCtxGetDevResource (CUDA 12.4+: under MPS it is
    the client's share), else from the device attribute; memory from cuMemGetInfo; and the
    device's UUID, so that a client can be shown to run on the Target's GPU.
    """
    cuda = _libcuda()
    if cuda is None:
        return {"error": "libcuda is not loadable"}
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    steps = (("cuInit", (ctypes.c_uint(0),)), ("cuDeviceGet", (ctypes.byref(dev), ctypes.c_int(device))))
    for name, args in steps:
        rc = getattr(cuda, name)(*args)
        if rc != 0:
            return {"error": f"{name} returned {rc}"}
    rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if rc != 0:
        return {"error": f"cuDevicePrimaryCtxRetain returned {rc}"}
    cuda.cuCtxSetCurrent(ctx)
    out: dict[str, Any] = {}
    uuid = (ctypes.c_ubyte * 16)()
    get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or getattr(cuda, "cuDeviceGetUuid", None)
    if get_uuid is not None and get_uuid(uuid, dev) == 0:
        out["uuid"] = format_uuid(bytes(uuid))
    attr = ctypes.c_int()
    if cuda.cuDeviceGetAttribute(ctypes.byref(attr), _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) == 0:
        out["device_sms"] = attr.value
    ctx_sms = _ctx_sms(cuda, ctx)
    if ctx_sms is not None:
        out["context_sms"] = ctx_sms
    out["sms"] = ctx_sms if ctx_sms is not None else out.get("device_sms")
    out["sms_source"] = "cuCtxGetDevResource" if ctx_sms is not None else "cuDeviceGetAttribute"
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    fn = getattr(cuda, "cuMemGetInfo_v2", None) or cuda.cuMemGetInfo
    if fn(ctypes.byref(free), ctypes.byref(total)) == 0:
        out["memory_free"], out["memory_total"] = free.value, total.value
    return out


def format_uuid(raw: bytes) -> str:
    """A CUuuid's 16 bytes as NVML and nvidia-smi write a GPU's UUID: GPU-8-4-4-4-12 hex digits."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class _SmResource(ctypes.Structure):
    """CUdevResource: its type, 92 reserved bytes, then a 48-byte union whose SM member starts with
    smCount; room to spare after it for what later CUDA versions append."""

    _fields_ = [("type", ctypes.c_int), ("_internal", ctypes.c_ubyte * 92), ("sm_count", ctypes.c_uint),
                ("_rest", ctypes.c_ubyte * 300)]


def current_context() -> int | None:
    """This thread's current CUDA context (its CUcontext handle), None where there is none."""
    cuda = _libcuda()
    if cuda is None:
        return None
    ctx = ctypes.c_void_p()
    if cuda.cuCtxGetCurrent(ctypes.byref(ctx)) != 0:
        return None
    return ctx.value or None


def make_current(context: int) -> bool:
    """Make ``context`` (a CUcontext handle) this thread's current context; False where that failed."""
    cuda = _libcuda()
    return cuda is not None and cuda.cuCtxSetCurrent(ctypes.c_void_p(context)) == 0


def current_context_sms() -> int | None:
    """SMs of this thread's current CUDA context (a green context's own share, an MPS client's
    share), read with cuCtxGetDevResource; None where there is no context or the driver cannot say."""
    cuda = _libcuda()
    ctx = current_context()
    if cuda is None or ctx is None:
        return None
    return _ctx_sms(cuda, ctypes.c_void_p(ctx))


def _ctx_sms(cuda: Any, ctx: ctypes.c_void_p) -> int | None:
    fn = getattr(cuda, "cuCtxGetDevResource", None)
    if fn is None:
        return None
    res = _SmResource()
    if fn(ctx, ctypes.byref(res), ctypes.c_int(1)) != 0:  # CU_DEV_RESOURCE_TYPE_SM
        return None
    return int(res.sm_count) or None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["probe"]:
        print("usage: python -m pytest_mig.device.mps probe", file=sys.stderr)
        return 2
    report = context_resources()
    print(json.dumps(report))
    return 0 if "error" not in report else 1


if __name__ == "__main__":
    sys.exit(main())
