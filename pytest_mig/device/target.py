"""The Target a run measures: a real MIG instance, a whole GPU, an emulated profile, or the CPU.

This module chooses the Target from the options, the environment (CUDA_VISIBLE_DEVICES set by
Slurm or Kubernetes) and the NVML inventory; pins it (CUDA_VISIBLE_DEVICES before CUDA starts);
and verifies it once CUDA is up (SM count and memory as CUDA sees them).  A user's mistake is a
:class:`SelectionError` with one sentence; the plugin turns it into ``pytest.UsageError``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal, Mapping

from pytest_mig.device.nvml import Gpu, Inventory, MigInstance, cuda_visible
from pytest_mig.device.profiles import ALL, CPU, FULL, GpuModel, ProfileError, ProfileSpec, ladder, lookup_model, model_slug, parse_profile
from pytest_mig.common.text import SHOWN, printable, quoted, shown

TargetKind = Literal["mig", "full", "emulated", "cpu"]

#: Memory a CPU run lets its workloads use: the CPU is a correctness and smoke target, not measured for speed.
CPU_MEMORY_BUDGET = 2 * 2**30


class SelectionError(Exception):
    """A user's mistake in choosing the device: one sentence, shown without a traceback."""


class DoesNotFit(Exception):
    """The work cannot fit this Target (e.g. a 1.5B model on a 10 GB slice): a skip with the reason."""


@dataclass
class Target:
    """What a test runs on.  Workloads size themselves from ``sms`` and ``memory_bytes``."""

    kind: TargetKind
    profile: str  # "1g.10gb", "full" or "cpu"
    chosen_by: str  # "plugin", "scheduler (CUDA_VISIBLE_DEVICES)", "emulation", "--mig-device", "no GPU"
    gpu_name: str | None = None  # the parent GPU's name, e.g. "NVIDIA H200"
    uuid: str | None = None  # MIG-... for a slice, GPU-... for a whole GPU
    gpu_index: int | None = None  # NVML index of the parent GPU
    sms: int | None = None  # what the profile (or the whole GPU) should have
    sms_obtained: int | None = None  # what CUDA or the green context really gave
    memory_bytes: int | None = None  # the profile's memory, or the device's
    spec: ProfileSpec | None = None
    fingerprint: dict[str, Any] = field(default_factory=dict)
    verified: str = "not checked"  # outcome of the SM/memory check, in words
    notes: list[str] = field(default_factory=list)
    compute_capability: tuple[int, int] | None = None
    board: dict[str, Any] = field(default_factory=dict)  # the parent GPU: gpu_uuid, serial, pci_bus_id
    instance: dict[str, Any] = field(default_factory=dict)  # a MIG instance: gpu_instance_id, compute_instance_id

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    @property
    def emulated(self) -> bool:
        return self.kind == "emulated"

    @property
    def device(self) -> str:
        """The torch device string: the pinned GPU is always cuda:0 in this process."""
        return "cpu" if self.is_cpu else "cuda:0"

    @property
    def gpu_slug(self) -> str:
        return "cpu" if self.is_cpu or not self.gpu_name else model_slug(self.gpu_name)

    @property
    def baseline_profile(self) -> str:
        """The key under which baselines are kept: emulated profiles apart from real slices."""
        return f"{self.profile}-emulated" if self.emulated else self.profile

    @property
    def model(self) -> GpuModel | None:
        """The catalog entry of the parent GPU (datasheet peaks, profile table), if known."""
        if self.is_cpu or not self.gpu_name:
            return None
        mib = self.fingerprint.get("memory_total_mib") if self.fingerprint else None
        return lookup_model(self.gpu_name, mib)

    def peak_tflops(self, precision: str) -> float | None:
        """Datasheet dense peak of this Target: the whole GPU's, scaled by the SMs it has."""
        model = self.model
        if model is None or not model.peak_tflops or precision not in model.peak_tflops:
            return None
        sms = self.effective_sms or model.sms
        return model.peak_tflops[precision] * sms / model.sms

    @property
    def effective_sms(self) -> int | None:
        return self.sms_obtained or self.sms

    def memory_budget(self) -> int:
        """Bytes a workload may plan to use (it still leaves headroom for the allocator)."""
        if self.is_cpu or not self.memory_bytes:
            return CPU_MEMORY_BUDGET
        return self.memory_bytes

    def label(self) -> str:
        if self.is_cpu:
            return "CPU"
        name = (self.gpu_name or "GPU").replace("NVIDIA ", "")
        if self.kind == "full":
            return f"{name} (whole GPU)"
        sms = f", {self.effective_sms} SMs" if self.effective_sms else ""
        return f"{name} {self.profile}" + (" (emulated" + sms + ")" if self.emulated else f" (MIG{sms})")

    def to_dict(self) -> dict[str, Any]:
        """The Target as it goes into result records and reports."""
        return {
            "kind": self.kind,
            "profile": self.profile,
            "baseline_profile": self.baseline_profile,
            "chosen_by": self.chosen_by,
            "gpu_name": self.gpu_name,
            "gpu_slug": self.gpu_slug,
            "uuid": self.uuid,
            "sms": self.sms,
            "sms_obtained": self.sms_obtained,
            "memory_bytes": self.memory_bytes,
            "verified": self.verified,
            "emulated": self.emulated,
            # which board, so that a report can name the one to pull (index, bus id, serial)
            "gpu_index": self.gpu_index,
            **self.board,
            **self.instance,
        }


