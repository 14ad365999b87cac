// ember — matrix products on CUDA through cuBLAS and cuBLASLt. One cuBLAS and one cuBLASLt handle per thread and
// device, created on first use and bound to ember's current stream before every call. Row-major ember matrices are
// handed to the column-major libraries as their transposes (C^T = B^T A^T), so a transposed view (one unit stride)
// costs no copy. fp32 runs in full fp32 unless TF32 is allowed (set_allow_tf32, off by default as PyTorch's
// torch.backends.cuda.matmul.allow_tf32); fp16 and bf16 accumulate in fp32; fp64 in fp64.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/float16.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/allocator.hpp"  // registers the device allocator: workspaces are ember tensors
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace detail {
inline std::atomic<bool>& allow_tf32_flag() {
  static std::atomic<bool> f{false};
  return f;
}
}  // namespace detail

/// Lets fp32 matrix products round their inputs to TF32 on tensor cores (about 10 bits of mantissa, several times
/// faster). Off by default, as torch.backends.cuda.matmul.allow_tf32.
inline void set_allow_tf32(bool on) { detail::allow_tf32_flag().store(on, std::memory_order_relaxed); }
/// Whether fp32 matrix products may use TF32 (set_allow_tf32).
inline bool allow_tf32() { return detail::allow_tf32_flag().load(std::memory_order_relaxed); }

/// What cuBLASLt may apply to a linear layer's output in the same kernel: y = act(x @ w^T + b).
/// gelu_tanh is GELU's tanh approximation (PyTorch's gelu(approximate='tanh')), the form cuBLASLt computes.
enum class Epilogue { bias, bias_relu, bias_gelu_tanh };

namespace detail {

template <class T>
constexpr cudaDataType_t cuda_dtype() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
  else if constexpr (std::is_same_v<T, half>) return CUDA_R_16F;
  else if constexpr (std::is_same_v<T, bfloat16>) return CUDA_R_16BF;
  else static_assert(!sizeof(T*), "cuBLAS: float, double, half or bfloat16 only");
}

/// fp64 in fp64; everything else in fp32 (TF32 for fp32 inputs when allowed).
template <class T>
cublasComputeType_t compute_type() {
  if constexpr (std::is_same_v<T, double>) return CUBLAS_COMPUTE_64F;
  else if constexpr (std::is_same_v<T, float>) return allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  else return CUBLAS_COMPUTE_32F;
}
/// The type of alpha and beta: the compute type's.
template <class T>
using scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

inline constexpr std::size_t kBlasWorkspace = std::size_t(32) << 20;  // cuBLAS / cuBLASLt workspace per call

/// The handles of one device in one thread, destroyed with the thread.
struct BlasHandles {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  int device = -1;
  BlasHandles() = default;
  BlasHandles(const BlasHandles&) = delete;
  BlasHandles& operator=(const BlasHandles&) = delete;
  ~BlasHandles() {
    if (!blas && !lt) return;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
    EMBER_CUDA_WARN(cudaSetDevice(device));
    if (blas && cublasDestroy(blas) != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "ember: cublasDestroy failed\n");
    if (lt && cublasLtDestroy(lt) != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "ember: cublasLtDestroy failed\n");
    EMBER_CUDA_WARN(cudaSetDevice(prev));
  }
};

inline BlasHandles& blas_handles(int device) {
  EMBER_CHECK(device >= 0 && device < kMaxDevices, "cuBLAS: device index ", device, " out of range");
  thread_local std::array<BlasHandles, kMaxDevices> hs;
  return hs[std::size_t(device)];
}

}  // namespace detail

/// This thread's cuBLAS handle for device `index` (the current one by default), bound to the current stream.
/// The caller must have made `index` the current device.
inline cublasHandle_t blas_handle(int index = -1) {
  if (index < 0) index = current_device();
  detail::BlasHandles& h = detail::blas_handles(index);
  if (!h.blas) {
    EMBER_CUBLAS_CHECK(cublasCreate(&h.blas));
    h.device = index;
  }
  EMBER_CUBLAS_CHECK(cublasSetStream(h.blas, current_stream(index).handle()));
  return h.blas;
}

