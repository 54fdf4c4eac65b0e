#!/usr/bin/env bash
# Configure (Ninja, Release) and build gaugewatch.
#
#   ./scripts/build.sh [extra cmake -D options...]
#
# Environment: BUILD_DIR (default build), BUILD_TYPE (default Release),
# JOBS (default: all cores). The first run, or any run given options,
# configures; later runs just build (Ninja re-runs CMake when a CMakeLists.txt
# changes). Options: see docs/building.md (e.g. -DGAUGEWATCH_ENABLE_AGENT=OFF).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
JOBS="${JOBS:-$(nproc)}"

log() { printf '[build] %s\n' "$*"; }
command -v cmake >/dev/null || { echo "[build] ERROR: cmake not found; run: sudo ./scripts/setup.sh" >&2; exit 1; }
command -v ninja >/dev/null || { echo "[build] ERROR: ninja not found; run: sudo ./scripts/setup.sh" >&2; exit 1; }

SECONDS=0
if [[ $# -gt 0 || ! -f "$BUILD_DIR/build.ninja" ]]; then
  log "configure: cmake -S . -B $BUILD_DIR -G Ninja -DCMAKE_BUILD_TYPE=$BUILD_TYPE $*"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "$@"
fi
log "build: cmake --build $BUILD_DIR -j $JOBS"
cmake --build "$BUILD_DIR" -j "$JOBS"
log "done in ${SECONDS}s ($BUILD_DIR)"