# --------------------------------------------------------------------------- choosing the Target

_HIDDEN = {"", "-1", "none", "nodevfiles", "void"}


@dataclass(frozen=True)
class Options:
    """The run's choices, from the command line / ini (see plugin.py)."""

    profile: str | None = None
    device: str | None = None
    emulate: bool = False
    require_gpu: bool = False


@dataclass
class Plan:
    """What the run measures and how to pin it."""

    targets: list[Target]
    pin: str | None = None  # value for CUDA_VISIBLE_DEVICES; None leaves the environment alone
    header: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # a sweep's profiles measured as a twin (emulation.distinct_contexts)

    @property
    def sweep(self) -> bool:
        return len(self.targets) > 1


def gpu_profiles(gpu: Gpu) -> list[ProfileSpec]:
    """This GPU's profiles: NVML's live table where it answered, else the catalog's."""
    model = lookup_model(gpu.name, gpu.memory_mib)
    if gpu.profiles:
        specs = []
        for p in gpu.profiles:
            cat = model.profile(p.name) if model else None
            frac = cat.memory_fraction if cat else Fraction(p.slices, 8)
            specs.append(ProfileSpec(p.name, p.sms, p.memory_mb / 1024, frac, p.copy_engines, p.instance_count))
        return specs
    return list(model.profiles) if model else []


def _names(specs: list[ProfileSpec]) -> str:
    ordered = sorted(specs, key=lambda s: (s.slices, s.memory_fraction, s.parsed.media, s.name))
    return ", ".join(s.name for s in ordered) or "none known"


