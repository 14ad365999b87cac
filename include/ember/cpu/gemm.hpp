// ember — CPU matrix multiply, split across the thread pool. On x86 with AVX2+FMA or AVX-512 (the compiler's
// target macros, e.g. -march=native) it runs ember's packed GEMM (cpu/detail/gemm_kernel.hpp), which reads any
// strides in place; elsewhere it runs Eigen's, which reads operands in place when one of their strides is 1 (so
// a transposed view costs no copy).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/float16.hpp"
#include "ember/cpu/detail/gemm_amx.hpp"
#include "ember/cpu/detail/gemm_kernel.hpp"
#include "ember/cpu/thread_pool.hpp"

#if !EMBER_GEMM_PACKED
#include <vector>

#include <Eigen/Core>
#endif

namespace ember::cpu {

/// What a GEMM (and a reduction next to it) accumulates in for operands of type T: double for double, fp32 for
/// float, half and bfloat16.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// A strided matrix view: element (i, j) is p[i * rs + j * cs].
template <class T>
struct MatView {
  const T* p;  ///< Element (0, 0).
  ///@{
  /// The row stride and the column stride, in elements.
  std::int64_t rs, cs;
  ///@}
  /// Whether rows are contiguous (column stride 1).
  bool row_major() const { return cs == 1; }
  /// Whether columns are contiguous and rows are not (a transposed row-major matrix).
  bool col_major() const { return rs == 1 && cs != 1; }
};

namespace detail {
#if EMBER_GEMM_PACKED
// Rows and columns of C per thread panel: whole micro-tiles.
template <class T>
inline constexpr std::int64_t kGemmRowAlign = gemm::kMR;
template <class T>
inline constexpr std::int64_t kGemmColAlign = gemm::kNR<gemm::compute_t<T>>;

template <class T, class TC>
void gemm_block(std::int64_t m, std::int64_t n, std::int64_t k, MatView<T> a, MatView<T> b, TC* c, std::int64_t ldc,
                bool accumulate) {
#if EMBER_GEMM_BF16_PAIRS
  if constexpr (std::is_same_v<T, bfloat16>) {
#if EMBER_GEMM_AMX
    if (gemm::amx::active()) {  // (on by default where available; cpu::set_amx)
      gemm::amx::gemm<TC>(m, n, k, a.p, a.rs, a.cs, b.p, b.rs, b.cs, c, ldc, accumulate);
      return;
    }
#endif
    if (gemm::bf16::active()) {  // AVX512-BF16 (cpu::set_bf16_dot)
      gemm::bf16::gemm<TC>(m, n, k, a.p, a.rs, a.cs, b.p, b.rs, b.cs, c, ldc, accumulate);
      return;
    }
  }
#endif
  gemm::gemm_packed<T, TC>(m, n, k, a.p, a.rs, a.cs, b.p, b.rs, b.cs, c, ldc, accumulate);
}
#else
template <class T>
inline constexpr std::int64_t kGemmRowAlign = 8;
template <class T>
inline constexpr std::int64_t kGemmColAlign = 8;

template <class T, int Order>
using EMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, 0, Eigen::OuterStride<>>;

template <class T, int OA, int OB>
void gemm_eigen(std::int64_t m, std::int64_t n, std::int64_t k, MatView<T> a, MatView<T> b, T* c, std::int64_t ldc,
                bool accumulate) {
  EMap<T, OA> A(a.p, m, k, Eigen::OuterStride<>(OA == Eigen::RowMajor ? a.rs : a.cs));
  EMap<T, OB> B(b.p, k, n, Eigen::OuterStride<>(OB == Eigen::RowMajor ? b.rs : b.cs));
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>> C(
      c, m, n, Eigen::OuterStride<>(ldc));
  if (accumulate) C.noalias() += A * B;
  else C.noalias() = A * B;
}

template <class T, class TC>
void gemm_block(std::int64_t m, std::int64_t n, std::int64_t k, MatView<T> a, MatView<T> b, TC* c, std::int64_t ldc,
                bool accumulate) {
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    // 16-bit operands without the packed kernel: fp32 copies of the blocks (the packed build converts in place).
    std::vector<float> af(std::size_t(m * k)), bf(std::size_t(k * n)), cf(std::size_t(m * n));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t p = 0; p < k; ++p) af[std::size_t(i * k + p)] = float(a.p[i * a.rs + p * a.cs]);
    for (std::int64_t p = 0; p < k; ++p)
      for (std::int64_t j = 0; j < n; ++j) bf[std::size_t(p * n + j)] = float(b.p[p * b.rs + j * b.cs]);
    gemm_block<float, float>(m, n, k, {af.data(), k, 1}, {bf.data(), n, 1}, cf.data(), n, false);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const float v = cf[std::size_t(i * n + j)];
        c[i * ldc + j] = TC(accumulate ? float(c[i * ldc + j]) + v : v);
      }
  } else {
    static_assert(std::is_same_v<T, TC>, "cpu::gemm: float and double write their own type");
    constexpr int RM = Eigen::RowMajor, CM = Eigen::ColMajor;
    if (a.row_major() && b.row_major()) gemm_eigen<T, RM, RM>(m, n, k, a, b, c, ldc, accumulate);
    else if (a.row_major()) gemm_eigen<T, RM, CM>(m, n, k, a, b, c, ldc, accumulate);
    else if (b.row_major()) gemm_eigen<T, CM, RM>(m, n, k, a, b, c, ldc, accumulate);
    else gemm_eigen<T, CM, CM>(m, n, k, a, b, c, ldc, accumulate);
  }
}
#endif
/// How a GEMM is split across nt threads: along the rows of C (each thread packs all of B and its rows of A) or
/// along the columns (all of A and its columns of B), in panels of `step` (whole micro-tiles). The split taken is
/// the one whose busiest thread has the least work, counting its micro-tiles (the kernel's multiply-adds, which
/// whole tiles make uneven: 128 rows are 11 tiles of 12, 6 for one thread and 5 for the other) and the values it
/// packs (about one multiply-add's time each). a_packed, b_packed: that operand is packed already (PackedA,
/// PackedB). (Packing the operand every thread needs whole once, the threads sharing the work, before the split
/// was measured slower on the MLP's GEMMs: one more fork and join, and half of it read from the other core's cache.)
struct GemmSplit {
  bool rows;
  std::int64_t step;
};
template <class T>
GemmSplit choose_split(std::int64_t m, std::int64_t n, std::int64_t k, int nt, bool a_packed = false,
                       bool b_packed = false) {
  const std::int64_t mr = kGemmRowAlign<T>, nr = kGemmColAlign<T>;
  const std::int64_t mu = (m + mr - 1) / mr, nu = (n + nr - 1) / nr;  // tiles along each side
  auto cost = [&](bool rows, std::int64_t& step) {
    const std::int64_t units = rows ? mu : nu, per = (units + nt - 1) / nt;
    step = per * (rows ? mr : nr);
    const double mt = double(rows ? std::min(m, step) : m), nt_cols = double(rows ? n : std::min(n, step));
    const double tiles = double(per) * double(rows ? nu : mu);
    const double fma = tiles * double(k) * double(mr) * double(nr);
    const double pack = (a_packed ? 0.0 : mt * double(k)) + (b_packed ? 0.0 : double(k) * nt_cols);
    return fma / 16.0 + pack;  // a multiply-add instruction covers 16 products on AVX-512 (fewer elsewhere)
  };
  std::int64_t sr = 0, sc = 0;
  const double cr = cost(true, sr), cc = cost(false, sc);
  return cr <= cc ? GemmSplit{true, sr} : GemmSplit{false, sc};
}
#if EMBER_GEMM_PACKED
// a · b + c as the packed kernel's multiply-add rounds it: fused where the kernel uses FMA instructions, else as the
// vector-extension kernel writes it (contracted by the compiler exactly when the vector form is).
template <class T>
EMBER_INLINE T kernel_fma(T a, T b, T c) {
#if EMBER_GEMM_AVX512 || EMBER_GEMM_AVX2
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// Columns [j0, j1) of C (m ≤ 2 rows) = [C +] A @ B for float and double: what the packed kernel computes for these
// elements, in its order (one multiply-add chain from zero per panel of Blocking::kc values of k, each panel's sum
// stored or added to C in turn), so the result is bit for bit that of a taller product's rows, without packing B
// or computing a micro-tile's padding rows. Eight columns' chains run side by side (the multiply-add latency).
template <class T>
void gemm_few_rows(std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, MatView<T> a, MatView<T> b,
                   T* c, std::int64_t ldc, bool accumulate) {
  constexpr std::int64_t kc = gemm::Blocking<T>::kc;
  constexpr int J = 8;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = j0; j < j1; j += J) {
      const int nj = int(std::min<std::int64_t>(J, j1 - j));
      const T* bj[J];
      for (int t = 0; t < J; ++t) bj[t] = b.p + (j + std::min(t, nj - 1)) * b.cs;  // a tail repeats its last column
      T* cr = c + i * ldc + j;
      for (std::int64_t pc = 0; pc < k; pc += kc) {
        const std::int64_t pe = std::min(k, pc + kc);
        T acc[J] = {};
        for (std::int64_t p = pc; p < pe; ++p) {
          const T av = a.p[i * a.rs + p * a.cs];
#if !defined(__NVCC__)  // (nvcc's front end does not know the pragma)
#pragma GCC unroll 8
#endif
          for (int t = 0; t < J; ++t) acc[t] = kernel_fma(av, bj[t][p * b.rs], acc[t]);
        }
        const bool add = accumulate || pc > 0;
        for (int t = 0; t < nj; ++t) cr[t] = add ? cr[t] + acc[t] : acc[t];
      }
    }
}

