#!/usr/bin/env bash
# Every public header of include/ember compiles on its own (.cuh files need nvcc and are left out): a TU that
# includes it twice (so a missing include guard fails too) must compile with nothing else before it.
# <ember/dist/mpi.hpp> needs MPI's headers: checked with MPI_INCLUDE_DIRS when given, skipped otherwise. The image
# headers need libjpeg's and libspng's: skipped when the compiler does not find them.
# FLAGS: more compiler flags, space-separated (CMake passes g++'s garbage-collector parameters here).
# usage: check_headers.sh CXX SOURCE_DIR [EIGEN_INCLUDE_DIRS [MPI_INCLUDE_DIRS [FLAGS]]] (dirs ':'-separated)
set -euo pipefail
cxx=$1 root=$2 eigen=${3:-/usr/include/eigen3} mpi=${4:-}
read -ra flags <<<"${5:-}"
cd "$root"
args=("$cxx" -std=c++20 -fsyntax-only "${flags[@]}" -I include)
IFS=: read -ra dirs <<<"$eigen"
for d in "${dirs[@]}"; do args+=(-I "$d"); done
if [ -n "$mpi" ]; then
  IFS=: read -ra dirs <<<"$mpi"
  for d in "${dirs[@]}"; do args+=(-I "$d"); done
fi
args+=(-x c++ -)

# The image headers (<ember/image.hpp>, data/image*.hpp) need libjpeg's and libspng's headers: skipped without them.
image=1
printf '#include <cstdio>\n#include <jpeglib.h>\n#include <spng.h>\n' | "${args[@]}" >/dev/null 2>&1 || image=0
mapfile -t headers < <(find include/ember -type f -name '*.hpp' 2>/dev/null | sort |
                       { if [ -n "$mpi" ]; then cat; else grep -v '^include/ember/dist/mpi\.hpp$'; fi; } |
                       { if [ $image = 1 ]; then cat; else grep -Ev '^include/ember/(image|data/image[^/]*)\.hpp$'; fi; })
[ ${#headers[@]} -gt 0 ] || { echo "headers_standalone: no headers yet"; exit 0; }

export log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# Each job compiles one header; a failing one leaves its diagnostics in $log/<header with / as _>.
printf '%s\0' "${headers[@]}" | xargs -0 -n1 -P2 bash -c \
  'h=${!#}; i="#include <${h#include/}>"; printf "%s\n%s\n" "$i" "$i" | "${@:1:$#-1}" >"$log/${h//\//_}" 2>&1 ||
     echo "$h" >>"$log/failed"' _ "${args[@]}"

# The umbrella header with the GEMM's Eigen fallback (EMBER_GEMM_EIGEN; also what nvcc's host pass gets without
# vector-extension flags): code that only the packed kernel's builds compile must not reach it.
eigen_case=include/ember/ember.hpp+EMBER_GEMM_EIGEN
printf '#include <ember/ember.hpp>\n' | "${args[@]}" -DEMBER_GEMM_EIGEN >"$log/${eigen_case//\//_}" 2>&1 ||
  echo "$eigen_case" >>"$log/failed"

if [ -s "$log/failed" ]; then
  mapfile -t failed < <(sort "$log/failed")
  for h in "${failed[@]}"; do echo "==== $h"; head -n 30 "$log/${h//\//_}"; done
  echo "headers_standalone: ${#failed[@]} of ${#headers[@]} headers do not compile on their own:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "headers_standalone: all ${#headers[@]} headers compile on their own"
