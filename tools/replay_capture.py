"""Replay one captured attention call through every backward this machine
has and compare each with FP64 on the same operands.

    python tools/replay_capture.py --input CAPTURE.safetensors [--device cuda|cpu] [--repeat 20] [--json]
    gaugewatch audit --input CAPTURE.safetensors --device cuda [--repeat 20] [--json]
    ./scripts/run.sh audit --input CAPTURE.safetensors --device cuda

The capture (tools/capture_file.py; the hooks' `capture` command,
bench/experiments/sink_backends.py's configuration b) holds q, k, v, out,
lse, grad_out of one call. Backwards:
- SDPA's own, forward and backward recomputed from q, k, v by
  torch.nn.attention.sdpa_kernel: flash, cudnn, efficient, math on CUDA;
  flash (the CPU flash kernel) and math on the CPU. A backend SDPA refuses
  for the shape is listed with its reason;
- the gaugewatch ops (build/lib/libgaugewatch_ops.so,
  torch.ops.gaugewatch.attention_backward on the captured out and lse):
  bf16, gproj, pivot, center, fp32; one the build does not provide on this
  device is listed with the op's error.
Prints dQ / dK / dV errors ||dX - dX_64|| / ||dX_64|| and the backward's
median time over --repeat runs (CUDA events on the GPU, wall clock on the
CPU); SDPA's times are of its backward alone (the graph kept).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import capture_file  # noqa: E402

# Autograd's device thread makes the primary context current itself on its
# first cuBLAS call; torch warns about it once, and nothing is wrong.
warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA context")

SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "math": "MATH"}
GAUGEWATCH_BACKENDS = ["bf16", "gproj", "pivot", "center", "fp32"]


def timed(fn, device, repeat):
    """Median seconds of fn() over `repeat` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def causal_kwargs(causal, n, m, device):
    if causal == "none":
        return {}
    if causal == "top_left":
        return {"is_causal": True}
    # bottom_right: query i sees keys j <= i + (m - n)
    mask = torch.ones(n, m, dtype=torch.bool, device=device).tril(m - n)
    return {"attn_mask": mask}


def relative(x, ref):
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def measure(make_backward, truth, device, repeat):
    """Time (ms) and dQ / dK / dV errors against `truth` of the backward that
    make_backward() returns (after the forward it needs, if any); a
    RuntimeError (a backend this device, shape or build lacks) makes it
    "unavailable" with the error's first line."""
    try:
        backward = make_backward()
        grads = backward()
        return {"time_ms": 1e3 * timed(backward, device, repeat),
                **{f"d{x}_error": relative(g, r) for x, g, r in zip("qkv", grads, truth)}}
    except RuntimeError as error:
        return {"unavailable": str(error).splitlines()[0][:160]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--ops-lib", default=str(pathlib.Path(os.environ.get("GAUGEWATCH_BUILD_DIR", HERE.parent / "build"))
                                           / "lib" / "libgaugewatch_ops.so"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("replay: --device cuda but no GPU is visible")
    if hasattr(torch.ops, "gaugewatch_hooks") and hasattr(torch.ops.gaugewatch_hooks, "stats"):
        print("replay: the hooks library is loaded in this process: SDPA's rows would run its backends", file=sys.stderr)
    tensors, meta = capture_file.read(args.input)
    missing = {"q", "k", "v", "out", "lse", "grad_out"} - set(tensors)
    if missing:
        raise SystemExit(f"replay: {args.input} lacks {sorted(missing)}; a capture holds q, k, v, out, lse, grad_out")
    t = {name: x.to(device) for name, x in tensors.items()}
    causal = meta.get("causal", "none")
    scale = float(meta["scale"]) if "scale" in meta else t["q"].shape[-1] ** -0.5
    n, m = t["q"].shape[-2], t["k"].shape[-2]
    mask = causal_kwargs(causal, n, m, device)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q64, k64, v64 = (t[x].double().requires_grad_() for x in ("q", "k", "v"))
    with sdpa_kernel([SDPBackend.MATH]):
        F.scaled_dot_product_attention(q64, k64, v64, scale=scale, **mask).backward(t["grad_out"].double())
    truth = (q64.grad, k64.grad, v64.grad)

    rows = []
    sdpa = SDPA_BACKENDS if device == "cuda" else {"flash": "FLASH_ATTENTION", "math": "MATH"}
    for name, enum in sdpa.items():
        def sdpa_forward():
            """SDPA's forward on this backend; returns its backward (the graph kept)."""
            qq, kk, vv = (t[x].clone().requires_grad_() for x in ("q", "k", "v"))
            with sdpa_kernel([getattr(SDPBackend, enum)]):
                out = F.scaled_dot_product_attention(qq, kk, vv, scale=scale, **mask)
            return lambda: torch.autograd.grad(out, (qq, kk, vv), t["grad_out"], retain_graph=True)

        rows.append({"backward": f"sdpa {name}", **measure(sdpa_forward, truth, device, args.repeat)})

    ops_error = None
    try:
        torch.ops.load_library(args.ops_lib)
    except (OSError, RuntimeError) as error:
        ops_error = f"{args.ops_lib}: {error}"
    for backend in GAUGEWATCH_BACKENDS:
        row = {"backward": f"gaugewatch {backend}"}
        if ops_error:
            rows.append({**row, "unavailable": ops_error})
            continue
        kwargs = {"is_causal": causal != "none", "scale": scale, "backend": backend,
                  "causal_alignment": causal if causal != "none" else "top_left"}

        def ops_backward():
            return torch.ops.gaugewatch.attention_backward(t["grad_out"], t["q"], t["k"], t["v"], t["out"], t["lse"],
                                                           **kwargs)

        rows.append({**row, **measure(lambda: ops_backward, truth, device, args.repeat)})

    shape = list(t["q"].shape)
    if args.json:
        print(json.dumps({"input": args.input, "device": device, "shape_q": shape, "causal": causal, "scale": scale,
                          "rows": rows}, indent=1))
        return 0
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    print(f"{args.input}: q {shape}, k {list(t['k'].shape)}, causal {causal}, scale {scale:.6g}; {name}")
    print(f"{'backward':<22}{'dQ err':>10}{'dK err':>10}{'dV err':>10}{'ms':>10}")
    for row in rows:
        if "unavailable" in row:
            print(f"{row['backward']:<22}  unavailable: {row['unavailable']}")
        else:
            print(f"{row['backward']:<22}{100 * row['dq_error']:>9.3f}%{100 * row['dk_error']:>9.3f}%"
                  f"{100 * row['dv_error']:>9.3f}%{row['time_ms']:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
