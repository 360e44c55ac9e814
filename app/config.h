// Training configuration: a plain value, built once from flags (and a recipe file) in
// app/flags.cc and passed down. Nothing below app/ reads flags.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/transforms.h"

namespace aiacc::app {

// One stage of a progressive schedule, in effect from start_epoch until the next stage.
struct Stage {
  int start_epoch = 0;
  int image_size = 224;
  int batch_size = 32;      // per process
  double scale_min = 0.08;  // random-resized-crop minimum area fraction
};

// Autocast's compute dtype (--amp-dtype; its "auto" is resolved by configFromFlags).
enum class AmpDtype {
  kFp16,  // loss-scaled (app/amp.h GradScaler)
  kBf16,  // fp32's range: no scaling needed
};

// The learning rate's shape after warmup (--lr-schedule).
enum class LrSchedule { kCosine, kStep, kLinear };

// What an elastic job keeps when its world changes (--elastic-batch).
enum class ElasticBatch {
  // Each rank's batch: the global batch follows the world, the learning rate with it (the linear
  // rule, learningRate's global_batch).
  kKeepPerRank,
  // The global batch of the job's first world (TrainingState::batch_world): shared out over the
  // ranks there are, unevenly where they do not divide it, each image weighing 1 / global batch;
  // the learning rate and the steps per epoch stay as they were.
  kKeepGlobal,
};

struct Config {
  // Data
  std::string data;  // ImageNet-layout folder, or "synthetic"
  int workers = 2;
  int jpeg_index_mb = 1024;                                 // per loader; 0: no JPEG entropy indexes
  int64_t max_image_pixels = data::kDefaultMaxImagePixels;  // larger images: a counted skip
  bool libjpeg_huffman = false;                             // libjpeg-turbo's Huffman decoder instead of aiacc's
  int prefetch = 4;
  double scale_max = 1.0, ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  double crop_fraction = 0.875;
  data::ResizeMode resize = data::ResizeMode::kTorchvision;
  bool channels_last = false;
  int64_t synthetic_images = 1281167;
  int64_t synthetic_classes = 1000;
  int eval_batch_size = 0;  // 0: the stage's batch size

  // Device and precision
  bool cuda = false;  // one GPU per process (cuda:local_rank); else the CPU
  bool amp = false;   // autocast + dynamic loss scaling (app/amp.h)
  AmpDtype amp_dtype = AmpDtype::kFp16;
  bool cudnn_benchmark = true;  // let cuDNN time its algorithms on the first batch of each shape

  // Model
  std::string arch = "resnet50";
  bool zero_init_residual = false;
  std::string init_weights;  // named-tensor file (models/weights.h) to start from; "": initialize

  // Schedule
  int epochs = 90;
  std::vector<Stage> stages;  // sorted by start_epoch, first starts at 0
  double lr = 0.1;            // per 256 images (linear scaling rule)
  double warmup_epochs = 2;
  LrSchedule lr_schedule = LrSchedule::kCosine;
  std::vector<int> lr_step_epochs = {30, 60, 80};
  double lr_step_gamma = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 1e-4;
  bool bn_weight_decay = false;  // decay BN parameters and biases too
  double label_smoothing = 0.1;
  ElasticBatch elastic_batch = ElasticBatch::kKeepPerRank;

  // Run control
  uint64_t seed = 0;
  int64_t max_steps = 0;   // 0: no limit
  double target_top1 = 0;  // percent; 0: none
  double target_top5 = 0;
  int64_t eval_every = 0;  // steps; 0: once per epoch
  int threads = 0;         // intra-op threads; 0: cores / local processes
  double progress_seconds = 2.0;
  // A metrics line every N steps with the job's loss and images over them (one small sum over
  // the ranks each time: a collective, so every rank must use the same N).
  int64_t log_every = 1;

  // Outputs
  std::string checkpoint_dir;
  // Mid-epoch checkpoints too (--checkpoint-every): every N steps, or every so many seconds of
  // rank 0's clock (agreed across ranks through GradientSync::voteFlags); 0: epoch ends only.
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_s = 0;
  int keep_checkpoints = 3;    // in checkpoint_dir: the newest K (common/checkpoint_dir.h)
  std::string resume;          // checkpoint file to continue from, or "auto" (the newest valid one in checkpoint_dir)
  bool evaluate_only = false;  // --evaluate: one evaluation of the val split, no training
  std::string metrics_file;
  std::string tensorboard_dir;  // rank 0's TensorBoard event files (app/tensorboard.h)
  std::string save_weights;     // the final model state as a named-tensor file (rank 0)
  std::string report_file;
  std::string dawnbench_dir;
  double cost_per_hour = 0;
  std::string author = "aiacc";
  std::string recipe;       // path, for the record
  std::string recipe_text;  // whole recipe, for the DAWNBench misc object
  // Every aiacc_train flag's value after the recipe and the command line (name without dashes,
  // value as gflags prints it): a --flagfile of "--name=value" lines reruns the same settings.
  std::vector<std::pair<std::string, std::string>> resolved_flags;
  // Those of them the command line (or a --flagfile) gave: what reruns the same settings. Not
  // every resolved value: a recipe's values come from its file, and whether a flag was given
  // decides some settings (a given --batch-size overrides every recipe stage; --gpus turns AMP
  // and channels-last on unless --amp/--channels-last were given).
  std::vector<std::pair<std::string, std::string>> given_flags;
};

// The stage in effect at `epoch`.
const Stage& stageAt(const Config& c, int epoch);

// Learning rate at fractional epoch position `pos` (epoch + step/steps_per_epoch) for a global
// batch of `global_batch` images: warmup from 0 linearly, then the schedule's shape.
double learningRate(const Config& c, double pos, int64_t global_batch);

// Throws InputError (saying what --data takes) when `c` names no data.
void requireData(const Config& c);

// The factor on a rank's mean loss over its `images` decoded images that makes each weigh
// 1 / global_batch in the gradient the sync averages over `world` ranks: images x world /
// global_batch (1 for a full batch of an even split).
double meanLossWeight(int64_t images, int64_t global_batch, int world);

// Parses "0:128,10:192,14:224" into stages with the given batch size and scale.
std::vector<Stage> parseResizeSchedule(const std::string& spec, int batch_size, double scale_min);

}  // namespace aiacc::app
