// TrainingState: everything the rest of a run depends on besides the model's and the
// optimizer's tensors. A checkpoint holds it beside them (app/checkpoint.h); the trainer's loop
// reads and advances it (app/trainer.cc); an elastic job's most advanced survivor hands it to the other ranks and to
// newcomers.
//
// What is not here, and why the continuation is still exact:
//   - the sample order and every augmentation are pure functions of (--seed, epoch, sample
//     index) (data/loader.h), so (epochs_done, batches_in_epoch) is the whole data position
//     (with segment_offset and segment_batch once an elastic job's world changed mid-epoch);
//   - the learning rate is a function of the position;
//   - the global CPU generator only draws the initial weights, which the checkpoint replaces (its
//     state is kept anyway, in rng_cpu, for anything a later version draws from it);
//   - the communication set-up's own state is saved (`comm`, comm::CommState): fp16 transfer's
//     scale (--allreduce-dtype fp16 without AMP fp16), and the tuner's choice, the channel shares
//     and the bucket order, which with 3 or more ranks or two-level reduction decide the sum's
//     order. The shares keep moving with measured channel speeds after the resume, as they would
//     have; a checkpoint taken while the tuner was still trying layouts has no choice to restore.
// Fields are appended at the end (aggregate initialisation in tests and tools keeps its order).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "app/report.h"
#include "aiacc/comm/gradient_sync.h"

namespace aiacc::app {

struct TrainingState {
  int64_t epochs_done = 0;            // completed epochs: the epoch the run is in
  int64_t step = 0;                   // optimizer steps taken (skipped ones included)
  int64_t images_seen = 0;            // training images, all ranks
  double elapsed_s = 0;               // wall seconds already spent (time to target continues from here)
  double train_s = 0;                 // of which in training steps
  double loss_scale = 0;              // the AMP loss scaler's scale (0: no scaler)
  int64_t loss_scale_good_steps = 0;  // finite steps since its last change
  // Batches of epoch `epochs_done` already trained: a run stopped in the middle of an epoch
  // resumes at the next batch of that same epoch (0 at an epoch boundary).
  int64_t batches_in_epoch = 0;
  int64_t skipped_steps = 0;  // steps every rank skipped for a non-finite gradient
  int checkpoint_failures = 0;
  // The evaluations so far and the target, as the report shows them: a resumed run's report
  // covers the whole run.
  std::vector<EvalPoint> evals;
  bool target_reached = false;
  double time_to_target_s = -1;
  // The settings the continuation depends on (name, value), as the run that wrote the
  // checkpoint had them: a resume with another value is refused, naming the setting.
  std::vector<std::pair<std::string, std::string>> settings;
  at::Tensor rng_cpu;  // the global CPU generator's state (uint8); undefined: not recorded
  // Written by one rank from its own memory, without a collective (the others were gone): the
  // BatchNorm running statistics are that rank's, not averaged over the ranks.
  bool rank_local_buffers = false;
  // Records, not read to continue: the dataset's class names (label i is classes[i]; empty for
  // synthetic and in-memory data) and the resolved configuration (flag name, value), which
  // --flagfile takes back.
  std::vector<std::string> classes;
  std::vector<std::pair<std::string, std::string>> config;
  // Each completed epoch's training loss and last learning rate (summary.csv), and the epoch in
  // progress so far: the job's summed loss over its images, the images, the last learning rate.
  std::vector<EpochTrain> epoch_train;
  double epoch_loss_sum = 0;
  int64_t epoch_images = 0;
  double epoch_lr = 0;
  // The communication set-up's own state (comm/gradient_sync.h): fp16 transfer's gradient scale
  // and its clean steps (0: none), the tuner's choice, the channel shares, the bucket order.
  comm::CommState comm;
  // Rank 0's CUDA generator's state on a GPU run (uint8; undefined on the CPU): nothing in
  // training draws from it today (augmentation is on the CPU, ResNet has no dropout), and it is
  // kept, as rng_cpu, for anything that will.
  at::Tensor rng_cuda;
  // An elastic job whose world changed within the epoch (app/elastic.h): the current world began
  // at batch segment_batch of the epoch, and shares out the epoch's order from position
  // segment_offset on (data/sampler.h). Both 0 when the world has not changed in this epoch.
  int64_t segment_offset = 0;
  int64_t segment_batch = 0;
  // The elastic membership generation this state was trained in (-1: not an elastic job).
  int64_t generation = -1;
  // --elastic-batch keep-global: the world whose ranks' --batch-size make the job's global batch
  // (its first generation's), kept whatever the world is now; 0 otherwise.
  int64_t batch_world = 0;
};

}  // namespace aiacc::app
