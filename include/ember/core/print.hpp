// ember — printing tensors the way PyTorch does: `tensor([[ 1.0000, -2.5000], ...], dtype=..., requires_grad=True)`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "ember/core/device_copy.hpp"
#include "ember/core/tensor.hpp"

namespace ember {

namespace detail {

struct PrintFormat {
  enum { Int, IntFloat, Fixed, Sci } kind = Fixed;
  int width = 1;
};

template <class T>
std::string format_value(T v, const PrintFormat& f) {
  char buf[64];
  if constexpr (std::is_same_v<T, bool>) {
    std::snprintf(buf, sizeof buf, "%s", v ? "True" : "False");
  } else if constexpr (!is_floating_v<T>) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  } else {
    const double d = double(static_cast<compute_t<T>>(v));
    if (std::isnan(d)) std::snprintf(buf, sizeof buf, "nan");
    else if (std::isinf(d)) std::snprintf(buf, sizeof buf, "%s", d > 0 ? "inf" : "-inf");
    else if (f.kind == PrintFormat::IntFloat) std::snprintf(buf, sizeof buf, "%.0f.", d);
    else if (f.kind == PrintFormat::Sci) std::snprintf(buf, sizeof buf, "%.4e", d);
    else std::snprintf(buf, sizeof buf, "%.4f", d);
  }
  std::string s(buf);
  if (int(s.size()) < f.width) s.insert(0, std::size_t(f.width - int(s.size())), ' ');
  return s;
}

// Index lists to show along a dim of size n: all of them, or the first and last `edge` around a gap (-1).
inline std::vector<std::int64_t> shown(std::int64_t n, bool summarize, int edge = 3) {
  std::vector<std::int64_t> v;
  if (!summarize || n <= 2 * edge) {
    for (std::int64_t i = 0; i < n; ++i) v.push_back(i);
  } else {
    for (int i = 0; i < edge; ++i) v.push_back(i);
    v.push_back(-1);
    for (std::int64_t i = n - edge; i < n; ++i) v.push_back(i);
  }
  return v;
}

/// Calls f(element) for every element PyTorch shows (all, or three at each end of every dim when summarising).
template <class T, class F>
void for_each_shown(const Tensor<T>& t, bool summarize, F&& f) {
  if (t.dim() == 0) {
    f(t.data()[0]);
    return;
  }
  auto rec = [&](auto& self, int d, std::int64_t off) -> void {
    for (const std::int64_t i : shown(t.shape()[d], summarize)) {
      if (i < 0) continue;
      const std::int64_t o = off + i * t.strides()[d];
      if (d == t.dim() - 1) f(t.data()[o]);
      else self(self, d + 1, o);
    }
  };
  rec(rec, 0, 0);
}

// Prints dim d of t. As PyTorch's _tensor_str: the sub-tensor at depth d is indented by indent + d; rows
// (the last dim) wrap at 80 columns, and a summarised row shows " ..." between its ends.
template <class T>
void print_rec(std::ostream& os, const Tensor<T>& t, int d, std::int64_t off, const PrintFormat& f, bool summarize,
               int indent) {
  os << '[';
  const auto idx = shown(t.shape()[d], summarize);
  const bool last = d == t.dim() - 1;
  const std::size_t per_line = std::size_t(std::max(1, (80 - (indent + d)) / (f.width + 2)));
  for (std::size_t k = 0; k < idx.size(); ++k) {
    if (k) {
      if (last && k % per_line != 0) os << ", ";
      else {
        os << ',';
        for (int nl = 0; nl < (last ? 1 : t.dim() - 1 - d); ++nl) os << '\n';
        os << std::string(std::size_t(indent + d + 1), ' ');
      }
    }
    if (idx[k] < 0) {
      os << (last ? " ..." : "...");
      continue;
    }
    const std::int64_t o = off + idx[k] * t.strides()[d];
    if (last) os << format_value(t.data()[o], f);
    else print_rec(os, t, d + 1, o, f, summarize, indent);
  }
  os << ']';
}

}  // namespace detail

