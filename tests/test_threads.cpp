// The CPU thread pool under concurrent use: parallel loops from several threads while another thread changes the
// thread count. Results must not depend on either (chunk boundaries depend only on the range and the count, and the
// fused loops and reductions are written to give the same bits for every count). This file is small on purpose:
// the ThreadSanitizer job of CI builds it together with the DataLoader and allocator tests.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using namespace ember_test;

TEST_CASE("thread pool: set_num_threads while other threads run parallel loops (no race, same results)") {
  ThreadsGuard guard;
  Generator g(11);
  const i64 n = 1 << 18;  // many chunks of the parallel loop at every thread count
  const Tensor<float> a = randn<float>({n}, g), b = randn<float>({n}, g);
  cpu::set_num_threads(1);
  const Tensor<float> ref = run_expr(a * b + 1.f);
  const double ref_sum = sum(a * b).item();

  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, loops{0};
  std::vector<std::thread> users;
  for (int u = 0; u < 3; ++u)
    users.emplace_back([&] {
      // Bounded in count; the changer below stops once every user is done.
      for (int k = 0; k < 40; ++k) {
        const Tensor<float> y = run_expr(a * b + 1.f);
        if (!bitwise_equal(y, ref)) ++bad;
        if (sum(a * b).item() != ref_sum) ++bad;
        ++loops;
      }
    });
  std::thread changer([&] {
    for (int k = 0; !stop.load(); ++k) {
      cpu::set_num_threads(1 + k % 3);
      (void)cpu::get_num_threads();
      std::this_thread::yield();
    }
  });
  for (auto& t : users) t.join();
  stop = true;
  changer.join();
  CHECK(loops.load() == 3 * 40);
  CHECK(bad.load() == 0);
  cpu::set_num_threads(3);
  CHECK(cpu::get_num_threads() == 3);
}

TEST_CASE("thread pool: loops right after one another (workers polling) and after idle time (workers asleep)") {
  // A worker polls for the next loop for EMBER_SPIN_US (200 µs by default), then sleeps until one is posted. Both
  // ways in must run every index exactly once, and an exception must reach the caller either way.
  ThreadsGuard guard;
  cpu::set_num_threads(3);
  constexpr i64 n = 997;
  std::vector<std::atomic<int>> hits(n);
  int rounds = 0;
  for (int r = 0; r < 24; ++r) {
    if (r % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the poll: workers sleep
    cpu::parallel_for(0, n, 1, [&](i64 a, i64 b) {
      for (i64 i = a; i < b; ++i) hits[std::size_t(i)].fetch_add(1, std::memory_order_relaxed);
    });
    ++rounds;
  }
  int wrong = 0;
  for (auto& h : hits) wrong += h.load() != rounds;
  CHECK(wrong == 0);
  // A worker must take part, polling or woken: two chunks that each wait (up to 2 s) for the other to start. The
  // caller alone would run them one after the other and time out in the first.
  int met = 0;
  for (int r = 0; r < 6; ++r) {
    if (r % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic<int> arrived{0};
    std::atomic<int> together{0};
    cpu::parallel_for(0, 2, 1, [&](i64 a, i64 b) {
      for (i64 i = a; i < b; ++i) {
        arrived.fetch_add(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (arrived.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        if (arrived.load() >= 2) together.fetch_add(1);
      }
    });
    met += together.load() == 2;
  }
  CHECK(met == 6);
  for (int sleep_ms : {0, 2}) {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    CHECK_THROWS_AS(cpu::parallel_for(0, n, 1,
                                      [&](i64 a, i64) {
                                        if (a > 0) throw std::runtime_error("chunk failed");
                                      }),
                    std::runtime_error);
  }
}
