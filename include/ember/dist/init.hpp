// ember — starting a process group from what the launcher set, as torch.distributed.init_process_group does.
//
// Who this process is (first match wins; explicit options override each value):
//   torchrun / ember-run   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   mpirun (Open MPI)      OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   srun (Slurm)           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
//   nothing                a single process (rank 0 of 1)
// The ranks meet at a TCP store at MASTER_ADDR:MASTER_PORT (default 127.0.0.1 when every rank is on this host, and
// 29500). Rank 0 serves it, unless the launcher does (ember-run sets EMBER_USE_AGENT_STORE=1). Under torchrun, whose
// own store holds MASTER_PORT, ember's listens on MASTER_PORT + 1. Rank 0 listens on MASTER_ADDR only (loopback on
// one host), or on EMBER_DIST_STORE_BIND ("0.0.0.0" or "::" for every interface). With EMBER_DIST_TOKEN (the job's
// shared secret, the same on every rank; ember-run makes one), only clients that prove they know it are served, and
// each rank checks that the store knows it too; without it, any client that reaches the port is served.
//
// The CPU backend: shm when every rank is on one host, else tcp; `Backend` or EMBER_DIST_BACKEND=shm|tcp|mpi
// forces one. CUDA tensors use NCCL (<ember/dist/nccl.hpp>). Timeouts: InitOptions::timeout, else
// EMBER_DIST_TIMEOUT (seconds), else 5 minutes, for the rendezvous and for every collective.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "ember/config.hpp"
#include "ember/dist/bootstrap.hpp"
#include "ember/dist/process_group.hpp"
#include "ember/dist/shm.hpp"
#include "ember/dist/store.hpp"
#include "ember/dist/tcp.hpp"

namespace ember::dist {

/// The CPU backend of a group.
enum class Backend : std::uint8_t { Auto, Shm, Tcp, Mpi };

inline const char* backend_name(Backend b) {
  constexpr const char* names[] = {"auto", "shm", "tcp", "mpi"};
  return names[static_cast<int>(b)];
}

/// The options of dist::init and dist::new_process_group, torch.distributed.init_process_group's role with its
/// init_method "env://": every value left at its sentinel (-1, "", unset) comes from the environment that the
/// launcher set (torchrun's and ember-run's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT; mpirun's OMPI_COMM_WORLD_*; Slurm's SLURM_*), and an explicit value overrides it.
/// ```
/// dist::ProcessGroup& pg = dist::init({.backend = dist::Backend::Tcp, .timeout = std::chrono::seconds(60)});
/// ```
struct InitOptions {
  /// The CPU backend; Auto: EMBER_DIST_BACKEND, else shm when every rank is on this host, else tcp. PyTorch: backend
  /// ("gloo" is ember's tcp or shm, "mpi" its Mpi; CUDA tensors use NCCL whatever this is).
  Backend backend = Backend::Auto;
  int rank = -1;              ///< this process's rank in [0, world_size); -1: RANK (or mpirun's, Slurm's), else 0
  int world_size = -1;        ///< the number of ranks; -1: WORLD_SIZE (or mpirun's, Slurm's), else 1
  int local_rank = -1;        ///< the rank among this host's ranks; -1: LOCAL_RANK (torchrun's variable), else 0
  int local_world_size = -1;  ///< the ranks on this host; -1: LOCAL_WORLD_SIZE (torchrun's variable), else 1
  std::string master_addr{};  ///< rank 0's host, where the store is; "": MASTER_ADDR, else 127.0.0.1 (one host)
  int master_port = -1;       ///< the store's port; -1: MASTER_PORT, else 29500
  /// For the rendezvous and every collective; unset: EMBER_DIST_TIMEOUT seconds, else 5 minutes (PyTorch: timeout,
  /// whose default is 10 minutes for NCCL and 30 for the others).
  std::optional<std::chrono::milliseconds> timeout{};
  /// Groups of one job are told apart by name (and by the order they are created in). PyTorch: group_name.
  std::string group_name = "default";
  /// The job's shared secret for the store; "": EMBER_DIST_TOKEN (unset: no authentication).
  std::string token{};
  /// Where rank 0's store listens; "": EMBER_DIST_STORE_BIND, else the master address.
  std::string store_bind{};
};

/// Who this process is in the job, as read from options and environment.
struct LaunchInfo {
  ///@{
  /// The rank and the number of ranks, in the job and on this node (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
  /// LOCAL_WORLD_SIZE).
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  ///@}
  std::string master_addr;  ///< Rank 0's host (MASTER_ADDR).
  int master_port = 29500;  ///< The store's port (MASTER_PORT).
  std::string token;       ///< the store's shared secret ("" for none)
  std::string store_bind;  ///< where rank 0's store listens
  bool agent_store = false;  ///< the launcher serves the store (rank 0 does not)
  Backend backend = Backend::Auto;                              ///< The CPU backend to use.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  ///< How long a collective may take.
  std::string launcher;      ///< "torchrun", "mpirun", "slurm", "options" or "none", for messages
};

namespace detail {
/// The integer in environment variable `name`, or `fallback` when unset; garbage is an error naming the variable.
inline long long env_int(const char* name, long long fallback, long long lo, long long hi) {
  return ember::detail::env_int("dist::init", name, fallback, lo, hi);
}
inline std::string env_str(const char* name) {
  const char* s = std::getenv(name);
  return s ? std::string(s) : std::string();
}
/// This machine, as far as shared memory is concerned: host name and boot id.
inline std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return std::string(host) + "/" + boot;
}
/// Rank 0's store server at host:port with `token`, shared by the groups that use it (it lives while one does).
inline std::shared_ptr<StoreServer> store_server(const std::string& host, int port, const std::string& token) {
  struct Entry {
    std::weak_ptr<StoreServer> server;
    std::string host, token;
  };
  static std::mutex mu;
  static std::map<int, Entry> servers;
  std::lock_guard<std::mutex> lk(mu);
  Entry& e = servers[port];
  auto s = e.server.lock();
  if (s) {
    EMBER_CHECK(e.host == host && e.token == token, "dist::init: this process already serves a store on port ", port,
                " with another address or token; groups on one port share them");
    return s;
  }
  s = std::make_shared<StoreServer>(StoreServerOptions{.host = host, .port = port, .token = token});
  e = {s, host, token};
  return s;
}
inline std::atomic<int>& group_counter() {
  static std::atomic<int> n{0};
  return n;
}
}  // namespace detail

