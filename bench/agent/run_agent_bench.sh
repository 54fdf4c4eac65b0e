#!/usr/bin/env bash
# Runs the agent load benchmark at ~10k and ~100k exported series, flat out
# and paced at 100k samples/s, and writes bench/results/agent-<date>.{json,md}
# with the machine described.
#   bench/agent/run_agent_bench.sh [build-dir]   (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
load="$build/bin/gaugewatch_agent_load"
agent="$build/bin/gaugewatch-agent"
[[ -x "$load" && -x "$agent" ]] || { echo "build gaugewatch_agent_load and gaugewatch-agent first (cmake --build $build --target gaugewatch_agent_load)" >&2; exit 2; }
seconds="${GAUGEWATCH_BENCH_SECONDS:-10}"
date="$(date -u +%Y-%m-%d)"
out_json="$root/bench/results/agent-$date.json"
out_md="$root/bench/results/agent-$date.md"
mkdir -p "$root/bench/results"

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
cores="$(nproc)"
mem="$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
kernel="$(uname -r)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"

runs=()
# 16 x 28 layers x 22 series = 9856 series; 64 x 71 x 22 = 99968 series.
for spec in "10k-flat-out 16 28 0" "10k-paced-100k 16 28 100000" \
            "100k-flat-out 64 71 0" "100k-paced-100k 64 71 100000"; do
  read -r label trainers layers rate <<<"$spec"
  echo "running $label ..." >&2
  runs+=("$("$load" --agent "$agent" --trainers "$trainers" --layers "$layers" --seconds "$seconds" --rate "$rate" --label "$label")")
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

{
  echo "{"
  echo "  \"date\": \"$date\", \"commit\": \"$commit\","
  echo "  \"machine\": {\"cpu\": \"$cpu\", \"cores\": $cores, \"memory\": \"$mem\", \"kernel\": \"$kernel\","
  echo "              \"loadavg_before\": \"$load_before\", \"loadavg_after\": \"$load_after\"},"
  echo "  \"runs\": ["
  for i in "${!runs[@]}"; do
    sep=","; [[ $i -eq $((${#runs[@]} - 1)) ]] && sep=""
    echo "    ${runs[$i]}$sep"
  done
  echo "  ]"
  echo "}"
} >"$out_json"

python3 - "$out_json" "$out_md" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
m = data["machine"]
lines = [
    f"# gaugewatch-agent load benchmark, {data['date']} (commit {data['commit']})",
    "",
    f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {m['kernel']}. "
    f"Load average before/after: {m['loadavg_before']} / {m['loadavg_after']} "
    "(the machine is shared with other builds; the trainers run on the same cores as the agent).",
    "",
    "Produced by `bench/agent/run_agent_bench.sh`: the real `gaugewatch-agent` binary, N simulated "
    "trainers (real gRPC over the unix socket, batches of 64 samples with all 20 metrics set), "
    "L layers each. Ingest latency = agent-side age of a sample when applied (trainer stamps it just "
    "before the write), from the agent's `gaugewatch_agent_sample_age_seconds` histogram, linearly "
    "interpolated inside its bucket (bounds 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250 ms ...). "
    "Flat-out runs saturate the agent, so their latency is queueing, and run without the per-trainer "
    "rate limit (`--trainer-sample-rate 0`); paced runs offer 100k samples/s under the embedded default "
    "limit (shed = samples it dropped). "
    "Scrape = client GET /metrics with trainers idle (median / max of 5); render = agent-side.",
    "",
    "| run | trainers x layers | series | offered/s | sustained samples/s | shed | ingest p50 / p99 ms | scrape median / max ms | render ms | exposition | agent RSS (peak) MiB |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
for r in data["runs"]:
    offered = "max" if r["offered_rate"] == 0 else f"{r['offered_rate']:,.0f}"
    lines.append(
        f"| {r['label']} | {r['trainers']} x {r['layers']} | {r['layer_series']:,.0f} | {offered} | "
        f"{r['samples_per_second']:,.0f} | {r.get('samples_shed', 0):,.0f} | {r['ingest_p50_ms']:.2f} / {r['ingest_p99_ms']:.2f} | "
        f"{r['scrape_ms_median']:.1f} / {r['scrape_ms_max']:.1f} | {r['render_ms']:.1f} | "
        f"{r['exposition_lines']:,.0f} lines, {r['exposition_bytes']/1e6:.1f} MB | "
        f"{r['agent_rss_mib']:.1f} ({r['agent_peak_rss_mib']:.1f}) |")
lines += ["", "Targets (issue 4): >= 100k samples/s sustained; 100k-series scrape < 250 ms."]
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
PY
cat "$out_md"
