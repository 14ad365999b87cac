// ember — the table of element-wise ops. Each row is one functor: its forward math and, beside it, its
// derivative(s). `d(x)` is the derivative of a unary op at x; `da(a, b)` / `db(a, b)` the partials of a binary
// op. Everything is EMBER_HOST_DEVICE: the same rows run in the CPU loop and the CUDA kernel.
// Ops without a gradient (comparisons, logic, sign) say so with `differentiable = false`.
#pragma once

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/expr/detail/fastmath.hpp"

namespace ember::ops_table {

namespace fm = ::ember::detail::fm;

template <class X>
EMBER_HOST_DEVICE EMBER_INLINE X sel(bool c, X a, X b) {
  return c ? a : b;
}
template <class X>
EMBER_HOST_DEVICE EMBER_INLINE X cube(X x) {
  return x * x * x;
}
/// a * b; for bool the logical and (as PyTorch's bool * bool), written so, not as an int product turned to bool.
template <class X>
EMBER_HOST_DEVICE EMBER_INLINE X mul(X a, X b) {
  if constexpr (std::is_same_v<X, bool>) return a && b;
  else return a * b;
}
/// a + b; for bool the logical or (as PyTorch's bool + bool).
template <class X>
EMBER_HOST_DEVICE EMBER_INLINE X add(X a, X b) {
  if constexpr (std::is_same_v<X, bool>) return a || b;
  else return a + b;
}

// Integral types go through float-free paths where it matters; transcendental ops are for floating types.
#define EMBER_UNARY(NAME, FWD, DERIV)                                        \
  struct NAME {                                                              \
    /** The op's name, in errors and profiles. */                            \
    static constexpr const char* name = #NAME;                               \
    /** Autograd differentiates through the op, with d(). */                 \
    static constexpr bool differentiable = true;                            \
    /** The op at x. */                                                      \
    template <class X>                                                       \
    EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {                 \
      return FWD;                                                            \
    }                                                                        \
    /** The derivative at x. */                                              \
    template <class X>                                                       \
    EMBER_HOST_DEVICE EMBER_INLINE X d(X x) const {                          \
      (void)x;                                                               \
      return DERIV;                                                          \
    }                                                                        \
  };

//          name      forward                                  derivative
/// x itself; derivative 1.
EMBER_UNARY(Identity, x,                                       X(1))
/// -x (torch.neg); derivative -1.
EMBER_UNARY(Neg,      -x,                                      X(-1))
/// |x| (torch.abs); derivative sign(x), 0 at 0.
EMBER_UNARY(Abs,      sel(x < X(0), X(-x), x),                 X(sel(x > X(0), X(1), sel(x < X(0), X(-1), X(0)))))
/// e^x (torch.exp).
EMBER_UNARY(Exp,      fm::exp(x),                              fm::exp(x))
/// e^x - 1, accurate near 0 (torch.expm1).
EMBER_UNARY(Expm1,    fm::expm1(x),                            fm::exp(x))
/// The natural logarithm (torch.log); derivative 1 / x.
EMBER_UNARY(Log,      fm::log(x),                              X(1) / x)
/// log(1 + x), accurate near 0 (torch.log1p).
EMBER_UNARY(Log1p,    fm::log1p(x),                            X(1) / (X(1) + x))
/// The square root (torch.sqrt).
EMBER_UNARY(Sqrt,     std::sqrt(x),                            X(0.5) / std::sqrt(x))
// Rsqrt's derivative is -r^3/2 with r = rsqrt(x), as PyTorch: at -0, r = -inf and the derivative is +inf.
/// 1 / sqrt(x) (torch.rsqrt).
EMBER_UNARY(Rsqrt,    X(1) / std::sqrt(x),                     X(-0.5) * cube(X(1) / std::sqrt(x)))
/// x * x (torch.square).
EMBER_UNARY(Square,   x * x,                                   X(2) * x)
/// sin(x) (torch.sin).
EMBER_UNARY(Sin,      std::sin(x),                             std::cos(x))
/// cos(x) (torch.cos).
EMBER_UNARY(Cos,      std::cos(x),                             -std::sin(x))
/// tanh(x) (torch.tanh); derivative 1 - tanh(x)^2.
EMBER_UNARY(Tanh,     fm::tanh(x),                             X(1) - fm::tanh(x) * fm::tanh(x))
/// 1 / (1 + e^-x) (torch.sigmoid); derivative s (1 - s).
EMBER_UNARY(Sigmoid,  fm::sigmoid(x),                          fm::sigmoid(x) * (X(1) - fm::sigmoid(x)))
// ReLU lets NaN through (as PyTorch's, which is clamp_min(x, 0)): sel(x < 0, 0, x), not sel(x > 0, x, 0). Its
// gradient is masked where x <= 0 only (PyTorch's threshold_backward), so at NaN the gradient passes.
/// max(x, 0) (torch.relu), NaN passing through.
EMBER_UNARY(Relu,     sel(x < X(0), X(0), x),                  sel(x <= X(0), X(0), X(1)))
// SiLU: x * sigmoid(x); derivative s * (1 + x * (1 - s)).
/// x * sigmoid(x) (torch.nn.functional.silu).
EMBER_UNARY(Silu,     x * fm::sigmoid(x),                      fm::sigmoid(x) * (X(1) + x * (X(1) - fm::sigmoid(x))))
// Softplus (beta 1, threshold 20 as in PyTorch): log1p(exp(x)), linear above the threshold.
/// log(1 + e^x), x itself above 20 (torch.nn.functional.softplus, beta 1, threshold 20).
EMBER_UNARY(Softplus, sel(x > X(20), x, fm::log1p(fm::exp(x))), sel(x > X(20), X(1), fm::sigmoid(x)))
// GELU, erf form: x * Phi(x); derivative Phi(x) + x * phi(x).
/// x * Phi(x), Phi the normal CDF (torch.nn.functional.gelu, approximate="none").
EMBER_UNARY(Gelu,     X(0.5) * x * (X(1) + fm::erf(x * X(0.70710678118654752))),
                      X(0.5) * (X(1) + fm::erf(x * X(0.70710678118654752))) +
                          x * X(0.39894228040143268) * fm::exp(X(-0.5) * x * x))
// GELU, tanh approximation: 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi).
/// GELU's tanh approximation (torch.nn.functional.gelu, approximate="tanh").
EMBER_UNARY(GeluTanh, X(0.5) * x * (X(1) + fm::tanh(X(0.79788456080286536) * (x + X(0.044715) * x * x * x))),
                      X(0.5) * (X(1) + fm::tanh(X(0.79788456080286536) * (x + X(0.044715) * x * x * x))) +
                          X(0.5) * x *
                              (X(1) - fm::tanh(X(0.79788456080286536) * (x + X(0.044715) * x * x * x)) *
                                          fm::tanh(X(0.79788456080286536) * (x + X(0.044715) * x * x * x))) *
                              X(0.79788456080286536) * (X(1) + X(3 * 0.044715) * x * x))
#undef EMBER_UNARY

/// sign(x) in {-1, 0, 1} (NaN stays NaN); no gradient.
struct Sign {
  static constexpr const char* name = "sign";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = false;  ///< The op has no gradient.
  /// The op at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {
    return sel(x > X(0), X(1), sel(x < X(0), X(-1), x));  // keeps 0 and NaN
  }
  /// The derivative at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X d(X) const {
    return X(0);
  }
};

