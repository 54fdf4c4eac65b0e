#!/usr/bin/env python3
"""Writes the gaugewatch Grafana dashboards (JSON model, schema 38, Grafana 10)
from the panel tables below: one place that says what each panel asks
Prometheus, so the three dashboards share their variables, units and joins.

    python3 dashboards/grafana/generate_dashboards.py          # rewrite the JSON
    python3 dashboards/grafana/generate_dashboards.py --check  # exit 1 if stale

Every metric name comes from the agent's catalogue (`gaugewatch-agent
--print-catalogue`); tests/python/test_dashboards.py checks names, titles,
units and descriptions, and that the committed JSON equals this output.
Legends and tables show module names: layer series are joined with
`gaugewatch_layer_backend_info`, which carries `name` and `backend`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}

# Backends whose backward corrects the BF16 leak (docs/numerics.md); the others
# (stock, bf16) are the ones the agent switches away from.
CORRECTING = "gproj|pivot|center|fp32"

# Selectors of the run/layer detail dashboard's variables.
RUN_SEL = 'run=~"$run", rank=~"$rank", layer=~"$layer"'
RANK_SEL = 'run=~"$run", rank=~"$rank"'


def named(expr: str, selector: str = RUN_SEL) -> str:
    """A per-layer series joined with its module name and backend."""
    return (f"{expr} * on (instance, run, rank, layer) group_left (name, backend) "
            f"gaugewatch_layer_backend_info{{{selector}}}")


def layer_metric(metric: str, selector: str = RUN_SEL) -> str:
    return named(f"{metric}{{{selector}}}", selector)


def target(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False,
           fmt: str | None = None) -> dict:
    out = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        out["instant"] = True
        out["range"] = False
    if fmt:
        out["format"] = fmt
    return out


def panel(kind: str, title: str, description: str, unit: str, targets: list[dict], *,
          w: int = 12, h: int = 8, options: dict | None = None,
          field_defaults: dict | None = None, transformations: list | None = None) -> dict:
    refs = "ABCDEFGH"
    for i, t in enumerate(targets):
        t["refId"] = refs[i]
    defaults = {"unit": unit}
    defaults.update(field_defaults or {})
    out = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
    }
    if transformations:
        out["transformations"] = transformations
    return out


def timeseries(title, description, unit, targets, **kw):
    kw.setdefault("options", {"legend": {"displayMode": "table", "placement": "right",
                                         "calcs": ["lastNotNull", "max"]},
                              "tooltip": {"mode": "multi", "sort": "desc"}})
    return panel("timeseries", title, description, unit, targets, **kw)


def stat(title, description, unit, expr, **kw):
    kw.setdefault("w", 6)
    kw.setdefault("h", 4)
    return panel("stat", title, description, unit, [target(expr, instant=True)],
                 options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value",
                          "graphMode": "none"}, **kw)


def table(title, description, unit, expr, columns: dict[str, str], value: str = "Value", **kw):
    """An instant table; `columns` maps label names to headers, in order; the
    other labels are hidden; `value` heads the query's value."""
    kw.setdefault("w", 24)
    organize = {
        "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True},
        "indexByName": {name: i for i, name in enumerate([*columns, "Value"])},
        "renameByName": columns | {"Value": value},
    }
    return panel("table", title, description, unit,
                 [target(expr, instant=True, fmt="table")],
                 options={"showHeader": True, "footer": {"show": False}},
                 transformations=[{"id": "organize", "options": organize}], **kw)


def variable_datasource() -> dict:
    return {"name": "datasource", "label": "Data source", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0}


def variable_query(name: str, label: str, query: str, *, regex: str = "", multi: bool = True,
                   include_all: bool = True, sort: int = 1) -> dict:
    out = {"name": name, "label": label, "type": "query", "datasource": DS,
           "definition": query, "query": {"query": query, "refId": f"{name}-variable"},
           "refresh": 2, "regex": regex, "multi": multi, "includeAll": include_all,
           "sort": sort, "hide": 0}
    if include_all:
        out["current"] = {"text": "All", "value": "$__all"}
        out["allValue"] = ".*"
    return out


RUN_VAR = variable_query("run", "Run", "label_values(gaugewatch_layer_backend_info, run)")
RANK_VAR = variable_query("rank", "Rank",
                          'label_values(gaugewatch_layer_backend_info{run=~"$run"}, rank)', sort=3)
