#!/usr/bin/env bash
# Runs the agent load benchmark at ~10k and ~100k exported series: flat out
# without scrapes (ingest capacity), flat out with a scrape every second
# (scrape latency under full ingest), and paced at 100k samples/s; each run
# GAUGEWATCH_BENCH_REPEATS times (default 3), reporting the median. Writes
# bench/results/agent-<date>.{json,md} with the machine, the commit and the
# load average around every run.
#   bench/agent/run_agent_bench.sh [build-dir]   (default: build)
# GAUGEWATCH_BENCH_BASELINE=<agent binary> (with GAUGEWATCH_BENCH_BASELINE_COMMIT=<its commit>)
# also runs the 100k flat-out runs against that binary, interleaved with the
# current one, for a before/after on the same machine state.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
load="$build/bin/gaugewatch_agent_load"
agent="$build/bin/gaugewatch-agent"
[[ -x "$load" && -x "$agent" ]] || { echo "build gaugewatch_agent_load and gaugewatch-agent first (cmake --build $build --target gaugewatch_agent_load)" >&2; exit 2; }
seconds="${GAUGEWATCH_BENCH_SECONDS:-10}"
repeats="${GAUGEWATCH_BENCH_REPEATS:-3}"
date="$(date -u +%Y-%m-%d)"
out_json="$root/bench/results/agent-$date.json"
out_md="$root/bench/results/agent-$date.md"
mkdir -p "$root/bench/results"

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
cores="$(nproc)"
mem="$(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
kernel="$(uname -r)"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain --untracked-files=no -- agent bench/agent 2>/dev/null)" ]]; then
  commit="$commit+uncommitted"
fi

baseline="${GAUGEWATCH_BENCH_BASELINE:-}"
baseline_commit="${GAUGEWATCH_BENCH_BASELINE_COMMIT:-unknown}"
runs_file="$(mktemp)"
trap 'rm -f "$runs_file"' EXIT
# 16 x 28 layers x 22 series = 9856 series; 64 x 71 x 22 = 99968 series.
# label trainers layers rate scrape-interval
run_one() {  # binary label trainers layers rate scrape repeat
  local before after run
  echo "running $2 ($7 of $repeats) ..." >&2
  before="$(cut -d' ' -f1-3 /proc/loadavg)"
  run="$("$load" --agent "$1" --trainers "$3" --layers "$4" --seconds "$seconds" \
           --rate "$5" --scrape-interval "$6" --label "$2")"
  after="$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "${run%\}}, \"repeat\": $7, \"loadavg_before\": \"$before\", \"loadavg_after\": \"$after\"}" >>"$runs_file"
}
for spec in "10k-flat-out 16 28 0 0" "10k-flat-out-scraped 16 28 0 1" "10k-paced-100k 16 28 100000 0" \
            "100k-flat-out 64 71 0 0" "100k-flat-out-scraped 64 71 0 1" "100k-paced-100k 64 71 100000 0"; do
  read -r label trainers layers rate scrape <<<"$spec"
  for ((i = 1; i <= repeats; i++)); do
    run_one "$agent" "$label" "$trainers" "$layers" "$rate" "$scrape" "$i"
    if [[ -n "$baseline" && "$label" == 100k-flat-out* ]]; then
      run_one "$baseline" "$label-baseline" "$trainers" "$layers" "$rate" "$scrape" "$i"
    fi
  done
done

python3 - "$runs_file" "$out_json" "$out_md" "$date" "$commit" "$cpu" "$cores" "$mem" "$kernel" "$seconds" "$baseline_commit" <<'PY'
import json, math, statistics, sys
runs_file, out_json, out_md, date, commit, cpu, cores, mem, kernel, seconds, baseline_commit = sys.argv[1:]
runs = [json.loads(line.replace(": nan", ": null")) for line in open(runs_file) if line.strip()]
keys = ["samples_per_second", "samples_shed", "ingest_p50_ms", "ingest_p99_ms", "scrape_ms_median", "scrape_ms_max",
        "ingest_scrape_ms_median", "ingest_scrape_ms_max", "render_ms", "agent_rss_mib", "agent_peak_rss_mib",
        "layer_series", "exposition_lines", "exposition_bytes", "agent_cpu_us_per_sample", "client_cpu_us_per_sample", "scrape_bodies_short"]
def median(values):
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else None
summary = []
for label in dict.fromkeys(r["label"] for r in runs):
    group = [r for r in runs if r["label"] == label]
    row = {k: group[0][k] for k in ("label", "trainers", "layers", "offered_rate", "scrape_interval_s")}
    row["repeats"] = len(group)
    row["median"] = {k: median([r.get(k) for r in group]) for k in keys}
    row["range"] = {k: [min(v for v in (r.get(k) for r in group) if v is not None),
                        max(v for v in (r.get(k) for r in group) if v is not None)]
                    for k in ("samples_per_second", "ingest_scrape_ms_median", "scrape_ms_median")
                    if any(r.get(k) is not None for r in group)}
    row["loadavg"] = [r["loadavg_before"] for r in group]
    summary.append(row)
