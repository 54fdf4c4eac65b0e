"""gaugewatch report: plots of a monitored run (PNG, matplotlib).

    .venv/bin/python tools/gaugewatch_report.py --stats STATS.json [--trace SAMPLES.jsonl]
        [--train-log TRAIN.jsonl] [--socket AGENT.sock --run RUN_ID] --out DIR
    ./scripts/run.sh report ...            (the same, after set-up and build)

Inputs (any subset; at least --stats or --trace):
- --stats: the hooks' stats file (GAUGEWATCH_STATS_FILE, `gaugewatch run
  --stats-file`) of any run: each layer's backend history (when it switched)
  and its latest audited sample;
- --trace: samples recorded over the run, one JSON object a line:
  {"kind": "sample", "step", "layer", "name", "backend", "metrics": {...}},
  {"kind": "switch", "step", "layer", "name", "backend"} (what
  examples/live_demo.py writes by following the stats file while the run goes);
  without it each layer has the one latest sample of --stats;
- --train-log: the trainer's JSON lines with "step" and "loss" (and
  "grad_norm"), e.g. examples/train.py's stdout or --log;
- --socket/--run: the agent's switch decisions for that run
  (`gaugewatchctl history --run RUN --audit --json`): rule firings and the
  acknowledged switches, shown as markers where the stats have none.

Writes DIR/monitor.png: (1) live dQ discrepancy of each layer's backward
against the FP32 recompute over steps, with the switches and the default
rule's 5% threshold; (2) GProj's dQ discrepancy on the same samples; (3) the
key offset / spread ratio (median over rows), the leak's amplification; (4)
the loss (and gradient norm). Also DIR/summary.json: per layer, discrepancy
before / after its switch, backend, switch step.
"""

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys

# Wire names of the metrics plotted (docs/agent.md, the metric catalogue).
LIVE_DQ = "live_dq_discrepancy"
GPROJ_DQ = "gproj_dq_discrepancy"
RATIO = "key_offset_spread_ratio_median"
DEFAULT_RULE_THRESHOLD = 0.05


class RunRecord:
    """What a report is drawn from: samples, switches and losses of one run."""

    def __init__(self):
        self.samples = []   # dicts: step, layer, name, backend, metrics
        self.switches = []  # dicts: step, layer, name, backend, source
        self.losses = []    # dicts: step, loss, grad_norm
        self.names = {}     # layer index -> name
        self._sample_keys = set()
        self._loss_steps = set()

    def layers(self):
        return sorted(set(self.names) | {s["layer"] for s in self.samples})

    def add_sample(self, sample):
        key = (sample["step"], sample["layer"])
        if key in self._sample_keys:
            return
        self._sample_keys.add(key)
        self.samples.append(sample)
        self.names.setdefault(sample["layer"], sample.get("name", f"attn.{sample['layer']}"))

    def add_loss(self, item):
        if item["step"] not in self._loss_steps:
            self._loss_steps.add(item["step"])
            self.losses.append(item)

    def add_switch(self, switch):
        key = (switch["step"], switch["layer"], switch["backend"])
        if any((s["step"], s["layer"], s["backend"]) == key for s in self.switches):
            return
        self.switches.append(switch)


def backend_at(history, step):
    """The backend a layer's backward ran at `step`, from its [step, backend] history."""
    current = history[0][1] if history else "stock"
    for at, backend in history:
        if at <= step:
            current = backend
    return current


def read_stats(record, path):
    stats = json.loads(pathlib.Path(path).read_text())
    for i, layer in enumerate(stats.get("layers", [])):
        record.names[i] = layer.get("name", f"attn.{i}")
        history = layer.get("history", [])
        for step, backend in history[1:]:
            record.add_switch({"step": step, "layer": i, "name": record.names[i], "backend": backend,
                               "source": "stats"})
        latest = layer.get("latest") or {}
        if "step" in latest:
            metrics = {k: v for k, v in latest.items() if k != "step"}
            metrics = metrics.get("metrics", metrics)
            record.add_sample({"step": latest["step"], "layer": i, "name": record.names[i],
                               "backend": backend_at(history, latest["step"]), "metrics": metrics})
    return stats


