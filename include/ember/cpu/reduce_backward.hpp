// ember — CPU loops of reductions' backward passes that are not element-wise expressions: the gradient of prod
// (autograd/reduce.hpp's node calls it; a CUDA twin would be cuda/reduce_backward.cuh).
#pragma once

#include <cstdint>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"

namespace ember::cpu {

/// d prod / d x_j, as PyTorch computes it, for Kn groups of R contiguous values a whose products are res (one per
/// group), into o (the layout of a). all: the product is over all elements (each group on its own: a group without
/// zeros takes prod / x_j, a group with one zero the product of the others, exact as prefix × suffix, a group with
/// two or more zeros 0); else over dims (prod / x_j when no group has a zero, else the product of the others in
/// every group). nonempty: the argument has at least one dim (a 0-d argument passes the gradient, 1).
template <class T>
void prod_of_others(const T* a, const T* res, T* o, std::int64_t Kn, std::int64_t R, bool all, bool nonempty) {
  using C = compute_t<T>;
  auto zeros_in = [&](std::int64_t k) {
    std::int64_t z = 0;
    for (std::int64_t j = 0; j < R; ++j) z += static_cast<C>(a[k * R + j]) == C(0);
    return z;
  };
  std::int64_t total_zeros = 0;
  if (!all)
    for (std::int64_t k = 0; k < Kn; ++k) total_zeros += zeros_in(k);
  for (std::int64_t k = 0; k < Kn; ++k) {
    const std::int64_t zeros = all ? zeros_in(k) : total_zeros;
    if (nonempty && zeros == 0) {
      for (std::int64_t j = 0; j < R; ++j)
        o[k * R + j] = convert<T>(static_cast<C>(res[k]) / static_cast<C>(a[k * R + j]));
      continue;
    }
    if (all && zeros > 1) {
      for (std::int64_t j = 0; j < R; ++j) o[k * R + j] = convert<T>(0.0);
      continue;
    }
    double pre = 1;
    for (std::int64_t j = 0; j < R; ++j) {
      o[k * R + j] = convert<T>(pre);
      pre *= double(static_cast<compute_t<T>>(a[k * R + j]));
    }
    double suf = 1;
    for (std::int64_t j = R - 1; j >= 0; --j) {
      o[k * R + j] = convert<T>(double(static_cast<compute_t<T>>(o[k * R + j])) * suf);
      suf *= double(static_cast<compute_t<T>>(a[k * R + j]));
    }
  }
}

}  // namespace ember::cpu
