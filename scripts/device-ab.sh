#!/usr/bin/env bash
# A/B of two versions of the kernels in one device call: version A is the
# working tree as it is, version B the same tree with a patch applied. Both
# are built (the ops library only; B incrementally on A's build) and timed by
# bench/kernels/bench_bf16_backward.py on the same machine in the same call,
# then scripts/compare_kernel_runs.py puts them side by side, kernel by kernel.
# Kernel times move by about 1% between H200 machines and end-to-end times by
# more, so a change of a few percent is only visible this way; the kernels the
# patch does not touch are the run's own control.
#
# Usage, through the device tool (docs/device.md, "Two versions in one call"):
#   git diff > ab.patch            # or git diff HEAD~1 HEAD, git diff X Y, ...
#   run(command="GW_AB_PATCH=ab.patch bash scripts/device-ab.sh", carry=[".device"])
# The patch must travel with the tree: leave it untracked (not ignored) or
# commit it.
#
# Environment: GW_AB_PATCH (required; applied with patch -p1, as git diff
# writes it), GW_AB_LABELS ("A,B": names in the tables), GW_AB_BENCH_ARGS
# (bench_bf16_backward.py's arguments; default below), GW_AB_BUDGET_S (540:
# both halves together, inside the tool's 600 s), OUT (.device/out elsewhere),
# GW_AB_ROUNDS (1: rounds of the benchmark per version; from the second on,
# A's and B's built ops libraries are timed in alternating processes, A then
# B, while GW_AB_BUDGET_S lasts, with the benchmark script as B's tree has it:
# cuDNN's time and the machine's state move between processes, and medians
# over rounds with the range of each round's B / A are the verdict where one
# pair of processes is not; compare.md then reads every complete round),
# GW_AB_VERIFY_S (0: off; seconds for testing B after its benchmark, with the
# patch still applied, on B's build: device.sh with GW_CTEST_R (default
# '^gpu\.'), GW_ONLY_PYTEST (default test_gpu_bf16_backward.py),
# GW_SANITIZE_VARIANTS and GW_SANITIZE as set, and the benchmarks named in
# GW_AB_VERIFY_BENCH (default none; e.g. backend_step_time.py with its
# GW_BENCH_ARGS_backend_step_time) on B's full build; it comes on top of
# GW_AB_BUDGET_S).
# Writes under $OUT: a.json and b.json (device.sh's bench.json of each half),
# with rounds rounds.tgz (a2.json, b2.json, ...: the benchmark's JSON of each
# later round, and its output), compare.md, ab-logs.tgz (both halves' logs),
# with GW_AB_VERIFY_S verify.tgz (that run's files; its table is printed).
# The tree is left as it was.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.device/out}"
PATCH_FILE="${GW_AB_PATCH:-}"
LABELS="${GW_AB_LABELS:-A,B}"
BUDGET="${GW_AB_BUDGET_S:-540}"
BENCH_ARGS="${GW_AB_BENCH_ARGS:---skip-mma-sync --skip-no-ws --skip-fp32 --reps 10}"
PY="${GAUGEWATCH_PYTHON:-python3}"
START=$(date +%s)

die() { echo "[device-ab] ERROR: $*" >&2; exit 2; }
[[ -n "$PATCH_FILE" ]] || die "set GW_AB_PATCH to the patch that turns version A (this tree) into B"
[[ -f "$PATCH_FILE" ]] || die "GW_AB_PATCH=$PATCH_FILE: no such file here (an ignored file does not travel: leave it untracked or carry it)"
PATCH_FILE="$(cd "$(dirname "$PATCH_FILE")" && pwd)/$(basename "$PATCH_FILE")"
patch -p1 --dry-run --force -s <"$PATCH_FILE" >/dev/null \
  || die "$PATCH_FILE does not apply to this tree with patch -p1: make it with git diff against this tree"
[[ "$BUDGET" =~ ^[0-9]+$ ]] || die "GW_AB_BUDGET_S=$BUDGET: give a whole number of seconds"
VERIFY_S="${GW_AB_VERIFY_S:-0}"
[[ "$VERIFY_S" =~ ^[0-9]+$ ]] || die "GW_AB_VERIFY_S=$VERIFY_S: give a whole number of seconds (0: no tests)"
ROUNDS="${GW_AB_ROUNDS:-1}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "GW_AB_ROUNDS=$ROUNDS: give a whole number of rounds, 1 or more"
if (( BUDGET < 240 )); then
  echo "[device-ab] warning: GW_AB_BUDGET_S=$BUDGET: the six shapes need about 240 s for both halves with" \
    "their builds; the benchmark may time out and measure nothing (fewer shapes: GW_AB_BENCH_ARGS --shapes)" >&2
