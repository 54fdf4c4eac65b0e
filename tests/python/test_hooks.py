"""libgaugewatch_hooks end to end on CPU: a real tiny GPT trainer
(tests/python/trainers/tiny_gpt.py, bfloat16 SDPA on the CPU flash op) run
under LD_PRELOAD, with torch.ops.load_library and through the Python helper,
each against a real gaugewatch-agent process on a real unix socket.

What is checked: samples arrive for the right layers; an agent rule trips
and switches one layer; the switch takes effect at a step boundary (the
hooks' per-layer history of which backward actually ran, compared with the
step the agent's audit log recorded for the ack); loss keeps decreasing; a
capture command writes a file `gaugewatch audit --input` reads; the agent
killed mid-run and restarted (training completes, the hook reconnects);
layer identity under activation checkpointing, gradient accumulation and
no-grad eval forwards; a second copy of the library stays inert."""

import ctypes
import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, build_dir

TRAINER = ROOT / "tests" / "python" / "trainers" / "tiny_gpt.py"


def _paths():
    b = build_dir()
    return b / "bin" / "gaugewatch-agent", b / "bin" / "gaugewatchctl", b / "lib" / "libgaugewatch_hooks.so"


@pytest.fixture(scope="module")
def binaries():
    agent, ctl, lib = _paths()
    for path in (agent, ctl, lib):
        if not path.exists():
            pytest.fail(f"{path} is missing: build first (./scripts/build.sh)")
    return agent, ctl, lib


