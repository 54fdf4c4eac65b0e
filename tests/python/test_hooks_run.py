"""`gaugewatch run -- <command>`: the launcher that preloads the hooks into an
unchanged trainer (exec, exit status passed through, environment from flags)."""

import json
import os
import subprocess
import sys

from conftest import ROOT, build_dir

TRAINER = ROOT / "tests" / "python" / "trainers" / "tiny_gpt.py"


def gaugewatch(*args, **kwargs):
    return subprocess.run([str(build_dir() / "bin" / "gaugewatch"), *map(str, args)], capture_output=True, text=True,
                          timeout=240, **kwargs)


def test_run_preloads_the_hooks_into_an_unchanged_trainer(tmp_path):
    stats = tmp_path / "stats.json"
    result = gaugewatch("run", "--no-agent", "--run-id", "launcher-test", "--stats-file", stats,
                        "--layer-backends", "0=pivot", "--", sys.executable, TRAINER, "--steps", 10)
    assert result.returncode == 0, result.stderr[-3000:]
    final = [json.loads(line) for line in result.stdout.splitlines() if '"done"' in line][0]["stats"]
    assert final["run_id"] == "launcher-test"
    assert [layer["backward_calls"] for layer in final["layers"]] == [10, 10, 10]
    assert final["layers"][0]["history"] == [[0, "pivot"]]
    assert json.loads(stats.read_text())["layers"]


def test_run_sets_environment_and_passes_the_exit_status_through():
    code = ("import os, sys; print(os.environ['LD_PRELOAD'].split(':')[0]); "
            "print(os.environ['GAUGEWATCH_SAMPLE_EVERY'], os.environ['GAUGEWATCH_SOCKET']); sys.exit(7)")
    result = gaugewatch("run", "--sample-every", 50, "--socket", "/tmp/x.sock", "--", sys.executable, "-c", code,
                        # A bare environment, but where the gRPC libraries live
                        # outside the system paths (the GPU machine) keep that.
                        env={"LD_PRELOAD": "", "PATH": "/usr/bin:/bin",
                             "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")})
    assert result.returncode == 7, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == str(build_dir() / "lib" / "libgaugewatch_hooks.so")
    assert lines[1] == "50 /tmp/x.sock"


def test_run_usage_errors():
    assert gaugewatch("run").returncode == 2
    assert gaugewatch("run", "--bogus", "--", "true").returncode == 2
    missing = gaugewatch("run", "--lib", "/nonexistent/libgaugewatch_hooks.so", "--", "true")
    assert missing.returncode == 2 and "not found" in missing.stderr
    assert gaugewatch("run", "--disable", "--", "/nonexistent-command").returncode == 127
