"""The physics of particle tracking: the beam, the particles, and the maps in NumPy (or torch).

simpletrack's maps (reference/simpletrack.md), vectorised over particles and looping over elements,
in float64: the reference the fused GPU kernel of :mod:`pytest_mig.workloads.tracking` is checked
against, and on torch tensors its CPU path.  A lost particle (|x| or |y| >= APERTURE_M after a
drift) keeps its coordinates.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from pytest_mig.workloads import WorkloadError
from pytest_mig.workloads.lattice import CAVITY, DRIFT, MULTIPOLE, MULTIPOLE_HEADER, SROTATION, XYSHIFT, Lattice

#: Rows of the particle coordinate array (structure of arrays, float64).
X, PX, Y, PY, ZETA, DELTA, RPP, RVV = range(8)
NCOORD = 8
#: Half-aperture of the drifts, in metres: a particle beyond it is lost.
APERTURE_M = 1.0


@dataclass(frozen=True)
class Beam:
    """The reference particle: simpletrack's benchmark beam (7 TeV protons)."""

    p0c: float = 7e12  # eV
    mass0: float = 938.272046e6  # eV
    charge0: float = 1.0
    chi: float = 1.0  # (q/q0)(m0/m): one species

    @property
    def beta0(self) -> float:
        return self.p0c / math.sqrt(self.p0c**2 + self.mass0**2)

    def constants(self) -> tuple[float, ...]:
        """What the kernels read, in float64: beta0, p0c, charge0, chi, 1/beta0^2, (mass0/p0c)^2."""
        b = self.beta0
        return (b, self.p0c, self.charge0, self.chi, 1.0 / (b * b), (self.mass0 / self.p0c) ** 2)


@dataclass
class Particles:
    """Particle state, structure of arrays: coords [8, N] float64, lost and turn int32 [N]."""

    coords: Any
    lost: Any
    turn: Any

    @property
    def n(self) -> int:
        return int(self.coords.shape[1])

    def numpy(self) -> Particles:
        def conv(a: Any) -> np.ndarray:
            return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)

        return Particles(conv(self.coords), conv(self.lost), conv(self.turn))

    def to_torch(self, device: str) -> Particles:
        import torch

        return Particles(
            torch.as_tensor(np.ascontiguousarray(self.coords), device=device),
            torch.as_tensor(np.ascontiguousarray(self.lost), device=device),
            torch.as_tensor(np.ascontiguousarray(self.turn), device=device),
        )

    def take(self, idx: np.ndarray) -> Particles:
        """The particles at indices ``idx``, on the arrays' own device."""
        if hasattr(self.coords, "device"):
            import torch

            t = torch.as_tensor(idx, device=self.coords.device)
            return Particles(self.coords[:, t].contiguous(), self.lost[t].contiguous(), self.turn[t].contiguous())
        return Particles(self.coords[:, idx], self.lost[idx], self.turn[idx])


def _with_delta(coords: np.ndarray, beam: Beam) -> np.ndarray:
    """Fill rpp and rvv from delta, as the cavity map does."""
    delta = coords[DELTA]
    p = 1.0 + delta
    beta = p / np.sqrt(p * p + (beam.mass0 / beam.p0c) ** 2)
    coords[RPP] = 1.0 / p
    coords[RVV] = beta / beam.beta0
    return coords


def simpletrack_particles(n: int, beam: Beam = Beam()) -> Particles:
    """simpletrack's benchmark beam: px = linspace(0, 1e-5, n), every other coordinate 0."""
    coords = np.zeros((NCOORD, n))
    coords[PX] = np.linspace(0.0, 1e-5, n)
    coords = _with_delta(coords, beam)
    return Particles(coords, np.zeros(n, np.int32), np.zeros(n, np.int32))


def random_particles(n: int, beam: Beam = Beam(), seed: int = 0) -> Particles:
    """Particles with every coordinate non-zero, so every term of every map is exercised."""
    rng = np.random.default_rng(seed)
    coords = np.zeros((NCOORD, n))
    for row, sigma in ((X, 3e-4), (PX, 1e-5), (Y, 3e-4), (PY, 1e-5), (ZETA, 5e-2), (DELTA, 2e-4)):
        coords[row] = rng.normal(0, sigma, n)
    coords = _with_delta(coords, beam)
    return Particles(coords, np.zeros(n, np.int32), np.zeros(n, np.int32))


# ---------------------------------------------------------------------------------------------
# The reference: NumPy (or torch) arrays, vectorised over particles, a loop over elements.


@functools.lru_cache(maxsize=8)
def _decoded(lattice: Lattice) -> list[tuple[int, tuple[float, ...]]]:
    """The lattice as Python floats per element: indexing numpy scalars per element is slow."""
    out = []
    for i in range(len(lattice)):
        kind, p = lattice.element(i)
        out.append((kind, tuple(float(v) for v in p)))
    return out


@dataclass
class _Coords:
    """The particles' eight coordinates and lost flags as arrays of ``xp``, updated element by element."""

    x: Any
    px: Any
    y: Any
    py: Any
    zeta: Any
    delta: Any
    rpp: Any
    rvv: Any
    lost: Any


