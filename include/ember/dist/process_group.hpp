// ember — ProcessGroup: the ranks of a job and the collectives between them (torch.distributed's ProcessGroup).
// Every collective is asynchronous: it returns a Work handle at once and runs in the background in call order;
// `.wait()` blocks and rethrows its error. CPU tensors go to the group's CPU backend (shm, tcp or mpi), CUDA tensors
// to NCCL (created on first use, when the program includes <ember/dist/nccl.hpp> and links ember::nccl).
//
//   auto& pg = dist::init();                     // RANK, WORLD_SIZE, MASTER_ADDR, ... from the launcher
//   pg.all_reduce(grad, dist::ReduceOp::Avg).wait();
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/optional_part.hpp"
#include "ember/core/tensor.hpp"
#include "ember/dist/backend.hpp"
#include "ember/dist/bootstrap.hpp"
#include "ember/dist/store.hpp"
#include "ember/dist/work.hpp"

namespace ember::dist {

namespace detail {
/// The backend of a world of one: nothing to exchange (Collectives::execute copies where a collective must).
class SelfCollectives final : public Collectives {
 public:
  explicit SelfCollectives(std::chrono::milliseconds timeout) : Collectives(0, 1, timeout) {}
  ~SelfCollectives() override { stop(); }
  const char* name() const override { return "self"; }
  bool handles(Device) const override { return true; }

 protected:
  void all_reduce(const Buffer&, ReduceOp, Deadline, std::uint64_t) override {}
  void broadcast(const Buffer&, int, Deadline, std::uint64_t) override {}
  void all_gather(const Buffer&, const Buffer&, Deadline, std::uint64_t) override {}
  void reduce_scatter(const Buffer&, const Buffer&, ReduceOp, Deadline, std::uint64_t) override {}
  void barrier(Deadline, std::uint64_t) override {}
  void abort_peers(const std::string&) noexcept override {}
};

/// The optional part (core/optional_part.hpp) that creates the CUDA-tensor backend of a group on first use;
/// installed by <ember/dist/nccl.hpp>.
struct CudaBackendPart {
  using Entry = std::shared_ptr<Collectives> (*)(int rank, int world, Bootstrap& boot, int device,
                                                 std::chrono::milliseconds timeout);
};

template <class T>
Buffer buffer_of(const Tensor<T>& t, const char* op, const char* what) {
  EMBER_CHECK(t.defined(), "dist::", op, ": the ", what, " tensor is undefined");
  EMBER_CHECK(t.is_contiguous(), "dist::", op, ": the ", what, " tensor must be contiguous, got shape ",
              t.shape().str(), " with strides ", t.strides().str(), "; call contiguous() first");
  return Buffer{t.data(), t.numel(), dtype_traits<T>::tag, t.device(), t.storage()};
}
}  // namespace detail

/// A group of ranks and its collectives (torch.distributed's ProcessGroup): all_reduce, broadcast, all_gather,
/// reduce_scatter and barrier on tensors, through a CPU backend (shm, tcp, mpi) and, for CUDA tensors, NCCL.
class ProcessGroup {
 public:
  /// Assembles a group (dist::init and dist::new_process_group do this). `server`/`store` are kept alive with it.
  ProcessGroup(int rank, int world, std::shared_ptr<detail::Collectives> cpu, std::shared_ptr<Bootstrap> boot,
               std::shared_ptr<Store> store = nullptr, std::shared_ptr<StoreServer> server = nullptr)
      : server_(std::move(server)), store_(std::move(store)), boot_(std::move(boot)), cpu_(std::move(cpu)),
        rank_(rank), world_(world) {}
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;
  ~ProcessGroup() {
    cuda_.reset();  // the backends (and their threads) go before the bootstrap and the store they use
    cpu_.reset();
  }

