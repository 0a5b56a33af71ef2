"""``--mig-device all``: the same benchmarks on every GPU or slice of the node at once, merged.

One worker process per device, each a plain pytest run pinned to its device the way a scheduler
pins a job (``CUDA_VISIBLE_DEVICES`` set to the device's UUID, ``--mig-device`` naming it), all
started together.  Their results files are merged into one, their records into one report: a row
per device and figure (the client view), the provider figures of all devices together, and the
outlier devices.  A device that is busy is not started and is named; a worker that fails is named
with its log; the others still run and are reported.

Which devices: every GPU with MIG off and every MIG instance of the GPUs with MIG on; with
``--mig-profile P`` only the instances of profile P (identical copies on every slice of that
profile, Columbia/IBM's experiment), with ``--mig-profile full`` only the GPUs with MIG off.  Where
``CUDA_VISIBLE_DEVICES`` is set (a Slurm or Kubernetes allocation), only the devices it shows.
Under emulation it is refused: green contexts on one GPU share its bandwidth and power, so they are
not independent devices.

Stopped (SIGTERM, as Kubernetes sends it to the container's first process, or Ctrl-C): the runner
passes SIGTERM on to every worker, each of which stops as a single run does and keeps the figures of
its finished tests (:mod:`pytest_mig.store.checkpoint`); it waits for them (``STOP_GRACE_S``, then kills
what is left), merges what they wrote, marks the merged file stopped and exits 2.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TextIO

from pytest_mig.report import exports

from pytest_mig.night import window
from pytest_mig.store.checkpoint import stop_on_sigterm
from pytest_mig.device.nvml import Inventory, cuda_visible
from pytest_mig.device.profiles import ALL, FULL
from pytest_mig.store.results import ResultRecord, ResultsFileError, default_results_path, read_results_file, write_results
from pytest_mig.device.target import SelectionError
from pytest_mig.common.text import shown
from pytest_mig.report.fleet import device_rows, find_device_outliers, provider_figures, provider_lines

#: Options a worker must not get from the command line: the node runner writes these itself.
OWN_OPTIONS = ("--mig-device", "--mig-results", "--mig-report", "--mig-scaling-plot", "--mig-export",
               "--mig-node-worker", "--mig-nights")
#: Options whose file each worker gets its own copy of (the device's index in the name).
PER_WORKER_FILES = ("--junitxml", "--junit-xml", "--benchmark-json")
#: Seconds a stopped worker has to write its figures and end, before it is killed (inside the 30 s
#: that Slurm's KillWait and Kubernetes' grace period give by default).
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class Device:
    """One device of the node a worker runs on."""

    uuid: str  # GPU-... or MIG-...
    gpu_index: int
    label: str  # "GPU 1 (bus 00000000:19:00.0, serial 165...)" or "GPU 0 1g.10gb MIG-..."
    busy_pids: tuple[int, ...] = ()
    env: tuple[tuple[str, str], ...] | None = None  # the worker's whole environment (an MPS client's), else the node's
    args: tuple[str, ...] = ()  # options of this worker's own (a layout's slice: its profile and slot)


def devices(inv: Inventory, profile: str | None, emulate: bool, cvd: str | None) -> list[Device]:
    """The devices ``--mig-device all`` runs on; SelectionError (one sentence) where there are none."""
    if emulate:
        raise SelectionError("--mig-device all runs identical copies on every real GPU or slice at once; under "
                             "--mig-emulate the green contexts of one GPU share its memory bandwidth and power, so "
                             "they are not independent devices: drop --mig-emulate, or --mig-device all")
    if profile and profile.lower() == ALL:
        raise SelectionError("--mig-device all with --mig-profile all: name one profile (every slice of it runs at "
                             "once) or 'full' (every GPU with MIG off)")
    if inv.error or not inv.gpus:
        raise SelectionError(f"--mig-device all found no GPU: {inv.error or 'NVML found no NVIDIA GPU'}")
    out = []
    for g in inv.gpus:
        where = ", ".join(x for x in (f"bus {g.pci_bus_id}" if g.pci_bus_id else "",
                                      f"serial {g.serial}" if g.serial else "") if x)
        name = f"GPU {g.index}" + (f" ({where})" if where else "")
        if g.mig_enabled:
            for inst in g.instances:
                if profile in (None, "") or inst.profile == profile:
                    out.append(Device(inst.uuid, g.index, f"{name} {inst.profile} {inst.uuid}", inst.busy_pids))
        elif profile in (None, "", FULL):
            out.append(Device(g.uuid, g.index, name, g.busy_pids))
    visible = cuda_visible(cvd)
    if visible is not None:  # each entry resolved as the single-device run resolves it (index, UUID, prefix)
        slices = {i.uuid for i in (inv.find_instance(v) for v in visible if v.startswith("MIG-")) if i}
        gpus = {g.index for g in (inv.find_gpu(v) for v in visible if not v.startswith("MIG-")) if g}
        out = [d for d in out if d.uuid in slices or d.gpu_index in gpus]
    if not out:
        what = f"no {profile} instance" if profile and profile != FULL else "no device"
        raise SelectionError(f"--mig-device all found {what} on this node"
                             + (f" among CUDA_VISIBLE_DEVICES={shown(cvd)}" if cvd is not None else "") + ".")
    return out


def worker_args(args: Sequence[str], device: Device, results: Path, n: int, nights: Path | None = None,
                own: Sequence[str] = OWN_OPTIONS) -> list[str]:
    """The command line of one worker: the user's, pinned to ``device``, writing ``results``, told it is
    worker ``n`` (``--mig-node-worker``) and where the node's earlier results files are
    (``--mig-nights``: the folder of ``nights``, where there is one)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        name, eq, value = a.partition("=")
        if name in own:
            skip = not eq
            continue
        if name in PER_WORKER_FILES and eq:
            p = Path(value)
            out.append(f"{name}={p.with_name(f'{p.stem}.device{n}{p.suffix}')}")
            continue
        out.append(a)
    return [*out, *device.args, "--mig-device", device.uuid, "--mig-results", str(results), "--mig-node-worker", str(n),
            *([f"--mig-nights={nights}"] if nights is not None else [])]