def read_trace(record, path):
    for line in pathlib.Path(path).read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        kind = item.pop("kind", None)
        if kind == "sample":
            record.add_sample(item)
        elif kind == "switch":
            record.add_switch({**item, "source": item.get("source", "stats")})
        elif kind == "train":
            record.add_loss(item)


def read_train_log(record, path):
    for line in pathlib.Path(path).read_text().splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue  # the trainer's other output
        if isinstance(item, dict) and "step" in item and "loss" in item:
            record.add_loss(item)


def read_agent(record, ctl, socket, run_id):
    """The agent's switch decisions for the run and their acknowledgements
    (`gaugewatchctl history --audit --json`); each acknowledged switch becomes
    a switch event at the step the trainer applied it. Returns the history, or
    None when the agent cannot be reached."""
    result = subprocess.run([str(ctl), "--socket", str(socket), "--json", "history", "--run", run_id, "--audit"],
                            capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        print(f"report: the agent's history is not available ({result.stderr.strip()})", file=sys.stderr)
        return None
    history = json.loads(result.stdout or "{}")
    decisions = {d["decision_id"]: d for d in history.get("decisions", [])}
    sent = {a["command_id"]: a.get("decision_id") for a in history.get("audit", [])
            if a.get("kind") == "AUDIT_KIND_COMMAND_SENT"}
    for ack in history.get("audit", []):
        if ack.get("kind") != "AUDIT_KIND_COMMAND_ACKED":
            continue
        decision = decisions.get(sent.get(ack.get("command_id")))
        applied = re.fullmatch(r"step (\d+)", ack.get("detail", ""))
        if decision is None or applied is None:
            continue
        backend = decision.get("backend", "").removeprefix("BACKEND_").lower()
        for layer in decision.get("target", {}).get("layers", []):
            record.add_switch({"step": int(applied.group(1)), "layer": layer,
                               "name": record.names.get(layer, f"attn.{layer}"), "backend": backend,
                               "source": "agent"})
    return history


def summarize(record):
    """Per layer: median live dQ discrepancy before and after its first switch,
    the backend it ended on, the switch step."""
    rows = []
    for layer in record.layers():
        samples = sorted((s for s in record.samples if s["layer"] == layer), key=lambda s: s["step"])
        switches = sorted((s for s in record.switches if s["layer"] == layer), key=lambda s: s["step"])
        switched_at = switches[0]["step"] if switches else None
        backend = switches[-1]["backend"] if switches else (samples[-1]["backend"] if samples else "stock")

        def median(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        before = median(s["metrics"].get(LIVE_DQ) for s in samples if switched_at is None or s["step"] < switched_at)
        after = median(s["metrics"].get(LIVE_DQ) for s in samples if switched_at is not None and
                       s["step"] >= switched_at)
        rows.append({"layer": layer, "name": record.names.get(layer, f"attn.{layer}"), "backend": backend,
                     "switched_at_step": switched_at, "live_dq_before": before, "live_dq_after": after,
                     "gproj_dq": median(s["metrics"].get(GPROJ_DQ) for s in samples),
                     "offset_spread_ratio": median(s["metrics"].get(RATIO) for s in samples),
                     "samples": len(samples)})
    return rows


def format_table(rows):
    def pct(x):
        return "-" if x is None else f"{100 * x:.2f}%"

    lines = [f"{'layer':<14}{'samples':>8}{'dQ err before':>15}{'dQ err after':>14}{'gproj dQ':>10}"
             f"{'offset/spread':>15}  {'backend':<8}switched at"]
    for r in rows:
        ratio = "-" if r["offset_spread_ratio"] is None else f"{r['offset_spread_ratio']:.1f}"
        at = "-" if r["switched_at_step"] is None else f"step {r['switched_at_step']}"
        lines.append(f"{r['layer']:>2} {r['name']:<11}{r['samples']:>8}{pct(r['live_dq_before']):>15}"
                     f"{pct(r['live_dq_after']):>14}{pct(r['gproj_dq']):>10}{ratio:>15}  {r['backend']:<8}{at}")
    return "\n".join(lines)


def plot(record, out_dir, title="gaugewatch: live monitor"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    layers = record.layers()
    colors = {layer: plt.cm.tab10(i % 10) for i, layer in enumerate(layers)}
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), constrained_layout=True)
    fig.suptitle(title)
    panels = [(axes[0][0], LIVE_DQ, "live backward: dQ discrepancy vs FP32"),
              (axes[0][1], GPROJ_DQ, "GProj on the same samples: dQ discrepancy"),
              (axes[1][0], RATIO, "key offset / spread (median over rows)")]
    for ax, metric, label in panels:
        for layer in layers:
            points = sorted((s["step"], s["metrics"].get(metric)) for s in record.samples
                            if s["layer"] == layer and s["metrics"].get(metric) is not None)
            if not points:
                continue
            steps, values = zip(*points)
            if metric != RATIO:
                values = [100.0 * v for v in values]
            ax.plot(steps, values, marker="o", markersize=3, linewidth=1.2, color=colors[layer],
                    label=record.names.get(layer, f"attn.{layer}"))
        for switch in record.switches:
            ax.axvline(switch["step"], color=colors.get(switch["layer"], "gray"), linestyle="--", linewidth=1)
        if metric == LIVE_DQ:
            ax.axhline(100 * DEFAULT_RULE_THRESHOLD, color="red", linestyle=":", linewidth=1,
                       label="default rule: 5% x3 -> gproj")
            by_step = {}
            for switch in record.switches:  # one label per step and backend
                by_step.setdefault((switch["step"], switch["backend"]), []).append(
                    record.names.get(switch["layer"], f"attn.{switch['layer']}"))
            for (step, backend), names in sorted(by_step.items()):
                ax.annotate(f"{', '.join(sorted(set(names)))} -> {backend}", xy=(step, 0.98),
                            xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("%" if metric != RATIO else "ratio")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    ax = axes[1][1]
    if record.losses:
        losses = sorted(record.losses, key=lambda x: x["step"])
        ax.plot([x["step"] for x in losses], [x["loss"] for x in losses], color="black", label="loss")
        ax.set_ylabel("loss")
        if any("grad_norm" in x for x in losses):
            twin = ax.twinx()
            twin.plot([x["step"] for x in losses if "grad_norm" in x],
                      [x["grad_norm"] for x in losses if "grad_norm" in x], color="tab:gray", alpha=0.6,
                      linewidth=0.8, label="gradient norm")
            twin.set_ylabel("gradient norm (before clipping)")
        for switch in record.switches:
            ax.axvline(switch["step"], color=colors.get(switch["layer"], "gray"), linestyle="--", linewidth=1)
        ax.set_title("training loss", fontsize=10)
    else:
        ax.text(0.5, 0.5, "no training log given (--train-log)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("training loss", fontsize=10)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    path = out_dir / "monitor.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stats")
    p.add_argument("--trace")
    p.add_argument("--train-log")
    p.add_argument("--socket", help="agent unix socket: add its switch decisions (with --run)")
    p.add_argument("--run", help="run id for --socket (default: the stats file's)")
    p.add_argument("--ctl", default=str(pathlib.Path(__file__).resolve().parents[1] / "build" / "bin" /
                                        "gaugewatchctl"))
    p.add_argument("--out", required=True)
    p.add_argument("--title")
    args = p.parse_args(argv)
    if not args.stats and not args.trace:
        p.error("give --stats FILE and/or --trace FILE")
    record = RunRecord()
    run_id = args.run
    if args.stats:
        stats = read_stats(record, args.stats)
        run_id = run_id or stats.get("run_id")
    if args.trace:
        read_trace(record, args.trace)
    if args.train_log:
        read_train_log(record, args.train_log)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.socket:
        if not run_id:
            p.error("--socket needs --run (or a stats file that names the run)")
        history = read_agent(record, args.ctl, args.socket, run_id)
        if history is not None:
            (out / "agent_history.json").write_text(json.dumps(history, indent=2) + "\n")
    rows = summarize(record)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    path = plot(record, out, title=args.title or f"gaugewatch: run {run_id or '(unnamed)'}")
    print(format_table(rows))
    print(f"\nwrote {path}\n      {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
