"""The live monitor, end to end: an agent, the example trainer under
`gaugewatch run`, the agent's default rule switching the layers whose
backward leaks, then a summary, plots, and where to look further.

    .venv/bin/python examples/live_demo.py [--config cpu|gpu] [--steps N]
        [--out DIR] [--build-dir build] [--agent-minutes 15 | --stop-agent]

`./scripts/run.sh` (no arguments) sets up, builds and runs this. What it does:
1. starts build/bin/gaugewatch-agent with its embedded defaults (the default
   rule: live_dq_discrepancy > 5% in 3 consecutive samples of a layer ->
   switch that layer to gproj) on a socket, database and free HTTP port in a
   fresh directory (DIR, default /tmp/gaugewatch-demo-XXXX);
2. runs `gaugewatch run ... -- python examples/train.py --config C`: the
   example GPT (examples/README.md) with some layers in the attention-sink
   regime. The demo samples densely so that the whole loop shows within a
   minute: every 2nd step, every layer, 1 head x 128 rows, up to 25% of the
   step time (the hooks' defaults: every 100th step, a quarter of the layers,
   2%);
3. follows the hooks' stats file while it runs: prints each sampled step's
   live dQ discrepancy per layer and each switch as it happens, and writes
   them to DIR/samples.jsonl;
4. prints the summary table (per layer: discrepancy before and after, backend,
   when it switched), renders DIR/plots/monitor.png (tools/gaugewatch_report.py),
   and prints the paths, the metrics URL and the gaugewatchctl commands.
The agent stays up for --agent-minutes (default 15) so that its /metrics and
gaugewatchctl can be looked at, then exits by itself; --stop-agent stops it
at the end. Exit status 0 when the run completed; the summary says whether
a layer switched.
"""

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gaugewatch_report  # noqa: E402

SAMPLING = {"--sample-every": "2", "--layer-fraction": "1", "--max-heads": "1", "--max-rows": "128",
            "--overhead-budget": "0.25"}


def log(text):
    print(text, flush=True)