@dataclass
class Worker:
    device: Device
    log: Path
    results: Path
    proc: subprocess.Popen[bytes] | None = None
    returncode: int | None = None
    seconds: float = 0.0
    stopped: str | None = None  # "SIGTERM" or "interrupted" (Ctrl-C): asked to stop before it ended


def run_workers(args: Sequence[str], devs: Sequence[Device], folder: Path, out: TextIO,
                python: str = sys.executable, nights: Path | None = None, own: Sequence[str] = OWN_OPTIONS,
                first: int = 0) -> list[Worker]:
    """Start one pytest worker per free device, all at once, and wait for every one.  ``nights``: the
    folder of the node's earlier results files, where a worker finds each test's last time
    (``--mig-window``: every device plans the same night from them).  ``own``: the options the runner
    writes itself; ``first``: the number of the first worker (a layout's phases number theirs apart)."""
    workers = []
    for n, d in enumerate(devs, start=first):
        w = Worker(d, folder / f"device{n}.log", folder / f"device{n}.json")
        workers.append(w)
        if d.busy_pids:
            print(f"pytest-mig node: {d.label} is busy (pids {', '.join(map(str, d.busy_pids))}): not run", file=out)
            continue
        env = dict(d.env) if d.env is not None else dict(os.environ, CUDA_VISIBLE_DEVICES=d.uuid)
        cmd = [python, "-m", "pytest", *worker_args(args, d, w.results, n, nights, own)]
        with open(w.log, "wb") as log:
            w.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        w.seconds = time.monotonic()
    print(f"pytest-mig node: {sum(w.proc is not None for w in workers)} worker(s) started, logs in {folder}", file=out)
    stop = stop_on_sigterm()
    try:
        for w in workers:
            if w.proc is not None:  # one assignment: a stop between the two would lose the start time
                w.returncode, w.seconds = w.proc.wait(), time.monotonic() - w.seconds
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C: every worker stops and keeps what it measured
        stop_workers(workers, "SIGTERM" if stop.received else "interrupted")
    finally:
        stop.restore()
    return workers


