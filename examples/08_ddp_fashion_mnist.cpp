// ember example 8: data-parallel training of example 04's CNN on Fashion-MNIST. Every rank holds the whole model,
// reads its own shard of each epoch (a DistributedSampler) and DistributedDataParallel averages the gradients during
// backward, so N ranks with a per-rank batch of B/N take the same steps as one process with a batch of B.
//
//   build/tools/ember-run -n 2 build/examples/08_ddp_fashion_mnist [--epochs N] [--batch GLOBAL] [--lr X]
//   torchrun --nproc-per-node 2 --no-python build/examples/08_ddp_fashion_mnist
//   mpirun -np 2 build/examples/08_ddp_fashion_mnist        (MASTER_ADDR/MASTER_PORT for more than one host)
//   build/examples/08_ddp_fashion_mnist                     (one process: the same training as example 04's)
//
// --batch is the global batch (default 128, as example 04), split evenly over the ranks. Rank 0 evaluates on the
// test set after each epoch and prints; the other ranks print nothing. The launcher gives each rank
// cores / ranks threads (EMBER_NUM_THREADS).
#include <ember/data.hpp>
#include <ember/dist.hpp>
#include <ember/ember.hpp>
#include <ember/nn/ddp.hpp>
#if defined(EMBER_WITH_MPI) && EMBER_WITH_MPI
#include <ember/dist/mpi.hpp>  // EMBER_DIST_BACKEND=mpi runs the collectives through MPI
#endif

#include "fashion_cnn.hpp"
#include "flags.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace ember;

int main(int argc, char** argv) {
  int epochs = 5, workers = 1;
  std::size_t global_batch = 128;
  double max_lr = 0.1;
  std::string root;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (!std::strcmp(argv[i], "--epochs")) epochs = int(examples::int_flag("--epochs", next(), 1, 1000));
    else if (!std::strcmp(argv[i], "--batch"))
      global_batch = std::size_t(examples::int_flag("--batch", next(), 1, 60000));
    else if (!std::strcmp(argv[i], "--lr")) max_lr = examples::real_flag("--lr", next(), 1e-9, 100);
    else if (!std::strcmp(argv[i], "--workers")) workers = int(examples::int_flag("--workers", next(), 0, 256));
    else if (!std::strcmp(argv[i], "--data")) root = next();
    else {
      std::fprintf(stderr, "usage: %s [--epochs N] [--batch GLOBAL] [--lr X] [--workers N] [--data DIR]\n", argv[0]);
      return 2;
    }
  }
  try {
    dist::ProcessGroup& pg = dist::init();  // RANK, WORLD_SIZE, ... from ember-run, torchrun, mpirun or srun
    const int rank = pg.rank(), world = pg.size();
    if (epochs < 1 || global_batch < std::size_t(world) || global_batch % std::size_t(world) != 0 || max_lr <= 0) {
      if (rank == 0) std::fprintf(stderr, "need --epochs >= 1, --lr > 0 and --batch a multiple of %d\n", world);
      return 2;
    }
    const std::size_t batch = global_batch / std::size_t(world);

    manual_seed(0);
    data::FashionMNIST train_set(data::Split::Train, root), test_set(data::Split::Test, root);
    const data::transforms::Normalize normalize({0.2860f}, {0.3530f});
    data::DistributedSampler sampler(rank, world, {.shuffle = true, .seed = 1, .drop_last = true});
    data::DataLoader train(train_set, {.batch_size = batch, .num_workers = workers, .seed = 1 + std::uint64_t(rank)},
                           data::transforms::Compose(data::transforms::RandomHorizontalFlip{}, normalize), sampler);
    data::DataLoader test(test_set, {.batch_size = 1000, .num_workers = workers}, normalize);

    Net<amp::fp32> net;
    nn::DistributedDataParallel model(net);  // every rank starts from rank 0's weights
    optim::SGD opt(model.parameters(), {.lr = max_lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
    optim::OneCycleLR schedule(opt, max_lr, {.total_steps = std::int64_t(epochs) * std::int64_t(train.size())});
    if (rank == 0)
      std::printf("%d ranks (%s backend), %zu images per rank per step (global batch %zu), %d threads per rank, %s\n",
                  world, pg.backend(), batch, global_batch, cpu::get_num_threads(), cpu::describe().c_str());

    for (int epoch = 0; epoch < epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      model.train();
      train.set_epoch(std::uint64_t(epoch));  // a new shard order each epoch, the same on every rank
      double loss_sum = 0;
      std::size_t seen = 0;
      for (auto& b : train) {
        Tensor<float> loss = nn::cross_entropy(model(b.data), b.target);
        opt.zero_grad();
        loss.backward();  // returns with the gradients averaged over the ranks
        opt.step();
        schedule.step();
        loss_sum += double(loss.item()) * double(b.size());
        seen += b.size();
      }
      // The mean training loss over every rank's images.
      Tensor<double> stats = tensor<double>({loss_sum, double(seen)});
      pg.all_reduce(stats).wait();
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rank == 0) {
        model.eval();
        InferenceMode inference;
        std::int64_t correct = 0;
        for (auto& b : test) correct += sum(cast<std::int64_t>(argmax(net.forward(b.data), 1) == b.target)).item();
        const auto s = stats.to_vector();
        std::printf("epoch %d  %5.1f s  %6.0f images/s (all ranks)  train loss %.4f  test accuracy %.2f%%\n", epoch + 1,
                    secs, s[1] / secs, s[0] / s[1], 100.0 * double(correct) / double(test_set.size()));
        std::fflush(stdout);
      }
      pg.barrier().wait();  // the others wait for rank 0's evaluation
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
