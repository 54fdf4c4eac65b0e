"""Shared by the kernel benchmarks (the leading underscore keeps
scripts/device.sh from running it): where the ops library is, and how one
call is timed (CUDA events, warm-up, median over inputs rotated between calls
so that L2 does not carry one call's operands into the next)."""

import json
import os
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def find_library():
    env = os.environ.get("GAUGEWATCH_OPS_LIB")
    if env:
        return env
    build = Path(os.environ.get("GAUGEWATCH_BUILD_DIR", REPO / "build"))
    for path in (build / "lib" / "libgaugewatch_ops.so", build / "kernels" / "torch" / "libgaugewatch_ops.so"):
        if path.is_file():
            return str(path)
    return None


def load_ops(bench):
    """torch.ops.gaugewatch, or an exit code: 0 without a CUDA device (nothing
    to time), 1 when libgaugewatch_ops.so is not built."""
    if not torch.cuda.is_available():
        print(f"{bench}: no CUDA device; nothing to time")
        return None, 0
    lib = find_library()
    if lib is None:
        print(f"{bench}: libgaugewatch_ops.so not found (GAUGEWATCH_OPS_LIB / GAUGEWATCH_BUILD_DIR)")
        return None, 1
    torch.ops.load_library(lib)
    return torch.ops.gaugewatch, 0


def warm_gpu(seconds=2.0):
    """Keeps the GPU busy with BF16 matrix products for `seconds` before the
    first measurement of a process, so that its first shape is not timed
    while the clocks still ramp up from idle. (cuDNN's backward of the
    benchmark's first shape measured 1.02-1.29 ms across the committed
    H200 runs before it, the shapes after it 1.51-1.78 and 4.80-5.33 ms,
    while the project's kernels moved by about 1%. With it, the first
    shape's cuDNN time still spread 1.02-1.27 ms over six processes of one
    call, bench/results/bench_bf16_backward-d64-writer-h200-2026-12-04.md:
    the spread is between processes, not the clocks' ramp; compare over
    several processes, scripts/device-ab.sh GW_AB_ROUNDS.)"""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(8):
            torch.mm(a, b)
        torch.cuda.synchronize()
    del a, b


def time_ms(fn, inputs, reps, warmup=2):
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def select_shapes(shapes, spec):
    """The rows of `shapes` (name first) named in `spec`, a comma-separated
    list (empty: all), in `shapes`' order; an unknown name is an error, so
    that a mistyped --shapes does not time less than was asked."""
    wanted = [s for s in spec.split(",") if s]
    names = [row[0] for row in shapes]
    unknown = [s for s in wanted if s not in names]
    if unknown:
        raise SystemExit(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(names)}")
    return [row for row in shapes if not wanted or row[0] in wanted]


def write_results(bench, args, meta, cases, markdown):
    """Prints the markdown and writes {meta, cases, markdown} as JSON to
    --json, else to $GAUGEWATCH_BENCH_OUT/<bench>.json when that is set
    (device.sh), and the markdown to --markdown when given."""
    print(markdown)
    out_dir = os.environ.get("GAUGEWATCH_BENCH_OUT")
    path = args.json or (os.path.join(out_dir, f"{bench}.json") if out_dir else "")
    if path:
        Path(path).write_text(json.dumps({"meta": meta, "cases": cases, "markdown": markdown}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(markdown + "\n")
