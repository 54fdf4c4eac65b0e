"""One call of gaugewatch::attention_backward on a benchmark shape, for ncu:
  ncu --kernel-name regex:gaugewatch -c 2 --section SpeedOfLight ... \
      python3 bench/kernels/_profile_one.py --backend gproj --d 128
  ncu --kernel-name regex:keyouter_kernel -c 1 --set full ... \
      python3 bench/kernels/_profile_one.py --backend pivot --d 128 --sink
  ncu --kernel-name regex:centring -c 2 --section SpeedOfLight ... \
      python3 bench/kernels/_profile_one.py --backend center_keys --offset
(bf16 and pivot run the key-outer kernel unless --deterministic: then the pair;
gproj runs its key-outer passes by default (at head dim 128 where they run
warp-specialized), the pair with GAUGEWATCH_GPROJ_KERNEL=pair, e.g. its
second pass alone:
  ncu --kernel-name regex:gproj_keys_ws -c 1 ... \
      python3 bench/kernels/_profile_one.py --backend gproj --d 128
center_keys runs the key centring alone on the forward's lse.)
(The leading underscore keeps scripts/device.sh from running it as a benchmark.)
"""
import argparse
import os
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="gproj")
parser.add_argument("--B", type=int, default=4)
parser.add_argument("--H", type=int, default=16)
parser.add_argument("--N", type=int, default=4096)
parser.add_argument("--d", type=int, default=128)
parser.add_argument("--noncausal", action="store_true")
parser.add_argument("--deterministic", action="store_true", help="the two-kernel pair for bf16 and pivot")
parser.add_argument("--sink", action="store_true", help="key 0 is every row's pivot (bench_bf16_backward's sink)")
parser.add_argument("--offset", action="store_true", help="every key shifted by 8 (center_keys centres them)")
parser.add_argument("--Hkv", type=int, default=0, help="kv heads for center_keys (default: H)")
args = parser.parse_args()
build = Path(os.environ.get("GAUGEWATCH_BUILD_DIR", REPO / "build"))
torch.ops.load_library(os.environ.get("GAUGEWATCH_OPS_LIB", str(build / "lib" / "libgaugewatch_ops.so")))
causal = not args.noncausal
q, k, v, do = (torch.randn(args.B, args.H, args.N, args.d, device="cuda").bfloat16() for _ in range(4))
if args.sink:
    q[..., 0] = 4.0
    k[:, :, 0, :] = 0.0
    k[:, :, 0, 0] = 2.0 * args.d ** 0.5
if args.backend == "center_keys":
    hkv = args.Hkv or args.H
    k = torch.randn(args.B, hkv, args.N, args.d, device="cuda").bfloat16()
    if args.offset:
        k += 8.0
    lse = torch.full((args.B, args.H, args.N), 5.0, device="cuda")
    for _ in range(2):
        torch.ops.gaugewatch.center_keys(q, k, lse)
    torch.cuda.synchronize()
    raise SystemExit(0)
out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
torch.ops.gaugewatch.attention_backward(do, q, k, v, out, lse.float(), is_causal=causal, backend=args.backend,
                                        deterministic=args.deterministic)
torch.cuda.synchronize()
