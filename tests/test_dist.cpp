// Tests of the collective layer, DistributedDataParallel and ZeRO-1: each doctest case starts 2-3 copies of this
// program as ranks on loopback (the case itself serves the rendezvous store, as a launcher does), waits for them
// with a time limit and checks their exit codes and what they printed. A copy started with --worker=NAME runs the
// rank's side of scenario NAME and exits 0 when every check held (it prints what failed otherwise).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ember/dist.hpp>
#include <ember/ember.hpp>
#include <ember/nn/ddp.hpp>
#include <ember/optim/zero.hpp>

#include "helpers.hpp"
#if EMBER_TEST_MPI
#include <ember/dist/mpi.hpp>
#endif

extern char** environ;

using namespace ember;
using Clock = std::chrono::steady_clock;

namespace {

// ---- the parent's side: start ranks, wait, collect -------------------------------------------------------------

struct Ranks {
  std::vector<int> status;          // waitpid status; -1 when the rank had to be killed at the time limit
  std::vector<std::string> output;  // stdout and stderr
  double seconds = 0;
  bool exited_ok(int r) const { return status[std::size_t(r)] >= 0 && WIFEXITED(status[std::size_t(r)]) && WEXITSTATUS(status[std::size_t(r)]) == 0; }
  std::string all() const {
    std::string s;
    for (std::size_t r = 0; r < output.size(); ++r) s += "---- rank " + std::to_string(r) + ":\n" + output[r];
    return s;
  }
};

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  REQUIRE(n > 0);
  return std::string(buf, std::size_t(n));
}

/// Starts ranks [0, started) of a world of `world` running `scenario` with `args`, each with RANK etc. and `env`.
/// `during`, when given, runs in this process once the ranks are started (with the store and its token), before
/// they are waited for.
using DuringRun = std::function<void(dist::StoreServer& store, const std::string& token)>;
Ranks run_ranks(const std::string& scenario, int world, std::vector<std::string> args = {},
                std::map<std::string, std::string> env = {}, int started = -1, double limit_s = 120,
                const DuringRun& during = {}) {
  if (started < 0) started = world;
  // As ember-run does: a token for the job, which the store asks every rank to prove it knows.
  const std::string token = dist::detail::new_token();
  dist::StoreServer store(dist::StoreServerOptions{.token = token});
  const std::string exe = self_exe();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const auto t0 = Clock::now();
  for (int r = 0; r < started; ++r) {
    std::map<std::string, std::string> e;
    for (char** p = environ; *p; ++p) {
      std::string kv(*p);
      const auto eq = kv.find('=');
      if (eq != std::string::npos) e[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    e["RANK"] = std::to_string(r);
    e["WORLD_SIZE"] = std::to_string(world);
    e["LOCAL_RANK"] = std::to_string(r);
    e["LOCAL_WORLD_SIZE"] = std::to_string(world);
    e["MASTER_ADDR"] = "127.0.0.1";
    e["MASTER_PORT"] = std::to_string(store.port());
    e["EMBER_USE_AGENT_STORE"] = "1";
    e["EMBER_DIST_TOKEN"] = token;
    e["EMBER_NUM_THREADS"] = "1";
    for (auto& [k, v] : env) e[k] = v;
    std::vector<std::string> kvs;
    for (auto& [k, v] : e) kvs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : kvs) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_s{exe, "--worker=" + scenario};
    for (auto& a : args) argv_s.push_back(a);
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    char tmpl[] = "/tmp/ember-dist-test-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    REQUIRE(fd >= 0);
    logs.push_back(tmpl);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    posix_spawn_file_actions_adddup2(&fa, fd, 2);
    pid_t pid = -1;
    const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(fd);
    REQUIRE(rc == 0);
    pids.push_back(pid);
  }
  if (during) {
    try {
      during(store, token);
    } catch (const std::exception& e) {
      const std::string what = std::string("while the ranks ran: ") + e.what();
      FAIL_CHECK(what);
    }
  }
  Ranks res;
  res.status.assign(std::size_t(started), -1);
  std::size_t left = pids.size();
  while (left > 0) {
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] < 0) continue;
      int st = 0;
      if (::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        res.status[r] = st;
        pids[r] = -1;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::duration<double>(Clock::now() - t0).count() > limit_s) {
      for (pid_t p : pids)
        if (p > 0) {
          ::kill(p, SIGKILL);
          ::waitpid(p, nullptr, 0);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& path : logs) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    res.output.push_back(ss.str());
    ::unlink(path.c_str());
  }
  return res;
}

// ---- the ranks' side ---------------------------------------------------------------------------------------------

int failures = 0;
#define WCHECK(cond, ...)                                                                        \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      ++failures;                                                                                \
      std::fprintf(stderr, "check failed at line %d: %s\n", __LINE__, ::ember::detail::concat(__VA_ARGS__).c_str()); \
    }                                                                                            \
  } while (0)

/// The value rank `r` contributes at index i: small integers, so sums, products and maxima are exact in every dtype.
template <class T>
T value(int r, std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>) return (i + r) % 3 == 0;
  else return T(float((i * 7 + r * 3 + i / 5) % 5 + 1));
}
template <class T>
double as_double(T v) {
  return double(static_cast<float>(v));
}
template <>
double as_double<double>(double v) {
  return v;
}
template <>
double as_double<std::int64_t>(std::int64_t v) {
  return double(v);
}

/// Reference reduction of every rank's value at i (in the dtype's compute type, as ember does).
template <class T>
double reference(dist::ReduceOp op, int world, std::int64_t i) {
  using C = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;
  if constexpr (std::is_same_v<T, bool>) {
    bool acc = value<bool>(0, i);
    for (int r = 1; r < world; ++r) {
      const bool v = value<bool>(r, i);
      acc = (op == dist::ReduceOp::Sum || op == dist::ReduceOp::Max) ? (acc || v) : (acc && v);
    }
    return acc;
  } else {
    C acc = C(as_double(value<T>(0, i)));
    for (int r = 1; r < world; ++r) {
      const C v = C(as_double(value<T>(r, i)));
      switch (op) {
        case dist::ReduceOp::Sum:
        case dist::ReduceOp::Avg: acc = C(acc + v); break;
        case dist::ReduceOp::Product: acc = C(acc * v); break;
        case dist::ReduceOp::Max: acc = acc > v ? acc : v; break;
        case dist::ReduceOp::Min: acc = acc < v ? acc : v; break;
      }
    }
    double d = double(acc);
    if (op == dist::ReduceOp::Avg) d /= world;
    if constexpr (std::is_same_v<T, double>) return d;
    else return as_double(T(float(d)));  // rounded to T as the result is
  }
}
template <class T>
double tolerance(double ref) {
  if constexpr (std::is_same_v<T, half>) return 1e-3 * std::abs(ref);
  else if constexpr (std::is_same_v<T, bfloat16>) return 8e-3 * std::abs(ref);
  else if constexpr (std::is_same_v<T, float>) return 1e-6 * std::abs(ref);
  else if constexpr (std::is_same_v<T, double>) return 1e-12 * std::abs(ref);
  else return 0;
}

template <class T>
Tensor<T> rank_values(int r, std::int64_t n, std::int64_t offset = 0) {
  Tensor<T> t = empty<T>(Shape{n});
  T* p = t.data();
  for (std::int64_t i = 0; i < n; ++i) p[i] = value<T>(r, offset + i);
  return t;
}

