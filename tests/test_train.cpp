// The Trainer: its loop against a hand-written one (accumulation, clipping, steps and limits), EarlyStopping on
// scripted metric sequences, ModelCheckpoint's top-k bookkeeping and file names, bit-exact resume after an
// interruption mid-epoch (deterministic mode, a 2-worker loader with shuffling and augmentation, a scheduler, random
// noise from the default generator), the CSV logger, the progress bar's output on a fake clock, and misuse errors.
#include <doctest/doctest.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>
#include <variant>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ember/data.hpp"
#include "ember/ember.hpp"
#include "ember/io.hpp"
#include "ember/profile/profiler.hpp"
#include "ember/train.hpp"
#include "ember/train/checkpoint.hpp"
#include "ember/train/run.hpp"
#include "ember/train/tensorboard.hpp"
#include "helpers.hpp"
#include "toy_training.hpp"

using namespace ember;
using namespace ember_test;

namespace {

double max_abs_diff(const Tensor<float>& a, const Tensor<float>& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (i64 i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(rd(a, i)) - double(rd(b, i))));
  return m;
}

train::TrainerOptions quiet(train::TrainerOptions o = {}) {
  o.enable_progress_bar = false;
  o.print_summary = false;
  return o;
}

}  // namespace

TEST_CASE("Trainer: gradient accumulation over 2 batches of 4 equals steps on batches of 8") {
  manual_seed(1);
  Net a;
  Net b;
  b.load_state_dict(a.state_dict());
  data::DataLoader small(Toy{16}, {.batch_size = 4});
  data::DataLoader big(Toy{16}, {.batch_size = 8});
  optim::SGD oa(a.parameters(), {.lr = 0.5});
  optim::SGD ob(b.parameters(), {.lr = 0.5});
  train::Trainer t(quiet({.max_epochs = 2, .accumulate_grad_batches = 2}));
  const train::FitResult r =
      t.fit(a, oa, small, [&](data::Batch& x) { return nn::cross_entropy(a(flat(x.data)), x.target); });
  CHECK(r.global_step == 4);
  CHECK(r.epochs == 2);
  CHECK(r.stop_reason == "max_epochs=2 reached");
  for (int e = 0; e < 2; ++e)
    for (auto& x : big) {
      Tensor<float> loss = nn::cross_entropy(b(flat(x.data)), x.target);
      ob.zero_grad();
      loss.backward();
      ob.step();
    }
  const auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(max_abs_diff(pa[i], pb[i]) < 1e-6);
  // And differs from no accumulation (the test can fail).
  manual_seed(1);
  Net c;
  optim::SGD oc(c.parameters(), {.lr = 0.5});
  train::Trainer(quiet({.max_epochs = 2})).fit(c, oc, small, [&](data::Batch& x) {
    return nn::cross_entropy(c(flat(x.data)), x.target);
  });
  CHECK(max_abs_diff(c.parameters()[0], pb[0]) > 1e-4);
}

TEST_CASE("Trainer: clipping by norm and by value, the scheduler, max_steps and limit_train_batches") {
  for (auto algo : {train::ClipAlgorithm::norm, train::ClipAlgorithm::value}) {
    manual_seed(2);
    Net a;
    Net b;
    b.load_state_dict(a.state_dict());
    data::DataLoader loader(Toy{40}, {.batch_size = 8});
    optim::SGD oa(a.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD ob(b.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::StepLR sa(oa, 2, 0.5), sb(ob, 2, 0.5);
    train::Trainer t(quiet({.max_steps = 7, .gradient_clip_val = 0.05, .gradient_clip_algorithm = algo,
                            .limit_train_batches = 3}));
    const auto r = t.fit(a, oa, loader, [&](data::Batch& x) { return nn::cross_entropy(a(flat(x.data)), x.target); },
                         {.scheduler = &sa});
    CHECK(r.global_step == 7);
    CHECK(r.epochs == 2);  // 3 + 3 batches, then one of the third epoch
    CHECK(r.stop_reason == "max_steps=7 reached");
    int steps = 0;
    for (int e = 0; e < 3 && steps < 7; ++e) {
      int i = 0;
      for (auto& x : loader) {
        if (i++ == 3 || steps == 7) break;
        Tensor<float> loss = nn::cross_entropy(b(flat(x.data)), x.target);
        loss.backward();
        if (algo == train::ClipAlgorithm::norm) optim::clip_grad_norm_(b.parameters(), 0.05);
        else optim::clip_grad_value_(b.parameters(), 0.05);
        ob.step();
        ob.zero_grad();
        sb.step();
        ++steps;
      }
    }
    const auto pa = a.parameters(), pb = b.parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) CHECK(bitwise_equal(pa[i], pb[i]));
    CHECK(oa.lr(0) == ob.lr(0));
  }
}

TEST_CASE("Trainer: validation metrics are batch-size-weighted means; callbacks see them; StepOutput metrics") {
  manual_seed(3);
  Net m;
  data::DataLoader tl(Toy{20}, {.batch_size = 8});
  data::DataLoader vl(Toy{10}, {.batch_size = 4});  // batches of 4, 4, 2
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  struct Seen : train::Callback {
    std::vector<double> val;
    int epochs = 0, batches = 0;
    void on_validation_end(train::Trainer& t) override { val.push_back(*t.callback_metrics().get("val_mean")); }
    void on_train_epoch_end(train::Trainer&) override { ++epochs; }
    void on_train_batch_end(train::Trainer&) override { ++batches; }
  };
  auto seen = std::make_shared<Seen>();
  train::Trainer t(quiet({.max_epochs = 2}));
  t.add_callback(seen);
  const auto r = t.fit(
      m, opt, tl, &vl,
      [&](data::Batch& b) {
        return train::StepOutput{nn::cross_entropy(m(flat(b.data)), b.target), {{"answer", 42}}};
      },
      [&](data::Batch& b) {
        // the mean target of the batch: weighted over the batches it is the mean over the 10 samples
        return train::Metrics{{"val_mean", double(sum(cast<float>(b.target)).item()) / double(b.size())}};
      });
  double expect = 0;
  for (std::size_t i = 0; i < 10; ++i) expect += double(i % 3);
  expect /= 10;
  REQUIRE(seen->val.size() == 2);
  CHECK(seen->val[0] == doctest::Approx(expect).epsilon(1e-12));
  CHECK(seen->epochs == 2);
  CHECK(seen->batches == 6);
  CHECK(r.metrics.get("answer").value_or(0) == 42);
  CHECK(r.metrics.contains("train_loss_epoch"));

  // Mid-epoch validation (every half epoch of 4 batches: after batches 2 and 4) on the first 2 validation batches.
  data::DataLoader tl4(Toy{32}, {.batch_size = 8});
  auto seen2 = std::make_shared<Seen>();
  int val_batches = 0;
  train::Trainer t2(quiet({.max_epochs = 2, .val_check_interval = 0.5, .limit_val_batches = 2}));
  t2.add_callback(seen2);
  t2.fit(m, opt, tl4, &vl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); },
         [&](data::Batch& b) {
           ++val_batches;
           return train::Metrics{{"val_mean", double(sum(cast<float>(b.target)).item()) / double(b.size())}};
         });
  CHECK(seen2->val.size() == 4);
  CHECK(val_batches == 8);
  CHECK(seen2->val[0] == doctest::Approx((0 + 1 + 2 + 0 + 1 + 2 + 0 + 1) / 8.0).epsilon(1e-12));
}

