// The CPU thread pool under concurrent use: parallel loops from several threads while another thread changes the
// thread count. Results must not depend on either (chunk boundaries depend only on the range and the count, and the
// fused loops and reductions are written to give the same bits for every count). This file is small on purpose:
// the ThreadSanitizer job of CI builds it together with the DataLoader and allocator tests.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
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
