// ember example 9: a character-level GPT. Token and position embeddings, pre-norm transformer blocks (causal
// multi-head self-attention through scaled_dot_product_attention, a GELU MLP), trained with AdamW (decoupled weight
// decay on the 2-D weights only), linear warm-up then cosine decay, gradient clipping and accumulation; it saves
// and resumes checkpoints and samples text with a temperature and top-k.
//
//   09_char_gpt [--data FILE|DIR] [--steps N] [--batch N] [--accum N] [--ctx N] [--dim N] [--heads N] [--layers N]
//               [--lr X] [--log N] [--ckpt FILE] [--resume] [--stop-after N] [--sample N] [--temperature X]
//               [--top-k N] [--threads N]
//
// The text is a file or every regular file of a directory, by default Debian's license texts
// (/usr/share/common-licenses, in every installation: no download). Every --log steps it prints the loss and the
// training tokens per second; --ckpt FILE saves the model, optimizer, schedule and generator state there (atomically)
// every --log steps and at the end, and --resume continues from it (--stop-after N ends a run early, as an
// interruption would: resumed, it finishes with the parameters of an uninterrupted run, bit for bit). bench/torch_gpt_peer.py is the same model in
// PyTorch eager, for a side-by-side tokens/s figure.
#include <ember/ember.hpp>
#if EMBER_EXAMPLE_SAVE
#include <ember/io.hpp>
#include <ember/train/run.hpp>
#endif

#include "flags.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace ember;

struct Config {
  std::string data = "/usr/share/common-licenses";
  std::int64_t steps = 200, batch = 16, accum = 2, ctx = 128, dim = 128, heads = 4, layers = 4, log = 20;
  double lr = 1e-3, temperature = 0.8;
  std::int64_t sample = 200, top_k = 10, stop_after = 0;
  std::string ckpt;
  bool resume = false;
  int threads = 0;
};

/// The corpus as bytes: one file, or a directory's regular files in name order. At most 64 MiB are read.
std::string read_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  constexpr std::uintmax_t kMax = std::uintmax_t(64) << 20;
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    EMBER_CHECK(in.good(), "09_char_gpt: cannot read ", f.string());
    const std::uintmax_t size = fs::file_size(f);
    EMBER_CHECK(text.size() + size <= kMax, "09_char_gpt: the corpus exceeds ", kMax >> 20, " MiB at ", f.string());
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

/// GPT: wte + wpe -> dropout -> blocks -> ln_f -> head. Each block is a pre-norm TransformerEncoderLayer run
/// causally (x + attn(ln1(x)), then x + mlp(ln2(x))).
struct CharGPT : nn::Module {
  std::int64_t ctx;
  nn::Embedding wte, wpe;
  nn::Dropout drop{0.1};
  nn::ModuleList blocks;
  nn::LayerNorm ln_f;
  nn::Linear head;

