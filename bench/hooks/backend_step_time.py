"""Step time of the example GPT (examples/sink_gpt.py) with every attention
layer's backward on one backend, and the monitor's overhead at its defaults:

  no_library          no hooks library
  stock               hooks loaded, every layer stock, sampling off (interception only)
  monitor_defaults    hooks loaded, every layer stock, sampling at the defaults
                      (1 step in 100, a quarter of the layers, 2% budget)
  gproj, pivot, center  every layer's backward on that backend, sampling off

Method (bench/hooks/step_time.py's): every variant runs in --procs
long-lived processes, warmed up once; then rounds, in each of which every
variant runs one burst (--burst-warmup untimed + --burst timed steps) in a
rotating order; each variant's burst median is paired with the no_library
burst (and with the stock burst) of the same round; reported: the median
over rounds of these paired differences, a bootstrap 95% interval, min / max.

    python3 bench/hooks/backend_step_time.py                       # GPU: config gpu, ~3 min on an H200
    .venv/bin/python bench/hooks/backend_step_time.py --tiny      # CPU, seconds: the test's configuration
    ... [--budget-s S] [--rounds N] [--procs P] [--burst N] [--out FILE.json]

Writes --out, else $GAUGEWATCH_BENCH_OUT/backend_step_time-<device>-<date>.json
(and .md beside it); without either, prints only. The stats of each hooked
process say which backwards ran (a backend the build lacks runs stock and
counts in `fallbacks`: the table marks such a variant).
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

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from step_time import pct, summarize  # noqa: E402

WORKER = r"""
import json, sys, time
a = json.loads(sys.argv[1])
sys.path.insert(0, a["examples"])
import torch, sink_gpt
if a["device"] == "cpu":
    torch.set_num_threads(a["threads"])
if a["lib"]:
    torch.ops.load_library(a["lib"])
config = dict(sink_gpt.CONFIGS[a["model"]])
model, data = sink_gpt.build(config, a["device"], seed=0)
opt = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.0)
batches = [tuple(t.to(a["device"]) for t in data.next_batch()) for _ in range(8)]
count = 0

def step():
    global count
    x, y = batches[count % len(batches)]
    count += 1
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    sink_gpt.loss_of(model, x, y, torch.bfloat16).backward()
    opt.step()
    if a["device"] == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0

def stats():
    return json.loads(torch.ops.gaugewatch_hooks.stats()) if a["lib"] else None

for _ in range(a["warmup"]):
    step()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd.get("quit"):
        print(json.dumps({"stats": stats()}), flush=True)
        break
    print(json.dumps({"times": [step() for _ in range(cmd["run"])]}), flush=True)
