"""The first night on any GPU: compute and bandwidth figures against the device's own ceiling.

A figure with no history of its own that no reference holds (a GPU model or profile the shipped
references do not cover, or ``--mig-reference none``) is judged by :class:`Ceilings`, the step of
:class:`pytest_mig.judge.pipeline.Pipeline` after the reference, against:

* the device's **ceiling** for the figure, from what NVML and CUDA report and the architecture's
  per-SM rates (:mod:`pytest_mig.device.architectures`): a TFLOPS figure's is SMs x max SM clock x
  FLOP per SM per clock of its precision on its unit (CUDA cores for the FMA chain and the fp32
  GEMM, tensor cores for the others, FP64 tensor cores where the GPU has them); a FLOP per SM per
  cycle figure's is the rate itself (its own clock is the one measured); a memory-bandwidth
  figure's is max memory clock x 2 transfers per clock x bus width, times a real MIG slice's share
  of the memory slices (an emulated profile shares the whole memory); a host-bandwidth figure's is
  the PCIe link's maximum generation and width, per direction (both, for the bidirectional one);
* its **expected fraction** of that ceiling: the least any run of the shipped H100 and H200
  references reached, computed from those files and their fingerprints (:class:`Expectations`), on
  the targets most like this one: those whose share of their GPU's SMs is nearest to this target's
  from below and from above (power, hence clock, follows the share: a whole H100 or H200 runs its
  bf16 GEMM at 64-67% of its max-clock ceiling, a 16-SM slice at 89-93%); for memory bandwidth on a
  whole GPU or a real slice, whole GPUs; on an emulated profile, its own GPU model's (a green
  context's bandwidth follows its SMs' load rate, not the memory); for host copies, every target.
  A figure no reference holds takes the fraction of the rate timed over a longer window of the same
  work (a GEMM headline: its sustained rate), else that of its other precisions;
* its **floor**, :data:`MARGIN` times the expected fraction.  Below it the figure fails, as a DCGM
  diagnostic fails a GPU below its SKU's floor: the H100 and H200 differ by up to about 10% in the
  fractions they reach, so a healthy board of another model clears the floor, and one at 75% of its
  expected fraction fails.  A figure above :data:`ABOVE` of its ceiling is not judged: the ceiling's
  inputs do not describe the device.

The verdict (``source`` "ceiling") names the ceiling and how it was computed, the floor and the
references it came from, and that the device's ceiling judged it.  Nothing else is judged this
way: figures of other kinds (training, simulation, energy, cost) wait for the site's own history; a
CPU run has no ceiling; an architecture not in the table, a rate NVIDIA does not publish, or a
figure no reference measured has none (its no-baseline verdict says why); and host bandwidth on a
real MIG slice is bound by the slice's copy engines, which no reference measured.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pytest_mig.device.architectures import DATA, Architecture, architecture_for, model_facts, transfers_per_clock
from pytest_mig.device.health import link_gbs
from pytest_mig.device.profiles import GpuModel, ProfileError, lookup_model, parse_profile
from pytest_mig.judge.reference import SHIPPED, Reference, ReferenceStore
from pytest_mig.judge.verdict import Verdict, format_number, make_verdict, value_text
from pytest_mig.measure.metric import timing_partners
from pytest_mig.store.baselines import BaselineMeta, EntryKey, throttle_reasons
from pytest_mig.store.results import ResultRecord

#: The floor is this fraction of the expected fraction of the ceiling.
MARGIN = 0.85
#: A figure above this fraction of its ceiling is not judged: the ceiling does not describe the device.
ABOVE = 1.05
#: Shares of a GPU's SMs closer than this are the same share.
SHARE_SLACK = 0.02

#: Figures that have a ceiling, by name: (pattern, rule); the first group of each pattern is the
#: precision or direction.  "cuda": the FMA chain on the CUDA cores; "gemm": torch.matmul;
#: "per-cycle": a GEMM's FLOP per SM per clock; "memory": STREAM and the device copy; "host": PCIe.
RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(fp64|fp32|fp16|bf16)_fma_tflops"), "cuda"),
    (re.compile(r"(bf16|fp16|tf32|fp8|fp32|fp64)_(?:sustained_)?tflops"), "gemm"),
    (re.compile(r"(bf16|fp16|tf32|fp8|fp32|fp64)_flop_per_sm_cycle"), "per-cycle"),
    (re.compile(r"(fp32|fp64)_(?:copy|mul|add|triad|dot|d2d_copy)_gbs"), "memory"),
    (re.compile(r"(h2d|d2h|bidir)_gbs"), "host"),
)
#: The unit each rule's figures are in (a figure in another unit is not the one the rule means).
RULE_UNITS = {"cuda": "TFLOPS", "gemm": "TFLOPS", "per-cycle": "FLOP/SM/cycle", "memory": "GB/s", "host": "GB/s"}
#: The rate a GEMM precision runs at, first one the architecture has: tensor cores, the CUDA cores for
#: fp32 with TF32 off, FP64 tensor cores where the GPU has them (A100, H100, B200) else the CUDA cores.
GEMM_RATES: dict[str, tuple[tuple[str, str], ...]] = {
    "bf16": (("tensor", "bf16"),), "fp16": (("tensor", "fp16"),), "tf32": (("tensor", "tf32"),),
    "fp8": (("tensor", "fp8"),), "fp32": (("cuda", "fp32"),), "fp64": (("tensor", "fp64"), ("cuda", "fp64")),
}


def rule_of(metric: str, unit: str, direction: str = "higher") -> tuple[str, str] | None:
    """(rule, precision or direction) of a figure that has a ceiling; None for any other figure."""
    if direction != "higher":
        return None
    for pattern, rule in RULES:
        m = pattern.fullmatch(metric)
        if m and RULE_UNITS[rule] == unit:
            return rule, m.group(1)
    return None


@dataclass(frozen=True)
class Device:
    """What a ceiling is computed from: the target, its clocks and bus as NVML reported them."""

    gpu_name: str
    kind: str  # "full", "mig" or "emulated"
    profile: str
    sms: int | None  # the target's (obtained, for an emulated profile)
    gpu_sms: int | None  # the whole GPU's
    sm_mhz: float | None  # max SM clock
    mem_mhz: float | None  # max memory clock
    bus_bits: int | None
    arch: Architecture | None
    capability: str | None  # as reported, for the verdict that cannot find it
    memory_fraction: float | None = None  # a real MIG slice's share of the memory slices
    host_link: tuple[int, int] | None = None  # (max PCIe generation, max lanes)

    @property
    def share(self) -> float | None:
        """The target's share of its GPU's SMs (1 for a whole GPU)."""
        if self.kind == "full":
            return 1.0
        return self.sms / self.gpu_sms if self.sms and self.gpu_sms else None


@dataclass(frozen=True)
class Ceiling:
    """A figure's ceiling on a device, and how it was computed."""

    value: float
    unit: str
    how: str  # "132 SMs x 1980 MHz x 4096 FLOP per SM per clock (bf16 tensor, Hopper)"
    rule: str


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _count(value: Any) -> int | None:
    n = _number(value)
    return int(n) if n is not None else None


