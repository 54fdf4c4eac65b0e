"""The live attention backward of an unchanged model, checked against FP64 on
its own operands.

`AttentionProbe` is a TorchFunctionMode: while it is active and `armed`,
every F.scaled_dot_product_attention call records its q, k, v (as the op
got them), the gradient that reaches its output (dO) and the gradients the
live backward returned for q, k and v (tensor hooks), in call order (= layer
order for a model that calls attention once per layer). The op itself runs
unchanged, so with libgaugewatch_hooks loaded the backward measured is the
one the hooks library chose for that layer.

`errors_against_fp64` recomputes each recorded call in float64 on the same
(BF16) operands and dO and returns ||dX_live - dX_64|| / ||dX_64|| for X in
Q, K, V, plus the key offset / spread ratio of the call (median over rows,
docs/numerics.md, "Metric definitions").
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class AttentionProbe(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.armed = False
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention or not self.armed:
            return func(*args, **kwargs)
        q, k, v = args[:3]
        out = func(*args, **kwargs)
        record = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "out": out.detach(), "args": args[3:],
                  "kwargs": dict(kwargs)}
        self.calls.append(record)
        for name, tensor in (("dq", q), ("dk", k), ("dv", v), ("do", out)):
            if tensor.requires_grad:
                tensor.register_hook(lambda g, name=name: record.__setitem__(name, g.detach()))
        return out

    def take(self):
        """The calls recorded since the last take; disarms the probe (so that
        the FP64 recompute of errors_against_fp64 is not recorded)."""
        self.armed = False
        calls, self.calls = self.calls, []
        return calls


@contextlib.contextmanager
def math_attention(device_type="cpu"):
    """SDPA's math backend only, in the dtype of its inputs: on the CPU, SDPA
    would otherwise run FP64 and FP32 through the CPU flash op, which a
    loaded hooks library intercepts (its stock backward, but counted as the
    model's passes and layers); and autocast, which lists SDPA among its
    lower-precision ops, would cast FP32 inputs back to BF16."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]), torch.autocast(device_type=device_type, enabled=False):
        yield


def relative_error(x, ref):
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def offset_spread_ratio(q, k, scale, causal):
    """Median over rows of ||mu_k,i|| / sigma_k,i (FP64; every batch and head)."""
    q, k = q.double(), k.double()
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = s.softmax(-1)
    mu = p @ k
    spread = ((p @ (k * k).sum(-1, keepdim=True)).squeeze(-1) - (mu * mu).sum(-1)).clamp_min(0).sqrt()
    ratio = mu.norm(dim=-1) / spread.clamp_min(1e-300)
    return float(ratio.flatten().median())


def errors_against_fp64(record):
    """Live dQ/dK/dV errors of one recorded call against FP64 on its own operands."""
    kwargs = dict(record["kwargs"])
    q64, k64, v64 = (record[n].double().requires_grad_() for n in ("q", "k", "v"))
    with math_attention(q64.device.type):
        out = F.scaled_dot_product_attention(q64, k64, v64, *record["args"], **kwargs)
    out.backward(record["do"].double())
    scale = kwargs.get("scale") or q64.shape[-1] ** -0.5
    result = {"dq_error": relative_error(record["dq"], q64.grad), "dk_error": relative_error(record["dk"], k64.grad),
              "dv_error": relative_error(record["dv"], v64.grad),
              "offset_spread_ratio": offset_spread_ratio(record["q"], record["k"], scale,
                                                         kwargs.get("is_causal", False))}
    del q64, k64, v64, out
    return result


class ReplaceAttention(TorchFunctionMode):
    """Routes F.scaled_dot_product_attention to `attend(q, k, v, *args,
    **kwargs)` while active (innermost mode: an outer AttentionProbe sees the
    call `attend` makes)."""

    def __init__(self, attend):
        super().__init__()
        self.attend = attend

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self.attend(*args, **kwargs)
        return func(*args, **kwargs)


def fp32_math_attention(q, k, v, *args, **kwargs):
    """Attention in FP32 by SDPA's math backend (not a fused op: no hooks
    library intercepts it), the output cast back to the input dtype."""
    with math_attention(q.device.type):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), *args, **kwargs)
    return out.to(q.dtype)


class _Fp64Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        ctx.save_for_backward(q, k, v)
        ctx.is_causal, ctx.scale = is_causal, scale
        with math_attention(q.device.type):
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal, scale=scale)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad(), math_attention(q.device.type):
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(q64, k64, v64, is_causal=ctx.is_causal, scale=ctx.scale)
            dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), grad_out.double())
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def exact_backward_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    """The BF16 forward (computed in FP32 and rounded to the input dtype, as
    the fused kernels do, by the math backend so that no hooks library sees
    it) with the gradient computed in FP64 on the same operands and rounded
    to the input dtype: the backward without its rounding."""
    if attn_mask is not None or dropout_p or kwargs:
        raise ValueError("exact_backward_attention takes causal or full attention only")
    return _Fp64Backward.apply(q, k, v, is_causal, scale)


def save_capture(path, record):
    """Writes a recorded causal or full call as a gaugewatch capture file
    (tools/capture_file.py): the log-sum-exp recomputed in FP32 from q and k."""
    import sys
    import pathlib
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
    import capture_file
    kwargs = record["kwargs"]
    q, k = record["q"], record["k"]
    scale = kwargs.get("scale") or q.shape[-1] ** -0.5
    s = scale * q.float() @ k.float().transpose(-1, -2)
    causal = bool(kwargs.get("is_causal"))
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    capture_file.write_capture(path, q, k, record["v"], record["out"], s.logsumexp(-1), record["do"],
                               "top_left" if causal else "none", scale)