/// This thread's cuBLASLt handle for device `index` (the current one by default). cuBLASLt takes the stream per
/// call (current_stream).
inline cublasLtHandle_t blaslt_handle(int index = -1) {
  if (index < 0) index = current_device();
  detail::BlasHandles& h = detail::blas_handles(index);
  if (!h.lt) {
    EMBER_CUBLAS_CHECK(cublasLtCreate(&h.lt));
    h.device = index;
  }
  return h.lt;
}

/// A matrix operand in row-major terms: element (i, j) at p[i * rs + j * cs] (one of rs, cs is 1 or the matrix
/// has one row/column), consecutive batch entries `bs` elements apart.
template <class T>
struct BlasMat {
  const T* p;
  std::int64_t rs, cs, bs = 0;
};

namespace detail {

/// How a row-major (rows x cols) operand looks to a column-major library: the op that turns the stored
/// column-major matrix into the operand's transpose, and the stored matrix's leading dimension.
struct ColMajorView {
  cublasOperation_t op;
  std::int64_t ld;
};
template <class T>
ColMajorView col_major_view(const BlasMat<T>& m, std::int64_t rows, std::int64_t cols) {
  // Row-major storage (unit column stride) is the column-major transpose: no op. Column-major storage needs one.
  if (m.cs == 1 || cols == 1) return {CUBLAS_OP_N, std::max<std::int64_t>({m.rs, cols, 1})};
  return {CUBLAS_OP_T, std::max<std::int64_t>({m.cs, rows, 1})};
}

inline void check_int(const char* op, std::int64_t v, const char* what) {
  EMBER_CHECK(v <= INT_MAX, op, ": ", what, " = ", v, " exceeds cuBLAS's 32-bit int limit");
}

}  // namespace detail

/// C (batch x m x n, row-major, rows ldc apart, batches ldc_batch apart) = A (m x k) @ B (k x n), or C += A @ B when
/// `accumulate`, for each of `batch` products, on the current stream of the current device. A and B each need a
/// unit stride (BlasMat); ops/matmul.hpp copies them otherwise.
template <class T>
void gemm(std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k, BlasMat<T> a, BlasMat<T> b, T* c,
          std::int64_t ldc, std::int64_t c_batch_stride, bool accumulate = false) {
  if (batch == 0 || m == 0 || n == 0) return;
  const char* op = batch > 1 ? "bmm" : "mm";
  using S = detail::scale_t<T>;
  const S alpha = S(1), beta = accumulate ? S(1) : S(0);
  // Column-major: C^T (n x m) = B^T (n x k) @ A^T (k x m).
  const detail::ColMajorView vb = detail::col_major_view(b, k, n), va = detail::col_major_view(a, m, k);
  for (auto [v, what] : {std::pair{m, "m"}, {n, "n"}, {k, "k"}, {va.ld, "lda"}, {vb.ld, "ldb"}, {ldc, "ldc"},
                         {batch, "batch"}})
    detail::check_int(op, v, what);
  const cudaDataType_t dt = detail::cuda_dtype<T>();
  cublasHandle_t h = blas_handle();
  // k == 0: cuBLAS scales C by beta, which gives zeros (or leaves C) as the empty sum should.
  if (batch == 1) {
    EMBER_CUBLAS_CHECK(cublasGemmEx(h, vb.op, va.op, int(n), int(m), int(k), &alpha, b.p, dt, int(vb.ld), a.p, dt,
                                    int(va.ld), &beta, c, dt, int(ldc), detail::compute_type<T>(),
                                    CUBLAS_GEMM_DEFAULT));
  } else {
    EMBER_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, vb.op, va.op, int(n), int(m), int(k), &alpha, b.p, dt,
                                                  int(vb.ld), b.bs, a.p, dt, int(va.ld), a.bs, &beta, c, dt, int(ldc),
                                                  c_batch_stride, int(batch), detail::compute_type<T>(),
                                                  CUBLAS_GEMM_DEFAULT));
  }
}

namespace detail {
/// RAII for the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (d) (void)cublasLtMatrixLayoutDestroy(d);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (op) (void)cublasLtMatmulDescDestroy(op);
  }
};

/// The largest power of two (at most 256) that divides the address.
inline std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

inline cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::bias_relu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case Epilogue::bias_gelu_tanh: return CUBLASLT_EPILOGUE_GELU_BIAS;
    default: return CUBLASLT_EPILOGUE_BIAS;
  }
}
}  // namespace detail

