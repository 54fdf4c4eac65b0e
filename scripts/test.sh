#!/usr/bin/env bash
# The test command: set up, build, run every test, end with the runners' summaries.
#
#   sudo ./scripts/test.sh        (as root: ./scripts/test.sh)
#
# Steps: scripts/setup.sh, scripts/build.sh, then
#   ctest --test-dir $BUILD_DIR --output-on-failure        (GoogleTest suites)
#   .venv/bin/python -m pytest tests/python -q             (Python clients)
# Both runners always run; the exit status is non-zero if either fails.
# Environment: BUILD_DIR (default build), CTEST_ARGS, PYTEST_ARGS (extra args),
# GAUGEWATCH_SKIP_SETUP=1 (skip setup.sh, e.g. on a machine you don't administer).
# The Python tests find the build through GAUGEWATCH_BUILD_DIR (absolute).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export BUILD_DIR="${BUILD_DIR:-build}"
export GAUGEWATCH_BUILD_DIR="$(cd "$ROOT" && mkdir -p "$BUILD_DIR" && cd "$BUILD_DIR" && pwd)"
PY="$ROOT/.venv/bin/python"
LOGS="$GAUGEWATCH_BUILD_DIR/test-logs"
mkdir -p "$LOGS"
SECONDS=0

if [[ -z "${GAUGEWATCH_SKIP_SETUP:-}" ]]; then
  ./scripts/setup.sh || { echo "[test] ERROR: setup failed" >&2; exit 1; }
fi
./scripts/build.sh || { echo "[test] ERROR: build failed" >&2; exit 1; }
build_s=$SECONDS

# --- ctest -----------------------------------------------------------------------------
echo "[test] ctest --test-dir $BUILD_DIR --output-on-failure"
# shellcheck disable=SC2086
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j "$(nproc)" ${CTEST_ARGS:-} \
  2>&1 | tee "$LOGS/ctest.log"
ctest_rc=${PIPESTATUS[0]}
ctest_summary="$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$LOGS/ctest.log" | tail -1)"
[[ -n "$ctest_summary" ]] || ctest_summary="$(grep -E 'No tests were found' "$LOGS/ctest.log" | tail -1)"
[[ -n "$ctest_summary" ]] || ctest_summary="(no summary; exit $ctest_rc)"

# --- fuzz ------------------------------------------------------------------------------
# The agent's libFuzzer targets need clang: a separate agent-only build, then
# bounded runs (ctest agent_fuzz_bounded: message validation, YAML config,
# flags; agent_logic_fuzz_bounded: trainer sessions into the controller, its
# /metrics, raw bytes to the HTTP server).
fuzz_rc=0
fuzz_summary="(skipped: GAUGEWATCH_SKIP_FUZZ is set)"
if [[ -z "${GAUGEWATCH_SKIP_FUZZ:-}" ]]; then
  FUZZ_DIR="${BUILD_DIR}-fuzz"
  echo "[test] libFuzzer: clang build of agent_fuzz and agent_logic_fuzz in $FUZZ_DIR, then their bounded runs"
  if CC=clang CXX=clang++ cmake -S . -B "$FUZZ_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       -DGAUGEWATCH_ENABLE_FUZZ=ON -DGAUGEWATCH_ENABLE_TORCH=OFF -DGAUGEWATCH_ENABLE_CUDA=OFF \
       -DGAUGEWATCH_ENABLE_BENCH=OFF >"$LOGS/fuzz-build.log" 2>&1 &&
     cmake --build "$FUZZ_DIR" --target agent_fuzz agent_logic_fuzz >>"$LOGS/fuzz-build.log" 2>&1; then
    ctest --test-dir "$FUZZ_DIR" -R '^agent_(logic_)?fuzz_bounded$' --output-on-failure --no-tests=error 2>&1 | tee "$LOGS/fuzz.log"
    fuzz_rc=${PIPESTATUS[0]}
    fuzz_summary="$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$LOGS/fuzz.log" | tail -1)"
  else
    fuzz_rc=1
    fuzz_summary="(the clang fuzz build failed: see $LOGS/fuzz-build.log)"
    tail -20 "$LOGS/fuzz-build.log"
  fi
fi

# --- pytest ----------------------------------------------------------------------------
pytest_rc=0
pytest_summary=""
py_tests="$(find tests/python -name 'test_*.py' -o -name '*_test.py' 2>/dev/null | head -1)"
if [[ -z "$py_tests" ]]; then
  pytest_summary="(no test files under tests/python: skipped)"
elif [[ ! -x "$PY" ]]; then
  pytest_rc=1
  pytest_summary="(no .venv: run sudo ./scripts/setup.sh)"
else
  echo "[test] $PY -m pytest tests/python -q"
  # shellcheck disable=SC2086
  "$PY" -m pytest tests/python -q -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$LOGS/pytest.log"
  pytest_rc=${PIPESTATUS[0]}
  # exit 5 = no tests collected: a failure here, since test files exist.
  pytest_summary="$(grep -E '^=*[ ]*[0-9]+ (passed|failed|error|errors|skipped|deselected|xfailed|xpassed)|no tests ran' "$LOGS/pytest.log" | tail -1)"
  [[ -n "$pytest_summary" ]] || pytest_summary="(no summary; exit $pytest_rc)"
fi

# --- summary ---------------------------------------------------------------------------
count() {  # count <regex-word> <text>: the number before the word, 0 if absent
  local n
  n="$(grep -oE "[0-9]+ $1" <<<"$2" | head -1 | grep -oE '^[0-9]+')"
  echo "${n:-0}"
}
ct_failed=0; ct_total=0
if [[ "$ctest_summary" =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
  ct_failed=${BASH_REMATCH[1]}; ct_total=${BASH_REMATCH[2]}
fi
# ctest counts a GTEST_SKIP()ped test as passed; it lists it under "did not run".
ct_skipped="$(grep -cE '^[[:space:]]+[0-9]+ - .*\((Skipped|Disabled)\)[[:space:]]*$' "$LOGS/ctest.log")"
py_passed="$(count passed "$pytest_summary")"
py_failed=$(( $(count failed "$pytest_summary") + $(count 'errors?' "$pytest_summary") ))
py_skipped="$(count skipped "$pytest_summary")"
total_passed=$(( ct_total - ct_failed - ct_skipped + py_passed ))
total_skipped=$(( ct_skipped + py_skipped ))
total_failed=$(( ct_failed + py_failed ))
if [[ $ctest_rc -ne 0 && $ct_failed -eq 0 ]]; then total_failed=$((total_failed + 1)); fi
if [[ $pytest_rc -ne 0 && $py_failed -eq 0 ]]; then total_failed=$((total_failed + 1)); fi
if [[ -z "${GAUGEWATCH_SKIP_FUZZ:-}" ]]; then
  if [[ $fuzz_rc -eq 0 ]]; then total_passed=$((total_passed + 1)); else total_failed=$((total_failed + 1)); fi
fi

echo
echo "================================ summary ================================"
echo "build:  ${build_s}s (setup + configure + build, $BUILD_DIR)"
echo "ctest:  $ctest_summary   [exit $ctest_rc]"
echo "fuzz:   $fuzz_summary   [exit $fuzz_rc]"
echo "pytest: $pytest_summary   [exit $pytest_rc]"
echo "time:   ${SECONDS}s in all; logs in $LOGS"
echo "tests: $total_passed passed, $total_failed failed, $total_skipped skipped"
if [[ $ctest_rc -ne 0 || $pytest_rc -ne 0 || $fuzz_rc -ne 0 ]]; then
  exit 1
fi
exit 0
