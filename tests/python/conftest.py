"""Shared fixtures for the Python tests: where the build is, and a runner for
the `gaugewatch` command-line tool."""

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GAUGEWATCH_BUILD_DIR", ROOT / "build")).resolve()


@pytest.fixture(scope="session")
def gaugewatch_bin() -> pathlib.Path:
    path = build_dir() / "bin" / "gaugewatch"
    if not path.exists():
        pytest.fail(f"{path} is missing: build first (./scripts/build.sh) or set GAUGEWATCH_BUILD_DIR")
    return path


@pytest.fixture
def run_cli(gaugewatch_bin):
    """Runs `gaugewatch ARGS...`; returns the CompletedProcess (text mode)."""

    def run(*args, check=True, timeout=600):
        result = subprocess.run([str(gaugewatch_bin), *map(str, args)], capture_output=True, text=True,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"gaugewatch {' '.join(map(str, args))} exited {result.returncode}:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    return run


@pytest.fixture
def audit_json(run_cli):
    """Runs `gaugewatch audit ... --json` and returns the parsed report."""

    def run(*args):
        return json.loads(run_cli("audit", *args, "--json").stdout)

    return run


_RECORDS: list[str] = []


@pytest.fixture(scope="session")
def record_line():
    """Lines printed in the terminal summary (measured numbers worth keeping
    in the device log even when every test passes)."""
    return _RECORDS.append


def pytest_terminal_summary(terminalreporter):
    if _RECORDS:
        terminalreporter.section("gaugewatch measurements")
        for line in _RECORDS:
            terminalreporter.write_line(line)
