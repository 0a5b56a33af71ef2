"""plan_run, pin and verify as plain functions, against the inventories of real GPUs.

Each inventory is what pytest_mig.device.nvml.discover reads through the fake pynvml loaded with a topology
from tests/topologies.py, so these tests also cover how NVML's answers become Gpu/MigInstance records.
test_plugin.py checks the same behaviours end to end (sentences, exit codes, the report header).
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

import pytest

import topologies as topo
from pytest_mig.device import nvml
from pytest_mig.device import target
from pytest_mig.device.plan import Options, Plan, plan_run
from pytest_mig.device.target import CudaProps, SelectionError, Target, VerificationError, pin, verify

MIB = topo.MIB
H100 = "NVIDIA H100 80GB HBM3"
H100_PROFILES = "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"
H200_PROFILES = "1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb"
A100_40_PROFILES = "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"

PlanFn = Callable[..., Plan]


@pytest.fixture
def plan(discover: Callable[[Any], nvml.Inventory]) -> PlanFn:
    """plan(topology, env=None, **options) -> plan_run's Plan for that machine."""

    def run(topology: Any, env: dict[str, str] | None = None, **options: Any) -> Plan:
        return plan_run(Options(**options), discover(topology), env or {})

    return run


@pytest.fixture
def refused(plan: PlanFn) -> Callable[..., str]:
    """refused(topology, env=None, **options) -> the sentence plan_run raises (it must raise)."""

    def run(topology: Any, env: dict[str, str] | None = None, **options: Any) -> str:
        with pytest.raises(SelectionError) as exc:
            plan(topology, env, **options)
        return str(exc.value)

    return run


def only(p: Plan) -> Target:
    assert len(p.targets) == 1 and not p.sweep
    return p.targets[0]


# ------------------------------------------------------------------------------------------------
# A real MIG slice of the profile asked.


@pytest.mark.parametrize(
    ("topology", "profile", "uuid", "sms", "memory_mib"),
    [
        ("a100-40gb-mixed", "3g.20gb", topo.A100_40_3G, 42, 20096),
        ("a100-40gb-mixed", "2g.10gb", topo.A100_40_2G, 28, 9984),
        ("a100-80gb-mixed", "3g.40gb", topo.A100_80_3G, 42, 40192),
        ("a100-80gb-mixed", "1g.10gb", topo.A100_80_1G_A, 14, 9728),
        ("a100-80gb-mixed", "1g.20gb", topo.A100_80_1G20, 14, 19968),  # only on GPU 1
        ("a100-80gb-mixed", "1c.3g.40gb", topo.A100_80_1C3G, 14, 40192),  # a compute instance
        ("a100-80gb-mixed", "2c.3g.40gb", topo.A100_80_2C3G, 28, 40192),
        ("h100-mig", "1g.10gb", topo.H100_1G[0], 16, 9984),
    ],
)
def test_a_free_instance_of_the_profile_is_chosen_and_pinned(
    plan: PlanFn, topology: str, profile: str, uuid: str, sms: int, memory_mib: int
) -> None:
    p = plan(topology, profile=profile)
    t = only(p)
    assert (t.kind, t.profile, t.uuid, p.pin) == ("mig", profile, uuid, uuid)
    assert (t.sms, t.memory_bytes) == (sms, memory_mib * MIB)
    assert t.chosen_by == "plugin (free instance)"
    assert t.gpu_name == topo.get_topology(topology).gpus[t.gpu_index or 0].name
    assert t.device == "cuda:0" and t.baseline_profile == profile


def test_the_free_instance_is_preferred_to_a_busy_one(plan: PlanFn) -> None:
    # a100-40gb-mixed: the first 1g.5gb (slot 2) runs pid 24817, the second (slot 3) is free.
    assert only(plan("a100-40gb-mixed", profile="1g.5gb")).uuid == topo.A100_40_1G_FREE


def test_the_search_for_a_free_instance_goes_on_to_the_next_gpu(plan: PlanFn) -> None:
    t = topo.with_busy(topo.with_busy(topo.get_topology("a100-80gb-mixed"), topo.A100_80_1G_A), topo.A100_80_1G_B)
    chosen = only(plan(t, profile="1g.10gb"))
    assert (chosen.gpu_index, chosen.uuid) == (1, topo.A100_80_1G_C)


def test_profile_names_are_matched_without_regard_to_case(plan: PlanFn) -> None:
    t = only(plan("h100-mig", profile=" 1G.10GB "))
    assert t.profile == "1g.10gb" and t.uuid == topo.H100_1G[0]


# ------------------------------------------------------------------------------------------------
# The profile asked cannot be had: one sentence each.