TEST_CASE("EarlyStopping: patience, min_delta, both modes, thresholds and non-finite values") {
  auto run = [](train::EarlyStoppingOptions o, std::vector<double> seq) {
    train::EarlyStopping es(o);
    for (std::size_t i = 0; i < seq.size(); ++i)
      if (!es.check(seq[i]).empty()) return int(i);
    return -1;
  };
  using O = train::EarlyStoppingOptions;
  CHECK(run(O{.patience = 2}, {1.0, 0.9, 0.95, 0.93, 0.5}) == 3);
  CHECK(run(O{.patience = 2}, {1.0, 0.9, 0.95, 0.85, 0.86, 0.87}) == 5);
  CHECK(run(O{.patience = 3}, {1.0, 0.9, 0.95, 0.93, 0.5}) == -1);
  // min_delta: 0.95 is not better than 1.0 by more than 0.1
  CHECK(run(O{.min_delta = 0.1, .patience = 1}, {1.0, 0.95}) == 1);
  CHECK(run(O{.min_delta = 0.1, .patience = 1}, {1.0, 0.85, 0.8}) == 2);
  CHECK(run(O{.min_delta = -0.1, .patience = 1}, {1.0, 0.85, 0.8}) == 2);  // the sign does not matter
  // max mode
  CHECK(run(O{.monitor = "acc", .mode = train::Mode::max, .patience = 1}, {0.5, 0.6, 0.6}) == 2);
  CHECK(run(O{.monitor = "acc", .mode = train::Mode::max, .patience = 1}, {0.5, 0.6, 0.7}) == -1);
  // thresholds (strict, as Lightning)
  CHECK(run(O{.patience = 10, .stopping_threshold = 0.2}, {1.0, 0.5, 0.2, 0.19}) == 3);
  CHECK(run(O{.patience = 10, .divergence_threshold = 5.0}, {1.0, 5.0, 5.1}) == 2);
  CHECK(run(O{.monitor = "acc", .mode = train::Mode::max, .patience = 10, .stopping_threshold = 0.9},
            {0.5, 0.91}) == 1);
  // non-finite
  CHECK(run(O{.patience = 10}, {1.0, std::nan("")}) == 1);
  CHECK(run(O{.patience = 10, .check_finite = false}, {1.0, std::nan(""), 0.5}) == -1);
  // patience 0: the first check without improvement stops
  CHECK(run(O{.patience = 0}, {1.0, 1.0}) == 1);
  train::EarlyStopping es(O{.patience = 2});
  es.check(1.0);
  es.check(0.5);
  es.check(0.7);
  const std::string why = es.check(0.6);
  CHECK(why.find("val_loss did not improve in the last 2 records") != std::string::npos);
  CHECK(why.find("Best score: 0.5") != std::string::npos);
  CHECK(es.best_score() == 0.5);
}

TEST_CASE("EarlyStopping inside fit stops the run and says why; a missing monitor is an error") {
  manual_seed(4);
  Net m;
  data::DataLoader tl(Toy{16}, {.batch_size = 8});
  data::DataLoader vl(Toy{8}, {.batch_size = 8});
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  const std::vector<double> script = {0.9, 0.8, 0.85, 0.84, 0.83, 0.1};
  int call = 0;
  auto val = [&](data::Batch&) { return train::Metrics{{"val_loss", script[std::size_t(call++)]}}; };
  auto step = [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); };
  train::Trainer t(quiet({.max_epochs = 20}));
  auto es = std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{.patience = 3, .verbose = false});
  t.add_callback(es);
  const auto r = t.fit(m, opt, tl, &vl, step, val);
  CHECK(r.epochs == 5);
  CHECK(es->stopped_epoch() == 4);
  CHECK(r.stop_reason.find("did not improve in the last 3 records") != std::string::npos);

  train::Trainer t2(quiet({.max_epochs = 2}));
  t2.add_callback(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{.monitor = "val_acc"}));
  call = 0;
  expect_error(__LINE__, [&] { t2.fit(m, opt, tl, &vl, step, val); },
               {"EarlyStopping", "'val_acc'", "val_loss"});
}

TEST_CASE("ModelCheckpoint: file names from the template, top-k by the monitor, last.ckpt") {
  TempDir dir;
  train::ModelCheckpoint fmt({.filename = "{epoch}-{val_loss:.2f}-{step:05d}"});
  CHECK(fmt.format_name(3, 120, train::Metrics{{"val_loss", 0.12345}}) == "epoch=3-val_loss=0.12-step=00120");
  CHECK(train::ModelCheckpoint(train::ModelCheckpointOptions{}).format_name(0, 7, {}) == "epoch=0-step=7");
  expect_error(__LINE__, [&] { fmt.format_name(0, 0, {}); }, {"ModelCheckpoint", "'val_loss'"});
  expect_error(__LINE__, [&] { train::ModelCheckpoint({.filename = "{epoch:%s}"}).format_name(0, 0, {}); },
               {"ModelCheckpoint", "format"});

  manual_seed(5);
  Net m;
  data::DataLoader tl(Toy{16}, {.batch_size = 8});
  data::DataLoader vl(Toy{8}, {.batch_size = 8});
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  const std::vector<double> script = {0.5, 0.3, 0.4, 0.2, 0.6};
  int call = 0;
  auto ck = std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions{
      .dirpath = dir / "ck", .filename = "{epoch}-{val_loss:.1f}", .monitor = "val_loss", .save_top_k = 2,
      .save_last = true});
  train::Trainer t(quiet({.max_epochs = 5}));
  t.add_callback(ck);
  t.fit(m, opt, tl, &vl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); },
        [&](data::Batch&) { return train::Metrics{{"val_loss", script[std::size_t(call++)]}}; });
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "ck")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(files == std::vector<std::string>{"epoch=1-val_loss=0.3.ckpt", "epoch=3-val_loss=0.2.ckpt", "last.ckpt"});
  CHECK(ck->best_model_path() == dir / "ck/epoch=3-val_loss=0.2.ckpt");
  CHECK(ck->best_model_score() == 0.2);
  // The best checkpoint holds the model as it was after epoch 3 (global step 8), and its file is a Trainer's.
  const train::TrainingState s = train::load_checkpoint(ck->best_model_path());
  CHECK(s.step == 8);
  CHECK(s.epoch == 4);  // the run continues with epoch 4
  CHECK(s.batch_in_epoch == 0);
  CHECK(s.model.size() == m.state_dict().size());
  const train::TrainingState last = train::load_checkpoint(dir / "ck/last.ckpt");
  CHECK(last.step == 10);
  for (const auto& [k, v] : m.state_dict())
    CHECK(bitwise_equal(std::get<Tensor<float>>(v), std::get<Tensor<float>>(last.model.at(k))));
  // Without a monitor, save_top_k = 1 keeps the newest only.
  auto newest = std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions{.dirpath = dir / "n"});
  train::Trainer t2(quiet({.max_epochs = 3}));
  t2.add_callback(newest);
  t2.fit(m, opt, tl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); });
  files.clear();
  for (const auto& e : fs::directory_iterator(dir / "n")) files.push_back(e.path().filename().string());
  CHECK(files == std::vector<std::string>{"epoch=2-step=6.ckpt"});
  // Not a checkpoint: a clear error.
  io::save_safetensors(dir / "other.safetensors", {{"w", zeros<float>(Shape{2})}});
  expect_error(__LINE__, [&] { train::load_checkpoint(dir / "other.safetensors"); },
               {"not an ember checkpoint", "<missing>"});
}

namespace {
/// One run of the resume test: deterministic, 2 loader workers with shuffling and flips, momentum SGD under
/// one-cycle, noise and dropout from the default generator in the step, mid-epoch validation; checkpoints every 4
/// steps.
struct ResumeRun {
  std::string dir;
  std::int64_t max_steps;
  std::int64_t interrupt_at = -1;  // throw from a callback at this global step
  std::string ckpt_path{};
  std::int64_t kill_at = -1;       // the process kills itself (SIGKILL) at this global step

