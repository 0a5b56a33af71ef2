"""Simulated nights of a fleet, made from one real recorded night: the input of ``pytest-mig report``'s
fleet test and of the 1,000-GPU timing in docs/fleet.md.

Each simulated GPU gets a copy of the recorded night's results file with its own board (a new UUID,
serial, PCI bus id and index; eight GPUs to a node, nodes named ``node-000``, ``node-001``, ...), every
figure (and its samples) multiplied by 1 + a normal draw of sigma ``noise``; one board is made ``slow``
worse (its "higher" figures divided by 1 + slow, its "lower" ones multiplied).  The verdicts are the
recorded night's as they were.  Seeded: the same arguments write the same files.

    python tests/fleet_nights.py docs/results/h100-nights-2026-11-26.tgz OUT --gpus 1000 --slow-gpu 421

reads ``night2.json`` of the archive (or a results file given directly) and writes OUT/gpu-0000.json ...
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import tarfile
import uuid
from pathlib import Path
from typing import Any

#: The recorded night the docs' fleet timing copies (a real H100 night, in docs/results).
ARCHIVE = Path(__file__).resolve().parent.parent / "docs" / "results" / "h100-nights-2026-11-26.tgz"
NIGHT = "night2.json"
GPUS_PER_NODE = 8


def read_night(source: Path, member: str = NIGHT) -> dict[str, Any]:
    """A results document from a ``.tgz`` (its member ending in ``member``) or a results file."""
    if source.suffix in (".tgz", ".gz"):
        with tarfile.open(source) as tar:
            name = next(m for m in tar.getnames() if m.endswith("/" + member) or m == member)
            handle = tar.extractfile(name)
            assert handle is not None
            return json.loads(handle.read())
    return json.loads(source.read_text())


def board(i: int, rng: random.Random) -> dict[str, Any]:
    """The identity of simulated GPU ``i``: node, index, UUID, serial, PCI bus id."""
    index = i % GPUS_PER_NODE
    return {"node": f"node-{i // GPUS_PER_NODE:03d}", "gpu_index": index,
            "uuid": f"GPU-{uuid.UUID(int=rng.getrandbits(128))}", "gpu_serial": str(1650000000000 + i),
            "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0"}


def simulate(night: dict[str, Any], i: int, *, noise: float, slow: float, seed: int) -> dict[str, Any]:
    """Simulated GPU ``i``'s copy of ``night`` (``slow`` > 0: this board is that much worse)."""
    rng = random.Random(seed * 1_000_003 + i)
    who = board(i, rng)
    doc = copy.deepcopy(night)
    for target in [doc.get("meta", {}).get("target")] + [r["target"] for r in doc["records"]]:
        if target:
            target.update(gpu_index=who["gpu_index"], gpu_uuid=who["uuid"], uuid=who["uuid"],
                          gpu_serial=who["gpu_serial"], pci_bus_id=who["pci_bus_id"])
    for fp in [doc.get("meta", {}).get("fingerprint")] + [r["fingerprint"] for r in doc["records"]]:
        if fp and "gpu_uuid" in fp:
            fp["gpu_uuid"] = who["uuid"]
    for r in doc["records"]:
        r["node"] = who["node"]
        m = r["metric"]
        factor = 1 + rng.gauss(0.0, noise)
        if slow:
            factor *= 1 / (1 + slow) if m["direction"] == "higher" else 1 + slow
        if isinstance(m.get("value"), (int, float)):
            m["value"] = m["value"] * factor
        if m.get("samples"):
            m["samples"] = [x * factor for x in m["samples"]]
    return doc


def write_fleet(night: dict[str, Any], out: Path, gpus: int, *, slow_gpu: int | None, slow: float = 0.08,
                noise: float = 0.003, seed: int = 0) -> list[Path]:
    """Write ``gpus`` simulated nights into ``out``; the paths, in order."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(gpus):
        doc = simulate(night, i, noise=noise, slow=slow if i == slow_gpu else 0.0, seed=seed)
        path = out / f"gpu-{i:04d}.json"
        path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="a results file, or a .tgz holding night2.json")
    p.add_argument("out", type=Path, help="folder to write gpu-NNNN.json into")
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--slow-gpu", type=int, default=None, help="index of the slow board (default: none)")
    p.add_argument("--slow", type=float, default=0.08, help="how much worse the slow board is (0.08: 8%%)")
    p.add_argument("--noise", type=float, default=0.003, help="sigma of each figure's noise (0.003: 0.3%%)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    paths = write_fleet(read_night(args.source), args.out, args.gpus, slow_gpu=args.slow_gpu, slow=args.slow,
                        noise=args.noise, seed=args.seed)
    print(f"{len(paths)} results files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