@pytest.mark.parametrize("bad", ["bogus", "1g", "10gb", "1g.5GiB", "2c.1g.10gb", "1g.10gb+mps", "8g.80gb.x"])
def test_a_malformed_profile_lists_this_gpus_profiles(refused: Callable[..., str], bad: str) -> None:
    msg = refused("h100-mig", profile=bad)
    assert f"'{bad}'" in msg
    assert msg.endswith(f"the profiles here: GPU 0 ({H100}): {H100_PROFILES}.")


def test_a_malformed_profile_on_a_machine_with_two_gpus_lists_them_once(refused: Callable[..., str]) -> None:
    msg = refused("a100-40gb-mixed", profile="1g.5")
    assert msg.endswith(f"the profiles here: GPUs 0, 1 (NVIDIA A100-SXM4-40GB): {A100_40_PROFILES}.")


def test_a_malformed_profile_is_refused_without_a_gpu_too(refused: Callable[..., str]) -> None:
    assert refused("no-gpu", profile="bogus").startswith("'bogus' is not a MIG profile name: expected")


def test_a_profile_this_gpu_does_not_have(refused: Callable[..., str]) -> None:
    assert refused("h100-mig", profile="1g.5gb") == (
        f"GPU 0 ({H100}) has no profile 1g.5gb; its profiles: {H100_PROFILES}.")


def test_a_profile_no_gpu_here_has_is_not_something_an_administrator_can_create(refused: Callable[..., str]) -> None:
    msg = refused("a100-40gb-mixed", profile="1g.18gb")
    assert msg == ("no GPU here has profile 1g.18gb; the profiles here: "
                   f"GPUs 0, 1 (NVIDIA A100-SXM4-40GB): {A100_40_PROFILES}.")
    assert "administrator" not in msg


def test_a_profile_of_the_gpu_without_an_instance(refused: Callable[..., str]) -> None:
    msg = refused("a100-40gb-mixed", profile="1g.10gb")
    assert msg.startswith("no 1g.10gb instance exists: "
                          "GPU 0 (NVIDIA A100-SXM4-40GB) has 3g.20gb x1, 2g.10gb x1, 1g.5gb x2.")
    assert "nvidia-smi mig -cgi" in msg


def test_every_instance_of_the_profile_busy(refused: Callable[..., str]) -> None:
    t = topo.with_busy(topo.get_topology("a100-40gb-mixed"), topo.A100_40_1G_FREE, pid=4242)
    msg = refused(t, profile="1g.5gb")
    assert msg.startswith(f"every 1g.5gb instance is busy: {topo.A100_40_1G_BUSY} (pids {topo.A100_40_BUSY_PID}), "
                          f"{topo.A100_40_1G_FREE} (pids 4242);")
    assert "--mig-device" in msg


def test_a_mig_profile_on_a_gpu_with_mig_off_points_at_emulation(refused: Callable[..., str]) -> None:
    msg = refused("h200-mig-off", profile="1g.18gb")
    assert msg.startswith("GPU 0 (NVIDIA H200) has MIG mode disabled, so there is no 1g.18gb slice to pin; "
                          f"its profiles are {H200_PROFILES}.")
    assert "Use --mig-emulate to approximate 1g.18gb" in msg and "--mig-profile full" in msg


def test_a_mig_profile_on_a_gpu_without_mig(refused: Callable[..., str]) -> None:
    assert refused("l40s-no-mig", profile="1g.10gb") == (
        "GPU 0 (NVIDIA L40S) has no MIG profiles, so there is no 1g.10gb to pin or emulate: "
        "measure the whole GPU with --mig-profile full (or without --mig-profile).")


def test_all_needs_emulation_even_without_a_gpu(refused: Callable[..., str]) -> None:
    for topology in ("h200-mig-off", "h100-mig", "no-gpu"):
        assert refused(topology, profile="all").startswith("--mig-profile all sweeps every profile of the GPU in one "
                                                           "process, which only emulation can do: add --mig-emulate")


# ------------------------------------------------------------------------------------------------
# The scheduler's pin (Slurm, Kubernetes): CUDA_VISIBLE_DEVICES.

SCHEDULER = "scheduler (CUDA_VISIBLE_DEVICES)"


def test_the_scheduler_s_slice_of_the_right_profile_is_used_and_left_pinned(plan: PlanFn) -> None:
    p = plan("a100-80gb-mixed", {"CUDA_VISIBLE_DEVICES": topo.A100_80_2G}, profile="2g.20gb")
    t = only(p)
    assert (t.uuid, t.profile, t.chosen_by) == (topo.A100_80_2G, "2g.20gb", SCHEDULER)
    assert p.pin is None  # the environment already pins it


def test_the_scheduler_s_slice_without_a_profile(plan: PlanFn) -> None:
    t = only(plan("a100-80gb-mixed", {"CUDA_VISIBLE_DEVICES": topo.A100_80_1G20}))
    assert (t.kind, t.profile, t.gpu_index, t.chosen_by) == ("mig", "1g.20gb", 1, SCHEDULER)


