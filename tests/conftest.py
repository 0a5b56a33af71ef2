"""Fixtures shared by the plugin's selection tests (test_target.py, test_plugin.py).

They stand in for what a CPU-only machine lacks, one seam each: NVML (the fake pynvml loaded with a
real GPU's topology), CUDA (``pytest_mig.device.target.cuda_props``), green-context support
(``torch.cuda.green_contexts.SUPPORTED``) and the emulator (``pytest_mig.device.emulation.Emulator``).
Everything they change is undone after the test, ``os.environ`` included (``pin`` writes to it).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import fake_pynvml
import topologies as topo
from pytest_mig.device import emulation
from pytest_mig.device import nvml
from pytest_mig.device import target
from pytest_mig.judge import verdict as _verdict  # noqa: F401  (numpy and scipy are imported once, before in-process runs)
from scipy import stats as _stats  # noqa: F401  (pytest-mig imports it only when a sigma is computed: here, before
#   any in-process run, since pytester forgets what an inner run imported and numpy's C modules load once per process)
from pytest_mig.measure import Timer
from pytest_mig.device.profiles import lookup_model
from pytest_mig.device.target import CudaProps, Target

#: What the plugin reads from the environment; a test starts without any of them.
MIG_ENV = ("CUDA_VISIBLE_DEVICES", "PYTEST_MIG_PROFILE")


@pytest.fixture
def mig_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No scheduler pin and no profile in the environment; whatever pin() writes is undone afterwards.

    Setting each variable before deleting it makes monkeypatch remember that it was unset, so a value
    written later by pin() is removed at teardown too (a bare delenv of an unset variable records nothing).
    """
    for name in MIG_ENV:
        monkeypatch.setenv(name, "set-by-mig_env")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def discover(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], nvml.Inventory]:
    """discover(topology) -> the Inventory pytest_mig.device.nvml reads through the fake pynvml."""

    def read(topology: Any) -> nvml.Inventory:
        with monkeypatch.context() as m:
            fake_pynvml.install(m, topology)
            return nvml.discover()

    return read


def _cuda_props_of(topology: str | topo.Topology, uuid: str | None = None) -> CudaProps:
    t = topo.get_topology(topology) if isinstance(topology, str) else topology
    if uuid is not None and uuid.startswith("MIG-"):
        gpu_index, inst = topo.find_instance(t, uuid)
        gpu = t.gpus[gpu_index]
        return CudaProps(f"{gpu.name} MIG {inst.profile}", inst.sms, inst.memory_mb * topo.MIB, gpu.compute_capability)
    gpu = t.gpus[topo.find_gpu(t, uuid) if uuid else 0]
    model = lookup_model(gpu.name, gpu.memory_mib)
    sms = model.sms if model else 128
    return CudaProps(gpu.name, sms, gpu.memory_mib * topo.MIB, gpu.compute_capability)


@pytest.fixture
def cuda_props_of() -> Callable[..., CudaProps]:
    """cuda_props_of(topology, uuid=None): what CUDA would report for a MIG instance (by UUID) or a whole
    GPU (by UUID; default GPU 0) of that topology."""
    return _cuda_props_of


@pytest.fixture
def stand_in_cuda(monkeypatch: pytest.MonkeyPatch) -> Callable[[CudaProps | None], None]:
    """stand_in_cuda(props): what pytest_mig.device.target.cuda_props answers (None: a torch without CUDA)."""

    def answer(props: CudaProps | None) -> None:
        monkeypatch.setattr(target, "cuda_props", lambda: props)

    return answer


