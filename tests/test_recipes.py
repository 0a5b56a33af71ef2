"""The nightly recipes (recipes/): the shared nightly script run for real on the CPU over several
nights (the history grows only with good nights, a regression fails it, the trend page and exports
are published, old results are pruned); the Slurm batch script run with stand-in sbatch and srun;
the GitHub Actions, GitLab CI and Kubernetes files parsed and checked against what the script
writes."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
NIGHTLY = RECIPES / "pytest-mig-nightly.sh"

SUITE = '''
import os

from pytest_mig.measure import Metric


def test_rate(mig_bench):
    rate = float(os.environ.get("RATE", "100"))
    mig_bench.record(Metric("rate", rate, "items/s", "higher", [rate * 0.999, rate, rate * 1.001], kind="compute"))
'''


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MIG_", "CUDA_VISIBLE"))}
    env.update(MIG_STATE=str(tmp / "state"), MIG_SUITE=str(tmp / "suite"), MIG_PUBLISH=str(tmp / "publish"),
               MIG_REQUIRE_GPU="0", MIG_KEEP_RESULTS="4", PYTHON=sys.executable, HOME=str(tmp))
    env.update(extra)
    return env


def _night(tmp: Path, rate: float, *args: str, script: Path = NIGHTLY, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), "-p", "no:cacheprovider", *args], cwd=tmp, capture_output=True,
                          text=True, timeout=300, env=_env(tmp, RATE=str(rate), **extra))


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Five good nights on the CPU, then a night 20% slower."""
    tmp = tmp_path_factory.mktemp("nightly")
    (tmp / "suite").mkdir()
    (tmp / "suite" / "test_suite.py").write_text(SUITE)
    good = [_night(tmp, r) for r in (100.0, 100.2, 99.9, 100.1, 100.0)]
    history = tmp / "state" / "baselines" / "cpu" / "cpu.json"
    before = history.read_text()
    bad = _night(tmp, 80.0)
    return {"tmp": tmp, "good": good, "bad": bad, "history": history, "before": before}


def test_good_nights_pass_and_grow_the_history(nights: dict[str, Any]) -> None:
    assert [r.returncode for r in nights["good"]] == [0] * 5, nights["good"][-1].stdout[-2000:]
    doc = json.loads(nights["before"])
    (entry,) = doc["modes"]["normal"].values()
    assert [r["value"] for r in entry["rate"]["runs"]] == [100.0, 100.2, 99.9, 100.1, 100.0]


def test_a_regression_fails_the_night_and_is_not_learned(nights: dict[str, Any]) -> None:
    bad = nights["bad"]
    assert bad.returncode == 1
    assert "REGRESSED suite/test_suite.py::test_rate rate 80.00 items/s" in bad.stdout
    assert "this run failed, so it was not added to the history" in bad.stdout
    assert nights["history"].read_text() == nights["before"]


def test_the_page_report_junit_and_exports_are_published(nights: dict[str, Any]) -> None:
    pub = nights["tmp"] / "publish"
    page = (pub / "trend.html").read_text()
    assert 'data-verdict="regressed"' in page and "1 regressed" in page
    assert (pub / "report.md").exists()
    junit = {p.get("name"): p.get("value") for p in ET.parse(pub / "junit.xml").getroot().iter("property")}
    assert junit["suite/test_suite.py::test_rate::rate.verdict"] == "regressed"  # xunit2: the suite's properties
    (bigger,) = json.loads((pub / "export" / "github" / "bigger-is-better.json").read_text())
    assert bigger["value"] == 80.0 and "verdict regressed" in bigger["extra"]
    prom = (nights["tmp"] / "state" / "export" / "pytest_mig.prom").read_text()
    regressed = {f.name: f.samples for f in text_string_to_metric_families(prom)}["PYTEST_MIG_REGRESSED"]
    assert [s.value for s in regressed] == [1.0]


def test_old_results_files_are_pruned_and_the_page_keeps_the_newest(nights: dict[str, Any]) -> None:
    files = sorted((nights["tmp"] / "state" / "results").glob("*.json"))
    assert len(files) == 4  # MIG_KEEP_RESULTS
    assert json.loads(files[-1].read_text())["records"][0]["metric"]["value"] == 80.0


