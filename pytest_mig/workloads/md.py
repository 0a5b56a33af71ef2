"""Molecular dynamics: a Lennard-Jones fluid in torch (Wulver's GROMACS row, made self-contained),
and GROMACS itself where a ``gmx`` binary is installed.

The torch workload is the classic LJ benchmark (LAMMPS's ``bench/in.lj``, Rahman's argon) in
reduced units (sigma = epsilon = mass = 1; time unit tau = sigma sqrt(m / epsilon)):

- an FCC lattice at density 0.8442 in a cubic periodic box; velocities drawn at 2 T* = 1.44 with
  the total momentum removed and the temperature rescaled exactly (3N - 3 degrees of freedom): the
  lattice takes half of that kinetic energy, the crystal melts and the fluid settles at T* ~ 0.72
  (drawn at 0.72 it would stay a crystal near T* = 0.37);
- pair potential 4 (r^-12 - r^-6), cut at 2.5 sigma and shifted to zero there (so the energy is
  continuous and its conservation can be checked);
- velocity Verlet at dt* = 0.005;
- a Verlet neighbour list of radius cutoff + skin (0.3 sigma), built with a cell list (cells at
  least cutoff + skin wide, the 27 around an atom searched; all pairs where the box holds fewer
  than 3 cells a side) and rebuilt whenever some atom has moved more than skin/2 since the last
  build.  At a build the atoms are put back into the box and renumbered in cell order.  The list
  is a padded ``[N, max_neighbours]`` int64 tensor of image indices k (N + 1) + j (neighbour j
  seen in periodic image k, GROMACS's shift vectors), holding both i->j and j->i (a "full" list:
  forces are one gather, elementwise terms and a row sum; no scatter, no atomics, no
  minimum-image arithmetic per step).  Unused slots point at the atom's own far image, outside
  every cutoff;
- float32 on a GPU (float64 on request, and always in the references).

Times are converted to real ones with argon's constants (sigma = 3.405 A, epsilon/k_B = 119.8 K,
m = 39.948 u, so tau = 2.156 ps and dt = 10.78 fs): that is what the ns/day figure means.

Each run is checked: the total energy over the measured steps (sampled after every timed call)
must not drift by more than :data:`DRIFT_LIMIT` relative per 1000 steps, nor stray by more than
:data:`DEVIATION_LIMIT` from its first value; the total momentum must stay zero to rounding; and
the forces of the final state on atoms spread over the whole box must equal a float64 all-pairs
(minimum-image, no list) computation over every atom.

GROMACS (:func:`run_gromacs`): an argon box of the same density and start is written as
.gro/.top/.mdp files, ``gmx grompp`` and ``gmx mdrun -nb gpu`` run on the Target's device (the
subprocess inherits the pinned CUDA_VISIBLE_DEVICES), and ns/day is read from the log's
``Performance:`` line (GROMACS times the second half of its run, ``-resethway``).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..measure import Metric, Timer, Timing, energy_metrics
from ..target import Target
from . import DoesNotFit, WorkloadError, check_close

# ---------------------------------------------------------------------------------------------
# Units and the physical set-up


@dataclass(frozen=True)
class ArgonUnits:
    """What one reduced LJ unit is for argon: sigma 3.405 A, epsilon/k_B 119.8 K, 39.948 u, so tau = 2.156 ps."""

    sigma_nm: float = 0.3405
    epsilon_over_kb_k: float = 119.8
    mass_u: float = 39.948

    @property
    def epsilon_kj_mol(self) -> float:
        return self.epsilon_over_kb_k * 8.314462618e-3  # k_B N_A in kJ/(mol K)

    @property
    def tau_ps(self) -> float:
        """sigma sqrt(m / epsilon): nm sqrt(u / (kJ/mol)) is exactly 1 ps."""
        return self.sigma_nm * math.sqrt(self.mass_u / self.epsilon_kj_mol)


ARGON = ArgonUnits()


@dataclass(frozen=True)
class LJSetup:
    """The simulated system and integrator, in reduced units."""

    density: float = 0.8442
    temperature: float = 0.72  # what the fluid settles at
    initial_temperature: float = 1.44  # of the velocities drawn on the lattice (see fcc_lattice)
    cutoff: float = 2.5
    skin: float = 0.3
    dt: float = 0.005

    @property
    def list_radius(self) -> float:
        return self.cutoff + self.skin

    @property
    def lattice_constant(self) -> float:
        return (4.0 / self.density) ** (1.0 / 3.0)

    def box_for(self, cells: int) -> float:
        """The box edge of ``cells`` FCC cells a side, rounded to the nearest float32: then the
        periodic shifts (integer multiples of it) are exact in float32 too, and the float32 run
        and its float64 reference see the very same box (the density moves by < 1e-7)."""
        return float(torch.tensor(cells * self.lattice_constant, dtype=torch.float32))

    def energy_shift(self) -> float:
        """4 (rc^-12 - rc^-6): subtracted from every pair within the cutoff."""
        s6 = self.cutoff**-6
        return 4.0 * s6 * (s6 - 1.0)


LJ = LJSetup()

#: Relative total-energy drift allowed per 1000 steps (slope of a straight-line fit through the
#: energies sampled over the measured run).  A correct velocity Verlet at dt* = 0.005 stays
#: orders of magnitude below it (float32 and float64 alike); a missing half kick drifts by order 1
#: and a wrong force sign blows up within a few dozen steps.  (A stale list is the force check's.)
DRIFT_LIMIT = 1e-3
#: Largest relative deviation of any sampled total energy from the first: a correct run's
#: fluctuation is far smaller; a run that blew up (NaN, collapse) or lost the shift is far beyond.
DEVIATION_LIMIT = 5e-3
#: |total momentum| / (N * thermal speed): zero to rounding for a symmetric full list.
MOMENTUM_LIMIT = {"fp32": 1e-5, "fp64": 1e-12}
#: Relative (norm-wise) error of the forces against the float64 all-pairs reference, for pairs
#: inside the box (where r_j - r_i of nearby atoms is exact); see :func:`force_limit`.
FORCE_LIMIT = {"fp32": 1e-5, "fp64": 1e-12}
#: A pair across the periodic boundary subtracts coordinates a box apart: its displacement is off
#: by up to half an ulp of the box edge, and the steep r^-13 repulsion multiplies that.  Allowed:
#: this many ulps of the box edge, relative (~1.3e-4 on a 1M-atom float32 box of 105 sigma, where
#: one missing pair at the cutoff would still show as ~2.5e-4 over the 64 atoms checked).
BOUNDARY_ULPS = 10.0
#: Atoms whose forces are checked against all N atoms in float64 after the run.
FORCE_CHECK_ATOMS = 64

PRECISIONS = {"fp32": torch.float32, "fp64": torch.float64}
PRECISION_NAMES = tuple(PRECISIONS)


def dtype_of(precision: str) -> torch.dtype:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown MD precision '{precision}': use one of {', '.join(PRECISION_NAMES)}")
    return PRECISIONS[precision]


def fcc_lattice(cells: int, setup: LJSetup = LJ, *, dtype: torch.dtype = torch.float64,
                device: str = "cpu") -> tuple[torch.Tensor, float]:
    """4 cells^3 atoms on an FCC lattice filling a cubic box at ``setup.density``; (positions, box edge).

    The perfect lattice is a potential-energy minimum: velocities drawn at
    ``setup.initial_temperature`` = 2 T* lose half their kinetic energy to it, the crystal melts,
    and the fluid settles near T* = 0.72 (LAMMPS's in.lj does the same: 1.44 on an FCC 0.8442)."""
    if cells < 1:
        raise ValueError("an FCC lattice needs at least one cell a side")
    box = setup.box_for(cells)
    a = box / cells
    basis = torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]], dtype=torch.float64)
    r = torch.arange(cells, dtype=torch.float64)
    corners = torch.stack(torch.meshgrid(r, r, r, indexing="ij"), dim=-1).reshape(-1, 3)
    pos = ((corners[:, None, :] + basis[None, :, :]).reshape(-1, 3) + 0.25) * a  # off the box faces
    return pos.to(device=device, dtype=dtype), box