def _memory_fraction(model: GpuModel | None, profile: str) -> float | None:
    try:
        spec = model.profile(parse_profile(profile).gi_name) if model is not None else None
    except ProfileError:
        return None
    return float(spec.memory_fraction) if spec is not None else None


def _link(info: Any, health: Any) -> tuple[int, int] | None:
    """The PCIe link's maximum (generation, lanes): read under load by the copy test, else by the
    health reading before the test."""
    link = info.get("link_under_load") if isinstance(info, Mapping) else None
    if not isinstance(link, Mapping):
        before = health.get("before") if isinstance(health, Mapping) else None
        link = before.get("pcie") if isinstance(before, Mapping) else None
    gen, width = (_count(link.get("max_gen")), _count(link.get("max_width"))) if isinstance(link, Mapping) else (None, None)
    return (gen, width) if gen and width else None


def device_of(target: Mapping[str, Any], fingerprint: Mapping[str, Any] | None, info: Any = None,
              health: Any = None) -> Device | None:
    """The device a target (a record's ``target``, or ``Target.to_dict()``) ran on; None on the CPU."""
    if target.get("kind") == "cpu" or not target.get("gpu_name"):
        return None
    fp = fingerprint or {}
    name = str(target["gpu_name"])
    model = lookup_model(name, _number(fp.get("memory_total_mib")))
    facts = model_facts(name)
    kind = "emulated" if target.get("emulated") or target.get("kind") == "emulated" else str(target.get("kind") or "full")
    profile = str(target.get("profile") or "")
    sms = _count(target.get("sms_obtained")) or _count(target.get("sms"))
    gpu_sms = model.sms if model is not None else (sms if kind == "full" else None)
    bus = _count(fp.get("memory_bus_width_bits")) or (facts.memory_bus_bits if facts else None)
    capability = fp.get("compute_capability")
    return Device(name, kind, profile, sms, gpu_sms, _number(fp.get("max_sm_clock_mhz")),
                  _number(fp.get("max_mem_clock_mhz")), bus, architecture_for(capability, name),
                  str(capability) if capability else None,
                  _memory_fraction(model, profile) if kind == "mig" else None, _link(info, health))


