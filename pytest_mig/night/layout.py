"""``--mig-layout``: identical copies of the selected tests on every slice of a MIG layout at once
(Columbia/IBM's experiment), merged, with the client, provider and isolation figures.

For each layout in turn, one worker per slice (a plain pytest run, as node mode's, :mod:`pytest_mig.night.node`):

1. **alone**: each slice by itself, its neighbours idle, one after another (under emulation one run
   per distinct profile: MPS clients of one profile are alike);
2. **together**: every slice at once, each test begun by all of them together
   (:mod:`pytest_mig.night.barrier`).

A layout of one slice runs once.  MIG on: the workers are pinned to the layout's instances, which must
exist (:func:`pytest_mig.device.layout.match_instances`).  MIG off with ``--mig-emulate``: one CUDA MPS
control daemon on private pipe and log folders serves every worker, each an MPS client with its
profile's share of the SMs and its memory; the daemon is stopped (``quit``) at the end, after a
failure, Ctrl-C or SIGTERM alike.  The figures derived from the merged records
(:mod:`pytest_mig.report.layouts`) are judged against their own history, one per layout.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TextIO

from pytest_mig.device import mps
from pytest_mig.device.layout import Layout, SlotTag, match_instances, mps_percentage, parse_layouts, resolve
from pytest_mig.device.nvml import Gpu, Inventory, cuda_visible
from pytest_mig.device.plan import gpu_profiles
from pytest_mig.device.profiles import ProfileError, lookup_model
from pytest_mig.device.target import SelectionError
from pytest_mig.judge.pipeline import Pipeline, StoreHistories
from pytest_mig.night.barrier import prepare
from pytest_mig.night.node import OWN_OPTIONS, Device, Worker, merge, run_workers
from pytest_mig.report.fleet import device_rows
from pytest_mig.report.layouts import LayoutPlotError, derived_records, layout_figures, layout_lines, plot_layouts
from pytest_mig.store.baselines import BaselineStore
from pytest_mig.store.checkpoint import stop_on_sigterm
from pytest_mig.store.history import BaselineError
from pytest_mig.store.results import ResultRecord, default_results_path, write_results

#: Options the layout runner writes itself for each worker (beside node mode's).
LAYOUT_OWN = (*OWN_OPTIONS, "--mig-layout", "--mig-layout-plot", "--mig-profile", "--mig-layout-slot",
              "--mig-layout-barrier")


@dataclass
class Planned:
    """One layout on one GPU: its slots' profiles, and the MIG instance of each where MIG is on."""

    layout: Layout
    gpu: Gpu
    instances: list[str]  # MIG-... per slot; empty under emulation


def _words(g: Gpu) -> str:
    return f"GPU {g.index} ({g.name}, MIG {'on' if g.mig_enabled else 'off'})"


def plan_layouts(inv: Inventory, text: str, emulate: bool, cvd: str | None) -> list[Planned]:
    """Every layout asked for, resolved on its GPU; SelectionError (one sentence) for any mistake."""
    if inv.error or not inv.gpus:
        raise SelectionError(f"--mig-layout found no GPU: {inv.error or 'NVML found no NVIDIA GPU'}.")
    try:
        asked = parse_layouts(text)
    except ProfileError as exc:
        raise SelectionError(f"{exc}.") from None
    gpus = list(inv.gpus)
    visible = cuda_visible(cvd)
    if visible is not None:
        found = [inv.find_gpu(v) for v in visible if not v.startswith("MIG-")]
        gpus = [g for g in gpus if g in found] or gpus
    if emulate:
        off = [g for g in gpus if not g.mig_enabled]
        if not off:
            raise SelectionError(f"--mig-layout with --mig-emulate needs a GPU with MIG mode off, but "
                                 f"{_words(gpus[0])} has MIG on: drop --mig-emulate to run on its instances.")
        g = off[0]
        out = [Planned(resolve(a, items, gpu_profiles(g), _words(g)), g, []) for a, items in asked]
        model = lookup_model(g.name, g.memory_mib)
        if model is None or not model.sms or any(not s.sms for s in gpu_profiles(g)):
            raise SelectionError(f"--mig-layout under emulation needs the SM count of every profile of {_words(g)}, "
                                 "which the catalog does not have.")
        return out
    on = [g for g in gpus if g.mig_enabled]
    if not on:
        raise SelectionError(f"--mig-layout: {_words(gpus[0])} has MIG mode off, so there are no instances to run "
                             f"the layout on: add --mig-emulate to confine each slice with CUDA MPS instead.")
    out = []
    for a, items in asked:
        errors = []
        for g in on:
            try:
                lay = resolve(a, items, gpu_profiles(g), _words(g))
                out.append(Planned(lay, g, [i.uuid for i in match_instances(lay, g, _words(g))]))
                break
            except SelectionError as exc:
                errors.append(str(exc))
        else:
            raise SelectionError(errors[0])
    return out