def track_reference(lattice: Lattice, particles: Particles, turns: int, beam: Beam = Beam(), xp: ModuleType = np) -> Particles:
    """Track ``particles`` for ``turns`` turns with array module ``xp`` (numpy or torch).

    The maps and their order of operations are those of reference/simpletrack.md and of the
    Triton kernel; a lost particle (|x| or |y| >= 1 m after a drift) keeps its coordinates."""
    constants = beam.constants()
    c = particles.coords
    s = _Coords(*(c[i] * 1.0 for i in range(NCOORD)), lost=particles.lost * 1)
    turn = particles.turn * 1
    elements = _decoded(lattice)
    for _ in range(turns):
        for kind, p in elements:
            _track_element(s, kind, p, constants, xp)
        turn = xp.where(s.lost == 0, turn + 1, turn)
    stack = np.stack if xp is np else xp.stack
    return Particles(stack([s.x, s.px, s.y, s.py, s.zeta, s.delta, s.rpp, s.rvv]), s.lost, turn)


def _track_element(s: _Coords, kind: int, p: tuple[float, ...], constants: tuple[float, ...], xp: ModuleType) -> None:
    """Apply one element's map to the particles not lost."""
    alive = s.lost == 0
    if kind == DRIFT:
        _drift(s, alive, p[0], xp)
    elif kind == MULTIPOLE:
        _multipole(s, alive, p, constants[3], xp)
    elif kind == CAVITY:
        _cavity(s, alive, p, constants, xp)
    elif kind == XYSHIFT:
        where = xp.where
        s.x = where(alive, s.x - p[0], s.x)
        s.y = where(alive, s.y - p[1], s.y)
    elif kind == SROTATION:
        where = xp.where
        cs, sn = p
        x, y, px, py = s.x, s.y, s.px, s.py
        s.x, s.y = where(alive, cs * x + sn * y, x), where(alive, -sn * x + cs * y, y)
        s.px, s.py = where(alive, cs * px + sn * py, px), where(alive, -sn * px + cs * py, py)
    else:
        raise ValueError(f"unknown element type {kind}")


def _drift(s: _Coords, alive: Any, length: float, xp: ModuleType) -> None:
    """The exact drift; a particle outside the aperture after it is lost."""
    where = xp.where
    xpr = s.px * s.rpp
    ypr = s.py * s.rpp
    s.x = where(alive, s.x + xpr * length, s.x)
    s.y = where(alive, s.y + ypr * length, s.y)
    s.zeta = where(alive, s.zeta + length * (s.rvv - (1.0 + (xpr * xpr + ypr * ypr) * 0.5)), s.zeta)
    out = (xp.abs(s.x) >= APERTURE_M) | (xp.abs(s.y) >= APERTURE_M)
    s.lost = where(alive & out, s.lost * 0 + 1, s.lost)


def _multipole(s: _Coords, alive: Any, p: tuple[float, ...], chi: float, xp: ModuleType) -> None:
    """The thin multipole kick (Horner's scheme over the field's orders), with the dipole's
    curvature terms where it has a length."""
    where = xp.where
    x, y = s.x, s.y
    order = int(p[0])
    length, hxl, hyl = p[1], p[2], p[3]
    bal = p[MULTIPOLE_HEADER:]
    dpx = x * 0.0 + bal[2 * order]
    dpy = x * 0.0 + bal[2 * order + 1]
    for i in range(order - 1, -1, -1):
        zre = dpx * x - dpy * y
        zim = dpx * y + dpy * x
        dpx = bal[2 * i] + zre
        dpy = bal[2 * i + 1] + zim
    dpx = -chi * dpx
    dpy = chi * dpy
    if length > 0.0:
        hxx = hxl / length * x
        hyy = hyl / length * y
        dpx = dpx + (hxl + hxl * s.delta - chi * bal[0] * hxx)
        dpy = dpy - (hyl + hyl * s.delta - chi * bal[1] * hyy)
        s.zeta = where(alive, s.zeta - chi * (hxx - hyy) * length, s.zeta)
    s.px = where(alive, s.px + dpx, s.px)
    s.py = where(alive, s.py + dpy, s.py)


def _cavity(s: _Coords, alive: Any, p: tuple[float, ...], constants: tuple[float, ...], xp: ModuleType) -> None:
    """The RF cavity's energy kick, and the momentum-dependent factors it changes."""
    beta0, p0c, charge0, chi, inv_beta0_sq, mratio_sq = constants
    where = xp.where
    volt, kfreq, lag = p
    tau = s.zeta / (s.rvv * beta0)
    phase = lag - kfreq * tau
    de = chi * charge0 * volt * xp.sin(phase)
    rep = xp.sqrt(s.delta * s.delta + 2.0 * s.delta + inv_beta0_sq) + de / p0c
    irpp = xp.sqrt(rep * rep - mratio_sq)
    beta = irpp / rep
    s.delta = where(alive, irpp - 1.0, s.delta)
    s.rpp = where(alive, 1.0 / irpp, s.rpp)
    s.rvv = where(alive, beta / beta0, s.rvv)
    s.zeta = where(alive, tau * beta, s.zeta)


def compare(got: Particles, want: Particles, limit: float, what: str) -> float:
    """Largest error per coordinate, relative to that coordinate's largest magnitude; raise
    WorkloadError above ``limit`` or where the lost flags or turn counters differ."""
    g, w = got.numpy(), want.numpy()
    if not np.array_equal(g.lost, w.lost) or not np.array_equal(g.turn, w.turn):
        raise WorkloadError(f"{what}: lost flags or turn counters differ from the reference")
    worst = 0.0
    for row in range(NCOORD):
        scale = float(np.max(np.abs(w.coords[row]))) or 1.0
        err = float(np.max(np.abs(g.coords[row] - w.coords[row]))) / scale
        if not err <= limit:  # NaN too
            raise WorkloadError(f"{what}: coordinate {row} differs from the reference by {err:.3g} (relative), limit {limit:.1g}")
        worst = max(worst, err)
    return worst
