"""attn_mask in the CUDA FP32 recompute, and key centring on CUDA (center_keys
and backend "center"), on the GPU:

- the FP32 recompute with a key-padding bool mask (a stride-0 broadcast view),
  an additive bias with -inf entries, and the monitor's row subset, against
  the FP64 masked truth (SDPA's math on float64, autograd);
- center_keys on CUDA (two kernels) equals the CPU op bit for bit: kbar,
  k - kbar and the shifted lse (BF16 and FP16, GQA, d 64/128/256, lengths no
  block divides, a padded lse, SDPA's transposed layout, long keys (a
  summation share of many batches), the three policies);
- backend "center" on sink-like inputs: SDPA flash's dQ is ~100% off, the
  centred flash backward ~1%; on random inputs it stays near stock; with GQA;
  with a key-padding mask (the memory-efficient backward) against the masked
  truth, with and without GQA.
Skips without a CUDA GPU; runs through scripts/device.sh.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import attention_inputs
from test_ops import ops, rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run scripts/device.sh")


def masked_truth(q, k, v, grad_out, mask, causal, scale):
    """dq, dk, dv in float64 with attn_mask (bool: True takes part; float: a
    bias), written out: a row with no allowed key gets zero gradients (SDPA)."""
    q, k, v, do = (t.detach().cpu().double() for t in (q, k, v, grad_out))
    s = scale * q @ k.transpose(-1, -2)
    n, m = s.shape[-2:]
    allowed = torch.ones(n, m, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask.cpu()
        else:
            s = s + mask.cpu().double()
    s = s.masked_fill(~allowed, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with no allowed key: 0
    dv = p.transpose(-1, -2) @ do
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, dv


def operands(B, H, N, M, d, seed=0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, L, d, generator=g).bfloat16().to(device) for L in (N, M, M, N))
    out = torch.zeros_like(q)  # backend fp32 reads neither out nor lse
    lse = torch.zeros(B, H, N, device=device)
    return q, k, v, do, out, lse


@pytest.mark.parametrize("causal", [False, True])
def test_fp32_recompute_with_key_padding_mask(causal):
    B, H, N, M, d = 2, 4, 200, 200, 64
    q, k, v, do, out, lse = operands(B, H, N, M, d)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[0, 150:] = False  # right padding
    keep[1, :30] = False   # left padding
    mask = keep.cuda()[:, None, None, :].expand(B, H, N, M)  # stride-0 view
    assert mask.stride(1) == 0 and mask.stride(2) == 0
    scale = 1 / math.sqrt(d)
    got = ops.attention_backward(do, q, k, v, out, lse, is_causal=causal, backend="fp32", attn_mask=mask)
    want = masked_truth(q, k, v, do, mask.cpu(), causal, scale)
    if causal:
        # Rows 0..29 of batch 1 see no allowed key: zero gradients, as SDPA.
        assert torch.all(got[0][1, :, :30] == 0)
    for label, x, truth in zip("qkv", got, want):
        assert x.dtype == torch.float32 and torch.isfinite(x).all()
        assert rel(x, truth) < 1e-5, f"d{label}"


def test_fp32_recompute_with_additive_bias_and_rows():
    B, H, N, M, d = 1, 4, 130, 170, 128
    q, k, v, do, out, lse = operands(B, H, N, M, d, seed=1)
    g = torch.Generator().manual_seed(3)
    bias = (2.0 * torch.randn(1, H, N, M, generator=g))
    bias[..., ::7] = -math.inf
    bias = bias.bfloat16().cuda()  # a floating bias of another dtype is converted once
    scale = 1 / math.sqrt(d)
    got = ops.attention_backward(do, q, k, v, out, lse, backend="fp32", attn_mask=bias, deterministic=True)
    want = masked_truth(q, k, v, do, bias.float().cpu(), False, scale)
    for label, x, truth in zip("qkv", got, want):
        assert rel(x, truth) < 1e-5, f"d{label}"
    # The monitor's sample: rows of chosen slices; dk/dv from those rows only.
    slices, rows = torch.tensor([1, 3], dtype=torch.int32), torch.tensor([0, 5, 64, 129], dtype=torch.int32)
    dq, dk, dv = ops.attention_backward_rows(do, q, k, v, out, lse, slices.cuda(), rows.cuda(), attn_mask=bias)
    chosen = torch.zeros(B * H, N, dtype=torch.bool)
    chosen[slices.long().unsqueeze(1), rows.long()] = True
    do_sample = do.cpu().float() * chosen.view(B, H, N, 1)
    want_rows = masked_truth(q, k, v, do_sample, bias.float().cpu(), False, scale)
    assert rel(dq, want[0].view(B * H, N, d)[slices.long()][:, rows.long()]) < 1e-5
    assert rel(dk, want_rows[1]) < 1e-5 and rel(dv, want_rows[2]) < 1e-5


def assert_center_keys_match_cpu(q, k, lse, k_cuda=None, **kwargs):
    """The one-pass CUDA kernel's (k - kbar, lse - scale q.kbar, kbar) against
    the CPU op, bit for bit (both take q . kbar in FP64, exact for BF16 and
    FP16 operands); k_cuda: k on the GPU in a layout .cuda() would not keep.
    Returns the fraction of coordinates centred and the GPU outputs."""
    cpu = ops.center_keys(q, k, lse, **kwargs)
    gpu = ops.center_keys(q.cuda(), k.cuda() if k_cuda is None else k_cuda, lse.cuda(), **kwargs)
    k_c, lse_c, kbar = (t.cpu() for t in gpu)
    assert torch.equal(kbar, cpu[2]), "kbar"
    assert torch.equal(k_c, cpu[0]), "k - kbar"
    assert torch.equal(lse_c, cpu[1]), "lse - scale q.kbar (and rows >= N unchanged)"
    n = q.shape[2]
    assert torch.equal(lse_c[..., n:], lse[..., n:]), "padded lse rows unchanged"
    return float((kbar != 0).float().mean()), gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["sink", "random"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_center_keys_cuda_matches_cpu(kind, dtype, d):
    """GQA (4 query heads on 2 kv heads), N = 300 (no block or cluster size
    divides it), a padded lse (L > N, as the efficient forward saves it)."""
    q, k, _, _ = attention_inputs.make_inputs(kind, heads=4, n=300, d=d, seed=2)
    q, k = q.to(dtype), k[:, :2].to(dtype)
    lse = torch.randn(1, 4, 320) + 10.0
    lse[0, 1, 7] = -math.inf  # a row that sees no key: copied
    centred, _ = assert_center_keys_match_cpu(q, k, lse)
    assert centred == 0 if kind == "random" else centred > 0.9


@pytest.mark.parametrize("kind", ["sink", "random"])
def test_center_keys_cuda_matches_cpu_at_scale(kind):
    """Large enough for many clusters and query tiles per block, keys beyond
    what a block stages in shared memory (7000 keys of d = 128 over a cluster
    of 8: 875 a block, 800 staged, the rest through the ring and read again),
    SDPA's (B, N, H, d)
    layout (transposed views), policies always and never."""
    B, Hq, Hkv, N, d = 2, 8, 2, 7000, 128
    g = torch.Generator().manual_seed(11)
    q = torch.randn(B, N, Hq, d, generator=g).bfloat16().transpose(1, 2)
    k = torch.randn(B, N, Hkv, d, generator=g)
    if kind == "sink":
        k = k + 300.0 * torch.randn(B, 1, Hkv, d, generator=g)
    k = k.bfloat16().transpose(1, 2)
    lse = torch.randn(B, Hq, N) + 10.0
    centred, (k_centred, _, _) = assert_center_keys_match_cpu(q, k, lse)
    assert centred == 0 if kind == "random" else centred > 0.9
    assert k_centred.stride() == k.stride(), "k - kbar in k's layout: the stock backward's dK layout is unchanged"
    assert assert_center_keys_match_cpu(q, k, lse, policy="always")[0] == 1.0
    assert assert_center_keys_match_cpu(q, k, lse, policy="never", scale=0.1)[0] == 0.0
    # A slice of a fused (B, N, 3, H, d) projection (not dense): k - kbar dense in k's dimension order.
    qkv = torch.randn(B, N, 3, Hkv, d, generator=g).bfloat16()
    qkv[:, :, 1] += 300.0 if kind == "sink" else 0.0
    k_slice = qkv.cuda()[:, :, 1].transpose(1, 2)
    assert not k_slice.is_contiguous() and k_slice.stride(2) == 3 * Hkv * d
    _, (k_centred, _, _) = assert_center_keys_match_cpu(q, k_slice.cpu(), lse, k_cuda=k_slice)
    assert k_centred.stride() == (N * Hkv * d, d, Hkv * d, 1)


def flash_forward(q, k, v, causal):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)[:2]
    return out, lse


def stock_flash(q, k, v, do, causal):
    """SDPA flash's own backward (autograd) on the same operands."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return torch.autograd.grad(out, (q, k, v), do)