def device_of_record(rec: ResultRecord) -> Device | None:
    return device_of(rec.target.to_dict(), rec.fingerprint, rec.metric.info, rec.health)


# -- ceilings --------------------------------------------------------------------------------------


def ceiling(device: Device, metric: str, unit: str, direction: str = "higher") -> Ceiling | str | None:
    """The figure's ceiling on ``device``; why it has none (a sentence); None: not a figure with one."""
    found = rule_of(metric, unit, direction)
    if found is None:
        return None
    rule, which = found
    if rule == "memory":
        return _memory_ceiling(device)
    if rule == "host":
        return _host_ceiling(device, which)
    return _compute_ceiling(device, rule, which)


def _compute_ceiling(device: Device, rule: str, precision: str) -> Ceiling | str:
    arch = device.arch
    if arch is None:
        cc = f"compute capability {device.capability}" if device.capability else f"the {device.gpu_name}"
        return f"{cc} is not in the architecture table ({DATA.name}), so its per-SM rates are unknown"
    if arch.no_ceiling:
        return f"{device.gpu_name}: {arch.no_ceiling}"
    choices = GEMM_RATES[precision] if rule in ("gemm", "per-cycle") else (("cuda", precision),)
    unit, rate = next(((u, arch.rate(u, p)) for u, p in choices if arch.rate(u, p)), (choices[0][0], None))
    where = "tensor" if unit == "tensor" else "CUDA-core"
    if rate is None:
        return f"NVIDIA publishes no {precision} {where} rate for {arch.name} ({DATA.name})"
    label = f"{precision} {where}, {arch.name}"
    if rule == "per-cycle":
        return Ceiling(float(rate), "FLOP/SM/cycle", f"{rate} FLOP per SM per clock: {label}", rule)
    if not device.sms or not device.sm_mhz:
        return "NVML or CUDA reported no SM count or no maximum SM clock"
    value = device.sms * device.sm_mhz * 1e6 * rate / 1e12
    how = f"{device.sms} SMs x {device.sm_mhz:.0f} MHz x {rate} FLOP per SM per clock: {label}"
    return Ceiling(value, "TFLOPS", how, rule)


def _memory_ceiling(device: Device) -> Ceiling | str:
    if not device.mem_mhz or not device.bus_bits:
        return "NVML reported no maximum memory clock or no memory bus width"
    per_clock = transfers_per_clock()
    value = device.mem_mhz * 1e6 * per_clock * device.bus_bits / 8 / 1e9
    how = f"{device.mem_mhz:.0f} MHz x {per_clock} transfers x {device.bus_bits}-bit bus"
    if device.kind == "mig":
        if device.memory_fraction is None:
            return f"the share of memory slices of profile {device.profile} on the {device.gpu_name} is not known"
        value *= device.memory_fraction
        how += f" x {device.memory_fraction:g} of the memory slices ({device.profile})"
    elif device.kind == "emulated":
        how += ", the whole GPU's (emulation does not partition memory)"
    return Ceiling(value, "GB/s", how, "memory")


def _host_ceiling(device: Device, direction: str) -> Ceiling | str:
    if device.kind == "mig":
        return ("a real MIG slice's host copies are bound by its copy engines, not by the link, and no reference "
                "measured one")
    if device.host_link is None:
        return "the PCIe link's generation and width were not read"
    gen, width = device.host_link
    per = link_gbs(gen, width)
    if per is None:
        return f"PCIe Gen{gen} x{width} has no known rate"
    both = direction == "bidir"
    how = f"PCIe Gen{gen} x{width}: {per:.1f} GB/s per direction" + (", both directions" if both else "")
    return Ceiling(per * (2 if both else 1), "GB/s", how, "host")


# -- what the references reached -------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """The fraction of its ceiling one reference (a GPU model and profile) reached for one figure."""

    model: str
    profile: str  # the reference's profile key ("1g.10gb-emulated", "full")
    share: float  # of its GPU's SMs
    fraction: float  # the least any of the reference's runs reached
    runs: int


