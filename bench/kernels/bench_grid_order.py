"""Benchmark: the fused BF16 backward's grid order (kernels/cuda/grid_order.cuh),
sections of heads sized to the L2 (the default) against one section of all
heads (GAUGEWATCH_GRID_SECTION=all: every head's heaviest block first, the
order before sections).

The ops library reads GAUGEWATCH_GRID_SECTION once, when it loads, so each
order runs in its own child process; child processes alternate between the
two orders for --rounds rounds (a GPU's clock and temperature drift between
processes by a few percent, as much as the effect measured), and each round
gives a ratio per shape and backend (sections / all, medians of --reps CUDA
event timings over inputs rotated so that L2 does not carry over between
calls). Reported: each order's median over rounds and the median of the
per-round ratios. Backends: bf16 and pivot (the key-outer kernel), gproj
(its default structure, GprojPath::kAuto) and bf16's pair
(deterministic=True: the dq kernel's query-tile grid).

Run (needs a GPU and the built ops library):
  python3 bench/kernels/bench_grid_order.py [--rounds 2] [--reps 10] [--shapes A,B] [--json F] [--markdown F]
Writes $GAUGEWATCH_BENCH_OUT/bench_grid_order.json when that is set (device.sh).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ORDERS = ("auto", "all")  # GAUGEWATCH_GRID_SECTION values: sections (default), one section
BACKENDS = (("bf16", False), ("pivot", False), ("gproj", False), ("bf16", True))


def label(backend, deterministic):
    return f"{backend}_pair" if deterministic else backend


def child(args):
    """Times every shape and backend under this process's grid order; JSON on stdout."""
    import torch

    from _common import load_ops, select_shapes, time_ms
    from bench_bf16_backward import SHAPES, make_inputs

    ops, rc = load_ops("bench_grid_order")
    if ops is None:
        return rc
    out = {}
    for name, B, Hq, Hkv, N, d, causal in select_shapes(SHAPES, args.shapes):
        inputs = [make_inputs(B, Hq, Hkv, N, d, causal, seed, sink="sink" in name) for seed in range(3)]
        for backend, deterministic in BACKENDS:
            out[f"{name}/{label(backend, deterministic)}"] = time_ms(
                lambda x, b=backend, det=deterministic: ops.attention_backward(
                    x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"], is_causal=causal, backend=b,
                    deterministic=det), inputs, args.reps, warmup=2)
        del inputs
        torch.cuda.empty_cache()
    print(json.dumps(out))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--shapes", default="", help="comma-separated subset of bench_bf16_backward's shapes")
    parser.add_argument("--json", default="")
    parser.add_argument("--markdown", default="")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    import torch

    from _common import write_results

    if not torch.cuda.is_available():
        print("bench_grid_order: no CUDA device; nothing to time")
        return 0
    if os.environ.get("GAUGEWATCH_GRID_SECTION") not in (None, ""):
        print("bench_grid_order: unset GAUGEWATCH_GRID_SECTION: this benchmark sets it per child process")
        return 1
    times = {order: [] for order in ORDERS}  # per round: {case: ms}
    for r in range(args.rounds):
        for order in ORDERS if r % 2 == 0 else ORDERS[::-1]:
            cmd = [sys.executable, __file__, "--child", "--reps", str(args.reps), "--shapes", args.shapes]
            proc = subprocess.run(cmd, env=dict(os.environ, GAUGEWATCH_GRID_SECTION=order), capture_output=True,
                                  text=True)
            sys.stderr.write(proc.stderr)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                print(f"bench_grid_order: the {order} child exited {proc.returncode}", file=sys.stderr)
                return 1
            times[order].append(json.loads(lines[-1]))
            print(f"round {r} {order}: {lines[-1]}", flush=True)
    cases = []
    for case in times["auto"][0]:
        shape, backend = case.split("/")
        ratios = [a[case] / b[case] for a, b in zip(times["auto"], times["all"])]
        cases.append({"shape": shape, "backend": backend,
                      "sections_ms": statistics.median(t[case] for t in times["auto"]),
                      "all_ms": statistics.median(t[case] for t in times["all"]),
                      "sections_over_all": statistics.median(ratios), "round_ratios": ratios})
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "torch": torch.__version__, "rounds": args.rounds, "reps": args.reps}
    lines = [f"GPU {meta['gpu']}, torch {meta['torch']}; {args.rounds} rounds of alternating child processes, "
             f"median of {args.reps} per round; ms", "",
             "| shape | backend | sections (default) | one section (all) | sections/all | per round |",
             "|---|---|---|---|---|---|"]
    for c in cases:
        lines.append(f"| {c['shape']} | {c['backend']} | {c['sections_ms']:.3f} | {c['all_ms']:.3f} | "
                     f"{c['sections_over_all']:.3f} | {' '.join(f'{x:.3f}' for x in c['round_ratios'])} |")
    write_results("bench_grid_order", args, meta, cases, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
