"""Tests of the gaugewatch torch ops (kernels/torch) from Python.

The library is loaded with torch.ops.load_library from $GAUGEWATCH_OPS_LIB, else
from $GAUGEWATCH_BUILD_DIR (default build/) lib/ or kernels/torch/; the module is
skipped with a message when it is not built.

Run:  .venv/bin/python -m pytest tests/python/test_ops.py -q
CPU cases run everywhere (the ops delegate to the CPU reference); CUDA cases
(fp32 kernel) skip without a GPU.

Ground truth is float64 autograd of F.scaled_dot_product_attention (math
backend) on the upcast BF16 operands, with the same mask as the op.
"""

import math
import os
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

REPO = Path(__file__).resolve().parents[2]


def _find_library():
    env = os.environ.get("GAUGEWATCH_OPS_LIB")
    if env:
        return env if Path(env).is_file() else None
    build = Path(os.environ.get("GAUGEWATCH_BUILD_DIR", REPO / "build"))
    for path in (build / "lib" / "libgaugewatch_ops.so", build / "kernels" / "torch" / "libgaugewatch_ops.so"):
        if path.is_file():
            return str(path)
    return None


_LIB = _find_library()
if _LIB is None:
    pytest.skip(
        "libgaugewatch_ops.so is not built (set GAUGEWATCH_OPS_LIB, or build target gaugewatch_ops into build/)",
        allow_module_level=True,
    )
torch.ops.load_library(_LIB)
ops = torch.ops.gaugewatch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


# --- problems -------------------------------------------------------------------------------------


class Problem:
    """BF16 operands of one attention call plus the saved forward (out, lse)."""

    def __init__(self, B=1, Hq=2, Hkv=2, N=48, M=48, d=64, causal=False, alignment="top_left",
                 cu_q=None, cu_k=None, scale=None, key_offset=0.0, q_gain=1.0, seed=0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.q = (q_gain * torch.randn(B, Hq, N, d, generator=g)).bfloat16()
        k = torch.randn(B, Hkv, M, d, generator=g)
        if key_offset:
            k = k + key_offset * torch.randn(d, generator=g)
        self.k = k.bfloat16()
        self.v = torch.randn(B, Hkv, M, d, generator=g).bfloat16()
        self.grad_out = torch.randn(B, Hq, N, d, generator=g).bfloat16()
        self.causal, self.alignment, self.scale = causal, alignment, scale
        self.cu_q = None if cu_q is None else torch.tensor(cu_q, dtype=torch.int32)
        self.cu_k = None if cu_k is None else torch.tensor(cu_k, dtype=torch.int32)
        self.mask = visible_mask(N, M, causal, alignment, cu_q, cu_k)
        self.alpha = scale if scale is not None else 1.0 / math.sqrt(d)
        self._forward()
        if device != "cpu":
            for name in ("q", "k", "v", "grad_out", "out", "lse"):
                setattr(self, name, getattr(self, name).to(device))

    def _forward(self):
        q, k, v = (t.double() for t in (self.q, self.k, self.v))
        group = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = self.alpha * q @ kk.transpose(-1, -2)
        s = s.masked_fill(~self.mask, -math.inf)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        self.out = (p @ vv).bfloat16()
        self.lse = lse.float()  # an empty row: logsumexp gives -inf, SDPA / the reference save +inf
        self.lse[torch.isneginf(self.lse)] = math.inf

    def kwargs(self, **extra):
        kw = dict(is_causal=self.causal, scale=self.scale, causal_alignment=self.alignment)
        if self.cu_q is not None:
            kw.update(cu_seqlens_q=self.cu_q.to(self.q.device), cu_seqlens_k=self.cu_k.to(self.q.device))
        kw.update(extra)
        return kw

    def args(self):
        return (self.grad_out, self.q, self.k, self.v, self.out, self.lse)

    def exact(self, grad_out=None):
        """float64 dq, dk, dv from autograd of SDPA's math backend."""
        q, k, v = (t.detach().cpu().double().requires_grad_() for t in (self.q, self.k, self.v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, scale=self.alpha,
                                           enable_gqa=q.shape[1] != k.shape[1])
        u = (self.grad_out if grad_out is None else grad_out).cpu().double()
        o.backward(u)
        return q.grad, k.grad, v.grad


def visible_mask(N, M, causal, alignment, cu_q, cu_k):
    """(N, M) bool: kernels/reference/attention_problem.cpp visible_keys()."""
    segments = [(0, N, 0, M)] if cu_q is None else list(zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]))
    mask = torch.zeros(N, M, dtype=torch.bool)
    for q0, q1, k0, k1 in segments:
        rows, keys = q1 - q0, k1 - k0
        for i in range(rows):
            last = keys
            if causal:
                last = min(keys, i + 1) if alignment == "top_left" else max(0, min(keys, i + 1 + keys - rows))
            mask[q0 + i, k0:k0 + last] = True
    return mask


