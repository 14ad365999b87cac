#!/usr/bin/env bash
# What a user's first build and their rebuilds cost, measured the way they meet them: a fresh consumer project that
# takes ember with add_subdirectory(), configured in Release, built with `cmake --build -jJOBS`; then its TU touched
# and rebuilt. Both ways of linking ember: ember::precompiled (the first build compiles the library's two TUs beside
# the user's own) and ember::ember (header-only: the first build and a rebuild cost the same). Prints wall and CPU
# seconds of each build as a Markdown table.
#
#   scripts/first_build.sh [--jobs J] [--runs N] [TU]
#
#   --jobs J   the build's parallelism (default 2, the CI machines' and many laptops' VMs' cores)
#   --runs N   rebuild N times and print the median (default 3); the first build is done once
#   TU         the user's program (default bench/compile_time/cnn_fmnist.cpp, the fp32 CNN of example 04)
#
# Environment: CXX (default g++). Needs GNU time.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs=2 runs=3 tu="$root/bench/compile_time/cnn_fmnist.cpp"
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) tu="$(realpath "$1")"; shift ;;
  esac
done
command -v /usr/bin/time >/dev/null || { echo "first_build.sh: needs GNU time (apt-get install time)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# One build: prints "wall_seconds cpu_seconds" (CPU: user + system of the build and every compiler it ran).
timed_build() {
  /usr/bin/time -f "%e %U %S" -o "$work/t" cmake --build "$1" --parallel "$jobs" >"$work/build.log" 2>&1 ||
    { cat "$work/build.log" >&2; exit 1; }
  awk '{ printf "%.1f %.1f\n", $1, $2 + $3 }' "$work/t"
}
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

printf '| linked to | first build: wall | first build: CPU | rebuild after an edit: wall (median of %d) | rebuild: CPU |\n' "$runs"
printf '|---|---|---|---|---|\n'
for target in ember::precompiled ember::ember; do
  proj="$work/consumer-${target#ember::}"
  mkdir -p "$proj"
  cp "$tu" "$proj/main.cpp"
  cat >"$proj/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.21)
project(first_build CXX)
add_subdirectory("$root" ember)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE $target)
EOF
  cmake -S "$proj" -B "$proj/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="${CXX:-g++}" \
    >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; exit 1; }
  read -r fw fc < <(timed_build "$proj/build")
  walls=() cpus=()
  for _ in $(seq "$runs"); do
    touch "$proj/main.cpp"
    read -r w c < <(timed_build "$proj/build")
    walls+=("$w") cpus+=("$c")
  done
  printf '| `%s` | %s s | %s s | %s s | %s s |\n' "$target" "$fw" "$fc" \
    "$(printf '%s\n' "${walls[@]}" | median)" "$(printf '%s\n' "${cpus[@]}" | median)"
done
echo
echo "(\`cmake --build --parallel $jobs\` of a fresh add_subdirectory() consumer, Release; $(${CXX:-g++} --version | head -1);" \
  "$(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