# Shown by module name, selected by layer index: the regex takes the value
# (layer) and the text (name) from each backend_info series.
LAYER_VAR = variable_query(
    "layer", "Layer",
    'query_result(max by (layer, name) (gaugewatch_layer_backend_info{run=~"$run", rank=~"$rank"}))',
    regex='/layer="(?<value>[^"]+)",name="(?<text>[^"]+)"/', sort=3)

SWITCH_ANNOTATION = {
    # A non-stock backend_info series that did not exist a minute earlier: the
    # step at which a layer's backend changed (a switch decision carried out).
    "name": "Backend switches",
    "datasource": DS,
    "enable": True,
    "iconColor": "orange",
    "expr": ('gaugewatch_layer_backend_info{run=~"$run", rank=~"$rank", backend!~"stock|bf16"} '
             'unless gaugewatch_layer_backend_info{run=~"$run", rank=~"$rank", '
             'backend!~"stock|bf16"} offset 1m'),
    "step": "1m",
    "titleFormat": "switch: {{name}} -> {{backend}}",
    "textFormat": "run {{run}} rank {{rank}} layer {{layer}} ({{name}}) now runs {{backend}}",
    "tagKeys": "run,rank,backend",
    "useValueForTime": False,
}
GRAFANA_ANNOTATION = {
    "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
    "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
    "type": "dashboard",
}


def fleet_panels() -> list[dict]:
    live = "gaugewatch_layer_live_dq_discrepancy_ratio"
    all_sel = 'run=~"$run"'
    return [
        stat("Trainers connected", "Trainer streams open to the agents now, over every agent.",
             "none", "sum(gaugewatch_agent_trainers_connected)"),
        stat("Runs reporting", "Runs with at least one rank whose trainer has a stream open.",
             "none", 'count(count by (run) (gaugewatch_rank_connected{run=~"$run"} == 1)) or vector(0)'),
        stat("Layers on a correcting backend",
             f"Layers (per rank) whose backward runs {CORRECTING.replace('|', ', ')}: switched by "
             "a rule, an operator or the trainer's own setting.",
             "none",
             f'count(gaugewatch_layer_backend_info{{{all_sel}, backend=~"{CORRECTING}"}}) or vector(0)'),
        stat("Agents down", "Scrape targets of the gaugewatch-agent job that Prometheus cannot reach "
             "(up == 0). Runbook: GaugewatchAgentDown.",
             "none", 'count(up{job="gaugewatch-agent"} == 0) or vector(0)'),
        table("Worst layers by live dQ discrepancy",
              "The ten layers (worst rank each) whose live backward's dQ is furthest from the FP32 "
              "recompute, with the module name and the backend the layer runs now. "
              "Above 5% on stock the default rule switches the layer to gproj.",
              "percentunit",
              f"topk(10, max by (run, layer, name, backend) ({layer_metric(live, all_sel)}))",
              {"run": "Run", "layer": "Layer", "name": "Module", "backend": "Backend"},
              value="live dQ discrepancy", h=8),
        timeseries("Worst live dQ discrepancy per run",
                   "Largest ||dQ_live - dQ_fp32|| / ||dQ_fp32|| over the run's ranks and layers.",
                   "percentunit",
                   [target(f"max by (run) ({live}{{{all_sel}}})", "{{run}}")]),
        timeseries("Layers switched per run",
                   "Layers per run (summed over ranks) whose backend is a correcting one.",
                   "none",
                   [target(f'count by (run) (gaugewatch_layer_backend_info{{{all_sel}, '
                           f'backend=~"{CORRECTING}"}})', "{{run}}")]),
        timeseries("Unmonitored attention calls / s",
                   "Attention calls the hooks saw but could not audit, by reason (dropout, math path, "
                   "dtype, ...): their gradients are not checked. Runbook: "
                   "GaugewatchUnmonitoredAttention.",
                   "ops",
                   [target('sum by (run, reason) (rate(gaugewatch_rank_attention_calls_total'
                           '{run=~"$run", monitored="false"}[$__rate_interval]))',
                           "{{run}}: {{reason}}")]),
        timeseries("Monitored share of attention calls",
                   "Audited attention calls over all attention calls the hooks saw, per run.",
                   "percentunit",
                   [target('sum by (run) (rate(gaugewatch_rank_attention_calls_total'
                           '{run=~"$run", monitored="true"}[$__rate_interval])) / '
                           'sum by (run) (rate(gaugewatch_rank_attention_calls_total'
                           '{run=~"$run"}[$__rate_interval]))', "{{run}}")],
                   field_defaults={"min": 0, "max": 1}),
        table("Ranks and their GPUs",
              "Every rank the agents know, with host, local rank and GPU (UUID and PCI bus id as "
              "dcgm-exporter spells them: join DCGM_FI_* on UUID, docs/operations.md), and whether "
              "its trainer is connected.",
              "none",
              'gaugewatch_rank_info{run=~"$run"} '
              '* on (instance, run, rank) group_left () gaugewatch_rank_connected',
              {"run": "Run", "rank": "Rank", "local_rank": "Local rank", "hostname": "Host",
               "gpu_uuid": "GPU UUID", "pci_bus_id": "PCI bus id"}, value="Connected", h=8),
        timeseries("Ranks finished and silent",
                   "Ranks that said goodbye (finished cleanly) and ranks that went silent without "
                   "one (expired). Silent ranks mid-run fire GaugewatchTrainerSilent.",
                   "none",
                   [target('sum by (run) (gaugewatch_rank_finished{run=~"$run"})', "{{run}} finished"),
                    target('sum by (run) (gaugewatch_rank_expired{run=~"$run"} unless on (instance, '
                           'run, rank) gaugewatch_rank_finished == 1)', "{{run}} silent")]),
    ]


