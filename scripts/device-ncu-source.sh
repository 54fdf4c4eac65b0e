#!/usr/bin/env bash
# Where a fused backward kernel spends its time, instruction by instruction:
# builds the ops library (scripts/device.sh, nothing else), then profiles one
# launch of the key-outer kernel per case with Nsight Compute's source
# counters (warp-state samples and executed instructions per SASS
# instruction) and writes each report's SASS page as CSV.
#
# Usage, through the device tool:
#   run(command="GW_NCU_CASES='bf16:64 pivot:64' bash scripts/device-ncu-source.sh", carry=[".device"])
# GW_NCU_CASES: space-separated backend:head_dim (default "bf16:64");
# GW_NCU_KERNEL: the kernel-name regex (default keyouter_ws, the first pass);
# GW_NCU_ARGS: more arguments for bench/kernels/_profile_one.py, the shape
# (default its B4 H16 N4096 causal; e.g. "--B 2 --N 8192 --noncausal");
# OUT (.device/out). Writes under $OUT, per case: <backend>_d<d>.csv (the
# SASS page: one row per instruction with its samples by stall reason),
# <backend>_d<d>_summary.txt (SpeedOfLight, WarpStateStats,
# SchedulerStats) (at most 8 files come back from a device call: four
# cases). The build's own logs stay on the machine unless it fails.
# scripts/ncu_source_summary.py sorts a CSV into where the samples fall.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.device/out}"
CASES="${GW_NCU_CASES:-bf16:64}"
KERNEL="${GW_NCU_KERNEL:-keyouter_ws}"
PY="${GAUGEWATCH_PYTHON:-python3}"
mkdir -p "$OUT"

WORK="$(mktemp -d /tmp/gw-ncu.XXXXXX)"
OUT="$WORK/build" GW_DEVICE_BUDGET_S=300 GW_BUILD_TARGETS=gaugewatch_ops GW_SKIP_CTEST=1 GW_ONLY_PYTEST=none \
  GW_SANITIZE=0 GW_ONLY_BENCH=none bash scripts/device.sh >"$WORK/build.txt" 2>&1
export GAUGEWATCH_BUILD_DIR="$ROOT/build-device"
if [[ ! -f "$GAUGEWATCH_BUILD_DIR/lib/libgaugewatch_ops.so" ]]; then
  echo "[ncu-source] no ops library was built (its log: build.log)"
  cp "$WORK/build/build.log" "$OUT/" 2>/dev/null
  exit 2
fi
NCU="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)"
[[ -n "$NCU" ]] || { echo "[ncu-source] no ncu on this machine"; exit 2; }

for case in $CASES; do
  backend="${case%%:*}"; d="${case##*:}"; name="${backend}_d${d}"
  echo "[ncu-source] $name"
  # shellcheck disable=SC2086  # GW_NCU_ARGS: several arguments
  "$NCU" --kernel-name "regex:$KERNEL" -c 1 --section SourceCounters --section WarpStateStats \
    --section SchedulerStats --section SpeedOfLight --import-source no -f -o "$WORK/$name" \
    "$PY" bench/kernels/_profile_one.py --backend "$backend" --d "$d" ${GW_NCU_ARGS:-} >"$WORK/$name.log" 2>&1 \
    || { tail -5 "$WORK/$name.log"; continue; }
  "$NCU" -i "$WORK/$name.ncu-rep" --page details >"$OUT/${name}_summary.txt" 2>&1
  "$NCU" -i "$WORK/$name.ncu-rep" --page source --print-source sass --csv >"$OUT/$name.csv" 2>"$WORK/$name.err" \
    || { echo "[ncu-source] the SASS page did not export:"; cat "$WORK/$name.err"; }
  wc -l "$OUT/$name.csv"
done
