"""Capture files cross the C++/Python boundary both ways, and the CPU
reference agrees with PyTorch's float64 autograd on the same operands."""

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def sdpa_fp64(q, k, v, grad_out, *, causal, scale):
    """float64 gradients of SDPA's math on upcast inputs; causal is
    'none' | 'top_left' (SDPA is_causal) | 'bottom_right'."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    mask = None
    if causal == "bottom_right":
        n, m = q.shape[-2], k.shape[-2]
        mask = torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal == "top_left", scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    out.backward(grad_out.double())
    return out.detach(), q.grad, k.grad, v.grad


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def test_cli_capture_loads_in_python(run_cli, tmp_path):
    path = tmp_path / "sink.safetensors"
    run_cli("audit", "sink", "--q-len", "64", "--heads", "2", "--save-operands", path)
    tensors = load_file(str(path))
    assert set(tensors) == {"q", "k", "v", "out", "lse", "grad_out"}
    for name in ("q", "k", "v", "out", "grad_out"):
        assert tensors[name].dtype == torch.bfloat16
        assert tensors[name].shape == (1, 2, 64, 64)
    assert tensors["lse"].dtype == torch.float32 and tensors["lse"].shape == (1, 2, 64)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["causal"] == "top_left"
    assert float(meta["scale"]) == pytest.approx(1 / 8)


@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("heads,kv_heads,n,m,d", [(4, 4, 48, 48, 64), (4, 2, 40, 56, 128), (2, 1, 50, 30, 64)])
def test_python_capture_audits_and_matches_torch_fp64(run_cli, tmp_path, causal, heads, kv_heads, n, m, d):
    torch.manual_seed(n * 7 + m + d + len(causal))
    scale = 0.1
    q = torch.randn(2, heads, n, d).bfloat16()
    k = (torch.randn(2, kv_heads, m, d) + 3.0).bfloat16()
    v = torch.randn(2, kv_heads, m, d).bfloat16()
    grad_out = torch.randn(2, heads, n, d).bfloat16()
    out64, dq, dk, dv = sdpa_fp64(q, k, v, grad_out, causal=causal, scale=scale)
    # The saved operands a fused kernel would hold: BF16 output, FP32 lse.
    s = torch.einsum("bhnd,bhmd->bhnm", q.double(), k.double().repeat_interleave(heads // kv_heads, 1)) * scale
    if causal != "none":
        diagonal = 0 if causal == "top_left" else m - n
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(diagonal), -math.inf)
    lse = torch.logsumexp(s, -1).float()
    capture = tmp_path / "capture.safetensors"
    save_file({"q": q, "k": k, "v": v, "out": out64.bfloat16(), "lse": lse.contiguous(), "grad_out": grad_out},
              str(capture), metadata={"causal": causal, "scale": repr(scale)})
    grads = tmp_path / "grads.safetensors"
    run_cli("audit", "--input", capture, "--dump-gradients", grads)
    ours = load_file(str(grads))

    # Rows that see no key (bottom-right with N > M) have lse = +inf and zero gradients.
    finite = torch.isfinite(ours["fp64.lse"])
    assert torch.allclose(ours["fp64.lse"][finite], lse.double()[finite], rtol=1e-6)
    assert rel(ours["fp64.out"].nan_to_num(), out64.nan_to_num()) < 1e-12
    assert rel(ours["fp64.dq"], dq.nan_to_num()) < 1e-10
    assert rel(ours["fp64.dk"], dk) < 1e-10
    assert rel(ours["fp64.dv"], dv) < 1e-10
    assert rel(ours["fp32.dq"], dq.nan_to_num()) < 1e-5
    for backend in ("bf16", "gproj", "pivot"):
        assert rel(ours[f"{backend}.dq"], dq.nan_to_num()) < 0.02, backend
        assert ours[f"{backend}.dq"].dtype == torch.float32


def test_malformed_captures_fail_clearly(run_cli, tmp_path):
    q = torch.randn(1, 2, 8, 64).bfloat16()
    good = {"q": q, "k": q.clone(), "v": q.clone(), "out": q.clone(), "lse": torch.zeros(1, 2, 8),
            "grad_out": q.clone()}
    cases = {
        "missing": ({k: v for k, v in good.items() if k != "grad_out"}, "missing tensor 'grad_out'"),
        "dtype": ({**good, "k": good["k"].float()}, "tensor 'k' is F32, expected BF16"),
        "shape": ({**good, "out": torch.randn(1, 2, 9, 64).bfloat16()}, "tensor 'out' has shape (1, 2, 9, 64)"),
        "lse": ({**good, "lse": torch.zeros(1, 2, 8).double()}, "tensor 'lse' is F64, expected F32"),
    }
    for name, (tensors, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors, str(path))
        result = run_cli("audit", "--input", path, check=False)
        assert result.returncode == 1, name
        assert message in result.stderr, (name, result.stderr)
