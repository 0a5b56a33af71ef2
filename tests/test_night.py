"""The night's time: tests that gate nothing are left out (and run on request), compile caches per
software stack beside the baselines, each test's seconds kept in the results file, and the progress
line's estimate of the time left."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from test_verdict_flow import QUIET, TEST_ID, h200  # noqa: F401

from pytest_mig.store.history import BaselineEntry, Run
from pytest_mig.night.nights import CACHE_FOLDER, Progress, compile_caches, gates_nothing, last_runs, stack_key
from pytest_mig.judge.reference import ReferenceStore, build
from pytest_mig.store.results import read_results_file
from pytest_mig.workloads.caches import Caches

Run_ = Callable[..., pytest.RunResult]
FP = {"gpu_name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda_driver": 13000, "torch": "2.11.0"}


def test_compile_caches_live_beside_the_baselines_one_folder_per_stack(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    caches = compile_caches(tmp_path / "baselines", FP, env, references=tmp_path / "refs")
    folder = caches.stack
    assert folder == tmp_path / CACHE_FOLDER / stack_key(FP) and folder.is_dir()
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton"),
                   "OPENMM_CACHE_DIR": str(folder / "openmm")}  # not $TMPDIR, which a batch job loses each night
    # the workloads' folders are handed on as arguments, never through the environment
    assert caches == Caches(stack=folder, built_systems=tmp_path / CACHE_FOLDER / "openmm-systems",  # beside the stacks
                            references=tmp_path / "refs")
    other = compile_caches(tmp_path / "baselines", {**FP, "driver": "590.10.02"}, env)
    assert other.stack != folder and other.references is None
    assert other.built_systems == tmp_path / CACHE_FOLDER / "openmm-systems"  # kept across stacks
    assert not (tmp_path / "baselines").exists()  # the reviewed folder gets nothing
    assert stack_key({**FP, "driver": "590.10.02"}) != stack_key(FP)  # a new driver starts a fresh cache
    assert stack_key({**FP, "gpu_uuid": "GPU-other"}) == stack_key(FP)  # another board of the model shares it
    assert (folder / "openmm").is_dir()  # OpenMM writes kernels into the folder but does not make it
    site = {"TORCHINDUCTOR_CACHE_DIR": "/site/cache", "OPENMM_CACHE_DIR": "/site/openmm"}
    compile_caches(tmp_path / "site" / "baselines", FP, site)
    assert site["TORCHINDUCTOR_CACHE_DIR"] == "/site/cache"  # a site's own setting is left alone
    assert site["OPENMM_CACHE_DIR"] == "/site/openmm"
    assert not (tmp_path / "site" / CACHE_FOLDER / stack_key(FP) / "openmm").exists()


CACHES_BENCH = """
import json
import os
from pathlib import Path

from pytest_mig.measure import Metric


def test_rate(mig_bench):
    c = mig_bench.caches
    seen = {"stack": str(c.stack), "built_systems": str(c.built_systems),
            "references": str(c.references) if c.references is not None else None,
            "environ": sorted(k for k in os.environ if k.startswith("PYTEST_MIG_") and k != "PYTEST_MIG_FAKE_NVML")}
    Path("caches.json").write_text(json.dumps(seen))
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [100.0] * 3, kind="compute"))
"""


def test_the_benchmarks_get_the_runs_caches_from_mig_bench(h200: Run_, pytester: pytest.Pytester,  # noqa: F811
                                                            mig_env: pytest.MonkeyPatch) -> None:
    import json

    from pytest_mig.judge.reference import SHIPPED

    mig_env.delenv("PYTEST_MIG_PROFILE", raising=False)
    pytester.makepyfile(test_bench=CACHES_BENCH)
    h200().assert_outcomes(passed=1)
    seen = json.loads((pytester.path / "caches.json").read_text())
    (stack,) = [p for p in (pytester.path / CACHE_FOLDER).iterdir() if p.name != "openmm-systems"]
    assert seen == {"stack": str(stack), "built_systems": str(pytester.path / CACHE_FOLDER / "openmm-systems"),
                    "references": str(SHIPPED), "environ": []}  # handed on, never through the environment
    # judged against no reference, but the compiled batches still start from the shipped seeds (batches.json)
    h200("--mig-reference", "none").assert_outcomes(passed=1)
    assert json.loads((pytester.path / "caches.json").read_text())["references"] == str(SHIPPED)


def _entry(test: str, metric: str, values: list[float]) -> BaselineEntry:
    return BaselineEntry(test, metric, "items/s", "higher", "compute", None, [Run(v) for v in values], "normal")


class _Local:
    def __init__(self, *entries: BaselineEntry) -> None:
        self.entries = {(e.test, e.metric, e.mode): e for e in entries}

    def get(self, test: str, metric: str, mode: str) -> BaselineEntry | None:
        return self.entries.get((test, metric, mode))


def test_a_test_gates_nothing_only_where_every_figure_was_measured_too_noisy() -> None:
    refs = ReferenceStore()
    ref = refs.load("nvidia-h100-80gb-hbm3", "full")
    noisy = "benchmarks/test_training.py::test_training[qwen1.5b-lora-maxbatch]"
    gemm = "benchmarks/test_gemm.py::test_gemm[bf16]"
    assert gates_nothing(noisy, "normal", None, ref)  # too noisy in the reference to gate: no verdict to buy
    assert not gates_nothing(gemm, "normal", None, ref)
    assert not gates_nothing("benchmarks/test_new.py::test_x", "normal", None, ref)  # nobody measured it: run
    assert not gates_nothing(noisy, "normal", None, None)  # no reference for this GPU model: run
    quiet = _Local(*[_entry(noisy, m, [100.0, 100.1, 99.9, 100.0, 100.2]) for m in ("tokens_per_s",)])
    assert not gates_nothing(noisy, "normal", quiet, ref)  # the site's own history gates it: run
    own = "test_site.py::test_own"  # a site's own test, its history too noisy to gate at 5%
    loud = _Local(_entry(own, "rate", [100.0, 120.0, 90.0, 115.0, 85.0]))
    assert gates_nothing(own, "normal", loud, None)
    # a tolerance it is judged with makes it gate, as the judge does: run it
    assert not gates_nothing(own, "normal", loud, None, 0.10)
    assert not gates_nothing(own, "normal", loud, None, {"rate": 0.10})
    assert gates_nothing(own, "normal", loud, None, {"other_metric": 0.10})  # a marker naming another figure


NOISY_BENCH = """
import os

