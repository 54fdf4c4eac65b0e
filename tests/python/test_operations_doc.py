"""docs/operations.md: its reference blocks equal what the code prints now
(flags, metric catalogue, alerts), every repository path it names exists, and
the example Prometheus configuration it points to is valid."""

import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, build_dir
from operations_support import agent_binary

DOC = ROOT / "docs" / "operations.md"


def test_reference_blocks_match_the_code():
    agent_binary()
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "generate_operations_reference.py"),
                             str(build_dir()), "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_blocks_are_filled():
    text = DOC.read_text()
    for name, marker in (("agent-flags", "--grpc-socket"), ("metrics", "gaugewatch_layer_backend_info"),
                         ("alerts", "GaugewatchAgentDown")):
        block = text.split(f"<!-- generated: {name} -->")[1].split(f"<!-- end generated: {name} -->")[0]
        assert marker in block, name


def test_named_repository_paths_exist():
    text = DOC.read_text()
    paths = set(re.findall(r"`((?:agent|deploy|dashboards|docs|scripts)/[A-Za-z0-9_./-]+)`", text))
    assert len(paths) >= 10
    for path in paths:
        path = path.split("/...")[0]
        assert (ROOT / path).exists(), f"docs/operations.md names {path}, which does not exist"


def test_example_prometheus_config_is_valid():
    if not shutil.which("promtool"):
        pytest.skip("promtool not installed")
    directory = ROOT / "deploy" / "prometheus"
    result = subprocess.run(["promtool", "check", "config", "prometheus.example.yml"], cwd=directory,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
