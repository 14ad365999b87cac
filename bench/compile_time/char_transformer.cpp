// A user's program, kept for scripts/compile_time.sh: a character-level transformer (token and position
// embeddings, pre-norm blocks of causal multi-head self-attention and a GELU MLP) trained with AdamW, gradient
// clipping and a warm-up schedule, saving and resuming checkpoints through ember/io.hpp. It builds and runs on any
// text file; what it is measured for is its compile time.
#include <ember/ember.hpp>
#include <ember/io.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace ember;

constexpr std::int64_t kVocab = 256, kCtx = 64, kDim = 128, kHeads = 4, kLayers = 2;

struct Block : nn::Module {
  nn::LayerNorm ln1{kDim}, ln2{kDim};
  nn::Linear qkv{kDim, 3 * kDim}, proj{kDim, kDim}, up{kDim, 4 * kDim}, down{4 * kDim, kDim};
  nn::Dropout drop{0.1};

  Block() : nn::Module("Block") {
    register_module("ln_1", ln1);
    register_module("c_attn", qkv);
    register_module("c_proj", proj);
    register_module("ln_2", ln2);
    register_module("c_fc", up);
    register_module("mlp_proj", down);
    register_module("dropout", drop);
  }
  /// x (B, T, C) -> (B, T, C); mask (T, T) holds 0 where a position may attend and -inf where it may not.
  Tensor<float> forward(const Tensor<float>& x, const Tensor<float>& mask) const {
    const std::int64_t B = x.size(0), T = x.size(1), hd = kDim / kHeads;
    const Tensor<float> h = qkv(ln1(x));                                       // (B, T, 3C)
    auto heads = [&](std::int64_t part) {                                      // (B*H, T, hd)
      return h.narrow(2, part * kDim, kDim).reshape({B, T, kHeads, hd}).permute({0, 2, 1, 3}).reshape({B * kHeads, T, hd});
    };
    const Tensor<float> q = heads(0), k = heads(1), v = heads(2);
    const Tensor<float> att = softmax(Tensor<float>(bmm(q, k.transpose(1, 2)) * (1.0f / std::sqrt(float(hd))) + mask), -1);
    const Tensor<float> y = bmm(drop(att), v).reshape({B, kHeads, T, hd}).permute({0, 2, 1, 3}).reshape({B, T, kDim});
    const Tensor<float> x1 = x + drop(proj(y));
    return x1 + drop(down(Tensor<float>(gelu(up(ln2(x1))))));
  }
};

struct CharLM : nn::Module {
  nn::Embedding tok{kVocab, kDim}, pos{kCtx, kDim};
  std::vector<std::unique_ptr<Block>> blocks;
  nn::LayerNorm ln_f{kDim};
  nn::Linear head{kDim, kVocab, /*with_bias=*/false};

  CharLM() : nn::Module("CharLM") {
    register_module("wte", tok);
    register_module("wpe", pos);
    for (std::int64_t i = 0; i < kLayers; ++i) {
      blocks.push_back(std::make_unique<Block>());
      std::string name = "h";  // (not "h" + std::to_string(i): g++ 12 -O3 warns falsely, -Wrestrict)
      name += std::to_string(i);
      register_module(name, *blocks.back());
    }
    register_module("ln_f", ln_f);
    register_module("lm_head", head);
  }
  /// idx (B, T) int64 -> logits (B, T, vocab)
  Tensor<float> forward(const Tensor<std::int64_t>& idx) const {
    const std::int64_t T = idx.size(1);
    Tensor<float> x = tok(idx) + pos(arange<std::int64_t>(T));
    const Tensor<std::int64_t> i = arange<std::int64_t>(T);
    const Tensor<float> mask = where(i.reshape({1, T}) > i.reshape({T, 1}), full<float>({T, T}, -INFINITY), 0.0f);  // causal
    for (const auto& b : blocks) x = b->forward(x, mask);
    return head(ln_f(x));
  }
};

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TEXT_FILE [STEPS] [CHECKPOINT]\n", argv[0]);
    return 2;
  }
  const std::int64_t steps = argc > 2 ? std::stoll(argv[2]) : 100;
  const std::string ckpt_path = argc > 3 ? argv[3] : "char_transformer.safetensors";
  try {
    std::ifstream in(argv[1], std::ios::binary);
    EMBER_CHECK(in, "cannot open ", argv[1]);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    EMBER_CHECK(std::int64_t(text.size()) > kCtx + 1, argv[1], " is shorter than one context window");
    Tensor<std::int64_t> corpus = empty<std::int64_t>({std::int64_t(text.size())});
    for (std::size_t i = 0; i < text.size(); ++i) corpus.data()[i] = static_cast<unsigned char>(text[i]);

    manual_seed(0);
    CharLM model;
    optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
    optim::CosineWarmupLR schedule(opt, 20, steps);
    io::Checkpoint start;
    std::int64_t first = 0;
    if (std::ifstream(ckpt_path).good()) {
      start = io::load_checkpoint(ckpt_path);
      model.load_state_dict(start.model);
      opt.load_state_dict(start.optimizer);
      first = start.step;
    }
    const std::int64_t B = 16, n = corpus.numel() - kCtx - 1;
    model.train();
    for (std::int64_t step = first; step < steps; ++step) {
      const Tensor<std::int64_t> at = randint<std::int64_t>(0, n, {B});
      std::vector<Tensor<std::int64_t>> xs, ys;
      for (std::int64_t b = 0; b < B; ++b) {
        xs.push_back(corpus.narrow(0, at.data()[b], kCtx));
        ys.push_back(corpus.narrow(0, at.data()[b] + 1, kCtx));
      }
      const Tensor<float> logits = model.forward(stack(xs));
      Tensor<float> loss = nn::cross_entropy(logits.reshape({-1, kVocab}), stack(ys).reshape({-1}));
      opt.zero_grad();
      loss.backward();
      optim::clip_grad_norm_(model.parameters(), 1.0);
      opt.step();
      schedule.step();
      if ((step + 1) % 20 == 0) {
        std::printf("step %lld  loss %.4f\n", static_cast<long long>(step + 1), double(loss.item()));
        io::save_checkpoint(ckpt_path, {.model = model.state_dict(), .optimizer = opt.state_dict(), .step = step + 1});
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
