// ember — Tensor<T>: a cheap shared handle to (storage, shape, strides, offset, autograd slot), like
// torch::Tensor. Copying a handle shares the data; clone() copies it. Views share storage.
//
// The class is here; the geometry of its views is computed in core/tensor_views.hpp and its autograd slot is
// core/tensor_autograd.hpp, both included at the end of this header (each includes this one, so any of the three
// gives the whole Tensor). What needs a higher layer (running a loop, recording a backward node, running
// backward) goes through detail::TensorOps<T>, which autograd/tensor_ops.hpp defines; include <ember/ember.hpp>
// to use those members.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/storage.hpp"

namespace ember {

/// An n-dimensional array of T with autograd (PyTorch's `torch.Tensor`); see the class definition below.
template <class T>
class Tensor;

namespace autograd {
struct Node;
}

// How a view was derived from its base (autograd replays it); defined in core/tensor_views.hpp.
struct ViewOp;

namespace detail {
/// Members of Tensor that need the executor or autograd; defined in autograd/tensor_ops.hpp.
template <class T>
struct TensorOps;
/// A contiguous copy on another device without autograd; defined in core/device_copy.hpp.
template <class T>
Tensor<T> copy_to_device(const Tensor<T>& t, Device d, bool non_blocking);
/// Specialised true by expr/ for its expression node types.
template <class E>
struct is_expression : std::false_type {};
}  // namespace detail

template <class E>
concept Expression = detail::is_expression<std::remove_cvref_t<E>>::value;

/// The autograd slot of a tensor: created on demand, shared by every handle to the same tensor.
template <class T>
struct AutogradMeta;

/// What a Tensor handle points to: the storage and the view's geometry into it, plus the autograd slot. Every
/// handle (copy) of a tensor shares one TensorImpl; views have their own, sharing the storage.
template <class T>
struct TensorImpl {
  Storage storage;                        ///< The memory (shared by all views of it) and its device.
  Shape sizes;                            ///< The shape (d0, d1, ...).
  Shape strides;                          ///< Per-dim strides, in elements (not bytes).
  std::int64_t offset = 0;                ///< Where element (0, ..., 0) is in the storage, in elements.
  bool is_view = false;                   ///< Shares storage with a tensor it was derived from.
  std::unique_ptr<AutogradMeta<T>> meta;  ///< The autograd slot, created on demand (null without autograd state).
};

/// An n-dimensional array of T on a device, with autograd: ember's `torch.Tensor`. A Tensor is a cheap shared
/// handle (copying it shares the data, clone() copies), views share storage, and element-wise expressions
/// (`a * b + 1`) are evaluated lazily in one fused pass when assigned to a Tensor. The operations are free
/// functions (ember::relu, ember::matmul, ...) and the members here; include <ember/ember.hpp> to use them all.
/// T is one of float, double, half, bfloat16, int32_t, int64_t, uint8_t or bool.
template <class T>
class Tensor {
  static_assert(Dtype<T>, "ember::Tensor<T>: T must be one of float, double, half, bfloat16, int32_t, int64_t, "
                          "uint8_t or bool");

 public:
  using value_type = T;  ///< The element type (the dtype).

  /// An undefined tensor (no storage), like a default torch::Tensor.
  Tensor() = default;
  /// Wraps an existing implementation (used by creation functions and views).
  explicit Tensor(std::shared_ptr<TensorImpl<T>> impl) : impl_(std::move(impl)) {}
  /// Materialises an element-wise expression in one pass (and records one autograd node when needed).
  template <Expression E>
  Tensor(const E& e) : Tensor(detail::TensorOps<T>::materialize(e)) {}  // NOLINT: implicit on purpose

  /// Another handle to the same tensor (shares data and autograd state; use clone() to copy).
  Tensor(const Tensor&) = default;
  /// Takes over `other`'s handle, leaving it undefined.
  Tensor(Tensor&&) noexcept = default;
  /// Rebinds the handle (shares `other`'s data), as assignment of torch::Tensor does.
  Tensor& operator=(const Tensor&) & = default;
  /// Rebinds the handle, taking over `other`'s.
  Tensor& operator=(Tensor&&) & noexcept = default;
  /// Assigning to a temporary handle (a view: `x.slice(0, 0, 2) = y;`, `x[i] = y;`) copies `src` into its memory,
  /// broadcasting, as LibTorch's rvalue assignment does; rebinding a temporary would silently do nothing.
  Tensor& operator=(const Tensor& src) && {
    copy_(src);
    return *this;
  }

