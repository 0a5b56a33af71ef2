"""Choosing the Target(s) of a run from the options, the environment and the NVML inventory.

The options name a profile (or ``full``, or ``all`` under emulation) and perhaps a device; the
environment carries the CUDA_VISIBLE_DEVICES a scheduler (Slurm, Kubernetes) set; the inventory is
what NVML sees.  :func:`plan_run` turns them into a :class:`Plan`: the Target(s), what pins them
and the header's lines.  A user's mistake is a :class:`~pytest_mig.device.target.SelectionError`
with one sentence; the plugin turns it into ``pytest.UsageError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping

from pytest_mig.common.text import SHOWN, printable, quoted, shown
from pytest_mig.device.nvml import Gpu, Inventory, MigInstance, cuda_visible
from pytest_mig.device.profiles import ALL, CPU, FULL, ProfileError, ProfileSpec, ladder, lookup_model, parse_profile
from pytest_mig.device.target import SelectionError, Target

_HIDDEN = {"", "-1", "none", "nodevfiles", "void"}


@dataclass(frozen=True)
class Options:
    """The run's choices, from the command line / ini (see plugin.py)."""

    profile: str | None = None
    device: str | None = None
    emulate: bool = False
    require_gpu: bool = False
    by_mps: bool = False  # a layout's emulated slice: CUDA MPS confines the process, no green context


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


_Named = tuple[Gpu, MigInstance | None]


@dataclass
class _Given:
    """The device the scheduler or the user named, how it was chosen, what pins it and the header so far."""

    named: _Named | None
    chosen_by: str
    visible: list[str]
    pin: str | None
    header: list[str]

    def finish(self, targets: list[Target], pin_value: str | None) -> Plan:
        return Plan(targets, pin_value, self.header)


def _plan_run(opts: Options, inv: Inventory, env: Mapping[str, str]) -> Plan:
    profile = _checked_profile(opts, inv)
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
    given = _given_device(opts, inv, cvd, visible)
    if profile is None:
        return _plan_no_profile(opts, inv, given)
    if profile.lower() == FULL:
        return _plan_full(inv, given)
    if opts.emulate:
        return _plan_emulated(profile, inv, given, opts)
    return _plan_mig(profile, inv, given)


def _checked_profile(opts: Options, inv: Inventory) -> str | None:
    """The profile asked for, stripped; refuses one that does not parse, and 'all' without emulation."""
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
    return profile


def _named_by_scheduler(visible: list[str], inv: Inventory, cvd: str | None) -> _Named | None:
    """The device CUDA_VISIBLE_DEVICES names first, if it names any."""
    if not visible:
        return None
    named = _resolve_visible(visible[0], inv)
    if named is None:
        raise SelectionError(f"CUDA_VISIBLE_DEVICES={shown(cvd)} names no GPU or MIG instance on this machine "
                             f"(NVML sees: {'; '.join(_gpu_words(g) + ': ' + (_instances_words(g) if g.mig_enabled else 'MIG off') for g in inv.gpus)}).")
    return named


def _given_device(opts: Options, inv: Inventory, cvd: str | None, visible: list[str]) -> _Given:
    """The device the scheduler or the user named, if any, what pins it and the header's warnings."""
    named = _named_by_scheduler(visible, inv, cvd)
    chosen_by = "plugin" if named is None else "scheduler (CUDA_VISIBLE_DEVICES)"
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
    return _Given(named, chosen_by, visible, pin, header)