@dataclass(frozen=True)
class Expected:
    """A figure's expected fraction of its ceiling, and the references it comes from."""

    fraction: float
    points: tuple[Point, ...]
    family: str | None = None  # the other figures it was taken from
    own: bool = True  # whether a reference holds the figure itself


def _reference_device(meta: BaselineMeta, fingerprint: Mapping[str, Any]) -> Device | None:
    """The device a reference's run measured, where its SM count is certain (None otherwise)."""
    model = lookup_model(meta.gpu_model, _number(fingerprint.get("memory_total_mib")))
    if model is None:
        return None
    profile = meta.target_profile
    if profile == "full":
        kind, sms = "full", model.sms
    else:
        try:
            spec = model.profile(parse_profile(profile).gi_name)
        except ProfileError:
            return None
        kind, sms = ("emulated" if meta.emulated else "mig"), (spec.sms if spec is not None else None)
    arch = architecture_for(fingerprint.get("compute_capability"), meta.gpu_model)
    if not sms or (kind == "emulated" and not _certain(sms, model.sms, arch)):
        return None
    facts = model_facts(meta.gpu_model)
    target = {"gpu_name": meta.gpu_model, "kind": kind, "profile": profile, "sms": sms}
    return device_of(target, fingerprint, {"link_under_load": _facts_link(facts)})


def _certain(sms: int, gpu_sms: int, arch: Architecture | None) -> bool:
    """Whether an emulated profile's green context got the SMs its profile names: the whole GPU, or
    a count the driver does not round (a multiple of the architecture's green-context step).  The
    reference files do not record the SMs obtained (26 asked gives 32 on Hopper)."""
    step = arch.green_context_sm_multiple if arch is not None else None
    return sms == gpu_sms or bool(step and sms % step == 0)


def _facts_link(facts: Any) -> dict[str, int] | None:
    return {"max_gen": facts.host_link[0], "max_width": facts.host_link[1]} if facts and facts.host_link else None


def _points_of(ref: Reference) -> dict[EntryKey, Point]:
    """Each figure's fraction of its ceiling on one reference (figures with a ceiling only)."""
    meta = ref.baseline.meta
    devices: dict[str, Device | None] = {}
    out: dict[EntryKey, Point] = {}
    for key, entry in ref.baseline.entries.items():
        if rule_of(entry.metric, entry.unit, entry.direction) is None:
            continue
        fractions, share = [], None
        for run in entry.runs:
            fp_key = repr(sorted(run.fingerprint.items()))
            if fp_key not in devices:
                devices[fp_key] = _reference_device(meta, run.fingerprint)
            device = devices[fp_key]
            c = ceiling(device, entry.metric, entry.unit) if device is not None else None
            if isinstance(c, Ceiling) and c.value > 0 and math.isfinite(run.value):
                fractions.append(run.value / c.value)
                share = device.share if device is not None else None
        if fractions and share:
            out[key] = Point(meta.gpu_model, meta.profile, share, min(fractions), len(fractions))
    return out


def family(key: EntryKey) -> tuple[str, str, str]:
    """A figure's family: its test without parameters, its metric without the precision, its mode
    (``test_cuda_core_fma``, ``fma_tflops``, ``normal``)."""
    test, metric, mode = key
    return re.sub(r"\[.*\]$", "", test), re.sub(r"^(?:fp64|fp32|fp16|bf16|tf32|fp8)_", "", metric), mode


def bracket(points: Sequence[Point], share: float | None) -> list[Point]:
    """The points whose share of their GPU's SMs is nearest to ``share`` from below and from above
    (all of them where the share is unknown)."""
    if share is None:
        return list(points)
    shares = sorted({round(p.share, 3) for p in points})
    below = [s for s in shares if s <= share + SHARE_SLACK]
    above = [s for s in shares if s >= share - SHARE_SLACK]
    pick = {max(below)} if below else set()
    if above:
        pick.add(min(above))
    return [p for p in points if round(p.share, 3) in pick]


