"""A real Prometheus on loopback for the tests: it scrapes node_exporter's textfile collector (the
export files, as a site deploys them) and static endpoints (dcgm-exporter's series), evaluates rule
files, and is asked through its HTTP API.  Debian's ``prometheus`` and ``prometheus-node-exporter``
packages (`.ci/run` installs them); the tests skip, saying why, without them.
"""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest

PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
needs_live = pytest.mark.skipif(PROMETHEUS is None or NODE_EXPORTER is None,
                                reason="prometheus or node_exporter is not installed (Debian: apt-get install "
                                       "prometheus prometheus-node-exporter; neither is on PyPI)")

Api = Callable[[str, dict[str, str]], Any]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exporter(body: bytes) -> type[http.server.BaseHTTPRequestHandler]:
    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Exporter


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextmanager
def prometheus(tmp_path: Path, textfiles: Path, *, endpoints: Sequence[str] = (),
               rule_files: Sequence[Path] = ()) -> Iterator[Api]:
    """Prometheus scraping every second a node_exporter that reads ``textfiles`` (job ``node``) and one
    endpoint serving each text of ``endpoints`` (job ``dcgm``), with ``rule_files``; yields
    ``api(path, params)``, the ``data`` of the answer (an OSError or ValueError until it is up)."""
    with ExitStack() as stack:
        targets = []
        for text in endpoints:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _exporter(text.encode()))
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stack.callback(server.shutdown)
            targets.append(f"127.0.0.1:{server.server_address[1]}")
        node, port = _free_port(), _free_port()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(p) for p in rule_files],
                  "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{node}"]}]}]
                  + ([{"job_name": "dcgm", "static_configs": [{"targets": targets}]}] if targets else [])}
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        for argv, log in (([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{node}", "--collector.disable-defaults",
                            "--collector.textfile", f"--collector.textfile.directory={textfiles}"], "node.log"),
                          ([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                            f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                           "prometheus.log")):
            proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL,
                                    stderr=stack.enter_context((tmp_path / log).open("w")))
            stack.callback(_stop, proc)

        def api(path: str, params: dict[str, str]) -> Any:
            url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
            with urllib.request.urlopen(url, timeout=5) as answer:  # loopback: the Prometheus started here
                return json.loads(answer.read().decode())["data"]

        yield api


def wait_for(ask: Callable[[], Any], done: Callable[[Any], bool], logs: Path, timeout: float = 60) -> Any:
    """``ask()`` every half second until ``done`` holds of its answer (or ``timeout`` s): the last answer;
    a failed assertion quotes the tail of the logs in ``logs``."""
    answer: Any = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            answer = ask()
        except (OSError, KeyError, ValueError):
            continue
        if done(answer):
            return answer
    tails = "".join(p.read_text()[-1500:] for p in sorted(logs.glob("*.log")))
    raise AssertionError(f"not reached in {timeout} s; last answer {answer!r}\n{tails}")
