"""The kernel benchmarks' tools on the CPU (no GPU, no ops library): their
shape selection (bench/kernels/_common.py), the kernel-by-kernel comparison
of two runs (scripts/compare_kernel_runs.py, on a committed H200 run) and
scripts/device-ab.sh's refusal of a patch that does not apply."""

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


def test_compare_runs_refuses_a_missing_key_and_a_foreign_file(tmp_path):
    out = compare(f"{OVERLAP}#nope", f"{OVERLAP}#final_949611a")
    assert out.returncode != 0 and "no key 'nope'" in out.stderr and "overlap_91caeb2" in out.stderr
    other = tmp_path / "other.json"
    other.write_text('{"rounds": []}')
    out = compare(str(other), f"{OVERLAP}#final_949611a")
    assert out.returncode != 0 and "neither bench_bf16_backward.py's JSON" in out.stderr


def test_device_ab_refuses_a_patch_that_does_not_apply(tmp_path):
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/no/such/file.cu\n+++ b/no/such/file.cu\n@@ -1 +1 @@\n-x\n+y\n")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device-ab.sh")], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "GW_AB_PATCH": str(bad), "OUT": str(tmp_path / "o")})
    assert out.returncode == 2
    assert "does not apply to this tree" in out.stderr
    assert not (tmp_path / "o").exists()  # refused before anything ran