@pytest.fixture
def green_contexts(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """green_contexts(supported): set torch.cuda.green_contexts.SUPPORTED, which target checks."""
    import torch.cuda

    module = getattr(torch.cuda, "green_contexts", None)
    if module is None:  # a torch older than 2.10: give it the module the check imports
        module = types.ModuleType("torch.cuda.green_contexts")
        monkeypatch.setattr(torch.cuda, "green_contexts", module, raising=False)
        monkeypatch.setitem(__import__("sys").modules, "torch.cuda.green_contexts", module)

    def supported(value: bool) -> None:
        monkeypatch.setattr(module, "SUPPORTED", value, raising=False)

    return supported


class StandInEmulator:
    """pytest_mig.device.emulation.Emulator without a GPU: "obtains" the SMs rounded up to a multiple of 8, as
    Hopper's driver does (at most the H200's 132), and records which profiles it activated."""

    activated: list[str] = []
    device_sms = 132
    escape: str | None = None  # what escaped() says while a test runs (set by a test)

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index
        self._running = False

    @contextlib.contextmanager
    def activate(self, t: Target) -> Iterator[Target]:
        type(self).activated.append(t.profile)
        obtained = min(-(-(t.sms or 0) // 8) * 8, self.device_sms)
        note = f"stand-in green context: {t.sms} SMs asked, {obtained} obtained"
        self._running = True
        try:
            yield replace(t, sms_obtained=obtained, verified=note)
        finally:
            self._running = False

    def escaped(self) -> str | None:
        return type(self).escape if self._running else None


@pytest.fixture
def stand_in_emulator(monkeypatch: pytest.MonkeyPatch) -> type[StandInEmulator]:
    """Replace the emulator the plugin starts for an emulated run; returns the class (see .activated)."""
    monkeypatch.setattr(StandInEmulator, "activated", [])
    monkeypatch.setattr(StandInEmulator, "escape", None)
    monkeypatch.setattr(emulation, "Emulator", StandInEmulator)
    return StandInEmulator


# ------------------------------------------------------------------------------------------------
# Workload tests: the CPU Target and a plain timer.


@pytest.fixture
def cpu() -> target.Target:
    """The Target of a run without a GPU: workloads run at their tiny CPU sizes."""
    return target.Target(kind="cpu", profile="cpu", chosen_by="test")


@pytest.fixture
def timer() -> Timer:
    return Timer("cpu")


@pytest.fixture
def one_thread() -> Iterator[None]:
    """For tiny CPU workloads: one torch thread is faster than a team (and immune to a loaded machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def machine(
    mig_env: pytest.MonkeyPatch, stand_in_cuda: Callable[[CudaProps | None], None],
    cuda_props_of: Callable[..., CudaProps],
) -> Callable[..., None]:
    """machine(topology, cuda=None): NVML shows that topology; CUDA shows the MIG instance or GPU with
    UUID ``cuda`` ("gpu0" for GPU 0, None for a torch without CUDA)."""

    def make(topology: Any, cuda: str | None = None) -> None:
        fake_pynvml.install(mig_env, topology)
        stand_in_cuda(None if cuda is None else cuda_props_of(topology, None if cuda == "gpu0" else cuda))

    return make


@pytest.fixture
def stack(tmp_path: Path) -> Path:
    """The stack's cache folder, where the largest batches are remembered (workloads.batch_search,
    given as ``Caches(stack=stack)``)."""
    return tmp_path / "stack"


#: Test files whose tests run real processes (pytest runs, the recipes, the example, node workers, the
#: docs build): all of them end to end.
END_TO_END_FILES = {"test_stopped_run.py", "test_recipes.py", "test_examples.py", "test_node.py", "test_docs.py",
                    "test_calibrate_detection.py", "test_shared_store.py", "test_kept_outputs.py"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: an end-to-end test (a real pytest run or another process); "
                                       "python -m pytest tests -m 'not e2e' runs the fast tests of objects alone")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the end-to-end tests: those that drive a real pytest run (``pytester``) and the files of
    :data:`END_TO_END_FILES`."""
    for item in items:
        if "pytester" in getattr(item, "fixturenames", ()) or item.path.name in END_TO_END_FILES:
            item.add_marker(pytest.mark.e2e)
