"""The plugin end to end: pytester runs against the fake pynvml loaded with real GPUs' topologies.

Runs are in-process (fast): the fake is put in ``sys.modules`` and CUDA, green-context support and the
emulator are stood in for through their seams (see conftest.py).  ``os.environ`` is the real one, so
what ``pin`` writes is checked there and undone after each test.  One run is a subprocess, to see the
pin in a fresh process as a scheduler's job would start it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

import fake_pynvml
import topologies as topo
from pytest_mig.common.text import shown

H100 = "NVIDIA H100 80GB HBM3"
H100_PROFILES = "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"
H200_PROFILES = "1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb"
SWEEP = ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]

#: A test that reports the Target it got: tests below assert on these lines.
REPORTING_TEST = """
import os

def test_target(mig_device, mig_plan):
    print()
    print("kind", mig_device.kind, "device", mig_device.device, "profile", mig_device.profile)
    print("uuid", mig_device.uuid, "chosen_by", mig_device.chosen_by)
    print("sms", mig_device.sms, "obtained", mig_device.sms_obtained, "memory", mig_device.memory_bytes)
    print("verified", mig_device.verified)
    print("pinned", os.environ.get("CUDA_VISIBLE_DEVICES"), "sweep", mig_plan.sweep)
"""


@pytest.fixture
def emulation(
    green_contexts: Callable[[bool], None], stand_in_emulator: type, machine: Callable[..., None]
) -> type:
    """An H200 with MIG off whose torch has green contexts; the plugin's emulator is a stand-in."""
    machine("h200-mig-off", cuda="gpu0")
    green_contexts(True)
    return stand_in_emulator


#: Plugins an in-process run can do without, each of which costs about half a second per run here:
#: unraisableexception calls gc.collect() five times (slow once torch is imported; these runs raise
#: nothing unraisable), and hypothesis's plugin re-imports hypothesis every run (pytester drops the
#: modules a run imported).  Blocking a plugin that is not installed is a no-op.
SLOW_PLUGINS = ("-p", "no:unraisableexception", "-p", "no:hypothesispytest")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """An in-process run of pytest, with pytest-mig loaded from its entry point."""
    return pytester.runpytest(*SLOW_PLUGINS, *args)


def usage_error(result: pytest.RunResult) -> str:
    """The one sentence of a usage error; the run must have stopped with exit code 4 and no traceback."""
    output = "\n".join(result.outlines + result.errlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    assert "Traceback" not in output and "INTERNALERROR" not in output
    errors = [line[len("ERROR: "):] for line in result.errlines if line.startswith("ERROR: ")]
    assert len(errors) == 1, output
    return errors[0]


# ------------------------------------------------------------------------------------------------
# Options.


def test_help_lists_the_mig_options_and_ini_settings(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "pytest-mig: NVIDIA MIG slices and GPUs:",
        "*--mig-profile=MIG_PROFILE*",
        "*--mig-device=MIG_DEVICE*",
        "*--mig-emulate*",
        "*--mig-require-gpu*",
        "*--mig-baseline-keep=MIG_BASELINE_KEEP*",
        "*--mig-confirm=MIG_CONFIRM*",
        "*--mig-tolerance=MIG_TOLERANCE*",
        "*the largest change a figure may hide*",
    ])
    result.stdout.fnmatch_lines(["*mig_profile (string):*", "*mig_require_gpu (string):*", "*mig_baseline_keep*",
                                 "*mig_confirm*"])


# ------------------------------------------------------------------------------------------------
# Usage errors: one sentence, exit code 4, no traceback.


@pytest.mark.parametrize(
    ("topology", "args", "sentence"),
    [
        pytest.param("h100-mig", ["--mig-profile", "bogus"],
                     "'bogus' is not a MIG profile name: expected <slices>g.<memory>gb such as 1g.10gb, 1g.10gb+me or "
                     f"1c.3g.40gb, or 'full' or 'all'; the profiles here: GPU 0 ({H100}): {H100_PROFILES}.",
                     id="malformed profile"),
        pytest.param("h100-mig", ["--mig-profile", "1g.5gb"],
                     f"GPU 0 ({H100}) has no profile 1g.5gb; its profiles: {H100_PROFILES}.", id="not this GPU's"),
        pytest.param(topo.with_busy(topo.get_topology("a100-40gb-mixed"), topo.A100_40_1G_FREE),
                     ["--mig-profile", "1g.5gb"],
                     f"every 1g.5gb instance is busy: {topo.A100_40_1G_BUSY} (pids {topo.A100_40_BUSY_PID}), "
                     f"{topo.A100_40_1G_FREE} (pids 31337); wait for one to be free, or name one with --mig-device "
                     "to share it.", id="every instance busy"),
        pytest.param("a100-80gb-mixed", ["--mig-profile", "4g.40gb"],
                     "no 4g.40gb instance exists: GPU 0 (NVIDIA A100-SXM4-80GB) has 3g.40gb x1, 2g.20gb x1, "
                     "1g.10gb x2; GPU 1 (NVIDIA A100-SXM4-80GB) has 1c.3g.40gb x1, 2c.3g.40gb x1, 1g.20gb x1, "
                     "1g.10gb x2. An administrator must create one (nvidia-smi mig -cgi).", id="no instance"),
        pytest.param("h200-mig-off", ["--mig-profile", "1g.18gb"],
                     "GPU 0 (NVIDIA H200) has MIG mode disabled, so there is no 1g.18gb slice to pin; its profiles "
                     f"are {H200_PROFILES}. Use --mig-emulate to approximate 1g.18gb with a green context, or "
                     "--mig-profile full for the whole GPU.", id="MIG off"),
        pytest.param("h100-mig", ["--mig-profile", "full"],
                     "--mig-profile full needs a GPU with MIG mode off, but every GPU here has MIG on: "
                     f"GPU 0 ({H100}): 1g.10gb x7.", id="full on MIG"),
        pytest.param("h200-mig-off", ["--mig-profile", "all"],
                     "--mig-profile all sweeps every profile of the GPU in one process, which only emulation can do: "
                     "add --mig-emulate (on a MIG GPU, run one job per slice instead).", id="all without emulation"),
        pytest.param("h100-mig", ["--mig-profile", "1g.10gb", "--mig-emulate"],
                     f"--mig-emulate approximates a profile on a GPU with MIG mode off, but GPU 0 ({H100}) has MIG on: "
                     "drop --mig-emulate and run on a real instance.", id="emulation on MIG"),
        pytest.param("no-gpu", ["--mig-require-gpu"],
                     "--mig-require-gpu is set but there is no usable GPU: NVML found no NVIDIA GPU on this machine.",
                     id="require GPU"),
    ],
)
def test_a_choice_that_cannot_be_had_is_one_sentence_and_exit_code_4(
    pytester: pytest.Pytester, machine: Callable[..., None], topology: Any, args: list[str], sentence: str
) -> None:
    machine(topology)
    pytester.makepyfile(REPORTING_TEST)
    assert usage_error(run(pytester, *args)) == sentence
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # nothing was pinned


