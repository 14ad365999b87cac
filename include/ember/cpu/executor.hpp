// ember — the CPU executor ("where"): runs an evaluator over a plan in one threaded pass. Dense plans take a flat
// loop the compiler vectorises; others walk rows (outer coordinates, then a strided inner loop).
#pragma once

#include <atomic>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/detail/cast16.hpp"
#include "ember/cpu/detail/stream_store.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/aliasing.hpp"
#include "ember/expr/evaluator.hpp"

namespace ember::cpu {

/// Elements per chunk below which a loop stays on one thread.
inline constexpr std::int64_t kGrain = 32768;

/// Runs body over every index of the plan, in parallel chunks. Body provides set_row(coords, outer) and
/// run_linear / run_row over an index range, which return whether the pass's check was true there; it is copied per
/// chunk so each thread has its own row pointers. Returns whether any chunk's check was true.
template <class Body>
bool run_plan(const expr::Plan& p, const Body& body) {
  const std::int64_t n = p.numel();
  if (n == 0) return false;
  std::atomic<bool> any{false};
  if (p.linear) {
    parallel_for(0, n, kGrain, [&](std::int64_t a, std::int64_t b) {
      Body local = body;
      if (local.run_linear(a, b)) any.store(true, std::memory_order_relaxed);
    });
    return any.load();
  }
  const std::int64_t row = p.row_len();
  const int outer = p.outer_dims();
  parallel_for(0, n, kGrain, [&](std::int64_t a, std::int64_t b) {
    Body local = body;
    std::int64_t coords[kMaxDims] = {};
    std::int64_t o = a / row, j = a % row;
    for (int d = outer - 1; d >= 0; --d) {  // unflatten the outer index
      coords[d] = o % p.shape[d];
      o /= p.shape[d];
    }
    std::int64_t i = a;
    bool found = false;
    while (i < b) {
      local.set_row(coords, outer);
      const std::int64_t j1 = std::min(row, j + (b - i));
      found = local.run_row(j, j1) || found;
      i += j1 - j;
      j = 0;
      for (int d = outer - 1; d >= 0; --d) {  // next row
        if (++coords[d] < p.shape[d]) break;
        coords[d] = 0;
      }
    }
    if (found) any.store(true, std::memory_order_relaxed);
  });
  return any.load();
}

/// Writes each expression of a pack into its output: out_k[i] = e_k(i), all in one loop over one plan, and folds
/// the pass's check (a bool evaluator; expr::Eval<expr::NoCheck> for none) over the same indices.
/// `slots` holds the operands that LeafRef nodes read (multi-output passes); unused otherwise.
struct NoSlots {
  void set_row(const std::int64_t*, int) {}
};

template <bool Slots, class Check, class... Pairs>
struct AssignBody {
  template <class P>
  using out_t = std::remove_pointer_t<decltype(P::first_type::base)>;  // a pair's output element type
  using Table = std::conditional_t<Slots, expr::SlotTable, NoSlots>;
  static constexpr bool kChecks = !std::is_same_v<Check, expr::Eval<expr::NoCheck>>;
  std::tuple<Pairs...> pairs;  // each pair: (OperandEval<T> out, Eval<E> ev)
  Table slots;
  Check check;

