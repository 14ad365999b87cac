// ember — check macros for CUDA, cuBLAS, cuDNN and NCCL calls. A failing call throws ember::Error naming the call,
// the file and line, and the library's own error string; the _WARN forms (for destructors) print instead.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <cstdio>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define EMBER_HAVE_CUDNN 1
#else
#define EMBER_HAVE_CUDNN 0
#endif
#if __has_include(<nccl.h>)
#include <nccl.h>
#define EMBER_HAVE_NCCL 1
#else
#define EMBER_HAVE_NCCL 0
#endif

namespace ember::cuda::detail {

[[noreturn, gnu::cold, gnu::noinline]] inline void fail(const char* lib, const char* call, const char* file, int line,
                                                        long long code, const char* what) {
  throw Error(::ember::detail::concat(lib, " error ", code, " (", what, ") in `", call, "` at ", file, ":", line));
}

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) [[unlikely]] {
    (void)cudaGetLastError();  // clear the sticky-free error so the next call starts clean
    fail("CUDA", call, file, line, e, cudaGetErrorString(e));
  }
}
inline void check(cublasStatus_t e, const char* call, const char* file, int line) {
  if (e != CUBLAS_STATUS_SUCCESS) [[unlikely]] fail("cuBLAS", call, file, line, e, cublasGetStatusString(e));
}
#if EMBER_HAVE_CUDNN
inline void check(cudnnStatus_t e, const char* call, const char* file, int line) {
  if (e != CUDNN_STATUS_SUCCESS) [[unlikely]] fail("cuDNN", call, file, line, e, cudnnGetErrorString(e));
}
#endif
#if EMBER_HAVE_NCCL
inline void check(ncclResult_t e, const char* call, const char* file, int line) {
  if (e != ncclSuccess) [[unlikely]] fail("NCCL", call, file, line, e, ncclGetErrorString(e));
}
#endif

inline void warn(cudaError_t e, const char* call, const char* file, int line) noexcept {
  if (e != cudaSuccess) [[unlikely]] {
    (void)cudaGetLastError();
    std::fprintf(stderr, "ember: CUDA error %d (%s) in `%s` at %s:%d\n", int(e), cudaGetErrorString(e), call, file,
                 line);
  }
}

}  // namespace ember::cuda::detail

/// Throws ember::Error when a CUDA runtime, cuBLAS/cuBLASLt, cuDNN or NCCL call does not succeed.
#define EMBER_CUDA_CHECK(call) ::ember::cuda::detail::check((call), #call, __FILE__, __LINE__)
#define EMBER_CUBLAS_CHECK(call) ::ember::cuda::detail::check((call), #call, __FILE__, __LINE__)
#define EMBER_CUDNN_CHECK(call) ::ember::cuda::detail::check((call), #call, __FILE__, __LINE__)
#define EMBER_NCCL_CHECK(call) ::ember::cuda::detail::check((call), #call, __FILE__, __LINE__)
/// For destructors and other places that must not throw: prints the error to stderr.
#define EMBER_CUDA_WARN(call) ::ember::cuda::detail::warn((call), #call, __FILE__, __LINE__)

#endif  // EMBER_WITH_CUDA
