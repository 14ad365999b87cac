// ember — DistributedDataParallel: data-parallel training of a module across the ranks of a process group, as
// torch.nn.parallel.DistributedDataParallel does it.
//
// At construction the ranks check they hold the same model and take rank 0's parameters and buffers. The gradients
// are grouped into buckets (25 MiB by default, the first one 1 MiB, parameters in reverse registration order, which
// is roughly the order backward produces their gradients). A gradient-ready hook on every parameter copies its
// gradient into its bucket; when a bucket is complete its all-reduce (the average over the ranks) starts in the
// background while backward goes on. When backward has finished, the last buckets are launched and every bucket is
// waited for and copied back into the gradients: backward() returns with the gradients averaged, so an optimizer
// step can never see half-reduced gradients. Inside `no_sync()` gradients only accumulate locally; the first
// backward after it reduces the accumulated sum. BatchNorm's running statistics are broadcast from rank 0 before
// every forward in training (broadcast_buffers).
//
//   auto& pg = dist::init();
//   nn::DistributedDataParallel ddp(model);                       // Net model; same seed or not: rank 0's weights
//   optim::SGD opt(ddp.parameters(), {.lr = 0.1});
//   Tensor<float> loss = nn::cross_entropy(ddp(x), y);
//   opt.zero_grad(); loss.backward(); opt.step();
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/storage.hpp"
#include "ember/autograd/engine.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/dist/init.hpp"
#include "ember/dist/process_group.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

/// The options of nn::DistributedDataParallel after the module, with the names of
/// torch.nn.parallel.DistributedDataParallel (its other arguments are not supported):
/// ```
/// nn::DistributedDataParallel ddp(model, {.bucket_cap_mb = 50, .find_unused_parameters = true});
/// ```
struct DDPOptions {
  /// Bucket size in MiB: gradients are averaged a bucket at a time, while backward goes on (PyTorch's default, None,
  /// is 25). The first bucket is at most 1 MiB, so that communication starts early, as PyTorch's.
  double bucket_cap_mb = 25;
  /// Broadcast rank 0's buffers (BatchNorm statistics) before each forward in training.
  bool broadcast_buffers = true;
  /// Parameters that get no gradient in a backward pass count as zero instead of being an error.
  bool find_unused_parameters = false;
};

namespace detail {

/// The parameters whose gradients a live DistributedDataParallel averages during backward, by storage and byte
/// offset, with the reducer and its process group: optim::ZeroRedundancyOptimizer reads it (ddp_group_of) so that it
/// does not average those gradients a second time.
struct DdpRegistry {
  std::mutex mu;
  std::map<std::pair<const StorageImpl*, std::size_t>, std::pair<const void*, const dist::ProcessGroup*>> params;
};
inline DdpRegistry& ddp_registry() {
  static DdpRegistry r;
  return r;
}

/// The type-erased engine of DistributedDataParallel (one instantiation whatever the model).
class DdpReducer : public std::enable_shared_from_this<DdpReducer> {
 public:
  DdpReducer(const Module& m, dist::ProcessGroup& pg, const DDPOptions& o)
      : pg_(pg), opt_(o), buffers_(m.named_buffers()) {
    EMBER_CHECK(o.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
                o.bucket_cap_mb);
    for (auto& [name, t] : m.named_parameters_any()) {
      const bool trains = std::visit([](const auto& x) { return x.defined() && x.requires_grad(); }, t);
      if (trains) params_.push_back(Param{name, t, 0, 0, 0, 0, false});
    }
    check_same_model();
    broadcast_state(true);
    build_buckets();
    std::lock_guard<std::mutex> lk(ddp_registry().mu);
    for (const Param& p : params_) ddp_registry().params[key_of(p.t)] = {this, &pg_};
  }
  DdpReducer(const DdpReducer&) = delete;
  DdpReducer& operator=(const DdpReducer&) = delete;
  ~DdpReducer() {
    std::lock_guard<std::mutex> lk(ddp_registry().mu);
    for (const Param& p : params_) {
      auto it = ddp_registry().params.find(key_of(p.t));
      if (it != ddp_registry().params.end() && it->second.first == this) ddp_registry().params.erase(it);
    }
  }

