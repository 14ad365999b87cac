#!/usr/bin/env bash
# INT8 inference of the example-04 CNN at batch 64: ember (bench_conv's BM_CnnInference/3/64, the median of 3
# repetitions) against PyTorch's own int8 model (bench/torch_inference_peer.py, x86/fbgemm backend), run in turns on
# the same machine with the same thread count (ember uses every core, the peer 2 threads by default). Each round
# prints both images/s and their ratio; the last line is the median ratio. Not part of CI.
#   bench/int8_vs_torch.sh BUILD_DIR PYTHON [ROUNDS] [default|tuned]
# tuned: both under glibc settings that keep freed memory (the allocator column of RESULTS.md).
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR PYTHON [ROUNDS] [default|tuned]}
py=${2:?usage: $0 BUILD_DIR PYTHON [ROUNDS] [default|tuned]}
rounds=${3:-5}
if [ "${4:-default}" = tuned ]; then
  export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ratios=()
for r in $(seq "$rounds"); do
  e=$("$build/bench/bench_conv" --benchmark_filter='CnnInference/3/64/' --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true | awk '/_median/ {sub(/.*images\/s=/, ""); sub(/k\/s/, ""); print $0 * 1000}')
  t=$("$py" "$here/torch_inference_peer.py" | awk '/batch +64 +int8/ {print $4}')
  ratio=$(awk -v e="$e" -v t="$t" 'BEGIN {printf "%.3f", e / t}')
  ratios+=("$ratio")
  echo "round $r: ember int8 $e images/s, pytorch int8 $t images/s, ratio $ratio"
done
echo "median ratio over $rounds rounds: $(printf '%s\n' "${ratios[@]}" | median)"
