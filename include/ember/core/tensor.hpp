// ember — Tensor<T>: a cheap shared handle to (storage, shape, strides, offset, autograd slot), like
// torch::Tensor. Copying a handle shares the data; clone() copies it. Views share storage.
//
// The geometry of views is computed here. What needs a higher layer (running a loop, recording a backward node,
// running backward) goes through detail::TensorOps<T>, which autograd/tensor_ops.hpp defines; include
// <ember/ember.hpp> to use those members.
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

/// How a view was derived from its base; autograd replays it (or its inverse) in backward.
struct ViewOp {
  /// Which view function made the view: view/reshape, permute/transpose, expand, slice/narrow, select/operator[].
  enum Kind : unsigned char { Reshape, Permute, Expand, Slice, Select } kind = Reshape;  ///< The view's kind.
  Shape perm{};  ///< Permute: output dim i is base dim perm[i].
  int dim = 0;   ///< Slice and Select: the dim sliced or selected.
  ///@{
  /// Slice: the (normalised) start, end and step along `dim`; Select uses `start` as the index.
  std::int64_t start = 0, end = 0, step = 1;
  ///@}
};

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
    EMBER_CHECK(device().is_cpu() || detail::cuda_copy != nullptr, op, ": the tensor is on ", device().str(),
                " and ", detail::no_cuda_backend());
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

// The larger members, defined here rather than in the class so that they are not inline: with ember::precompiled,
// which holds Tensor<T> for the common dtypes, a TU then calls the library's copies instead of compiling its own.

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

template <class T>
Tensor<T> Tensor<T>::slice(std::int64_t d, std::int64_t start, std::int64_t end, std::int64_t step) const {
  const int dd = wrap_dim(d, shape(), "slice");
  EMBER_CHECK(step > 0, "slice: step must be positive, got ", step);
  const std::int64_t n = shape()[dd];
  auto clampi = [n](std::int64_t v) { return v < 0 ? (v + n < 0 ? 0 : v + n) : (v > n ? n : v); };
  start = clampi(start);
  end = clampi(end);
  if (end < start) end = start;
  Shape sz = shape(), st = strides();
  sz[dd] = end > start ? (end - start - 1) / step + 1 : 0;  // (no overflow for any step)
  // A step past the end leaves at most one element, whose stride does not matter: keep the old one then.
  if (detail::mul_overflow(st[dd], step, &st[dd])) st[dd] = strides()[dd];
  std::int64_t off = 0;
  EMBER_CHECK(!detail::mul_overflow(start, strides()[dd], &off) && !detail::add_overflow(off, storage_offset(), &off),
              "slice: the offset of element ", start, " of dim ", dd, " (stride ", strides()[dd],
              ") overflows int64 (shape ", shape().str(), ")");
  return view_of(sz, st, off, {ViewOp::Slice, {}, dd, start, end, step});
}

template <class T>
Tensor<T> Tensor<T>::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  const int dd = wrap_dim(d, shape(), "narrow");
  const std::int64_t n = shape()[dd];
  EMBER_CHECK(start >= -n && start <= n, "narrow: start ", start, " is out of range for dim ", dd, " of shape ",
              shape().str(), " (expected a start in [", -n, ", ", n, "])");
  if (start < 0) start += n;  // counts from the end, as in PyTorch
  EMBER_CHECK(length >= 0 && length <= n - start, "narrow: start ", start, " + length ", length,
              " is out of bounds for dim ", dd, " of shape ", shape().str(), " (expected 0 <= length <= ", n - start,
              ")");
  return slice(dd, start, start + length);
}

template <class T>
Tensor<T> Tensor<T>::select(std::int64_t d, std::int64_t i) const {
  const int dd = wrap_dim(d, shape(), "select");
  const std::int64_t n = shape()[dd];
  EMBER_CHECK(i >= -n && i < n, "select: index ", i, " is out of range for dim ", dd, " of size ", n,
              " (shape ", shape().str(), ")");
  if (i < 0) i += n;
  Shape sz = shape(), st = strides();
  sz.erase(dd);
  st.erase(dd);
  return view_of(sz, st, storage_offset() + i * strides()[dd], {ViewOp::Select, {}, dd, i, i + 1, 1});
}

template <class T>
Tensor<T> Tensor<T>::transpose(std::int64_t d0, std::int64_t d1) const {
  const int a = wrap_dim(d0, shape(), "transpose"), b = wrap_dim(d1, shape(), "transpose");
  Shape sz = shape(), st = strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  Shape perm;
  for (int i = 0; i < dim(); ++i) perm.push_back(i);
  std::swap(perm[a], perm[b]);
  return view_of(sz, st, storage_offset(), {ViewOp::Permute, perm});
}

