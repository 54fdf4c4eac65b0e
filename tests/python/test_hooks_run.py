"""`gaugewatch run -- <command>`: the launcher that preloads the hooks into an
unchanged trainer (exec, exit status passed through, environment from flags),
and the preload shim it uses (hooks/preload_shim.c: the hooks in Python processes only)."""

import json
import os
import shutil
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
    assert lines[0] == str(build_dir() / "lib" / "libgaugewatch_preload.so")  # the shim, which loads the hooks
    assert lines[1] == "50 /tmp/x.sock"


def test_run_usage_errors():
    assert gaugewatch("run").returncode == 2
    assert gaugewatch("run", "--bogus", "--", "true").returncode == 2
    missing = gaugewatch("run", "--lib", "/nonexistent/libgaugewatch_hooks.so", "--", "true")
    assert missing.returncode == 2 and "not found" in missing.stderr
    assert gaugewatch("run", "--disable", "--", "/nonexistent-command").returncode == 127


MAPS_OF_SELF = "import sys; print(sum('libgaugewatch_hooks.so' in l for l in open('/proc/self/maps')) > 0)"


def test_run_loads_the_hooks_in_python_processes_only():
    """The preload shim: a Python child maps the hooks library; a program the
    trainer starts that is not Python (a compiler, a shell) maps neither the
    hooks nor libtorch, at any depth of the process tree."""
    shell = "grep -c -e libgaugewatch_hooks.so -e libtorch /proc/$$/maps; exec " + sys.executable + " -c \"" + \
        MAPS_OF_SELF + "\""
    result = gaugewatch("run", "--no-agent", "--", "sh", "-c", shell)
    assert result.returncode == 0, result.stderr[-3000:]
    shell_count, python_has_hooks = result.stdout.split()
    assert shell_count == "0", result.stdout  # sh: nothing of torch or the hooks mapped
    assert python_has_hooks == "True", result.stdout
    assert "not found beside the hooks library" not in result.stderr


def test_run_without_the_shim_preloads_the_hooks_and_says_so(tmp_path):
    """A --lib whose directory has no libgaugewatch_preload.so: the hooks are
    preloaded directly (monitoring still works) and the launcher says what
    that costs."""
    lib = tmp_path / "libgaugewatch_hooks.so"
    lib.symlink_to(build_dir() / "lib" / "libgaugewatch_hooks.so")
    result = gaugewatch("run", "--no-agent", "--lib", lib, "--", sys.executable, "-c", MAPS_OF_SELF)
    assert result.returncode == 0 and result.stdout.strip() == "True", result
    assert "libgaugewatch_preload.so not found beside the hooks library" in result.stderr, result.stderr


def test_shim_without_the_hooks_beside_it_says_so_and_the_program_runs(tmp_path):
    shim = tmp_path / "libgaugewatch_preload.so"
    shutil.copy2(build_dir() / "lib" / "libgaugewatch_preload.so", shim)
    env = dict(os.environ, LD_PRELOAD=str(shim))
    result = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ran", result
    assert f"cannot load the hooks library {tmp_path}/libgaugewatch_hooks.so" in result.stderr, result.stderr
    assert "runs unmonitored" in result.stderr
    result = subprocess.run(["sh", "-c", "echo ran"], capture_output=True, text=True, env=env, timeout=60)
    assert result.stdout.strip() == "ran" and result.stderr == "", result  # not Python: nothing to load