def run_panels() -> list[dict]:
    def per_layer(metric: str) -> str:
        return f"max by (run, layer, name) ({layer_metric(metric)})"

    return [
        timeseries("Live vs GProj dQ discrepancy",
                   "||dQ - dQ_fp32|| / ||dQ_fp32|| for the backend the layer runs (live) and for "
                   "GProj on the same operands (worst rank). Orange marks: backend switches.",
                   "percentunit",
                   [target(per_layer("gaugewatch_layer_live_dq_discrepancy_ratio"), "{{name}} live"),
                    target(per_layer("gaugewatch_layer_gproj_dq_discrepancy_ratio"), "{{name}} gproj")],
                   w=24, h=9),
        panel("heatmap", "Live dQ discrepancy: layers x time",
              "One row per layer (module name), colour = live dQ discrepancy (worst rank): a "
              "leak shows as a bright band, a switch as the band going dark.",
              "percentunit",
              [target(per_layer("gaugewatch_layer_live_dq_discrepancy_ratio"), "{{layer}} {{name}}",
                      fmt="time_series")],
              w=24, h=10,
              options={"calculate": False, "cellGap": 1,
                       "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential",
                                 "exponent": 0.5, "fill": "dark-orange", "steps": 64},
                       "yAxis": {"axisPlacement": "left"}, "rowsFrame": {"layout": "auto"},
                       "legend": {"show": True}, "tooltip": {"show": True, "yHistogram": False},
                       "cellValues": {"unit": "percentunit"}}),
        timeseries("Live dK and dV discrepancy",
                   "||dK_live - dK_fp32|| / ||dK_fp32|| and the same for dV (worst rank).",
                   "percentunit",
                   [target(per_layer("gaugewatch_layer_live_dk_discrepancy_ratio"), "{{name}} dK"),
                    target(per_layer("gaugewatch_layer_live_dv_discrepancy_ratio"), "{{name}} dV")]),
        timeseries("Row mass |rho| / sum |t| (max over rows)",
                   "The BF16 score gradient's leftover row sum relative to the row's gradient size: "
                   "what the key offset multiplies into dQ (docs/numerics.md).",
                   "percentunit",
                   [target(per_layer("gaugewatch_layer_row_mass_normalized_max_ratio"), "{{name}}")]),
        timeseries("Key offset / spread ratio",
                   "||mu_k|| / sigma_k, the leak amplification: median and max over rows. Rising "
                   "above 3 fires GaugewatchKeyOffsetRatioRising.",
                   "none",
                   [target(per_layer("gaugewatch_layer_key_offset_spread_ratio_median_ratio"),
                           "{{name}} median"),
                    target(per_layer("gaugewatch_layer_key_offset_spread_ratio_max_ratio"), "{{name}} max")]),
        timeseries("Sharp rows (p_max > 0.999)",
                   "Fraction of rows whose attention sits on one key.",
                   "percentunit",
                   [target(per_layer("gaugewatch_layer_sharp_row_fraction_ratio"), "{{name}}")]),
        timeseries("Gauge violation: live vs GProj",
                   "||dQ(K+b) - dQ(K)|| / ||dQ(K)|| with b = -mean key: 0 in exact arithmetic.",
                   "percentunit",
                   [target(per_layer("gaugewatch_layer_live_gauge_violation_ratio"), "{{name}} live"),
                    target(per_layer("gaugewatch_layer_gproj_gauge_violation_ratio"), "{{name}} gproj")]),
        timeseries("Audited samples / s",
                   "Samples the agent received per layer: a gap means the layer is not sampled.",
                   "ops",
                   [target(f"sum by (name) ({named(f'rate(gaugewatch_layer_samples_total{{{RUN_SEL}}}[$__rate_interval])')})",
                           "{{name}}")]),
        table("Layers: backend and desired backend",
              "Per rank and layer: the backend the layer runs and the one the decisions in force "
              "ask for (they differ until the trainer acknowledges a switch).",
              "none", f"gaugewatch_layer_backend_info{{{RUN_SEL}}}",
              {"run": "Run", "rank": "Rank", "layer": "Layer", "name": "Module", "backend": "Backend",
               "desired": "Desired"}, value="Info", h=9),
    ]


