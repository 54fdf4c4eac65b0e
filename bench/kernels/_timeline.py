"""Where one call of gaugewatch::attention_backward spends its time beyond
its kernels: the host's time in the call (no synchronization), the call's
time by CUDA events as bench_bf16_backward.py takes it, and from
torch.profiler the GPU activities of one call (kernels, memsets) with their
start relative to the call's start on the host, so that host work before the
first launch and gaps between launches show.
  python3 bench/kernels/_timeline.py --backend pivot --B 2 --N 8192 --noncausal
(The leading underscore keeps scripts/device.sh from running it.)
"""
import argparse
import statistics
import time

import torch

from _common import load_ops, time_ms

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="pivot")
parser.add_argument("--B", type=int, default=4)
parser.add_argument("--H", type=int, default=16)
parser.add_argument("--N", type=int, default=4096)
parser.add_argument("--d", type=int, default=128)
parser.add_argument("--noncausal", action="store_true")
parser.add_argument("--reps", type=int, default=20)
args = parser.parse_args()
ops, rc = load_ops("_timeline")
if ops is None:
    raise SystemExit(rc)
causal = not args.noncausal
q, k, v, do = (torch.randn(args.B, args.H, args.N, args.d, device="cuda").bfloat16() for _ in range(4))
out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
lse = lse.float()


def call(_=None):
    return ops.attention_backward(do, q, k, v, out, lse, is_causal=causal, backend=args.backend)


event_ms = time_ms(call, [None], args.reps, warmup=3)
host_us = []
for _ in range(args.reps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    host_us.append((time.perf_counter() - t0) * 1e6)
torch.cuda.synchronize()

from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    torch.cuda.synchronize()
    call()
    torch.cuda.synchronize()
events = prof.events()
op = min((e for e in events if "attention_backward" in e.name and e.device_type.name == "CPU"),
         key=lambda e: e.time_range.start)
t0 = op.time_range.start
gpu = sorted((e for e in events if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
print(f"{args.backend} B{args.B} H{args.H} N{args.N} d{args.d} {'causal' if causal else 'noncausal'}: "
      f"event {event_ms * 1e3:.0f} us, host call {statistics.median(host_us):.0f} us (median of {args.reps}), "
      f"host op in the profile {op.time_range.end - op.time_range.start:.0f} us")
busy = 0.0
end_prev = None
for e in gpu:
    start, end = e.time_range.start - t0, e.time_range.end - t0
    gap = "" if end_prev is None else f" gap {start - end_prev:.0f}"
    print(f"  {start:9.0f} +{end - start:8.1f}{gap}  {e.name[:90]}")
    busy += end - start
    end_prev = end
api = sorted((e for e in events if e.device_type.name == "CPU" and e.name.startswith("cu")
              and op.time_range.start <= e.time_range.start <= op.time_range.end), key=lambda e: e.time_range.start)
print("  host: runtime and driver calls inside the op")
for e in api:
    print(f"  {e.time_range.start - t0:9.0f} +{e.time_range.end - e.time_range.start:8.1f}  {e.name[:60]}")
if gpu:
    print(f"  first GPU activity at {gpu[0].time_range.start - t0:.0f} us, last ends at "
          f"{gpu[-1].time_range.end - t0:.0f} us, busy {busy:.0f} us")
