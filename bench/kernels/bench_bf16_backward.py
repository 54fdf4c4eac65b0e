"""Benchmark: gaugewatch's fused BF16 backward (bf16, gproj, pivot) and FP32
backward against PyTorch SDPA's flash, cuDNN and efficient backward, side by
side in one process on the same operands.

What is timed (CUDA events, warm-up, median over --reps, inputs rotated over
--rotate copies so L2 does not carry over between calls):
  sdpa_<backend>  autograd backward of F.scaled_dot_product_attention under that
                  backend (backward only: the graph is kept, retain_graph=True);
                  sdpa_cudnn_again the cuDNN one timed again after the gw
                  backends of the shape (the ratios use sdpa_cudnn)
  gw_<backend>    torch.ops.gaugewatch.attention_backward(backend=...), on the
                  BF16 operands and SDPA flash's saved out and lse; includes
                  the delta pre-pass and the workspace allocation; gw_center is
                  key centring (center_keys' kernels) plus SDPA's flash backward;
                  the default path (deterministic=False): bf16 and pivot run
                  the warp-specialized key-outer kernel, gproj that kernel
                  and its second pass (GAUGEWATCH_GPROJ_KERNEL unset)
  gw_<backend>_pair  bf16, gproj, pivot with deterministic=True: the two-kernel
                  pair, side by side with the key-outer kernel
  gw_center_keys  center_keys alone (the centring's share of gw_center)
  gw_gproj_key_outer  gproj with GAUGEWATCH_GPROJ_KERNEL=key_outer: the
                  key-outer path at every head dim whatever the default
                  chooses (at 64 and 256 it is the default; both passes over
                  the keys warp-specialized at 64 and 128; a child process,
                  since the ops library reads the variable once, when it
                  loads; n/a with the child's error in
                  gw_gproj_key_outer_error if the child fails)
  gw_<backend>_mma_sync  the same with GAUGEWATCH_BF16_KERNEL=mma_sync: the
                  mma.sync kernel pair that the Hopper (wgmma) pair replaced,
                  for bf16, gproj and pivot (a child process, likewise)
  gw_bf16_no_ws, gw_pivot_no_ws, gw_gproj_no_ws  bf16, pivot and the
                  key-outer gproj with GAUGEWATCH_BF16_KERNEL=key_outer (and
                  GAUGEWATCH_GPROJ_KERNEL=key_outer): the key-outer kernel
                  without warp specialization (cp.async loads by every
                  thread; a child process, likewise), the baseline of the
                  warp-specialized one (<backend>_ws_over_no_ws; gproj's
                  against gw_gproj_key_outer)
  gw_gproj_pass2_128  gproj with GAUGEWATCH_GPROJ_PASS2_KEYS=128: its second
                  pass over 128-key blocks (head dims 64 and 128; a child
                  process, likewise), the baseline of the default 256-key
                  pass: gw_gproj against it (gproj_pass2_256_over_128) and
                  the second pass's kernel time (kernels_us_pass2_128)
  head dim 256   bf16, pivot and gproj run the key-outer kernels there by
                  default (gw_<backend>; their *_pair columns the mma.sync
                  pair): <backend>_d256_key_outer_over_pair and a table of
                  its own
Effective TFLOP/s = 2.5 x forward FLOPs (4 B Hq N M d, halved when causal) / time.
Targets (issue 3): gproj <= 2x sdpa_flash, gproj <= 1.6x gw_bf16, pivot <= 1.1x gw_bf16;
(issue 11): center <= 1.08x sdpa_flash; (issue 13): bf16 <= 1.15x, pivot <= 1.2x,
gproj <= 1.8x sdpa_cudnn (the *_vs_cudnn columns; gw_gproj is gproj's
default, the key-outer gproj and the pair have their own columns).
Head dim 256 (the last shape): bf16, pivot and gproj on the head-dim-256
key-outer kernels by default; deterministic=True on the mma.sync pair.
Shapes with "sink" in the name: key 0 of every head is an attention sink that
wins the row maximum of P for every row (every row's pivot is key 0: pivot's
dK fix-up lands on one key), q[..., 0] = 4, k_0 = (2 sqrt(d), 0, ..., 0).

Run (needs a GPU and the built ops library; GAUGEWATCH_GPROJ_KERNEL unset):
  python3 bench/kernels/bench_bf16_backward.py [--json F] [--markdown F] [--shapes A,B]
      [--skip-fp32] [--skip-mma-sync] [--skip-gproj-key-outer] [--skip-no-ws]
      [--skip-gproj-pass2-128]
Writes $GAUGEWATCH_BENCH_OUT/bench_bf16_backward.json when that is set (device.sh).
Exits 1 (after writing the results) when a child process failed.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from _common import load_ops, select_shapes, time_ms, warm_gpu, write_results
import _center

SHAPES = [
    # name, B, Hq, Hkv, N, d, causal
    ("B4_H16_N4096_d64_causal", 4, 16, 16, 4096, 64, True),
    ("B4_H16_N4096_d128_causal", 4, 16, 16, 4096, 128, True),
    ("B2_H16_N8192_d128", 2, 16, 16, 8192, 128, False),
    ("B4_Hq32_Hkv8_N4096_d128_causal_gqa", 4, 32, 8, 4096, 128, True),
    ("B1_H16_N16384_d128_causal", 1, 16, 16, 16384, 128, True),
    ("B4_H16_N4096_d128_causal_sink_pivot", 4, 16, 16, 4096, 128, True),
    # Head dim 256: the key-outer kernels by default, the mma.sync pair with
    # deterministic=True.
    ("B4_H16_N4096_d256_causal", 4, 16, 16, 4096, 256, True),
]
GW = ("bf16", "gproj", "pivot", "center", "fp32")
# Also timed with deterministic=True (gw_<backend>_pair): the two-kernel pair.
PAIR = ("bf16", "gproj", "pivot")
# Also timed with GAUGEWATCH_BF16_KERNEL=mma_sync (gw_<backend>_mma_sync).
MMA_SYNC = ("bf16", "gproj", "pivot")
# Also timed with GAUGEWATCH_BF16_KERNEL=key_outer (gw_<backend>_no_ws): the key-outer kernel
# without warp specialization (gproj: its key-outer path, GAUGEWATCH_GPROJ_KERNEL=key_outer).
NO_WS = ("bf16", "pivot", "gproj")
# Variants timed in a child process with the environment the ops library
# reads when it loads: name -> (environment, backends, key suffix). The child
# writes gw_<backend><suffix>_ms and kernels_us<suffix> (its backends'
# default paths).
VARIANTS = {
    "mma_sync": ({"GAUGEWATCH_BF16_KERNEL": "mma_sync"}, MMA_SYNC, "_mma_sync"),
    "gproj_key_outer": ({"GAUGEWATCH_GPROJ_KERNEL": "key_outer"}, ("gproj",), "_key_outer"),
    "no_ws": ({"GAUGEWATCH_BF16_KERNEL": "key_outer", "GAUGEWATCH_GPROJ_KERNEL": "key_outer"}, NO_WS, "_no_ws"),
    "gproj_pass2_128": ({"GAUGEWATCH_GPROJ_PASS2_KEYS": "128"}, ("gproj",), "_pass2_128"),
}
# The head dims a variant changes anything at (the others are not timed).
VARIANT_HEAD_DIMS = {"gproj_pass2_128": (64, 128)}


def effective_flops(B, Hq, N, d, causal):
    """2.5 x the forward's FLOPs (4 B Hq N M d, halved when causal; M = N here)."""
    return 2.5 * 4 * B * Hq * N * N * d * (0.5 if causal else 1.0)