by = {row["label"]: row["median"] for row in summary}
targets = {
    "samples_per_second_100k_min": 400000,
    "ingest_scrape_ms_median_100k_max": 250,
    "samples_per_second_100k": by["100k-flat-out"]["samples_per_second"],
    "samples_per_second_100k_scraped": by["100k-flat-out-scraped"]["samples_per_second"],
    "ingest_scrape_ms_median_100k": by["100k-flat-out-scraped"]["ingest_scrape_ms_median"],
}
targets["ingest_met"] = targets["samples_per_second_100k"] >= 400000
targets["scrape_met"] = targets["ingest_scrape_ms_median_100k"] < 250
data = {"date": date, "commit": commit, "seconds_per_run": float(seconds),
        "baseline_commit": baseline_commit if any(r["label"].endswith("-baseline") for r in runs) else None,
        "machine": {"cpu": cpu, "cores": int(cores), "memory": mem, "kernel": kernel},
        "targets": targets, "summary": summary, "runs": runs}
json.dump(data, open(out_json, "w"), indent=1)

m = data["machine"]
f = lambda v, fmt="{:,.0f}": "-" if v is None else fmt.format(v)
lines = [
    f"# gaugewatch-agent load benchmark, {date} (commit {commit})",
    "",
    f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, Linux {kernel}. The trainers (real gRPC clients) "
    "run on the same cores as the agent, and the machine is shared with other builds: the load average "
    "(1/5/15 min) before each repeat is listed per run.",
    "",
    "Produced by `bench/agent/run_agent_bench.sh`: the real `gaugewatch-agent` binary, N simulated trainers "
    "(real gRPC over the unix socket, batches of 64 samples with all 20 metrics set), L layers each, "
    f"{seconds} s per run, each run repeated {summary[0]['repeats']} times; the table shows the median. "
    "Ingest latency = agent-side age of a sample when applied, from `gaugewatch_agent_sample_age_seconds`, "
    "interpolated inside its bucket; flat-out runs saturate the agent, so their latency is queueing. "
    "Flat-out runs have no per-trainer rate limit (`--trainer-sample-rate 0`); paced runs offer 100k samples/s "
    "under the default limit. Scrape under ingest = client GET /metrics once a second while the trainers "
    "stream flat out (`-scraped` runs); idle scrape = 5 GETs after the trainers stop; render = agent-side. "
    "Agent CPU = the agent process's user + system time over the ingest window per sample received (less "
    "sensitive to other load than samples/s); client CPU = the same for the benchmark process (trainers and "
    "scraper), which competes with the agent for the two cores.",
    "",
    "| run | trainers x layers | series | offered/s | samples/s (median, range) | ingest p50 / p99 ms | "
    "scrape under ingest median / max ms | idle scrape median / max ms | render ms | exposition | RSS (peak) MiB | "
    "agent / client CPU us per sample | bodies cut short |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for row in summary:
    md = row["median"]
    rng = row["range"].get("samples_per_second", [None, None])
    offered = "max" if row["offered_rate"] == 0 else f"{row['offered_rate']:,.0f}"
    lines.append(
        f"| {row['label']} | {row['trainers']} x {row['layers']} | {f(md['layer_series'])} | {offered} | "
        f"{f(md['samples_per_second'])} ({f(rng[0])}-{f(rng[1])}) | "
        f"{f(md['ingest_p50_ms'], '{:.2f}')} / {f(md['ingest_p99_ms'], '{:.2f}')} | "
        f"{f(md['ingest_scrape_ms_median'], '{:.1f}')} / {f(md['ingest_scrape_ms_max'], '{:.1f}')} | "
        f"{f(md['scrape_ms_median'], '{:.1f}')} / {f(md['scrape_ms_max'], '{:.1f}')} | {f(md['render_ms'], '{:.1f}')} | "
        f"{f(md['exposition_lines'])} lines, {f(md['exposition_bytes'] / 1e6 if md['exposition_bytes'] else None, '{:.1f}')} MB | "
        f"{f(md['agent_rss_mib'], '{:.1f}')} ({f(md['agent_peak_rss_mib'], '{:.1f}')}) | "
        f"{f(md['agent_cpu_us_per_sample'], '{:.2f}')} / {f(md['client_cpu_us_per_sample'], '{:.2f}')} | "
        f"{f(md['scrape_bodies_short'])} |")
if data["baseline_commit"]:
    lines += ["", f"`-baseline` rows: the agent built from commit {baseline_commit}, run by the same benchmark "
              "binary interleaved with the current one (same machine state). Its /metrics bodies were cut short "
              "(connection reset at close), so its scrape times cover only part of the body."]
lines += ["", "Load average before each repeat:", ""]
for row in summary:
    lines.append(f"- {row['label']}: " + "; ".join(row["loadavg"]))
t = targets
lines += ["", "Targets (issue 14, item 7), on this machine's 2 cores:", "",
          f"- >= 400,000 samples/s at 100k series: {f(t['samples_per_second_100k'])} samples/s flat out "
          f"({f(t['samples_per_second_100k_scraped'])} with a scrape every second): "
          + ("met" if t["ingest_met"] else "not met") + ".",
          f"- /metrics scrape < 250 ms (median) under full ingest at 100k series: "
          f"{f(t['ingest_scrape_ms_median_100k'], '{:.1f}')} ms: " + ("met" if t["scrape_met"] else "not met") + "."]
open(out_md, "w").write("\n".join(lines) + "\n")
PY
cat "$out_md"