def rel(x, ref):
    x, ref = x.detach().cpu().double(), ref.detach().cpu().double()
    norm = ref.norm()
    return ((x - ref).norm() / norm).item() if norm > 0 else (x - ref).norm().item()


CASES = {
    "noncausal": dict(N=40, M=56),
    "top_left_tall": dict(N=50, M=30, causal=True),
    "top_left_wide_d128": dict(N=30, M=70, d=128, causal=True),
    "bottom_right_tall": dict(N=50, M=30, causal=True, alignment="bottom_right"),
    "bottom_right_wide": dict(N=20, M=64, causal=True, alignment="bottom_right"),
    "gqa": dict(B=2, Hq=4, Hkv=2, N=33, M=33, causal=True),
    "mqa": dict(Hq=4, Hkv=1, N=17, M=40),
    "packed_top_left": dict(Hq=2, Hkv=1, N=40, M=50, causal=True, cu_q=[0, 15, 15, 40], cu_k=[0, 20, 22, 50]),
    "packed_bottom_right": dict(N=40, M=50, causal=True, alignment="bottom_right", cu_q=[0, 25, 40], cu_k=[0, 10, 50]),
    "custom_scale": dict(N=24, M=24, scale=0.3),
    "single_row_key": dict(N=1, M=1),
    "d32_cpu_only": dict(N=20, M=20, d=32),
}


# --- catalogue and schema checks ----------------------------------------------------------------


def test_metric_names_match_metric_vector():
    names = ops.metric_names()
    assert len(names) == len(set(names)) == 20
    assert names[0] == "row_mass_abs_max" and "gproj_dq_discrepancy" in names
    p = Problem(N=16, M=16, causal=True)
    metrics = ops.attention_metrics(*p.args(), **p.kwargs())
    assert metrics.dtype == torch.float64 and metrics.shape == (len(names),)
    assert torch.isfinite(metrics).all()


@pytest.mark.parametrize("backend", ["fp32", "bf16", "gproj", "pivot", "fp64"])
def test_opcheck_attention_backward(backend):
    p = Problem(Hq=4, Hkv=2, N=12, M=20, causal=True, alignment="bottom_right")
    torch.library.opcheck(ops.attention_backward.default, p.args(), p.kwargs(backend=backend))


def test_opcheck_packed_rows_and_metrics():
    p = Problem(N=20, M=24, causal=True, cu_q=[0, 8, 20], cu_k=[0, 10, 24])
    torch.library.opcheck(ops.attention_backward.default, p.args(), p.kwargs(backend="fp32"))
    slices, rows = torch.tensor([1, 0]), torch.tensor([0, 7, 19])
    torch.library.opcheck(ops.attention_backward_rows.default, p.args() + (slices, rows), p.kwargs())
    torch.library.opcheck(ops.attention_metrics.default, p.args(), p.kwargs())