def kernel_breakdown(ops, x, causal, calls=3, backends=("bf16", "gproj", "pivot"), pairs=PAIR):
    """Mean device time per call of each kernel the gw backends launch (us),
    from torch.profiler: where the time goes inside one backward (keys
    <backend>: the default path; <backend>_pair: deterministic=True)."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    runs = [(b, b, False) for b in backends] + [(f"{b}_pair", b, True) for b in pairs]
    for label, backend, deterministic in runs:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                ops.attention_backward(x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"], is_causal=causal,
                                       backend=backend, deterministic=deterministic)
            torch.cuda.synchronize()
        times = {}
        for evt in prof.key_averages():
            if evt.device_type is not None and "gaugewatch" in evt.key:
                short = evt.key.split("(")[0].split("::")[-1].split("<")[0]
                total = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
                times[short] = times.get(short, 0.0) + total / calls
        out[label] = {k: round(v, 1) for k, v in times.items()}
    return out


def make_inputs(B, Hq, Hkv, N, d, causal, seed, sink=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, Hkv, N, d, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, Hkv, N, d, device="cuda", generator=g).bfloat16()
    do = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    if sink:
        # Logit of key 0: alpha q_i . k_0 = 8 on every row; the others ~N(0, 1).
        q[..., 0] = 4.0
        k[:, :, 0, :] = 0.0
        k[:, :, 0, 0] = 2.0 * d ** 0.5
    kk, vv = (k, v) if Hq == Hkv else (k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, kk, vv, 0.0, causal, False)[:2]
    return dict(q=q, k=k, v=v, do=do, out=out, lse=lse.float())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--fp32-reps", type=int, default=3)
    parser.add_argument("--rotate", type=int, default=3)
    parser.add_argument("--shapes", default="", help="comma-separated subset of shape names")
    parser.add_argument("--json", default="")
    parser.add_argument("--markdown", default="")
    parser.add_argument("--skip-fp32", action="store_true", help="leave out the FP32 recompute (slow)")
    parser.add_argument("--skip-mma-sync", action="store_true", help="leave out the mma.sync baseline pair")
    parser.add_argument("--skip-gproj-key-outer", action="store_true",
                        help="leave out the key-outer gproj (GAUGEWATCH_GPROJ_KERNEL=key_outer)")
    parser.add_argument("--skip-no-ws", action="store_true",
                        help="leave out the key-outer kernel without warp specialization "
                             "(GAUGEWATCH_BF16_KERNEL=key_outer)")
    parser.add_argument("--skip-gproj-pass2-128", action="store_true",
                        help="leave out gproj's second pass over 128-key blocks (GAUGEWATCH_GPROJ_PASS2_KEYS=128)")
    parser.add_argument("--variant-child", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant_child:
        return variant_child(args, args.variant_child)
    if os.environ.get("GAUGEWATCH_GPROJ_KERNEL") not in (None, "", "auto"):
        print("bench_bf16_backward: unset GAUGEWATCH_GPROJ_KERNEL: gw_gproj is gproj's default, and the "
              "key-outer gproj is timed in its own process")
        return 1
    ops, rc = load_ops("bench_bf16_backward")
    if ops is None:
        return rc
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "driver": getattr(torch.cuda, "driver_version", lambda: None)() if hasattr(torch.cuda, "driver_version")
            else None, "reps": args.reps, "rotate": args.rotate}
    try:
        import subprocess
        meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.strip() or meta["driver"]
    except (OSError, subprocess.SubprocessError):
        pass
    cases = []
    warm_gpu()
    for name, B, Hq, Hkv, N, d, causal in select_shapes(SHAPES, args.shapes):
        flops = effective_flops(B, Hq, N, d, causal)
        inputs = [make_inputs(B, Hq, Hkv, N, d, causal, seed, sink="sink" in name) for seed in range(args.rotate)]
        row = {"shape": name, "B": B, "Hq": Hq, "Hkv": Hkv, "N": N, "d": d, "causal": causal}
        def time_sdpa(backend, key):
            kind = sdpa[backend]

            def prepare(x):
                q, k, v = (x[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
                with sdpa_kernel([kind]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
                return dict(o=o, inputs=(q, k, v), do=x["do"])
            try:
                graphs = [prepare(x) for x in inputs]
                row[f"{key}_ms"] = time_ms(
                    lambda gph: torch.autograd.grad(gph["o"], gph["inputs"], gph["do"], retain_graph=True), graphs,
                    args.reps, warmup=3)
                del graphs
            except RuntimeError as exc:  # a backend that refuses the shape (e.g. flash with GQA views)
                row[f"{key}_ms"] = None
                row[f"{key}_error"] = str(exc).splitlines()[0][:200]

        for backend in sdpa:
            time_sdpa(backend, f"sdpa_{backend}")
        for backend in GW:
            if backend == "fp32" and args.skip_fp32:
                continue
            def gw(x, b=backend):
                return ops.attention_backward(x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"], is_causal=causal,
                                              backend=b)
            try:
                row[f"gw_{backend}_ms"] = time_ms(gw, inputs, args.fp32_reps if backend == "fp32" else args.reps,
                                                  warmup=1 if backend == "fp32" else 3)
            except RuntimeError as exc:
                row[f"gw_{backend}_ms"] = None
                row[f"gw_{backend}_error"] = str(exc).splitlines()[0][:200]
        for backend in PAIR:
            row[f"gw_{backend}_pair_ms"] = time_ms(
                lambda x, b=backend: ops.attention_backward(x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"],
                                                            is_causal=causal, backend=b, deterministic=True),
                inputs, args.reps, warmup=3)
        row["gw_center_keys_ms"] = time_ms(lambda x: ops.center_keys(x["q"], x["k"], x["lse"]), inputs, args.reps)
        # cuDNN's backward once more, after the project's: the ratios use the
        # first time; the two side by side show whether cuDNN's time drifts
        # within a process (across processes it spread by up to 25%).
        time_sdpa("cudnn", "sdpa_cudnn_again")
        for key in [k[:-3] for k in list(row) if k.endswith("_ms")]:
            ms = row[key + "_ms"]
            row[key + "_tflops"] = None if ms is None else flops / (ms * 1e-3) / 1e12
        row["kernels_us"] = kernel_breakdown(ops, inputs[0], causal)
        cudnn = row.get("sdpa_cudnn_ms")
        for key in [k[:-3] for k in list(row) if k.endswith("_ms")]:
            ms = row[key + "_ms"]
            row[key + "_vs_cudnn"] = None if ms is None or not cudnn else ms / cudnn
        row["gproj_over_flash"] = row["gw_gproj_ms"] / row["sdpa_flash_ms"] if row.get("sdpa_flash_ms") else None
        row["center_over_flash"] = (row["gw_center_ms"] / row["sdpa_flash_ms"]
                                    if row.get("sdpa_flash_ms") and row.get("gw_center_ms") else None)
        row["gproj_over_bf16"] = row["gw_gproj_ms"] / row["gw_bf16_ms"]
        row["pivot_over_bf16"] = row["gw_pivot_ms"] / row["gw_bf16_ms"]
        for backend in ("bf16", "pivot"):  # gproj's key-outer ratio comes with its child
            row[f"{backend}_key_outer_over_pair"] = row[f"gw_{backend}_ms"] / row[f"gw_{backend}_pair_ms"]
        cases.append(row)
        print(json.dumps(row), flush=True)
        del inputs
        torch.cuda.empty_cache()
    # Backend center as the hooks run it, beside the stock backward it wraps (bench/kernels/_center.py).
    for row in cases:
        row["center"] = _center.time_center(ops, row["B"], row["Hq"], row["Hkv"], row["N"], row["d"], row["causal"],
                                            args.reps, args.rotate)
        print(json.dumps({"shape": row["shape"], "center": row["center"]}), flush=True)
    children_ok = True
    if not args.skip_mma_sync and cases:
        children_ok &= merge_variant(cases, args, "mma_sync")
    if not args.skip_gproj_key_outer and cases:
        children_ok &= merge_variant(cases, args, "gproj_key_outer")
    if not args.skip_no_ws and cases:
        children_ok &= merge_variant(cases, args, "no_ws")
    if not args.skip_gproj_pass2_128 and cases:
        children_ok &= merge_variant(cases, args, "gproj_pass2_128")
    for row in cases:
        ms, pair, cudnn = row.get("gw_gproj_key_outer_ms"), row["gw_gproj_pair_ms"], row.get("sdpa_cudnn_ms")
        flops = effective_flops(row["B"], row["Hq"], row["N"], row["d"], row["causal"])
        row["gw_gproj_key_outer_ms"] = ms
        row["gw_gproj_key_outer_tflops"] = None if ms is None else flops / (ms * 1e-3) / 1e12
        row["gw_gproj_key_outer_vs_cudnn"] = None if ms is None or not cudnn else ms / cudnn
        row["gproj_key_outer_over_pair"] = None if ms is None else ms / pair
        for backend in NO_WS:
            ms = row.get(f"gw_{backend}_no_ws_ms")
            ws = row.get("gw_gproj_key_outer_ms") if backend == "gproj" else row[f"gw_{backend}_ms"]
            row[f"gw_{backend}_no_ws_ms"] = ms
            row[f"gw_{backend}_no_ws_tflops"] = None if ms is None else flops / (ms * 1e-3) / 1e12
            row[f"{backend}_ws_over_no_ws"] = None if ms is None or ws is None else ws / ms
        ms = row.get("gw_gproj_pass2_128_ms")
        row["gw_gproj_pass2_128_tflops"] = None if ms is None else flops / (ms * 1e-3) / 1e12
        row["gw_gproj_pass2_128_vs_cudnn"] = None if ms is None or not cudnn else ms / cudnn
        row["gproj_pass2_256_over_128"] = None if ms is None else row["gw_gproj_ms"] / ms
        if row["d"] == 256:
            # Key-outer over pair: the default against deterministic=True
            # (the mma.sync pair at head dim 256).
            for backend in ("bf16", "pivot", "gproj"):
                row[f"{backend}_d256_key_outer_over_pair"] = row[f"gw_{backend}_ms"] / row[f"gw_{backend}_pair_ms"]

    def fmt(row, key):
        ms = row.get(key + "_ms")
        return "n/a" if ms is None else f"{ms:.3f} ({row[key + '_tflops']:.0f})"

    cols = ["sdpa_flash", "sdpa_cudnn", "sdpa_cudnn_again", "sdpa_efficient", "gw_bf16", "gw_gproj", "gw_pivot",
            "gw_center", "gw_fp32"]
    lines = [f"GPU {meta['gpu']}, driver {meta['driver']}, torch {meta['torch']}, CUDA {meta['cuda']}, "
             f"cuDNN {meta['cudnn']}; median of {args.reps} (fp32: {args.fp32_reps}); ms (effective TFLOP/s)", "",
             "| shape | " + " | ".join(cols) + " | gproj/flash | gproj/bf16 | pivot/bf16 | center/flash | "
             "center_keys ms |",
             "|---" * (len(cols) + 6) + "|"]
    ratio = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
    for row in cases:
        lines.append(f"| {row['shape']} | " + " | ".join(fmt(row, c) for c in cols) +
                     f" | {ratio(row['gproj_over_flash'])} | {ratio(row['gproj_over_bf16'])} | "
                     f"{ratio(row['pivot_over_bf16'])} | {ratio(row['center_over_flash'])} | "
                     f"{row['gw_center_keys_ms']:.3f} |")
    lines += ["", "Key-outer kernel (bf16, pivot: default, warp-specialized; gproj: "
              "GAUGEWATCH_GPROJ_KERNEL=key_outer, its default at head dims 64 and 256) "
              "against the two-kernel pair (deterministic=True), and against cuDNN: "
              "ms (effective TFLOP/s)", "",
              "| shape | sdpa_cudnn | gw_bf16 key-outer | gw_bf16 pair | gw_pivot key-outer | gw_pivot pair | "
              "gw_gproj key-outer | gw_gproj pair | bf16/cuDNN | pivot/cuDNN | gproj pair/cuDNN | "
              "gproj key-outer/cuDNN | bf16 key-outer/pair | pivot key-outer/pair | gproj key-outer/pair |",
              "|---" * 15 + "|"]
    for row in cases:
        lines.append(f"| {row['shape']} | {fmt(row, 'sdpa_cudnn')} | {fmt(row, 'gw_bf16')} | "
                     f"{fmt(row, 'gw_bf16_pair')} | {fmt(row, 'gw_pivot')} | {fmt(row, 'gw_pivot_pair')} | "
                     f"{fmt(row, 'gw_gproj_key_outer')} | {fmt(row, 'gw_gproj_pair')} | "
                     f"{ratio(row.get('gw_bf16_vs_cudnn'))} | {ratio(row.get('gw_pivot_vs_cudnn'))} | "
                     f"{ratio(row.get('gw_gproj_pair_vs_cudnn'))} | {ratio(row['gw_gproj_key_outer_vs_cudnn'])} | "
                     f"{ratio(row['bf16_key_outer_over_pair'])} | {ratio(row['pivot_key_outer_over_pair'])} | "
                     f"{ratio(row['gproj_key_outer_over_pair'])} |")
    if any(row.get(f"gw_{b}_no_ws_ms") is not None for row in cases for b in NO_WS):
        lines += ["", "Warp-specialized key-outer kernel (the default; gproj: its key-outer path, "
                  "GAUGEWATCH_GPROJ_KERNEL=key_outer) against the key-outer kernel "
                  "without warp specialization (GAUGEWATCH_BF16_KERNEL=key_outer) and cuDNN: ms (effective TFLOP/s)",
                  "", "| shape | sdpa_cudnn | gw_bf16 ws | gw_bf16 no-ws | gw_pivot ws | gw_pivot no-ws | "
                  "gw_gproj key-outer | gw_gproj no-ws | bf16 ws/cuDNN | pivot ws/cuDNN | bf16 ws/no-ws | "
                  "pivot ws/no-ws | gproj key-outer/no-ws |", "|---" * 13 + "|"]
        for row in cases:
            lines.append(f"| {row['shape']} | {fmt(row, 'sdpa_cudnn')} | {fmt(row, 'gw_bf16')} | "
                         f"{fmt(row, 'gw_bf16_no_ws')} | {fmt(row, 'gw_pivot')} | {fmt(row, 'gw_pivot_no_ws')} | "
                         f"{fmt(row, 'gw_gproj_key_outer')} | {fmt(row, 'gw_gproj_no_ws')} | "
                         f"{ratio(row.get('gw_bf16_vs_cudnn'))} | {ratio(row.get('gw_pivot_vs_cudnn'))} | "
                         f"{ratio(row['bf16_ws_over_no_ws'])} | {ratio(row['pivot_ws_over_no_ws'])} | "
                         f"{ratio(row['gproj_ws_over_no_ws'])} |")
    if any(row.get("gw_gproj_pass2_128_ms") is not None for row in cases):
        pass2 = "gproj_keys_ws_kernel"
        lines += ["", "gproj's second pass over 256-key blocks (the default) against 128-key blocks "
                  "(GAUGEWATCH_GPROJ_PASS2_KEYS=128, a child process): ms (effective TFLOP/s), and the second "
                  "pass's kernel (us, profiler)", "",
                  "| shape | sdpa_cudnn | gw_gproj pass 2 over 128 | gw_gproj | 256/128 | gproj 128/cuDNN | "
                  "gproj/cuDNN | pass 2 us (128) | pass 2 us (256) |", "|---" * 9 + "|"]
        for row in cases:
            if row.get("gw_gproj_pass2_128_ms") is None:
                continue
            us128 = row.get("kernels_us_pass2_128", {}).get("gproj", {}).get(pass2)
            us256 = row.get("kernels_us", {}).get("gproj", {}).get(pass2)
            lines.append(f"| {row['shape']} | {fmt(row, 'sdpa_cudnn')} | {fmt(row, 'gw_gproj_pass2_128')} | "
                         f"{fmt(row, 'gw_gproj')} | {ratio(row['gproj_pass2_256_over_128'])} | "
                         f"{ratio(row['gw_gproj_pass2_128_vs_cudnn'])} | {ratio(row.get('gw_gproj_vs_cudnn'))} | "
                         f"{'n/a' if us128 is None else f'{us128:.1f}'} | "
                         f"{'n/a' if us256 is None else f'{us256:.1f}'} |")
    if any(row["d"] == 256 for row in cases):
        lines += ["", "Head dim 256: the key-outer kernels (the default) against the mma.sync pair "
                  "(deterministic=True): ms (effective TFLOP/s), the key-outer kernel's time and "
                  "gproj's second pass's (us, profiler)", "",
                  "| shape | backend | sdpa_cudnn | pair | key-outer | key-outer/pair | pair/cuDNN | "
                  "key-outer/cuDNN | key-outer kernel us | second pass us |", "|---" * 10 + "|"]
        for row in cases:
            if row["d"] != 256:
                continue
            for backend in ("bf16", "pivot", "gproj"):
                key_outer, pair = f"gw_{backend}", f"gw_{backend}_pair"
                kernels_us = row.get("kernels_us", {}).get(backend, {})
                us, us2 = kernels_us.get("keyouter_d256_kernel"), kernels_us.get("gproj_keys_d256_kernel")
                lines.append(f"| {row['shape']} | {backend} | {fmt(row, 'sdpa_cudnn')} | {fmt(row, pair)} | "
                             f"{fmt(row, key_outer)} | {ratio(row[f'{backend}_d256_key_outer_over_pair'])} | "
                             f"{ratio(row.get(pair + '_vs_cudnn'))} | {ratio(row.get(key_outer + '_vs_cudnn'))} | "
                             f"{'n/a' if us is None else f'{us:.1f}'} | "
                             f"{'n/a' if us2 is None else f'{us2:.1f}'} |")
    if any("gw_bf16_mma_sync_ms" in row for row in cases):
        lines += ["", "Hopper (wgmma) pair against the mma.sync pair (GAUGEWATCH_BF16_KERNEL=mma_sync): "
                  "ms Hopper / mma.sync", "", "| shape | " + " | ".join(MMA_SYNC) + " |",
                  "|---" * (len(MMA_SYNC) + 1) + "|"]
        for row in cases:
            lines.append(f"| {row['shape']} | " + " | ".join(
                f"{row[f'gw_{b}_pair_ms']:.3f} / {ratio(row.get(f'gw_{b}_mma_sync_ms'))}" for b in MMA_SYNC) + " |")
    lines += _center.markdown(cases)
    write_results("bench_bf16_backward", args, meta, cases, "\n".join(lines))
    return 0 if children_ok else 1


def variant_child(args, variant):
    """In a process started with VARIANTS[variant]'s environment: its
    backends' times per shape, as JSON into --json."""
    _, backends, suffix = VARIANTS[variant]
    ops, rc = load_ops(f"bench_bf16_backward ({variant})")
    if ops is None:
        return rc
    result = {}
    warm_gpu()
    for name, B, Hq, Hkv, N, d, causal in select_shapes(SHAPES, args.shapes):
        inputs = [make_inputs(B, Hq, Hkv, N, d, causal, seed, sink="sink" in name) for seed in range(args.rotate)]
        row = {}
        for backend in backends:
            row[f"gw_{backend}{suffix}_ms"] = time_ms(
                lambda x, b=backend: ops.attention_backward(x["do"], x["q"], x["k"], x["v"], x["out"], x["lse"],
                                                            is_causal=causal, backend=b), inputs, args.reps, warmup=3)
        row[f"kernels_us{suffix}"] = kernel_breakdown(ops, inputs[0], causal, backends=backends,
                                                      pairs=PAIR if variant == "mma_sync" else ())
        result[name] = row
        del inputs
        torch.cuda.empty_cache()
    Path(args.json).write_text(json.dumps(result))
    return 0