  /// Registers the gradient hooks (after construction: they hold a weak reference to this reducer).
  void install_hooks() {
    std::weak_ptr<DdpReducer> self = weak_from_this();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      std::visit(
          [&](auto& p) {
            using T = typename std::remove_cvref_t<decltype(p)>::value_type;
            auto t = p;  // (a handle)
            t.register_hook([self, i](const Tensor<T>&) {
              if (auto r = self.lock()) r->mark_ready(i);
            });
          },
          params_[i].t);
    }
  }

  /// Before each forward: the previous reduction must have finished; rank 0's buffers are broadcast in training.
  void prepare_forward(bool training) {
    EMBER_CHECK(!active_, "DistributedDataParallel: the gradient reduction of the previous backward pass did not "
                "finish (its backward failed?); the gradients are not synchronised");
    if (training && opt_.broadcast_buffers && pg_.size() > 1) broadcast_state(false);
  }

  bool no_sync = false;

  std::size_t num_buckets() const { return buckets_.size(); }
  /// Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_names() const {
    std::vector<std::vector<std::string>> out;
    for (const Bucket& b : buckets_) {
      out.emplace_back();
      for (std::size_t i : b.params) out.back().push_back(params_[i].name);
    }
    return out;
  }

 private:
  struct Param {
    std::string name;
    AnyTensor t;
    std::size_t bucket, offset, numel, elem;  // offset and numel in elements of the bucket's dtype
    bool ready;
  };
  struct Bucket {
    AnyTensor flat;                  // (sum of the params' numel), the params' dtype and device
    std::vector<std::size_t> params;
    std::size_t pending = 0;
    bool launched = false;
    dist::Work work;
  };

  static std::pair<const StorageImpl*, std::size_t> key_of(const AnyTensor& t) {
    return {storage_of(t).get(), byte_offset(t)};
  }
  static Storage storage_of(const AnyTensor& t) {
    return std::visit([](const auto& x) { return x.storage(); }, t);
  }
  static std::size_t byte_offset(const AnyTensor& t) {
    return std::visit(
        [](const auto& x) {
          using T = typename std::remove_cvref_t<decltype(x)>::value_type;
          return std::size_t(x.storage_offset()) * sizeof(T);
        },
        t);
  }
  static std::size_t nbytes(const AnyTensor& t) {
    return std::visit(
        [](const auto& x) {
          using T = typename std::remove_cvref_t<decltype(x)>::value_type;
          return std::size_t(x.numel()) * sizeof(T);
        },
        t);
  }

  // Every rank must wrap the same model: names, dtypes and shapes hash to the same value.
  void check_same_model() {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](const std::string& s) {
      for (char c : s) h = (h ^ std::uint8_t(c)) * 1099511628211ull;
    };
    for (const Param& p : params_) mix(p.name + describe(p.t));
    for (const auto& [n, t] : buffers_) mix(n + describe(t));
    const int w = pg_.size();
    if (w == 1) return;
    Tensor<std::int64_t> all = zeros<std::int64_t>(Shape{w});
    Tensor<std::int64_t> mine = full<std::int64_t>(Shape{1}, std::int64_t(h));
    pg_.all_gather_into_tensor(all, mine).wait();
    const auto v = all.to_vector();
    for (int k = 0; k < w; ++k)
      EMBER_CHECK(v[std::size_t(k)] == std::int64_t(h), "DistributedDataParallel: rank ", k,
                  " wraps a different model than rank ", pg_.rank(), " (parameter and buffer names, dtypes or shapes "
                  "differ); every rank must build the same model");
  }

  // Broadcasts rank 0's parameters (with_params) and buffers: per dtype and device, one flat tensor.
  void broadcast_state(bool with_params) {
    if (pg_.size() == 1) return;
    NoGradGuard ng;
    std::vector<AnyTensor> ts;
    if (with_params)
      for (const Param& p : params_) ts.push_back(p.t);
    for (const auto& [n, t] : buffers_)
      if (std::visit([](const auto& x) { return x.defined(); }, t)) ts.push_back(t);
    while (!ts.empty()) {
      // The tensors of the first one's dtype and device.
      const std::size_t kind = ts.front().index();
      const Device dev = std::visit([](const auto& x) { return x.device(); }, ts.front());
      std::vector<AnyTensor> group, rest;
      for (auto& t : ts)
        (t.index() == kind && std::visit([](const auto& x) { return x.device(); }, t) == dev ? group : rest)
            .push_back(std::move(t));
      ts = std::move(rest);
      std::visit(
          [&](const auto& first) {
            using T = typename std::remove_cvref_t<decltype(first)>::value_type;
            std::int64_t total = 0;
            for (const auto& t : group) total += std::get<Tensor<T>>(t).numel();
            Tensor<T> flat = empty<T>(Shape{total}, dev);
            copy_group(group, flat, true);
            pg_.broadcast(flat, 0).wait();
            copy_group(group, flat, false);
          },
          group.front());
    }
  }
  // Tensors into (to_flat) or out of a flat tensor, back to back.
  template <class T>
  static void copy_group(const std::vector<AnyTensor>& group, const Tensor<T>& flat, bool to_flat) {
    std::size_t off = 0;
    for (const auto& any : group) {
      Tensor<T> t = std::get<Tensor<T>>(any);
      const std::size_t n = std::size_t(t.numel()) * sizeof(T);
      if (t.is_contiguous()) {
        if (to_flat) copy_bytes(flat.storage(), off, t.storage(), std::size_t(t.storage_offset()) * sizeof(T), n);
        else copy_bytes(t.storage(), std::size_t(t.storage_offset()) * sizeof(T), flat.storage(), off, n);
      } else {
        Tensor<T> c = t.detach().contiguous();
        if (to_flat) copy_bytes(flat.storage(), off, c.storage(), std::size_t(c.storage_offset()) * sizeof(T), n);
        else t.detach().copy_(flat.as_strided_raw(t.shape(), contiguous_strides(t.shape()),
                                                  std::int64_t(off / sizeof(T))));
      }
      if (!to_flat) t.bump_version();
      off += n;
    }
  }

  // Buckets over the parameters in reverse registration order; one dtype and device per bucket.
  void build_buckets() {
    const std::size_t cap = std::size_t(opt_.bucket_cap_mb * 1024 * 1024);
    const std::size_t first_cap = std::min<std::size_t>(cap, std::size_t(1) << 20);
    std::vector<std::vector<std::size_t>> groups;
    std::size_t bytes = 0;
    for (std::size_t k = params_.size(); k-- > 0;) {
      const Param& p = params_[k];
      const bool fits = !groups.empty() && bytes + nbytes(p.t) <= (groups.size() == 1 ? first_cap : cap) &&
                        params_[groups.back().front()].t.index() == p.t.index() &&
                        std::visit([](const auto& x) { return x.device(); }, params_[groups.back().front()].t) ==
                            std::visit([](const auto& x) { return x.device(); }, p.t);
      if (!fits) {
        groups.emplace_back();
        bytes = 0;
      }
      groups.back().push_back(k);
      bytes += nbytes(p.t);
    }
    for (auto& g : groups) {
      Bucket b;
      b.params = g;
      std::visit(
          [&](const auto& first) {
            using T = typename std::remove_cvref_t<decltype(first)>::value_type;
            std::size_t off = 0;
            for (std::size_t i : g) {
              Param& p = params_[i];
              p.bucket = buckets_.size();
              p.offset = off;
              p.numel = std::size_t(std::get<Tensor<T>>(p.t).numel());
              p.elem = sizeof(T);
              off += p.numel;
            }
            b.flat = empty<T>(Shape{std::int64_t(off)}, first.device());
          },
          params_[g.front()].t);
      buckets_.push_back(std::move(b));
    }
  }

  void start_iteration() {
    active_ = true;
    next_bucket_ = 0;
    for (Param& p : params_) p.ready = false;
    for (Bucket& b : buckets_) {
      b.pending = b.params.size();
      b.launched = false;
      b.work = dist::Work();
    }
    std::weak_ptr<DdpReducer> self = weak_from_this();
    autograd::queue_callback([self] {
      if (auto r = self.lock()) r->finalize();
    });
  }

  // A parameter's gradient is complete: copy it into its bucket; launch the buckets that are ready, in order.
  void mark_ready(std::size_t i) {
    if (no_sync || pg_.size() == 1) return;
    if (!active_) start_iteration();
    Param& p = params_[i];
    EMBER_CHECK(!p.ready, "DistributedDataParallel: the gradient of '", p.name, "' was completed twice in one "
                "backward pass (a second backward through the same graph?); reduce once per backward");
    Bucket& b = buckets_[p.bucket];
    std::visit(
        [&](const auto& t) {
          using T = typename std::remove_cvref_t<decltype(t)>::value_type;
          Tensor<T> g = t.grad();
          if (!g.is_contiguous()) g = g.detach().contiguous();
          copy_bytes(storage_of(b.flat), p.offset * sizeof(T), g.storage(), std::size_t(g.storage_offset()) * sizeof(T),
                     p.numel * sizeof(T));
        },
        p.t);
    p.ready = true;
    --b.pending;
    launch_ready();
  }

  void launch_ready() {
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
      Bucket& b = buckets_[next_bucket_++];
      b.work = std::visit([&](const auto& flat) { return pg_.all_reduce(flat, dist::ReduceOp::Avg); }, b.flat);
      b.launched = true;
    }
  }

  // End of backward: unused parameters, the last buckets, then wait for all and write the averages back.
  void finalize() {
    struct Done {  // whatever happens, the iteration is over
      bool& a;
      ~Done() { a = false; }
    } done{active_};
    std::string unused;
    for (Param& p : params_) {
      if (p.ready) continue;
      if (!opt_.find_unused_parameters) {
        unused += (unused.empty() ? "" : ", ") + p.name;
        continue;
      }
      Bucket& b = buckets_[p.bucket];
      std::visit(
          [&](const auto& flat) {
            using T = typename std::remove_cvref_t<decltype(flat)>::value_type;
            flat.slice(0, std::int64_t(p.offset), std::int64_t(p.offset + p.numel)).fill_(T(0));
          },
          b.flat);
      p.ready = true;
      --b.pending;
    }
    EMBER_CHECK(unused.empty(), "DistributedDataParallel (rank ", pg_.rank(), "): these parameters received no "
                "gradient in this backward pass: ", unused, "; every parameter must take part in the loss on every "
                "rank, or construct DistributedDataParallel with {.find_unused_parameters = true}");
    launch_ready();
    for (Bucket& b : buckets_) b.work.wait();
    NoGradGuard ng;
    for (Param& p : params_) {
      const Bucket& b = buckets_[p.bucket];
      std::visit(
          [&](auto& t) {
            using T = typename std::remove_cvref_t<decltype(t)>::value_type;
            const Tensor<T>& flat = std::get<Tensor<T>>(b.flat);
            Tensor<T>& g = t.grad();
            if (!g.defined() || !g.is_contiguous()) {
              Tensor<T> fresh = empty<T>(t.shape(), t.device());
              copy_bytes(fresh.storage(), 0, flat.storage(), p.offset * sizeof(T), p.numel * sizeof(T));
              if (g.defined()) g.copy_(fresh);
              else g = fresh;
            } else {
              copy_bytes(g.storage(), std::size_t(g.storage_offset()) * sizeof(T), flat.storage(),
                         p.offset * sizeof(T), p.numel * sizeof(T));
              g.bump_version();
            }
          },
          p.t);
    }
  }

  dist::ProcessGroup& pg_;
  DDPOptions opt_;
  std::vector<std::pair<std::string, AnyTensor>> buffers_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::size_t next_bucket_ = 0;
  bool active_ = false;
};

}  // namespace detail

