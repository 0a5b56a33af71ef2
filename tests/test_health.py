"""Health context: every sign read through the fake NVML, its sentence, and what it does to a run."""

from __future__ import annotations

from typing import Any, Callable

import fake_pynvml
import pytest
import topologies
from test_verdict_flow import BENCH, QUIET, STEADY, TEST_ID, rate_record

from pytest_mig.device import health
from pytest_mig.cli import compare_records
from pytest_mig.device.health import (
    Reader,
    Snapshot,
    change_signs,
    link_gbs,
    link_note,
    state_signs,
)
from pytest_mig.store.results import read_results

# --------------------------------------------------------------------------- link arithmetic


@pytest.mark.parametrize(("gen", "width", "gbs"), [
    (5, 16, 63.015), (4, 16, 31.508), (4, 8, 15.754), (3, 16, 15.754), (2, 16, 8.0), (1, 1, 0.25), (6, 16, 121.0),
])
def test_link_rate_per_direction_from_generation_and_width(gen: int, width: int, gbs: float) -> None:
    assert link_gbs(gen, width) == pytest.approx(gbs, abs=0.001)


def test_a_link_trained_down_to_x8_is_half_the_rate() -> None:
    assert link_gbs(5, 8) / link_gbs(5, 16) == pytest.approx(0.5)


@pytest.mark.parametrize(("gen", "width"), [(None, 16), (7, 16), (5, 0), (5, None)])
def test_an_unknown_link_has_no_rate(gen: Any, width: Any) -> None:
    assert link_gbs(gen, width) is None


# --------------------------------------------------------------------------- reading through NVML


def read(monkeypatch: pytest.MonkeyPatch, topology: Any, **changes: Any) -> Snapshot:
    topo = topologies.get_topology(topology) if isinstance(topology, str) else topology
    fake_pynvml.install(monkeypatch, topologies.with_gpu(topo, 0, **changes) if changes else topo)
    reader = Reader(0)
    try:
        return reader.read()
    finally:
        reader.close()


def test_a_healthy_gpu_reads_every_sign_and_shows_none(monkeypatch: pytest.MonkeyPatch) -> None:
    s = read(monkeypatch, "h200-mig-off", pcie_link=(5, 16, 5, 16))
    assert s.others == [] and s.ecc == {"volatile_corrected": 0, "volatile_uncorrected": 0,
                                        "aggregate_corrected": 0, "aggregate_uncorrected": 0}
    assert s.remapped_rows == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert s.pcie == {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16} and s.unavailable == []
    assert state_signs(s) == [] and link_note(s) is None
    assert health.summary(s) == ("GPU 0: no other process; ECC uncorrected 0 volatile / 0 lifetime, corrected 0 / 0; "
                                 "remapped rows 0 correctable, 0 uncorrectable; PCIe link at Gen5 x16, max Gen5 x16")


def test_what_nvml_cannot_tell_is_said_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    s = read(monkeypatch, "h200-mig-off", ecc_mode=(0, 0),
             errors=(("nvmlDeviceGetCurrPcieLinkWidth", fake_pynvml.NVML_ERROR_NOT_SUPPORTED),))
    assert s.ecc is None and s.pcie is None and s.unavailable == ["ECC counts", "PCIe link"]
    assert "not readable: ECC counts, PCIe link" in health.summary(s)


@pytest.mark.parametrize(("changes", "level", "text"), [
    ({"ecc_counts": (0, 2, 0, 2)}, "fail", "2 uncorrected ECC error(s) on GPU 0 since the driver loaded (volatile count)"),
    ({"remapped_rows": (0, 3, 0, 1)}, "fail", "row remapping failed on GPU 0: the board has run out of spare rows (RMA)"),
    ({"remapped_rows": (1, 0, 1, 0)}, "warn", "remapped rows pending on GPU 0: a GPU reset is due to apply them"),
    ({"remapped_rows": None, "retired_pages": (2, 1, 1)}, "warn",
     "retired pages pending on GPU 0: a GPU reset is due to retire them"),
    ({"pcie_link": (4, 8, 5, 16)}, "fail",
     "PCIe link at Gen4 x8, max Gen5 x16 on GPU 0: the link trained down to fewer lanes"),
])
def test_each_state_sign_and_its_sentence(monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], level: str,
                                          text: str) -> None:
    assert [(x.level, x.text) for x in state_signs(read(monkeypatch, "h200-mig-off", **changes))] == [(level, text)]


def test_older_gpus_report_retired_pages_instead_of_remapped_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    s = read(monkeypatch, "h200-mig-off", remapped_rows=None, retired_pages=(2, 1, 0))
    assert s.remapped_rows is None and s.retired_pages == {"single_bit": 2, "double_bit": 1, "pending": False}
    assert "retired pages 2 single-bit, 1 double-bit" in health.summary(s)