@pytest.fixture
def workdir():
    # Short: unix socket paths must stay under 108 bytes.
    path = pathlib.Path(tempfile.mkdtemp(prefix="gwh-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_for(predicate, timeout=30.0, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Agent:
    """A real gaugewatch-agent process on a unix socket in `workdir`."""

    def __init__(self, binary, ctl, workdir, rules_yaml=""):
        self.binary, self.ctl, self.dir = binary, ctl, workdir
        self.socket = str(workdir / "agent.sock")
        self.config = workdir / "agent.yaml"
        self.config.write_text("default_rules: false\n" + rules_yaml)
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        self.log = self.dir / f"agent-{self.starts}.log"
        self.proc = subprocess.Popen(
            [str(self.binary), "--grpc-socket", self.socket, "--http-listen", "127.0.0.1:0", "--database",
             str(self.dir / "agent.db"), "--config", str(self.config)],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "ready" in self.log.read_text() or self.proc.poll() is not None, 20, what="agent ready")
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def ctl_json(self, *args):
        out = subprocess.run([str(self.ctl), "--socket", self.socket, "--json", *args], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    def rank(self, run_id):
        runs = self.ctl_json("layers", "--run", run_id).get("runs", [])
        if not runs or not runs[0].get("ranks"):
            return {}
        return runs[0]["ranks"][0]

    def layers(self, run_id):
        return self.rank(run_id).get("layers", [])


@pytest.fixture
def agent_factory(binaries, workdir):
    agents = []

    def make(rules_yaml=""):
        agent = Agent(binaries[0], binaries[1], workdir, rules_yaml)
        agents.append(agent)
        return agent.start()

    yield make
    for agent in agents:
        agent.stop()


def torch_version():
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                         text=True, timeout=120)
    return out.stdout.strip()


def cuda_driver_version():
    """cuDriverGetVersion through ctypes, as "major.minor"; "" without a CUDA driver."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return ""
    version = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
        return ""
    return f"{version.value // 1000}.{(version.value % 1000) // 10}"


def trainer_env(lib, workdir, run_id, socket, mode, **extra):
    env = dict(os.environ)
    env.update({
        "GAUGEWATCH_SOCKET": socket,
        "GAUGEWATCH_RUN_ID": run_id,
        "GAUGEWATCH_SAMPLE_EVERY": "1",
        "GAUGEWATCH_LAYER_FRACTION": "1",
        "GAUGEWATCH_MAX_HEADS": "2",
        "GAUGEWATCH_MAX_ROWS": "16",
        "GAUGEWATCH_OVERHEAD_BUDGET": "1",
        "GAUGEWATCH_STATS_FILE": str(workdir / f"{run_id}.stats.json"),
        "GAUGEWATCH_LOG_FILE": str(workdir / f"{run_id}.hooks.log"),
        "OMP_NUM_THREADS": "1",
        # Python and native stacks, then a kill, well before run_trainer's timeout.
        "GAUGEWATCH_TEST_WATCHDOG_S": "200",
    })
    if mode == "plain":
        # As `gaugewatch run` preloads: the shim, which loads the hooks in
        # Python processes only (not in the compilers Inductor starts).
        env["LD_PRELOAD"] = str(pathlib.Path(lib).parent / "libgaugewatch_preload.so")
    else:
        env.pop("LD_PRELOAD", None)
        env["GAUGEWATCH_HOOKS_LIB"] = str(lib)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def parse_output(stdout):
    losses, done = [], None
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if "loss" in record:
                losses.append(record["loss"])
            if record.get("done"):
                done = record
    return losses, done


def assert_loss_decreases(losses):
    assert len(losses) >= 10, losses
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.5 * first, f"loss did not decrease: {losses}"


def run_trainer(env, *args, timeout=240):
    result = subprocess.run([sys.executable, str(TRAINER), *map(str, args)], env=env, capture_output=True,
                            text=True, timeout=timeout)
    # A hung trainer was killed by its watchdog (GAUGEWATCH_TEST_WATCHDOG_S):
    # its thread dump is in the stderr tail.
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-12000:]
    return result


SWITCH_RULE = """rules:
  - name: cpu-dq
    metric: live_dq_discrepancy
    op: ">"
    threshold: 0.00001
    for_samples: 2
    layers: [1]
    switch_backend: gproj
  - name: capture-layer-0
    metric: key_rms
    op: ">"
    threshold: 0.0
    layers: [0]
    capture: 1
"""

NAMES = {
    "plain": ["attn.0", "attn.1", "attn.2"],
    "load_library": ["attn.0", "attn.1", "attn.2"],
    "helper": ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"],
}


@pytest.mark.parametrize("mode", ["plain", "load_library", "helper"])
def test_rule_switches_layer_at_step_boundary(mode, binaries, workdir, agent_factory, run_cli):
    lib = binaries[2]
    agent = agent_factory(SWITCH_RULE)
    run_id = f"hooks-{mode.replace('_', '-')}"
    captures = workdir / "captures"
    env = trainer_env(lib, workdir, run_id, agent.socket, mode, GAUGEWATCH_CAPTURE_DIR=captures)
    result = run_trainer(env, "--steps", 25, "--mode", mode)
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    stats = done["stats"]
    assert stats is not None, result.stderr

    # The hook's layers: named as the mode says, each ran a backward per step.
    assert [layer["name"] for layer in stats["layers"]] == NAMES[mode]
    assert all(layer["backward_calls"] == 25 for layer in stats["layers"]), stats["layers"]

    # The agent got samples for every layer under the same names.
    layers = agent.layers(run_id)
    assert [layer["name"] for layer in layers] == NAMES[mode]
    assert all(int(layer.get("samples", 0)) > 0 for layer in layers), layers
    assert all(layer["latest"].get("live_dq_discrepancy", 0) > 0 for layer in layers), layers
    # The translation audit of the backend in use reaches the agent too (stock
    # layers: the op's stock figure; layer 1 after its switch: GProj's).
    for layer in layers:
        gauge = layer["latest"].get("live_gauge_violation")
        assert gauge is not None and math.isfinite(gauge) and gauge > 0, layer
    # ... and is the figure the hook computed for that layer's latest sample.
    hook_latest = {layer["name"]: layer["latest"] for layer in stats["layers"]}
    assert all(hook_latest[layer["name"]].get("live_gauge_violation") is not None for layer in layers), hook_latest

    # The Hello's versions as the agent keeps them: torch's, and the CUDA
    # runtime's / driver's ("major.minor") when a CUDA driver is there, else empty.
    rank = agent.rank(run_id)
    assert rank.get("torch_version") == torch_version().split("+")[0], rank  # TORCH_VERSION: no local suffix
    cuda, driver = rank["cuda_version"], rank["driver_version"]
    expected_driver = cuda_driver_version()
    assert driver == expected_driver, (rank, expected_driver)
    if expected_driver:
        assert re.fullmatch(r"\d+\.\d+", cuda), rank
    else:
        assert cuda == "", rank

    # The rule fired for layer 1 only; the hook acked the switch at step S.
    decisions = agent.ctl_json("history", "--run", run_id, "--audit")
    assert [d["rule"] for d in decisions.get("decisions", [])] == ["cpu-dq"], decisions
    acked = [a for a in decisions["audit"] if a["kind"] == "AUDIT_KIND_COMMAND_ACKED"]
    assert acked, decisions
    assert layers[1]["backend"] == "BACKEND_GPROJ", layers[1]

    # Which backward ran: layer 1 stock up to step S - 1, gproj from S on; the others stock throughout.
    history = {layer["index"]: layer["history"] for layer in stats["layers"]}
    assert history[0] == [[0, "stock"]] and history[2] == [[0, "stock"]], history
    assert len(history[1]) == 2 and history[1][0] == [0, "stock"] and history[1][1][1] == "gproj", history
    switch_step = history[1][1][0]
    assert 2 <= switch_step < 25
    ack_steps = {a["detail"] for a in acked}
    assert f"step {switch_step}" in ack_steps, (ack_steps, switch_step)
    assert stats["backward_calls"]["gproj"] == 25 - switch_step
    # Layer 1's latest sample, once it ran gproj, reports GProj's translation audit as the live one.
    latest_1 = hook_latest[NAMES[mode][1]]
    if latest_1["step"] >= switch_step:
        assert latest_1["live_gauge_violation"] == latest_1["gproj_gauge_violation"], latest_1
    assert stats["fallbacks"] == 0

    # The capture command wrote layer 0's operands, readable by `gaugewatch audit`.
    files = sorted(captures.glob("*.safetensors"))
    assert files and "layer0" in files[0].name, list(captures.iterdir()) if captures.exists() else "no dir"
    report = json.loads(run_cli("audit", "--input", files[0], "--json").stdout)
    assert report


def test_agent_killed_mid_run_then_reconnects(binaries, workdir, agent_factory):
    lib = binaries[2]
    agent = agent_factory()
    run_id = "hooks-restart"
    stop_file = workdir / "stop"
    stats_file = workdir / f"{run_id}.stats.json"
    env = trainer_env(lib, workdir, run_id, agent.socket, "plain", GAUGEWATCH_RECONNECT_MAX_MS=300)
    proc = subprocess.Popen([sys.executable, str(TRAINER), "--steps", "3000", "--stop-file", str(stop_file),
                             "--step-sleep", "0.02"],
                            env=env, stdout=open(workdir / "trainer.out", "w"),
                            stderr=open(workdir / "trainer.err", "w"), text=True)

    def stats():
        try:
            return json.loads(stats_file.read_text())
        except (OSError, ValueError):
            return None

    try:
        wait_for(lambda: any(int(l.get("samples", 0)) > 0 for l in agent.layers(run_id)), 60,
                 what="samples at the first agent")
        agent.kill()
        killed_at = wait_for(stats, 30, what="the stats file")["step"]
        # Training goes on without the agent.
        wait_for(lambda: (s := stats()) and s["step"] >= killed_at + 20 and not s["reporter"]["connected"], 60,
                 what="steps while the agent is down")
        agent.start()
        wait_for(lambda: (s := stats()) and s["reporter"]["connects"] >= 2, 60, what="reconnect")
        wait_for(lambda: any(int(l.get("samples", 0)) > 0 for l in agent.layers(run_id)), 60,
                 what="samples at the restarted agent")
        stop_file.write_text("stop")
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = (workdir / "trainer.out").read_text(), (workdir / "trainer.err").read_text()
    assert proc.returncode == 0, err[-3000:]
    losses, done = parse_output(out)
    assert_loss_decreases(losses)
    assert done["stats"]["reporter"]["connects"] >= 2
    assert "agent unreachable" in err or "stream ended" in err, err[-2000:]


def test_layer_identity_under_checkpointing_accumulation_and_eval(binaries, workdir):
    """Non-reentrant activation checkpointing (forward recomputed inside the
    backward), 2 micro-batches per step and a no-grad eval forward every 3
    steps: still exactly 3 layers, one backward per layer per micro-batch,
    and the layer configured for gproj runs gproj for every one of its calls."""
    lib = binaries[2]
    env = trainer_env(lib, workdir, "hooks-ckpt", "none", "plain", GAUGEWATCH_LAYER_BACKENDS="2=gproj")
    result = run_trainer(env, "--steps", 12, "--checkpoint", "--grad-accum", 2, "--eval-every", 3)
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    stats = done["stats"]
    assert [layer["name"] for layer in stats["layers"]] == ["attn.0", "attn.1", "attn.2"]
    assert [layer["backward_calls"] for layer in stats["layers"]] == [24, 24, 24]
    assert stats["backward_calls"]["gproj"] == 24 and stats["backward_calls"]["stock"] == 48
    assert stats["layers"][2]["history"] == [[0, "gproj"]]
    assert stats["step"] == 23  # a step per micro-batch (forward + backward pass), from 0
    assert stats["reporter"] is None and "no agent configured" in result.stderr


def test_agent_absent_training_unaffected(binaries, workdir):
    lib = binaries[2]
    env = trainer_env(lib, workdir, "hooks-absent", str(workdir / "nobody.sock"), "plain")
    start = time.monotonic()
    result = run_trainer(env, "--steps", 12)
    elapsed = time.monotonic() - start
    losses, done = parse_output(result.stdout)
    assert_loss_decreases(losses)
    assert done["stats"]["reporter"]["connects"] == 0
    assert "agent unreachable" in result.stderr
    assert elapsed < 60, elapsed  # no hang at exit


def test_second_copy_stays_inert(binaries, workdir):
    lib = binaries[2]
    copy = workdir / "copy" / "libgaugewatch_hooks.so"
    copy.parent.mkdir()
    shutil.copy2(lib, copy)
    env = trainer_env(lib, workdir, "hooks-copy", "none", "plain", GAUGEWATCH_HOOKS_LIB=copy)
    result = run_trainer(env, "--steps", 10, "--mode", "load_library")
    losses, done = parse_output(result.stdout)
    assert "another copy of libgaugewatch_hooks is already loaded" in result.stderr
    assert [layer["backward_calls"] for layer in done["stats"]["layers"]] == [10, 10, 10]


def test_clean_exit_says_goodbye_and_the_agent_marks_the_rank_finished(binaries, workdir, agent_factory):
    """A trainer that ends normally sends Goodbye (the agent marks its rank
    finished, so no trainer-silent alert); one that is killed does not."""
    agent = agent_factory()
    env = trainer_env(binaries[2], workdir, "bye", agent.socket, "plain")
    run_trainer(env, "--steps", 4)
    wait_for(lambda: agent.rank("bye").get("finished"), 20, what="rank marked finished")
    assert not agent.rank("bye").get("connected", False)

    env = trainer_env(binaries[2], workdir, "killed", agent.socket, "plain")
    proc = subprocess.Popen([sys.executable, str(TRAINER), "--steps", "400"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: agent.layers("killed"), 120, what="the second trainer connected")
    finally:
        proc.kill()
        proc.wait(30)
    wait_for(lambda: not agent.rank("killed").get("connected", True), 20, what="killed rank disconnected")
    assert not agent.rank("killed").get("finished", False)
