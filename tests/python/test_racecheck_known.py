"""scripts/racecheck_known.py on racecheck output recorded on the H200
(tests/python/data/racecheck_pingpong_reports.log: the default run of
tests/cuda/sanitize_kernels.py at cd3606b, 2026-12-02;
racecheck_pingpong_reports_writer.log: the same at 2cdea46, with KeyTile's
writer-warp parameter and add_dq_tile's thread-count template, 2026-12-02;
racecheck_pair_pivot_fixup_reports.log: the pair's pivot fix-up reports,
sanitize_kernels.py --cases 5 and --cases 6 --runs pivot:pair at 5b606a4,
2026-12-05) and on variants of them that the classifier must not accept."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "racecheck_known.py"
RECORDED = (ROOT / "tests" / "python" / "data" / "racecheck_pingpong_reports.log").read_text()
RECORDED_WRITER = (ROOT / "tests" / "python" / "data" / "racecheck_pingpong_reports_writer.log").read_text()
RECORDED_FIXUP = (ROOT / "tests" / "python" / "data" / "racecheck_pair_pivot_fixup_reports.log").read_text()


def classify(text):
    run = subprocess.run([sys.executable, str(SCRIPT)], input=text, capture_output=True, text=True, timeout=60)
    return run.returncode, run.stdout


@pytest.mark.parametrize("recorded, reports", [(RECORDED, 6), (RECORDED_WRITER, 10), (RECORDED_FIXUP, 4)],
                         ids=["cd3606b", "2cdea46_writer_parameter", "5b606a4_pair_pivot_fixup"])
def test_the_recorded_pingpong_reports_are_known(recorded, reports):
    rc, out = classify(recorded)
    assert rc == 0, out
    assert f"all {reports} reports" in out


def test_the_exchange_in_a_writer_keytile_is_not_known():
    # KeyTile<64, ..., kWriter = true> has no such exchange: not the artefact.
    changed = RECORDED_WRITER.replace("(int)128, (bool)0>::add_dq_tile", "(int)128, (bool)1>::add_dq_tile", 1)
    rc, out = classify(changed)
    assert rc == 1, out
    assert "1 of 10 reports" in out


def test_the_exchange_in_a_gproj_keytile_is_known():
    # gproj's first pass adds dQ as bf16's does (its U moved to the second
    # pass), so KeyTile<64, kGproj> has the same exchange.
    changed = RECORDED.replace("(gaugewatch::gpu::Projection)0", "(gaugewatch::gpu::Projection)1")
    assert changed != RECORDED
    rc, out = classify(changed)
    assert rc == 0, out


def test_an_unknown_report_names_both_sides_briefly():
    # One report's write side moved into another function: the summary names
    # the read and the write with their lines, templates shortened.
    first = RECORDED.index("and Write access at void gaugewatch::gpu::bf16::keyouter::KeyTile")
    changed = RECORDED[:first] + RECORDED[first:].replace("::compute<", "::write_keys<", 1)
    rc, out = classify(changed)
    assert rc == 1, out
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    assert lines[0].startswith("  Read at gaugewatch::gpu::bf16::keyouter::KeyTile<64, 0, 128>::add_dq_tile ("), out
    assert lines[1].startswith("    and Write at gaugewatch::gpu::bf16::keyouter::KeyTile<64, 0, 128>::write_keys<...> ("), out
    assert all("lambda" not in line for line in lines), out


def test_a_hazard_in_another_function_is_not_known():
    # One report's write side moved into another function of the kernel.
    first = RECORDED.index("and Write access at void gaugewatch::gpu::bf16::keyouter::KeyTile")
    changed = RECORDED[:first] + RECORDED[first:].replace("::compute<", "::write_keys<", 1)
    rc, out = classify(changed)
    assert rc == 1, out
    assert "1 of 6 reports" in out


def test_the_same_exchange_at_another_head_dim_is_not_known():
    changed = RECORDED.replace("KeyTile<(int)64, (gaugewatch::gpu::Projection)0, (int)128>::add_dq_tile",
                               "KeyTile<(int)128, (gaugewatch::gpu::Projection)0, (int)128>::add_dq_tile")
    rc, out = classify(changed)
    assert rc == 1, out
    assert "add_dq_tile" in out


def test_a_write_write_hazard_is_not_known():
    changed = RECORDED.replace("Race reported between Read access", "Race reported between Write access", 1)
    rc, out = classify(changed)
    assert rc == 1, out


def test_output_without_reports_is_left_to_the_caller():
    rc, out = classify("========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed\n")
    assert rc == 2, out


def test_both_artefacts_in_one_run_are_known():
    rc, out = classify(RECORDED + RECORDED_FIXUP)
    assert rc == 0, out
    assert "all 10 reports are known artefacts across the pingpong (6 the D = 64 dQ exchange, 4 the pair's pivot " \
           "fix-up" in out, out


def test_the_fixup_reads_in_a_dkdv_kernel_without_the_fixup_are_not_known():
    # bf16's and gproj's dkdv kernels have no fix-up: the same reads there
    # are not the artefact.
    for projection in ("0", "1"):
        changed = RECORDED_FIXUP.replace("(gaugewatch::gpu::Projection)2>", f"(gaugewatch::gpu::Projection){projection}>",
                                         1)
        rc, out = classify(changed)
        assert rc == 1, out
        assert "1 of 4 reports" in out


def test_fixup_reads_against_a_write_of_another_function_are_not_known():
    changed = RECORDED_FIXUP.replace("Write access at gaugewatch::gpu::mma::cp_async_16(",
                                     "Write access at gaugewatch::gpu::mma::store_tile(", 1)
    rc, out = classify(changed)
    assert rc == 1, out
    assert "1 of 4 reports" in out


def test_a_cp_async_write_against_another_read_is_not_known():
    changed = RECORDED_FIXUP.replace("[lambda(unsigned long, int) (instance 1)]", "[lambda(int, int) (instance 2)]", 1)
    rc, out = classify(changed)
    assert rc == 1, out
    assert "1 of 4 reports" in out
