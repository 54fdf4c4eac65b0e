"""The attn_mask keyword and key centring of the gaugewatch torch ops, on the CPU.

- attention_backward / attention_backward_rows / attention_metrics with bool and
  additive masks of every broadcast shape SDPA accepts (key padding left and
  right, stride-0 views, fully masked rows, with is_causal) against float64
  autograd of torch's CPU SDPA on the same mask.
- center_keys: its contract (kbar on the dtype's grid, per (batch, kv head);
  k_centred = k - kbar; lse shifted for i < N only; GQA; policies) and
  torch.library.opcheck.
- backend "center" (the CPU flash backward on centred keys): sink-like inputs
  from > 50% dQ error to < 2%, random inputs exactly the stock result.

Run:  GAUGEWATCH_BUILD_DIR=build .venv/bin/python -m pytest tests/python/test_ops_mask_center.py -q
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from test_ops import ops, rel  # the ops library, loaded once (skips the module when it is not built)


def operands(B=2, Hq=2, Hkv=2, N=24, M=32, d=64, key_offset=0.0, q_gain=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (q_gain * torch.randn(B, Hq, N, d, generator=g)).bfloat16()
    k = (torch.randn(B, Hkv, M, d, generator=g) + key_offset * torch.randn(B, Hkv, 1, d, generator=g)).bfloat16()
    v = torch.randn(B, Hkv, M, d, generator=g).bfloat16()
    grad_out = torch.randn(B, Hq, N, d, generator=g).bfloat16()
    return q, k, v, grad_out


def sdpa_truth(q, k, v, grad_out, mask, is_causal=False):
    """float64 autograd of torch's CPU SDPA (math path) with `mask`, plus the
    forward's out (BF16) and lse (float32; +inf for rows that see no key)."""
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    if is_causal:  # SDPA takes no mask together with is_causal: fold the causal part into the mask
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
        mask = causal if mask is None else (mask & causal if mask.dtype == torch.bool
                                            else mask.double().masked_fill(~causal, -math.inf))
    sdpa_mask = mask if mask is None or mask.dtype == torch.bool else mask.double()
    out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=sdpa_mask, enable_gqa=gqa)
    out.backward(grad_out.double())
    group = q.shape[1] // k.shape[1]
    s = qd.detach() @ kd.detach().repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if sdpa_mask is not None:
        s = s.masked_fill(~sdpa_mask, -math.inf) if sdpa_mask.dtype == torch.bool else s + sdpa_mask
    lse = torch.logsumexp(s, -1).float()
    lse[torch.isneginf(lse)] = math.inf
    return (qd.grad, kd.grad, vd.grad), out.detach().bfloat16(), lse


def key_padding(B, M, valid, left):
    """(B, 1, 1, M) bool: the last (left padded) or first (right padded) valid[b] keys take part."""
    j = torch.arange(M)
    lengths = torch.tensor(valid)[:, None]
    keep = j[None, :] >= M - lengths if left else j[None, :] < lengths
    return keep[:, None, None, :]


B, HQ, N, M = 2, 2, 24, 32

