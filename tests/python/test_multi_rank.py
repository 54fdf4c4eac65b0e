"""Run-consistent switching across the processes of one run (docs/scaling.md):
torchrun starts two gloo DDP processes under `gaugewatch run`, each streams to
a real gaugewatch-agent on a real unix socket; a switch decision reaches both
ranks with one effective step, and both change the layer's backward exactly
at that step boundary, as each rank's hooks stats file and the agent's audit
log record."""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import ROOT, build_dir
from test_hooks import Agent as HooksAgent

TRAINER = ROOT / "tests" / "python" / "trainers" / "ddp_tiny.py"
# torchrun's entry point, with SIGUSR1 printing its threads' Python stacks
# (stop_tree's diagnosis of a launcher that does not exit).
TORCHRUN = [sys.executable, "-c", "import faulthandler, signal, sys; "
            "faulthandler.register(signal.SIGUSR1, all_threads=True); sys.argv[0] = 'torchrun'; "
            "from torch.distributed.run import main; main()"]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def workdir():
    path = pathlib.Path(tempfile.mkdtemp(prefix="gwm-", dir="/tmp"))  # unix socket paths < 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Agent(HooksAgent):
    """A real gaugewatch-agent process on a unix socket, named, with extra
    flags (stop and ctl_json as test_hooks' agent)."""

    def __init__(self, workdir, name="agent", extra_yaml="", extra_args=()):
        b = build_dir() / "bin"
        self.binary, self.ctl = b / "gaugewatch-agent", b / "gaugewatchctl"
        for path in (self.binary, self.ctl, build_dir() / "lib" / "libgaugewatch_hooks.so"):
            if not path.exists():
                pytest.fail(f"{path} is missing: build first (./scripts/build.sh)")
        self.socket = str(workdir / f"{name}.sock")
        config = workdir / f"{name}.yaml"
        config.write_text("default_rules: false\n" + extra_yaml)
        self.log = workdir / f"{name}.log"
        self.args = [str(self.binary), "--grpc-socket", self.socket, "--database", str(workdir / f"{name}.db"),
                     "--config", str(config), *extra_args]
        if "--http-listen" not in extra_args:
            self.args += ["--http-listen", "127.0.0.1:0"]
        self.proc = subprocess.Popen(self.args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "ready" in self.log.read_text() or self.proc.poll() is not None, 20, "agent ready")
        assert self.proc.poll() is None, self.log.read_text()

    def ranks(self, run_id):
        runs = self.ctl_json("layers", "--run", run_id).get("runs", [])
        return runs[0].get("ranks", []) if runs else []


