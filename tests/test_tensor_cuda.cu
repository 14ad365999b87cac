// CUDA memory: the caching device allocator's bookkeeping (host-only, runs everywhere), and on a device: the
// allocator in a steady loop, empty_cache, out-of-memory errors, statistics, copies between host and device for every
// dtype (contiguous and strided, blocking and non-blocking from pinned memory), Module::to, printing, pin_memory.
// Device cases skip with a message when no CUDA device is present.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "ember/data.hpp"
#include "helpers.hpp"

using namespace ember_test;
using ember::cuda::detail::BlockPool;
using ember::cuda::detail::kSmallSegment;

namespace {

constexpr std::size_t MiB = std::size_t(1) << 20;

// Raw memory for BlockPool from malloc, with a capacity so out-of-memory can be provoked; events complete when the
// test says so (or when waited for).
struct FakeMemory {
  using Event = int;
  std::shared_ptr<std::set<int>> completed = std::make_shared<std::set<int>>();
  int next_event = 0, live_events = 0;
  Event record_event(std::uintptr_t) noexcept {
    ++live_events;
    return next_event++;
  }
  bool event_done(Event e) const noexcept { return completed->count(e) > 0; }
  void wait_event(Event e) noexcept { completed->insert(e); }
  void release_event(Event) noexcept { --live_events; }
  std::size_t capacity = std::size_t(1) << 40;
  std::size_t outstanding = 0;
  std::map<void*, std::size_t> live;
  int mallocs = 0, frees = 0, failures = 0;
  void* raw_alloc(std::size_t n) {
    if (outstanding + n > capacity) {
      ++failures;
      return nullptr;
    }
    void* p = std::malloc(n);
    REQUIRE(p != nullptr);
    live[p] = n;
    outstanding += n;
    ++mallocs;
    return p;
  }
  void raw_free(void* p) {
    auto it = live.find(p);
    REQUIRE(it != live.end());  // frees only what it handed out, once
    outstanding -= it->second;
    live.erase(it);
    std::free(p);
    ++frees;
  }
};
using Pool = BlockPool<FakeMemory>;
FakeMemory limited(std::size_t capacity) {
  FakeMemory m;
  m.capacity = capacity;
  return m;
}

char* C(void* p) { return static_cast<char*>(p); }

struct VecDataset {
  std::vector<data::Example> ex;
  std::size_t size() const { return ex.size(); }
  data::Example get(std::size_t i) const { return ex[i]; }
};

bool skip_without_device() {
  if (ember::cuda::is_available()) return false;
  MESSAGE("skipped: no CUDA device");
  return true;
}

// A CPU tensor of shape s with values that differ per element and are exact in every dtype.
template <class T>
Tensor<T> pattern(const Shape& s, int seed = 0) {
  Tensor<T> t = empty<T>(s);
  for (i64 i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, bool>) t.data()[i] = ((i + seed) % 3) == 1;
    else if constexpr (std::is_same_v<T, std::uint8_t>) t.data()[i] = std::uint8_t((i * 7 + seed) % 251);
    else t.data()[i] = convert<T>(double((i * 37 + seed) % 211) - 100.0);
  }
  return t;
}

template <class T>
bool same_values(const Tensor<T>& a, const Tensor<T>& b) {
  if (!(a.shape() == b.shape()) || !a.device().is_cpu() || !b.device().is_cpu()) return false;
  for (i64 i = 0; i < a.numel(); ++i) {
    const T x = rd(a, i), y = rd(b, i);
    if (std::memcmp(&x, &y, sizeof(T)) != 0) return false;
  }
  return true;
}

}  // namespace

// ---- bookkeeping (no device needed) ----------------------------------------------------------------------------

TEST_CASE("CUDA allocator bookkeeping: rounding and segment sizes") {
  CHECK(Pool::round_size(0) == 512);
  CHECK(Pool::round_size(1) == 512);
  CHECK(Pool::round_size(512) == 512);
  CHECK(Pool::round_size(513) == 1024);
  CHECK(Pool::round_size(MiB + 1) == MiB + 512);
  CHECK(Pool::segment_size(512) == 2 * MiB);
  CHECK(Pool::segment_size(MiB) == 2 * MiB);        // the largest small request
  CHECK(Pool::segment_size(MiB + 512) == 2 * MiB);  // large: rounded up to 2 MiB
  CHECK(Pool::segment_size(5 * MiB) == 6 * MiB);
  CHECK(Pool::segment_size(6 * MiB) == 6 * MiB);
}