# --- gradients against float64 autograd ------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_fp32_backend_matches_float64_autograd(name):
    p = Problem(seed=zlib.crc32(name.encode()) % 1000, **CASES[name])
    want = p.exact()
    got = ops.attention_backward(*p.args(), **p.kwargs(backend="fp32"))
    assert all(t.dtype == torch.float32 for t in got)
    for label, x, ref in zip("qkv", got, want):
        assert rel(x, ref) < 1e-5, f"{name}: d{label} rel err {rel(x, ref):.3e}"
    exact = ops.attention_backward(*p.args(), **p.kwargs(backend="fp64"))
    for label, x, ref in zip("qkv", exact, want):
        assert rel(x, ref) < 1e-12, f"{name}: fp64 d{label} rel err {rel(x, ref):.3e}"


@pytest.mark.parametrize("name", ["noncausal", "gqa", "packed_top_left", "bottom_right_tall"])
def test_projected_backends_within_bf16_tolerance(name):
    # The tolerance is measured, not guessed: the plain fused BF16 backward's
    # own error on the same inputs (FA2 test_flash_attn.py style).
    p = Problem(seed=7, **CASES[name])
    want = p.exact()
    plain = ops.attention_backward(*p.args(), **p.kwargs(backend="bf16"))
    for backend in ("gproj", "pivot"):
        got = ops.attention_backward(*p.args(), **p.kwargs(backend=backend))
        assert all(t.dtype == torch.bfloat16 for t in got)
        for label, x, y, ref in zip("qkv", got, plain, want):
            err, base = rel(x, ref), rel(y, ref)
            assert err <= 2.0 * base + 1e-6, f"{name} {backend}: d{label} err {err:.3e} vs bf16 {base:.3e}"
            assert err < 2e-2, f"{name} {backend}: d{label} err {err:.3e}"


def test_gproj_repairs_common_key_offset():
    # Keys sharing a large offset: the plain BF16 backward leaks the mean key into
    # dq (docs/numerics.md); GProj and pivot keep the conservation law.
    p = Problem(N=64, M=64, causal=True, key_offset=200.0, q_gain=1.0, seed=3)
    want = p.exact()
    errs = {b: rel(ops.attention_backward(*p.args(), **p.kwargs(backend=b))[0], want[0])
            for b in ("bf16", "gproj", "pivot", "fp32")}
    assert errs["gproj"] < 1e-2 and errs["pivot"] < 2e-2, errs
    assert errs["bf16"] > 10 * errs["gproj"], errs
    assert errs["fp32"] < 1e-5, errs


def test_rows_op_matches_float64_autograd():
    p = Problem(B=2, Hq=4, Hkv=2, N=40, M=50, causal=True, seed=11)
    slices, rows = torch.tensor([1, 6], dtype=torch.int32), torch.tensor([0, 3, 21, 39], dtype=torch.int32)
    masked = torch.zeros_like(p.grad_out)
    flat = p.grad_out.reshape(-1, *p.grad_out.shape[2:])
    masked.view(-1, *p.grad_out.shape[2:])[slices.long()[:, None], rows.long()[None, :]] = \
        flat[slices.long()[:, None], rows.long()[None, :]]
    dq_full, dk_part, dv_part = p.exact(grad_out=masked)
    dq, dk, dv = ops.attention_backward_rows(*p.args(), slices, rows, **p.kwargs())
    assert dq.shape == (2, 4, 64) and dk.shape == p.k.shape
    want_dq = dq_full.reshape(-1, *dq_full.shape[2:])[slices.long()[:, None], rows.long()[None, :]]
    assert rel(dq, want_dq) < 1e-5
    assert rel(dk, dk_part) < 1e-5
    assert rel(dv, dv_part) < 1e-5


# --- gradient layout ------------------------------------------------------------------------------------


