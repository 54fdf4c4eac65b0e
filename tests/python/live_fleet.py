"""Real processes for the operations tests: gaugewatch-agent instances, the
simulated fleet (tests/ops/sim_fleet.cpp) and a Prometheus server, on
loopback ports and temporary directories, stopped when the test ends."""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from conftest import build_dir
from operations_support import agent_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Processes:
    """Starts processes with their output in files; terminates them all."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self.running: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "w")
        process = subprocess.Popen([str(a) for a in args], stdout=log, stderr=subprocess.STDOUT)
        self.running.append((name, process))
        return process

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def stop(self):
        for _, process in reversed(self.running):
            if process.poll() is None:
                process.terminate()
        for _, process in reversed(self.running):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Agent:
    def __init__(self, processes: Processes, name: str, *extra: str):
        directory = processes.directory
        self.name = name
        self.socket = directory / f"{name}.sock"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.process = processes.start(f"agent-{name}", [
            agent_binary(), "--grpc-socket", self.socket, "--http-listen", self.address,
            "--database", directory / f"{name}.db", *extra])
        wait_until(lambda: self.process.poll() is not None or
                   (self.socket.exists() and http_get(f"http://{self.address}/healthz")[0] == 200),
                   30, f"agent {name}")
        assert self.process.poll() is None, processes.log(f"agent-{name}")


def sim_fleet_binary() -> pathlib.Path:
    path = build_dir() / "bin" / "gaugewatch_sim_fleet"
    if not path.exists():
        pytest.fail(f"{path} is missing: build the agent tests first (./scripts/build.sh)")
    return path


def start_sim_fleet(processes: Processes, seconds: float, socket_a: pathlib.Path,
                    socket_b: pathlib.Path | None = None):
    ready = processes.directory / "fleet.ready"
    args = [sim_fleet_binary(), "--socket-a", socket_a, "--seconds", str(seconds), "--ready-file", ready]
    if socket_b is not None:
        args += ["--socket-b", socket_b]
    process = processes.start("sim-fleet", args)
    wait_until(lambda: ready.exists() or process.poll() is not None, 60, "the simulated trainers")
    assert process.poll() is None, processes.log("sim-fleet")
    return process


class Prometheus:
    BINARY = "/usr/bin/prometheus"

    def __init__(self, processes: Processes, config: str):
        directory = processes.directory
        (directory / "prometheus.yml").write_text(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = processes.start("prometheus", [
            self.BINARY, f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn"])
        wait_until(lambda: self.process.poll() is not None or http_get(self.url + "/-/ready")[0] == 200,
                   60, "prometheus to be ready")
        assert self.process.poll() is None, processes.log("prometheus")

    def api(self, path: str, **params) -> list[dict]:
        status, body = http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=30)
        reply = json.loads(body)
        assert status == 200 and reply["status"] == "success", f"{path} {params}: {body[:500]}"
        return reply["data"]["result"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)

    def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> list[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)
