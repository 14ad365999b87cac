// A CPU program as users build it: header-only, no CUDA, so EMBER_HOST_ONLY is 1 (config.hpp) and Tensor::device()
// is the constant Device::cpu(). Its own binary, because the doctest suite (ember_tests) sets EMBER_HOST_ONLY=0 to
// stand in for a CUDA backend on the host, and one program must not mix the two.
//
// What must hold here: CPU tensors work as everywhere else, and a tensor labelled with another device (from_blob
// does not allocate) is an ember::Error at its first use, never a CPU loop over memory that is not the host's.
#include "helpers.hpp"

static_assert(EMBER_HOST_ONLY == 1, "this file tests the default of a TU without CUDA");
#if defined(EMBER_PRECOMPILED)
#error "host_only.cpp is built header-only (ember::precompiled sets EMBER_HOST_ONLY=0)"
#endif

using namespace ember_test;

namespace {
// Every op reaches device() before it reads memory; a tensor labelled cuda:0 over this buffer must never be read.
// The buffer holds NaN, so a result computed from it would show.
std::vector<float>& poisoned() {
  static std::vector<float> v(64, std::numeric_limits<float>::quiet_NaN());
  return v;
}
Tensor<float> on_cuda(const Shape& s) { return from_blob(poisoned().data(), s, {}, Device::cuda(0)); }
#define HOST_ONLY_ERROR {"cuda:0", "EMBER_HOST_ONLY=1", "EMBER_WITH_CUDA=1"}
}  // namespace

TEST_CASE("EMBER_HOST_ONLY: CPU tensors work, and report the CPU") {
  Tensor<float> a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  a.requires_grad_();
  CHECK(a.device() == Device::cpu());
  Tensor<float> y = relu(matmul(a, a.t()) - 20.f);  // [[14, 32], [32, 77]] - 20
  CHECK(y.device().is_cpu());
  CHECK(y.to_vector() == std::vector<float>{0, 12, 12, 57});
  sum(y).backward();
  CHECK(a.grad().device().is_cpu());
  // d/da sum(relu(a a^T - 20)) = (M + M^T) a = 2 M a with M the ReLU mask [[0, 1], [1, 1]]: rows 2 a1, 2 (a0 + a1).
  CHECK(a.grad().to_vector() == std::vector<float>{8, 10, 12, 10, 14, 18});
  CHECK(a.to(Device::cpu()).same_impl(a));
}

TEST_CASE("EMBER_HOST_ONLY: a tensor labelled with another device is an error at its first use") {
  const Tensor<float> g = on_cuda({2, 3});
  const Tensor<float> c = zeros<float>({2, 3});
  EXPECT_ERROR([&] { (void)g.device(); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { Tensor<float> r = c + g; }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { Tensor<float> r = g * 2.f; }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { Tensor<float> r = sum(g); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { Tensor<float> r = matmul(c, g.t()); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { Tensor<float> r = linear(c, g); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { Tensor<float> r = conv2d(on_cuda({1, 1, 4, 4}), ones<float>({1, 1, 3, 3})); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { (void)g.cpu(); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { (void)g.to_vector(); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { (void)to_string(g); }, HOST_ONLY_ERROR);
  EXPECT_ERROR([&] { Tensor<float> r = c.clone(); r.copy_(g); }, HOST_ONLY_ERROR);
  nn::Linear lin(3, 2);
  EXPECT_ERROR([&] { Tensor<float> r = lin(g); }, HOST_ONLY_ERROR);
  CHECK(std::isnan(poisoned()[0]));  // (nothing wrote to it either)
  // Moving a CPU tensor to a GPU needs the CUDA backend, which this program does not have.
  EXPECT_ERROR([&] { (void)c.to(Device::cuda()); }, {"to", "cuda:0", "built without"});
  // An undefined tensor says so, as in any build.
  EXPECT_ERROR([&] { (void)Tensor<float>().device(); }, {"undefined tensor"});
}
