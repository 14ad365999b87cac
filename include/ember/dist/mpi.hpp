// ember — the MPI backend: every collective delegated to the MPI library the program is linked with (CMake target
// ember::mpi, e.g. Debian's Open MPI), so ember runs under any cluster's mpirun or srun. Including this header lets
// dist::init() choose it: `dist::init({.backend = dist::Backend::Mpi})` or EMBER_DIST_BACKEND=mpi. Rank and world
// size come from MPI itself; MPI is initialised (with MPI_THREAD_SERIALIZED at least: the group's progress thread
// makes the calls) unless the program did it, and finalised at exit if ember initialised it.
//
// Collectives are MPI's blocking ones (its tuned algorithms; its non-blocking ones were 2-4x slower here). MPI cannot
// cancel a collective nor tell the other ranks, so the group's timeout is enforced by a watchdog thread: a collective
// that takes longer prints an error naming it and aborts the MPI job (MPI_Abort), which mpirun turns into the end of
// every rank with a non-zero exit, never a hang. Half and bfloat16 are reduced in float (MPI has no such types); Avg
// is a sum scaled by 1/world.
#pragma once

// Only MPI's C interface (Open MPI and MPICH would add their deprecated C++ bindings otherwise).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ember/config.hpp"
#include "ember/dist/backend.hpp"
#include "ember/dist/bootstrap.hpp"
#include "ember/dist/detail/reduce.hpp"
#include "ember/dist/init.hpp"
#include "ember/dist/process_group.hpp"

namespace ember::dist {

namespace detail {

/// MPI's state in this process: initialised once, its calls serialised unless MPI_THREAD_MULTIPLE is given.
class MpiRuntime {
 public:
  static MpiRuntime& get() {
    static MpiRuntime rt;
    return rt;
  }
  std::unique_lock<std::mutex> lock() { return multiple_ ? std::unique_lock<std::mutex>() : std::unique_lock(mu_); }
  bool finalized() const {
    int f = 0;
    MPI_Finalized(&f);
    return f != 0;
  }
  ~MpiRuntime() {
    if (owned_ && !finalized()) MPI_Finalize();
  }

 private:
  MpiRuntime() {
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = MPI_THREAD_SINGLE;
    if (!inited) {
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      owned_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    EMBER_CHECK(provided >= MPI_THREAD_SERIALIZED, "dist: the mpi backend needs MPI_THREAD_SERIALIZED or more (the "
                "group's progress thread calls MPI); this MPI was initialised with thread level ", provided);
    multiple_ = provided >= MPI_THREAD_MULTIPLE;
  }
  std::mutex mu_;
  bool owned_ = false, multiple_ = false;
};

inline std::string mpi_error(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, std::size_t(len));
}

inline MPI_Datatype mpi_type(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return MPI_FLOAT;
    case ScalarType::Double: return MPI_DOUBLE;
    case ScalarType::Int32: return MPI_INT32_T;
    case ScalarType::Int64: return MPI_INT64_T;
    case ScalarType::UInt8: return MPI_UINT8_T;
    case ScalarType::Int8: return MPI_INT8_T;
    case ScalarType::Bool: return MPI_UINT8_T;
    case ScalarType::Half:
    case ScalarType::BFloat16: return MPI_UINT16_T;  // moved, never reduced (reductions arrive as float)
  }
  return MPI_BYTE;
}
inline MPI_Op mpi_op(ReduceOp op, ScalarType t) {
  if (t == ScalarType::Bool) return op == ReduceOp::Sum || op == ReduceOp::Max ? MPI_BOR : MPI_BAND;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Product: return MPI_PROD;
  }
  return MPI_SUM;
}

/// The group's all-gather of setup strings through MPI (for the NCCL backend's unique id).
class MpiBootstrap : public Bootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm) : comm_(comm) {}
  std::vector<std::string> all_gather(const std::string& mine, const std::string&, Deadline) override {
    auto lk = MpiRuntime::get().lock();
    int world = 0;
    MPI_Comm_size(comm_, &world);
    int len = int(mine.size());
    std::vector<int> lens(static_cast<std::size_t>(world)), offs(static_cast<std::size_t>(world));
    MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_);
    int total = 0;
    for (int k = 0; k < world; ++k) {
      offs[std::size_t(k)] = total;
      total += lens[std::size_t(k)];
    }
    std::string all(std::size_t(total), '\0');
    MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm_);
    std::vector<std::string> out;
    for (int k = 0; k < world; ++k) out.push_back(all.substr(std::size_t(offs[std::size_t(k)]), std::size_t(lens[std::size_t(k)])));
    return out;
  }
  std::string where() const override { return "MPI"; }

 private:
  MPI_Comm comm_;
};

}  // namespace detail

/// The MPI backend: the collectives of a group's CPU tensors through MPI calls on the group's communicator.
class MpiCollectives final : public detail::Collectives {
 public:
  /// Rank `rank` of `world` on communicator `comm`, which the backend then owns (and frees).
  MpiCollectives(MPI_Comm comm, int rank, int world, std::chrono::milliseconds timeout)
      : Collectives(rank, world, timeout), comm_(comm), watchdog_([this] { watch(); }) {}
  ~MpiCollectives() override {
    stop();
    {
      std::lock_guard<std::mutex> lk(watch_mu_);
      quit_ = true;
    }
    watch_cv_.notify_all();
    watchdog_.join();
    if (!detail::MpiRuntime::get().finalized()) {
      auto lk = detail::MpiRuntime::get().lock();
      MPI_Comm_free(&comm_);
    }
  }
  /// The backend's name, as ProcessGroup::backend() reports it.
  const char* name() const override { return "mpi"; }

