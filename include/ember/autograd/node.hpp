// ember — autograd nodes. A node is one entry of the tape: it holds what its backward needs, a buffer where the
// gradient of its output accumulates, and one edge per input (the node that produced that input, or the
// input's gradient sink if it is a leaf). Nodes are numbered in recording order on each thread; backward runs
// them in reverse order of that number once all their consumers have delivered.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/autograd/grad_mode.hpp"

namespace ember::autograd {

inline std::uint64_t& sequence_counter() {
  thread_local std::uint64_t seq = 0;
  return seq;
}
inline std::uint64_t next_sequence_number() { return ++sequence_counter(); }
/// How many autograd nodes (tape entries and gradient sinks) this thread has created so far.
inline std::uint64_t nodes_created() { return sequence_counter(); }

/// Refuses an inference tensor (InferenceMode) that an op is about to save for backward or differentiate.
template <class T>
void check_not_inference(const Tensor<T>& t, const char* what) {
  EMBER_CHECK(!t.defined() || !t.is_inference(), what, ": a tensor of shape ", t.shape().str(), " (", dtype_name<T>(),
              ") created under InferenceMode cannot be saved for backward or differentiated; clone() it outside "
              "InferenceMode to get a normal tensor, or run the whole computation under InferenceMode");
}

/// One entry of the autograd tape, what Tensor::grad_fn() returns (PyTorch's `grad_fn` object): the backward of
/// the op that produced a tensor, with an edge to the node of each of its inputs. ember's ops derive their nodes
/// from TypedNode; custom ops record one through autograd::apply_function.
struct Node : std::enable_shared_from_this<Node> {
  /// The recording order on this thread; backward runs nodes in decreasing order (gradient sinks first).
  std::uint64_t seq = next_sequence_number();
  /// One edge per input: the node that receives that input's gradient (PyTorch's next_functions); null where
  /// the input needs no gradient.
  std::vector<std::shared_ptr<Node>> next;  // per input; null where the input needs no gradient
  bool released = false;  ///< Set once release() freed what backward needed (a second backward is then an error).

  EMBER_HEADER_INLINE virtual ~Node();  // (not inline: with ember::precompiled the vtable lives in the library)
  /// The node's name, as PyTorch's grad_fn.name(): "Conv2dBackward", "AccumulateGrad", a custom op's name.
  virtual const char* name() const = 0;
  /// Runs hooks of the output, then computes and delivers the inputs' gradients.
  virtual void apply() = 0;
  /// Drops the gradient buffer after apply.
  virtual void clear_grad() = 0;
  /// Frees what backward needed (the tape is freed after backward unless retain_graph).
  virtual void release() {}
  /// Whether this is a leaf's gradient sink (AccumulateGrad) rather than an op's backward.
  virtual bool is_accumulator() const { return false; }
};
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Node::~Node() = default;
#endif

/// A node whose output has element type T. (Its members are defined below the class, not inline: with
/// ember::precompiled, which holds the floating dtypes' nodes, a TU compiles none of them.)
template <class T>
struct TypedNode : Node {
  Tensor<T> grad;                       ///< The output's gradient, accumulated from its consumers.
  std::weak_ptr<TensorImpl<T>> output;  ///< The output tensor, for retain_grad() and hooks.

  TypedNode() = default;
  TypedNode(const TypedNode&) = delete;
  TypedNode& operator=(const TypedNode&) = delete;
  ~TypedNode() override;

  /// Adds g into the gradient buffer.
  void accumulate(Tensor<T> g);
  void clear_grad() override { grad = Tensor<T>(); }

  void apply() final;
  /// Computes the inputs' gradients from `grad` and delivers them.
  virtual void backward() = 0;

