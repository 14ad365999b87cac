#!/usr/bin/env bash
# Installs what building and testing ember needs on Debian 12; does nothing when all of it is there.
# usage: scripts/deps.sh [--bench] [--fuzz]
#   --bench adds libtorch-dev (~1 GB) for bench/vs_libtorch; --fuzz is accepted for old scripts (clang and libFuzzer are
#   now always installed: the test suite runs the fuzzers)
set -euo pipefail
# zlib1g-dev: gzip'd IDX files; nlohmann-json3-dev: safetensors headers; dataset-fashion-mnist: the examples' data
# clang, libclang-rt-14-dev: libFuzzer for the fuzz jobs of the test suite (ctest's fuzz_smoke, scripts/fuzz.sh)
# time: GNU time, for scripts/compile_time.sh's peak-memory figures
pkgs=(cmake g++ make libeigen3-dev doctest-dev libbenchmark-dev zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist
      clang libclang-rt-14-dev time)
for arg in "$@"; do
  case $arg in
    --bench) pkgs+=(libtorch-dev) ;;
    --fuzz) ;;
    *) echo "usage: $0 [--bench] [--fuzz]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all installed"
  exit 0
fi

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "deps: installing ${missing[*]}"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
