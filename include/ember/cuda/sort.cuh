// ember — CUDA sort and scan kernels along a dim of a contiguous tensor viewed as (outer, n, inner): the stable sort
// (and its first k positions, for topk), cumsum / cumprod with their backward, and multinomial sampling; the CUDA
// twin of cpu/sort.hpp
// (ops/sort.hpp checks the arguments and dispatches).
//
// The sort is two stable radix sorts over every element at once: first by the value's order-preserving unsigned key
// (NaN above every number and every NaN equal, -0 equal to +0, as the CPU's comparison; descending sorts the
// complemented key), then by row. Radix sorts are stable, so each row ends up in value order with ties in position
// order: the CPU's stable sort, position for position. The radix sort is ember's own (stable_radix_sort_pairs, also
// the grouping step of cuda/index.cuh's reductions), LSD with 4-bit digits: per digit, each thread counts and then
// places one tile of consecutive elements in order, and one block scans the tiles' counts, so the placement is
// stable and deterministic without atomics. (CUB's sort would be faster, but its headers declare a namespace `cuda`
// that makes `cuda::` ambiguous in every user file with `using namespace ember;`.)
// The scans give one thread to each row and walk it in order, accumulating in double for floating types and int64
// for integers, exactly as the CPU loop does (the same operations in the same order: the same results).
// multinomial gives one thread to each row as well: the CPU's draws from the same Philox blocks, in double in the
// same order, so a seed draws the same samples on both devices (O(k) per sample without replacement, as the CPU).
// This header needs nvcc; ops/sort.hpp includes it only when __CUDACC__ is defined.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA

#if !defined(__CUDACC__)
#error "ember/cuda/sort.cuh defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/allocator.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace sort_detail {

inline constexpr int kThreads = 256;

inline unsigned grid_for(std::int64_t work) {
  const std::int64_t b = (work + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

#define EMBER_SORT_LOOP(i, n)                                                                    \
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);             \
       i += std::int64_t(gridDim.x) * blockDim.x)

/// The bits of the key sort_key<T> gives.
template <class T>
inline constexpr int key_bits_of = (std::is_same_v<T, double> || sizeof(T) == 8) ? 64 : 32;

/// An unsigned key whose order is the CPU's sort order of T (cpu::detail::sort_less): NaN above everything (all
/// NaNs equal), -0 equal to +0.
template <class T>
__device__ EMBER_INLINE unsigned long long sort_key(T v) {
  if constexpr (std::is_same_v<T, double>) {
    if (v != v) return ~0ull;
    const unsigned long long b = static_cast<unsigned long long>(__double_as_longlong(v == 0.0 ? 0.0 : v));
    return (b >> 63) ? ~b : b | (1ull << 63);
  } else if constexpr (is_floating_v<T>) {  // float, half and bfloat16: through float, exactly
    const float f = convert<float>(v);
    if (f != f) return 0xffffffffull;
    const unsigned b = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (b >> 31) ? (~b & 0xffffffffu) : (b | 0x80000000u);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? 1ull : 0ull;
  } else if constexpr (std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<unsigned long long>(static_cast<U>(v) ^ (U(1) << (sizeof(T) * 8 - 1)));
  } else {
    return static_cast<unsigned long long>(v);
  }
}

/// keys[r * n + j] = the key of x at row r = (o, i), position j; pos[r * n + j] = r * n + j.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sort_keys_kernel(const T* __restrict__ x, std::int64_t n, std::int64_t inner, std::int64_t count, bool descending,
                     unsigned long long* __restrict__ keys, std::int64_t* __restrict__ pos) {
  EMBER_SORT_LOOP(t, count) {
    const std::int64_t r = t / n, j = t % n, o = r / inner, i = r % inner;
    const unsigned long long k = sort_key(x[(o * n + j) * inner + i]);
    keys[t] = descending ? (key_bits_of<T> == 64 ? ~k : (~k & 0xffffffffull)) : k;
    pos[t] = t;
  }
}