template <class T>
void check_collectives(dist::ProcessGroup& pg, std::int64_t n, bool all_ops) {
  const int r = pg.rank(), w = pg.size();
  const char* dt = dtype_name<T>();
  std::vector<dist::ReduceOp> ops{dist::ReduceOp::Sum};
  if (all_ops) {
    ops = {dist::ReduceOp::Sum, dist::ReduceOp::Max, dist::ReduceOp::Min, dist::ReduceOp::Product};
    if (is_floating_v<T>) ops.push_back(dist::ReduceOp::Avg);
  }
  for (dist::ReduceOp op : ops) {
    // all_reduce
    Tensor<T> t = rank_values<T>(r, n);
    pg.all_reduce(t, op).wait();
    const T* p = t.data();
    for (std::int64_t i = 0; i < n; ++i) {
      const double ref = reference<T>(op, w, i), got = as_double(p[i]);
      if (std::abs(got - ref) > tolerance<T>(ref)) {
        WCHECK(false, "all_reduce ", dt, " ", dist::reduce_op_name(op), " n=", n, " at ", i, ": ", got, " vs ", ref);
        break;
      }
    }
    // reduce_scatter: w parts of n elements each
    Tensor<T> in = rank_values<T>(r, n * w);
    Tensor<T> out = empty<T>(Shape{n});
    pg.reduce_scatter_tensor(out, in, op).wait();
    const T* q = out.data();
    for (std::int64_t i = 0; i < n; ++i) {
      const double ref = reference<T>(op, w, r * n + i), got = as_double(q[i]);
      if (std::abs(got - ref) > tolerance<T>(ref)) {
        WCHECK(false, "reduce_scatter ", dt, " ", dist::reduce_op_name(op), " n=", n, " at ", i, ": ", got, " vs ", ref);
        break;
      }
    }
    // the input is only read
    const T* pin = in.data();
    for (std::int64_t i = 0; i < n * w; ++i)
      if (as_double(pin[i]) != as_double(value<T>(r, i))) {
        WCHECK(false, "reduce_scatter changed its input at ", i);
        break;
      }
  }
  // broadcast from a root that depends on n
  const int root = int(n % w);
  Tensor<T> b = rank_values<T>(r, n);
  pg.broadcast(b, root).wait();
  const T* pb = b.data();
  for (std::int64_t i = 0; i < n; ++i)
    if (as_double(pb[i]) != as_double(value<T>(root, i))) {
      WCHECK(false, "broadcast ", dt, " n=", n, " root ", root, " at ", i);
      break;
    }
  // all_gather
  Tensor<T> mine = rank_values<T>(r, n);
  Tensor<T> all = empty<T>(Shape{n * w});
  pg.all_gather_into_tensor(all, mine).wait();
  const T* pa = all.data();
  for (int k = 0; k < w; ++k)
    for (std::int64_t i = 0; i < n; ++i)
      if (as_double(pa[k * n + i]) != as_double(value<T>(k, i))) {
        WCHECK(false, "all_gather ", dt, " n=", n, " part ", k, " at ", i);
        k = w;
        break;
      }
}

int worker_collectives(const std::vector<std::string>& args) {
  dist::InitOptions o;
  if (!args.empty() && args[0] == "shm") o.backend = dist::Backend::Shm;
  if (!args.empty() && args[0] == "tcp") o.backend = dist::Backend::Tcp;
  if (!args.empty() && args[0] == "mpi") o.backend = dist::Backend::Mpi;
  auto& pg = dist::init(o);
  // EMBER_TEST_DIST_QUICK (the sanitizer jobs): the large sizes are left out.
  const bool quick = std::getenv("EMBER_TEST_DIST_QUICK") != nullptr;
  const std::int64_t large = quick ? 4099 : (1 << 20) + 3;
  for (std::int64_t n : {std::int64_t(0), std::int64_t(1), std::int64_t(7), large}) {
    check_collectives<float>(pg, n, true);
    check_collectives<double>(pg, n, true);
    check_collectives<half>(pg, n, true);
    check_collectives<bfloat16>(pg, n, true);
    check_collectives<std::int32_t>(pg, n, true);
    check_collectives<std::int64_t>(pg, n, true);
    check_collectives<std::uint8_t>(pg, n, true);
    check_collectives<std::int8_t>(pg, n, true);
    check_collectives<bool>(pg, n, true);
  }
  if (!quick) check_collectives<float>(pg, std::int64_t(16) << 20, false);  // 64 MiB per rank
  // The list form of all_gather, a barrier, and many small collectives in flight at once (the queue keeps order).
  std::vector<Tensor<float>> parts;
  for (int k = 0; k < pg.size(); ++k) parts.push_back(empty<float>(Shape{2, 3}));
  Tensor<float> mine = full<float>(Shape{2, 3}, float(pg.rank()));
  pg.all_gather(parts, mine);
  for (int k = 0; k < pg.size(); ++k) WCHECK(parts[std::size_t(k)].to_vector()[5] == float(k), "all_gather list");
  pg.barrier().wait();
  std::vector<Tensor<float>> ts;
  std::vector<dist::Work> works;
  for (int i = 0; i < 50; ++i) {
    ts.push_back(full<float>(Shape{std::int64_t(1000 + 7919 * i)}, float(i + pg.rank())));
    works.push_back(pg.all_reduce(ts.back()));
  }
  for (auto& wk : works) wk.wait();
  const int w = pg.size();
  for (int i = 0; i < 50; ++i)
    WCHECK(ts[std::size_t(i)].to_vector().back() == float(w * i + w * (w - 1) / 2), "queued all_reduce ", i);
  std::printf("rank %d: %s ok (%d failures)\n", pg.rank(), pg.backend(), failures);
  return failures == 0 ? 0 : 1;
}

// A rank dies in the middle of an all-reduce; the others must fail quickly with an error naming it.
int worker_kill(const std::vector<std::string>& args) {
  dist::InitOptions o;
  o.backend = args.at(0) == "tcp" ? dist::Backend::Tcp : dist::Backend::Shm;
  o.timeout = std::chrono::seconds(60);
  auto& pg = dist::init(o);
  const std::int64_t n = std::getenv("EMBER_TEST_DIST_QUICK") ? std::int64_t(1) << 20 : std::int64_t(32) << 20;
  Tensor<float> big = full<float>(Shape{n}, 1.f);
  const auto t0 = Clock::now();
  try {
    // Rank 1 may finish this first collective while another rank is still sending its last chunks, and die
    // before they do: a peer's death fails whatever collective is in flight, so it is inside the try too.
    pg.all_reduce(big).wait();
    if (pg.rank() == 1) {
      auto w = pg.all_reduce(big);
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      ::raise(SIGKILL);
    }
    for (int i = 0; i < 5; ++i) pg.all_reduce(big).wait();
    std::printf("rank %d: no error\n", pg.rank());
    return 1;
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("rank %d: error after %.2f s: %s\n", pg.rank(), s, e.what());
    if (s > 10) return 2;
  }
  // The group is broken now: the next collective fails at once.
  try {
    Tensor<float> t = ones<float>(Shape{4});
    pg.all_reduce(t).wait();
    return 3;
  } catch (const Error& e) {
    std::printf("rank %d: then: %s\n", pg.rank(), e.what());
  }
  return 0;
}

// Ranks that call different collectives get an error naming both calls, not corrupted data or a hang.
int worker_mismatch(const std::vector<std::string>& args) {
  dist::InitOptions o;
  o.backend = args.at(0) == "tcp" ? dist::Backend::Tcp : dist::Backend::Shm;
  o.timeout = std::chrono::seconds(60);
  auto& pg = dist::init(o);
  const auto t0 = Clock::now();
  try {
    if (args.at(1) == "size") {
      Tensor<float> t = ones<float>(Shape{pg.rank() == 1 ? 999 : 1000});
      pg.all_reduce(t).wait();
    } else {
      if (pg.rank() == 1) {
        Tensor<double> t = ones<double>(Shape{1000});
        pg.all_reduce(t).wait();
      } else {
        Tensor<float> t = ones<float>(Shape{1000});
        pg.all_reduce(t).wait();
      }
    }
    std::printf("rank %d: no error\n", pg.rank());
    return 1;
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("rank %d: error after %.2f s: %s\n", pg.rank(), s, e.what());
    return s < 10 ? 0 : 2;
  }
}

