"""Scaling checks: does a metric grow between MIG profiles the way the hardware says it should?

For one metric of one test on one GPU model, measured on several profiles (this run's emulation
sweep, other slice jobs' result files, or stored baselines for the profiles this run did not
measure), the ratio between each pair of adjacent profiles of the ladder is compared with the ideal:

* ``slices`` (the default, as the user asked): 7/3, 3/2, 2/1 by compute slices;
* ``sms``: SM counts (exact on H100/H200, whose 3g has 60 SMs: 7g/3g = 132/60 = 2.2);
* ``memory``: memory slices.  Bandwidth (kind ``memory``) always follows memory slices, and
  emulated bandwidth is left out, since emulation does not partition memory bandwidth.

A ratio short of its ideal because the bigger profile was power- or thermal-throttled while the
smaller was not (an H200 at its 700 W limit with 132 SMs busy, not with 64) is reported as
``power-limited``, not failed, when the ratio is within tolerance of the ideal scaled by the two
SM clocks the measurements ran at (the mean sampled through each one's energy window, else the
clock read right after it; without clocks, when the bigger profile alone was throttled): the
board's power limit is no driver regression.

Emulation partitions SMs but not memory bandwidth: every green context draws on the whole GPU's
HBM, so on an H200 a 64-SM context already reaches the bandwidth of all 132 SMs.  In an emulated
ladder, a training or simulation figure (kinds that mix compute with memory traffic) that falls
short of the SM ratio is reported as ``bandwidth-shared``, not failed, when the bandwidth the two
contexts obtained in the same data (the bandwidth tests' best GB/s per profile) grew clearly less
than their SMs and the figure still grew at least as much as that bandwidth (within tolerance).
Without bandwidth figures for both profiles it is judged on the SMs alone; real slices, which own
their memory slices, never get this allowance.

The ladder holds one profile per compute-slice count (1g, 2g, 3g, 4g, 7g, then the whole GPU): the
smallest-memory one (1g.18gb, not its 1g.35gb or +me variants, which are reported as left out).

An emulated ladder is always judged on the SMs the green contexts really obtained, whatever the
basis: emulation partitions SMs only and the driver rounds them (Hopper: 26 -> 32, 60 -> 64), so on
an H200 an emulated 3g has 64 SMs and 3g/2g is 2.0, not the 1.5 of slices.

Throughput metrics (``direction == "higher"``) give bigger/smaller; times give smaller/bigger, so a
ratio is always the speed-up.  A whole GPU ("full") sits above 7g; MIG off vs 7g is always judged
against the SM ratio (A100: 108/98 = 1.10, the SMs MIG gives up; Hopper: 1.0), on every basis but
memory (bandwidth is not lost).  Real slices and emulated profiles are never mixed in one ladder;
a whole-GPU figure joins both.

Tolerances per kind (:data:`SCALING_TOLERANCE`), checked against published numbers (tests/test_scaling.py):

* compute 10%: CERN's A100 CUDA-core fp16/fp32/fp64 ratios (within 5.1%) and MIG-off vs 7g pass.
* tensor 15%: Wulver's fp16 and TF32 GEMM on A100-80GB pass (2g/1g, 3g/2g, full/3g within 6.4%);
  CERN's tensor-core 7g/3g 1.61 (ideal 2.33, -31%) fails, as CERN themselves flagged it.
* simulation 12%: CERN's simpletrack (worst 7g/3g -7.1%) and Wulver's GROMACS 2g/1g, 3g/2g pass;
  GROMACS full/3g (1.03 for 2.57) fails: that system is too small for a whole A100.
* training 15%: CERN's 4g/2g (1.87) and 2g/1g (1.93) pass; its 7g/3g 1.77-1.82 fails on slices
  (-21.9 to -23.8%) and passes on the memory basis (ideal 2); Wulver's QLoRA full/3g 1.32 fails.
* memory 10% on memory slices (CERN's bandwidth table is exactly 1:2:4:8).
* energy, cost and info metrics are not scaling-checked, nor a metric whose ``info["scaling"]`` is
  False (training at a fixed small batch, which underuses big profiles; step times; GEMM's FLOP per
  SM cycle, which is per SM and per clock already; GEMM's headline TFLOPS where its sustained
  TFLOPS was measured, which is judged instead), with ``info["scaling_note"]`` saying why.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Mapping, Sequence

from pytest_mig.measure import Metric
from pytest_mig.device.profiles import CPU, FULL, Basis, GpuModel, ProfileError, ProfileSpec, ladder, lookup_model, model_slug, parse_profile
from pytest_mig.device.target import TargetInfo
from pytest_mig.store.results import ResultRecord
from pytest_mig.common.text import quoted

BASES: tuple[str, ...] = ("slices", "sms", "memory")

#: Allowed deviation of a measured ratio from the ideal, by kind of metric (None: not checked).
SCALING_TOLERANCE: dict[str, float | None] = {
    "compute": 0.10,
    "memory": 0.10,
    "simulation": 0.12,
    "tensor": 0.15,
    "training": 0.15,
    "energy": None,
    "cost": None,
    "info": None,
}

#: Kinds whose ideal ignores the chosen basis: bandwidth scales with memory slices.
KIND_BASIS: dict[str, Basis] = {"memory": "memory"}

#: Kinds whose figures mix compute with memory traffic: in an emulated ladder, whose contexts all
#: share the GPU's memory bandwidth, they may follow the bandwidth obtained rather than the SMs.
BANDWIDTH_BOUND_KINDS: frozenset[str] = frozenset({"training", "simulation"})

REAL, EMULATED = "MIG", "emulated"


@dataclass
class Rung:
    """One profile's figure in a ladder."""

    profile: str  # "3g.20gb" or "full"
    slices: int | None  # compute slices (7 for a whole GPU: the 7g it contains)
    sms: int | None  # the SMs the figure was measured with
    memory_fraction: Fraction | None
    value: float
    n: int = 1  # records merged (median) into this rung
    source: str = "run"  # "run" or "baseline"
    throttled: tuple[str, ...] = ()  # power or thermal throttle reasons seen while it was measured
    clock_mhz: float | None = None  # SM clock of the measurement: its window's mean, else read right after it

    @property
    def is_full(self) -> bool:
        return self.profile == FULL


