// The small learnable training problem the end-to-end tests share (CPU and GPU): a generated
// sample of 8 hue classes (one shape), real JPEGs with structure a ResNet-18 learns in a few
// dozen steps, and the configuration that learns it.
#pragma once

#include <string>

#include "app/config.h"
#include "data/sample_gen.h"

namespace aiacc::test {

// Writes the sample (320 train, 80 val images) into dir.
inline void makeLearnableSample(const std::string& dir) {
  data::SampleSpec spec;
  spec.classes = 8;
  spec.shapes = 1;
  spec.train_per_class = 40;
  spec.val_per_class = 10;
  spec.min_side = 40;
  spec.max_side = 64;
  data::makeSampleDataset(dir, spec);
}

// 3 epochs of ResNet-18 at 32 px, batch 16, on the sample in data_dir.
inline app::Config learnableConfig(const std::string& data_dir) {
  app::Config c;
  c.data = data_dir;
  c.arch = "resnet18";
  c.epochs = 3;
  c.stages = {app::Stage{0, 32, 16, 0.35}};
  c.lr = 0.8;  // per 256: 0.05 at batch 16
  c.warmup_epochs = 0.5;
  c.nesterov = true;
  c.weight_decay = 5e-5;
  c.zero_init_residual = true;
  c.workers = 1;
  // One compute thread: ctest runs two tests at once on 2 cores, and oversubscribed OpenMP
  // threads spin against each other (several times slower).
  c.threads = 1;
  c.progress_seconds = 1e9;
  c.seed = 5;
  return c;
}

}  // namespace aiacc::test