  CharGPT(std::int64_t vocab, const Config& c)
      : nn::Module("CharGPT"), ctx(c.ctx), wte(vocab, c.dim), wpe(c.ctx, c.dim), ln_f(c.dim), head(c.dim, vocab, false) {
    register_module("wte", wte);
    register_module("wpe", wpe);
    register_module("drop", drop);
    for (std::int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(nn::TransformerEncoderLayer(c.dim, c.heads,
                                                   {.dim_feedforward = 4 * c.dim,
                                                    .dropout = 0.1,
                                                    .activation = nn::TransformerActivation::gelu,
                                                    .batch_first = true,
                                                    .norm_first = true}));
    register_module("blocks", blocks);
    register_module("ln_f", ln_f);
    register_module("head", head);
    // GPT-2's initialisation: N(0, 0.02) for the linear and embedding weights.
    apply([](nn::Module& m) {
      if (m.type_name() == "Linear" || m.type_name() == "Embedding") {
        Tensor<float> w = m.own_parameter<float>("weight");
        nn::init::normal_(w, 0.0, 0.02);
      }
    });
  }

  /// idx (B, T) int64 -> logits (B, T, vocab)
  Tensor<float> forward(const Tensor<std::int64_t>& idx) const {
    const std::int64_t t = idx.size(1);
    Tensor<float> x = drop(Tensor<float>(wte(idx) + wpe(arange<std::int64_t>(t))));
    for (auto& b : blocks) x = static_cast<nn::TransformerEncoderLayer&>(b).forward(x, {}, {}, /*is_causal=*/true);
    return head(ln_f(x));
  }
  Tensor<float> operator()(const Tensor<std::int64_t>& idx) const { return forward(idx); }
};

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "09_char_gpt: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--data") c.data = next();
    else if (a == "--steps") c.steps = examples::int_flag("--steps", next().c_str(), 1, 1000000000);
    else if (a == "--batch") c.batch = examples::int_flag("--batch", next().c_str(), 1, 65536);
    else if (a == "--accum") c.accum = examples::int_flag("--accum", next().c_str(), 1, 65536);
    else if (a == "--ctx") c.ctx = examples::int_flag("--ctx", next().c_str(), 2, 65536);
    else if (a == "--dim") c.dim = examples::int_flag("--dim", next().c_str(), 1, 65536);
    else if (a == "--heads") c.heads = examples::int_flag("--heads", next().c_str(), 1, 4096);
    else if (a == "--layers") c.layers = examples::int_flag("--layers", next().c_str(), 1, 1024);
    else if (a == "--log") c.log = examples::int_flag("--log", next().c_str(), 1, 1000000000);
    else if (a == "--lr") c.lr = examples::real_flag("--lr", next().c_str(), 1e-9, 100);
    else if (a == "--sample") c.sample = examples::int_flag("--sample", next().c_str(), 0, 1000000);
    else if (a == "--temperature") c.temperature = examples::real_flag("--temperature", next().c_str(), 1e-6, 100);
    else if (a == "--top-k") c.top_k = examples::int_flag("--top-k", next().c_str(), 1, 1000000);
    else if (a == "--ckpt") c.ckpt = next();
    else if (a == "--resume") c.resume = true;
    else if (a == "--stop-after") c.stop_after = examples::int_flag("--stop-after", next().c_str(), 0, 1000000000);
    else if (a == "--threads") c.threads = int(examples::int_flag("--threads", next().c_str(), 1, 4096));
    else {
      std::fprintf(stderr, "usage: %s [--data FILE|DIR] [--steps N] [--batch N] [--accum N] [--ctx N] [--dim N] "
                           "[--heads N] [--layers N] [--lr X] [--log N] [--ckpt FILE] [--resume] [--stop-after N] [--sample N] "
                           "[--temperature X] [--top-k N] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  try {
    EMBER_CHECK(c.steps > 0 && c.batch > 0 && c.accum > 0 && c.ctx > 1 && c.dim > 0 && c.heads > 0 && c.layers > 0 &&
                    c.log > 0 && c.temperature > 0 && c.top_k > 0,
                "09_char_gpt: sizes, counts and the temperature must be positive");
    if (c.threads > 0) cpu::set_num_threads(c.threads);
#if !EMBER_EXAMPLE_SAVE
    EMBER_CHECK(c.ckpt.empty(), "09_char_gpt: --ckpt needs the build with EMBER_EXAMPLE_SAVE=1 (CMake sets it)");
#endif
    // The vocabulary: the bytes that occur, in byte order.
    const std::string text = read_corpus(c.data);
    EMBER_CHECK(std::int64_t(text.size()) > 10 * (c.ctx + 1), "09_char_gpt: the corpus (", text.size(),
                " bytes) is too short for a context of ", c.ctx);
    std::vector<std::int64_t> code(256, -1);
    std::vector<char> chars;
    for (unsigned char ch : text)
      if (code[ch] < 0) code[ch] = 0;
    for (int b = 0; b < 256; ++b)
      if (code[std::size_t(b)] == 0) {
        code[std::size_t(b)] = std::int64_t(chars.size());
        chars.push_back(char(b));
      }
    const std::int64_t vocab = std::int64_t(chars.size());
    Tensor<std::int64_t> data = empty<std::int64_t>({std::int64_t(text.size())});
    for (std::size_t i = 0; i < text.size(); ++i) data.data()[i] = code[static_cast<unsigned char>(text[i])];
    const std::int64_t n_train = data.numel() * 9 / 10;  // the last tenth is held out
    std::printf("corpus: %zu bytes, vocabulary %lld, %lld train / %lld validation\n", text.size(),
                static_cast<long long>(vocab), static_cast<long long>(n_train),
                static_cast<long long>(data.numel() - n_train));

    manual_seed(1337);
    CharGPT model(vocab, c);
    // Decoupled weight decay on the matrices (linear and embedding weights), none on biases and norms.
    std::vector<Tensor<float>> decay, no_decay;
    for (auto& [name, p] : model.named_parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    optim::AdamW<float> opt({{decay, {.lr = c.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1}},
                             {no_decay, {.lr = c.lr, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.0}}});
    optim::CosineWarmupLR schedule(opt, std::max<std::int64_t>(1, c.steps / 10), c.steps + 1, c.lr / 10);
    std::printf("model: %lld parameters (%zu tensors with weight decay, %zu without)\n",
                static_cast<long long>(model.num_parameters()), decay.size(), no_decay.size());

    std::int64_t first = 0;
#if EMBER_EXAMPLE_SAVE
    // The whole run's state (and the default generator's), saved and restored in one call each, all or nothing.
    std::int64_t saved_step = 0;
    const train::Run run{.model = &model, .optimizer = opt, .scheduler = schedule, .step = &saved_step};
    if (c.resume) {
      EMBER_CHECK(!c.ckpt.empty(), "09_char_gpt: --resume needs --ckpt FILE");
      train::resume_run(c.ckpt, run);
      first = saved_step;
      std::printf("resumed from %s at step %lld\n", c.ckpt.c_str(), static_cast<long long>(first));
    }
    auto save = [&](std::int64_t step) {
      if (c.ckpt.empty()) return;
      saved_step = step;
      train::save_run(c.ckpt, run);
    };
#else
    auto save = [](std::int64_t) {};
#endif

    // A batch of random windows: x (B, T) and the next characters y (B, T).
    auto batch = [&](std::int64_t lo, std::int64_t hi, Tensor<std::int64_t>& x, Tensor<std::int64_t>& y) {
      const Tensor<std::int64_t> at = randint<std::int64_t>(lo, hi - c.ctx - 1, {c.batch});
      x = empty<std::int64_t>({c.batch, c.ctx});
      y = empty<std::int64_t>({c.batch, c.ctx});
      for (std::int64_t b = 0; b < c.batch; ++b)
        for (std::int64_t t = 0; t < c.ctx; ++t) {
          x.data()[b * c.ctx + t] = data.data()[at.data()[b] + t];
          y.data()[b * c.ctx + t] = data.data()[at.data()[b] + t + 1];
        }
    };
    auto loss_of = [&](const Tensor<std::int64_t>& x, const Tensor<std::int64_t>& y) {
      return nn::cross_entropy(model(x).reshape({-1, vocab}), y.reshape({-1}));
    };

    const auto params = model.parameters();
    model.train();
    auto t0 = std::chrono::steady_clock::now();
    double window_loss = 0;
    std::int64_t window_steps = 0;
    for (std::int64_t step = first; step < c.steps; ++step) {
      opt.zero_grad();
      double step_loss = 0;
      for (std::int64_t m = 0; m < c.accum; ++m) {  // gradient accumulation over micro-batches
        Tensor<std::int64_t> x, y;
        batch(0, n_train, x, y);
        Tensor<float> loss = loss_of(x, y);
        Tensor<float>(loss * (1.0f / float(c.accum))).backward();
        step_loss += double(loss.item()) / double(c.accum);
      }
      optim::clip_grad_norm_(params, 1.0);
      opt.step();
      schedule.step();
      window_loss += step_loss;
      ++window_steps;
      if ((step + 1) % c.log == 0 || step + 1 == c.steps) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tokens = double(window_steps * c.accum * c.batch * c.ctx);
        double val = 0;
        {
          NoGradGuard ng;
          model.eval();
          Tensor<std::int64_t> x, y;
          batch(n_train, data.numel(), x, y);
          val = double(loss_of(x, y).item());
          model.train();
        }
        std::printf("step %5lld  loss %.4f  val %.4f  lr %.2e  %.0f tokens/s\n", static_cast<long long>(step + 1),
                    window_loss / double(window_steps), val, opt.lr(0), tokens / secs);
        std::fflush(stdout);
        save(step + 1);
        window_loss = 0;
        window_steps = 0;
        t0 = std::chrono::steady_clock::now();
      }
      if (c.stop_after > 0 && step + 1 == c.stop_after) {
        std::printf("stopped after step %lld\n", static_cast<long long>(step + 1));
        return 0;
      }
    }
    double checksum = 0;  // of the parameters, to compare runs
    for (const auto& p : params)
      for (float v : p.to_vector()) checksum += double(v);
    std::printf("parameter checksum %.9e\n", checksum);

    // Sampling: temperature, then the top-k logits, then a draw from their softmax.
    if (c.sample > 0) {
      InferenceMode im;
      model.eval();
      std::vector<std::int64_t> out = {code[static_cast<unsigned char>('\n')] >= 0 ? code[static_cast<unsigned char>('\n')] : 0};
      for (std::int64_t i = 0; i < c.sample; ++i) {
        const std::int64_t t = std::min<std::int64_t>(std::int64_t(out.size()), c.ctx);
        Tensor<std::int64_t> x = empty<std::int64_t>({1, t});
        std::copy(out.end() - t, out.end(), x.data());
        const Tensor<float> logits = model(x).select(1, t - 1).select(0, 0);  // (vocab)
        const auto top = topk(Tensor<float>(logits * float(1.0 / c.temperature)), std::min(c.top_k, vocab));
        const Tensor<std::int64_t> pick = multinomial(softmax(top.values, 0), 1);
        out.push_back(top.indices.data()[pick.data()[0]]);
      }
      std::string s;
      for (std::size_t i = 1; i < out.size(); ++i) s.push_back(chars[std::size_t(out[i])]);
      std::printf("--- sample (temperature %.2f, top-k %lld) ---\n%s\n", c.temperature,
                  static_cast<long long>(c.top_k), s.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
