"""Backend "center" as the hooks run it (hooks/center_backend.cpp), timed
side by side with the stock backward it wraps, for bench_bf16_backward.py (the
leading underscore keeps scripts/device.sh from running it on its own).

Per call the hooks run gaugewatch::center_keys on the intercepted op's saved
q, k and lse (cuDNN's (B, H, N, 1) lse as (B, H, N)), then that op's own
backward on (q, K - kbar, v, out, lse - scale q.kbar) with the forward's RNG
state and lengths. Timed here, per shape, in one process on the same operands
(CUDA events, median, inputs rotated so L2 does not carry over):
  stock        the op's backward, called as the hooks call it (the aten op,
               not autograd)
  center       center_keys + the same backward on the centred operands
  center_keys  the centring alone
for the flash and cuDNN ops (a shape an op refuses is reported, not timed), on
random keys (policy auto centres nothing: q is not read) and on keys with a
common offset (every coordinate centred: q read for q . kbar). Target (issue
11): center <= 1.08x stock on every shape.

On its own (only this table, bench_bf16_backward.py's shapes):
  python3 bench/kernels/_center.py [--shapes A,B] [--reps 20] [--rotate 3] [--json F] [--markdown F]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from _common import load_ops, select_shapes, time_ms

KEYS = ("random", "offset")


def _operands(B, Hq, Hkv, N, d, seed, keys):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    k = torch.randn(B, Hkv, N, d, device="cuda", generator=g)
    if keys == "offset":
        # A common key offset of RMS 50 per coordinate (per head): |mean| >> spread.
        k = k + 50.0 * torch.randn(B, Hkv, 1, d, device="cuda", generator=g)
    v = torch.randn(B, Hkv, N, d, device="cuda", generator=g).bfloat16()
    do = torch.randn(B, Hq, N, d, device="cuda", generator=g).bfloat16()
    return q, k.bfloat16(), v, do


def _flash(q, k, v, do, causal):
    """Forward once; returns backward(k, lse) -> grads and the saved lse."""
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False)

    def backward(k_used, lse_used):
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            do, q, k_used, v, out, lse_used, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset)

    return backward, lse


def _cudnn(q, k, v, do, causal):
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False)

    def backward(k_used, lse_used):
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k_used, v, out, lse_used, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal)

    return backward, lse


OPS = {"flash": _flash, "cudnn": _cudnn}


def _centred(ops, q, k, lse):
    """What hooks/center_backend.cpp hands the stock backward."""
    cudnn_layout = lse.dim() == 4 and lse.shape[3] == 1
    k_centred, lse_shifted, _ = ops.center_keys(q, k, lse[..., 0] if cudnn_layout else lse)
    return k_centred, lse_shifted.unsqueeze(3) if cudnn_layout else lse_shifted


def time_center(ops, B, Hq, Hkv, N, d, causal, reps, rotate):
    """{op: {keys: {stock_ms, center_ms, center_keys_ms, center_over_stock} or {error}}}."""
    result = {}
    for op, forward in OPS.items():
        result[op] = {}
        for keys in KEYS:
            try:
                calls = []
                for seed in range(rotate):
                    q, k, v, do = _operands(B, Hq, Hkv, N, d, seed, keys)
                    backward, lse = forward(q, k, v, do, causal)
                    calls.append(dict(q=q, k=k, lse=lse, backward=backward))
                stock = time_ms(lambda x: x["backward"](x["k"], x["lse"]), calls, reps, warmup=3)
                center = time_ms(lambda x: x["backward"](*_centred(ops, x["q"], x["k"], x["lse"])), calls, reps,
                                 warmup=3)
                keys_only = time_ms(lambda x: _centred(ops, x["q"], x["k"], x["lse"]), calls, reps, warmup=3)
                _, _, kbar = ops.center_keys(calls[0]["q"], calls[0]["k"],
                                             calls[0]["lse"][..., 0] if calls[0]["lse"].dim() == 4 else calls[0]["lse"])
                result[op][keys] = {"stock_ms": stock, "center_ms": center, "center_keys_ms": keys_only,
                                    "center_over_stock": center / stock,
                                    "centred_fraction": float((kbar != 0).float().mean())}
            except RuntimeError as exc:  # an op that refuses the shape (e.g. GQA)
                result[op][keys] = {"error": str(exc).splitlines()[0][:200]}
            finally:
                calls = None
                torch.cuda.empty_cache()
    return result


def markdown(cases):
    """The table of every shape's center timings (rows carry them as row["center"])."""
    lines = ["", "Backend center as the hooks run it (center_keys + the op's own backward on the centred operands) "
             "against that backward alone, same operands, one process: ms; keys: random (nothing centred) / "
             "offset (every coordinate centred); target center/stock <= 1.08", "",
             "| shape | op | keys | centred | stock ms | center ms | center_keys ms | center/stock |",
             "|---" * 8 + "|"]
    for row in cases:
        for op, by_keys in row.get("center", {}).items():
            for keys, t in by_keys.items():
                if "error" in t:
                    lines.append(f"| {row['shape']} | {op} | {keys} | n/a | n/a | n/a | n/a | {t['error'][:60]} |")
                else:
                    lines.append(f"| {row['shape']} | {op} | {keys} | {t['centred_fraction']:.0%} | "
                                 f"{t['stock_ms']:.3f} | {t['center_ms']:.3f} | {t['center_keys_ms']:.3f} | "
                                 f"{t['center_over_stock']:.3f} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rotate", type=int, default=3)
    parser.add_argument("--shapes", default="", help="comma-separated subset of bench_bf16_backward's shape names")
    parser.add_argument("--json", default="")
    parser.add_argument("--markdown", default="")
    args = parser.parse_args()
    ops, rc = load_ops("center")
    if ops is None:
        return rc
    from bench_bf16_backward import SHAPES

    cases = []
    for name, B, Hq, Hkv, N, d, causal in select_shapes(SHAPES, args.shapes):
        cases.append({"shape": name, "center": time_center(ops, B, Hq, Hkv, N, d, causal, args.reps, args.rotate)})
        print(json.dumps(cases[-1]), flush=True)
    props = torch.cuda.get_device_properties(0)
    text = "\n".join([f"GPU {props.name}, torch {torch.__version__}, median of {args.reps}"] + markdown(cases))
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": props.name, "cases": cases}, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