@dataclass
class ScalingRow:
    """One ratio between adjacent profiles, against its ideal."""

    gpu: str
    test: str
    metric: str
    kind: str
    family: str  # "MIG" or "emulated"
    basis: str
    bigger: str
    smaller: str
    value_bigger: float
    value_smaller: float
    unit: str
    ratio: float
    ideal: float
    deviation: float  # ratio / ideal - 1
    tolerance: float
    note: str = ""
    power_limited: tuple[str, ...] = ()  # the bigger profile was throttled and the smaller was not
    bandwidth_shared: tuple[str, ...] = ()  # emulated: the contexts' shared bandwidth explains the gap

    @property
    def within(self) -> bool:
        return abs(self.deviation) <= self.tolerance

    @property
    def ok(self) -> bool:
        """Within tolerance; or short of the ideal only because the bigger profile hit the board's
        power or thermal limit (reported, not failed: a power cap is no driver regression), or, in
        emulation, because both contexts drew on the same memory bandwidth."""
        return self.within or (self.deviation < 0 and bool(self.power_limited or self.bandwidth_shared))

    @property
    def result(self) -> str:
        if self.within:
            return "ok"
        if not self.ok:
            return "FAIL"
        return "power-limited" if self.power_limited else "bandwidth-shared"

    @property
    def pair(self) -> str:
        return f"{self.bigger} / {self.smaller}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu, "test": self.test, "metric": self.metric, "kind": self.kind, "family": self.family,
            "basis": self.basis, "pair": self.pair, "bigger": self.bigger, "smaller": self.smaller,
            "value_bigger": self.value_bigger, "value_smaller": self.value_smaller, "unit": self.unit,
            "ratio": round(self.ratio, 4), "ideal": round(self.ideal, 4),
            "deviation_pct": round(self.deviation * 100, 2), "tolerance_pct": round(self.tolerance * 100, 2),
            "ok": self.ok, "result": self.result, "power_limited": list(self.power_limited),
            "bandwidth_shared": list(self.bandwidth_shared), "note": self.note,
        }


