#!/usr/bin/env bash
# pytest-mig nightly: judge this GPU or MIG slice against its own history (or, on the first nights, the
# shipped reference), add the night to the history only if it passed, and publish the trend page, the
# report, JUnit XML and the exports. Exits with pytest's status: non-zero on a regression, so the
# pipeline or job fails. Every recipe in this folder calls it; extra arguments go to pytest, e.g.
#     recipes/pytest-mig-nightly.sh --mig-profile 1g.10gb --mig-quick
#
# Environment (all optional):
#   MIG_STATE         folder kept between nights (default $HOME/pytest-mig): baselines/, results/, trend.html
#   MIG_SUITE         the benchmark folder (default: benchmarks, run from a checkout of pytest-mig)
#   MIG_PUBLISH       also copy trend.html, report.md, junit.xml and the exports here (a CI artifact folder)
#   MIG_PROM          the Prometheus textfile (default $MIG_STATE/export/pytest_mig.prom; point it at
#                     node_exporter's --collector.textfile.directory to scrape it)
#   MIG_KEEP_RESULTS  results files kept for the trend page (default 90)
#   MIG_REQUIRE_GPU   1 (default): a runner without a usable GPU fails instead of measuring its CPU
#   PYTHON            the Python that has pytest-mig installed (default: the first of the checkout's
#                     .venv/bin/python, python3 and python that imports pytest_mig; a batch job's PATH
#                     is often not the shell's that installed it)
set -uo pipefail

state=${MIG_STATE:-$HOME/pytest-mig}
suite=${MIG_SUITE:-benchmarks}
checkout=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
    for candidate in "$checkout/.venv/bin/python" python3 python; do
        if "$candidate" -c 'import pytest_mig' >/dev/null 2>&1; then
            python=$candidate
            break
        fi
    done
fi
if [ -z "$python" ] || ! "$python" -c 'import pytest_mig' >/dev/null 2>&1; then
    echo "pytest-mig-nightly: ${PYTHON:+PYTHON=$PYTHON cannot import pytest_mig; }no Python with pytest-mig" \
         "installed was found ($checkout/.venv/bin/python, python3, python): set PYTHON to the one it was" \
         "installed with, e.g. PYTHON=/path/to/venv/bin/python" >&2
    exit 2
fi
stamp=$(date -u +%Y%m%dT%H%M%SZ)
host=$(hostname -s 2>/dev/null || hostname)
mkdir -p "$state/baselines" "$state/results" "$state/export" || exit 2

args=(-m pytest "$suite"
      --mig-save-if-passed --mig-baseline-dir "$state/baselines"
      --mig-results "$state/results/$stamp-$host.json"
      --mig-report "$state/report.md" --junitxml "$state/junit.xml"
      --mig-export "github=$state/export/github"
      --mig-export "prometheus=${MIG_PROM:-$state/export/pytest_mig.prom}")
if [ "${MIG_REQUIRE_GPU:-1}" = 1 ]; then
    args+=(--mig-require-gpu)
fi
# SIGTERM (a time limit, a cancelled job, a Kubernetes deadline: where this script is the container's
# first process, only it is signalled) is passed on to pytest, which stops and keeps the figures of its
# finished tests; the page below is still drawn. SIGKILL after the grace period is the hard stop.
"$python" "${args[@]}" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
wait "$child"
status=$?
while kill -0 "$child" 2>/dev/null; do  # wait returned early for the signal: wait for pytest itself
    wait "$child"
    status=$?
done
trap - TERM INT

# Keep the newest results files (their names sort by time) and draw the page from them and the history.
mapfile -t old < <(find "$state/results" -maxdepth 1 -name '*.json' | sort | head -n "-${MIG_KEEP_RESULTS:-90}")
if [ "${#old[@]}" -gt 0 ]; then
    rm -f -- "${old[@]}"
fi
mapfile -t nights < <(find "$state/results" -maxdepth 1 -name '*.json' | sort)
"$python" -m pytest_mig.cli history "${nights[@]}" --mig-baseline-dir "$state/baselines" --out "$state/trend.html" \
    --title "pytest-mig nightly: $host" || { [ "$status" -ne 0 ] || status=1; }

if [ -n "${MIG_PUBLISH:-}" ]; then
    mkdir -p "$MIG_PUBLISH"
    for f in trend.html report.md junit.xml; do
        [ -f "$state/$f" ] && cp "$state/$f" "$MIG_PUBLISH/"
    done
    cp -r "$state/export/." "$MIG_PUBLISH/export/" 2>/dev/null || true
fi
exit "$status"
