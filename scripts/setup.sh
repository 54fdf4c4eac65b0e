#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for gaugewatch: Debian packages and the
# Python virtual environment .venv (torch==2.11.0 and the test dependencies).
#
#   sudo ./scripts/setup.sh        (or ./scripts/setup.sh as root)
#
# Idempotent and quick when already done: packages are checked with dpkg-query
# before apt-get runs, and the venv's installed versions before pip runs.
# Environment:
#   GAUGEWATCH_PYTHON_BASE   interpreter used to create .venv (default: python3)
#   GAUGEWATCH_SKIP_APT=1    skip the Debian packages (e.g. a machine you don't administer)
#   GAUGEWATCH_SKIP_VENV=1   skip the virtual environment
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
TORCH_VERSION="2.11.0"

log()  { printf '[setup] %s\n' "$*"; }
die()  { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
SECONDS=0

# --- Debian packages ----------------------------------------------------------------
APT_PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config git
  # agent: gRPC + protobuf code generation, abseil, HTTP /metrics, config, state
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev libre2-dev zlib1g-dev libssl-dev
  libcivetweb-dev libyaml-cpp-dev libsqlite3-dev sqlite3
  # agent: the Prometheus C++ client, flags, logging
  prometheus-cpp-dev libcli11-dev libspdlog-dev
  # tests, JSON
  libgtest-dev libgmock-dev nlohmann-json3-dev
  # Prometheus server and promtool (rules unit tests); amtool (the example Alertmanager route)
  prometheus prometheus-alertmanager
  # headless browser for the status page test
  chromium
  # clang + libFuzzer / sanitizer runtimes (GAUGEWATCH_ENABLE_FUZZ)
  clang libclang-rt-14-dev
)

installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

apt_install() {
  # Never start services from package scripts (prometheus): a policy-rc.d that
  # refuses every start, removed again afterwards if we created it.
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# gaugewatch setup.sh: no service starts during install\nexit 101\n' \
      > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  local rc=0
  export DEBIAN_FRONTEND=noninteractive
  if [[ -z "${GAUGEWATCH_APT_UPDATED:-}" ]]; then
    log "apt-get update"
    apt-get update -q || rc=$?
    GAUGEWATCH_APT_UPDATED=1
  fi
  if [[ $rc -eq 0 ]]; then
    log "apt-get install $*"
    apt-get install -y -q --no-install-recommends "$@" || rc=$?
  fi
  if [[ $made_policy -eq 1 ]]; then rm -f /usr/sbin/policy-rc.d; fi
  return $rc
}

if [[ -z "${GAUGEWATCH_SKIP_APT:-}" ]]; then
  command -v dpkg-query >/dev/null || die "dpkg-query not found: this script targets Debian 12"
  missing=()
  for p in "${APT_PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
  if ((${#missing[@]})); then
    [[ $EUID -eq 0 ]] || die "missing Debian packages (${missing[*]}); run as root: sudo ./scripts/setup.sh"
    apt_install "${missing[@]}" || die "apt-get install failed for: ${missing[*]}"
    # The prometheus package ships a unit; the project starts its own servers
    # (tests use loopback ports), so keep the packaged one stopped and disabled.
    for unit in prometheus prometheus-alertmanager; do
      if [[ " ${missing[*]} " == *" $unit "* ]] && command -v systemctl >/dev/null \
         && [[ -d /run/systemd/system ]]; then
        systemctl disable --now "$unit" >/dev/null 2>&1 || true
        log "$unit.service stopped and disabled (the project runs its own instances)"
      fi
    done
  else
    log "Debian packages: all ${#APT_PACKAGES[@]} present"
  fi
fi

# --- CUDA toolkit (not a Debian package here; reported, not installed) ---------------
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  log "CUDA: $("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p') ($nvcc_bin): CUDA kernels will be compiled"
else
  log "CUDA: nvcc not found: the build skips the CUDA kernels (GAUGEWATCH_ENABLE_CUDA=OFF)"
fi

# --- Python virtual environment ------------------------------------------------------
PIP_SPECS=(
  "torch==$TORCH_VERSION" numpy safetensors pytest pytest-timeout
  grpcio protobuf requests pyyaml matplotlib
)

# Prints the specs from PIP_SPECS that the venv does not satisfy (empty: all good).
venv_missing() {
  "$VENV/bin/python" - "${PIP_SPECS[@]}" <<'PY' 2>/dev/null
import sys
from importlib import metadata
missing = []
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        missing.append(spec)
        continue
    if want and have != want and not have.startswith(want + "+"):
        missing.append(spec)
print(" ".join(missing))
PY
}

if [[ -z "${GAUGEWATCH_SKIP_VENV:-}" ]]; then
  base_python="${GAUGEWATCH_PYTHON_BASE:-python3}"
  if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    command -v "$base_python" >/dev/null || die "$base_python not found; install it: sudo apt-get install -y python3 python3-venv"
    log "creating $VENV with $("$base_python" --version 2>&1) ($(command -v "$base_python"))"
    rm -rf "$VENV"
    if ! "$base_python" -m venv "$VENV" 2>/dev/null; then
      rm -rf "$VENV"
      if ! installed python3-venv; then
        [[ $EUID -eq 0 ]] || die "'$base_python -m venv' failed and python3-venv is missing; run as root: sudo ./scripts/setup.sh"
        apt_install python3-venv || die "apt-get install python3-venv failed"
      fi
      "$base_python" -m venv "$VENV" || die "'$base_python -m venv $VENV' failed (with python3-venv installed)"
    fi
  fi
  todo="$(venv_missing)" || todo="${PIP_SPECS[*]}"
  if [[ -n "$todo" ]]; then
    log "pip install into .venv: $todo  (torch brings its CUDA wheels: several GB the first time)"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check $todo \
      || die "pip install failed for: $todo"
    todo="$(venv_missing)" || die "the venv's Python fails to run"
    [[ -z "$todo" ]] || die "after pip install, still not satisfied: $todo"
  fi
  log "venv: $("$VENV/bin/python" -c 'import sys, torch; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}")')"
fi

log "done in ${SECONDS}s"
