/// # Option defaults: ember against PyTorch
///
/// A default that differs from PyTorch's silently changes a ported training run (ember's `optim::AdamW` once
/// decayed nothing by default where `torch.optim.AdamW` decays by 0.01). So every option default of every layer,
/// loss, optimizer, LR scheduler, functional op, init function, Module method and of the data loader that ember has
/// a counterpart of is audited here against PyTorch's.
///
/// - `tests/fixtures/defaults.txt` holds PyTorch's defaults, one row per option (`<torch name> <parameter>
///   <Python repr>`), written by `tests/fixtures/gen_defaults.py` by introspecting the installed torch (2.15.0):
///   `inspect.signature` of each class's `__init__` and each function, the docstring signature for builtins.
///   Regenerate it with `python3 tests/fixtures/gen_defaults.py` (a Python with the PyPI torch wheel) when moving
///   to a new PyTorch.
/// - This file is the audit: one line per fixture row, naming the ember option it corresponds to. The test
///   default-constructs each ember options struct (or the layer) and compares field by field; for defaults that
///   are function arguments (`leaky_relu`'s slope, `clip_grad_norm_`'s norm type, the init functions...) it calls
///   the function once with the default and once with PyTorch's value spelled out, and requires the same result.
/// - A row must be audited: a new PyTorch option makes the test fail until a line here says what ember does.
/// - `EMBER_DEFAULTS_AUDIT=audit.md ember_tests -sf="*test_defaults.cpp"` writes the whole audit as a table
///   (PyTorch name, option, PyTorch's default, ember's, ok).
///
/// Kinds of rows (the failure message names the row, PyTorch's default and ember's):
///
/// | kind         | meaning                                                                                  |
/// |--------------|------------------------------------------------------------------------------------------|
/// | checked      | ember has the option; its default must equal PyTorch's (a value, or None = unset)         |
/// | `equivalent` | ember has no such option and always behaves as PyTorch's default does (e.g. `inplace`,     |
/// |              | `padding_mode='zeros'`, `foreach`), or spells the default differently (pool `stride = 0`   |
/// |              | for None); the PyTorch value is pinned, so a change of PyTorch's default fails the test    |
/// | `required`   | PyTorch has a default, ember makes the argument required (it cannot change results        |
/// |              | silently: a call without it does not compile or is rejected), e.g. `softmax`'s `dim`      |
///
/// There is no deliberate difference: every default that differed was changed to PyTorch's.
///
/// Differences found by the audit (all fixed; the test failed on each before the fix):
///
/// | option                                              | PyTorch 2.15 | ember before              | now  |
/// |-----------------------------------------------------|--------------|---------------------------|------|
/// | `optim::AdamW` weight_decay                         | 0.01         | 0                         | 0.01 |
/// | `nn::Module::parameters` / `named_parameters` /     | True         | False: a tensor shared by | True |
/// | `named_buffers` remove_duplicate                    |              | two submodules was listed |      |
/// |                                                     |              | twice, so stepped twice   |      |
///
/// `AdamOptions` serves Adam and AdamW, so its `weight_decay` is a `std::optional<double>`: unset means the
/// optimizer's PyTorch default (Adam 0, AdamW 0.01), resolved at construction (`param_groups()` shows it).
///
/// `nn::functional::dropout` (p = 0.5, training = true, as F.dropout; ember has no in-place form) is newer than the
/// fixture and not audited here; the layer `nn::Dropout` is. ember has no functional `embedding` and no
/// `CosineAnnealingLR` (its `eta_min` is audited as `CosineWarmupLR`'s `min_lr`).
#include <doctest/doctest.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/autograd/conv.hpp"
#include "ember/autograd/linalg.hpp"
#include "ember/autograd/normalization.hpp"
#include "ember/autograd/pool.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/core/creation.hpp"
#include "ember/data/dataloader.hpp"
#include "ember/data/sampler.hpp"
#include "ember/nn/activation.hpp"
#include "ember/nn/conv.hpp"
#include "ember/nn/dropout.hpp"
#include "ember/nn/embedding.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/loss.hpp"
#include "ember/nn/module.hpp"
#include "ember/nn/normalization.hpp"
#include "ember/nn/pooling.hpp"
#include "ember/optim/adam.hpp"
#include "ember/optim/clip_grad.hpp"
#include "ember/optim/lr_scheduler.hpp"
#include "ember/optim/sgd.hpp"

using namespace ember;

