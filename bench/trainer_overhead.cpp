// What the Trainer and the profiler cost on the CNN training step of example 04 (examples/fashion_cnn.hpp, batch
// 128, SGD with Nesterov momentum under one-cycle): one epoch of synthetic 28x28 images as a plain loop, through
// train::Trainer (progress bar drawn to /dev/null as if it were a terminal, 10 redraws a second), and through the
// Trainer with profile::Profiler recording every step. The three take turns within each round, so the machine's
// drift falls on all of them; the ratios are per round, the medians quoted. Then the cost of a profiling range when
// no profiler runs, times the ranges a step records, against the step's time; and the profiler's table of the step.
//
//   trainer_overhead [--rounds N] [--batches N]
#include <ember/data.hpp>
#include <ember/ember.hpp>
#include <ember/profile/profiler.hpp>
#include <ember/train.hpp>

#include "../examples/fashion_cnn.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace ember;

namespace {

struct Synthetic {
  std::size_t n;
  std::size_t size() const { return n; }
  data::Example get(std::size_t i) const {
    Tensor<float> x = empty<float>(Shape{1, 28, 28});
    std::uint32_t s = std::uint32_t(i) * 2654435761u + 1;
    for (int k = 0; k < 28 * 28; ++k) {
      s = s * 1664525u + 1013904223u;
      x.data()[k] = float(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
    }
    return {x, std::int64_t(i % 10)};
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Setup {
  Net<amp::fp32> model;
  optim::SGD<float> opt;
  optim::OneCycleLR sched;
  explicit Setup(std::int64_t steps)
      : opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true}),
        sched(opt, 0.1, {.total_steps = steps}) {}
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  std::size_t batches = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--batches") && i + 1 < argc) batches = std::size_t(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--batches N]\n", argv[0]);
      return 2;
    }
  }
  const std::size_t bs = 128;
  data::DataLoader loader(Synthetic{batches * bs}, {.batch_size = bs, .shuffle = true, .seed = 1});
  std::FILE* devnull = std::fopen("/dev/null", "w");
  const double images = double(batches * bs);

  auto plain = [&] {
    Setup s{std::int64_t(batches)};
    s.model.train();
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& b : loader) {
      Tensor<float> loss = nn::cross_entropy(s.model.forward(b.data), b.target);
      s.opt.zero_grad();
      loss.backward();
      s.opt.step();
      s.sched.step();
      (void)loss.item();  // the loop of example 04 reads the loss for its statistics
    }
    return images / seconds_since(t0);
  };
  std::size_t ranges_per_step = 0;
  auto trainer = [&](bool profiled) {
    Setup s{std::int64_t(batches)};
    profile::Profiler prof;
    train::TrainerOptions o{.max_epochs = 1, .print_summary = false};
    o.progress.tty = 1;
    o.progress.out = devnull;
    if (profiled) o.profiler = &prof;
    train::Trainer t(o);
    const auto t0 = std::chrono::steady_clock::now();
    t.fit(s.model, s.opt, loader, [&](data::Batch& b) { return nn::cross_entropy(s.model.forward(b.data), b.target); },
          {.scheduler = &s.sched});
    const double ips = images / seconds_since(t0);
    if (profiled) ranges_per_step = prof.events().size() / batches;
    return ips;
  };

  plain();  // warm the caches and the allocator
  std::vector<double> p, t, tp, rt, rtp;
  for (int r = 0; r < rounds; ++r) {
    double a = 0, b = 0, c = 0;
    switch (r % 3) {  // rotate the order
      case 0: a = plain(), b = trainer(false), c = trainer(true); break;
      case 1: b = trainer(false), c = trainer(true), a = plain(); break;
      default: c = trainer(true), a = plain(), b = trainer(false); break;
    }
    p.push_back(a), t.push_back(b), tp.push_back(c), rt.push_back(b / a), rtp.push_back(c / a);
    std::printf("round %d: plain %.0f images/s, Trainer %.0f (%.3f), Trainer + profiler %.0f (%.3f)\n", r + 1, a, b,
                b / a, c, c / a);
  }
  std::printf("median images/s: plain %.0f, Trainer %.0f, Trainer + profiler %.0f\n", median(p), median(t), median(tp));
  std::printf("median per-round ratio: Trainer / plain %.3f, Trainer + profiler / plain %.3f\n", median(rt),
              median(rtp));

  // A range with no profiler running: an atomic load and a branch.
  const int n = 20'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    EMBER_PROFILE_RANGE("off");
    asm volatile("" ::: "memory");
  }
  const double off_ns = seconds_since(t0) * 1e9 / n;
  const double step_us = 1e6 * double(bs) / median(p);
  std::printf("a range with no profiler: %.2f ns; %zu ranges per step -> %.5f%% of a %.0f us step\n", off_ns,
              ranges_per_step, 100.0 * off_ns * double(ranges_per_step) * 1e-3 / step_us, step_us);
  // What the profiler shows for this step: 5 active steps after 2 skipped and 1 of warm-up.
  {
    Setup s{std::int64_t(batches)};
    profile::Profiler prof({.wait = 2, .warmup = 1, .active = 5});
    train::TrainerOptions o{.max_epochs = 1, .enable_progress_bar = false, .print_summary = false};
    o.profiler = &prof;
    prof.start();
    train::Trainer(o).fit(s.model, s.opt, loader,
                          [&](data::Batch& b) { return nn::cross_entropy(s.model.forward(b.data), b.target); },
                          {.scheduler = &s.sched});
    prof.stop();
    std::printf("\n%s", prof.table(12).c_str());
  }
  std::fclose(devnull);
}
