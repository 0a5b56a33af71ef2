"""Imports made while the run waits on a worker (pytest_mig.workloads.preload), and the marker that names them."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from test_plugin import run, usage_error

from pytest_mig.workloads import preload
from pytest_mig.workloads import DoesNotFit, hf
from pytest_mig.workloads import openmm_md as om


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write importable modules; none is expected before or after the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(body)
        written.append(name)
        return name

    preload.forget()
    yield write
    preload.forget()
    for name in written:
        sys.modules.pop(name, None)


def test_the_expected_modules_are_imported_in_a_thread_while_the_body_waits(modules) -> None:
    slow = modules("pm_slow", "import threading, time\nTHREAD = threading.current_thread().name\ntime.sleep(0.2)\n")
    broken = modules("pm_broken", "raise RuntimeError('a module that cannot be imported')\n")
    preload.expect([broken, slow, slow])
    assert preload.pending() == [broken, slow]  # once each, in order
    with preload.while_waiting():
        waited = time.perf_counter()
        while slow not in sys.modules and time.perf_counter() - waited < 10:
            time.sleep(0.01)  # the body waits, as the OpenMM test waits on its worker
        started_in_body = slow in sys.modules
    assert started_in_body  # imported while the body ran, not after it
    assert sys.modules[slow].THREAD == "pytest-mig-preload"  # in its own thread, not the caller's
    assert not any(t.name == "pytest-mig-preload" for t in threading.enumerate())  # joined before the caller goes on
    assert broken not in sys.modules and preload.pending() == [broken]  # a failed import is left to its test


def test_the_thread_is_joined_even_where_the_body_returns_first(modules) -> None:
    slow = modules("pm_slower", "import time\ntime.sleep(0.3)\n")
    preload.expect([slow])
    started = time.perf_counter()
    with preload.while_waiting():
        pass
    assert slow in sys.modules and time.perf_counter() - started >= 0.3
    with preload.while_waiting():  # nothing pending: no thread
        assert not any(t.name == "pytest-mig-preload" for t in threading.enumerate())


def test_an_import_that_hangs_does_not_hang_the_run(modules, monkeypatch: pytest.MonkeyPatch) -> None:
    hangs = modules("pm_hangs", "import time\ntime.sleep(3)\n")
    monkeypatch.setattr(preload, "JOIN_TIMEOUT_S", 0.2)
    preload.expect([hangs])
    started = time.perf_counter()
    with preload.while_waiting():
        pass
    assert time.perf_counter() - started < 2  # the run goes on; the import finishes on its own
    for thread in threading.enumerate():
        if thread.name == "pytest-mig-preload":
            thread.join()
    assert hangs in sys.modules


def test_openmm_imports_what_is_expected_while_its_worker_runs(modules, cpu, monkeypatch: pytest.MonkeyPatch) -> None:
    later = modules("pm_later", "X = 1\n")
    preload.expect([later])
    seen: list[bool] = []

    def worker(request, env):
        waited = time.perf_counter()
        while later not in sys.modules and time.perf_counter() - waited < 10:
            time.sleep(0.01)
        seen.append(later in sys.modules)
        raise DoesNotFit("the worker stops here")

    monkeypatch.setattr(om, "installed", lambda: True)
    monkeypatch.setattr(om, "_run_worker", worker)
    with pytest.raises(DoesNotFit, match="the worker stops here"):
        om.run_openmm(cpu)
    assert seen == [True]


def test_each_training_case_names_what_building_its_model_imports() -> None:
    import importlib.util

    from benchmarks.test_training import CASES, _param

    for case in CASES:
        marks = [m for m in _param(case).marks if m.name == "mig_imports"]
        assert len(marks) == 1 and marks[0].args == hf.imports(case.config, case.mode)
        assert ("peft" in marks[0].args) == (case.mode != "full")
        assert f"transformers.models.{hf.CONFIGS[case.config].layout}.modeling_{hf.CONFIGS[case.config].layout}" \
            in marks[0].args
    for layout, names in hf.IMPORTS.items():  # every name is a module transformers has
        for name in names:
            assert importlib.util.find_spec(name) is not None, name


MARKED = """
import pytest

@pytest.mark.mig_imports({args})
def test_marked():
    pass
"""


def test_a_malformed_imports_marker_is_one_sentence_at_start_up(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED.format(args="3"))
    assert usage_error(run(pytester)) == (
        "test_a_malformed_imports_marker_is_one_sentence_at_start_up.py::test_marked: @pytest.mark.mig_imports needs "
        "module names, e.g. @pytest.mark.mig_imports('transformers.modeling_utils'); got (3,).")


@pytest.mark.parametrize("gpu", [False, True])
def test_a_gpu_run_expects_the_marked_imports_and_a_cpu_run_none(pytester: pytest.Pytester, machine, gpu: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import topologies as topo

    expected: list[list[str]] = []
    monkeypatch.setattr(preload, "expect", lambda names: expected.append(list(names)))
    if gpu:
        machine("a100-40gb-mixed", cuda=topo.A100_40_GPU1)
    pytester.makepyfile(MARKED.format(args="'json', 'email.parser'"))
    result = run(pytester, *(["--mig-profile", "full"] if gpu else []))
    assert result.ret == 0
    # on the CPU a worker's engine uses every core, so nothing would overlap: no import is expected
    assert expected == ([["json", "email.parser"]] if gpu else [])