/// rows[t] = the row of the element at sorted position t.
// (The kernels that are not templates are static: defined in a header, each translation unit keeps its own copy.)
static __global__ void __launch_bounds__(kThreads)
    row_of_kernel(const std::int64_t* __restrict__ pos, std::int64_t n, std::int64_t count,
                  std::int64_t* __restrict__ rows) {
  EMBER_SORT_LOOP(t, count) rows[t] = pos[t] / n;
}

/// out[(o * k + j) * inner + i] = the position along the dim of the j-th element of row (o, i), for j < k.
static __global__ void __launch_bounds__(kThreads)
    take_first_kernel(const std::int64_t* __restrict__ pos, std::int64_t n, std::int64_t inner, std::int64_t k,
                      std::int64_t rows, std::int64_t* __restrict__ out) {
  EMBER_SORT_LOOP(t, rows * k) {
    const std::int64_t r = t / k, j = t % k, o = r / inner, i = r % inner;
    out[(o * k + j) * inner + i] = pos[r * n + j] % n;
  }
}

template <class T>
using scan_acc_t = std::conditional_t<is_floating_v<T>, double, std::int64_t>;

/// One thread per row (o, i): y = the running sum (prod: product) of x along the dim, in scan_acc_t<T>.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cumulative_kernel(const T* __restrict__ x, T* __restrict__ y, std::int64_t outer, std::int64_t n,
                      std::int64_t inner, bool prod) {
  using Acc = scan_acc_t<T>;
  EMBER_SORT_LOOP(r, outer * inner) {
    const std::int64_t base = (r / inner) * n * inner + r % inner;
    Acc acc = prod ? Acc(1) : Acc(0);
    for (std::int64_t j = 0; j < n; ++j) {
      const Acc v = convert<Acc>(x[base + j * inner]);
      acc = prod ? Acc(acc * v) : Acc(acc + v);
      y[base + j * inner] = convert<T>(acc);
    }
  }
}

/// One thread per row: the gradient of cumsum (a reversed running sum of g) or of cumprod (from its input x and
/// output y; the CPU's closed form around the first zero), in double.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cumulative_backward_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ y,
                               T* __restrict__ gx, std::int64_t outer, std::int64_t n, std::int64_t inner,
                               bool prod) {
  EMBER_SORT_LOOP(r, outer * inner) {
    const std::int64_t base = (r / inner) * n * inner + r % inner;
    auto at = [&](std::int64_t j) { return base + j * inner; };
    auto d = [](T v) { return convert<double>(v); };
    if (!prod) {
      double acc = 0;
      for (std::int64_t j = n - 1; j >= 0; --j) gx[at(j)] = convert<T>(acc += d(g[at(j)]));
      continue;
    }
    std::int64_t z = n;
    for (std::int64_t j = 0; j < n; ++j)
      if (d(x[at(j)]) == 0) {
        z = j;
        break;
      }
    double acc = 0;
    for (std::int64_t k = n - 1; k >= 0; --k) {
      if (k > z) {
        gx[at(k)] = convert<T>(0.0);
      } else if (k == z) {
        double q = z > 0 ? d(y[at(z - 1)]) : 1.0, sum = 0;
        for (std::int64_t j = z; j < n; ++j) {
          if (j > z) q *= d(x[at(j)]);
          sum += d(g[at(j)]) * q;
        }
        gx[at(k)] = convert<T>(sum);
      } else {
        acc += d(g[at(k)]) * d(y[at(k)]);
        gx[at(k)] = convert<T>(acc / d(x[at(k)]));
      }
    }
  }
}