/// x for x > 0, slope * x otherwise (torch.nn.functional.leaky_relu). Ops with a parameter carry it as a member
/// (it travels into the kernel with the expression).
struct LeakyRelu {
  static constexpr const char* name = "leaky_relu";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = true;  ///< Autograd differentiates through the op, with d().
  double slope = 0.01;  ///< The slope for x < 0 (negative_slope in torch.nn.functional.leaky_relu).
  /// The op at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {
    return sel(x > X(0), x, X(slope) * x);
  }
  /// The derivative at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X d(X x) const {
    return sel(x > X(0), X(1), X(slope));
  }
};

/// x for x > 0, alpha (e^x - 1) otherwise (torch.nn.functional.elu).
struct Elu {
  static constexpr const char* name = "elu";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = true;  ///< Autograd differentiates through the op, with d().
  double alpha = 1.0;  ///< The scale of the exponential branch, x <= 0 (torch.nn.functional.elu's alpha).
  /// The op at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {
    return sel(x > X(0), x, X(alpha) * fm::expm1(x));
  }
  /// As PyTorch's elu_backward: the exponential branch where x <= 0, slope 1 elsewhere (NaN included).
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X d(X x) const {
    return sel(x <= X(0), X(alpha) * fm::exp(x), X(1));
  }
};