TEST_CASE("CUDA allocator bookkeeping: small requests are carved from one segment and reused") {
  Pool pool;
  void* a = pool.allocate(1000, 0);
  void* b = pool.allocate(100, 0);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(pool.backend().mallocs == 1);  // one 2 MiB segment serves both
  CHECK(C(b) == C(a) + 1024);          // b follows a's rounded size
  CHECK(pool.block_size(a) == 1024);
  CHECK(pool.block_size(b) == 512);
  auto s = pool.stats();
  CHECK(s.reserved_bytes == kSmallSegment);
  CHECK(s.allocated_bytes == 1536);
  CHECK(s.num_cuda_mallocs == 1);
  CHECK(s.cache_hits == 1);  // b came from the cached remainder of a's segment
  // Steady state: the same allocations again and again reach the backend never.
  for (int i = 0; i < 100; ++i) {
    void* x = pool.allocate(4096, 0);
    void* y = pool.allocate(70000, 0);
    pool.deallocate(x);
    pool.deallocate(y);
  }
  CHECK(pool.backend().mallocs == 1);
  pool.deallocate(a);
  pool.deallocate(b);
  CHECK(pool.stats().allocated_bytes == 0);
  CHECK(pool.cached_blocks() == 1);  // everything merged back into the whole segment
  // The merged segment serves the largest small request from its start.
  void* big = pool.allocate(MiB, 0);
  CHECK(big == a);
  pool.deallocate(big);
}

TEST_CASE("CUDA allocator bookkeeping: freed blocks serve only their own stream") {
  Pool pool;
  void* a = pool.allocate(4096, /*stream*/ 1);
  pool.deallocate(a);
  void* b = pool.allocate(4096, /*stream*/ 2);
  CHECK(pool.backend().mallocs == 2);  // stream 2 got a segment of its own
  CHECK(C(b) != C(a));
  void* c = pool.allocate(4096, 1);
  CHECK(c == a);  // stream 1 reuses its block
  CHECK(pool.backend().mallocs == 2);
  pool.deallocate(b);
  pool.deallocate(c);
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.backend().outstanding == 0);
}

TEST_CASE("CUDA allocator bookkeeping: large blocks are split when the rest is worth it, and merged") {
  Pool pool;
  // 5 MiB -> a 6 MiB segment; the 1 MiB rest is not split off (large pool blocks stay above 1 MiB).
  void* a = pool.allocate(5 * MiB, 0);
  CHECK(pool.stats().reserved_bytes == 6 * MiB);
  CHECK(pool.block_size(a) == 6 * MiB);
  pool.deallocate(a);
  // 2 MiB from the cached 6 MiB block: split, the 4 MiB rest stays cached.
  void* b = pool.allocate(2 * MiB, 0);
  CHECK(b == a);
  CHECK(pool.block_size(b) == 2 * MiB);
  void* c = pool.allocate(3 * MiB, 0);  // from the 4 MiB rest (1 MiB left, kept in the block)
  CHECK(C(c) == C(a) + 2 * MiB);
  CHECK(pool.block_size(c) == 4 * MiB);
  CHECK(pool.backend().mallocs == 1);
  CHECK(pool.stats().cache_hits == 2);
  // Small requests never take large blocks.
  void* s = pool.allocate(1000, 0);
  CHECK(pool.backend().mallocs == 2);
  pool.deallocate(s);
  // empty_cache frees only whole free segments: the large one is in use.
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes == 6 * MiB);
  pool.deallocate(b);
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes == 6 * MiB);  // c still holds part of it
  pool.deallocate(c);
  CHECK(pool.cached_blocks() == 1);  // b + c merged
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.stats().num_cuda_frees == 2);
  CHECK(pool.backend().outstanding == 0);
}

