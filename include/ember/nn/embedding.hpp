// ember — nn::Embedding: a lookup table of num_embeddings vectors of size embedding_dim, as torch.nn.Embedding
// (weights from N(0, 1); the padding_idx row starts at zero and receives no gradient).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ember/amp/policy.hpp"
#include "ember/autograd/shape_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/nn/detail/policy_cast.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/module.hpp"
#include "ember/ops/indexing.hpp"

namespace ember::nn {

/// torch.nn.Embedding under a precision policy (nn::Embedding is EmbeddingT<amp::fp32>): a lookup table of
/// num_embeddings vectors of embedding_dim values, indexed by int64 tensors.
template <amp::PrecisionPolicy P = amp::fp32>
class EmbeddingT : public Module {
 public:
  using param_t = typename P::param_t;      ///< The parameters' dtype (the precision policy's master weights).
  using compute_t = typename P::compute_t;  ///< The input's and output's dtype.

  /// nn.Embedding(num_embeddings, embedding_dim, padding_idx): weights from N(0, 1); the padding_idx row (negative
  /// counts from the end) starts at zero and receives no gradient.
  EmbeddingT(std::int64_t num_embeddings, std::int64_t embedding_dim,
             std::optional<std::int64_t> padding_idx = std::nullopt);

  /// indices (any shape, each in [0, num_embeddings)) -> (*indices.shape, embedding_dim). An index outside the
  /// table, -1 included, is an error (as torch.nn.Embedding), never a wrap-around to the last rows.
  Tensor<compute_t> forward(const Tensor<std::int64_t>& indices) const;
  /// forward(indices).
  Tensor<compute_t> operator()(const Tensor<std::int64_t>& indices) const { return forward(indices); }

  /// Throws unless every entry of indices lies in [0, num_embeddings), naming the first bad one.
  void check_indices(const Tensor<std::int64_t>& indices) const;

  ///@{
  /// The table's rows and the vectors' length.
  std::int64_t num_embeddings, embedding_dim;
  ///@}
  std::optional<std::int64_t> padding_idx;  ///< The row that stays zero and gets no gradient (normalised to >= 0).
  Tensor<param_t> weight;                   ///< (num_embeddings, embedding_dim).
};

template <amp::PrecisionPolicy P>
EMBER_COLD EmbeddingT<P>::EmbeddingT(std::int64_t num_embeddings, std::int64_t embedding_dim,
                          std::optional<std::int64_t> padding_idx)
    : Module("Embedding"), num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  EMBER_CHECK(num_embeddings > 0 && embedding_dim > 0, "nn::Embedding: sizes must be positive, got (",
              num_embeddings, ", ", embedding_dim, ")");
  if (padding_idx) {
    std::int64_t i = *padding_idx;
    EMBER_CHECK(i >= -num_embeddings && i < num_embeddings, "nn::Embedding: padding_idx ", i,
                " is out of range for ", num_embeddings, " embeddings");
    this->padding_idx = i < 0 ? i + num_embeddings : i;
  }
  weight = empty<param_t>(Shape{num_embeddings, embedding_dim});
  init::normal_(weight);
  if (this->padding_idx) {
    NoGradGuard ng;
    weight[*this->padding_idx].zero_();
  }
  register_parameter("weight", weight);
  set_extra_repr([num_embeddings, embedding_dim]() EMBER_COLD {
    return std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
  });
}

template <amp::PrecisionPolicy P>
auto EmbeddingT<P>::forward(const Tensor<std::int64_t>& indices) const -> Tensor<compute_t> {
  check_indices(indices);
  Shape out = indices.shape();
  out.push_back(embedding_dim);
  Tensor<compute_t> w = detail::to_compute<compute_t>(weight);
  Tensor<compute_t> rows = index_select(w, 0, indices.reshape({-1}));
  if (padding_idx) {
    // Rows looked up at padding_idx are zero and pass no gradient back to the table.
    Tensor<compute_t> keep = cast<compute_t>(indices.reshape({-1, 1}) != *padding_idx);
    rows = rows * keep;
  }
  return rows.view(out);
}

template <amp::PrecisionPolicy P>
void EmbeddingT<P>::check_indices(const Tensor<std::int64_t>& indices) const {
  EMBER_CHECK(indices.defined(), "nn::Embedding: the indices are undefined");
  EMBER_CHECK(indices.device() == weight.device(), "nn::Embedding: the indices are on ", indices.device().str(),
              " but the table is on ", weight.device().str());
  const auto [i, v] = ops::first_out_of_range(indices, num_embeddings, "nn::Embedding");
  EMBER_CHECK(i < 0, "nn::Embedding: index ", v, " at position ", i,
              " (row-major, indices of shape ", indices.shape().str(), ") is out of range [0, ", num_embeddings,
              ") for a table of ", num_embeddings, " embeddings");
}

using Embedding = EmbeddingT<>;

}  // namespace ember::nn