def test_the_scheduler_s_slice_of_another_profile_is_refused(refused: Callable[..., str]) -> None:
    msg = refused("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": topo.A100_40_3G}, profile="1g.5gb")
    assert msg == (f"CUDA_VISIBLE_DEVICES names {topo.A100_40_3G}, a 3g.20gb instance, "
                   "but --mig-profile asks for 1g.5gb.")


def test_the_pre_r470_form_of_a_mig_device_is_understood(plan: PlanFn) -> None:
    # MIG-<GPU uuid>/<GPU instance id>/<compute instance id>: the 3g.20gb is GI 2, CI 0.
    t = only(plan("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": f"MIG-{topo.A100_40_GPU0}/2/0"}, profile="3g.20gb"))
    assert (t.uuid, t.chosen_by) == (topo.A100_40_3G, SCHEDULER)


@pytest.mark.parametrize("cvd", ["MIG-00000000-0000-0000-0000-000000000000", f"MIG-{topo.A100_40_GPU0}/2",
                                 f"MIG-{topo.A100_40_GPU0}/7/0", "5", "GPU-nope", "5,0"])
def test_a_scheduler_pin_naming_nothing_here_is_refused(refused: Callable[..., str], cvd: str) -> None:
    msg = refused("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": cvd}, profile="1g.5gb")
    assert msg.startswith(f"CUDA_VISIBLE_DEVICES={cvd} names no GPU or MIG instance on this machine (NVML sees: "
                          "GPU 0 (NVIDIA A100-SXM4-40GB): 3g.20gb x1, 2g.10gb x1, 1g.5gb x2; "
                          "GPU 1 (NVIDIA A100-SXM4-40GB): MIG off).")


@pytest.mark.parametrize("cvd", ["0:9", "0a", " 0", "0 ", "0,,1", "0,-1"])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(plan: PlanFn, cvd: str) -> None:
    """Measured on an H100 (driver 580, torch 2.11): an index is read like strtol, so "0:9" is GPU 0,
    never MIG slot 9; the first entry CUDA cannot read ends the list."""
    p = plan("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": cvd}, profile="1g.5gb")
    assert only(p).uuid == topo.A100_40_1G_FREE  # GPU 0, narrowed to its free 1g.5gb slice, as for "0"
    assert not any("shows 2 devices" in line for line in p.header)


@pytest.mark.parametrize("cvd", [f" {topo.A100_40_3G} ", f"{topo.A100_40_3G} ", topo.A100_40_3G.lower(),
                                 ",0", "0,0", "all", "GPU-", topo.A100_40_3G.replace("MIG-", "mig-")])
def test_a_value_that_shows_cuda_no_device_is_refused(refused: Callable[..., str], cvd: str) -> None:
    assert refused("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": cvd}) == (
        f"CUDA_VISIBLE_DEVICES={cvd!r} shows CUDA no device: CUDA reads indices and exact GPU-/MIG- UUIDs "
        f"separated by commas, with no spaces around a UUID, stops at the first entry it cannot read and hides "
        f"everything when an index is named twice.")


def test_a_unique_uuid_prefix_names_its_device_and_several_devices_are_said(plan: PlanFn) -> None:
    t = only(plan("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": topo.A100_40_3G[:12]}, profile="3g.20gb"))
    assert t.uuid == topo.A100_40_3G
    p = plan("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": f"{topo.A100_40_3G},1"}, profile="3g.20gb")
    assert only(p).uuid == topo.A100_40_3G
    assert f"CUDA_VISIBLE_DEVICES={topo.A100_40_3G},1 shows 2 devices; a benchmark measures only the first, " \
           f"{topo.A100_40_3G}" in p.header


def test_a_scheduler_pin_to_a_whole_gpu_with_mig_on_is_narrowed_to_a_slice(plan: PlanFn) -> None:
    p = plan("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": "0"}, profile="1g.5gb")
    assert only(p).uuid == topo.A100_40_1G_FREE and p.pin == topo.A100_40_1G_FREE


def test_a_scheduler_pin_to_a_whole_gpu_with_mig_off_and_a_mig_profile(refused: Callable[..., str]) -> None:
    msg = refused("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": topo.A100_40_GPU1}, profile="1g.5gb")
    assert msg.startswith("GPU 1 (NVIDIA A100-SXM4-40GB) has MIG mode disabled") and "--mig-emulate" in msg


@pytest.mark.parametrize("hidden", ["", "-1", "NoDevFiles", "none", "void"])
def test_a_scheduler_pin_that_hides_every_gpu_means_the_cpu(plan: PlanFn, hidden: str) -> None:
    p = plan("h100-mig", {"CUDA_VISIBLE_DEVICES": hidden}, profile="1g.10gb")
    assert only(p).kind == "cpu" and p.pin is None
    assert p.header == [f"no GPU: CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU; running the workloads on the CPU "
                        "at small sizes (--mig-profile 1g.10gb not applied); nothing is compared with GPU baselines"]