TEST_CASE("CUDA allocator bookkeeping: out of memory frees the cache, retries once, then reports nullptr") {
  Pool pool(limited(8 * MiB));
  void* small = pool.allocate(1000, 0);
  pool.deallocate(small);  // a cached 2 MiB segment
  void* big = pool.allocate(7 * MiB, 0);  // needs 8 MiB: fits only once the cached segment is freed
  REQUIRE(big != nullptr);
  auto s = pool.stats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_cuda_frees == 1);
  CHECK(s.num_ooms == 0);
  CHECK(s.reserved_bytes == 8 * MiB);
  CHECK(pool.allocate(1, 0) == nullptr);  // nothing left and nothing cached
  CHECK(pool.stats().num_ooms == 1);
  CHECK(pool.allocate(~std::size_t(0), 0) == nullptr);  // rounding this would wrap around
  CHECK(pool.stats().num_ooms == 2);
  pool.deallocate(big);
}

TEST_CASE("CUDA allocator bookkeeping: record_stream delays reuse until the other stream's work is done") {
  Pool pool;
  void* a = pool.allocate(8192, /*stream*/ 1);
  CHECK(pool.record_stream(a, 2));
  CHECK(pool.record_stream(a, 1));  // its own stream: nothing to wait for
  CHECK_FALSE(pool.record_stream(C(a) + 512, 2));  // not a block
  pool.deallocate(a);
  CHECK(pool.blocks_waiting_for_streams() == 1);
  CHECK(pool.backend().live_events == 1);  // one event, on stream 2
  CHECK(pool.stats().allocated_bytes == 8192);  // still in use until stream 2 is past the free
  void* b = pool.allocate(8192, 1);
  CHECK(b != a);  // not reused yet
  pool.backend().completed->insert(0);  // stream 2 reached the event
  void* c = pool.allocate(8192, 1);
  CHECK(c == a);
  CHECK(pool.blocks_waiting_for_streams() == 0);
  CHECK(pool.backend().live_events == 0);
  CHECK(pool.stats().allocated_bytes == 2 * 8192);
  // Two other streams: reused after both.
  CHECK(pool.record_stream(c, 2));
  CHECK(pool.record_stream(c, 3));
  pool.deallocate(c);
  pool.backend().completed->insert(1);
  void* d = pool.allocate(8192, 1);
  CHECK(d != c);
  pool.backend().completed->insert(2);
  pool.empty_cache();  // processes the events: c's block is free again
  CHECK(pool.blocks_waiting_for_streams() == 0);
  CHECK(pool.stats().allocated_bytes == 2 * 8192);
  pool.deallocate(b);
  pool.deallocate(d);
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes == 0);
}

TEST_CASE("CUDA allocator bookkeeping: an allocation that fails waits for blocks held by other streams") {
  Pool pool(limited(4 * MiB));
  void* a = pool.allocate(3 * MiB, 0);  // the whole 4 MiB segment
  pool.record_stream(a, 5);
  pool.deallocate(a);
  void* b = pool.allocate(3 * MiB, 0);  // needs the memory: waits for the event, frees the segment, retries
  REQUIRE(b != nullptr);
  CHECK(pool.stats().num_alloc_retries == 1);
  CHECK(pool.backend().live_events == 0);
  pool.deallocate(b);
}

TEST_CASE("CUDA allocator bookkeeping: statistics and peaks") {
  Pool pool;
  void* a = pool.allocate(3 * MiB, 0);
  void* b = pool.allocate(3 * MiB, 0);
  pool.deallocate(a);
  auto s = pool.stats();
  CHECK(s.allocated_bytes == 4 * MiB);
  CHECK(s.peak_allocated_bytes == 8 * MiB);
  CHECK(s.reserved_bytes == 8 * MiB);
  CHECK(s.num_allocs == 2);
  pool.reset_peak();
  CHECK(pool.stats().peak_allocated_bytes == 4 * MiB);
  pool.deallocate(b);
  CHECK(pool.stats().peak_allocated_bytes == 4 * MiB);
}

