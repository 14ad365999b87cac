// bench_allreduce: ember's all-reduce against its peers, side by side in one run, on this host.
//
// For each world size (2 and 3 ranks) it times float32 sum all-reduces of 1 KiB to 256 MiB with ember's shm and tcp
// backends (and ember's mpi backend when built), Open MPI's own MPI_Allreduce under mpirun (allreduce_mpi_peer) and
// Gloo's TCP ring (allreduce_gloo_peer, both of its ring implementations, the better one quoted), every library timed
// by the same loop (allreduce_sweep.hpp), the libraries taking turns over 3 rounds (the median per size is quoted;
// the raw lines give every round). It prints time and bus bandwidth as nccl-tests define it (algbw = bytes /
// time, busbw = algbw * 2(n-1)/n), the ratios the targets are stated in, and single-core memcpy bandwidth measured in
// the same run. With --ddp it measures instead how much of DistributedDataParallel's communication backward hides:
// on 2 ranks, the time from the start of backward to "every bucket reduced" against backward alone.
//
//   bench_allreduce [--worlds=2,3] [--sizes=1K,64M] [--backends=shm,tcp,mpi] [--no-peers] [--rounds=3]
//   bench_allreduce --ddp [--steps=N]
//
// Ranks are started with ember-run (this build's), the MPI peer with mpirun (as root it sets Open MPI's
// OMPI_ALLOW_RUN_AS_ROOT variables). Each rank runs with one thread (EMBER_NUM_THREADS=1, OMP_NUM_THREADS=1).
#include <ember/dist.hpp>
#include <ember/ember.hpp>
#include <ember/nn/ddp.hpp>
#ifndef EMBER_WITH_MPI
#define EMBER_WITH_MPI 0
#endif
#if EMBER_WITH_MPI
#include <ember/dist/mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../examples/fashion_cnn.hpp"
#include "allreduce_sweep.hpp"

using namespace ember;
using Clock = std::chrono::steady_clock;

namespace {

std::string self_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string p(buf, n > 0 ? std::size_t(n) : 0);
  return p.substr(0, p.rfind('/'));
}
std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, n > 0 ? std::size_t(n) : 0);
}

/// Runs a shell command and returns its standard output ("" when it failed; its stderr passes through).
std::string capture(const std::string& cmd) {
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return {};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int st = ::pclose(f);
  if (st != 0) {
    std::fprintf(stderr, "bench_allreduce: `%s` failed (status %d)\n", cmd.c_str(), st);
    return {};
  }
  return out;
}

/// bytes -> microseconds from "size=B us=T" lines.
std::map<std::size_t, double> parse(const std::string& out) {
  std::map<std::size_t, double> m;
  std::size_t pos = 0;
  while ((pos = out.find("size=", pos)) != std::string::npos) {
    std::size_t b = 0;
    double us = 0;
    if (std::sscanf(out.c_str() + pos, "size=%zu us=%lf", &b, &us) == 2) m[b] = us;
    pos += 5;
  }
  return m;
}

double memcpy_gbs() {
  const std::size_t n = std::size_t(256) << 20;
  std::vector<char> a(n, 1), b(n, 2);
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    std::swap(a, b);
  }
  std::sort(t.begin(), t.end());
  return double(n) / t[t.size() / 2] / 1e9;
}

std::string size_str(std::size_t b) {
  if (b >= (std::size_t(1) << 20)) return std::to_string(b >> 20) + " MiB";
  return std::to_string(b >> 10) + " KiB";
}

// ---- a rank of ember's sweep -------------------------------------------------------------------------------------
int worker_sweep(const std::string& backend, const std::string& sizes) {
  dist::InitOptions o;
  o.backend = backend == "shm" ? dist::Backend::Shm : backend == "tcp" ? dist::Backend::Tcp : dist::Backend::Mpi;
  auto& pg = dist::init(o);
  Tensor<float> t;  // a user holds the tensor across calls: made once per size
  bench::sweep(pg.rank(), bench::sweep_sizes(sizes),
               [&](float* p, std::size_t n) {
                 if (!t.defined() || t.data() != p || t.numel() != std::int64_t(n))
                   t = from_blob(p, Shape{std::int64_t(n)});
                 pg.all_reduce(t).wait();
               },
               [&] { pg.barrier().wait(); });
  return 0;
}

// ---- a rank of the DDP overlap measurement -----------------------------------------------------------------------
struct Mlp : nn::Module {
  nn::Linear fc1{784, 1024}, fc2{1024, 1024}, fc3{1024, 10};
  Mlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  Tensor<float> forward(const Tensor<float>& x) { return fc3(relu(fc2(relu(fc1(x.flatten(1)))))); }
};

