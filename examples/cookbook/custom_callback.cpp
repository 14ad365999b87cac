// Cookbook: a Trainer callback of your own, with state that checkpoints save and resume. README, "Cookbook".
#include <ember/data.hpp>
#include <ember/ember.hpp>
#include <ember/train.hpp>

#include <cstdio>
#include <map>
#include <optional>
#include <string>

using namespace ember;

// [snippet]
/// Stops training once the running loss is below a threshold, and counts the batches it saw.
struct StopBelow : train::Callback {
  double threshold;
  std::int64_t batches = 0;
  explicit StopBelow(double t) : threshold(t) {}
  void on_train_batch_end(train::Trainer& t) override {
    ++batches;
    const std::optional<double> loss = t.callback_metrics().get("train_loss");
    if (loss && *loss < threshold) t.request_stop("loss below threshold");
  }
  // Optional: state in checkpoints (a unique key, then text in and out).
  std::string state_key() const override { return "StopBelow"; }
  void save_state(std::map<std::string, std::string>& kv) const override { kv["batches"] = std::to_string(batches); }
  void load_state(const std::map<std::string, std::string>& kv) override {
    if (auto it = kv.find("batches"); it != kv.end()) batches = std::stoll(it->second);
  }
};
// [/snippet]

struct Blobs {  // two separable classes
  std::size_t size() const { return 256; }
  data::Example get(std::size_t i) const {
    Tensor<float> x = full<float>({4}, i % 2 ? 1.0f : -1.0f);
    x.data()[std::size_t(i % 4)] += float(i % 7) * 0.1f;
    return {x, std::int64_t(i % 2)};
  }
};

int main() {
  manual_seed(0);
  nn::Linear model(4, 2);
  optim::SGD<float> opt(model.parameters(), {.lr = 0.5});
  data::DataLoader loader(Blobs{}, {.batch_size = 32, .shuffle = true});
  auto stop = std::make_shared<StopBelow>(0.05);
  train::Trainer trainer({.max_epochs = 50, .enable_progress_bar = false});
  trainer.add_callback(stop);
  trainer.fit(model, opt, loader, [&](data::Batch& b) { return nn::cross_entropy(model(b.data), b.target); });
  std::printf("custom callback: stopped after %lld batches (epoch %lld)\n", static_cast<long long>(stop->batches),
              static_cast<long long>(trainer.current_epoch()));
  return trainer.current_epoch() < 49 ? 0 : 1;
}