// Only some ranks arrive: the rendezvous fails at its timeout, naming the missing rank.
int worker_rendezvous(const std::vector<std::string>&) {
  dist::InitOptions o;
  o.timeout = std::chrono::seconds(2);
  const auto t0 = Clock::now();
  try {
    dist::init(o);
    return 1;
  } catch (const Error& e) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("error after %.2f s: %s\n", s, e.what());
    return s < 10 ? 0 : 2;
  }
}

// ---- DistributedDataParallel -------------------------------------------------------------------------------------

struct SmallNet : nn::Module {
  nn::Conv2d conv{2, 4, 3, {.padding = 1}};
  nn::Linear fc1{4 * 6 * 6, 16}, fc2{16, 5};
  SmallNet() {
    register_module("conv", conv);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor<float> forward(const Tensor<float>& x) {  // x (N, 2, 6, 6)
    return fc2(relu(fc1(Tensor<float>(relu(conv(x))).flatten(1))));
  }
};

Tensor<float> batch_input(std::int64_t n, std::uint64_t seed) {
  manual_seed(seed);
  return randn<float>(Shape{n, 2, 6, 6});
}
Tensor<std::int64_t> batch_target(std::int64_t n, std::uint64_t seed) {
  manual_seed(seed + 1000);
  return randint<std::int64_t>(0, 5, Shape{n});
}
double max_diff(const std::vector<Tensor<float>>& a, const std::vector<Tensor<float>>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto x = a[i].to_vector(), y = b[i].to_vector();
    for (std::size_t j = 0; j < x.size(); ++j) m = std::max(m, double(std::abs(x[j] - y[j])));
  }
  return m;
}
SmallNet fresh_net(std::uint64_t seed) {
  manual_seed(seed);
  return SmallNet();
}

int worker_ddp(const std::vector<std::string>&) {
  auto& pg = dist::init();
  const int r = pg.rank(), w = pg.size();
  const std::int64_t per = 6, total = per * w;
  // The ranks start from different weights: DDP takes rank 0's.
  SmallNet model = fresh_net(100 + std::uint64_t(r));
  nn::DistributedDataParallel ddp(model, {.bucket_cap_mb = 0.002});  // several buckets
  WCHECK(ddp.buckets().size() >= 3, "expected several buckets, got ", ddp.buckets().size());
  SmallNet ref = fresh_net(100);  // rank 0's initial weights, trained on the whole batch in this process
  WCHECK(max_diff(model.parameters(), ref.parameters()) == 0, "DDP did not broadcast rank 0's parameters");
  optim::SGD opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_opt(ref.parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 3; ++step) {
    Tensor<float> x = batch_input(total, 7 + step);
    Tensor<std::int64_t> y = batch_target(total, 7 + step);
    Tensor<float> loss = nn::cross_entropy(ddp(x.slice(0, r * per, (r + 1) * per)), y.slice(0, r * per, (r + 1) * per));
    opt.zero_grad();
    loss.backward();
    opt.step();
    Tensor<float> ref_loss = nn::cross_entropy(ref.forward(x), y);
    ref_opt.zero_grad();
    ref_loss.backward();
    ref_opt.step();
    const double d = max_diff(model.parameters(), ref.parameters());
    WCHECK(d < 1e-5, "DDP step ", step, " differs from the single-process step on the whole batch by ", d);
  }
  // no_sync: two half batches accumulated locally, then one synchronised backward, equal the whole batch.
  {
    Tensor<float> x = batch_input(2 * total, 99);
    Tensor<std::int64_t> y = batch_target(2 * total, 99);
    opt.zero_grad();
    ref_opt.zero_grad();
    auto half_batch = [&](int k) -> Tensor<float> {
      const std::int64_t a = k * total + r * per;
      return nn::cross_entropy(ddp(x.slice(0, a, a + per)), y.slice(0, a, a + per)) * 0.5f;
    };
    {
      auto guard = ddp.no_sync();
      half_batch(0).backward();
    }
    half_batch(1).backward();
    opt.step();
    Tensor<float> l0 = nn::cross_entropy(ref.forward(x.slice(0, 0, total)), y.slice(0, 0, total));
    Tensor<float> l1 = nn::cross_entropy(ref.forward(x.slice(0, total, 2 * total)), y.slice(0, total, 2 * total));
    Tensor<float>(l0 * 0.5f + l1 * 0.5f).backward();
    ref_opt.step();
    const double d = max_diff(model.parameters(), ref.parameters());
    WCHECK(d < 1e-5, "no_sync accumulation differs from the large batch by ", d);
  }
  // An unused parameter is an error naming it, unless find_unused_parameters.
  {
    struct TwoHeads : nn::Module {
      nn::Linear a{4, 3}, b{4, 3};
      TwoHeads() {
        register_module("a", a);
        register_module("b", b);
      }
      Tensor<float> forward(const Tensor<float>& x, bool use_b) { return use_b ? b(x) : a(x); }
    };
    manual_seed(5);
    TwoHeads m;
    nn::DistributedDataParallel strict(m);
    Tensor<float> x = ones<float>(Shape{2, 4});
    bool threw = false;
    try {
      Tensor<float> s = sum(strict(x, false));
      s.backward();
    } catch (const Error& e) {
      threw = std::string(e.what()).find("b.weight") != std::string::npos;
    }
    WCHECK(threw, "an unused parameter did not give the expected error");
    manual_seed(5);
    TwoHeads m2;
    nn::DistributedDataParallel lenient(m2, {.find_unused_parameters = true});
    m2.zero_grad();
    // Rank 0 uses head a, the others head b: each head's gradient is its user's divided by the world size.
    Tensor<float> s = sum(lenient(x, r != 0));
    s.backward();
    const float ga = m2.a.bias.grad().to_vector()[0], gb = m2.b.bias.grad().to_vector()[0];
    WCHECK(std::abs(ga - 2.0f / w) < 1e-6 && std::abs(gb - 2.0f * (w - 1) / w) < 1e-6, "find_unused_parameters: ", ga,
           " ", gb);
  }
  // BatchNorm buffers follow rank 0 at each forward in training.
  {
    struct BnNet : nn::Module {
      nn::Linear fc{3, 4};
      nn::BatchNorm1d bn{4};
      BnNet() {
        register_module("fc", fc);
        register_module("bn", bn);
      }
      Tensor<float> forward(const Tensor<float>& x) { return bn(fc(x)); }
    };
    manual_seed(3);
    BnNet m;
    nn::DistributedDataParallel d(m);
    manual_seed(50 + std::uint64_t(r));
    Tensor<float> x1 = randn<float>(Shape{8, 3}), x2 = randn<float>(Shape{8, 3});
    d(x1);
    Tensor<float> rm0 = m.bn.running_mean.clone();
    pg.broadcast(rm0, 0).wait();  // rank 0's statistics after the first forward
    d(x2);                        // starts from rank 0's statistics, then updates them with this rank's batch
    NoGradGuard ng;
    Tensor<float> expected = rm0 * 0.9f + mean(m.fc(x2), 0) * 0.1f;
    WCHECK(max_diff({m.bn.running_mean}, {expected}) < 1e-6, "the running mean did not start from rank 0's");
  }
  std::printf("rank %d: ddp ok (%d failures)\n", r, failures);
  return failures == 0 ? 0 : 1;
}

// ---- ZeRO-1 --------------------------------------------------------------------------------------------------------

