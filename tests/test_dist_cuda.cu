// The NCCL backend on a CUDA device: a communicator of one rank (a lent machine has one GPU, and NCCL allows one rank
// per device), so each collective's result is known; what this checks is the plumbing: the communicator set up
// through a bootstrap, the group's stream ordered after the caller's, Work::wait ordering the caller's stream after
// the collective, the watchdog completing Work, reduce_scatter/all_gather/broadcast argument handling, bf16/fp16 in
// place. Skips without a device; built only when NCCL is found (ember::nccl).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ember/dist.hpp"
#include "ember/dist/nccl.hpp"
#include "ember/ember.hpp"

using namespace ember;

namespace {

#define SKIP_WITHOUT_DEVICE()           \
  if (!ember::cuda::is_available()) {   \
    MESSAGE("skipped: no CUDA device"); \
    return;                             \
  }

/// The bootstrap of a world of one: everyone's string is this rank's.
struct SelfBootstrap : dist::Bootstrap {
  std::vector<std::string> all_gather(const std::string& mine, const std::string&, dist::Deadline) override {
    return {mine};
  }
  std::string where() const override { return "this process"; }
};

}  // namespace

TEST_CASE("dist nccl: a one-rank communicator runs every collective on device tensors") {
  SKIP_WITHOUT_DEVICE();
  SelfBootstrap boot;
  auto nccl = std::make_shared<dist::NcclCollectives>(0, 1, boot, 0, std::chrono::seconds(60));
  dist::ProcessGroup pg(0, 1, nccl, std::make_shared<SelfBootstrap>());
  CHECK(std::string(pg.backend()) == "nccl");

  Tensor<float> x = arange<float>(0, 1000).to(Device::cuda(0));
  dist::Work w = pg.all_reduce(x, dist::ReduceOp::Avg);
  w.wait();  // orders this thread's stream after the collective
  CHECK(x.to_vector()[999] == 999.f);
  CHECK(w.is_completed());

  Tensor<bfloat16> h = full<bfloat16>(Shape{64}, bfloat16(1.5f)).to(Device::cuda(0));
  pg.all_reduce(h).wait();
  CHECK(float(h.to_vector()[63]) == 1.5f);

  Tensor<float> out = zeros<float>(Shape{1000}).to(Device::cuda(0));
  pg.all_gather_into_tensor(out, x).wait();
  CHECK(out.to_vector()[10] == 10.f);
  Tensor<float> rs = zeros<float>(Shape{1000}).to(Device::cuda(0));
  pg.reduce_scatter_tensor(rs, x, dist::ReduceOp::Max).wait();
  CHECK(rs.to_vector()[500] == 500.f);
  pg.broadcast(x, 0).wait();
  pg.barrier().wait();

  // A CPU tensor on a group whose only backend is NCCL is an error that says so.
  Tensor<float> cpu = ones<float>(Shape{4});
  CHECK_THROWS_WITH_AS(pg.all_reduce(cpu), doctest::Contains("does not take tensors on cpu"), Error);
}

TEST_CASE("dist: a world of one (the self backend) gathers and scatters device tensors with device copies") {
  SKIP_WITHOUT_DEVICE();
  auto pg = dist::new_process_group({.rank = 0, .world_size = 1});
  REQUIRE(std::string(pg->backend()) == "self");
  Tensor<float> x = arange<float>(0, 1000).to(Device::cuda(0));
  Tensor<float> out = zeros<float>(Shape{1000}).to(Device::cuda(0));
  pg->all_gather_into_tensor(out, x).wait();
  CHECK(out.to_vector()[10] == 10.f);
  Tensor<float> rs = zeros<float>(Shape{1000}).to(Device::cuda(0));
  pg->reduce_scatter_tensor(rs, x).wait();
  CHECK(rs.to_vector()[999] == 999.f);
}

#undef SKIP_WITHOUT_DEVICE  // (the CUDA files are compiled several to a TU: tests/unity.cmake)