def _plan_no_profile(opts: Options, inv: Inventory, given: _Given) -> Plan:
    """No profile asked: measure what we were given, else the first GPU with MIG off or the first free slice."""
    named = given.named
    if opts.emulate:
        gpus = [named[0]] if named is not None else list(inv.gpus)
        raise SelectionError("--mig-emulate needs the profile to emulate: add --mig-profile P or --mig-profile "
                             f"all (the profiles here: {_machine_profiles(gpus)}).")
    if named is not None:
        gpu, inst = named
        if inst is not None:
            return given.finish([_mig_target(gpu, inst, given.chosen_by)], given.pin)
        if gpu.mig_enabled:
            free = [i for i in gpu.instances if i.free]
            if not free:
                raise SelectionError(f"{_gpu_words(gpu)} has MIG mode on and no free instance; "
                                     "pick one with --mig-profile or --mig-device.")
            return given.finish([_mig_target(gpu, free[0], "plugin (first free instance)")], free[0].uuid)
        return given.finish([_full_target(gpu, given.chosen_by)], given.pin)
    for gpu in inv.gpus:  # the first GPU with MIG off, or the first free slice
        if not gpu.mig_enabled:
            return given.finish([_full_target(gpu, "plugin")], gpu.uuid)
        free = [i for i in gpu.instances if i.free]
        if free:
            return given.finish([_mig_target(gpu, free[0], "plugin (first free instance)")], free[0].uuid)
    raise SelectionError("every GPU here has MIG mode on and no free instance ("
                         + "; ".join(f"{_gpu_words(g)}: {_instances_words(g)}" for g in inv.gpus)
                         + "); pick one with --mig-device to share it, or wait for a free one.")


def _plan_full(inv: Inventory, given: _Given) -> Plan:
    """--mig-profile full: a whole GPU, with MIG mode off."""
    if given.named is not None:
        gpu, inst = given.named
        if inst is not None:
            raise SelectionError(f"--mig-profile full asks for a whole GPU, but the device given is {inst.uuid}, "
                                 f"a {inst.profile} MIG instance.")
        if gpu.mig_enabled:
            raise SelectionError(f"--mig-profile full needs a GPU with MIG mode off, but {_gpu_words(gpu)} has "
                                 f"MIG on ({_instances_words(gpu)}); pick one of its profiles instead.")
        return given.finish([_full_target(gpu, given.chosen_by)], given.pin)
    gpu = next((g for g in inv.gpus if not g.mig_enabled), None)
    if gpu is None:
        raise SelectionError("--mig-profile full needs a GPU with MIG mode off, but every GPU here has MIG on: "
                             + "; ".join(f"{_gpu_words(g)}: {_instances_words(g)}" for g in inv.gpus) + ".")
    return given.finish([_full_target(gpu, "plugin")], gpu.uuid)


def _plan_emulated(profile: str, inv: Inventory, given: _Given, opts: Options) -> Plan:
    """Emulation: one profile or the whole ladder, on a GPU whose MIG is off."""
    named = given.named
    gpu = named[0] if named is not None else next((g for g in inv.gpus if not g.mig_enabled), inv.gpus[0])
    if named is not None and named[1] is not None or gpu.mig_enabled:
        raise SelectionError(f"--mig-emulate approximates a profile on a GPU with MIG mode off, but "
                             f"{_gpu_words(gpu)} has MIG on: drop --mig-emulate and run on a real instance.")
    ok, why = (True, "") if opts.by_mps else _green_contexts_supported()
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
            given.header.append(f"{spec.name} is emulated with the SMs of a {asked.compute_slices}-slice profile "
                                f"({spec.sms}) and the memory of {asked.gi_name}: an approximation of a compute instance")
    return given.finish(targets, given.pin if named is not None else gpu.uuid)


def _mig_gpus_having(profile: str, inv: Inventory, given: _Given) -> list[Gpu]:
    """The GPUs in question whose MIG mode is on and whose model has the profile; refuses when none is."""
    candidates = [given.named[0]] if given.named is not None else list(inv.gpus)
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
    return mig_gpus


def _plan_mig(profile: str, inv: Inventory, given: _Given) -> Plan:
    """A real MIG slice of the profile asked: the one named, else the first free one."""
    mig_gpus = _mig_gpus_having(profile, inv, given)
    if given.named is not None and given.named[1] is not None:
        gpu, inst = given.named
        if inst.profile.lower() != profile.lower():
            raise SelectionError(f"{'CUDA_VISIBLE_DEVICES' if given.visible else '--mig-device'} names {inst.uuid}, a "
                                 f"{inst.profile} instance, but --mig-profile asks for {profile}.")
        return given.finish([_mig_target(gpu, inst, given.chosen_by)], given.pin)
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
    return given.finish([_mig_target(gpu, inst, "plugin (free instance)")], inst.uuid)
