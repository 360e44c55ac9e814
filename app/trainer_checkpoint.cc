// The trainer's checkpoints (Trainer::State, app/trainer_state.h): written at epoch ends and at
// the step the ranks agreed to stop at; read back by --resume, which continues the same epoch
// at its next batch.
#include <glog/logging.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <filesystem>

#include "app/checkpoint.h"
#include "app/job_settings.h"
#include "app/stop_signal.h"
#include "app/trainer_state.h"
#include "aiacc/common/checkpoint_dir.h"
#include "aiacc/common/error.h"
#include "aiacc/common/parse_number.h"

namespace aiacc::app {
std::vector<std::pair<std::string, std::string>> Trainer::State::continuationSettings() const {
  // What decides the steps that follow: the data and its order, the model, the update. Not the
  // run's extent (--epochs, --max-steps, targets, evaluation): a resumed run may change those.
  static const std::vector<std::string> kRunExtent = {"--epochs",
                                                      "--max-steps",
                                                      "--eval-every",
                                                      "--log-every",
                                                      "--target-top1",
                                                      "--target-top5",
                                                      "--checkpoint-every",
                                                      "checkpoints (--checkpoint-dir)",
                                                      "resumed at (epochs done/step)",
                                                      "--evaluate"};
  std::vector<std::pair<std::string, std::string>> out = {{"world size", std::to_string(world)}};
  for (auto& kv : trainSettings(cfg, dataset, train->shardSize(), TrainingState{})) {
    // (--elastic-batch decides nothing in a job of fixed size.)
    if (std::find(kRunExtent.begin(), kRunExtent.end(), kv.name) == kRunExtent.end() &&
        (elastic || kv.name != "--elastic-batch"))
      out.emplace_back(kv.name, kv.value);
  }
  return out;
}

bool Trainer::State::evaluationPending() const {
  if (pos.step == 0 || pos.settings.empty() || (!pos.evals.empty() && pos.evals.back().step == pos.step)) return false;
  return cfg.eval_every > 0 ? pos.step % cfg.eval_every == 0 : pos.batches_in_epoch == 0;
}

void Trainer::State::resume() {
  if (cfg.resume.empty()) return;
  std::string path = cfg.resume;
  if (cfg.resume == "auto") {
    // The newest checkpoint that is whole (manifest, size, CRC-32C) and decodes; each one passed
    // over is said. One that cannot be decoded (damaged or crafted, its manifest intact) gives
    // way to the one before it; when none decodes, the newest one's error stops the run (a
    // checkpoint of another model, say: starting afresh would silently drop the run's steps).
    std::string first_error;
    const std::optional<CheckpointFile> found = findNewestValid(
        cfg.checkpoint_dir,
        [&](const std::string& line) {
      if (isRank0()) LOG(WARNING) << "--resume auto: passing over " << line;
        },
        [&](const CheckpointFile& file) -> std::string {
          try {
            pos = decodeCheckpoint(file.bytes, file.path, *model, *optimizer);
            return "";
          } catch (const Error& e) {
            if (first_error.empty()) first_error = e.what();
            return firstLine(e.what());
          }
        });
    AIACC_CHECK_IO(found || first_error.empty(), "--resume auto: no checkpoint in ", cfg.checkpoint_dir,
                   " can be read; the newest: ", first_error);
    if (!found) {
      if (isRank0()) LOG(INFO) << "--resume auto: no valid checkpoint in " << cfg.checkpoint_dir << "; starting afresh";
      return;
    }
    path = found->path;
  } else {
    pos = loadCheckpoint(path, *model, *optimizer);
  }
  // Format 4 on: the settings it was written with. An evaluation continues no training: it only
  // needs the model, which the load checked.
  if (!pos.settings.empty() && !cfg.evaluate_only) {
    const auto written = [&](const std::string& name) {
      return std::find_if(pos.settings.begin(), pos.settings.end(), [&](const auto& kv) { return kv.first == name; });
    };
    // An elastic job resumes in whatever world its generation has (a node that did not come
    // back): the rest of the epoch is shared out among the ranks there are, as a regroup does.
    const auto ck_world = written("world size");
    const std::optional<int> ck_world_n = ck_world == pos.settings.end() ? std::optional<int>(world)
                                                                         : parseInteger<int>(ck_world->second);
    AIACC_CHECK_INPUT(ck_world_n && *ck_world_n >= 1, "cannot resume from '", path, "': its world size '",
                      ck_world->second, "' is not a number of ranks");
    const int written_world = *ck_world_n;
    const bool reshard = elastic && written_world != world;
    for (const auto& [name, value] : continuationSettings()) {
      if (reshard && (name == "world size" || name == "steps per epoch")) continue;
      const auto it = written(name);
      AIACC_CHECK_INPUT(it == pos.settings.end() || it->second == value, "cannot resume from '", path,
                        "': it was written with ", name, " ", it->second, ", this run has ", value,
                        " (resume with the same settings, or start afresh with another --checkpoint-dir)");
    }
    if (reshard) {
      const Stage& st = stageAt(cfg, static_cast<int>(pos.epochs_done));
      pos.segment_offset += (pos.batches_in_epoch - pos.segment_batch) * globalBatch(st, written_world);
      pos.segment_batch = pos.batches_in_epoch;
      if (isRank0()) {
        LOG(INFO) << "resume: the checkpoint was written by " << written_world << " ranks, this generation has "
                  << world << ": the rest of epoch " << pos.epochs_done + 1 << " is shared out among them";
      }
    }
  }
  if (pos.rng_cpu.defined()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(pos.rng_cpu);
  }
  if (pos.rng_cuda.defined() && device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);  // a handle on the device's generator
    gen.set_state(pos.rng_cuda);
  } else if (pos.rng_cuda.defined() && isRank0()) {
    LOG(INFO) << "resume: the checkpoint's CUDA generator state is not used: this run is on the CPU";
  }
  if (scaler->enabled() && pos.loss_scale > 0) scaler->setState(pos.loss_scale, pos.loss_scale_good_steps);
  if (isRank0()) {
    LOG(INFO) << "resumed from " << path << " at step " << pos.step << " (epoch " << pos.epochs_done + 1 << ", batch "
              << pos.batches_in_epoch << ")";
  }
}