  std::vector<Tensor<float>> operator()() const {
    manual_seed(99);  // the model's initialisation; deterministic mode reseeds before training
    Net m;
    auto flip = data::transforms::RandomHorizontalFlip{};
    data::DataLoader tl(Toy{44}, {.batch_size = 4, .shuffle = true, .num_workers = 2, .seed = 5}, flip);
    data::DataLoader vl(Toy{8}, {.batch_size = 4});
    optim::SGD opt(m.parameters(), {.lr = 0.05, .momentum = 0.9});
    optim::OneCycleLR sched(opt, 0.2, {.total_steps = 40});
    train::Trainer t(quiet({.max_steps = max_steps, .val_check_interval = 0.5, .deterministic = true, .seed = 7}));
    t.add_callback(std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions{.dirpath = dir, .save_top_k = 0, .save_last = true, .every_n_train_steps = 4}));
    t.add_callback(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{.patience = 100}));
    struct Interrupt : train::Callback {
      std::int64_t at;
      explicit Interrupt(std::int64_t a) : at(a) {}
      void on_train_batch_end(train::Trainer& t) override {
        if (t.global_step() == at) throw std::runtime_error("interrupted");
      }
    };
    if (interrupt_at >= 0) t.add_callback(std::make_shared<Interrupt>(interrupt_at));
    struct Kill : train::Callback {
      std::int64_t at;
      explicit Kill(std::int64_t a) : at(a) {}
      void on_train_batch_end(train::Trainer& t) override {
        if (t.global_step() == at) ::kill(::getpid(), SIGKILL);
      }
    };
    if (kill_at >= 0) t.add_callback(std::make_shared<Kill>(kill_at));
    t.fit(
        m, opt, tl, &vl,
        [&](data::Batch& b) {
          Tensor<float> x = flat(b.data) + randn<float>(Shape{std::int64_t(b.size()), 4}) * 0.1f;
          return nn::cross_entropy(m(nn::functional::dropout(x, 0.2)), b.target);
        },
        [&](data::Batch& b) {
          return train::Metrics{{"val_loss", double(nn::cross_entropy(m(flat(b.data)), b.target).item())}};
        },
        {.scheduler = &sched, .ckpt_path = ckpt_path});
    std::vector<Tensor<float>> out = m.parameters();
    out.push_back(full<float>(Shape{1}, float(opt.lr(0))));
    return out;
  }
};
}  // namespace

TEST_CASE("Trainer: a run interrupted mid-epoch and resumed from last.ckpt ends bit-identical to one never stopped") {
  TempDir dir;
  // 11 batches per epoch, 30 steps: the interruption at step 18 is in the second epoch, the checkpoint it resumes
  // from (step 16) too, after a mid-epoch validation; the resumed run crosses into the third epoch.
  const auto whole = ResumeRun{dir / "a", 30}();
  CHECK_THROWS_WITH(ResumeRun({dir / "b", 30, 18})(), "interrupted");
  const train::TrainingState s = train::load_checkpoint(dir / "b/last.ckpt");
  CHECK(s.step == 16);
  CHECK(s.epoch == 1);
  CHECK(s.batch_in_epoch == 5);
  CHECK(s.rng.offset() > 0);
  const auto resumed = ResumeRun{dir / "b", 30, -1, "last"}();
  REQUIRE(whole.size() == resumed.size());
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK(bitwise_equal(whole[i], resumed[i]));
  // Resuming without restoring the generator would differ: the test can fail.
  const auto fresh = ResumeRun{dir / "c", 30 - 16}();
  CHECK_FALSE(bitwise_equal(fresh[0], whole[0]));
}

TEST_CASE("Trainer: a process killed (SIGKILL) mid-epoch resumes from last.ckpt bit-identical to a run never stopped") {
  if (const char* dir = std::getenv("EMBER_TEST_TRAIN_KILLED_RUN")) {  // the child: trains until it kills itself
    ResumeRun{dir, 30, -1, "", 18}();
    FAIL("the run was to be killed at step 18");
    return;
  }
  TempDir dir;
  const auto whole = ResumeRun{dir / "a", 30}();
  // This program again, running only this test case as the child above.
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(n > 0);
  exe[n] = '\0';
  std::string filter = "-tc=Trainer: a process killed*", out = "--out=" + (dir / "child.log");
  std::vector<char*> argv{exe, filter.data(), out.data(), nullptr};
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  env_s.push_back("EMBER_TEST_TRAIN_KILLED_RUN=" + (dir / "b"));
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(::posix_spawn(&pid, exe, nullptr, nullptr, argv.data(), envp.data()) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("child: " << read_file(dir / "child.log"));
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  const train::TrainingState s = train::load_checkpoint(dir / "b/last.ckpt");
  CHECK(s.step == 16);
  const auto resumed = ResumeRun{dir / "b", 30, -1, "last"}();
  REQUIRE(whole.size() == resumed.size());
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK(bitwise_equal(whole[i], resumed[i]));
}

TEST_CASE("Trainer checkpoints are untrusted: no file outside dirpath is deleted, counts are bounded, any seed resumes") {
  TempDir dir;
  namespace fs = std::filesystem;
  // The default generator's seed is above 2^63: its checkpoints load, seed and offset intact.
  {
    train::TrainingState s;
    s.rng.set_offset(12345);
    REQUIRE(s.rng.seed() > std::uint64_t(std::numeric_limits<std::int64_t>::max()));
    train::detail::save_training_state(dir / "seed.ckpt", s);
    const train::TrainingState back = train::load_checkpoint(dir / "seed.ckpt");
    CHECK(back.rng.seed() == s.rng.seed());
    CHECK(back.rng.offset() == 12345);
  }

  // A real run's last.ckpt, then edited copies of it.
  manual_seed(5);
  Net m;
  data::DataLoader tl(Toy{16}, {.batch_size = 8});
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  const std::string ckdir = dir / "ck";
  auto fit = [&](const std::string& resume) {
    auto ck = std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions{.dirpath = ckdir, .save_top_k = 1, .save_last = true});
    train::Trainer t(quiet({.max_epochs = 3}));
    t.add_callback(ck);
    t.add_callback(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{.monitor = "train_loss"}));
    t.fit(m, opt, tl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); },
          {.ckpt_path = resume});
  };
  fit("");
  const train::TrainingState good = train::load_checkpoint(ckdir + "/last.ckpt");
  const std::string key = "callback/ModelCheckpoint{" + ckdir + ",}/";
  REQUIRE(good.extra.count(key + "kept") == 1);
  auto edited = [&](const std::function<void(train::TrainingState&)>& edit) {
    train::TrainingState s = good;
    edit(s);
    const std::string p = dir / "edited.ckpt";
    train::detail::save_training_state(p, s);
    return p;
  };

  // A kept-files list naming a file elsewhere: resuming (at epoch 1 of 3) would have deleted it at the next save,
  // the one-file list being full.
  const std::string victim = dir / "victim.txt";
  std::ofstream(victim) << "keep me";
  for (const std::string& path : {victim, ckdir + "/../victim.ckpt", ckdir + "/x.safetensors", std::string("/x.ckpt")}) {
    CAPTURE(path);
    const std::string p = edited([&](train::TrainingState& s) {
      s.epoch = 1;
      s.extra[key + "kept"] = "1\t" + path + "\n";
    });
    expect_error(__LINE__, [&] { fit(p); }, {"ModelCheckpoint", "among its kept files", ".ckpt file in"});
  }
  CHECK(fs::exists(victim));
  for (const char* score : {"nan", "", "1x"}) {
    CAPTURE(score);
    const std::string p = edited([&](train::TrainingState& s) {
      s.extra[key + "kept"] = std::string(score) + "\t" + ckdir + "/epoch=0-step=2.ckpt\n";
    });
    expect_error(__LINE__, [&] { fit(p); }, {"ModelCheckpoint", "with a finite score"});
  }
  expect_error(__LINE__, [&] { fit(edited([&](train::TrainingState& s) { s.extra[key + "last_model_path"] = victim; })); },
               {"ModelCheckpoint", "last_model_path", "last.ckpt"});

  // Counters the loop advances are bounded, so resuming cannot overflow them.
  expect_error(__LINE__, [&] {
    io::SafeTensors f = io::load_safetensors(ckdir + "/last.ckpt");
    f.metadata["step"] = std::to_string(std::numeric_limits<std::int64_t>::max());
    io::save_safetensors(dir / "edited.ckpt", f.tensors, f.metadata);
    train::load_checkpoint(dir / "edited.ckpt");
  }, {"'step' is \"9223372036854775807\", not an integer in [0, 9000000000000000]"});
  // (nor can a run write such a checkpoint)
  expect_error(__LINE__, [&] { edited([](train::TrainingState& s) { s.step = std::numeric_limits<std::int64_t>::max(); }); },
               {"save_checkpoint", "step 9223372036854775807", "in [0, 9000000000000000]"});
  // A position past the end of the epoch, running totals that do not fit it, a NaN best score.
  expect_error(__LINE__, [&] { fit(edited([](train::TrainingState& s) { s.epoch = 1; s.batch_in_epoch = 7; })); },
               {"resumes at batch 7 of an epoch of 2 batches"});
  auto mid_epoch = [&](const char* loss_n, const char* samples) {
    return edited([=](train::TrainingState& s) {
      s.epoch = 1;
      s.batch_in_epoch = 1;
      s.extra["trainer/loss_sum"] = "1.5";
      s.extra["trainer/loss_n"] = loss_n;
      s.extra["trainer/samples"] = samples;
    });
  };
  expect_error(__LINE__, [&] { fit(mid_epoch("2", "8")); }, {"extra/trainer/loss_n is \"2\", expected a whole number "
                                                             "in [0, 1]"});
  expect_error(__LINE__, [&] { fit(mid_epoch("1", "9223372036854775807")); }, {"extra/trainer/samples"});
  expect_error(__LINE__, [&] { fit(mid_epoch("1", "8 ")); }, {"extra/trainer/samples"});
  expect_error(__LINE__, [&] {
    fit(edited([](train::TrainingState& s) { s.extra["callback/EarlyStopping{train_loss}/best_score"] = "nan"; }));
  }, {"EarlyStopping", "best_score is NaN"});
  fit(mid_epoch("1", "8"));  // the unedited kind resumes
  CHECK(fs::exists(victim));
}

