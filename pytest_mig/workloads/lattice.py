"""An LHC-scale accelerator lattice generated in code, packed as structure-of-arrays for tracking.

CERN's "simulation" figures come from tracking particles through the real LHC lattice
(reference/simpletrack.md): 18,657 elements per turn, 26,658.88 m of drifts.  That lattice is not
downloaded here; this module builds one with the same element mix and scale from FODO cells
(thin quadrupoles, bends sliced into thick multipoles carrying field errors up to order 15,
sextupoles, octupoles, spool-piece correctors, RF cavities, misalignments as XY-shift pairs and
tilts as S-rotation pairs), deterministic from a seed.  The tracking kernels then do the same
arithmetic, element for element, as they would on the real machine.

Packing: ``types[i]`` is the element's type code, ``offsets[i]`` the start of its parameters in
the flat float64 ``params`` buffer (simpletrack packs its elements in one buffer the same way).

=========== =================================================================
type        parameters at ``params[offsets[i]:]``
=========== =================================================================
DRIFT       length
MULTIPOLE   order, length, hxl, hyl, bal[0] .. bal[2*order+1] (kn0, ks0, kn1/1!, ks1/1!, ...)
CAVITY      voltage [V], kfreq [rad/m], lag [rad]
XYSHIFT     dx, dy
SROTATION   cos(angle), sin(angle)
=========== =================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

DRIFT, MULTIPOLE, CAVITY, XYSHIFT, SROTATION = 0, 1, 2, 3, 4
ELEMENT_NAMES = {DRIFT: "drift", MULTIPOLE: "multipole", CAVITY: "cavity", XYSHIFT: "xyshift", SROTATION: "srotation"}
#: A multipole's parameters before its ``bal`` coefficients: order, length, hxl, hyl.
MULTIPOLE_HEADER = 4


@dataclass(frozen=True)
class LatticeSpec:
    """What to generate: element counts and scale.  The defaults are the real LHC's, as tracked
    by simpletrack (reference/simpletrack.md); :meth:`scaled` gives smaller lattices for tests."""

    drifts: int = 8316
    multipoles: int = 10137  # all thin multipoles, the thick (bending) ones included
    thick: int = 2572  # multipoles with length > 0 and a bend hxl
    xyshifts: int = 176  # in pairs around misaligned quadrupoles
    cavities: int = 12
    active_cavities: int = 8  # the others are in the lattice at 0 V
    srotations: int = 16  # in pairs around tilted quadrupoles
    length_m: float = 26658.8832  # total drift length
    cells: int = 248  # FODO cells (the LHC's are 106.9 m long)
    sectors: int = 8
    arc_fraction: float = 0.75  # of each sector's cells that bend; the rest form the straight section
    tune: float = 64.31  # betatron tune the quadrupole strength is set for (both planes, thin-lens FODO)
    bend_order: int = 15  # field errors carried by the bends, up to this order
    quad_order: int = 10
    reference_radius_m: float = 0.017  # of the field-error expansion (LHC: 17 mm)
    cavity_voltage_v: float = 2.0e6
    cavity_kfreq: float = 8.3999  # rad/m: 400.79 MHz
    cavity_lag_rad: float = math.pi
    total_bend_rad: float = 2 * math.pi  # shared by the thick multipoles; a scaled lattice is an arc of the ring

    @property
    def elements(self) -> int:
        return self.drifts + self.multipoles + self.xyshifts + self.cavities + self.srotations

    def scaled(self, factor: float) -> LatticeSpec:
        """A lattice ``factor`` times the size, with at least one element of each kind.

        Each bend keeps the full ring's angle (the scaled lattice is a section of the ring, not a
        smaller ring): bends of 2 pi / 40 would focus far harder than the quadrupoles, and the
        small lattices lost particles within a few turns."""

        def n(v: int, minimum: int = 1) -> int:
            return max(minimum, round(v * factor))

        cells = n(self.cells, 2)
        # Keep the fractional tune away from integer resonances, as the full ring's is.
        tune = math.floor(self.tune * cells / self.cells) + self.tune % 1
        if tune / cells >= 0.5:
            tune = self.tune * cells / self.cells
        return replace(
            self,
            drifts=n(self.drifts),
            multipoles=n(self.multipoles),
            thick=n(self.thick),
            xyshifts=2 * n(self.xyshifts // 2),
            cavities=n(self.cavities),
            active_cavities=min(n(self.active_cavities), n(self.cavities)),
            srotations=2 * n(self.srotations // 2),
            length_m=self.length_m * cells / self.cells,
            total_bend_rad=self.total_bend_rad * n(self.thick) / self.thick,
            cells=cells,
            sectors=min(self.sectors, cells),
            tune=tune,
        )


#: The real LHC's element mix and scale.
LHC = LatticeSpec()


@dataclass(frozen=True, eq=False)
class Lattice:
    """A packed lattice: type codes, parameter offsets and the flat parameter buffer.

    Compared and hashed by identity (``eq=False``), so caches can key on it."""

    types: np.ndarray  # int32 [n]
    offsets: np.ndarray  # int32 [n]
    params: np.ndarray  # float64
    spec: LatticeSpec
    seed: int

    def __len__(self) -> int:
        return int(self.types.shape[0])

    def element(self, i: int) -> tuple[int, np.ndarray]:
        """Type code and parameter slice of element ``i``."""
        kind = int(self.types[i])
        off = int(self.offsets[i])
        return kind, self.params[off: off + param_count(kind, self.params, off)]

    def counts(self) -> dict[str, int]:
        """Elements by kind, plus the thick multipoles: the figures reference/simpletrack.md gives."""
        out = {ELEMENT_NAMES[k]: int(np.count_nonzero(self.types == k)) for k in ELEMENT_NAMES}
        mult = self.offsets[self.types == MULTIPOLE]
        out["thick"] = int(np.count_nonzero(self.params[mult + 1] > 0))
        out["total"] = len(self)
        return out

    @property
    def total_length(self) -> float:
        return float(self.params[self.offsets[self.types == DRIFT]].sum())

    @property
    def total_bend(self) -> float:
        mult = self.offsets[self.types == MULTIPOLE]
        return float(self.params[mult + 2].sum())

    @property
    def max_order(self) -> int:
        mult = self.offsets[self.types == MULTIPOLE]
        return int(self.params[mult].max()) if len(mult) else 0


def param_count(kind: int, params: np.ndarray, off: int) -> int:
    if kind == DRIFT:
        return 1
    if kind == MULTIPOLE:
        return MULTIPOLE_HEADER + 2 * (int(params[off]) + 1)
    if kind == CAVITY:
        return 3
    if kind in (XYSHIFT, SROTATION):
        return 2
    raise ValueError(f"unknown element type {kind}")


def spread(total: int, slots: int) -> list[int]:
    """``total`` items over ``slots`` slots as evenly as possible (a deterministic placement)."""
    if slots <= 0:
        if total:
            raise ValueError(f"cannot place {total} items in no slots")
        return []
    return [(i + 1) * total // slots - i * total // slots for i in range(slots)]


Element = tuple[int, tuple[float, ...]]


def drift(length: float) -> Element:
    return (DRIFT, (float(length),))


def multipole(knl: Sequence[float], ksl: Sequence[float] = (), length: float = 0.0, hxl: float = 0.0, hyl: float = 0.0) -> Element:
    """A thin multipole from integrated strengths knl[n], ksl[n] (n = 0 dipole, 1 quadrupole, ...).

    bal holds kn/n! and ks/n! interleaved, as the Horner evaluation in the kernels reads them."""
    order = max(len(knl), len(ksl), 1) - 1
    bal = []
    for n in range(order + 1):
        kn = knl[n] if n < len(knl) else 0.0
        ks = ksl[n] if n < len(ksl) else 0.0
        bal += [kn / math.factorial(n), ks / math.factorial(n)]
    return (MULTIPOLE, (float(order), float(length), float(hxl), float(hyl), *map(float, bal)))


def cavity(voltage: float, kfreq: float, lag: float) -> Element:
    return (CAVITY, (float(voltage), float(kfreq), float(lag)))


def xyshift(dx: float, dy: float) -> Element:
    return (XYSHIFT, (float(dx), float(dy)))


def srotation(angle: float) -> Element:
    return (SROTATION, (math.cos(angle), math.sin(angle)))


def pack(elements: Sequence[Element], spec: LatticeSpec, seed: int) -> Lattice:
    types = np.array([k for k, _ in elements], dtype=np.int32)
    sizes = np.array([len(p) for _, p in elements], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
    params = np.fromiter((v for _, p in elements for v in p), dtype=np.float64, count=int(sizes.sum()))
    return Lattice(types, offsets, params, spec, seed)


def _errors(rng: np.random.Generator, main: float, order: int, r0: float, first: int, rel: float = 1e-4) -> tuple[list[float], list[float]]:
    """Field errors b_n, a_n (units of 1e-4 of the main field at radius r0) as integrated strengths."""
    knl = [0.0] * (order + 1)
    ksl = [0.0] * (order + 1)
    for n in range(first, order + 1):
        scale = main * rel / r0 ** n * math.factorial(n)
        knl[n] = scale * rng.normal()
        ksl[n] = scale * rng.normal()
    return knl, ksl


@dataclass(frozen=True)
class _Layout:
    """Where things sit, per half-cell: which bend (and how many bends), which hold cavities, and
    whose quadrupole is shifted or tilted."""

    arc_half: list[bool]
    bends_per: dict[int, int]
    cav_per: dict[int, int]
    shifted: set[int]
    tilted: set[int]


def _layout(spec: LatticeSpec) -> _Layout:
    """Arcs and straight sections per sector, the bends spread over the arcs, the cavities over the
    straights of one sector, and the shifted and tilted quadrupoles spread evenly."""
    arc_half: list[bool] = []  # per half-cell: bending or straight
    sector_of: list[int] = []
    for sector, ncell in enumerate(spread(spec.cells, spec.sectors)):
        narc = round(ncell * spec.arc_fraction) if ncell > 1 else ncell
        for c in range(ncell):
            arc_half += [c < narc] * 2
            sector_of += [sector] * 2
    if not any(arc_half):
        arc_half[0] = True
    arcs = [h for h, a in enumerate(arc_half) if a]
    straights = [h for h, a in enumerate(arc_half) if not a]
    bends_per = dict(zip(arcs, spread(spec.thick, len(arcs))))
    # Cavities in the straight half-cells of one sector (the LHC's RF sits at point 4).
    rf_sector = min(3, spec.sectors - 1)
    rf_halves = [h for h in straights if sector_of[h] == rf_sector] or straights or arcs
    cav_per = dict(zip(rf_halves, spread(spec.cavities, len(rf_halves))))
    quads = list(range(2 * spec.cells))
    shifted = {quads[int(i)] for i in np.linspace(0, len(quads) - 1, spec.xyshifts // 2)} if spec.xyshifts else set()
    tilt_pool = straights or arcs
    tilted = {tilt_pool[int(i)] for i in np.linspace(0, len(tilt_pool) - 1, spec.srotations // 2)} if spec.srotations else set()
    if len(shifted) != spec.xyshifts // 2 or len(tilted) != spec.srotations // 2:
        raise ValueError("too few half-cells for the requested XY shifts or S-rotations")
    return _Layout(arc_half, bends_per, cav_per, shifted, tilted)


def generate_lattice(spec: LatticeSpec = LHC, seed: int = 0) -> Lattice:
    """Build the lattice: FODO cells (arcs with bends, straight sections with the cavities), then
    correctors and drift splits until the element counts equal ``spec``'s exactly."""
    rng = np.random.default_rng(seed)
    half = spec.length_m / (2 * spec.cells)
    mu = 2 * math.pi * spec.tune / spec.cells  # phase advance per cell
    if not 0 < mu < math.pi:
        raise ValueError(f"tune {spec.tune} over {spec.cells} cells gives an unstable FODO cell")
    kq = 2 * math.sin(mu / 2) / half  # thin-lens FODO: sin(mu/2) = half-cell length / (2 f)
    bend_angle = spec.total_bend_rad / spec.thick
    layout = _layout(spec)

    elements: list[Element] = []
    cavities_made = 0
    for h in range(2 * spec.cells):
        sign = 1.0 if h % 2 == 0 else -1.0
        elements += _quadrupole(rng, spec, layout, h, kq, sign)
        if layout.arc_half[h]:
            arc, step = _arc_magnets(rng, spec, sign, layout.bends_per[h], half, bend_angle)
            elements += arc
        else:
            step = half
        nc = layout.cav_per.get(h, 0)  # the half-cell's last drift holds its cavities
        for _ in range(nc):
            elements.append(drift(step / (nc + 1)))
            volt = spec.cavity_voltage_v if cavities_made < spec.active_cavities else 0.0
            elements.append(cavity(volt, spec.cavity_kfreq, spec.cavity_lag_rad))
            cavities_made += 1
        elements.append(drift(step / (nc + 1)))
    return pack(_fill(elements, spec, rng), spec, seed)