"""

OFF = {"GAUGEWATCH_SAMPLE_EVERY": "0"}
VARIANTS = {
    "no_library": None,
    "stock": dict(OFF),
    "monitor_defaults": {},
    "gproj": {**OFF, "GAUGEWATCH_BACKEND": "gproj"},
    "pivot": {**OFF, "GAUGEWATCH_BACKEND": "pivot"},
    "center": {**OFF, "GAUGEWATCH_BACKEND": "center"},
}


class Worker:
    def __init__(self, name, args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GAUGEWATCH_") and k != "LD_PRELOAD"}
        extra = VARIANTS[name]
        lib = ""
        if extra is not None:
            lib = args.lib
            env.update({"GAUGEWATCH_SOCKET": "none", "GAUGEWATCH_RUN_ID": f"bench-{name}", **extra})
        spec = {"examples": str(ROOT / "examples"), "device": args.device, "threads": args.threads, "lib": lib,
                "model": args.model, "warmup": args.warmup}
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(spec)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1)

    def reply(self):
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(60)
            raise SystemExit(f"{self.name} failed:\n{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def run(self, steps):
        self.proc.stdin.write(json.dumps({"run": steps}) + "\n")
        return self.reply()["times"]

    def quit(self):
        self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
        stats = self.reply()["stats"]
        self.proc.stdin.close()
        self.proc.wait(60)
        return stats


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model on the CPU, 3 rounds: seconds")
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--procs", type=int, default=None, help="processes per variant (1 CUDA, 2 CPU)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--burst", type=int, default=None)
    p.add_argument("--burst-warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=0, help="0: rounds for --budget-s (at least 10)")
    p.add_argument("--budget-s", type=float, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lib", default=str(pathlib.Path(os.environ.get("GAUGEWATCH_BUILD_DIR", ROOT / "build"))
                                       / "lib" / "libgaugewatch_hooks.so"))
    p.add_argument("--out")
    args = p.parse_args()
    import torch
    if args.device is None:
        args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    args.model = "tiny" if args.tiny else ("gpu" if args.device == "cuda" else "cpu")
    cuda = args.device == "cuda"
    if args.tiny:
        args.rounds = args.rounds or 3
    args.procs = args.procs or (1 if cuda or args.tiny else 2)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.tiny else 10)
    args.burst = args.burst or (2 if args.tiny else 10 if cuda else 5)
    args.budget_s = args.budget_s or (120.0 if cuda else 40.0)
    if not pathlib.Path(args.lib).exists():
        raise SystemExit(f"{args.lib} not found: build first or pass --lib")
    names = args.variants.split(",")
    if "no_library" not in names:
        names.insert(0, "no_library")

    started = time.monotonic()
    workers = {n: [Worker(n, args) for _ in range(args.procs)] for n in names}
    for ws in workers.values():
        for w in ws:
            w.reply()
    print(f"started {len(names) * args.procs} processes in {time.monotonic() - started:.1f} s", flush=True)
    medians = {n: [] for n in names}
    means = {n: [] for n in names}
    rounds_started = time.monotonic()
    r = 0
    while True:
        if args.rounds:
            if r >= args.rounds:
                break
        elif r >= 200 or (r >= 10 and time.monotonic() - rounds_started >= args.budget_s):
            break
        for name in names[r % len(names):] + names[:r % len(names)]:
            burst = workers[name][r % args.procs].run(args.burst_warmup + args.burst)[args.burst_warmup:]
            medians[name].append(statistics.median(burst))
            means[name].append(statistics.fmean(burst))
        if r % 5 == 0:
            print(f"round {r}: " + ", ".join(f"{n} {1e3 * medians[n][-1]:.1f} ms" for n in names), flush=True)
        r += 1

    results = {}
    for name in names:
        stats = None
        for w in workers[name]:
            stats = w.quit()
        row = {"median_ms": 1e3 * statistics.median(medians[name]), "bursts": len(medians[name])}
        if name != "no_library":
            row["vs_no_library"] = summarize([pct(m, b) for m, b in zip(medians[name], medians["no_library"])])
            row["vs_no_library_of_means"] = summarize([pct(m, b) for m, b in zip(means[name], means["no_library"])])
            if "stock" in medians and name != "stock":
                row["vs_stock"] = summarize([pct(m, b) for m, b in zip(medians[name], medians["stock"])])
        if stats:
            wanted = (VARIANTS[name] or {}).get("GAUGEWATCH_BACKEND", "stock")
            row["backward_calls"] = stats.get("backward_calls")
            row["fallbacks"] = stats.get("fallbacks")
            row["samples_submitted"] = stats.get("samples_submitted")
            row["cuda_backends"] = stats.get("cuda_backends")
            row["ran_asked_backend"] = bool((stats.get("backward_calls") or {}).get(wanted))
        results[name] = row

    lines = [f"# Step time by attention backward, example GPT `{args.model}` ({args.device}, "
             f"{time.strftime('%Y-%m-%d')})", "",
             f"{r} rounds of {args.burst} timed steps per variant, {args.procs} process(es) per variant; "
             "paired with the same round's bursts; median [bootstrap 95%].", "",
             "| variant | median step ms | vs no library | vs stock (hooks loaded) | ran the asked backend |",
             "|---|---|---|---|---|"]
    for name, row in results.items():
        def fmt(key):
            s = row.get(key)
            return "-" if not s else f"{s['median_pct']:+.2f}% [{s['ci95_pct'][0]:+.2f}, {s['ci95_pct'][1]:+.2f}]"
        ran = row.get("ran_asked_backend")
        lines.append(f"| {name} | {row['median_ms']:.2f} | {fmt('vs_no_library')} | {fmt('vs_stock')} | "
                     f"{'-' if ran is None else ('yes' if ran else 'NO: ' + json.dumps(row['backward_calls']))} |")
    text = "\n".join(lines) + "\n"
    print(text)
    report = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "rounds": r, "results": results,
              "wall_s": time.monotonic() - started,
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(0) if cuda else None}}
    out = args.out
    if out is None and os.environ.get("GAUGEWATCH_BENCH_OUT"):
        out = pathlib.Path(os.environ["GAUGEWATCH_BENCH_OUT"]) / f"backend_step_time-{args.device}-{report['date']}.json"
    if out:
        out = pathlib.Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(text)
        print(f"wrote {out} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