  void set_row(const std::int64_t* c, int outer) {
    slots.set_row(c, outer);
    check.set_row(c, outer);
    std::apply([&](auto&... pr) { (..., (pr.first.set_row(c, outer), pr.second.set_row(c, outer))); }, pairs);
  }
  bool run_linear(std::int64_t a, std::int64_t b) {
    return std::apply([&](auto&... pr) { return run<expr::LinearIdx>(a, b, &slots, check, pr...); }, pairs);
  }
  bool run_row(std::int64_t a, std::int64_t b) {
    return std::apply([&](auto&... pr) { return run<expr::RowIdx>(a, b, &slots, check, pr...); }, pairs);
  }
  /// Indices [a, b) of a dense space, straight from the pairs: no body to build and copy (small ops pay for
  /// every copy of these structs).
  static void run_dense(std::int64_t a, std::int64_t b, const Pairs&... pr)
    requires(!Slots && !kChecks)
  {
    static constexpr Table none{};
    run<expr::LinearIdx>(a, b, &none, Check{}, pr...);
  }
  /// run_linear over [a, b) of a linear plan (one dim, unit strides), with the outputs streamed
  /// (cpu/detail/stream_store.hpp): each block of values is computed by run_linear's own loop (so streaming adds no
  /// loop per expression) into L1-resident buffers, one per output, then copied out with streaming stores; the
  /// thread's stores are fenced at the end. Returns whether the check was true anywhere.
  bool run_streamed(std::int64_t a, std::int64_t b) {
    // Blocks of a multiple of 64 elements, at multiples of the block size in the whole pass: so with outputs on
    // 64-byte boundaries (as the allocator gives them) every block is whole lines, and only a chunk's first and last
    // lines, shared with the neighbouring chunk, take ordinary stores (a line written partly with ordinary stores
    // and partly with streaming ones is written back twice).
    constexpr std::size_t kRowBytes = (std::size_t(0) + ... + sizeof(out_t<Pairs>));
    constexpr std::int64_t kBlock =
        std::max<std::int64_t>(64, std::int64_t(detail::stream::kBlockBytes / kRowBytes) / 64 * 64);
    alignas(64) unsigned char raw[std::size_t(kBlock) * kRowBytes + 64 * sizeof...(Pairs)];
    const auto dst = std::apply([](const auto&... pr) { return std::make_tuple(pr.first.base...); }, pairs);
    std::tuple<out_t<Pairs>*...> buf;
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      std::size_t off = 0;
      (..., (std::get<K>(buf) = reinterpret_cast<std::remove_reference_t<decltype(*std::get<K>(buf))>*>(raw + off),
             off += (std::size_t(kBlock) * sizeof(*std::get<K>(buf)) + 63) / 64 * 64));
    }(std::index_sequence_for<Pairs...>{});
    bool bad = false;
    for (std::int64_t s = a, e = 0; s < b; s = e) {
      e = std::min(b, (s / kBlock + 1) * kBlock);
      const std::int64_t len = e - s;
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (..., (std::get<K>(pairs).first.base = detail::stream::rebased(std::get<K>(buf), s)));
      }(std::index_sequence_for<Pairs...>{});
      bad = run_linear(s, s + len) || bad;
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (..., detail::stream::stream_copy(std::get<K>(dst) + s, std::get<K>(buf),
                                          std::size_t(len) * sizeof(*std::get<K>(dst))));
      }(std::index_sequence_for<Pairs...>{});
    }
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (..., (std::get<K>(pairs).first.base = std::get<K>(dst)));
    }(std::index_sequence_for<Pairs...>{});
    detail::stream::fence();
    return bad;
  }

 private:
  // Indices [a, b) of the whole space (LinearIdx) or of the current row (RowIdx).
  template <class Idx, class... P>
  EMBER_VECTORIZE static bool run(std::int64_t a, std::int64_t b, const Table* sl, const Check& ck, const P&... pr) {
    // Local copies so the compiler keeps pointers in registers and vectorises; the slot table is copied so its
    // pointers are loop invariants the compiler can prove.
    auto local = std::make_tuple(pr...);
    const Table t = *sl;
    const Check c = ck;
    const expr::SlotTable* tp = nullptr;
    if constexpr (Slots) tp = &t;
    int bad = 0;
    std::apply(
        [&](auto&... q) {
          // No iteration reads what another writes: outputs are fresh, or alias an operand with the same
          // geometry (a = a * b, an in-place update), or the executor went through a temporary. So no runtime
          // alias checks.
#if defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#elif defined(__GNUC__)
#pragma GCC ivdep
#endif
          for (std::int64_t i = a; i < b; ++i) {
            if constexpr (kChecks) bad |= int(step(Idx{i, tp}, c, q...));
            else step(Idx{i, tp}, c, q...);
          }
        },
        local);
    return bad != 0;
  }
  // Every value first (the check's too), then every store: a store cannot clobber what a later expression reads
  // (an in-place output is read before it is written), and the compiler computes sub-expressions shared between
  // outputs (the same derivative factor, the same exp) once.
  template <class I, class... Q>
  EMBER_INLINE static bool step(I ix, const Check& c, Q&... q) {
    const std::tuple<decltype(q.second.eval(ix))...> vals{q.second.eval(ix)...};
    const bool flag = c.eval(ix);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (..., store(q, ix, std::get<K>(vals)));
    }(std::index_sequence_for<Q...>{});
    return flag;
  }
  template <class Q, class I, class V>
  EMBER_INLINE static void store(Q& q, I ix, V v) {
    using T = std::remove_const_t<std::remove_reference_t<decltype(q.first.at(ix))>>;
    q.first.at(ix) = convert<T>(v);
  }
};