def _quadrupole(rng: np.random.Generator, spec: LatticeSpec, layout: _Layout, h: int, kq: float,
                sign: float) -> list[Element]:
    """Half-cell ``h``'s quadrupole (focusing or defocusing by ``sign``) with its field errors,
    inside its XY shift and S-rotation where it has them."""
    r0 = spec.reference_radius_m
    qkn, qks = _errors(rng, kq * r0, spec.quad_order, r0, first=2)
    qkn[1] += sign * kq
    quad = [multipole(qkn, qks)]
    if h in layout.shifted:
        dx, dy = rng.normal(0.0, 2e-5, 2)
        quad = [xyshift(dx, dy), *quad, xyshift(-dx, -dy)]
    if h in layout.tilted:
        angle = rng.uniform(-0.05, 0.05)
        quad = [srotation(angle), *quad, srotation(-angle)]
    return quad


def _arc_magnets(rng: np.random.Generator, spec: LatticeSpec, sign: float, nb: int, half: float,
                 bend_angle: float) -> tuple[list[Element], float]:
    """An arc half-cell's sextupole, octupole and ``nb`` bends between drifts; returns them and the
    length of the drift that closes the half-cell."""
    r0 = spec.reference_radius_m
    elements = [multipole([0.0, 0.0, sign * 0.04 * (1 + 0.05 * rng.normal())]),  # sextupole
                multipole([0.0, 0.0, 0.0, 0.3 * rng.normal()])]  # octupole (Landau)
    step = half / (nb + 1)
    for _ in range(nb):
        elements.append(drift(step))
        bkn, bks = _errors(rng, bend_angle, spec.bend_order, r0, first=1)
        bkn[0] = bend_angle
        elements.append(multipole(bkn, bks, length=0.8 * step, hxl=bend_angle))
    return elements, step


