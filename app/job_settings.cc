#include "app/job_settings.h"

#include <cstdio>
#include <cstdlib>

#include "app/option_names.h"
#include "aiacc/common/error.h"
#include "aiacc/common/shortest_double.h"

namespace aiacc::app {
namespace {

std::string str(double v) { return shortestDouble(v); }
std::string onOff(bool b) { return b ? "on" : "off"; }

// FNV-1a over the names, each ended by a zero byte.
uint64_t hashNames(const std::vector<std::string>& names) {
  uint64_t h = 1469598103934665603ull;
  for (const std::string& n : names) {
    for (unsigned char ch : n) h = (h ^ ch) * 1099511628211ull;
    h = (h ^ 0u) * 1099511628211ull;
  }
  return h;
}

}  // namespace

comm::Settings distSettings(const DistSpec& d, const comm::WorldInfo& world) {
  return {
      {"world size", std::to_string(world.world)},
      {"processes per node", std::to_string(world.local_size)},
      {"GPU ranks (--gpus)", onOff(d.gpus > 0)},
      {"--bucket-mb", str(d.dp.reducer.bucket_mb)},
      {"--streams", d.streams > 0 ? std::to_string(d.streams) : "auto"},
      {"--autotune", onOff(d.dp.autotune)},
      {"--shm", onOff(d.shm)},
      {"--allreduce-dtype", optionName(d.dp.codec.dtype)},
      {"--bn-sync", optionName(d.dp.buffers)},
      {"--find-unused", onOff(d.dp.reducer.detect_unused)},
      {"--hierarchical", optionName(d.hierarchical)},
      {"--ranks-per-node", d.ranks_per_node > 0 ? std::to_string(d.ranks_per_node) : "auto"},
  };
}

std::string datasetFingerprint(const std::vector<std::string>& classes, size_t train_files, size_t val_files) {
  char hash[24];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(hashNames(classes)));
  return strCat(classes.size(), " classes (names ", hash, "), ", train_files, " train and ", val_files, " val files");
}

comm::Settings trainSettings(const Config& c, const std::string& dataset, int64_t shard_size,
                             const TrainingState& resumed) {
  std::string stages, steps;
  for (const Stage& st : c.stages) {
    stages += strCat(stages.empty() ? "" : ",", st.start_epoch, ":", st.image_size, "px/", st.batch_size);
    steps += strCat(steps.empty() ? "" : ", ", "from epoch ", st.start_epoch, ": ",
                    st.batch_size > 0 ? shard_size / st.batch_size : 0);
  }
  const std::string name = optionName(c.lr_schedule);
  std::string schedule = name;
  if (c.lr_schedule == LrSchedule::kStep) {
    for (int e : c.lr_step_epochs) schedule += strCat(schedule == name ? " at " : ",", e);
    schedule += strCat(" x", str(c.lr_step_gamma));
  }
  return {
      {"dataset", dataset},
      {"steps per epoch", steps},
      {"stages (epoch:size/batch)", stages},
      {"--arch", c.arch},
      {"--epochs", std::to_string(c.epochs)},
      {"--max-steps", std::to_string(c.max_steps)},
      {"--eval-every", std::to_string(c.eval_every)},
      // Each log point is a sum over the ranks: ranks with another N would pair different sums.
      {"--log-every", std::to_string(c.log_every)},
      {"--target-top1", str(c.target_top1)},
      {"--target-top5", str(c.target_top5)},
      {"--seed", std::to_string(c.seed)},
      // The update every rank applies to the same averaged gradient: a difference would let the
      // weights drift apart without any collective noticing.
      {"--lr (per 256 images)", str(c.lr)},
      {"--warmup-epochs", str(c.warmup_epochs)},
      {"--lr-schedule", schedule},
      {"--momentum", str(c.momentum)},
      {"--nesterov", onOff(c.nesterov)},
      {"--weight-decay", str(c.weight_decay)},
      {"--bn-weight-decay", onOff(c.bn_weight_decay)},
      {"--label-smoothing", str(c.label_smoothing)},
      {"--elastic-batch", optionName(c.elastic_batch)},
      {"--amp", c.amp ? optionName(c.amp_dtype) : "off"},
      {"checkpoints (--checkpoint-dir)", onOff(!c.checkpoint_dir.empty())},
      // Each rank enters the checkpoint's buffer sync at the steps it decides (by steps; by time
      // only rank 0 decides, and every rank acts on the agreed flag).
      {"--checkpoint-every", c.checkpoint_every_steps > 0 ? strCat(c.checkpoint_every_steps, " steps")
                             : c.checkpoint_every_s > 0   ? strCat(str(c.checkpoint_every_s), " s")
                                                          : std::string("off")},
      {"resumed at (epochs done/step)", strCat(resumed.epochs_done, "/", resumed.step)},
      {"--evaluate", onOff(c.evaluate_only)},
  };
}

}  // namespace aiacc::app