void Trainer::State::sayLaterCheckpoints() const {
  if (cfg.checkpoint_dir.empty() || cfg.evaluate_only) return;
  std::vector<int64_t> steps;
  try {
    steps = checkpointSteps(cfg.checkpoint_dir);
  } catch (const IoError&) {
    return;  // (the writer says why it cannot write there)
  }
  const auto later = std::count_if(steps.begin(), steps.end(), [&](int64_t step) { return step > pos.step; });
  if (later == 0) return;
  LOG(WARNING) << "--checkpoint-dir " << cfg.checkpoint_dir << " holds " << later << " checkpoint(s) of later steps "
               << "than this run's start at step " << pos.step << " (the newest: step " << steps.front()
               << "): they are kept, outside --keep-checkpoints, until this run's steps reach theirs, and `latest` "
                  "will name this run's own newest"
               << (cfg.resume.empty() ? " (to go on from what `latest` names now instead: --resume auto; to keep "
                                        "them all: another --checkpoint-dir)"
                                      : "");
}

std::string Trainer::State::writeCheckpoint(CheckpointWait wait) {
  flushLog();  // the position saved counts every image trained (a collective, like the buffer sync)
  sync().syncBuffers();
  if (!isRank0()) return "";
  AIACC_CHECK(checkpoints != nullptr, "no checkpoint writer (made in setUp with --checkpoint-dir)");
  if (wait == CheckpointWait::kSkipIfBusy && !checkpoints->idle()) {
    ++report.checkpoint_skips;  // the previous write is still going: no second snapshot queued behind it
    return "";
  }
  // The snapshot, on the training thread; the writer thread puts it on disk.
  std::string bytes = encodeCheckpoint(*model, *optimizer, snapshot());
  if (wait == CheckpointWait::kDone) {  // the write before this one answers for itself
    checkpoints->flush();
    takeCheckpointErrors();
  }
  checkpoints->submit(pos.step, std::move(bytes));  // waits for the write before it, if any
  if (wait != CheckpointWait::kDone) return "";
  checkpoints->flush();
  return takeCheckpointErrors() ? cfg.checkpoint_dir + "/" + checkpointPayloadName(pos.step) : "";
}

bool Trainer::State::takeCheckpointErrors() {
  bool saved = true;
  if (!checkpoints) return saved;
  for (const CheckpointWriteError& e : checkpoints->takeErrors()) {
    ++pos.checkpoint_failures;
    saved = saved && e.saved;  // e.saved: whole, and `latest` names it; only retention failed
    LOG(ERROR) << e.message << (e.saved ? "" : "; the previous checkpoint stays the newest");
  }
  return saved;
}

void Trainer::State::checkpoint() {
  if (cfg.checkpoint_dir.empty()) return;
  writeCheckpoint(CheckpointWait::kQueue);
  run.last_checkpoint_s = now();
  run.checkpoint_step = pos.step;
  run.checkpoint_evals = pos.evals.size();
}

Report Trainer::State::finishPreempted() {
  report.preempted = true;
  report.stop_signal = run.stop_signal;
  if (!cfg.checkpoint_dir.empty()) {
    if (isRank0()) {  // said before the write: a slow disk or a write still in flight shows here
      LOG(INFO) << "stop after step " << pos.step << " ("
                << (run.stop_signal != 0 ? signalName(run.stop_signal) : std::string("a stop request on another rank"))
                << "): writing its checkpoint"
                << (checkpoints && !checkpoints->idle() ? " once the write in flight has ended" : "");
    }
    report.checkpoint = writeCheckpoint(CheckpointWait::kDone);
    // (Every rank learns in finishReport's sum whether rank 0 wrote it.)
    if (!report.checkpoint.empty()) report.saved_step = pos.step;
  }
  return finishReport();
}

}  // namespace aiacc::app
