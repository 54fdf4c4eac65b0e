"""Shared by the operations tests (dashboards, rules, deployment, docs, panel
test): the shipped files, the agent's metric catalogue as the agent prints it,
and the metric names a PromQL expression uses."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess

import pytest
import yaml

from conftest import ROOT, build_dir

DASHBOARDS = ROOT / "dashboards" / "grafana"
RULES = ROOT / "dashboards" / "prometheus" / "gaugewatch_rules.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
DASHBOARD_FILES = ("gaugewatch-fleet.json", "gaugewatch-run.json", "gaugewatch-agent.json")

# A metric name of the catalogue: gaugewatch_ + lower case, not a file name.
METRIC_TOKEN = re.compile(r"\bgaugewatch_[a-z0-9_]+\b(?![.:])")
# Metrics of Prometheus itself that the dashboards and rules may use.
PROMETHEUS_METRICS = {"up"}


def agent_binary() -> pathlib.Path:
    path = build_dir() / "bin" / "gaugewatch-agent"
    if not path.exists():
        pytest.fail(f"{path} is missing: build the agent first (./scripts/build.sh) or set "
                    "GAUGEWATCH_BUILD_DIR")
    return path


def catalogue() -> dict[str, dict]:
    """The agent's exported metrics, from `gaugewatch-agent --print-catalogue`."""
    text = subprocess.run([str(agent_binary()), "--print-catalogue"], capture_output=True, text=True,
                          check=True, timeout=30).stdout
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith("`gaugewatch_"):
            name = cells[0].strip("`")
            rows[name] = {"type": cells[1], "unit": cells[2], "labels": cells[3]}
    assert rows, f"no catalogue rows in --print-catalogue output:\n{text[:500]}"
    return rows


def sample_names(rows: dict[str, dict]) -> set[str]:
    """Catalogue names plus the _bucket/_sum/_count samples of histograms."""
    names = set(rows)
    for name, row in rows.items():
        if row["type"] == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def dashboards() -> dict[str, dict]:
    return {name: json.loads((DASHBOARDS / name).read_text()) for name in DASHBOARD_FILES}


def rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def recorded_names() -> set[str]:
    return {r["record"] for g in rules()["groups"] for r in g["rules"] if "record" in r}


def alerts() -> list[dict]:
    return [r for g in rules()["groups"] for r in g["rules"] if "alert" in r]


def metric_tokens(expr: str) -> set[str]:
    return set(METRIC_TOKEN.findall(expr))


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana variables in a panel query replaced by concrete values."""
    out = expr.replace("$__rate_interval", values.get("__rate_interval", "1m"))
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        out = out.replace("$" + name, value)
    assert "$" not in out, f"unsubstituted variable in {out}"
    return out