TEST_CASE("CUDA allocator bookkeeping: random allocations never overlap and all memory comes back") {
  Pool pool(limited(256 * MiB));
  std::mt19937 rng(7);
  std::map<char*, std::pair<std::size_t, std::uintptr_t>> live;  // ptr -> (requested, stream)
  auto check_disjoint = [&] {
    char* end = nullptr;
    for (auto& [p, v] : live) {
      if (end) REQUIRE(p >= end);
      REQUIRE(pool.block_size(p) >= v.first);
      end = p + pool.block_size(p);
    }
  };
  std::size_t expect_alloc = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      const std::size_t n = rng() % 4 == 0 ? 1 + rng() % (12 * MiB) : 1 + rng() % 300000;
      const std::uintptr_t stream = rng() % 3;
      void* p = pool.allocate(n, stream);
      if (!p) continue;  // capacity reached: fine, the pool said so
      REQUIRE(live.count(C(p)) == 0);
      live[C(p)] = {n, stream};
      expect_alloc += pool.block_size(p);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      expect_alloc -= pool.block_size(it->first);
      pool.deallocate(it->first);
      live.erase(it);
    }
    if (step % 97 == 0) check_disjoint();
    if (step % 997 == 0) pool.empty_cache();
    REQUIRE(pool.stats().allocated_bytes == expect_alloc);
    REQUIRE(pool.stats().reserved_bytes == pool.backend().outstanding);
  }
  check_disjoint();
  for (auto& [p, v] : live) pool.deallocate(p);
  CHECK(pool.stats().allocated_bytes == 0);
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.backend().outstanding == 0);
  CHECK(pool.backend().mallocs == pool.backend().frees);
}

TEST_CASE("CUDA allocator bookkeeping: threads allocating and freeing at once") {
  Pool pool;
  std::vector<std::thread> threads;
  std::atomic<int> overlaps{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng{unsigned(t)};
      std::vector<std::pair<char*, std::size_t>> mine;
      for (int i = 0; i < 3000; ++i) {
        if (mine.empty() || rng() % 2) {
          const std::size_t n = 1 + rng() % 200000;
          char* p = C(pool.allocate(n, std::uintptr_t(t % 2)));
          // Stamp the block with this thread's id: another owner of the same bytes would overwrite it.
          std::memset(p, t + 1, n);
          mine.emplace_back(p, n);
        } else {
          const std::size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          for (std::size_t j = 0; j < n; j += 997)
            if (p[j] != char(t + 1)) overlaps++;
          pool.deallocate(p);
          mine.erase(mine.begin() + std::ptrdiff_t(k));
        }
      }
      for (auto& [p, n] : mine) pool.deallocate(p);
    });
  for (auto& th : threads) th.join();
  CHECK(overlaps == 0);
  CHECK(pool.stats().allocated_bytes == 0);
  pool.empty_cache();
  CHECK(pool.stats().reserved_bytes == 0);
  CHECK(pool.backend().outstanding == 0);
}

// ---- without a device ------------------------------------------------------------------------------------------

TEST_CASE("CUDA memory without a device: clear errors, pin_memory in DataLoader is a no-op") {
  if (ember::cuda::is_available()) {
    MESSAGE("skipped: a CUDA device is present (this case checks the errors without one)");
    return;
  }
  EXPECT_ERROR([] { (void)empty<float>({4}, Device::cuda()); }, {"cuda:0", "no CUDA device"});
  const Tensor<float> x = pattern<float>({2, 3});
  EXPECT_ERROR([&] { (void)x.to(Device::cuda()); }, {"cuda:0", "no CUDA device"});
  EXPECT_ERROR([&] { (void)x.cuda(); }, {"cuda:0", "no CUDA device"});
  CHECK_THROWS_AS((void)x.pin_memory(), ember::Error);  // cudaHostAlloc fails without a driver/device
  CHECK_FALSE(x.is_pinned());
  CHECK(x.to(Device::cpu()).same_impl(x));
  // A DataLoader asked to pin memory leaves batches in ordinary memory.
  std::vector<data::Example> ex;
  for (int i = 0; i < 4; ++i) ex.push_back({pattern<float>({3}, i), i});
  data::DataLoader loader(VecDataset{ex}, {.batch_size = 2, .pin_memory = true});
  int n = 0;
  for (auto& b : loader) {
    CHECK_FALSE(b.data.is_pinned());
    ++n;
  }
  CHECK(n == 2);
}

// ---- on a device -----------------------------------------------------------------------------------------------

