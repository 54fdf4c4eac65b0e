"""BF16 attention operands shared by the GPU tests (a helper module, not a
test file): the four-key witness (docs/numerics.md, "The four-key witness")
and the random / sink-like families the accuracy tests use. All on the CPU;
callers move them."""

import torch


def witness(d=64):
    """q, k, v, grad_out of the witness: with scale 0.125 every fused BF16
    backward returns dq[0] = -24 where the truth is 0."""
    q = torch.zeros(1, 1, 1, d)
    k = torch.zeros(1, 1, 4, d)
    k[..., 0] = 65536.0
    k[0, 0, :, 1] = torch.arange(4.0)
    v = torch.zeros(1, 1, 4, d)
    v[0, 0, 0, 0], v[0, 0, 0, 1], v[0, 0, 1, 0], v[0, 0, 2, 1] = 4.0, 3 / 256, -4.0, -3 / 256
    grad_out = torch.zeros(1, 1, 1, d)
    grad_out[..., :2] = 1.0
    return [t.bfloat16() for t in (q, k, v, grad_out)]


def make_inputs(kind, *, heads=4, n=1024, d=64, seed=0):
    """"random": unit normal operands; "sink": sharp queries (gain 20) and a
    common key offset of RMS 200 (d = 64) or 300 (d = 128)."""
    g = torch.Generator().manual_seed(seed)
    gain, key_offset = (1.0, 0.0) if kind == "random" else (20.0, 200.0 if d == 64 else 300.0)
    q = (gain * torch.randn(1, heads, n, d, generator=g)).bfloat16()
    k = torch.randn(1, heads, n, d, generator=g)
    k = (k + key_offset * torch.randn(1, heads, 1, d, generator=g)).bfloat16()
    v = torch.randn(1, heads, n, d, generator=g).bfloat16()
    grad_out = torch.randn(1, heads, n, d, generator=g).bfloat16()
    return q, k, v, grad_out