template <class M>
void ddp_case(const char* name, dist::ProcessGroup& pg, double bucket_mb, int steps) {
  manual_seed(1);
  M plain, wrapped_net;
  nn::DistributedDataParallel ddp(wrapped_net, {.bucket_cap_mb = bucket_mb});
  manual_seed(2 + std::uint64_t(pg.rank()));
  const Tensor<float> x = randn<float>(Shape{64, 1, 28, 28});
  const Tensor<std::int64_t> y = randint<std::int64_t>(0, 10, Shape{64});
  std::size_t grad_bytes = 0;
  for (auto& p : plain.parameters()) grad_bytes += std::size_t(p.numel()) * 4;
  // Alternating: backward of the plain model, backward through DDP (until every bucket is reduced).
  std::vector<double> alone, with_ddp, comm;
  Tensor<float> flat = zeros<float>(Shape{std::int64_t(grad_bytes / 4)});
  for (int s = 0; s < steps + 2; ++s) {
    pg.barrier().wait();
    Tensor<float> l1 = nn::cross_entropy(plain.forward(x), y);
    plain.zero_grad();
    auto t0 = Clock::now();
    l1.backward();
    const double a = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    pg.barrier().wait();
    Tensor<float> l2 = nn::cross_entropy(ddp(x), y);
    wrapped_net.zero_grad();
    t0 = Clock::now();
    l2.backward();
    const double b = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    pg.barrier().wait();
    t0 = Clock::now();
    pg.all_reduce(flat, dist::ReduceOp::Avg).wait();
    const double c = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (s >= 2) {  // (warm-up)
      alone.push_back(a);
      with_ddp.push_back(b);
      comm.push_back(c);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  if (pg.rank() == 0)
    std::printf("ddp model=%s grads=%.2fMiB buckets=%zu bucket_cap_mb=%g backward_alone_ms=%.3f "
                "backward_ddp_ms=%.3f allreduce_alone_ms=%.3f ratio=%.3f\n",
                name, double(grad_bytes) / (1 << 20), ddp.buckets().size(), bucket_mb, median(alone), median(with_ddp),
                median(comm), median(with_ddp) / median(alone));
}

int worker_ddp(int steps) {
  auto& pg = dist::init();
  ddp_case<Net<amp::fp32>>("cnn", pg, 25, steps);
  ddp_case<Net<amp::fp32>>("cnn", pg, 0.05, steps);
  ddp_case<Mlp>("mlp", pg, 25, steps);
  ddp_case<Mlp>("mlp", pg, 1, steps);
  return 0;
}

std::string arg_value(int argc, char** argv, const char* name, const std::string& fallback) {
  const std::string pre = std::string(name) + "=";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(pre, 0) == 0) return argv[i] + pre.size();
  return fallback;
}
bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], name)) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && !std::strcmp(argv[1], "--worker=sweep")) return worker_sweep(argv[2], argc > 3 ? argv[3] : "");
    if (argc > 1 && !std::strcmp(argv[1], "--worker=ddp")) return worker_ddp(std::atoi(argv[2]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank error: %s\n", e.what());
    return 1;
  }
  const std::string dir = self_dir(), exe = self_exe();
  const std::string run = std::string(EMBER_RUN_PATH) + " --no-prefix";
  const std::string env = "EMBER_NUM_THREADS=1 OMP_NUM_THREADS=1 ";
  if (has_flag(argc, argv, "--ddp")) {
    const std::string steps = arg_value(argc, argv, "--steps", "20");
    std::fputs(capture(env + run + " -n 2 " + exe + " --worker=ddp " + steps).c_str(), stdout);
    return 0;
  }
  const std::string sizes = arg_value(argc, argv, "--sizes", "");
  const std::string worlds = arg_value(argc, argv, "--worlds", "2,3");
  std::string backends = arg_value(argc, argv, "--backends", EMBER_WITH_MPI ? "shm,tcp,mpi" : "shm,tcp");
  const bool peers = !has_flag(argc, argv, "--no-peers");
  const std::string sizes_arg = sizes.empty() ? "" : " --sizes=" + sizes;
  const int rounds = std::max(1, std::atoi(arg_value(argc, argv, "--rounds", "3").c_str()));

  const double membw = memcpy_gbs();
  std::printf("memcpy (one core, 256 MiB): %.2f GB/s\n", membw);
  for (std::size_t pos = 0; pos < worlds.size();) {
    const std::size_t comma = std::min(worlds.find(',', pos), worlds.size());
    const int w = std::atoi(worlds.substr(pos, comma - pos).c_str());
    pos = comma + 1;
    const std::string mpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                               "OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe --bind-to none";
    // Each library's sweep `rounds` times, the libraries taking turns, and per size the median over the rounds.
    std::vector<std::pair<std::string, std::string>> libs;  // (name, command)
    for (std::size_t b = 0; b < backends.size();) {
      const std::size_t c = std::min(backends.find(',', b), backends.size());
      const std::string be = backends.substr(b, c - b);
      b = c + 1;
      const std::string launch = be == "mpi" ? mpirun + " -n " + std::to_string(w) : run + " -n " + std::to_string(w);
      libs.push_back({"ember " + be, env + launch + " " + exe + " --worker=sweep " + be + (sizes.empty() ? "" : " " + sizes)});
    }
    if (peers && ::access((dir + "/allreduce_mpi_peer").c_str(), X_OK) == 0)
      libs.push_back({"Open MPI", env + mpirun + " -n " + std::to_string(w) + " " + dir + "/allreduce_mpi_peer" + sizes_arg});
    const bool have_gloo = peers && ::access((dir + "/allreduce_gloo_peer").c_str(), X_OK) == 0;
    if (have_gloo)
      for (const char* mode : {"ring", "chunked"})
        libs.push_back({std::string("Gloo ") + mode, env + run + " -n " + std::to_string(w) + " " + dir +
                                                         "/allreduce_gloo_peer STORE " + mode + sizes_arg});
    std::map<std::string, std::map<std::size_t, std::vector<double>>> runs;  // library -> bytes -> us per round
    for (int round = 0; round < rounds; ++round)
      for (const auto& [name, cmd] : libs) {
        std::string c = cmd;
        char tmpl[] = "/tmp/ember-gloo-XXXXXX";  // Gloo's file store, new for each run
        if (const auto at = c.find(" STORE "); at != std::string::npos) {
          if (!::mkdtemp(tmpl)) continue;
          c.replace(at, 7, std::string(" ") + tmpl + " ");
        }
        for (const auto& [b, us] : parse(capture(c))) runs[name][b].push_back(us);
        if (c != cmd) capture(std::string("rm -rf ") + tmpl);
      }
    std::map<std::string, std::map<std::size_t, double>> res;  // library -> bytes -> median us
    std::vector<std::string> order;
    for (const auto& [name, cmd] : libs) {
      order.push_back(name);
      for (auto& [b, v] : runs[name]) {
        std::sort(v.begin(), v.end());
        res[name][b] = v[v.size() / 2];
      }
    }
    // The table: per size, each library's time and busbw.
    const double factor = 2.0 * (w - 1) / w;
    std::printf("\n%d ranks: time per all-reduce (us) and bus bandwidth (GB/s)\n%-9s", w, "size");
    for (const auto& n : order) std::printf(" | %-22s", n.c_str());
    std::printf("\n");
    for (std::size_t bytes : bench::sweep_sizes(sizes)) {
      std::printf("%-9s", size_str(bytes).c_str());
      for (const auto& n : order) {
        auto it = res[n].find(bytes);
        if (it == res[n].end()) std::printf(" | %-22s", "-");
        else std::printf(" | %10.1f us %6.2f GB/s", it->second, double(bytes) / it->second / 1e3 * factor);
      }
      std::printf("\n");
    }
    // The raw lines and the target ratios.
    auto busbw = [&](const std::string& n, std::size_t b) {
      auto it = res[n].find(b);
      return it == res[n].end() ? 0.0 : double(b) / it->second / 1e3 * factor;
    };
    auto us = [&](const std::string& n, std::size_t b) {
      auto it = res[n].find(b);
      return it == res[n].end() ? 0.0 : it->second;
    };
    const std::size_t big = std::size_t(64) << 20, small = 1024;
    const double gloo = std::max(busbw("Gloo ring", big), busbw("Gloo chunked", big));
    std::printf("targets (%d ranks): shm 64 MiB busbw / Open MPI = %.2f, / memcpy = %.2f; tcp 64 MiB busbw / Gloo = %.2f; "
                "1 KiB latency shm %.1f us vs Open MPI %.1f us\n",
                w, busbw("ember shm", big) / std::max(busbw("Open MPI", big), 1e-9),
                busbw("ember shm", big) / membw, busbw("ember tcp", big) / std::max(gloo, 1e-9), us("ember shm", small),
                us("Open MPI", small));
    for (const auto& n : order)
      for (const auto& [b, v] : runs[n]) {
        std::printf("raw world=%d lib=\"%s\" size=%zu us=", w, n.c_str(), b);
        for (std::size_t k = 0; k < v.size(); ++k) std::printf("%s%.3f", k ? "," : "", v[k]);
        std::printf(" median_busbw=%.3f\n", double(b) / res[n][b] / 1e3 * factor);
      }
    std::fflush(stdout);
  }
  return 0;
}