def _machine_profiles(gpus: tuple[Gpu, ...] | list[Gpu]) -> str:
    """'GPU 0 (NVIDIA H200): 1g.18gb, ...' for every GPU (GPUs with the same table grouped)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for g in gpus:
        names = _names(gpu_profiles(g)) if g.mig_enabled is not None else "no MIG"
        groups.setdefault((g.name, names), []).append(g.index)
    return "; ".join(f"{'GPU' if len(idx) == 1 else 'GPUs'} {', '.join(map(str, idx))} ({name}): {names}"
                     for (name, names), idx in groups.items())


def _no_such_profile(gpu: Gpu, profile: str, specs: list[ProfileSpec]) -> SelectionError:
    if not specs:
        what = "nothing to sweep" if profile.lower() == ALL else f"no {profile} to pin or emulate"
        return SelectionError(f"{_gpu_words(gpu)} has no MIG profiles, so there is {what}: "
                              "measure the whole GPU with --mig-profile full (or without --mig-profile).")
    return SelectionError(f"{_gpu_words(gpu)} has no profile {profile}; its profiles: {_names(specs)}.")


def _find_spec(specs: list[ProfileSpec], name: str) -> ProfileSpec | None:
    for s in specs:
        if s.name.lower() == name.lower():
            return s
    return None


def _spec_for_compute_instance(specs: list[ProfileSpec], name: str) -> ProfileSpec | None:
    """'1c.3g.40gb': memory of the 3g GPU instance, SMs of a 1g slice (an approximation the header states)."""
    parsed = parse_profile(name)
    gi = _find_spec(specs, parsed.gi_name)
    if gi is None:
        return None
    if not parsed.is_compute_instance:
        return gi
    small = next((s for s in specs if s.slices == parsed.compute_slices and not s.parsed.media), None)
    sms = small.sms if small else None
    return ProfileSpec(str(parsed), sms, gi.memory_gib, gi.memory_fraction, gi.copy_engines, gi.max_instances, True)


def _resolve_visible(entry: str, inv: Inventory) -> tuple[Gpu, MigInstance | None] | None:
    """A CUDA_VISIBLE_DEVICES / --mig-device entry: N, N:M, GPU-uuid, MIG-uuid or MIG-GPU-uuid/gi/ci."""
    if entry.startswith("MIG-GPU-") and "/" in entry:  # pre-R470 form
        parts = entry[4:].split("/")
        if len(parts) != 3:
            return None
        gpu_uuid, gi, ci = parts
        gpu = inv.find_gpu(gpu_uuid)
        if gpu is None:
            return None
        for inst in gpu.instances:
            if str(inst.gpu_instance_id) == gi and str(inst.compute_instance_id) == ci:
                return gpu, inst
        return None
    if entry.startswith("MIG-"):
        inst = inv.find_instance(entry)
        return (inv.gpus[[g.index for g in inv.gpus].index(inst.gpu_index)], inst) if inst else None
    if ":" in entry:
        g, _, m = entry.partition(":")
        gpu = inv.find_gpu(g)
        if gpu is None:
            return None
        inst = next((i for i in gpu.instances if str(i.mig_index) == m), None)
        return (gpu, inst) if inst else None
    gpu = inv.find_gpu(entry)
    return (gpu, None) if gpu else None


def _gpu_words(gpu: Gpu) -> str:
    return f"GPU {gpu.index} ({gpu.name})"


def _instances_words(gpu: Gpu) -> str:
    counts: dict[str, int] = {}
    for i in gpu.instances:
        counts[i.profile] = counts.get(i.profile, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in counts.items()) or "no instances"


def _cpu_plan(reason: str, opts: Options) -> Plan:
    if opts.require_gpu:
        raise SelectionError(f"--mig-require-gpu is set but there is no usable GPU: {reason}.")
    t = Target(kind="cpu", profile=CPU, chosen_by="no GPU", notes=[reason])
    asked = f" (--mig-profile {opts.profile} not applied)" if opts.profile else ""
    header = [f"no GPU: {reason}; running the workloads on the CPU at small sizes{asked}; "
              "nothing is compared with GPU baselines"]
    return Plan([t], None, header)


def _green_contexts_supported() -> tuple[bool, str]:
    try:
        import torch
        from torch.cuda import green_contexts
    except ImportError:
        return False, "this PyTorch has no torch.cuda.green_contexts (PyTorch >= 2.10 with CUDA 12.8+ is needed)"
    if not getattr(green_contexts, "SUPPORTED", False):
        return False, (f"this PyTorch ({torch.__version__}) was built without green-context support "
                       "(a CUDA 12.8+ build of PyTorch >= 2.10 is needed)")
    return True, ""


def _board(gpu: Gpu) -> dict[str, Any]:
    return {"gpu_uuid": gpu.uuid, "gpu_serial": gpu.serial, "pci_bus_id": gpu.pci_bus_id}


def _full_target(gpu: Gpu, chosen_by: str) -> Target:
    model = lookup_model(gpu.name, gpu.memory_mib)
    return Target(kind="full", profile=FULL, chosen_by=chosen_by, gpu_name=gpu.name, uuid=gpu.uuid,
                  gpu_index=gpu.index, sms=model.sms if model else None, memory_bytes=gpu.memory_mib * 2**20,
                  compute_capability=gpu.compute_capability, board=_board(gpu))


def _mig_target(gpu: Gpu, inst: MigInstance, chosen_by: str) -> Target:
    specs = gpu_profiles(gpu)
    spec = _find_spec(specs, inst.profile)
    return Target(kind="mig", profile=inst.profile, chosen_by=chosen_by, gpu_name=gpu.name, uuid=inst.uuid,
                  gpu_index=gpu.index, sms=inst.sms or (spec.sms if spec else None),
                  memory_bytes=(inst.memory_mb * 2**20) if inst.memory_mb else (spec.memory_bytes if spec else None),
                  spec=spec, compute_capability=gpu.compute_capability, board=_board(gpu),
                  instance={"mig_index": inst.mig_index, "gpu_instance_id": inst.gpu_instance_id,
                            "compute_instance_id": inst.compute_instance_id})


def _emulated_target(gpu: Gpu, spec: ProfileSpec, chosen_by: str) -> Target:
    return Target(kind="emulated", profile=spec.name, chosen_by=chosen_by, gpu_name=gpu.name, uuid=gpu.uuid,
                  gpu_index=gpu.index, sms=spec.sms, memory_bytes=spec.memory_bytes, spec=spec,
                  compute_capability=gpu.compute_capability, board=_board(gpu))


def plan_run(opts: Options, inv: Inventory, env: Mapping[str, str]) -> Plan:
    """Choose the Target(s) of a run.  Raises SelectionError for every user mistake.

    A refusal also names what NVML could not read (a lost GPU may be the one that held the slices
    or the index asked for) and any pending MIG mode change (a reset is due before it applies);
    a whole GPU that other processes are using is warned about in the header, as a slice is.
    """
    try:
        plan = _plan_run(opts, inv, env)
    except SelectionError as exc:
        extra = [f"NVML could not read {p} (a lost GPU needs a reset by an administrator)" for p in inv.problems]
        extra += [f"GPU {g.index} has a pending MIG mode change: {g.state_words()}" for g in inv.gpus
                  if g.mig_pending is not None]
        if not extra:
            raise
        raise SelectionError(f"{str(exc).rstrip('.')}. Also: {'; '.join(extra)}.") from None
    for t in plan.targets:
        gpu = next((g for g in inv.gpus if g.index == t.gpu_index), None)
        if t.kind == FULL and gpu is not None and gpu.busy_pids:
            line = (f"GPU {gpu.index} is in use by pid {', '.join(map(str, gpu.busy_pids))}: its figures may be "
                    f"disturbed")
            if line not in plan.header:
                plan.header.append(line)
    return plan


def _plan_run(opts: Options, inv: Inventory, env: Mapping[str, str]) -> Plan:
    profile = opts.profile.strip() if opts.profile else None
    if profile and profile.lower() not in (FULL, ALL):
        try:
            parse_profile(profile)
        except ProfileError as exc:
            here = f"; the profiles here: {_machine_profiles(inv.gpus)}" if inv.gpus else ""
            raise SelectionError(f"{exc}{here}.") from None
    if profile and profile.lower() == ALL and not opts.emulate:
        raise SelectionError("--mig-profile all sweeps every profile of the GPU in one process, which only "
                             "emulation can do: add --mig-emulate (on a MIG GPU, run one job per slice instead).")

    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip().lower() in _HIDDEN:
        return _cpu_plan(f"CUDA_VISIBLE_DEVICES={quoted(cvd, SHOWN)} hides every GPU", opts)
    visible = cuda_visible(cvd) or []
    if cvd is not None and not visible:
        raise SelectionError(f"CUDA_VISIBLE_DEVICES={quoted(cvd, SHOWN)} shows CUDA no device: CUDA reads indices and exact "
                             f"GPU-/MIG- UUIDs separated by commas, with no spaces around a UUID, stops at the first "
                             f"entry it cannot read and hides everything when an index is named twice.")
    if inv.error:
        return _cpu_plan(inv.error, opts)
    if not inv.gpus:
        return _cpu_plan("NVML found no NVIDIA GPU on this machine", opts)

    # The device the scheduler or the user named, if any.
    named: tuple[Gpu, MigInstance | None] | None = None
    chosen_by = "plugin"
    if visible:
        named = _resolve_visible(visible[0], inv)
        if named is None:
            raise SelectionError(f"CUDA_VISIBLE_DEVICES={shown(cvd)} names no GPU or MIG instance on this machine "
                                 f"(NVML sees: {'; '.join(_gpu_words(g) + ': ' + (_instances_words(g) if g.mig_enabled else 'MIG off') for g in inv.gpus)}).")
        chosen_by = "scheduler (CUDA_VISIBLE_DEVICES)"
    if opts.device:
        by_option = _resolve_visible(opts.device.strip(), inv)
        if by_option is None:
            known = [i.uuid for i in inv.instances] + [f"{g.index} ({g.uuid})" for g in inv.gpus]
            raise SelectionError(f"--mig-device {shown(opts.device)} is not a GPU or MIG instance on this machine; "
                                 f"known: {', '.join(known)}.")
        narrows = named is not None and named[1] is None and by_option[1] is not None and by_option[0] == named[0]
        if named is not None and by_option != named and not narrows:
            raise SelectionError(f"--mig-device {shown(opts.device)} is not the device this job was given "
                                 f"(CUDA_VISIBLE_DEVICES={shown(cvd)}).")
        named, chosen_by = by_option, "--mig-device"
        if narrows:  # the job has the whole GPU; pin the instance of it the user named
            visible = []
    pin = None if visible else (named[1].uuid if named and named[1] else (named[0].uuid if named else None))
    header = [f"NVML could not read {problem}; that GPU is left out" for problem in inv.problems]
    if len(visible) > 1 and named is not None:
        header.append(f"CUDA_VISIBLE_DEVICES={shown(cvd)} shows {len(visible)} devices; a benchmark measures only "
                      f"the first, {printable(visible[0])}")
    if named is not None and named[1] is not None and named[1].busy_pids:
        header.append(f"{named[1].uuid} is in use by pid {', '.join(map(str, named[1].busy_pids))}: "
                      "its figures may be disturbed")

    def finish(targets: list[Target], pin_value: str | None) -> Plan:
        return Plan(targets, pin_value, header)

    # 1. No profile asked: measure what we were given.
    if profile is None:
        if opts.emulate:
            gpus = [named[0]] if named is not None else list(inv.gpus)
            raise SelectionError("--mig-emulate needs the profile to emulate: add --mig-profile P or --mig-profile "
                                 f"all (the profiles here: {_machine_profiles(gpus)}).")
        if named is not None:
            gpu, inst = named
            if inst is not None:
                return finish([_mig_target(gpu, inst, chosen_by)], pin)
            if gpu.mig_enabled:
                free = [i for i in gpu.instances if i.free]
                if not free:
                    raise SelectionError(f"{_gpu_words(gpu)} has MIG mode on and no free instance; "
                                         "pick one with --mig-profile or --mig-device.")
                return finish([_mig_target(gpu, free[0], "plugin (first free instance)")], free[0].uuid)
            return finish([_full_target(gpu, chosen_by)], pin)
        for gpu in inv.gpus:  # the first GPU with MIG off, or the first free slice
            if not gpu.mig_enabled:
                return finish([_full_target(gpu, "plugin")], gpu.uuid)
            free = [i for i in gpu.instances if i.free]
            if free:
                return finish([_mig_target(gpu, free[0], "plugin (first free instance)")], free[0].uuid)
        raise SelectionError("every GPU here has MIG mode on and no free instance ("
                             + "; ".join(f"{_gpu_words(g)}: {_instances_words(g)}" for g in inv.gpus)
                             + "); pick one with --mig-device to share it, or wait for a free one.")

    # 2. A whole GPU.
    if profile.lower() == FULL:
        if named is not None:
            gpu, inst = named
            if inst is not None:
                raise SelectionError(f"--mig-profile full asks for a whole GPU, but the device given is {inst.uuid}, "
                                     f"a {inst.profile} MIG instance.")
            if gpu.mig_enabled:
                raise SelectionError(f"--mig-profile full needs a GPU with MIG mode off, but {_gpu_words(gpu)} has "
                                     f"MIG on ({_instances_words(gpu)}); pick one of its profiles instead.")
            return finish([_full_target(gpu, chosen_by)], pin)
        gpu = next((g for g in inv.gpus if not g.mig_enabled), None)
        if gpu is None:
            raise SelectionError("--mig-profile full needs a GPU with MIG mode off, but every GPU here has MIG on: "
                                 + "; ".join(f"{_gpu_words(g)}: {_instances_words(g)}" for g in inv.gpus) + ".")
        return finish([_full_target(gpu, "plugin")], gpu.uuid)

    # 3. Emulation: one profile or the whole ladder, on a GPU whose MIG is off.
    if opts.emulate:
        gpu = named[0] if named is not None else next((g for g in inv.gpus if not g.mig_enabled), inv.gpus[0])
        if named is not None and named[1] is not None or gpu.mig_enabled:
            raise SelectionError(f"--mig-emulate approximates a profile on a GPU with MIG mode off, but "
                                 f"{_gpu_words(gpu)} has MIG on: drop --mig-emulate and run on a real instance.")
        ok, why = _green_contexts_supported()
        if not ok:
            raise SelectionError(f"--mig-emulate needs CUDA green contexts, but {why}.")
        specs = gpu_profiles(gpu)
        if profile.lower() == ALL:
            targets = [_emulated_target(gpu, s, "emulation") for s in ladder(specs)]
            if not targets:
                raise _no_such_profile(gpu, ALL, specs)
        else:
            spec = _spec_for_compute_instance(specs, profile)
            if spec is None:
                raise _no_such_profile(gpu, profile, specs)
            targets = [_emulated_target(gpu, spec, "emulation")]
            asked = parse_profile(profile)
            if asked.is_compute_instance:
                header.append(f"{spec.name} is emulated with the SMs of a {asked.compute_slices}-slice profile "
                              f"({spec.sms}) and the memory of {asked.gi_name}: an approximation of a compute instance")
        return finish(targets, pin if named is not None else gpu.uuid)

    # 4. A real MIG slice of the profile asked.
    candidates = [named[0]] if named is not None else list(inv.gpus)
    gi_name = parse_profile(profile).gi_name
    having = [g for g in candidates if _find_spec(gpu_profiles(g), gi_name) is not None]
    if not having:
        if len(candidates) == 1:
            raise _no_such_profile(candidates[0], profile, gpu_profiles(candidates[0]))
        raise SelectionError(f"no GPU here has profile {profile}; the profiles here: {_machine_profiles(candidates)}.")
    mig_gpus = [g for g in having if g.mig_enabled]
    if not mig_gpus:
        gpu = having[0]
        raise SelectionError(f"{_gpu_words(gpu)} has MIG mode disabled, so there is no {profile} slice to pin; "
                             f"its profiles are {_names(gpu_profiles(gpu))}. Use --mig-emulate to approximate "
                             f"{profile} with a green context, or --mig-profile full for the whole GPU.")
    if named is not None and named[1] is not None:
        gpu, inst = named
        if inst.profile.lower() != profile.lower():
            raise SelectionError(f"{'CUDA_VISIBLE_DEVICES' if visible else '--mig-device'} names {inst.uuid}, a "
                                 f"{inst.profile} instance, but --mig-profile asks for {profile}.")
        return finish([_mig_target(gpu, inst, chosen_by)], pin)
    matching = [(g, i) for g in mig_gpus for i in g.instances if i.profile.lower() == profile.lower()]
    if not matching:
        raise SelectionError(f"no {profile} instance exists: "
                             + "; ".join(f"{_gpu_words(g)} has {_instances_words(g)}" for g in mig_gpus)
                             + ". An administrator must create one (nvidia-smi mig -cgi).")
    free = [(g, i) for g, i in matching if i.free]
    if not free:
        busy = ", ".join(f"{i.uuid} (pids {', '.join(map(str, i.busy_pids))})" for _, i in matching)
        raise SelectionError(f"every {profile} instance is busy: {busy}; wait for one to be free, or name one "
                             "with --mig-device to share it.")
    gpu, inst = free[0]
    return finish([_mig_target(gpu, inst, "plugin (free instance)")], inst.uuid)


# --------------------------------------------------------------------------- pinning and verifying


def cuda_initialized() -> bool:
    """Whether this process already started CUDA (then CUDA_VISIBLE_DEVICES can no longer pin it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def pin(plan: Plan, environ: "os._Environ[str] | dict[str, str]") -> None:
    """Set CUDA_VISIBLE_DEVICES before CUDA starts; refuse if CUDA started already on another device."""
    if plan.pin is None:
        return
    if cuda_initialized() and environ.get("CUDA_VISIBLE_DEVICES") != plan.pin:
        raise SelectionError(f"CUDA was initialised in this process before pytest-mig could pin {plan.pin}: "
                             "something (a conftest, a plugin) touched the GPU at import time; move that code "
                             "into a fixture or set CUDA_VISIBLE_DEVICES yourself.")
    environ["CUDA_VISIBLE_DEVICES"] = plan.pin


@dataclass(frozen=True)
class CudaProps:
    """What CUDA reports for device 0 of this process."""

    name: str
    sms: int
    total_memory: int
    capability: tuple[int, int]


def cuda_props() -> CudaProps | None:
    """Start CUDA on the pinned device and read it; None when this torch has no CUDA device."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(0)
    return CudaProps(p.name, int(p.multi_processor_count), int(p.total_memory), (int(p.major), int(p.minor)))


class VerificationError(SelectionError):
    """The device CUDA gave is not the one asked for."""


def verify(target: Target, props: CudaProps | None) -> Target:
    """Check SMs and memory as CUDA sees them against the Target; returns the Target with the outcome.

    MIG: SMs must match exactly and memory within 10%.  Whole GPU: SMs match the catalog's count.
    Emulated: CUDA sees the whole GPU; the SMs really obtained are read back by the emulator.
    """
    if target.is_cpu:
        return replace(target, verified="CPU run: nothing to verify")
    if props is None:
        raise VerificationError(f"NVML sees {target.gpu_name} but this PyTorch cannot use CUDA (is it a CPU-only "
                                "build?): install a CUDA build of torch, or hide the GPU with CUDA_VISIBLE_DEVICES=''.")
    t = replace(target, compute_capability=props.capability)
    if target.kind == "emulated":
        return replace(t, verified=f"CUDA sees the whole GPU ({props.sms} SMs); the green context limits it")
    problems = []
    if t.sms and props.sms != t.sms:
        problems.append(f"{props.sms} SMs where {t.profile} has {t.sms}")
    if t.memory_bytes and not (0.85 * t.memory_bytes <= props.total_memory <= 1.1 * t.memory_bytes):
        problems.append(f"{props.total_memory / 2**30:.1f} GiB where {t.profile} has {t.memory_bytes / 2**30:.1f} GiB")
    if target.kind == "mig" and " MIG " in props.name:
        cuda_profile = props.name.rsplit(" MIG ", 1)[1].strip()
        if cuda_profile.lower() != target.profile.lower():
            problems.append(f"CUDA names it '{props.name}'")
    if problems:
        raise VerificationError(f"the device CUDA gave is not the {t.profile} asked for: {'; '.join(problems)}.")
    return replace(t, sms_obtained=props.sms, memory_bytes=min(t.memory_bytes or props.total_memory, props.total_memory),
                   verified=f"ok: CUDA sees {props.sms} SMs and {props.total_memory / 2**30:.1f} GiB")