fi
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/gw-device-ab.XXXXXX)"

half() {  # half <a|b> <budget_s>: device.sh, ops library and the benchmark only
  OUT="$WORK/$1" GW_DEVICE_BUDGET_S="$2" GW_BUILD_TARGETS=gaugewatch_ops GW_SKIP_CTEST=1 GW_ONLY_PYTEST=none \
    GW_SANITIZE=0 GW_ONLY_BENCH=bench_bf16_backward.py GW_BENCH_ARGS_bench_bf16_backward="$BENCH_ARGS" \
    GW_REUSE_BUILD="$3" bash scripts/device.sh >"$WORK/$1.txt" 2>&1
  tail -4 "$WORK/$1.txt"
  cp "$WORK/$1/bench.json" "$OUT/$1.json" 2>/dev/null || echo "[device-ab] half $1 wrote no bench.json (see ab-logs.tgz)"
  # This half's ops library, for the later rounds (the next half rebuilds it in place).
  cp "${BUILD_DIR:-build-device}/lib/libgaugewatch_ops.so" "$WORK/$1_ops.so" 2>/dev/null
}

# Round r of version v (a or b): the benchmark on that version's ops library,
# in its own process, within what is left of the budget (less a reserve of
# 10 s); false where no time is left or it wrote nothing.
bench_round() {
  local left=$(( BUDGET - ($(date +%s) - START) - 10 ))
  (( left > 20 )) || return 1
  # shellcheck disable=SC2086
  GAUGEWATCH_OPS_LIB="$WORK/$2_ops.so" timeout "$left" "$PY" bench/kernels/bench_bf16_backward.py $BENCH_ARGS \
    --json "$WORK/rounds/$2$1.json" >"$WORK/rounds/$2$1.txt" 2>&1
  [[ -s "$WORK/rounds/$2$1.json" ]]
}

# A builds from scratch (about 70 s of a 16-core machine) and B only what the
# patch touches: A gets 55% of the budget, B what is left but 20 s.
echo "[device-ab] A: the tree as it is"
half a $(( BUDGET * 55 / 100 )) "${GW_REUSE_BUILD:-}"
echo "[device-ab] B: with $(basename "$PATCH_FILE")"
patch -p1 --force -s <"$PATCH_FILE" || die "the patch did not apply after the dry run passed"
half b $(( BUDGET - ($(date +%s) - START) - 20 )) 1
A_RUNS="$OUT/a.json" B_RUNS="$OUT/b.json"
if (( ROUNDS > 1 )) && [[ -f "$WORK/a_ops.so" && -f "$WORK/b_ops.so" ]]; then
  mkdir -p "$WORK/rounds"
  for (( r = 2; r <= ROUNDS; r++ )); do
    bench_round "$r" a && bench_round "$r" b || { echo "[device-ab] round $r incomplete (budget or a failed run): $((r - 1)) round(s)"; break; }
    A_RUNS+=",$WORK/rounds/a$r.json" B_RUNS+=",$WORK/rounds/b$r.json"
    echo "[device-ab] round $r done ($(( $(date +%s) - START )) s)"
  done
  tar czf "$OUT/rounds.tgz" -C "$WORK" rounds 2>/dev/null
fi
if (( VERIFY_S > 0 )); then
  # B's build is there (the halves build only the ops library: the rest now).
  echo "[device-ab] verify: the GPU tests on B (${VERIFY_S} s)"
  OUT="$WORK/verify" GW_DEVICE_BUDGET_S="$VERIFY_S" GW_REUSE_BUILD=1 GW_CTEST_R="${GW_CTEST_R:-^gpu\.}" \
    GW_ONLY_PYTEST="${GW_ONLY_PYTEST:-test_gpu_bf16_backward.py}" GW_ONLY_BENCH="${GW_AB_VERIFY_BENCH:-none}" \
    bash scripts/device.sh >"$WORK/verify.txt" 2>&1
  tail -12 "$WORK/verify.txt"
  cp "$WORK/verify.txt" "$WORK/verify/" 2>/dev/null
  tar czf "$OUT/verify.tgz" -C "$WORK" verify 2>/dev/null || echo "[device-ab] verify wrote nothing to pack"
fi
patch -p1 -R --force -s <"$PATCH_FILE" || echo "[device-ab] warning: could not take the patch back out of the tree"

tar czf "$OUT/ab-logs.tgz" -C "$WORK" a b a.txt b.txt 2>/dev/null
if [[ -f "$OUT/a.json" && -f "$OUT/b.json" ]]; then
  "$PY" scripts/compare_kernel_runs.py "$A_RUNS" "$B_RUNS" --labels "$LABELS" --markdown "$OUT/compare.md"
else
  die "a half has no benchmark results; compare.md not written"
fi