def _stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_slurm_script_resubmits_itself_and_runs_the_night_on_its_slice(nights: dict[str, Any]) -> None:
    tmp = nights["tmp"]
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    _stand_in(bin_, "sbatch", f'echo "sbatch $*" >> {tmp}/slurm.log\n')
    _stand_in(bin_, "srun", f'echo "srun $*" >> {tmp}/slurm.log\nshift\nexec "$@"\n')  # drop --ntasks=1, run
    _stand_in(bin_, "python3", f'exec {sys.executable} "$@"\n')  # the Python pytest-mig is installed in
    script = RECIPES / "slurm-nightly.sbatch"
    # no PYTHON exported: the script finds the python3 that imports pytest_mig
    done = _night(tmp, 100.0, script=script, MIG_REPO=str(ROOT), PATH=f"{bin_}:{os.environ['PATH']}",
                  MIG_STATE=str(tmp / "slurm-state"), PYTHON="")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    log = (tmp / "slurm.log").read_text().splitlines()
    assert log[0] == f"sbatch --begin=03:00 {ROOT}/recipes/slurm-nightly.sbatch"
    assert log[1] == f"srun --ntasks=1 {ROOT}/recipes/pytest-mig-nightly.sh --mig-profile 1g.10gb -p no:cacheprovider"
    assert (tmp / "slurm-state" / "trend.html").exists()  # the night ran and was published
    directives = re.findall(r"^#SBATCH (\S+)", script.read_text(), flags=re.M)
    assert "--gres=gpu:a100_1g.10gb:1" in directives and any(d.startswith("--time=") for d in directives)