MASKS = {
    "bool_right_padded": lambda: key_padding(B, M, [32, 19], left=False),
    "bool_left_padded": lambda: key_padding(B, M, [32, 7], left=True),
    "bool_keys_1xM": lambda: (torch.arange(M) % 3 != 0)[None, :],
    "bool_rows_keys_2d": lambda: torch.rand(N, M, generator=torch.Generator().manual_seed(1)) > 0.3,
    "bool_expanded_stride0": lambda: key_padding(B, M, [20, 32], left=False).expand(B, HQ, N, M),
    "bool_fully_masked_rows": lambda: torch.ones(N, M, dtype=torch.bool).index_fill(0, torch.tensor([0, 5]), False),
    "additive_per_head": lambda: torch.randn(1, HQ, N, M, generator=torch.Generator().manual_seed(2)).bfloat16(),
    "additive_padding_inf": lambda: torch.zeros(B, 1, 1, M).masked_fill(~key_padding(B, M, [25, 11], True),
                                                                        -math.inf).bfloat16(),
    "additive_per_batch_row": lambda: (3 * torch.randn(B, 1, N, 1, generator=torch.Generator().manual_seed(3))
                                       ).bfloat16(),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_masked_backends_match_sdpa_float64(name):
    mask = MASKS[name]()
    q, k, v, grad_out = operands(B, HQ, HQ, N, M)
    truth, out, lse = sdpa_truth(q, k, v, grad_out, mask)
    args = (grad_out, q, k, v, out, lse)
    fp64 = ops.attention_backward(*args, backend="fp64", attn_mask=mask)
    for got, want in zip(fp64, truth):
        assert rel(got, want) < 1e-12
    fp32 = ops.attention_backward(*args, backend="fp32", attn_mask=mask)
    for got, want in zip(fp32, truth):
        assert rel(got, want) < 1e-5
    for backend in ("bf16", "gproj", "pivot", "center"):
        dq, dk, dv = ops.attention_backward(*args, backend=backend, attn_mask=mask)
        assert dq.dtype == torch.bfloat16
        assert rel(dq, truth[0]) < 0.01, backend
        assert rel(dk, truth[1]) < 0.01, backend
        assert rel(dv, truth[2]) < 0.01, backend
    if name == "bool_fully_masked_rows":  # as SDPA: zero output and gradients for those rows
        assert truth[0][:, :, [0, 5]].abs().max() == 0
        for backend in ("fp64", "fp32", "gproj", "center"):
            assert ops.attention_backward(*args, backend=backend, attn_mask=mask)[0][:, :, [0, 5]].abs().max() == 0


@pytest.mark.parametrize("left", [False, True], ids=["right_padded", "left_padded"])
def test_mask_with_causal_and_gqa(left):
    q, k, v, grad_out = operands(B=2, Hq=4, Hkv=2, N=32, M=32, seed=4)
    mask = key_padding(2, 32, [32, 21], left)
    truth, out, lse = sdpa_truth(q, k, v, grad_out, mask, is_causal=True)
    args = (grad_out, q, k, v, out, lse)
    got = ops.attention_backward(*args, backend="fp64", is_causal=True, attn_mask=mask)
    for g, want in zip(got, truth):
        assert rel(g, want) < 1e-12
    center = ops.attention_backward(*args, backend="center", is_causal=True, attn_mask=mask)
    assert rel(center[0], truth[0]) < 0.01


def test_rows_op_with_mask_matches_truth_on_chosen_rows():
    q, k, v, grad_out = operands(seed=5)
    mask = key_padding(B, M, [30, 9], left=True)
    slices, rows = torch.tensor([0, 3]), torch.tensor([1, 7, 20])
    keep = torch.zeros(B * HQ, N, 1)
    keep[slices[:, None], rows[None, :]] = 1
    masked_grad = (grad_out.reshape(B * HQ, N, -1) * keep).reshape(grad_out.shape).bfloat16()
    truth, out, lse = sdpa_truth(q, k, v, masked_grad, mask)
    dq, dk, dv = ops.attention_backward_rows(grad_out, q, k, v, out, lse, slices, rows, attn_mask=mask)
    want_dq = truth[0].reshape(B * HQ, N, -1)[slices][:, rows]
    assert rel(dq, want_dq) < 1e-5
    assert rel(dk, truth[1]) < 1e-5
    assert rel(dv, truth[2]) < 1e-5


def test_metrics_measure_the_masked_call():
    """Padded keys far from the others (a false alarm if the mask were ignored):
    the live discrepancy is the true BF16 error of the masked call."""
    q, k, v, grad_out = operands(seed=6)
    k = k.clone()
    k[:, :, 20:] = 300.0
    mask = key_padding(B, M, [20, 20], left=False)
    truth, out, lse = sdpa_truth(q, k, v, grad_out, mask)
    names = ops.metric_names()
    metrics = ops.attention_metrics(grad_out, q, k, v, out, lse, attn_mask=mask)
    live = ops.attention_backward(grad_out, q, k, v, out, lse, backend="bf16", attn_mask=mask)
    true_error = rel(live[0], truth[0])
    measured = metrics[names.index("live_dq_discrepancy")].item()
    assert true_error < 0.01
    assert measured == pytest.approx(true_error, rel=0.05)
    assert metrics[names.index("key_offset_median")].item() < 20  # padded keys carry no probability


def test_mask_preconditions_are_checked():
    q, k, v, grad_out = operands()
    truth, out, lse = sdpa_truth(q, k, v, grad_out, None)
    args = (grad_out, q, k, v, out, lse)
    with pytest.raises(RuntimeError, match="not broadcastable"):
        ops.attention_backward(*args, backend="fp32", attn_mask=torch.ones(N, M + 1, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="bool .* or a floating"):
        ops.attention_backward(*args, backend="fp32", attn_mask=torch.ones(N, M, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="1 to 4 dimensions"):
        ops.attention_metrics(*args, attn_mask=torch.ones(1, 1, 1, N, M, dtype=torch.bool))


def test_opcheck_masked_ops():
    q, k, v, grad_out = operands(N=8, M=12, seed=7)
    mask = key_padding(B, 12, [12, 5], left=True)
    _, out, lse = sdpa_truth(q, k, v, grad_out, mask)
    args = (grad_out, q, k, v, out, lse)
    torch.library.opcheck(ops.attention_backward.default, args, {"backend": "gproj", "attn_mask": mask})
    torch.library.opcheck(ops.attention_backward.default, args, {"backend": "center", "attn_mask": mask})
    torch.library.opcheck(ops.attention_metrics.default, args, {"attn_mask": mask.float()})


# --- center_keys ---------------------------------------------------------------------------------


def test_center_keys_contract_bf16_gqa_padded_lse():
    q, k, _, _ = operands(B=2, Hq=4, Hkv=2, N=16, M=40, key_offset=200.0, q_gain=10.0, seed=8)
    L = 24  # the efficient op pads lse beyond N
    lse = torch.randn(2, 4, L)
    k_centred, lse_shifted, kbar = ops.center_keys(q, k, lse)
    assert kbar.shape == (2, 2, 64) and kbar.dtype == torch.bfloat16
    assert k_centred.dtype == torch.bfloat16 and lse_shifted.dtype == torch.float32
    # kbar is the mean key rounded to BF16 where the offset dominates (here: most coordinates).
    mean = k.double().mean(2)
    spread = k.double().std(2, unbiased=False)
    centred = mean.abs() > 2 * spread
    assert centred.float().mean() > 0.9
    assert torch.equal(kbar[centred], mean[centred].float().bfloat16())
    assert (kbar[~centred] == 0).all()
    assert torch.equal(k_centred, (k.float() - kbar.float()[:, :, None, :]).bfloat16())
    # lse - scale q.kbar of the query head's kv head, rows < N only: the dot in
    # FP64, then FP32 (the definition the CUDA kernel follows bit for bit).
    kv = kbar.double().repeat_interleave(2, 1)
    dot = (q.double() @ kv[..., None]).squeeze(-1).float()
    want = lse[..., :16] - dot * torch.tensor(1 / 8.0, dtype=torch.float32)
    assert torch.equal(lse_shifted[..., :16], want)
    assert torch.equal(lse_shifted[..., 16:], lse[..., 16:])


def test_center_keys_policies_and_dtypes():
    q, k, _, _ = operands(N=8, M=16, seed=9)  # no key offset
    lse = torch.randn(B, HQ, 8)
    _, lse_auto, kbar_auto = ops.center_keys(q, k, lse)
    assert (kbar_auto == 0).all(), "auto centres nothing on keys without an offset"
    assert torch.equal(lse_auto, lse)
    _, _, kbar_always = ops.center_keys(q, k, lse, policy="always")
    assert torch.equal(kbar_always, k.double().mean(2).float().bfloat16())
    k_never, lse_never, kbar_never = ops.center_keys(q, k, lse, policy="never")
    assert (kbar_never == 0).all() and torch.equal(k_never, k) and torch.equal(lse_never, lse)
    for dtype in (torch.float16, torch.float32):
        kf = (k.float() + 500).to(dtype)
        k_centred, _, kbar = ops.center_keys(q.to(dtype), kf, lse, scale=0.3)
        assert kbar.dtype == dtype and k_centred.dtype == dtype
        assert torch.equal(kbar, kf.double().mean(2).to(dtype))
    with pytest.raises(RuntimeError, match="unknown centring policy"):
        ops.center_keys(q, k, lse, policy="sometimes")
    with pytest.raises(RuntimeError, match="L >= N"):
        ops.center_keys(q, k, lse[..., :4])


def test_center_keys_layout_follows_k():
    """k - kbar is dense in k's dimension order on every device (CPU here,
    Meta through opcheck; CUDA in test_gpu_center_masks.py): SDPA's transposed
    (B, M, H, d) view keeps its strides, a slice of a fused qkv projection
    gets them without the gaps, a contiguous k stays contiguous."""
    B, H, N, d = 2, 2, 12, 64
    g = torch.Generator().manual_seed(12)
    q = torch.randn(B, H, N, d, generator=g).bfloat16()
    lse = torch.randn(B, H, N)
    qkv = (torch.randn(B, N, 3, H, d, generator=g) + 100.0).bfloat16()
    transposed = qkv[:, :, 1].contiguous().transpose(1, 2)
    fused = qkv[:, :, 1].transpose(1, 2)
    assert not fused.is_contiguous() and transposed.stride() == (N * H * d, d, H * d, 1)
    in_row_order, contiguous = (N * H * d, d, H * d, 1), (H * N * d, N * d, d, 1)
    for k, want in ((transposed, in_row_order), (fused, in_row_order), (fused.contiguous(), contiguous)):
        k_centred, _, kbar = ops.center_keys(q, k, lse)
        assert k_centred.stride() == want, k.stride()
        assert torch.equal(k_centred, (k.float() - kbar.float()[:, :, None]).bfloat16())
        with FakeTensorMode() as fake:
            fake_centred = ops.center_keys(fake.from_tensor(q), fake.from_tensor(k), fake.from_tensor(lse))[0]
        assert fake_centred.stride() == want, "the Meta kernel gives the same layout"


def test_opcheck_center_keys():
    q, k, _, _ = operands(B=1, Hq=4, Hkv=1, N=8, M=12, key_offset=100.0, seed=10)
    lse = torch.randn(1, 4, 16)
    torch.library.opcheck(ops.center_keys.default, (q, k, lse), {})
    torch.library.opcheck(ops.center_keys.default, (q, k, lse), {"scale": 0.2, "policy": "always"})


# --- backend "center": accuracy -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sink_offset250_gain25", "sink_offset2000_gain8_noncausal", "random"])
def test_center_accuracy(kind, record_line):
    """CPU flash backward (the stock CPU backward) with and without centring,
    against float64; on the H200 the same comparison reads sink 97-562% ->
    0.7-1.5% (docs/numerics.md, Key centring)."""
    offset, gain, causal = {"sink_offset250_gain25": (250.0, 25.0, True),
                            "sink_offset2000_gain8_noncausal": (2000.0, 8.0, False),
                            "random": (0.0, 1.0, True)}[kind]
    q, k, v, grad_out = operands(B=1, Hq=2, Hkv=2, N=256, M=256, key_offset=offset, q_gain=gain, seed=11)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    truth, _, _ = sdpa_truth(q, k, v, grad_out, None, is_causal=causal)
    stock = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0,
                                                                                  causal)
    center = ops.attention_backward(grad_out, q, k, v, out, lse, is_causal=causal, backend="center")
    stock_dq, center_dq = rel(stock[0], truth[0]), rel(center[0], truth[0])
    record_line(f"center accuracy {kind}: CPU flash dQ {100 * stock_dq:.3g}% -> center {100 * center_dq:.3g}%, "
                f"dK {100 * rel(stock[1], truth[1]):.3g}% -> {100 * rel(center[1], truth[1]):.3g}%")
    if kind == "random":
        for a, b in zip(center, stock):
            assert torch.equal(a, b)
    else:
        assert stock_dq > 0.5
        assert center_dq < 0.02
        assert rel(center[1], truth[1]) < 0.02


@pytest.mark.parametrize("layout", ["bottom_right", "packed_top_left", "packed_bottom_right_masked"])
def test_center_backend_on_layouts_the_cpu_flash_op_lacks(layout):
    """bottom-right causal alignment and packed sequences reach the CPU flash
    backward as an explicit mask (with attn_mask folded in): same gradients
    as the fp64 reference within BF16 accuracy, key offset removed."""
    q, k, v, grad_out = operands(B=1, Hq=2, Hkv=1, N=40, M=48, key_offset=100.0, q_gain=8.0, seed=12)
    kw = dict(is_causal=True, causal_alignment="top_left")
    if layout == "bottom_right":
        kw["causal_alignment"] = "bottom_right"
    else:
        kw.update(cu_seqlens_q=torch.tensor([0, 15, 40]), cu_seqlens_k=torch.tensor([0, 20, 48]))
    if layout == "packed_bottom_right_masked":
        kw["causal_alignment"] = "bottom_right"
        kw["attn_mask"] = key_padding(1, 48, [44], left=False)
    out, lse = exact_forward(q, k, v, **kw)
    exact = ops.attention_backward(grad_out, q, k, v, out, lse, backend="fp64", **kw)
    center = ops.attention_backward(grad_out, q, k, v, out, lse, backend="center", **kw)
    plain = ops.attention_backward(grad_out, q, k, v, out, lse, backend="bf16", **kw)
    assert rel(plain[0], exact[0]) > 0.1, "the key offset leaks in the plain BF16 backward"
    for got, want in zip(center, exact):
        assert rel(got, want) < 0.02


def exact_forward(q, k, v, is_causal, causal_alignment, cu_seqlens_q=None, cu_seqlens_k=None, attn_mask=None):
    """out (BF16) and lse (float32, +inf for rows without keys) in float64 under
    the ops' masking (the reference's visible_keys, folded into one mask)."""
    N, M = q.shape[2], k.shape[2]
    segments = [(0, N, 0, M)] if cu_seqlens_q is None else list(
        zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(), cu_seqlens_k[:-1].tolist(),
            cu_seqlens_k[1:].tolist()))
    visible = torch.zeros(N, M, dtype=torch.bool)
    for q0, q1, k0, k1 in segments:
        rows, keys = q1 - q0, k1 - k0
        for i in range(rows):
            last = min(keys, i + 1) if causal_alignment == "top_left" else max(0, min(keys, i + 1 + keys - rows))
            visible[q0 + i, k0:k0 + (last if is_causal else keys)] = True
    if attn_mask is not None:
        visible = visible & attn_mask
    group = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, -1)
    out = (torch.exp(s - lse[..., None]).nan_to_num(0.0) @ v.double().repeat_interleave(group, 1)).bfloat16()
    lse = lse.float()
    lse[torch.isneginf(lse)] = math.inf
    return out, lse