namespace {

using TD = Tensor<double>;

template <class V>
struct is_optional : std::false_type {};
template <class V>
struct is_optional<std::optional<V>> : std::true_type {};

/// Shortest round-trip spelling of a double ("0.01", "1e-08" is "1e-08").
std::string fmt(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

/// The numbers of a Python repr: "0.001", "1e-08", "-100", "(0.9, 0.999)", "[3, 3]"; nullopt if it is not numeric.
std::optional<std::vector<double>> parse_numbers(std::string s) {
  if (!s.empty() && (s.front() == '(' || s.front() == '[')) s = s.substr(1, s.size() - 2);
  std::vector<double> out;
  std::istringstream is(s);
  std::string item;
  while (std::getline(is, item, ',')) {
    const auto b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    if (b == std::string::npos) return std::nullopt;
    item = item.substr(b, e - b + 1);
    double v = 0;
    auto r = std::from_chars(item.data(), item.data() + item.size(), v);
    if (r.ec != std::errc() || r.ptr != item.data() + item.size()) return std::nullopt;
    out.push_back(v);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

/// PyTorch's defaults (tests/fixtures/defaults.txt) and the record of which rows were audited.
class Audit {
 public:
  Audit() {
#ifdef EMBER_TEST_FIXTURES
    const std::filesystem::path path = std::filesystem::path(EMBER_TEST_FIXTURES) / "defaults.txt";
#else
    const std::filesystem::path path = std::filesystem::path(__FILE__).parent_path() / "fixtures" / "defaults.txt";
#endif
    std::ifstream f(path);
    REQUIRE_MESSAGE(f.good(), "cannot open ", path.string());
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty() || line[0] == '#') continue;
      const auto a = line.find(' '), b = line.find(' ', a + 1);
      REQUIRE_MESSAGE(b != std::string::npos, "malformed row in defaults.txt: ", line);
      rows_[line.substr(0, b)] = line.substr(b + 1);
    }
    REQUIRE(rows_.size() > 100);
  }

  /// A numeric option (or a pair / list: betas, a Size2). A scalar in PyTorch applies to every element.
  void num(const std::string& name, const std::string& param, std::vector<double> ember, double rel_tol = 0) {
    const std::string& py = row(name, param);
    const auto want = parse_numbers(py);
    bool ok = want.has_value() && (want->size() == ember.size() || want->size() == 1);
    for (std::size_t i = 0; ok && i < ember.size(); ++i) {
      const double w = (*want)[want->size() == 1 ? 0 : i];
      ok = rel_tol == 0 ? ember[i] == w : std::fabs(ember[i] - w) <= rel_tol * std::fabs(w);
    }
    std::string e = ember.size() == 1 ? fmt(ember[0]) : "(";
    if (ember.size() != 1) {
      for (std::size_t i = 0; i < ember.size(); ++i) e += (i ? ", " : "") + fmt(ember[i]);
      e += ")";
    }
    report(name, param, py, e, ok);
  }
  template <class V>
  void num(const std::string& name, const std::string& param, const V& ember) {
    if constexpr (is_optional<V>::value) {
      if (!ember) return report(name, param, row(name, param), "None (unset)", row(name, param) == "None");
      return num(name, param, *ember);
    } else if constexpr (std::is_same_v<V, Size2>) {
      num(name, param, std::vector<double>{double(ember.h), double(ember.w)});
    } else {
      num(name, param, std::vector<double>{double(ember)});
    }
  }
  void flag(const std::string& name, const std::string& param, bool ember) {
    const std::string& py = row(name, param);
    report(name, param, py, ember ? "True" : "False", py == (ember ? "True" : "False"));
  }
  /// A string option; ember's value spelled as PyTorch spells it ('mean', 'cos', 'fan_in').
  void str(const std::string& name, const std::string& param, const std::string& ember) {
    const std::string& py = row(name, param);
    report(name, param, py, "'" + ember + "'", py == "'" + ember + "'");
  }
  /// PyTorch's default is None; ember's option must be unset (an undefined tensor, nullopt).
  void none(const std::string& name, const std::string& param, bool ember_unset, const std::string& ember_value) {
    const std::string& py = row(name, param);
    report(name, param, py, ember_value, py == "None" && ember_unset);
  }
  /// A function-argument default, probed: `same` says whether calling with ember's default gave the same result
  /// as passing PyTorch's default explicitly (the caller parses it with value()).
  void same_result(const std::string& name, const std::string& param, bool same, const std::string& what) {
    report(name, param, row(name, param), same ? "same result as PyTorch's value (" + what + ")"
                                                : "a different result from PyTorch's value (" + what + ")", same);
  }
  /// ember has no such option and behaves as PyTorch's default `py` does, or spells it differently.
  void equivalent(const std::string& name, const std::string& param, const std::string& py, const std::string& why) {
    const std::string& got = row(name, param);
    report(name, param, got, "equivalent to " + py + ": " + why,
           got == py);
  }
  /// PyTorch has a default `py`; ember's argument is required.
  void required(const std::string& name, const std::string& param, const std::string& py, const std::string& why) {
    const std::string& got = row(name, param);
    report(name, param, got, "required (audited against PyTorch's " + py + "): " + why, got == py);
  }

  /// PyTorch's default as a number (for probing function-argument defaults).
  double value(const std::string& name, const std::string& param) {
    const auto v = parse_numbers(row(name, param, false));
    REQUIRE_MESSAGE((v && v->size() == 1), name, " ", param, ": not a number: ", row(name, param, false));
    return (*v)[0];
  }
  const std::string& raw(const std::string& name, const std::string& param) { return row(name, param, false); }

  /// Every fixture row must have been audited.
  void finish() {
    std::string missing;
    for (const auto& [k, v] : rows_)
      if (!seen_.count(k)) missing += "\n  " + k + " " + v;
    CHECK_MESSAGE(missing.empty(), "rows of defaults.txt that no line of test_defaults.cpp audits (say what ember "
                                   "does for each):", missing);
    if (const char* out = std::getenv("EMBER_DEFAULTS_AUDIT")) {
      std::ofstream f(out);
      f << "| PyTorch | option | PyTorch's default | ember | |\n|---|---|---|---|---|\n" << table_;
    }
  }

 private:
  const std::string& row(const std::string& name, const std::string& param, bool mark = true) {
    const std::string key = name + " " + param;
    auto it = rows_.find(key);
    REQUIRE_MESSAGE(it != rows_.end(), "defaults.txt has no row '", key, "' (regenerate it with gen_defaults.py)");
    if (mark) seen_.insert(key);
    return it->second;
  }
  void report(const std::string& name, const std::string& param, const std::string& py, const std::string& ember,
              bool ok) {
    CHECK_MESSAGE(ok, name, " ", param, ": PyTorch's default is ", py, ", ember's ", ember);
    table_ += "| " + name + " | " + param + " | `" + py + "` | " + ember + " | " + (ok ? "ok" : "DIFFERS") + " |\n";
  }
  std::map<std::string, std::string> rows_;
  std::string table_;  // the audit as a Markdown table, written where EMBER_DEFAULTS_AUDIT names a file
  std::set<std::string> seen_;
};

const char* reduction_str(nn::Reduction r) {
  return r == nn::Reduction::None ? "none" : r == nn::Reduction::Sum ? "sum" : "mean";
}
nn::Reduction reduction_of(const std::string& py) {
  if (py == "'none'") return nn::Reduction::None;
  if (py == "'sum'") return nn::Reduction::Sum;
  REQUIRE_MESSAGE(py == "'mean'", "unknown reduction ", py);
  return nn::Reduction::Mean;
}

bool equal(const TD& a, const TD& b) {
  if (a.shape() != b.shape()) return false;
  const TD x = a.contiguous(), y = b.contiguous();
  for (std::int64_t i = 0; i < x.numel(); ++i)
    if (!(x.data()[i] == y.data()[i])) return false;
  return true;
}
TD sample(const Shape& s, double a, double b) {
  TD t = empty<double>(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = 3 * std::sin(a * double(i) + b);
  return t;
}

const std::string kNoFusedImpl = "ember's update is always one fused loop per parameter; the values are the same";
const std::string kNeverInplace = "ember's layers never write their input";
const std::string kDeprecated = "deprecated PyTorch argument (reduction replaces it); ember has only reduction";

// ---- optimizers ---------------------------------------------------------------------------------------------------

void audit_optimizers(Audit& a) {
  const optim::SGDOptions sgd{};
  const std::string S = "torch.optim.SGD";
  a.num(S, "lr", sgd.lr);
  a.num(S, "momentum", sgd.momentum);
  a.num(S, "dampening", sgd.dampening);
  a.num(S, "weight_decay", sgd.weight_decay);
  a.flag(S, "nesterov", sgd.nesterov);
  a.flag(S, "maximize", sgd.maximize);
  a.equivalent(S, "foreach", "None", kNoFusedImpl);
  a.equivalent(S, "differentiable", "False", "optimizer steps are never recorded by autograd (NoGradGuard)");
  a.equivalent(S, "fused", "None", kNoFusedImpl);

  // Adam and AdamW share AdamOptions; weight_decay's default depends on the optimizer, so read what each one
  // resolved the default-constructed options to.
  TD p = zeros<double>({2}).requires_grad_(true);
  for (const bool decoupled : {false, true}) {
    const std::string A = decoupled ? "torch.optim.AdamW" : "torch.optim.Adam";
    const optim::AdamOptions o = decoupled ? optim::AdamW<double>({p}, {}).param_groups()[0].options
                                           : optim::Adam<double>({p}, {}).param_groups()[0].options;
    a.num(A, "lr", o.lr);
    a.num(A, "betas", std::vector<double>{o.beta1, o.beta2});
    a.num(A, "eps", o.eps);
    a.num(A, "weight_decay", o.weight_decay);
    a.flag(A, "amsgrad", o.amsgrad);
    a.flag(A, "maximize", o.maximize);
    a.equivalent(A, "foreach", "None", kNoFusedImpl);
    a.equivalent(A, "fused", "None", kNoFusedImpl);
    a.equivalent(A, "capturable", "False", "CUDA graph capture is not supported; no effect on values");
    a.equivalent(A, "differentiable", "False", "optimizer steps are never recorded by autograd (NoGradGuard)");
    if (!decoupled)
      a.equivalent(A, "decoupled_weight_decay", "False", "optim::Adam is the L2 form; optim::AdamW the decoupled one");
  }

  // Optimizer::zero_grad(set_to_none = true): the gradient is gone afterwards.
  TD q = ones<double>({2}).requires_grad_(true);
  optim::SGD<double> opt({q}, {.lr = 0.1});
  sum(q * q).backward();
  REQUIRE(q.grad().defined());
  opt.zero_grad();
  a.flag("torch.optim.Optimizer.zero_grad", "set_to_none", !q.grad().defined());
}

// ---- LR schedulers ------------------------------------------------------------------------------------------------

void audit_schedulers(Audit& a) {
  TD p = zeros<double>({1}).requires_grad_(true);
  {
    // StepLR's gamma: the lr after one period with base lr 1.
    optim::SGD<double> opt({p}, {.lr = 1.0});
    optim::StepLR s(opt, 1);
    s.step();
    a.num("torch.optim.lr_scheduler.StepLR", "gamma", opt.lr(0));
    a.equivalent("torch.optim.lr_scheduler.StepLR", "last_epoch", "-1",
                 "a scheduler always starts at step 0 (resume through the optimizer's state)");
  }
  {
    // CosineWarmupLR's min_lr (CosineAnnealingLR's eta_min): the lr at the end of the schedule.
    optim::SGD<double> opt({p}, {.lr = 1.0});
    optim::CosineWarmupLR s(opt, 0, 4);
    for (int i = 0; i < 4; ++i) s.step();
    a.num("torch.optim.lr_scheduler.CosineAnnealingLR", "eta_min", opt.lr(0));
    a.equivalent("torch.optim.lr_scheduler.CosineAnnealingLR", "last_epoch", "-1",
                 "a scheduler always starts at step 0 (resume through the optimizer's state)");
  }
  const optim::OneCycleOptions oc{};
  const std::string O = "torch.optim.lr_scheduler.OneCycleLR";
  a.required(O, "total_steps", "None", "OneCycleOptions::total_steps must be set (0 is rejected)");
  a.required(O, "epochs", "None", "give total_steps = epochs * steps_per_epoch");
  a.required(O, "steps_per_epoch", "None", "give total_steps = epochs * steps_per_epoch");
  a.num(O, "pct_start", oc.pct_start);
  a.str(O, "anneal_strategy", oc.cos_anneal ? "cos" : "linear");
  a.flag(O, "cycle_momentum", oc.cycle_momentum);
  a.num(O, "base_momentum", oc.base_momentum);
  a.num(O, "max_momentum", oc.max_momentum);
  a.num(O, "div_factor", oc.div_factor);
  a.num(O, "final_div_factor", oc.final_div_factor);
  a.flag(O, "three_phase", oc.three_phase);
  a.equivalent(O, "last_epoch", "-1", "a scheduler always starts at step 0");

  const optim::PlateauOptions pl{};
  const std::string R = "torch.optim.lr_scheduler.ReduceLROnPlateau";
  a.str(R, "mode", pl.mode_max ? "max" : "min");
  a.num(R, "factor", pl.factor);
  a.num(R, "patience", pl.patience);
  a.num(R, "threshold", pl.threshold);
  a.str(R, "threshold_mode", pl.threshold_rel ? "rel" : "abs");
  a.num(R, "cooldown", pl.cooldown);
  a.num(R, "min_lr", pl.min_lr);
  a.num(R, "eps", pl.eps);
}

// ---- layers -------------------------------------------------------------------------------------------------------

template <class Options>
void audit_pool_options(Audit& a, const std::string& name, const Options& o, bool max_pool) {
  a.none(name, "stride", o.stride == Size2(0), "stride = 0 (the kernel size, as None)");
  a.num(name, "padding", o.padding);
  if (max_pool) a.num(name, "dilation", o.dilation);
  a.flag(name, "ceil_mode", o.ceil_mode);
  if (!max_pool) {
    a.flag(name, "count_include_pad", o.count_include_pad);
    if constexpr (requires { o.divisor_override; }) {
      a.none(name, "divisor_override", !o.divisor_override, "unset");
    } else {
      a.equivalent(name, "divisor_override", "None", "no divisor_override option: the divisor is the window size");
    }
  }
}

void audit_layers(Audit& a) {
  a.flag("torch.nn.Linear", "bias", nn::Linear(2, 3).bias.defined());

  const nn::Conv2dOptions c{};
  const std::string C = "torch.nn.Conv2d";
  a.num(C, "stride", c.stride);
  a.num(C, "padding", c.padding);
  a.num(C, "dilation", c.dilation);
  a.num(C, "groups", c.groups);
  a.flag(C, "bias", c.bias);
  a.flag(C, "bias", nn::Conv2d(1, 2, 3).bias.defined());
  a.equivalent(C, "padding_mode", "'zeros'", "zero padding is the only mode");

  a.equivalent("torch.nn.ReLU", "inplace", "False", kNeverInplace);
  a.equivalent("torch.nn.SiLU", "inplace", "False", kNeverInplace);
  a.str("torch.nn.GELU", "approximate", nn::GELU().approximate ? "tanh" : "none");
  a.num("torch.nn.LeakyReLU", "negative_slope", nn::LeakyReLU().negative_slope);
  a.equivalent("torch.nn.LeakyReLU", "inplace", "False", kNeverInplace);
  a.num("torch.nn.Flatten", "start_dim", nn::Flatten().start_dim);
  a.num("torch.nn.Flatten", "end_dim", nn::Flatten().end_dim);
  a.num("torch.nn.Dropout", "p", nn::Dropout().p);
  a.equivalent("torch.nn.Dropout", "inplace", "False", kNeverInplace);

  const std::string E = "torch.nn.Embedding";
  const nn::Embedding emb(5, 3);
  a.none(E, "padding_idx", !emb.padding_idx.has_value(), "nullopt");
  a.equivalent(E, "max_norm", "None", "no max_norm option: rows are never renormalised");
  a.equivalent(E, "norm_type", "2.0", "used only with max_norm, which ember does not have");
  a.equivalent(E, "scale_grad_by_freq", "False", "gradients are not scaled by frequency");
  a.equivalent(E, "sparse", "False", "the weight's gradient is dense");
  a.equivalent(E, "_weight", "None", "private PyTorch argument: the weight is initialised from N(0, 1)");
  a.equivalent(E, "_freeze", "False", "private PyTorch argument: the weight requires grad");

  const nn::BatchNormOptions bn{};
  for (const std::string B : {"torch.nn.BatchNorm1d", "torch.nn.BatchNorm2d"}) {
    a.num(B, "eps", bn.eps);
    a.num(B, "momentum", bn.momentum);
    a.flag(B, "affine", bn.affine);
    a.flag(B, "track_running_stats", bn.track_running_stats);
    a.flag(B, "bias", B == "torch.nn.BatchNorm1d" ? nn::BatchNorm1d(3).bias.defined()
                                                   : nn::BatchNorm2d(3).bias.defined());
  }
  const nn::LayerNorm ln(4);
  a.num("torch.nn.LayerNorm", "eps", ln.eps);
  a.flag("torch.nn.LayerNorm", "elementwise_affine", ln.weight.defined());
  a.flag("torch.nn.LayerNorm", "bias", ln.bias.defined());

  audit_pool_options(a, "torch.nn.MaxPool2d", nn::MaxPool2d(2).options, true);
  a.equivalent("torch.nn.MaxPool2d", "return_indices", "False", "nn::MaxPool2d returns the values only");
  audit_pool_options(a, "torch.nn.AvgPool2d", nn::AvgPool2d(2).options, false);
}

// ---- losses -------------------------------------------------------------------------------------------------------

void audit_loss_options(Audit& a, const std::string& name, const auto& o) {
  if constexpr (requires { o.weight; }) a.none(name, "weight", !o.weight.defined(), "an undefined tensor");
  if constexpr (requires { o.pos_weight; }) a.none(name, "pos_weight", !o.pos_weight.defined(), "an undefined tensor");
  if constexpr (requires { o.ignore_index; }) a.num(name, "ignore_index", o.ignore_index);
  if constexpr (requires { o.label_smoothing; }) a.num(name, "label_smoothing", o.label_smoothing);
  a.str(name, "reduction", reduction_str(o.reduction));
  a.equivalent(name, "size_average", "None", kDeprecated);
  a.equivalent(name, "reduce", "None", kDeprecated);
}

void audit_losses(Audit& a) {
  audit_loss_options(a, "torch.nn.CrossEntropyLoss", nn::CrossEntropyLoss<float>().options);
  audit_loss_options(a, "torch.nn.NLLLoss", nn::NLLLoss<float>().options);
  audit_loss_options(a, "torch.nn.BCEWithLogitsLoss", nn::BCEWithLogitsLoss<float>().options);
  audit_loss_options(a, "torch.nn.MSELoss", nn::MSELoss());
  audit_loss_options(a, "torch.nn.L1Loss", nn::L1Loss());
  audit_loss_options(a, "torch.nn.SmoothL1Loss", nn::SmoothL1Loss());
  a.num("torch.nn.SmoothL1Loss", "beta", nn::SmoothL1Loss().beta);
  a.str("torch.nn.HuberLoss", "reduction", reduction_str(nn::HuberLoss().reduction));
  a.num("torch.nn.HuberLoss", "delta", nn::HuberLoss().delta);

  const std::string F = "torch.nn.functional.";
  audit_loss_options(a, F + "cross_entropy", nn::CrossEntropyOptions<float>{});
  audit_loss_options(a, F + "nll_loss", nn::NllLossOptions<float>{});
  audit_loss_options(a, F + "binary_cross_entropy_with_logits", nn::BceWithLogitsOptions<float>{});

  // The element-wise losses take their options as function arguments: call with and without them.
  const TD x = sample({3, 4}, 0.7, 0.1), y = sample({3, 4}, 1.3, 0.4);
  for (const std::string f : {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"}) {
    const nn::Reduction r = reduction_of(a.raw(F + f, "reduction"));
    bool same = false;
    if (f == "mse_loss") same = equal(nn::mse_loss(x, y), nn::mse_loss(x, y, r));
    if (f == "l1_loss") same = equal(nn::l1_loss(x, y), nn::l1_loss(x, y, r));
    if (f == "smooth_l1_loss") same = equal(nn::smooth_l1_loss(x, y), nn::smooth_l1_loss(x, y, r));
    if (f == "huber_loss") same = equal(nn::huber_loss(x, y), nn::huber_loss(x, y, r));
    a.same_result(F + f, "reduction", same, "ember::nn::" + f + "(input, target)");
    if (f != "smooth_l1_loss") {
      a.equivalent(F + f, "weight", "None", "no per-element weight argument");
    }
    if (f != "huber_loss") {
      a.equivalent(F + f, "size_average", "None", kDeprecated);
      a.equivalent(F + f, "reduce", "None", kDeprecated);
    }
  }
  const double beta = a.value(F + "smooth_l1_loss", "beta"), delta = a.value(F + "huber_loss", "delta");
  a.same_result(F + "smooth_l1_loss", "beta",
                equal(nn::smooth_l1_loss(x, y), nn::smooth_l1_loss(x, y, nn::Reduction::Mean, beta)), "beta");
  a.same_result(F + "huber_loss", "delta",
                equal(nn::huber_loss(x, y), nn::huber_loss(x, y, nn::Reduction::Mean, delta)), "delta");
}

// ---- functional ops -----------------------------------------------------------------------------------------------

void audit_functional(Audit& a) {
  const std::string F = "torch.nn.functional.";
  const TD x = sample({2, 3, 6, 6}, 0.37, 0.2);

  const TD xl = sample({2, 4}, 0.5, 0.3), wl = sample({3, 4}, 0.9, 1.0);
  a.same_result(F + "linear", "bias", equal(linear(xl, wl), linear(xl, wl, zeros<double>({3}))), "no bias added");

  const ember::Conv2dOptions co{};
  a.num(F + "conv2d", "stride", co.stride);
  a.num(F + "conv2d", "padding", co.padding);
  a.num(F + "conv2d", "dilation", co.dilation);
  a.num(F + "conv2d", "groups", co.groups);
  const TD wc = sample({2, 3, 3, 3}, 0.23, 0.5);
  a.same_result(F + "conv2d", "bias", equal(conv2d(x, wc), conv2d(x, wc, zeros<double>({2}))), "no bias added");

  const Pool2dOptions po{};
  audit_pool_options(a, F + "max_pool2d", po, true);
  a.equivalent(F + "max_pool2d", "return_indices", "False", "max_pool2d returns the values only");
  audit_pool_options(a, F + "avg_pool2d", po, false);
  // stride None = the kernel size: the output sizes PyTorch computed for a (6, 6) input and kernel 2.
  const TD mp = max_pool2d(x, 2), ap = avg_pool2d(x, 2);
  a.num(F + "max_pool2d", "=stride_of_kernel_2", std::vector<double>{double(mp.size(2)), double(mp.size(3))});
  a.num(F + "avg_pool2d", "=stride_of_kernel_2", std::vector<double>{double(ap.size(2)), double(ap.size(3))});

  // batch_norm: momentum through the running statistics, eps through the output.
  {
    const std::string B = F + "batch_norm";
    const double mom = a.value(B, "momentum"), eps = a.value(B, "eps");
    TD m1 = zeros<double>({3}), v1 = ones<double>({3}), m2 = zeros<double>({3}), v2 = ones<double>({3});
    const TD w = ones<double>({3}), b = zeros<double>({3});
    const TD y1 = batch_norm(x, m1, v1, w, b, true);
    const TD y2 = batch_norm(x, m2, v2, w, b, true, mom, eps);
    a.same_result(B, "momentum", equal(m1, m2) && equal(v1, v2), "the running statistics");
    a.same_result(B, "eps", equal(y1, y2) && equal(batch_norm(x, m1, v1, w, b, false),
                                                  batch_norm(x, m1, v1, w, b, false, mom, eps)), "the output");
    a.required(B, "training", "False", "batch_norm(x, running_mean, running_var, weight, bias, training, ...)");
    a.required(B, "weight", "None", "pass Tensor<T>() for None");
    a.required(B, "bias", "None", "pass Tensor<T>() for None");
  }
  {
    const std::string L = F + "layer_norm";
    const TD w = sample({6}, 0.3, 0.1), b = sample({6}, 0.8, 0.2);
    a.same_result(L, "eps", equal(layer_norm(x, Shape{6}, w, b), layer_norm(x, Shape{6}, w, b, a.value(L, "eps"))),
                  "the output");
    a.same_result(L, "weight", equal(layer_norm(x, Shape{6}), layer_norm(x, Shape{6}, ones<double>({6}))),
                  "no scale");
    a.same_result(L, "bias", equal(layer_norm(x, Shape{6}, w), layer_norm(x, Shape{6}, w, zeros<double>({6}))),
                  "no shift");
  }
  {
    const TD neg = full<double>({1}, -1.0);
    a.num(F + "leaky_relu", "negative_slope", -TD(leaky_relu(neg)).data()[0]);
    a.equivalent(F + "leaky_relu", "inplace", "False", kNeverInplace);
    a.equivalent(F + "gelu", "approximate", "'none'", "ember::gelu is the exact form ('none'), gelu_tanh the tanh one");
  }
  for (const std::string f : {"softmax", "log_softmax"}) {
    a.required(F + f, "dim", "None", "the dim is required (PyTorch's None picks one implicitly, deprecated)");
    a.equivalent(F + f, "_stacklevel", "3", "private PyTorch argument (warning plumbing)");
  }
}

// ---- clipping, init ----------------------------------------------------------------------------------------------

void audit_clip_and_init(Audit& a) {
  {
    const std::string C = "torch.nn.utils.clip_grad_norm_";
    auto with_grad = [](double v) {
      TD p = zeros<double>({3}).requires_grad_(true);
      sum(p * sample({3}, 0.4, 0.3) + p * v).backward();
      return std::vector<TD>{p};
    };
    const double by_default = optim::clip_grad_norm_(with_grad(0), 1e9);
    const double by_value = optim::clip_grad_norm_(with_grad(0), 1e9, a.value(C, "norm_type"));
    a.same_result(C, "norm_type", by_default == by_value, "the returned norm");
    bool threw = false;
    try {
      optim::clip_grad_norm_(with_grad(std::numeric_limits<double>::quiet_NaN()), 1.0);
    } catch (const Error&) {
      threw = true;
    }
    a.flag(C, "error_if_nonfinite", threw);
    a.equivalent(C, "foreach", "None", "one loop over the gradients; no effect on values");
    a.equivalent("torch.nn.utils.clip_grad_value_", "foreach", "None", "one loop over the gradients");
  }

  const std::string I = "torch.nn.init.";
  a.num(I + "calculate_gain", "=leaky_relu_gain", std::vector<double>{nn::init::calculate_gain(
                                                      nn::init::Nonlinearity::LeakyReLU)}, 1e-15);
  a.equivalent(I + "calculate_gain", "param", "None", "calculate_gain(nl, param = 0.01): 0.01 is what None means "
                                                       "for leaky_relu (checked by =leaky_relu_gain), ignored otherwise");
  // Each init function with its defaults equals the call with PyTorch's values spelled out, from the same seed of
  // the default generator.
  auto same = [](auto&& with_defaults, auto&& with_values) {
    TD t = empty<double>({4, 5}), u = empty<double>({4, 5});
    manual_seed(1234);
    with_defaults(t);
    manual_seed(1234);
    with_values(u);
    return equal(t, u);
  };
  namespace init = nn::init;
  const double ua = a.value(I + "uniform_", "a"), ub = a.value(I + "uniform_", "b");
  const double nm = a.value(I + "normal_", "mean"), ns = a.value(I + "normal_", "std");
  const bool u_same = same([](TD& t) { init::uniform_(t); }, [&](TD& t) { init::uniform_(t, ua, ub); });
  a.same_result(I + "uniform_", "a", u_same, "U(a, b)");
  a.same_result(I + "uniform_", "b", u_same, "U(a, b)");
  const bool n_same = same([](TD& t) { init::normal_(t); }, [&](TD& t) { init::normal_(t, nm, ns); });
  a.same_result(I + "normal_", "mean", n_same, "N(mean, std)");
  a.same_result(I + "normal_", "std", n_same, "N(mean, std)");
  for (const std::string f : {"xavier_uniform_", "xavier_normal_"}) {
    const double gain = a.value(I + f, "gain");
    const bool s = f == "xavier_uniform_" ? same([](TD& t) { init::xavier_uniform_(t); },
                                                 [&](TD& t) { init::xavier_uniform_(t, gain); })
                                          : same([](TD& t) { init::xavier_normal_(t); },
                                                 [&](TD& t) { init::xavier_normal_(t, gain); });
    a.same_result(I + f, "gain", s, "gain");
  }
  for (const std::string f : {"kaiming_uniform_", "kaiming_normal_"}) {
    const double ka = a.value(I + f, "a");
    const std::string mode = a.raw(I + f, "mode"), nl = a.raw(I + f, "nonlinearity");
    REQUIRE_MESSAGE((mode == "'fan_in'" || mode == "'fan_out'"), (I + f), " mode ", mode);
    REQUIRE_MESSAGE(nl == "'leaky_relu'", (I + f), " nonlinearity ", nl, ": extend the audit");
    const auto m = mode == "'fan_in'" ? init::FanMode::FanIn : init::FanMode::FanOut;
    const auto n = init::Nonlinearity::LeakyReLU;
    const bool s = f == "kaiming_uniform_" ? same([](TD& t) { init::kaiming_uniform_(t); },
                                                  [&](TD& t) { init::kaiming_uniform_(t, ka, m, n); })
                                           : same([](TD& t) { init::kaiming_normal_(t); },
                                                  [&](TD& t) { init::kaiming_normal_(t, ka, m, n); });
    a.same_result(I + f, "a", s, "a, mode, nonlinearity");
    a.same_result(I + f, "mode", s, "a, mode, nonlinearity");
    a.same_result(I + f, "nonlinearity", s, "a, mode, nonlinearity");
  }
  for (const std::string f : {"uniform_", "normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                              "kaiming_normal_"})
    a.equivalent(I + f, "generator", "None", "ember::default_generator(), which manual_seed seeds");
}

// ---- Module -------------------------------------------------------------------------------------------------------

struct Leaf : nn::Module {
  TD w = zeros<double>({2}), b = zeros<double>({2});
  Leaf() : nn::Module("Leaf") {
    register_parameter("w", w);
    register_buffer("b", b);
  }
};
struct Tied : nn::Module {
  Leaf own, shared;
  explicit Tied(const Leaf& s) : nn::Module("Tied"), shared(s) {
    register_module("own", own);
    register_module("a", shared);
    register_module("b", shared);  // one submodule under two names (weight tying)
  }
};

void audit_module(Audit& a) {
  const std::string M = "torch.nn.Module.";
  Leaf leaf;
  Tied m(leaf);
  m.eval();
  m.train();
  a.flag(M + "train", "mode", m.is_training());

  sum(m.own.w * 2.0).backward();
  REQUIRE(m.own.w.grad().defined());
  m.zero_grad();
  a.flag(M + "zero_grad", "set_to_none", !m.own.w.grad().defined());

  bool threw = false;
  try {
    m.load_state_dict(nn::StateDict{});
  } catch (const Error&) {
    threw = true;
  }
  a.flag(M + "load_state_dict", "strict", threw);
  a.equivalent(M + "load_state_dict", "assign", "False", "values are copied into the existing tensors");

  // recurse: the children's parameters are included; remove_duplicate: the tied submodule's are listed once.
  const auto params = m.parameters<double>();
  const auto named = m.named_parameters<double>();
  const auto buffers = m.named_buffers();
  a.flag(M + "parameters", "recurse", params.size() >= 2);
  a.flag(M + "named_parameters", "recurse", named.size() >= 2);
  a.flag(M + "named_buffers", "recurse", buffers.size() >= 2);
  a.flag(M + "named_parameters", "remove_duplicate", named.size() == 2 && params.size() == 2);
  a.flag(M + "named_buffers", "remove_duplicate", buffers.size() == 2);
  a.equivalent(M + "named_parameters", "prefix", "''", "names start at the module itself");
  a.equivalent(M + "named_buffers", "prefix", "''", "names start at the module itself");

  a.flag("torch.nn.Parameter", "requires_grad", leaf.w.requires_grad());
  a.equivalent("torch.nn.Parameter", "data", "None", "a parameter is a registered tensor");
}

// ---- data ---------------------------------------------------------------------------------------------------------

void audit_data(Audit& a) {
  const data::DataLoaderOptions o{};
  const std::string D = "torch.utils.data.DataLoader";
  a.num(D, "batch_size", o.batch_size);
  a.none(D, "shuffle", !o.shuffle, "false (no shuffling, what None means)");
  a.equivalent(D, "sampler", "None", "the default sampler: sequential, or a permutation with shuffle");
  a.equivalent(D, "batch_sampler", "None", "no batch_sampler option: batches of batch_size from the sampler");
  a.num(D, "num_workers", o.num_workers);
  a.equivalent(D, "collate_fn", "None", "the default collation (samples stacked along a new dim 0)");
  a.flag(D, "pin_memory", o.pin_memory);
  a.flag(D, "drop_last", o.drop_last);
  a.equivalent(D, "timeout", "0", "no timeout option: the consumer waits as long as a batch takes");
  a.equivalent(D, "worker_init_fn", "None", "no worker_init_fn option");
  a.equivalent(D, "multiprocessing_context", "None", "workers are threads of the process");
  a.equivalent(D, "generator", "None", "the order is drawn from DataLoaderOptions::seed and the epoch");
  a.equivalent(D, "prefetch_factor", "None", "prefetch_factor = 2, what None means when num_workers > 0");
  a.num(D, "=prefetch_factor_with_workers", o.prefetch_factor);
  a.equivalent(D, "persistent_workers", "False", "no option; it changes start-up cost, not the batches");
  a.equivalent(D, "pin_memory_device", "''", "pinned for the current CUDA device");
  a.equivalent(D, "in_order", "True", "batches always come in the sampler's order");

  const data::DistributedSamplerOptions d{};
  const std::string S = "torch.utils.data.DistributedSampler";
  a.required(S, "num_replicas", "None", "DistributedSampler(rank, world_size, options); None reads the process group");
  a.required(S, "rank", "None", "DistributedSampler(rank, world_size, options); None reads the process group");
  a.flag(S, "shuffle", d.shuffle);
  a.num(S, "seed", d.seed);
  a.flag(S, "drop_last", d.drop_last);
}

}  // namespace

TEST_CASE("defaults: every option default equals PyTorch 2.15's (tests/fixtures/defaults.txt)") {
  Audit a;
  audit_optimizers(a);
  audit_schedulers(a);
  audit_layers(a);
  audit_losses(a);
  audit_functional(a);
  audit_clip_and_init(a);
  audit_module(a);
  audit_data(a);
  a.finish();
}
