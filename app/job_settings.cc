#include "app/job_settings.h"

#include <cstdio>

#include "common/error.h"

namespace aiacc::app {
namespace {

std::string str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
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
      {"--bucket-mb", str(d.bucket_mb)},
      {"--streams", d.streams > 0 ? std::to_string(d.streams) : "auto"},
      {"--autotune", onOff(d.autotune)},
      {"--shm", onOff(d.shm)},
      {"--allreduce-dtype", d.allreduce_dtype},
      {"--bn-sync", d.bn_sync},
      {"--find-unused", onOff(d.find_unused)},
      {"--negotiation", d.central ? "central" : "decentralized"},
      {"--hierarchical", d.hierarchical},
      {"--ranks-per-node", d.ranks_per_node > 0 ? std::to_string(d.ranks_per_node) : "auto"},
  };
}

std::string datasetFingerprint(const std::vector<std::string>& classes, size_t train_files, size_t val_files) {
  char hash[24];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(hashNames(classes)));
  return strCat(classes.size(), " classes (names ", hash, "), ", train_files, " train and ", val_files, " val files");
}

comm::Settings trainSettings(const Config& c, const std::string& dataset, int64_t shard_size,
                             const TrainPosition& resumed) {
  std::string stages, steps;
  for (const Stage& st : c.stages) {
    stages += strCat(stages.empty() ? "" : ",", st.start_epoch, ":", st.image_size, "px/", st.batch_size);
    steps += strCat(steps.empty() ? "" : ", ", "from epoch ", st.start_epoch, ": ",
                    st.batch_size > 0 ? shard_size / st.batch_size : 0);
  }
  return {
      {"dataset", dataset},
      {"steps per epoch", steps},
      {"stages (epoch:size/batch)", stages},
      {"--arch", c.arch},
      {"--epochs", std::to_string(c.epochs)},
      {"--max-steps", std::to_string(c.max_steps)},
      {"--eval-every", std::to_string(c.eval_every)},
      {"--target-top1", str(c.target_top1)},
      {"--target-top5", str(c.target_top5)},
      {"--seed", std::to_string(c.seed)},
      {"--amp", c.amp ? c.amp_dtype : "off"},
      {"checkpoints (--checkpoint-dir)", onOff(!c.checkpoint_dir.empty())},
      {"resumed at (epochs done/step)", strCat(resumed.epochs_done, "/", resumed.step)},
  };
}

}  // namespace aiacc::app