namespace {
/// Every bit a resume may change, as text: the model's parameters and buffers, the optimizer's and the scheduler's
/// state (with the rates and momenta the optimizer holds), each stateful callback's saved state and what its
/// accessors report, and the default generator. (The loss scaler lives inside fit, so a failed fit drops it.)
using Snapshot = std::map<std::string, std::string>;
void put_state(Snapshot& out, const std::string& prefix, const StateDict& sd) {
  for (const auto& entry : sd)
    std::visit(
        [&](const auto& x) {
          using T = typename std::remove_cvref_t<decltype(x)>::value_type;
          const auto c = x.contiguous();
          const std::size_t bytes = std::size_t(c.numel()) * sizeof(T);
          out[prefix + entry.first] = std::string(dtype_name<T>()) + c.shape().str() + ":" +
                                      std::string(reinterpret_cast<const char*>(c.data()), bytes);
        },
        entry.second);
}

/// A user's callback with state, checked only by its load_state (no check_state), which writes `tag` before it
/// finds `batches` malformed: resuming must undo that too.
struct Tally : train::Callback {
  std::int64_t batches = 0;
  std::string tag = "fresh";
  void on_train_batch_end(train::Trainer& t) override {
    ++batches;
    tag = "step " + std::to_string(t.global_step());
  }
  std::string state_key() const override { return "Tally"; }
  void save_state(std::map<std::string, std::string>& kv) const override {
    kv["batches"] = std::to_string(batches);
    kv["tag"] = tag;
  }
  void load_state(const std::map<std::string, std::string>& kv) override {
    if (kv.empty()) return;
    const auto b = kv.find("batches"), t = kv.find("tag");
    EMBER_CHECK(t != kv.end(), "Tally: no tag");
    tag = t->second;
    char* end = nullptr;
    const long long v = b == kv.end() ? -1 : std::strtoll(b->second.c_str(), &end, 10);
    EMBER_CHECK(b != kv.end() && !b->second.empty() && *end == '\0' && v >= 0, "Tally: batches is not a count");
    batches = v;
  }
};

/// What to write instead of a metadata entry of a Trainer checkpoint (nullopt: drop the entry).
std::vector<std::optional<std::string>> hostile_texts(const std::string& key, const std::string& ckdir) {
  using V = std::vector<std::optional<std::string>>;
  const std::optional<std::string> missing;
  auto ends = [&](const char* s) { return key.size() >= std::strlen(s) && key.ends_with(s); };
  if (key == "format") return V{"ember-train-checkpoint-2", "", missing};
  if (key == "epoch" || key == "step") return V{"-1", "x", "", "1e3", "9000000000000001", missing};
  if (key == "batch_in_epoch") return V{"-1", "x", "5", "9000000000000001", missing};  // 4 batches an epoch
  if (key == "rng_seed" || key == "rng_offset") return V{"-1", "x", " 1", "18446744073709551616", missing};
  if (key == "extra/trainer/loss_sum") return V{"x", "", "1.5 ", missing};
  if (key == "extra/trainer/loss_n") return V{"-1", "x", "3", "0.5", missing};  // at most batch_in_epoch (2)
  if (key == "extra/trainer/samples") return V{"-1", "x", "1e300", missing};
  if (ends("}/kept"))
    return V{"garbage", "1\t/etc/x.ckpt\n", "nan\t" + ckdir + "/epoch=0-step=3.ckpt\n",
             "1\t" + ckdir + "/notes.ckpt\n", "1\t" + ckdir + "/last.ckpt\n", missing};
  if (ends("}/best_model_path")) return V{"garbage", ckdir + "/epoch=9-step=99.ckpt", missing};
  if (ends("}/last_model_path")) return V{"garbage", ckdir + "/other.ckpt", missing};
  if (ends("}/best_score")) return V{"x", "nan", missing};
  if (ends("}/wait_count")) return V{"-1", "x", "2.5", missing};
  if (key == "extra/callback/Tally/batches") return V{"x", "-3", missing};
  if (key == "extra/callback/Tally/tag") return V{missing};  // (any text is a tag)
  FAIL("no hostile values for the metadata entry ", key);
  return {};
}

/// What to write instead of a tensor entry (nullopt: drop it): the wrong shape, a dtype the entry cannot have, a dtype
/// no state holds; NaN and out-of-range values where the entry is not a weight (a model's weights are data, NaN
/// included, as in PyTorch). A parameter without optimizer state is legitimate: those entries are not dropped.
std::vector<std::optional<io::AnyTensor>> hostile_tensors(const std::string& key, const io::AnyTensor& good) {
  std::vector<std::optional<io::AnyTensor>> out;
  const Shape shape = io::shape_of(good);
  const std::int64_t n = std::visit([](const auto& x) { return x.numel(); }, good);
  const bool floating = io::scalar_type(good) != ScalarType::Int64;
  std::visit([&](const auto& x) {
    using T = typename std::remove_cvref_t<decltype(x)>::value_type;
    out.emplace_back(zeros<T>(Shape{n + 1}));
  }, good);
  if (floating) out.emplace_back(zeros<std::int64_t>(shape));
  else out.emplace_back(zeros<float>(shape));
  out.emplace_back(zeros<std::uint8_t>(shape));
  const bool model = key.starts_with("model/");
  if (!key.starts_with("optimizer/state.")) out.emplace_back(std::nullopt);
  if (model || !floating) return out;
  auto with = [&](double v) {
    return std::visit([&](const auto& x) -> io::AnyTensor {
      using T = typename std::remove_cvref_t<decltype(x)>::value_type;
      Tensor<T> c = x.clone();
      c.data()[0] = T(v);
      return c;
    }, good);
  };
  out.emplace_back(with(std::numeric_limits<double>::quiet_NaN()));
  if (n > 1) {  // a momentum buffer
    out.emplace_back(with(std::numeric_limits<double>::infinity()));
    return out;
  }
  out.emplace_back(with(-1));
  auto ends = [&](const char* s) { return key.ends_with(s); };
  std::vector<double> extra;
  if (ends(".lr") || ends(".weight_decay") || ends(".momentum") || ends(".dampening")) extra = {1e308, 0x1p62, 9e15};
  else if (ends("base_lrs.0")) extra = {1e308};
  else if (ends("last_epoch") || ends("growth_interval") || ends("_growth_tracker")) extra = {2.5, 1e300};
  else if (ends("/scale")) extra = {1e39};
  else if (ends("growth_factor") || ends("backoff_factor")) extra = {1.0};
  else FAIL("no out-of-range values for ", key);
  for (double v : extra) out.emplace_back(with(v));
  return out;
}
}  // namespace

