"""Step time of the example GPT (examples/sink_gpt.py) with every attention
layer's backward on one backend, and the monitor's overhead at its defaults:

  no_library          no hooks library
  stock               hooks loaded, every layer stock, sampling off (interception only)
  monitor_defaults    hooks loaded, every layer stock, sampling at the defaults
                      (1 step in 100, a quarter of the layers, 2% budget)
  gproj, pivot, center, bf16  every layer's backward on that backend, sampling off
                      (bf16: the fused kernel without a projection, the baseline
                      of gproj and pivot)
  gproj_key_outer     gproj's key-outer path at every head dim: its two passes
                      over the keys, both warp-specialized
                      (GAUGEWATCH_GPROJ_KERNEL=key_outer; gproj's default at
                      head dim 64)
  gproj_pair          gproj on the two-kernel pair at every head dim
                      (GAUGEWATCH_GPROJ_KERNEL=pair; gproj's default at 128)
  gproj_pass2_128     gproj's default with its second pass over 128-key
                      blocks (GAUGEWATCH_GPROJ_PASS2_KEYS=128; the default
                      is 256)
  pivot_no_ws, bf16_no_ws  pivot, bf16 on the key-outer kernel without warp
                      specialization (GAUGEWATCH_BF16_KERNEL=key_outer; their
                      default is the warp-specialized one)

Method (bench/hooks/paired_rounds.py): every variant runs in --procs
long-lived processes, warmed up once; then rounds, in each of which every
variant runs one burst (--burst-warmup untimed + --burst timed steps) in a
rotating order; each variant's burst median is paired with the no_library
burst (and with the stock burst) of the same round; reported: the median
over rounds of these paired differences, a bootstrap 95% interval, min / max.

    python3 bench/hooks/backend_step_time.py                       # GPU: config gpu, ~3 min on an H200
    python3 bench/hooks/backend_step_time.py --model gpt2_4k --deadline-s 400   # GPU-bound GPT-2 small
    .venv/bin/python bench/hooks/backend_step_time.py --tiny      # CPU, seconds: the test's configuration
    ... [--budget-s S] [--rounds N] [--procs P] [--burst N] [--deadline-s S] [--out FILE.json]
        [--variants A,B] [--profile-steps N]

--profile-steps N (default 3 on CUDA): after the rounds, N steps of each
variant's first process run under torch.profiler; the report adds each
variant's busy time per step and the kernels whose time differs most from
no_library's (where a backend's extra step time goes: its kernels, copies,
memsets).

--model: the example's configuration for the device (default; tiny with
--tiny), or a plain GPT of examples/sink_gpt.py without the sink regime on
random tokens: gpt2_4k is GPT-2 small (12 layers, 12 heads of 64, vocab
50304) at batch 4 x 4096 tokens, GPU-bound, attention's backward about a
fifth of the step; gpt2_cpu the same code path at a size for the CPU.

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
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import paired_rounds  # noqa: E402

WORKER = r"""
sys.path.insert(0, a["examples"])
import torch, sink_gpt
# Also on CUDA: the processes start at once, and each would take every core.
torch.set_num_threads(a["threads"])
if a["lib"]:
    torch.ops.load_library(a["lib"])
if a["plain"] is None:
    config = dict(sink_gpt.CONFIGS[a["model"]])
    model, data = sink_gpt.build(config, a["device"], seed=0)
    batches = [tuple(t.to(a["device"]) for t in data.next_batch()) for _ in range(8)]
else:
    config = a["plain"]
    torch.manual_seed(0)
    model = sink_gpt.GPT(config["vocab"], config["dim"], config["heads"], config["layers"], config["seq"])
    model = model.to(a["device"])
    tokens = torch.randint(0, config["vocab"], (2, config["batch"], config["seq"] + 1),
                           generator=torch.Generator().manual_seed(0))
    batches = [(t[:, :-1].to(a["device"]), t[:, 1:].to(a["device"])) for t in tokens]
opt = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.0)
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

