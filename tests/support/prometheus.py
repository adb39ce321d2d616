"""A real Prometheus server (Debian's package, /usr/bin/prometheus) on a free loopback port,
scraping one target, for the tests that read figures back through its HTTP API.

bin/test installs the package when it is missing (as root, with apt-get). Without the binary the
test fails and says so: a monitoring test that is silently skipped proves nothing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROMETHEUS = "/usr/bin/prometheus"


def prometheus_binary() -> str:
    if not (Path(PROMETHEUS).is_file() and os.access(PROMETHEUS, os.X_OK)):
        raise RuntimeError(f"{PROMETHEUS} is missing: install Debian's prometheus package "
                           f"(apt-get install -y prometheus; bin/test does it when run as root)")
    return PROMETHEUS


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen
    workdir: Path
    log_path: Path
    _stopped: bool = field(default=False)

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=5) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus answered {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query through /api/v1/query: the result vector."""
        return self.api("/api/v1/query", query=expr)["result"]

    def scalar(self, expr: str) -> float | None:
        """The value of a query that yields one series (None when it yields none yet)."""
        result = self.query(expr)
        if not result:
            return None
        assert len(result) == 1, f"{expr!r} gave {len(result)} series: {result}"
        return float(result[0]["value"][1])

    def wait_for(self, expr: str, accept: Callable[[float | None], bool], *, timeout: float = 60.0) -> float | None:
        deadline = time.monotonic() + timeout
        seen: float | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            seen = self.scalar(expr)
            if accept(seen):
                return seen
            time.sleep(0.25)
        raise AssertionError(f"Prometheus never gave an accepted value for {expr!r} in {timeout:.0f} s (last: {seen}); "
                             f"targets: {self.api('/api/v1/targets')}; log:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(f"Prometheus exited with {self.process.returncode}:\n{self.log()}")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_prometheus(*, target: str, metrics_path: str = "/metrics", bearer_token: str = "",
                     interval: str = "1s", job: str = "dunning", ready_timeout: float = 60.0) -> PrometheusServer:
    """Start Prometheus scraping `target` ("127.0.0.1:8123") every `interval`; returns once it is ready."""
    binary = prometheus_binary()
    workdir = Path(tempfile.mkdtemp(prefix="prometheus-test-"))
    scrape: dict[str, Any] = {"job_name": job, "scrape_interval": interval, "scrape_timeout": interval,
                              "metrics_path": metrics_path, "static_configs": [{"targets": [target]}]}
    if bearer_token:
        scrape["authorization"] = {"type": "Bearer", "credentials": bearer_token}
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": [scrape]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    server = PrometheusServer(url=f"http://127.0.0.1:{port}", process=process, workdir=workdir, log_path=log_path)
    deadline = time.monotonic() + ready_timeout
    while True:
        try:
            server._check_alive()
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return server
        except AssertionError:
            server.stop()
            raise
        except OSError:
            pass
        if time.monotonic() > deadline:
            log_text = server.log()
            server.stop()
            raise AssertionError(f"Prometheus was not ready within {ready_timeout:.0f} s:\n{log_text}")
        time.sleep(0.2)