template <class Opt, class Options>
int zero_case(dist::ProcessGroup& pg, const Options& options, const char* name) {
  const int r = pg.rank(), w = pg.size();
  // Parameters of awkward sizes (the flat vector does not divide evenly), the same on every rank.
  auto make = [] {
    manual_seed(11);
    return std::vector<Tensor<float>>{randn<float>(Shape{5, 3}).requires_grad_(), randn<float>(Shape{7}).requires_grad_(),
                                      randn<float>(Shape{2, 2, 2}).requires_grad_()};
  };
  std::vector<Tensor<float>> ps = make(), ref = make();
  optim::ZeroRedundancyOptimizer<Opt> zero(ps, options, &pg);
  Opt plain(ref, options);
  // Each rank's gradient of its own loss; the plain optimizer gets the average of all ranks' (recomputed here).
  auto loss_of = [](const std::vector<Tensor<float>>& p, int rank, int step) {
    manual_seed(1000 + std::uint64_t(rank) * 17 + std::uint64_t(step));
    Tensor<float> s = zeros<float>(Shape{});
    for (const auto& t : p) s = s + sum(square(t - randn<float>(t.shape())) * (1.0f + float(rank)));
    return s;
  };
  for (int step = 0; step < 10; ++step) {
    zero.zero_grad();
    loss_of(ps, r, step).backward();
    zero.step();
    plain.zero_grad();
    Tensor<float> avg = zeros<float>(Shape{});
    for (int k = 0; k < w; ++k) avg = avg + loss_of(ref, k, step) * (1.0f / float(w));
    avg.backward();
    plain.step();
  }
  const double d = max_diff(ps, ref);
  WCHECK(d < 1e-5, name, ": ZeRO-1 differs from the plain optimizer after 10 steps by ", d);
  // State memory: about 1/world of the plain optimizer's.
  std::size_t plain_bytes = 0;
  for (const auto& [k, t] : plain.state_dict())
    if (k.rfind("state.", 0) == 0)
      plain_bytes += std::visit([](const auto& x) { return std::size_t(x.numel()) * 4; }, t);
  const double frac = double(zero.local_state_bytes()) / double(plain_bytes);
  std::printf("rank %d: %s state bytes %zu of %zu (%.3f)\n", r, name, zero.local_state_bytes(), plain_bytes, frac);
  WCHECK(frac < 1.0 / w + 0.2, name, ": local state is ", frac, " of the plain optimizer's");
  // The consolidated state dict is the plain optimizer's, and loads back.
  zero.consolidate_state_dict(0);
  if (r == 0) {
    const nn::StateDict a = zero.state_dict(), b = plain.state_dict();
    WCHECK(a.size() == b.size(), name, ": consolidated state has ", a.size(), " entries, plain ", b.size());
    for (const auto& [k, t] : b) {
      auto it = a.find(k);
      WCHECK(it != a.end(), name, ": consolidated state lacks ", k);
      if (it == a.end()) continue;
      const double dd = std::visit(
          [&](const auto& x) {
            using U = typename std::remove_cvref_t<decltype(x)>::value_type;
            const auto* y = std::get_if<Tensor<U>>(&it->second);
            if (!y || y->shape() != x.shape()) return 1e9;
            double m = 0;
            auto xv = x.to_vector(), yv = y->to_vector();
            for (std::size_t j = 0; j < xv.size(); ++j) m = std::max(m, std::abs(double(xv[j]) - double(yv[j])));
            return m;
          },
          t);
      WCHECK(dd < 1e-5, name, ": consolidated '", k, "' differs by ", dd);
    }
  } else {
    bool threw = false;
    try {
      (void)zero.state_dict();
    } catch (const Error&) {
      threw = true;
    }
    WCHECK(threw, name, ": state_dict() on a rank that did not gather it must be an error");
  }
  // Loading the plain optimizer's state into a fresh ZeRO and stepping both again keeps them equal.
  std::vector<Tensor<float>> ps2;
  for (const auto& t : ref) ps2.push_back(t.detach().clone().requires_grad_());
  optim::ZeroRedundancyOptimizer<Opt> zero2(ps2, options, &pg);
  zero2.load_state_dict(plain.state_dict());
  zero2.zero_grad();
  loss_of(ps2, r, 50).backward();
  zero2.step();
  plain.zero_grad();
  Tensor<float> avg = zeros<float>(Shape{});
  for (int k = 0; k < w; ++k) avg = avg + loss_of(ref, k, 50) * (1.0f / float(w));
  avg.backward();
  plain.step();
  WCHECK(max_diff(ps2, ref) < 1e-5, name, ": after load_state_dict the step differs by ", max_diff(ps2, ref));
  return 0;
}

int worker_zero(const std::vector<std::string>&) {
  auto& pg = dist::init();
  zero_case<optim::Adam<float>>(pg, optim::AdamOptions{.lr = 0.05}, "Adam");
  zero_case<optim::AdamW<float>>(pg, optim::AdamOptions{.lr = 0.05, .weight_decay = 0.1}, "AdamW");
  zero_case<optim::SGD<float>>(pg, optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, "SGD");
  std::printf("rank %d: zero ok (%d failures)\n", pg.rank(), failures);
  return failures == 0 ? 0 : 1;
}

// ZeRO under DDP with no options: ZeRO sees that DDP averages the gradients and does not average them again, and
// trains as a plain optimizer under DDP does; DDP over part of the parameters is an error.
int worker_ddp_zero(const std::vector<std::string>&) {
  auto& pg = dist::init();
  const int r = pg.rank();
  struct Net : nn::Module {
    nn::Linear a{4, 6}, b{6, 3};
    Net() {
      register_module("a", a);
      register_module("b", b);
    }
    Tensor<float> forward(const Tensor<float>& x) { return b(relu(a(x))); }
  };
  manual_seed(5);
  Net m1;
  manual_seed(5);
  Net m2;
  nn::DistributedDataParallel d1(m1), d2(m2);
  optim::ZeroRedundancyOptimizer<optim::AdamW<float>> zero(d1.parameters(), {.lr = 0.05}, &pg);
  optim::AdamW<float> plain(d2.parameters(), {.lr = 0.05});
  WCHECK(zero.averaged_by_ddp(), "ZeRO did not see that DDP averages its parameters' gradients");
  for (int step = 0; step < 5; ++step) {
    manual_seed(100 + std::uint64_t(r) * 7 + std::uint64_t(step));
    const Tensor<float> x = randn<float>(Shape{8, 4});
    zero.zero_grad();
    Tensor<float>(sum(square(d1(x)))).backward();
    zero.step();
    plain.zero_grad();
    Tensor<float>(sum(square(d2(x)))).backward();
    plain.step();
  }
  WCHECK(max_diff(m1.parameters(), m2.parameters()) < 1e-6, "ZeRO under DDP differs from AdamW under DDP by ",
         max_diff(m1.parameters(), m2.parameters()));
  // DDP around one layer, ZeRO over the whole model: an error, not a silent mix.
  manual_seed(5);
  Net m3;
  nn::DistributedDataParallel<nn::Linear> part(m3.a);
  optim::ZeroRedundancyOptimizer<optim::SGD<float>> zero3(m3.parameters(), {.lr = 0.1}, &pg);
  std::string msg;
  try {
    Tensor<float>(sum(square(m3.forward(randn<float>(Shape{2, 4}))))).backward();
    zero3.step();
  } catch (const Error& e) {
    msg = e.what();
  }
  WCHECK(msg.find("averages the gradients of 2 of its 4 parameters") != std::string::npos,
         "DDP over part of ZeRO's parameters gave: ", msg);
  std::printf("rank %d: ddp + zero ok (%d failures)\n", r, failures);
  return failures == 0 ? 0 : 1;
}