@pytest.mark.parametrize("device", ["MIG-00000000-0000-0000-0000-000000000000", "7", "0:9"])
def test_mig_device_that_does_not_exist(pytester: pytest.Pytester, machine: Callable[..., None], device: str) -> None:
    machine("a100-40gb-mixed")
    sentence = usage_error(run(pytester, "--mig-device", device))
    assert sentence.startswith(f"--mig-device {device} is not a GPU or MIG instance on this machine; known: "
                               f"{topo.A100_40_3G}, {topo.A100_40_2G}, ")
    assert sentence.endswith(f"0 ({topo.A100_40_GPU0}), 1 ({topo.A100_40_GPU1}).")


def test_a_scheduler_pin_to_another_profile_is_refused(pytester: pytest.Pytester, machine: Callable[..., None],
                                                       mig_env: pytest.MonkeyPatch) -> None:
    machine("a100-80gb-mixed")
    mig_env.setenv("CUDA_VISIBLE_DEVICES", topo.A100_80_3G)  # Slurm gave a 3g.40gb
    assert usage_error(run(pytester, "--mig-profile", "1g.10gb")) == (
        f"CUDA_VISIBLE_DEVICES names {topo.A100_80_3G}, a 3g.40gb instance, but --mig-profile asks for 1g.10gb.")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == topo.A100_80_3G


def test_emulation_on_a_torch_without_green_contexts(pytester: pytest.Pytester, emulation: type,
                                                     green_contexts: Callable[[bool], None]) -> None:
    green_contexts(False)
    sentence = usage_error(run(pytester, "--mig-profile", "1g.18gb", "--mig-emulate"))
    assert sentence.startswith("--mig-emulate needs CUDA green contexts, but this PyTorch (")
    assert sentence.endswith("was built without green-context support "
                             "(a CUDA 12.8+ build of PyTorch >= 2.10 is needed).")


def test_cuda_started_before_the_pin_is_refused(pytester: pytest.Pytester, machine: Callable[..., None],
                                                mig_env: pytest.MonkeyPatch) -> None:
    from pytest_mig.device import target

    machine("h100-mig", cuda=topo.H100_1G[0])
    mig_env.setattr(target, "cuda_initialized", lambda: True)  # e.g. a conftest touched the GPU at import
    assert usage_error(run(pytester, "--mig-profile", "1g.10gb")) == (
        f"CUDA was initialised in this process before pytest-mig could pin {topo.H100_1G[0]}: something (a conftest, "
        "a plugin) touched the GPU at import time; move that code into a fixture or set CUDA_VISIBLE_DEVICES yourself.")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_device_cuda_shows_otherwise_than_asked_fails_verification(pytester: pytest.Pytester,
                                                                     machine: Callable[..., None]) -> None:
    machine("h100-mig", cuda=topo.H100_GPU0)  # CUDA sees the whole GPU though a slice was pinned
    pytester.makepyfile(REPORTING_TEST)
    assert usage_error(run(pytester, "--mig-profile", "1g.10gb")) == (
        "the device CUDA gave is not the 1g.10gb asked for: 132 SMs where 1g.10gb has 16; "
        "79.6 GiB where 1g.10gb has 9.8 GiB.")


def test_a_torch_without_cuda_on_a_gpu_machine_fails_verification(pytester: pytest.Pytester,
                                                                  machine: Callable[..., None]) -> None:
    machine("h100-mig", cuda=None)
    assert usage_error(run(pytester)).startswith(f"NVML sees {H100} but this PyTorch cannot use CUDA (is it a "
                                                        "CPU-only build?)")


def test_require_gpu_from_the_ini_file(pytester: pytest.Pytester, machine: Callable[..., None]) -> None:
    machine("driver-not-loaded")
    pytester.makeini("[pytest]\nmig_require_gpu = true\n")
    assert usage_error(run(pytester)) == (
        "--mig-require-gpu is set but there is no usable GPU: NVML could not start: the NVIDIA driver is not loaded.")


