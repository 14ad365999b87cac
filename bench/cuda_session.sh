#!/usr/bin/env bash
# Every CUDA check of ember on one GPU machine, in one go, most important first: the CUDA test binary, example 10
# (04's CNN trained on the GPU) beside its PyTorch peer, then the CUDA benchmarks beside theirs. Each step has a time
# limit and its own log under OUTDIR; a summary goes to stdout. The binaries may be built on another machine (build
# with -DEMBER_NATIVE=OFF then: the GPU host is another CPU).
#
# usage: bench/cuda_session.sh BUILD_DIR OUTDIR FASHION_MNIST_DIR [EPOCHS]
#   BUILD_DIR  a tree configured with -DEMBER_WITH_CUDA=ON -DEMBER_BUILD_CUDA_EXAMPLES=ON and built with
#              --target ember_tests_cuda 10_fashion_mnist_cuda bench_cuda bench_cuda_libs bench_memory_cuda
# cuBLAS, cuDNN and NCCL are taken from the system, or from the nvidia-* wheels beside the python3 that has torch.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BUILD_DIR OUTDIR FASHION_MNIST_DIR [EPOCHS]" >&2; exit 2; }
build=$1 out=$2 data=$3 epochs=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
if [ -n "$nv" ]; then
  for d in "$nv"/*/lib; do LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; done
fi
[ -d "$build/.lib" ] && LD_LIBRARY_PATH=$build/.lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # carried libraries, if any
export LD_LIBRARY_PATH

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"

# step NAME LIMIT_S CMD...: runs CMD into OUTDIR/NAME.log (appending), prints its exit status, time and summary lines
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "--- $name: $*" >> "$out/$name.log"
  timeout "$limit" "$@" >> "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0)) s"
  return $rc
}

# 1. The CUDA test binary: the summary, and every failure's location and message.
step tests 300 "$build/tests/ember_tests_cuda"
grep -E "^\[doctest\] (test cases|assertions|Status)|ERROR|FATAL|error:|Segmentation|Aborted" "$out/tests.log" | head -40

# 2. Example 10 against its PyTorch peer, fp32 then bf16: per-epoch times and accuracy.
for p in fp32 bf16; do
  step cnn 150 "$build/examples/10_fashion_mnist_cuda" --epochs "$epochs" --data "$data" --precision "$p"
  step cnn 150 python3 "$here/torch_cuda_cnn_peer.py" "$data" "$p" "$epochs"
done
grep -E "^(---|epoch|Epoch)|rror|accuracy" "$out/cnn.log" | cut -c1-160 | head -30

# 3. Fused element-wise kernels, then cuBLAS/cuDNN, each beside its PyTorch peer; then host<->device copies.
step fused 60 "$build/bench/bench_cuda"
step fused 240 python3 "$here/torch_cuda_peer.py"
tail -n 40 "$out/fused.log"
step libs 90 "$build/bench/bench_cuda_libs"
step libs 120 python3 "$here/torch_cuda_libs_peer.py"
tail -n 30 "$out/libs.log"
step memory 120 "$build/bench/bench_memory_cuda" --benchmark_min_time=0.1
grep -vE "^\*\*\*|^---|^Run on|^CPU Caches|^  L[123]|^Load Average" "$out/memory.log" | cut -c1-110 | head -40
