// ember — the CPU forward of a fused linear layer, y = act(a @ b + bias): the GEMM of cpu/gemm.hpp in blocks of rows
// with the epilogue of cpu/epilogue.hpp applied to each block while it is in cache (ops/matmul.hpp's ops::linear
// dispatches here; cuda/blas.hpp's linear_epilogue is the CUDA twin).
#pragma once

#include <algorithm>
#include <cstdint>

#include "ember/config.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/gemm.hpp"

namespace ember::cpu {

/// y (M x N, row-major) = act(a (M x K) @ b (K x N) + bias (N values, or null)). Each block of rows gets its bias and
/// activation right after its GEMM, while the block (~256 KiB when the layer is narrow) is in cache. Each block packs
/// the whole of b again, so a block has at least 256 rows: the repacking then costs under 1/500 of the block's
/// multiply-adds.
template <class T>
void linear_forward(std::int64_t M, std::int64_t N, std::int64_t K, MatView<T> av, MatView<T> bv, const T* bias,
                    Activation act, T* y) {
  const std::int64_t rows = std::max<std::int64_t>(256, (std::int64_t(256) << 10) / std::int64_t(sizeof(T) * N));
  for (std::int64_t r0 = 0; r0 < M; r0 += rows) {
    const std::int64_t r = std::min(rows, M - r0);
    gemm<T>(r, N, K, MatView<T>{av.p + r0 * av.rs, av.rs, av.cs}, bv, y + r0 * N, N, false);
    bias_act_rows_(y + r0 * N, r, N, N, bias, act);
  }
}

}  // namespace ember::cpu