# ------------------------------------------------------------------------------------------------
# --mig-device.


@pytest.mark.parametrize(
    ("device", "uuid"),
    [(topo.A100_40_2G, topo.A100_40_2G), ("0:3", topo.A100_40_1G_FREE), ("0:1", topo.A100_40_2G)],
)
def test_mig_device_picks_one_instance(plan: PlanFn, device: str, uuid: str) -> None:
    p = plan("a100-40gb-mixed", device=device)
    t = only(p)
    assert (t.uuid, t.chosen_by, p.pin) == (uuid, "--mig-device", uuid)


def test_mig_device_by_gpu_index_is_the_whole_gpu(plan: PlanFn) -> None:
    p = plan("a100-40gb-mixed", device="1")
    t = only(p)
    assert (t.kind, t.profile, t.uuid, t.sms, p.pin) == ("full", "full", topo.A100_40_GPU1, 108, topo.A100_40_GPU1)


@pytest.mark.parametrize("device", ["MIG-00000000-0000-0000-0000-000000000000", "7", "0:9", "1:0", "GPU-nope"])
def test_mig_device_that_does_not_exist(refused: Callable[..., str], device: str) -> None:
    msg = refused("a100-40gb-mixed", device=device, profile="1g.5gb")
    assert msg.startswith(f"--mig-device {device} is not a GPU or MIG instance on this machine; known: ")
    assert topo.A100_40_1G_FREE in msg and f"1 ({topo.A100_40_GPU1})" in msg


def test_mig_device_of_another_profile_than_asked(refused: Callable[..., str]) -> None:
    assert refused("a100-40gb-mixed", device=topo.A100_40_3G, profile="1g.5gb") == (
        f"--mig-device names {topo.A100_40_3G}, a 3g.20gb instance, but --mig-profile asks for 1g.5gb.")


def test_mig_device_other_than_the_scheduler_s_is_refused(refused: Callable[..., str]) -> None:
    msg = refused("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": topo.A100_40_3G}, device=topo.A100_40_2G)
    assert msg == (f"--mig-device {topo.A100_40_2G} is not the device this job was given "
                   f"(CUDA_VISIBLE_DEVICES={topo.A100_40_3G}).")


def test_mig_device_may_narrow_the_scheduler_s_whole_gpu_to_one_of_its_slices(plan: PlanFn) -> None:
    p = plan("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": "0"}, device=topo.A100_40_2G)
    assert (only(p).uuid, only(p).chosen_by, p.pin) == (topo.A100_40_2G, "--mig-device", topo.A100_40_2G)


def test_mig_device_on_a_busy_instance_says_so_in_the_header(plan: PlanFn) -> None:
    p = plan("a100-40gb-mixed", device=topo.A100_40_1G_BUSY)
    assert only(p).uuid == topo.A100_40_1G_BUSY
    assert p.header == [
        f"{topo.A100_40_1G_BUSY} is in use by pid {topo.A100_40_BUSY_PID}: its figures may be disturbed"]


# ------------------------------------------------------------------------------------------------
# No profile, and 'full'.


def test_no_profile_on_a_mig_gpu_takes_the_first_free_slice(plan: PlanFn) -> None:
    t = topo.with_busy(topo.get_topology("h100-mig"), topo.H100_1G[0])
    p = plan(t)
    assert (only(p).uuid, only(p).chosen_by, p.pin) == (topo.H100_1G[1], "plugin (first free instance)",
                                                        topo.H100_1G[1])


def test_no_profile_goes_on_to_a_gpu_with_mig_off_when_every_slice_is_busy(plan: PlanFn) -> None:
    t = topo.with_busy(topo.with_busy(topo.with_busy(topo.get_topology("a100-40gb-mixed"), topo.A100_40_3G),
                                      topo.A100_40_2G), topo.A100_40_1G_FREE)
    assert (only(plan(t)).kind, only(plan(t)).uuid) == ("full", topo.A100_40_GPU1)


def test_no_profile_and_no_free_slice_anywhere(refused: Callable[..., str]) -> None:
    t = topo.get_topology("h100-mig")
    for uuid in topo.H100_1G:
        t = topo.with_busy(t, uuid)
    msg = refused(t)
    assert msg.startswith(f"every GPU here has MIG mode on and no free instance (GPU 0 ({H100}): 1g.10gb x7)")


@pytest.mark.parametrize(("topology", "uuid", "sms", "memory_mib"),
                         [("h200-mig-off", topo.H200_GPU0, 132, 143771), ("l40s-no-mig", topo.L40S_GPU0, None, 46068)])
