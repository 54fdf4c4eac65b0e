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
docs/numerics.md, "Metrics the monitor reports").
"""

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
        record = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "args": args[3:], "kwargs": dict(kwargs)}
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
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), *args, **kwargs)
    return out.to(q.dtype)


class _StockForwardFp64Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale):
        ctx.save_for_backward(q, k, v)
        ctx.is_causal, ctx.scale = is_causal, scale
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
            out = F.scaled_dot_product_attention(q64, k64, v64, is_causal=ctx.is_causal, scale=ctx.scale)
            dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), grad_out.double())
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def exact_backward_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    """The stock BF16 forward with the gradient computed in FP64 on the same
    operands (and rounded to the input dtype): the backward without its
    rounding, the forward unchanged."""
    if attn_mask is not None or dropout_p or kwargs:
        raise ValueError("exact_backward_attention takes causal or full attention only")
    return _StockForwardFp64Backward.apply(q, k, v, is_causal, scale)