@dataclass
class ScalingGroup:
    """One metric of one test on one GPU model and family, with its profiles in ladder order."""

    gpu: str
    test: str
    metric: str
    unit: str
    kind: str
    direction: str
    family: str
    basis: str
    rungs: list[Rung]


@dataclass
class ScalingReport:
    """All ratios checked, and why some groups were not."""

    rows: list[ScalingRow] = field(default_factory=list)
    groups: list[ScalingGroup] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one line per group left out, with the reason
    profiles_seen: dict[str, list[str]] = field(default_factory=dict)  # GPU -> profiles in the data

    @property
    def failures(self) -> list[ScalingRow]:
        return [r for r in self.rows if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.failures

    def skip_reason(self) -> str:
        """Why nothing could be checked, in one sentence (for pytest.skip)."""
        seen = "; ".join(f"{gpu}: {', '.join(p) or 'none'}" for gpu, p in sorted(self.profiles_seen.items()))
        return ("scaling needs one metric measured on at least two profiles of one GPU model"
                + (f" (profiles seen: {seen})" if seen else " (no GPU results)")
                + "; sweep with --mig-profile all --mig-emulate or pass other slices' results with --mig-scaling-results")

    def format_table(self, rows: Sequence[ScalingRow] | None = None) -> str:
        """Ratio, ideal and deviation per pair (default: all rows), for a failure or the summary."""
        from tabulate import tabulate

        chosen = list(self.rows if rows is None else rows)
        if not chosen:
            return "(no scaling ratios)"
        table = [
            [r.gpu, r.test, r.metric, r.family, r.pair, f"{r.ratio:.3f}", f"{r.ideal:.3f} ({r.basis})",
             f"{round(r.deviation * 100, 1) + 0.0:+.1f}%", f"±{r.tolerance * 100:.0f}%", r.result,
             r.note]
            for r in chosen
        ]
        headers = ["gpu", "test", "metric", "family", "profiles", "ratio", "ideal", "deviation", "tolerance", "result", "note"]
        if not any(r.note for r in chosen):
            headers = headers[:-1]
            table = [row[:-1] for row in table]
        return tabulate(table, headers=headers, tablefmt="simple", disable_numparse=True)

    def failure_text(self) -> str:
        n = len(self.failures)
        return (f"{n} scaling ratio(s) off their ideal by more than the tolerance:\n"
                + self.format_table(self.failures))

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.rows]


def _family(target: TargetInfo) -> list[str]:
    kind = target.kind
    if kind == "emulated" or target.emulated:
        return [EMULATED]
    if kind == FULL or target.profile == FULL:
        return [REAL, EMULATED]
    if kind == "mig":
        return [REAL]
    return []


def _rung(record: ResultRecord, model: GpuModel | None, family: str, source: str) -> Rung | None:
    t = record.target
    profile = str(t.profile or "")
    sms = t.sms_obtained or t.sms
    clocks = record.metric.clocks
    throttled, clock = clocks.throttled, clocks.sm_clock_mhz
    if profile == FULL:
        top = ladder(model.profiles)[-1] if model else None
        return Rung(FULL, top.slices if top else None, int(sms or (model.sms if model else 0)) or None,
                    Fraction(1), record.metric.value, 1, source, throttled, clock)
    try:
        parsed = parse_profile(profile)
    except ProfileError:
        return None
    spec: ProfileSpec | None = model.profile(parsed.gi_name.replace("+me", "")) if model else None
    if sms is None and spec is not None and not parsed.is_compute_instance:
        sms = spec.sms
    name = str(parsed).replace("+me", "")  # the media-engine twin has the same compute and memory
    return Rung(name, parsed.compute_slices, int(sms) if sms else None,
                spec.memory_fraction if spec else None, record.metric.value, 1, source, throttled, clock)