/// Reads the launch environment (see the top of this header), checked: ranks in range, a world of at least one.
inline LaunchInfo launch_info(const InitOptions& o = {}) {
  LaunchInfo li;
  const int kMax = 1 << 20;
  if (std::getenv("RANK") || std::getenv("WORLD_SIZE")) {
    li.launcher = std::getenv("TORCHELASTIC_RUN_ID") ? "torchrun" : "RANK/WORLD_SIZE";
    li.rank = int(detail::env_int("RANK", 0, 0, kMax));
    li.world_size = int(detail::env_int("WORLD_SIZE", 1, 1, kMax));
    li.local_rank = int(detail::env_int("LOCAL_RANK", li.rank, 0, kMax));
    li.local_world_size = int(detail::env_int("LOCAL_WORLD_SIZE", li.world_size, 1, kMax));
  } else if (std::getenv("OMPI_COMM_WORLD_RANK")) {
    li.launcher = "mpirun";
    li.rank = int(detail::env_int("OMPI_COMM_WORLD_RANK", 0, 0, kMax));
    li.world_size = int(detail::env_int("OMPI_COMM_WORLD_SIZE", 1, 1, kMax));
    li.local_rank = int(detail::env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0, kMax));
    li.local_world_size = int(detail::env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1, kMax));
  } else if (std::getenv("SLURM_PROCID")) {
    li.launcher = "slurm";
    li.rank = int(detail::env_int("SLURM_PROCID", 0, 0, kMax));
    li.world_size = int(detail::env_int("SLURM_NTASKS", 1, 1, kMax));
    li.local_rank = int(detail::env_int("SLURM_LOCALID", 0, 0, kMax));
    // "2" or "2(x3)": the tasks on this node.
    const std::string per = detail::env_str("SLURM_NTASKS_PER_NODE");
    long long n = 1;
    const std::string first = per.substr(0, per.find_first_of("(,"));
    EMBER_CHECK(per.empty() || (ember::detail::parse_int(first, n) && n >= 1 && n <= kMax),
                "dist::init: SLURM_NTASKS_PER_NODE is ", ember::detail::quote_untrusted(per),
                ", not a task count such as \"2\" or \"2(x3)\"");
    li.local_world_size = int(n);
  } else {
    li.launcher = "none";
  }
  if (o.rank >= 0) li.rank = o.rank;
  if (o.world_size >= 0) li.world_size = o.world_size;
  if (o.local_rank >= 0) li.local_rank = o.local_rank;
  if (o.local_world_size >= 0) li.local_world_size = o.local_world_size;
  if (o.rank >= 0 || o.world_size >= 0) li.launcher = "options";
  EMBER_CHECK(li.world_size >= 1 && li.rank >= 0 && li.rank < li.world_size, "dist::init: rank ", li.rank,
              " is out of range for a world of ", li.world_size, " (from ", li.launcher, ")");

  li.master_addr = !o.master_addr.empty() ? o.master_addr : detail::env_str("MASTER_ADDR");
  if (li.master_addr.empty()) {
    EMBER_CHECK(li.world_size == 1 || li.local_world_size >= li.world_size, "dist::init: MASTER_ADDR is not set "
                "and the ", li.world_size, " ranks are not all on this host (", li.local_world_size, " are); set "
                "MASTER_ADDR (and MASTER_PORT) to rank 0's address");
    li.master_addr = "127.0.0.1";
  }
  li.master_port = o.master_port >= 0 ? o.master_port : int(detail::env_int("MASTER_PORT", 29500, 1, 65535));
  li.token = !o.token.empty() ? o.token : detail::env_str("EMBER_DIST_TOKEN");
  if (!li.token.empty())
    detail::check_token(li.token, !o.token.empty() ? "dist::init: InitOptions::token" : "dist::init: EMBER_DIST_TOKEN");
  li.store_bind = !o.store_bind.empty() ? o.store_bind : detail::env_str("EMBER_DIST_STORE_BIND");
  if (li.store_bind.empty()) li.store_bind = li.master_addr;
  li.agent_store = detail::env_str("EMBER_USE_AGENT_STORE") == "1";
  if (!li.agent_store && std::getenv("TORCHELASTIC_USE_AGENT_STORE")) {
    EMBER_CHECK(li.master_port < 65535, "dist::init: MASTER_PORT 65535 leaves no port for ember's store");
    ++li.master_port;  // torchrun's own store holds MASTER_PORT
  }

  li.backend = o.backend;
  if (li.backend == Backend::Auto) {
    const std::string b = detail::env_str("EMBER_DIST_BACKEND");
    if (b == "shm") li.backend = Backend::Shm;
    else if (b == "tcp") li.backend = Backend::Tcp;
    else if (b == "mpi") li.backend = Backend::Mpi;
    else EMBER_CHECK(b.empty() || b == "auto", "dist::init: EMBER_DIST_BACKEND=", ember::detail::quote_untrusted(b),
                     " is not one of shm, tcp, mpi, auto");
  }
  if (o.timeout) li.timeout = *o.timeout;
  else li.timeout = std::chrono::seconds(detail::env_int("EMBER_DIST_TIMEOUT", 300, 1, 7 * 24 * 3600));
  EMBER_CHECK(li.timeout.count() > 0, "dist::init: the timeout must be positive");
  return li;
}