/// One thread per row of multinomial's contiguous (rows, k) weights p: the CPU's draws (cpu::multinomial), the same
/// operations in double in the same order, from the same Philox blocks (draw i = row * ns + s: half i % 2 of block
/// base + i / 2), so a seed gives the same samples on both devices. w (rows, 2k doubles) is scratch: the weights and
/// their running sum. A row the CPU would refuse (cpu::multinomial_row_weights) sets *bad and draws nothing.
template <class T>
__global__ void __launch_bounds__(kThreads)
    multinomial_kernel(const T* __restrict__ p, std::int64_t rows, std::int64_t k, std::int64_t ns, bool replacement,
                       std::uint64_t seed, std::uint64_t base, double* __restrict__ scratch,
                       std::int64_t* __restrict__ out, int* __restrict__ bad) {
  EMBER_SORT_LOOP(row, rows) {
    double* w = scratch + row * 2 * k;
    double* cdf = w + k;
    std::int64_t nonzero = 0;
    bool ok = true;
    for (std::int64_t j = 0; j < k; ++j) {
      const double v = convert<double>(p[row * k + j]);
      ok = ok && ::isfinite(v) && v >= 0;
      w[j] = v;
      nonzero += v > 0;
    }
    if (!ok || nonzero == 0 || (!replacement && ns > nonzero)) {
      *bad = 1;
      continue;
    }
    auto uniform = [&](std::int64_t s) {
      const std::uint64_t i = std::uint64_t(row) * std::uint64_t(ns) + std::uint64_t(s);
      std::uint32_t b[4];
      Generator::block(seed, base + i / 2, b);
      return (i % 2) ? Generator::to_unit_double(b[2], b[3]) : Generator::to_unit_double(b[0], b[1]);
    };
    std::int64_t* o = out + row * ns;
    if (replacement) {
      double acc = 0;
      for (std::int64_t j = 0; j < k; ++j) cdf[j] = acc += w[j];
      for (std::int64_t s = 0; s < ns; ++s) {
        const double u = uniform(s) * acc;
        std::int64_t lo = 0, hi = k;  // the first j with cdf[j] > u (std::upper_bound)
        while (lo < hi) {
          const std::int64_t mid = lo + (hi - lo) / 2;
          if (cdf[mid] <= u) lo = mid + 1;
          else hi = mid;
        }
        std::int64_t j = lo < k - 1 ? lo : k - 1;
        while (w[j] == 0) --j;  // rounding at the top end: the last category with weight
        o[s] = j;
      }
    } else {
      for (std::int64_t s = 0; s < ns; ++s) {
        double total = 0;
        for (std::int64_t j = 0; j < k; ++j) total += w[j];
        const double u = uniform(s) * total;
        double acc = 0;
        std::int64_t pick = -1;
        for (std::int64_t j = 0; j < k; ++j) {
          if (w[j] == 0) continue;
          pick = j;
          acc += w[j];
          if (u < acc) break;
        }
        o[s] = pick;
        w[pick] = 0;
      }
    }
  }
}

inline int bits_for(std::int64_t bound) {
  int b = 1;
  while (b < 63 && (std::int64_t(1) << b) < bound) ++b;
  return b;
}

inline constexpr int kTile = 256;        // consecutive elements one thread counts and places
inline constexpr int kDigitBits = 4, kDigits = 1 << kDigitBits;
inline constexpr int kScanThreads = 1024;

/// counts[d * ntiles + t] = how many keys of tile t have digit d at `shift`.
static __global__ void __launch_bounds__(kThreads)
    digit_count_kernel(const unsigned long long* __restrict__ keys, std::int64_t count, int shift, std::int64_t ntiles,
                       std::int64_t* __restrict__ counts) {
  EMBER_SORT_LOOP(t, ntiles) {
    std::int64_t c[kDigits] = {};
    const std::int64_t e = t * kTile + kTile < count ? t * kTile + kTile : count;
    for (std::int64_t i = t * kTile; i < e; ++i) ++c[(keys[i] >> shift) & (kDigits - 1)];
    for (int d = 0; d < kDigits; ++d) counts[d * ntiles + t] = c[d];
  }
}

