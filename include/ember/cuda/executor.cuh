// ember — the CUDA executor ("where"): one generic kernel template runs an expression's evaluator (the same
// Eval<E> the CPU executor runs, copied into the kernel by value) over every element of the output.
//   - Dense plans (every operand contiguous with the output's geometry) take a grid-stride loop over packs of
//     N elements, N = 16 bytes / the widest element type, so every operand moves with one 128-bit load or store
//     (4 floats, 8 halves); a scalar tail finishes, and misaligned operands run the scalar loop only.
//   - Other plans (broadcast, strided views) walk rows: each thread sets its row pointers from the row's outer
//     coordinates, then strides along the row.
// half/bfloat16 are ember's own 2-byte storage types here as on the host; their conversions are bit-exact
// EMBER_HOST_DEVICE code (core/float16.hpp), and all math runs in float inside the kernel.
// This header needs nvcc (it defines kernels); ops/elementwise.hpp includes it only when __CUDACC__ is defined.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA

#if !defined(__CUDACC__)
#error "ember/cuda/executor.cuh defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"
#include "ember/expr/aliasing.hpp"
#include "ember/expr/evaluator.hpp"

namespace ember::cuda {

namespace detail {

/// Threads per block of the element-wise kernels.
inline constexpr int kThreads = 256;

/// A trivially copyable tuple (std::tuple is not trivially copyable, so it cannot be a kernel parameter).
template <std::size_t I, class T>
struct TupleLeaf {
  T value;
};
template <class Seq, class... T>
struct TupleBase;
template <std::size_t... I, class... T>
struct TupleBase<std::index_sequence<I...>, T...> : TupleLeaf<I, T>... {};
template <class... T>
struct Tuple : TupleBase<std::index_sequence_for<T...>, T...> {};
template <std::size_t I, class T>
EMBER_HOST_DEVICE EMBER_INLINE T& get(TupleLeaf<I, T>& t) {
  return t.value;
}
template <std::size_t I, class T>
EMBER_HOST_DEVICE EMBER_INLINE const T& get(const TupleLeaf<I, T>& t) {
  return t.value;
}

/// One output and the evaluator of the expression written into it.
template <class T, class Ev>
struct Output {
  using value_type = T;
  expr::OperandEval<T> out;
  Ev ev;
};

struct NoSlots {
  EMBER_HOST_DEVICE void set_row(const std::int64_t*, int) {}
};

/// Everything a kernel needs: outputs with their evaluators, the slot table of multi-output passes, and the pass's
/// check (a bool evaluator, expr::Eval<expr::NoCheck> for none) with the flag it sets.
template <bool Slots, class Check, class... P>
struct Body {
  using Table = std::conditional_t<Slots, expr::SlotTable, NoSlots>;
  static constexpr std::size_t n = sizeof...(P);
  static constexpr bool kChecks = !std::is_same_v<Check, expr::Eval<expr::NoCheck>>;
  Tuple<P...> outs;
  Table slots;
  Check check;
  std::int64_t* flag;  // set to 1 when the check is true anywhere (with kChecks)

