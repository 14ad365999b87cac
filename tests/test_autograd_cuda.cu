// CUDA twins of test_autograd.cpp and test_optim.cpp: fused backward kernels equal the CPU gradients (double, and
// float/half/bfloat16 within rounding), mixing devices is an error, and the optimizers' updates equal the CPU's.
// Each case skips when no device is present.
#include "cuda_compare.hpp"

namespace {
/// Runs loss(leaves...) backward on CPU leaves and on their device copies; compares values and gradients.
template <class F>
void same_gradients(std::vector<Tensor<double>> xs, F loss, const std::string& what, double rtol = 1e-10) {
  std::vector<Tensor<double>> ds;
  for (auto& x : xs) {
    ds.push_back(to_dev(x).requires_grad_());
    x.requires_grad_();
  }
  Tensor<double> lc = loss(xs), ld = loss(ds);
  expect_match(lc, ld, rtol, rtol, what + " (value)");
  lc.backward();
  ld.backward();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    REQUIRE(xs[i].grad().defined());
    REQUIRE(ds[i].grad().defined());
    expect_match(xs[i].grad(), ds[i].grad(), rtol, rtol, what + " grad of leaf " + std::to_string(i));
  }
}
}  // namespace

TEST_CASE("cuda: fused backward equals the CPU gradients (double), broadcast leaves, reductions") {
  SKIP_WITHOUT_CUDA();
  manual_seed(9);
  auto rn = [](const Shape& s) { return randn<double>(s); };
  same_gradients({rn({64, 100}), rn({64, 100}), rn({100})},
                 [](auto& v) { return sum(gelu(v[0] * v[1] + v[2])); }, "sum(gelu(x*w+b)), b broadcast");
  same_gradients({rn({1000}), rn({1000})},
                 [](auto& v) { return mean(tanh(v[0]) * v[1] - v[0] / (square(v[1]) + 1.0)); }, "mean(tanh(a)*b - a/(b^2+1))");
  same_gradients({rn({30, 40}), rn({30, 1})},
                 [](auto& v) { return sum(sum(where(v[0] > v[1], exp(v[0] * 0.1), v[1] * v[0]), {1})); },
                 "where with a broadcast column, sum over dim 1");
  same_gradients({rn({20, 30})}, [](auto& v) { return Tensor<double>(sum(max(v[0], 1)) + min(v[0])); }, "max along dim, min");
  same_gradients({rn({20, 30})}, [](auto& v) { return Tensor<double>(sum(norm(v[0], 2, {0})) + var(v[0]) + sum(std_dev(v[0], 1))); },
                 "norm, var, std");
  same_gradients({rn({50, 60}), rn({60, 50})}, [](auto& v) { return sum(sigmoid(v[0] + v[1].t()) * v[0]); },
                 "transposed leaf");
  // Intermediate tensors on the tape (two materialised expressions).
  same_gradients({rn({256}), rn({256})},
                 [](auto& v) {
                   Tensor<double> h = silu(v[0] * v[1]);
                   return sum(softplus(h) * h);
                 },
                 "two nodes");
}

TEST_CASE("cuda: fused backward in float, half and bfloat16 equals the CPU gradients within rounding") {
  SKIP_WITHOUT_CUDA();
  manual_seed(10);
  const Tensor<float> x0 = randn<float>({4096}), w0 = randn<float>({4096}), b0 = randn<float>({4096});
  {
    Tensor<float> x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    Tensor<float> xd = to_dev(x0).requires_grad_(), wd = to_dev(w0).requires_grad_(), bd = to_dev(b0).requires_grad_();
    Tensor<float> y = gelu(x * w + b), yd = gelu(xd * wd + bd);
    expect_match(y, yd, "gelu forward float");
    const Tensor<float> g = randn<float>({4096});
    y.backward(g);
    yd.backward(to_dev(g));
    expect_match(x.grad(), xd.grad(), 1e-5, 1e-6, "dx float");
    expect_match(w.grad(), wd.grad(), 1e-5, 1e-6, "dw float");
    expect_match(b.grad(), bd.grad(), 1e-5, 1e-6, "db float");
  }
  {
    const Tensor<bf16> xb = ev(cast<bf16>(x0)), wb(cast<bf16>(w0));
    Tensor<bf16> x = xb.clone().requires_grad_(), w = wb.clone().requires_grad_();
    Tensor<bf16> xd = to_dev(xb).requires_grad_(), wd = to_dev(wb).requires_grad_();
    Tensor<bf16> y = gelu(x * w), yd = gelu(xd * wd);
    expect_match(y, yd, "gelu forward bf16");
    sum(y).backward();
    sum(yd).backward();
    expect_match(x.grad(), xd.grad(), 8e-3, 1e-3, "dx bf16");
    expect_match(w.grad(), wd.grad(), 8e-3, 1e-3, "dw bf16");
  }
  {
    const Tensor<f16> xh = ev(cast<f16>(x0));
    Tensor<f16> x = xh.clone().requires_grad_();
    Tensor<f16> xd = to_dev(xh).requires_grad_();
    Tensor<f16> y = sigmoid(x) * x, yd = sigmoid(xd) * xd;
    sum(y).backward();
    sum(yd).backward();
    expect_match(x.grad(), xd.grad(), 1e-3, 1e-4, "dx half");
  }
}