int worker_exit(const std::vector<std::string>& args) {
  // For the launcher's tests: rank 1 exits with the code given, the others wait to be stopped.
  const int code = std::atoi(args.at(0).c_str());
  const char* rank = std::getenv("RANK");
  const char* token = std::getenv("EMBER_DIST_TOKEN");
  std::printf("rank %s: LOCAL_RANK=%s WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s token of %zu bytes\n", rank,
              std::getenv("LOCAL_RANK"), std::getenv("WORLD_SIZE"), std::getenv("MASTER_ADDR"),
              std::getenv("MASTER_PORT"), token ? std::strlen(token) : std::size_t(0));
  std::fflush(stdout);
  if (rank && std::string(rank) == "1") return code;
  if (code == 0) return 0;
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

// A broadcast that the root finishes (and exits after) while the last rank still waits for its live neighbour to
// forward the data: the root's exit is not an error for the others. Rank 1 arrives 400 ms late.
int worker_late(const std::vector<std::string>& args) {
  dist::InitOptions o;
  o.backend = args.at(0) == "tcp" ? dist::Backend::Tcp : dist::Backend::Shm;
  o.timeout = std::chrono::seconds(30);
  auto& pg = dist::init(o);
  const int r = pg.rank();
  if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  Tensor<std::int64_t> t = full<std::int64_t>(Shape{1}, r == 0 ? 42 : -1);
  pg.broadcast(t, 0).wait();
  WCHECK(t.item() == 42, "rank ", r, " received ", t.item(), " instead of 42");
  std::printf("rank %d: late ok (%d failures)\n", r, failures);
  return failures == 0 ? 0 : 1;
}

// ---- the tcp ring's connections -------------------------------------------------------------------------------

bool loopback_address(const std::string& a) {
  in_addr v4{};
  if (::inet_pton(AF_INET, a.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  return a == "::1";
}

/// The store's all-gather, except that rank 0 waits, once the ranks' ring addresses are known and before it connects
/// to rank 1, until the test has made its own connections to rank 1 (it sets "test/rogues done"): they arrive first.
class GatedBootstrap : public dist::StoreBootstrap {
 public:
  GatedBootstrap(std::shared_ptr<dist::Store> store, int rank, int world)
      : StoreBootstrap(store, "test/ring", rank, world), rank_(rank) {}
  std::vector<std::string> all_gather(const std::string& mine, const std::string& what, dist::Deadline d) override {
    auto out = StoreBootstrap::all_gather(mine, what, d);
    if (what == "tcp addresses" && rank_ == 0) (void)store()->get("test/rogues done");
    return out;
  }

 private:
  int rank_;
};

// A tcp group assembled as dist::init does (the store's token from the environment), its ring greeted with the token
// ("token"), with none ("open"), or, on rank 1 only, with another one ("other"); rank 0 waits at the gate ("gated").
int worker_ring(const std::vector<std::string>& args) {
  const auto li = dist::launch_info();
  const std::string& mode = args.at(0);
  std::string token = mode == "open" ? std::string() : li.token;
  if (mode == "other" && li.rank == 1) token = "another-token-of-32-bytes-abcdef";
  auto store = std::make_shared<dist::Store>(li.master_addr, li.master_port, li.timeout, li.token);
  std::shared_ptr<dist::StoreBootstrap> boot =
      args.size() > 1 && args[1] == "gated" ? std::make_shared<GatedBootstrap>(store, li.rank, li.world_size)
                                            : std::make_shared<dist::StoreBootstrap>(store, "test/ring", li.rank,
                                                                                     li.world_size);
  try {
    auto tcp = std::make_shared<dist::TcpCollectives>(li.rank, li.world_size, boot, store->local_address(),
                                                      li.timeout, token);
    // The listener was bound to the address the rank announced, loopback on this host: getsockname says which.
    WCHECK(loopback_address(tcp->listen_address()), "the ring listened on ", tcp->listen_address());
    dist::ProcessGroup pg(li.rank, li.world_size, tcp, boot, store);
    for (std::int64_t n : {std::int64_t(1), std::int64_t(7), std::int64_t(100003)}) check_collectives<float>(pg, n, false);
  } catch (const Error& e) {
    std::printf("rank %d: error: %s\n", li.rank, e.what());
    return 5;
  }
  std::printf("rank %d: ring ok (%d failures)\n", li.rank, failures);
  return failures == 0 ? 0 : 1;
}

int run_worker(const std::string& name, const std::vector<std::string>& args) {
  try {
    if (name == "collectives") return worker_collectives(args);
    if (name == "kill") return worker_kill(args);
    if (name == "mismatch") return worker_mismatch(args);
    if (name == "rendezvous") return worker_rendezvous(args);
    if (name == "ddp") return worker_ddp(args);
    if (name == "zero") return worker_zero(args);
    if (name == "ddp_zero") return worker_ddp_zero(args);
    if (name == "exit") return worker_exit(args);
    if (name == "late") return worker_late(args);
    if (name == "ring") return worker_ring(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker %s: %s\n", name.c_str(), e.what());
    return 10;
  }
  std::fprintf(stderr, "unknown worker %s\n", name.c_str());
  return 11;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("dist: every collective equals a local reference (shm and tcp; every dtype and op; 0 to 64 MiB)") {
  for (const char* backend : {"shm", "tcp"}) {
    for (int world : {2, 3}) {
      CAPTURE(backend);
      CAPTURE(world);
      const Ranks res = run_ranks("collectives", world, {backend});
      INFO(res.all());
      for (int r = 0; r < world; ++r) CHECK(res.exited_ok(r));
    }
  }
}

TEST_CASE("dist: a killed rank makes the others fail within seconds, naming it") {
  for (const char* backend : {"shm", "tcp"}) {
    CAPTURE(backend);
    const Ranks res = run_ranks("kill", 3, {backend});
    INFO(res.all());
    CHECK(WIFSIGNALED(res.status[1]));
    CHECK(res.exited_ok(0));
    CHECK(res.exited_ok(2));
    CHECK(res.seconds < 30);
    for (int r : {0, 2}) CHECK(contains(res.output[std::size_t(r)], "rank 1"));
  }
}

TEST_CASE("dist: a rank that finished its part and exited is not an error for one still receiving") {
  for (const char* backend : {"shm", "tcp"}) {
    CAPTURE(backend);
    const Ranks res = run_ranks("late", 3, {backend});
    INFO(res.all());
    for (int r = 0; r < 3; ++r) CHECK(res.exited_ok(r));
  }
}

TEST_CASE("dist: mismatched sizes or dtypes give an error naming both calls") {
  for (const char* backend : {"shm", "tcp"}) {
    for (const char* what : {"size", "dtype"}) {
      CAPTURE(backend);
      CAPTURE(what);
      const Ranks res = run_ranks("mismatch", 3, {backend, what});
      INFO(res.all());
      for (int r = 0; r < 3; ++r) CHECK(res.exited_ok(r));
      CHECK(contains(res.all(), std::string(what) == "size" ? "all_reduce of 999 float32" : "all_reduce of 1000 float64"));
    }
  }
}

TEST_CASE("dist: a rank that never arrives fails the rendezvous at its timeout, naming it") {
  const Ranks res = run_ranks("rendezvous", 3, {}, {}, 2);
  INFO(res.all());
  for (int r = 0; r < 2; ++r) {
    CHECK(res.exited_ok(r));
    CHECK(contains(res.output[std::size_t(r)], "2 of 3 ranks arrived (missing: rank 2)"));
  }
}

TEST_CASE("DistributedDataParallel: 2 ranks equal one process on the whole batch; no_sync; unused parameters") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const Ranks res = run_ranks("ddp", world);
    INFO(res.all());
    for (int r = 0; r < world; ++r) CHECK(res.exited_ok(r));
  }
}

TEST_CASE("ZeroRedundancyOptimizer: equals the plain optimizer over 10 steps with 1/world of its state") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const Ranks res = run_ranks("zero", world);
    INFO(res.all());
    for (int r = 0; r < world; ++r) CHECK(res.exited_ok(r));
  }
}

TEST_CASE("ZeRO under DDP: the gradients are averaged once, with no options") {
  const Ranks res = run_ranks("ddp_zero", 2);
  INFO(res.all());
  for (int r = 0; r < 2; ++r) CHECK(res.exited_ok(r));
}

TEST_CASE("dist: a world of one needs no launcher") {
  auto pg = dist::new_process_group({.rank = 0, .world_size = 1});
  CHECK(std::string(pg->backend()) == "self");
  Tensor<float> t = full<float>(Shape{3}, 2.f);
  pg->all_reduce(t, dist::ReduceOp::Avg).wait();
  CHECK(t.to_vector()[0] == 2.f);
  Tensor<float> out = empty<float>(Shape{3});
  pg->reduce_scatter_tensor(out, t).wait();
  CHECK(out.to_vector()[2] == 2.f);
  Tensor<std::int64_t> i = ones<std::int64_t>(Shape{2});
  CHECK_THROWS_WITH_AS(pg->all_reduce(i, dist::ReduceOp::Avg).wait(),
                       doctest::Contains("ReduceOp::Avg needs a floating dtype, got int64"), Error);
  Tensor<float> nc = ones<float>(Shape{3, 4}).t();
  CHECK_THROWS_WITH_AS(pg->all_reduce(nc), doctest::Contains("must be contiguous"), Error);
  CHECK_THROWS_WITH_AS(pg->all_gather_into_tensor(empty<float>(Shape{5}), t), doctest::Contains("expected world size"),
                       Error);
}

TEST_CASE("dist: the launcher's variables and the store's numbers are whole integers") {
  using ember_test::EnvGuard;
  EnvGuard no_rank("RANK", nullptr), no_world("WORLD_SIZE", nullptr), no_mpi("OMPI_COMM_WORLD_RANK", nullptr);
  EnvGuard procid("SLURM_PROCID", "1"), ntasks("SLURM_NTASKS", "4"), localid("SLURM_LOCALID", "1");
  EnvGuard addr("MASTER_ADDR", "127.0.0.1"), port("MASTER_PORT", nullptr);
  {
    // Slurm's "tasks on this node" is a count, optionally with a repeat: "2(x3)" is 2 on each of 3 nodes.
    EnvGuard per("SLURM_NTASKS_PER_NODE", "2(x2)");
    const auto li = dist::launch_info();
    CHECK(li.launcher == "slurm");
    CHECK(li.rank == 1);
    CHECK(li.world_size == 4);
    CHECK(li.local_world_size == 2);
  }
  {
    // atoi read "x2" as 0 and made it a node of one task.
    EnvGuard per("SLURM_NTASKS_PER_NODE", "x2");
    CHECK_THROWS_WITH_AS(dist::launch_info(), doctest::Contains("SLURM_NTASKS_PER_NODE is \"x2\""), Error);
  }
  {
    EnvGuard bad("MASTER_PORT", "29500 ");
    CHECK_THROWS_WITH_AS(
        dist::launch_info(),
        doctest::Contains("dist::init: environment variable MASTER_PORT is \"29500 \", not an integer in [1, 65535]"),
        Error);
  }
  // The store adds to whole integers only: strtoll-style parsing read "12abc" as 12 and answered 13.
  dist::StoreServer server(0);
  dist::Store store("127.0.0.1", server.port(), std::chrono::seconds(10));
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  store.set("text", "12abc");
  CHECK_THROWS_WITH_AS(store.add("text", 1), doctest::Contains("the value is not an integer"), Error);
  CHECK(store.get("text") == "12abc");
  store.set("big", "9223372036854775807");
  CHECK(store.add("big", 1) == std::numeric_limits<long long>::min());  // the server adds in two's complement
}

namespace {
// A port nothing listens on now (the kernel's pick, released).
int free_port() {
  dist::Socket s = dist::Socket::listen("127.0.0.1", 0, "free_port");
  return s.local_port();
}
}  // namespace

TEST_CASE("dist: rank 0's store listens on MASTER_ADDR and serves only clients that know EMBER_DIST_TOKEN") {
  using ember_test::EnvGuard;
  EnvGuard no_rank("RANK", nullptr), no_world("WORLD_SIZE", nullptr), no_agent("EMBER_USE_AGENT_STORE", nullptr);
  EnvGuard no_bind("EMBER_DIST_STORE_BIND", nullptr), no_torch("TORCHELASTIC_USE_AGENT_STORE", nullptr);
  const std::string token = "the-job-token-0123456789";
  {
    // A group of one on the shm backend still meets at the store: rank 0 serves it, with the token.
    EnvGuard tok("EMBER_DIST_TOKEN", token.c_str());
    const int port = free_port();
    auto pg = dist::new_process_group({.backend = dist::Backend::Shm, .rank = 0, .world_size = 1,
                                       .master_addr = "127.0.0.1", .master_port = port});
    Tensor<float> t = full<float>(Shape{3}, 2.f);
    pg->all_reduce(t).wait();
    CHECK(t.to_vector()[0] == 2.f);
    CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", port, std::chrono::seconds(5)),
                         doctest::Contains("the store requires the job's token"), Error);
    dist::Store peer("127.0.0.1", port, std::chrono::seconds(5), token);
    CHECK(peer.check("ember/default/" + std::to_string(dist::detail::group_counter().load() - 1) + "/rendezvous/0/0"));
  }
  {
    // Without a token: open, on loopback; a client that brings a token does not trust it.
    EnvGuard tok("EMBER_DIST_TOKEN", nullptr);
    const int port = free_port();
    auto pg = dist::new_process_group({.backend = dist::Backend::Shm, .rank = 0, .world_size = 1,
                                       .master_addr = "127.0.0.1", .master_port = port});
    dist::Store anyone("127.0.0.1", port, std::chrono::seconds(5));
    CHECK_THROWS_WITH_AS(dist::Store("127.0.0.1", port, std::chrono::seconds(5), token),
                         doctest::Contains("does not ask for a token"), Error);
  }
  {
    // Loopback cannot serve ranks on other hosts: an error that says what to set (not a rendezvous that times out).
    EnvGuard tok("EMBER_DIST_TOKEN", nullptr);
    CHECK_THROWS_WITH_AS(dist::new_process_group({.backend = dist::Backend::Tcp, .rank = 0, .world_size = 2,
                                                  .local_world_size = 1, .master_addr = "127.0.0.1",
                                                  .master_port = free_port()}),
                         doctest::Contains("which only this host reaches, but 1 of the 2 ranks run on other hosts: "
                                           "set MASTER_ADDR"),
                         Error);
  }
  {
    // A weak token is refused, naming the variable and not the token.
    EnvGuard tok("EMBER_DIST_TOKEN", "hunter2");
    try {
      (void)dist::launch_info();
      FAIL("a 7-byte token was accepted");
    } catch (const Error& e) {
      CHECK(contains(e.what(), "dist::init: EMBER_DIST_TOKEN holds 7 bytes"));
      CHECK_FALSE(contains(e.what(), "hunter2"));
    }
    EnvGuard bind("EMBER_DIST_STORE_BIND", "0.0.0.0");
    CHECK(dist::launch_info({.token = token}).store_bind == "0.0.0.0");
  }
}