/// clamp(x, lo, hi). As in PyTorch 2.15, the gradient passes strictly inside the bounds only: 0 at x == lo or
/// x == hi (so everywhere when lo == hi) and at NaN. An infinite bound is an absent one (clamp_min is
/// clamp(x, lo, +inf)): x = +inf is inside clamp_min(x, lo), as in torch.clamp_min.
struct Clamp {
  static constexpr const char* name = "clamp";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = true;  ///< Autograd differentiates through the op, with d().
  ///@{
  /// The bounds; an infinite one is absent (clamp_min, clamp_max).
  double lo, hi;
  ///@}
  /// The op at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {
    const X l = X(lo), h = X(hi);
    return sel(x < l, l, sel(x > h, h, x));  // NaN passes through
  }
  /// The derivative at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X d(X x) const {
    const bool above = lo < -DBL_MAX || x > X(lo);
    const bool below = hi > DBL_MAX || x < X(hi);
    return sel(above && below, X(1), X(0));
  }
};

/// The element-wise losses' rows (smooth_l1_loss, huber_loss apply them to input - target).
/// 0.5 x² / beta where |x| < beta, else |x| - 0.5 beta (beta = 0 is |x|).
struct SmoothL1 {
  static constexpr const char* name = "smooth_l1";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = true;  ///< Autograd differentiates through the op, with d().
  double beta = 1.0;  ///< Where the quadratic part ends (smooth_l1_loss's beta).
  /// The op at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {
    const X a = x < X(0) ? -x : x, b = X(beta);
    return a < b ? X(0.5) * x * x / b : a - X(0.5) * b;
  }
  /// The derivative at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X d(X x) const {
    const X a = x < X(0) ? -x : x, b = X(beta);
    return a < b ? x / b : (x > X(0) ? X(1) : (x < X(0) ? X(-1) : X(0)));
  }
};

/// 0.5 x² where |x| < delta, else delta (|x| - 0.5 delta).
struct Huber {
  static constexpr const char* name = "huber";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = true;  ///< Autograd differentiates through the op, with d().
  double delta = 1.0;  ///< Where the quadratic part ends (huber_loss's delta).
  /// The op at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {
    const X a = x < X(0) ? -x : x, dl = X(delta);
    return a < dl ? X(0.5) * x * x : dl * (a - X(0.5) * dl);
  }
  /// The derivative at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X d(X x) const {
    const X a = x < X(0) ? -x : x, dl = X(delta);
    return a < dl ? x : (x > X(0) ? dl : (x < X(0) ? -dl : X(0)));
  }
};

#define EMBER_BINARY(NAME, FWD, DA, DB)                                      \
  struct NAME {                                                              \
    /** The op's name, in errors and profiles. */                            \
    static constexpr const char* name = #NAME;                               \
    /** Autograd differentiates through the op, with da() and db(). */       \
    static constexpr bool differentiable = true;                            \
    /** The op at (a, b). */                                                 \
    template <class X>                                                       \
    EMBER_HOST_DEVICE EMBER_INLINE X operator()(X a, X b) const {            \
      return FWD;                                                            \
    }                                                                        \
    /** The partial derivative in a at (a, b). */                            \
    template <class X>                                                       \
    EMBER_HOST_DEVICE EMBER_INLINE X da(X a, X b) const {                    \
      (void)a;                                                               \
      (void)b;                                                               \
      return DA;                                                             \
    }                                                                        \
    /** The partial derivative in b at (a, b). */                            \
    template <class X>                                                       \
    EMBER_HOST_DEVICE EMBER_INLINE X db(X a, X b) const {                    \
      (void)a;                                                               \
      (void)b;                                                               \
      return DB;                                                             \
    }                                                                        \
  };

//           name     forward          d/da                               d/db
/// a + b (torch.add); for bool the logical or.
EMBER_BINARY(Add,     add(a, b),       X(1),                              X(1))
/// a - b (torch.sub).
EMBER_BINARY(Sub,     a - b,           X(1),                              X(-1))
/// a * b (torch.mul); for bool the logical and.
EMBER_BINARY(Mul,     mul(a, b),       b,                                 a)
/// a / b, true division (torch.div).
EMBER_BINARY(Div,     a / b,           X(1) / b,                          -a / (b * b))
// Pow's partials as PyTorch's pow_backward: d/da is 0 where b == 0 (even at a = 0 or NaN), else b a^(b-1);
// d/db is 0 where a == 0 and b >= 0, else a^b log(a) (NaN for a < 0, -inf at a = 0, b < 0).
/// a^b (torch.pow).
EMBER_BINARY(Pow,     std::pow(a, b),  sel(b == X(0), X(0), b * std::pow(a, b - X(1))),
                                       sel(a == X(0) && b >= X(0), X(0), std::pow(a, b) * fm::log(a)))