def test_no_profile_on_a_gpu_with_mig_off_is_the_whole_gpu(
    plan: PlanFn, topology: str, uuid: str, sms: int | None, memory_mib: int
) -> None:
    p = plan(topology)
    t = only(p)
    assert (t.kind, t.profile, t.uuid, t.sms, t.memory_bytes, p.pin) == (
        "full", "full", uuid, sms, memory_mib * MIB, uuid)


def test_full_takes_a_gpu_with_mig_off(plan: PlanFn) -> None:
    p = plan("a100-40gb-mixed", profile="full")
    assert (only(p).kind, only(p).uuid, only(p).label()) == ("full", topo.A100_40_GPU1, "A100-SXM4-40GB (whole GPU)")


def test_full_on_a_machine_whose_gpus_all_have_mig_on(refused: Callable[..., str]) -> None:
    assert refused("h100-mig", profile="full") == (
        f"--mig-profile full needs a GPU with MIG mode off, but every GPU here has MIG on: GPU 0 ({H100}): 1g.10gb x7.")


def test_full_on_the_scheduler_s_mig_slice(refused: Callable[..., str]) -> None:
    msg = refused("h100-mig", {"CUDA_VISIBLE_DEVICES": topo.H100_1G[3]}, profile="full")
    assert msg == (f"--mig-profile full asks for a whole GPU, but the device given is {topo.H100_1G[3]}, "
                   "a 1g.10gb MIG instance.")


def test_full_on_a_named_gpu_with_mig_on(refused: Callable[..., str]) -> None:
    msg = refused("a100-40gb-mixed", device="0", profile="full")
    assert msg.startswith("--mig-profile full needs a GPU with MIG mode off, "
                          "but GPU 0 (NVIDIA A100-SXM4-40GB) has MIG on")


# ------------------------------------------------------------------------------------------------
# Emulation.


@pytest.fixture
def with_green_contexts(green_contexts: Callable[[bool], None]) -> None:
    green_contexts(True)


@pytest.mark.usefixtures("with_green_contexts")
def test_emulating_one_profile_on_an_h200(plan: PlanFn) -> None:
    p = plan("h200-mig-off", profile="1g.18gb", emulate=True)
    t = only(p)
    assert (t.kind, t.profile, t.chosen_by, t.uuid, p.pin) == ("emulated", "1g.18gb", "emulation", topo.H200_GPU0,
                                                               topo.H200_GPU0)
    assert t.sms == 16
    assert t.memory_bytes == 16 * 2**30  # the 1g.18gb class: NVML says 16384 MiB
    assert t.emulated and t.baseline_profile == "1g.18gb-emulated" and t.gpu_name == "NVIDIA H200"


@pytest.mark.usefixtures("with_green_contexts")
def test_emulating_every_profile_is_a_sweep_smallest_first_without_media_twins(plan: PlanFn) -> None:
    p = plan("h200-mig-off", profile="all", emulate=True)
    assert p.sweep
    assert [(t.profile, t.sms) for t in p.targets] == [
        ("1g.18gb", 16), ("1g.35gb", 26), ("2g.35gb", 32), ("3g.71gb", 60), ("4g.71gb", 64), ("7g.141gb", 132)]
    assert {t.kind for t in p.targets} == {"emulated"} and p.pin == topo.H200_GPU0


@pytest.mark.usefixtures("with_green_contexts")
def test_emulating_a_compute_instance_states_the_approximation(plan: PlanFn) -> None:
    p = plan("h200-mig-off", profile="1c.3g.71gb", emulate=True)
    assert (only(p).sms, only(p).memory_bytes) == (16, int(69.75 * 2**30))
    assert p.header == ["1c.3g.71gb is emulated with the SMs of a 1-slice profile (16) and the memory of 3g.71gb: "
                        "an approximation of a compute instance"]


@pytest.mark.usefixtures("with_green_contexts")
def test_emulation_takes_the_gpu_with_mig_off_on_a_mixed_machine(plan: PlanFn) -> None:
    p = plan("a100-40gb-mixed", profile="3g.20gb", emulate=True)
    assert (only(p).uuid, only(p).sms, p.pin) == (topo.A100_40_GPU1, 42, topo.A100_40_GPU1)


@pytest.mark.usefixtures("with_green_contexts")
def test_emulation_of_the_scheduler_s_gpu_leaves_the_pin_alone(plan: PlanFn) -> None:
    p = plan("h200-mig-off", {"CUDA_VISIBLE_DEVICES": "0"}, profile="2g.35gb", emulate=True)
    assert (only(p).profile, only(p).chosen_by, p.pin) == ("2g.35gb", "emulation", None)


@pytest.mark.usefixtures("with_green_contexts")
def test_emulating_a_profile_the_gpu_does_not_have(refused: Callable[..., str]) -> None:
    assert refused("h200-mig-off", profile="1g.10gb", emulate=True) == (
        f"GPU 0 (NVIDIA H200) has no profile 1g.10gb; its profiles: {H200_PROFILES}.")
    assert refused("l40s-no-mig", profile="all", emulate=True).startswith(
        "GPU 0 (NVIDIA L40S) has no MIG profiles, so there is nothing to sweep")