// A resume that throws partway leaves nothing half-loaded: every part of the checkpoint is checked before any is
// loaded. Each entry of a real checkpoint (every tensor of the model, optimizer, loss scaler and scheduler, every
// metadata entry: format, position, generator, the epoch's running totals, each callback's state, a user callback's
// included) is replaced in turn by each of its hostile values; every resume must throw an ember::Error and leave the
// model, optimizer, scheduler, callbacks and default generator bit for bit as they were.
TEST_CASE("Trainer resume is all or nothing: a hostile value in any checkpoint entry is refused, changing nothing") {
  TempDir dir;
  const std::string ckdir = dir / "ck";
  manual_seed(11);
  Net m;
  data::DataLoader tl(Toy{16}, {.batch_size = 4});  // 4 batches an epoch
  optim::SGD opt(m.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  optim::StepLR sched(opt, 3, 0.5);
  auto step = [&](data::Batch& b) {  // (noise from the default generator: its state moves with the run)
    const Tensor<float> x = flat(b.data) + randn<float>(Shape{std::int64_t(b.size()), 4}) * 0.01f;
    return nn::cross_entropy(m(x), b.target);
  };
  struct Callbacks {
    std::shared_ptr<train::ModelCheckpoint> ck;
    std::shared_ptr<train::EarlyStopping> es;
    std::shared_ptr<Tally> tally;
  };
  auto make_callbacks = [&] {
    return Callbacks{std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions{
                         .dirpath = ckdir, .save_top_k = 2, .save_last = true, .every_n_train_steps = 3}),
                     std::make_shared<train::EarlyStopping>(
                         train::EarlyStoppingOptions{.monitor = "train_loss", .patience = 100, .verbose = false}),
                     std::make_shared<Tally>()};
  };
  auto fit = [&](const Callbacks& cb, std::int64_t max_steps, const std::string& resume) {
    train::Trainer t(quiet({.max_steps = max_steps, .precision = train::Precision::fp16_mixed, .deterministic = true,
                            .seed = 7}));
    t.add_callback(cb.ck).add_callback(cb.es).add_callback(cb.tally);
    t.fit(m, opt, tl, step, {.scheduler = &sched, .ckpt_path = resume});
  };
  // The checkpoint: mid-epoch (step 6 is batch 2 of epoch 1), with the loss scaler's state and the running totals.
  fit(make_callbacks(), 6, "");
  const io::SafeTensors good = io::load_safetensors(ckdir + "/last.ckpt");
  REQUIRE(good.metadata.at("batch_in_epoch") == "2");
  REQUIRE(good.tensors.count("scaler/scale") == 1);
  REQUIRE(good.metadata.count("extra/trainer/loss_n") == 1);
  REQUIRE(good.metadata.count("extra/callback/Tally/batches") == 1);
  // Then the run goes on elsewhere (5 more steps, other callbacks), so that a partial load would show.
  const Callbacks live = make_callbacks();
  fit(live, 5, "");

  auto snapshot = [&] {
    Snapshot s;
    put_state(s, "model/", m.state_dict());
    put_state(s, "optimizer/", opt.state_dict());
    put_state(s, "scheduler/", sched.state_dict());
    for (const train::Callback* c : {static_cast<train::Callback*>(live.ck.get()),
                                     static_cast<train::Callback*>(live.es.get()),
                                     static_cast<train::Callback*>(live.tally.get())}) {
      std::map<std::string, std::string> kv;
      c->save_state(kv);
      for (const auto& [k, v] : kv) s["callback/" + c->state_key() + "/" + k] = v;
    }
    s["ck/best"] = live.ck->best_model_path() + " " + train::detail::exact(live.ck->best_model_score());
    s["ck/last"] = live.ck->last_model_path();
    s["es/best"] = train::detail::exact(live.es->best_score()) + " " + std::to_string(live.es->wait_count());
    s["rng"] = std::to_string(default_generator().seed()) + " " + std::to_string(default_generator().offset());
    return s;
  };
  const Snapshot before = snapshot();
  const std::string edited = dir / "edited.ckpt";
  int refused = 0;
  auto refuse = [&](const io::TensorMap& tensors, const io::Metadata& meta, const std::string& what) {
    CAPTURE(what);
    const std::vector<unsigned char> bytes = io::serialize_safetensors(tensors, meta);
    std::ofstream(edited, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                  std::streamsize(bytes.size()));
    const std::string msg = error_of([&] { fit(live, 6, edited); });
    INFO("message: " << msg);
    CHECK_MESSAGE(msg.rfind("<", 0) != 0, "expected an ember::Error");
    const Snapshot after = snapshot();
    for (const auto& entry : before)  // (clang before 16 cannot capture structured bindings)
      CHECK_MESSAGE(after.at(entry.first) == entry.second, "changed: ", entry.first);
    CHECK(after.size() == before.size());
    ++refused;
  };
  for (const auto& [key, t] : good.tensors)
    for (const std::optional<io::AnyTensor>& h : hostile_tensors(key, t)) {
      io::TensorMap tensors = good.tensors;
      if (h) tensors.at(key) = *h;
      else tensors.erase(key);
      refuse(tensors, good.metadata, key + (h ? " as " + std::string(dtype_name(io::scalar_type(*h))) + " " +
                                                    io::shape_of(*h).str()
                                              : std::string(" dropped")));
    }
  for (const auto& [key, v] : good.metadata)
    for (const std::optional<std::string>& h : hostile_texts(key, ckdir)) {
      io::Metadata meta = good.metadata;
      if (h) meta.at(key) = *h;
      else meta.erase(key);
      refuse(good.tensors, meta, key + (h ? " = \"" + *h + "\"" : std::string(" dropped")));
    }
  CHECK(refused > 150);
  // The unedited checkpoint resumes (and stops at once, at max_steps = 6): the test could see a change.
  {
    const std::vector<unsigned char> bytes = io::serialize_safetensors(good.tensors, good.metadata);
    std::ofstream(edited, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                  std::streamsize(bytes.size()));
  }
  fit(live, 6, edited);
  const Snapshot resumed = snapshot();
  CHECK(resumed.at("model/fc1.weight") != before.at("model/fc1.weight"));
  CHECK(resumed.at("rng") != before.at("rng"));
  CHECK(std::to_string(live.tally->batches) == good.metadata.at("extra/callback/Tally/batches"));
  for (const auto& [k, v] : m.state_dict())
    CHECK(bitwise_equal(std::get<Tensor<float>>(v), std::get<Tensor<float>>(good.tensors.at("model/" + k))));
}