/// The process group over which a live DistributedDataParallel averages the gradient of parameter `p` during
/// backward, or nullptr when none does.
template <class T>
const dist::ProcessGroup* ddp_group_of(const Tensor<T>& p) {
  if (!p.defined()) return nullptr;
  auto& r = detail::ddp_registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.params.find({p.storage().get(), std::size_t(p.storage_offset()) * sizeof(T)});
  return it == r.params.end() ? nullptr : it->second.second;
}

/// Data-parallel training of `M` (any nn::Module type with a forward) on a process group (the default one unless
/// given). Copies of the wrapper share the module and the reducer.
template <class M>
class DistributedDataParallel {
  static_assert(std::is_base_of_v<Module, M>, "DistributedDataParallel<M>: M must be an nn::Module");

 public:
  /// Wraps `module` (nn.parallel.DistributedDataParallel(module, ...)): broadcasts rank 0's parameters and buffers
  /// and installs the gradient hooks that all-reduce the gradients in buckets during backward.
  explicit DistributedDataParallel(M module, DDPOptions o = {}, dist::ProcessGroup* pg = nullptr)
      : module_(std::move(module)),
        reducer_(std::make_shared<detail::DdpReducer>(module_, pg ? *pg : dist::default_group(), o)) {
    reducer_->install_hooks();
  }