def operand_layouts(B=2, H=2, N=24, d=64, seed=21, device="cpu"):
    """One problem's grad_out, q, k, v in three layouts (the same values, on
    `device`), and the strides attention_backward must give each gradient:
    contiguous (B, H, N, d); SDPA's (B, N, H, d) storage viewed as
    (B, H, N, d); slot 0, 1, 2 of a fused (B, N, 3, H, d) qkv projection
    (strided rows, not dense), whose gradients are dense (B, N, H, d)."""
    p = Problem(B=B, Hq=H, Hkv=H, N=N, M=N, d=d, causal=True, seed=seed, device=device)
    contiguous = (H * N * d, N * d, d, 1)
    row_order = (N * H * d, d, H * d, 1)
    sdpa = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (p.grad_out, p.q, p.k, p.v)]
    qkv = torch.stack([t.transpose(1, 2) for t in (p.q, p.k, p.v)], dim=2)  # (B, N, 3, H, d)
    fused = [sdpa[0]] + [qkv[:, :, i].transpose(1, 2) for i in range(3)]
    assert not fused[1].is_contiguous() and fused[1].stride() == (N * 3 * H * d, d, 3 * H * d, 1)
    layouts = {"contiguous": ([p.grad_out, p.q, p.k, p.v], contiguous), "sdpa": (sdpa, row_order),
               "fused_qkv": (fused, row_order)}
    return p, layouts


@pytest.mark.parametrize("backend", ["fp64", "fp32", "bf16", "gproj", "pivot", "center"])
def test_gradients_dense_in_operand_stride_order_cpu_and_meta(backend):
    """attention_backward returns dq, dk, dv dense in the stride order of q, k,
    v (kernels/torch/stride_order.h; the CUDA kernels write them so), whatever
    layout the backend computes in, with the values of the contiguous call;
    the Meta kernel (fake tensors: torch.compile, opcheck) gives the same
    strides."""
    p, layouts = operand_layouts()
    reference = ops.attention_backward(*p.args(), **p.kwargs(backend=backend))
    for name, (operands, want) in layouts.items():
        args = (*operands, p.out, p.lse)
        got = ops.attention_backward(*args, **p.kwargs(backend=backend))
        meta = ops.attention_backward(*(t.to("meta") for t in args), **p.kwargs(backend=backend))
        with FakeTensorMode() as mode:
            fake = ops.attention_backward(*(mode.from_tensor(t) for t in args), **p.kwargs(backend=backend))
        for label, x, m, f, ref in zip("qkv", got, meta, fake, reference):
            assert x.stride() == want, f"{name}: d{label} strides {x.stride()}"
            assert m.stride() == want and f.stride() == want, f"{name}: Meta d{label} strides {m.stride()}"
            assert m.dtype == f.dtype == x.dtype
            assert torch.equal(x, ref), f"{name}: d{label} differs from the contiguous call's"


def test_opcheck_attention_backward_fused_qkv_operands():
    # Non-dense operands through opcheck, dynamic shapes included (the Meta
    # kernel orders symbolic strides). opcheck compares the fake and real
    # outputs' strides on CUDA only: test_cuda_gradients_dense_in_operand_stride_order.
    p, layouts = operand_layouts(N=12)
    operands, _ = layouts["fused_qkv"]
    for backend in ("bf16", "center"):
        torch.library.opcheck(ops.attention_backward.default, (*operands, p.out, p.lse), p.kwargs(backend=backend))


# --- errors ---------------------------------------------------------------------------------------------


