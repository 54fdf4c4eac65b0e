#!/usr/bin/env bash
# Build and test gaugewatch on the GPU machine (H200, Ubuntu 24.04, torch
# 2.11.0+cu130 in the image's python3, nvcc 13.0, CMake 4.4, no network, no
# gRPC or -dev libraries). Runs there as root, from the repo root:
#
#   bash scripts/device.sh          (device tool: carry [".device"], see docs/device.md)
#
# Steps (each one logged and timed; a failed step does not stop the rest):
#   env        GPU, driver, torch, nvcc, cmake, compiler versions
#   deps       dpkg -x every .deb from .device/debs into /opt/gw-deps
#   configure  CMake (Ninja, Release) against the image's torch; if the agent
#              side (gRPC from the debs) fails to configure, again with
#              GAUGEWATCH_ENABLE_AGENT=OFF, noted in results.json
#   build      everything (ninja -k 0: as much as compiles)
#   ctest      all registered tests, GPU tests included
#   pytest     python3 -m pytest, one process per tests/python file (GPU tests included),
#              GW_PYTEST_JOBS of them at a time (default 1)
#   sanitizer  compute-sanitizer memcheck/racecheck/synccheck on tests/cuda/sanitize_kernels.py,
#              then again with GAUGEWATCH_GPROJ_KERNEL=key_outer (the key-outer gproj at both head dims),
#              with that and GAUGEWATCH_BF16_KERNEL=key_outer (the key-outer kernel without
#              warp specialization, every backend), and with GAUGEWATCH_GPROJ_KERNEL=key_outer and
#              GAUGEWATCH_GPROJ_PASS2_KEYS=128 (gproj's second pass over 128-key blocks; 256 the default);
#              and with GAUGEWATCH_D256_KERNEL=key_outer (bf16, pivot and gproj at head dim 256 on their key-outer kernels);
#              GW_SANITIZE_VARIANTS picks among default gproj_key_outer key_outer gproj_pass2_128 d256_key_outer
#   bench      every build/bin bench_* / *_bench binary and bench/**/*.py script
# Output (flat, under $OUT): device.log env.log build.log ctest.log pytest.log
# sanitizer.log bench.log bench.json results.json. A short table is printed last.
#
# Environment: OUT (default .device/out), GW_DEPS_PREFIX (/opt/gw-deps),
# GW_DEBS_DIR (.device/debs), BUILD_DIR (build-device), GAUGEWATCH_PYTHON
# (python3), GW_DEVICE_BUDGET_S (540: total seconds; each step is cut short so
# that results.json is always written inside the device tool's 600 s limit),
# CTEST_JOBS (8), GW_PYTEST_JOBS (1: test files at a time), CMAKE_EXTRA_ARGS,
# PYTEST_ARGS; focused runs: GW_ONLY_PYTEST,
# GW_ONLY_BENCH (basenames), GW_PYTEST_K (a pytest -k expression for every
# file), GW_SKIP_CTEST=1, GW_CTEST_R (a ctest -R regex), GW_BUILD_TARGETS
# (space-separated CMake targets instead of all), GW_REUSE_BUILD=1 (keep the
# build directory a previous call left), GW_SANITIZE=0, GW_SANITIZE_VARIANTS
# (a subset of "default gproj_key_outer key_outer"), GW_BENCH_ARGS (arguments for
# every bench/*.py script run), GW_BENCH_ARGS_<script> (for one script, its
# basename without .py: GW_BENCH_ARGS_bench_bf16_backward) (docs/device.md).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/.device/out}"
PREFIX="${GW_DEPS_PREFIX:-/opt/gw-deps}"
DEBS="${GW_DEBS_DIR:-$ROOT/.device/debs}"
BUILD_DIR="${BUILD_DIR:-build-device}"
PY="${GAUGEWATCH_PYTHON:-python3}"
# An absolute path without resolving symlinks (a venv's python is a symlink).
if [[ "$PY" == */* ]]; then PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"; else PY="$(command -v "$PY" || echo "$PY")"; fi
BUDGET="${GW_DEVICE_BUDGET_S:-540}"
CTEST_JOBS="${CTEST_JOBS:-8}"
JOBS="$(nproc)"
ARCH_LIB="usr/lib/x86_64-linux-gnu"
TMP="$(mktemp -d /tmp/gw-device.XXXXXX)"
STEPS="$TMP/steps.tsv"        # name \t status \t rc \t seconds \t note
: >"$STEPS"
mkdir -p "$OUT"
START=$(date +%s)

LOG="$OUT/device.log"
: >"$LOG"
say() { printf '[device] %s\n' "$*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( BUDGET - $(elapsed) )); }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5//$'\t'/ }" >>"$STEPS"; write_results; }

# run_step <name> <logfile> <reserve_s> <cmd...>: runs cmd with a timeout that
# leaves reserve_s seconds for the later steps; appends output to logfile.
# Sets STEP_RC. Never exits the script.
run_step() {
  local name="$1" logfile="$2" reserve="$3"; shift 3
  local limit=$(( $(remaining) - reserve ))
  if (( limit < 10 )); then
    say "$name: skipped, no time left in the ${BUDGET}s budget"
    STEP_RC=124
    STEP_S=0
    return
  fi
  say "$name: $* (limit ${limit}s, log $(basename "$logfile"))"
  local t0=$(date +%s)
  { echo "===== $name: $*"; } >>"$logfile"
  timeout --kill-after=10 "$limit" "$@" >>"$logfile" 2>&1
  STEP_RC=$?
  STEP_S=$(( $(date +%s) - t0 ))
  say "$name: exit $STEP_RC after ${STEP_S}s"
}

# reserve_for <want_s> <floor_s>: the reserve a step leaves for the later
# steps, want_s where the budget allows, less where that would leave the step
# itself under floor_s (a small GW_DEVICE_BUDGET_S shortens the later steps
# rather than skipping configure and build).
reserve_for() {
  local want="$1" floor="$2" room
  room=$(( $(remaining) - floor ))
  (( room < 0 )) && room=0
  echo $(( room < want ? room : want ))
}

status_of() { case "$1" in 0) echo ok ;; 124|137) echo timeout ;; *) echo failed ;; esac; }

# --- results.json (rewritten after every step so a cut-short run still has it) ----------
AGENT_ENABLED=""; AGENT_FALLBACK=""; AGENT_FALLBACK_REASON=""
write_results() {
  GW_STEPS="$STEPS" GW_OUT="$OUT" GW_ELAPSED="$(elapsed)" GW_BUDGET="$BUDGET" \
  GW_AGENT_ENABLED="$AGENT_ENABLED" GW_AGENT_FALLBACK="$AGENT_FALLBACK" \
  GW_AGENT_FALLBACK_REASON="$AGENT_FALLBACK_REASON" GW_ENV_JSON="$TMP/env.json" \
  GW_BUILD_DIR="$BUILD_DIR" \
  "$SYS_PY" - <<'PY' || true
import json, os, re
out = os.environ["GW_OUT"]
def read(p):
    try:
        with open(p, errors="replace") as f: return f.read()
    except OSError: return ""
steps = []
for line in read(os.environ["GW_STEPS"]).splitlines():
    name, status, rc, secs, note = (line.split("\t") + [""] * 5)[:5]
    steps.append({"name": name, "status": status, "exit_code": int(rc or 0),
                  "seconds": int(secs or 0), "note": note})
env = {}
try: env = json.loads(read(os.environ["GW_ENV_JSON"]) or "{}")
except ValueError: pass
ctest = {}
m = re.findall(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", read(os.path.join(out, "ctest.log")))
if m:
    _, failed, total = map(int, m[-1])
    # ctest counts GTEST_SKIP()ped tests as passed and lists them as "(Skipped)".
    skipped = len(re.findall(r"^\s+\d+ - .*\((?:Skipped|Disabled)\)\s*$", read(os.path.join(out, "ctest.log")), re.M))
    ctest = {"total": total, "passed": total - failed - skipped, "failed": failed, "skipped": skipped}
    ctext = read(os.path.join(out, "ctest.log"))
    failed_part = ctext.split("The following tests FAILED:")[-1] if "The following tests FAILED:" in ctext else ""
    ctest["failed_tests"] = re.findall(r"^\s*\d+ - (\S+).*\((?!Skipped|Disabled)[^)]*\)\s*$", failed_part, re.M)[:50]
pytest = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0, "deselected": 0, "errors": 0}
# One summary line per test file (device.sh runs each file in its own process).
lines = [l for l in read(os.path.join(out, "pytest.log")).splitlines()
         if re.match(r"^=*\s*\d+ (passed|failed|error|errors|skipped)", l)]
for line in lines:
    for key in ("passed", "failed", "skipped", "xfailed", "xpassed", "deselected"):
        mm = re.search(r"(\d+) " + key, line); pytest[key] += int(mm.group(1)) if mm else 0
    mm = re.search(r"(\d+) errors?", line); pytest["errors"] += int(mm.group(1)) if mm else 0
pytest["files_reported"] = len(lines)
pytest["crashed"] = re.findall(r"Fatal Python error: (\w+)", read(os.path.join(out, "pytest.log")))
bench = []
try:
    with open(os.path.join(out, "bench.json")) as f: bench = json.load(f)
except (OSError, ValueError): pass
res = {
    "schema": "gaugewatch-device-results/1",
    "elapsed_s": int(os.environ["GW_ELAPSED"]), "budget_s": int(os.environ["GW_BUDGET"]),
    "build_dir": os.environ["GW_BUILD_DIR"],
    **env,
    "agent": {"enabled": os.environ["GW_AGENT_ENABLED"] == "ON",
              "fallback_to_off": os.environ["GW_AGENT_FALLBACK"] == "1",
              "fallback_reason": os.environ["GW_AGENT_FALLBACK_REASON"]},
    "ctest": ctest, "pytest": pytest,
    "bench": {"runs": len(bench), "items": [{k: b.get(k) for k in ("name", "status", "seconds")} for b in bench]},
    "steps": steps,
    "ok": bool(steps) and all(s["status"] in ("ok", "skipped") for s in steps),
}
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(res, f, indent=2); f.write("\n")
PY
}

# An interpreter for our own bookkeeping (the image's python3 has torch).
SYS_PY="$(command -v python3 || command -v "$PY")"
[[ -n "$SYS_PY" ]] || { echo "[device] ERROR: no python3 for results.json" >&2; exit 1; }

say "start $(date -u +%FT%TZ) in $ROOT; OUT=$OUT; budget ${BUDGET}s; $JOBS cores"

# --- env ------------------------------------------------------------------------------------
t0=$(date +%s)
{
  echo "===== uname"; uname -a
  echo "===== os"; grep PRETTY_NAME /etc/os-release
  echo "===== nvidia-smi"; nvidia-smi 2>&1 || echo "nvidia-smi failed"
  echo "===== nvcc"; (command -v nvcc && nvcc --version) 2>&1 || /usr/local/cuda/bin/nvcc --version 2>&1
  echo "===== cmake"; cmake --version 2>&1 | head -1; command -v ninja && ninja --version
  echo "===== c++"; c++ --version 2>&1 | head -1
  echo "===== python"; command -v "$PY"; "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "available", torch.cuda.is_available())' 2>&1
  echo "===== pip (selected)"; "$PY" -m pip list 2>/dev/null | grep -i -E '^(torch|numpy|safetensors|pytest|pytest-timeout|grpcio|protobuf|pyyaml|requests) ' || true
} >"$OUT/env.log" 2>&1
"$PY" - >"$TMP/env.json" 2>>"$OUT/env.log" <<'PY' || echo '{}' >"$TMP/env.json"
import json, shutil, subprocess, sys
def sh(cmd):
    try: return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception: return ""
env = {"python": sys.version.split()[0]}
q = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
if q:
    parts = [p.strip() for p in q.splitlines()[0].split(",")]
    env.update(gpu_name=parts[0], driver=parts[1] if len(parts) > 1 else "", gpu_memory=parts[2] if len(parts) > 2 else "",
               gpu_count=len(q.splitlines()))
try:
    import torch
    env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
               cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        env["torch_device"] = torch.cuda.get_device_name(0)
        env["compute_capability"] = "%d.%d" % torch.cuda.get_device_capability(0)
except Exception as e:
    env["torch_error"] = repr(e)
nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
v = sh([nvcc, "--version"])
env["nvcc"] = v.split("release ")[-1].split(",")[0] if "release" in v else ""
env["cmake"] = sh(["cmake", "--version"]).splitlines()[0].split()[-1] if sh(["cmake", "--version"]) else ""
print(json.dumps(env))
PY
record env ok 0 $(( $(date +%s) - t0 )) "$("$SYS_PY" -c 'import json,sys; e=json.load(open(sys.argv[1])); print(e.get("gpu_name","no GPU"), "/ driver", e.get("driver","?"), "/ torch", e.get("torch","?"))' "$TMP/env.json" 2>/dev/null)"

# --- deps: unpack the carried .debs ---------------------------------------------------------
# -dev packages that the image may already have: skipped when their header is there
# (then the image's own runtime library matches its own headers).
declare -A SYSTEM_HEADER=( [libssl-dev]=/usr/include/openssl/ssl.h [zlib1g-dev]=/usr/include/zlib.h
                           [libsqlite3-dev]=/usr/include/sqlite3.h
                           [libcurl4-openssl-dev]=/usr/include/x86_64-linux-gnu/curl/curl.h )
t0=$(date +%s)
deps_note=""
if ls "$DEBS"/*.deb >/dev/null 2>&1; then
  mkdir -p "$PREFIX"
  n=0; skipped=()
  for deb in "$DEBS"/*.deb; do
    pkg="$(basename "$deb" | cut -d_ -f1)"
    hdr="${SYSTEM_HEADER[$pkg]:-}"
    if [[ -n "$hdr" && -e "$hdr" && -z "${GW_EXTRACT_ALL:-}" ]]; then skipped+=("$pkg"); continue; fi
    dpkg -x "$deb" "$PREFIX" && n=$((n + 1)) || say "deps: dpkg -x $deb failed"
  done
  # A -dev package's libfoo.so -> libfoo.so.N.M link dangles when its runtime
  # package is the image's own (not carried): point it at the image's library.
  fixed=0
  while IFS= read -r link; do
    target="$(readlink "$link")"; name="$(basename "$link")"
    major="$(sed -n 's/^.*\.so\.\([0-9]*\).*$/\1/p' <<<"$target")"
    for cand in "/$ARCH_LIB/$(basename "$target")" "/$ARCH_LIB/$name.$major" "/$ARCH_LIB/$name"; do
      if [[ -e "$cand" ]]; then ln -sf "$cand" "$link"; fixed=$((fixed + 1)); break; fi
    done
  done < <(find "$PREFIX/$ARCH_LIB" -maxdepth 1 -xtype l -name '*.so' 2>/dev/null)
  dangling="$(find "$PREFIX/$ARCH_LIB" -maxdepth 1 -xtype l 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ')"
  deps_note="$n .debs unpacked into $PREFIX; skipped (image has them): ${skipped[*]:-none}; relinked $fixed; dangling: ${dangling:-none}"
  export PATH="$PREFIX/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$PREFIX/$ARCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$PREFIX/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  {
    echo "===== deps"; echo "$deps_note"
    echo "protoc: $(command -v protoc) $(protoc --version 2>&1)"
    echo "grpc_cpp_plugin: $(command -v grpc_cpp_plugin)"
  } >>"$OUT/env.log" 2>&1
  say "deps: $deps_note"
  record deps ok 0 $(( $(date +%s) - t0 )) "$deps_note"
else
  say "deps: no .debs in $DEBS (run scripts/fetch-device-debs.sh here and carry .device); gRPC side will fall back"
  record deps failed 1 0 "no .debs in $DEBS"
fi

# --- configure ------------------------------------------------------------------------------
# The C++ compiler: one whose shared objects use the process's libstdc++.so. A
# toolchain that links libstdc++ statically into shared libraries gives a torch
# process two copies of it; the ops library then crashed in std::ostream
# (seen on this image, 2026-11-29). Probe: a template libstdc++.so exports
# (basic_ostream::_M_insert<long>) must stay undefined in the shared object.
pick_cxx() {
  local probe="$TMP/cxx-probe" cxx
  mkdir -p "$probe"
  printf '#include <sstream>\n#include <string>\nstd::string f(long x) { std::ostringstream o; o << x; return o.str(); }\n' >"$probe/p.cpp"
  for cxx in ${CXX:-} c++ g++ /usr/bin/g++ /usr/bin/g++-13 /usr/bin/g++-14 /usr/bin/g++-12; do
    command -v "$cxx" >/dev/null 2>&1 || continue
    "$cxx" -shared -fPIC -O2 "$probe/p.cpp" -o "$probe/p.so" 2>/dev/null || continue
    if ! nm -D --defined-only "$probe/p.so" 2>/dev/null | grep -q '_M_insert'; then
      command -v "$cxx"
      return
    fi
    echo "compiler $cxx links libstdc++ into shared objects: not used" >>"$OUT/env.log"
  done
}
CXX_PICKED="$(pick_cxx)"
CMAKE_ARGS=(-S . -G Ninja -DCMAKE_BUILD_TYPE=Release -DGAUGEWATCH_PYTHON="$PY")
if [[ -n "$CXX_PICKED" ]]; then
  CC_PICKED="${CXX_PICKED%g++*}gcc${CXX_PICKED##*g++}"
  [[ -x "$CC_PICKED" ]] || CC_PICKED="$(command -v gcc || echo cc)"
  CMAKE_ARGS+=(-DCMAKE_CXX_COMPILER="$CXX_PICKED" -DCMAKE_C_COMPILER="$CC_PICKED" -DCMAKE_CUDA_HOST_COMPILER="$CXX_PICKED")
  echo "C++ compiler: $CXX_PICKED ($("$CXX_PICKED" --version | head -1)), C: $CC_PICKED" >>"$OUT/env.log"
else
  say "configure: every C++ compiler found links libstdc++ statically into shared objects; using the default"
fi
[[ -n "${CMAKE_PREFIX_PATH:-}" ]] && CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH//:/;}")
# shellcheck disable=SC2206
[[ -n "${CMAKE_EXTRA_ARGS:-}" ]] && CMAKE_ARGS+=(${CMAKE_EXTRA_ARGS})
# GW_REUSE_BUILD=1: a later call on the same (warm) machine configures the
# build directory the previous call left and builds incrementally.
if [[ "${GW_REUSE_BUILD:-}" == 1 && -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  say "configure: reusing $BUILD_DIR (GW_REUSE_BUILD=1)"
else
  rm -rf "$BUILD_DIR"
fi
t0=$(date +%s)
run_step configure "$OUT/build.log" "$(reserve_for 420 60)" cmake "${CMAKE_ARGS[@]}" -B "$BUILD_DIR" -DGAUGEWATCH_ENABLE_AGENT=ON
if [[ $STEP_RC -eq 0 ]]; then
  AGENT_ENABLED=ON
  record configure ok 0 $(( $(date +%s) - t0 )) "agent ON"
else
  AGENT_FALLBACK=1
  AGENT_FALLBACK_REASON="$(grep -A4 -m1 'CMake Error' "$OUT/build.log" | tr '\n' ' ' | tr -s ' ' | cut -c1-400)"
  [[ -n "$AGENT_FALLBACK_REASON" ]] || AGENT_FALLBACK_REASON="configure exited $STEP_RC"
  say "configure with the agent failed: $AGENT_FALLBACK_REASON"
  say "configure: retrying with GAUGEWATCH_ENABLE_AGENT=OFF"
  rm -rf "$BUILD_DIR"
  run_step configure-no-agent "$OUT/build.log" "$(reserve_for 400 50)" cmake "${CMAKE_ARGS[@]}" -B "$BUILD_DIR" -DGAUGEWATCH_ENABLE_AGENT=OFF
  if [[ $STEP_RC -eq 0 ]]; then
    AGENT_ENABLED=OFF
    record configure ok 0 $(( $(date +%s) - t0 )) "agent OFF (fallback: gRPC side did not configure)"
  else
    record configure "$(status_of $STEP_RC)" "$STEP_RC" $(( $(date +%s) - t0 )) "failed with and without the agent; see build.log"
  fi
fi
CONFIGURED=$STEP_RC

# --- build ----------------------------------------------------------------------------------
if [[ $CONFIGURED -eq 0 ]]; then
  # shellcheck disable=SC2086
  run_step build "$OUT/build.log" "$(reserve_for 200 150)" cmake --build "$BUILD_DIR" -j "$JOBS" ${GW_BUILD_TARGETS:+--target $GW_BUILD_TARGETS} -- -k 0
  note="$(grep -c '^FAILED:' "$OUT/build.log" 2>/dev/null) failed build edges"
  # Our shared libraries are loaded into torch processes: none may carry a
  # private copy of libstdc++ (see gaugewatch::shared_libstdcxx).
  for so in "$BUILD_DIR"/lib/*.so; do
    [[ -e "$so" ]] || continue
    if nm -D --defined-only "$so" 2>/dev/null | grep -q 'codecvt'; then
      note="$note; $(basename "$so") carries libstdc++"
    fi
  done
  record build "$(status_of $STEP_RC)" "$STEP_RC" "$STEP_S" "$note"
else
  record build skipped 0 0 "not configured"
fi

export GAUGEWATCH_BUILD_DIR="$ROOT/$BUILD_DIR"
export GAUGEWATCH_REQUIRE_GPU=1      # GPU tests fail instead of skipping when CUDA is missing
export PYTHONUNBUFFERED=1

# --- ctest ----------------------------------------------------------------------------------
if [[ $CONFIGURED -eq 0 && -n "${GW_SKIP_CTEST:-}" ]]; then
  record ctest skipped 0 0 "GW_SKIP_CTEST set"
elif [[ $CONFIGURED -eq 0 ]]; then
  : >"$OUT/ctest.log"
  # 120 s for the later steps where the budget allows; a short budget gives
  # ctest at least 30 s (a focused GW_CTEST_R='^gpu\.' run takes ~20 s).
  run_step ctest "$OUT/ctest.log" "$(reserve_for 120 30)" ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j "$CTEST_JOBS" --timeout 300 \
    ${GW_CTEST_R:+-R "$GW_CTEST_R"}
  record ctest "$(status_of $STEP_RC)" "$STEP_RC" "$STEP_S" "$(grep -E 'tests passed' "$OUT/ctest.log" | tail -1)"
else
  record ctest skipped 0 0 "not configured"
fi

# --- pytest ---------------------------------------------------------------------------------
# One process per test file: a crash (segfault in a native op) in one file must
# not hide the results of the others.
: >"$OUT/pytest.log"
mapfile -t py_files < <(find tests/python -maxdepth 1 \( -name 'test_*.py' -o -name '*_test.py' \) 2>/dev/null | sort)
if [[ -n "${GW_ONLY_PYTEST:-}" ]]; then  # space-separated basenames: a focused run
  mapfile -t py_files < <(for f in "${py_files[@]}"; do [[ " $GW_ONLY_PYTEST " == *" $(basename "$f") "* ]] && echo "$f"; done)
fi
# GW_PYTEST_JOBS=N runs N files at a time (each still its own process, its
# output kept apart and appended to pytest.log in file order): the whole
# suite fits one call that way (serially the GPU machine took more than 540 s:
# the torch.compile tests alone run minutes there). Default 1.
JOBS_PY="${GW_PYTEST_JOBS:-1}"
[[ "$JOBS_PY" =~ ^[1-9][0-9]*$ ]] || { say "GW_PYTEST_JOBS=$JOBS_PY: not a positive whole number; running 1"; JOBS_PY=1; }
pytest_file() {  # pytest_file <file> <logfile>: one file, its exit code into <logfile>.rc
  # shellcheck disable=SC2086
  run_step "pytest $(basename "$1")" "$2" 60 "$PY" -X faulthandler -m pytest "$1" -q -p no:cacheprovider -rfEs \
    ${GW_PYTEST_K:+-k "$GW_PYTEST_K"} ${PYTEST_ARGS:-}
  echo "$STEP_RC" >"$2.rc"
}
if ((${#py_files[@]})); then
  t0=$(date +%s); worst=0; crashed=()
  for i in "${!py_files[@]}"; do
    if ((JOBS_PY == 1)); then
      pytest_file "${py_files[$i]}" "$TMP/pytest.$i.log"
    else
      while (( $(jobs -rp | wc -l) >= JOBS_PY )); do wait -n; done
      pytest_file "${py_files[$i]}" "$TMP/pytest.$i.log" &
    fi
  done
  wait
  for i in "${!py_files[@]}"; do
    f="${py_files[$i]}"
    cat "$TMP/pytest.$i.log" >>"$OUT/pytest.log" 2>/dev/null
    rc="$(cat "$TMP/pytest.$i.log.rc" 2>/dev/null || echo 124)"
    case $rc in 0|5) ;; *) worst=$rc ;; esac
    if ((rc > 128)); then crashed+=("$(basename "$f") (signal $((rc - 128)))"); fi
  done
  note="$(grep -E '^=*[ ]*[0-9]+ (passed|failed|error|errors|skipped)' "$OUT/pytest.log" | tr -d '=' |
          awk '{for (i = 1; i < NF; i++) if ($(i+1) ~ /^(passed|failed|skipped|errors?),?$/) { k = $(i+1); sub(/,/, "", k); sub(/errors/, "error", k); n[k] += $i }}
               END {printf "%d passed, %d failed, %d errors, %d skipped", n["passed"], n["failed"], n["error"], n["skipped"]}')"
  ((${#crashed[@]})) && note="$note; crashed: ${crashed[*]}"
  record pytest "$(status_of $worst)" "$worst" $(( $(date +%s) - t0 )) "$note"
else
  say "pytest: no test files under tests/python"
  record pytest skipped 0 0 "no test files under tests/python"
fi

# --- compute-sanitizer ----------------------------------------------------------------------
# memcheck, racecheck and synccheck over small calls of every CUDA backend
# (tests/cuda/sanitize_kernels.py), restricted to gaugewatch's kernels; then
# the same script with GAUGEWATCH_GPROJ_KERNEL=key_outer, which runs only the
# key-outer gproj at both head dims (both passes warp-specialized),
# and with that and GAUGEWATCH_BF16_KERNEL=key_outer, which runs bf16, pivot
# and the key-outer gproj on the key-outer kernel without warp specialization
# (the default is the warp-specialized one), and the key-outer gproj with its
# second pass over 128-key blocks (GAUGEWATCH_GPROJ_PASS2_KEYS=128; 256-key
# blocks are the default), and bf16, pivot and gproj at head dim 256 on their key-outer kernels
# (GAUGEWATCH_D256_KERNEL=key_outer GAUGEWATCH_GPROJ_KERNEL=key_outer: they
# run by default too, but the default variant asks for gproj's pair; the
# library reads the variables once, when it loads).
SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [[ "${GW_SANITIZE:-1}" != 0 && -x "$SAN" && -e "$BUILD_DIR/lib/libgaugewatch_ops.so" ]]; then
  : >"$OUT/sanitizer.log"
  t0=$(date +%s); worst=0; notes=()
  for variant in ${GW_SANITIZE_VARIANTS:-default gproj_key_outer key_outer gproj_pass2_128 d256_key_outer}; do
    case $variant in
      default) variant_env=(GAUGEWATCH_GPROJ_KERNEL=pair GAUGEWATCH_BF16_KERNEL= GAUGEWATCH_GPROJ_PASS2_KEYS= GAUGEWATCH_D256_KERNEL=) ;;
      gproj_key_outer) variant_env=(GAUGEWATCH_GPROJ_KERNEL=key_outer GAUGEWATCH_BF16_KERNEL= GAUGEWATCH_GPROJ_PASS2_KEYS= GAUGEWATCH_D256_KERNEL=) ;;
      key_outer) variant_env=(GAUGEWATCH_GPROJ_KERNEL=key_outer GAUGEWATCH_BF16_KERNEL=key_outer GAUGEWATCH_GPROJ_PASS2_KEYS= GAUGEWATCH_D256_KERNEL=) ;;
      gproj_pass2_128) variant_env=(GAUGEWATCH_GPROJ_KERNEL=key_outer GAUGEWATCH_BF16_KERNEL= GAUGEWATCH_GPROJ_PASS2_KEYS=128 GAUGEWATCH_D256_KERNEL=) ;;
      d256_key_outer) variant_env=(GAUGEWATCH_D256_KERNEL=key_outer GAUGEWATCH_GPROJ_KERNEL=key_outer GAUGEWATCH_BF16_KERNEL= GAUGEWATCH_GPROJ_PASS2_KEYS=) ;;
      *) echo "GW_SANITIZE_VARIANTS: unknown variant $variant (default gproj_key_outer key_outer gproj_pass2_128 d256_key_outer)" >&2
         exit 2 ;;
    esac
    for tool in memcheck racecheck synccheck; do
      run_step "sanitizer $tool ($variant)" "$OUT/sanitizer.log" 30 env "${variant_env[@]}" \
        "$SAN" --tool "$tool" --error-exitcode 3 --kernel-regex kns=gaugewatch "$PY" tests/cuda/sanitize_kernels.py
      label="$tool"; [[ $variant != default ]] && label="$tool ($variant)"
      known=""
      if [[ $tool == racecheck && $STEP_RC -eq 3 ]]; then
        # Reports that are all the tool's known artefacts beside the pingpong
        # (the D = 64 dQ exchange, the pair's pivot fix-up;
        # scripts/racecheck_known.py) pass; any other hazard keeps the run failed.
        if awk -v h="===== sanitizer $tool ($variant):" 'index($0, "===== ") == 1 {on = index($0, h) == 1; if (on) seg = ""} on {seg = seg $0 "\n"} END {printf "%s", seg}' \
             "$OUT/sanitizer.log" | "$SYS_PY" scripts/racecheck_known.py | tee -a "$OUT/sanitizer.log" "$LOG"; then
          STEP_RC=0; known=" (known pingpong reports only)"
        fi
      fi
      [[ $STEP_RC -eq 0 ]] || worst=$STEP_RC
      notes+=("$label $(status_of $STEP_RC)$known")
    done
  done
  record sanitizer "$(status_of $worst)" "$worst" $(( $(date +%s) - t0 )) "${notes[*]}"
fi

# --- bench ----------------------------------------------------------------------------------
: >"$OUT/bench.log"
BENCH_JSON_DIR="$TMP/bench"; mkdir -p "$BENCH_JSON_DIR"
export GAUGEWATCH_BENCH_OUT="$BENCH_JSON_DIR"     # bench scripts may write *.json here
printf '' >"$TMP/bench.tsv"
benches=()
if [[ -d "$BUILD_DIR/bin" ]]; then
  while IFS= read -r b; do benches+=("$b"); done < <(find "$BUILD_DIR/bin" -maxdepth 1 -type f -perm -u+x \( -name 'bench_*' -o -name '*_bench' \) | sort)
fi
while IFS= read -r s; do benches+=("$s"); done < <(find bench -type f -name '*.py' ! -name '_*' ! -path '*/results/*' ! -path '*/__pycache__/*' 2>/dev/null | sort)
if [[ -n "${GW_ONLY_BENCH:-}" ]]; then  # space-separated basenames, "none" for no benchmarks
  # In the order given: the first named runs first (a long one last).
  filtered=(); for want in $GW_ONLY_BENCH; do for b in "${benches[@]}"; do [[ "$(basename "$b")" == "$want" ]] && filtered+=("$b"); done; done
  benches=("${filtered[@]}")
fi
t0=$(date +%s)
if ((${#benches[@]} == 0)); then
  say "bench: no benchmark binaries in $BUILD_DIR/bin and no bench/*.py scripts: skipped"
  record bench skipped 0 0 "no benchmarks built or present"
else
  bench_fail=0
  for b in "${benches[@]}"; do
    name="$(basename "$b")"
    if [[ "$b" == *.py ]]; then
      # GW_BENCH_ARGS_<script name without .py>, else GW_BENCH_ARGS.
      per_script="GW_BENCH_ARGS_${name%.py}"
      args="${!per_script-${GW_BENCH_ARGS:-}}"
      # shellcheck disable=SC2086
      run_step "bench $name" "$OUT/bench.log" 5 "$PY" "$b" $args
    else
      run_step "bench $name" "$OUT/bench.log" 5 "$b" --benchmark_out="$BENCH_JSON_DIR/$name.json" --benchmark_out_format=json
    fi
    printf '%s\t%s\t%s\n' "$name" "$(status_of $STEP_RC)" "${STEP_S:-0}" >>"$TMP/bench.tsv"
    [[ $STEP_RC -eq 0 ]] || bench_fail=$((bench_fail + 1))
  done
  "$SYS_PY" - "$TMP/bench.tsv" "$BENCH_JSON_DIR" "$OUT/bench.json" <<'PY' || true
import json, os, sys
tsv, jdir, out = sys.argv[1:4]
runs = []
for line in open(tsv):
    name, status, secs = line.rstrip("\n").split("\t")
    item = {"name": name, "status": status, "seconds": int(secs or 0)}
    stem = name[:-3] if name.endswith(".py") else name
    for fn in sorted(os.listdir(jdir)):
        if fn.startswith(stem) and fn.endswith(".json"):
            try: item.setdefault("results", {})[fn] = json.load(open(os.path.join(jdir, fn)))
            except ValueError: pass
    runs.append(item)
json.dump(runs, open(out, "w"), indent=1)
PY
  if ((bench_fail)); then st=failed; else st=ok; fi
  record bench "$st" "$bench_fail" $(( $(date +%s) - t0 )) "${#benches[@]} run, $bench_fail failed"
fi

# --- summary --------------------------------------------------------------------------------
write_results
rm -rf "$TMP"
say "done after $(elapsed)s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
{
  echo
  printf '%-12s %-8s %6s  %s\n' step status seconds note
  printf '%-12s %-8s %6s  %s\n' ---- ------ ------- ----
  "$SYS_PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["steps"]:
    print("%-12s %-8s %6d  %s" % (s["name"], s["status"], s["seconds"], s["note"][:110]))
print("agent:", "ON" if r["agent"]["enabled"] else "OFF", "(fallback)" if r["agent"]["fallback_to_off"] else "",
      "| overall:", "OK" if r["ok"] else "FAILED")
' "$OUT/results.json"
} | tee -a "$LOG"