def agent_panels() -> list[dict]:
    job = 'job="gaugewatch-agent"'
    rate = "[$__rate_interval]"
    return [
        stat("Agents up", "Scrape targets of the gaugewatch-agent job that answer.", "none",
             f"sum(up{{{job}}})"),
        stat("Agents down", "Scrape targets that do not answer (up == 0): GaugewatchAgentDown.",
             "none", f"count(up{{{job}}} == 0) or vector(0)"),
        stat("Per-layer series vs limit", "Series admitted by the cardinality guard as a share of "
             "max_series; at 100% new layers are refused (GaugewatchCardinalityLimit).",
             "percentunit", "max(gaugewatch_agent_series / gaugewatch_agent_series_limit)"),
        stat("Trainers connected", "Trainer streams open now, over all agents.", "none",
             "sum(gaugewatch_agent_trainers_connected)"),
        timeseries("Samples received / s", "Samples accepted, per agent.", "ops",
                   [target(f"sum by (instance) (rate(gaugewatch_agent_samples_received_total{rate}))",
                           "{{instance}}")]),
        timeseries("Rejected messages / s by reason",
                   "Trainer messages that failed validation (GaugewatchMessagesRejected).", "ops",
                   [target(f"sum by (instance, reason) (rate(gaugewatch_agent_messages_rejected_total{rate}))",
                           "{{instance}}: {{reason}}")]),
        timeseries("Samples lost: dropped by hooks, shed by the rate limit",
                   "Samples the trainers' hooks dropped from their bounded queues, and valid samples "
                   "the agent shed at the per-trainer rate limit (GaugewatchSamplesDropped, "
                   "GaugewatchTrainerRateLimited).",
                   "short",
                   [target("sum by (run, rank) (increase(gaugewatch_rank_hook_dropped_samples_total"
                           f"{rate}))", "dropped {{run}}/{{rank}}"),
                    target(f"sum by (run, rank) (increase(gaugewatch_rank_samples_shed_total{rate}))",
                           "shed {{run}}/{{rank}}")]),
        timeseries("Series vs limit", "Per-layer series admitted by the cardinality guard, its limit, "
                   "and samples refused because the limit was reached.", "short",
                   [target("gaugewatch_agent_series", "{{instance}} series"),
                    target("gaugewatch_agent_series_limit", "{{instance}} limit"),
                    target(f"increase(gaugewatch_agent_series_refused_total{rate})",
                           "{{instance}} refused")]),
        timeseries("Switch decisions and commands",
                   "Decisions recorded by source (rule, promql_rule, admin), command "
                   "acknowledgements by status, and rule firings on layers no correcting backend "
                   "can take (reported, not switched).", "short",
                   [target(f"sum by (source) (increase(gaugewatch_agent_decisions_total{rate}))",
                           "decisions: {{source}}"),
                    target(f"sum by (status) (increase(gaugewatch_agent_command_acks_total{rate}))",
                           "acks: {{status}}"),
                    target(f"sum (increase(gaugewatch_agent_escalations_uncorrectable_total{rate}))",
                           "rule firings no correcting backend can take")]),
        timeseries("Limits: streams refused, ranks held, clock-skewed samples",
                   "Trainer streams refused or ended by a limit (stream_limit, rank_limit, "
                   "hello_deadline), ranks the agent holds in memory, and samples whose timestamp "
                   "lies outside the clock-skew window.", "short",
                   [target(f"sum by (instance, reason) (increase(gaugewatch_agent_streams_refused_total{rate}))",
                           "{{instance}} refused: {{reason}}"),
                    target("gaugewatch_agent_ranks", "{{instance}} ranks held"),
                    target(f"increase(gaugewatch_agent_samples_clock_skew_total{rate})",
                           "{{instance}} clock-skewed samples")]),
        timeseries("Sample age at ingest (p99)",
                   "Time from a trainer stamping a sample to the agent applying it.", "s",
                   [target("histogram_quantile(0.99, sum by (instance, le) "
                           f"(rate(gaugewatch_agent_sample_age_seconds_bucket{rate})))", "{{instance}}")]),
        timeseries("Scrape rendering time", "Time the previous /metrics rendering took.", "s",
                   [target("gaugewatch_agent_scrape_duration_seconds", "{{instance}}")]),
        timeseries("SQLite store: rows kept and pruned",
                   "Rows after the last retention pass and rows deleted by retention, by table; "
                   "write failures (GaugewatchStoreErrors).", "short",
                   [target("sum by (instance, table) (gaugewatch_agent_store_rows)",
                           "{{instance}} {{table}} rows"),
                    target(f"sum by (instance, table) (increase(gaugewatch_agent_store_pruned_rows_total{rate}))",
                           "{{instance}} {{table}} pruned"),
                    target(f"sum by (instance) (increase(gaugewatch_agent_store_errors_total{rate}))",
                           "{{instance}} write errors")]),
    ]