def test_a_malformed_ini_boolean_is_a_usage_error(pytester: pytest.Pytester, machine: Callable[..., None]) -> None:
    machine("no-gpu")
    pytester.makeini("[pytest]\nmig_require_gpu = maybe\n")
    # read by pytest-mig itself (not as pytest's "bool" type), so the sentence names the option
    assert usage_error(run(pytester)) == "ini option mig_require_gpu: 'maybe' is not true or false; use true or false."


# ------------------------------------------------------------------------------------------------
# A real slice: chosen, pinned, verified, and said in the header.


def test_a_free_slice_of_the_profile_is_pinned_verified_and_reported(
    pytester: pytest.Pytester, machine: Callable[..., None]
) -> None:
    machine("a100-40gb-mixed", cuda=topo.A100_40_1G_FREE)
    pytester.makepyfile(REPORTING_TEST)
    result = run(pytester, "-s", "--mig-profile", "1g.5gb")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "pytest-mig: GPU 0: NVIDIA A100-SXM4-40GB, driver 535.183.01, CUDA 12.2, VBIOS 92.00.36.00.02, torch *",
        f"pytest-mig: profile 1g.5gb (mig) {topo.A100_40_1G_FREE}, chosen by plugin (free instance)",
        "pytest-mig: check: ok: CUDA sees 14 SMs and 4.8 GiB",
        "*",
        "kind mig device cuda:0 profile 1g.5gb",
        f"uuid {topo.A100_40_1G_FREE} chosen_by plugin (free instance)",
        f"sms 14 obtained 14 memory {4864 * topo.MIB}",
        "verified ok: CUDA sees 14 SMs and 4.8 GiB",
        f"pinned {topo.A100_40_1G_FREE} sweep False",
    ])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == topo.A100_40_1G_FREE  # pin() wrote it, before CUDA started


def test_the_scheduler_s_slice_is_used_as_given(pytester: pytest.Pytester, machine: Callable[..., None],
                                                mig_env: pytest.MonkeyPatch) -> None:
    machine("a100-80gb-mixed", cuda=topo.A100_80_1G_D)
    mig_env.setenv("CUDA_VISIBLE_DEVICES", topo.A100_80_1G_D)  # Kubernetes gave nvidia.com/mig-1g.10gb
    pytester.makepyfile(REPORTING_TEST)
    result = run(pytester, "-s", "--mig-profile", "1g.10gb")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "pytest-mig: GPU 1: NVIDIA A100-SXM4-80GB, driver 550.54.15, CUDA 12.4, *",
        f"pytest-mig: profile 1g.10gb (mig) {topo.A100_80_1G_D}, chosen by scheduler (CUDA_VISIBLE_DEVICES)",
        "pytest-mig: check: ok: CUDA sees 14 SMs and 9.5 GiB",
        "*",
        f"pinned {topo.A100_80_1G_D} sweep False",
    ])


def test_a_busy_slice_named_with_mig_device_is_used_and_the_header_warns(
    pytester: pytest.Pytester, machine: Callable[..., None]
) -> None:
    machine("a100-40gb-mixed", cuda=topo.A100_40_1G_BUSY)
    pytester.makepyfile(REPORTING_TEST)
    result = run(pytester, "--mig-device", "0:2")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        f"pytest-mig: {topo.A100_40_1G_BUSY} is in use by pid {topo.A100_40_BUSY_PID}: its figures may be disturbed",
        "pytest-mig: GPU 0: *",
        f"pytest-mig: profile 1g.5gb (mig) {topo.A100_40_1G_BUSY}, chosen by --mig-device",
    ])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == topo.A100_40_1G_BUSY


def test_full_is_a_whole_gpu_with_mig_off(pytester: pytest.Pytester, machine: Callable[..., None]) -> None:
    machine("a100-40gb-mixed", cuda=topo.A100_40_GPU1)
    pytester.makepyfile(REPORTING_TEST)
    result = run(pytester, "-s", "--mig-profile", "full")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "pytest-mig: GPU 1: NVIDIA A100-SXM4-40GB, *",
        f"pytest-mig: profile full (full) {topo.A100_40_GPU1}, chosen by plugin",
        "pytest-mig: check: ok: CUDA sees 108 SMs and 40.0 GiB",
    ])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == topo.A100_40_GPU1


# ------------------------------------------------------------------------------------------------
# No GPU: the CPU, and the header says why.


@pytest.mark.parametrize(
    ("topology", "reason"),
    [
        ("no-gpu", "NVML found no NVIDIA GPU on this machine"),
        ("no-nvml", "NVML could not start: the NVML library (libnvidia-ml.so) was not found: "
                    "no NVIDIA driver on this machine"),
        ("driver-not-loaded", "NVML could not start: the NVIDIA driver is not loaded"),
        (fake_pynvml.NO_PYNVML, "the pynvml module (package nvidia-ml-py) is not installed"),
    ],
)
def test_without_a_gpu_the_run_is_on_the_cpu(pytester: pytest.Pytester, machine: Callable[..., None],
                                             topology: str, reason: str) -> None:
    machine(topology)
    pytester.makepyfile(REPORTING_TEST)
    result = run(pytester, "-s")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        f"pytest-mig: no GPU: {reason}; running the workloads on the CPU at small sizes; "
        "nothing is compared with GPU baselines",
        "pytest-mig: target CPU; torch *",
        "*",
        "kind cpu device cpu profile cpu",
        "uuid None chosen_by no GPU",
        "sms None obtained None memory None",
        "verified CPU run: nothing to verify",
        "pinned None sweep False",
    ])


