"""Dashboard lint: the Grafana JSON is what the generator writes; every panel
has a title, a description and a unit; queries name only catalogue metrics,
recording rules and `up`; layer panels show module names; the run dashboard
has the variables and the switch annotations; provisioning points at the files."""

import re
import subprocess
import sys

import pytest
import yaml

from operations_support import (DASHBOARDS, PROMETHEUS_METRICS, catalogue, dashboards, metric_tokens,
                                recorded_names, sample_names)


def panels():
    for file, board in dashboards().items():
        for p in board["panels"]:
            yield file, p


def test_committed_json_is_the_generator_output():
    result = subprocess.run([sys.executable, str(DASHBOARDS / "generate_dashboards.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("file,board", list(dashboards().items()))
def test_dashboard_has_identity(file, board):
    assert board["title"].startswith("gaugewatch / "), file
    assert board["uid"] and board["description"], file
    assert board["templating"]["list"][0]["name"] == "datasource"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), f"{file}: duplicate panel ids"


def test_every_panel_has_title_description_unit_and_queries():
    for file, p in panels():
        where = f"{file}: panel {p.get('id')} {p.get('title')!r}"
        assert p.get("title"), where
        assert len(p.get("description", "")) >= 20, f"{where}: description missing or too short"
        assert p["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        assert p["datasource"]["uid"] == "${datasource}", where
        assert p["targets"], f"{where}: no query"
        for t in p["targets"]:
            assert t["expr"].strip(), where
            assert t["datasource"]["uid"] == "${datasource}", where


def test_queries_use_only_catalogue_names():
    allowed = sample_names(catalogue()) | recorded_names() | PROMETHEUS_METRICS
    seen = set()
    for file, board in dashboards().items():
        exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
        exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
        exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
        for expr in exprs:
            for name in metric_tokens(expr):
                seen.add(name)
                assert name in allowed, f"{file}: {name} is not in the agent's catalogue ({expr})"
            for name in re.findall(r"\b[a-z_]+(?=\{)", expr):
                assert name.startswith("gaugewatch_") or name in PROMETHEUS_METRICS, (file, name)
    assert len(seen) >= 25, f"only {len(seen)} distinct metrics on the dashboards"


def test_layer_series_are_shown_by_module_name():
    for file, p in panels():
        for t in p["targets"]:
            layer_metrics = {m for m in metric_tokens(t["expr"]) if m.startswith("gaugewatch_layer_")}
            if not layer_metrics or layer_metrics == {"gaugewatch_layer_backend_info"}:
                continue
            outer = re.match(r"\s*(?:topk\(\d+, )?\w+ by \(([^)]*)\)", t["expr"])
            if outer and "layer" not in outer.group(1) and "name" not in outer.group(1):
                continue  # aggregated over layers (per run, per agent): no layer to name
            assert "group_left (name" in t["expr"], f"{file} {p['title']}: no join with backend_info"
            if p["type"] in ("timeseries", "heatmap"):
                assert "{{name}}" in t["legendFormat"], f"{file} {p['title']}: legend without name"
            if p["type"] == "table":
                organize = p["transformations"][0]["options"]["renameByName"]
                assert organize.get("name") == "Module", f"{file} {p['title']}"


def test_run_dashboard_has_variables_heatmap_and_switch_annotations():
    board = dashboards()["gaugewatch-run.json"]
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "run", "rank", "layer"]
    layer = board["templating"]["list"][3]
    assert "(?<value>" in layer["regex"] and "(?<text>" in layer["regex"]
    # The regex reads the labels in the order Prometheus prints them.
    assert re.search(layer["regex"].strip("/").replace("?<", "?P<"),
                     '{layer="3",name="model.layers.3.self_attn"} 1').group("text") == \
        "model.layers.3.self_attn"
    assert any(p["type"] == "heatmap" for p in board["panels"])
    switch = [a for a in board["annotations"]["list"] if a.get("name") == "Backend switches"]
    assert switch and "gaugewatch_layer_backend_info" in switch[0]["expr"]
    assert "{{name}}" in switch[0]["titleFormat"]


def test_fleet_and_agent_dashboards_cover_the_issue():
    boards = dashboards()
    fleet = " ".join(t["expr"] for p in boards["gaugewatch-fleet.json"]["panels"] for t in p["targets"])
    for metric in ("gaugewatch_layer_live_dq_discrepancy_ratio", "gaugewatch_agent_trainers_connected",
                   "gaugewatch_layer_backend_info"):
        assert metric in fleet
    agent = " ".join(t["expr"] for p in boards["gaugewatch-agent.json"]["panels"] for t in p["targets"])
    assert 'up{job="gaugewatch-agent"}' in agent


def test_provisioning_points_at_the_dashboards():
    provider = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards" / "gaugewatch.yaml").read_text())
    assert provider["apiVersion"] == 1
    assert provider["providers"][0]["type"] == "file"
    datasource = yaml.safe_load((DASHBOARDS / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus"