TEST_CASE("CUDA allocator: a steady training-like loop makes no cudaMalloc calls") {
  if (skip_without_device()) return;
  auto step = [] {
    Tensor<float> a = empty<float>({256, 256}, Device::cuda());
    Tensor<float> b = empty<float>({1000}, Device::cuda());
    Tensor<ember::half> c = empty<ember::half>({3, 1024, 1024}, Device::cuda());  // large pool
    Tensor<std::int64_t> d = empty<std::int64_t>({17}, Device::cuda());
    CHECK(a.device() == Device::cuda());
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 512 == 0);
  };
  step();  // warm-up fills the cache
  const auto before = cuda::memory_stats();
  for (int i = 0; i < 50; ++i) step();
  const auto after = cuda::memory_stats();
  CHECK(after.num_cuda_mallocs == before.num_cuda_mallocs);
  CHECK(after.cache_hits >= before.cache_hits + 200);
  CHECK(after.allocated_bytes == before.allocated_bytes);
}

TEST_CASE("CUDA allocator: a training step (Linear, ReLU, MSE, backward, SGD) makes no cudaMalloc after the first") {
  if (skip_without_device()) return;
  ember::manual_seed(1);
  nn::Sequential model(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 10));
  model.to(Device::cuda());
  optim::SGD opt(model.parameters(), {.lr = 0.01, .momentum = 0.9, .nesterov = true});
  const Tensor<float> x = randn<float>({32, 64}).to(Device::cuda()), y = randn<float>({32, 10}).to(Device::cuda());
  float first = 0, last = 0;
  auto step = [&] {
    opt.zero_grad();
    Tensor<float> loss = mean(square(model(x) - y));
    loss.backward();
    opt.step();
    return loss.item();
  };
  first = step();  // the first iteration fills the cache (and creates the momentum buffers)
  const auto before = cuda::memory_stats();
  for (int i = 0; i < 10; ++i) last = step();
  const auto after = cuda::memory_stats();
  CHECK(after.num_cuda_mallocs == before.num_cuda_mallocs);
  CHECK(after.cache_hits > before.cache_hits);
  CHECK(std::isfinite(last));
  CHECK(last < first);  // and it trains
}

TEST_CASE("CUDA allocator: statistics, peaks and empty_cache") {
  if (skip_without_device()) return;
  cuda::empty_cache();
  const auto s0 = cuda::memory_stats();
  cuda::reset_peak_memory_stats();
  {
    Tensor<float> a = empty<float>({8, 1024, 1024}, Device::cuda());  // 32 MiB
    const auto s1 = cuda::memory_stats();
    CHECK(s1.allocated_bytes == s0.allocated_bytes + 32 * MiB);
    CHECK(s1.reserved_bytes >= s0.reserved_bytes + 32 * MiB);
    CHECK(cuda::memory_allocated() == s1.allocated_bytes);
    CHECK(cuda::max_memory_allocated() >= s1.allocated_bytes);
  }
  const auto s2 = cuda::memory_stats();
  CHECK(s2.allocated_bytes == s0.allocated_bytes);
  CHECK(s2.peak_allocated_bytes >= s0.allocated_bytes + 32 * MiB);
  CHECK(s2.reserved_bytes >= s0.reserved_bytes + 32 * MiB);  // cached, not returned
  cuda::empty_cache();
  const auto s3 = cuda::memory_stats();
  CHECK(s3.reserved_bytes <= s0.reserved_bytes);
  CHECK(s3.num_cuda_frees > s2.num_cuda_frees);
  cuda::reset_peak_memory_stats();
  CHECK(cuda::max_memory_allocated() == s3.allocated_bytes);
}

TEST_CASE("CUDA allocator: an impossible request is an error naming size, device, free memory and reserve") {
  if (skip_without_device()) return;
  const auto s0 = cuda::memory_stats();
  EXPECT_ERROR([] { (void)empty<float>({i64(1) << 40}, Device::cuda()); },
               {"CUDA out of memory", "4.00 TiB", "cuda:0", "free of", "total", "reserved"});
  const auto s1 = cuda::memory_stats();
  CHECK(s1.num_ooms == s0.num_ooms + 1);
  CHECK(s1.num_alloc_retries == s0.num_alloc_retries + 1);
  // The device is still usable afterwards.
  const Tensor<float> x = pattern<float>({5});
  CHECK(same_values(x.cuda().cpu(), x));
  EXPECT_ERROR([] { (void)empty<float>({4}, Device::cuda(cuda::device_count())); }, {"does not exist"});
}