def exact_grads(q, k, v, do, causal):
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
    return torch.autograd.grad(out, (q64, k64, v64), do.double())


@pytest.mark.parametrize("d", [64, 128, 256])
def test_center_corrects_sinklike_dq(d):
    """The leak alpha rho_i mu_i of every stock backward becomes alpha rho_i
    (mu_i - kbar): dQ error ~100% and more -> ~1% (docs/numerics.md, Key centring)."""
    q, k, v, do = (t.cuda() for t in attention_inputs.make_inputs("sink", heads=4, n=1024, d=d))
    out, lse = flash_forward(q, k, v, True)
    exact = exact_grads(q, k, v, do, True)
    stock = stock_flash(q, k, v, do, True)
    center = ops.attention_backward(do, q, k, v, out, lse, is_causal=True, backend="center")
    errors = [(rel(s, e), rel(c, e)) for s, c, e in zip(stock, center, exact)]
    print(f"sink d{d}: dQ/dK/dV stock -> center " + ", ".join(f"{s:.2%} -> {c:.2%}" for s, c in errors))
    assert errors[0][0] > 0.5, "stock flash leaks on sink-like keys"
    assert errors[0][1] < 0.03, "centred dQ"
    assert errors[1][1] < errors[1][0] + 0.01 and errors[2][1] < errors[2][0] + 0.01


