#!/usr/bin/env python3
"""Regenerates the reference blocks of docs/operations.md from the code's own
tables: the agent's flags (`gaugewatch-agent --help`), gaugewatchctl's
(`gaugewatchctl --help`), the agent's metric catalogue
(`gaugewatch-agent --print-catalogue`) and the alerts of
dashboards/prometheus/gaugewatch_rules.yml. Each block sits between
`<!-- generated: NAME -->` and `<!-- end generated: NAME -->`.

    python3 deploy/generate_operations_reference.py build          # rewrite
    python3 deploy/generate_operations_reference.py build --check  # exit 1 on drift
"""

import argparse
import pathlib
import re
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "operations.md"
RULES = ROOT / "dashboards" / "prometheus" / "gaugewatch_rules.yml"


def agent_output(build: pathlib.Path, flag: str, program: str = "gaugewatch-agent") -> str:
    binary = build / "bin" / program
    if not binary.exists():
        sys.exit(f"{binary} is missing: build the agent first")
    result = subprocess.run([str(binary), flag], capture_output=True, text=True, timeout=30)
    return (result.stdout or result.stderr).rstrip() + "\n"


def alerts_table() -> str:
    lines = ["| alert | severity | for | fires when | runbook |", "|---|---|---|---|---|"]
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            summary = rule["annotations"]["summary"].replace("|", "\\|")
            summary = re.sub(r"\{\{[^}]*\}\}", "…", summary)
            lines.append(f"| `{rule['alert']}` | {rule['labels']['severity']} | {rule.get('for', '0s')} | "
                         f"{summary} | [runbook](runbooks.md#{rule['alert'].lower()}) |")
    return "\n".join(lines) + "\n"


def blocks(build: pathlib.Path) -> dict[str, str]:
    return {
        "agent-flags": "```\n" + agent_output(build, "--help") + "```\n",
        "ctl-flags": "```\n" + agent_output(build, "--help", "gaugewatchctl") + "```\n",
        "metrics": agent_output(build, "--print-catalogue"),
        "alerts": alerts_table(),
    }


def render(text: str, generated: dict[str, str]) -> str:
    for name, body in generated.items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end generated: {name} -->)", re.S)
        if not pattern.search(text):
            sys.exit(f"docs/operations.md has no block '{name}'")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=pathlib.Path, help="build directory with bin/gaugewatch-agent")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/operations.md differs")
    args = parser.parse_args()
    current = DOC.read_text()
    updated = render(current, blocks(args.build.resolve()))
    if args.check:
        if updated != current:
            print("docs/operations.md is out of date with the code: run "
                  "python3 deploy/generate_operations_reference.py <build dir>", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