/// y (M x N, row-major, contiguous) = act(x (M x K) @ w (N x K)^T + bias (N)) in one cuBLASLt call with the bias (and
/// activation) applied in the GEMM's epilogue. x and w each need a unit stride; bias is contiguous. Returns false,
/// having done nothing, when cuBLASLt has no kernel for this problem (the caller then takes the plain path).
template <class T>
bool linear_epilogue(std::int64_t M, std::int64_t N, std::int64_t K, BlasMat<T> x, BlasMat<T> w, const T* bias,
                     T* y, Epilogue e, Device dev) {
  using S = detail::scale_t<T>;
  // Column-major: y^T (N x M) = op(W) (N x K) @ op(X) (K x M); the bias runs along y^T's rows (N), as cuBLASLt's
  // epilogue broadcasts it.
  const detail::ColMajorView vw = detail::col_major_view(w, N, K);  // w^T as a (K x N) row-major operand
  // w is (N x K) row-major: its column-major storage is w^T (K x N); op T makes it (N x K). Column-major storage
  // (cs != 1) is w itself: op N.
  const cublasOperation_t opw = vw.op == CUBLAS_OP_N ? CUBLAS_OP_T : CUBLAS_OP_N;
  const detail::ColMajorView vx = detail::col_major_view(x, M, K);  // x (M x K): storage x^T (K x M) when row-major
  const cudaDataType_t dt = detail::cuda_dtype<T>();
  const cudaDataType_t st = std::is_same_v<T, double> ? CUDA_R_64F : CUDA_R_32F;
  detail::LtDescs ds;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, detail::compute_type<T>(), st));
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &opw, sizeof(opw)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &vx.op, sizeof(vx.op)));
  const cublasLtEpilogue_t ep = detail::lt_epilogue(e);
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  Tensor<T> bias_copy;  // the epilogue loads the bias in vectors: give it an aligned copy when a view is not
  if (detail::alignment(bias) < 16) {
    bias_copy = empty<T>(Shape{N}, dev);
    EMBER_CUDA_CHECK(cudaMemcpyAsync(bias_copy.data(), bias, std::size_t(N) * sizeof(T), cudaMemcpyDeviceToDevice,
                                     current_stream(dev.index).handle()));
    bias = bias_copy.data();
  }
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  // Stored shapes: A is (K x N) when transposed by opw = T, else (N x K); B is (K x M) for op N, else (M x K).
  if (opw == CUBLAS_OP_T) EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, dt, K, N, vw.ld));
  else EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, dt, N, K, vw.ld));
  if (vx.op == CUBLAS_OP_N) EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, dt, K, M, vx.ld));
  else EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, dt, M, K, vx.ld));
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.d, dt, N, M, N));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&ds.pref));
  std::size_t ws = detail::kBlasWorkspace;
  EMBER_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The heuristics assume 256-byte aligned operands unless told otherwise; views can start anywhere.
  const std::uint32_t al_a = detail::alignment(w.p), al_b = detail::alignment(x.p), al_d = detail::alignment(y);
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                          sizeof(al_a)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                          sizeof(al_b)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                                          sizeof(al_d)));
  EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(ds.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                                          sizeof(al_d)));
  cublasLtHandle_t h = blaslt_handle(dev.index);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, ds.op, ds.a, ds.b, ds.d, ds.d, ds.pref, 1, &heur, &found);
  if (hs == CUBLAS_STATUS_NOT_SUPPORTED || (hs == CUBLAS_STATUS_SUCCESS && found == 0)) return false;
  EMBER_CUBLAS_CHECK(hs);
  Tensor<std::uint8_t> work;
  if (heur.workspaceSize > 0) work = empty<std::uint8_t>(Shape{std::int64_t(heur.workspaceSize)}, dev);
  const S alpha = S(1), beta = S(0);
  EMBER_CUBLAS_CHECK(cublasLtMatmul(h, ds.op, &alpha, w.p, ds.a, x.p, ds.b, &beta, y, ds.d, y, ds.d, &heur.algo,
                                    work.defined() ? work.data() : nullptr, heur.workspaceSize,
                                    current_stream(dev.index).handle()));
  return true;
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