  /// This process's rank in the group (dist.get_rank(group)).
  int rank() const { return rank_; }
  /// The number of ranks (dist.get_world_size(group)).
  int size() const { return world_; }
  /// The CPU backend: "shm", "tcp", "mpi" or "self" (a world of one).
  const char* backend() const { return cpu_->name(); }
  /// The time any collective may take before it fails (default 5 minutes, or EMBER_DIST_TIMEOUT seconds).
  std::chrono::milliseconds timeout() const { return cpu_->timeout(); }
  /// Changes the collectives' timeout, for the CPU and the CUDA backend.
  void set_timeout(std::chrono::milliseconds t) {
    cpu_->set_timeout(t);
    if (cuda_) cuda_->set_timeout(t);
  }
  /// How the group's ranks exchange connection data.
  Bootstrap& bootstrap() const { return *boot_; }
  /// The rendezvous store (null under an MPI bootstrap or in a world of one).
  const std::shared_ptr<Store>& store() const { return store_; }

  /// Reduces `t` over all ranks in place: every rank gets the result.
  template <class T>
  Work all_reduce(const Tensor<T>& t, ReduceOp op = ReduceOp::Sum) {
    detail::Request r{CollectiveKind::AllReduce, detail::buffer_of(t, "all_reduce", "input"), {}, op, 0};
    t.bump_version();
    return submit(std::move(r));
  }
  /// Copies rank `root`'s `t` into every other rank's `t`.
  template <class T>
  Work broadcast(const Tensor<T>& t, int root = 0) {
    detail::Request r{CollectiveKind::Broadcast, detail::buffer_of(t, "broadcast", "input"), {}, ReduceOp::Sum, root};
    t.bump_version();
    return submit(std::move(r));
  }
  /// Rank k's `in` lands in part k of `out` (world * in.numel() elements; any shape), on every rank.
  template <class T>
  Work all_gather_into_tensor(const Tensor<T>& out, const Tensor<T>& in) {
    detail::Request r{CollectiveKind::AllGather, detail::buffer_of(out, "all_gather", "output"),
                      detail::buffer_of(in, "all_gather", "input"), ReduceOp::Sum, 0};
    out.bump_version();
    return submit(std::move(r));
  }
  /// Rank k's `in` lands in outs[k] (world tensors of in's size). Waits for the result (it is copied out).
  template <class T>
  Work all_gather(const std::vector<Tensor<T>>& outs, const Tensor<T>& in) {
    EMBER_CHECK(int(outs.size()) == world_, "dist::all_gather: expected ", world_, " output tensors (one per rank), got ",
                outs.size());
    for (std::size_t k = 0; k < outs.size(); ++k) {
      const Tensor<T>& o = outs[k];
      detail::buffer_of(o, "all_gather", "output");
      EMBER_CHECK(o.numel() == in.numel() && o.device() == in.device(), "dist::all_gather: output ", k, " has ",
                  o.numel(), " elements on ", o.device().str(), ", expected ", in.numel(), " on ", in.device().str());
    }
    Tensor<T> flat(make_impl<T>(in.numel() * world_, in.device()));
    Work w = all_gather_into_tensor(flat, in);
    w.wait();
    for (int k = 0; k < world_; ++k) {
      const Tensor<T>& o = outs[std::size_t(k)];
      copy_bytes(o.storage(), std::size_t(o.storage_offset()) * sizeof(T), flat.storage(),
                 std::size_t(k) * std::size_t(in.numel()) * sizeof(T), std::size_t(in.numel()) * sizeof(T));
      o.bump_version();
    }
    return w;
  }
  /// Reduces `in` (world * out.numel() elements) over all ranks; rank k gets part k in `out`.
  template <class T>
  Work reduce_scatter_tensor(const Tensor<T>& out, const Tensor<T>& in, ReduceOp op = ReduceOp::Sum) {
    detail::Request r{CollectiveKind::ReduceScatter, detail::buffer_of(out, "reduce_scatter", "output"),
                      detail::buffer_of(in, "reduce_scatter", "input"), op, 0};
    out.bump_version();
    return submit(std::move(r));
  }
  /// Returns once every rank has called barrier (wait on the Work).
  Work barrier() {
    return submit(detail::Request{CollectiveKind::Barrier, Buffer{nullptr, 0, ScalarType::UInt8, Device::cpu(), {}},
                                  {}, ReduceOp::Max, 0});
  }

  /// Checks a type-erased request and queues it on the backend of its device.
  inline Work submit(detail::Request r);