/// Prints as PyTorch does; a CUDA tensor is copied to the host first and shows `device='cuda:0'`.
template <class T>
std::ostream& operator<<(std::ostream& os, const Tensor<T>& tensor) {
  if (!tensor.defined()) return os << "tensor(undefined)";
  if (!tensor.device().is_cpu()) tensor.check_host_copy("printing");
  // The values printed (a host copy of a CUDA tensor); `tensor` itself gives the device and autograd suffixes.
  const Tensor<T> t = tensor.device().is_cpu() ? tensor : detail::copy_to_device(tensor, Device::cpu(), false);
  const bool summarize = t.numel() > 1000;
  // Choose one format for every element from the elements shown, as PyTorch's _Formatter does: for floating
  // types, the nonzero finite values decide the mode (integral, fixed with 4 decimals, or scientific) and the width.
  detail::PrintFormat f;
  if constexpr (is_floating_v<T>) {
    double mx = 0, mn = INFINITY;
    bool integral = true;
    detail::for_each_shown(t, summarize, [&](T x) {
      const double v = double(static_cast<compute_t<T>>(x));
      if (!std::isfinite(v) || v == 0) return;
      integral = integral && v == std::ceil(v);
      mx = std::max(mx, std::fabs(v));
      mn = std::min(mn, std::fabs(v));
    });
    const bool any_nonzero = mn != INFINITY;
    const bool wide = any_nonzero && (mx / mn > 1000 || mx > 1e8);
    if (integral) f.kind = wide ? detail::PrintFormat::Sci : detail::PrintFormat::IntFloat;
    else if (wide || mn < 1e-4) f.kind = detail::PrintFormat::Sci;
    else f.kind = detail::PrintFormat::Fixed;
    detail::for_each_shown(t, summarize, [&](T x) {
      const double v = double(static_cast<compute_t<T>>(x));
      if (!std::isfinite(v) || v == 0) return;
      f.width = std::max(f.width, int(detail::format_value(x, detail::PrintFormat{f.kind, 1}).size()));
    });
  } else {
    f.kind = detail::PrintFormat::Int;
    detail::for_each_shown(t, summarize, [&](T x) {
      f.width = std::max(f.width, int(detail::format_value(x, detail::PrintFormat{f.kind, 1}).size()));
    });
  }
  std::ostringstream body;
  body << "tensor(";
  if (t.numel() == 0) body << "[]";
  else if (t.dim() == 0) body << detail::format_value(t.data()[0], f);
  else detail::print_rec(body, t, 0, 0, f, summarize, 7);
  std::vector<std::string> suffixes;
  if (tensor.device().is_cuda()) suffixes.push_back("device='" + tensor.device().str() + "'");
  if (t.numel() == 0 && t.dim() != 1) {  // an empty tensor states its shape unless it is (0,)
    std::string sz = "size=(";
    for (int d = 0; d < t.dim(); ++d) sz += (d ? ", " : "") + std::to_string(t.shape()[d]);
    suffixes.push_back(sz + ")");
  }
  // float32 is the default dtype; int64 and bool are inferred from the printed values unless there are none.
  if (!std::is_same_v<T, float> &&
      (t.numel() == 0 || (!std::is_same_v<T, std::int64_t> && !std::is_same_v<T, bool>)))
    suffixes.push_back(std::string("dtype=torch.") + dtype_name<T>());
  if (tensor.has_meta() && tensor.meta().grad_fn) suffixes.push_back("grad_fn=<Backward>");
  else if (tensor.requires_grad()) suffixes.push_back("requires_grad=True");
  // As PyTorch's _add_suffixes: a suffix that would pass column 80 starts a new line, indented under "tensor(".
  std::string s = body.str();
  const std::size_t nl = s.rfind('\n');
  std::size_t last = nl == std::string::npos ? s.size() + 2 : s.size() - nl + 1;
  for (const auto& suf : suffixes) {
    if (last + suf.size() + 2 > 80) {
      s += ",\n       " + suf;
      last = 7 + suf.size();
    } else {
      s += ", " + suf;
      last += suf.size() + 2;
    }
  }
  return os << s << ')';
}

/// The printed form as a string.
template <class T>
std::string to_string(const Tensor<T>& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace ember
