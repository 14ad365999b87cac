// ember — CPU matrix multiply through Eigen, split across the thread pool. Operands are read in place when one
// of their strides is 1 (so a transposed view costs no copy).
#pragma once

#include <algorithm>
#include <cstdint>

#include <Eigen/Core>

#include "ember/config.hpp"
#include "ember/cpu/thread_pool.hpp"

namespace ember::cpu {

/// A strided matrix view: element (i, j) is p[i * rs + j * cs].
template <class T>
struct MatView {
  const T* p;
  std::int64_t rs, cs;
  bool row_major() const { return cs == 1; }
  bool col_major() const { return rs == 1 && cs != 1; }
};

namespace detail {
template <class T, int Order>
using EMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0, Eigen::OuterStride<>>;
using RM = std::integral_constant<int, Eigen::RowMajor>;
using CM = std::integral_constant<int, Eigen::ColMajor>;

template <class T, class OA, class OB>
void gemm_block(std::int64_t m, std::int64_t n, std::int64_t k, MatView<T> a, MatView<T> b, T* c, std::int64_t ldc,
                bool accumulate) {
  EMap<T, OA::value> A(a.p, m, k, Eigen::OuterStride<>(OA::value == Eigen::RowMajor ? a.rs : a.cs));
  EMap<T, OB::value> B(b.p, k, n, Eigen::OuterStride<>(OB::value == Eigen::RowMajor ? b.rs : b.cs));
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>> C(
      c, m, n, Eigen::OuterStride<>(ldc));
  if (accumulate) C.noalias() += A * B;
  else C.noalias() = A * B;
}
}  // namespace detail

/// C (m, n; row-major, leading dim ldc) = A (m, k) @ B (k, n), or += when accumulate. A and B must each have a
/// unit stride (row- or column-major); ops/ makes a contiguous copy otherwise.
template <class T>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, MatView<T> a, MatView<T> b, T* c, std::int64_t ldc,
          bool accumulate = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "cpu::gemm: float or double");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, T(0));
    return;
  }
  auto run = [&](std::int64_t i0, std::int64_t i1, std::int64_t j0, std::int64_t j1) {
    const MatView<T> as{a.p + i0 * a.rs, a.rs, a.cs}, bs{b.p + j0 * b.cs, b.rs, b.cs};
    T* cs = c + i0 * ldc + j0;
    const std::int64_t mm = i1 - i0, nn = j1 - j0;
    if (a.row_major() && b.row_major()) detail::gemm_block<T, detail::RM, detail::RM>(mm, nn, k, as, bs, cs, ldc, accumulate);
    else if (a.row_major()) detail::gemm_block<T, detail::RM, detail::CM>(mm, nn, k, as, bs, cs, ldc, accumulate);
    else if (b.row_major()) detail::gemm_block<T, detail::CM, detail::RM>(mm, nn, k, as, bs, cs, ldc, accumulate);
    else detail::gemm_block<T, detail::CM, detail::CM>(mm, nn, k, as, bs, cs, ldc, accumulate);
  };
  const int nt = get_num_threads();
  const double flops = 2.0 * double(m) * double(n) * double(k);
  if (nt == 1 || flops < 4e6) {
    run(0, m, 0, n);
    return;
  }
  // Split the larger of m and n into one panel per thread (panels of whole 8-row/col multiples).
  if (m >= n) {
    const std::int64_t step = ((m + nt - 1) / nt + 7) / 8 * 8;
    parallel_for(0, (m + step - 1) / step, 1, [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) run(p * step, std::min(m, (p + 1) * step), 0, n);
    });
  } else {
    const std::int64_t step = ((n + nt - 1) / nt + 7) / 8 * 8;
    parallel_for(0, (n + step - 1) / step, 1, [&](std::int64_t p0, std::int64_t p1) {
      for (std::int64_t p = p0; p < p1; ++p) run(0, m, p * step, std::min(n, (p + 1) * step));
    });
  }
}

}  // namespace ember::cpu