/// Packs all of B (k, n) in pack_b_all's layout into dst, the threads each packing whole micro-panels.
template <class T>
void pack_b_parallel(std::int64_t k, std::int64_t n, MatView<T> b, gemm::compute_t<T>* dst) {
  constexpr std::int64_t nr = gemm::kNR<gemm::compute_t<T>>;
  parallel_for(0, (n + nr - 1) / nr, 1, [&](std::int64_t q0, std::int64_t q1) {
    gemm::pack_b_all(k, n, b.p, b.rs, b.cs, dst, q0 * nr, std::min(n, q1 * nr));
  });
}

/// C = [C +] A @ B (none of m, n, k zero) reading the operands pre holds packed in place (PackedA, PackedB): on the
/// calling thread when small, as gemm, else split across the threads as choose_split says.
template <class T, class TC>
void gemm_prepacked(std::int64_t m, std::int64_t n, std::int64_t k, MatView<T> a, MatView<T> b, TC* c,
                    std::int64_t ldc, bool accumulate, const gemm::Prepacked<gemm::compute_t<T>>& pre) {
  const int nt = get_num_threads();
  if (nt == 1 || 2.0 * double(m) * double(n) * double(k) < 4e6) {
    gemm::gemm_packed<T, TC>(m, n, k, a.p, a.rs, a.cs, b.p, b.rs, b.cs, c, ldc, accumulate, pre);
    return;
  }
  const GemmSplit sp = choose_split<T>(m, n, k, nt, pre.a != nullptr, pre.b != nullptr);
  const std::int64_t len = sp.rows ? m : n;
  parallel_for(0, (len + sp.step - 1) / sp.step, 1, [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t i0 = p * sp.step, i1 = std::min(len, i0 + sp.step);
      gemm::Prepacked<gemm::compute_t<T>> q = pre;
      if (sp.rows) {
        q.a_row0 += i0;
        gemm::gemm_packed<T, TC>(i1 - i0, n, k, a.p + i0 * a.rs, a.rs, a.cs, b.p, b.rs, b.cs, c + i0 * ldc, ldc,
                                 accumulate, q);
      } else {
        q.b_col0 += i0;
        gemm::gemm_packed<T, TC>(m, i1 - i0, k, a.p, a.rs, a.cs, b.p + i0 * b.cs, b.rs, b.cs, c + i0, ldc,
                                 accumulate, q);
      }
    }
  });
}

