"""The panel test: real agents fed by simulated trainers (tests/ops/sim_fleet.cpp:
a switch, a rejected switch, a finished run, a silent one, ...) and a real
Prometheus scraping them with the shipped rules loaded. Every dashboard
query (variables substituted) returns data, and every alert fires in the
scenario meant for it and in no other.

Short intervals keep it under a minute: scrapes and rule evaluations every
second, the agents' rank expiry 6 s, and every alert's `for:` cut to 10 s
(the rules are otherwise the shipped file, loaded as is)."""

import functools
import http.server
import re
import shutil
import threading
import time

import pytest

from live_fleet import Agent, Processes, Prometheus, free_port, start_sim_fleet, wait_until
from conftest import ROOT
from operations_support import RULES, alerts, dashboards, substitute

# alert -> the scenario it belongs to: (label, value) every firing series of
# it must carry. Node A holds one run per scenario, node B the agent-level
# ones, node C is a scrape target nobody listens on.
EXPECTED = {
    "GaugewatchDqDiscrepancyHigh": ("run", "unswitchable"),
    "GaugewatchSwitchedLayerStillHigh": ("run", "still-high"),
    "GaugewatchKeyOffsetRatioRising": ("run", "drifting"),
    "GaugewatchGaugeViolation": ("run", "translation"),
    "GaugewatchGprojNotExact": ("run", "gproj-inexact"),
    "GaugewatchUnmonitoredAttention": ("run", "coverage"),
    "GaugewatchTrainerSilent": ("run", "silent"),
    "GaugewatchSamplesDropped": ("run", "dropping"),
    "GaugewatchTrainerRateLimited": ("run", "flood"),
    "GaugewatchAgentDown": ("instance", "node-c"),
    "GaugewatchMessagesRejected": ("instance", "node-b"),
    "GaugewatchCardinalityLimit": ("instance", "node-b"),
}
# An SQLite write failure cannot be caused from outside a running agent
# without faking the file system; promtool tests GaugewatchStoreErrors.
NOT_PLAYED = {"GaugewatchStoreErrors"}
FOR_IN_TEST = "10s"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if not shutil.which(Prometheus.BINARY):
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    directory = tmp_path_factory.mktemp("panels")
    rules = re.sub(r"^(\s+for: ).*$", rf"\g<1>{FOR_IN_TEST}", RULES.read_text(), flags=re.M)
    (directory / "rules.yml").write_text(rules)
    processes = Processes(directory)
    # A DCGM-shaped target (dcgm-exporter's metric and labels), filled by the
    # join test with the GPU UUIDs the simulated ranks report.
    dcgm_dir = directory / "dcgm"
    dcgm_dir.mkdir()
    dcgm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        QuietHandler, directory=str(dcgm_dir)))
    threading.Thread(target=dcgm.serve_forever, daemon=True).start()
    try:
        node_a = Agent(processes, "a", "--rank-expiry-seconds", "6")
        node_b = Agent(processes, "b", "--trainer-sample-rate", "100", "--trainer-sample-burst", "100",
                       "--max-series", "200")
        node_c = f"127.0.0.1:{free_port()}"  # nothing listens: an agent that is down
        names = {node_a.address: "node-a", node_b.address: "node-b", node_c: "node-c"}
        relabel = "\n".join(f"          - source_labels: [__address__]\n"
                            f"            regex: '{re.escape(address)}'\n"
                            f"            target_label: instance\n"
                            f"            replacement: {name}" for address, name in names.items())
        prometheus = Prometheus(processes, f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{directory / 'rules.yml'}"]
scrape_configs:
  - job_name: gaugewatch-agent
    static_configs:
      - targets: ["{node_a.address}", "{node_b.address}", "{node_c}"]
    relabel_configs:
{relabel}
  - job_name: dcgm
    static_configs:
      - targets: ["127.0.0.1:{dcgm.server_address[1]}"]
""")
        # Every target scraped once before the first trainer connects, so that
        # each counter's first sample precedes its first increase.
        wait_until(lambda: len(prometheus.query('up{job="gaugewatch-agent"}')) == 3, 30,
                   "the first scrape of every target")
        start = time.time()
        start_sim_fleet(processes, 120, node_a.socket, node_b.socket)
        yield {"prometheus": prometheus, "start": start, "processes": processes, "dcgm_dir": dcgm_dir}
    finally:
        processes.stop()
        dcgm.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def firing(prometheus, start):
    found = set()
    for series in prometheus.query_range('ALERTS{alertstate="firing"}', start, time.time()):
        labels = series["metric"]
        key, _ = EXPECTED.get(labels["alertname"], ("run", None))
        found.add((labels["alertname"], key, labels.get(key, labels.get("instance"))))
    return found


EXPECTED_FIRING = {(name, key, value) for name, (key, value) in EXPECTED.items()}


@pytest.fixture(scope="module")
def settled(fleet):
    """The fleet once every scenario has played out: every expected alert
    fired (or 90 s passed; the alert test says which did not)."""
    prometheus, start = fleet["prometheus"], fleet["start"]
    try:
        wait_until(lambda: EXPECTED_FIRING <= firing(prometheus, start), 90, "every alert to fire",
                   interval=2)
    except AssertionError:
        pass
    time.sleep(3)  # a late, unexpected alert gets its chance too
    return fleet


def test_every_alert_fires_in_its_scenario_and_no_other(settled):
    prometheus, start = settled["prometheus"], settled["start"]
    assert {a["alert"] for a in alerts()} == set(EXPECTED) | NOT_PLAYED
    expected = EXPECTED_FIRING
    found = firing(prometheus, start)
    assert found == expected, (f"missing: {sorted(expected - found)}\nunexpected: {sorted(found - expected)}\n"
                               + settled["processes"].log("sim-fleet"))


# Variables of each dashboard: the fleet with every run, the run dashboard on
# the switched run (every rank and layer).
VALUES = {
    "gaugewatch-fleet.json": {"run": ".*", "__rate_interval": "10s"},
    "gaugewatch-run.json": {"run": "switched", "rank": ".*", "layer": ".*", "__rate_interval": "10s"},
    "gaugewatch-agent.json": {"__rate_interval": "10s"},
}


def queries():
    for file, board in dashboards().items():
        for panel in board["panels"]:
            for target in panel["targets"]:
                yield file, panel["title"], target.get("instant", False), target["expr"]
        for annotation in board["annotations"]["list"]:
            if "expr" in annotation:
                yield file, annotation["name"], False, annotation["expr"]
        for variable in board["templating"]["list"]:
            definition = variable.get("definition", "")
            if definition.startswith("query_result("):
                yield file, f"variable {variable['name']}", True, definition[len("query_result("):-1]


def test_every_panel_query_returns_data(settled):
    prometheus, start = settled["prometheus"], settled["start"]
    empty = []
    checked = 0
    for file, title, instant, expr in queries():
        concrete = substitute(expr, VALUES[file])
        result = (prometheus.query(concrete) if instant
                  else prometheus.query_range(concrete, start, time.time(), step="2s"))
        checked += 1
        if not result:
            empty.append(f"{file} / {title}: {concrete}")
    assert checked >= 40
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_switch_shows_as_annotation_with_module_name(settled):
    prometheus, start = settled["prometheus"], settled["start"]
    board = dashboards()["gaugewatch-run.json"]
    annotation = next(a for a in board["annotations"]["list"] if a.get("name") == "Backend switches")
    result = prometheus.query_range(substitute(annotation["expr"], VALUES["gaugewatch-run.json"]),
                                    start, time.time(), step="2s")
    assert {(s["metric"]["layer"], s["metric"]["name"], s["metric"]["backend"]) for s in result} == \
        {("1", "model.layers.1.self_attn", "gproj")}


def test_layer_legends_carry_module_names(settled):
    prometheus = settled["prometheus"]
    worst = next(p for p in dashboards()["gaugewatch-fleet.json"]["panels"]
                 if p["title"] == "Worst layers by live dQ discrepancy")
    rows = prometheus.query(substitute(worst["targets"][0]["expr"], VALUES["gaugewatch-fleet.json"]))
    top = max(rows, key=lambda s: float(s["value"][1]))["metric"]
    assert top["name"].startswith("model.layers.") and top["run"] in ("unswitchable", "still-high")


def documented_dcgm_queries():
    """The PromQL of docs/operations.md's DCGM section, one string per query."""
    section = (ROOT / "docs" / "operations.md").read_text().split("Join with DCGM", 1)[1]
    block = section.split("```")[3]
    queries, current = [], []
    for line in block.splitlines():
        if line.startswith("#") or not line.strip():
            if current:
                queries.append(" ".join(current))
            current = []
        else:
            current.append(line.strip())
    if current:
        queries.append(" ".join(current))
    return queries


def test_documented_dcgm_join(settled):
    prometheus = settled["prometheus"]
    info = prometheus.query('gaugewatch_rank_info{run="switched"}')
    assert len(info) == 1, info
    identity = info[0]["metric"]
    assert identity["gpu_uuid"].startswith("GPU-") and identity["pci_bus_id"].startswith("00000000:")
    assert identity["hostname"] == "sim-node-a" and identity["local_rank"] == "0"
    (settled["dcgm_dir"] / "metrics").write_text(
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{identity["gpu_uuid"]}",device="nvidia0",'
        f'modelName="NVIDIA H200",Hostname="gpu-node-07",pci_bus_id="{identity["pci_bus_id"]}"}} 87\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-another",device="nvidia1",modelName="NVIDIA H200",'
        'Hostname="gpu-node-07",pci_bus_id="00000000:2A:00.0"} 12\n')
    wait_until(lambda: prometheus.query("DCGM_FI_DEV_GPU_UTIL"), 30, "the DCGM target's first scrape")
    dcgm_join, layer_join = [q.replace("llama-70b-0412", "switched") for q in documented_dcgm_queries()]
    joined = prometheus.query(dcgm_join)
    assert [(s["metric"]["run"], s["metric"]["rank"], s["metric"]["UUID"], s["value"][1]) for s in joined] == \
        [("switched", "0", identity["gpu_uuid"], "87")]
    labelled = prometheus.query(layer_join)
    assert len(labelled) == 4 and {s["metric"]["gpu_uuid"] for s in labelled} == {identity["gpu_uuid"]}
