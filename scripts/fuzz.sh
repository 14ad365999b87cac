#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (address + undefined-behaviour sanitizers) and runs each for a
# bounded time on a working copy of its seed corpus (fuzz/corpus/<name>). Crashing inputs land in
# build-fuzz/artifacts/; turn each into a regular test (tests/test_io.cpp, tests/test_data.cpp, tests/test_optim.cpp,
# tests/test_store.cpp).
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]   (targets: safetensors records tar idx state store image)
# EMBER_FUZZ_OUT sets the output folder (default build-fuzz). Inputs up to 256 KiB, so that the hostile seeds (deep
# nesting, thousands of tensors, gzip bombs) are reachable. CI runs it for 20 s a target (ctest's fuzz_smoke).
# needs: clang and libclang-rt-14-dev (scripts/deps.sh --fuzz); the image target libjpeg and libspng (skipped without
# their headers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(safetensors records tar idx state store)
  # The image decoders, where libjpeg's and libspng's headers are installed (scripts/deps.sh installs them).
  printf '#include <cstdio>\n#include <jpeglib.h>\n#include <spng.h>\n' | "${CLANGXX:-clang++}" -fsyntax-only -x c++ - \
    >/dev/null 2>&1 && targets+=(image)
fi
cxx=${CLANGXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (scripts/deps.sh --fuzz)" >&2; exit 2; }

out=${EMBER_FUZZ_OUT:-build-fuzz}
mkdir -p "$out/artifacts"
# One target: build it, run it, and leave a one-line verdict in $out/fuzz_<name>.verdict (its exit status says which).
one() {
  local t=$1 src=fuzz/fuzz_$1.cpp corpus=$out/corpus-$1 log=$out/fuzz_$1.log runs libs=(-lz)
  [ "$t" != image ] || libs+=(-ljpeg -lspng)
  "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude \
    "$src" "${libs[@]}" -o "$out/fuzz_$t" >"$out/fuzz_$t.build.log" 2>&1 ||
    { echo "fuzz_$t: FAILED to build, see $out/fuzz_$t.build.log"; cat "$out/fuzz_$t.build.log"; return 1; }
  mkdir -p "$corpus"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  if "$out/fuzz_$t" "$corpus" -max_total_time="$secs" -max_len=262144 -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$out/artifacts/${t}-" >"$log" 2>&1; then
    runs=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 || true)
    echo "fuzz_$t: ok, ${runs:-see $log}; corpus $(ls "$corpus" | wc -l) inputs"
  else
    echo "fuzz_$t: FAILED, see $log and $out/artifacts/"
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5 || true
    return 1
  fi
}
for t in "${targets[@]}"; do
  [ -f "fuzz/fuzz_$t.cpp" ] || { echo "fuzz: no fuzz/fuzz_$t.cpp" >&2; exit 2; }
done
# Two targets at a time (a libFuzzer run is one thread; the machines CI runs on have two cores). Each one's output
# goes to its verdict file and is printed in order at the end.
pids=()
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || true; done
  echo "== fuzz_$t: building, then running ${secs}s"
  one "$t" >"$out/fuzz_$t.verdict" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  wait "${pids[$i]}" || status=1
  cat "$out/fuzz_${targets[$i]}.verdict"
done
exit $status