/// Whether a PackedA or PackedB of T keeps its view and multiplies through cpu::gemm instead of packing its operand
/// in the fp32 kernel's layout: bfloat16 while the AVX512-BF16 kernel is on (its own layout, pairs along k), so the
/// results stay gemm's bit for bit.
template <class T>
bool via_gemm() {
#if EMBER_GEMM_BF16_PAIRS
  if constexpr (std::is_same_v<T, bfloat16>) return gemm::bf16::active();
#endif
  return false;
}
#endif
}  // namespace detail

/// C (m, n; row-major, leading dim ldc) = A (m, k) @ B (k, n), or += when accumulate. A and B must each have a
/// unit stride (row- or column-major); ops/ makes a contiguous copy otherwise. T is float, double, half or
/// bfloat16; 16-bit operands are converted to fp32 while packed and accumulate in fp32, and C is written once in
/// TC (T, or float for a 16-bit T).
template <class T, class TC = T>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, MatView<T> a, MatView<T> b, TC* c, std::int64_t ldc,
          bool accumulate = false) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, half> ||
                    std::is_same_v<T, bfloat16>,
                "cpu::gemm: float, double, half or bfloat16 operands");
  static_assert(std::is_same_v<TC, T> || (sizeof(T) == 2 && std::is_same_v<TC, float>),
                "cpu::gemm: the output is the operands' type, or float for 16-bit operands");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (std::int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, TC(0));
    return;
  }
  const int nt = get_num_threads();
  const double flops = 2.0 * double(m) * double(n) * double(k);