class Expectations:
    """Each figure's fractions of its ceiling on a folder of references, computed once, when first needed."""

    def __init__(self, references: ReferenceStore) -> None:
        self.references = references
        self._points: dict[EntryKey, list[Point]] | None = None

    @property
    def points(self) -> dict[EntryKey, list[Point]]:
        if self._points is None:
            points: dict[EntryKey, list[Point]] = {}
            for ref in self.references.references():
                for key, point in _points_of(ref).items():
                    points.setdefault(key, []).append(point)
            self._points = points
        return self._points

    def expected(self, rec: ResultRecord, device: Device, rule: str) -> Expected | str:
        """The figure's expected fraction on this device, or why there is none."""
        key = (rec.test, rec.metric.name, rec.mode)
        own = list(self.points.get(key, ()))
        kin = self._kin(key, rec.metric.kind, bool(own))
        points = own + [p for k in kin for p in self.points[k]]
        if not points:
            return f"no shipped reference measured {rec.metric.name} in {rec.mode} mode, to set its expected fraction"
        if rule == "memory" and device.kind in ("full", "mig"):  # its memory is its own: as a whole GPU's
            points = [p for p in points if p.share >= 1 - SHARE_SLACK] or points
        elif rule == "memory":  # a green context's bandwidth is bound by its SMs' loads: only its own model's
            points = [p for p in points if _same_model(p.model, device.gpu_name)]
            if not points:
                return (f"emulation does not partition memory, so an emulated profile's bandwidth is bound by how fast "
                        f"its SMs load, which differs between GPU models and no table gives; no reference of the "
                        f"{device.gpu_name} measured it")
        chosen = bracket(points, device.share if rule != "host" else None)  # copies: copy engines, not SMs
        used = ", ".join(k[1] for k in kin if any(p in chosen for p in self.points[k])) or None
        return Expected(min(p.fraction for p in chosen), tuple(chosen), used, bool(own))

    def _kin(self, key: EntryKey, kind: str, held: bool) -> list[EntryKey]:
        """The other figures that speak for ``key``: the rate over a longer window of the same work
        (:func:`~pytest_mig.measure.metric.timing_partners`: a GEMM headline's sustained rate, same
        kernel and precision), always, for the shares the figure's own runs do not cover (references
        that dropped a redefined headline from their emulated profiles hold it on whole GPUs only, at
        61-63% of the ceiling where a 16-SM slice reaches about 90%); where no reference holds either,
        and ``key`` itself is not ``held``, its family, its other precisions (a tensor-core headline
        reaches less of its ceiling than the CUDA-core fp32 and fp64 GEMMs of its family: an H200's
        quick fp8 headline 55-56%, where the H100 references' fp32 and fp64 GEMMs reached 71%)."""
        test, metric, mode = key
        same = [k for k in self.points if k[0] == test and k[2] == mode]
        partners = set(timing_partners(metric, kind, ((k[1], kind) for k in same)))
        kin = sorted(k for k in same if k[1] in partners)
        return kin if kin or held else sorted(k for k in self.points if family(k) == family(key) and k != key)


def _same_model(a: str, b: str) -> bool:
    ma, mb = lookup_model(a), lookup_model(b)
    return ma is not None and ma is mb if ma is not None or mb is not None else a == b


# -- the verdict -----------------------------------------------------------------------------------


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f}%" if fraction >= 0.1 else f"{fraction * 100:.2g}%"


def _where(expected: Expected) -> str:
    """'the least the H100 80GB HBM3 and H200 references reached on whole GPUs (full, 7g...)'."""
    models = " and ".join(sorted({p.model.replace("NVIDIA ", "") for p in expected.points}))
    shares = sorted({round(p.share, 2) for p in expected.points})
    on = ("on whole GPUs" if shares[0] >= 1 - SHARE_SLACK else "on every target measured" if len(shares) > 2 else
          "on targets with " + " and ".join(_pct(s) for s in shares) + " of their GPU's SMs")
    text = f"the least the {models} references reached {on}"
    if expected.family:
        text += (f", with the same test's {expected.family} (the same work)" if expected.own else
                 f", from the same test's {expected.family} (no reference holds this figure)")
    return text