def _corrector(rng: np.random.Generator, i: int) -> Element:
    """Spool-piece and orbit correctors: weak, of low order, normal or skew in turn."""
    kind = i % 5
    if kind == 0:
        return multipole([rng.normal(0, 1e-9)], [rng.normal(0, 1e-9)])  # orbit corrector
    if kind == 1:
        return multipole([0.0, 0.0], [0.0, rng.normal(0, 1e-5)])  # skew quadrupole
    order = kind  # 2: sextupole, 3: octupole, 4: decapole spool pieces
    knl = [0.0] * order + [rng.normal(0, 0.01 * math.factorial(order))]
    return multipole(knl)


def _fill(elements: list[Element], spec: LatticeSpec, rng: np.random.Generator) -> list[Element]:
    """Insert correctors into drifts, add correctors beside magnets, split drifts: until the
    drift and multipole counts equal the spec (the real lattice has them between its magnets)."""
    ndrift = sum(1 for k, _ in elements if k == DRIFT)
    nmult = sum(1 for k, _ in elements if k == MULTIPOLE)
    more_mult, more_drift = spec.multipoles - nmult, spec.drifts - ndrift
    if more_mult < 0 or more_drift < 0:
        raise ValueError(
            f"the cell structure alone has {ndrift} drifts and {nmult} multipoles, more than the "
            f"{spec.drifts} and {spec.multipoles} asked for: use fewer cells"
        )
    inside = min(more_mult, more_drift)  # each splits a drift around a new corrector
    made = 0

    out: list[Element] = []
    per_drift = iter(spread(inside, ndrift))
    for k, p in elements:
        if k != DRIFT:
            out.append((k, p))
            continue
        c = next(per_drift)
        part = p[0] / (c + 1)
        for _ in range(c):
            out += [drift(part), _corrector(rng, made)]
            made += 1
        out.append(drift(part))

    beside = spread(more_mult - inside, sum(1 for k, _ in out if k == MULTIPOLE))
    elements, out, j = out, [], 0
    for k, p in elements:
        out.append((k, p))
        if k == MULTIPOLE:
            for _ in range(beside[j]):
                out.append(_corrector(rng, made))
                made += 1
            j += 1

    splits = iter(spread(more_drift - inside, sum(1 for k, _ in out if k == DRIFT)))
    elements, out = out, []
    for k, p in elements:
        if k != DRIFT:
            out.append((k, p))
            continue
        s = next(splits)
        out += [drift(p[0] / (s + 1))] * (s + 1)
    return out