template <class T>
Tensor<T> Tensor<T>::permute(const std::vector<std::int64_t>& order) const {
  EMBER_CHECK(int(order.size()) == dim(), "permute: got ", order.size(), " dims for a tensor of shape ",
              shape().str());
  Shape sz, st, perm;
  bool seen[kMaxDims] = {};
  for (auto o : order) {
    const int d = wrap_dim(o, shape(), "permute");
    EMBER_CHECK(!seen[d], "permute: dim ", d, " appears twice");
    seen[d] = true;
    sz.push_back(shape()[d]);
    st.push_back(strides()[d]);
    perm.push_back(d);
  }
  return view_of(sz, st, storage_offset(), {ViewOp::Permute, perm});
}

template <class T>
Tensor<T> Tensor<T>::view(Shape s) const {
  s = infer_size(s, "view");
  Shape st;
  EMBER_CHECK(view_strides(s, st), "view: a tensor of shape ", shape().str(), " and strides ", strides().str(),
              " cannot be viewed as ", s.str(), " without a copy; call reshape() or contiguous() first");
  return view_of(s, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::reshape(Shape s) const {
  s = infer_size(s, "reshape");
  Shape st;
  if (view_strides(s, st)) return view_of(s, st, storage_offset(), {});
  return contiguous().view(s);
}

template <class T>
Tensor<T> Tensor<T>::expand(Shape s) const {
  EMBER_CHECK(s.n >= dim(), "expand: the target ", s.str(), " has fewer dims than the tensor ", shape().str());
  const Shape target = s;
  Shape st;
  st.n = s.n;
  for (int i = 0; i < s.n; ++i) {
    const int j = dim() - s.n + i;
    if (j < 0) {
      EMBER_CHECK(s[i] >= 0, "expand: invalid size ", s[i], " for the new leading dim ", i, " (target ",
                  target.str(), "; -1 is allowed only for an existing dim)");
      st[i] = 0;
      continue;
    }
    if (s[i] == -1) s[i] = shape()[j];
    EMBER_CHECK(s[i] >= 0, "expand: invalid size ", s[i], " in the target ", target.str(),
                " (expected sizes >= 0, or -1 to keep a size)");
    EMBER_CHECK(shape()[j] == s[i] || shape()[j] == 1, "expand: cannot expand shape ", shape().str(), " to ",
                target.str(), " (dim ", i, ": ", shape()[j], " vs ", s[i], ")");
    st[i] = shape()[j] == s[i] ? strides()[j] : 0;
  }
  checked_numel(s, "expand");
  return view_of(s, st, storage_offset(), {ViewOp::Expand, {}});
}

template <class T>
Tensor<T> Tensor<T>::squeeze() const {
  Shape sz, st;
  for (int i = 0; i < dim(); ++i)
    if (shape()[i] != 1) {
      sz.push_back(shape()[i]);
      st.push_back(strides()[i]);
    }
  return view_of(sz, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::squeeze(std::int64_t d) const {
  const int dd = wrap_dim(d, shape(), "squeeze");
  Shape sz = shape(), st = strides();
  if (sz[dd] == 1) {
    sz.erase(dd);
    st.erase(dd);
  }
  return view_of(sz, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::unsqueeze(std::int64_t d) const {
  const int n = dim() + 1;
  EMBER_CHECK(d >= -n && d < n, "unsqueeze: dim ", d, " is out of range for a tensor of shape ", shape().str(),
              " (expected a dim in [", -n, ", ", n - 1, "])");
  const int dd = int(d < 0 ? d + n : d);
  Shape sz = shape(), st = strides();
  // The stride of a size-1 dim is never used to address memory; this is PyTorch's choice, or 1 past the end.
  std::int64_t s = 1;
  if (dd < dim() && detail::mul_overflow(strides()[dd], shape()[dd], &s)) s = 1;
  sz.insert(dd, 1);
  st.insert(dd, s);
  return view_of(sz, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::flatten(std::int64_t start, std::int64_t end) const {
  if (dim() == 0) return reshape(Shape{1});
  const int a = wrap_dim(start, shape(), "flatten"), b = wrap_dim(end, shape(), "flatten");
  EMBER_CHECK(a <= b, "flatten: start dim ", a, " is after end dim ", b);
  Shape s;
  for (int i = 0; i < a; ++i) s.push_back(shape()[i]);
  std::int64_t m = 1;
  bool over = false;
  for (int i = a; i <= b; ++i) over |= detail::mul_overflow(m, shape()[i], &m);
  EMBER_CHECK(!over, "flatten: dims ", a, "..", b, " of shape ", shape().str(), " have too many elements");
  s.push_back(m);
  for (int i = b + 1; i < dim(); ++i) s.push_back(shape()[i]);
  return reshape(s);
}

template <class T>
Tensor<T>& Tensor<T>::requires_grad_(bool on) {
  if constexpr (!is_floating_v<T>) {
    EMBER_CHECK(!on, "requires_grad_: only floating-point tensors can require gradients, this one is ",
                dtype_name<T>());
  }
  EMBER_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad; use detach() to get a "
                         "leaf from the result of an operation");
  EMBER_CHECK(!on || !is_inference() || detail::inference_mode_flag(),
              "requires_grad_: this tensor (shape ", shape().str(), ") was created under InferenceMode and cannot "
              "require gradients outside it; clone() it outside InferenceMode to get a normal tensor");
  meta().requires_grad = on;
  return *this;
}

template <class T>
Tensor<T>& Tensor<T>::register_hook(std::function<void(const Tensor&)> fn) {
  EMBER_CHECK(requires_grad(), "register_hook: the tensor does not require grad");
  meta().hooks.push_back(std::move(fn));
  return *this;
}

template <class T>
Shape Tensor<T>::infer_size(Shape s, const char* op) const {
  int infer = -1;
  std::int64_t known = 1;
  bool zero = false, over = false;
  for (int i = 0; i < s.n; ++i) {
    if (s[i] == -1) {
      EMBER_CHECK(infer < 0, op, ": only one dim can be -1, got ", s.str());
      infer = i;
    } else {
      EMBER_CHECK(s[i] >= 0, op, ": invalid size ", s[i], " in ", s.str());
      if (s[i] == 0) zero = true;
      else over |= detail::mul_overflow(known, s[i], &known);
    }
  }
  EMBER_CHECK(!over, op, ": shape ", s.str(), " has too many elements (expected the product of its nonzero sizes "
              "to fit in int64; the tensor has shape ", shape().str(), ")");
  if (zero) known = 0;
  if (infer >= 0) {
    EMBER_CHECK(known != 0 && numel() % known == 0, op, ": shape ", s.str(), " is invalid for a tensor of ",
                numel(), " elements (shape ", shape().str(), ")");
    s[infer] = numel() / known;
  }
  EMBER_CHECK(s.numel() == numel(), op, ": shape ", s.str(), " is invalid for a tensor of ", numel(),
              " elements (shape ", shape().str(), ")");
  return s;
}

template <class T>
bool Tensor<T>::view_strides(const Shape& s, Shape& out) const {
  if (numel() == 0 || s.n == 0) {
    out = contiguous_strides(s);
    return true;
  }
  out = Shape();
  out.n = s.n;
  // Old dims without size-1 ones (numel() > 0, so every size is >= 1).
  std::int64_t os[kMaxDims] = {}, ost[kMaxDims] = {};
  int on = 0;
  for (int i = 0; i < dim(); ++i)
    if (shape()[i] != 1) {
      os[on] = shape()[i];
      ost[on] = strides()[i];
      ++on;
    }
  int oi = 0, ni = 0;
  while (ni < s.n) {
    if (s[ni] == 1) {  // any stride will do; PyTorch's choice, unless it overflows
      std::int64_t st = 1;
      if (oi < on && detail::mul_overflow(ost[oi], os[oi], &st)) st = 1;
      out[ni++] = st;
      continue;
    }
    // Take a chunk of old dims [oi, oj) and new dims [ni, nj) with equal products. Both products stay within
    // numel(); the bounds only matter if the numels differed.
    if (oi >= on) return false;
    int oj = oi, nj = ni;
    std::int64_t po = os[oj++], pn = s[nj++];
    while (po != pn) {
      if (po < pn) {
        if (oj >= on) return false;
        po *= os[oj++];
      } else {
        if (nj >= s.n) return false;
        pn *= s[nj++];
      }
    }
    for (int k = oi; k + 1 < oj; ++k) {
      std::int64_t inner = 0;  // old chunk not contiguous?
      if (detail::mul_overflow(ost[k + 1], os[k + 1], &inner) || ost[k] != inner) return false;
    }
    // New strides from the innermost old one (the chunk's outermost stride is not formed: it may not fit).
    std::int64_t st = ost[oj - 1];
    for (int k = nj - 1; k >= ni; --k) {
      out[k] = st;
      if (k > ni) st *= s[k];
    }
    oi = oj;
    ni = nj;
  }
  return true;
}

template <class T>
struct AutogradMeta {
  bool requires_grad = false;                      ///< Tensor::requires_grad().
  bool retains_grad = false;                       ///< Set by Tensor::retain_grad(): a non-leaf keeps its grad.
  Tensor<T> grad;                                  ///< The accumulated gradient (Tensor::grad()).
  std::shared_ptr<autograd::Node> grad_fn;         ///< The node that produced this tensor (null for leaves).
  std::weak_ptr<autograd::Node> accumulator;       ///< A leaf's gradient sink, made on first use.
  std::vector<std::function<void(const Tensor<T>&)>> hooks;  ///< Tensor::register_hook's callbacks, in order.
};

}  // namespace ember