def stop_workers(workers: Sequence[Worker], reason: str, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to every worker still running, then wait up to ``grace_s`` for them; kill what is left."""
    running = [w for w in workers if w.proc is not None and w.returncode is None]
    for w in running:
        w.stopped = reason
        if w.proc is not None and w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for w in running:
        assert w.proc is not None
        try:
            w.returncode = w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.returncode = w.proc.wait()
        w.seconds = time.monotonic() - w.seconds


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def merge(workers: Sequence[Worker], out: TextIO) -> tuple[list[ResultRecord], list[str], dict[str, Any]]:
    """Every worker's records, one sentence per device that gave none or failed, and the meta the
    node's results file keeps of theirs (each test's longest time, what a window left out)."""
    records: list[ResultRecord] = []
    metas: list[dict[str, Any]] = []
    problems = []
    for w in workers:
        if w.proc is None:
            problems.append(f"{w.device.label}: busy, not run")
            continue
        got: list[ResultRecord] = []
        if w.results.exists():
            try:
                got, meta = read_results_file(w.results)
                metas.append(meta)
            except ResultsFileError as exc:
                problems.append(f"{w.device.label}: {exc}")
        records.extend(got)
        state = ("stopped" if w.stopped else
                 {0: "passed", 1: "tests failed", 5: "no tests ran"}.get(w.returncode or 0, f"exit {w.returncode}"))
        print(f"pytest-mig node: {w.device.label}: {state} ({len(got)} figures, {w.seconds:.0f} s), log {w.log}",
              file=out)
        if w.returncode not in (0, 1, 5) and not w.stopped:
            problems.append(f"{w.device.label}: the worker ended with exit {w.returncode}: {_tail(w.log)}")
    return records, problems, window.merge_meta(metas)


def main(args: Sequence[str], inv: Inventory, profile: str | None, emulate: bool, results: str | None,
         report: str | None, out: TextIO, rootdir: Path, exports_to: Sequence[tuple[str, Path]] = ()) -> int:
    """Run ``args`` on every device, merge and report; the exit status of the whole node."""
    from pytest_mig.report.tables import frame_table, write_report

    devs = devices(inv, profile, emulate, os.environ.get("CUDA_VISIBLE_DEVICES"))
    folder = Path(tempfile.mkdtemp(prefix="pytest-mig-node-"))
    path = None if results == "none" else Path(results) if results else default_results_path(rootdir)
    workers = run_workers(args, devs, folder, out, nights=path.parent if path is not None else None)
    stopped = next((w.stopped for w in workers if w.stopped), None)
    if stopped:
        print(f"pytest-mig node: stopped ({stopped}): every worker was asked to stop; the figures of their "
              "finished tests are kept, marked incomplete", file=out)
    records, problems, kept = merge(workers, out)
    if records:
        import pandas as pd

        print(frame_table(pd.DataFrame(device_rows(records))), file=out)
        figures = provider_figures(records)
        if figures:
            print("provider figures (Columbia/IBM: all devices at once):", file=out)
            for line in provider_lines(figures):
                print(f"  {line}", file=out)
        for o in find_device_outliers(records):
            print(o.line(), file=out)
        if path is not None:
            meta = {"node_mode": [w.device.label for w in workers], "complete": not stopped, **kept}
            write_results(path, records, meta={**meta, "stopped": stopped} if stopped else meta)
            print(f"pytest-mig node: merged results of {len(devs)} device(s): {path}", file=out)
        if report:
            write_report(Path(report), records)
            print(f"pytest-mig node: report: {report}", file=out)
        try:  # the node's merged figures, every device's rows labelled by its own GPU
            for line in exports.write(exports_to, records):
                print(f"pytest-mig node: {line}", file=out)
        except exports.ExportError as exc:
            problems.append(str(exc))
    for p in problems:
        print(f"pytest-mig node: {p}", file=out)
    codes = [w.returncode for w in workers if w.proc is not None]
    failed = bool(problems) or any(c not in (0, 5) for c in codes) or not codes
    _tidy(folder, keep=failed or bool(stopped), out=out)
    if stopped:
        return 2  # pytest's "interrupted"
    return 1 if failed else (0 if any(c == 0 for c in codes) else 5)


def _tidy(folder: Path, *, keep: bool, out: TextIO) -> None:
    """Remove the workers' folder (their logs and results files, merged above) after a clean night;
    keep it, and say where, when a worker failed or the night was stopped: its logs say why."""
    if keep:
        print(f"pytest-mig node: the workers' logs are kept in {folder}", file=out)
        return
    shutil.rmtree(folder, ignore_errors=True)


__all__ = ["Device", "Worker", "devices", "main", "merge", "run_workers", "stop_workers", "worker_args"]
