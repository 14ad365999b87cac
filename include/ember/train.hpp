// ember — the training loop as options: train::Trainer, its callbacks (EarlyStopping, LearningRateMonitor), the
// progress bar and the CSV logger. Checkpoints (ModelCheckpoint, resuming) are in <ember/train/checkpoint.hpp>, which
// includes <ember/io.hpp>.
#pragma once

#include "ember/train/callbacks.hpp"
#include "ember/train/logger.hpp"
#include "ember/train/metrics.hpp"
#include "ember/train/progress.hpp"
#include "ember/train/trainer.hpp"