def _ideal(big: Rung, small: Rung, basis: Basis, model: GpuModel | None) -> tuple[float | None, str]:
    """Ideal ratio big/small and a note; None when the data to compute it is missing."""
    note = ""
    if basis == "memory":
        if big.memory_fraction is None or small.memory_fraction is None:
            return None, "memory slices unknown"
        return float(big.memory_fraction / small.memory_fraction), note
    if big.is_full:
        top = ladder(model.profiles)[-1] if model else None
        if model is None or top is None or not top.sms:
            return None, "SM counts unknown"
        loss = model.sms / top.sms  # MIG on vs off always follows SMs: the SMs MIG gives up
        note = "MIG off vs 7g: SM ratio" if small.slices == top.slices else "includes MIG-off SM ratio"
        if small.is_full:
            return 1.0, note
        if basis == "sms":
            return (model.sms / small.sms, note) if small.sms else (None, "SM counts unknown")
        if small.slices is None:
            return None, "slices unknown"
        return loss * top.slices / small.slices, note
    if basis == "sms":
        if not big.sms or not small.sms:
            return None, "SM counts unknown"
        return big.sms / small.sms, note
    if big.slices is None or not small.slices:
        return None, "slices unknown"
    return big.slices / small.slices, note


def _order(r: Rung) -> tuple[Any, ...]:
    return (r.is_full, r.slices or 0, r.memory_fraction or 0, r.sms or 0, r.profile)


_Key = tuple[str, str, str, str]


@dataclass
class _Case:
    """One metric of one test on one GPU model: this run's records of it, the stored ones that may
    fill in profiles, and what judging it needs."""

    key: _Key
    recs: list[ResultRecord]
    fill: list[ResultRecord]
    gpu_name: str
    model: GpuModel | None
    label: str
    tol: float

    @property
    def metric(self) -> Metric:
        return self.recs[0].metric


def check_scaling(
    records: Iterable[ResultRecord],
    *,
    basis: Basis | str = "slices",
    extra: Iterable[ResultRecord] = (),
    tolerances: float | Mapping[str, float] | None = None,
) -> ScalingReport:
    """Check every metric measured on two or more profiles of one GPU model against the ideal.

    ``records`` are this run's (and other jobs') results; ``extra`` (stored baselines) only fills in
    profiles the records lack, and only for metrics the records have.  ``tolerances`` overrides
    :data:`SCALING_TOLERANCE`: one fraction for every kind, or a mapping kind -> fraction.
    """
    if basis not in BASES:
        raise ValueError(f"unknown scaling basis {quoted(basis)}: use slices, sms or memory")
    report = ScalingReport()
    run = _group_run(records, report)
    bandwidth = _emulated_bandwidth(rec for recs in run.values() for rec in recs)
    fill: dict[_Key, list[ResultRecord]] = {}
    for rec in extra:
        key = _group_key(rec)
        if key is not None and key in run:
            fill.setdefault(key, []).append(rec)
    for key in sorted(run):
        case = _case(report, key, run[key], fill.get(key, []), tolerances)
        if case is not None:
            _check_case(report, case, basis, bandwidth)
    return report


def _group_run(records: Iterable[ResultRecord], report: ScalingReport) -> dict[_Key, list[ResultRecord]]:
    """The run's records by metric and GPU model; notes in the report every profile seen per GPU."""
    run: dict[_Key, list[ResultRecord]] = {}
    for rec in records:
        key = _group_key(rec)
        if key is None:
            continue
        run.setdefault(key, []).append(rec)
        gpu = str(rec.target.gpu_name or key[0])
        seen = report.profiles_seen.setdefault(gpu, [])
        prof = str(rec.target.baseline_profile or rec.target.profile)
        if prof not in seen:
            seen.append(prof)
    return run


