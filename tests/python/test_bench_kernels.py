"""The kernel benchmarks' tools on the CPU (no GPU, no ops library): their
shape selection (bench/kernels/_common.py), the kernel-by-kernel comparison
of two runs (scripts/compare_kernel_runs.py, on a committed H200 run),
scripts/device-ab.sh's refusal of a patch that does not apply, and the
SASS comparison of two builds (scripts/sass_compare.py, on nvcc's output)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
from _common import select_shapes  # noqa: E402
from bench_bf16_backward import SHAPES  # noqa: E402


def test_empty_selection_is_every_shape_in_order():
    assert select_shapes(SHAPES, "") == SHAPES


def test_named_shapes_keep_the_table_order():
    last, first = SHAPES[-1][0], SHAPES[0][0]
    assert [row[0] for row in select_shapes(SHAPES, f"{last},{first}")] == [first, last]


def test_an_unknown_shape_is_refused_with_the_known_names():
    with pytest.raises(SystemExit, match="unknown B9_typo.*known: " + SHAPES[0][0]):
        select_shapes(SHAPES, f"{SHAPES[0][0]},B9_typo")


# --- scripts/compare_kernel_runs.py and scripts/device-ab.sh --------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OVERLAP = ROOT / "bench" / "results" / "bench_bf16_backward-overlap-h200-2026-12-03.json"


def compare(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_kernel_runs.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_compare_runs_reads_a_committed_ab_run_kernel_by_kernel(tmp_path):
    md = tmp_path / "c.md"
    out = compare(f"{OVERLAP}#overlap_91caeb2", f"{OVERLAP}#final_949611a", "--labels", "two,one",
                  "--markdown", str(md))
    assert out.returncode == 0, out.stderr
    assert md.read_text() == out.stdout
    # the measured row of that run: bf16's ws kernel at d64, 1157.8 us against 1135.9 us
    assert "| B4_H16_N4096_d64_causal | bf16 | keyouter_ws_kernel | 1157.8 | 1135.9 | 0.981 |" in out.stdout
    assert "| two / cuDNN | one / cuDNN |" in out.stdout
    # cuDNN's own time in each run, the ratios' denominator (no "again" in runs before it existed)
    assert "| B4_H16_N4096_d64_causal | 1.152 | n/a | 1.087 | n/a | 0.944 |" in out.stdout


def test_compare_runs_takes_medians_over_rounds_and_the_range_of_each_rounds_ratio():
    one, two = f"{OVERLAP}#overlap_91caeb2", f"{OVERLAP}#final_949611a"
    out = compare(f"{one},{two}", f"{two},{one}", "--labels", "a,b")
    assert out.returncode == 0, out.stderr
    assert "2 run(s) of a, 2 of b: medians over each side's runs" in out.stdout
    # median of 1157.8 and 1135.9 us on both sides; the rounds: 1135.9 / 1157.8 and its inverse
    row = "| B4_H16_N4096_d64_causal | bf16 | keyouter_ws_kernel | 1146.8 | 1146.8 | 1.000 | 0.981-1.019 |"
    assert row in out.stdout
    # every run's own cuDNN time beside the medians
    assert "| B4_H16_N4096_d64_causal | 1.119 | n/a | 1.119 | n/a | 1.000 | 1.152 1.087 1.087 1.152 |" in out.stdout
    # uneven sides: medians, no rounds column
    out = compare(f"{one},{two},{one}", two)
    assert out.returncode == 0, out.stderr
    assert "| B4_H16_N4096_d64_causal | bf16 | keyouter_ws_kernel | 1157.8 | 1135.9 | 0.981 |\n" in out.stdout


def test_compare_runs_refuses_a_missing_key_and_a_foreign_file(tmp_path):
    out = compare(f"{OVERLAP}#nope", f"{OVERLAP}#final_949611a")
    assert out.returncode != 0 and "no key 'nope'" in out.stderr and "overlap_91caeb2" in out.stderr
    other = tmp_path / "other.json"
    other.write_text('{"rounds": []}')
    out = compare(str(other), f"{OVERLAP}#final_949611a")
    assert out.returncode != 0 and "neither bench_bf16_backward.py's JSON" in out.stderr


def device_ab_refusal(tmp_path, patch_text, **env):
    """device-ab.sh run with `patch_text` as its patch and `env`: its exit, and
    its stderr once it is checked that nothing ran (no $OUT)."""
    patch = tmp_path / "ab.patch"
    patch.write_text(patch_text)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device-ab.sh")], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "GW_AB_PATCH": str(patch),
                                          "OUT": str(tmp_path / "o"), **env})
    assert not (tmp_path / "o").exists()  # refused before anything ran
    return out.returncode, out.stderr


def test_device_ab_refuses_a_patch_that_does_not_apply(tmp_path):
    rc, err = device_ab_refusal(tmp_path, "--- a/no/such/file.cu\n+++ b/no/such/file.cu\n@@ -1 +1 @@\n-x\n+y\n")
    assert rc == 2
    assert "does not apply to this tree" in err


def test_device_ab_refuses_a_budget_that_is_not_a_number(tmp_path):
    rc, err = device_ab_refusal(tmp_path, "", GW_AB_BUDGET_S="5m")  # an empty patch applies to any tree
    assert rc == 2
    assert "GW_AB_BUDGET_S=5m: give a whole number of seconds" in err


def test_device_ab_refuses_a_verification_time_that_is_not_a_number(tmp_path):
    rc, err = device_ab_refusal(tmp_path, "", GW_AB_VERIFY_S="yes")
    assert rc == 2
    assert "GW_AB_VERIFY_S=yes: give a whole number of seconds (0: no tests)" in err


def test_device_ab_refuses_rounds_that_are_not_a_count(tmp_path):
    for rounds in ("0", "three"):
        rc, err = device_ab_refusal(tmp_path, "", GW_AB_ROUNDS=rounds)
        assert rc == 2
        assert f"GW_AB_ROUNDS={rounds}: give a whole number of rounds, 1 or more" in err


def test_device_ab_names_the_patch_of_several_that_does_not_apply(tmp_path):
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/no/such/file.cu\n+++ b/no/such/file.cu\n@@ -1 +1 @@\n-x\n+y\n")
    rc, err = device_ab_refusal(tmp_path, "", GW_AB_PATCH=f"{tmp_path / 'ab.patch'},{bad}")
    assert rc == 2
    assert f"{bad} does not apply to this tree" in err


def test_device_ab_refuses_more_candidates_than_the_device_tool_brings_back(tmp_path):
    patches = []
    for i in range(5):
        (tmp_path / f"p{i}.patch").write_text("")
        patches.append(str(tmp_path / f"p{i}.patch"))
    rc, err = device_ab_refusal(tmp_path, "", GW_AB_PATCH=",".join(patches))
    assert rc == 2
    assert "GW_AB_PATCH names 5 patches: at most 4 per call" in err


def two_empty_patches(tmp_path):
    """GW_AB_PATCH for two candidates that apply to any tree: device_ab_refusal's
    ab.patch and a second empty patch."""
    (tmp_path / "two.patch").write_text("")
    return f"{tmp_path / 'ab.patch'},{tmp_path / 'two.patch'}"


@pytest.mark.parametrize("env, message", [
    ({"GW_AB_LABELS": "main,x"}, "GW_AB_LABELS=main,x: give 3 names, A's and one per patch"),
    ({"GW_AB_VERIFY_S": "300"}, "GW_AB_VERIFY_S=300 tests one version: give one patch"),
])
def test_device_ab_refuses_labels_or_tests_that_do_not_fit_several_candidates(tmp_path, env, message):
    rc, err = device_ab_refusal(tmp_path, "", GW_AB_PATCH=two_empty_patches(tmp_path), **env)
    assert rc == 2
    assert message in err


# --- scripts/sass_compare.py on real nvcc output ----------------------------------------------

NVCC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
KERNEL = """
// {comment}
__global__ void axpy(float a, const float* x, float* y, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = {expr};
}}
template <int K> __global__ void scale(float* y) {{ y[threadIdx.x] *= K; }}
template __global__ void scale<2>(float*);
template __global__ void scale<3>(float*);
"""


def cubin(tmp_path, name, comment, expr):
    src = tmp_path / f"{name}.cu"
    src.write_text(KERNEL.format(comment=comment, expr=expr))
    out = tmp_path / f"{name}.cubin"
    subprocess.run([str(NVCC), "-cubin", "-arch=sm_90a", "-O3", "-o", str(out), str(src)], check=True,
                   capture_output=True, timeout=120)
    return out


def sass_compare(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_compare.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not NVCC.exists(), reason="needs nvcc (the CUDA toolkit)")
def test_sass_compare_tells_a_comment_change_from_a_code_change(tmp_path):
    base = cubin(tmp_path, "base", "one comment", "a * x[i] + y[i]")
    recommented = cubin(tmp_path, "recommented", "another comment, same code", "a * x[i] + y[i]")
    changed = cubin(tmp_path, "changed", "one comment", "a * x[i] - y[i]")
    same = sass_compare(base, recommented)
    if "cuobjdump not found" in same.stderr:
        pytest.skip("no cuobjdump here (CUDA toolkit without it and no triton wheel)")
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.count("same ") == 3  # axpy, scale<2>, scale<3>
    diff = sass_compare(base, changed, "--diff", "axpy")
    assert diff.returncode == 1
    assert [line.split()[0] for line in diff.stdout.splitlines() if "scale" in line] == ["same", "same"]
    assert any(line.startswith("DIFF") and "axpy" in line for line in diff.stdout.splitlines())
    assert "FADD" in diff.stdout or "FFMA" in diff.stdout  # the unified diff of axpy's instructions
    only = sass_compare(base, changed, "--filter", "scale")
    assert only.returncode == 0 and "axpy" not in only.stdout


# --- bench/kernels/bench_split_streams.py: the two halves of a problem --------------------------

import torch  # noqa: E402
from bench_split_streams import halves, largest_difference  # noqa: E402


def _problem(B, Hq, Hkv, N=4, d=2):
    """Tensors whose every element names its batch, head and row, laid out as
    bench_bf16_backward.make_inputs lays them out (lse without the head dim)."""
    def tagged(H, dims):
        idx = torch.arange(B * H * N).reshape(B, H, N).float()
        return idx if dims == 3 else idx[..., None].expand(B, H, N, d).clone()
    return dict(q=tagged(Hq, 4), k=tagged(Hkv, 4), v=tagged(Hkv, 4), do=tagged(Hq, 4), out=tagged(Hq, 4),
                lse=tagged(Hq, 3))


def test_halves_cut_the_batch_when_there_are_two_or_more():
    x = _problem(B=4, Hq=4, Hkv=2)
    first, second = halves(x, 4, 4, 2)
    for name, t in x.items():
        assert torch.equal(torch.cat([first[name], second[name]], 0), t)
        assert first[name].shape[0] == 2 and first[name].data_ptr() == t.data_ptr()  # views, no copies


def test_halves_cut_kv_heads_with_their_query_heads_when_the_batch_is_one():
    x = _problem(B=1, Hq=8, Hkv=2)  # GQA: query heads 0-3 read kv head 0, 4-7 kv head 1
    first, second = halves(x, 1, 8, 2)
    assert torch.equal(first["k"], x["k"][:, :1]) and torch.equal(second["v"], x["v"][:, 1:])
    assert torch.equal(first["q"], x["q"][:, :4]) and torch.equal(second["lse"], x["lse"][:, 4:])
    # each half is a problem of its own: query head h of a half reads its kv head h // group
    assert first["q"].shape[1] // first["k"].shape[1] == 4 == second["q"].shape[1] // second["k"].shape[1]


def test_largest_difference_is_relative_to_the_whole_and_joins_along_the_cut():
    whole = [torch.tensor([[1.0, -4.0], [2.0, 3.0]])] * 3
    same = [[w[:1] for w in whole], [w[1:] for w in whole]]
    assert largest_difference(whole, same, B=2) == 0.0
    off = [[w[:1] for w in whole], [w[1:] + torch.tensor([0.0, 0.5]) for w in whole]]
    assert largest_difference(whole, off, B=2) == pytest.approx(0.5 / 4.0)
    heads = [[w[:, :1] for w in whole], [w[:, 1:] for w in whole]]
    assert largest_difference(whole, heads, B=1) == 0.0
