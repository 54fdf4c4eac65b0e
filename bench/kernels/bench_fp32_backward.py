"""Benchmark: gaugewatch's fused FP32 attention backward (CUDA, sm_90a) against
PyTorch SDPA's math backend backward in FP32 on the same operands.

What is timed (CUDA events, warm-up, median over --reps, inputs rotated over
--rotate copies so caches do not carry over):
  gw_fp32        torch.ops.gaugewatch.attention_backward(backend="fp32"): BF16 -> FP32
                 conversion, row pre-pass, dK/dV pass with dQ atomics
  gw_fp32_det    the same, deterministic=True (dQ in the row pass, no atomics)
  gw_fp32_rows   attention_backward_rows on a monitor-sized sample
                 (--sample-slices (b, h) slices x --sample-rows query rows)
  sdpa_math_fp32 autograd backward of F.scaled_dot_product_attention (math backend)
                 on FP32 copies of the operands, TF32 off (same arithmetic class)
Effective TFLOP/s = 2.5 x forward FLOPs (4 B Hq N M d, halved when causal) / time.

Run (needs a GPU and the built ops library):
  python3 bench/kernels/bench_fp32_backward.py --json $OUT/bench_fp32_backward.json
Library: $GAUGEWATCH_OPS_LIB, else $GAUGEWATCH_BUILD_DIR (default build/)/lib/libgaugewatch_ops.so.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from _common import load_ops, select_shapes, time_ms

SHAPES = [
    # name, B, Hq, Hkv, N, d, causal
    ("B4_H16_N4096_d64_causal", 4, 16, 16, 4096, 64, True),
    ("B4_H16_N4096_d128_causal", 4, 16, 16, 4096, 128, True),
    ("B2_H16_N8192_d128", 2, 16, 16, 8192, 128, False),
    ("B4_Hq32_Hkv8_N4096_d128_causal_gqa", 4, 32, 8, 4096, 128, True),
]


def make_inputs(B, Hq, Hkv, N, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, Hkv, N, d, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, Hkv, N, d, device="cuda", generator=g).bfloat16()
    do = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    out = torch.zeros_like(q)  # not read by the fp32 backend
    lse = torch.zeros(B, Hq, N, device="cuda")
    return dict(q=q, k=k, v=v, do=do, out=out, lse=lse)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rotate", type=int, default=2)
    parser.add_argument("--sample-slices", type=int, default=4)
    parser.add_argument("--sample-rows", type=int, default=256)
    parser.add_argument("--skip-sdpa", action="store_true", help="skip the SDPA math baseline (memory heavy)")
    parser.add_argument("--shapes", default="", help="comma-separated subset of shape names")
    parser.add_argument("--json", default="", help="write results here (default: "
                        "$GAUGEWATCH_BENCH_OUT/bench_fp32_backward.json when that is set, as device.sh does)")
    args = parser.parse_args()

    ops, rc = load_ops("bench_fp32_backward")
    if ops is None:
        return rc
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    props = torch.cuda.get_device_properties(0)
    results = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
               "driver": torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None,
               "reps": args.reps, "cases": []}
    for name, B, Hq, Hkv, N, d, causal in select_shapes(SHAPES, args.shapes):
        flops = 2.5 * 4 * B * Hq * N * N * d * (0.5 if causal else 1.0)
        inputs = [make_inputs(B, Hq, Hkv, N, d, seed) for seed in range(args.rotate)]
        row = {"shape": name, "B": B, "Hq": Hq, "Hkv": Hkv, "N": N, "d": d, "causal": causal}

        def gw(x, deterministic=False):
            return ops.attention_backward(x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"], is_causal=causal,
                                          backend="fp32", deterministic=deterministic)

        row["gw_fp32_ms"] = time_ms(gw, inputs, args.reps)
        row["gw_fp32_det_ms"] = time_ms(lambda x: gw(x, True), inputs, args.reps)
        S = min(args.sample_slices, B * Hq)
        R = min(args.sample_rows, N)
        slices = torch.linspace(0, B * Hq - 1, S, device="cuda").round().int()
        rows = torch.linspace(0, N - 1, R, device="cuda").round().int().unique()
        row["gw_fp32_rows_ms"] = time_ms(
            lambda x: ops.attention_backward_rows(x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"], slices, rows,
                                                  is_causal=causal), inputs, args.reps)
        row["sample"] = f"{S} slices x {rows.numel()} rows"
        if not args.skip_sdpa:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def prepare(x):
                q, k, v = (x[n].float().requires_grad_() for n in ("q", "k", "v"))
                with sdpa_kernel(SDPBackend.MATH):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
                return dict(o=o, inputs=(q, k, v), do=x["do"].float())

            try:
                graphs = [prepare(x) for x in inputs]
                row["sdpa_math_fp32_ms"] = time_ms(
                    lambda gph: torch.autograd.grad(gph["o"], gph["inputs"], gph["do"], retain_graph=True), graphs,
                    args.reps)
                del graphs
            except torch.OutOfMemoryError:
                row["sdpa_math_fp32_ms"] = None
        for key in ("gw_fp32", "gw_fp32_det", "sdpa_math_fp32"):
            ms = row.get(key + "_ms")
            row[key + "_tflops"] = None if ms is None else flops / (ms * 1e-3) / 1e12
        del inputs
        torch.cuda.empty_cache()
        results["cases"].append(row)
        print(json.dumps(row), flush=True)

    lines = ["| shape | gw fp32 ms (TFLOP/s) | deterministic ms | rows sample ms | SDPA math fp32 ms (TFLOP/s) |",
             "|---|---|---|---|---|"]
    for r in results["cases"]:
        sdpa = "n/a" if r.get("sdpa_math_fp32_ms") is None else \
            f"{r['sdpa_math_fp32_ms']:.2f} ({r['sdpa_math_fp32_tflops']:.1f})"
        lines.append(f"| {r['shape']} | {r['gw_fp32_ms']:.2f} ({r['gw_fp32_tflops']:.1f}) | {r['gw_fp32_det_ms']:.2f} "
                     f"| {r['gw_fp32_rows_ms']:.2f} ({r['sample']}) | {sdpa} |")
    table = "\n".join(lines)
    print(f"\n{props.name}, torch {torch.__version__}\n{table}")
    results["markdown"] = table
    if not args.json and os.environ.get("GAUGEWATCH_BENCH_OUT"):
        args.json = os.path.join(os.environ["GAUGEWATCH_BENCH_OUT"], "bench_fp32_backward.json")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