def test_center_on_random_inputs_and_gqa():
    q, k, v, do = (t.cuda() for t in attention_inputs.make_inputs("random", heads=4, n=512, d=64))
    out, lse = flash_forward(q, k, v, True)
    exact = exact_grads(q, k, v, do, True)
    stock = stock_flash(q, k, v, do, True)
    center = ops.attention_backward(do, q, k, v, out, lse, is_causal=True, backend="center")
    for s, c, e in zip(stock, center, exact):
        assert rel(c, e) <= 1.5 * rel(s, e) + 1e-3  # auto leaves unoffset keys alone
    # GQA: 4 query heads on 2 kv heads, sink-like.
    q, k, v, do = (t.cuda() for t in attention_inputs.make_inputs("sink", heads=4, n=256, d=64, seed=5))
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    out, lse = flash_forward(q, kk, vv, True)
    exact = exact_grads(q, kk, vv, do, True)
    dq, dk, dv = ops.attention_backward(do, q, k, v, out, lse, is_causal=True, backend="center")
    assert dk.shape == k.shape and dv.shape == v.shape
    assert rel(dq, exact[0]) < 0.03
    assert rel(dk, exact[1].unflatten(1, (2, 2)).sum(2)) < 0.03
    assert rel(dv, exact[2].unflatten(1, (2, 2)).sum(2)) < 0.03


def test_center_with_key_padding_mask():
    """A masked call: SDPA's memory-efficient forward and backward on centred
    keys, against the FP64 masked truth; as accurate as the stock backward on
    random inputs, and corrects the sink-like leak."""
    B, H, N, d = 2, 4, 256, 64
    for kind in ("random", "sink"):
        q, k, v, do = (t.cuda() for t in attention_inputs.make_inputs(kind, heads=H, n=N, d=d, seed=7))
        q, k, v, do = (t.expand(B, -1, -1, -1).contiguous() for t in (q, k, v, do))
        keep = torch.ones(B, N, dtype=torch.bool, device="cuda")
        keep[0, 200:] = False
        keep[1, :20] = False
        mask = keep[:, None, None, :].expand(B, H, N, N)
        bias = torch.zeros(B, H, N, N, dtype=q.dtype, device="cuda").masked_fill(~mask, -math.inf)
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False)[:2]
        exact = masked_truth(q, k, v, do, mask.cpu(), False, 1 / math.sqrt(d))
        center = ops.attention_backward(do, q, k, v, out, lse, backend="center", attn_mask=mask)
        fp32 = ops.attention_backward(do, q, k, v, out, lse, backend="fp32", attn_mask=mask)
        errors = [rel(c, e) for c, e in zip(center, exact)]
        print(f"masked {kind}: center dQ/dK/dV " + ", ".join(f"{x:.2%}" for x in errors))
        assert all(rel(f, e) < 1e-5 for f, e in zip(fp32, exact)), "the recompute with the mask is the truth"
        assert errors[0] < 0.03 and errors[1] < 0.03 and errors[2] < 0.03


def test_center_with_gqa_and_key_padding_mask():
    """GQA and a mask together: the memory-efficient backward on repeated
    centred kv heads, gradients folded per kv head, against the FP64 masked truth."""
    B, Hq, Hkv, N, d = 2, 4, 2, 200, 128
    q, k, v, do = (t.cuda() for t in attention_inputs.make_inputs("sink", heads=Hq, n=N, d=d, seed=9))
    q, do = (t.expand(B, -1, -1, -1).contiguous() for t in (q, do))
    k, v = (t[:, :Hkv].expand(B, -1, -1, -1).contiguous() for t in (k, v))
    keep = torch.ones(B, N, dtype=torch.bool, device="cuda")
    keep[0, 170:] = False
    keep[1, :25] = False
    mask = keep[:, None, None, :].expand(B, Hq, N, N)
    kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    bias = torch.zeros(B, Hq, N, N, dtype=q.dtype, device="cuda").masked_fill(~mask, -math.inf)
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, kk, vv, bias, True, 0.0, False)[:2]
    lse = lse[..., :N]  # the op takes (B, Hq, N); the centring pads it again for the efficient backward
    exact = masked_truth(q, kk, vv, do, mask.cpu(), False, 1 / math.sqrt(d))
    dq, dk, dv = ops.attention_backward(do, q, k, v, out, lse, backend="center", attn_mask=mask)
    assert dk.shape == k.shape and dv.shape == v.shape
    errors = [rel(dq, exact[0]), rel(dk, exact[1].unflatten(1, (Hkv, Hq // Hkv)).sum(2)),
              rel(dv, exact[2].unflatten(1, (Hkv, Hq // Hkv)).sum(2))]
    print("masked GQA sink: center dQ/dK/dV " + ", ".join(f"{x:.2%}" for x in errors))
    assert all(x < 0.03 for x in errors)
