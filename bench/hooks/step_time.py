"""Step time of a small GPT with and without libgaugewatch_hooks, side by side
in one run: (1) no library, (2) interception only (GAUGEWATCH_SAMPLE_EVERY=0),
(3) sampling at the defaults (every 100 steps, a quarter of the layers, 2%
budget). Each configuration runs in its own process (LD_PRELOAD); the
configurations alternate over --rounds rounds so that drift of a shared
machine hits them alike. Reports the median step time after warm-up.

    .venv/bin/python bench/hooks/step_time.py --out bench/results/hooks_cpu.json   # CPU, here
    python3 bench/hooks/step_time.py --out bench/results/hooks_h200.json          # GPU

The device defaults to cuda when a GPU is visible; the model then defaults to
a GPT-2-small-like shape (dim 1024, 16 heads, 12 layers, seq 1024, batch 8),
on the CPU to a small one (dim 256, 4 heads, 4 layers, seq 128, batch 4).

Needs the build (build/lib/libgaugewatch_hooks.so, or --lib). No agent is
started: the reporter's cost is a queue push per sample; the audit's cost is
what this measures.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

WORKER = r"""
import json, os, sys, time
import torch, torch.nn.functional as F
from torch import nn
a = json.loads(sys.argv[1])
torch.manual_seed(0)
if a["device"] == "cpu":
    torch.set_num_threads(a["threads"])
dev, dt = a["device"], getattr(torch, a["dtype"])

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
    def forward(s, x):
        b, n, d = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, n, 3, s.h, d // s.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(b, n, d))
        return x + s.mlp(s.ln2(x))

d, L, V = a["dim"], a["layers"], 256
emb = nn.Embedding(V, d)
blocks = nn.Sequential(*[Block(d, a["heads"]) for _ in range(L)])
head = nn.Linear(d, V)
model = nn.Sequential(emb, blocks, head).to(dev, dt)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(0, V, (a["batch"], a["seq"] + 1), device=dev)
times = []
for step in range(a["steps"]):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[:, :-1]).float().reshape(-1, V), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
stats = None
try:
    stats = json.loads(torch.ops.gaugewatch_hooks.stats())
except Exception:
    pass
print(json.dumps({"times": times, "stats": stats}))
"""

CONFIGS = {
    "no_library": None,
    "interception_only": {"GAUGEWATCH_SAMPLE_EVERY": "0"},
    "sampling_defaults": {},
}


def run_config(name, args, lib):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    for key in list(env):
        if key.startswith("GAUGEWATCH_"):
            del env[key]
    extra = CONFIGS[name]
    if extra is not None:
        env["LD_PRELOAD"] = str(lib)
        env["GAUGEWATCH_SOCKET"] = "none"
        env["GAUGEWATCH_RUN_ID"] = f"bench-{name}"
        env.update(extra)
    worker_args = {k: getattr(args, k) for k in ("device", "dtype", "dim", "heads", "layers", "seq", "batch",
                                                  "steps", "threads")}
    out = subprocess.run([sys.executable, "-c", WORKER, json.dumps(worker_args)], env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if extra is not None and result["stats"] is None:
        raise SystemExit(f"{name}: the hooks library was not active:\n{out.stderr[-2000:]}")
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--dim", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--steps", type=int, default=210)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lib", default=str(pathlib.Path(os.environ.get("GAUGEWATCH_BUILD_DIR", ROOT / "build"))
                                       / "lib" / "libgaugewatch_hooks.so"))
    p.add_argument("--out")
    args = p.parse_args()
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    defaults = ({"dim": 1024, "heads": 16, "layers": 12, "seq": 1024, "batch": 8} if args.device == "cuda" else
                {"dim": 256, "heads": 4, "layers": 4, "seq": 128, "batch": 4})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    lib = pathlib.Path(args.lib)
    if not lib.exists():
        raise SystemExit(f"{lib} not found: build first or pass --lib")

    times = {name: [] for name in CONFIGS}
    last_stats = {}
    for r in range(args.rounds):
        for name in CONFIGS:
            result = run_config(name, args, lib)
            times[name].extend(result["times"][args.warmup:])
            last_stats[name] = result["stats"]
            print(f"round {r}: {name:18s} median {1e3 * statistics.median(result['times'][args.warmup:]):.2f} ms",
                  flush=True)
    base = statistics.median(times["no_library"])
    rows = {}
    for name in CONFIGS:
        med = statistics.median(times[name])
        mean = statistics.fmean(times[name])
        rows[name] = {"median_ms": 1e3 * med, "mean_ms": 1e3 * mean, "steps": len(times[name]),
                      "overhead_median_pct": 100.0 * (med / base - 1.0),
                      "overhead_mean_pct": 100.0 * (mean / statistics.fmean(times["no_library"]) - 1.0)}
        s = last_stats.get(name)
        if s:
            rows[name]["samples_last_round"] = s["samples_submitted"]
            rows[name]["audit_ms_total_last_round"] = s["audit_us_total"] / 1e3
            rows[name]["audits_skipped_budget_last_round"] = s["audits_skipped_budget"]
            # The library's whole account of the last round (backends that ran,
            # fallbacks, audit skips and their reasons): a variant that shows no
            # samples says why here.
            rows[name]["stats_last_round"] = {k: v for k, v in s.items() if k != "layers"}
            rows[name]["layers_last_round"] = [{k: v for k, v in layer.items() if k != "history"}
                                               for layer in s.get("layers", [])][:4]
            if name == "sampling_defaults" and s["samples_submitted"] == 0:
                print(f"warning: {name} submitted no samples; skipped audits by reason: "
                      f"{s.get('audits_skipped_reasons')}, over budget: {s['audits_skipped_budget']}",
                      file=sys.stderr, flush=True)
    report = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "args": vars(args),
        "results": rows,
    }
    try:
        import torch
        report["machine"]["torch"] = torch.__version__
        if args.device == "cuda":
            report["machine"]["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        report["machine"]["cpu_model"] = next(line.split(":", 1)[1].strip() for line in
                                              open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(json.dumps(report, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