def _case(report: ScalingReport, key: _Key, recs: list[ResultRecord], fill: list[ResultRecord],
          tolerances: float | Mapping[str, float] | None) -> _Case | None:
    """The metric's case to check; None (with the reason in the report, where one is due) when it is not."""
    first = recs[0]
    m: Metric = first.metric
    if not m.compare or SCALING_TOLERANCE.get(m.kind) is None:
        return None
    exempt = next((r for r in recs if r.metric.info.get("scaling") is False), None)
    if exempt is not None:
        why = exempt.metric.info.get("scaling_note") or "the workload says its figure does not follow the profile's size"
        report.skipped.append(f"{first.test}::{m.name}: not scaling-checked ({why})")
        return None
    tol = _tolerance(tolerances, m.kind)
    if tol is None:
        return None
    gpu_name = str(first.target.gpu_name or key[0])
    model = lookup_model(gpu_name, (first.fingerprint or {}).get("memory_total_mib"))
    label = f"{first.test}::{m.name}" + (" (--mig-quick)" if first.mode == "quick" else "")
    if len({r.metric.direction for r in recs}) > 1 or len({r.metric.unit for r in recs}) > 1:
        report.skipped.append(f"{label} on {gpu_name}: direction or unit differs between profiles")
        return None
    return _Case(key, recs, fill, gpu_name, model, label, tol)


def _check_case(report: ScalingReport, case: _Case, basis: Basis | str,
                bandwidth: dict[tuple[str, str], float]) -> None:
    """Check the case's real and emulated ladders, each pair of neighbouring profiles a row."""
    m = case.metric
    kind_basis: Basis = KIND_BASIS.get(m.kind, basis)  # type: ignore[assignment]
    checked_any = False
    for family in (REAL, EMULATED):
        rungs = _family_ladder(report, case, family)
        if len(rungs) < 2:
            continue
        checked_any = True
        # Emulation partitions SMs only, and the driver rounds them (60 -> 64 on Hopper): the
        # only ideal it can be held to is the ratio of the SMs the green contexts obtained.
        fam_basis: Basis = "sms" if family == EMULATED else kind_basis
        group = ScalingGroup(case.gpu_name, case.recs[0].test, m.name, m.unit, m.kind, m.direction, family,
                             fam_basis, rungs)
        report.groups.append(group)
        for small, big in zip(rungs, rungs[1:]):
            _check_pair(report, case, group, small, big, basis, bandwidth)
    if not checked_any and not any(s.startswith(case.label + " on") for s in report.skipped):
        profs = sorted({str(r.target.baseline_profile or r.target.profile) for r in case.recs})
        report.skipped.append(f"{case.label} on {case.gpu_name}: only {', '.join(profs)} measured")


def _family_ladder(report: ScalingReport, case: _Case, family: str) -> list[Rung]:
    """The family's ladder of the case, one profile per slice count, stored profiles filling gaps;
    empty when there is no ladder (a whole GPU alone, emulated bandwidth)."""
    m = case.metric
    if family == EMULATED and m.kind == "memory":
        if any(EMULATED in _family(r.target) and r.target.kind == "emulated" for r in case.recs):
            report.skipped.append(f"{case.label} on {case.gpu_name}: emulated bandwidth left out "
                                  f"(emulation does not partition memory bandwidth)")
        return []
    rungs = _rungs([r for r in case.recs if family in _family(r.target)], case.model, family, "run")
    if not any(not r.is_full for r in rungs):
        return []  # a whole GPU alone is no ladder
    have = {r.profile for r in rungs}
    extra_rungs = [r for r in _rungs([x for x in case.fill if family in _family(x.target)
                                       and x.metric.direction == m.direction and x.metric.unit == m.unit],
                                      case.model, family, "baseline") if r.profile not in have]
    rungs, variants = _main_rungs(sorted(rungs + extra_rungs, key=_order))
    for v in variants:
        report.skipped.append(f"{case.label} {v.profile} on {case.gpu_name}: a variant of {v.slices}g "
                              f"left out of the {family} ladder (one profile per slice count)")
    return rungs


