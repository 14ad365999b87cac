// ember — the NCCL backend for CUDA tensors (CMake target ember::nccl). Including this header in one translation
// unit of a program lets every process group take CUDA tensors: the group creates an NCCL communicator on first use
// (rank 0's unique id travels through the group's bootstrap: the store, or MPI) on the device of the first tensor.
//
// Each group has its own high-priority stream. A collective is ordered after the work already queued on the caller's
// current stream (an event), runs on the group's stream, and its Work's wait() orders the caller's current stream
// after it without blocking the host, as PyTorch's work.wait() does; the tensors' memory is recorded on the group's
// stream so the caching allocator does not hand it out while NCCL still uses it. A watchdog thread per group marks
// collectives complete, and when one takes longer than the group's timeout, or NCCL reports an asynchronous error, it
// aborts the communicator (ncclCommAbort), which fails the pending and later collectives with an ember::Error.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include "ember/cuda/check.hpp"
#if !EMBER_HAVE_NCCL
#error "ember/dist/nccl.hpp needs NCCL (nccl.h): link the CMake target ember::nccl"
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "ember/cuda/allocator.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"
#include "ember/dist/backend.hpp"
#include "ember/dist/bootstrap.hpp"
#include "ember/dist/process_group.hpp"

namespace ember::dist {

namespace detail {
inline ncclDataType_t nccl_type(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return ncclFloat32;
    case ScalarType::Double: return ncclFloat64;
    case ScalarType::Int32: return ncclInt32;
    case ScalarType::Int64: return ncclInt64;
    case ScalarType::UInt8: return ncclUint8;
    case ScalarType::Int8: return ncclInt8;
    case ScalarType::Bool: return ncclUint8;
    case ScalarType::Half: return ncclFloat16;
    case ScalarType::BFloat16: return ncclBfloat16;
  }
  return ncclUint8;
}
inline ncclRedOp_t nccl_op(ReduceOp op, ScalarType t) {
  if (t == ScalarType::Bool) return op == ReduceOp::Sum || op == ReduceOp::Max ? ncclMax : ncclMin;  // or / and
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Product: return ncclProd;
  }
  return ncclSum;
}
}  // namespace detail

/// The NCCL backend: the collectives of a group's CUDA tensors on one device, enqueued on a stream of its own.
class NcclCollectives final : public detail::Collectives {
 public:
  /// Rank `rank` of `world` on CUDA device `device`: rank 0's NCCL unique id goes to the others through `boot`.
  NcclCollectives(int rank, int world, Bootstrap& boot, int device, std::chrono::milliseconds timeout)
      : Collectives(rank, world, timeout), device_(device) {
    cuda::DeviceGuard g(device);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank == 0) EMBER_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::string mine = rank == 0 ? std::string(reinterpret_cast<const char*>(&id), sizeof id) : std::string();
    const std::string got = boot.all_gather(mine, "nccl id", deadline_in(timeout))[0];
    EMBER_CHECK(got.size() == sizeof id, "dist: setting up NCCL (rank ", rank, "): rank 0 sent an id of ", got.size(),
                " bytes, expected ", sizeof id);
    std::memcpy(&id, got.data(), sizeof id);
    EMBER_NCCL_CHECK(ncclCommInitRank(&comm_, world, id, rank));
    stream_ = cuda::Stream::create(device, /*high_priority=*/true);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclCollectives() override {
    {
      std::lock_guard<std::mutex> lk(pending_mu_);
      stopping_ = true;
    }
    pending_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (!aborted_) EMBER_CUDA_WARN(cudaStreamSynchronize(stream_.handle()));
    if (comm_) {
      if (aborted_) (void)ncclCommAbort(comm_);
      else (void)ncclCommDestroy(comm_);
    }
  }
  /// The backend's name, as ProcessGroup::backend() reports it.
  const char* name() const override { return "nccl"; }
  /// Whether it runs the collectives of tensors on `d`: CUDA tensors of its device.
  bool handles(Device d) const override { return d.is_cuda() && d.index == device_; }