namespace {
/// What the peer sends on `s` until it closes the connection; `closed` is false when `limit` passed first.
std::string read_until_closed(const dist::Socket& s, bool& closed,
                              std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  std::string got;
  const auto d = dist::deadline_in(limit);
  char buf[256];
  closed = false;
  for (;;) {
    if (!s.wait_readable(d)) return got;
    try {
      got.append(buf, s.recv_some(buf, sizeof buf, {}));
    } catch (const Error&) {
      closed = true;
      return got;
    }
  }
}

/// An IPv4 address of this host's that is not loopback ("" when it has none).
std::string non_loopback_address() {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return {};
  std::string found;
  for (ifaddrs* i = ifs; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    const in_addr a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &a, buf, sizeof buf);
    found = buf;
  }
  ::freeifaddrs(ifs);
  return found;
}

// While rank 0 waits at the gate: connections to rank 1's ring port (read from the store, as the ranks announce it)
// from a program that is not rank 0, each of which must be refused and closed.
void rogue_connections(dist::StoreServer& server, const std::string& token, bool open) {
  using dist::detail::Digest;
  const auto d = dist::deadline_in(std::chrono::seconds(60));
  dist::Store st("127.0.0.1", server.port(), std::chrono::seconds(60), token);
  struct Release {  // rank 0 goes on whatever happens here
    dist::Store& st;
    ~Release() {
      try {
        st.set("test/rogues done", "1");
      } catch (...) {
      }
    }
  } release{st};
  std::vector<std::string> addrs;
  for (int r = 0; r < 3; ++r) addrs.push_back(st.get("test/ring/tcp addresses/0/" + std::to_string(r)));
  const std::string& a1 = addrs[1];
  const int port = std::stoi(a1.substr(a1.rfind(' ') + 1));
  CHECK(a1.substr(0, a1.rfind(' ')) == "127.0.0.1");
  // From another interface of this host the port cannot be reached at all.
  const std::string other = non_loopback_address();
  if (other.empty()) MESSAGE("this host has no interface but loopback: not tried from another one");
  else CHECK_THROWS_AS(dist::Socket::connect(other, port, dist::deadline_in(std::chrono::milliseconds(300)), "rogue"),
                       Error);

  auto connect = [&] { return dist::Socket::connect("127.0.0.1", port, d, "rogue"); };
  const Digest group = dist::detail::ring_group_digest(addrs);
  Digest other_group = group;
  other_group[0] ^= 1;
  using Prove =
      std::function<Digest(const unsigned char* nonce_l, const unsigned char* nonce_c, const std::string& id)>;
  const Prove zeros = [](const unsigned char*, const unsigned char*, const std::string&) { return Digest{}; };
  auto ring_proof = [&](const std::string& key) -> Prove {
    return [key](const unsigned char* nl, const unsigned char* nc, const std::string& id) {
      return dist::detail::labelled_proof(key, "ring", "client", nl, nc, id);
    };
  };
  // A greeting in the ring's own format, as `rank` of `grp`, with the proof `prove` makes.
  auto greet = [&](int rank, const Digest& grp, const Prove& prove) {
    dist::Socket s = connect();
    char hello[dist::detail::kRingHelloBytes];
    s.recv_all(hello, sizeof hello, d, "rogue: reading the listener's greeting");
    CHECK(std::string_view(hello, 4) == "EMRS");
    CHECK(int(hello[5]) == (open ? 0 : 1));  // the listener says whether it wants the token
    unsigned char nonce_c[dist::detail::kNonceBytes];
    dist::detail::random_bytes(nonce_c, sizeof nonce_c);
    const std::string id = dist::detail::ring_identity(rank, 3, grp);
    const Digest proof = prove(reinterpret_cast<const unsigned char*>(hello + 6), nonce_c, id);
    const std::string msg = "EMRC" + id + std::string(reinterpret_cast<const char*>(nonce_c), sizeof nonce_c) +
                            std::string(reinterpret_cast<const char*>(proof.data()), proof.size());
    s.send_all(msg.data(), msg.size(), d, "rogue: greeting");
    return s;
  };
  auto raw = [&](const std::string& bytes) {
    dist::Socket s = connect();
    s.send_all(bytes.data(), bytes.size(), d, "rogue: sending");
    return s;
  };
  struct Attempt {
    std::string what;
    dist::Socket s;
    int reason;         // the refusal's code
    std::size_t heard;  // the bytes of the listener's greeting read already
  };
  std::vector<Attempt> tries;
  // The first: the greeting the ring used to take, rank 0's as far as it could tell (magic, rank, world, group).
  std::string old_hello = "HELL";
  dist::detail::put_u32(old_hello, 0);
  dist::detail::put_u32(old_hello, 3);
  dist::detail::put_u32(old_hello, std::uint32_t(std::hash<std::string>{}(addrs[0])));
  const std::size_t hello = dist::detail::kRingHelloBytes;
  tries.push_back({"the unproven greeting of rank 0", raw(old_hello), 1, 0});
  tries.push_back({"an HTTP request", raw("GET / HTTP/1.1\r\nHost: ember\r\n\r\n"), 1, 0});
  dist::Socket stall = connect();  // says nothing
  if (!open) {
    tries.push_back({"rank 0's greeting with another token",
                     greet(0, group, ring_proof("not-the-job-token-0123456789")), 2, hello});
    tries.push_back({"rank 0's greeting proven as the store's client would prove it",
                     greet(0, group,
                           [&](const unsigned char* nl, const unsigned char* nc, const std::string&) {
                             return dist::detail::client_proof(token, nl, nc);
                           }),
                     2, hello});
  }
  // The token proves the job, not the rank: rank 2 (the next one, not the previous) and another group are refused.
  tries.push_back({"rank 2's greeting", greet(2, group, open ? zeros : ring_proof(token)), 3, hello});
  tries.push_back({"a greeting from another group", greet(0, other_group, open ? zeros : ring_proof(token)), 3, hello});
  for (auto& t : tries) {
    CAPTURE(t.what);
    bool closed = false;
    const std::string got = read_until_closed(t.s, closed);
    CHECK(closed);
    // The listener's greeting, then its refusal and nothing else: never the answer that takes a connection.
    const std::size_t at = hello - t.heard;
    CHECK(got.size() == at + dist::detail::kRingAnswerBytes);
    if (got.size() != at + dist::detail::kRingAnswerBytes) continue;
    if (at > 0) CHECK(got.substr(0, 4) == "EMRS");
    CHECK(got.substr(at, 4) == "EMRX");
    CHECK(int(got[at + 4]) == t.reason);
  }
  // One that stalls is closed after a short while, still before rank 0 arrives.
  bool closed = false;
  const std::string got = read_until_closed(stall, closed);
  CHECK(closed);
  CHECK(got.size() == hello);
}
}  // namespace