def test_preconditions_are_checked_with_reasons():
    p = Problem(N=8, M=8)
    args = list(p.args())
    with pytest.raises(RuntimeError, match="q must be BFloat16"):
        ops.attention_backward(args[0], p.q.float(), *args[2:], backend="fp32")
    with pytest.raises(RuntimeError, match="lse must be Float"):
        ops.attention_backward(*args[:5], p.lse.double(), backend="fp32")
    with pytest.raises(RuntimeError, match="unknown backend 'flash'"):
        ops.attention_backward(*args, backend="flash")
    with pytest.raises(RuntimeError, match="causal_alignment"):
        ops.attention_backward(*args, is_causal=True, causal_alignment="diagonal")
    with pytest.raises(RuntimeError, match="both cu_seqlens_q and cu_seqlens_k"):
        ops.attention_backward(*args, cu_seqlens_q=torch.tensor([0, 8]))
    with pytest.raises(RuntimeError, match="must start at 0 and end at"):
        ops.attention_backward(*args, cu_seqlens_q=torch.tensor([0, 7]), cu_seqlens_k=torch.tensor([0, 8]))
    g = Problem(Hq=3, Hkv=3, N=8, M=8)
    with pytest.raises(RuntimeError, match="GQA"):
        ops.attention_backward(g.grad_out, g.q, g.k[:, :2], g.v[:, :2], g.out, g.lse, backend="fp32")
    with pytest.raises(RuntimeError, match="rows are query rows"):
        ops.attention_backward_rows(*args, torch.tensor([0]), torch.tensor([8]))
    with pytest.raises(RuntimeError, match="rows must be distinct"):
        ops.attention_backward_rows(*args, torch.tensor([0]), torch.tensor([3, 3]))


# --- CUDA: the fused FP32 kernel --------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("name", sorted(set(CASES) - {"d32_cpu_only"}))
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_fp32_matches_float64_autograd(name, deterministic):
    p = Problem(seed=zlib.crc32(name.encode()) % 1000, device="cuda", **CASES[name])
    want = p.exact()
    got = ops.attention_backward(*p.args(), **p.kwargs(backend="fp32", deterministic=deterministic))
    assert all(t.is_cuda and t.dtype == torch.float32 for t in got)
    for label, x, ref in zip("qkv", got, want):
        assert rel(x, ref) < 1e-5, f"{name}: d{label} rel err {rel(x, ref):.3e}"


@requires_cuda
def test_cuda_fp32_deterministic_is_bitwise_repeatable_and_matches_cpu():
    p = Problem(B=2, Hq=4, Hkv=2, N=200, M=190, d=128, causal=True, seed=5, device="cuda")
    a = ops.attention_backward(*p.args(), **p.kwargs(backend="fp32", deterministic=True))
    b = ops.attention_backward(*p.args(), **p.kwargs(backend="fp32", deterministic=True))
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    cpu_args = [t.cpu() for t in p.args()]
    ref = ops.attention_backward(*cpu_args, **p.kwargs(backend="fp32"))
    for x, y in zip(a, ref):
        assert rel(x, y) < 1e-5


@requires_cuda
def test_cuda_rows_op_matches_cpu():
    p = Problem(B=2, Hq=4, Hkv=2, N=70, M=80, causal=True, seed=13, device="cuda")
    slices, rows = torch.tensor([0, 5, 7]), torch.tensor([1, 2, 40, 69])
    got = ops.attention_backward_rows(*p.args(), slices.cuda(), rows.cuda(), **p.kwargs())
    want = ops.attention_backward_rows(*[t.cpu() for t in p.args()], slices, rows, **p.kwargs())
    for x, y in zip(got, want):
        assert rel(x, y) < 1e-5