import pytest

from pytest_mig.measure import Metric


{marker}
def test_rate(mig_bench):
    rate = float(os.environ.get("RATE", "100"))
    mig_bench.record(Metric("rate", rate, "items/s", "higher", [rate] * 3, kind="compute"))
"""


def test_a_test_whose_tolerance_is_set_is_never_left_out_as_too_noisy(
        h200: Run_, pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A history too noisy to gate at 5% leaves its test out of the night, unless the test is judged
    with a tolerance of its own (a marker) or the run's (--mig-tolerance): then it gates, and runs."""
    pytester.makepyfile(test_bench=NOISY_BENCH.format(marker=""))
    for rate in (100.0, 120.0, 90.0, 115.0, 85.0):
        mig_env.setenv("RATE", str(rate))
        h200("--mig-save-baseline").assert_outcomes(passed=1)
    mig_env.setenv("RATE", "100")
    h200().assert_outcomes(deselected=1)
    h200("--mig-tolerance", "20%").assert_outcomes(passed=1)
    pytester.makepyfile(test_bench=NOISY_BENCH.format(marker="@pytest.mark.mig_tolerance(0.20)"))
    h200().assert_outcomes(passed=1)


def test_progress_estimates_the_time_left_from_the_last_run_else_this_runs_average() -> None:
    p = Progress(["a", "b", "c"], previous={"b": 100.0, "c": 50.0}, started=0.0, last_line=0.0)
    assert p.finished("a", 5.0, now=5.0) is None  # short, and soon after the last line
    assert p.finished("b", 30.0, now=35.0) == ("pytest-mig: 2 of 3 tests done in 35 s; about 50 s left "
                                              "(from the last runs' times)")
    fresh = Progress(["a", "b", "c"], started=0.0, last_line=0.0)
    assert fresh.left_s() is None
    assert fresh.finished("a", 90.0, now=90.0) == ("pytest-mig: 1 of 3 tests done in 1 min 30 s; about 3 min 00 s "
                                                  "left (from this run's average)")


def test_each_tests_seconds_are_kept_and_read_back_for_the_next_estimate(h200: Run_,  # noqa: F811
                                                                        pytester: pytest.Pytester) -> None:
    h200("--mig-results", "night/first.json").assert_outcomes(passed=1)
    _, meta = read_results_file(pytester.path / "night" / "first.json")
    assert set(meta["durations"]) == {TEST_ID} and meta["durations"][TEST_ID] >= 0
    assert last_runs(pytester.path / "night")[0] == meta["durations"]
    assert last_runs(pytester.path / "night", pytester.path / "night" / "first.json")[0] == {}


def test_an_ungated_test_is_deselected_with_the_reason_and_runs_on_request(
        h200: Run_, pytester: pytest.Pytester, tmp_path: Path) -> None:  # noqa: F811
    """A reference whose two runs of the figure are 30% apart: it is too noisy to gate anywhere."""
    from pytest_mig.device.target import TargetInfo
    from pytest_mig.measure import Metric
    from pytest_mig.store.results import ResultRecord, write_results

    target = TargetInfo("full", "full", "full", gpu_name="NVIDIA H200", gpu_slug="nvidia-h200")
    for i, (rate, latency) in enumerate([(100.0, 2.0), (130.0, 2.6)]):
        recs = [ResultRecord(TEST_ID, Metric("rate", rate, "items/s"), target, {}, f"2026-11-2{i}T00:00:00+00:00"),
                ResultRecord(TEST_ID, Metric("latency_ms", latency, "ms", "lower"), target, {},
                             f"2026-11-2{i}T00:00:00+00:00")]
        write_results(tmp_path / f"r{i}.json", recs)
    build([tmp_path / "r0.json", tmp_path / "r1.json"], tmp_path / "ref")
    left_out = h200(f"--mig-reference={tmp_path / 'ref'}")  # one token: not a path pytest takes for the rootdir
    left_out.assert_outcomes(deselected=1)
    left_out.stdout.fnmatch_lines(["*1 test(s) not run: every figure of theirs is too noisy to gate in normal mode "
                                   "here*--mig-all-tests runs them: test_rate"])
    h200(f"--mig-reference={tmp_path / 'ref'}", "--mig-all-tests").assert_outcomes(passed=1)