def _check_pair(report: ScalingReport, case: _Case, group: ScalingGroup, small: Rung, big: Rung,
                basis: Basis | str, bandwidth: dict[tuple[str, str], float]) -> None:
    """The row of one pair of neighbouring profiles: the measured ratio against the ideal, and why
    it may fall short (clocks, shared bandwidth); a skip when the ideal or a value is missing."""
    m, family, fam_basis, gpu_name = case.metric, group.family, group.basis, case.gpu_name
    ideal, note = _ideal(big, small, fam_basis, case.model)  # type: ignore[arg-type]
    if family == EMULATED and fam_basis != basis and ideal is not None:
        note = (note + "; " if note else "") + "emulated: ideal from the SMs obtained"
    if ideal is None or small.value == 0 or big.value == 0:
        report.skipped.append(f"{case.label} {big.profile} / {small.profile} on {gpu_name}: {note or 'zero value'}")
        return
    ratio = big.value / small.value if m.direction == "higher" else small.value / big.value
    sources = {big.source, small.source} - {"run"}
    if sources:
        note = (note + "; " if note else "") + "other profile from the stored baseline"
    limited = _power_limited(big, small, ratio, ideal, case.tol)
    if limited:
        note = (note + "; " if note else "") + f"{big.profile} slower clocked: {limited[0]}"
    shared: tuple[str, ...] = ()
    if not limited and family == EMULATED and m.kind in BANDWIDTH_BOUND_KINDS:
        shared = _bandwidth_shared(bandwidth.get((case.key[0], big.profile)),
                                   bandwidth.get((case.key[0], small.profile)), ratio, ideal, case.tol)
        if shared:
            note = (note + "; " if note else "") + shared[0]
    report.rows.append(ScalingRow(
        gpu_name, case.recs[0].test, m.name, m.kind, family, fam_basis, big.profile, small.profile,
        big.value, small.value, m.unit, ratio, ideal, ratio / ideal - 1, case.tol, note, limited, shared))


def _power_limited(big: Rung, small: Rung, ratio: float, ideal: float, tol: float) -> tuple[str, ...]:
    """Why a ratio short of its ideal is the board's limit, not the profile's: the bigger profile
    ran at a lower SM clock (power or thermal capping) and the ratio is within tolerance of the
    ideal scaled by the two clocks; without clocks, the bigger one alone throttled."""
    if ratio >= ideal * (1 - tol):
        return ()
    if big.clock_mhz and small.clock_mhz:
        if big.clock_mhz < 0.98 * small.clock_mhz:
            adjusted = ideal * big.clock_mhz / small.clock_mhz
            if abs(ratio / adjusted - 1) <= tol:
                return (f"SM clock {big.clock_mhz:.0f} vs {small.clock_mhz:.0f} MHz "
                        f"(clock-scaled ideal {adjusted:.3f})",)
        return ()
    reasons = tuple(t for t in big.throttled if t not in small.throttled)
    return (f"throttled ({', '.join(reasons)})",) if reasons else ()


def _emulated_bandwidth(records: Iterable[ResultRecord]) -> dict[tuple[str, str], float]:
    """(GPU slug, profile) -> the best bandwidth (GB/s) a bandwidth test drew there, for the
    emulated family (emulated contexts and the whole GPU): what each context could pull from HBM."""
    best: dict[tuple[str, str], float] = {}
    for rec in records:
        m, t = rec.metric, rec.target
        key = _group_key(rec)
        if key is None or m.kind != "memory" or m.unit != "GB/s" or EMULATED not in _family(t) or not m.value > 0:
            continue
        profile = str(t.profile).replace("+me", "")
        best[(key[0], profile)] = max(best.get((key[0], profile), 0.0), float(m.value))
    return best