// ModelCheckpoint deletes a kept file that a better one replaced by its single name inside dirpath (opened once), and
// only a regular file named by its own template: a kept-files list cannot lead it through a symlinked folder, to
// another file of dirpath, or along a symlink.
TEST_CASE("ModelCheckpoint deletes only files it wrote, inside dirpath: a symlinked folder or file leads nowhere") {
  namespace fs = std::filesystem;
  TempDir dir;
  const std::string ckdir = dir / "ck", outside = dir / "outside";
  fs::create_directories(ckdir);
  fs::create_directories(outside);
  std::ofstream(outside + "/victim.ckpt") << "keep me";
  std::ofstream(outside + "/target.ckpt") << "keep me too";
  std::ofstream(ckdir + "/notes.ckpt") << "not a checkpoint of this callback";
  fs::create_directory_symlink(outside, ckdir + "/link");
  fs::create_symlink(outside + "/target.ckpt", ckdir + "/epoch=0-step=1.ckpt");

  manual_seed(5);
  Net m;
  data::DataLoader tl(Toy{16}, {.batch_size = 8});
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  auto fit = [&](const std::string& resume, std::int64_t max_epochs) {
    train::Trainer t(quiet({.max_epochs = max_epochs}));
    t.add_callback(std::make_shared<train::ModelCheckpoint>(
        train::ModelCheckpointOptions{.dirpath = ckdir, .save_top_k = 1, .save_last = true}));
    t.fit(m, opt, tl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); },
          {.ckpt_path = resume});
  };
  fit("", 1);
  const train::TrainingState good = train::load_checkpoint(ckdir + "/last.ckpt");
  const std::string key = "callback/ModelCheckpoint{" + ckdir + ",}/";
  auto listing = [&](const std::string& kept) {
    train::TrainingState s = good;
    s.extra[key + "kept"] = "1\t" + kept + "\n";
    s.extra[key + "best_model_path"] = kept;
    const std::string p = dir / "edited.ckpt";
    train::detail::save_training_state(p, s);
    return p;
  };
  // Resuming at epoch 1 of 2 with a full one-file list would delete the listed file at the next save.
  for (const std::string& kept : {ckdir + "/link/victim.ckpt", ckdir + "/notes.ckpt", ckdir + "/last.ckpt"}) {
    CAPTURE(kept);
    EXPECT_ERROR([&] { fit(listing(kept), 2); }, {"ModelCheckpoint", "among its kept files", "filename template"});
  }
  // A name of the template's kind that is a symlink: the list is accepted, and when epoch 1's checkpoint replaces it
  // the link is left (no file this callback wrote) and so is what it points at.
  fit(listing(ckdir + "/epoch=0-step=1.ckpt"), 2);
  CHECK(fs::exists(ckdir + "/epoch=1-step=4.ckpt"));
  CHECK(fs::is_symlink(fs::symlink_status(ckdir + "/epoch=0-step=1.ckpt")));
  CHECK(fs::exists(outside + "/victim.ckpt"));
  CHECK(fs::exists(outside + "/target.ckpt"));
  CHECK(fs::exists(ckdir + "/notes.ckpt"));
  // A regular file of its own is still deleted when a better one replaces it.
  fit(listing(ckdir + "/epoch=0-step=2.ckpt"), 2);
  CHECK_FALSE(fs::exists(ckdir + "/epoch=0-step=2.ckpt"));
  // File names are single names in dirpath: a '/' in a metric's name becomes '_', and one in the template is refused.
  train::ModelCheckpoint slash({.dirpath = ckdir, .filename = "{epoch}-{val/loss:.1f}"});
  CHECK(slash.format_name(2, 0, train::Metrics{{"val/loss", 0.3}}) == "epoch=2-val_loss=0.3");
  EXPECT_ERROR([&] { train::ModelCheckpoint({.filename = "{epoch}/last"}); }, {"ModelCheckpoint", "names a folder"});
}

// A kill at any point of a save leaves every checkpoint that exists complete (each is renamed into place only when
// written and synced), and may leave the temporary file of the save it cut short: the next run's ModelCheckpoint
// removes those (its own names, writers that no longer run). Each round resumes from the last checkpoint the killed
// round left, so the chain of resumes is checked too.
TEST_CASE("ModelCheckpoint every step, SIGKILLed 30 times: every checkpoint left loads, no temporary file stays") {
  namespace fs = std::filesystem;
  TempDir dir;
  const std::string ckdir = dir / "ck";
  fs::create_directories(ckdir);
  data::DataLoader tl(Toy{16}, {.batch_size = 4});
  auto options = [&](bool save_last) {
    return train::ModelCheckpointOptions{.dirpath = ckdir, .save_top_k = 3, .save_last = save_last,
                                         .every_n_train_steps = 1};
  };
  std::mt19937 rng(48);
  std::uniform_int_distribution<int> delay_us(0, 20000);
  int temp_files_seen = 0;
  for (int round = 0; round < 30; ++round) {
    CAPTURE(round);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // trains, checkpointing every step, until it is killed (nothing here may touch doctest)
      try {
        manual_seed(3);
        Net m;
        optim::SGD opt(m.parameters(), {.lr = 0.05, .momentum = 0.9});
        train::Trainer t(quiet({.max_steps = 1'000'000}));
        t.add_callback(std::make_shared<train::ModelCheckpoint>(options(true)));
        const bool resume = fs::exists(ckdir + "/last.ckpt");
        t.fit(m, opt, tl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); },
              {.ckpt_path = resume ? "last" : ""});
        ::_exit(2);
      } catch (...) {
        ::_exit(1);
      }
    }
    ::usleep(useconds_t(delay_us(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE_MESSAGE(WIFSIGNALED(status), "the training child exited with ", WEXITSTATUS(status), " before the kill");
    for (const auto& e : fs::directory_iterator(ckdir)) {
      const std::string name = e.path().filename().string();
      if (name.find(".tmp-") != std::string::npos) ++temp_files_seen;
      else if (e.path().extension() == ".ckpt") CHECK_NOTHROW(train::load_checkpoint(e.path().string()));
    }
    {  // the next run (here one that stops at once) cleans up
      Net m;
      optim::SGD opt(m.parameters(), {.lr = 0.05});
      train::Trainer t(quiet({.max_steps = 0}));
      t.add_callback(std::make_shared<train::ModelCheckpoint>(options(false)));
      t.fit(m, opt, tl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); });
    }
    for (const auto& e : fs::directory_iterator(ckdir))
      CHECK_MESSAGE(e.path().filename().string().find(".tmp-") == std::string::npos, "left: ", e.path().string());
  }
  MESSAGE("temporary files the kills left, all removed by the next run: " << temp_files_seen);
}

TEST_CASE("CSVLogger: a column per metric, widened by rewriting, rows appended") {
  TempDir dir;
  train::CSVLogger log({.save_dir = dir.path.string(), .name = "run"});
  CHECK(log.log_dir() == dir / "run/version_0");
  log.log_metrics({{"a", 1}}, 0);
  log.log_metrics({{"a", 2}, {"b", 0.5}}, 1);
  log.log_metrics({{"b", 4}}, 2);
  log.finalize();
  CHECK(read_file(log.path()) == "step,a,b\n0,1,\n1,2,0.5\n2,,4\n");
  train::CSVLogger next({.save_dir = dir.path.string(), .name = "run"});
  CHECK(next.log_dir() == dir / "run/version_1");
}

TEST_CASE("ProgressBar: plain lines at a fixed interval when not a terminal, a live line on one (fake clock)") {
  TempDir dir;
  double now = 0;
  auto run = [&](int tty) {
    const std::string path = dir / ("bar" + std::to_string(tty));
    std::FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f);
    train::ProgressBar bar({.refresh_per_second = 2, .plain_interval_seconds = 10, .tty = tty, .out = f,
                            .clock = [&] { return now; }});
    now = 100;
    bar.start_epoch(1, 5, 100);
    for (int b = 1; b <= 100; ++b) {
      now = 100 + 0.25 * b;  // 4 batches a second
      bar.update({.batches = b, .samples = 32 * b, .loss = 1.0 / b, .data_wait_seconds = 0.01 * b});
      if (b == 50) bar.message("a callback says hello");
    }
    bar.end_epoch({.batches = 100, .samples = 3200, .loss = 0.25, .data_wait_seconds = 1.0},
                  train::Metrics{{"val_loss", 0.3125}, {"val_acc", 0.875}});
    std::fclose(f);
    return read_file(path);
  };
  CHECK(run(0) ==
        "epoch 2/5  40/100  4.0 it/s  128 samples/s  loss 0.025  data 4.0%  0:10 < 0:15\n"
        "a callback says hello\n"
        "epoch 2/5  80/100  4.0 it/s  128 samples/s  loss 0.0125  data 4.0%  0:20 < 0:05\n"
        "epoch 2/5  100/100  4.0 it/s  128 samples/s  loss 0.25  data 4.0%  0:25  val_loss 0.3125  val_acc 0.875\n");
  const std::string tty = run(1);
  // Redrawn in place at most twice a second (50 draws over 25 s), the message on a line of its own, the epoch's
  // summary ending the line.
  std::size_t redraws = 0;
  for (std::size_t p = tty.find("\r\x1b[K"); p != std::string::npos; p = tty.find("\r\x1b[K", p + 1)) ++redraws;
  CHECK(redraws == 50 + 1 + 1);  // 50 updates, the line cleared for the message, the summary
  CHECK(tty.find("epoch 2/5  2/100 [....................]  4.0 it/s") != std::string::npos);
  CHECK(tty.find("epoch 2/5  50/100 [##########..........]") != std::string::npos);
  CHECK(tty.find("\r\x1b[Ka callback says hello\n") != std::string::npos);
  CHECK(tty.ends_with("\r\x1b[Kepoch 2/5  100/100  4.0 it/s  128 samples/s  loss 0.25  data 4.0%  0:25  val_loss 0.3125  "
                      "val_acc 0.875\n"));
}

