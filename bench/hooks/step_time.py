"""Step time of a small GPT with and without libgaugewatch_hooks: (1) no
library, (2) interception only (GAUGEWATCH_SAMPLE_EVERY=0), (3) sampling at
the defaults (every 100 steps, a quarter of the layers, 2% budget, CUDA event
timing), (4) the same with CUPTI timing (GAUGEWATCH_TIMING=cupti, opt-in).

Method (resolves differences well below the ~2% drift between processes and
over time that a few long runs per variant showed on the H200):
- every variant runs in --procs processes (LD_PRELOAD), all started at once
  and kept alive; each is warmed up (--warmup steps) once;
- then --rounds rounds; in each round every variant runs one short burst
  (--burst-warmup steps not timed, then --burst timed steps), in a rotating
  order (ABC, BCA, CAB, ...), the process of a variant alternating between
  rounds; the other processes idle meanwhile (one runs at a time);
- per round, each variant's overhead is paired with the no-library burst of
  the same round (medians of the bursts; also means, which include the rare
  sampled step); the result is the median over rounds of these paired
  differences, with a bootstrap 95% interval of that median (resampling the
  rounds) and the min / max. Drift slower than a round cancels in the pairs;
  process-level offsets average over --procs processes per variant.
- --rounds 0 (default) runs rounds for --budget-s seconds (default 150 s on
  CUDA, 25 s on the CPU; at least 10 rounds).

    .venv/bin/python bench/hooks/step_time.py --out bench/results/hooks_cpu.json   # CPU, here
    python3 bench/hooks/step_time.py --out bench/results/hooks_h200.json          # GPU

The device defaults to cuda when a GPU is visible; the model then defaults to
a GPT-2-small-like shape (dim 1024, 16 heads, 12 layers, seq 1024, batch 8),
on the CPU to a small one (dim 256, 4 heads, 4 layers, seq 128, batch 4).

JSON: results.<variant> keeps the earlier keys (median_ms, mean_ms, steps,
overhead_median_pct, overhead_mean_pct, *_last_round: one process's library
stats); overhead_median_pct / overhead_mean_pct are now the paired
estimates; the pooled ones are overhead_pooled_median_pct /
overhead_pooled_mean_pct; "paired" holds the per-round differences, the
bootstrap interval and min / max, "resolution_pct" the interval's half
width, and "targets" whether the interval lies below the 0.5% (interception)
/ 2% (sampling) targets.

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
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import paired_rounds  # noqa: E402

WORKER = r"""
import torch, torch.nn.functional as F
from torch import nn
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

def step():
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[:, :-1]).float().reshape(-1, V), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0

def stats():
    try:
        return json.loads(torch.ops.gaugewatch_hooks.stats())
    except Exception:
        return None

