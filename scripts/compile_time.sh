#!/usr/bin/env bash
# What a user pays to compile ember: wall time and peak compiler memory for a fixed set of translation units, one
# at a time (so the numbers do not share cores), as a Markdown table.
#
#   scripts/compile_time.sh [--runs N] [--pch] [--precompiled] [--floor] [--lto] [--ladder] [--trace] [TU ...]
#
#   --runs N   compile each TU N times and print the median wall time (and the largest peak memory); default 1
#   --pch      also time each TU against a precompiled header of <ember/ember.hpp> + <ember/data.hpp> + <ember/io.hpp>
#              (what ember_target_precompile_headers() sets up in CMake); the PCH's own build time is printed
#   --precompiled  also time each TU with EMBER_PRECOMPILED (what linking ember::precompiled sets), after
#              compiling the library's sources (src/precompiled_*.cpp) once, whose times are printed too
#   --floor    also compile each TU at -O0 and -O1 (the other flags unchanged): what parsing and instantiating the
#              program's code costs with little or no optimisation, a floor for the -O2 figures
#   --lto      also build each TU into a program (compile and link, -pthread -lz), once in one process and once
#              with -flto=auto, which moves the optimisation and code generation to the link and runs it in
#              one job per core: what a header-only user's edit-build loop takes with each
#   --ladder   also compile bench/compile_time/feature_ladder.cpp at each of its levels (one feature more per level)
#              and print what each feature adds to a header-only TU: wall time, peak memory, object code
#   --trace    also compile each TU with clang++ -ftime-trace and print where the time went: front end vs back
#              end, the headers that cost most to parse, and the templates that cost most to instantiate
#   TU ...     other files to measure (default: the fp32 CNN, the ResNet and transformer programs in
#              bench/compile_time/)
#
# Environment: CXX (default g++), EMBER_CT_FLAGS (default "-O2 -march=native"), CLANGXX (default clang++).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cxx="${CXX:-g++}"
clangxx="${CLANGXX:-clang++}"
read -r -a flags <<<"${EMBER_CT_FLAGS:--O2 -march=native}"
runs=1 pch=0 pre=0 trace=0 floor=0 lto=0 ladder=0 tus=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --pch) pch=1; shift ;;
    --precompiled) pre=1; shift ;;
    --trace) trace=1; shift ;;
    --floor) floor=1; shift ;;
    --lto) lto=1; shift ;;
    --ladder) ladder=1; shift ;;
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) tus+=("$(realpath "$1")"); shift ;;
  esac