class Ceilings:
    """The pipeline's step after the reference: a figure against its device's ceiling.

    ``references`` give the expected fractions (the shipped H100 and H200 ones by default, whatever
    ``--mig-reference`` names: the floors are calibrated on them)."""

    def __init__(self, references: ReferenceStore | None = None, *, margin: float = MARGIN) -> None:
        self.expectations = Expectations(references if references is not None else ReferenceStore(SHIPPED))
        self.margin = margin

    def judge(self, rec: ResultRecord) -> Verdict | str | None:
        """The figure's verdict against its device's ceiling; else why it has none (a sentence, for its
        no-baseline verdict); None on the CPU, where no figure has a ceiling."""
        m = rec.metric
        device = device_of_record(rec)
        if device is None:
            return None
        found = ceiling(device, m.name, m.unit, m.direction)
        if found is None:
            return (f"a {m.kind} figure has no device ceiling: it is judged from the first night after a baseline "
                    f"holds it")
        if isinstance(found, str):
            return f"no device ceiling: {found}"
        expected = self.expectations.expected(rec, device, found.rule)  # type: ignore[arg-type]
        if isinstance(expected, str):
            return f"no device ceiling: {expected}"
        if not math.isfinite(m.value):
            return make_verdict(rec, "incomparable", f"{value_text(rec)} not compared: this run's value is {m.value}",
                                throttled=throttle_reasons(m.info))
        return self._verdict(rec, device, found, expected)  # type: ignore[arg-type]

    def _verdict(self, rec: ResultRecord, device: Device, c: Ceiling, expected: Expected) -> Verdict:
        m = rec.metric
        fraction, floor = m.value / c.value, self.margin * expected.fraction
        head = f"{value_text(rec)}: {_pct(fraction)} of this device's ceiling of {format_number(c.value)} {c.unit} ({c.how})"
        throttled = throttle_reasons(m.info)
        if fraction > ABOVE:
            return make_verdict(rec, "incomparable", f"{head}: above the ceiling, so the SMs, clocks or rates it was "
                                f"computed from do not describe this device; not judged", throttled=throttled,
                                source="ceiling")
        outcome = "regressed" if fraction < floor else "pass"
        baseline = expected.fraction * c.value
        v = make_verdict(rec, outcome, "", baseline=baseline, change_pct=(m.value / baseline - 1) * 100,
                         tolerance=1 - self.margin, threshold=1 - self.margin, detectable=1 - self.margin,
                         runs=sum(p.runs for p in expected.points), gates=True, basis="ceiling", source="ceiling",
                         throttled=throttled, failed=outcome == "regressed")
        where = "no history or reference run of it for" + (" emulated" if device.kind == "emulated" else "")
        v.message = (f"{head}; floor {_pct(floor)} ({self.margin:g} x {_pct(expected.fraction)}, {_where(expected)}): "
                     f"{'below' if outcome == 'regressed' else 'above'} it; judged against the device's ceiling: "
                     f"{where} {device.gpu_name.replace('NVIDIA ', '')} {device.profile} yet, until a saved baseline "
                     f"(--mig-save-baseline) takes over with this GPU's own thresholds")
        if throttled:
            v.message += f"; GPU was throttled during the measurement ({', '.join(throttled)})"
        return v

    def confirm(self, verdict: Verdict, values: Sequence[float]) -> Verdict:
        """A regression re-judged on its re-measurements: it stands only where every one is below the
        floor too; otherwise it was a transient dip (``transient``, which does not fail)."""
        extra = [float(x) for x in values if x is not None and math.isfinite(x)]
        if verdict.outcome != "regressed" or verdict.baseline is None or not extra:
            return verdict
        floor = verdict.baseline * self.margin
        v = Verdict(**{**verdict.to_dict(), "confirmations": extra})
        shown = ", ".join(format_number(x) for x in extra)
        if all(x < floor for x in extra):
            v.message += f"; confirmed: every re-measurement is below the floor too, {shown} {v.unit}"
        else:
            v.outcome, v.failed = "transient", False
            v.message += f"; a transient dip, not a regression: re-measured {shown} {v.unit}, not every one below the floor"
        return v

    def header(self, target: Mapping[str, Any], fingerprint: Mapping[str, Any] | None) -> str | None:
        """What a run's figures without a history or reference are judged against on this target
        (a ``Target.to_dict()``); None on the CPU."""
        device = device_of(target, fingerprint)
        if device is None:
            return None
        probe = _compute_ceiling(device, "gemm", "fp32")
        if isinstance(probe, str):
            return f"figures are reported, not judged (no device ceiling either: {probe})"
        memory = _memory_ceiling(device)
        bandwidth = f", memory {format_number(memory.value)} GB/s" if isinstance(memory, Ceiling) else ""
        arch = device.arch.name if device.arch is not None else "?"
        return (f"compute and bandwidth figures judged against this device's ceiling ({arch}, {device.sms} SMs at up to "
                f"{device.sm_mhz:.0f} MHz{bandwidth}), each with a floor of {self.margin:g} x the fraction of it the "
                f"shipped H100 and H200 references reached; the other figures are reported, not judged")


__all__ = ["ABOVE", "MARGIN", "RULES", "Ceiling", "Ceilings", "Device", "Expectations", "Expected", "Point", "bracket",
           "ceiling", "device_of", "device_of_record", "family", "rule_of"]
