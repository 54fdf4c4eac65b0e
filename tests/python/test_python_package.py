"""The gaugewatch_hooks Python package as a user gets it: `pip install
./hooks/python` (here `--target` a temporary directory, without
dependencies: torch is already in the test interpreter), imported from
outside the repository, finding the native library through
GAUGEWATCH_BUILD_DIR, GAUGEWATCH_HOOKS_LIB or an installed prefix, and
`python -m gaugewatch_hooks --check` reporting what it loaded and what would
be monitored. The agent socket is checked against a real gaugewatch-agent."""

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, build_dir

PACKAGE_SOURCE = ROOT / "hooks" / "python"
CPU_SDPA_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"


def build_isolation_args() -> list[str]:
    """pip builds in an isolated environment by default, fetching setuptools
    from the index; where the interpreter already has a setuptools that can
    build the wheel (>= 70.1, or >= 61 with the wheel package) the build uses
    it instead, so that a machine without network (the GPU machine) runs the
    same install."""
    try:
        import setuptools
    except ImportError:
        return []
    version = tuple(int(part) for part in re.findall(r"\d+", setuptools.__version__)[:2])
    if version >= (70, 1) or (version >= (61, 0) and importlib.util.find_spec("wheel") is not None):
        return ["--no-build-isolation"]
    return []


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package pip-installed into a directory of its own."""
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *build_isolation_args(),
                             "--target", str(target), str(PACKAGE_SOURCE)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (target / "gaugewatch_hooks" / "__main__.py").is_file()
    return target


@pytest.fixture(scope="module")
def built_library():
    library = build_dir() / "lib" / "libgaugewatch_hooks.so"
    if not library.exists():
        pytest.fail(f"{library} is missing: build first (./scripts/build.sh) or set GAUGEWATCH_BUILD_DIR")
    return library


def run_python(site, args, env_extra, cwd):
    """Runs the test interpreter with only `site` added to its path and no
    GAUGEWATCH_* variables but `env_extra`; PATH keeps no gaugewatch binary
    unless env_extra sets it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUGEWATCH_") and k != "LD_PRELOAD"}
    env["PATH"] = "/usr/bin:/bin"
    env["PYTHONPATH"] = str(site)
    env.update(env_extra)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180, cwd=cwd, env=env)


def check_json(site, env_extra, cwd):
    result = run_python(site, ["-m", "gaugewatch_hooks", "--check", "--json"], env_extra, cwd)
    return result.returncode, json.loads(result.stdout) if result.stdout.strip().startswith("{") else result


def test_version_and_default_socket_agree_with_the_native_side():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    cmake_version = re.search(r"project\(gaugewatch\s+VERSION\s+(\S+)", cmake).group(1)
    pyproject = (PACKAGE_SOURCE / "pyproject.toml").read_text()
    assert re.search(r'^version = "(.+)"$', pyproject, re.M).group(1) == cmake_version
    headers = "".join(path.read_text() for path in (ROOT / "hooks").glob("*.h"))
    default_socket = re.search(r'kDefaultSocket\s*=\s*"([^"]+)"', headers).group(1)
    check = (PACKAGE_SOURCE / "gaugewatch_hooks" / "check.py").read_text()
    assert re.search(r'^DEFAULT_SOCKET = "([^"]+)"$', check, re.M).group(1) == default_socket