  /// The wrapped module (PyTorch's ddp.module).
  M& module() { return module_; }
  /// The wrapped module (PyTorch's ddp.module).
  const M& module() const { return module_; }
  /// The module's forward, after DDP's per-iteration preparation.
  template <class... A>
  decltype(auto) forward(A&&... args) {
    reducer_->prepare_forward(module_.is_training());
    return module_.forward(std::forward<A>(args)...);
  }
  /// forward(args...).
  template <class... A>
  decltype(auto) operator()(A&&... args) {
    return forward(std::forward<A>(args)...);
  }
  /// The module's parameters (what the optimizer gets).
  template <class T = float>
  std::vector<Tensor<T>> parameters(bool recurse = true) const {
    return module_.template parameters<T>(recurse);
  }
  /// The module's train(on).
  void train(bool on = true) { module_.train(on); }
  /// The module's eval().
  void eval() { module_.eval(); }

  /// While the returned guard lives, backward passes accumulate gradients locally without communicating (gradient
  /// accumulation); the first backward after it reduces the accumulated gradients.
  class NoSync {
   public:
    /// Turns synchronisation off until the guard is destroyed (no_sync() makes one).
    explicit NoSync(std::shared_ptr<detail::DdpReducer> r) : r_(std::move(r)), old_(r_->no_sync) { r_->no_sync = true; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    ~NoSync() { r_->no_sync = old_; }

   private:
    std::shared_ptr<detail::DdpReducer> r_;
    bool old_;
  };
  /// The guard of local gradient accumulation, as PyTorch's `with ddp.no_sync():`.
  [[nodiscard]] NoSync no_sync() { return NoSync(reducer_); }

  /// The buckets' parameter names, in the order their all-reduces start.
  std::vector<std::vector<std::string>> buckets() const { return reducer_->bucket_names(); }

 private:
  M module_;
  std::shared_ptr<detail::DdpReducer> reducer_;
};

}  // namespace ember::nn
