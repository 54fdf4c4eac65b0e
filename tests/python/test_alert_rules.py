"""Alert and recording rules: every alert has a runbook section, a severity and
a summary; `promtool test rules` tests each alert both firing and not; the
rules name only catalogue metrics; the alerts the operators asked for exist."""

import re
import shutil
import subprocess

import pytest
import yaml

from operations_support import (PROMETHEUS_METRICS, RULES, RUNBOOKS, alerts, catalogue, metric_tokens,
                                recorded_names, rules, sample_names)

# The alerts operators rely on (issue: discrepancy high, switched layer still
# high, key-offset ratio rising, unmonitored attention, trainer silent mid-run,
# agent down, samples dropped / shed, cardinality guard hit).
REQUIRED = {
    "GaugewatchDqDiscrepancyHigh", "GaugewatchSwitchedLayerStillHigh",
    "GaugewatchKeyOffsetRatioRising", "GaugewatchUnmonitoredAttention", "GaugewatchTrainerSilent",
    "GaugewatchAgentDown", "GaugewatchSamplesDropped", "GaugewatchTrainerRateLimited",
    "GaugewatchCardinalityLimit",
}


def test_required_alerts_exist():
    names = {a["alert"] for a in alerts()}
    assert REQUIRED <= names, f"missing: {REQUIRED - names}"
    assert "GaugewatchRankExpired" not in names, "fires for ranks that finished cleanly"


def test_every_alert_has_severity_summary_and_runbook_section():
    headings = set(re.findall(r"^## (\S+)\s*$", RUNBOOKS.read_text(), re.M))
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in ("info", "warning", "critical"), name
        assert alert["annotations"]["summary"], name
        assert alert["annotations"]["runbook_url"] == f"docs/runbooks.md#{name.lower()}", name
        assert name in headings, f"docs/runbooks.md has no section '## {name}'"
    assert headings == {a["alert"] for a in alerts()}, "runbook sections without an alert"


def test_runbook_sections_say_meaning_confirmation_and_action():
    sections = re.split(r"^## ", RUNBOOKS.read_text(), flags=re.M)[1:]
    for section in sections:
        name = section.split()[0]
        for part in ("**Means.**", "**Confirm.**", "**Do.**"):
            assert part in section, f"runbook {name} lacks {part}"


def test_promtool_tests_every_alert_firing_and_quiet():
    tests = yaml.safe_load((RULES.parent / "gaugewatch_rules_test.yml").read_text())
    firing, quiet = set(), set()
    for case in tests["tests"]:
        for t in case.get("alert_rule_test", []):
            (firing if t["exp_alerts"] else quiet).add(t["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names <= firing, f"never tested firing: {names - firing}"
    assert names <= quiet, f"never tested quiet: {names - quiet}"


def test_promtool_check_and_test_rules():
    if not shutil.which("promtool"):
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for args in (["check", "rules", RULES.name], ["test", "rules", "gaugewatch_rules_test.yml"]):
        result = subprocess.run(["promtool", *args], cwd=RULES.parent, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_rules_use_only_catalogue_names():
    allowed = sample_names(catalogue()) | recorded_names() | PROMETHEUS_METRICS
    for group in rules()["groups"]:
        for rule in group["rules"]:
            for name in metric_tokens(rule["expr"]):
                assert name in allowed, f"{rule.get('alert') or rule.get('record')} uses {name}"