// Element-wise max/min, gradients as PyTorch's: ties split the gradient evenly, the smaller (larger) operand gets
// none, and where either operand is NaN (unordered) both get the full gradient.
/// The larger of a and b, NaN if either is (torch.maximum).
EMBER_BINARY(Maximum, sel(a > b || a != a, a, b), sel(a < b, X(0), sel(a == b, X(0.5), X(1))),
                                                  sel(b < a, X(0), sel(a == b, X(0.5), X(1))))
/// The smaller of a and b, NaN if either is (torch.minimum).
EMBER_BINARY(Minimum, sel(a < b || a != a, a, b), sel(a > b, X(0), sel(a == b, X(0.5), X(1))),
                                                  sel(b > a, X(0), sel(a == b, X(0.5), X(1))))
#undef EMBER_BINARY

/// Comparisons and logic: bool results, no gradient.
#define EMBER_PREDICATE(NAME, FWD)                                           \
  struct NAME {                                                              \
    /** The op's name, in errors and profiles. */                            \
    static constexpr const char* name = #NAME;                               \
    /** A predicate has no gradient. */                                      \
    static constexpr bool differentiable = false;                           \
    /** The predicate at (a, b). */                                          \
    template <class X>                                                       \
    EMBER_HOST_DEVICE EMBER_INLINE bool operator()(X a, X b) const {         \
      return FWD;                                                            \
    }                                                                        \
  };
/// a < b (torch.lt).
EMBER_PREDICATE(Lt, a < b)
/// a <= b (torch.le).
EMBER_PREDICATE(Le, a <= b)
/// a > b (torch.gt).
EMBER_PREDICATE(Gt, a > b)
/// a >= b (torch.ge).
EMBER_PREDICATE(Ge, a >= b)
/// a == b (torch.eq).
EMBER_PREDICATE(Eq, a == b)
/// a != b (torch.ne).
EMBER_PREDICATE(Ne, a != b)
/// a == b, or both NaN: which elements a max/min reduction picked (a NaN result came from the NaN elements).
EMBER_PREDICATE(SameValue, a == b || (a != a && b != b))
/// The logical and of a and b (torch.logical_and).
EMBER_PREDICATE(And, bool(a) && bool(b))
/// The logical or (torch.logical_or).
EMBER_PREDICATE(Or, bool(a) || bool(b))
/// The logical exclusive or (torch.logical_xor).
EMBER_PREDICATE(Xor, bool(a) != bool(b))
#undef EMBER_PREDICATE

/// The logical not of x (torch.logical_not); no gradient.
struct Not {
  static constexpr const char* name = "logical_not";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = false;  ///< The op has no gradient.
  /// The op at x.
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE bool operator()(X x) const {
    return !bool(x);
  }
};

/// Derivative wrappers: an expression node whose op is Deriv<Op> evaluates Op's derivative instead of Op.
template <class Op>
struct Deriv {
  static constexpr const char* name = "deriv";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = false;  ///< The op has no gradient.
  Op op;  ///< The wrapped op, with its parameters.
  /// The wrapped op's derivative at x, op.d(x).
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X x) const {
    return op.d(x);
  }
};
/// A binary op's partial derivative in its first operand, as an op: DerivA<Op> evaluates Op::da.
template <class Op>
struct DerivA {
  static constexpr const char* name = "deriv_a";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = false;  ///< The op has no gradient.
  Op op;  ///< The wrapped op, with its parameters.
  /// The wrapped op's partial derivative in a, op.da(a, b).
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X a, X b) const {
    return op.da(a, b);
  }
};
/// A binary op's partial derivative in its second operand, as an op: DerivB<Op> evaluates Op::db.
template <class Op>
struct DerivB {
  static constexpr const char* name = "deriv_b";  ///< The op's name, in errors and profiles.
  static constexpr bool differentiable = false;  ///< The op has no gradient.
  Op op;  ///< The wrapped op, with its parameters.
  /// The wrapped op's partial derivative in b, op.db(a, b).
  template <class X>
  EMBER_HOST_DEVICE EMBER_INLINE X operator()(X a, X b) const {
    return op.db(a, b);
  }
};

}  // namespace ember::ops_table