TEST_CASE("dist: tcp: rogue connections to a rank's ring port, made before its neighbour's, are refused; sums hold") {
  for (bool open : {false, true}) {
    CAPTURE(open);
    const Ranks res = run_ranks("ring", 3, {open ? "open" : "token", "gated"}, {{"EMBER_DIST_TIMEOUT", "30"}}, -1, 120,
                                [&](dist::StoreServer& server, const std::string& token) {
                                  rogue_connections(server, token, open);
                                });
    INFO(res.all());
    for (int r = 0; r < 3; ++r) {
      CHECK(res.exited_ok(r));
      CHECK(contains(res.output[std::size_t(r)], "ring ok (0 failures)"));
    }
  }
}

TEST_CASE("dist: tcp: a rank with another token is refused, and the message says so") {
  // Rank 1 has another token. Each rank greets the next one in the ring, so two pairs disagree at once: rank 2
  // refuses rank 1's greeting, and rank 1 refuses rank 0's. Which refusal a rank reports first depends on timing;
  // either way the greeter of a refused pair says that it was refused for the token, and the refusing rank says
  // that it refused a connection whose token proof was wrong.
  const Ranks res = run_ranks("ring", 3, {"other"}, {{"EMBER_DIST_TIMEOUT", "5"}});
  INFO(res.all());
  for (int st : res.status) CHECK((st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 5));  // (each gave an error)
  const std::string refused = "it refused this rank: this rank's proof of the job's token was wrong";
  const bool by_2 = contains(res.output[1], "greeting rank 2 at 127.0.0.1:") && contains(res.output[1], refused);
  const bool by_1 = contains(res.output[0], "greeting rank 1 at 127.0.0.1:") && contains(res.output[0], refused);
  CHECK((by_2 || by_1));
  auto refusing = [&](int r, int from) {
    return contains(res.output[std::size_t(r)], "this rank refused 1 connection that did not prove to be rank " +
                                                    std::to_string(from) + " (the last: its proof of the job's token "
                                                    "(EMBER_DIST_TOKEN) was wrong)");
  };
  CHECK((refusing(2, 1) || refusing(1, 0)));
}

