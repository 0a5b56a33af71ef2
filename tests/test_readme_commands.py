"""README's commands, in README's order, as a new admin on a fresh CPU machine types them.

The commands are read from README's code blocks, so this test follows README when it changes: a
command it does not know fails it until :func:`_plan` is told how to run it or why it cannot run
here. The end-to-end test runs them in a copy of the repository (no history, no results, no compile
cache) with this machine's interpreter and the copy's code on ``PYTHONPATH``.

What it does not run exactly, and why:

- ``pip install`` lines: they need the package index (PyTorch's CPU index is unreachable offline) and
  would replace the interpreter's install of the project; the rest of each line runs as written.
  :func:`test_readme_installs_the_gpu_extra_only_on_a_gpu_node` checks what the lines install.
- ``pytest-mig calibrate -n 10 -- benchmarks ...``: ten CPU runs of the whole suite take about 20
  minutes, so it runs 3 times (the fewest ``pytest-mig samples`` accepts) over ``test_cuda_core_fma``
  (``-k``), whose figures are medians of enough samples for ``samples``.
- Commands over files a site gathers (``night/*.json``, ``r1.json r2.json new.json``) get the
  results files the earlier commands wrote: the suite's run for the night, calibrate's runs for the
  compared files.
- README's line for a GPU node (the ``gpu`` extra) is skipped: this machine follows its line for no GPU.
- Commands that need a GPU, a MIG slice, every GPU of a node or Slurm are listed as skipped, with the
  reason; so are the plugin's own tests (this test is one of them; CI runs them all).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: A code-block line is a command when its first word (after ``VAR=value`` assignments) is one of these.
COMMAND_WORDS = {"python", "python3", "pip", "pytest", "pytest-mig", "tox", "bash", "sbatch", "srun"}

#: What a copy of the repository leaves out: what a fresh clone does not have.
NOT_IN_A_CLONE = (".git", ".venv*", ".tox", ".mig-results", ".mig-compile-cache", ".benchmarks", "site",
                  "__pycache__", "*.egg-info", "build", "dist", ".pytest_cache")


@dataclass
class Step:
    """One command of README (a part of a line joined by ``&&``): run as ``argv``, or skipped for ``skip``."""

    text: str
    argv: list[str] = field(default_factory=list)
    skip: str = ""
    outputs: list[str] = field(default_factory=list)
    #: exit codes the docs give the command, each with what its output then says
    codes: dict[int, str] = field(default_factory=lambda: {0: ""})


def readme_commands(text: str) -> list[str]:
    """Every command line of README's code blocks (indented or fenced), in order, comments removed."""
    lines, fenced, previous_blank = [], False, True
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        in_block = fenced or (line.startswith("    ") and (previous_blank or bool(lines and lines[-1][1])))
        previous_blank = not line.strip()
        lines.append((line, in_block))
    commands = []
    for line, in_block in lines:
        if not in_block:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: prose or code, not a command
            continue
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        if words and (words[0] in COMMAND_WORDS or words[0].startswith("recipes/")):
            commands.append(line.split("  #")[0].strip())
    return commands


def _plan(command: str) -> list[Step]:
    """The steps of one README command line: how each runs on this CPU machine, or why it cannot."""
    if "[gpu]" in command:  # the GPU node's setup: this machine takes README's line for no GPU
        return [Step(p.strip(), skip="a GPU node's line (the gpu extra's CUDA packages)") for p in command.split("&&")]
    steps = []
    for part in (p.strip() for p in command.split("&&")):
        words = shlex.split(part)
        step = Step(part)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words = words[1:]
        if words[:4] == ["python", "-m", "pip", "install"]:
            step.skip = "pip needs the package index (offline here) and would replace this interpreter's install"
        elif words[:3] == ["python", "-m", "pytest"] and words[3:4] == ["tests"]:
            step.skip = "the plugin's own tests, this one among them (CI runs them: .ci/run)"
        elif words[0] in ("pytest", "python") and "--mig-device" in words and "all" in words:
            step.skip = "every GPU or MIG slice of a node: needs GPUs"
        elif words[:3] == ["python", "-m", "pytest"] and words[3:] == ["benchmarks"]:
            step.argv = [sys.executable, "-m", "pytest", "benchmarks"]
            step.outputs = [".mig-results/results-*.json"]
        elif words[:3] == ["python", "-m", "mkdocs"]:
            step.argv = [sys.executable, *words[1:]]
            step.outputs = ["site/index.html"]
            if importlib.util.find_spec("mkdocs") is None:
                step.skip = "mkdocs is not installed (the test extra brings it)"
        elif words[0] == "tox":
            step.skip = "the suite on a GPU node"
        elif words[0].startswith("recipes/"):
            step.skip = "a Slurm job on a MIG slice (test_recipes.py runs the nightly script on the CPU)"
        elif words[0] == "pytest-mig":
            step.argv = [sys.executable, "-m", "pytest_mig.cli", *words[1:]]
            if words[1] == "calibrate":
                step.argv[step.argv.index("-n") + 1] = "3"
                step.argv += ["-k", "test_cuda_core_fma"]
                step.outputs = [".mig-results/calibrate/*/calibrate-03.json"]
            if words[1] == "compare":  # docs/options.md: exit 1 on a regression (CPU runs are noisy)
                step.codes[1] = "regressed"
            if "--out" in words:
                step.outputs.append(words[words.index("--out") + 1])
        else:
            raise AssertionError(f"README runs `{part}`: tell test_readme_commands.py how to run it here, or why not")
        steps.append(step)
    return steps