def test_a_python_without_pytest_mig_is_one_sentence(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name in ("python3", "python"):  # Pythons on the PATH that cannot import pytest_mig
        _stand_in(bin_, name, "exit 1\n")
    script = tmp_path / "recipes" / NIGHTLY.name  # a checkout with no .venv
    script.parent.mkdir()
    script.write_text(NIGHTLY.read_text())
    env = _env(tmp_path, PYTHON="", PATH=f"{bin_}:/usr/bin:/bin")
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("pytest-mig-nightly: no Python with pytest-mig installed was found (")
    assert "set PYTHON to the one it was installed with" in done.stderr and len(done.stderr.splitlines()) == 1
    env["PYTHON"] = str(bin_ / "python3")
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and done.stderr.startswith(f"pytest-mig-nightly: PYTHON={bin_ / 'python3'} cannot "
                                                           "import pytest_mig; no Python")


def test_tox_gpu_installs_the_engines_a_gpu_node_runs() -> None:
    """README's `tox -e gpu`: OpenMM's CUDA plugin and bitsandbytes come with it (the gpu extra)."""
    import configparser

    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib to read pyproject.toml")
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    extras = tox["testenv:gpu"]["extras"].replace(",", " ").split()
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    packages = [req for extra in extras for req in wanted[extra]]
    assert any(p.startswith("openmm[cuda") for p in packages) and any(p.startswith("bitsandbytes") for p in packages)


def _steps_running(steps: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    return [s for s in steps if text in str(s.get("run", ""))]


def test_the_github_workflow_runs_the_night_on_a_gpu_runner_and_publishes_what_it_writes(
        nights: dict[str, Any]) -> None:
    doc = yaml.safe_load((RECIPES / "github-actions-nightly.yml").read_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` as true
    (cron,) = [c["cron"] for c in on["schedule"]]
    assert len(cron.split()) == 5
    (job,) = doc["jobs"].values()
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    assert _steps_running(job["steps"], "recipes/pytest-mig-nightly.sh")
    upload = next(s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "publish/"
    charts = {s["with"]["tool"]: s for s in job["steps"] if "github-action-benchmark" in str(s.get("uses", ""))}
    assert set(charts) == {"customBiggerIsBetter", "customSmallerIsBetter"}
    assert len({c["with"]["name"] for c in charts.values()}) == 2  # one chart each, never mixed
    for tool, chart in charts.items():
        file = chart["with"]["output-file-path"]
        assert file.endswith("bigger-is-better.json" if tool == "customBiggerIsBetter" else "smaller-is-better.json")
        assert chart["if"] == f"always() && hashFiles('{file}') != ''"  # a file not written is not charted
    # the same layout the script wrote: the suite's one figure is bigger-is-better
    assert (nights["tmp"] / charts["customBiggerIsBetter"]["with"]["output-file-path"]).exists()
    assert not (nights["tmp"] / charts["customSmallerIsBetter"]["with"]["output-file-path"]).exists()
    assert job["env"]["MIG_PUBLISH"].endswith("/publish")


def test_the_gitlab_job_runs_on_a_schedule_and_reports_junit(nights: dict[str, Any]) -> None:
    doc = yaml.safe_load((RECIPES / "gitlab-ci-nightly.yml").read_text())
    job = doc["pytest-mig-nightly"]
    assert job["tags"] == ["gpu"] and "schedule" in job["rules"][0]["if"]
    assert any("recipes/pytest-mig-nightly.sh" in line for line in job["script"])
    assert job["artifacts"]["when"] == "always"
    junit = job["artifacts"]["reports"]["junit"]
    assert (nights["tmp"] / junit).exists() and job["variables"]["MIG_PUBLISH"].endswith("/publish")


def test_the_kubernetes_cronjob_asks_for_the_slice_it_tests_and_keeps_its_history() -> None:
    claim, cron = yaml.safe_load_all((RECIPES / "kubernetes-cronjob.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and cron["kind"] == "CronJob"
    spec = cron["spec"]
    assert len(spec["schedule"].split()) == 5 and spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and spec["jobTemplate"]["spec"]["backoffLimit"] == 0
    (c,) = pod["containers"]
    assert c["command"][0].endswith("recipes/pytest-mig-nightly.sh")
    profile = c["command"][c["command"].index("--mig-profile") + 1]
    assert c["resources"]["limits"] == {f"nvidia.com/mig-{profile}": 1}
    state = {e["name"]: e["value"] for e in c["env"]}["MIG_STATE"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[state]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # the host's turn at host copies: a file on a folder of the node, shared by its pods
    lock = Path(c["command"][c["command"].index("--mig-host-lock") + 1])
    assert volumes[mounts[str(lock.parent)]]["hostPath"]["type"] == "DirectoryOrCreate"


STOPPED_SUITE = '''
import time

from pytest_mig.measure import Metric


def test_rate(mig_bench):
    mig_bench.record(Metric("rate", 100.0, "items/s", "higher", [99.9, 100.0, 100.1], kind="compute"))


def test_long(mig_bench):
    time.sleep(120)  # still measuring when the job's time is up
'''


def test_a_night_stopped_by_sigterm_keeps_its_figures_and_still_draws_the_page(tmp_path: Path) -> None:
    import signal
    import time

    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_suite.py").write_text(STOPPED_SUITE)
    # SIGTERM to the script alone, as Kubernetes sends it to a container's first process
    night = subprocess.Popen(["bash", str(NIGHTLY), "-p", "no:cacheprovider"], cwd=tmp_path, env=_env(tmp_path),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = tmp_path / "state" / "results"
    deadline = time.monotonic() + 120
    while not list(results.glob("*.json")) and time.monotonic() < deadline:  # the first test's figure is kept
        time.sleep(0.2)
    night.send_signal(signal.SIGTERM)
    out, _ = night.communicate(timeout=120)
    assert night.returncode == 2, out[-3000:]
    assert "stopped (SIGTERM: a time limit or a cancelled job): the figures of the 1 test(s) that finished" in out
    (kept,) = results.glob("*.json")
    doc = json.loads(kept.read_text())
    assert [r["metric"]["name"] for r in doc["records"]] == ["rate"] and doc["meta"]["stopped"] == "SIGTERM"
    assert "rate" in (tmp_path / "publish" / "trend.html").read_text()  # the page was drawn after the stop
    assert not (tmp_path / "state" / "baselines" / "cpu").exists()  # a stopped night is not learned