namespace {
/// The all-gather of a rank whose peers are made up by the test: its own address, then `others`.
class FixedBootstrap : public dist::Bootstrap {
 public:
  explicit FixedBootstrap(std::vector<std::string> others) : others_(std::move(others)) {}
  std::vector<std::string> all_gather(const std::string& mine, const std::string&, dist::Deadline) override {
    std::vector<std::string> all{mine};
    all.insert(all.end(), others_.begin(), others_.end());
    return all;
  }
  std::string where() const override { return "the test"; }

 private:
  std::vector<std::string> others_;
};
}  // namespace

TEST_CASE("dist: tcp: a rank checks the proof of the rank it connects to before it sends anything") {
  const std::string token = "the-job-token-0123456789";
  {
    // A world of one connects to itself, through the same greeting.
    auto boot = std::make_shared<FixedBootstrap>(std::vector<std::string>{});
    auto tcp = std::make_shared<dist::TcpCollectives>(0, 1, boot, "127.0.0.1", std::chrono::seconds(10), token);
    CHECK(tcp->listen_address() == "127.0.0.1");
    dist::ProcessGroup pg(0, 1, tcp, boot);
    Tensor<float> t = full<float>(Shape{5}, 3.f);
    pg.all_reduce(t).wait();
    CHECK(t.to_vector()[4] == 3.f);
  }
  // The next rank's address leads to a program that answers the greeting, each time in another wrong way.
  struct Case {
    std::string hello;   // what it sends first (its nonce: zeros)
    std::string answer;  // what it answers to the greeting
    const char* error;
  };
  const std::string zeros(32, '\0');
  const std::vector<Case> cases{
      {"EMRS\x01\x01" + zeros, "EMRA" + zeros, "could not prove it knows the job's token (EMBER_DIST_TOKEN)"},
      {"SSH-2.0-OpenSSH_9.2 " + std::string(18, 'x'), "", "does not answer as the ring of this version of ember"},
      {std::string("EMRS\x01\x00", 6) + zeros, "", "it does not ask for the job's token and this rank has one"},
      {"EMRS\x01\x01" + zeros, "EMRX\x02" + std::string(31, '\0'),
       "it refused this rank: this rank's proof of the job's token was wrong"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.error);
    dist::Socket fake = dist::Socket::listen("127.0.0.1", 0, "fake rank");
    std::string greeting;
    std::thread peer([&] {
      try {
        const auto d = dist::deadline_in(std::chrono::seconds(10));
        dist::Socket s = fake.accept(d, "fake rank");
        s.send_all(c.hello.data(), c.hello.size(), d, "fake rank");
        if (c.answer.empty()) return;
        greeting.resize(dist::detail::kRingGreetingBytes);
        s.recv_all(greeting.data(), greeting.size(), d, "fake rank");
        s.send_all(c.answer.data(), c.answer.size(), d, "fake rank");
        bool closed = false;
        read_until_closed(s, closed, std::chrono::seconds(10));  // (what the rank sends after: nothing)
        greeting += closed ? "" : " and more";
      } catch (const std::exception& e) {
        greeting = e.what();
      }
    });
    auto boot =
        std::make_shared<FixedBootstrap>(std::vector<std::string>{"127.0.0.1 " + std::to_string(fake.local_port())});
    CHECK_THROWS_WITH_AS(dist::TcpCollectives(0, 2, boot, "127.0.0.1", std::chrono::seconds(10), token),
                         doctest::Contains(c.error), Error);
    peer.join();
    if (!c.answer.empty()) {
      CHECK(greeting.size() == dist::detail::kRingGreetingBytes);
      CHECK(greeting.substr(0, 4) == "EMRC");
    }
  }
}

/// Runs a shell command, returning (wait status, output).
std::pair<int, std::string> shell(const std::string& cmd) {
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  return {::pclose(f), out};
}

#ifdef EMBER_RUN_PATH
TEST_CASE("ember-run: starts the ranks with torchrun's variables, prefixes their output, stops them when one fails") {
  const std::string run = EMBER_RUN_PATH, self = self_exe();
  {
    const auto ran = shell(run + " -n 2 -- " + self + " --worker=exit 0");
    const int st = ran.first;
    const std::string& out = ran.second;
    INFO(out);
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    CHECK(contains(out, "[rank 0] rank 0: LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1"));
    CHECK(contains(out, "[rank 1] rank 1: LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1"));
    CHECK(contains(out, "token of 64 bytes"));  // made for the job
  }
  {
    // The ranks meet at ember-run's store, proving the token it gave them; a token set beforehand is passed on.
    const auto ran = shell("EMBER_DIST_TOKEN=a-token-set-by-the-user " + run + " -n 2 -- " + self + " --worker=late shm");
    INFO(ran.second);
    CHECK((WIFEXITED(ran.first) && WEXITSTATUS(ran.first) == 0));
    CHECK(contains(ran.second, "rank 1: late ok (0 failures)"));
    const auto given = shell("EMBER_DIST_TOKEN=a-token-set-by-the-user " + run + " -n 1 -- " + self + " --worker=exit 0");
    CHECK(contains(given.second, "token of 23 bytes"));
    const auto weak = shell("EMBER_DIST_TOKEN=weak " + run + " -n 1 -- " + self + " --worker=exit 0");
    INFO(weak.second);
    CHECK((WIFEXITED(weak.first) && WEXITSTATUS(weak.first) != 0));
    CHECK(contains(weak.second, "EMBER_DIST_TOKEN holds 4 bytes; a token needs 16"));
  }
  {
    const auto t0 = Clock::now();
    const auto ran = shell(run + " -n 3 " + self + " --worker=exit 3");
    const int st = ran.first;
    const std::string& out = ran.second;
    INFO(out);
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 3));  // the failed rank's code
    CHECK(contains(out, "rank 1 exited with code 3; stopping the other ranks"));
    CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 30);  // the others did not sleep their 60 s
  }
  {
    const auto ran = shell(run + " -n 2 -- /nonexistent/program");
    const int st = ran.first;
    const std::string& out = ran.second;
    INFO(out);
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) != 0));
    CHECK(contains(out, "cannot start /nonexistent/program"));
  }
}
#endif

#if EMBER_TEST_MPI
TEST_CASE("dist: the mpi backend under mpirun equals the local reference") {
  // As root (CI containers) Open MPI wants to be told; single-copy through ptrace is often not allowed there.
  const std::string cmd = std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                                      "OMPI_MCA_btl_vader_single_copy_mechanism=none EMBER_NUM_THREADS=1 ") +
                          EMBER_MPIEXEC + " --oversubscribe -n 3 " + self_exe() + " --worker=collectives mpi";
  const auto ran = shell(cmd);
  const int st = ran.first;
  const std::string& out = ran.second;
  INFO(out);
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  CHECK(contains(out, "rank 2: mpi ok (0 failures)"));
}
#endif

int main(int argc, char** argv) {
  if (argc > 1 && std::strncmp(argv[1], "--worker=", 9) == 0) {
    std::vector<std::string> args(argv + 2, argv + argc);
    const int rc = run_worker(argv[1] + 9, args);
    std::fflush(stdout);
    std::fflush(stderr);
    return rc;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