  EMBER_HOST_DEVICE const expr::SlotTable* slot_ptr() const {
    if constexpr (Slots) return &slots;
    else return nullptr;
  }
  EMBER_HOST_DEVICE void set_row(const std::int64_t* c, int outer) {
    slots.set_row(c, outer);
    check.set_row(c, outer);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (..., (get<K>(outs).out.set_row(c, outer), get<K>(outs).ev.set_row(c, outer)));
    }(std::index_sequence_for<P...>{});
  }
};

/// Writes every output at one index: every value first (the check's too), then every store (a store cannot clobber
/// what a later expression reads, so an in-place output is read before it is written and sub-expressions shared
/// between outputs are computed once). Returns the check's value.
template <class B, class I, std::size_t... K>
__device__ EMBER_INLINE bool step_one(const B& b, I ix, std::index_sequence<K...>) {
  Tuple<decltype(get<K>(b.outs).ev.eval(ix))...> vals;
  (..., (get<K>(vals) = get<K>(b.outs).ev.eval(ix)));
  const bool flag = b.check.eval(ix);
  (..., (get<K>(b.outs).out.at(ix) =
             convert<typename std::remove_cvref_t<decltype(get<K>(b.outs))>::value_type>(get<K>(vals))));
  return flag;
}

/// Writes N consecutive elements of every output from index i, with one aligned load per operand and one
/// aligned store per output. Returns whether the check was true at any of them.
template <int N, class B, std::size_t... K>
__device__ EMBER_INLINE bool step_pack(const B& b, std::int64_t i, const expr::SlotTable* sl,
                                       std::index_sequence<K...>) {
  Tuple<decltype(get<K>(b.outs).ev.template eval_pack<N>(i, sl))...> vals;
  (..., (get<K>(vals) = get<K>(b.outs).ev.template eval_pack<N>(i, sl)));
  bool flag = false;
  if constexpr (B::kChecks) {
    const auto c = b.check.template eval_pack<N>(i, sl);
    EMBER_UNROLL for (int k = 0; k < N; ++k) flag = flag || bool(c.v[k]);
  }
  auto store = [&](const auto& o, const auto& p) {
    using T = typename std::remove_cvref_t<decltype(o)>::value_type;
    expr::RawPack<T, N> r;
    EMBER_UNROLL for (int k = 0; k < N; ++k) r.v[k] = convert<T>(p.v[k]);
    *reinterpret_cast<expr::RawPack<T, N>*>(o.out.base + i) = r;
  };
  (..., store(get<K>(b.outs), get<K>(vals)));
  return flag;
}

/// The end of a kernel with a check: one thread of each block whose threads saw the check true sets the flag.
/// Every writer writes 1, so no atomic is needed; every thread of the block must call it.
template <class B>
__device__ EMBER_INLINE void set_flag(const B& b, bool bad) {
  if constexpr (B::kChecks) {
    if (__syncthreads_or(bad) && threadIdx.x == 0 && threadIdx.y == 0) *b.flag = 1;
  }
}

/// The dense kernel: packs of N over [0, n / N * N) when `vec`, then single elements. Grid-stride loops.
template <int N, class B>
__global__ void __launch_bounds__(kThreads) linear_kernel(const __grid_constant__ B body, std::int64_t n, bool vec) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const expr::SlotTable* sl = body.slot_ptr();
  constexpr auto seq = std::make_index_sequence<B::n>{};
  const std::int64_t nvec = vec ? n / N : 0;
  bool bad = false;
  for (std::int64_t v = tid; v < nvec; v += stride) bad = step_pack<N>(body, v * N, sl, seq) || bad;
  for (std::int64_t i = nvec * N + tid; i < n; i += stride) bad = step_one(body, expr::LinearIdx{i, sl}, seq) || bad;
  set_flag(body, bad);
}

/// The walk of a kernel over a plan's rows (`shape`: its extents, outer dims first; rows of length shape[outer], the
/// inner dim), cut into chunks of `chunk` elements so that a few long rows still fill the device. Work item w is
/// chunk w % nchunks of row w / nchunks; threadIdx.y picks a work item, threadIdx.x strides along it. For each work
/// item, row(coords) gets the row's outer coordinates (a thread sets its row pointers once per work item), then
/// elem(r, j) runs for the thread's elements j of row r, in increasing order. The strided element-wise kernel and
/// the strided reduction walk rows so.
template <class RowFn, class ElemFn>
__device__ void for_row_chunks(const Shape& shape, std::int64_t nrows, std::int64_t chunk, RowFn&& row_fn,
                               ElemFn&& elem) {
  const int outer = shape.n - 1;
  const std::int64_t row = shape[outer];
  const std::int64_t nchunks = (row + chunk - 1) / chunk;
  for (std::int64_t w = std::int64_t(blockIdx.x) * blockDim.y + threadIdx.y; w < nrows * nchunks;
       w += std::int64_t(gridDim.x) * blockDim.y) {
    const std::int64_t r = w / nchunks, j0 = (w % nchunks) * chunk, j1 = j0 + chunk < row ? j0 + chunk : row;
    std::int64_t coords[kMaxDims];
    std::int64_t t = r;
    for (int d = outer - 1; d >= 0; --d) {
      coords[d] = t % shape[d];
      t /= shape[d];
    }
    row_fn(coords, outer);
    for (std::int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) elem(r, j);
  }
}