class Agent:
    """gaugewatch-agent with embedded defaults on a socket, database and free
    HTTP port under `workdir`; kept alive `minutes` after the demo by coreutils
    `timeout`, so it ends by itself."""

    def __init__(self, build_dir, workdir, minutes):
        self.socket = workdir / "agent.sock"
        self.database = workdir / "agent.db"
        self.log_path = workdir / "agent.log"
        command = [str(build_dir / "bin" / "gaugewatch-agent"), "--grpc-socket", str(self.socket),
                   "--http-listen", "127.0.0.1:0", "--database", str(self.database)]
        if minutes > 0:
            command = ["timeout", "--signal=TERM", f"{int(minutes * 60)}s", *command]
        # Its own session: the agent outlives the demo when asked to, and a
        # Ctrl-C of the demo does not reach it.
        self.proc = subprocess.Popen(command, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            text = self.log_path.read_text()
            if "ready" in text or self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if "ready" not in text:
            raise SystemExit(f"demo: the agent did not start:\n{text}")
        self.http_port = int(re.search(r"http port:\s+(\d+)", text).group(1))
        self.metrics_url = f"http://127.0.0.1:{self.http_port}/metrics"

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class StatsFollower:
    """Reads the hooks' stats file (rewritten at every pass boundary) and turns
    what changed into samples and switches (RunRecord) and trace lines."""

    def __init__(self, path, trace_path, record):
        self.path, self.record = path, record
        self.trace = open(trace_path, "w")
        self.seen_samples, self.seen_switches = set(), set()
        self.stats = None

    def poll(self):
        """New (samples, switches) since the last poll."""
        try:
            stats = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return [], []  # not written yet, or caught mid-write
        self.stats = stats
        samples, switches = [], []
        for i, layer in enumerate(stats.get("layers", [])):
            name = layer.get("name", f"attn.{i}")
            self.record.names[i] = name
            history = layer.get("history", [])
            for step, backend in history[1:]:
                if (i, step, backend) not in self.seen_switches:
                    self.seen_switches.add((i, step, backend))
                    switch = {"step": step, "layer": i, "name": name, "backend": backend}
                    switches.append(switch)
                    self.record.add_switch({**switch, "source": "stats"})
                    self._write({"kind": "switch", **switch})
            latest = layer.get("latest") or {}
            if "step" in latest and (i, latest["step"]) not in self.seen_samples:
                self.seen_samples.add((i, latest["step"]))
                metrics = {k: v for k, v in latest.items() if k != "step"}
                metrics = metrics.get("metrics", metrics)
                sample = {"step": latest["step"], "layer": i, "name": name,
                          "backend": gaugewatch_report.backend_at(history, latest["step"]), "metrics": metrics}
                samples.append(sample)
                self.record.add_sample(sample)
                self._write({"kind": "sample", **sample})
        return samples, switches

    def add_train(self, item):
        self.record.add_loss(item)
        self._write({"kind": "train", **item})

    def _write(self, item):
        self.trace.write(json.dumps(item) + "\n")
        self.trace.flush()


def progress_line(step, steps, loss, samples):
    """One sampled step: every layer's live dQ discrepancy (! over the
    default rule's threshold) and backend; with more than 6 layers, the
    layers over the threshold and a count of the others."""
    threshold = gaugewatch_report.DEFAULT_RULE_THRESHOLD
    samples = sorted(samples, key=lambda s: s["layer"])

    def cell(s):
        value = s["metrics"].get(gaugewatch_report.LIVE_DQ)
        text = "-" if value is None else f"{100 * value:.2f}%"
        flag = "!" if value is not None and value > threshold else " "
        return f"{s['name']} {text:>8}{flag}({s['backend']})"

    if len(samples) <= 6:
        cells = "  ".join(cell(s) for s in samples)
    else:
        over = [s for s in samples if (s["metrics"].get(gaugewatch_report.LIVE_DQ) or 0) > threshold]
        under = [s["metrics"].get(gaugewatch_report.LIVE_DQ) or 0 for s in samples if s not in over]
        cells = (f"{len(under)} layer(s) under 5% (max {100 * max(under, default=0):.2f}%)"
                 + ("; over: " + "  ".join(cell(s) for s in over) if over else ""))
    loss_text = "      " if loss is None else f"{loss:6.3f}"
    return f"  step {step:>4}/{steps}  loss {loss_text}  live dQ err: " + cells


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=["cpu", "gpu", "tiny"], help="default: gpu when a GPU is visible")
    p.add_argument("--steps", type=int)
    p.add_argument("--threads", type=int, default=1, help="the trainer's CPU threads")
    p.add_argument("--out", help="directory for everything written (default: a new /tmp/gaugewatch-demo-*)")
    p.add_argument("--build-dir", default=os.environ.get("GAUGEWATCH_BUILD_DIR", str(ROOT / "build")))
    p.add_argument("--python", default=sys.executable, help="the trainer's interpreter")
    p.add_argument("--agent-minutes", type=float, default=15.0, help="agent lifetime after the demo")
    p.add_argument("--stop-agent", action="store_true", help="stop the agent when the demo ends")
    args = p.parse_args()

    build_dir = pathlib.Path(args.build_dir).resolve()
    for binary in ("gaugewatch", "gaugewatch-agent", "gaugewatchctl"):
        if not (build_dir / "bin" / binary).exists():
            raise SystemExit(f"demo: {build_dir / 'bin' / binary} is missing: build first (./scripts/build.sh)")
    if args.config is None:
        import torch
        args.config = "gpu" if torch.cuda.is_available() else "cpu"
    # Short: a unix socket path must stay under 108 bytes.
    workdir = pathlib.Path(args.out).resolve() if args.out else pathlib.Path(
        tempfile.mkdtemp(prefix="gaugewatch-demo-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    ctl = build_dir / "bin" / "gaugewatchctl"

    log(f"[demo] directory {workdir}")
    agent = Agent(build_dir, workdir, 0 if args.stop_agent else args.agent_minutes)
    log(f"[demo] agent pid {agent.proc.pid}: socket {agent.socket}, metrics {agent.metrics_url}, "
        f"default rule: live dQ discrepancy > 5% in 3 samples in a row -> gproj")

    try:
        return run_demo(args, agent, workdir, build_dir, run_id, ctl)
    except BaseException:
        agent.stop()  # an interrupted or failed demo leaves no agent behind
        raise


def run_demo(args, agent, workdir, build_dir, run_id, ctl):
    stats_path = workdir / "stats.json"
    trainer = [args.python, str(ROOT / "examples" / "train.py"), "--config", args.config,
               "--threads", str(args.threads), "--log", str(workdir / "train.jsonl")]
    if args.steps:
        trainer += ["--steps", str(args.steps)]
    command = [str(build_dir / "bin" / "gaugewatch"), "run", "--socket", str(agent.socket), "--run-id", run_id,
               "--stats-file", str(stats_path), "--log-file", str(workdir / "hooks.log")]
    for flag, value in SAMPLING.items():
        command += [flag, value]
    command += ["--", *trainer]
    log(f"[demo] {' '.join(command)}")
    started = time.monotonic()
    stderr_path = workdir / "trainer.stderr"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(stderr_path, "w"), text=True, bufsize=1)

    record = gaugewatch_report.RunRecord()
    follower = StatsFollower(stats_path, workdir / "samples.jsonl", record)
    config, steps, pending, losses = None, None, [], {}
    try:
        for line in proc.stdout:
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "config" in item:
                config = item["config"]
                steps = config["steps"]
                log(f"[demo] trainer: {config['layers']} layers, dim {config['dim']}, seq {config['seq']}, batch "
                    f"{config['batch']}, {config['dtype']} on {config['device']}; sink regime in layers "
                    f"{config['sink_layers']} (key bias RMS {config['key_bias']}, query gain {config['query_gain']})")
                continue
            if "step" in item:
                follower.add_train(item)
                losses[item["step"]] = item["loss"]
                samples, switches = follower.poll()
                pending += samples
                for switch in switches:
                    log(f"  >>> step {switch['step']}: layer {switch['layer']} '{switch['name']}' now runs "
                        f"{switch['backend']} (the agent's default rule)")
                # One line per sampled step once its samples are in (the audit runs
                # off the training thread: they arrive a step or so later).
                for step in sorted({s["step"] for s in pending}):
                    if step < item["step"]:
                        done = [s for s in pending if s["step"] == step]
                        log(progress_line(step, steps, losses.get(step), done))
                        pending = [s for s in pending if s["step"] != step]
    finally:
        code = proc.wait()
    samples, switches = follower.poll()
    for switch in switches:
        log(f"  >>> step {switch['step']}: layer {switch['layer']} '{switch['name']}' now runs {switch['backend']}")
    pending += samples
    for step in sorted({s["step"] for s in pending}):
        log(progress_line(step, steps, losses.get(step), [s for s in pending if s["step"] == step]))
    elapsed = time.monotonic() - started
    if code != 0:
        log(f"[demo] the trainer exited with status {code}; its stderr ({stderr_path}):")
        log(stderr_path.read_text()[-3000:])

    rows = gaugewatch_report.summarize(record)
    (workdir / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot = gaugewatch_report.plot(record, workdir / "plots",
                                  title=f"gaugewatch live monitor: run {run_id} ({args.config} configuration)")
    history = gaugewatch_report.read_agent(record, ctl, agent.socket, run_id)
    if history is not None:
        (workdir / "agent_history.json").write_text(json.dumps(history, indent=2) + "\n")

    switched = [r for r in rows if r["switched_at_step"] is not None]
    stats = follower.stats or {}
    log("")
    log(f"[demo] {len(record.losses)} steps in {elapsed:.0f} s, {len(record.samples)} samples "
        f"(audits skipped for the budget: {stats.get('audits_skipped_budget', 0)}), "
        f"{len(switched)} layer(s) switched")
    log(gaugewatch_report.format_table(rows))
    log("")
    log("[demo] written:")
    for name, what in (("plots/monitor.png", "plots: discrepancy, gproj, offset/spread, loss"),
                       ("summary.json", "the table above"), ("samples.jsonl", "every sample and switch"),
                       ("stats.json", "the hooks' stats"), ("train.jsonl", "the trainer's steps"),
                       ("hooks.log", "the hooks' log"), ("agent.log", "the agent's log"),
                       ("agent.db", "the agent's decisions and audit log (SQLite)"),
                       ("agent_history.json", "gaugewatchctl history --audit --json")):
        if (workdir / name).exists():
            log(f"  {str(workdir / name):<60} {what}")
    log(f"  re-render: ./scripts/run.sh report --stats {stats_path} --trace {workdir / 'samples.jsonl'} "
        f"--train-log {workdir / 'train.jsonl'} --out {workdir / 'plots'}")
    if args.stop_agent:
        agent.stop()
        log("[demo] the agent is stopped (--stop-agent); while an agent runs, look further with:")
    else:
        log(f"[demo] the agent keeps running for {args.agent_minutes:g} min (stop it now: "
            f"kill -TERM -{agent.proc.pid}); look further with:")
    log(f"  curl -s {agent.metrics_url} | grep live_dq")
    log(f"  {ctl} --socket {agent.socket} layers --run {run_id}")
    log(f"  {ctl} --socket {agent.socket} history --run {run_id} --audit")
    log(f"  {ctl} --socket {agent.socket} switch --run {run_id} --layers 0 --backend pivot")
    log(f"[demo] plot: {plot}")
    return code


if __name__ == "__main__":
    sys.exit(main())