def _bandwidth_shared(bw_big: float | None, bw_small: float | None, ratio: float, ideal: float,
                      tol: float) -> tuple[str, ...]:
    """Why an emulated ratio short of its SM ideal is the shared memory bandwidth's doing: the
    bandwidth obtained grew clearly less than the SMs, and the figure grew at least as much as it."""
    if ratio >= ideal * (1 - tol) or not bw_big or not bw_small:
        return ()
    bw_ratio = bw_big / bw_small
    if bw_ratio >= ideal * (1 - tol) or ratio < bw_ratio * (1 - tol):
        return ()
    return (f"shared memory bandwidth: {bw_big:.0f} vs {bw_small:.0f} GB/s obtained (ratio {bw_ratio:.2f}), "
            "emulation does not partition it",)


def _main_rungs(rungs: list[Rung]) -> tuple[list[Rung], list[Rung]]:
    """One rung per compute-slice count (the smallest memory: 1g.18gb, not 1g.35gb or 1g.18gb+me),
    so the ladder is 1g, 2g, 3g, 4g, 7g, full; the variants that were left out."""
    keep: dict[Any, Rung] = {}
    variants: list[Rung] = []
    for r in rungs:  # sorted by slices, then memory, then SMs: the first of each slice count wins
        key = FULL if r.is_full else r.slices
        if key in keep:
            variants.append(r)
        else:
            keep[key] = r
    return list(keep.values()), variants


def _group_key(rec: ResultRecord) -> tuple[str, str, str, str] | None:
    """(GPU slug, test, metric, mode): quick and normal runs measure other sizes, so never one ladder."""
    t = rec.target
    if t.kind == CPU or not t.gpu_name or not t.profile or not _family(t):
        return None
    slug = str(t.gpu_slug or model_slug(str(t.gpu_name)))
    return (slug, rec.test, rec.metric.name, rec.mode)


def _rungs(records: list[ResultRecord], model: GpuModel | None, family: str, source: str) -> list[Rung]:
    by_profile: dict[str, list[Rung]] = {}
    for rec in records:
        r = _rung(rec, model, family, source)
        if r is not None:
            by_profile.setdefault(r.profile, []).append(r)
    out = []
    for same in by_profile.values():
        r = same[0]
        if len(same) > 1:  # several runs or nodes of one profile: their median
            reasons = tuple(dict.fromkeys(t for x in same for t in x.throttled))
            clocks = [x.clock_mhz for x in same if x.clock_mhz]
            r = Rung(r.profile, r.slices, r.sms, r.memory_fraction, statistics.median(x.value for x in same),
                     len(same), r.source, reasons, statistics.median(clocks) if clocks else None)
        out.append(r)
    return out


def _tolerance(tolerances: float | Mapping[str, float] | None, kind: str) -> float | None:
    if isinstance(tolerances, (int, float)):
        return float(tolerances)
    if tolerances is not None and kind in tolerances:
        return float(tolerances[kind])
    return SCALING_TOLERANCE.get(kind)


def check_values(
    gpu_name: str,
    values: Mapping[str, float],
    *,
    kind: str = "compute",
    direction: str = "higher",
    basis: Basis | str = "slices",
    metric: str = "value",
    unit: str = "",
    test: str = "published",
    tolerances: float | Mapping[str, float] | None = None,
) -> ScalingReport:
    """Scaling of plain numbers per profile (published tables, quick what-ifs): same rule as above."""
    records = []
    for profile, value in values.items():
        target = TargetInfo(FULL if profile == FULL else "mig", profile, gpu_name=gpu_name, gpu_slug=model_slug(gpu_name),
                            emulated=False)
        records.append(ResultRecord(test, Metric(metric, value, unit, direction, [], kind), target, {}))  # type: ignore[arg-type]
    return check_scaling(records, basis=basis, tolerances=tolerances)


__all__ = [
    "BANDWIDTH_BOUND_KINDS", "BASES", "KIND_BASIS", "SCALING_TOLERANCE", "Rung", "ScalingGroup", "ScalingReport",
    "ScalingRow", "check_scaling", "check_values",
]