TEST_CASE_TEMPLATE("CUDA copies: host -> device -> host round trips, contiguous and strided", T, float, double, ember::half,
                   ember::bfloat16, std::int32_t, std::int64_t, std::uint8_t, bool) {
  if (skip_without_device()) return;
  const Tensor<T> x = pattern<T>({5, 7, 3});
  const Tensor<T> g = x.cuda();
  CHECK(g.device() == Device::cuda(0));
  CHECK(g.is_contiguous());
  CHECK_FALSE(g.same_impl(x));
  CHECK(same_values(g.cpu(), x));
  CHECK(same_values(g.to(Device::cpu()), x));
  CHECK(g.to(Device::cuda(0)).same_impl(g));  // already there
  // Strided CPU sources are gathered first.
  const Tensor<T> xt = x.transpose(0, 2);
  CHECK(same_values(xt.cuda().cpu(), xt.contiguous()));
  const Tensor<T> xs = x.slice(1, 1, 7, 3);
  CHECK(same_values(xs.cuda().cpu(), xs.contiguous()));
  // Strided CUDA views copy back only their own elements.
  CHECK(same_values(g.transpose(0, 2).cpu(), xt.contiguous()));
  CHECK(same_values(g.slice(1, 1, 7, 3).cpu(), xs.contiguous()));
  CHECK(same_values(g.select(0, 3).cpu(), x.select(0, 3).contiguous()));
  const Tensor<T> row = pattern<T>({1, 4}, 3);
  CHECK(same_values(row.cuda().expand({3, 4}).cpu(), row.expand({3, 4}).contiguous()));
  CHECK(g.to_vector() == x.to_vector());
  // Element access copies to the host.
  const T a = g[2][4][1].item(), b = x.at(2, 4, 1);
  CHECK(std::memcmp(&a, &b, sizeof(T)) == 0);
  // Device to device on one device (stream-ordered), then back.
  Tensor<T> g2 = empty<T>(x.shape(), Device::cuda());
  copy_bytes(g2.storage(), 0, g.storage(), 0, std::size_t(x.numel()) * sizeof(T));
  CHECK(same_values(g2.cpu(), x));
  // copy_ across devices, both ways, and into a strided host view.
  Tensor<T> h = empty<T>(x.shape());
  h.copy_(g);
  CHECK(same_values(h, x));
  Tensor<T> g3 = empty<T>(x.shape(), Device::cuda());
  g3.copy_(pattern<T>({5, 7, 3}, 11));
  CHECK(same_values(g3.cpu(), pattern<T>({5, 7, 3}, 11)));
  Tensor<T> ht = empty<T>({3, 7, 5}).transpose(0, 2);
  ht.copy_(g);
  CHECK(same_values(ht.contiguous(), x));
  // Empty tensors travel too.
  CHECK(empty<T>({0, 3}).cuda().cpu().shape() == Shape{0, 3});
}

TEST_CASE("CUDA copies: between two devices") {
  if (skip_without_device()) return;
  if (cuda::device_count() < 2) {
    MESSAGE("skipped: needs two CUDA devices");
    return;
  }
  const Tensor<float> x = pattern<float>({64, 33});
  const Tensor<float> a = x.cuda(0);
  const Tensor<float> b = a.to(Device::cuda(1));
  CHECK(b.device() == Device::cuda(1));
  CHECK(same_values(b.cpu(), x));
  const Tensor<float> c = b.t().to(Device::cuda(0));  // strided source
  CHECK(same_values(c.cpu(), x.t().contiguous()));
  const Tensor<float> d = a.to(Device::cuda(1), /*non_blocking*/ true);
  cuda::synchronize(1);
  CHECK(same_values(d.cpu(), x));
}

namespace {
// Holds a stream until released: a host function that waits for a flag (at most 20 s, so a bug cannot hang CI).
std::atomic<bool> g_release{false};
void CUDART_CB wait_for_release(void*) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!g_release.load() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}
}  // namespace

