#!/usr/bin/env bash
# A/B of versions of the kernels in one device call: version A is the working
# tree as it is, each candidate (B, or B1, B2, ... for several patches) the
# same tree with one patch applied (the patches one at a time, not on top of
# each other). All are built (the ops library only; each candidate
# incrementally on the build before it) and timed by
# bench/kernels/bench_bf16_backward.py on the same machine in the same call,
# then scripts/compare_kernel_runs.py puts each candidate beside A, kernel by
# kernel. Kernel times move by about 1% between H200 machines and end-to-end
# times by more, so a change of a few percent is only visible this way; the
# kernels a patch does not touch are the run's own control. Several
# candidates in one call share one machine start and A's build (device time
# is scarce; a variant that differs in where, not whether, a change applies
# is one more patch).
#
# Usage, through the device tool (docs/device.md, "Two versions in one call"):
#   git diff > ab.patch            # or git diff HEAD~1 HEAD, git diff X Y, ...
#   run(command="GW_AB_PATCH=ab.patch bash scripts/device-ab.sh", carry=[".device"])
#   run(command="GW_AB_PATCH=x.patch,y.patch GW_AB_LABELS=main,x,y bash scripts/device-ab.sh", ...)
# The patches must travel with the tree: leave them untracked (not ignored),
# commit them, or carry them.
#
# Environment: GW_AB_PATCH (required; one patch or several, comma-separated,
# each applied with patch -p1, as git diff writes it, to the tree as it is),
# GW_AB_LABELS ("A,B", or "A,B1,B2,..." for several patches: names in the
# tables, one per version), GW_AB_BENCH_ARGS (bench_bf16_backward.py's
# arguments; default below), GW_AB_BUDGET_S (540: every version's build and
# benchmark together, inside the tool's 600 s), OUT (.device/out elsewhere),
# GW_AB_ROUNDS (1: rounds of the benchmark per version; from the second on,
# the versions' built ops libraries are timed in alternating processes, A
# then each candidate, while GW_AB_BUDGET_S lasts, with the benchmark script
# as the last candidate's tree has it: cuDNN's time and the machine's state
# move between processes, and medians over rounds with the range of each
# round's B / A are the verdict where one pair of processes is not; the
# comparisons then read every complete round), GW_AB_VERIFY_S (0: off;
# one patch only; seconds for testing B after its benchmark, with the
# patch still applied, on B's build: device.sh with GW_CTEST_R (default
# '^gpu\.'), GW_ONLY_PYTEST (default test_gpu_bf16_backward.py),
# GW_SANITIZE_VARIANTS and GW_SANITIZE as set, and the benchmarks named in
# GW_AB_VERIFY_BENCH (default none; e.g. backend_step_time.py with its
# GW_BENCH_ARGS_backend_step_time) on B's full build; it comes on top of
# GW_AB_BUDGET_S).
# Writes under $OUT: a.json and b.json (b1.json, b2.json, ... for several
# patches: device.sh's bench.json of each version's first run), with rounds
# rounds.tgz (a-2.json, b-2.json, ...: the benchmark's JSON of each later
# round, and its output), compare.md (for several patches each candidate's
# comparison with A in turn), ab-logs.tgz
# (every version's logs), with GW_AB_VERIFY_S verify.tgz (that run's files;
# its table is printed). The tree is left as it was.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.device/out}"
PATCH_LIST="${GW_AB_PATCH:-}"
BUDGET="${GW_AB_BUDGET_S:-540}"
BENCH_ARGS="${GW_AB_BENCH_ARGS:---skip-mma-sync --skip-no-ws --skip-fp32 --reps 10}"
PY="${GAUGEWATCH_PYTHON:-python3}"
START=$(date +%s)