def initial_velocities(n: int, temperature: float, *, seed: int = 0, dtype: torch.dtype = torch.float64,
                       device: str = "cpu") -> torch.Tensor:
    """Gaussian velocities, zero total momentum, kinetic temperature exactly ``temperature``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    v = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    v -= v.mean(dim=0)
    t_now = float((v * v).sum()) / (3 * n - 3)
    v *= math.sqrt(temperature / t_now)
    return v.to(device=device, dtype=dtype)


def cells_for_atoms(atoms: int) -> int:
    """FCC cells a side whose 4 n^3 atoms are closest to (not above) ``atoms``; at least 4 (a box
    of 6.7 sigma: twice the list radius, so that the minimum image is unique)."""
    return max(4, math.floor((atoms / 4.0) ** (1.0 / 3.0) + 1e-9))


# ---------------------------------------------------------------------------------------------
# Pair terms, forces, neighbour lists


def minimum_image_(d: torch.Tensor, box: float) -> torch.Tensor:
    """Shift displacements (in place) to their nearest periodic image."""
    return d.sub_(torch.round(d * (1.0 / box)).mul_(box))


def with_sentinel(pos: torch.Tensor) -> torch.Tensor:
    """``pos`` with one more row of NaN: the empty slots of the cell table point at it, and every
    distance to it is NaN, which no comparison admits."""
    return torch.cat([pos, torch.full((1, 3), float("nan"), dtype=pos.dtype, device=pos.device)])


#: The 27 periodic images, (a, b, c) in box edges; image k of atom j is list index k (N + 1) + j.
IMAGES = tuple(itertools.product((-1, 0, 1), repeat=3))
IMAGE_ZERO = IMAGES.index((0, 0, 0))
#: The list's padding: an atom's own image a box edge away on every axis, sqrt(3) box from it:
#: finite (no NaN into the force sum) and outside every cutoff (the box is >= 2 list radii).
IMAGE_FAR = IMAGES.index((1, 1, 1))


def images(pos: torch.Tensor, box: float) -> torch.Tensor:
    """[27 (N + 1), 3]: the atoms in each periodic image (GROMACS's shift vectors, applied once per
    step), each image closed by a NaN row.  A list entry then needs no minimum-image arithmetic,
    and for neighbours in the same image (most of them) r_j - r_i is exact."""
    shifts = torch.tensor(IMAGES, dtype=pos.dtype, device=pos.device) * box
    return (with_sentinel(pos).unsqueeze(0) + shifts.unsqueeze(1)).reshape(-1, 3)


def pair_terms(r2: torch.Tensor, rc2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of pairs inside the cutoff, F/r for them): F/r = 24 (2 r^-14 - r^-8), 0 outside
    (and 0 for r^2 = 0 or NaN, which are not pairs)."""
    inside = (r2 < rc2) & (r2 > 0)
    inv2 = torch.reciprocal(torch.where(inside, r2, torch.full((), float("inf"), dtype=r2.dtype, device=r2.device)))
    inv6 = inv2 * inv2
    inv6.mul_(inv2)
    f_over_r = inv6 * 48.0
    f_over_r.sub_(24.0).mul_(inv6).mul_(inv2)
    return inside, f_over_r


def pair_energy(r2: torch.Tensor, inside: torch.Tensor, shift: float) -> torch.Tensor:
    """4 (r^-12 - r^-6) - shift inside the cutoff, 0 outside."""
    inv2 = torch.reciprocal(torch.where(inside, r2, torch.full((), float("inf"), dtype=r2.dtype, device=r2.device)))
    inv6 = inv2 * inv2 * inv2
    return torch.where(inside, 4.0 * inv6 * (inv6 - 1.0) - shift, torch.zeros((), dtype=r2.dtype, device=r2.device))