TEST_CASE("CUDA copies: non_blocking from pinned memory is asynchronous and keeps its source alive") {
  if (skip_without_device()) return;
  const Shape shape{1024, 1024};  // 4 MiB
  const Tensor<float> want = pattern<float>(shape, 5);
  // Warm the caches so nothing below needs cudaMalloc/cudaHostAlloc while the stream is held.
  Tensor<float> a = want.pin_memory();
  Tensor<float> spare = empty<float>(shape).pin_memory();
  (void)empty<float>(shape, Device::cuda());
  REQUIRE(a.is_pinned());
  REQUIRE(spare.is_pinned());
  CHECK(same_values(a, want));
  float* const a_ptr = a.data();
  spare = Tensor<float>();  // its block is cached

  g_release = false;
  const cuda::Stream s = cuda::current_stream(0);
  EMBER_CUDA_CHECK(cudaLaunchHostFunc(s.handle(), wait_for_release, nullptr));
  const Tensor<float> g = a.to(Device::cuda(), /*non_blocking*/ true);  // queued behind the held stream
  CHECK_FALSE(s.query());                                              // really not done yet
  a = Tensor<float>();                                                  // the copy keeps the source alive
  CHECK(cuda::pending_copies() >= 1);
  Tensor<float> other = empty<float>(shape).pin_memory();  // must not get the in-flight block
  CHECK(other.data() != a_ptr);
  for (i64 i = 0; i < other.numel(); ++i) other.data()[i] = -1.f;
  g_release = true;
  s.synchronize();
  CHECK(same_values(g.cpu(), want));
  cuda::pinned_synchronize();
  CHECK(cuda::pending_copies() == 0);

  // Device -> host with non_blocking lands in pinned memory; valid after synchronising.
  const Tensor<float> back = g.to(Device::cpu(), /*non_blocking*/ true);
  CHECK(back.is_pinned());
  s.synchronize();
  CHECK(same_values(back, want));
  // pinned statistics count the traffic
  const auto ps = cuda::pinned_memory_stats();
  CHECK(ps.num_cuda_mallocs >= 2);
  CHECK(ps.cache_hits >= 1);
  CHECK(ps.allocated_bytes >= 2 * 4 * MiB);
}

TEST_CASE("CUDA allocator: record_stream keeps a block from reuse until the other stream is done") {
  if (skip_without_device()) return;
  auto& alloc = cuda::CudaCachingAllocator::get(0);
  const cuda::Stream side = cuda::Stream::create(0);
  Tensor<float> spare = empty<float>({4096}, Device::cuda());
  Tensor<float> x = empty<float>({4096}, Device::cuda());  // for the current stream
  float* const xp = x.data();
  spare = Tensor<float>();  // a cached block, so nothing below needs cudaMalloc while `side` is held
  g_release = false;
  EMBER_CUDA_CHECK(cudaLaunchHostFunc(side.handle(), wait_for_release, nullptr));  // `side` is busy with x
  cuda::record_stream(x, side);
  const std::size_t allocated = cuda::memory_allocated(0);
  x = Tensor<float>();
  CHECK(alloc.blocks_waiting_for_streams() == 1);
  CHECK(cuda::memory_allocated(0) == allocated);  // not free while `side` may use it
  const Tensor<float> y = empty<float>({4096}, Device::cuda());
  CHECK(y.data() != xp);
  CHECK(alloc.blocks_waiting_for_streams() == 1);
  g_release = true;
  side.synchronize();
  cuda::empty_cache();  // polls the events
  CHECK(alloc.blocks_waiting_for_streams() == 0);
  CHECK(cuda::memory_allocated(0) == allocated);  // x's block given back, y's taken
  EXPECT_ERROR([&] { cuda::record_stream(pattern<float>({2}), side); }, {"record_stream", "cpu"});
}

TEST_CASE("CUDA memory: pin_memory") {
  if (skip_without_device()) return;
  const Tensor<double> x = pattern<double>({6, 4});
  CHECK_FALSE(x.is_pinned());
  const Tensor<double> p = x.t().pin_memory();
  CHECK(p.is_pinned());
  CHECK(p.is_contiguous());
  CHECK(same_values(p, x.t().contiguous()));
  CHECK(p.pin_memory().same_impl(p));
  CHECK_FALSE(x.cuda().is_pinned());
  EXPECT_ERROR([&] { (void)x.cuda().pin_memory(); }, {"pin_memory", "cuda:0"});
  // DataLoader batches land in pinned memory.
  std::vector<data::Example> ex;
  for (int i = 0; i < 6; ++i) ex.push_back({pattern<float>({3}, i), i});
  data::DataLoader loader(VecDataset{ex}, {.batch_size = 3, .num_workers = 1, .pin_memory = true});
  int n = 0;
  for (auto& b : loader) {
    CHECK(b.data.is_pinned());
    CHECK(b.target.is_pinned());
    CHECK(b.data.to(Device::cuda(), true).cpu().at(1, 2) == ex[std::size_t(n * 3 + 1)].data.at(2));
    ++n;
  }
  CHECK(n == 2);
}

