"""OpenMM systems built once and read back on later nights.

Building a benchmark system is pure Python that gives the same System every night:
``Modeller.addSolvent`` and ``createSystem`` took 9.3 s for the 92k-atom water box and 2.6 s for each
of the three 23.5k-atom runs (mixed, single and double precision build the same box) on the CPU-only
development machine, and 15.8 s and 5.1 s on an H100 host's CPU.  The built System (OpenMM's own XML serialisation) and its
positions are kept in one JSON file in ``.mig-compile-cache/openmm-systems/``
(``Caches.built_systems``, made by :func:`pytest_mig.night.nights.compile_caches`), named by a digest of
everything the build depends on (the system, the force field and its settings, OpenMM's version).
A new driver, CUDA or torch changes none of that, so the first night after one reads them too.

Nothing in the file is a measurement, and nothing is trusted blindly: a file that is missing,
unreadable, from another build, or whose System does not hold as many particles as it has positions
is built again and rewritten (atomically: a reader never sees half a file).  Where there is no
folder, or it cannot be written, the system is built every time, as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable
from pytest_mig.common.files import FileProblem, atomic_write_text, read_json

#: Bumped when the file's layout changes: an older file is then rebuilt, never misread.
FORMAT = 1


def build_key(system: Any, settings: dict[str, Any], openmm_version: str) -> str:
    """A digest of everything the built System depends on (16 hex digits)."""
    text = json.dumps({"format": FORMAT, "system": dataclasses.asdict(system), "settings": settings,
                       "openmm": openmm_version}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_path(name: str, key: str, folder: Path | None) -> Path | None:
    """The file of the system ``name`` built as ``key`` in ``folder`` (the built systems' folder); None
    where there is no folder."""
    return Path(folder) / f"{name}-{key}.json" if folder is not None else None


def load(path: Path | None, key: str) -> tuple[Any, list[tuple[float, float, float]]] | None:
    """(System, positions in nm) from ``path``, or None where it is absent or not exactly this build's."""

    if path is None:
        return None
    try:
        if not path.is_file():  # not a folder, a pipe or a device: a file or nothing
            return None
        doc = read_json(path)
    except (OSError, FileProblem):
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != key:
        return None
    positions, xml = doc.get("positions_nm"), doc.get("system_xml")
    if not isinstance(positions, list) or not positions or not isinstance(xml, str):
        return None
    if not all(isinstance(p, list) and len(p) == 3
               and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in p)
               for p in positions):
        return None
    try:
        import openmm

        system = openmm.XmlSerializer.deserialize(xml)
    except Exception:  # OpenMM raises its own exception type for a malformed document
        return None
    if system.getNumParticles() != len(positions):
        return None
    return system, [(float(x), float(y), float(z)) for x, y, z in positions]


def store(path: Path | None, key: str, system: Any, positions_nm: list[tuple[float, float, float]]) -> bool:
    """Write the built System and its positions; False where the folder cannot be written (no error)."""
    if path is None:
        return False
    import openmm

    doc = {"format": FORMAT, "key": key, "openmm": openmm.__version__,
           "positions_nm": [[float(x), float(y), float(z)] for x, y, z in positions_nm],
           "system_xml": openmm.XmlSerializer.serialize(system)}
    try:
        atomic_write_text(path, json.dumps(doc, allow_nan=False))
    except (OSError, ValueError):
        return False
    return True


def cached_build(system: Any, settings: dict[str, Any], build: Callable[[], tuple[Any, Any]],
                 folder: Path | None = None) -> tuple[Any, list[tuple[float, float, float]], bool]:
    """(System, positions in nm, read from the cache) for ``system``: the copy kept in ``folder`` (the
    built systems' folder, ``Caches.built_systems``) where it holds, else ``build()`` (returning the
    System and positions as an OpenMM Quantity), stored there for next time.  Without a folder the
    system is built and nothing is kept."""
    import openmm
    import openmm.unit as unit

    key = build_key(system, settings, openmm.__version__)
    path = cache_path(system.name, key, folder)
    found = load(path, key)
    if found is not None:
        return found[0], found[1], True
    mm_system, positions = build()
    nm = [(float(p[0]), float(p[1]), float(p[2])) for p in positions.value_in_unit(unit.nanometer)]
    store(path, key, mm_system, nm)
    return mm_system, nm, False