/// The strided kernel: the plan's rows walked by for_row_chunks.
template <class B>
__global__ void __launch_bounds__(kThreads) strided_kernel(const __grid_constant__ B body, Shape shape,
                                                           std::int64_t nrows, std::int64_t chunk) {
  B local = body;  // row pointers are per thread
  constexpr auto seq = std::make_index_sequence<B::n>{};
  bool bad = false;
  for_row_chunks(
      shape, nrows, chunk, [&](const std::int64_t* coords, int outer) { local.set_row(coords, outer); },
      [&](std::int64_t, std::int64_t j) { bad = step_one(local, expr::RowIdx{j, local.slot_ptr()}, seq) || bad; });
  set_flag(local, bad);
}

/// Block shape and chunk length for walking rows of length `row`: threads along the row (a power of two from 32
/// to kThreads), the rest of the block across rows; rows longer than 16 block widths are cut into chunks.
struct RowGeometry {
  unsigned bx, by;
  std::int64_t chunk;
};
inline RowGeometry row_geometry(std::int64_t row) {
  unsigned bx = kThreads;
  if (row < kThreads) {
    bx = 32;
    while (bx < row) bx *= 2;
  }
  return {bx, unsigned(kThreads) / bx, std::int64_t(bx) * 16};
}

/// Streaming multiprocessors of a device (cached).
inline int sm_count(int dev) {
  static int cache[kMaxDevices] = {};
  if (cache[dev] == 0) {
    int n = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cache[dev] = n > 0 ? n : 1;
  }
  return cache[dev];
}

/// Blocks for a grid-stride loop over `work` items of kThreads per block: enough to fill the device a few
/// times over, never more than the work needs.
inline unsigned grid_for(std::int64_t work, int dev) {
  const std::int64_t need = (work + kThreads - 1) / kThreads;
  const std::int64_t cap = std::int64_t(sm_count(dev)) * (2048 / kThreads) * 4;
  return unsigned(std::max<std::int64_t>(1, std::min(need, cap)));
}

template <class B>
void check_body() {
  static_assert(std::is_trivially_copyable_v<B>,
                "ember: an evaluator must be trivially copyable to travel into a CUDA kernel (it holds pointers and "
                "strides only)");
  static_assert(sizeof(B) <= 32000, "ember: the expression is too large for one CUDA kernel's parameters; "
                                    "materialise part of it into a tensor");
}