  /// Writes an expression into this tensor's memory (through views), in one pass; allocates when undefined.
  template <Expression E>
  Tensor& operator=(const E& e) {
    detail::TensorOps<T>::template assign<0>(*this, e);
    return *this;
  }
  /// In place `*this += e` (a tensor, scalar or expression, broadcast to this shape), in one pass, as PyTorch's
  /// add_: recorded for autograd when an operand needs a gradient; on a leaf that requires grad, only under
  /// NoGradGuard.
  template <class E>
  Tensor& operator+=(const E& e) {
    detail::TensorOps<T>::template assign<1>(*this, e);
    return *this;
  }
  /// In place `*this -= e`, as operator+= (PyTorch's sub_).
  template <class E>
  Tensor& operator-=(const E& e) {
    detail::TensorOps<T>::template assign<2>(*this, e);
    return *this;
  }
  /// In place `*this *= e`, as operator+= (PyTorch's mul_).
  template <class E>
  Tensor& operator*=(const E& e) {
    detail::TensorOps<T>::template assign<3>(*this, e);
    return *this;
  }
  /// In place `*this /= e`, as operator+= (PyTorch's div_).
  template <class E>
  Tensor& operator/=(const E& e) {
    detail::TensorOps<T>::template assign<4>(*this, e);
    return *this;
  }

  // ---- geometry -------------------------------------------------------------------------------------------
  /// Whether the handle refers to a tensor (false for a default-constructed one), as torch::Tensor::defined().
  bool defined() const { return impl_ != nullptr; }
  /// The sizes of the dims (PyTorch's `shape` / `size()`).
  const Shape& shape() const { return impl().sizes; }
  /// The same as shape() (LibTorch's sizes()).
  const Shape& sizes() const { return impl().sizes; }
  /// Per-dim strides in elements (PyTorch's stride()).
  const Shape& strides() const { return impl().strides; }
  /// The size of dim d; negative d counts from the end (PyTorch's size(d)).
  std::int64_t size(std::int64_t d) const { return shape()[wrap_dim(d, shape(), "size")]; }
  /// The stride of dim d in elements; negative d counts from the end (PyTorch's stride(d)).
  std::int64_t stride(std::int64_t d) const { return strides()[wrap_dim(d, shape(), "stride")]; }
  /// The number of dims (PyTorch's dim() / ndim).
  int dim() const { return impl().sizes.n; }
  /// The number of elements (PyTorch's numel()).
  std::int64_t numel() const { return impl().sizes.numel(); }
  /// Where element (0, ..., 0) lies in the storage, in elements (PyTorch's storage_offset()).
  std::int64_t storage_offset() const { return impl().offset; }
  /// Where the elements live. Under EMBER_HOST_ONLY (config.hpp; the default without CUDA) the constant
  /// Device::cpu(), and another device an error.
  EMBER_INLINE Device device() const {
#if EMBER_HOST_ONLY
    // Small enough to inline everywhere (the errors are out of line), so every caller sees the constant.
    if (impl_ == nullptr || !impl_->storage->device.is_cpu()) [[unlikely]] device_error();
    return Device::cpu();
#else
    return impl().storage->device;
#endif
  }
  /// Whether the elements are laid out densely in row-major order (PyTorch's is_contiguous()).
  bool is_contiguous() const { return ember::is_contiguous(shape(), strides()); }
  /// Whether this tensor shares storage with a tensor it was derived from (PyTorch's `_is_view()`).
  bool is_view() const { return impl().is_view; }
  /// The memory the elements live in, shared by every view of it (PyTorch's untyped_storage()).
  const Storage& storage() const { return impl().storage; }
  /// Pointer to element (0, ..., 0).
  T* data() const { return static_cast<T*>(impl().storage->data) + impl().offset; }
  /// Bumped by every in-place write to the storage; autograd checks it. Inference tensors have no version counter
  /// (it stays 0), as in PyTorch.
  std::uint64_t version() const { return impl().storage->version.load(std::memory_order_relaxed); }
  /// Advances version() after writing the storage directly (through data()), so that autograd notices; every
  /// in-place op of ember does it itself. A no-op for inference tensors.
  void bump_version() const {
    if (!impl().storage->inference) impl().storage->version.fetch_add(1, std::memory_order_relaxed);
  }
  /// Whether the memory was allocated under InferenceMode (views of such a tensor are inference tensors too).
  bool is_inference() const { return impl().storage->inference; }
  /// Whether `o` is a handle to this very tensor (not merely a view of the same storage), as PyTorch's `is`.
  bool same_impl(const Tensor& o) const { return impl_ == o.impl_; }
  /// True when no other handle, view or autograd record shares this tensor's memory, so writing it in place is
  /// invisible to everyone else (data transforms use it to skip a copy).
  bool unshared() const {
    return impl_ && impl_.use_count() == 1 && impl_->storage.use_count() == 1 && !requires_grad();
  }
  /// The implementation behind the handle (null when undefined), without a check: for ember's own code.
  TensorImpl<T>* unsafe_impl() const { return impl_.get(); }
  /// The shared pointer behind the handle (null when undefined): an identity to compare or hash tensors by.
  const std::shared_ptr<TensorImpl<T>>& impl_ptr() const { return impl_; }