def _gathered_files(argv: list[str], cwd: Path) -> list[str]:
    """argv with its globs expanded in cwd; files a site gathers from elsewhere are filled from this run's:
    ``night/`` with the suite's results, missing ``*.json`` operands with calibrate's runs in order."""
    runs = sorted(glob(str(cwd / ".mig-results" / "calibrate" / "*" / "calibrate-*.json")))
    out = []
    for arg in argv:
        if "*" in arg and not glob(str(cwd / arg)) and Path(arg).parent.name == "night":
            (cwd / "night").mkdir(exist_ok=True)
            for results in glob(str(cwd / ".mig-results" / "results-*.json")):
                shutil.copy(results, cwd / "night")
        if "*" in arg:
            out += sorted(str(Path(p).relative_to(cwd)) for p in glob(str(cwd / arg)))
        elif arg.endswith(".json") and not (cwd / arg).exists():
            assert runs, f"README's `{arg}` needs a results file and calibrate wrote none"
            shutil.copy(runs.pop(0), cwd / arg)
            out.append(arg)
        else:
            out.append(arg)
    return out


def _paragraph_before(text: str, command: str) -> str:
    return text[:text.index(command)].rstrip().split("\n\n")[-1]


def test_readme_installs_the_gpu_extra_only_on_a_gpu_node() -> None:
    installs = [c for c in readme_commands(README.read_text(encoding="utf-8")) if "pip install" in c]
    text = README.read_text(encoding="utf-8")
    gpu = [c for c in installs if "[gpu]" in c]
    cpu = [c for c in installs if "download.pytorch.org/whl/cpu" in c]
    assert len(gpu) == 1 and "GPU node" in _paragraph_before(text, gpu[0]), "the gpu extra is a GPU node's"
    assert len(cpu) == 1 and "no GPU" in _paragraph_before(text, cpu[0])
    assert shlex.split(cpu[0])[-2:] == ["--index-url", "https://download.pytorch.org/whl/cpu"]
    after_cpu_torch = installs[installs.index(cpu[0]) + 1]
    assert shlex.split(after_cpu_torch.split("&&")[0]) == ["python", "-m", "pip", "install", "-e", "."], \
        "with no GPU the project is installed without the CUDA extras"


def test_every_readme_command_is_run_or_skipped_with_a_reason() -> None:
    steps = [s for c in readme_commands(README.read_text(encoding="utf-8")) for s in _plan(c)]
    run = [s.text.split()[:2] for s in steps if not s.skip]
    assert "python -m pytest benchmarks" in [s.text for s in steps if not s.skip]
    for expected in (["pytest-mig", "history"], ["pytest-mig", "report"],
                     ["pytest-mig", "compare"], ["pytest-mig", "devices"]):
        assert expected in run, f"README no longer runs {' '.join(expected)}, or this test skips it"
    assert all(s.argv or s.skip for s in steps)


@pytest.mark.e2e
def test_readme_commands_in_order_on_a_fresh_cpu_machine(tmp_path: Path) -> None:
    repo = tmp_path / "pytest-mig"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MIG_", "CUDA_VISIBLE"))}
    env.update(PYTHONPATH=str(repo), HOME=str(tmp_path / "home"))
    done, skipped = [], []
    for command in readme_commands(README.read_text(encoding="utf-8")):
        for step in _plan(command):
            if step.skip:
                skipped.append(f"{step.text}: {step.skip}")
                continue
            argv = _gathered_files(step.argv, repo)
            ran = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=900, check=False)
            said = f"README's `{step.text}` exited {ran.returncode}:\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
            assert ran.returncode in step.codes and step.codes[ran.returncode] in ran.stdout, said
            for output in step.outputs:
                found = glob(str(repo / output))
                assert found and all(Path(f).stat().st_size > 0 or Path(f).is_dir() for f in found), \
                    f"README's `{step.text}` wrote no {output}"
            done.append(f"{step.text} (exit {ran.returncode})")
    print("ran:", *done, "skipped:", *skipped, sep="\n  ")
    assert any(s.startswith("pytest-mig history .mig-results/*.json --mig-baseline-dir baselines") for s in done)
    assert any(s.startswith("python -m pytest benchmarks") for s in done)