#if EMBER_GEMM_PACKED
  if constexpr ((std::is_same_v<T, float> || std::is_same_v<T, double>) && std::is_same_v<T, TC>) {
    if (m <= 2) {  // a matrix-vector product (a batch of one): no packing, no padding rows
      if (nt == 1 || flops < 4e6) {
        detail::gemm_few_rows<T>(m, 0, n, k, a, b, c, ldc, accumulate);
        return;
      }
      const std::int64_t step = std::max<std::int64_t>(8, (n / nt + 7) / 8 * 8);
      parallel_for(0, (n + step - 1) / step, 1, [&](std::int64_t p0, std::int64_t p1) {
        for (std::int64_t p = p0; p < p1; ++p)
          detail::gemm_few_rows<T>(m, p * step, std::min(n, (p + 1) * step), k, a, b, c, ldc, accumulate);
      });
      return;
    }
  }
#endif
  if (nt == 1 || flops < 4e6) {
    detail::gemm_block<T, TC>(m, n, k, a, b, c, ldc, accumulate);
    return;
  }
  // One panel of whole micro-tiles per thread (detail::choose_split); each thread packs its own operand blocks.
  const detail::GemmSplit sp = detail::choose_split<T>(m, n, k, nt);
  const bool split_rows = sp.rows;
  const std::int64_t len = split_rows ? m : n, step = sp.step;
  parallel_for(0, (len + step - 1) / step, 1, [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t i0 = p * step, i1 = std::min(len, i0 + step);
      if (split_rows)
        detail::gemm_block<T, TC>(i1 - i0, n, k, {a.p + i0 * a.rs, a.rs, a.cs}, b, c + i0 * ldc, ldc, accumulate);
      else
        detail::gemm_block<T, TC>(m, i1 - i0, k, a, {b.p + i0 * b.cs, b.rs, b.cs}, c + i0, ldc, accumulate);
    }
  });
}

/// A left operand A (m, k) packed once for many GEMMs (a convolution's weights, reused for every image of a
/// batch): each GEMM then reads the packed panels instead of packing A again, and its threads share them. Without
/// ember's packed kernel it keeps the view, and each GEMM reads A in place as gemm does.
template <class T>
class PackedA {
 public:
  /// Packs A (m, k), viewed by `a` (which must outlive the object when the packed kernel is not built, or when a
  /// bfloat16 A multiplies on AVX512-BF16 dot products: detail::via_gemm).
  PackedA(std::int64_t m, std::int64_t k, MatView<T> a) : m_(m), k_(k), a_(a) {
#if EMBER_GEMM_PACKED
    via_gemm_ = detail::via_gemm<T>();
    if (m > 0 && k > 0 && !via_gemm_) {
      packed_.resize(std::size_t(detail::gemm::packed_rows(m) * k));
      detail::gemm::pack_a_all(m, k, a.p, a.rs, a.cs, packed_.data());
    }
#endif
  }

