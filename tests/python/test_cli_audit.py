"""`gaugewatch audit` as a user runs it: the witness, the scenarios, errors."""

import re


def backend(report, name):
    return next(b for b in report["backends"] if b["name"] == name)


def test_witness_prints_minus_24_and_zero(run_cli, audit_json):
    text = run_cli("audit", "witness").stdout
    rows = {line.split()[0]: line.split() for line in text.splitlines() if re.match(r"^(fp64|fp32|bf16|gproj|pivot)\s", line)}
    assert rows["bf16"][4] == "-24"
    assert rows["gproj"][4] == "0"
    assert rows["pivot"][4] == "0"
    assert rows["fp64"][4] == "0"

    report = audit_json("witness")
    assert report["offset_coordinate"] == 0
    assert backend(report, "bf16")["offset_coordinate_first_row"] == -24.0
    assert abs(backend(report, "gproj")["offset_coordinate_first_row"]) < 1e-3
    assert abs(backend(report, "pivot")["offset_coordinate_first_row"]) < 1e-3
    assert report["metrics"]["row_mass_abs_max"] == 3 / 1024


def test_sink_scenario_separates_backends(audit_json):
    report = audit_json("sink", "--q-len", "256", "--heads", "2")
    assert backend(report, "bf16")["dq_error"] > 0.5
    assert backend(report, "gproj")["dq_error"] < 0.005
    assert backend(report, "pivot")["dq_error"] < 0.01
    assert backend(report, "fp32")["dq_error"] < 1e-3
    metrics = report["metrics"]
    assert metrics["live_dq_discrepancy"] > 0.5
    assert metrics["gproj_dq_discrepancy"] < 0.005
    assert metrics["live_gauge_violation"] > 0.5 > 0.01 > metrics["gproj_gauge_violation"]
    assert metrics["key_offset_spread_ratio_median"] > 10
    assert metrics["sharp_row_fraction"] > 0.3


def test_list_names_every_scenario(run_cli):
    names = [line.split()[0] for line in run_cli("audit", "--list").stdout.splitlines()]
    assert {"witness", "random", "sink", "two_key", "massive_key", "clusters"} <= set(names)


def test_usage_errors_exit_2_with_a_reason(run_cli):
    result = run_cli("audit", "no_such_scenario", check=False)
    assert result.returncode == 2
    assert "no scenario 'no_such_scenario'" in result.stderr
    result = run_cli("audit", "random", "--q-len", "zero", check=False)
    assert result.returncode == 2
    assert "--q-len needs a positive integer" in result.stderr
    result = run_cli("audit", "random", "--causal", "sideways", check=False)
    assert result.returncode == 2
    assert "unknown causal mode" in result.stderr
    result = run_cli("frobnicate", check=False)
    assert result.returncode == 2


def test_unreadable_file_exits_1_naming_it(run_cli, tmp_path):
    missing = tmp_path / "nope.safetensors"
    result = run_cli("audit", "--input", missing, check=False)
    assert result.returncode == 1
    assert str(missing) in result.stderr and "cannot open" in result.stderr
