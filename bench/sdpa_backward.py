"""PyTorch SDPA BF16 backward times on the GPU: the baseline gaugewatch's
kernels are measured against (issue: kernels). One process, same inputs for
every backend, CUDA events, warm-up, median over repeats, inputs rotated so
repeats do not hit a warm L2.

Effective TFLOP/s = 2.5 x forward FLOPs (4 B H N M d), halved when causal.
Writes sdpa_backward.json (and .md) to $GAUGEWATCH_BENCH_OUT (default .)
and prints a markdown table.

  python3 bench/sdpa_backward.py [--repeats 20]
"""

import argparse
import datetime
import json
import os
import statistics

import torch
import torch.nn.functional as F

SHAPES = [  # (name, B, Hq, Hkv, N, d, causal)
    ("B4 H16 N4096 d64 causal", 4, 16, 16, 4096, 64, True),
    ("B4 H16 N4096 d128 causal", 4, 16, 16, 4096, 128, True),
    ("B2 H16 N8192 d128", 2, 16, 16, 8192, 128, False),
    ("B4 H32/8 GQA N4096 d128 causal", 4, 32, 8, 4096, 128, True),
]


def time_backward(backend, b, hq, hkv, n, d, causal, repeats, rotate=3):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    sets = []
    for i in range(rotate):
        g = torch.Generator(device="cuda").manual_seed(i)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        v = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        grad_out = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
        with sdpa_kernel([kernel]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
        sets.append((out, (q, k, v), grad_out))
    times = []
    for i in range(5 + repeats):
        out, inputs, grad_out = sets[i % rotate]
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
        stop.record()
        stop.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(stop))
    return statistics.median(times), min(times), max(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sdpa_backward: no CUDA GPU, nothing to measure")
        return
    props = torch.cuda.get_device_properties(0)
    meta = {"date": datetime.date.today().isoformat(), "gpu": props.name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "driver": os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().strip()}
    rows = []
    for name, b, hq, hkv, n, d, causal in SHAPES:
        flops = 2.5 * 4 * b * hq * n * n * d / (2 if causal else 1)
        entry = {"shape": name, "backends": {}}
        for backend in ("flash", "cudnn", "efficient"):
            try:
                median, low, high = time_backward(backend, b, hq, hkv, n, d, causal, args.repeats)
                entry["backends"][backend] = {"ms": median, "min_ms": low, "max_ms": high,
                                              "tflops": flops / median / 1e9}
            except RuntimeError as error:  # a backend may not support a shape
                entry["backends"][backend] = {"error": str(error).splitlines()[0][:200]}
            torch.cuda.empty_cache()
        rows.append(entry)
    lines = [f"SDPA BF16 backward on {meta['gpu']} (driver {meta['driver']}, torch {meta['torch']}, CUDA "
             f"{meta['cuda']}, cuDNN {meta['cudnn']}), {meta['date']}; median of {args.repeats} after 5 warm-up",
             "", "| shape | flash ms (TFLOP/s) | cuDNN ms (TFLOP/s) | efficient ms (TFLOP/s) | flash / cuDNN |",
             "|---|---|---|---|---|"]
    for entry in rows:
        cells = []
        for backend in ("flash", "cudnn", "efficient"):
            r = entry["backends"][backend]
            cells.append(f"{r['ms']:.3f} ({r['tflops']:.0f})" if "ms" in r else "unsupported")
        f, c = entry["backends"]["flash"], entry["backends"]["cudnn"]
        ratio = f"{f['ms'] / c['ms']:.2f}" if "ms" in f and "ms" in c else "-"
        lines.append(f"| {entry['shape']} | {' | '.join(cells)} | {ratio} |")
    table = "\n".join(lines)
    print(table)
    out_dir = os.environ.get("GAUGEWATCH_BENCH_OUT", ".")
    with open(os.path.join(out_dir, "sdpa_backward.json"), "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=2)
    with open(os.path.join(out_dir, "sdpa_backward.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