TEST_CASE("cuda: mixing devices in one expression is an error naming both") {
  SKIP_WITHOUT_CUDA();
  const Tensor<float> a = randn<float>({10}), ad = to_dev(a);
  std::string msg;
  try {
    Tensor<float> y(a + ad);  // materialising checks the devices first
  } catch (const ember::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("different devices") != std::string::npos);
  CHECK(msg.find("cpu") != std::string::npos);
  CHECK(msg.find("cuda:0") != std::string::npos);
}

TEST_CASE("cuda: backward with a gradient on another device than the output is an error naming both") {
  SKIP_WITHOUT_CUDA();
  Tensor<double> x = randn<double>({4, 3}).requires_grad_();
  Tensor<double> y = x * 2.0;
  CHECK_THROWS_WITH_AS(y.backward(to_dev(ones<double>({4, 3}))),
                       doctest::Contains("the gradient is on cuda:0 but the output of shape [4, 3] is on cpu"), Error);
}

TEST_CASE("cuda: optimizer state follows load_state_dict to the parameter's device; a parameter moved away from its "
          "state is an error naming it") {
  SKIP_WITHOUT_CUDA();
  manual_seed(12);
  const Tensor<double> p0 = randn<double>({50, 3});
  std::vector<Tensor<double>> grads;
  for (int i = 0; i < 4; ++i) grads.push_back(randn<double>({50, 3}));
  Tensor<double> pd = to_dev(p0).requires_grad_();
  optim::AdamW<double> od({pd}, {.lr = 0.01, .weight_decay = 0.1});
  for (int i = 0; i < 2; ++i) {
    pd.grad() = to_dev(grads[std::size_t(i)]);
    od.step();
  }
  // A CPU copy of the parameter continues from the device optimizer's state: load_state_dict moves it to the CPU.
  Tensor<double> pc = to_host(pd.detach()).clone().requires_grad_();
  optim::AdamW<double> oc({pc}, {.lr = 0.01, .weight_decay = 0.1});
  oc.load_state_dict(od.state_dict());
  for (int i = 2; i < 4; ++i) {
    pd.grad() = to_dev(grads[std::size_t(i)]);
    od.step();
    pc.grad() = grads[std::size_t(i)].clone();
    oc.step();
  }
  expect_match(pc.detach(), pd.detach(), 1e-12, 1e-12, "AdamW continued on the CPU from the device's state");

  // Module::to moves the parameters, not the optimizer's state (as in PyTorch): the next step says so. (A module
  // of one double parameter: the kernels this file already has.)
  struct One : nn::Module {
    Tensor<double> w = randn<double>({6});
    One() { register_parameter("w", w); }
  } m;
  m.to(Device::cuda());
  optim::SGD<double> sgd({m.w}, {.lr = 0.1, .momentum = 0.9});
  m.w.grad() = to_dev(randn<double>({6}));
  sgd.step();
  m.to(Device::cpu());
  REQUIRE(m.w.device().is_cpu());
  m.w.grad() = randn<double>({6});
  CHECK_THROWS_WITH_AS(sgd.step(), doctest::Contains("its state 'momentum_buffer' is on cuda:0"), Error);
}

TEST_CASE("cuda: SGD (momentum, Nesterov) and Adam/AdamW (amsgrad) updates equal the CPU's") {
  SKIP_WITHOUT_CUDA();
  manual_seed(11);
  const Tensor<double> p0 = randn<double>({300, 7});
  auto run = [&](auto make_opt, const char* what) {
    Tensor<double> pc = p0.clone().requires_grad_(), pd = to_dev(p0).requires_grad_();
    auto oc = make_opt(pc);
    auto od = make_opt(pd);
    for (int step = 0; step < 4; ++step) {
      const Tensor<double> g = randn<double>({300, 7});
      pc.grad() = g.clone();
      pd.grad() = to_dev(g);
      oc.step();
      od.step();
    }
    expect_match(pc.detach(), pd.detach(), 1e-12, 1e-12, what);
  };
  run([](Tensor<double>& p) { return optim::SGD<double>({p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9,
                                                                               .weight_decay = 0.01}); },
      "SGD momentum");
  run([](Tensor<double>& p) { return optim::SGD<double>({p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9,
                                                                               .nesterov = true}); },
      "SGD Nesterov");
  run([](Tensor<double>& p) { return optim::SGD<double>({p}, optim::SGDOptions{.lr = 0.05}); }, "SGD plain");
  run([](Tensor<double>& p) { return optim::Adam<double>({p}, optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1}); },
      "Adam");
  run([](Tensor<double>& p) { return optim::AdamW<double>({p}, optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1,
                                                                                  .amsgrad = true}); },
      "AdamW amsgrad");
}