@pytest.mark.usefixtures("with_green_contexts")
def test_emulation_on_a_gpu_with_mig_on_is_refused(refused: Callable[..., str]) -> None:
    assert refused("h100-mig", profile="1g.10gb", emulate=True) == (
        f"--mig-emulate approximates a profile on a GPU with MIG mode off, but GPU 0 ({H100}) has MIG on: "
        "drop --mig-emulate and run on a real instance.")
    # The scheduler's slice is on a GPU with MIG on, though the machine has a GPU with MIG off too.
    msg = refused("a100-40gb-mixed", {"CUDA_VISIBLE_DEVICES": topo.A100_40_3G}, profile="3g.20gb", emulate=True)
    assert msg.startswith("--mig-emulate approximates a profile on a GPU with MIG mode off, "
                          "but GPU 0 (NVIDIA A100-SXM4-40GB) has MIG on")


@pytest.mark.usefixtures("with_green_contexts")
def test_emulation_needs_a_profile(refused: Callable[..., str]) -> None:
    assert refused("h200-mig-off", emulate=True) == (
        f"--mig-emulate needs the profile to emulate: add --mig-profile P or --mig-profile all "
        f"(the profiles here: GPU 0 (NVIDIA H200): {H200_PROFILES}).")


def test_emulation_on_a_torch_without_green_contexts(refused: Callable[..., str],
                                                      green_contexts: Callable[[bool], None]) -> None:
    import torch

    green_contexts(False)
    msg = refused("h200-mig-off", profile="1g.18gb", emulate=True)
    assert msg == (f"--mig-emulate needs CUDA green contexts, but this PyTorch ({torch.__version__}) was built without "
                   "green-context support (a CUDA 12.8+ build of PyTorch >= 2.10 is needed).")