  /// C (m, n; leading dim ldc) = A @ B (k, n), or += when accumulate; split across threads as gemm.
  template <class TC = T>
  void gemm(std::int64_t n, MatView<T> b, TC* c, std::int64_t ldc, bool accumulate = false) const {
#if EMBER_GEMM_PACKED
    const std::int64_t m = m_, k = k_;
    if (m == 0 || n == 0 || k == 0 || via_gemm_) {
      cpu::gemm<T, TC>(m, n, k, a_, b, c, ldc, accumulate);
      return;
    }
    detail::gemm::Prepacked<detail::gemm::compute_t<T>> pre;
    pre.a = packed_.data();
    pre.a_rows = detail::gemm::packed_rows(m);
    detail::gemm_prepacked<T, TC>(m, n, k, a_, b, c, ldc, accumulate, pre);
#else
    cpu::gemm<T, TC>(m_, n, k_, a_, b, c, ldc, accumulate);
#endif
  }

 private:
  std::int64_t m_, k_;
  MatView<T> a_;
#if EMBER_GEMM_PACKED
  bool via_gemm_ = false;  // multiplied through cpu::gemm, which packs A itself (detail::via_gemm)
  std::vector<detail::gemm::compute_t<T>> packed_;
#endif
};

/// A right operand B (k, n) packed once for many GEMMs (a layer's weight applied to many batches with the same
/// values, as in evaluation): each GEMM reads the packed panels instead of packing B again, and its threads share
/// them, each packing only its own rows of A. The packing itself is split across the threads. Results equal gemm's
/// bit for bit. Without ember's packed kernel it keeps the view; either way the matrix b views must outlive the
/// object. (Packing a weight once per training step, for a single use, was measured not to pay: bench_matmul's
/// BM_LinearPackedWeight.)
template <class T>
class PackedB {
 public:
  /// Packs B (k, n), viewed by `b`, the threads sharing the work for a large B.
  PackedB(std::int64_t k, std::int64_t n, MatView<T> b) : k_(k), n_(n), b_(b) {
#if EMBER_GEMM_PACKED
    via_gemm_ = detail::via_gemm<T>();
    if (k > 0 && n > 0 && !via_gemm_) {
      packed_.get<C>(std::size_t(detail::gemm::packed_cols<C>(n) * k));  // 64-byte aligned, as the kernel loads B
      // Split across the threads from 64 Ki values (a quarter MiB of floats; w2 of the MLP, 32 Ki, packs alone).
      if (get_num_threads() > 1 && k * n >= 65536) detail::pack_b_parallel<T>(k, n, b, data());
      else detail::gemm::pack_b_all(k, n, b.p, b.rs, b.cs, data());
    }
#endif
  }
  PackedB(const PackedB&) = delete;
  PackedB& operator=(const PackedB&) = delete;

  /// C (m, n; leading dim ldc) = A (m, k) @ B, or += when accumulate; split across threads as gemm.
  template <class TC = T>
  void gemm(std::int64_t m, MatView<T> a, TC* c, std::int64_t ldc, bool accumulate = false) const {
#if EMBER_GEMM_PACKED
    const std::int64_t n = n_, k = k_;
    // Nothing to multiply, or one or two rows (gemm reads B in place for those, without packing): as gemm.
    if (m == 0 || n == 0 || k == 0 || via_gemm_ || (m <= 2 && sizeof(T) > 2 && std::is_same_v<T, TC>)) {
      cpu::gemm<T, TC>(m, n, k, a, b_, c, ldc, accumulate);
      return;
    }
    detail::gemm::Prepacked<C> pre;
    pre.b = data();
    pre.b_cols = detail::gemm::packed_cols<C>(n);
    detail::gemm_prepacked<T, TC>(m, n, k, a, b_, c, ldc, accumulate, pre);
#else
    cpu::gemm<T, TC>(m, n_, k_, a, b_, c, ldc, accumulate);
#endif
  }

 private:
  std::int64_t k_, n_;
  MatView<T> b_;
#if EMBER_GEMM_PACKED
  using C = detail::gemm::compute_t<T>;
  bool via_gemm_ = false;  // multiplied through cpu::gemm, which packs B itself (detail::via_gemm)
  C* data() const { return static_cast<C*>(packed_.p); }
  detail::gemm::Scratch packed_;
#endif
};

}  // namespace ember::cpu