 protected:
  /// MPI_Allreduce in place, in chunks of at most 2^30 elements (MPI counts are int).
  void all_reduce(const Buffer& b, ReduceOp op, Deadline d, std::uint64_t) override {
    const std::int64_t step = std::int64_t(1) << 30;  // MPI counts are int
    for (std::int64_t off = 0; off < b.numel; off += step) {
      const int n = int(std::min(step, b.numel - off));
      run(CollectiveKind::AllReduce, d, [&] {
        return MPI_Allreduce(MPI_IN_PLACE, at(b, off), n, detail::mpi_type(b.dtype), detail::mpi_op(op, b.dtype),
                             comm_);
      });
    }
    if (op == ReduceOp::Avg) detail::scale_in_place(b.data, std::size_t(b.numel), b.dtype, 1.0 / world_);
  }
  /// MPI_Bcast from `root`.
  void broadcast(const Buffer& b, int root, Deadline d, std::uint64_t) override {
    const std::int64_t step = std::int64_t(1) << 30;
    for (std::int64_t off = 0; off < b.numel; off += step) {
      const int n = int(std::min(step, b.numel - off));
      run(CollectiveKind::Broadcast, d, [&] { return MPI_Bcast(at(b, off), n, detail::mpi_type(b.dtype), root, comm_); });
    }
  }
  /// MPI_Allgather of `in` into `out`.
  void all_gather(const Buffer& out, const Buffer& in, Deadline d, std::uint64_t) override {
    check_int(in.numel, CollectiveKind::AllGather);
    run(CollectiveKind::AllGather, d, [&] {
      return MPI_Allgather(in.data, int(in.numel), detail::mpi_type(in.dtype), out.data, int(in.numel),
                           detail::mpi_type(in.dtype), comm_);
    });
  }
  /// MPI_Reduce_scatter_block of `in` into `out` (Avg: a sum, then scaled).
  void reduce_scatter(const Buffer& out, const Buffer& in, ReduceOp op, Deadline d, std::uint64_t) override {
    check_int(out.numel, CollectiveKind::ReduceScatter);
    run(CollectiveKind::ReduceScatter, d, [&] {
      return MPI_Reduce_scatter_block(in.data, out.data, int(out.numel), detail::mpi_type(out.dtype),
                                      detail::mpi_op(op, out.dtype), comm_);
    });
    if (op == ReduceOp::Avg) detail::scale_in_place(out.data, std::size_t(out.numel), out.dtype, 1.0 / world_);
  }
  /// MPI_Barrier.
  void barrier(Deadline d, std::uint64_t) override {
    run(CollectiveKind::Barrier, d, [&] { return MPI_Barrier(comm_); });
  }
  /// Nothing: the watchdog aborts the MPI job when a call passes its deadline.
  void abort_peers(const std::string&) noexcept override {}

 private:
  static void* at(const Buffer& b, std::int64_t off) {
    return static_cast<char*>(b.data) + std::size_t(off) * element_size(b.dtype);
  }
  void check_int(std::int64_t n, CollectiveKind k) const {
    EMBER_CHECK(n <= INT_MAX, context(k), ": ", n, " elements per rank is more than MPI's int count allows");
  }
  // One blocking MPI call, watched: the watchdog aborts the job if it is still running at the deadline.
  template <class Call>
  void run(CollectiveKind k, Deadline d, Call call) {
    {
      std::lock_guard<std::mutex> lk(watch_mu_);
      watched_ = k;
      deadline_ = d;
      active_ = true;  // (the watchdog looks every 100 ms; it is not woken for each call)
    }
    int rc;
    {
      auto lk = detail::MpiRuntime::get().lock();
      rc = call();
    }
    {
      std::lock_guard<std::mutex> lk(watch_mu_);
      active_ = false;
    }
    if (rc != MPI_SUCCESS) detail::fail(context(k), detail::mpi_error(rc));
  }
  void watch() {
    std::unique_lock<std::mutex> lk(watch_mu_);
    for (;;) {
      watch_cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return quit_ || active_; });
      if (quit_) return;
      if (active_ && Clock::now() >= deadline_) {
        std::fprintf(stderr, "%s: timed out after %s (a rank did not take part, or died); aborting the MPI job\n",
                     context(watched_).c_str(), duration_str(timeout()).c_str());
        std::fflush(stderr);
        MPI_Abort(comm_, 1);
      }
      if (active_) watch_cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return quit_ || !active_; });
    }
  }

  MPI_Comm comm_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool active_ = false, quit_ = false;
  CollectiveKind watched_ = CollectiveKind::AllReduce;
  Deadline deadline_{};
  std::thread watchdog_;
};

namespace detail {
inline std::shared_ptr<ProcessGroup> make_mpi_group(const LaunchInfo& li) {
  MpiRuntime& rt = MpiRuntime::get();
  MPI_Comm comm;
  int rank = 0, world = 1;
  {
    auto lk = rt.lock();
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
  }
  EMBER_CHECK(li.launcher == "none" || (li.rank == rank && li.world_size == world), "dist::init: the environment ",
              "says rank ", li.rank, " of ", li.world_size, " (", li.launcher, ") but MPI says rank ", rank, " of ", world);
  return std::make_shared<ProcessGroup>(rank, world, std::make_shared<MpiCollectives>(comm, rank, world, li.timeout),
                                        std::make_shared<MpiBootstrap>(comm));
}
inline const bool mpi_backend_registered = ember::detail::provide<MpiBackendPart>(&make_mpi_group);
}  // namespace detail

}  // namespace ember::dist
