"""Small calls of every CUDA backend of gaugewatch::attention_backward, for
compute-sanitizer (memcheck, racecheck, synccheck) in scripts/device.sh:
multi-tile, ragged lengths, every masking mode, packing and GQA, head dims 64,
128 and 256 (256: bf16 and pivot on the head-dim-256 key-outer kernel by
default, gproj and deterministic=True on the mma.sync pair); bf16 and pivot
both on the key-outer path (default: the warp-specialized key-outer kernel) and on the
two-kernel pair (deterministic=True), gproj on the pair (device.sh's
default variant sets GAUGEWATCH_GPROJ_KERNEL=pair; gproj's default at head
dim 128, and deterministic=True); and key centring's two kernels (center_keys) on GQA
with a padded lse, head dims 64, 128 and 256, and on long keys (a share of
many batches). Exits non-zero on any
Python-side failure; the sanitizer's own exit code (--error-exitcode)
reports hazards.

With GAUGEWATCH_GPROJ_KERNEL=key_outer (the library reads it once, when it
loads) the script runs only the key-outer gproj (its warp-specialized first
pass, its row finish and its warp-specialized second pass over the keys)
on the same cases but head dim 256's (the fifth run's):
scripts/device.sh runs it that way a second time under each tool. With
GAUGEWATCH_BF16_KERNEL=key_outer it runs only bf16 and pivot on their
key-outer path (deterministic=False) on the key-outer kernel without warp
specialization and its finish, on the same cases, and with both variables
gproj too (then on the key-outer kernel and the cp.async second pass):
device.sh's third run under each tool. The key-outer gproj's second pass
runs over 256-key blocks by default (at each head dim one case spans two
such blocks); with GAUGEWATCH_GPROJ_KERNEL=key_outer and
GAUGEWATCH_GPROJ_PASS2_KEYS=128 over 128-key blocks: device.sh's fourth
run. With GAUGEWATCH_D256_KERNEL=key_outer set (and
GAUGEWATCH_GPROJ_KERNEL=key_outer, which takes gproj there) it runs only
bf16, pivot and gproj at head dim 256 (deterministic=False), on the
head-dim-256 key-outer kernel and its finish (gproj: and its second pass) (two cases:
GQA, several query tiles and 64-key blocks, a ragged last one): device.sh's
fifth run.

To narrow a report down: --cases 5,6 runs only those entries of CASES (by
index), --runs pivot:pair,bf16:default only those backends on that path
(default: deterministic=False; pair: deterministic=True), and
--no-centring leaves out the centring calls, e.g.
  compute-sanitizer --tool racecheck --kernel-name kns=dkdv_kernel \
    python3 tests/cuda/sanitize_kernels.py --cases 5 --runs pivot:pair --no-centring
"""

import argparse
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
build = Path(os.environ.get("GAUGEWATCH_BUILD_DIR", REPO / "build"))
torch.ops.load_library(os.environ.get("GAUGEWATCH_OPS_LIB", str(build / "lib" / "libgaugewatch_ops.so")))
ops = torch.ops.gaugewatch
GPROJ_KEY_OUTER = os.environ.get("GAUGEWATCH_GPROJ_KERNEL") == "key_outer"
PLAIN_KEY_OUTER = os.environ.get("GAUGEWATCH_BF16_KERNEL") == "key_outer"
D256_KEY_OUTER = os.environ.get("GAUGEWATCH_D256_KERNEL") == "key_outer"

CASES = [
    dict(B=1, Hq=2, Hkv=1, N=70, M=130, d=64, causal=True, alignment="top_left"),
    dict(B=1, Hq=1, Hkv=1, N=130, M=70, d=128, causal=True, alignment="bottom_right"),
    dict(B=2, Hq=2, Hkv=2, N=65, M=65, d=64, causal=False, alignment="top_left"),
    dict(B=1, Hq=2, Hkv=2, N=100, M=90, d=128, causal=True, alignment="top_left",
         cu_q=[0, 1, 60, 60, 100], cu_k=[0, 30, 31, 50, 90]),
    dict(B=1, Hq=4, Hkv=2, N=130, M=70, d=256, causal=True, alignment="bottom_right"),
    # Two 256-key blocks of gproj's wide second pass, the second ragged.
    dict(B=1, Hq=2, Hkv=1, N=200, M=300, d=128, causal=True, alignment="top_left"),
    dict(B=1, Hq=2, Hkv=1, N=200, M=300, d=64, causal=True, alignment="bottom_right"),
    # Several query tiles and 64-key blocks at head dim 256 (GAUGEWATCH_D256_KERNEL=key_outer).
    dict(B=1, Hq=2, Hkv=1, N=150, M=200, d=256, causal=True, alignment="top_left"),
]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--cases", default="", help="comma-separated indices into CASES (default: all)")
parser.add_argument("--runs", default="", help="comma-separated backend:path, path default or pair (default: all)")
parser.add_argument("--no-centring", action="store_true", help="leave out the centring calls")
args = parser.parse_args()
if args.cases:
    try:
        CASES = [CASES[int(i)] for i in args.cases.split(",")]
    except (ValueError, IndexError):
        parser.error(f"--cases {args.cases}: give indices 0..{len(CASES) - 1}, comma-separated")
