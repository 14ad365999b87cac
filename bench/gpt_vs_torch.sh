#!/usr/bin/env bash
# Training tokens/s of examples/09_char_gpt against the same model in PyTorch eager (bench/torch_gpt_peer.py), run in
# turns on the same machine with the same thread count: each round runs both, and the ratio of the two medians
# (over the --log windows after the first) is printed per round and as the median over rounds. Not part of CI.
#   bench/gpt_vs_torch.sh BUILD_DIR PYTHON [ROUNDS] [THREADS] [extra options for both]
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR PYTHON [ROUNDS] [THREADS] [OPTIONS...]}
py=${2:?usage: $0 BUILD_DIR PYTHON [ROUNDS] [THREADS] [OPTIONS...]}
rounds=${3:-5}
threads=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
opts=(--steps 50 --log 10 --threads "$threads" "$@")
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
ratios=()
for r in $(seq "$rounds"); do
  e=$("$build/examples/09_char_gpt" "${opts[@]}" --sample 0 | awk '/tokens\/s/ {print $(NF-1)}' | tail -n +2 | median)
  t=$("$py" "$here/torch_gpt_peer.py" "${opts[@]}" | awk '/^step/ {print $(NF-1)}' | tail -n +2 | median)
  ratio=$(awk -v e="$e" -v t="$t" 'BEGIN {printf "%.3f", e / t}')
  ratios+=("$ratio")
  echo "round $r: ember $e tokens/s, pytorch eager $t tokens/s, ratio $ratio"
done
echo "median ratio over $rounds rounds: $(printf '%s\n' "${ratios[@]}" | median)"
