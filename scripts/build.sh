#!/usr/bin/env bash
# Configure (Ninja, Release) and build gaugewatch.
#
#   ./scripts/build.sh [extra cmake -D options...]
#
# Environment: BUILD_DIR (default build), BUILD_TYPE (default Release),
# JOBS (default: all cores), GAUGEWATCH_NO_CCACHE. The first run, or any run given options,
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
# ccache, when installed, makes rebuilds and other checkouts' builds cheap
# (GAUGEWATCH_NO_CCACHE=1 turns it off).
LAUNCHER=()
if [[ -z "${GAUGEWATCH_NO_CCACHE:-}" ]] && command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [[ $# -gt 0 || ! -f "$BUILD_DIR/build.ninja" ]]; then
  log "configure: cmake -S . -B $BUILD_DIR -G Ninja -DCMAKE_BUILD_TYPE=$BUILD_TYPE ${LAUNCHER[*]} $*"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" "${LAUNCHER[@]}" "$@"
fi
log "build: cmake --build $BUILD_DIR -j $JOBS"
cmake --build "$BUILD_DIR" -j "$JOBS"
log "done in ${SECONDS}s ($BUILD_DIR)"