  /// Enqueues the collective on the backend's stream, after the work queued so far on the tensor's current stream.
  Work submit(detail::Request r) override {
    const std::string ctx = context(r.kind);
    {
      std::lock_guard<std::mutex> lk(pending_mu_);
      EMBER_CHECK(aborted_msg_.empty(), ctx, ": the NCCL communicator was aborted (", aborted_msg_, "); create a new group");
    }
    cuda::DeviceGuard g(device_);
    const cuda::Stream caller = cuda::current_stream(device_);
    cuda::Event ready;
    ready.record(caller);
    ready.block(stream_);
    const cudaStream_t s = stream_.handle();
    const ncclDataType_t t = detail::nccl_type(r.out.dtype);
    switch (r.kind) {
      case CollectiveKind::AllReduce:
        EMBER_NCCL_CHECK(ncclAllReduce(r.out.data, r.out.data, std::size_t(r.out.numel), t,
                                       detail::nccl_op(r.op, r.out.dtype), comm_, s));
        break;
      case CollectiveKind::Broadcast:
        EMBER_NCCL_CHECK(ncclBroadcast(r.out.data, r.out.data, std::size_t(r.out.numel), t, r.root, comm_, s));
        break;
      case CollectiveKind::AllGather:
        EMBER_NCCL_CHECK(ncclAllGather(r.in.data, r.out.data, std::size_t(r.in.numel), t, comm_, s));
        break;
      case CollectiveKind::ReduceScatter:
        EMBER_NCCL_CHECK(ncclReduceScatter(r.in.data, r.out.data, std::size_t(r.out.numel), t,
                                           detail::nccl_op(r.op, r.out.dtype), comm_, s));
        break;
      case CollectiveKind::Barrier: {
        // An all-reduce of one value; the barrier is complete when the stream has run it (wait() blocks for it).
        if (!barrier_buf_) barrier_buf_ = make_storage(sizeof(float), Device::cuda(device_));
        EMBER_NCCL_CHECK(ncclAllReduce(barrier_buf_->data, barrier_buf_->data, 1, ncclFloat32, ncclSum, comm_, s));
        break;
      }
    }
    for (const Storage* st : {&r.out.keep, &r.in.keep})
      if (*st && (*st)->device.is_cuda()) cuda::record_stream(*st, stream_);
    auto state = std::make_shared<detail::WorkState>();
    cuda::Event done;
    done.record(stream_);
    state->device_async = r.kind != CollectiveKind::Barrier;
    state->query = [done] { return done.query(); };
    const int dev = device_;
    state->on_wait = [done, dev, barrier = r.kind == CollectiveKind::Barrier] {
      if (barrier) done.synchronize();
      else done.block(cuda::current_stream(dev));
    };
    {
      std::lock_guard<std::mutex> lk(pending_mu_);
      pending_.push_back({done, state, deadline_in(timeout()), ctx});
    }
    pending_cv_.notify_all();
    if (!state->device_async) {  // the barrier blocks the host
      Work w(state);
      w.wait();
      return w;
    }
    return Work(state);
  }

 protected:
  ///@{
  /// Unused: submit() enqueues on the stream directly.
  void all_reduce(const Buffer&, ReduceOp, Deadline, std::uint64_t) override {}
  void broadcast(const Buffer&, int, Deadline, std::uint64_t) override {}
  void all_gather(const Buffer&, const Buffer&, Deadline, std::uint64_t) override {}
  void reduce_scatter(const Buffer&, const Buffer&, ReduceOp, Deadline, std::uint64_t) override {}
  void barrier(Deadline, std::uint64_t) override {}
  void abort_peers(const std::string&) noexcept override {}
  ///@}

 private:
  struct Pending {
    cuda::Event done;
    std::shared_ptr<detail::WorkState> state;
    Deadline deadline;
    std::string ctx;
  };

  // Completes collectives as their events fire; aborts the communicator on a timeout or an asynchronous NCCL error.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lk(pending_mu_);
    for (;;) {
      pending_cv_.wait_for(lk, std::chrono::milliseconds(2), [&] { return stopping_ || !pending_.empty(); });
      if (stopping_ && pending_.empty()) return;
      std::string failure;
      ncclResult_t async = ncclSuccess;
      if (comm_ && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess)
        failure = std::string("NCCL reported an error: ") + ncclGetErrorString(async);
      while (!pending_.empty() && failure.empty()) {
        Pending& p = pending_.front();
        bool fired = false;
        try {
          fired = p.done.query();
        } catch (const std::exception& e) {
          failure = e.what();
          break;
        }
        if (fired) {
          p.state->finish();
          pending_.pop_front();
        } else {
          if (Clock::now() >= p.deadline) failure = "timed out after " + duration_str(timeout());
          break;
        }
      }
      if (!failure.empty()) {
        const std::string msg = (pending_.empty() ? context(CollectiveKind::AllReduce) : pending_.front().ctx) + ": " +
                                failure + "; the communicator was aborted";
        aborted_msg_ = msg;
        aborted_ = true;
        (void)ncclCommAbort(comm_);
        comm_ = nullptr;
        for (Pending& p : pending_) p.state->finish(std::make_exception_ptr(Error(msg)));
        pending_.clear();
        if (stopping_) return;
      }
      if (stopping_ && pending_.empty()) return;
    }
  }

  int device_;
  ncclComm_t comm_ = nullptr;
  cuda::Stream stream_ = cuda::Stream::default_stream(0);
  Storage barrier_buf_;
  std::mutex pending_mu_;
  std::condition_variable pending_cv_;
  std::deque<Pending> pending_;
  std::string aborted_msg_;
  bool stopping_ = false;
  std::atomic<bool> aborted_{false};
  std::thread watchdog_;
};

namespace detail {
inline std::shared_ptr<Collectives> make_nccl(int rank, int world, Bootstrap& boot, int device,
                                              std::chrono::milliseconds timeout) {
  return std::make_shared<NcclCollectives>(rank, world, boot, device, timeout);
}
inline const bool nccl_backend_registered = ember::detail::provide<CudaBackendPart>(&make_nccl);
}  // namespace detail

}  // namespace ember::dist

#endif  // EMBER_WITH_CUDA