@pytest.fixture
def agent_socket():
    """A real gaugewatch-agent listening on a unix socket; yields its path."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gwp-", dir="/tmp"))  # unix socket paths: < 108 bytes
    socket_path = workdir / "agent.sock"
    agent = subprocess.Popen([str(build_dir() / "bin" / "gaugewatch-agent"), "--grpc-socket", str(socket_path),
                              "--http-listen", "127.0.0.1:0", "--database", str(workdir / "agent.db")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists() and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket_path.exists(), "gaugewatch-agent did not create its socket"
        yield socket_path
    finally:
        agent.terminate()
        agent.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_installed_package_finds_the_build_and_reports_what_it_monitors(installed, built_library, agent_socket,
                                                                        tmp_path):
    code, report = check_json(installed, {"GAUGEWATCH_BUILD_DIR": str(build_dir()),
                                          "GAUGEWATCH_SOCKET": str(agent_socket)}, tmp_path)
    assert code == 0, report
    assert report["versions"]["package"] == "0.1.0"
    assert report["versions"]["package_dir"] == str(installed / "gaugewatch_hooks")
    assert report["versions"]["torch"].startswith("2.11.0")
    library = report["library"]
    assert library["path"] == str(built_library) and library["found_by"] == "GAUGEWATCH_BUILD_DIR"
    assert library["active"] and library["error"] is None
    mapped = {pathlib.Path(path).name: path for path in library["mapped"]}
    assert mapped["libgaugewatch_hooks.so"] == str(built_library.resolve())
    assert "libgaugewatch_ops.so" in mapped
    assert "gaugewatch::attention_backward" in library["ops"]
    assert "gaugewatch_hooks::stats" in library["ops"]
    cpu = [probe for probe in report["sdpa"] if probe["device"] == "cpu"][0]
    assert cpu == {"device": "cpu", "op": CPU_SDPA_OP, "error": None, "autograd_key": "AutogradCPU",
                   "intercepted": True}
    assert report["agent"] == {"path": str(agent_socket), "source": "GAUGEWATCH_SOCKET",
                               "state": "an agent is listening"}
    assert report["sampling"]["every_n_steps"] == 100


def test_check_text_names_library_op_and_socket(installed, built_library, tmp_path):
    missing_socket = tmp_path / "no-agent.sock"
    result = run_python(installed, ["-m", "gaugewatch_hooks", "--check"],
                        {"GAUGEWATCH_HOOKS_LIB": str(built_library), "GAUGEWATCH_SOCKET": str(missing_socket)},
                        tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    text = result.stdout
    assert f"library: {built_library} (found by GAUGEWATCH_HOOKS_LIB)" in text
    assert f"cpu: {CPU_SDPA_OP} -> intercepted: monitored (AutogradCPU)" in text
    assert f"agent socket: {missing_socket} (GAUGEWATCH_SOCKET): absent: no agent has created it" in text
    assert text.rstrip().endswith("ok: layers calling the SDPA ops above will be monitored")


def test_missing_library_says_where_it_looked_and_what_to_set(installed, tmp_path):
    code, report = check_json(installed, {}, tmp_path)
    assert code == 1
    error = report["library"]["error"]
    assert "libgaugewatch_hooks.so not found (looked in:" in error
    for hint in ("GAUGEWATCH_HOOKS_LIB=", "GAUGEWATCH_BUILD_DIR=", "cmake --install"):
        assert hint in error
    assert report["sdpa"][0]["intercepted"] is False
    assert report["library"]["mapped"] == []


def test_wrong_hooks_lib_setting_is_named_and_training_goes_on(installed, tmp_path):
    wrong = tmp_path / "nope.so"
    result = run_python(installed, ["-c", "import gaugewatch_hooks; print(gaugewatch_hooks.load())"],
                        {"GAUGEWATCH_HOOKS_LIB": str(wrong)}, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "False"
    assert lines[0] == (f"[gaugewatch-hooks] GAUGEWATCH_HOOKS_LIB={wrong} is not a file; point it at a built "
                        "libgaugewatch_hooks.so, or unset it to search GAUGEWATCH_BUILD_DIR and the install prefix; "
                        "training continues unmonitored")


def test_installed_prefix_is_found_through_the_gaugewatch_command(installed, built_library, tmp_path):
    prefix = tmp_path / "prefix"
    result = subprocess.run(["cmake", "--install", str(build_dir()), "--prefix", str(prefix)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    code, report = check_json(installed, {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "GAUGEWATCH_SOCKET": "none"},
                              tmp_path)
    assert code == 0, report
    assert report["library"]["path"] == str(prefix / "lib" / "libgaugewatch_hooks.so")
    assert report["library"]["found_by"] == f"prefix of {prefix / 'bin' / 'gaugewatch'}"
    mapped = {pathlib.Path(path).name: path for path in report["library"]["mapped"]}
    assert mapped["libgaugewatch_ops.so"] == str(prefix / "lib" / "libgaugewatch_ops.so")
    assert report["agent"]["path"] is None and report["agent"]["state"].startswith("off")
