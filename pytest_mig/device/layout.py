"""MIG layouts: the slices of one GPU run at once (Columbia/IBM's experiment), named, resolved on the
GPU's own profile table, checked against the instances NVML shows, or emulated with CUDA MPS.

A layout is written as its slices joined by ``+``, a run of equal ones as ``PROFILExN``:
``4g.40gb+3g.40gb``, ``2g.10gb+2g.10gb+2g.10gb+1g.10gb``, ``1g.10gbx7``.  A slice may be given by its
compute slices alone (``4g``), which names the GPU's own profile (:func:`resolve`), so one layout
reads the same on an A100-40GB (``4g.20gb``), an A100-80GB or H100 (``4g.40gb``) and an H200
(``4g.71gb``).  Several layouts are separated by commas and run one after another; the presets
(:data:`PRESETS`) name such lists: ``paper``, Columbia/IBM's five layouts and 1g on all seven slices,
and ``wulver``, three 1g slices against one 3g.

MIG on: each layout's instances must exist on one GPU, exactly (:func:`match_instances`); pytest-mig
never creates or destroys an instance.  MIG off, under emulation: each slice is an MPS client whose
active thread percentage is the profile's share of the GPU's SMs (:func:`mps_percentage`) and whose
pinned memory is the profile's; the SMs each client obtains are read back and compared
(:func:`sms_check`).  Under MPS, memory bandwidth and L2 stay shared, unlike MIG.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from pytest_mig.device.nvml import Gpu, MigInstance
from pytest_mig.device.profiles import ProfileError, ProfileSpec, parse_profile
from pytest_mig.device.target import SelectionError

#: Named lists of layouts, each written in compute slices (the GPU's own profiles are found by :func:`resolve`).
PRESETS: dict[str, tuple[str, ...]] = {
    "paper": ("7g", "4g+3g", "4g+2g+1g", "3g+2g+2g", "2g+2g+2g+1g", "1gx7"),
    "wulver": ("1gx3", "3g"),
}
#: How a worker's run is confined to its slice.
CONFINED_BY = ("mig", "mps")
#: The phases of a layout: each slice alone (its neighbours idle), then every slice at once.
PHASES = ("alone", "together")

_ITEM = re.compile(r"(?P<name>[0-9a-z.+]+?)(?:\s*[x*:]\s*(?P<n>[0-9]{1,2}))?\Z", re.IGNORECASE)
_BARE = re.compile(r"(?P<g>[1-8])g\Z", re.IGNORECASE)


@dataclass(frozen=True)
class Layout:
    """One layout: the profile of each slice, in order, and how it was asked for."""

    asked: str
    profiles: tuple[str, ...]

    @property
    def name(self) -> str:
        """``4g.40gb+2g.20gb+1g.20gb``, ``1g.10gbx7``: runs of one profile written once with their count."""
        parts: list[str] = []
        for p in self.profiles:
            if parts and parts[-1].split("x")[0] == p:
                head, _, n = parts[-1].partition("x")
                parts[-1] = f"{head}x{int(n or 1) + 1}"
            else:
                parts.append(p)
        return "+".join(parts)

    @property
    def slices(self) -> int:
        return len(self.profiles)


def parse_layouts(text: str) -> list[tuple[str, list[str]]]:
    """``text`` as layouts (a preset's, or comma-separated), each as its items (a profile or ``Ng``),
    repeats written out.  ProfileError, one sentence, for anything else."""
    text = text.strip()
    preset = PRESETS.get(text.lower())
    out = []
    for one in (preset if preset is not None else [t for t in text.split(",")]):
        one = one.strip()
        if not one:
            raise ProfileError(f"--mig-layout {text!r}: an empty layout between commas")
        out.append((one, _items(one, text)))
    return out


def _items(layout: str, text: str) -> list[str]:
    raw = [t.strip() for t in layout.split("+")]
    tokens: list[str] = []
    for t in raw:  # "1g.10gb+me" is one profile, not two slices
        if tokens and re.fullmatch(r"me(\s*[x*:]\s*[0-9]+)?", t, re.IGNORECASE):
            tokens[-1] = f"{tokens[-1]}+{t}"
        else:
            tokens.append(t)
    items: list[str] = []
    for t in tokens:
        m = _ITEM.match(t.replace(" ", ""))
        name = m["name"] if m else ""
        if not m or not (_BARE.match(name) or _is_profile(name)):
            raise ProfileError(f"--mig-layout {text!r}: {t!r} is not a slice; write slices as profiles joined by '+' "
                               f"(4g.40gb+3g.40gb), a run of one profile as 1g.10gbx7, a slice by its compute slices "
                               f"(4g+2g+1g), or a preset: {', '.join(PRESETS)}")
        n = int(m["n"] or 1)
        if not 1 <= n <= 8:
            raise ProfileError(f"--mig-layout {text!r}: {t!r} asks for {n} slices; a GPU has 1 to 7")
        items.extend([name.lower()] * n)
    return items


def _is_profile(name: str) -> bool:
    try:
        parse_profile(name)
    except ProfileError:
        return False
    return True


def resolve(asked: str, items: Sequence[str], specs: Sequence[ProfileSpec], gpu_words: str) -> Layout:
    """The layout on this GPU's profile table: a bare ``Ng`` becomes the GPU's N-slice profile with the
    least memory, and the memory slices left over go to a lone 1g slice (Columbia/IBM's 1g.10gb beside
    4g.20gb+2g.10gb on the A100-40GB).  SelectionError, one sentence, where it does not fit."""
    plain = [s for s in specs if not s.parsed.media and not s.parsed.is_compute_instance]
    names = {s.name.lower(): s for s in specs}
    chosen: list[ProfileSpec] = []
    for item in items:
        bare = _BARE.match(item)
        if bare:
            same = sorted((s for s in plain if s.slices == int(bare["g"])), key=lambda s: s.memory_fraction)
            if not same:
                raise SelectionError(f"--mig-layout {asked}: {gpu_words} has no {item} profile; its profiles are "
                                     f"{', '.join(s.name for s in specs)}.")
            chosen.append(same[0])
        elif item in names:
            chosen.append(names[item])
        else:
            raise SelectionError(f"--mig-layout {asked}: {gpu_words} has no {item} profile; its profiles are "
                                 f"{', '.join(s.name for s in specs)}.")
    if all(_BARE.match(i) for i in items):
        chosen = _give_leftover_memory(chosen, plain)
    _check_fits(asked, chosen, gpu_words)
    return Layout(asked, tuple(s.name for s in chosen))


def _give_leftover_memory(chosen: list[ProfileSpec], plain: Sequence[ProfileSpec]) -> list[ProfileSpec]:
    ones = [i for i, s in enumerate(chosen) if s.slices == 1]
    if len(ones) != 1 or len(chosen) == 1:
        return chosen
    left = 1 - sum(s.memory_fraction for s in chosen)
    bigger = sorted((s for s in plain if s.slices == 1 and s.memory_fraction > chosen[ones[0]].memory_fraction
                     and s.memory_fraction - chosen[ones[0]].memory_fraction <= left),
                    key=lambda s: s.memory_fraction)
    if bigger:
        chosen = list(chosen)
        chosen[ones[0]] = bigger[-1]
    return chosen


def _check_fits(asked: str, chosen: Sequence[ProfileSpec], gpu_words: str) -> None:
    slices = sum(s.slices for s in chosen)
    memory = sum(s.memory_fraction for s in chosen)
    counts = Counter(s.name for s in chosen)
    too_many = [f"{s.name} x{counts[s.name]} (at most {s.max_instances})"
                for s in {x.name: x for x in chosen}.values() if counts[s.name] > s.max_instances]
    if slices > 7 or memory > 1 or too_many:
        why = "; ".join(x for x in (f"{slices} compute slices of 7" if slices > 7 else "",
                                    f"{float(memory) * 8:g} memory slices of 8" if memory > 1 else "",
                                    ", ".join(too_many)) if x)
        raise SelectionError(f"--mig-layout {asked} does not fit {gpu_words}: {why}.")


def match_instances(layout: Layout, gpu: Gpu, gpu_words: str) -> list[MigInstance]:
    """The GPU's instances of ``layout``, one per slice in order; SelectionError naming what is missing
    and what is extra where the GPU's instances are not exactly the layout's."""
    want = Counter(p.lower() for p in layout.profiles)
    have = Counter(i.profile.lower() for i in gpu.instances)
    missing, extra = want - have, have - want
    if missing or extra:
        words = "; ".join(x for x in (
            "missing " + ", ".join(f"{p} x{n}" for p, n in sorted(missing.items())) if missing else "",
            "extra " + ", ".join(f"{p} x{n}" for p, n in sorted(extra.items())) if extra else "") if x)
        raise SelectionError(f"--mig-layout {layout.name}: the instances of {gpu_words} are not this layout ({words}); "
                             f"an administrator creates them (nvidia-smi mig -cgi ... -C), pytest-mig never creates or "
                             f"destroys instances.")
    pool = sorted(gpu.instances, key=lambda i: i.mig_index)
    out = []
    for p in layout.profiles:
        inst = next(i for i in pool if i.profile.lower() == p.lower())
        pool.remove(inst)
        out.append(inst)
    return out


def mps_percentage(sms: int, total_sms: int) -> float:
    """The active thread percentage of a client that should get ``sms`` of ``total_sms`` SMs: the share,
    rounded up to a hundredth so that rounding never loses a TPC (MPS gives whole TPCs, rounding down)."""
    return min(100.0, math.ceil(10000 * sms / total_sms) / 100)


def sms_check(profile: str, sms: int | None, report: dict[str, object]) -> tuple[int | None, str]:
    """The SMs an MPS client obtained (its probe ``report``, :func:`pytest_mig.device.mps.context_resources`)
    and a sentence on them against the profile's ``sms``."""
    got = report.get("sms")
    if not isinstance(got, int):
        return None, f"MPS client: the SMs obtained were not read back ({report.get('error', 'no answer')})"
    if sms and got != sms:
        return got, (f"MPS gave this worker {got} SMs where {profile} has {sms}: its figures are of {got} SMs")
    return got, f"MPS client: {got} SMs obtained, as {profile} has"


@dataclass(frozen=True)
class SlotTag:
    """What a layout's worker is told of its slice (``--mig-layout-slot``): layout, phase, slot, confinement."""

    layout: str
    phase: str
    slot: int
    confined_by: str

    def arg(self) -> str:
        return f"{self.layout}/{self.phase}/{self.slot}/{self.confined_by}"

    @classmethod
    def parse(cls, text: str) -> "SlotTag":
        layout, phase, slot, how = text.split("/")
        if phase not in PHASES or how not in CONFINED_BY:
            raise ValueError(f"not a layout slot: {text!r}")
        return cls(layout, phase, int(slot), how)

    def history_profile(self, profile: str) -> str:
        """Where its figures' history is kept: apart from the profile's solo runs, per layout and phase."""
        return f"{profile}@{self.layout}.{self.phase}"

    def extra(self) -> dict[str, object]:
        return {"layout": self.layout, "layout_phase": self.phase, "layout_slot": self.slot,
                "layout_confined_by": self.confined_by}


__all__ = ["CONFINED_BY", "Layout", "PHASES", "PRESETS", "SlotTag", "match_instances", "mps_percentage",
           "parse_layouts", "resolve", "sms_check"]
