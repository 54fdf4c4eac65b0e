#!/usr/bin/env bash
# Download (here, on Debian 12) the .debs that scripts/device.sh unpacks on the
# GPU machine, which has no network and no gRPC or -dev libraries.
#
#   ./scripts/fetch-device-debs.sh        -> .device/debs/*.deb (gitignored, ~19 MB)
#
# Then carry them with the device tool: run(command="bash scripts/device.sh",
# carry=[".device"]). See docs/device.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.device/debs"

# Runtime libraries and -dev packages, Debian 12 (bookworm) amd64.
PACKAGES=(
  # gRPC + protobuf + abseil and their runtime dependencies (docs/findings.md,
  # "The GPU machine")
  libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32
  protobuf-compiler protobuf-compiler-grpc
  libabsl-dev libabsl20220623 libre2-dev libre2-9 libc-ares-dev libc-ares2
  # agent: config, /metrics, state
  libyaml-cpp-dev libyaml-cpp0.7 libcivetweb-dev libcivetweb1 libsqlite3-dev
  # gRPC's CMake config also finds OpenSSL and zlib (device.sh skips these
  # -dev packages when the image already has their headers)
  libssl-dev zlib1g-dev
  # agent: the Prometheus C++ client (its CMake config also finds civetweb,
  # which names the civetweb binary, and CURL for the push library), logging
  # (spdlog on fmt), flags (CLI11, header-only). libcurl4 itself is not
  # carried: the image's runtime serves the -dev package's link.
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  civetweb libcurl4-openssl-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev
  # tests, JSON
  nlohmann-json3-dev libgtest-dev libgmock-dev
)

[[ "$(dpkg --print-architecture 2>/dev/null)" == amd64 ]] \
  || { echo "[fetch-debs] ERROR: run this on the amd64 Debian 12 machine" >&2; exit 1; }

mkdir -p "$DEST"
rm -f "$DEST"/*.deb
cd "$DEST"
echo "[fetch-debs] apt-get download ${#PACKAGES[@]} packages into $DEST"
# apt-get download runs as _apt when it can; the folder may not be readable to it.
chmod 777 "$DEST" 2>/dev/null || true
if ! apt-get download "${PACKAGES[@]}"; then
  echo "[fetch-debs] download failed; refreshing the package lists (apt-get update) and retrying"
  apt-get update -q
  apt-get download "${PACKAGES[@]}"
fi
chmod 755 "$DEST" 2>/dev/null || true
n=$(ls "$DEST"/*.deb | wc -l)
[[ $n -eq ${#PACKAGES[@]} ]] || { echo "[fetch-debs] ERROR: expected ${#PACKAGES[@]} .debs, got $n" >&2; exit 1; }
echo "[fetch-debs] $n packages, $(du -sh "$DEST" | cut -f1) in $DEST"
