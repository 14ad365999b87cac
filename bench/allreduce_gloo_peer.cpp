// The Gloo peer of bench_allreduce (kept out of CI; built when CMake finds Debian's libgloo-dev): Gloo's ring
// all-reduce over its TCP transport on loopback, timed by the same loop as ember's (allreduce_sweep.hpp).
// Started as the ranks of a job by ember-run (RANK, WORLD_SIZE); the ranks meet through a Gloo FileStore folder.
//   allreduce_gloo_peer STORE_DIR ring|chunked [--sizes=1K,64M]
//     ring     gloo::allreduce with the ring algorithm (the call PyTorch's gloo backend makes)
//     chunked  gloo::AllreduceRingChunked (Gloo's pipelined ring)
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "allreduce_sweep.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: allreduce_gloo_peer STORE_DIR ring|chunked [--sizes=...]\n");
    return 2;
  }
  const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  const int world = std::atoi(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "1");
  const std::string mode = argv[2];
  std::string sizes;
  if (argc > 3 && std::string(argv[3]).rfind("--sizes=", 0) == 0) sizes = argv[3] + 8;

  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[1]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
  ctx->connectFullMesh(store, dev);

  std::uint32_t tag = 0;
  auto barrier = [&] {
    gloo::BarrierOptions o(ctx);
    o.setTag(tag++);
    gloo::barrier(o);
  };
  if (mode == "chunked") {
    // The algorithm object is set up once per buffer and size, as its users do.
    std::map<std::pair<float*, std::size_t>, std::unique_ptr<gloo::AllreduceRingChunked<float>>> algos;
    bench::sweep(rank, bench::sweep_sizes(sizes), [&](float* p, std::size_t n) {
      auto& a = algos[{p, n}];
      if (!a) a = std::make_unique<gloo::AllreduceRingChunked<float>>(ctx, std::vector<float*>{p}, int(n));
      a->run();
    }, barrier);
  } else {
    bench::sweep(rank, bench::sweep_sizes(sizes), [&](float* p, std::size_t n) {
      gloo::AllreduceOptions o(ctx);
      o.setOutput(p, n);
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, std::size_t)>(&gloo::sum<float>));
      o.setTag(tag++);
      gloo::allreduce(o);
    }, barrier);
  }
  return 0;
}