def test_an_idle_link_below_its_generation_is_a_note_not_a_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    s = read(monkeypatch, "h200-mig-off", pcie_link=(1, 16, 5, 16))
    assert state_signs(s) == []
    assert link_note(s) == ("PCIe link at Gen1 x16, max Gen5 x16 (links drop generation when idle; "
                            "test_host_bandwidth reads it under load)")


def test_board_signs_of_a_mig_slice_come_from_its_parent_and_processes_from_the_slice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slice_uuid = topologies.H100_1G[2]
    topo = topologies.with_busy(topologies.with_gpu(topologies.get_topology("h100-mig"), 0, ecc_counts=(4, 0, 9, 0)),
                                slice_uuid, pid=4242)
    fake_pynvml.install(monkeypatch, topo)
    reader = Reader(0, slice_uuid)
    s = reader.read()
    reader.close()
    assert s.device == f"GPU 0 {slice_uuid}" and s.others == [4242] and s.ecc["aggregate_corrected"] == 9
    fake_pynvml.install(monkeypatch, topo)
    other = Reader(0, topologies.H100_1G[3])
    assert other.read().others == []  # another slice's process is not this slice's
    other.close()


def test_own_pids_are_learnt_when_nvml_numbers_them_in_another_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = topologies.with_busy(topologies.get_topology("h200-mig-off"), topologies.H200_GPU0, pid=555)
    fake_pynvml.install(monkeypatch, topo)
    reader = Reader(0)
    before = reader.processes()  # 555: not this process (it has not started CUDA)
    fake_pynvml.install(monkeypatch, topologies.with_busy(topo, topologies.H200_GPU0, pid=777))
    reader = Reader(0)
    reader.learn_own_pids(before)  # 777 appeared with this process's CUDA context: this run's own pid
    assert reader.read().others == [555]
    reader.close()


# --------------------------------------------------------------------------- signs between two readings


def snap(**fields: Any) -> Snapshot:
    base = dict(gpu_index=3, device="GPU 3", ecc={"volatile_corrected": 0, "volatile_uncorrected": 0,
                                                   "aggregate_corrected": 0, "aggregate_uncorrected": 0},
                remapped_rows={"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False})
    base.update(fields)
    return Snapshot(**base)


@pytest.mark.parametrize(("after", "level", "text"), [
    ({"others": [1234]}, "warn", "another process (pid 1234) used GPU 3 during the measurement"),
    ({"ecc": {"volatile_corrected": 0, "volatile_uncorrected": 2, "aggregate_corrected": 0,
              "aggregate_uncorrected": 2}}, "fail", "2 uncorrected ECC error(s) on GPU 3 during the measurement"),
    ({"ecc": {"volatile_corrected": 5, "volatile_uncorrected": 0, "aggregate_corrected": 5,
              "aggregate_uncorrected": 0}}, "warn", "5 corrected ECC error(s) on GPU 3 during the measurement"),
    ({"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}}, "warn",
     "1 row(s) remapped on GPU 3 for uncorrectable errors during the measurement"),
    ({"clock_events": ["hw_slowdown", "hw_thermal"]}, "warn", "clock events on GPU 3: hw_slowdown, hw_thermal"),
    ({"xids": [79]}, "fail", "XID 79 on GPU 3 during the measurement"),
])
def test_each_change_sign_and_its_sentence(after: dict[str, Any], level: str, text: str) -> None:
    assert [(s.level, s.text) for s in change_signs(snap(), snap(**after))] == [(level, text)]


def test_nothing_changed_is_no_sign() -> None:
    assert change_signs(snap(), snap()) == []


def test_the_likely_cause_names_every_sign() -> None:
    one = [health.Sign("warn", "another process (pid 1234) used GPU 3 during the measurement")]
    assert health.likely_cause(one) == "; health: another process (pid 1234) used GPU 3 during the measurement: " \
                                       "the likely cause"
    assert health.likely_cause(one * 2).endswith(": likely causes") and health.likely_cause([]) == ""


# --------------------------------------------------------------------------- in a run


@pytest.fixture
def h200_health(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch, stand_in_cuda: Callable[..., None],
                cuda_props_of: Callable[..., Any]) -> Callable[..., pytest.RunResult]:
    """run(topology, *options): one pytest run of BENCH on a whole H200 whose NVML shows ``topology``."""
    stand_in_cuda(cuda_props_of("h200-mig-off"))
    pytester.makepyfile(test_bench=BENCH)

    def run(topology: Any, *options: str) -> pytest.RunResult:
        fake_pynvml.install(mig_env, topology)
        mig_env.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return pytester.runpytest("--mig-profile", "full", *QUIET, *options)

    return run


H200 = topologies.get_topology("h200-mig-off")


def test_the_header_shows_the_device_s_health(h200_health: Callable[..., pytest.RunResult]) -> None:
    result = h200_health(H200)
    result.stdout.fnmatch_lines(["pytest-mig: health GPU 0: no other process; ECC uncorrected 0 volatile*; "
                                 "XID events: watched"])


def test_a_regression_beside_another_process_names_it_as_the_likely_cause(
        h200_health: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    for rate in STEADY:
        mig_env.setenv("RATE", str(rate))
        h200_health(H200, "--mig-save-baseline").assert_outcomes(passed=1)
    mig_env.setenv("RATE", "90")
    busy = topologies.with_busy(H200, topologies.H200_GPU0, pid=1234)
    result = h200_health(busy, "--mig-results", "r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*REGRESSED {TEST_ID} rate 90.00 items/s*; health: another process (pid 1234) "
                                 "used GPU 0 during the measurement: the likely cause"])
    rec = rate_record(pytester, "r.json")
    assert rec.health["signs"] == [{"level": "warn", "text": "another process (pid 1234) used GPU 0 during the "
                                                             "measurement"}]
    assert rec.health["before"]["others"] == [1234] and rec.health["after"]["pcie"]["width"] == 16


def test_a_figure_that_passes_beside_a_warning_passes(h200_health: Callable[..., pytest.RunResult],
                                                     pytester: pytest.Pytester) -> None:
    busy = topologies.with_busy(H200, topologies.H200_GPU0, pid=1234)
    h200_health(busy, "--mig-results", "r.json").assert_outcomes(passed=1)
    assert rate_record(pytester, "r.json").health["signs"][0]["level"] == "warn"


ECC_DURING_TEST = BENCH + '''

def test_ecc_errors_during_the_test(mig_bench):
    import pynvml
    import topologies

    fake = pynvml._fake
    fake.topology = topologies.with_gpu(fake.topology, 0, ecc_counts=(0, 3, 0, 3))
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [100.0] * 3, kind="compute"))
'''


def test_uncorrected_ecc_errors_during_a_test_fail_it_whatever_its_figures(
        h200_health: Callable[..., pytest.RunResult], pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=ECC_DURING_TEST)
    result = h200_health(H200, "-k", "ecc")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*HEALTH 3 uncorrected ECC error(s) on GPU 0 during the measurement*",
                                 "*health FAIL: 3 uncorrected ECC error(s) on GPU 0 since the driver loaded*"])


def test_a_failed_row_remap_fails_the_run_even_when_every_figure_passes(
        h200_health: Callable[..., pytest.RunResult]) -> None:
    result = h200_health(topologies.with_gpu(H200, 0, remapped_rows=(0, 12, 0, 1)))
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["pytest-mig: health FAIL: row remapping failed on GPU 0*",
                                 "*health FAIL: row remapping failed on GPU 0: the board has run out of spare rows*"])


