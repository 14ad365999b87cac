#!/usr/bin/env bash
# Runs the fused and the materialised build of fusion_tradeoff.cpp on the same input and checks that they print the
# same loss and gradient (relative difference at most 1e-5: fused kernels round fewer intermediates).
#   fusion_same.sh <fused binary> <materialised binary>
set -euo pipefail
f="$("$1" 8192 1)"
m="$("$2" 8192 1)"
echo "$f"
echo "$m"
printf '%s\n%s\n' "$f" "$m" | tr -d '(),' | awk '
  NF >= 3 { s[NR] = $(NF - 2); g[NR] = $NF }
  function close_enough(a, b,   d, r) {
    d = a - b; if (d < 0) d = -d
    r = a < 0 ? -a : a
    return d <= 1e-5 * r + 1e-6
  }
  END {
    if (NR != 2 || s[1] "" == "" || s[2] "" == "" || s[1] != s[1] + 0 || s[2] != s[2] + 0) {
      print "fusion_same: unexpected output"
      exit 1
    }
    if (!close_enough(s[1], s[2]) || !close_enough(g[1], g[2])) { print "fusion_same: the two builds differ"; exit 1 }
    print "fusion_same: the same loss and gradient"
  }'