/// The exclusive prefix sum of a[0, n) in place, by one block: each thread sums a contiguous chunk, thread 0 scans
/// the chunks' sums in order, each thread then writes its chunk's prefixes.
static __global__ void __launch_bounds__(kScanThreads) exclusive_scan_kernel(std::int64_t* __restrict__ a, std::int64_t n) {
  __shared__ std::int64_t part[kScanThreads];
  const std::int64_t chunk = (n + kScanThreads - 1) / kScanThreads;
  const std::int64_t b = threadIdx.x * chunk, e = b + chunk < n ? b + chunk : n;
  std::int64_t sum = 0;
  for (std::int64_t i = b; i < e; ++i) sum += a[i];
  part[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::int64_t run = 0;
    for (int k = 0; k < kScanThreads; ++k) {
      const std::int64_t v = part[k];
      part[k] = run;
      run += v;
    }
  }
  __syncthreads();
  std::int64_t run = part[threadIdx.x];
  for (std::int64_t i = b; i < e; ++i) {
    const std::int64_t v = a[i];
    a[i] = run;
    run += v;
  }
}

/// Places tile t's (key, value) pairs, in order, at the offsets the scanned counts give their digits.
static __global__ void __launch_bounds__(kThreads)
    digit_place_kernel(const unsigned long long* __restrict__ keys, const std::int64_t* __restrict__ vals,
                       std::int64_t count, int shift, std::int64_t ntiles, const std::int64_t* __restrict__ offsets,
                       unsigned long long* __restrict__ keys_out, std::int64_t* __restrict__ vals_out) {
  EMBER_SORT_LOOP(t, ntiles) {
    std::int64_t at[kDigits];
    for (int d = 0; d < kDigits; ++d) at[d] = offsets[d * ntiles + t];
    const std::int64_t e = t * kTile + kTile < count ? t * kTile + kTile : count;
    for (std::int64_t i = t * kTile; i < e; ++i) {
      const std::int64_t o = at[(keys[i] >> shift) & (kDigits - 1)]++;
      keys_out[o] = keys[i];
      vals_out[o] = vals[i];
    }
  }
}

}  // namespace sort_detail

/// Sorts `count` (key, value) pairs by the keys' low `bits` bits, stably (equal keys keep their order); keys hold
/// unsigned 64-bit keys in int64 storage. The sorted pairs replace the inputs. On dev's stream s.
inline void stable_radix_sort_pairs(Tensor<std::int64_t>& keys, Tensor<std::int64_t>& vals, std::int64_t count,
                                    int bits, Device dev, cudaStream_t s) {
  using namespace sort_detail;
  if (count <= 1) return;
  const std::int64_t ntiles = (count + kTile - 1) / kTile;
  Tensor<std::int64_t> ko = empty<std::int64_t>(Shape{count}, dev), vo = empty<std::int64_t>(Shape{count}, dev);
  Tensor<std::int64_t> counts = empty<std::int64_t>(Shape{kDigits * ntiles}, dev);
  for (int shift = 0; shift < bits; shift += kDigitBits) {
    auto* ki = reinterpret_cast<const unsigned long long*>(keys.data());
    digit_count_kernel<<<grid_for(ntiles), kThreads, 0, s>>>(ki, count, shift, ntiles, counts.data());
    EMBER_CUDA_CHECK(cudaGetLastError());
    exclusive_scan_kernel<<<1, kScanThreads, 0, s>>>(counts.data(), kDigits * ntiles);
    EMBER_CUDA_CHECK(cudaGetLastError());
    digit_place_kernel<<<grid_for(ntiles), kThreads, 0, s>>>(ki, vals.data(), count, shift, ntiles, counts.data(),
                                                             reinterpret_cast<unsigned long long*>(ko.data()),
                                                             vo.data());
    EMBER_CUDA_CHECK(cudaGetLastError());
    std::swap(keys, ko);
    std::swap(vals, vo);
  }
}

