// ember — GEMM epilogues: an activation (and a bias) applied to a block of a GEMM's output right after the GEMM
// wrote it, while the block is still in cache, instead of a separate element-wise pass over the whole tensor.
// The math is the element-wise table's (expr/functors.hpp), in the same precision as the fused executor's
// (16-bit values are computed in fp32 and rounded once), so a fused result equals the unfused one bit for bit.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/activation.hpp"
#include "ember/expr/functors.hpp"

namespace ember::cpu {

/// The activation vocabulary was cpu::Act: it is ember::Activation now (expr/activation.hpp), the one for every
/// device and epilogue.
using Act [[deprecated("cpu::Act is ember::Activation (expr/activation.hpp)")]] = Activation;
[[deprecated("cpu::act_name is ember::activation_name")]] inline const char* act_name(Activation a) {
  return activation_name(a);
}

namespace detail {
template <class T, class F>
EMBER_VECTORIZE void act_run(T* EMBER_RESTRICT y, std::int64_t n, const T* bias_row, T bias, F f) {
  using C = std::conditional_t<sizeof(T) == 2, float, T>;
  if (bias_row) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = T(f(C(y[i]) + C(bias_row[i])));
  } else {
    const C b = C(bias);
    for (std::int64_t i = 0; i < n; ++i) y[i] = T(f(C(y[i]) + b));
  }
}
template <class T, class F>
EMBER_VECTORIZE void act_run_nobias(T* EMBER_RESTRICT y, std::int64_t n, F f) {
  using C = std::conditional_t<sizeof(T) == 2, float, T>;
  for (std::int64_t i = 0; i < n; ++i) y[i] = T(f(C(y[i])));
}
// GELU (erf and tanh forms) and SiLU, the activations whose math is heavy, are reached through a table of loops
// rather than named by every caller: a layer's activation is read at run time (nn::fuse_conv_bn moves one into
// it), and naming all of them would compile their loops into every program that has a layer, fused or not. What
// can give a layer one of these (the fold of nn::fuse_conv_bn, quant's layers, ops::linear and ops::conv2d called
// with an activation) fills the table first with enable_act_epilogues<T>().
template <class T>
struct HeavyActs {
  using WithBias = void (*)(T*, std::int64_t, const T*, T);
  using NoBias = void (*)(T*, std::int64_t);
  std::atomic<WithBias> bias[3] = {};
  std::atomic<NoBias> nobias[3] = {};
};
template <class T>
inline HeavyActs<T> heavy_acts;

template <class T, class F>
void heavy_bias(T* y, std::int64_t n, const T* bias_row, T bias) {
  act_run(y, n, bias_row, bias, F{});
}
template <class T, class F>
void heavy_nobias(T* y, std::int64_t n) {
  act_run_nobias(y, n, F{});
}
// The loop of heavy activation a (slot gelu 0, gelu_tanh 1, silu 2) in one column of the table, read once per call;
// an error naming a and the dtype when it was never enabled (or a is not one of them).
template <class Fn>
Fn heavy_fn(const std::atomic<Fn> (&slots)[3], Activation a, const char* dtype) {
  const int k = int(a) - int(Activation::gelu);
  EMBER_CHECK(k >= 0 && k < 3, "cpu epilogue: unknown activation ", int(a));
  const Fn f = slots[k].load(std::memory_order_acquire);
  EMBER_CHECK(f != nullptr, "cpu epilogue: the ", activation_name(a), " epilogue for ", dtype,
              " was never enabled (cpu::enable_act_epilogues<", dtype,
              ">() comes first: nn::fuse_conv_bn, quant's layers, ops::linear and ops::conv2d call it)");
  return f;
}
template <class T>
typename HeavyActs<T>::WithBias heavy_bias_fn(Activation a) {
  return heavy_fn(heavy_acts<T>.bias, a, dtype_name<T>());
}
template <class T>
typename HeavyActs<T>::NoBias heavy_nobias_fn(Activation a) {
  return heavy_fn(heavy_acts<T>.nobias, a, dtype_name<T>());
}
}  // namespace detail

/// True for the activations enable_act_epilogues provides (GELU, GELU-tanh, SiLU).
inline bool is_heavy_act(Activation a) {
  return a == Activation::gelu || a == Activation::gelu_tanh || a == Activation::silu;
}

/// Puts dtype T's GELU, GELU-tanh and SiLU loops in the table the epilogues below read them from (see HeavyActs
/// above), each with its row of the element-wise table (visit_activation); idempotent and thread-safe. ReLU's loop
/// needs no enabling.
template <class T>
void enable_act_epilogues() {
  auto& t = detail::heavy_acts<T>;
  for (const Activation a : {Activation::gelu, Activation::gelu_tanh, Activation::silu})
    visit_activation(a, [&](auto op) {
      using F = decltype(op);
      if constexpr (!std::is_same_v<F, ops_table::Identity> && !std::is_same_v<F, ops_table::Relu>) {
        const int k = int(a) - int(Activation::gelu);
        t.bias[k].store(&detail::heavy_bias<T, F>, std::memory_order_release);
        t.nobias[k].store(&detail::heavy_nobias<T, F>, std::memory_order_release);
      }
    });
}

/// y[0, n) = act(y) in place.
template <class T>
void act_(T* y, std::int64_t n, Activation a) {
  if (a == Activation::none || n <= 0) return;
  if (a == Activation::relu) detail::act_run_nobias(y, n, ops_table::Relu{});
  else detail::heavy_nobias_fn<T>(a)(y, n);
}