# ------------------------------------------------------------------------------------------------
# Where the profile comes from: command line > environment > ini.


@pytest.mark.parametrize(
    ("cli", "env", "ini", "used"),
    [
        (None, None, "7g.80gb", "7g.80gb"),
        (None, "2g.20gb", "7g.80gb", "2g.20gb"),
        ("1g.10gb", "2g.20gb", "7g.80gb", "1g.10gb"),
        ("1g.10gb", None, None, "1g.10gb"),
    ],
)
def test_the_profile_s_precedence_is_command_line_then_environment_then_ini(
    pytester: pytest.Pytester, machine: Callable[..., None], mig_env: pytest.MonkeyPatch,
    cli: str | None, env: str | None, ini: str | None, used: str
) -> None:
    machine("no-gpu")  # the header names the profile that was asked and not applied
    if ini:
        pytester.makeini(f"[pytest]\nmig_profile = {ini}\n")
    if env:
        mig_env.setenv("PYTEST_MIG_PROFILE", env)
    result = run(pytester, *(["--mig-profile", cli] if cli else []))
    result.stdout.fnmatch_lines([f"pytest-mig: no GPU: * (--mig-profile {used} not applied); *"])


def test_the_environment_s_profile_selects_a_slice(pytester: pytest.Pytester, machine: Callable[..., None],
                                                   mig_env: pytest.MonkeyPatch) -> None:
    machine("a100-80gb-mixed", cuda=topo.A100_80_1G20)
    pytester.makeini("[pytest]\nmig_profile = 3g.40gb\n")
    mig_env.setenv("PYTEST_MIG_PROFILE", "1g.20gb")
    pytester.makepyfile(REPORTING_TEST)
    result = run(pytester)
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"pytest-mig: profile 1g.20gb (mig) {topo.A100_80_1G20}, "
                                 "chosen by plugin (free instance)"])


def test_an_ini_profile_that_cannot_be_had_is_a_usage_error(pytester: pytest.Pytester,
                                                            machine: Callable[..., None]) -> None:
    machine("h100-mig")
    pytester.makeini("[pytest]\nmig_profile = 3g.40gb\n")
    assert usage_error(run(pytester)).startswith(f"no 3g.40gb instance exists: GPU 0 ({H100}) has 1g.10gb x7.")


# ------------------------------------------------------------------------------------------------
# Emulation.


def test_emulating_one_profile(pytester: pytest.Pytester, emulation: Any) -> None:
    pytester.makepyfile(REPORTING_TEST)
    result = run(pytester, "-s", "--mig-profile", "1g.18gb", "--mig-emulate")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "pytest-mig: GPU 0: NVIDIA H200, driver 580.159.04, CUDA 13.0, VBIOS 96.00.A5.00.1A, torch *",
        f"pytest-mig: profile 1g.18gb (emulated) {topo.H200_GPU0}, chosen by emulation",
        "pytest-mig: emulation partitions SMs only (green context) and caps memory; *",
        "pytest-mig: check: CUDA sees the whole GPU (132 SMs); the green context limits it: "
        "stand-in green context: 16 SMs asked, 16 obtained",
        "*",
        "kind emulated device cuda:0 profile 1g.18gb",
        f"sms 16 obtained 16 memory {16 * 2**30}",
        "verified stand-in green context: 16 SMs asked, 16 obtained",
        f"pinned {topo.H200_GPU0} sweep False",
    ])
    assert emulation.activated == ["1g.18gb", "1g.18gb"]  # at session start (for the header), then for the test


SWEEP_TESTS = """
import pytest

def test_each(mig_device, mig_plan, request):
    assert mig_plan.sweep
    assert request.node.callspec.id == mig_device.profile
    print()
    print("ran", mig_device.profile, mig_device.sms, mig_device.sms_obtained)

@pytest.mark.mig_min_sms(32)
def test_big(mig_device):
    pass

def test_plain():
    pass
"""


def test_the_sweep_parametrizes_mig_device_once_per_profile(pytester: pytest.Pytester, emulation: Any) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TESTS)
    result = run(pytester, "--collect-only", "-q", "--mig-profile", "all", "--mig-emulate")
    assert result.ret == 0
    collected = [line for line in result.outlines if line.startswith("test_sweep.py::")]
    assert collected == ([f"test_sweep.py::test_each[{p}]" for p in SWEEP]
                         + [f"test_sweep.py::test_big[{p}]" for p in SWEEP] + ["test_sweep.py::test_plain"])
    assert emulation.activated == []  # collecting starts no green context


def test_the_sweep_runs_each_profile_in_its_own_green_context(pytester: pytest.Pytester, emulation: Any) -> None:
    pytester.makepyfile(test_sweep=SWEEP_TESTS)
    result = run(pytester, "-s", "-rs", "--strict-markers", "--mig-profile", "all", "--mig-emulate", "--mig-all-tests")
    result.assert_outcomes(passed=11, skipped=2)
    result.stdout.fnmatch_lines([
        "pytest-mig: emulated sweep over every profile: 1g.18gb (16 SMs), 1g.35gb (26 SMs), 2g.35gb (32 SMs), "
        "3g.71gb (60 SMs), 4g.71gb (64 SMs), 7g.141gb (132 SMs); chosen by emulation",
    ])
    result.stdout.fnmatch_lines(["ran 1g.18gb 16 16", "ran 1g.35gb 26 32", "ran 2g.35gb 32 32", "ran 3g.71gb 60 64",
                                 "ran 4g.71gb 64 64", "ran 7g.141gb 132 132"])
    result.stdout.fnmatch_lines(["SKIPPED * test_sweep.py:*: needs 32 SMs; 1g.18gb has 16",
                                 "SKIPPED * test_sweep.py:*: needs 32 SMs; 1g.35gb has 26"])
    assert "left out of the sweep" not in result.stdout.str()  # --mig-all-tests measures the twins too
    # each context once at session start (for the header), then test_each over all, test_big where it fits
    assert emulation.activated == SWEEP + SWEEP + SWEEP[2:]