done
if [ ${#tus[@]} -eq 0 ]; then
  tus=("$root/bench/compile_time/cnn_fmnist.cpp" "$root/bench/compile_time/resnet_fmnist.cpp"
       "$root/bench/compile_time/char_transformer.cpp")
fi
command -v /usr/bin/time >/dev/null || { echo "compile_time.sh: needs GNU time (apt-get install time)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(-std=c++20 "${flags[@]}" -I"$root/include")
# What CMake adds for ember::precompiled: EMBER_PRECOMPILED_IO (the library holds <ember/io.hpp>'s code too).
pre_defs=(-DEMBER_PRECOMPILED -DEMBER_PRECOMPILED_IO)

# One compile: prints "seconds kilobytes" (the largest peak of the driver's processes). With link=1, the
# compile builds a program instead of an object file.
link=0
measure() {
  local out=(-c -o "$work/out.o")
  [ "$link" = 1 ] && out=(-o "$work/a.out" -pthread -lz)
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" "${out[@]}" 2>"$work/err" \
    || { cat "$work/err" >&2; echo "compile_time.sh: failed: $*" >&2; exit 1; }
  cat "$work/time"
}
# $runs compiles: prints "MEDIAN_SECONDS PEAK_GB" (the median wall time, the largest peak memory).
runs_of() {
  local walls=() mem=0 s kb
  for ((r = 0; r < runs; r++)); do
    read -r s kb < <(measure "$@")
    walls+=("$s")
    [ "$kb" -gt "$mem" ] && mem="$kb"
  done
  echo "$(median "${walls[@]}") $(awk -v kb="$mem" 'BEGIN {printf "%.2f", kb / 1048576}')"
}
# The median of its arguments.
median() {
  printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'
}
# One table row: "| name | s | GB |".
row() {
  local name="$1" med gb
  shift
  read -r med gb < <(runs_of "$@")
  printf '| %s | %.1f s | %s GB |\n' "$name" "$med" "$gb"
}

echo "$cxx $("$cxx" -dumpfullversion 2>/dev/null || true), ${flags[*]}, $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg), median of $runs"
echo
echo "| TU | wall | peak memory |"
echo "|---|---|---|"
for tu in "${tus[@]}"; do
  row "$(basename "$tu") (header-only)" "$cxx" "${common[@]}" "$tu"
done

if [ "$floor" = 1 ]; then
  for level in -O0 -O1; do
    # The configured flags with their -O option replaced.
    lflags=("$level")
    for f in "${flags[@]}"; do [[ "$f" == -O* ]] || lflags+=("$f"); done
    for tu in "${tus[@]}"; do
      row "$(basename "$tu") (header-only, $level)" "$cxx" -std=c++20 "${lflags[@]}" -I"$root/include" "$tu"
    done
  done
fi

if [ "$lto" = 1 ]; then
  # The two builds alternate, run by run, so that both see the same machine.
  link=1
  for tu in "${tus[@]}"; do
    plain=() lto_walls=() plain_mem=0 lto_mem=0
    for ((r = 0; r < runs; r++)); do
      read -r s kb < <(measure "$cxx" "${common[@]}" "$tu")
      plain+=("$s"); [ "$kb" -gt "$plain_mem" ] && plain_mem="$kb"
      read -r s kb < <(measure "$cxx" "${common[@]}" -flto=auto "$tu")
      lto_walls+=("$s"); [ "$kb" -gt "$lto_mem" ] && lto_mem="$kb"
    done
    printf '| %s (header-only, compile and link) | %.1f s | %.2f GB |\n' "$(basename "$tu")" "$(median "${plain[@]}")" \
      "$(awk -v kb="$plain_mem" 'BEGIN {print kb / 1048576}')"
    printf '| %s (header-only, compile and link, -flto=auto) | %.1f s | %.2f GB |\n' "$(basename "$tu")" \
      "$(median "${lto_walls[@]}")" "$(awk -v kb="$lto_mem" 'BEGIN {print kb / 1048576}')"
  done
  link=0
fi

if [ "$pch" = 1 ]; then
  mkdir -p "$work/pch"
  printf '#include <ember/ember.hpp>\n#include <ember/data.hpp>\n#include <ember/io.hpp>\n' \
    >"$work/pch/ember_pch.hpp"
  read -r s kb < <(/usr/bin/time -f "%e %M" -o "$work/time" "$cxx" "${common[@]}" -x c++-header "$work/pch/ember_pch.hpp" \
                     -o "$work/pch/ember_pch.hpp.gch" && cat "$work/time")
  printf '| the precompiled header itself (once) | %.1f s | %.2f GB |\n' "$s" "$(echo "$kb" | awk '{print $1/1048576}')"
  for tu in "${tus[@]}"; do
    row "$(basename "$tu") (with the PCH)" "$cxx" "${common[@]}" -include "$work/pch/ember_pch.hpp" -Winvalid-pch "$tu"
  done
fi

if [ "$pre" = 1 ]; then
  for part in "$root"/src/precompiled_*.cpp; do  # the library's parts, which a parallel build compiles side by side
    row "src/$(basename "$part"), a part of the ember::precompiled library itself (once)" "$cxx" "${common[@]}" \
      "${pre_defs[@]:1}" -I"$root/src" "$part"
  done
  for tu in "${tus[@]}"; do
    row "$(basename "$tu") (EMBER_PRECOMPILED)" "$cxx" "${common[@]}" "${pre_defs[@]}" "$tu"
  done
  if [ "$pch" = 1 ]; then  # both: the PCH is built with the same macro, as CMake does for a target linking ember::precompiled
    mkdir -p "$work/pchpre"
    cp "$work/pch/ember_pch.hpp" "$work/pchpre/ember_pch.hpp"
    "$cxx" "${common[@]}" "${pre_defs[@]}" -x c++-header "$work/pchpre/ember_pch.hpp" \
      -o "$work/pchpre/ember_pch.hpp.gch"
    for tu in "${tus[@]}"; do
      row "$(basename "$tu") (EMBER_PRECOMPILED and the PCH)" "$cxx" "${common[@]}" "${pre_defs[@]}" \
        -include "$work/pchpre/ember_pch.hpp" -Winvalid-pch "$tu"
    done
  fi
fi

if [ "$ladder" = 1 ]; then
  ladder_tu="$root/bench/compile_time/feature_ladder.cpp"
  echo
  echo "### feature_ladder.cpp, header-only: what each feature adds"
  echo
  echo "| level | adds | wall | added | peak memory | object code (text) |"
  echo "|---|---|---|---|---|---|"
  prev=""
  # The level table at the top of the file: "//   k  what it adds".
  while read -r k what; do
    read -r med gb < <(runs_of "$cxx" "${common[@]}" -DEMBER_LADDER="$k" "$ladder_tu")
    text="$(size "$work/out.o" | awk 'NR == 2 {printf "%.0f KB", $1 / 1024}')"
    added="$( [ -n "$prev" ] && awk -v a="$med" -v b="$prev" 'BEGIN {printf "%+.1f s", a - b}' || echo "")"
    printf '| %s | %s | %.1f s | %s | %s GB | %s |\n' "$k" "$what" "$med" "$added" "$gb" "$text"
    prev="$med"
  done < <(sed -n 's|^//   \([0-9]\)  \(.*\)$|\1 \2|p' "$ladder_tu")
fi

if [ "$trace" = 1 ]; then
  command -v "$clangxx" >/dev/null || { echo "compile_time.sh: --trace needs $clangxx" >&2; exit 2; }
  for tu in "${tus[@]}"; do
    base="$(basename "$tu" .cpp)"
    (cd "$work" && "$clangxx" "${common[@]}" -ftime-trace -ftime-trace-granularity=100 -c "$tu" -o "$work/$base.o")
    echo
    echo "### $base: where the time goes (clang -ftime-trace)"
    python3 - "$work/$base.json" "$root" <<'EOF'
import collections, json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
root = sys.argv[2] + "/include/"
totals = {e["name"][6:]: e["dur"] / 1e6 for e in events if e.get("name", "").startswith("Total ")}
print(f"front end {totals.get('Frontend', 0):.1f} s (parsing {totals.get('Source', 0):.1f} s, instantiating "
      f"{totals.get('InstantiateFunction', 0) + totals.get('InstantiateClass', 0):.1f} s), "
      f"back end {totals.get('Backend', 0):.1f} s (optimising {totals.get('Optimizer', 0):.1f} s, "
      f"code generation {totals.get('CodeGenPasses', 0):.1f} s)")
def family(name):  # a template's name without its arguments: all the instantiations of one template together
    out, depth = [], 0
    for ch in name:
        if ch == "<": depth += 1
        if depth == 0: out.append(ch)
        if ch == ">": depth -= 1
    return "".join(out)[:100]
def top(kinds, key, n):
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("name") in kinds:
            k = key(e.get("args", {}).get("detail", ""))
            total[k] += e["dur"]; count[k] += 1
    return [(v / 1e6, count[k], k) for k, v in total.most_common(n)]
print("\nheaders, inclusive parse time (s, times entered):")
for s, c, k in top({"Source"}, lambda d: d.replace(root, "").split("/include/c++/")[-1], 12):
    print(f"  {s:6.2f} {c:4d}  {k}")
print("\ntemplates, inclusive instantiation time summed over their instantiations (s, instantiations):")
for s, c, k in top({"InstantiateFunction", "InstantiateClass"}, family, 15):
    print(f"  {s:6.2f} {c:4d}  {k}")
EOF
  done
fi