TEST_CASE("Trainer: misuse is a clear error") {
  Net m;
  data::DataLoader tl(Toy{8}, {.batch_size = 4});
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  expect_error(__LINE__, [] { train::Trainer(quiet({.accumulate_grad_batches = 0})); }, {"accumulate_grad_batches"});
  expect_error(__LINE__, [] { train::Trainer(quiet({.val_check_interval = 1.5})); }, {"val_check_interval"});
  expect_error(__LINE__, [&] {
    train::Trainer(quiet({.max_epochs = 1})).fit(m, opt, tl, [&](data::Batch& b) {
      NoGradGuard ng;
      return nn::cross_entropy(m(flat(b.data)), b.target);
    });
  }, {"does not require grad"});
  expect_error(__LINE__, [&] {
    train::Trainer(quiet({.max_epochs = 1})).fit(m, opt, tl, [&](data::Batch& b) {
      return Tensor<float>(nn::cross_entropy(m(flat(b.data)), b.target) * std::nanf(""));
    });
  }, {"training loss is nan", "epoch 0, batch 0", "stop_on_nonfinite_loss"});
  expect_error(__LINE__, [&] {
    train::Trainer(quiet({.max_epochs = 1})).fit(m, opt, tl, [&](data::Batch& b) {
      return Tensor<float>(m(flat(b.data)));
    });
  }, {"one element", "[4, 3]"});
  expect_error(__LINE__, [&] {
    train::Trainer(quiet({.max_epochs = 1})).fit(m, opt, tl, [&](data::Batch& b) {
      return nn::cross_entropy(m(flat(b.data)), b.target);
    }, {.ckpt_path = "last"});
  }, {"ckpt_path = \"last\"", "ModelCheckpoint"});
}

namespace {
/// Reads TFRecord framing back, checking both CRCs of every record; returns the records' payloads.
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 12);
    std::uint64_t len;
    std::uint32_t hc, dc;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&hc, bytes.data() + at + 8, 4);
    CHECK(hc == train::tb::masked_crc32c(bytes.data() + at, 8));
    REQUIRE(bytes.size() - at - 12 >= len + 4);
    const std::string data = bytes.substr(at + 12, len);
    std::memcpy(&dc, bytes.data() + at + 12 + len, 4);
    CHECK(dc == train::tb::masked_crc32c(data.data(), data.size()));
    out.push_back(data);
    at += 12 + len + 4;
  }
  return out;
}

/// A minimal protobuf reader: field number -> raw values (varints as numbers, the rest as bytes).
struct Fields {
  std::multimap<int, std::string> bytes;
  std::multimap<int, std::uint64_t> ints;
  explicit Fields(const std::string& s) {
    std::size_t at = 0;
    auto varint = [&] {
      std::uint64_t v = 0;
      for (int shift = 0;; shift += 7) {
        REQUIRE(at < s.size());
        const auto c = std::uint8_t(s[at++]);
        v |= std::uint64_t(c & 0x7F) << shift;
        if (!(c & 0x80)) return v;
      }
    };
    while (at < s.size()) {
      const std::uint64_t key = varint();
      const int field = int(key >> 3), wire = int(key & 7);
      if (wire == 0) ints.emplace(field, varint());
      else {
        const std::size_t n = wire == 1 ? 8 : wire == 5 ? 4 : std::size_t(varint());
        REQUIRE(at + n <= s.size());
        bytes.emplace(field, s.substr(at, n));
        at += n;
      }
    }
  }
  template <class T>
  T as(int f) const {
    T v{};
    const auto it = bytes.find(f);
    REQUIRE(it != bytes.end());
    REQUIRE(it->second.size() == sizeof(T));
    std::memcpy(&v, it->second.data(), sizeof(T));
    return v;
  }
};

/// The events of the fixture: three scalars, two metrics in one event, a histogram and a text.
std::string write_tensorboard_events(const std::string& dir) {
  double clock = 1700000000.0;
  train::TensorBoardLogger tb({.save_dir = dir, .name = "tb", .wall_clock = [&] { return clock += 0.25; }});
  for (int s = 0; s < 3; ++s) tb.add_scalar("train_loss", 1.0 / (s + 1), s);
  tb.log_metrics({{"val_loss", 0.3125}, {"val_acc", 0.875}}, 3);
  tb.add_histogram("fc1.weight", from_vector(std::vector<float>{-1.f, 0.f, 0.5f, 2.f, 3.f}), 3, 4);
  tb.add_text("notes", "ember *trainer* run", 4);
  return tb.path();
}
}  // namespace

TEST_CASE("TensorBoardLogger: histogram values that are not finite, or span more than a double can count") {
  TempDir dir;
  train::TensorBoardLogger tb({.save_dir = dir.path.string(), .name = "h"});
  expect_error(__LINE__, [&] { tb.add_histogram_values("w", {1.0, std::nan(""), 2.0}, 0); },
               {"add_histogram_values", "'w'", "value 1 is nan", "finite"});
  expect_error(__LINE__, [&] { tb.add_histogram_values("w", {1.0}, 0, 0); }, {"buckets must be in [1, 100000]"});
  // hi - lo overflows to inf: every value still lands in a bucket (under UBSan: no out-of-range conversion).
  tb.add_histogram_values("wide", {-1.7e308, -1.0, 0.0, 1.0, 1.7e308}, 1, 7);
  tb.add_histogram("t", from_vector(std::vector<float>{1.f, kInfF, kNaNF, -3.f}), 2);  // the finite ones only
}

TEST_CASE("TensorBoardLogger: TFRecord framing with masked CRC-32C, events that read back, TensorBoard's reading") {
  const char* digits = "123456789";
  CHECK(train::tb::crc32c(digits, 9) == 0xE3069283u);  // the CRC-32C check value
  TempDir dir;
  const std::string path = write_tensorboard_events(dir.path.string());
  CHECK(path.find(dir / "tb/version_0/events.out.tfevents.1700000000.") == 0);
  const std::string bytes = read_file(path);
  const auto recs = read_records(bytes);
  REQUIRE(recs.size() == 7);
  CHECK(Fields(recs[0]).bytes.find(3)->second == "brain.Event:2");
  std::vector<std::tuple<std::string, std::int64_t, float>> scalars;
  for (std::size_t i = 1; i < recs.size(); ++i) {
    const Fields ev(recs[i]);
    CHECK(ev.as<double>(1) == 1700000000.0 + 0.25 * double(i + 1));
    const auto step = std::int64_t(ev.ints.find(2)->second);
    const Fields summary(ev.bytes.find(5)->second);
    for (auto [it, end] = summary.bytes.equal_range(1); it != end; ++it) {
      const Fields v(it->second);
      if (v.bytes.count(2)) scalars.emplace_back(v.bytes.find(1)->second, step, v.as<float>(2));
      if (v.bytes.count(5)) {
        const Fields h(v.bytes.find(5)->second);
        CHECK(h.as<double>(1) == -1.0);
        CHECK(h.as<double>(2) == 3.0);
        CHECK(h.as<double>(3) == 5.0);
        CHECK(h.as<double>(4) == 4.5);
        CHECK(h.as<double>(5) == 14.25);
        std::vector<double> counts(4);
        REQUIRE(h.bytes.find(7)->second.size() == 32);
        std::memcpy(counts.data(), h.bytes.find(7)->second.data(), 32);
        CHECK(counts == std::vector<double>{2, 1, 1, 1});  // [-1, 0], (0, 1], (1, 2], (2, 3]
      }
    }
  }
  CHECK(scalars == std::vector<std::tuple<std::string, std::int64_t, float>>{
                       {"train_loss", 0, 1.f}, {"train_loss", 1, 0.5f}, {"train_loss", 2, float(1.0 / 3)},
                       {"val_loss", 3, 0.3125f}, {"val_acc", 3, 0.875f}});
  if (const char* out = std::getenv("EMBER_TB_FIXTURE_OUT")) std::filesystem::copy_file(path, out,
                                                                std::filesystem::copy_options::overwrite_existing);
  // The committed fixture is this output, byte for byte, and TensorBoard's own reader (the event accumulator of the
  // PyPI tensorboard package, tests/fixtures/gen_tensorboard.py) read it as tensorboard_expected.txt says.
  std::string fix = __FILE__;
  fix = fix.substr(0, fix.find_last_of('/') + 1) + "fixtures/";
  CHECK(read_file(fix + "tensorboard.tfevents") == bytes);
  std::ifstream exp(fix + "tensorboard_expected.txt");
  REQUIRE(exp.good());
  std::string kind, tag;
  std::vector<std::tuple<std::string, std::int64_t, float>> read_back;
  int histograms = 0, texts = 0;
  while (exp >> kind >> tag) {
    std::int64_t step;
    exp >> step;
    std::string rest;
    std::getline(exp, rest);
    if (kind == "scalar") read_back.emplace_back(tag, step, std::strtof(rest.c_str(), nullptr));
    else if (kind == "histogram") {
      ++histograms;
      CHECK(tag == "fc1.weight");
      CHECK(rest == " min=-1 max=3 num=5 sum=4.5 sum_squares=14.25 bucket=2,1,1,1");
    } else if (kind == "text") {
      ++texts;
      CHECK(tag == "notes");
      CHECK(rest == " ember *trainer* run");
    }
  }
  std::sort(read_back.begin(), read_back.end());
  std::sort(scalars.begin(), scalars.end());
  CHECK(read_back == scalars);
  CHECK(histograms == 1);
  CHECK(texts == 1);
}