def test_the_sweep_measures_a_green_context_its_driver_gave_two_profiles_once(pytester: pytest.Pytester,
                                                                               emulation: Any) -> None:
    """The stand-in rounds SMs up to a multiple of 8, as Hopper's driver does: the H200's 1g.35gb (26 asked)
    gets 2g.35gb's 32 SMs and 3g.71gb (60) gets 4g.71gb's 64, with the same memory each. The profile that
    got what it asked stands for its twin; the header names the twin and why."""
    pytester.makepyfile(test_sweep=SWEEP_TESTS, test_sweep_cost=COST_TEST)  # the cost test records figures
    result = run(pytester, "-s", "-rs", "--strict-markers", "--mig-profile", "all", "--mig-emulate",
                 "--mig-results", "sweep.json")
    result.assert_outcomes(passed=12, skipped=1)
    result.stdout.fnmatch_lines([
        "pytest-mig: green contexts, SMs asked -> obtained: 1g.18gb 16 -> 16, 2g.35gb 32 -> 32, 4g.71gb 64 -> 64, "
        "7g.141gb 132 -> 132",
        "pytest-mig: 1g.35gb left out of the sweep: its green context obtained the same 32 SMs and * GiB as "
        "2g.35gb's (26 asked), so it would measure the same configuration again; measured once, as 2g.35gb "
        "(--mig-all-tests measures both)",
        "pytest-mig: 3g.71gb left out of the sweep: its green context obtained the same 64 SMs and * GiB as "
        "4g.71gb's (60 asked)*",
    ])
    ran = [line.split()[1] for line in result.outlines if line.startswith("ran ")]
    assert ran == ["1g.18gb", "2g.35gb", "4g.71gb", "7g.141gb"]
    meta = json.loads((pytester.path / "sweep.json").read_text())["meta"]  # the results file says so too
    assert [line.split()[0] for line in meta["left_out"]] == ["1g.35gb", "3g.71gb"]
    assert emulation.activated[:len(SWEEP)] == SWEEP  # every context made once at session start, then only the four
    assert set(emulation.activated[len(SWEEP):]) == {"1g.18gb", "2g.35gb", "4g.71gb", "7g.141gb"}


# ------------------------------------------------------------------------------------------------
# Markers.

MARKED_TESTS = """
import pytest

@pytest.mark.mig_profiles("3g.40gb", "full")
def test_profiles(mig_device):
    pass

@pytest.mark.mig_min_memory(20)
def test_memory(mig_device):
    pass

@pytest.mark.mig_min_sms(32)
def test_sms(mig_device):
    pass

@pytest.mark.mig_gpu_only
def test_gpu_only(mig_device):
    assert not mig_device.is_cpu

@pytest.mark.mig_tolerance(0.1)
def test_tolerance(mig_device):
    pass

@pytest.mark.mig_profiles("1g.10gb")
@pytest.mark.mig_min_memory(8)
@pytest.mark.mig_min_sms(16)
def test_fits(mig_device):
    pass

@pytest.mark.mig_profiles("3g.40gb")
def test_without_the_fixture():
    pass

@pytest.mark.mig_gpu_only
def test_gpu_only_without_the_fixture():
    pass
"""


def test_markers_skip_what_does_not_fit_a_slice_with_the_reason(pytester: pytest.Pytester,
                                                               machine: Callable[..., None]) -> None:
    machine("h100-mig", cuda=topo.H100_1G[0])
    pytester.makepyfile(test_markers=MARKED_TESTS)
    result = run(pytester, "-rs", "--strict-markers", "--mig-profile", "1g.10gb")
    result.assert_outcomes(passed=4, skipped=4)
    result.stdout.fnmatch_lines([
        "SKIPPED * test_markers.py:*: runs only on profiles 3g.40gb, full; this is 1g.10gb",
        "SKIPPED * test_markers.py:*: needs 20 GiB; 1g.10gb has 9.8 GiB",
        "SKIPPED * test_markers.py:*: needs 32 SMs; 1g.10gb has 16",
        "SKIPPED * test_markers.py:*: runs only on profiles 3g.40gb; this is 1g.10gb",
    ])


#: A test that fails while its frame, in a reference cycle, holds a large object, and a test after it
#: that looks whether the object is still alive when its own body starts.
FAILING_THEN_NEXT = """
import gc
import weakref

class Big:
    pass

REF = []

def test_fails_holding_memory(mig_device):
    gc.disable()  # as when nothing has triggered the cyclic collector yet
    big = Big()
    big.cycle = big
    REF.append(weakref.ref(big))
    assert False, "a workload that ran out of the slice's memory"

def test_next_starts_with_it_freed(mig_device):
    gc.enable()
    assert REF[0]() is None, "the failed test's objects are still held"
"""