def test_emulation_on_a_torch_older_than_green_contexts(refused: Callable[..., str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.cuda

    monkeypatch.delattr(torch.cuda, "green_contexts", raising=False)
    monkeypatch.setitem(sys.modules, "torch.cuda.green_contexts", None)  # type: ignore[arg-type]
    assert refused("h200-mig-off", profile="1g.18gb", emulate=True) == (
        "--mig-emulate needs CUDA green contexts, but this PyTorch has no torch.cuda.green_contexts "
        "(PyTorch >= 2.10 with CUDA 12.8+ is needed).")


# ------------------------------------------------------------------------------------------------
# No GPU, no NVML, driver not loaded.

NO_GPU_REASONS = {
    "no-gpu": "NVML found no NVIDIA GPU on this machine",
    "no-nvml": ("NVML could not start: the NVML library (libnvidia-ml.so) was not found: "
                "no NVIDIA driver on this machine"),
    "driver-not-loaded": "NVML could not start: the NVIDIA driver is not loaded",
    "no-pynvml": "the pynvml module (package nvidia-ml-py) is not installed",
}


@pytest.mark.parametrize(("topology", "reason"), NO_GPU_REASONS.items())
def test_without_a_gpu_the_target_is_the_cpu_and_the_header_says_why(plan: PlanFn, topology: str, reason: str) -> None:
    p = plan(topology)
    t = only(p)
    assert (t.kind, t.profile, t.device, t.chosen_by, t.notes, p.pin) == ("cpu", "cpu", "cpu", "no GPU", [reason], None)
    assert t.is_cpu and t.label() == "CPU" and t.gpu_slug == "cpu" and t.memory_budget() == target.CPU_MEMORY_BUDGET
    assert p.header == [f"no GPU: {reason}; running the workloads on the CPU at small sizes; "
                        "nothing is compared with GPU baselines"]


@pytest.mark.parametrize(("topology", "reason"), NO_GPU_REASONS.items())
def test_require_gpu_turns_the_cpu_into_an_error(refused: Callable[..., str], topology: str, reason: str) -> None:
    assert refused(topology, require_gpu=True, profile="1g.10gb") == (
        f"--mig-require-gpu is set but there is no usable GPU: {reason}.")


def test_require_gpu_with_every_gpu_hidden(refused: Callable[..., str]) -> None:
    msg = refused("h100-mig", {"CUDA_VISIBLE_DEVICES": "-1"}, require_gpu=True)
    assert msg == "--mig-require-gpu is set but there is no usable GPU: CUDA_VISIBLE_DEVICES='-1' hides every GPU."


def test_require_gpu_changes_nothing_where_there_is_a_gpu(plan: PlanFn) -> None:
    assert only(plan("h100-mig", require_gpu=True)).kind == "mig"


# ------------------------------------------------------------------------------------------------
# A GPU NVML lists but cannot read (lost, needs a reset) is left out, and the header says so.

GPU_IS_LOST = 15  # pynvml.NVML_ERROR_GPU_IS_LOST


@pytest.mark.parametrize("function", ["nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMigMode"])
def test_a_gpu_nvml_cannot_read_is_left_out(plan: PlanFn, function: str) -> None:
    t = topo.with_error(topo.get_topology("a100-40gb-mixed"), function, GPU_IS_LOST, topo.A100_40_GPU0)
    p = plan(t, profile="full")
    assert only(p).uuid == topo.A100_40_GPU1
    assert p.header == ["NVML could not read GPU 0: NVMLError_GpuIsLost: GPU is lost; that GPU is left out"]


def test_a_lost_gpu_is_named_when_nothing_else_fits(refused: Callable[..., str]) -> None:
    """GPU 0 held the MIG slices; it is lost, so the profile is not found: the sentence says why."""
    t = topo.with_error(topo.get_topology("a100-40gb-mixed"), "nvmlDeviceGetUUID", GPU_IS_LOST, topo.A100_40_GPU0)
    msg = refused(t, profile="1g.5gb")
    assert msg.endswith("Also: NVML could not read GPU 0: NVMLError_GpuIsLost: GPU is lost (a lost GPU needs a reset "
                        "by an administrator).")
    msg = refused(t, {"CUDA_VISIBLE_DEVICES": "0"}, profile="1g.5gb")
    assert msg.startswith("CUDA_VISIBLE_DEVICES=0 names no GPU or MIG instance on this machine")
    assert "NVML could not read GPU 0: NVMLError_GpuIsLost" in msg


def test_a_pending_mig_mode_change_is_shown_as_pending(refused: Callable[..., str],
                                                       discover: Callable[[Any], nvml.Inventory]) -> None:
    t = topo.with_mig_mode(topo.get_topology("h200-mig-off"), 0, current=0, pending=1)
    (gpu,) = discover(t).gpus
    assert gpu.mig_enabled is False and gpu.mig_pending is True
    assert gpu.state_words() == "MIG off (MIG on pending: a GPU reset is due before it applies)"
    msg = refused(t, profile="1g.18gb")
    assert msg.endswith("Also: GPU 0 has a pending MIG mode change: MIG off (MIG on pending: a GPU reset is due "
                        "before it applies).")
    assert discover(topo.get_topology("h200-mig-off")).gpus[0].mig_pending is None  # nothing pending


def test_a_whole_gpu_in_use_is_warned_about_as_a_slice_is(plan: PlanFn) -> None:
    busy = topo.with_busy(topo.with_all_free(topo.get_topology("h200-mig-off")), topo.H200_GPU0, pid=4242)
    p = plan(busy, profile="full")
    assert "GPU 0 is in use by pid 4242: its figures may be disturbed" in p.header
    assert not any("in use" in line for line in plan(topo.with_all_free(topo.get_topology("h200-mig-off")),
                                                     profile="full").header)


def test_a_mig_mode_nvml_does_not_support_means_a_gpu_without_mig(discover: Callable[[Any], nvml.Inventory]) -> None:
    inv = discover("l40s-no-mig")
    assert [(g.name, g.mig_enabled) for g in inv.gpus] == [("NVIDIA L40S", None)] and inv.problems == ()


def test_when_no_gpu_can_be_read_the_run_is_on_the_cpu_and_says_why(plan: PlanFn) -> None:
    p = plan(topo.with_error(topo.get_topology("h100-mig"), "nvmlDeviceGetUUID", GPU_IS_LOST))
    assert only(p).kind == "cpu"
    assert only(p).notes == ["NVML could not read any GPU: GPU 0: NVMLError_GpuIsLost: GPU is lost"]


def test_a_mig_device_without_a_uuid_cannot_be_pinned_and_is_left_out(plan: PlanFn) -> None:
    t = topo.with_error(topo.get_topology("h100-mig"), "nvmlDeviceGetUUID", GPU_IS_LOST, topo.H100_1G[0])
    assert only(plan(t, profile="1g.10gb")).uuid == topo.H100_1G[1]


# ------------------------------------------------------------------------------------------------
# pin(): CUDA_VISIBLE_DEVICES before CUDA starts.


def test_pin_sets_cuda_visible_devices() -> None:
    env: dict[str, str] = {}
    pin(Plan([Target("mig", "1g.10gb", "plugin")], topo.H100_1G[2]), env)
    assert env == {"CUDA_VISIBLE_DEVICES": topo.H100_1G[2]}


def test_pin_without_a_value_leaves_the_environment_alone() -> None:
    env = {"CUDA_VISIBLE_DEVICES": topo.H100_1G[0]}
    pin(Plan([Target("mig", "1g.10gb", SCHEDULER)], None), env)
    assert env == {"CUDA_VISIBLE_DEVICES": topo.H100_1G[0]}


def test_pin_after_cuda_started_on_another_device_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target, "cuda_initialized", lambda: True)
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    with pytest.raises(SelectionError, match=r"^CUDA was initialised in this process before pytest-mig could pin "
                                             + topo.H100_1G[2] + ": something .* touched the GPU at import time"):
        pin(Plan([Target("mig", "1g.10gb", "plugin")], topo.H100_1G[2]), env)
    assert env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_pin_after_cuda_started_on_the_same_device_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target, "cuda_initialized", lambda: True)
    env = {"CUDA_VISIBLE_DEVICES": topo.H100_1G[2]}
    pin(Plan([Target("mig", "1g.10gb", "plugin")], topo.H100_1G[2]), env)
    assert env == {"CUDA_VISIBLE_DEVICES": topo.H100_1G[2]}