/// y[0, n) = act(y + bias) in place, one bias for the whole run (a channel of a convolution's output).
template <class T>
void bias_act_(T* y, std::int64_t n, T bias, Activation a) {
  if (n <= 0) return;
  if (a == Activation::none) {
    detail::act_run(y, n, static_cast<const T*>(nullptr), bias, [](auto v) { return v; });
    return;
  }
  if (a == Activation::relu) detail::act_run(y, n, static_cast<const T*>(nullptr), bias, ops_table::Relu{});
  else detail::heavy_bias_fn<T>(a)(y, n, nullptr, bias);
}

/// Rows of y (rows x n, leading dim ld): y[r, j] = act(y[r, j] + bias[j]) (a bias per column, as linear's), or
/// act(y) without a bias (bias null).
template <class T>
void bias_act_rows_(T* y, std::int64_t rows, std::int64_t n, std::int64_t ld, const T* bias, Activation a) {
  if (n <= 0) return;
  if (a == Activation::none) {
    if (!bias) return;
    for (std::int64_t r = 0; r < rows; ++r)
      detail::act_run(y + r * ld, n, bias, T(0), [](auto v) { return v; });
    return;
  }
  if (a == Activation::relu) {
    for (std::int64_t r = 0; r < rows; ++r) {
      if (bias) detail::act_run(y + r * ld, n, bias, T(0), ops_table::Relu{});
      else detail::act_run_nobias(y + r * ld, n, ops_table::Relu{});
    }
  } else if (bias) {
    const auto f = detail::heavy_bias_fn<T>(a);
    for (std::int64_t r = 0; r < rows; ++r) f(y + r * ld, n, bias, T(0));
  } else {
    const auto f = detail::heavy_nobias_fn<T>(a);
    for (std::int64_t r = 0; r < rows; ++r) f(y + r * ld, n);
  }
}

/// What linear's backward sums a bias gradient in: double for float and double, fp32 for 16-bit types.
template <class T>
using bias_grad_acc_t = std::conditional_t<sizeof(T) == 2, float, double>;

namespace detail {
// gz[i] = g[i] * f'(s[i]) (in fp32 for 16-bit types, rounded once as the element-wise executor does), and
// acc[i] += gz[i] when Sum.
template <bool Sum, class T, class A, class F>
EMBER_VECTORIZE void act_grad_run(const T* EMBER_RESTRICT g, const T* EMBER_RESTRICT s, T* EMBER_RESTRICT gz,
                                  A* EMBER_RESTRICT acc, std::int64_t n, F f) {
  using C = std::conditional_t<sizeof(T) == 2, float, T>;
  // (No named T temporary: GCC does not vectorise the copy of a named bfloat16/half into gz, so the value is
  // rounded where it is stored and again, to the same bits, for the sum.)
  for (std::int64_t i = 0; i < n; ++i) {
    const C c = C(g[i]) * C(f.d(C(s[i])));
    gz[i] = T(c);
    if constexpr (Sum) acc[i] += A(T(c));
  }
}
template <class T, class A>
EMBER_VECTORIZE void sum_run(const T* EMBER_RESTRICT g, A* EMBER_RESTRICT acc, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) acc[i] += A(g[i]);
}
}  // namespace detail

/// The backward epilogue of linear (rows x n, row-major, g and s with leading dim n): gz = g * act'(s), where s is
/// what the activation's derivative reads (the layer's output for ReLU), and db[j] = sum over rows of gz[r, j]
/// when db is not null (db holds n values; it is overwritten). With Activation::none gz is g itself and is not written.
/// act is none or relu: those are the activations linear fuses in training (GELU's and SiLU's derivatives read
/// the pre-activation, which the fused forward does not keep), so only ReLU's derivative is compiled here.
/// Threads take blocks of columns, so each column's sum runs down the rows in order on one thread: the result
/// does not depend on the thread count.
template <class T>
void linear_act_grad(const T* g, const T* s, T* gz, std::int64_t rows, std::int64_t n, Activation a,
                     bias_grad_acc_t<T>* db) {
  using A = bias_grad_acc_t<T>;
  EMBER_CHECK(a == Activation::none || a == Activation::relu, "linear_act_grad: activation ", activation_name(a),
              " is not fused in training (only none and relu are)");
  if (n <= 0) return;
  if (db)
    for (std::int64_t j = 0; j < n; ++j) db[j] = A(0);
  if (a == Activation::none && !db) return;
  // Blocks of whole 16-column groups with at least ~32k elements each.
  const std::int64_t per = (std::int64_t(1) << 15) / std::max<std::int64_t>(rows, 1);
  const std::int64_t grain = std::max<std::int64_t>(16, (per + 15) / 16 * 16);
  parallel_for(0, n, grain, [&](std::int64_t j0, std::int64_t j1) {
    const std::int64_t w = j1 - j0;
    if (a == Activation::none) {
      for (std::int64_t r = 0; r < rows; ++r) detail::sum_run(g + r * n + j0, db + j0, w);
      return;
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t o = r * n + j0;
      if (db) detail::act_grad_run<true>(g + o, s + o, gz + o, db + j0, w, ops_table::Relu{});
      else detail::act_grad_run<false>(g + o, s + o, gz + o, static_cast<A*>(nullptr), w, ops_table::Relu{});
    }
  });
}

/// out[j] = T(db[j]) for n values: linear_act_grad's bias sums rounded into the bias's dtype.
template <class T>
void round_bias_grad(const bias_grad_acc_t<T>* db, std::int64_t n, T* out) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = T(db[j]);
}

}  // namespace ember::cpu