"""

# Plain GPTs on random tokens (--model): no sink regime, no synthetic language.
PLAIN_MODELS = {
    "gpt2_4k": dict(vocab=50304, dim=768, heads=12, layers=12, seq=4096, batch=4, lr=6e-4),
    "gpt2_cpu": dict(vocab=512, dim=64, heads=2, layers=2, seq=64, batch=2, lr=6e-4),
}

OFF = {"GAUGEWATCH_SAMPLE_EVERY": "0"}
VARIANTS = {
    "no_library": None,
    "stock": dict(OFF),
    "monitor_defaults": {},
    "gproj": {**OFF, "GAUGEWATCH_BACKEND": "gproj"},
    "gproj_key_outer": {**OFF, "GAUGEWATCH_BACKEND": "gproj", "GAUGEWATCH_GPROJ_KERNEL": "key_outer"},
    "gproj_pair": {**OFF, "GAUGEWATCH_BACKEND": "gproj", "GAUGEWATCH_GPROJ_KERNEL": "pair"},
    "gproj_pass2_128": {**OFF, "GAUGEWATCH_BACKEND": "gproj", "GAUGEWATCH_GPROJ_PASS2_KEYS": "128"},
    "pivot": {**OFF, "GAUGEWATCH_BACKEND": "pivot"},
    "bf16": {**OFF, "GAUGEWATCH_BACKEND": "bf16"},
    "pivot_no_ws": {**OFF, "GAUGEWATCH_BACKEND": "pivot", "GAUGEWATCH_BF16_KERNEL": "key_outer"},
    "bf16_no_ws": {**OFF, "GAUGEWATCH_BACKEND": "bf16", "GAUGEWATCH_BF16_KERNEL": "key_outer"},
    "center": {**OFF, "GAUGEWATCH_BACKEND": "center"},
}


def worker(name, args):
    """A process of variant `name`: it loads the hooks library unless the variant is no_library."""
    extra = VARIANTS[name]
    spec = {"examples": str(ROOT / "examples"), "device": args.device, "threads": args.threads,
            "lib": "" if extra is None else args.lib, "model": args.model, "plain": PLAIN_MODELS.get(args.model),
            "warmup": args.warmup}
    env = paired_rounds.clean_env() if extra is None else paired_rounds.hooked_env(name, extra)
    return paired_rounds.Worker(name, WORKER, spec, env, hooked=extra is not None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model on the CPU, 3 rounds: seconds")
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--model", choices=["example", *PLAIN_MODELS], default="example",
                   help="example: examples/sink_gpt.py's configuration for the device; else a plain GPT")
    paired_rounds.add_arguments(p, ROOT)
    p.add_argument("--profile-steps", type=int,
                   help="after the rounds, profile this many steps of each variant's first process and report its "
                        "kernels (CUDA) or operators (CPU) by time per step and what it adds to no_library's; "
                        "0: none (default: 3 on CUDA, 0 on the CPU)")
    args = p.parse_args()
    import torch
    if args.device is None:
        args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    if args.model == "example":
        args.model = "tiny" if args.tiny else ("gpu" if args.device == "cuda" else "cpu")
    cuda = args.device == "cuda"
    if args.tiny:
        args.rounds = args.rounds or 3
    args.procs = args.procs or (1 if cuda or args.tiny else 2)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.tiny else 10)
    args.burst = args.burst or (2 if args.tiny else 10 if cuda else 5)
    args.budget_s = args.budget_s or (120.0 if cuda else 40.0)
    args.profile_steps = args.profile_steps if args.profile_steps is not None else (3 if cuda else 0)
    if not pathlib.Path(args.lib).exists():
        raise SystemExit(f"{args.lib} not found: build first or pass --lib")
    names = args.variants.split(",")
    if "no_library" not in names:
        names.insert(0, "no_library")

    started = time.monotonic()
    workers = {n: [worker(n, args) for _ in range(args.procs)] for n in names}
    paired_rounds.wait_ready(workers)
    print(f"started {len(names) * args.procs} processes in {time.monotonic() - started:.1f} s", flush=True)
    bursts = paired_rounds.run_rounds(workers, args, run_started=started)
    r = len(bursts["no_library"])

    profiles = {name: workers[name][0].profile(args.profile_steps) for name in names} if args.profile_steps else {}
    results = {}
    for name in names:
        stats = None
        for w in workers[name]:
            stats = w.quit()
        row = {"median_ms": 1e3 * statistics.median(statistics.median(b) for b in bursts[name]), "bursts": r}
        if name != "no_library":
            row["vs_no_library"] = paired_rounds.paired(bursts, name, "no_library")
            row["vs_no_library_of_means"] = paired_rounds.paired(bursts, name, "no_library", of=statistics.fmean)
            if "stock" in bursts and name != "stock":
                row["vs_stock"] = paired_rounds.paired(bursts, name, "stock")
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
    if profiles:
        text += (f"\nProfiled {args.profile_steps} step(s) of each variant after the rounds (torch.profiler; "
                 f"{'GPU kernels by device time' if cuda else 'operators by self CPU time'}), per step:\n\n"
                 + paired_rounds.profile_report(profiles))
    print(text)
    report = {"date": time.strftime("%Y-%m-%d"), "args": vars(args), "rounds": r, "results": results,
              "profiles": profiles,
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