namespace detail {
/// The optional part (core/optional_part.hpp) that creates the MPI backend; installed by <ember/dist/mpi.hpp>.
struct MpiBackendPart {
  using Entry = std::shared_ptr<ProcessGroup> (*)(const LaunchInfo& li);
};
}  // namespace detail

/// A new process group of every rank of the job (all ranks must create their groups in the same order).
inline std::shared_ptr<ProcessGroup> new_process_group(const InitOptions& o = {}) {
  const LaunchInfo li = launch_info(o);
  const int instance = detail::group_counter().fetch_add(1);
  if (li.backend == Backend::Mpi) {
    EMBER_CHECK(ember::detail::part<detail::MpiBackendPart>() != nullptr,
                "dist::init: the mpi backend was asked for, but this program was built without it: include "
                "<ember/dist/mpi.hpp> and link ember::mpi (CMake finds MPI, e.g. Debian's libopenmpi-dev)");
    return ember::detail::part<detail::MpiBackendPart>()(li);
  }
  if (li.world_size == 1 && li.backend == Backend::Auto)
    return std::make_shared<ProcessGroup>(0, 1, std::make_shared<detail::SelfCollectives>(li.timeout), nullptr);

  const Deadline d = deadline_in(li.timeout);
  std::shared_ptr<StoreServer> server;
  if (li.rank == 0 && !li.agent_store) {
    server = detail::store_server(li.store_bind, li.master_port, li.token);
    EMBER_CHECK(!server->loopback_only() || li.local_world_size >= li.world_size, "dist::init: rank 0's store "
                "listens on ", server->address(), " (from ", ember::detail::quote_untrusted(li.store_bind), "), which "
                "only this host reaches, but ", li.world_size - li.local_world_size, " of the ", li.world_size,
                " ranks run on other hosts: set MASTER_ADDR to an address they reach (or EMBER_DIST_STORE_BIND=0.0.0.0 "
                "to listen on every interface)");
  }
  auto store = std::make_shared<Store>(li.master_addr, li.master_port, li.timeout, li.token);
  const std::string prefix = "ember/" + o.group_name + "/" + std::to_string(instance);
  auto boot = std::make_shared<StoreBootstrap>(store, prefix, li.rank, li.world_size);

  // Rendezvous: every rank says where it runs and what it believes the world is.
  const std::string host = detail::host_identity();
  const auto hello = boot->all_gather(std::to_string(li.world_size) + " " + host, "rendezvous", d);
  bool one_host = true;
  for (int k = 0; k < li.world_size; ++k) {
    const std::string& h = hello[std::size_t(k)];
    const auto sp = h.find(' ');
    EMBER_CHECK(sp != std::string::npos && h.substr(0, sp) == std::to_string(li.world_size), "dist::init: rank ", k,
                " believes the world has ", ember::detail::quote_untrusted(h.substr(0, sp)), " ranks, this rank (",
                li.rank, ") ", li.world_size);
    one_host = one_host && h.substr(sp + 1) == host;
  }
  Backend b = li.backend;
  if (b == Backend::Auto) b = one_host ? Backend::Shm : Backend::Tcp;
  EMBER_CHECK(b != Backend::Shm || one_host, "dist::init: the shm backend needs every rank on one host, but the "
              "ranks run on several; use tcp");
  std::shared_ptr<detail::Collectives> cpu;
  if (b == Backend::Shm) cpu = std::make_shared<ShmCollectives>(li.rank, li.world_size, *boot, li.timeout);
  else cpu = std::make_shared<TcpCollectives>(li.rank, li.world_size, boot, store->local_address(), li.timeout,
                                              li.token);
  return std::make_shared<ProcessGroup>(li.rank, li.world_size, std::move(cpu), std::move(boot), std::move(store),
                                        std::move(server));
}