def _torch_with(is_initialized: Callable[[], bool]) -> types.ModuleType:
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(is_initialized=is_initialized)  # type: ignore[attr-defined]
    return fake


def test_cuda_initialized_asks_torch_only_when_torch_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", _torch_with(lambda: True))
    assert target.cuda_initialized() is True
    monkeypatch.setitem(sys.modules, "torch", _torch_with(lambda: False))
    assert target.cuda_initialized() is False

    def broken() -> bool:
        raise RuntimeError("no driver")

    monkeypatch.setitem(sys.modules, "torch", _torch_with(broken))
    assert target.cuda_initialized() is False
    monkeypatch.delitem(sys.modules, "torch")
    assert target.cuda_initialized() is False


# ------------------------------------------------------------------------------------------------
# verify(): what CUDA sees once it starts.


@pytest.fixture
def h100_slice(plan: PlanFn) -> Target:
    return only(plan("h100-mig", profile="1g.10gb"))


def test_verify_accepts_the_slice_asked_for(h100_slice: Target, cuda_props_of: Callable[..., CudaProps]) -> None:
    t = verify(h100_slice, cuda_props_of("h100-mig", topo.H100_1G[0]))
    assert (t.sms_obtained, t.compute_capability) == (16, (9, 0))
    assert t.verified == "ok: CUDA sees 16 SMs and 9.8 GiB"


@pytest.mark.parametrize(
    ("props", "problem"),
    [
        (CudaProps(f"{H100} MIG 2g.20gb", 32, 20096 * MIB, (9, 0)),
         f"32 SMs where 1g.10gb has 16; 19.6 GiB where 1g.10gb has 9.8 GiB; CUDA names it '{H100} MIG 2g.20gb'"),
        (CudaProps(H100, 132, 81559 * MIB, (9, 0)), "132 SMs where 1g.10gb has 16; 79.6 GiB where 1g.10gb has 9.8 GiB"),
        (CudaProps(f"{H100} MIG 1g.10gb+me", 16, 9984 * MIB, (9, 0)), f"CUDA names it '{H100} MIG 1g.10gb+me'"),
        (CudaProps(f"{H100} MIG 1g.10gb", 16, 5000 * MIB, (9, 0)), "4.9 GiB where 1g.10gb has 9.8 GiB"),
    ],
)
def test_verify_refuses_another_device_in_one_sentence(h100_slice: Target, props: CudaProps, problem: str) -> None:
    with pytest.raises(VerificationError) as exc:
        verify(h100_slice, props)
    assert str(exc.value) == f"the device CUDA gave is not the 1g.10gb asked for: {problem}."


def test_verify_without_cuda_in_torch(h100_slice: Target) -> None:
    with pytest.raises(VerificationError, match=r"^NVML sees NVIDIA H100 80GB HBM3 but this PyTorch cannot use CUDA"):
        verify(h100_slice, None)


def test_verify_a_whole_gpu_by_its_sm_count(plan: PlanFn, cuda_props_of: Callable[..., CudaProps]) -> None:
    whole = only(plan("h200-mig-off"))
    assert verify(whole, cuda_props_of("h200-mig-off")).verified == "ok: CUDA sees 132 SMs and 140.4 GiB"
    with pytest.raises(VerificationError, match="114 SMs where full has 132"):
        verify(whole, CudaProps("NVIDIA H200", 114, 143771 * MIB, (9, 0)))


@pytest.mark.usefixtures("with_green_contexts")
def test_verify_an_emulated_profile_leaves_the_sms_to_the_green_context(
    plan: PlanFn, cuda_props_of: Callable[..., CudaProps]
) -> None:
    t = verify(only(plan("h200-mig-off", profile="1g.18gb", emulate=True)), cuda_props_of("h200-mig-off"))
    assert t.verified == "CUDA sees the whole GPU (132 SMs); the green context limits it"
    assert t.sms == 16 and t.sms_obtained is None


def test_verify_the_cpu(plan: PlanFn) -> None:
    assert verify(only(plan("no-gpu")), None).verified == "CPU run: nothing to verify"