  /// Sends g to input k's node (when that input needs a gradient).
  template <class U>
  void deliver(std::size_t k, Tensor<U> g);
};

template <class T>
TypedNode<T>::~TypedNode() = default;

template <class T>
void TypedNode<T>::accumulate(Tensor<T> g) {
  if (!grad.defined()) {
    grad = std::move(g);
    return;
  }
  Tensor<T> sum = empty<T>(grad.shape(), grad.device());
  ops::assign(sum, expr::make_binary(ops_table::Add{}, grad, g), "backward");
  grad = std::move(sum);
}

template <class T>
void TypedNode<T>::apply() {
  if (!grad.defined()) return;  // no consumer produced a gradient
  if (auto out = output.lock(); out && out->meta) {
    AutogradMeta<T>& m = *out->meta;
    if (m.retains_grad) m.grad = grad.clone();
    for (auto& h : m.hooks) h(grad);
  }
  backward();
}

template <class T>
template <class U>
void TypedNode<T>::deliver(std::size_t k, Tensor<U> g) {
  if (k < next.size() && next[k]) static_cast<TypedNode<U>*>(next[k].get())->accumulate(std::move(g));
}

/// The gradient sink of a leaf: adds into leaf.grad() and then runs the leaf's gradient-ready hooks.
template <class T>
struct AccumulateGrad final : TypedNode<T> {
  std::shared_ptr<TensorImpl<T>> leaf;  ///< The leaf tensor whose grad() receives the gradient.

  /// The sink of leaf `l`; it runs as soon as its gradient is complete (the largest sequence number).
  explicit AccumulateGrad(std::shared_ptr<TensorImpl<T>> l) : leaf(std::move(l)) {
    this->seq = std::numeric_limits<std::uint64_t>::max();  // run as soon as ready
  }
  /// "AccumulateGrad", as PyTorch's node.
  const char* name() const override { return "AccumulateGrad"; }
  /// True: a gradient sink.
  bool is_accumulator() const override { return true; }
  void backward() override {
    AutogradMeta<T>& m = *leaf->meta;
    Tensor<T>& g = this->grad;
    if (!m.grad.defined()) {
      // Keep the buffer when nothing else can see it; copy it otherwise (later accumulation is in place).
      const bool exclusive = g.is_contiguous() && g.storage().use_count() == 1 &&
                             std::size_t(g.numel()) == g.storage()->nbytes / sizeof(T);
      m.grad = exclusive ? g : g.detach().clone();
    } else {
      ops::assign(m.grad, expr::make_binary(ops_table::Add{}, m.grad, g), "backward");
    }
    for (auto& h : m.hooks) h(m.grad);
  }
};

/// The node that receives t's gradient: its producer, or (for a leaf) its gradient sink; null if none.
template <class T>
std::shared_ptr<Node> gradient_edge(const Tensor<T>& t) {
  if (!t.requires_grad()) return nullptr;
  check_not_inference(t, "autograd");
  AutogradMeta<T>& m = t.meta();
  if (m.grad_fn) return m.grad_fn;
  if (auto acc = m.accumulator.lock()) return acc;
  auto acc = std::make_shared<AccumulateGrad<T>>(t.impl_ptr());
  m.accumulator = acc;
  return acc;
}

/// Marks `out` as produced by `node` (which must already have its edges).
template <class T>
void set_history(Tensor<T>& out, const std::shared_ptr<TypedNode<T>>& node) {
  AutogradMeta<T>& m = out.meta();
  m.requires_grad = true;
  m.grad_fn = node;
}

/// Records the storage version of a saved tensor, to detect in-place changes before backward.
template <class T>
struct Saved {
  Tensor<T> t;                ///< The saved tensor (undefined when nothing was saved).
  std::uint64_t version = 0;  ///< Its version() when it was saved.
  Saved() = default;  ///< Nothing saved.
  /// Saves x and its current version (an inference tensor is refused).
  explicit Saved(const Tensor<T>& x) : t(x), version(x.defined() ? x.version() : 0) {
    check_not_inference(x, "autograd");
  }
  /// The saved tensor; an error naming `op` if it was modified in place since it was saved (PyTorch's "one of the
  /// variables needed for gradient computation has been modified by an inplace operation").
  const Tensor<T>& get(const char* op) const {
    EMBER_CHECK(!t.defined() || t.version() == version, op,
                ": a tensor needed for gradient computation (shape ", t.shape().str(),
                ") was modified by an in-place operation after it was used (version ", version, ", now ",
                t.version(), "); clone() it before modifying it");
    return t;
  }
};

}  // namespace ember::autograd
