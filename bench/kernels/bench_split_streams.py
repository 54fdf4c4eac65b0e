"""Benchmark: does one backward call leave SMs idle in its kernels' last
waves? The call on the whole problem against the same problem cut in two
halves (along the batch when B >= 2, else along the kv heads with their
query heads), the halves run one after the other on one stream and side by
side on two streams forked from the caller's (events, then joined).

Why: the key-outer kernels run one block per SM over (key block, kv head);
on B2 H16 N8192 d128 that is 2048 blocks on the H200's 132 SMs, 15.5 waves,
so the last wave leaves about half the SMs idle for one block's time (~3%
of the kernel by this arithmetic), and gproj's second pass (1024 blocks,
7.8 waves) and its finish kernels have their own last waves. Two
independent halves on two streams let one half's blocks fill the other's
idle SMs; what they cost is L2 locality (both halves' operands at once,
kernels/cuda/grid_order.cuh's sections). If "two streams" beats "whole" by
a few percent on a shape, splitting inside the library is worth building
there; if it does not, the tail is not where the time is.

Timed (CUDA events on the caller's stream, warm-up, median of --reps over
inputs rotated between calls, kernels/_common.py) per shape and backend
(bf16, gproj, pivot; torch.ops.gaugewatch.attention_backward, the default
path) in --rounds rounds, the three variants interleaved in each round
(the order rotated between rounds): whole, halves on one stream, halves on
two streams. Reported: each variant's median over rounds, the per-round
ratios to whole, and the largest difference between the halves' results
and the whole call's (relative to the whole's largest magnitude; the
key-outer kernels add dQ in FP32 atomics, so the order of additions, not
the values, may differ).

Run (needs a GPU and the built ops library):
  python3 bench/kernels/bench_split_streams.py [--rounds 3] [--reps 10] [--shapes A,B] [--json F] [--markdown F]
Writes $GAUGEWATCH_BENCH_OUT/bench_split_streams.json when that is set (device.sh).
"""

import argparse
import json
import statistics
import sys

import torch

BACKENDS = ("bf16", "gproj", "pivot")
VARIANTS = ("whole", "halves_one_stream", "halves_two_streams")
DEFAULT_SHAPES = ("B2_H16_N8192_d128,B1_H16_N16384_d128_causal,B4_Hq32_Hkv8_N4096_d128_causal_gqa,"
                  "B4_H16_N4096_d128_causal,B4_H16_N4096_d64_causal")


def halves(x, B, Hq, Hkv):
    """The inputs of the two halves: views of x's tensors (no copies), cut
    along the batch, or along the kv heads (query heads h * group.. with
    them) when B = 1."""
    if B >= 2:
        cut = [slice(0, B // 2), slice(B // 2, B)]
        return [{name: t[c] for name, t in x.items()} for c in cut]
    out = []
    for lo, hi in ((0, Hkv // 2), (Hkv // 2, Hkv)):
        group = Hq // Hkv
        qs, ks = slice(lo * group, hi * group), slice(lo, hi)
        out.append({name: (t[:, ks] if name in ("k", "v") else t[:, qs]) for name, t in x.items()})
    return out


def largest_difference(whole, parts, B):
    """max |halves - whole| / max |whole| over dQ, dK and dV."""
    worst = 0.0
    for i, w in enumerate(whole):
        joined = torch.cat([p[i] for p in parts], dim=0 if B >= 2 else 1)
        scale = w.float().abs().max().item() or 1.0
        worst = max(worst, (joined.float() - w.float()).abs().max().item() / scale)
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES,
                        help="comma-separated subset of bench_bf16_backward's shapes (head dims 64 and 128)")
    parser.add_argument("--json", default="")
    parser.add_argument("--markdown", default="")
    args = parser.parse_args()

    from _common import load_ops, select_shapes, time_ms, warm_gpu, write_results
    from bench_bf16_backward import SHAPES, make_inputs

    ops, rc = load_ops("bench_split_streams")
    if ops is None:
        return rc
    warm_gpu()
    caller = torch.cuda.current_stream()
    side = (torch.cuda.Stream(), torch.cuda.Stream())
    cases = []
    for name, B, Hq, Hkv, N, d, causal in select_shapes(SHAPES, args.shapes):
        if d not in (64, 128):
            raise SystemExit(f"bench_split_streams: {name}: head dims 64 and 128 only")
        if B < 2 and Hkv < 2:
            raise SystemExit(f"bench_split_streams: {name}: nothing to cut in two (B = 1, one kv head)")
        inputs = [make_inputs(B, Hq, Hkv, N, d, causal, seed, sink="sink" in name) for seed in range(3)]
        split_inputs = [halves(x, B, Hq, Hkv) for x in inputs]
        for backend in BACKENDS:
            def call(x, b=backend):
                return ops.attention_backward(x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"],
                                              is_causal=causal, backend=b)

            def one_stream(parts):
                return [call(p) for p in parts]

            def two_streams(parts):
                results = []
                for stream, p in zip(side, parts):
                    stream.wait_stream(caller)
                    with torch.cuda.stream(stream):
                        results.append(call(p))
                for stream in side:
                    caller.wait_stream(stream)
                return results

            runs = {"whole": (call, inputs), "halves_one_stream": (one_stream, split_inputs),
                    "halves_two_streams": (two_streams, split_inputs)}
            times = {v: [] for v in VARIANTS}
            for r in range(args.rounds):
                order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
                for v in order:
                    fn, xs = runs[v]
                    times[v].append(time_ms(fn, xs, args.reps, warmup=2))
            whole = call(inputs[0])
            diff_one = largest_difference(whole, one_stream(split_inputs[0]), B)
            diff_two = largest_difference(whole, two_streams(split_inputs[0]), B)
            torch.cuda.synchronize()
            case = {"shape": name, "backend": backend, "cut": "batch" if B >= 2 else "kv heads",
                    "round_ms": times,
                    "ms": {v: statistics.median(times[v]) for v in VARIANTS},
                    "round_ratios": {v: [t / w for t, w in zip(times[v], times["whole"])] for v in VARIANTS[1:]},
                    "largest_difference": {"halves_one_stream": diff_one, "halves_two_streams": diff_two}}
            case["ratio"] = {v: statistics.median(case["round_ratios"][v]) for v in VARIANTS[1:]}
            cases.append(case)
            print(json.dumps({k: case[k] for k in ("shape", "backend", "ms", "ratio")}), flush=True)
        del inputs, split_inputs
        torch.cuda.empty_cache()

    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "rounds": args.rounds, "reps": args.reps}
    lines = [f"GPU {meta['gpu']} ({meta['sms']} SMs), torch {meta['torch']}; {args.rounds} rounds, the variants "
             f"interleaved, median of {args.reps} per round; ms; ratios to whole: median of the rounds' (each round's)",
             "",
             "| shape | backend | cut | whole | halves, one stream | halves, two streams | one/whole | two/whole "
             "| two/whole per round | largest difference (two streams) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        ms, ratio = c["ms"], c["ratio"]
        per_round = " ".join(f"{x:.3f}" for x in c["round_ratios"]["halves_two_streams"])
        lines.append(f"| {c['shape']} | {c['backend']} | {c['cut']} | {ms['whole']:.3f} | "
                     f"{ms['halves_one_stream']:.3f} | {ms['halves_two_streams']:.3f} | "
                     f"{ratio['halves_one_stream']:.3f} | {ratio['halves_two_streams']:.3f} | {per_round} | "
                     f"{c['largest_difference']['halves_two_streams']:.1e} |")
    write_results("bench_split_streams", args, meta, cases, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
