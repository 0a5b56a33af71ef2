"""OpenMM run the way a user writes it, for the suite's overhead check (docs/benchmarks.md).

Same system and settings as pytest-mig's test_openmm: amber14 + TIP3P-FB, PME 0.9 nm, HBonds,
rigid water, hydrogen mass 1.5 amu, LangevinMiddleIntegrator 300 K / 1 ps^-1 / 4 fs, CUDA platform.
Prints one JSON line: ns/day over the timed steps.

    python docs/plain/openmm_plain.py --system water-23k --precision mixed --seconds 6

``--loop integrator`` steps with ``integrator.step`` as the suite's worker does, instead of
``Simulation.step`` (which advances 10 steps per call into the integrator), to tell the two apart.
"""

import argparse
import json
import os
import time

import openmm
import openmm.app as app
import openmm.unit as unit

parser = argparse.ArgumentParser()
parser.add_argument("--system", default="water-23k", choices=["water-23k", "water-92k", "popc-membrane"])
parser.add_argument("--precision", default="mixed")
parser.add_argument("--seconds", type=float, default=6.0)
parser.add_argument("--loop", default="simulation", choices=["simulation", "integrator"])
parser.add_argument("--platform", default="CUDA", choices=["CUDA", "CPU"])
args = parser.parse_args()

ff = app.ForceField("amber14-all.xml", "amber14/tip3pfb.xml")
if args.system == "popc-membrane":
    pdb = app.PDBFile(os.path.join(os.path.dirname(app.__file__), "data", "POPC.pdb"))
    topology, positions = pdb.topology, pdb.positions
else:
    side = {"water-23k": 6.2, "water-92k": 9.78}[args.system]
    modeller = app.Modeller(app.Topology(), [])
    modeller.addSolvent(ff, model="tip3p", boxSize=openmm.Vec3(side, side, side) * unit.nanometer)
    topology, positions = modeller.topology, modeller.positions
system = ff.createSystem(topology, nonbondedMethod=app.PME, nonbondedCutoff=0.9 * unit.nanometer,
                         constraints=app.HBonds, rigidWater=True, hydrogenMass=1.5 * unit.amu)
integrator = openmm.LangevinMiddleIntegrator(300 * unit.kelvin, 1 / unit.picosecond, 4 * unit.femtosecond)
platform = openmm.Platform.getPlatformByName(args.platform)
properties = {"Precision": args.precision} if args.platform == "CUDA" else {}
simulation = app.Simulation(topology, system, integrator, platform, properties)
simulation.context.setPositions(positions)
simulation.minimizeEnergy(maxIterations=200)
simulation.context.setVelocitiesToTemperature(300 * unit.kelvin)

advance = simulation.step if args.loop == "simulation" else integrator.step
warm_until = time.perf_counter() + 2.0  # warm-up, as long as the suite's
while time.perf_counter() < warm_until:
    advance(500)
    simulation.context.getState(getPositions=True)
start = time.perf_counter()
advance(100)
simulation.context.getState(getPositions=True)
per_step = (time.perf_counter() - start) / 100
steps = max(100, int(args.seconds / per_step))
start = time.perf_counter()
advance(steps)
simulation.context.getState(getPositions=True)
elapsed = time.perf_counter() - start
ns_per_day = steps * 4e-6 / elapsed * 86400
print(json.dumps({"system": args.system, "precision": args.precision, "loop": args.loop, "atoms": topology.getNumAtoms(),
                  "steps": steps, "seconds": elapsed, "ns_per_day": ns_per_day}))