@requires_cuda
def test_cuda_packed_offsets_from_cpu_are_checked():
    # cu_seqlens may stay on the CPU: then the op checks them before copying.
    p = Problem(N=40, M=50, causal=True, cu_q=[0, 15, 40], cu_k=[0, 20, 50], device="cuda")
    kw = p.kwargs(backend="fp32")
    kw.update(cu_seqlens_q=p.cu_q, cu_seqlens_k=p.cu_k)
    want = p.exact()
    for x, ref in zip(ops.attention_backward(*p.args(), **kw), want):
        assert rel(x, ref) < 1e-5
    kw.update(cu_seqlens_k=torch.tensor([0, 30, 20], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="end at 50"):
        ops.attention_backward(*p.args(), **kw)


@requires_cuda
def test_cuda_opcheck_and_head_dim_limits():
    p = Problem(Hq=4, Hkv=2, N=24, M=40, causal=True, device="cuda")
    # deterministic: opcheck compares repeated runs, dQ atomics would reorder sums
    torch.library.opcheck(ops.attention_backward.default, p.args(), p.kwargs(backend="fp32", deterministic=True))
    for backend in ("gproj", "pivot", "bf16"):
        torch.library.opcheck(ops.attention_backward.default, p.args(), p.kwargs(backend=backend))
    with pytest.raises(RuntimeError, match="head dims 64, 128 and 256"):
        q = Problem(N=8, M=8, d=32, device="cuda")
        ops.attention_backward(*q.args(), backend="fp32")


@requires_cuda
@pytest.mark.parametrize("backend", ["fp32", "bf16", "gproj", "pivot", "center"])
def test_cuda_gradients_dense_in_operand_stride_order(backend):
    """The CPU test's layouts on CUDA: the fused BF16 kernels write the
    gradients at these strides, the FP32 kernel's and the stock backward's
    (center) are copied to them; the fake tensors agree (opcheck checks too)."""
    p, layouts = operand_layouts(device="cuda")
    for name, (operands, want) in layouts.items():
        args = (*operands, p.out, p.lse)
        got = ops.attention_backward(*args, **p.kwargs(backend=backend))
        with FakeTensorMode() as mode:
            fake = ops.attention_backward(*(mode.from_tensor(t) for t in args), **p.kwargs(backend=backend))
        for label, x, f in zip("qkv", got, fake):
            assert x.is_cuda and x.stride() == want, f"{name}: d{label} strides {x.stride()}"
            assert f.stride() == want, f"{name}: fake d{label} strides {f.stride()}"
    operands, _ = layouts["fused_qkv"]
    torch.library.opcheck(ops.attention_backward.default, (*operands, p.out, p.lse),
                          p.kwargs(backend=backend, deterministic=True))


# --- a second copy of the library ----------------------------------------------------------------


def test_second_copy_from_another_path_stays_inert(tmp_path):
    """Two builds of the library in one process (e.g. the hooks' and a user's
    load_library): the second finds the ops defined, says so once and stays
    inert instead of aborting the process on a duplicate definition."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "libgaugewatch_ops_copy.so"
    shutil.copy(_LIB, copy)
    code = (
        "import torch\n"
        f"torch.ops.load_library({str(_LIB)!r})\n"
        f"torch.ops.load_library({str(copy)!r})\n"
        "names = torch.ops.gaugewatch.metric_names()\n"
        "q = torch.randn(1, 1, 4, 64).bfloat16()\n"
        "lse = torch.zeros(1, 1, 4)\n"
        "dq, dk, dv = torch.ops.gaugewatch.attention_backward(q, q, q, q, q, lse, backend='fp32')\n"
        "print(len(names), tuple(dq.shape))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["20", "(1,", "1,", "4,", "64)"]
    assert result.stderr.count("already registered by another copy") == 1, result.stderr


# --- the kernel choices read from the environment ----------------------------------------------


@pytest.mark.parametrize("name,value,says", [
    ("GAUGEWATCH_BF16_KERNEL", "fast", "is not one of ws, key_outer, mma_sync: the default kernels run"),
    ("GAUGEWATCH_GPROJ_KERNEL", "fused", "is not one of auto, key_outer, pair: gproj runs its default"),
    ("GAUGEWATCH_GRID_SECTION", "-3", "is not auto, all or a positive number of kv heads"),
    ("GAUGEWATCH_GPROJ_PASS2_KEYS", "192", "is not 128 or 256: gproj's second pass runs its default"),
    ("GAUGEWATCH_D256_KERNEL", "wgmma", "is not one of pair, key_outer: head dim 256 runs its default"),
])
def test_unknown_kernel_choice_warns_once_and_keeps_the_default(name, value, says):
    """The fused backward's kernel choices are read once, when the library
    loads (kernels/torch/cuda_launch.cpp): a value it does not know is named
    on stderr, once, with what runs instead, and the library still loads and
    runs; a known value says nothing."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        f"torch.ops.load_library({str(_LIB)!r})\n"
        "q = torch.randn(1, 1, 4, 64).bfloat16()\n"
        "dq, dk, dv = torch.ops.gaugewatch.attention_backward(q, q, q, q, q, torch.zeros(1, 1, 4), backend='gproj')\n"
        "print(tuple(dq.shape))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUGEWATCH_") or k == "GAUGEWATCH_OPS_LIB"}
    bad = subprocess.run([sys.executable, "-c", code], env=dict(env, **{name: value}), capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.strip() == "(1, 1, 4, 64)"
    assert bad.stderr.count(f"{name}={value} {says}") == 1, bad.stderr
    good = {"GAUGEWATCH_BF16_KERNEL": "ws", "GAUGEWATCH_GPROJ_KERNEL": "auto", "GAUGEWATCH_GRID_SECTION": "all",
            "GAUGEWATCH_GPROJ_PASS2_KEYS": "128", "GAUGEWATCH_D256_KERNEL": "key_outer"}[name]
    fine = subprocess.run([sys.executable, "-c", code], env=dict(env, **{name: good}), capture_output=True,
                          text=True, timeout=120)
    assert fine.returncode == 0, fine.stderr
    assert name not in fine.stderr, fine.stderr


@pytest.mark.parametrize("keys", ["128", "256"])
@pytest.mark.parametrize("other", ["GAUGEWATCH_BF16_KERNEL=key_outer", "GAUGEWATCH_BF16_KERNEL=mma_sync",
                                   "GAUGEWATCH_GPROJ_KERNEL=pair"])
def test_gproj_pass2_keys_under_a_choice_that_cannot_run_it_says_so(other, keys):
    """GAUGEWATCH_GPROJ_PASS2_KEYS (128 or 256) only sets the block size of
    gproj's warp-specialized second pass: beside a kernel choice under which
    that pass never runs, the library names the conflict once on stderr and
    runs as that choice says; unset, it says nothing."""
    import subprocess
    import sys

    name, value = other.split("=")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUGEWATCH_") or k == "GAUGEWATCH_OPS_LIB"}
    code = f"import torch\ntorch.ops.load_library({str(_LIB)!r})\n"
    result = subprocess.run([sys.executable, "-c", code], env=dict(env, GAUGEWATCH_GPROJ_PASS2_KEYS=keys,
                                                                  **{name: value}),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(f"GAUGEWATCH_GPROJ_PASS2_KEYS={keys} has no effect with {other}") == 1, result.stderr
    unset = subprocess.run([sys.executable, "-c", code], env=dict(env, **{name: value}), capture_output=True,
                           text=True, timeout=120)
    assert unset.returncode == 0, unset.stderr
    assert "GAUGEWATCH_GPROJ_PASS2_KEYS" not in unset.stderr, unset.stderr


def test_d256_key_outer_beside_the_mma_sync_pair_says_so():
    """GAUGEWATCH_D256_KERNEL=key_outer asks for a Hopper kernel: beside
    GAUGEWATCH_BF16_KERNEL=mma_sync, under which every call runs the
    mma.sync pair, the library names the conflict once on stderr and runs as
    that choice says."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GAUGEWATCH_") or k == "GAUGEWATCH_OPS_LIB"}
    code = f"import torch\ntorch.ops.load_library({str(_LIB)!r})\n"
    result = subprocess.run([sys.executable, "-c", code],
                            env=dict(env, GAUGEWATCH_D256_KERNEL="key_outer", GAUGEWATCH_BF16_KERNEL="mma_sync"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("GAUGEWATCH_D256_KERNEL=key_outer has no effect with "
                               "GAUGEWATCH_BF16_KERNEL=mma_sync") == 1, result.stderr