die() { echo "[device-ab] ERROR: $*" >&2; exit 2; }
[[ -n "$PATCH_LIST" ]] || die "set GW_AB_PATCH to the patch that turns version A (this tree) into B (several: comma-separated)"
IFS=',' read -r -a PATCHES <<<"$PATCH_LIST"
N=${#PATCHES[@]}
# The device tool brings back at most 8 files: A's and each candidate's JSON,
# compare.md, rounds.tgz and ab-logs.tgz are 8 with four candidates.
(( N <= 4 )) || die "GW_AB_PATCH names $N patches: at most 4 per call (the device tool brings back 8 files), split them over calls"
# The versions' names in files: a, then b (one patch) or b1, b2, ...
VERSIONS=(a)
if (( N == 1 )); then VERSIONS+=(b); else for (( i = 1; i <= N; i++ )); do VERSIONS+=("b$i"); done; fi
for i in "${!PATCHES[@]}"; do
  p="${PATCHES[$i]}"
  [[ -f "$p" ]] || die "GW_AB_PATCH: $p: no such file here (an ignored file does not travel: leave it untracked or carry it)"
  PATCHES[$i]="$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"
  patch -p1 --dry-run --force -s <"${PATCHES[$i]}" >/dev/null \
    || die "$p does not apply to this tree with patch -p1: make it with git diff against this tree"
done
DEFAULT_LABELS="A,B"
(( N > 1 )) && DEFAULT_LABELS="A$(for (( i = 1; i <= N; i++ )); do printf ',B%d' "$i"; done)"
IFS=',' read -r -a LABELS <<<"${GW_AB_LABELS:-$DEFAULT_LABELS}"
(( ${#LABELS[@]} == N + 1 )) \
  || die "GW_AB_LABELS=${GW_AB_LABELS:-}: give $((N + 1)) names, A's and one per patch, comma-separated"
[[ "$BUDGET" =~ ^[0-9]+$ ]] || die "GW_AB_BUDGET_S=$BUDGET: give a whole number of seconds"
VERIFY_S="${GW_AB_VERIFY_S:-0}"
[[ "$VERIFY_S" =~ ^[0-9]+$ ]] || die "GW_AB_VERIFY_S=$VERIFY_S: give a whole number of seconds (0: no tests)"
(( VERIFY_S == 0 || N == 1 )) \
  || die "GW_AB_VERIFY_S=$VERIFY_S tests one version: give one patch, or test the one you keep in a call of its own"
ROUNDS="${GW_AB_ROUNDS:-1}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "GW_AB_ROUNDS=$ROUNDS: give a whole number of rounds, 1 or more"
if (( BUDGET < 120 * (N + 1) )); then
  echo "[device-ab] warning: GW_AB_BUDGET_S=$BUDGET: the six shapes need about 120 s per version with" \
    "its build; the benchmark may time out and measure nothing (fewer shapes: GW_AB_BENCH_ARGS --shapes)" >&2
fi
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/gw-device-ab.XXXXXX)"

# first_run <version> <budget_s> <reuse>: device.sh, the ops library and the
# benchmark only.
first_run() {
  OUT="$WORK/$1" GW_DEVICE_BUDGET_S="$2" GW_BUILD_TARGETS=gaugewatch_ops GW_SKIP_CTEST=1 GW_ONLY_PYTEST=none \
    GW_SANITIZE=0 GW_ONLY_BENCH=bench_bf16_backward.py GW_BENCH_ARGS_bench_bf16_backward="$BENCH_ARGS" \
    GW_REUSE_BUILD="$3" bash scripts/device.sh >"$WORK/$1.txt" 2>&1
  tail -4 "$WORK/$1.txt"
  cp "$WORK/$1/bench.json" "$OUT/$1.json" 2>/dev/null || echo "[device-ab] version $1 wrote no bench.json (see ab-logs.tgz)"
  # This version's ops library, for the later rounds (the next version rebuilds it in place).
  cp "${BUILD_DIR:-build-device}/lib/libgaugewatch_ops.so" "$WORK/$1_ops.so" 2>/dev/null
}

# Round r of version v: the benchmark on that version's ops library, in its
# own process, within what is left of the budget (less a reserve of 10 s);
# false where no time is left or it wrote nothing.
bench_round() {
  local left=$(( BUDGET - ($(date +%s) - START) - 10 ))
  (( left > 20 )) || return 1
  # shellcheck disable=SC2086
  GAUGEWATCH_OPS_LIB="$WORK/$2_ops.so" timeout "$left" "$PY" bench/kernels/bench_bf16_backward.py $BENCH_ARGS \
    --json "$WORK/rounds/$2-$1.json" >"$WORK/rounds/$2-$1.txt" 2>&1
  [[ -s "$WORK/rounds/$2-$1.json" ]]
}

# A builds from scratch (about 70 s of a 16-core machine) and each candidate
# only what its patch and the previous one's removal touch: A gets 55% of
# the budget with one patch (40% with several), each candidate an equal
# share of what is left, less 20 s for each one after it.
echo "[device-ab] A: the tree as it is"
first_run a $(( BUDGET * (N == 1 ? 55 : 40) / 100 )) "${GW_REUSE_BUILD:-}"
for (( i = 0; i < N; i++ )); do
  v="${VERSIONS[$((i + 1))]}" p="${PATCHES[$i]}"
  echo "[device-ab] ${v^^} (${LABELS[$((i + 1))]}): with $(basename "$p")"
  patch -p1 --force -s <"$p" || die "$(basename "$p") did not apply after the dry run passed"
  left=$(( BUDGET - ($(date +%s) - START) - 20 * (N - i) ))
  first_run "$v" $(( left / (N - i) )) 1
  # The last patch stays in through the rounds (its tree's benchmark script
  # runs them) and while B is tested (GW_AB_VERIFY_S).
  if (( i + 1 < N )); then
    patch -p1 -R --force -s <"$p" || die "could not take $(basename "$p") back out of the tree"
  fi
done
declare -A RUNS
for v in "${VERSIONS[@]}"; do RUNS[$v]="$OUT/$v.json"; done
have_libs=1
for v in "${VERSIONS[@]}"; do [[ -f "$WORK/${v}_ops.so" ]] || have_libs=0; done
if (( ROUNDS > 1 && have_libs )); then
  mkdir -p "$WORK/rounds"
  for (( r = 2; r <= ROUNDS; r++ )); do
    done_all=1
    for v in "${VERSIONS[@]}"; do bench_round "$r" "$v" || { done_all=0; break; }; done
    if (( !done_all )); then
      echo "[device-ab] round $r incomplete (budget or a failed run): $((r - 1)) round(s)"
      break
    fi
    for v in "${VERSIONS[@]}"; do RUNS[$v]+=",$WORK/rounds/$v-$r.json"; done
    echo "[device-ab] round $r done ($(( $(date +%s) - START )) s)"
  done
  tar czf "$OUT/rounds.tgz" -C "$WORK" rounds 2>/dev/null
fi
if (( VERIFY_S > 0 )); then
  # B's build is there (the first runs build only the ops library: the rest now).
  echo "[device-ab] verify: the GPU tests on B (${VERIFY_S} s)"
  OUT="$WORK/verify" GW_DEVICE_BUDGET_S="$VERIFY_S" GW_REUSE_BUILD=1 GW_CTEST_R="${GW_CTEST_R:-^gpu\.}" \
    GW_ONLY_PYTEST="${GW_ONLY_PYTEST:-test_gpu_bf16_backward.py}" GW_ONLY_BENCH="${GW_AB_VERIFY_BENCH:-none}" \
    bash scripts/device.sh >"$WORK/verify.txt" 2>&1
  tail -12 "$WORK/verify.txt"
  cp "$WORK/verify.txt" "$WORK/verify/" 2>/dev/null
  tar czf "$OUT/verify.tgz" -C "$WORK" verify 2>/dev/null || echo "[device-ab] verify wrote nothing to pack"
fi
patch -p1 -R --force -s <"${PATCHES[$((N - 1))]}" || echo "[device-ab] warning: could not take the last patch back out of the tree"

(cd "$WORK" && tar czf "$OUT/ab-logs.tgz" "${VERSIONS[@]}" "${VERSIONS[@]/%/.txt}" 2>/dev/null)
[[ -f "$OUT/a.json" ]] || die "A has no benchmark results; no comparison written"
# One patch: compare.md; several: compare.md with each comparison in turn
# (one file: the 8-file limit above).
(( N > 1 )) && : >"$OUT/compare.md"
compared=0
for (( i = 1; i <= N; i++ )); do
  v="${VERSIONS[$i]}" label="${LABELS[$i]}" md="$OUT/compare.md"
  (( N > 1 )) && md="$WORK/compare-$v.md"
  if [[ ! -f "$OUT/$v.json" ]]; then
    echo "[device-ab] $label ($v) has no benchmark results: not compared"
    continue
  fi
  "$PY" scripts/compare_kernel_runs.py "${RUNS[a]}" "${RUNS[$v]}" --labels "${LABELS[0]},$label" --markdown "$md" \
    || continue
  compared=$((compared + 1))
  (( N > 1 )) && { printf '\n## %s against %s\n\n' "$label" "${LABELS[0]}"; cat "$md"; } >>"$OUT/compare.md"
done
(( compared == N )) || die "$((N - compared)) of $N candidate(s) have no comparison (above)"
