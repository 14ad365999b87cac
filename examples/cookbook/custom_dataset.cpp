// Cookbook: a dataset of your own (size() and get(i), as torch.utils.data.Dataset) through the threaded DataLoader.
// README, "Cookbook".
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include <cmath>
#include <cstdio>

using namespace ember;

// [snippet]
/// Points on two interleaved spirals, labelled by spiral: computed on demand, so get() is thread-safe.
struct Spirals {
  std::size_t n = 1000;
  std::size_t size() const { return n; }
  data::Example get(std::size_t i) const {
    const float t = float(i / 2) / float(n / 2) * 12.0f, sign = i % 2 ? -1.0f : 1.0f;
    Tensor<float> x = empty<float>({2});
    x.data()[0] = sign * t * std::cos(t), x.data()[1] = sign * t * std::sin(t);
    return {x, std::int64_t(i % 2)};
  }
};

int main() {
  data::DataLoader loader(Spirals{}, {.batch_size = 64, .shuffle = true, .num_workers = 2});
  std::size_t seen = 0;
  for (auto& batch : loader) seen += batch.size();  // batch.data (64, 2), batch.target (64)
  // [/snippet]
  std::printf("custom dataset: %zu samples in %zu batches, waited for data %.0f%% of the epoch\n", seen,
              loader.size(), loader.stats().wait_fraction() * 100);
  return seen == 1000 ? 0 : 1;
}