def lj_forces(pos: torch.Tensor, nbr: torch.Tensor, box: float, setup: LJSetup = LJ, *,
              energy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forces from a full neighbour list of image indices (and the potential energy, a 0-d
    tensor, on request).  d = r_j - r_i, so the force on i from j is -(F/r) d: a gather from
    :func:`images`, elementwise terms and a row sum."""
    d = images(pos, box)[nbr]  # [N, M, 3]
    d.sub_(pos.unsqueeze(1))
    r2 = torch.linalg.vecdot(d, d)
    inside, f_over_r = pair_terms(r2, setup.cutoff**2)
    forces = torch.einsum("nm,nmc->nc", f_over_r, d).neg_()
    pe = 0.5 * pair_energy(r2, inside, setup.energy_shift()).sum() if energy else None
    return forces, pe


def reference_forces(pos: torch.Tensor, box: float, setup: LJSetup = LJ, *, rows: torch.Tensor | None = None,
                     chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float64 all-pairs forces (minimum image, no list) on ``rows`` (all atoms if None), their
    potential energy (half of each pair) and, per row, the number of pairs within 1e-6 (relative)
    of the cutoff, where a lower precision may legitimately decide the other way."""
    p = pos.to(torch.float64)
    rows = torch.arange(p.shape[0], device=p.device) if rows is None else rows.to(p.device)
    rc2 = setup.cutoff**2
    forces, pes, edge = [], [], []
    for start in range(0, rows.numel(), chunk):
        r = rows[start:start + chunk]
        d = p.unsqueeze(0) - p[r].unsqueeze(1)  # [R, N, 3]
        minimum_image_(d, box)
        r2 = (d * d).sum(dim=-1)
        inside, f_over_r = pair_terms(r2, rc2)
        forces.append(-(f_over_r.unsqueeze(-1) * d).sum(dim=1))
        pes.append(0.5 * pair_energy(r2, inside, setup.energy_shift()).sum())
        edge.append(((r2 - rc2).abs() < 1e-6 * rc2).sum(dim=1))
    return torch.cat(forces), torch.stack(pes).sum(), torch.cat(edge)


@dataclass
class NeighbourList:
    """A padded full Verlet list of image indices: ``nbr[i, :counts[i]]`` are k (N + 1) + j for i's
    neighbours j within cutoff + skin, seen in periodic image k (j is in i's row exactly when i is
    in j's); the rest of the row is i's far image (padding)."""

    nbr: torch.Tensor  # [N, max_neighbours] int64
    counts: torch.Tensor  # [N] neighbours per atom
    built_at: torch.Tensor  # positions at the build
    method: str  # "cells" or "all-pairs"
    cells_per_side: int

    @property
    def max_neighbours(self) -> int:
        return int(self.nbr.shape[1])

    def atoms(self) -> torch.Tensor:
        """The neighbours' atom indices (padding: the row's own atom)."""
        return self.nbr % (self.nbr.shape[0] + 1)

    def images(self) -> torch.Tensor:
        """The neighbours' periodic images (indices into IMAGES)."""
        return torch.div(self.nbr, self.nbr.shape[0] + 1, rounding_mode="floor")


def cells_per_side(box: float, setup: LJSetup = LJ) -> int:
    """Cells a side at least cutoff + skin wide; below 3 the 27 around an atom would repeat."""
    return math.floor(box / setup.list_radius)


def cell_ids(pos: torch.Tensor, box: float, nc: int) -> torch.Tensor:
    """Flat cell index of each atom (positions in [0, box))."""
    ci = torch.floor(pos * (nc / box)).to(torch.int64).clamp_(0, nc - 1)
    return (ci[:, 0] * nc + ci[:, 1]) * nc + ci[:, 2]


def _cell_stencil(nc: int, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For every cell its 27 neighbours (itself included) and the periodic image their atoms are
    seen in from it: ([nc^3, 27] cell indices, [nc^3, 27] indices into IMAGES)."""
    r = torch.arange(nc, device=device)
    xyz = torch.stack(torch.meshgrid(r, r, r, indexing="ij"), dim=-1).reshape(-1, 3)
    offs = torch.tensor(IMAGES, device=device)
    raw = xyz.unsqueeze(1) + offs.unsqueeze(0)
    nb = raw % nc
    img = torch.div(raw, nc, rounding_mode="floor") + 1  # -1, 0, 1 -> 0, 1, 2
    return (nb[..., 0] * nc + nb[..., 1]) * nc + nb[..., 2], (img[..., 0] * 3 + img[..., 1]) * 3 + img[..., 2]


def build_neighbours(pos: torch.Tensor, box: float, setup: LJSetup = LJ, *, width: int | None = None,
                     chunk: int = 8192, force_all_pairs: bool = False) -> NeighbourList:
    """The Verlet list of ``pos``: cell list where the box holds >= 3 cells a side, else all pairs.

    Cell list: every cell's candidates (the atoms of its 27 neighbour cells, as image indices,
    padded with the NaN sentinel) form one row of a table; an atom's candidates are its cell's
    row, and those within cutoff + skin are packed to the left of its list row (``nonzero`` keeps
    their order).  ``width`` is the padded row length; it grows where some atom has more
    neighbours.  Work is done ``chunk`` atoms at a time to bound the temporaries."""
    n = pos.shape[0]
    device = pos.device
    rl = setup.list_radius
    if box < 2 * rl:
        raise ValueError(f"a box of {box:.3g} sigma is less than twice the list radius ({rl:g} sigma): "
                         "use at least 4 FCC cells a side")
    if width is None:
        expected = 4.0 / 3.0 * math.pi * rl**3 * n / box**3
        width = _round_up(int(1.3 * expected) + 8, 8)
    nc = cells_per_side(box, setup)
    use_cells = nc >= 3 and not force_all_pairs
    stride = n + 1  # atoms per image, the NaN sentinel included
    if use_cells:
        cid = cell_ids(pos, box, nc)
        occupancy = torch.bincount(cid, minlength=nc**3)
        cap = int(occupancy.max())
        if cap > 4 * n / nc**3 + 64:  # a liquid is never 4x denser than its mean anywhere
            raise WorkloadError(f"{cap} atoms in one cell of a box whose cells hold {n / nc**3:.1f} on average: "
                                "the atoms collapsed; the forces are wrong")
        order = torch.argsort(cid, stable=True)
        scid = cid[order]
        slot = torch.arange(n, device=device) - (torch.cumsum(occupancy, 0) - occupancy)[scid]
        cells = torch.full((nc**3, cap), n, dtype=torch.int64, device=device)  # n: the NaN sentinel
        cells[scid, slot] = order
        around, image = _cell_stencil(nc, device)
        table = (cells[around] + (image * stride).unsqueeze(-1)).reshape(nc**3, 27 * cap)
        img = images(pos, box)
    found: list[tuple[torch.Tensor, torch.Tensor]] = []
    for start in range(0, n, chunk):
        own = torch.arange(start, min(n, start + chunk), device=device)
        if use_cells:
            cand = table[cid[own]]  # [R, 27 cap]
            d = img[cand]
            d -= pos[own].unsqueeze(1)
            r = torch.linalg.vector_norm(d, dim=-1)
            within = (r < rl) & (r > 0)  # NaN (empty slot) and 0 (the atom itself) are out
        else:
            d = pos.unsqueeze(0) - pos[own].unsqueeze(1)  # [R, N, 3]
            k = torch.round(d * (-1.0 / box))  # the image that brings j next to i
            d.addcmul_(k, torch.full((), box, dtype=d.dtype, device=device))
            within = ((d * d).sum(dim=-1) < rl * rl) & (own.unsqueeze(1) != torch.arange(n, device=device))
            code = ((k[..., 0] + 1) * 9 + (k[..., 1] + 1) * 3 + (k[..., 2] + 1)).to(torch.int64)
            cand = code * stride + torch.arange(n, device=device)
        rows, cols = within.nonzero(as_tuple=True)  # row-major: each row's neighbours in order
        found.append((rows + start, cand[rows, cols]))
    all_rows = torch.cat([r for r, _ in found])
    nnb = torch.bincount(all_rows, minlength=n)
    most = int(nnb.max()) if n else 0
    if most > width:
        width = _round_up(int(most * 1.2) + 1, 8)
    own_far = torch.arange(n, device=device) + IMAGE_FAR * stride
    nbr = own_far.unsqueeze(1).repeat(1, width)
    row_start = torch.cumsum(nnb, 0) - nnb
    k = torch.arange(all_rows.numel(), device=device)  # each pair's index among all pairs, row-major
    nbr[all_rows, k - row_start[all_rows]] = torch.cat([c for _, c in found])
    return NeighbourList(nbr, nnb, pos.clone(), "cells" if use_cells else "all-pairs", nc)


def _round_up(v: int, to: int) -> int:
    return -(-v // to) * to



def max_displacement2(pos: torch.Tensor, lst: NeighbourList, box: float) -> torch.Tensor:
    """Largest squared distance any atom moved since the list was built (0-d tensor)."""
    d = pos - lst.built_at
    minimum_image_(d, box)
    return torch.linalg.vecdot(d, d).max()


# ---------------------------------------------------------------------------------------------
# The system and its integrator


@dataclass
class LJSystem:
    """State of one LJ simulation: positions (in [0, box) at the last list build, at most skin/2
    outside since), velocities, forces, neighbour list.

    At every list build the atoms are renumbered in cell order (as LAMMPS and HOOMD sort them), so
    that neighbours sit close together in memory for the gathers; only sums over atoms are reported."""

    pos: torch.Tensor
    vel: torch.Tensor
    box: float
    setup: LJSetup = LJ
    chunk: int = 8192
    sort: bool = True
    forces: torch.Tensor = field(init=False)
    nlist: NeighbourList = field(init=False)
    steps: int = field(default=0, init=False)
    rebuilds: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.rebuild()
        self.forces, _ = lj_forces(self.pos, self.nlist.nbr, self.box, self.setup)

    @classmethod
    def fcc(cls, cells: int, setup: LJSetup = LJ, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
            seed: int = 0, chunk: int = 8192, sort: bool = True) -> LJSystem:
        pos, box = fcc_lattice(cells, setup, dtype=dtype, device=device)
        vel = initial_velocities(pos.shape[0], setup.initial_temperature, seed=seed, dtype=dtype, device=device)
        return cls(pos, vel, box, setup, chunk, sort)

    @property
    def n(self) -> int:
        return int(self.pos.shape[0])

    def rebuild(self) -> None:
        """Put the atoms back into the box, sort them by cell (where the box has cells) and build
        the list.  Only here: the list's image indices hold until the next build, as long as no
        atom is wrapped in between (GROMACS puts atoms in the box at search steps only, too)."""
        self.pos.sub_(torch.floor(self.pos * (1.0 / self.box)).mul_(self.box))
        if not bool(((self.pos >= 0) & (self.pos <= self.box)).all()):  # NaN fails too
            raise WorkloadError(f"LJ positions became NaN or too large to wrap after {self.steps} steps: "
                                "the integrator or the forces are wrong")
        nc = cells_per_side(self.box, self.setup)
        if self.sort and nc >= 3:
            order = torch.argsort(cell_ids(self.pos, self.box, nc), stable=True)
            self.pos = self.pos[order]
            self.vel = self.vel[order]
            if hasattr(self, "forces"):
                self.forces = self.forces[order]
        width = self.nlist.max_neighbours if hasattr(self, "nlist") else None
        self.nlist = build_neighbours(self.pos, self.box, self.setup, width=width, chunk=self.chunk)
        self.rebuilds += 1

    def maybe_rebuild(self) -> None:
        """Rebuild the list when some atom moved more than skin/2 (then no pair can have crossed
        from beyond cutoff + skin to inside the cutoff unseen).  Reads one flag from the device."""
        half = 0.5 * self.setup.skin
        if bool(max_displacement2(self.pos, self.nlist, self.box) > half * half):
            self.rebuild()

    def energies(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(kinetic, potential) energy as 0-d float64 tensors on the device (no host sync)."""
        _, pe = lj_forces(self.pos, self.nlist.nbr, self.box, self.setup, energy=True)
        ke = 0.5 * (self.vel.to(torch.float64) ** 2).sum()
        assert pe is not None
        return ke, pe.to(torch.float64)

    def momentum(self) -> torch.Tensor:
        return self.vel.to(torch.float64).sum(dim=0)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            verlet_step(self)


def half_kick(system: LJSystem) -> None:
    system.vel.add_(system.forces, alpha=0.5 * system.setup.dt)


def verlet_step(system: LJSystem) -> None:
    """One velocity-Verlet step: half kick, drift, (list rebuild when due), new forces, half kick."""
    half_kick(system)
    system.pos.add_(system.vel, alpha=system.setup.dt)
    system.maybe_rebuild()
    system.forces, _ = lj_forces(system.pos, system.nlist.nbr, system.box, system.setup)
    half_kick(system)
    system.steps += 1


# ---------------------------------------------------------------------------------------------
# Checks


@dataclass(frozen=True)
class EnergyCheck:
    """Total energy over the measured run: drift (fitted slope) and the largest excursion."""

    drift_per_1000: float  # |slope| * 1000 / |E0|
    deviation: float  # max |E_k - E0| / |E0|
    steps: int  # steps between the first and the last sample
    samples: int


def energy_drift(energies: Sequence[float], steps_between: int) -> EnergyCheck:
    """Fit a straight line through energies sampled every ``steps_between`` steps."""
    if len(energies) < 2:
        raise ValueError("the energy check needs at least two samples")
    e0 = energies[0]
    xs = [k * steps_between for k in range(len(energies))]
    if not all(math.isfinite(e) for e in energies) or e0 == 0:
        return EnergyCheck(float("nan"), float("nan"), xs[-1], len(energies))
    mx, me = statistics.fmean(xs), statistics.fmean(energies)
    slope = sum((x - mx) * (e - me) for x, e in zip(xs, energies)) / sum((x - mx) ** 2 for x in xs)
    dev = max(abs(e - e0) for e in energies) / abs(e0)
    return EnergyCheck(abs(slope) * 1000.0 / abs(e0), dev, xs[-1], len(energies))


def check_energy(check: EnergyCheck, what: str) -> None:
    """Raise WorkloadError when the energy drifted or strayed: per 1000 steps, or over the whole
    run where it was shorter (a fluctuation is not scaled up into a drift)."""
    scaled = check.drift_per_1000 * min(1.0, check.steps / 1000.0)
    if not scaled <= DRIFT_LIMIT:  # NaN too
        raise WorkloadError(f"{what}: total energy drifted {check.drift_per_1000:.3g} (relative) per 1000 steps over "
                            f"{check.steps} steps, limit {DRIFT_LIMIT:g}: the integrator or the forces are wrong")
    if not check.deviation <= DEVIATION_LIMIT:
        raise WorkloadError(f"{what}: total energy strayed {check.deviation:.3g} (relative) from its first value, "
                            f"limit {DEVIATION_LIMIT:g}: the integrator or the forces are wrong")


def check_forces(system: LJSystem, precision: str, rows: int = FORCE_CHECK_ATOMS) -> dict[str, Any]:
    """The system's current forces on ``rows`` atoms spread over the box against float64 all pairs.

    Rows with a pair within 1e-6 of the cutoff (where float32 may decide the other way) are left
    out and counted.  Where the system is small, the potential energy is compared too."""
    n = system.n
    idx = torch.unique(torch.linspace(0, n - 1, min(rows, n), device=system.pos.device).round().to(torch.int64))
    ref, _, edge = reference_forces(system.pos, system.box, system.setup, rows=idx, chunk=max(1, 2**22 // n))
    keep = edge == 0
    got = system.forces[idx].to(torch.float64)
    denom = float(torch.linalg.vector_norm(ref[keep]))
    err = float(torch.linalg.vector_norm((got - ref)[keep])) / denom if denom > 0 else float("nan")
    limit = force_limit(precision, system.box)
    check_close(f"LJ {precision} forces of {int(keep.sum())} atoms vs float64 all pairs", err, limit)
    out: dict[str, Any] = {"force_rel_error": err, "force_limit": limit, "force_rows": int(keep.sum()), "force_rows_on_cutoff": int((~keep).sum())}
    if n <= 4096:
        _, pe_ref, _ = reference_forces(system.pos, system.box, system.setup)
        _, pe = system.energies()
        pe_err = abs(float(pe) - float(pe_ref)) / abs(float(pe_ref))
        check_close(f"LJ {precision} potential energy vs float64 all pairs", pe_err, FORCE_LIMIT[precision])
        out["pe_rel_error"] = pe_err
    return out


def force_limit(precision: str, box: float) -> float:
    """The force check's limit: FORCE_LIMIT plus BOUNDARY_ULPS ulps of the box edge (relative)."""
    eps = float(torch.finfo(dtype_of(precision)).eps)
    return FORCE_LIMIT[precision] + BOUNDARY_ULPS * eps * box


def check_momentum(system: LJSystem, precision: str) -> float:
    """|total momentum| per atom over the thermal speed: zero to rounding (unit masses)."""
    p = float(torch.linalg.vector_norm(system.momentum())) / (system.n * math.sqrt(system.setup.temperature))
    check_close(f"LJ {precision} total momentum", p, MOMENTUM_LIMIT[precision])
    return p


# ---------------------------------------------------------------------------------------------
# Sizing and effort

#: Atoms per SM on a GPU: ~1M atoms on a 132-SM H100/H200, ~130k on a 16-SM slice.
ATOMS_PER_SM = 8192
#: Device bytes planned per atom: the [N, ~112] list and the force pass's [N, ~112, 3] temporaries.
BYTES_PER_ATOM = {"fp32": 6000, "fp64": 12000}
#: Share of the Target's memory the system may plan to use (the neighbour build has its own share).
MEMORY_SHARE = 0.5
BUILD_SHARE = 0.1
#: Bytes per candidate pair in the cell-list build (indices, displacements, masks, slots).
BUILD_BYTES_PER_CANDIDATE = 100
#: FCC cells a side on the CPU: 256 atoms (4 cells: an all-pairs list) or 864 (6: a cell list).
CPU_CELLS = 4


@dataclass(frozen=True)
class MdEffort:
    """How long one mode runs: equilibration steps, timed calls, and the steps per call."""

    equilibrate: int  # steps before anything is timed (the lattice melts; the allocator warms up)
    warmup: int  # timed-call warm-ups (their steps count in the energy check)
    repeats: int
    call_s: float | None  # seconds one call should take (steps calibrated to it); None: fixed steps
    steps: int  # fixed steps per call (CPU), or the calibration run's length (GPU)
    max_steps: int


MD_EFFORT = {
    ("gpu", False): MdEffort(equilibrate=100, warmup=1, repeats=5, call_s=1.5, steps=50, max_steps=20000),
    ("gpu", True): MdEffort(equilibrate=100, warmup=1, repeats=3, call_s=0.5, steps=20, max_steps=5000),
    ("cpu", False): MdEffort(equilibrate=50, warmup=1, repeats=3, call_s=None, steps=40, max_steps=40),
    ("cpu", True): MdEffort(equilibrate=30, warmup=1, repeats=2, call_s=None, steps=25, max_steps=25),
}


def md_cells(budget_bytes: int, sms: int | None, precision: str, *, quick: bool = False) -> int:
    """FCC cells a side for a GPU Target: ATOMS_PER_SM per SM (half in quick mode), within the
    memory share; DoesNotFit where not even 4 cells a side (256 atoms) fit."""
    per_atom = BYTES_PER_ATOM[precision]
    fit = int(budget_bytes * MEMORY_SHARE / per_atom)
    want = max(1, sms or 1) * ATOMS_PER_SM // (2 if quick else 1)
    atoms = min(want, fit)
    if atoms < 4 * 4**3:
        raise DoesNotFit(f"LJ {precision}: not even 256 atoms fit {budget_bytes / 2**30:.2f} GiB")
    return cells_for_atoms(atoms)


def build_chunk(budget_bytes: int, setup: LJSetup = LJ) -> int:
    """Atoms per neighbour-build chunk: the 27 cells' candidates within BUILD_SHARE of the memory."""
    per_cell = setup.density * setup.list_radius**3 * 1.6  # fullest cell, with room
    per_atom = 27 * per_cell * BUILD_BYTES_PER_CANDIDATE
    n = int(budget_bytes * BUILD_SHARE / per_atom)
    return max(1024, min(65536, 1 << max(0, n.bit_length() - 1)))


def steps_per_call(step_s: float, effort: MdEffort) -> int:
    """Steps that take ``effort.call_s`` at ``step_s`` seconds each, rounded to 10, within bounds."""
    if effort.call_s is None or not step_s > 0:
        return effort.steps
    n = round(effort.call_s / step_s / 10.0) * 10
    return max(effort.steps, min(effort.max_steps, n))


# ---------------------------------------------------------------------------------------------
# The workload


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_md(target: Target, timer: Timer, *, precision: str = "fp32", quick: bool = False, cells: int | None = None,
           seed: int = 0, setup: LJSetup = LJ) -> list[Metric]:
    """LJ fluid on ``target``: atom-steps/s and ns/day (argon units), verified; see the module docstring.

    ``cells`` (FCC cells a side, 4 cells^3 atoms) overrides the size chosen from the Target."""
    dtype = dtype_of(precision)
    effort = MD_EFFORT[("cpu" if target.is_cpu else "gpu", quick)]
    budget = target.memory_budget()
    if cells is None:
        cells = CPU_CELLS if target.is_cpu else md_cells(budget, target.effective_sms, precision, quick=quick)
    try:
        timing, atoms, steps, info = _simulate(target, timer, precision, dtype, effort, cells, seed, setup,
                                               build_chunk(budget, setup))
    finally:  # the system is gone by now: give its memory back (a GROMACS run may follow on this slice)
        if target.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return _metrics(timing, atoms, steps, precision, info, setup)


def _simulate(target: Target, timer: Timer, precision: str, dtype: torch.dtype, effort: MdEffort, cells: int,
              seed: int, setup: LJSetup, chunk: int) -> tuple[Timing, int, int, dict[str, Any]]:
    """Equilibrate, calibrate, time, check; (timing, atoms, steps per call, info)."""
    device = target.device
    system = LJSystem.fcc(cells, setup, dtype=dtype, device=device, seed=seed, chunk=chunk)
    system.run(effort.equilibrate)
    steps = effort.steps
    if effort.call_s is not None:  # calibrate: time a short run, size the calls from it
        _sync(device)
        t0 = time.perf_counter()
        system.run(effort.steps)
        _sync(device)
        steps = steps_per_call((time.perf_counter() - t0) / effort.steps, effort)
    rebuilds0, steps0 = system.rebuilds, system.steps
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    energies = [system.energies()]

    def call() -> None:
        system.run(steps)
        energies.append(system.energies())

    timing = timer(call, warmup=effort.warmup, repeats=effort.repeats)
    _sync(device)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if device.startswith("cuda") else float("nan")
    totals = [float(ke + pe) for ke, pe in energies]
    check = energy_drift(totals, steps)
    check_energy(check, f"LJ {precision}, {system.n} atoms")
    momentum = check_momentum(system, precision)
    forces = check_forces(system, precision)
    info: dict[str, Any] = {
        "precision": precision,
        "atoms": system.n,
        "fcc_cells": cells,
        "box_sigma": system.box,
        "density": setup.density,
        "temperature_final": 2.0 * float(energies[-1][0]) / (3 * system.n - 3),
        "dt_tau": setup.dt,
        "cutoff_sigma": setup.cutoff,
        "skin_sigma": setup.skin,
        "steps_per_call": steps,
        "calls": len(totals) - 1,
        "list": system.nlist.method,
        "list_width": system.nlist.max_neighbours,
        "steps_per_rebuild": (system.steps - steps0) / max(1, system.rebuilds - rebuilds0),
        "energy_drift_per_1000_steps": check.drift_per_1000,
        "energy_deviation": check.deviation,
        "momentum_per_atom": momentum,
        "energy_samples_in_timed_calls": "one energy evaluation per call (about one force pass)",
        "peak_memory_gb": peak_gb,
        **forces,
    }
    return timing, system.n, steps, info


def ns_per_day(steps_per_s: float, setup: LJSetup = LJ, units: ArgonUnits = ARGON) -> float:
    """Simulated nanoseconds per day of wall time, with argon's tau."""
    return steps_per_s * setup.dt * units.tau_ps * 1e-3 * 86400.0


def _metrics(timing: Timing, atoms: int, steps: int, precision: str, info: dict[str, Any],
             setup: LJSetup = LJ, units: ArgonUnits = ARGON) -> list[Metric]:
    tag = f"lj_{precision}"
    work = atoms * steps
    rates = timing.rate_samples(work)
    step_rates = timing.rate_samples(steps)
    unit_info = {
        **info,
        "units": f"argon: sigma {units.sigma_nm * 10:.2f} A, epsilon/k_B {units.epsilon_over_kb_k} K, mass {units.mass_u} u, "
                 f"tau {units.tau_ps:.4g} ps, dt {setup.dt * units.tau_ps * 1e3:.4g} fs",
        "tau_ps": units.tau_ps,
    }
    return [
        Metric(f"{tag}_atom_steps_per_s", statistics.median(rates), "atom-steps/s", "higher", rates, kind="simulation",
               info={**unit_info, **({"clocks": timing.clocks} if timing.clocks else {})}),
        Metric(f"{tag}_ns_per_day", ns_per_day(statistics.median(step_rates), setup, units), "ns/day", "higher",
               [ns_per_day(r, setup, units) for r in step_rates], kind="simulation",
               info={**unit_info, "scaling": False}),  # the system grows with the Target: atom-steps/s scales
        Metric(f"{tag}_ms_per_step", timing.median / steps * 1e3, "ms", "lower",
               [s / steps * 1e3 for s in timing.samples], kind="info", compare=False, info={"steps_per_call": steps}),
        Metric(f"{tag}_energy_drift_per_1000_steps", info["energy_drift_per_1000_steps"], "relative", "lower", [],
               kind="info", compare=False, info={"limit": DRIFT_LIMIT, "deviation": info["energy_deviation"]}),
        Metric(f"{tag}_atoms", atoms, "atoms", "higher", [], kind="info", compare=False, info={"fcc_cells": info["fcc_cells"]}),
        *energy_metrics(timing, work, "atom-step", label=tag),
    ]


# ---------------------------------------------------------------------------------------------
# GROMACS

#: Environment variable naming the GROMACS binary where it is not ``gmx`` on PATH (gmx_mpi, a module path).
GMX_ENV = "PYTEST_MIG_GMX"
#: Atoms per SM of the GROMACS argon box (~270k on a whole H100/H200, ~33k on a 16-SM slice).
GMX_ATOMS_PER_SM = 2048
GMX_CPU_CELLS = 6
#: mdrun steps (the second half is timed: -resethway) and a wall-clock cap in hours (-maxh); a run
#: the cap stopped is flagged in the metric's info (its figure may then include the start-up).
GMX_STEPS = {False: 10000, True: 2000}
GMX_MAXH = {False: 120.0 / 3600, True: 30.0 / 3600}
#: Seconds a grompp or mdrun call may take before it is killed.
GMX_TIMEOUT_S = 600
#: The integration step in ps (GROMACS's units); dt* = 0.005 is 10.8 fs for argon, GROMACS is
#: usually run at 2-5 fs: the step count per ns differs from the torch run, ns/day does not mean the same work.
GMX_DT_PS = 0.005


def gmx_binary() -> str | None:
    """The GROMACS binary: ``$PYTEST_MIG_GMX`` if set, else ``gmx`` on PATH; None if neither."""
    named = os.environ.get(GMX_ENV)
    if named:
        return shutil.which(named) or (named if os.path.isfile(named) and os.access(named, os.X_OK) else None)
    return shutil.which("gmx")


@dataclass(frozen=True)
class GromacsPerformance:
    """What a GROMACS log's closing lines say about speed."""

    ns_per_day: float
    hours_per_ns: float | None
    wall_s: float | None
    core_s: float | None


_UNIT_COLUMNS = re.compile(r"\(([^)]+)\)")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def parse_gromacs_performance(text: str) -> GromacsPerformance:
    """ns/day (and hour/ns, wall and core seconds) from md.log's closing lines::

                       Core t (s)   Wall t (s)        (%)
               Time:      123.456       30.864      400.0
                         (ns/day)    (hour/ns)
        Performance:      139.954        0.171

    The unit header is read so that a log whose columns differ (older GROMACS printed Mnbf/s and
    GFlops first) is still read right; the last Performance line of the file counts.  ValueError
    when there is none (mdrun did not finish)."""
    lines = text.splitlines()
    perf_at = [i for i, line in enumerate(lines) if line.lstrip().startswith("Performance:")]
    if not perf_at:
        raise ValueError("no 'Performance:' line in the GROMACS log: mdrun did not finish")
    i = perf_at[-1]
    values = [float(v) for v in re.findall(_NUMBER, lines[i].split(":", 1)[1])]
    units = _UNIT_COLUMNS.findall(lines[i - 1]) if i > 0 else []
    if "ns/day" not in units:
        raise ValueError(f"the GROMACS log's Performance line has no (ns/day) column: {lines[i - 1].strip()!r}")
    if len(values) != len(units):
        raise ValueError(f"the GROMACS log's Performance line does not match its units: {lines[i].strip()!r}")
    col = dict(zip(units, values))
    wall = core = None
    for line in reversed(lines[:i]):
        if line.lstrip().startswith("Time:"):
            nums = [float(v) for v in re.findall(_NUMBER, line.split(":", 1)[1])]
            if len(nums) >= 2:
                core, wall = nums[0], nums[1]
            break
    return GromacsPerformance(col["ns/day"], col.get("hour/ns"), wall, core)


def gromacs_inputs(cells: int, *, setup: LJSetup = LJ, units: ArgonUnits = ARGON, steps: int = 1000,
                   seed: int = 0) -> dict[str, str]:
    """conf.gro, topol.top and md.mdp of an argon box: the torch run's lattice, density, cutoff and
    start (velocities at 2 T*), NVE, potential-shifted LJ, no charges."""
    pos, box = fcc_lattice(cells, setup)
    nm = pos * units.sigma_nm
    box_nm = box * units.sigma_nm
    n = nm.shape[0]
    rows = [f"{(i + 1) % 100000:5d}{'AR':<5}{'AR':>5}{(i + 1) % 100000:5d}{x:8.3f}{y:8.3f}{z:8.3f}"
            for i, (x, y, z) in enumerate(nm.tolist())]
    gro = "\n".join([f"argon FCC {cells}x{cells}x{cells}, density {setup.density} sigma^-3", f"{n:5d}", *rows,
                     f"{box_nm:10.5f}{box_nm:10.5f}{box_nm:10.5f}"]) + "\n"
    top = "\n".join([
        "; argon in reduced LJ units mapped to SI: sigma, epsilon and mass from pytest_mig.workloads.md.ARGON",
        "[ defaults ]",
        "; nbfunc  comb-rule  gen-pairs  fudgeLJ  fudgeQQ",
        "  1       2          no         1.0      1.0",
        "",
        "[ atomtypes ]",
        "; name  at.num  mass  charge  ptype  sigma  epsilon",
        f"  AR    18      {units.mass_u:.3f}  0.000  A  {units.sigma_nm:.5f}  {units.epsilon_kj_mol:.6f}",
        "",
        "[ moleculetype ]",
        "; name  nrexcl",
        "  AR    1",
        "",
        "[ atoms ]",
        "; nr  type  resnr  residue  atom  cgnr  charge  mass",
        f"  1   AR    1      AR       AR    1     0.000   {units.mass_u:.3f}",
        "",
        "[ system ]",
        "argon",
        "",
        "[ molecules ]",
        f"AR  {n}",
    ]) + "\n"
    rc_nm = setup.cutoff * units.sigma_nm
    mdp = "\n".join([
        "integrator               = md",
        f"dt                       = {GMX_DT_PS}",
        f"nsteps                   = {steps}",
        "cutoff-scheme            = Verlet",
        "nstlist                  = 20",
        "pbc                      = xyz",
        "vdwtype                  = Cut-off",
        "vdw-modifier             = Potential-shift",
        f"rvdw                     = {rc_nm:.4f}",
        "coulombtype              = Reaction-Field",
        f"rcoulomb                 = {rc_nm:.4f}",
        "epsilon-rf               = 0",
        "tcoupl                   = no",
        "pcoupl                   = no",
        "gen-vel                  = yes",
        f"gen-temp                 = {setup.initial_temperature * units.epsilon_over_kb_k:.2f}",
        f"gen-seed                 = {seed + 1}",
        "nstcalcenergy            = 100",
        "nstenergy                = 0",
        "nstlog                   = 0",
        "nstxout                  = 0",
        "nstvout                  = 0",
        "nstfout                  = 0",
        "nstxout-compressed       = 0",
    ]) + "\n"
    return {"conf.gro": gro, "topol.top": top, "md.mdp": mdp}


def _omp_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _run_gmx(args: list[str], cwd: Path, what: str) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=GMX_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise WorkloadError(f"{what} did not finish in {GMX_TIMEOUT_S} s: {' '.join(args)}") from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise WorkloadError(f"{what} failed (exit {proc.returncode}): {' '.join(args)}\n{tail}")
    return proc


def gmx_gpu_support(version_text: str) -> str | None:
    """The "GPU support:" value of ``gmx --version`` (CUDA, SYCL, OpenCL, disabled), or None."""
    m = re.search(r"^\s*GPU support:\s*(.+?)\s*$", version_text, re.MULTILINE)
    return m.group(1) if m else None


def gromacs_command(gmx: str, *, nb: str, threads: int, steps: int, maxh: float) -> list[str]:
    """The mdrun argument list (no shell): one thread-MPI rank, ``threads`` OpenMP threads,
    non-bonded work on ``nb`` ("gpu" or "cpu"), the second half timed."""
    return [gmx, "-quiet", "mdrun", "-s", "topol.tpr", "-deffnm", "md", "-g", "md.log", "-nb", nb,
            "-ntmpi", "1", "-ntomp", str(threads), "-nsteps", str(steps), "-resethway", "-noconfout",
            "-maxh", f"{maxh:.6f}"]


def run_gromacs(target: Target, timer: Timer | None = None, *, quick: bool = False, gmx: str | None = None,
                cells: int | None = None, workdir: str | os.PathLike[str] | None = None,
                setup: LJSetup = LJ) -> list[Metric]:
    """GROMACS mdrun on an argon box sized like the torch run, on the Target's device: ns/day from md.log.

    The figure is GROMACS's own (the second half of the run, ``-resethway``); ``timer`` times the
    whole mdrun once (start-up included), which is what pytest-benchmark records for this test.
    Skipped (DoesNotFit) without a GROMACS binary, and under emulation: a subprocess does not run
    inside this process's green context, so it would use the whole GPU."""
    gmx = gmx or gmx_binary()
    if gmx is None:
        raise DoesNotFit(f"gmx not on PATH (or set {GMX_ENV} to a GROMACS binary)")
    if target.emulated:
        raise DoesNotFit("GROMACS runs in its own process, outside the emulated profile's green context: "
                         "it would measure the whole GPU; run it on a real MIG slice")
    nb = "cpu" if target.is_cpu else "gpu"
    version = _run_gmx([gmx, "--version"], Path.cwd(), "gmx --version").stdout
    if nb == "gpu" and (gmx_gpu_support(version) or "").lower() in ("disabled", "none"):
        raise DoesNotFit(f"{gmx} was built without GPU support (its --version says 'GPU support: "
                         f"{gmx_gpu_support(version)}'): set {GMX_ENV} to a CUDA build of GROMACS")
    if cells is None:
        cells = GMX_CPU_CELLS if target.is_cpu else cells_for_atoms(max(1, target.effective_sms or 1) * GMX_ATOMS_PER_SM)
    steps = GMX_STEPS[quick] // (10 if target.is_cpu else 1)
    threads = _omp_threads()
    with tempfile.TemporaryDirectory(prefix="pytest-mig-gmx-", dir=workdir) as tmp:
        wd = Path(tmp)
        for name, text in gromacs_inputs(cells, setup=setup, steps=steps).items():
            (wd / name).write_text(text)
        _run_gmx([gmx, "-quiet", "grompp", "-f", "md.mdp", "-c", "conf.gro", "-p", "topol.top", "-o", "topol.tpr",
                  "-po", "mdout.mdp"], wd, "gmx grompp")
        mdrun = gromacs_command(gmx, nb=nb, threads=threads, steps=steps, maxh=GMX_MAXH[quick])
        timing = (timer or Timer(target.device))(lambda: _run_gmx(mdrun, wd, "gmx mdrun"), warmup=0, repeats=1)
        log = (wd / "md.log").read_text(errors="replace")
    try:
        perf = parse_gromacs_performance(log)
    except ValueError as exc:
        raise WorkloadError(f"gmx mdrun: {exc}") from None
    if not perf.ns_per_day > 0:
        raise WorkloadError(f"gmx mdrun reported {perf.ns_per_day} ns/day")
    atoms = 4 * cells**3
    steps_per_s = perf.ns_per_day * 1e3 / GMX_DT_PS / 86400.0
    info = {
        "gmx": gmx,
        "version": _gmx_version(log),
        "atoms": atoms,
        "nb": nb,
        "ntomp": threads,
        "nsteps": steps,
        "dt_ps": GMX_DT_PS,
        "hour_per_ns": perf.hours_per_ns,
        "timed_wall_s": perf.wall_s,  # GROMACS's: the second half of the run
        "mdrun_wall_s": timing.samples[0] if timing.samples else None,  # the whole mdrun, start-up included
        "system": "argon, FCC start at density 0.8442, NVE, potential-shifted LJ cut at 2.5 sigma",
        "stopped_by_maxh": "Run time exceeded" in log,
    }
    return [
        Metric("gmx_ns_per_day", perf.ns_per_day, "ns/day", "higher", [], kind="simulation",
               info={**info, "scaling": False}),
        Metric("gmx_atom_steps_per_s", atoms * steps_per_s, "atom-steps/s", "higher", [], kind="simulation", info=info),
        Metric("gmx_atoms", atoms, "atoms", "higher", [], kind="info", compare=False, info={"fcc_cells": cells}),
    ]


def _gmx_version(log: str) -> str | None:
    m = re.search(r"^\s*GROMACS version:\s*(.+)$", log, re.MULTILINE)
    return m.group(1).strip() if m else None


__all__ = [
    "ARGON",
    "LJ",
    "PRECISION_NAMES",
    "ArgonUnits",
    "EnergyCheck",
    "GromacsPerformance",
    "LJSetup",
    "LJSystem",
    "NeighbourList",
    "build_neighbours",
    "check_energy",
    "check_forces",
    "check_momentum",
    "energy_drift",
    "fcc_lattice",
    "force_limit",
    "gmx_binary",
    "gmx_gpu_support",
    "gromacs_command",
    "gromacs_inputs",
    "images",
    "initial_velocities",
    "lj_forces",
    "md_cells",
    "ns_per_day",
    "parse_gromacs_performance",
    "reference_forces",
    "run_gromacs",
    "run_md",
    "verlet_step",
]
