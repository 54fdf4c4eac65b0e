"""The example GPT with layers in the attention-sink regime, trained five ways
with the same seed, initial weights and data order:

  a  fp32_math           attention in FP32 by SDPA's math backend (no hooks): the reference
  b  stock_monitored     BF16, hooks loaded, sampling, no agent: stock backward, never switched
  c  stock_default_rule  BF16, hooks + a gaugewatch-agent with its default rule (5% x3 -> gproj)
  d  center              BF16, every layer's backward on `center` (GAUGEWATCH_BACKEND=center)
  e  pivot               BF16, every layer's backward on `pivot`

Measured in the experiment (not by the monitor), every --measure-every
steps: per layer, the live backward's dQ / dK / dV error against FP64 on that
step's own operands (q, k, v, dO recorded by a TorchFunctionMode around
F.scaled_dot_product_attention, the gradients the live backward returned
read by tensor hooks; _attention_probe.py); the weight-gradient cosine, from
the same weights and batch, to (a)'s attention (FP32 math) and to the exact
backward (the same BF16 forward, attention gradient in FP64): overall and
per layer's qkv weight. Every step: loss and gradient norm. Each
configuration runs in its own process (the hooks library's configuration is
per process); the hooks' stats say which backwards ran.

    python bench/experiments/sink_backends.py                # GPU: config gpu, 120 steps (~3 min on an H200)
    .venv/bin/python bench/experiments/sink_backends.py --tiny   # CPU, seconds: the test's configuration
    ... [--configs a,b,c,d,e] [--steps N] [--measure-every K] [--out DIR] [--device cpu|cuda]

Writes into --out (default $GAUGEWATCH_BENCH_OUT, else bench/results):
sink_backends-<device>-<date>.json, .md (summary) and -errors.png,
-training.png; and configuration b's last step's operands of the middle
sink layer (batch element 0) as a gaugewatch capture file
(capture-stock_monitored-layer<i>-step<s>.safetensors) for `tools/replay_capture.py --input FILE` and
`gaugewatch audit --input FILE`. Needs the build (GAUGEWATCH_BUILD_DIR, default build/):
lib/libgaugewatch_hooks.so, and bin/gaugewatch-agent for (c) (skipped, and
said so, without it).
"""

import argparse
import json
import math
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "examples"))

CONFIGS = {
    "a": {"name": "fp32_math", "hooks": False},
    "b": {"name": "stock_monitored", "hooks": True, "backend": "stock"},
    "c": {"name": "stock_default_rule", "hooks": True, "backend": "stock", "agent": True},
    "d": {"name": "center", "hooks": True, "backend": "center"},
    "e": {"name": "pivot", "hooks": True, "backend": "pivot"},
}
# Dense sampling so that the default rule acts within the run (the hooks'
# defaults sample one step in 100).
SAMPLING = {"GAUGEWATCH_SAMPLE_EVERY": "2", "GAUGEWATCH_LAYER_FRACTION": "1", "GAUGEWATCH_OVERHEAD_BUDGET": "0.25"}


def build_dir():
    return pathlib.Path(os.environ.get("GAUGEWATCH_BUILD_DIR", ROOT / "build")).resolve()


# --- one configuration, in its own process ---------------------------------------------------

def cosine(a, b):
    return float((a.double() * b.double()).sum() / (a.double().norm() * b.double().norm()).clamp_min(1e-300))


