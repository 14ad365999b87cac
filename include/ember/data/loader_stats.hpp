// ember — LoaderStats: what one epoch of a data::DataLoader cost its consumer (time waiting for batches, the
// loading time of each stage), and the hint that names what to change when the model waited for data.
#pragma once

#include <cstddef>
#include <string>

#include "ember/config.hpp"
#include "ember/data/loader_stages.hpp"

namespace ember::data {

/// What one epoch's iteration cost the consumer: time waiting for batches vs. total time (the "accelerator idle
/// because of data" figure is wait_fraction()), and what the loading itself spent its time on, stage by stage.
struct LoaderStats {
  double wait_seconds = 0;   ///< time the consumer spent blocked on the loader (all of the loading when num_workers = 0)
  double total_seconds = 0;  ///< time from the start of the epoch's iteration to the last batch handed out
  std::size_t batches = 0;  ///< batches handed out so far this epoch
  std::size_t samples = 0;  ///< samples in those batches
  /// Loading time per stage (read: the dataset's get(); decode; augment: the transform; collate), summed over the
  /// threads that loaded the batches handed out so far: CPU seconds, which with n workers can reach n times the
  /// epoch's wall time.
  StageTimes stages;
  /// wait_seconds / total_seconds: the fraction of the epoch the consumer was blocked on data (0 before any time).
  double wait_fraction() const { return total_seconds > 0 ? wait_seconds / total_seconds : 0.0; }
  /// samples / total_seconds: the loader's throughput as the consumer saw it (0 before any time).
  double samples_per_second() const { return total_seconds > 0 ? double(samples) / total_seconds : 0.0; }
};

/// What to change when an epoch's statistics say the consumer (the model) waited for data a quarter of the epoch or
/// more (epochs of at least 2 s); empty otherwise. Names the stage that took most of the loading time when the
/// statistics have stage times. DataLoader prints it once per process as a hint (core/hint.hpp).
EMBER_HEADER_INLINE std::string input_bound_hint(const LoaderStats& s, int num_workers);
#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE std::string input_bound_hint(const LoaderStats& s, int num_workers) {
  if (s.total_seconds < 2.0 || s.wait_fraction() < 0.25) return {};
  const std::string pct = std::to_string(int(s.wait_fraction() * 100 + 0.5)) + "%";
  std::string h;
  if (num_workers == 0)
    h = "DataLoader: the model waited for data " + pct + " of the epoch, loading in its own thread "
        "(num_workers = 0); set num_workers (2 or more) so that worker threads prepare the next batches";
  else
    h = "DataLoader: the model waited for data " + pct + " of the epoch with " + std::to_string(num_workers) +
        " workers; more workers, packed record files (data::RecordWriter) or cheaper transforms would feed it";
  const double total = s.stages.total();
  if (total > 0) {
    const Stage big = s.stages.largest();
    const char* fix = big == Stage::read     ? "packed shards read sequentially (data::ImageRecordDataset)"
                      : big == Stage::decode ? "a smaller decode (ImagePipeline's reduced_decode, images packed at a "
                                               "smaller size with ember_pack_images --max-side)"
                      : big == Stage::augment ? "cheaper transforms (a smaller output size, fewer colour changes)"
                                              : "collating into the batch directly (ImagePipeline)";
    h += "; loading time is mostly " + std::string(stage_name(big)) + " (" +
         std::to_string(int(100 * s.stages[big] / total + 0.5)) + "%): try " + fix;
  }
  return h;
}
#endif

}  // namespace ember::data