def test_a_failed_test_does_not_keep_its_memory_from_the_next(pytester: pytest.Pytester,
                                                               mig_env: pytest.MonkeyPatch) -> None:
    """In a process of its own: an in-process run's hook recorder keeps every failure's frames."""
    fake_pynvml.install_subprocess(mig_env, "no-gpu")
    pytester.makepyfile(test_failing=FAILING_THEN_NEXT)
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)


def test_markers_on_the_cpu(pytester: pytest.Pytester, machine: Callable[..., None]) -> None:
    machine("no-gpu")
    pytester.makepyfile(test_markers=MARKED_TESTS)
    result = run(pytester, "-rs", "--strict-markers")
    # Memory and SM minimums do not apply to the CPU, which runs every workload at small sizes.
    result.assert_outcomes(passed=3, skipped=5)
    result.stdout.fnmatch_lines([
        "SKIPPED * test_markers.py:*: runs only on profiles 3g.40gb, full; this is cpu",
        "SKIPPED * test_markers.py:*: needs a GPU; this run is on the CPU",
        "SKIPPED * test_markers.py:*: runs only on profiles 1g.10gb; this is cpu",
        "SKIPPED * test_markers.py:*: runs only on profiles 3g.40gb; this is cpu",
        "SKIPPED * test_markers.py:*: needs a GPU; this run is on the CPU",
    ])


@pytest.mark.parametrize(
    ("marker", "sentence"),
    [
        ("mig_min_memory('lots')", "@pytest.mark.mig_min_memory needs one positive number of GiB, e.g. "
                                   "@pytest.mark.mig_min_memory(20); got ('lots',)."),
        ("mig_min_sms()", "@pytest.mark.mig_min_sms needs one positive number of SMs, e.g. "
                          "@pytest.mark.mig_min_sms(32); got ()."),
        ("mig_min_sms(-4)", "@pytest.mark.mig_min_sms needs one positive number of SMs, e.g. "
                            "@pytest.mark.mig_min_sms(32); got (-4,)."),
        ("mig_profiles", "@pytest.mark.mig_profiles needs the names of the profiles the test runs on, e.g. "
                         "@pytest.mark.mig_profiles('1g.10gb', 'full'); got ()."),
        ("mig_profiles(7)", "@pytest.mark.mig_profiles needs the names of the profiles the test runs on, e.g. "
                            "@pytest.mark.mig_profiles('1g.10gb', 'full'); got (7,)."),
        ("mig_profiles('1g10gb')", "@pytest.mark.mig_profiles needs the names of the profiles the test runs on, e.g. "
                                   "@pytest.mark.mig_profiles('1g.10gb', 'full'); got ('1g10gb',)."),
        ("mig_min_sms(float('nan'))", "@pytest.mark.mig_min_sms needs one positive number of SMs, e.g. "
                                      "@pytest.mark.mig_min_sms(32); got (nan,)."),
        ("mig_min_memory(float('inf'))", "@pytest.mark.mig_min_memory needs one positive number of GiB, e.g. "
                                         "@pytest.mark.mig_min_memory(20); got (inf,)."),
        ("mig_tolerance('abc')", "@pytest.mark.mig_tolerance('abc') is not a tolerance below 100% (tolerance 'abc' "
                                 "is not a number: write a percentage such as 5% or a fraction such as 0.05); e.g. "
                                 "@pytest.mark.mig_tolerance(0.05), mig_tolerance('5%') or "
                                 "mig_tolerance({'fp16_tflops': 0.03})."),
        ("mig_tolerance(5)", "@pytest.mark.mig_tolerance(5) is not a tolerance below 100% (5 is outside 0 up to 1 "
                             "(a fraction: 0.05 is 5%)); e.g. @pytest.mark.mig_tolerance(0.05), mig_tolerance('5%') "
                             "or mig_tolerance({'fp16_tflops': 0.03})."),
        ("mig_tolerance(-0.5)", "@pytest.mark.mig_tolerance(-0.5) is not a tolerance below 100% (-0.5 is outside 0 "
                                "up to 1 (a fraction: 0.05 is 5%)); e.g. @pytest.mark.mig_tolerance(0.05), "
                                "mig_tolerance('5%') or mig_tolerance({'fp16_tflops': 0.03})."),
    ],
)
def test_a_malformed_marker_is_a_usage_error(pytester: pytest.Pytester, machine: Callable[..., None],
                                             marker: str, sentence: str) -> None:
    machine("no-gpu")
    pytester.makepyfile(test_bad=f"import pytest\n\n@pytest.mark.{marker}\ndef test_x():\n    pass\n")
    assert usage_error(run(pytester)) == f"test_bad.py::test_x: {sentence}"