/// Runs a body over a plan on device `dev`: the dense kernel when the plan is linear, the row kernel otherwise.
/// `aligned`: every operand's pointer is aligned for packs of N (checked by the caller).
template <int N, class B>
void launch(const B& body, const expr::Plan& p, int dev, bool aligned) {
  check_body<B>();
  const std::int64_t n = p.numel();
  if (n == 0) return;
  const cudaStream_t s = current_stream(dev).handle();
  if (p.linear) {
    const std::int64_t work = aligned ? n / N + (n % N) : n;
    linear_kernel<N, B><<<grid_for(work, dev), kThreads, 0, s>>>(body, n, aligned);
  } else {
    const std::int64_t row = p.row_len();
    const std::int64_t nrows = n / row;
    const RowGeometry g = row_geometry(row);
    const std::int64_t items = nrows * ((row + g.chunk - 1) / g.chunk);
    const std::int64_t blocks = std::min<std::int64_t>((items + g.by - 1) / g.by,
                                                       std::int64_t(sm_count(dev)) * (2048 / kThreads) * 4);
    strided_kernel<B><<<unsigned(blocks), dim3(g.bx, g.by), 0, s>>>(body, p.shape, nrows, g.chunk);
  }
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// Elements per 16-byte pack for element types up to `bytes` wide.
constexpr int pack_width(std::size_t bytes) { return bytes == 0 || bytes >= 16 ? 1 : int(16 / bytes); }

inline bool aligned_to(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

/// True when every tensor leaf of e starts on a multiple of N elements' bytes.
template <int N, class E>
bool leaves_aligned(const E& e) {
  bool ok = true;
  expr::visit_leaves(e, [&](const auto& leaf) {
    ok = ok && aligned_to(leaf.tensor().data(), N * sizeof(*leaf.tensor().data()));
  });
  return ok;
}

}  // namespace detail

/// out = e on out's CUDA device (out already has the broadcast shape of e, or e broadcasts to it). One kernel,
/// aliasing-safe (as if e were evaluated into a temporary first), on the device's current stream.
template <class T, class E>
void assign(const Tensor<T>& out, const E& e, const char* op = "assign") {
  static_assert(expr::no_slots_v<E>, "ember: this expression reads slots (expr::slot / LeafRef), which only a "
                                     "multi-output pass with a slot source (ops::assign_multi) evaluates");
  const Device dev = out.device();
  EMBER_CHECK(dev.is_cuda(), op, ": the CUDA executor got an output on ", dev.str());
  DeviceGuard guard(dev.index);
  constexpr int N = detail::pack_width(std::max(sizeof(T), expr::max_leaf_bytes<E>::value));
  // Fast path: every operand dense with exactly out's shape (or out itself). No plan to build.
  bool dense = out.is_contiguous();
  expr::visit_leaves(e, [&](const auto& leaf) {
    const auto& t = leaf.tensor();
    dense = dense && t.defined() && t.device() == dev && t.shape() == out.shape() && t.is_contiguous() &&
            (t.storage() != out.storage() || static_cast<const void*>(t.data()) == static_cast<const void*>(out.data()));
  });
  if (dense) {
    const expr::Plan& lp = expr::linear_plan();
    int kk = 1;
    auto ev = expr::make_eval(e, lp, kk);
    using P = detail::Output<T, decltype(ev)>;
    detail::Body<false, expr::Eval<expr::NoCheck>, P> body{};
    detail::get<0>(body.outs) = P{expr::OperandEval<T>(out.data(), lp, 0), ev};
    expr::Plan p = lp;
    p.shape = Shape{out.numel()};
    const bool aligned = detail::aligned_to(out.data(), N * sizeof(T)) && detail::leaves_aligned<N>(e);
    detail::launch<N>(body, p, dev.index, aligned);
    out.bump_version();
    return;
  }
  expr::check_writable(out, op);
  const Shape space = out.shape();
  expr::PlanBuilder b(space);
  const int ko = b.add(out.shape(), out.strides());
  Device d = dev;
  bool have = true;
  const void* ptrs[expr::kMaxOperands] = {out.data()};
  const StorageImpl* stor[expr::kMaxOperands] = {out.storage().get()};
  int k = 1;
  expr::visit_leaves(e, [&](const auto& leaf) {
    EMBER_CHECK(k < expr::kMaxOperands, op, ": expression has too many operands (at most ", expr::kMaxOperands, ")");
    ptrs[k] = leaf.tensor().defined() ? static_cast<const void*>(leaf.tensor().data()) : nullptr;
    stor[k] = leaf.tensor().defined() ? leaf.tensor().storage().get() : nullptr;
    ++k;
  });
  expr::add_leaves(e, b, d, have, op);
  const Shape es = e.shape();
  EMBER_CHECK(broadcast_shapes(es, space, op) == space, op, ": cannot write a result of shape ", es.str(),
              " into a tensor of shape ", space.str());
  if (expr::overlaps_badly(out, b, ko, k, ptrs, stor)) {
    Tensor<T> tmp = empty<T>(space, dev);
    assign(tmp, e, op);
    assign(out, expr::TensorLeaf<T, false>{&tmp}, op);
    return;
  }
  const expr::Plan p = b.collapse();
  int kk = 1;
  auto ev = expr::make_eval(e, p, kk);
  using P = detail::Output<T, decltype(ev)>;
  detail::Body<false, expr::Eval<expr::NoCheck>, P> body{};
  detail::get<0>(body.outs) = P{expr::OperandEval<T>(out.data(), p, ko), ev};
  const bool aligned = detail::aligned_to(out.data(), N * sizeof(T)) && detail::leaves_aligned<N>(e);
  detail::launch<N>(body, p, dev.index, aligned);
  out.bump_version();
}

/// Several outputs of one shape from several expressions in ONE kernel over `space` (ops::assign_multi; cpu::
/// assign_multi is its twin, with the same aliasing rule): the tensors of `slot_src` fill the slot table for the
/// expressions' LeafRef nodes; an output may be read with its own geometry (an in-place update), any other overlap
/// goes through temporaries. With a check (not expr::NoCheck), `flag` (one int64 on the outputs' device) is set to
/// 1 where the check is true anywhere; it is never cleared here. Asynchronous, on the device's current stream.
template <class... T, class... E, class S, class C = expr::NoCheck>
void assign_multi(const std::tuple<Tensor<T>...>& outs, const std::tuple<E...>& es, const Shape& space,
                  const S& slot_src, const char* op = "backward", const C& check = {}, std::int64_t* flag = nullptr) {
  constexpr int n = sizeof...(T);
  expr::MultiPass<n> m = expr::plan_multi_pass(outs, es, space, slot_src, check, op);
  const Device dev = m.outs[0].device;
  EMBER_CHECK(dev.is_cuda(), op, ": the CUDA executor got an output on ", dev.str());
  constexpr bool checks = !std::is_same_v<C, expr::NoCheck>;
  EMBER_CHECK(!checks || flag != nullptr, op, ": a check needs a flag");
  if (space.numel() == 0) return;
  DeviceGuard guard(dev.index);
  if (!m.in_place) {
    // An operand reads an output's memory with another geometry: the pass writes fresh tensors, then copies them.
    auto tmp = std::make_tuple(empty<T>(space, dev)...);
    assign_multi(tmp, es, space, slot_src, op, check, flag);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (..., assign(std::get<I>(outs), expr::TensorLeaf<T, false>{&std::get<I>(tmp)}, op));
    }(std::index_sequence_for<T...>{});
    return;
  }
  constexpr std::size_t widest = std::max({sizeof(T)..., expr::max_leaf_bytes<E>::value...,
                                           expr::max_leaf_bytes<S>::value, expr::max_leaf_bytes<C>::value});
  constexpr int N = detail::pack_width(widest);
  const expr::Plan p = m.b.collapse();
  const expr::SlotTable slots = m.slots(p, slot_src);
  bool aligned = true;
  for (int k = 0; k < m.nslots; ++k) aligned = aligned && detail::aligned_to(m.ins[k].data, N * m.slot_size[k]);
  std::apply([&](const auto&... o) { aligned = aligned && (... && detail::aligned_to(o.data(), N * sizeof(*o.data()))); },
             outs);
  std::apply([&](const auto&... e) { aligned = aligned && (... && detail::leaves_aligned<N>(e)); }, es);
  aligned = aligned && detail::leaves_aligned<N>(check);
  const auto ev = m.evals(p, es, check);
  const auto& evs = ev.first;
  const auto& chk = ev.second;
  using Evs = std::remove_cvref_t<decltype(evs)>;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    using B = detail::Body<true, std::remove_cvref_t<decltype(chk)>, detail::Output<T, std::tuple_element_t<I, Evs>>...>;
    B body{};
    (..., (detail::get<I>(body.outs) = {expr::OperandEval<T>(std::get<I>(outs).data(), p, int(I)), std::get<I>(evs)}));
    body.slots = slots;
    body.check = chk;
    body.flag = flag;
    detail::launch<N>(body, p, dev.index, aligned);
  }(std::index_sequence_for<T...>{});
  std::apply([](const auto&... o) { (..., o.bump_version()); }, outs);
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
