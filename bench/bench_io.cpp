// Benchmarks of ember::io: parsing safetensors headers with many tensors. The reader must be linear in the header
// size (issue 10, item 2: it was super-quadratic, 10 000 tensors took 2 s and 50 000 ten minutes), duplicates
// still rejected. Each file holds N float32 tensors of shape [2] named like a model's parameters; the header is
// built in memory once per size, outside the timed loop.
//   bench_io --benchmark_filter=Safetensors
// Links ember::io.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ember/io/safetensors.hpp"

namespace {

/// A safetensors image with `n` tensors of 2 floats; with `duplicate_last`, the last name repeats the first.
std::vector<unsigned char> many_tensors(std::int64_t n, bool duplicate_last) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}";
  h.reserve(std::size_t(n) * 96);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t id = duplicate_last && i == n - 1 ? 0 : i;
    h += ",\"model.layers." + std::to_string(id) + ".weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" +
         std::to_string(8 * i) + "," + std::to_string(8 * i + 8) + "]}";
  }
  h += "}";
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::vector<unsigned char> out(8 + h.size() + std::size_t(n) * 8, 0);
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<unsigned char>(std::uint64_t(h.size()) >> (8 * i));
  for (std::size_t i = 0; i < h.size(); ++i) out[8 + i] = static_cast<unsigned char>(h[i]);
  return out;
}

void set_counters(benchmark::State& state, const std::vector<unsigned char>& file) {
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * std::int64_t(file.size()));
  state.counters["header_MB"] = double(file.size() - std::size_t(state.range(0)) * 8) / 1e6;
  state.counters["ns_per_tensor"] = benchmark::Counter(double(state.range(0)),
                                                       benchmark::Counter::kIsIterationInvariantRate |
                                                           benchmark::Counter::kInvert);
}

/// The whole load: header, checks, and one tensor allocated and filled per entry.
void BM_SafetensorsParse(benchmark::State& state) {
  const std::vector<unsigned char> file = many_tensors(state.range(0), false);
  for (auto _ : state) {
    ember::io::SafeTensors f = ember::io::parse_safetensors(file, "bench");
    if (f.tensors.size() != std::size_t(state.range(0))) state.SkipWithError("wrong tensor count");
    benchmark::DoNotOptimize(f);
  }
  set_counters(state, file);
}

/// A duplicate name as the very last key: the whole header is read before it is rejected.
void BM_SafetensorsRejectDuplicateLast(benchmark::State& state) {
  const std::vector<unsigned char> file = many_tensors(state.range(0), true);
  for (auto _ : state) {
    bool rejected = false;
    try {
      benchmark::DoNotOptimize(ember::io::parse_safetensors(file, "bench"));
    } catch (const ember::Error&) {
      rejected = true;
    }
    if (!rejected) state.SkipWithError("the duplicate was not rejected");
  }
  set_counters(state, file);
}

}  // namespace

BENCHMARK(BM_SafetensorsParse)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SafetensorsRejectDuplicateLast)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
