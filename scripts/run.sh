#!/usr/bin/env bash
# The main job: set up, build, then run the live monitor demo.
#
#   sudo ./scripts/run.sh                   (as root: ./scripts/run.sh)
#   sudo ./scripts/run.sh demo [options]    the same, with options (examples/live_demo.py --help)
#   sudo ./scripts/run.sh report [options]  plots of any run (tools/gaugewatch_report.py --help)
#   sudo ./scripts/run.sh audit --input CAPTURE --device cuda
#                                           a captured call through every backward this machine has
#   sudo ./scripts/run.sh audit witness     any other gaugewatch arguments: the CLI
#
# Without arguments it runs the live monitor demo with embedded defaults and
# temporary paths (examples/live_demo.py): an agent, the example GPT trainer
# (examples/train.py, some layers in the attention-sink regime) under
# `gaugewatch run`, the agent's default rule switching the leaking layers to
# gproj; a summary table, plots, the metrics URL and gaugewatchctl commands.
# On a machine with a GPU it runs the GPU configuration.
# Environment: BUILD_DIR (default build), GAUGEWATCH_SKIP_SETUP=1 (skip setup.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export BUILD_DIR="${BUILD_DIR:-build}"

if [[ -z "${GAUGEWATCH_SKIP_SETUP:-}" ]]; then ./scripts/setup.sh; fi
./scripts/build.sh

BIN="$BUILD_DIR/bin/gaugewatch"
PY="$ROOT/.venv/bin/python"
[[ -x "$BIN" ]] || { echo "[run] ERROR: $BIN was not built" >&2; exit 1; }
export GAUGEWATCH_BUILD_DIR="$(cd "$BUILD_DIR" && pwd)"
export GAUGEWATCH_PYTHON="${GAUGEWATCH_PYTHON:-$PY}"  # the Python `gaugewatch audit --device` replays with
if [[ $# -eq 0 ]]; then set -- demo; fi
case "$1" in
  demo)
    shift
    echo "[run] $PY examples/live_demo.py $*"
    exec "$PY" examples/live_demo.py --build-dir "$GAUGEWATCH_BUILD_DIR" "$@" ;;
  report)
    shift
    echo "[run] $PY tools/gaugewatch_report.py $*"
    exec "$PY" tools/gaugewatch_report.py --ctl "$GAUGEWATCH_BUILD_DIR/bin/gaugewatchctl" "$@" ;;
  *)
    echo "[run] $BIN $*"
    exec "$BIN" "$@" ;;
esac
