#!/usr/bin/env bash
# The main job: set up, build, then run gaugewatch with its embedded defaults.
#
#   sudo ./scripts/run.sh                 (as root: ./scripts/run.sh)
#   sudo ./scripts/run.sh audit witness   (any other gaugewatch arguments)
#
# Without arguments it runs `gaugewatch audit all`: the CPU numerics audit of
# every built-in scenario (fp64, plain BF16 emulation, GProj, pivot).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export BUILD_DIR="${BUILD_DIR:-build}"

./scripts/setup.sh
./scripts/build.sh

BIN="$BUILD_DIR/bin/gaugewatch"
[[ -x "$BIN" ]] || { echo "[run] ERROR: $BIN was not built" >&2; exit 1; }
if [[ $# -eq 0 ]]; then set -- audit all; fi
echo "[run] $BIN $*"
exec "$BIN" "$@"
