// Cookbook: data-parallel training with ZeRO-1 sharded optimizer state. Run with the launcher:
//   ember-run -n 2 build/examples/cookbook_ddp_zero
// README, "Cookbook".
#include <ember/dist.hpp>
#include <ember/ember.hpp>
#include <ember/nn/ddp.hpp>
#include <ember/optim/zero.hpp>

#include <cstdio>

using namespace ember;

int main() {
  // [snippet]
  dist::ProcessGroup& pg = dist::init();  // RANK, WORLD_SIZE, MASTER_ADDR... from ember-run or torchrun
  manual_seed(1);
  nn::Sequential model(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 10));
  nn::DistributedDataParallel ddp(model);  // rank 0's weights everywhere; gradients averaged in backward
  // Each rank keeps the AdamW moments of 1/world of the parameters; no option is needed under DDP.
  optim::ZeroRedundancyOptimizer<optim::AdamW<float>> opt(ddp.parameters(), {.lr = 1e-3});
  for (int step = 0; step < 5; ++step) {
    manual_seed(100 + std::uint64_t(pg.rank()) * 31 + std::uint64_t(step));  // this rank's shard of the data
    const Tensor<float> x = randn<float>({16, 32});
    const Tensor<std::int64_t> y = randint<std::int64_t>(0, 10, {16});
    Tensor<float> loss = nn::cross_entropy(ddp(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  // [/snippet]
  // Every rank ends with the same weights.
  Tensor<float> w = model.parameters()[0].clone(), w0 = w.clone();
  pg.broadcast(w0, 0).wait();
  const bool same = w.to_vector() == w0.to_vector();
  std::printf("rank %d of %d: %s, optimizer state %zu bytes\n", pg.rank(), pg.size(), same ? "in sync" : "DIFFERENT",
              opt.local_state_bytes());
  return same && pg.size() >= 2 ? 0 : 1;
}
