// ember — the convolution algorithm cache: which cuDNN algorithm to run for a problem, chosen once per problem
// (by timing the candidates in benchmark mode, by cuDNN's heuristics otherwise) and looked up on every later call.
// Host-only logic (no CUDA call), so a test without a device can check that different problems get different
// keys and equal problems hit the cache.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "ember/core/device.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/window.hpp"

namespace ember::cuda {

/// The three convolution passes; each has its own algorithm family in cuDNN.
enum class ConvPass : std::int64_t { forward = 0, backward_data = 1, backward_filter = 2 };

/// Everything that can change cuDNN's choice of algorithm: the pass, the device, the data and compute types, the
/// shapes and strides of input, weight and output, the window (padding/stride/dilation; the kernel extent is the
/// weight's shape) and groups, the math mode (TF32 allowed) and the memory layout.
struct ConvProblem {
  ConvPass pass = ConvPass::forward;
  Device device = Device::cuda(0);
  int dtype = 0;          // cudnnDataType_t of the tensors
  int compute_dtype = 0;  // cudnnDataType_t of the arithmetic
  Shape x_shape, x_strides, w_shape, y_shape, y_strides;  // (N, C, H, W), (O, C/groups, kh, kw), (N, O, oh, ow)
  Window2d window;
  std::int64_t groups = 1;
  bool allow_tf32 = false;
  int layout = 0;  // 0 = NCHW
};

/// A ConvProblem flattened into a fixed array of integers: compared element by element, hashed with FNV-1a.
struct ConvKey {
  static constexpr int kLen = 8 + 5 * 4 + 7 + 2;
  std::array<std::int64_t, kLen> v{};
  friend bool operator==(const ConvKey& a, const ConvKey& b) { return a.v == b.v; }
  friend bool operator!=(const ConvKey& a, const ConvKey& b) { return !(a == b); }
};

struct ConvKeyHash {
  std::size_t operator()(const ConvKey& k) const noexcept {
    std::uint64_t h = 1469598103934665603ull;
    for (std::int64_t x : k.v) {
      auto u = static_cast<std::uint64_t>(x);
      for (int i = 0; i < 8; ++i) {
        h ^= (u >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
      }
    }
    return static_cast<std::size_t>(h);
  }
};

/// The key of a problem. Shapes of up to 4 dims (conv2d's); a missing dim counts as -1 so (2, 3) and (2, 3, 1)
/// differ.
inline ConvKey make_conv_key(const ConvProblem& p) {
  ConvKey k;
  std::size_t i = 0;
  auto put = [&](std::int64_t x) { k.v[i++] = x; };
  put(std::int64_t(p.pass));
  put(std::int64_t(p.device.type));
  put(p.device.index);
  put(p.dtype);
  put(p.compute_dtype);
  put(p.allow_tf32 ? 1 : 0);
  put(p.layout);
  put(p.groups);
  for (const Shape* s : {&p.x_shape, &p.x_strides, &p.w_shape, &p.y_shape, &p.y_strides})
    for (int d = 0; d < 4; ++d) put(d < s->n ? (*s)[d] : -1);
  put(p.window.ph);
  put(p.window.pw);
  put(p.window.sh);
  put(p.window.sw);
  put(p.window.dh);
  put(p.window.dw);
  put(std::int64_t(p.x_shape.n));
  put(std::int64_t(p.w_shape.n));
  put(std::int64_t(p.y_shape.n));
  return k;
}

/// The algorithm chosen for one problem: cuDNN's algorithm enum, the math type it runs with and the workspace it
/// needs in bytes.
struct ConvAlgo {
  int algo = 0;
  int math_type = 0;
  std::size_t workspace = 0;
};

/// A thread-safe map from problem keys to chosen algorithms.
class ConvAlgoCache {
 public:
  std::optional<ConvAlgo> find(const ConvKey& k) const {
    std::lock_guard<std::mutex> lock(m_);
    auto it = map_.find(k);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void insert(const ConvKey& k, const ConvAlgo& a) {
    std::lock_guard<std::mutex> lock(m_);
    map_[k] = a;
  }
  /// The cached algorithm of `k`, or choose() (called without the lock held, so it may run cuDNN) stored and
  /// returned. Two threads racing on a new problem may both choose; the first stored answer wins.
  template <class Choose>
  ConvAlgo get_or_choose(const ConvKey& k, Choose&& choose) {
    if (auto a = find(k)) return *a;
    ConvAlgo a = choose();
    std::lock_guard<std::mutex> lock(m_);
    return map_.emplace(k, a).first->second;
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(m_);
    return map_.size();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(m_);
    map_.clear();
  }

 private:
  mutable std::mutex m_;
  std::unordered_map<ConvKey, ConvAlgo, ConvKeyHash> map_;
};

/// The process-wide caches: one filled by timing (benchmark mode), one by cuDNN's heuristics.
inline ConvAlgoCache& conv_algo_cache(bool benchmark) {
  static ConvAlgoCache timed, heuristic;
  return benchmark ? timed : heuristic;
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