/// The first k positions along the dim of each row of x (contiguous (outer, n, inner)) in sorted order, stable,
/// NaN above every number, into out (contiguous (outer, k, inner)), on device dev's current stream.
template <class T>
void sort_indices(const T* x, std::int64_t outer, std::int64_t n, std::int64_t inner, std::int64_t k, bool descending,
                  std::int64_t* out, int dev) {
  using namespace sort_detail;
  const std::int64_t rows = outer * inner, count = rows * n;
  if (rows * k == 0) return;
  const Device d = Device::cuda(dev);
  const cudaStream_t s = current_stream(dev).handle();
  Tensor<std::int64_t> keys = empty<std::int64_t>(Shape{count}, d), pos = empty<std::int64_t>(Shape{count}, d);
  sort_keys_kernel<T><<<grid_for(count), kThreads, 0, s>>>(x, n, inner, count, descending,
                                                           reinterpret_cast<unsigned long long*>(keys.data()),
                                                           pos.data());
  EMBER_CUDA_CHECK(cudaGetLastError());
  stable_radix_sort_pairs(keys, pos, count, key_bits_of<T>, d, s);  // by value
  if (rows > 1) {
    Tensor<std::int64_t> row = empty<std::int64_t>(Shape{count}, d);
    row_of_kernel<<<grid_for(count), kThreads, 0, s>>>(pos.data(), n, count, row.data());
    EMBER_CUDA_CHECK(cudaGetLastError());
    stable_radix_sort_pairs(row, pos, count, bits_for(rows), d, s);  // by row, keeping the value order within each
  }
  take_first_kernel<<<grid_for(rows * k), kThreads, 0, s>>>(pos.data(), n, inner, k, rows, out);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// y = the running sum (prod: product) of x along the dim (both contiguous (outer, n, inner)).
template <class T>
void cumulative(const T* x, T* y, std::int64_t outer, std::int64_t n, std::int64_t inner, bool prod, int dev) {
  using namespace sort_detail;
  if (outer * n * inner == 0) return;
  const cudaStream_t s = current_stream(dev).handle();
  cumulative_kernel<T><<<grid_for(outer * inner), kThreads, 0, s>>>(x, y, outer, n, inner, prod);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// gx = the gradient of cumsum (prod: cumprod, from its input x and output y) for g; all contiguous
/// (outer, n, inner).
template <class T>
void cumulative_backward(const T* g, const T* x, const T* y, T* gx, std::int64_t outer, std::int64_t n,
                         std::int64_t inner, bool prod, int dev) {
  using namespace sort_detail;
  if (outer * n * inner == 0) return;
  const cudaStream_t s = current_stream(dev).handle();
  cumulative_backward_kernel<T><<<grid_for(outer * inner), kThreads, 0, s>>>(g, x, y, gx, outer, n, inner, prod);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// multinomial's draws for the contiguous (rows, k) weights p into out (rows, ns), from the Philox blocks reserved at
/// `base` of the generator with `seed`, on device dev's current stream. Returns false when a row's weights are bad
/// (the caller reports which, as the CPU does); waits for the kernel to learn that.
template <class T>
bool multinomial(const T* p, std::int64_t rows, std::int64_t k, std::int64_t ns, bool replacement, std::uint64_t seed,
                 std::uint64_t base, std::int64_t* out, int dev) {
  using namespace sort_detail;
  const Device d = Device::cuda(dev);
  const cudaStream_t s = current_stream(dev).handle();
  Tensor<double> scratch = empty<double>(Shape{rows, 2 * k}, d);
  Tensor<std::int32_t> bad = empty<std::int32_t>(Shape{1}, d);
  EMBER_CUDA_CHECK(cudaMemsetAsync(bad.data(), 0, sizeof(std::int32_t), s));
  multinomial_kernel<T><<<grid_for(rows), kThreads, 0, s>>>(p, rows, k, ns, replacement, seed, base, scratch.data(),
                                                             out, bad.data());
  EMBER_CUDA_CHECK(cudaGetLastError());
  return bad.to(Device::cpu()).data()[0] == 0;
}

#undef EMBER_SORT_LOOP

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
