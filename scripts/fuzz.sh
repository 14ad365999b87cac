#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (address + undefined-behaviour sanitizers) and runs each for a
# bounded time on a working copy of its seed corpus (fuzz/corpus/<name>). Crashing inputs land in
# build-fuzz/artifacts/; turn each into a regular test (tests/test_io.cpp, tests/test_data.cpp).
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]   (targets: safetensors records idx)
# EMBER_FUZZ_OUT sets the output folder (default build-fuzz). Inputs up to 256 KiB, so that the hostile seeds (deep
# nesting, thousands of tensors, gzip bombs) are reachable. CI runs it for 20 s a target (ctest's fuzz_smoke).
# needs: clang and libclang-rt-14-dev (scripts/deps.sh --fuzz)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors records idx)
cxx=${CLANGXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (scripts/deps.sh --fuzz)" >&2; exit 2; }

out=${EMBER_FUZZ_OUT:-build-fuzz}
mkdir -p "$out/artifacts"
status=0
for t in "${targets[@]}"; do
  src=fuzz/fuzz_$t.cpp
  [ -f "$src" ] || { echo "fuzz: no $src" >&2; exit 2; }
  echo "== fuzz_$t: building"
  "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude \
    "$src" -lz -o "$out/fuzz_$t"
  corpus=$out/corpus-$t
  mkdir -p "$corpus"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  echo "== fuzz_$t: running ${secs}s"
  log=$out/fuzz_$t.log
  if "$out/fuzz_$t" "$corpus" -max_total_time="$secs" -max_len=262144 -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$out/artifacts/${t}-" >"$log" 2>&1; then
    runs=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1)
    echo "fuzz_$t: ok, ${runs:-see $log}; corpus $(ls "$corpus" | wc -l) inputs"
  else
    status=1
    echo "fuzz_$t: FAILED, see $log and $out/artifacts/"
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5 || true
  fi
done
exit $status