namespace detail {
/// The plan of out = e over out's shape: out is operand 0, the leaves follow. Checks that out can be written
/// element by element, that the operands are defined and on the CPU, and that e (of shape es) broadcasts to out.
/// Returns false, with no plan, when an operand reads out's memory with another geometry: the caller then goes
/// through a temporary. Ordinary code, compiled once however many expressions a program writes.
EMBER_HEADER_INLINE bool plan_write(const expr::OperandRef& out, const expr::OperandRef* leaves, int n,
                                    const Shape& es, const char* op, expr::Plan& p);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE bool plan_write(const expr::OperandRef& out, const expr::OperandRef* leaves, int n,
                                    const Shape& es, const char* op, expr::Plan& p) {
  EMBER_CHECK(out.defined, op, ": the output is an undefined tensor");
  const Shape& space = *out.shape;
  for (int i = 0; i < space.n; ++i)
    EMBER_CHECK(!((*out.strides)[i] == 0 && space[i] > 1), op,
                ": cannot write into a tensor with a broadcast (stride 0) dim; shape ", space.str(), ", strides ",
                out.strides->str(), " (clone() it first)");
  expr::PlanBuilder b(space);
  const int ko = b.add(space, *out.strides);
  Device dev = out.device;
  bool have = true;
  expr::add_operands(b, leaves, n, dev, have, op);
  EMBER_CHECK(broadcast_shapes(es, space, op) == space, op, ": cannot write a result of shape ", es.str(),
              " into a tensor of shape ", space.str());
  EMBER_CHECK(dev.is_cpu(), op, ": the CPU executor got tensors on ", dev.str());
  for (int k = 0; k < n; ++k)  // an operand that shares out's storage but reads it with another geometry
    if (leaves[k].storage == out.storage && (leaves[k].data != out.data || !(b.strides(k + 1) == b.strides(ko))))
      return false;
  b.collapse_into(p);
  return true;
}
#endif
}  // namespace detail

namespace detail {
/// Whether a pass of `count` elements whose fresh outputs take `bytes` streams them (cpu/detail/stream_store.hpp):
/// at least two thread chunks, at least the threshold, more than one thread. Counts the passes that do. (The
/// caller has checked that the expressions are memory-bound and that no operand reads an output.)
inline bool stream_this_pass(std::int64_t count, std::int64_t bytes) {
  if (count < 2 * kGrain) return false;  // first: the smallest ops pay for every check
  const std::int64_t from = streaming_store_min_bytes();
  if (from < 0 || bytes < from || get_num_threads() <= 1) return false;
  stream::streamed_passes().fetch_add(1, std::memory_order_relaxed);
  return true;
}

/// Whether E is cast<T>(tensor of S) with one of T and S float and the other bfloat16 or half.
template <class T, class E>
inline constexpr bool is_plain_16bit_cast_v = false;
template <class T, class S, bool Own>
inline constexpr bool is_plain_16bit_cast_v<T, expr::CastExpr<T, expr::TensorLeaf<S, Own>>> =
    (std::is_same_v<T, float> && (std::is_same_v<S, bfloat16> || std::is_same_v<S, half>)) ||
    (std::is_same_v<S, float> && (std::is_same_v<T, bfloat16> || std::is_same_v<T, half>));
}  // namespace detail