TEST_CASE("Trainer with a profiler: the loop's phases and the data waits are in the trace") {
  manual_seed(7);
  Net m;
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  data::DataLoader tl(Toy{16}, {.batch_size = 4, .num_workers = 1});
  profile::Profiler prof;
  train::Trainer t(quiet({.max_epochs = 1, .profiler = &prof}));
  t.fit(m, opt, tl, [&](data::Batch& b) { return nn::cross_entropy(m(flat(b.data)), b.target); });
  CHECK_FALSE(prof.started());
  std::map<std::string, int> calls;
  for (const auto& e : prof.events()) ++calls[e.name];
  CHECK(calls["training_step"] == 4);
  CHECK(calls["backward"] == 4);
  CHECK(calls["optimizer_step"] == 4);
  CHECK(calls["SGD.step"] == 4);
  CHECK(calls["DataLoader.wait"] == 4);
  CHECK(calls["ProfilerStep"] == 4);
}

// ---- train::save_run / resume_run: a hand-written loop checkpointed and resumed in one call each --------------

namespace {
/// An fp16 loop with loss scaling: a half-precision layer, SGD with momentum, StepLR, a GradScaler that grows every
/// 2 steps, dropout from the default generator, and a named generator for the data. Step 4's loss is scaled up until
/// its half gradients overflow, so the scaler backs off once and skips that step.
struct Fp16Loop {
  nn::LinearT<amp::fp16_mixed> fc{6, 4};
  optim::SGD<float> opt{fc.parameters(), {.lr = 0.05, .momentum = 0.9}};
  optim::StepLR sched{opt, 3, 0.5};
  amp::GradScaler scaler{{.init_scale = 256.0, .growth_interval = 2}};
  Generator data{77};
  std::int64_t epoch = 0, step = 0;
  train::Run run() {
    return {.model = &fc, .optimizer = opt, .scheduler = sched, .scaler = scaler, .epoch = &epoch, .step = &step,
            .generators = {{"data", &data}}};
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i, ++step) {
      const Tensor<half> x = cast<half>(randn<float>(Shape{8, 6}, data));
      const Tensor<float> y = cast<float>(fc(x));
      Tensor<float> h = nn::functional::dropout(y, 0.25, true, default_generator());
      Tensor<float> loss = mean(square(h)) * float(step == 4 ? 1e30 : 1.0);
      opt.zero_grad();
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      sched.step();
      if (step % 5 == 4) ++epoch;
    }
  }
};
}  // namespace

TEST_CASE("train::resume_run: an fp16 run with a GradScaler resumes bit-identically, scale and growth tracker too") {
  TempDir dir;
  manual_seed(21);
  Fp16Loop straight;
  straight.train(12);
  const std::uint64_t straight_offset = default_generator().offset();
  CHECK(straight.scaler.get_scale() != 256.0);  // the scaler moved: it grew, and backed off at step 4

  manual_seed(21);
  Fp16Loop first;
  first.train(6);
  train::save_run(dir / "run.ckpt", first.run());
  first.train(2);  // lost in the "crash"

  manual_seed(999);  // a fresh process: other weights, another generator state
  Fp16Loop resumed;
  train::resume_run(dir / "run.ckpt", resumed.run());
  CHECK(resumed.step == 6);
  CHECK(resumed.epoch == 1);
  resumed.train(6);
  CHECK(resumed.step == straight.step);
  CHECK(resumed.scaler.get_scale() == straight.scaler.get_scale());
  CHECK(resumed.scaler.get_growth_tracker() == straight.scaler.get_growth_tracker());
  CHECK(resumed.opt.lr(0) == straight.opt.lr(0));
  CHECK(default_generator().offset() == straight_offset);  // the dropout masks were the same
  const auto a = straight.fc.parameters(), b = resumed.fc.parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(bitwise_equal(a[i], b[i]));
  CHECK(resumed.data.offset() == straight.data.offset());
  // And the comparison can fail: without the scaler's state the resumed run scales differently and diverges.
  manual_seed(999);
  Fp16Loop no_scaler;
  train::Run r = no_scaler.run();
  r.scaler = {};
  expect_error(__LINE__, [&] { train::resume_run(dir / "run.ckpt", r); }, {"holds scaler state", "Run::scaler"});
}

TEST_CASE("train::resume_run is all or nothing and strict about the parts") {
  TempDir dir;
  manual_seed(3);
  Fp16Loop a;
  a.train(3);
  train::save_run(dir / "a.ckpt", a.run());
  const auto snapshot = [](Fp16Loop& l) {
    std::vector<float> v;
    for (const auto& p : l.fc.parameters())
      for (float x : p.to_vector()) v.push_back(x);
    return std::make_tuple(v, l.scaler.get_scale(), l.opt.lr(0), l.step, l.epoch, l.data.offset(),
                           default_generator().offset());
  };
  // A file whose optimizer state does not fit this run's optimizer: refused, and nothing changed (the model would
  // have loaded first).
  manual_seed(4);
  Fp16Loop b;
  b.train(1);
  io::Checkpoint c = io::load_checkpoint(dir / "a.ckpt");
  c.optimizer.begin()->second = Tensor<float>(full<float>(Shape{1}, 1.0f));
  io::save_checkpoint(dir / "bad.ckpt", c);
  const auto before = snapshot(b);
  expect_error(__LINE__, [&] { train::resume_run(dir / "bad.ckpt", b.run()); }, {"optim::SGD"});
  CHECK(snapshot(b) == before);
  // A scaler state that a disabled scaler cannot take, a missing generator, an extra one.
  c = io::load_checkpoint(dir / "a.ckpt");
  c.scaler["scale"] = Tensor<double>(full<double>(Shape{}, -1.0));
  io::save_checkpoint(dir / "bad2.ckpt", c);
  expect_error(__LINE__, [&] { train::resume_run(dir / "bad2.ckpt", b.run()); }, {"amp::GradScaler"});
  CHECK(snapshot(b) == before);
  train::Run more = b.run();
  Generator other;
  more.generators["other"] = &other;
  expect_error(__LINE__, [&] { train::resume_run(dir / "a.ckpt", more); }, {"holds no generator 'other'"});
  train::Run fewer = b.run();
  fewer.generators.clear();
  expect_error(__LINE__, [&] { train::resume_run(dir / "a.ckpt", fewer); }, {"holds generator 'data'"});
  CHECK(snapshot(b) == before);
  // The unedited file resumes.
  train::resume_run(dir / "a.ckpt", b.run());
  CHECK(b.step == 3);
}