def test_a_downtrained_link_fails_the_run(h200_health: Callable[..., pytest.RunResult]) -> None:
    result = h200_health(topologies.with_gpu(H200, 0, pcie_link=(5, 8, 5, 16)))
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*health FAIL: PCIe link at Gen5 x8, max Gen5 x16 on GPU 0*"])


def test_xids_are_read_from_an_nvml_event_set(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pynvml.install(monkeypatch, topologies.with_gpu(H200, 0, xids=(79, 48)))
    reader = Reader(0)
    assert reader.xid_note == "XID events: watched" and reader.read().xids == [79, 48]
    assert reader.read().xids == []  # each is reported once
    reader.close()


def test_a_driver_without_xid_events_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pynvml.install(monkeypatch, topologies.with_error(H200, "nvmlDeviceRegisterEvents",
                                                           fake_pynvml.NVML_ERROR_NOT_SUPPORTED))
    reader = Reader(0)
    assert reader.xid_note == "XID events: not available through NVML here (NVMLError_NotSupported)"
    assert reader.read().xids == []
    reader.close()


def test_a_history_is_not_needed_for_health(h200_health: Callable[..., pytest.RunResult]) -> None:
    """Health signs are judged without any baseline: a first run on a sick board already fails."""
    result = h200_health(topologies.with_gpu(H200, 0, ecc_counts=(0, 1, 0, 1)))
    assert result.ret == 1


def test_compare_on_recorded_runs_gives_the_plugin_s_verdicts_health_notes_included(
        h200_health: Callable[..., pytest.RunResult], pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    """One judge: `pytest-mig compare` on the nights' results files says what the plugin said."""
    nights = []
    for i, rate in enumerate(STEADY):
        mig_env.setenv("RATE", str(rate))
        nights.append(f"n{i}.json")
        h200_health(H200, "--mig-save-baseline", "--mig-results", nights[-1]).assert_outcomes(passed=1)
    mig_env.setenv("RATE", "90")
    busy = topologies.with_busy(H200, topologies.H200_GPU0, pid=1234)
    h200_health(busy, "--mig-results", "r.json").assert_outcomes(failed=1)
    plugin = {r.metric.name: r.verdict.to_dict() for r in read_results(pytester.path / "r.json") if r.verdict}
    assert "the likely cause" in plugin["rate"]["message"] and plugin["rate"]["outcome"] == "regressed"

    new = read_results(pytester.path / "r.json")
    verdicts = compare_records([read_results(pytester.path / n) for n in nights], new)
    assert {v.metric: v.to_dict() for v in verdicts} == plugin