  // ---- element access ------------------------------------------------------------------------------------
  /// The single element of a one-element tensor (copied to the host for a CUDA tensor, as PyTorch does).
  T item() const;
  /// Bounds-checked reference to one element of a CPU tensor: `x.at(1, 2) = 3.f;`.
  template <class... I>
  T& at(I... idx) const {
    static_assert((std::is_integral_v<I> && ...), "at: indices must be integers");
    const std::int64_t ix[] = {static_cast<std::int64_t>(idx)..., 0};
    constexpr int n = sizeof...(I);
    EMBER_CHECK(n == dim(), "at: got ", n, " indices for a tensor of shape ", shape().str());
    check_cpu("at");
    std::int64_t off = 0;
    for (int i = 0; i < n; ++i) {
      std::int64_t v = ix[i];
      const std::int64_t s = shape()[i];
      EMBER_CHECK(v >= -s && v < s, "at: index ", v, " is out of range for dim ", i, " of size ", s,
                  " (shape ", shape().str(), ")");
      off += (v < 0 ? v + s : v) * strides()[i];
    }
    return data()[off];
  }
  /// Copies the elements (in row-major order) into a vector (from the device for a CUDA tensor).
  std::vector<T> to_vector() const;

  // ---- views (share storage; differentiable) ------------------------------------------------------------
  /// Elements start, start+step, ... < end along dim; negative start/end count from the end, as in Python.
  Tensor slice(std::int64_t d, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  /// slice(d, start, start + length): `length` elements from `start` along dim d (PyTorch's narrow).
  Tensor narrow(std::int64_t d, std::int64_t start, std::int64_t length) const;
  /// Removes dim d, keeping index i.
  Tensor select(std::int64_t d, std::int64_t i) const;
  /// x[i] is x.select(0, i), as in PyTorch.
  Tensor operator[](std::int64_t i) const { return select(0, i); }
  /// Swaps dims d0 and d1 (a view; negative dims count from the end), as PyTorch's transpose.
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;
  /// Transpose of a matrix (a 0-d or 1-d tensor is returned as is).
  Tensor t() const {
    EMBER_CHECK(dim() <= 2, "t: expected a tensor of at most 2 dimensions, got shape ", shape().str());
    return dim() < 2 ? *this : transpose(0, 1);
  }
  /// Reorders the dims: output dim i is dim order[i] of this tensor (a view), as PyTorch's permute.
  Tensor permute(std::initializer_list<std::int64_t> order) const { return permute(std::vector(order)); }
  /// permute with the order as a vector.
  Tensor permute(const std::vector<std::int64_t>& order) const;
  /// A view with a new shape; one dim may be -1. Errors when the strides cannot express it (use reshape).
  Tensor view(std::initializer_list<std::int64_t> s) const { return view(Shape(s)); }
  /// view with the shape as a Shape.
  Tensor view(Shape s) const;
  /// view() when the strides allow it, else a contiguous copy with the new shape.
  Tensor reshape(std::initializer_list<std::int64_t> s) const { return reshape(Shape(s)); }
  /// reshape with the shape as a Shape.
  Tensor reshape(Shape s) const;
  /// Broadcasts size-1 dims (and new leading dims) to `s` without copying; -1 keeps a size.
  Tensor expand(std::initializer_list<std::int64_t> s) const { return expand(Shape(s)); }
  /// expand with the shape as a Shape.
  Tensor expand(Shape s) const;
  /// expand(o.shape()), as PyTorch's expand_as.
  template <class U>
  Tensor expand_as(const Tensor<U>& o) const {
    return expand(o.shape());
  }
  /// Removes every size-1 dim.
  Tensor squeeze() const;
  /// Removes dim d if it has size 1 (else returns the same view, as PyTorch does).
  Tensor squeeze(std::int64_t d) const;
  /// Inserts a size-1 dim at position d (a view; negative d counts from the end of the result), as PyTorch's.
  Tensor unsqueeze(std::int64_t d) const;
  /// Merges dims start..end into one (a view when possible, else a copy).
  Tensor flatten(std::int64_t start = 0, std::int64_t end = -1) const;

  // ---- copies ---------------------------------------------------------------------------------------------
  /// This tensor if already contiguous, else a contiguous copy (differentiable).
  Tensor contiguous() const { return is_contiguous() ? *this : clone(); }
  /// A contiguous copy (differentiable).
  Tensor clone() const { return detail::TensorOps<T>::clone(*this); }
  /// Copies src (broadcast to this shape) into this tensor's memory; src may be on another device. non_blocking:
  /// asynchronous when the host side is pinned memory (see to()).
  Tensor& copy_(const Tensor& src, bool non_blocking = false) {
    if (src.device() == device()) detail::TensorOps<T>::copy_same(*this, src);
    else detail::TensorOps<T>::copy_across(*this, src, non_blocking);
    return *this;
  }

  // ---- devices --------------------------------------------------------------------------------------------
  /// This tensor on `device`: itself when it is already there, else a contiguous copy (differentiable: the
  /// gradient is copied back). non_blocking, as in PyTorch: a copy from pinned host memory to a GPU runs
  /// asynchronously on the GPU's current stream (the source stays alive until it is done); a copy from a GPU to the
  /// host lands in newly allocated pinned memory and is asynchronous too: synchronise the stream (or the device)
  /// before reading it. Copies between GPUs are ordered on the current streams. Other copies finish before to()
  /// returns.
  Tensor to(Device device, bool non_blocking = false) const {
    if (device == this->device()) return *this;
    return detail::TensorOps<T>::to_device(*this, device, non_blocking);
  }
  /// to(Device::cuda(index)).
  Tensor cuda(int index = 0, bool non_blocking = false) const { return to(Device::cuda(index), non_blocking); }
  /// to(Device::cpu()).
  Tensor cpu() const { return to(Device::cpu()); }
  /// A copy in page-locked host memory (itself when already pinned), from which copies to a GPU can be
  /// asynchronous. Needs ember's CUDA backend and a CUDA driver.
  Tensor pin_memory() const {
    if (is_pinned()) return *this;
    return detail::TensorOps<T>::pin_memory(*this);
  }
  /// True when this is a host tensor in page-locked memory.
  bool is_pinned() const { return defined() && ember::is_pinned(*storage()); }
  /// Sets every element to v, in place (PyTorch's fill_).
  Tensor& fill_(T v) {
    detail::TensorOps<T>::fill(*this, v);
    return *this;
  }
  /// Sets every element to 0, in place (PyTorch's zero_).
  Tensor& zero_() { return fill_(T(0)); }

  // ---- autograd ---------------------------------------------------------------------------------------------
  /// Whether autograd records operations on this tensor (a leaf marked with requires_grad_, or a result of such).
  bool requires_grad() const { return impl_ && impl_->meta && impl_->meta->requires_grad; }
  /// Marks a leaf as needing its gradient (floating dtypes only).
  Tensor& requires_grad_(bool on = true);
  /// The accumulated gradient (undefined until a backward pass reaches this tensor).
  Tensor& grad() const { return meta().grad; }
  /// Whether no autograd node produced this tensor (a tensor made by the user, or a result computed without
  /// gradient), as PyTorch's is_leaf.
  bool is_leaf() const { return !(impl_ && impl_->meta && impl_->meta->grad_fn); }
  /// The backward node that produced this tensor (null for a leaf), as PyTorch's grad_fn.
  const std::shared_ptr<autograd::Node>& grad_fn() const { return meta().grad_fn; }
  /// Keeps .grad() for a non-leaf tensor too.
  Tensor& retain_grad() {
    meta().retains_grad = true;
    return *this;
  }
  /// Calls fn(grad) once this tensor's gradient of a backward pass is complete (DDP starts its allreduce here).
  Tensor& register_hook(std::function<void(const Tensor&)> fn);
  /// Backward from a one-element tensor (gradient 1).
  void backward(bool retain_graph = false) const { detail::TensorOps<T>::backward(*this, Tensor(), retain_graph); }
  /// Backward with an explicit gradient of this tensor's shape.
  void backward(const Tensor& gradient, bool retain_graph = false) const {
    detail::TensorOps<T>::backward(*this, gradient, retain_graph);
  }
  /// A new leaf sharing this tensor's data, cut from the graph.
  Tensor detach() const {
    auto p = std::make_shared<TensorImpl<T>>();
    p->storage = impl().storage;
    p->sizes = shape();
    p->strides = strides();
    p->offset = storage_offset();
    p->is_view = true;
    return Tensor(std::move(p));
  }

  /// The autograd slot (requires_grad, grad, grad_fn, hooks), created on first use: for ember's autograd.
  AutogradMeta<T>& meta() const {
    auto& m = impl().meta;
    if (!m) m = std::make_unique<AutogradMeta<T>>();
    return *m;
  }
  /// Whether the autograd slot exists yet (meta() creates it).
  bool has_meta() const { return impl_ && impl_->meta; }

  /// The view (sizes, strides, offset) of this tensor's storage, without autograd and without checks: for ember's
  /// own kernels, which derive the geometry from a checked tensor (every address it reaches lies in the storage).
  Tensor as_strided_raw(const Shape& sz, const Shape& st, std::int64_t offset) const {
    auto p = std::make_shared<TensorImpl<T>>();
    p->storage = impl().storage;
    p->sizes = sz;
    p->strides = st;
    p->offset = offset;
    p->is_view = true;
    return Tensor(std::move(p));
  }

  /// Errors unless a CUDA tensor can be copied to the host in this build.
  void check_host_copy(const char* op) const {
    EMBER_CHECK(device().is_cpu() || detail::part<detail::CudaCopyPart>() != nullptr, op, ": the tensor is on ",
                device().str(), " and ", detail::no_cuda_backend());
  }
  /// Errors (naming `op`) unless this is a CPU tensor.
  void check_cpu(const char* op) const {
    EMBER_CHECK(device().is_cpu(), op, ": expected a CPU tensor, got one on ", device().str());
  }

 private:
  TensorImpl<T>& impl() const {
    EMBER_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
#if EMBER_HOST_ONLY
  [[noreturn, gnu::cold, gnu::noinline]] void device_error() const {
    detail::device_in_host_only_tu(impl().storage->device);  // (impl() throws first for an undefined tensor)
  }
#endif
  Tensor view_of(const Shape& sz, const Shape& st, std::int64_t offset, const ViewOp& op) const {
    Tensor v = as_strided_raw(sz, st, offset);
    if (requires_grad()) detail::TensorOps<T>::record_view(*this, v, op);
    return v;
  }
  // `s` with its -1 (if any) replaced by the size that makes numel() match, or an Error naming `op`. The other
  // sizes pass the checks of checked_numel (a product that overflows is refused, also with a 0 among them).
  Shape infer_size(Shape s, const char* op) const;
  // Strides for viewing this tensor as `s` without copying, if possible: each run of old dims that is merged
  // or split must be contiguous within itself (the rule PyTorch's view follows).
  // `s` must have this tensor's numel (infer_size checked it).
  bool view_strides(const Shape& s, Shape& out) const;

  std::shared_ptr<TensorImpl<T>> impl_;
};

// The larger members, defined here (and in the two headers included below) rather than in the class so that they
// are not inline: with ember::precompiled, which holds Tensor<T> for the common dtypes, a TU then calls the library's
// copies instead of compiling its own.

template <class T>
T Tensor<T>::item() const {
  EMBER_CHECK(numel() == 1, "item: expected a tensor with one element, got shape ", shape().str());
  if (device().is_cpu()) return *data();
  check_host_copy("item");
  T v{};
  const Storage host = std::make_shared<StorageImpl>(static_cast<void*>(&v), sizeof(T), Device::cpu(), nullptr);
  copy_bytes(host, 0, storage(), std::size_t(storage_offset()) * sizeof(T), sizeof(T));
  return v;
}

template <class T>
std::vector<T> Tensor<T>::to_vector() const {
  if (!device().is_cpu()) check_host_copy("to_vector");
  Tensor c = device().is_cpu() ? contiguous() : detail::copy_to_device(*this, Device::cpu(), false);
  return std::vector<T>(c.data(), c.data() + c.numel());
}

}  // namespace ember

// The members defined after the class, in their own headers (each includes this one first):
#include "ember/core/tensor_views.hpp"     // ViewOp and the view members: slice, transpose, view, reshape, ...
#include "ember/core/tensor_autograd.hpp"  // AutogradMeta, requires_grad_, register_hook