/// out = e (out already has the broadcast shape of e, or e broadcasts to it). One pass; aliasing-safe.
template <class T, class E>
void assign(const Tensor<T>& out, const E& e, const char* op = "assign") {
  static_assert(expr::no_slots_v<E>, "ember: this expression reads slots (expr::slot / LeafRef), which only a "
                                     "multi-output pass with a slot source (ops::assign_multi) evaluates");
  // Fast path, the common small op: every operand dense with exactly out's shape. No plan to build. (Checked
  // here, inline, unrolled over the expression's leaves: the smallest ops pay for every call.)
  bool dense = out.is_contiguous() && out.device().is_cpu();
  bool fresh = true;  // no operand reads out's storage (an in-place update reads its lines anyway: never streamed)
  expr::visit_leaves(e, [&](const auto& leaf) {
    const auto& t = leaf.tensor();
    dense = dense && t.defined() && t.device().is_cpu() && t.shape() == out.shape() && t.is_contiguous() &&
            (t.storage() != out.storage() || static_cast<const void*>(t.data()) == static_cast<const void*>(out.data()));
    fresh = fresh && dense && t.storage() != out.storage();  // (only read when dense: every operand defined)
  });
  (void)fresh;  // (read only where E is memory-bound)
  if (dense) {
    const expr::Plan& lp = expr::linear_plan();
    int kk = 1;
    auto ev = expr::make_eval(e, lp, kk);
    using Pair = std::pair<expr::OperandEval<T>, decltype(ev)>;
    const Pair pr{expr::OperandEval<T>(out.data(), lp, 0), ev};
    const std::int64_t n = out.numel();
    using Body = AssignBody<false, expr::Eval<expr::NoCheck>, Pair>;
    // Streaming stores for a fresh output larger than the last-level cache, written by several threads, from a
    // memory-bound expression (cpu/detail/stream_store.hpp and expr::memory_bound say why each).
    if constexpr (expr::memory_bound_v<E>) {
      if (fresh && detail::stream_this_pass(n, n * std::int64_t(sizeof(T)))) {
        const Body body{std::make_tuple(pr), {}, {}};
        parallel_for(0, n, kGrain, [&](std::int64_t a, std::int64_t b) {
          Body local = body;
          local.run_streamed(a, b);
        });
        out.bump_version();
        return;
      }
    }
    // A plain cast between float and bfloat16 or half: the conversion runs (cpu/detail/cast16.hpp), the same bits
    // as the loop's, which the compiler vectorises poorly for bfloat16's rounding (2.5x slower on AVX-512).
    if constexpr (detail::is_plain_16bit_cast_v<T, E>) {
      if (fresh) {
        const auto* src = e.a.tensor().data();
        T* dst = out.data();
        const auto run = [src, dst](std::int64_t a, std::int64_t b) {
          if constexpr (sizeof(T) == 2) detail::cast16::store_run(dst + a, src + a, b - a, false);
          else detail::cast16::to_compute_run(src + a, dst + a, b - a);
        };
        if (n < 2 * kGrain) run(0, n);
        else parallel_for(0, n, kGrain, run);
        out.bump_version();
        return;
      }
    }
    if (n < 2 * kGrain)
      Body::run_dense(0, n, pr);
    else
      parallel_for(0, n, kGrain, [&](std::int64_t a, std::int64_t b) { Body::run_dense(a, b, pr); });
    out.bump_version();
    return;
  }
  const expr::LeafRefs<E> leaves(e);
  expr::Plan p;
  // e's shape reads its leaves: with an undefined one, plan_write names the op and the undefined operand first.
  const Shape es = leaves.all_defined() ? e.shape() : Shape{};
  if (!detail::plan_write(expr::operand_ref(out), leaves.at, leaves.n, es, op, p)) {
    Tensor<T> tmp = empty<T>(out.shape());
    assign(tmp, e, op);
    assign(out, expr::TensorLeaf<T, false>{&tmp}, op);
    return;
  }
  int kk = 1;
  auto ev = expr::make_eval(e, p, kk);
  using Pair = std::pair<expr::OperandEval<T>, decltype(ev)>;
  run_plan(p, AssignBody<false, expr::Eval<expr::NoCheck>, Pair>{
                  std::make_tuple(Pair{expr::OperandEval<T>(out.data(), p, 0), ev}), {}, {}});
  out.bump_version();
}