TEST_CASE("CUDA copies: gradients flow back through to()") {
  if (skip_without_device()) return;
  Tensor<double> x = pattern<double>({3, 2});
  x.requires_grad_();
  const Tensor<double> y = x.cuda();
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  const Tensor<double> z = y.cpu();
  const Tensor<double> w = pattern<double>({3, 2}, 9);
  Tensor<double> loss = sum(z * w);
  loss.backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device().is_cpu());
  CHECK(same_values(x.grad(), w));
}

TEST_CASE("CUDA memory: Module::to moves parameters, buffers and gradients in place") {
  if (skip_without_device()) return;
  nn::Linear lin(4, 3);
  nn::BatchNorm1d bn(3);
  struct Net : nn::Module {
    nn::Linear l;
    nn::BatchNorm1d b;
    Net(nn::Linear l_, nn::BatchNorm1d b_) : l(l_), b(b_) {
      register_module("l", l);
      register_module("b", b);
    }
  } net(lin, bn);
  const Tensor<float> w0 = lin.weight.detach().clone(), b0 = lin.bias.detach().clone();
  Tensor<float> handle = lin.weight;  // another handle to the same parameter
  lin.weight.grad() = pattern<float>({3, 4}, 2);
  net.to(Device::cuda());
  CHECK(lin.weight.device() == Device::cuda());
  CHECK(handle.device() == Device::cuda());  // identity kept
  CHECK(handle.same_impl(lin.weight));
  CHECK(lin.weight.is_leaf());
  CHECK(lin.weight.requires_grad());
  CHECK(lin.weight.grad().device() == Device::cuda());
  for (auto& [n, t] : net.named_buffers())
    std::visit([&](const auto& b) { CHECK_MESSAGE(b.device() == Device::cuda(), n); }, t);
  const auto sd = net.state_dict();
  CHECK(std::get<Tensor<float>>(sd.at("l.weight")).device() == Device::cuda());
  net.to(Device::cpu());
  CHECK(lin.weight.device().is_cpu());
  CHECK(same_values(lin.weight.detach(), w0));
  CHECK(same_values(lin.bias.detach(), b0));
  CHECK(same_values(lin.weight.grad(), pattern<float>({3, 4}, 2)));
  // load_state_dict into a module on the device
  net.to(Device::cuda());
  auto sd2 = net.state_dict();
  std::get<Tensor<float>>(sd2.at("l.weight")) = pattern<float>({3, 4}, 4);
  net.load_state_dict(sd2);
  CHECK(same_values(lin.weight.detach().cpu(), pattern<float>({3, 4}, 4)));
}

TEST_CASE("CUDA memory: printing a CUDA tensor shows its device") {
  const Tensor<float> x = tensor<float>({{1.5f, -2.f}, {3.f, 4.25f}});
  // The host forms (checked everywhere, so the device forms below differ from them only by the suffix).
  CHECK(to_string(x) == "tensor([[ 1.5000, -2.0000],\n        [ 3.0000,  4.2500]])");
  CHECK(to_string(tensor<std::int64_t>({1, 2})) == "tensor([1, 2])");
  CHECK(to_string(tensor<double>({1, 2})) == "tensor([1., 2.], dtype=torch.float64)");
  if (skip_without_device()) return;
  CHECK(to_string(x.cuda()) == "tensor([[ 1.5000, -2.0000],\n        [ 3.0000,  4.2500]], device='cuda:0')");
  CHECK(to_string(tensor<std::int64_t>({1, 2}).cuda()) == "tensor([1, 2], device='cuda:0')");
  CHECK(to_string(tensor<double>({1, 2}).cuda()) == "tensor([1., 2.], device='cuda:0', dtype=torch.float64)");
}
