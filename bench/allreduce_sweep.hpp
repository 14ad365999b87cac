// The timing loop shared by bench_allreduce's ember ranks and its peer programs (Gloo, MPI), so every library is
// timed the same way: float32 sum all-reduces of each size, 3 warm-up calls, then 5 rounds of calls started
// together (a barrier), the time per call being the median round's. Rank 0 prints one line per size:
// "size=<bytes> us=<microseconds per all-reduce>".
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

/// 1 KiB, 4 KiB, ..., 256 MiB (powers of 4), or the sizes of "--sizes=1K,64M" style lists.
inline std::vector<std::size_t> sweep_sizes(const std::string& list = "") {
  std::vector<std::size_t> out;
  if (list.empty()) {
    for (std::size_t b = 1024; b <= (std::size_t(256) << 20); b *= 4) out.push_back(b);
    return out;
  }
  std::size_t pos = 0;
  while (pos < list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    std::string item = list.substr(pos, comma - pos);
    std::size_t mult = 1;
    if (!item.empty() && (item.back() == 'K' || item.back() == 'M')) {
      mult = item.back() == 'K' ? 1024 : std::size_t(1) << 20;
      item.pop_back();
    }
    out.push_back(std::size_t(std::atoll(item.c_str())) * mult);
    pos = comma + 1;
  }
  return out;
}


/// allreduce(float* data, std::size_t n) sums n floats over the ranks in place; barrier() synchronises them.
template <class AllReduce, class Barrier>
void sweep(int rank, const std::vector<std::size_t>& sizes, AllReduce allreduce, Barrier barrier) {
  std::size_t most = 0;
  for (std::size_t b : sizes) most = std::max(most, b);
  std::vector<float> buf(most / sizeof(float), 0.0f);  // zeros: sums stay zero, no overflow, no denormals
  for (std::size_t bytes : sizes) {
    const std::size_t n = bytes / sizeof(float);
    // Calls per round: 50 ms over the sum of the ranks' times per call in 10 calls after the warm-up (agreed by an
    // all-reduce, so every rank makes the same number of calls), between 3 and 5000.
    for (int i = 0; i < 3; ++i) allreduce(buf.data(), n);
    const auto w0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) allreduce(buf.data(), n);
    float est = float(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() / 10);
    allreduce(&est, 1);
    const int iters = int(std::clamp(0.05 / std::max(double(est), 1e-9), 3.0, 5000.0));
    std::vector<double> rounds;
    for (int round = 0; round < 5; ++round) {
      barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) allreduce(buf.data(), n);
      rounds.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
    std::sort(rounds.begin(), rounds.end());
    if (rank == 0) {
      std::printf("size=%zu us=%.3f\n", bytes, rounds[rounds.size() / 2]);
      std::fflush(stdout);
    }
  }
}

}  // namespace bench
