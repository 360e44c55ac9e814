// The trainer's evaluation and its report (Trainer::State, app/trainer_state.h).
#include <glog/logging.h>
#include <sys/resource.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <iomanip>

#include "app/option_names.h"
#include "app/trainer_state.h"
#include "aiacc/common/error.h"
#include "data/device_input.h"
#include "models/torch_format.h"
#include "models/weights.h"

namespace aiacc::app {

std::optional<EvalPoint> Trainer::State::evaluate(double epoch_pos) {
  flushLog();            // the steps before it come first in the metrics file
  sync().syncBuffers();  // every rank evaluates its shard with the same BN statistics
  torch::NoGradGuard no_grad;
  model->eval();
  const Stage& st = stageAt(cfg, static_cast<int>(epoch_pos));
  data::EpochSpec spec;
  spec.epoch = 0;
  spec.image_size = st.image_size;
  spec.batch_size = cfg.eval_batch_size > 0 ? cfg.eval_batch_size : st.batch_size;
  val->startEpoch(spec);
  // correct@1, correct@5, loss sum, count; a stop request ends this rank's part at its next
  // batch, and the flag rides on the sums: every rank learns of it at the same point.
  double c1 = 0, c5 = 0, loss_sum = 0, count = 0, stop = 0;
  while (auto b = val->next()) {
    if (stopWanted() != 0) {
      stop = 1;
      break;
    }
    if (b->labels.numel() == 0) continue;
    const torch::Tensor images = data::imagesOnDevice(b->images, device, cfg.channels_last);
    const torch::Tensor labels = data::labelsOnDevice(b->labels, device);
    torch::Tensor logits;
    {
      AutocastGuard autocast(cfg.amp, device.type(), ampDtype());
      logits = model->forward(images);
    }
    logits = logits.to(at::kFloat);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    const int64_t k = std::min<int64_t>(5, logits.size(1));
    const torch::Tensor top = std::get<1>(logits.topk(k, 1));
    const torch::Tensor hit = top.eq(labels.unsqueeze(1));
    c1 += hit.select(1, 0).sum().item<double>();
    c5 += hit.any(1).sum().item<double>();
    count += static_cast<double>(b->labels.numel());
  }
  at::Tensor sums = at::tensor({c1, c5, loss_sum, count, stop}, at::kDouble);
  sync().allreduceSum(sums);
  model->train();
  if (sums[4].item<double>() > 0) return std::nullopt;
  EvalPoint e;
  e.step = pos.step;
  e.epoch = epoch_pos;
  e.seconds = now();
  const double n = std::max(1.0, sums[3].item<double>());
  e.top1 = 100.0 * sums[0].item<double>() / n;
  e.top5 = 100.0 * sums[1].item<double>() / n;
  e.loss = sums[2].item<double>() / n;
  e.images = static_cast<int64_t>(sums[3].item<double>());
  return e;
}

bool Trainer::State::targetReached(const EvalPoint& e) const {
  if (cfg.target_top1 <= 0 && cfg.target_top5 <= 0) return false;
  return (cfg.target_top1 <= 0 || e.top1 >= cfg.target_top1) && (cfg.target_top5 <= 0 || e.top5 >= cfg.target_top5);
}

void Trainer::State::evaluateAndRecord() {
  const std::optional<EvalPoint> got = evaluate(run.epoch_pos);
  if (!got) {
    run.preempted = run.stop = true;
    run.stop_signal = stopWanted();
    if (isRank0()) LOG(INFO) << "evaluation at step " << pos.step << " interrupted by a stop request; not recorded";
    return;
  }
  const EvalPoint& e = *got;
  TrainingState& r = pos;  // the history lives in the training state (checkpoints carry it)
  r.evals.push_back(e);
  writeMetric(evalPointJson(e, "eval"));
  tensorboardScalars({{"eval/top1", e.top1}, {"eval/top5", e.top5}, {"eval/loss", e.loss}});
  if (isRank0()) {
    LOG(INFO) << "eval epoch " << std::fixed << std::setprecision(2) << e.epoch << ": top-1 " << e.top1 << "% top-5 "
              << e.top5 << "% loss " << std::setprecision(4) << e.loss << " (" << e.images << " images, "
              << formatDuration(e.seconds) << " elapsed)";
  }
  if (!r.target_reached && targetReached(e)) {
    r.target_reached = true;
    r.time_to_target_s = e.seconds;
    run.stop = true;
    if (isRank0()) LOG(INFO) << "target reached after " << formatDuration(e.seconds);
  }
}

Report Trainer::State::finishReport() {
  flushLog();
  if (run.change_began && isRank0() && !report.membership.empty()) {  // no step after the last change
    writeMetric(membershipJson(report.membership.back()));
  }
  Report& r = report;
  if (checkpoints) {  // the last background write's outcome belongs in this report
    checkpoints->flush();
    takeCheckpointErrors();
  }
  r.evals = pos.evals;
  r.epoch_train = pos.epoch_train;
  if (pos.epoch_images > 0) r.epoch_train.push_back(EpochTrain{run.epoch_pos, epochLoss(), pos.epoch_lr});
  r.target_reached = pos.target_reached;
  r.time_to_target_s = pos.time_to_target_s;
  r.checkpoint_failures = pos.checkpoint_failures;
  r.overflow_skips = pos.skipped_steps;  // the loss scaler's and the fp16/bf16 transfer's
  if (!r.evals.empty()) {                // (a run stopped before its first evaluation has none)
    r.final_top1 = r.evals.back().top1;
    r.final_top5 = r.evals.back().top5;
  }
  r.steps = pos.step;
  r.images_seen = pos.images_seen;
  r.epochs = run.epoch_pos;
  r.train_s = pos.train_s;
  r.mean_images_per_s = static_cast<double>(run.images) / std::max(1e-9, run.train_s);
  r.vote_ab = run.vote_ab;
  r.steady_images_per_s = run.steady_images > 0 ? static_cast<double>(run.steady_images) / run.steady_s
                                                : r.mean_images_per_s;
  r.total_s = now();
  {  // Peak resident memory, this rank's and the largest over ranks (one-hot slots), the
     // undecodable files each rank met in its own shard, and after a stop whether rank 0 saved
     // its checkpoint (every rank exits 75 only then, app/exit_code.h): one sum.
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    r.peak_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;
    at::Tensor all = at::zeros({world + 2}, at::kDouble);
    all[rank] = r.peak_rss_mb;
    all[world] = static_cast<double>(skips->count());
    all[world + 1] = isRank0() && r.saved_step >= 0 ? 1.0 : 0.0;
    try {
      sync().allreduceSum(all);
      // The job's last collective: rank 0 says the job ended now, so that an error of its own
      // after it (--save-weights, the report) cannot leave the end unsaid (a rank's error only
      // counts as one failure of its generation, comm::markJobFailed).
      if (r.preempted && all[world + 1].item<double>() > 0) r.saved_step = pos.step;
      if (elastic && isRank0()) {
        try {
          elastic->markEnded(jobEnd());
        } catch (const std::exception&) {  // (the store is gone: nobody is left to tell)
        }
      }
      r.max_peak_rss_mb = all.narrow(0, 0, world).max().item<double>();
      r.skipped_files = static_cast<int64_t>(std::llround(all[world].item<double>()));
      r.summed_ranks = world;
    } catch (const comm::CommError& e) {
      // Training has ended and the state is evaluated: an elastic job does not fail for a rank
      // lost now, but its report can only give what this rank knows (the sum may have been cut
      // half way), and says so. (After a stop, a rank but 0 cannot tell whether the stop's
      // checkpoint was written: it counts it unsaved.)
      if (!elastic) throw;
      r.max_peak_rss_mb = r.peak_rss_mb;
      r.skipped_files = skips->count();
      r.summed_ranks = 1;
      // A survivor the loss left waiting to regroup (it failed the end of training's sum that
      // this rank passed) learns from the store that the job ended, and stops.
      try {
        elastic->markEnded(jobEnd());
      } catch (const std::exception&) {  // (the store went with the lost rank: nobody is left to tell)
      }
      LOG(WARNING) << "rank " << rank << ": a rank was lost after training ended (" << firstLine(e.what())
                   << "); the report's peak memory over ranks and undecodable files are this rank's own";
    }
  }
  r.ignored_files = ignored_files;
  r.exposed_comm_s = sync().exposedCommSeconds();
  r.device = device.str();
  r.precision = cfg.amp ? std::string("amp ") + optionName(cfg.amp_dtype) : "fp32";
  r.loss_scale = scaler->enabled() ? scaler->scale() : 0;
  r.comm = sync().describe();
  if (!cfg.save_weights.empty() && isRank0() && !r.preempted) {  // the final evaluation averaged the BN statistics
    try {
      models::writeWeightsFile(cfg.save_weights, *model);
    } catch (const IoError& e) {
      AIACC_THROW(IoError, "--save-weights: ", e.what());
    }
  }
  return r;
}

}  // namespace aiacc::app