def slot_devices(p: Planned, phase: str, daemon: mps.Mps | None, slots: Sequence[int],
                 barrier: Path | None = None) -> list[Device]:
    """The workers of ``slots`` of a planned layout in ``phase``: pinned to the instance, or MPS clients;
    ``barrier``: the folder through which they begin each test together (:mod:`pytest_mig.night.barrier`)."""
    specs = {s.name: s for s in gpu_profiles(p.gpu)}
    model = lookup_model(p.gpu.name, p.gpu.memory_mib)
    out = []
    for k in slots:
        profile = p.layout.profiles[k]
        tag = SlotTag(p.layout.name, phase, k, "mps" if daemon is not None else "mig")
        args = ("--mig-profile", profile, "--mig-layout-slot", tag.arg())
        if barrier is not None:  # one word: pytest takes a folder given as its own word for a test path
            # No re-measuring together: a slice re-measures a test after the others have gone on (they
            # wait idle for it at the next test), so a re-measurement would run without the neighbours
            # its figure is about and clear a loss of isolation as transient.
            args += (f"--mig-layout-barrier={barrier}", "--mig-confirm=0")
        if daemon is None:
            uuid = p.instances[k]
            out.append(Device(uuid, p.gpu.index, f"GPU {p.gpu.index} {p.layout.name} slot {k} {profile} {uuid} "
                              f"({phase})", args=args))
            continue
        spec = specs[profile]
        pct = mps_percentage(int(spec.sms or 0), int(model.sms if model else 0))
        env = daemon.client_env(os.environ, percentage=pct, memory_limit_bytes=spec.memory_bytes)
        out.append(Device(p.gpu.uuid, p.gpu.index, f"GPU {p.gpu.index} {p.layout.name} slot {k} {profile} (emulated, "
                          f"MPS {pct:g}% of the SMs) ({phase})", env=tuple(env.items()), args=args))
    return out


def alone_slots(p: Planned, emulated: bool) -> list[int]:
    """The slots run alone: every one on MIG, the first of each profile under emulation; none for a layout
    of one slice."""
    if p.layout.slices < 2:
        return []
    if not emulated:
        return list(range(p.layout.slices))
    first: dict[str, int] = {}
    for k, prof in enumerate(p.layout.profiles):
        first.setdefault(prof, k)
    return sorted(first.values())


def run_layouts(args: Sequence[str], planned: Sequence[Planned], daemon: mps.Mps | None, folder: Path,
                out: TextIO, nights: Path | None) -> list[Worker]:
    """Each layout's alone runs, one at a time, then its slices together; stops at the first stopped phase."""
    workers: list[Worker] = []
    for p in planned:
        phases = [[k] for k in alone_slots(p, daemon is not None)] + [list(range(p.layout.slices))]
        for n, slots in enumerate(phases):
            phase = "together" if n == len(phases) - 1 else "alone"
            gate = prepare(folder / f"barrier{len(workers)}", len(slots)) if len(slots) > 1 else None
            devs = slot_devices(p, phase, daemon, slots, gate)
            print(f"pytest-mig layout: {p.layout.name} on GPU {p.gpu.index}, {phase}: "
                  f"{', '.join(p.layout.profiles[k] for k in slots)}", file=out)
            got = run_workers(args, devs, folder, out, nights=nights, own=LAYOUT_OWN, first=len(workers))
            workers.extend(got)
            if any(w.stopped for w in got):
                return workers
    return workers