@pytest.mark.parametrize("where", ["cpu", "gpu"])
@pytest.mark.parametrize(
    ("args", "env", "sentence"),
    [
        (["--mig-profile="], {}, "--mig-profile is empty: give a profile such as 1g.10gb, 'full' or 'all' (is the "
                                 "shell variable it came from unset?)"),
        (["--mig-profile", " "], {}, "--mig-profile is empty: give a profile such as 1g.10gb, 'full' or 'all' (is the "
                                     "shell variable it came from unset?)"),
        ([], {"PYTEST_MIG_PROFILE": " "}, "PYTEST_MIG_PROFILE is empty: give a profile such as 1g.10gb, 'full' or "
                                          "'all' (is the shell variable it came from unset?)"),
        (["--mig-device="], {}, "--mig-device is empty: give a MIG-<uuid>, GPU-<uuid>, a GPU index N or N:M (is the "
                                "shell variable it came from unset?)"),
        (["-o", "mig_require_gpu=maybe"], {}, "ini option mig_require_gpu: 'maybe' is not true or false; use true or "
                                              "false."),
        (["-o", "mig_tolerance=abc"], {}, "ini option mig_tolerance: tolerance 'abc' is not a number: write a "
                                          "percentage such as 5% or a fraction such as 0.05"),
        (["-o", "mig_tolerance=5"], {}, "ini option mig_tolerance: tolerance '5' is ambiguous: write 5% or 0.05"),
        (["--mig-scaling-plot", "x.bmp"], {}, "--mig-scaling-plot x.bmp: cannot tell the image format from '.bmp'; "
                                              "use one of .png, .svg, .pdf"),
        (["--mig-su-coefficients", "cpu=nan"], {}, "SU coefficients 'cpu=nan': SU coefficient cpu must be a number "
                                                   "from 0 to 1e+06, not nan"),
        (["--mig-su-coefficients", "gpu=-16"], {}, "SU coefficients 'gpu=-16': SU coefficient gpu must be a number "
                                                   "from 0 to 1e+06, not -16.0"),
        (["--mig-su-coefficients", "gpu=inf"], {}, "SU coefficients 'gpu=inf': SU coefficient gpu must be a number "
                                                   "from 0 to 1e+06, not inf"),
        (["--mig-su-allocation", "cpus=nan"], {}, "--mig-su-allocation 'cpus=nan': 'cpus=nan' is not understood; "
                                                  "expected 'cpus=N,ram_gb=G'"),
    ],
)
def test_a_bad_setting_is_one_sentence_at_start_up_on_any_machine(
        pytester: pytest.Pytester, machine: Callable[..., None], mig_env: pytest.MonkeyPatch, where: str,
        args: list[str], env: dict[str, str], sentence: str) -> None:
    machine("no-gpu") if where == "cpu" else machine("h200-mig-off", cuda="gpu0")
    for name, value in env.items():
        mig_env.setenv(name, value)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    assert usage_error(run(pytester, *args)) == sentence
    assert not (pytester.path / ".mig-results").exists()  # nothing ran, nothing was written


@pytest.mark.parametrize("option", ["--mig-report", "--mig-results", "--mig-scaling-plot"])
def test_an_output_path_that_cannot_be_written_is_said_at_start_up(pytester: pytest.Pytester,
                                                                    machine: Callable[..., None], option: str) -> None:
    machine("no-gpu")
    (pytester.path / "a-file").write_text("")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    name = {"--mig-report": "r.md", "--mig-results": "r.json", "--mig-scaling-plot": "p.png"}[option]
    assert usage_error(run(pytester, option, f"a-file/{name}")) == (
        f"{option} a-file/{name}: a-file is a file, not a folder, so nothing can be written there.")
    assert (pytester.path / "a-file").read_text() == ""


def test_a_baseline_folder_that_cannot_be_written_is_said_before_a_save_run(pytester: pytest.Pytester,
                                                                            machine: Callable[..., None]) -> None:
    machine("no-gpu")
    (pytester.path / "a-file").write_text("")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    sentence = usage_error(run(pytester, "--mig-save-baseline", "--mig-baseline-dir", "a-file/baselines"))
    assert sentence.endswith("a-file/baselines: " + str(pytester.path / "a-file") +
                             " is a file, not a folder, so nothing can be written there.")
    run(pytester, "--mig-baseline-dir", "a-file/baselines").assert_outcomes(passed=1)  # only reading: fine


# ------------------------------------------------------------------------------------------------
# A fresh process, as a scheduler starts a job.