/// Several outputs of one shape from several expressions in ONE pass over `space` (ops::assign_multi): the fused
/// backward writes every leaf's gradient so, an optimizer its parameter and state. The tensors of `slot_src` (an
/// expression's tensor leaves, or a tuple of tensors) fill the slot table, in order, for the expressions' LeafRef
/// nodes. An output may also be read, through a slot or a leaf, where it is read with its own geometry (an in-place
/// update; expr::multi_in_place_ok); any other overlap goes through temporaries. The bool expression `check`
/// (expr::NoCheck: none) is evaluated at every index of the same pass; returns whether it was true anywhere.
template <class... T, class... E, class S, class C = expr::NoCheck>
bool assign_multi(const std::tuple<Tensor<T>...>& outs, const std::tuple<E...>& es, const Shape& space,
                  const S& slot_src, const char* op = "backward", const C& check = {}) {
  constexpr int n = sizeof...(T);
  expr::MultiPass<n> m = expr::plan_multi_pass(outs, es, space, slot_src, check, op);
  EMBER_CHECK(m.outs[0].device.is_cpu(), op, ": the CPU executor got tensors on ", m.outs[0].device.str());
  if (space.numel() == 0) return false;
  if (!m.in_place) {
    // An operand reads an output's memory with another geometry: the pass writes fresh tensors, then copies them.
    auto tmp = std::make_tuple(empty<T>(space)...);
    const bool any = assign_multi(tmp, es, space, slot_src, op, check);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (..., assign(std::get<I>(outs), expr::TensorLeaf<T, false>{&std::get<I>(tmp)}, op));
    }(std::index_sequence_for<T...>{});
    return any;
  }
  const expr::Plan p = m.b.collapse();
  const expr::SlotTable slots = m.slots(p, slot_src);
  const auto ev = m.evals(p, es, check);
  const auto& evs = ev.first;
  const auto& chk = ev.second;
  using Evs = std::remove_cvref_t<decltype(evs)>;
  auto body = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return AssignBody<true, std::remove_cvref_t<decltype(chk)>,
                      std::pair<expr::OperandEval<T>, std::tuple_element_t<I, Evs>>...>{
        std::make_tuple(std::make_pair(expr::OperandEval<T>(std::get<I>(outs).data(), p, int(I)), std::get<I>(evs))...),
        slots, chk};
  }(std::index_sequence_for<T...>{});
  // Streaming stores (as in assign) when the pass is linear, its expressions and check are memory-bound, no operand
  // reads an output, the outputs' bytes reach the threshold together, and several threads run it.
  if constexpr ((expr::memory_bound_v<C> && ... && expr::memory_bound_v<E>)) {
    bool fresh = p.linear;
    for (int k = 0; k < m.nin && fresh; ++k)
      for (int j = 0; j < n; ++j) fresh = fresh && m.ins[k].storage != m.outs[j].storage;
    const std::int64_t count = p.numel();
    if (fresh && detail::stream_this_pass(count, count * std::int64_t((std::size_t(0) + ... + sizeof(T))))) {
      std::atomic<bool> flag{false};
      parallel_for(0, count, kGrain, [&](std::int64_t a, std::int64_t b) {
        auto local = body;
        if (local.run_streamed(a, b)) flag.store(true, std::memory_order_relaxed);
      });
      std::apply([](const auto&... o) { (..., o.bump_version()); }, outs);
      return flag.load();
    }
  }
  const bool any = run_plan(p, body);
  std::apply([](const auto&... o) { (..., o.bump_version()); }, outs);
  return any;
}

}  // namespace ember::cpu