namespace detail {
inline std::shared_ptr<ProcessGroup>& default_group_slot() {
  static std::shared_ptr<ProcessGroup> g;
  return g;
}
}  // namespace detail

/// Starts the default process group (torch.distributed.init_process_group); every rank calls it once.
inline ProcessGroup& init(const InitOptions& o = {}) {
  auto& slot = detail::default_group_slot();
  EMBER_CHECK(!slot, "dist::init: the default process group is already initialized (call "
                     "dist::destroy_process_group() first)");
  slot = new_process_group(o);
  return *slot;
}
inline bool is_initialized() { return detail::default_group_slot() != nullptr; }
/// The default group; an error before dist::init().
inline ProcessGroup& default_group() {
  EMBER_CHECK(is_initialized(), "dist: the default process group is not initialized; call dist::init() first");
  return *detail::default_group_slot();
}
/// Ends the default group (joins its threads, closes its connections).
inline void destroy_process_group() { detail::default_group_slot().reset(); }
inline int get_rank() { return default_group().rank(); }
inline int get_world_size() { return default_group().size(); }

/// The collectives on the default group, waiting for the result (async_op=False in PyTorch).
template <class T>
void all_reduce(const Tensor<T>& t, ReduceOp op = ReduceOp::Sum) {
  default_group().all_reduce(t, op).wait();
}
template <class T>
void broadcast(const Tensor<T>& t, int root = 0) {
  default_group().broadcast(t, root).wait();
}
template <class T>
void all_gather_into_tensor(const Tensor<T>& out, const Tensor<T>& in) {
  default_group().all_gather_into_tensor(out, in).wait();
}
template <class T>
void reduce_scatter_tensor(const Tensor<T>& out, const Tensor<T>& in, ReduceOp op = ReduceOp::Sum) {
  default_group().reduce_scatter_tensor(out, in, op).wait();
}
inline void barrier() { default_group().barrier().wait(); }

}  // namespace ember::dist
