// ember — DataLoaderOptions: what a data::DataLoader is made with (batch size, shuffling, workers, prefetching,
// pinned memory, seed), named as in torch.utils.data.DataLoader.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::data {

/// DataLoader settings, named as in torch.utils.data.DataLoader and with its defaults (not in its order; seed plays
/// its generator's part):
///   data::DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .num_workers = 2}, transform);
struct DataLoaderOptions {
  /// The samples per batch, >= 1 (PyTorch's batch_size=None, no batching, is not supported).
  std::size_t batch_size = 1;
  bool shuffle = false;       ///< a new permutation each epoch (from seed and epoch); ignored with a custom sampler
  bool drop_last = false;     ///< drop the last batch when it is smaller than batch_size
  int num_workers = 0;        ///< 0: load in the consumer's thread; n: n worker threads
  int prefetch_factor = 2;    ///< batches each worker may have ready ahead of the consumer
  /// Batches in page-locked host memory, so `batch.data.to(Device::cuda(), true)` is asynchronous: the workers copy
  /// each collated batch's tensors (a Batch's data and target, or a batch that is a tensor) into memory from the
  /// pinned allocator (cuda/pinned.hpp). Needs ember's CUDA backend and a CUDA device; without them the flag does
  /// nothing (batches stay in ordinary host memory), as in PyTorch, and never fails.
  bool pin_memory = false;
  std::uint64_t seed = 0;     ///< seeds the shuffle and every sample's augmentation stream
};

}  // namespace ember::data
