"""The `gaugewatch` launcher's flag checks (every value fails fast with a
message naming the flag, flags fall back to their GAUGEWATCH_* variables,
--version), and the hooks' own start-up checks when configured by the
environment alone: unwritable stats / log files keep the library inert with a
logged error (the trainer runs unmonitored, never aborted), and
GAUGEWATCH_LAYERS beyond the model's layers is a loud warning."""

import json
import os
import sys

import pytest

from conftest import ROOT, build_dir
from test_hooks_run import gaugewatch

TRAINER = ROOT / "tests" / "python" / "trainers" / "tiny_gpt.py"


def test_version():
    result = gaugewatch("--version")
    assert result.returncode == 0 and result.stdout.startswith("gaugewatch "), result


@pytest.mark.parametrize("args, flag", [
    (["--sample-every", "abc"], "--sample-every"),
    (["--sample-every", "-3"], "--sample-every"),
    (["--backend", "gpro"], "--backend"),
    (["--backend", "fp64"], "--backend"),
    (["--layer-fraction", "7"], "--layer-fraction"),
    (["--layer-fraction", "0"], "--layer-fraction"),
    (["--overhead-budget", "nan"], "--overhead-budget"),
    (["--max-rows", "1.5"], "--max-rows"),
    (["--layers", "1,x"], "--layers"),
    (["--layer-backends", "1=flash"], "--layer-backends"),
    (["--layer-backends", "gproj"], "--layer-backends"),
    (["--run-id", "my run"], "--run-id"),
])
def test_bad_flag_values_fail_fast_naming_the_flag(args, flag):
    result = gaugewatch("run", *args, "--", "true")
    assert result.returncode == 2, result
    assert flag in result.stderr, result.stderr


def test_flags_fall_back_to_the_environment_and_are_checked_there_too():
    env = dict(os.environ, GAUGEWATCH_SAMPLE_EVERY="often")
    result = gaugewatch("run", "--", "true", env=env)
    assert result.returncode == 2 and "--sample-every" in result.stderr and "often" in result.stderr, result
    env = dict(os.environ, GAUGEWATCH_SAMPLE_EVERY="7")
    code = "import os; print(os.environ['GAUGEWATCH_SAMPLE_EVERY'])"
    result = gaugewatch("run", "--disable", "--", sys.executable, "-c", code, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "7", result


@pytest.mark.parametrize("flag", ["--stats-file", "--log-file"])
def test_unwritable_output_files_are_an_error_at_start(tmp_path, flag):
    result = gaugewatch("run", flag, tmp_path / "missing-dir" / "x.json", "--", "true")
    assert result.returncode == 2 and flag in result.stderr and "cannot be written" in result.stderr, result
    result = gaugewatch("run", flag, tmp_path, "--", "true")  # a directory
    assert result.returncode == 2 and "is a directory" in result.stderr, result


def run_preloaded(tmp_path, **env_extra):
    env = dict(os.environ, LD_PRELOAD=str(build_dir() / "lib" / "libgaugewatch_hooks.so"), GAUGEWATCH_SOCKET="none",
               GAUGEWATCH_RUN_ID="cli-checks", **env_extra)
    import subprocess
    return subprocess.run([sys.executable, str(TRAINER), "--steps", "4"], capture_output=True, text=True,
                          timeout=240, env=env)


def done_stats(stdout):
    return [json.loads(line) for line in stdout.splitlines() if '"done"' in line][0]["stats"]


@pytest.mark.parametrize("variable", ["GAUGEWATCH_STATS_FILE", "GAUGEWATCH_LOG_FILE"])
def test_hooks_stay_inert_with_a_logged_error_on_unwritable_files(tmp_path, variable):
    result = run_preloaded(tmp_path, **{variable: str(tmp_path / "missing-dir" / "f")})
    assert result.returncode == 0, result.stderr[-3000:]  # the trainer is never aborted
    assert f"ERROR: {variable}=" in result.stderr and "cannot be written" in result.stderr, result.stderr[-3000:]
    assert "runs unmonitored" in result.stderr
    assert not done_stats(result.stdout), "inert: no attention call was intercepted"


def test_hooks_warn_when_layers_name_layers_beyond_the_model(tmp_path):
    result = run_preloaded(tmp_path, GAUGEWATCH_LAYERS="9", GAUGEWATCH_SAMPLE_EVERY="1")
    assert result.returncode == 0, result.stderr[-3000:]
    warning = [line for line in result.stderr.splitlines() if "GAUGEWATCH_LAYERS names layer(s) 9" in line]
    assert len(warning) == 1, result.stderr[-3000:]
    assert "3 attention layer(s)" in warning[0] and "NO layer will be audited" in warning[0]
    assert done_stats(result.stdout)["samples_submitted"] == 0