RUNS = None
if args.runs:
    RUNS = []
    for item in args.runs.split(","):
        backend, _, path = item.partition(":")
        if backend not in ("bf16", "gproj", "pivot", "fp32") or path not in ("", "default", "pair"):
            parser.error(f"--runs {item}: give backend:path, backend bf16, gproj, pivot or fp32, "
                         f"path default or pair")
        RUNS.append((backend, path == "pair"))

for case in CASES:
    if D256_KEY_OUTER:
        if case["d"] != 256:
            continue
    elif (GPROJ_KEY_OUTER or PLAIN_KEY_OUTER) and case["d"] == 256:
        continue  # head dim 256's key-outer kernels: the D256_KEY_OUTER run
    g = torch.Generator(device="cuda").manual_seed(0)
    B, Hq, Hkv, N, M, d = (case[x] for x in ("B", "Hq", "Hkv", "N", "M", "d"))
    q = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, Hkv, M, d, device="cuda", generator=g).bfloat16()
    v = torch.randn(B, Hkv, M, d, device="cuda", generator=g).bfloat16()
    do = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    out = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    lse = torch.full((B, Hq, N), 5.0, device="cuda")
    kw = dict(is_causal=case["causal"], causal_alignment=case["alignment"])
    if "cu_q" in case:
        kw.update(cu_seqlens_q=torch.tensor(case["cu_q"], dtype=torch.int32, device="cuda"),
                  cu_seqlens_k=torch.tensor(case["cu_k"], dtype=torch.int32, device="cuda"))
    if D256_KEY_OUTER:
        runs = [("bf16", False), ("pivot", False), ("gproj", False)]
    elif GPROJ_KEY_OUTER or PLAIN_KEY_OUTER:
        runs = ([("gproj", False)] if GPROJ_KEY_OUTER else []) + (
            [("bf16", False), ("pivot", False)] if PLAIN_KEY_OUTER else [])
    else:
        runs = ([(b, False) for b in ("bf16", "gproj", "pivot", "fp32")] +
                [(b, True) for b in ("bf16", "gproj", "pivot")])
    if RUNS is not None:
        runs = [r for r in runs if r in RUNS]
    for backend, deterministic in runs:
        grads = ops.attention_backward(do, q, k, v, out, lse, backend=backend, deterministic=deterministic, **kw)
        torch.cuda.synchronize()
        if not all(torch.isfinite(x).all().item() for x in grads):
            print(f"non-finite gradient: backend {backend}, deterministic {deterministic}, case {case}")
            sys.exit(1)

if D256_KEY_OUTER:
    cases = sum(c["d"] == 256 for c in CASES)
    print(f"sanitize_kernels: {cases} head-dim-256 cases of bf16, pivot and gproj on the key-outer kernels ran")
    sys.exit(0)
if GPROJ_KEY_OUTER or PLAIN_KEY_OUTER:
    ran = ", ".join(backend for backend, _ in runs)
    kernel = ("the key-outer kernel without warp specialization" if PLAIN_KEY_OUTER
              else "the warp-specialized kernels")
    cases = sum(c["d"] != 256 for c in CASES)
    print(f"sanitize_kernels: {cases} cases of the key-outer path ({ran}; first pass on {kernel}) ran")
    sys.exit(0)

CENTRING = [dict(B=2, Hq=4, Hkv=2, N=300, L=320, d=d) for d in (64, 128, 256)]
# 7000 keys of d = 128 over a cluster of 8: 875 a block, 14 batches of the
# summation order; the apply kernel's blocks take 64 keys or more each.
CENTRING.append(dict(B=1, Hq=2, Hkv=1, N=7000, L=7000, d=128))
for case in [] if args.no_centring else CENTRING:
    g = torch.Generator(device="cuda").manual_seed(1)
    B, Hq, Hkv, N, L, d = (case[x] for x in ("B", "Hq", "Hkv", "N", "L", "d"))
    q = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    # An offset shared by every key: the centring has something to take out.
    k = (torch.randn(B, Hkv, N, d, device="cuda", generator=g) + 8.0).bfloat16()
    lse = torch.full((B, Hq, L), 5.0, device="cuda")
    for policy in ("auto", "always"):
        k_c, lse_c, kbar = ops.center_keys(q, k, lse, policy=policy)
        torch.cuda.synchronize()
        if not (torch.isfinite(k_c).all().item() and torch.isfinite(lse_c).all().item()):
            print(f"non-finite centring output: policy {policy}, case {case}")
            sys.exit(1)
print(f"sanitize_kernels: {len(CASES)} cases x {len(runs)} runs (backends, default path and pair) "
      f"and {0 if args.no_centring else len(CENTRING)} centring cases ran")