 private:
  template <class T>
  static std::shared_ptr<TensorImpl<T>> make_impl(std::int64_t n, Device d) {
    auto p = std::make_shared<TensorImpl<T>>();
    p->storage = make_storage(std::size_t(n) * sizeof(T), d);
    p->sizes = Shape{n};
    p->strides = Shape{1};
    return p;
  }
  inline detail::Collectives& backend_for(Device d, CollectiveKind k);

  std::shared_ptr<StoreServer> server_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Bootstrap> boot_;
  std::shared_ptr<detail::Collectives> cpu_;
  std::shared_ptr<detail::Collectives> cuda_;
  std::mutex cuda_mu_;
  int rank_, world_;
};

inline detail::Collectives& ProcessGroup::backend_for(Device d, CollectiveKind k) {
  if (cpu_->handles(d)) return *cpu_;
  const std::string ctx = cpu_->context(k);
  EMBER_CHECK(d.is_cuda(), ctx, ": the ", cpu_->name(), " backend does not take tensors on ", d.str());
  std::lock_guard<std::mutex> lk(cuda_mu_);
  if (!cuda_) {
    EMBER_CHECK(ember::detail::part<detail::CudaBackendPart>() != nullptr, ctx, ": the tensor is on ", d.str(),
                ", and collectives on CUDA tensors need ember's NCCL backend: include <ember/dist/nccl.hpp> in a "
                "translation unit of the program and link ember::nccl (the ", cpu_->name(),
                " backend takes CPU tensors)");
    cuda_ = ember::detail::part<detail::CudaBackendPart>()(rank_, world_, *boot_, d.index, cpu_->timeout());
  }
  EMBER_CHECK(cuda_->handles(d), ctx, ": this group's NCCL communicator is on another device than ", d.str(),
              " (one device per rank)");
  return *cuda_;
}

inline Work ProcessGroup::submit(detail::Request r) {
  const char* op = collective_name(r.kind);
  const bool has_in = r.kind == CollectiveKind::AllGather || r.kind == CollectiveKind::ReduceScatter;
  if (has_in) {
    EMBER_CHECK(r.in.dtype == r.out.dtype && r.in.device == r.out.device, "dist::", op, ": the input is ",
                dtype_name(r.in.dtype), " on ", r.in.device.str(), " but the output ", dtype_name(r.out.dtype), " on ",
                r.out.device.str());
    const std::int64_t part = r.kind == CollectiveKind::AllGather ? r.in.numel : r.out.numel;
    const std::int64_t whole = r.kind == CollectiveKind::AllGather ? r.out.numel : r.in.numel;
    EMBER_CHECK(whole / world_ == part && whole % world_ == 0, "dist::", op, ": the ",
                r.kind == CollectiveKind::AllGather ? "output" : "input", " has ", whole,
                " elements, expected world size (", world_, ") times the ",
                r.kind == CollectiveKind::AllGather ? "input's" : "output's", " ", part);
    if (r.kind == CollectiveKind::ReduceScatter) {
      const char* ob = static_cast<const char*>(r.out.data);
      const char* ib = static_cast<const char*>(r.in.data);
      EMBER_CHECK(ob + r.out.bytes() <= ib || ib + r.in.bytes() <= ob, "dist::reduce_scatter: the output overlaps "
                  "the input; pass a separate output tensor");
    }
  }
  if (r.kind == CollectiveKind::AllReduce || r.kind == CollectiveKind::ReduceScatter) {
    EMBER_CHECK(r.op != ReduceOp::Avg || is_floating(r.out.dtype), "dist::", op, ": ReduceOp::Avg needs a floating "
                "dtype, got ", dtype_name(r.out.dtype), " (use Sum and divide)");
  }
  if (r.kind == CollectiveKind::Broadcast)
    EMBER_CHECK(r.root >= 0 && r.root < world_, "dist::broadcast: root ", r.root, " is out of range for a world of ",
                world_);
  // A barrier carries no tensor: it runs on the group's own backend (NCCL's all-reduces one value on its device).
  if (r.kind == CollectiveKind::Barrier) return cpu_->submit(std::move(r));
  return backend_for(r.out.device, r.kind).submit(std::move(r));
}

}  // namespace ember::dist