def layout(panels: list[dict]) -> list[dict]:
    """Assigns ids and grid positions row by row (24 columns)."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x += w
        row_h = max(row_h, h)
    return panels


def dashboard(uid: str, title: str, description: str, variables: list[dict], panels: list[dict],
              annotations: list[dict]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gaugewatch"],
        "timezone": "utc",
        "schemaVersion": 38,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "links": [{"type": "dashboards", "tags": ["gaugewatch"], "asDropdown": False,
                   "includeVars": True, "keepTime": True, "title": "gaugewatch"}],
        "templating": {"list": [variable_datasource(), *variables]},
        "annotations": {"list": [GRAFANA_ANNOTATION, *annotations]},
        "panels": layout(panels),
    }


def dashboards() -> dict[str, dict]:
    return {
        "gaugewatch-fleet.json": dashboard(
            "gaugewatch-fleet", "gaugewatch / Fleet overview",
            "Every run the agents see: worst layers, switches, coverage, ranks and their GPUs.",
            [RUN_VAR], fleet_panels(), [SWITCH_ANNOTATION | {"expr": SWITCH_ANNOTATION["expr"].replace(
                ', rank=~"$rank"', "")}]),
        "gaugewatch-run.json": dashboard(
            "gaugewatch-run", "gaugewatch / Run and layer detail",
            "One run's layers over time: live vs GProj discrepancy, row mass, key offset/spread, "
            "sharpness; backend switches as annotations.",
            [RUN_VAR, RANK_VAR, LAYER_VAR], run_panels(), [SWITCH_ANNOTATION]),
        "gaugewatch-agent.json": dashboard(
            "gaugewatch-agent", "gaugewatch / Agent health",
            "The node agents themselves: reachability, ingest, rejections, losses, cardinality, "
            "decisions, SQLite.",
            [], agent_panels(), []),
    }


def render(board: dict) -> str:
    return json.dumps(board, indent=2, sort_keys=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    args = parser.parse_args()
    stale = []
    for name, board in dashboards().items():
        path = HERE / name
        text = render(board)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("stale (run dashboards/grafana/generate_dashboards.py):", ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