"""

CONFIGS = {
    "no_library": None,
    "interception_only": {"GAUGEWATCH_SAMPLE_EVERY": "0"},
    "sampling_defaults": {},
    # The defaults but the sampled backwards timed by CUPTI (opt-in): what
    # CUPTI's instrumentation costs the process once it has been used.
    "sampling_cupti": {"GAUGEWATCH_TIMING": "cupti"},
}


def worker(name, args, lib):
    """A process of variant `name`: the hooks library preloaded unless the variant is no_library."""
    extra = CONFIGS[name]
    spec = {k: getattr(args, k) for k in ("device", "dtype", "dim", "heads", "layers", "seq", "batch", "threads",
                                          "warmup")}
    env = paired_rounds.clean_env()
    if extra is not None:
        env = {**paired_rounds.hooked_env(name, extra), "LD_PRELOAD": str(lib)}
    return paired_rounds.Worker(name, WORKER, spec, env, hooked=extra is not None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--dim", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--batch", type=int)
    paired_rounds.add_arguments(p, ROOT)
    p.set_defaults(procs=2, warmup=20)
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

    if args.burst is None:
        args.burst = 25 if args.device == "cuda" else 10
    if args.budget_s is None:
        args.budget_s = 150.0 if args.device == "cuda" else 25.0
    started = time.monotonic()
    # CUPTI times CUDA kernels only: no such variant on the CPU.
    names = [n for n in CONFIGS if args.device == "cuda" or n != "sampling_cupti"]
    workers = {name: [worker(name, args, lib) for _ in range(args.procs)] for name in names}
    paired_rounds.wait_ready(workers)
    print(f"started {len(names) * args.procs} processes in {time.monotonic() - started:.1f} s; rounds of "
          f"{args.burst} timed steps per variant " + (f"x {args.rounds}" if args.rounds else
                                                       f"for {args.budget_s:.0f} s (at least 10 rounds)"),
          flush=True)

    bursts = paired_rounds.run_rounds(workers, args, run_started=started)
    times = {name: [t for burst in bursts[name] for t in burst] for name in names}
    rounds = len(bursts["no_library"])
    last_stats = {}
    samples_total = {}
    for name in names:
        for w in workers[name]:
            s = w.quit()
            last_stats[name] = s
            if s:
                samples_total[name] = samples_total.get(name, 0) + s["samples_submitted"]

    base = statistics.median(times["no_library"])
    base_mean = statistics.fmean(times["no_library"])
    targets = {"interception_only": 0.5, "sampling_defaults": 2.0}
    rows = {}
    for name in names:
        med = statistics.median(times[name])
        mean = statistics.fmean(times[name])
        rows[name] = {"median_ms": 1e3 * med, "mean_ms": 1e3 * mean, "steps": len(times[name]),
                      "overhead_pooled_median_pct": paired_rounds.pct(med, base),
                      "overhead_pooled_mean_pct": paired_rounds.pct(mean, base_mean)}
        if name != "no_library":
            paired_median = paired_rounds.paired(bursts, name, "no_library")
            paired_mean = paired_rounds.paired(bursts, name, "no_library", of=statistics.fmean)
            rows[name]["overhead_median_pct"] = paired_median["median_pct"]
            rows[name]["overhead_mean_pct"] = paired_mean["median_pct"]
            rows[name]["paired"] = {"of_burst_medians": paired_median, "of_burst_means": paired_mean}
            rows[name]["resolution_pct"] = paired_median["resolution_pct"]
            target = targets.get(name)
            if target is not None:
                rows[name]["targets"] = {
                    "target_pct": target,
                    "median_below": paired_median["median_pct"] < target,
                    "ci95_below": paired_median["ci95_pct"][1] < target and paired_mean["ci95_pct"][1] < target,
                    "resolved_below_0_5_pct": paired_median["resolution_pct"] < 0.5}
        else:
            rows[name]["overhead_median_pct"] = 0.0
            rows[name]["overhead_mean_pct"] = 0.0
        s = last_stats.get(name)
        if s:
            rows[name]["samples_total"] = samples_total.get(name, 0)
            rows[name]["samples_last_round"] = s["samples_submitted"]
            rows[name]["audit_ms_total_last_round"] = s["audit_us_total"] / 1e3
            rows[name]["audits_skipped_budget_last_round"] = s["audits_skipped_budget"]
            # The library's whole account of one process (backends that ran,
            # fallbacks, audit skips and their reasons): a variant that shows no
            # samples says why here.
            rows[name]["stats_last_round"] = {k: v for k, v in s.items() if k != "layers"}
            rows[name]["layers_last_round"] = [{k: v for k, v in layer.items() if k != "history"}
                                               for layer in s.get("layers", [])][:4]
            if name == "sampling_defaults" and samples_total.get(name, 0) == 0:
                print(f"warning: {name} submitted no samples; skipped audits by reason: "
                      f"{s.get('audits_skipped_reasons')}, over budget: {s['audits_skipped_budget']}",
                      file=sys.stderr, flush=True)
    for name in names[1:]:
        p = rows[name]["paired"]["of_burst_medians"]
        print(f"{name}: {p['median_pct']:+.3f}% [95% {p['ci95_pct'][0]:+.3f}, {p['ci95_pct'][1]:+.3f}] "
              f"(min {p['min_pct']:+.2f}, max {p['max_pct']:+.2f}; means {rows[name]['overhead_mean_pct']:+.3f}%)",
              flush=True)
    args.rounds = rounds
    args.wall_s = time.monotonic() - started
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