def merge_variant(cases, args, variant):
    """Times a variant in a child process (the library reads its environment
    once, when it loads) and merges the times into the rows. A failed child
    leaves its columns n/a, its error in gw_<backend><suffix>_error, and
    returns False."""
    import subprocess
    import tempfile

    env, backends, suffix = VARIANTS[variant]
    head_dims = VARIANT_HEAD_DIMS.get(variant)
    shapes = [row["shape"] for row in cases if head_dims is None or row["d"] in head_dims]
    if not shapes:
        return True
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{variant}.json"
        cmd = [sys.executable, __file__, "--variant-child", variant, "--json", str(path), "--reps", str(args.reps),
               "--rotate", str(args.rotate), "--shapes", ",".join(shapes)]
        proc = subprocess.run(cmd, env=dict(os.environ, **env), stderr=subprocess.PIPE, text=True)
        sys.stderr.write(proc.stderr)
        if proc.returncode != 0 or not path.is_file():
            lines = proc.stderr.strip().splitlines()
            error = f"child exited {proc.returncode} without results: {lines[-1][:200] if lines else 'no stderr'}"
            print(f"bench_bf16_backward: {variant} ({env}) {error}", file=sys.stderr)
            for row in cases:
                row.update({f"gw_{b}{suffix}_error": error for b in backends})
            return False
        child = json.loads(path.read_text())
    for row in cases:
        row.update(child.get(row["shape"], {}))
    return True


if __name__ == "__main__":
    sys.exit(main())