def gradients(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def reference_gradients(model, x, y, dtype, attend):
    import torch
    import sink_gpt
    from _attention_probe import ReplaceAttention
    model.zero_grad(set_to_none=True)
    with ReplaceAttention(attend):
        sink_gpt.loss_of(model, x, y, dtype).backward()
    return gradients(model)


def compare(live, ref, layers):
    import torch
    names = sorted(live)
    overall = cosine(torch.cat([live[n].flatten().float() for n in names]),
                     torch.cat([ref[n].flatten().float() for n in names]))
    per_layer = [cosine(live[f"blocks.{i}.attn.qkv.weight"], ref[f"blocks.{i}.attn.qkv.weight"])
                 for i in range(layers)]
    # The query rows of the qkv weight: their gradient is x^T dQ, where a dQ error lands.
    dim = live["blocks.0.attn.qkv.weight"].shape[1]
    query_rows = [cosine(live[f"blocks.{i}.attn.qkv.weight"][:dim], ref[f"blocks.{i}.attn.qkv.weight"][:dim])
                  for i in range(layers)]
    return {"overall": overall, "qkv_weight": per_layer, "query_weight": query_rows}


def worker(spec):
    import torch
    import sink_gpt
    from _attention_probe import (AttentionProbe, ReplaceAttention, errors_against_fp64, exact_backward_attention,
                                  fp32_math_attention, save_capture)
    config = dict(sink_gpt.CONFIGS[spec["model"]])
    config.update(spec["overrides"])
    device = spec["device"]
    if device == "cpu":
        torch.set_num_threads(spec["threads"])
    if spec["hooks"]:
        torch.ops.load_library(str(build_dir() / "lib" / "libgaugewatch_hooks.so"))
    model, data = sink_gpt.build(config, device, seed=spec["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.0)
    dtype = torch.bfloat16
    probe = AttentionProbe()
    live_attention = ReplaceAttention(fp32_math_attention) if spec["fp32_math"] else None

    def emit(item):
        print(json.dumps(item), flush=True)

    with probe:
        for step in range(config["steps"]):
            start = time.perf_counter()
            x, y = (t.to(device) for t in data.next_batch())
            measure = step % spec["measure_every"] == 0 or step == config["steps"] - 1
            probe.armed = measure
            optimizer.zero_grad(set_to_none=True)
            if live_attention:
                with live_attention:
                    loss = sink_gpt.loss_of(model, x, y, dtype)
                    loss.backward()
            else:
                loss = sink_gpt.loss_of(model, x, y, dtype)
                loss.backward()
            if measure:
                calls = probe.take()
                errors = [errors_against_fp64(c) for c in calls]
                if spec.get("capture_dir") and step == config["steps"] - 1 and config["sink_layers"]:
                    # The stock backward's operands of the middle sink layer, batch element 0
                    # (a few MB on the GPU configuration), for tools/replay_capture.py.
                    i = config["sink_layers"][len(config["sink_layers"]) // 2]
                    first = {k: (v[:1] if isinstance(v, torch.Tensor) else v) for k, v in calls[i].items()}
                    save_capture(pathlib.Path(spec["capture_dir"]) / f"capture-{spec['name']}-layer{i}-step{step}"
                                 ".safetensors", first)
                live = gradients(model)
                to_fp32 = (compare(live, reference_gradients(model, x, y, dtype, fp32_math_attention),
                                   config["layers"]) if not spec["fp32_math"] else None)
                to_exact = compare(live, reference_gradients(model, x, y, dtype, exact_backward_attention),
                                   config["layers"])
                for name, p in model.named_parameters():  # the live gradients take the step
                    p.grad = live.get(name)
                emit({"measure": step, "layers": errors, "cos_to_fp32_math": to_fp32, "cos_to_exact_backward":
                      to_exact})
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            emit({"step": step, "loss": loss.item(), "grad_norm": grad_norm.item(),
                  "step_ms": 1e3 * (time.perf_counter() - start)})
    stats = None
    if spec["hooks"]:
        torch.ops.gaugewatch_hooks.flush(5.0)
        stats = json.loads(torch.ops.gaugewatch_hooks.stats())
    emit({"done": True, "stats": stats, "config": {**config, "sink_layers": list(config["sink_layers"])}})


# --- the driver --------------------------------------------------------------------------------

def start_agent(workdir):
    binary = build_dir() / "bin" / "gaugewatch-agent"
    if not binary.exists():
        return None, f"{binary} not built"
    log_path = workdir / "agent.log"
    proc = subprocess.Popen([str(binary), "--grpc-socket", str(workdir / "agent.sock"), "--http-listen",
                             "127.0.0.1:0", "--database", str(workdir / "agent.db")],
                            stdout=open(log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "ready" not in log_path.read_text() and proc.poll() is None:
        time.sleep(0.05)
    if "ready" not in log_path.read_text():
        proc.kill()
        return None, f"the agent did not start: {log_path.read_text()[-500:]}"
    return proc, None


def run_config(key, args, workdir):
    spec_base = CONFIGS[key]
    spec = {"model": args.model, "overrides": args.overrides, "device": args.device, "threads": args.threads,
            "seed": args.seed, "measure_every": args.measure_every, "hooks": spec_base["hooks"],
            "fp32_math": key == "a", "name": spec_base["name"],
            "capture_dir": str(args.out_dir) if key == "b" else None}
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUGEWATCH_") and k != "LD_PRELOAD"}
    env["GAUGEWATCH_BUILD_DIR"] = str(build_dir())
    agent = None
    if spec_base["hooks"]:
        if not (build_dir() / "lib" / "libgaugewatch_hooks.so").exists():
            return {"skipped": f"{build_dir() / 'lib' / 'libgaugewatch_hooks.so'} not built"}
        env.update(SAMPLING)
        env["GAUGEWATCH_RUN_ID"] = f"sink-{spec_base['name']}"
        env["GAUGEWATCH_BACKEND"] = spec_base["backend"]
        env["GAUGEWATCH_SOCKET"] = "none"
        if spec_base.get("agent"):
            agent, why = start_agent(workdir)
            if agent is None:
                return {"skipped": why}
            env["GAUGEWATCH_SOCKET"] = str(workdir / "agent.sock")
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                                capture_output=True, text=True, timeout=args.config_timeout_s)
    finally:
        if agent is not None:
            os.killpg(agent.pid, signal.SIGTERM)
            agent.wait(15)
    if result.returncode != 0:
        return {"failed": f"exit {result.returncode}", "stderr": result.stderr[-4000:]}
    steps, measures, done = [], [], {}
    for line in result.stdout.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "measure" in item:
            measures.append(item)
        elif "step" in item:
            steps.append(item)
        elif item.get("done"):
            done = item
    out = {"name": spec_base["name"], "steps": steps, "measures": measures, "config": done.get("config"),
           "wall_s": time.monotonic() - started, "hooks_log_tail": result.stderr[-2000:]}
    stats = done.get("stats")
    if stats:
        out["hooks"] = {k: stats.get(k) for k in ("backward_calls", "fallbacks", "samples_submitted",
                                                   "audits_skipped_budget", "audits_skipped_reasons",
                                                   "cuda_backends", "commands_applied", "reporter")}
        out["hooks"]["layers"] = [{"name": layer["name"], "history": layer["history"],
                                   "latest_live_dq": (layer.get("latest") or {}).get("live_dq_discrepancy")}
                                  for layer in stats.get("layers", [])]
        wanted = spec_base["backend"]
        ran = stats.get("backward_calls") or {}
        if wanted != "stock" and not ran.get(wanted):
            out["backend_not_run"] = f"asked for {wanted}, the hooks ran {ran} (fallbacks {stats.get('fallbacks')})"
    return out


def median(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else None


def summarize(results, sink_layers):
    rows = {}
    for key, r in results.items():
        if "steps" not in r:
            rows[key] = {k: v for k, v in r.items() if k != "stderr"}
            continue
        losses = [s["loss"] for s in r["steps"]]
        tail = losses[-max(1, len(losses) // 10):]
        layers = len(r["measures"][0]["layers"]) if r["measures"] else 0
        sink = [i for i in range(layers) if i in sink_layers]
        other = [i for i in range(layers) if i not in sink_layers]
        last = r["measures"][-1] if r["measures"] else None

        def err(which, subset, measures):
            return median([m["layers"][i][which] for m in measures for i in subset])

        rows[key] = {
            "name": r["name"], "final_loss_mean_last_10pct": statistics.fmean(tail),
            "grad_norm_median": median([s["grad_norm"] for s in r["steps"]]),
            "step_ms_median": median([s["step_ms"] for s in r["steps"]]),
            "dq_error_sink_layers_median": err("dq_error", sink, r["measures"]),
            "dq_error_other_layers_median": err("dq_error", other, r["measures"]),
            "dk_error_sink_layers_median": err("dk_error", sink, r["measures"]),
            "dq_error_sink_layers_last": err("dq_error", sink, [last]) if last else None,
            "dq_error_all_layers_last_max": max(m["dq_error"] for m in last["layers"]) if last else None,
            "cos_to_fp32_math_median": median([m["cos_to_fp32_math"]["overall"] for m in r["measures"]
                                               if m["cos_to_fp32_math"]]),
            "cos_to_exact_backward_median": median([m["cos_to_exact_backward"]["overall"] for m in r["measures"]]),
            "cos_query_weight_sink_to_exact_backward_median": median(
                [m["cos_to_exact_backward"]["query_weight"][i] for m in r["measures"] for i in sink]),
            "switches": [[layer["name"], layer["history"]] for layer in r.get("hooks", {}).get("layers", [])
                         if len(layer["history"]) > 1],
            "backend_not_run": r.get("backend_not_run"),
        }
    return rows


def pct(x):
    return "-" if x is None else f"{100 * x:.3g}%"


def markdown(report):
    rows = report["summary"]
    lines = [f"# Sink-regime GPT, five backward configurations ({report['device']}, {report['date']})", "",
             f"Model `{report['model']}` {json.dumps(report['model_config'])}; seed {report['seed']}, same data "
             f"order in every configuration; measured every {report['measure_every']} steps. torch "
             f"{report['machine'].get('torch')}, {report['machine'].get('gpu') or report['machine'].get('cpu_model')}.",
             "", "Errors: live backward against FP64 on that step's own operands (median over measured steps and "
             "layers). Cosines: whole weight gradient, from the same weights and batch.", "",
             "| config | loss (last 10%) | grad norm | dQ err sink layers | dQ err other layers | dK err sink | "
             "max dQ err at end | cos to (a) FP32 math | cos to exact backward | query-weight cos, sink layers (exact) | "
             "step ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in rows.items():
        if "name" not in r or "final_loss_mean_last_10pct" not in r:
            lines.append(f"| {key} {CONFIGS[key]['name']} | {r.get('skipped') or r.get('failed')} |||||||||")
            continue
        cos_a = "-" if r["cos_to_fp32_math_median"] is None else f"{r['cos_to_fp32_math_median']:.6f}"
        lines.append(
            f"| {key} {r['name']} | {r['final_loss_mean_last_10pct']:.4f} | {r['grad_norm_median']:.3f} | "
            f"{pct(r['dq_error_sink_layers_median'])} | {pct(r['dq_error_other_layers_median'])} | "
            f"{pct(r['dk_error_sink_layers_median'])} | {pct(r['dq_error_all_layers_last_max'])} | {cos_a} | "
            f"{r['cos_to_exact_backward_median']:.6f} | {r['cos_query_weight_sink_to_exact_backward_median']:.6f} | "
            f"{r['step_ms_median']:.1f} |")
    lines.append("")
    for key, r in rows.items():
        if r.get("switches"):
            lines.append(f"- {key}: switches (layer, [step, backend] history): {r['switches']}")
        if r.get("backend_not_run"):
            lines.append(f"- {key}: NOT the asked backend: {r['backend_not_run']}")
    lines.append("")
    return "\n".join(lines)


def plots(report, out_prefix):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    results = {k: r for k, r in report["results"].items() if "steps" in r}
    colors = {"a": "black", "b": "tab:red", "c": "tab:orange", "d": "tab:green", "e": "tab:blue"}
    sink = set(report["model_config"]["sink_layers"])
    paths = []
    # Per-layer dQ error at each measured step, one panel per configuration.
    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.8), sharey=True, squeeze=False,
                             constrained_layout=True)
    for ax, (key, r) in zip(axes[0], results.items()):
        layers = len(r["measures"][0]["layers"]) if r["measures"] else 0
        for i in range(layers):
            ax.plot([m["measure"] for m in r["measures"]], [100 * m["layers"][i]["dq_error"] for m in r["measures"]],
                    marker="o", markersize=3, linewidth=1.5 if i in sink else 0.8,
                    linestyle="-" if i in sink else "--", label=f"layer {i}" + (" (sink)" if i in sink else ""))
        ax.set_yscale("log")
        ax.set_title(f"({key}) {r['name']}" + (" (NOT run: see the summary)" if r.get("backend_not_run") else ""),
                     fontsize=10)
        ax.set_xlabel("step")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("live dQ error vs FP64 (%)")
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.suptitle("per-layer dQ error of the live backward against FP64 on each step's own operands")
    path = pathlib.Path(f"{out_prefix}-errors.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
    # Loss, gradient norm, weight-gradient cosines.
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    for key, r in results.items():
        label = f"({key}) {r['name']}"
        steps = [s["step"] for s in r["steps"]]
        axes[0][0].plot(steps, [s["loss"] for s in r["steps"]], color=colors[key], linewidth=1, label=label)
        axes[0][1].plot(steps, [s["grad_norm"] for s in r["steps"]], color=colors[key], linewidth=1, label=label)
        ms = [m["measure"] for m in r["measures"]]
        if key != "a":
            axes[1][0].plot(ms, [1 - m["cos_to_fp32_math"]["overall"] for m in r["measures"]], marker="o",
                            color=colors[key], label=label)
        axes[1][1].plot(ms, [1 - statistics.median(m["cos_to_exact_backward"]["query_weight"][i] for i in sink)
                             for m in r["measures"]], marker="o", color=colors[key], label=label)
    for ax, title, log in ((axes[0][0], "loss", False), (axes[0][1], "gradient norm (before clipping)", False),
                           (axes[1][0], "1 - cosine of the weight gradient to (a) FP32-math attention", True),
                           (axes[1][1], "sink layers' query weights: 1 - cosine of the gradient to the exact backward", True)):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if log:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    path = pathlib.Path(f"{out_prefix}-training.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
    return paths


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help="the tiny model on the CPU, 6 steps: seconds")
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--configs", default="a,b,c,d,e")
    p.add_argument("--steps", type=int)
    p.add_argument("--measure-every", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--config-timeout-s", type=float, default=300)
    p.add_argument("--out")
    args = p.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))

    import torch
    if args.device is None:
        args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    args.model = "tiny" if args.tiny else ("gpu" if args.device == "cuda" else "cpu")
    defaults = {"tiny": (6, 3), "cpu": (40, 10), "gpu": (120, 20)}[args.model]
    args.overrides = {"steps": args.steps or defaults[0]}
    args.measure_every = args.measure_every or defaults[1]
    out_dir = pathlib.Path(args.out or os.environ.get("GAUGEWATCH_BENCH_OUT") or ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    args.out_dir = out_dir
    started = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="gw-sink-", dir="/tmp") as tmp:
        for key in args.configs.split(","):
            print(f"[sink_backends] ({key}) {CONFIGS[key]['name']} ...", flush=True)
            results[key] = run_config(key, args, pathlib.Path(tmp))
            r = results[key]
            state = r.get("skipped") or r.get("failed") or (f"{len(r['steps'])} steps, {len(r['measures'])} "
                                                           f"measurements in {r['wall_s']:.0f} s")
            print(f"[sink_backends] ({key}) {state}", flush=True)
            if r.get("failed"):
                print(r["stderr"], file=sys.stderr)
    import sink_gpt
    model_config = dict(sink_gpt.CONFIGS[args.model])
    model_config.update(args.overrides)
    model_config["sink_layers"] = list(model_config["sink_layers"])
    machine = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__}
    if args.device == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(0)
    else:
        try:
            machine["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                        if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    report = {"date": time.strftime("%Y-%m-%d"), "device": args.device, "model": args.model,
              "model_config": model_config, "seed": args.seed, "measure_every": args.measure_every,
              "machine": machine, "sampling": SAMPLING, "wall_s": time.monotonic() - started, "results": results}
    report["summary"] = summarize(results, set(model_config["sink_layers"]))
    prefix = out_dir / f"sink_backends-{args.device}-{report['date']}"
    pathlib.Path(f"{prefix}.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    paths = plots(report, prefix)
    text += "\n" + "\n".join(f"![{p.name}]({p.name})" for p in paths) + "\n"
    pathlib.Path(f"{prefix}.md").write_text(text)
    print(text)
    print(f"[sink_backends] wrote {prefix}.json, .md, " + ", ".join(p.name for p in paths)
          + f" in {report['wall_s']:.0f} s")
    failed = [k for k, r in results.items() if r.get("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