def test_the_pin_in_a_fresh_process(pytester: pytest.Pytester, mig_env: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py is the fake (tests/fakenvml_site); a conftest stands in for CUDA."""
    fake_pynvml.install_subprocess(mig_env, "h100-mig")
    pytester.makeconftest(
        "import pytest_mig.device.target as target\n\n"
        f"target.cuda_props = lambda: target.CudaProps('{H100} MIG 1g.10gb', 16, 9984 * 2**20, (9, 0))\n"
    )
    pytester.makepyfile(
        "import os\n"
        "import pytest_mig.device.target as target\n\n"
        "def test_pinned(mig_device):\n"
        f"    assert os.environ['CUDA_VISIBLE_DEVICES'] == mig_device.uuid == {topo.H100_1G[0]!r}\n"
        "    assert not target.cuda_initialized()\n"
    )
    result = pytester.runpytest_subprocess(*SLOW_PLUGINS, "--mig-profile", "1g.10gb")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([f"pytest-mig: profile 1g.10gb (mig) {topo.H100_1G[0]}, "
                                 "chosen by plugin (free instance)"])
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # the child's pin stays in the child


@pytest.mark.parametrize("value, sentence", [
    ("lots", "*--mig-tolerance*tolerance 'lots' is not a number*"),
    ("150%", "*--mig-tolerance*out of range*below 100%*"),
    ("1", "*--mig-tolerance*out of range*below 100%*"),
    ("7", "*--mig-tolerance*ambiguous*7%*"),
])
def test_a_bad_tolerance_is_refused_with_its_reason(pytester: pytest.Pytester, machine: Callable[..., None],
                                                    value: str, sentence: str) -> None:
    machine("no-gpu")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = run(pytester, "--mig-tolerance", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([sentence])


COST_TEST = """
def test_cost(mig_bench):
    metrics = mig_bench.cost(100.0, "token")
    per_hour = next(m for m in metrics if m.name == "su_per_hour")
    print("SU/h", per_hour.value, per_hour.info["coefficients"])
"""


@pytest.mark.parametrize("args, env, expected", [
    ((), {}, "*SU/h 1.0 cpu=1,ram_gb=4,gpu=16,gpu_mem_gb=80"),  # Wulver's 1 CPU, 4 GB; the CPU holds no GPU memory
    (("--mig-su-allocation", "cpus=4,ram_gb=32"), {}, "*SU/h 8.0 *"),  # max(4, 32/4)
    ((), {"SLURM_CPUS_PER_TASK": "6", "SLURM_MEM_PER_NODE": "8192"}, "*SU/h 6.0 *"),  # Slurm's allocation
    (("--mig-su-coefficients", "cpu=2"), {}, "*SU/h 2.0 cpu=2,*"),
])
def test_service_units_follow_the_options_and_slurm(pytester: pytest.Pytester, machine: Callable[..., None],
                                                    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...],
                                                    env: dict[str, str], expected: str) -> None:
    machine("no-gpu")
    for key in ("SLURM_CPUS_PER_TASK", "SLURM_MEM_PER_NODE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pytester.makepyfile(COST_TEST)
    result = run(pytester, "-s", "--mig-results", "none", *args)
    assert result.ret == 0
    result.stdout.fnmatch_lines([expected])


@pytest.mark.parametrize("option, value", [("--mig-su-coefficients", "gpu=lots"),
                                           ("--mig-su-allocation", "cpus=-1")])
def test_malformed_service_unit_options_are_usage_errors(pytester: pytest.Pytester, machine: Callable[..., None],
                                                         option: str, value: str) -> None:
    machine("no-gpu")
    pytester.makepyfile("def test_x():\n    pass\n")
    assert value in usage_error(run(pytester, option, value))


# ------------------------------------------------------------------------------------------------
# --mig-host-lock: the host's turn at host copies across containers.


def test_a_host_lock_that_cannot_be_one_is_a_usage_error_at_start_up(pytester: pytest.Pytester,
                                                                     machine: Callable[..., None]) -> None:
    machine("no-gpu")
    pytester.makepyfile("def test_x():\n    pass\n")
    folder = pytester.path / "locks"
    folder.mkdir()
    assert usage_error(run(pytester, "--mig-host-lock", "")) == (
        "--mig-host-lock is empty: name a file every run of the host sees, or leave the option out.")
    assert usage_error(run(pytester, "--mig-host-lock", "host\x00.lock")).startswith(
        "--mig-host-lock host\\x00.lock: it holds a NUL byte")
    assert usage_error(run(pytester, "--mig-host-lock", str(folder))) == (
        f"--mig-host-lock {shown(str(folder))} is a folder: name a file in it, such as pytest-mig.lock.")
    pytester.makeini(f"[pytest]\nmig_host_lock = {folder}/missing/host.lock\n")
    assert usage_error(run(pytester)) == (
        f"--mig-host-lock {shown(str(folder / 'missing/host.lock'))} cannot be opened: No such file or directory.")


def test_the_host_lock_reaches_the_benchmarks_relative_to_the_rootdir(pytester: pytest.Pytester,
                                                                      machine: Callable[..., None],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    machine("no-gpu")
    pytester.makeini("[pytest]\nmig_host_lock = locks/host.lock\n")
    (pytester.path / "locks").mkdir()
    test = pytester.makepyfile("def test_lock(mig_bench):\n    print('lock', mig_bench.host_lock)\n")
    (pytester.path / "elsewhere").mkdir()
    monkeypatch.chdir(pytester.path / "elsewhere")  # as the baseline folder: the rootdir's, wherever pytest starts
    result = run(pytester, "-s", "--mig-results", "none", str(test))
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"*lock {pytester.path / 'locks' / 'host.lock'}"])
    assert (pytester.path / "locks" / "host.lock").read_bytes() == b""


def test_a_host_lock_that_the_run_would_write_or_no_home_names_is_a_usage_error(
        pytester: pytest.Pytester, machine: Callable[..., None]) -> None:
    machine("no-gpu")
    pytester.makepyfile("def test_x():\n    pass\n")
    out = pytester.path / "night.json"
    assert usage_error(run(pytester, "--mig-results", str(out), "--mig-host-lock", str(out))) == (
        f"--mig-host-lock {shown(str(out))} is also --mig-results, which this run writes: name a file of its own, "
        "such as pytest-mig.lock.")
    assert not out.exists()
    assert usage_error(run(pytester, "--mig-host-lock", "~no-such-user-here/host.lock")) == (
        "--mig-host-lock ~no-such-user-here/host.lock: its ~ names no home folder here.")
    deep = "/".join(["d" * 200] * 20)  # under PATH_MAX as typed, over it under the rootdir
    assert "--mig-host-lock " in usage_error(run(pytester, "--mig-host-lock", deep))


def test_node_mode_says_a_bad_host_lock_once_before_any_worker_starts(pytester: pytest.Pytester,
                                                                     machine: Callable[..., None]) -> None:
    machine("h100-mig")
    pytester.makepyfile("def test_x():\n    pass\n")
    missing = pytester.path / "missing" / "host.lock"
    assert usage_error(run(pytester, "--mig-profile", "1g.10gb", "--mig-device", "all", "--mig-host-lock",
                           str(missing))) == f"--mig-host-lock {shown(str(missing))} cannot be opened: No such file or directory."