def launch(workdir, socket, run_id, nproc=2, node_rank=0, nnodes=1, master_port=None, extra=()):
    """gaugewatch run -- torchrun ... : each rank's hooks write stats-<run>-<rank>.json."""
    stats = f"{workdir}/stats-{run_id}-$RANK.json"
    rendezvous = (["--standalone"] if nnodes == 1 else
                  ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
                   "--master-port", str(master_port)])
    command = [str(build_dir() / "bin" / "gaugewatch"), "run", "--socket", socket, "--run-id", run_id,
               "--sample-every", "1000", "--", *TORCHRUN, "--nproc-per-node", str(nproc), *rendezvous,
               "--no-python", "sh", "-c",
               f'GAUGEWATCH_STATS_FILE="{stats}" exec "{sys.executable}" -X faulthandler "{TRAINER}" "$@"', "ddp_tiny",
               "--steps", "3000", "--step-sleep", "0.02", "--stop-file", str(workdir / f"stop-{run_id}"), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stats_of(workdir, run_id, rank):
    path = workdir / f"stats-{run_id}-{rank}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def switch_steps(workdir, run_id, ranks, layer, backend):
    """Each rank's step at which `layer` began running `backend` (None while it has not)."""
    out = {}
    for rank in ranks:
        stats = stats_of(workdir, run_id, rank)
        history = stats["layers"][layer]["history"] if stats else []
        out[rank] = next((step for step, name in history if name == backend), None)
    return out


def acked_steps(agent, run_id):
    """rank -> steps in the agent's audit log of acked switch commands of the run."""
    audit = agent.ctl_json("history", "--run", run_id, "--audit").get("audit", [])
    out = {}
    for record in audit:
        if record.get("kind") == "AUDIT_KIND_COMMAND_ACKED":
            match = re.match(r"step (\d+)", record.get("detail", ""))
            if match:
                out.setdefault(record.get("rank", 0), []).append(int(match.group(1)))
    return out


def descendants(pid):
    """The pids of pid's process tree below it (from /proc)."""
    children = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def collect(proc, timeout=60):
    """proc's output once it exits. If it has not exited after timeout s,
    proc (`gaugewatch run` execs torchrun) and every process below it (the
    trainers; both print their threads' Python stacks on SIGUSR1) are asked
    for their stacks, then the tree is killed; the output then ends with the
    stacks and proc's exit status is the kill's."""
    import os
    import signal
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        tree = descendants(proc.pid)
        for pid in [proc.pid, *tree]:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(3)
        for pid in [proc.pid, *tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        out = proc.communicate()[0]
        return out + f"\n[test] no exit {timeout} s after the stop file: stacks above, process tree killed\n"


def finish(proc, workdir, run_id):
    (workdir / f"stop-{run_id}").touch()
    out = collect(proc)
    assert proc.returncode == 0, out[-12000:]
    return out


def test_one_agent_switches_both_ranks_at_the_same_step(workdir):
    agent = Agent(workdir)
    run_id = "ddp-one-agent"
    proc = launch(workdir, agent.socket, run_id)
    try:
        wait_for(lambda: len(agent.ranks(run_id)) == 2, 45, "both ranks connected")
        wait_for(lambda: all((stats_of(workdir, run_id, r) or {}).get("step", 0) >= 5 for r in (0, 1)), 30,
                 "both ranks stepping")
        time.sleep(2.5)  # two heartbeats: the agent knows both ranks' steps and step rates
        before = max(stats_of(workdir, run_id, r)["step"] for r in (0, 1))
        agent.ctl_json("switch", "--run", run_id, "--layers", "1", "--backend", "pivot", "--reason", "test")
        steps = wait_for(lambda: (lambda s: s if None not in s.values() else None)(
            switch_steps(workdir, run_id, (0, 1), 1, "pivot")), 30, "both ranks switched")
        acks = wait_for(lambda: (lambda a: a if len(a) == 2 else None)(acked_steps(agent, run_id)), 15,
                        "both acks audited")
    finally:
        out = finish(proc, workdir, run_id)
        agent.stop()
    print(f"decision at ranks' step {before}: switched at {steps}, acks {acks}")
    assert steps[0] == steps[1], (steps, out[-2000:])
    assert steps[0] > before, f"switched at step {steps[0]}, before the ranks' step {before} at the decision"
    assert acks == {0: [steps[0]], 1: [steps[0]]}, acks
    # Layer 0 was not part of the decision.
    for rank in (0, 1):
        assert [name for _, name in stats_of(workdir, run_id, rank)["layers"][0]["history"]] == ["stock"]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_query(port, promql):
    import urllib.parse
    import urllib.request
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(promql)}"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())["data"]["result"]
    except OSError:
        return []


def test_two_agents_switch_a_run_across_nodes_at_the_same_step(workdir):
    """Two agents on loopback stand for two nodes, each with one rank of a
    2-process gloo DDP run; a real Prometheus scrapes both; both agents poll
    the same fleet rule, fire at the same instant and pick the same step."""
    if not shutil.which("prometheus"):
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    run_id = "ddp-two-nodes"
    prom_port, http_ports = free_port(), (free_port(), free_port())
    # The rule: the run passed step 40 (label_replace gives it the layer to switch).
    rule = (f'label_replace(max by (run) (gaugewatch_rank_step{{run="{run_id}"}}) > 40, '
            f'"layer", "1", "", "")')
    fleet_yaml = (f"prometheus_url: http://127.0.0.1:{prom_port}\npromql_interval_seconds: 1\n"
                  f"promql_rules:\n  - name: fleet_switch\n    query: '{rule}'\n"
                  f"    switch_backend: pivot\n    for_polls: 2\n")
    config = workdir / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                      "  - job_name: gaugewatch\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{http_ports[0]}', '127.0.0.1:{http_ports[1]}']\n")
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={workdir}/tsdb",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=open(workdir / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    agents = [Agent(workdir, f"node{i}", fleet_yaml, ("--http-listen", f"127.0.0.1:{http_ports[i]}"))
              for i in (0, 1)]
    master_port = free_port()
    procs = [launch(workdir, agents[i].socket, run_id, nproc=1, node_rank=i, nnodes=2, master_port=master_port)
             for i in (0, 1)]
    try:
        wait_for(lambda: all(len(a.ranks(run_id)) == 1 for a in agents), 60, "each node's rank connected")
        wait_for(lambda: len(prometheus_query(prom_port, f'gaugewatch_rank_step{{run="{run_id}"}}')) == 2, 30,
                 "Prometheus scraping both agents' rank steps")
        steps = wait_for(lambda: (lambda s: s if None not in s.values() else None)(
            switch_steps(workdir, run_id, (0, 1), 1, "pivot")), 45, "both ranks switched")
        acks = [wait_for(lambda a=a: acked_steps(a, run_id) or None, 15, "ack audited") for a in agents]
        decisions = [a.ctl_json("history", "--run", run_id).get("decisions", []) for a in agents]
    finally:
        (workdir / f"stop-{run_id}").touch()
        outs = [collect(p) for p in procs]
        for a in agents:
            a.stop()
        prometheus.terminate()
        prometheus.wait(15)
    print(f"fleet decisions {[d[0]['reason'] for d in decisions]}: switched at {steps}, acks {acks}")
    # The failing node's exit status and its output's end, printed whole (an
    # assertion message is cut short by pytest's repr).
    failed = [(node, p.returncode) for node, p in enumerate(procs) if p.returncode != 0]
    for node, code in failed:
        print(f"node {node} exited {code}; its output ends:\n{outs[node][-12000:]}")
    assert not failed, failed
    assert steps[0] == steps[1], steps
    assert steps[0] > 40
    assert acks[0] == {0: [steps[0]]} and acks[1] == {1: [steps[0]]}, acks
    # Each agent recorded one decision of the fleet rule, at the same instant.
    assert [len(d) for d in decisions] == [1, 1], decisions
    assert all(d[0]["source"] == "DECISION_SOURCE_PROMQL_RULE" for d in (decisions[0], decisions[1]))
    assert decisions[0][0]["reason"].split(" at ")[-1] == decisions[1][0]["reason"].split(" at ")[-1], decisions