def main(args: Sequence[str], inv: Inventory, text: str, emulate: bool, results: str | None, plot: str | None,
         out: TextIO, rootdir: Path, baseline_dir: Path, save: str | None) -> int:
    """Run every layout, merge, derive and judge the layout figures; the exit status of the whole run.
    ``save``: 'always' (--mig-save-baseline), 'if-passed' (--mig-save-if-passed) or None."""
    planned = plan_layouts(inv, text, emulate, os.environ.get("CUDA_VISIBLE_DEVICES"))
    folder = Path(tempfile.mkdtemp(prefix="pytest-mig-layout-"))
    path = None if results == "none" else Path(results) if results else default_results_path(rootdir)
    daemon = None
    sigterm = stop_on_sigterm()
    try:
        if emulate:
            try:  # one daemon for every worker, on private folders, serving this GPU alone
                daemon = mps.start({**os.environ, "CUDA_VISIBLE_DEVICES": planned[0].gpu.uuid}, private=True)
            except mps.MpsUnavailable as exc:
                raise SelectionError(f"--mig-layout under --mig-emulate confines each slice with CUDA MPS: {exc}.") \
                    from None
            print(f"pytest-mig layout: CUDA MPS daemon started (pipe {daemon.pipe_dir}); figures are emulated: "
                  "MPS partitions SMs and memory, not memory bandwidth or L2 as MIG does", file=out)
        workers = run_layouts(args, planned, daemon, folder, out, path.parent if path is not None else None)
    except KeyboardInterrupt:
        print("pytest-mig layout: stopped before the workers ended", file=out)
        return 2
    finally:
        if daemon is not None:
            daemon.stop()
            print("pytest-mig layout: CUDA MPS daemon stopped (quit)", file=out)
        sigterm.restore()
    return _report(workers, out, path, plot, baseline_dir, save, folder)


def _report(workers: Sequence[Worker], out: TextIO, path: Path | None, plot: str | None, baseline_dir: Path,
            save: str | None, folder: Path) -> int:
    stopped = next((w.stopped for w in workers if w.stopped), None)
    records, problems, kept = merge(workers, out)
    derived: list[ResultRecord] = []
    if records:
        import pandas as pd

        from pytest_mig.report.tables import frame_table

        print(frame_table(pd.DataFrame(device_rows(records))), file=out)
        for line in slot_problems(records):
            print(f"pytest-mig layout: {line}", file=out)
        figures = layout_figures(records)
        for line in layout_lines(figures):
            print(f"pytest-mig layout: {line}", file=out)
        derived = derived_records(figures, records)
        problems += _judge(derived, baseline_dir, save, ok=not problems and not stopped and _codes_ok(workers), out=out)
        if plot:
            try:
                print(f"pytest-mig layout: plot: {plot_layouts(figures, plot)}", file=out)
            except LayoutPlotError as exc:
                problems.append(str(exc))
        if path is not None:
            meta = {"layout_mode": [w.device.label for w in workers], "complete": not stopped, **kept}
            write_results(path, records + derived, meta={**meta, "stopped": stopped} if stopped else meta)
            print(f"pytest-mig layout: merged results: {path}", file=out)
    for p in problems:
        print(f"pytest-mig layout: {p}", file=out)
    failed = bool(problems) or not _codes_ok(workers) or any(v.verdict is not None and v.verdict.failed
                                                            for v in derived)
    print(f"pytest-mig layout: the workers' logs are in {folder}", file=out)
    return 2 if stopped else 1 if failed else 0


def slot_problems(records: Sequence[ResultRecord]) -> list[str]:
    """What the slices' start-up checks found wrong (an MPS client's half-precision products), once per
    layout and profile: ``layout, profile: sentence``."""
    found = {(str(r.target.extra.get("layout", "")), str(r.target.profile), str(r.target.extra["layout_slot_problem"]))
             for r in records if r.target.extra.get("layout_slot_problem")}
    return [f"{layout}, {profile}: {problem}" for layout, profile, problem in sorted(found)]


def _codes_ok(workers: Sequence[Worker]) -> bool:
    codes = [w.returncode for w in workers if w.proc is not None]
    return bool(codes) and all(c in (0, 5) for c in codes)


def _judge(derived: list[ResultRecord], baseline_dir: Path, save: str | None, *, ok: bool, out: TextIO) -> list[str]:
    """Judge the layout figures against their histories; save them where asked (and, for
    --mig-save-if-passed, where every worker and figure passed).  The problems, one sentence each."""
    store = BaselineStore(baseline_dir)
    try:
        verdicts = Pipeline(StoreHistories(store)).judge_runs(derived)
    except BaselineError as exc:
        return [str(exc)]
    for v in verdicts:
        if v.failed:
            print(f"pytest-mig layout: FAIL {v.line()}", file=out)
    if save == "always" or (save == "if-passed" and ok and not any(v.failed for v in verdicts)):
        try:
            store.save(derived)
            print(f"pytest-mig layout: the layout figures were added to their histories in {baseline_dir}", file=out)
        except BaselineError as exc:
            return [str(exc)]
    return []


__all__ = ["LAYOUT_OWN", "Planned", "alone_slots", "main", "plan_layouts", "run_layouts", "slot_devices",
           "slot_problems"]
