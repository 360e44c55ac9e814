#include "app/trainer.h"

#include <ATen/Parallel.h>
#include <unistd.h>
#include <sys/resource.h>
#include <glog/logging.h>
#include <torch/nn/functional/loss.h>
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "app/amp.h"
#include "app/checkpoint.h"
#include "app/fused_sgd.h"
#include "app/job_settings.h"
#include "app/launch_env.h"
#include "app/option_names.h"
#include "app/trainer_state.h"
#include "aiacc/common/atomic_file.h"
#include "aiacc/common/error.h"
#include "data/device_input.h"
#include "data/entropy_gate.h"
#include "data/loader.h"
#include "models/resnet.h"
#include "models/torch_format.h"
#include "models/weights.h"

namespace aiacc::app {

SyncFactory localSync() {
  return [](std::shared_ptr<torch::nn::Module>, const comm::Settings&) { return std::make_unique<comm::LocalSync>(); };
}

Trainer::Trainer(Config config, comm::WorldInfo world, SyncFactory make_sync, Clock::time_point start)
    : s_(std::make_unique<State>(std::move(config), world, std::move(make_sync), start)) {}
Trainer::~Trainer() = default;

void Trainer::setTimeline(std::shared_ptr<comm::Timeline> timeline) {
  s_->timeline = std::move(timeline);
  if (s_->timeline) s_->timeline->nameRow(0, "compute");
}

void Trainer::setElastic(std::shared_ptr<ElasticJob> elastic) { s_->elastic = std::move(elastic); }

void Trainer::setSurvivorClaim(std::function<bool()> claim) { s_->survivor_claim = std::move(claim); }

void Trainer::setStopRequest(StopRequest request) { s_->stop_request = std::move(request); }

void Trainer::setCheckpointFaultHook(std::function<void(CheckpointPhase, int64_t)> hook) {
  s_->checkpoint_hook = std::move(hook);
}

void Trainer::setTestHooks(const TestHooks& hooks) {
  if (hooks.checkpoint) s_->checkpoint_hook = hooks.checkpoint;
  s_->step_vote = hooks.step_vote;
  s_->run.vote_ab.block = hooks.step_vote_ab;
  s_->sample_log_path = hooks.sample_log;
  s_->epoch_eval_hook = hooks.epoch_eval;
  s_->run_end_hook = hooks.run_end;
  s_->skew_at_regroup = hooks.skew_at_regroup;
  s_->late_to_regroup_ms = hooks.late_to_regroup_ms;
  s_->step_end_hook = hooks.step_end;
  s_->die_joining = hooks.die_joining;
  s_->fail_setups = hooks.fail_setups;
}

Report Trainer::run() {
  State& s = *s_;
  s.setUp();
  if (s.cfg.evaluate_only) {  // --evaluate: the val split once, with the loaded model
    s.evaluateAndRecord();
    return s.run.preempted ? s.finishPreempted() : s.finishReport();
  }
  if (std::optional<EarlyEnd> end = s.trainEpochs()) {
    // Ranks were lost, or the job ended without this rank: no collective runs after it; the
    // report says only how this rank stopped.
    if (SurvivorStop* stop = std::get_if<SurvivorStop>(&*end)) {
      s.report.survivor_stop = std::move(*stop);
    } else {
      s.report.job_ended = std::get<comm::JobEnded>(std::move(*end));
    }
    return s.report;
  }
  return s.run.preempted ? s.finishPreempted() : s.finishReport();
}

// The driver of the run's phases (app/run_phase.h): it runs the current phase's work, which ends
// with an event, and asks next() for the phase that follows, until a terminal one.
// The one place an elastic job regroups, whatever failed (a step, the vote, a metrics line, an
// evaluation, a checkpoint) or when the ranks voted to let a newcomer in. The new generation
// goes on from its rank 0's state as a process joining it does: that state's pending
// evaluation (a stop that cut one, or a failure did), then the epoch it is in, from its
// position (any batches the new world can still make of it, then the epoch's end). Every rank
// of the generation holds the same state, so they all take the same collectives. An epoch end
// whose checkpoint a failure cut is not written again: the next one is.
// After the last epoch, or a stop within one (target, --max-steps), the final state is
// evaluated unless an epoch's end just was, or a stop request cut the run; in an elastic job
// a rank lost meanwhile regroups as anywhere else, and the survivors evaluate it.
std::optional<EarlyEnd> Trainer::State::trainEpochs() {
  const auto workLeft = [this] { return !run.stop && pos.epochs_done < cfg.epochs; };
  Phase phase = workLeft() ? Phase::kCatchUp : Phase::kRunEnd;  // (a resumed run may be at its end)
  bool complete = false;                  // kTraining -> kEpochEnd: the epoch's last step was trained
  bool held = false;                      // (run_end_hook: once)
  std::optional<comm::CommError> failed;  // kCommFailed: what failed
  std::optional<EarlyEnd> end;  // kRanksLost or kJobEnded, or kCommFailed in a job of fixed size: how this rank ends
  const auto work = [&]() -> Event {
    switch (phase) {
      case Phase::kCatchUp:  // the evaluation the state holds pending (a stop or a failure cut it)
        if (evaluationPending()) evaluateAndRecord();
        return run.preempted ? Event::kStopAgreed : Event::kDone;
      case Phase::kTraining: {
        const std::optional<bool> segment = trainSegment(static_cast<int>(pos.epochs_done));
        if (!segment) return Event::kRegroupAgreed;
        if (run.preempted) return Event::kStopAgreed;
        complete = *segment;
        return complete ? Event::kEpochDone : Event::kEndWithinEpoch;
      }
      case Phase::kEpochEnd:  // its row, its evaluation, its checkpoint (after a stop within it: the evaluation)
        if (complete) finishEpoch(static_cast<int>(pos.epochs_done));
        if (cfg.eval_every == 0 && !pos.target_reached) {
          if (epoch_eval_hook) epoch_eval_hook();
          evaluateAndRecord();
        }
        if (run.preempted) return Event::kStopAgreed;
        if (!complete) {  // stopped within the epoch (target, --max-steps): the final evaluation is left
          run.stop = true;
          return Event::kEndWithinEpoch;
        }
        checkpoint();
        // A newcomer the epoch's last step let in (not when the run ends here: nothing is left to train).
        if (std::exchange(run.regroup_after_epoch, false) && workLeft()) return Event::kRegroupAgreed;
        return Event::kDone;
      case Phase::kRunEnd: {
        const bool evaluated = !pos.evals.empty() && pos.evals.back().step == pos.step;
        if (!evaluated) {
          if (run_end_hook && !std::exchange(held, true)) run_end_hook();
          evaluateAndRecord();
          return run.preempted ? Event::kStopAgreed : Event::kEvaluated;
        }
        // A run that ended within an epoch (--max-steps, a target) is saved where it ended, its
        // final evaluation with it: the same command run again then has nothing left to do.
        if (run.checkpoint_step != pos.step || run.checkpoint_evals != pos.evals.size()) checkpoint();
        // A rank lost within the last evaluation's sum may have let some ranks finish it and
        // failed the others, which regroup: one more collective takes those that finished with
        // them. (Only a loss within this one can still part them; see finishReport.)
        if (elastic) endOfTraining();
        if (run_end_hook && !std::exchange(held, true)) run_end_hook();
        return Event::kDone;
      }
      case Phase::kRegrouping: {
        // Why: a failure's first line, or "" to let a newcomer in. (A failure within trainStep
        // cut that step; one elsewhere cut none.)
        const std::string cause = failed ? firstLine(failed->what()) : "";
        end = regroup(cause, failed && run.in_step);
        if (end) return std::holds_alternative<comm::JobEnded>(*end) ? Event::kJobEnded : Event::kRanksLost;
        failed.reset();
        run.in_step = false;
        // The restored state decides whether the run is at its end: this rank may have passed a
        // target or --max-steps the state does not hold, or fallen short of one it holds.
        run.stop = (cfg.max_steps > 0 && pos.step >= cfg.max_steps) || pos.target_reached;
        return Event::kDone;
      }
      default: AIACC_THROW(Error, "internal: the run's phase ", phaseName(phase), " has no work");
    }
  };
  while (!isTerminal(phase)) {
    Event event;
    if (phase == Phase::kRegrouping) {  // (its failures are errors, kRanksLost or kJobEnded: not caught here)
      event = work();
    } else {
      try {
        event = work();
      } catch (const comm::CommError& e) {
        failed = e;
        event = Event::kCommFailed;
      }
    }
    const std::optional<Phase> to = next(phase, event, RunFacts{elastic != nullptr, workLeft()});
    AIACC_CHECK(to.has_value(), "internal: the run's phase ", phaseName(phase), " cannot end with ", eventName(event));
    if (*to == Phase::kSurvivorStop && !end) end = stopAfterLostRank(*failed);  // (or throws the error)
    phase = *to;
  }
  return end;
}

std::optional<bool> Trainer::State::trainSegment(int epoch) {
  const Stage& st = stageAt(cfg, epoch);
  const int64_t global_batch = globalBatch(st);
  const int64_t rank_batch = rankBatchSize(st);
  data::EpochSpec spec{epoch, st.image_size, static_cast<int>(rank_batch), st.scale_min};
  spec.first_batch = pos.batches_in_epoch;  // > 0 in the epoch a run resumed in, or a world changed in
  spec.segment_offset = pos.segment_offset;
  spec.segment_batch = pos.segment_batch;
  // --elastic-batch keep-global in a world that does not divide the global batch evenly, or any
  // other than the first: every step is the order's next global_batch samples, shared unevenly.
  if (global_batch != static_cast<int64_t>(st.batch_size) * world) spec.global_batch = global_batch;
  const int64_t nb = train->startEpoch(spec);
  int64_t& step_in_epoch = pos.batches_in_epoch;
  auto t_last = Clock::now();
  run.last_step_end = t_last;
  while (auto batch = train->next()) {
    run.epoch_pos = epoch + epochFraction(step_in_epoch, nb, global_batch);
    const double lr = learningRate(cfg, run.epoch_pos, global_batch);
    setLearningRate(lr);
    const auto t0 = Clock::now();
    run.in_step = true;  // (a failure from here on cuts this step)
    if (sample_log) logSamples(*batch, pos.step + 1);
    const StepResult step = trainStep(*batch, st, t0);
    run.in_step = false;
    const auto t1 = Clock::now();
    const double step_s = std::chrono::duration<double>(t1 - t0).count();
    const double wall_s = std::chrono::duration<double>(t1 - t_last).count();
    t_last = t1;
    run.train_s += wall_s;
    pos.train_s += wall_s;
    // The step's images over the ranks: this rank's decoded share scaled to the global batch
    // (its images x world when the batches are even).
    const int64_t imgs = batch->labels.numel() * global_batch / rank_batch;
    run.images += imgs;
    if (run.steps >= 3 && !sync().tuning()) {
      run.steady_s += wall_s;
      run.steady_images += imgs;
      if (run.vote_ab.block > 0) {  // wall_s holds the gap after the last step, where the vote was or was not
        (run.voted ? run.vote_ab.s_with : run.vote_ab.s_without) += wall_s;
        ++(run.voted ? run.vote_ab.steps_with : run.vote_ab.steps_without);
      }
    }
    ++pos.step;
    ++run.steps;
    // Without a loss scaler a non-finite loss is not skipped: the weights it reaches are lost.
    // Said once, with its step, so that a run that diverges is not read as a run that learned
    // (the metrics line has "loss": null from here on).
    if (!std::isfinite(step.loss) && !scaler->enabled() && !run.nonfinite_loss_logged && isRank0()) {
      run.nonfinite_loss_logged = true;
      LOG(WARNING) << "step " << pos.step << ": the training loss is " << step.loss
                   << " (no loss scaler to skip it); the run has diverged";
    }
    ++step_in_epoch;
    run.last_step_end = t1;
    if (run.change_began) finishChange();
    if (step_end_hook) {  // (a test's fault or hold: a hold's wait is not counted in a failure's detection)
      step_end_hook(rank, pos.step);
      run.last_step_end = Clock::now();
    }
    if (sample_log && step.applied) logApplied();
    run.epoch_pos = epoch + epochFraction(step_in_epoch, nb, global_batch);
    LogWindow& w = run.window;
    const int64_t n = batch->labels.numel();
    ++w.steps;
    w.loss_sum += step.loss * static_cast<double>(n);
    w.images += n;
    w.images_all_ranks += imgs;
    w.wall_s += wall_s;
    w.compute_s += step_s;
    w.epoch = run.epoch_pos;
    w.batch = batch->index;
    w.lr = lr;
    if (w.steps >= cfg.log_every) flushLog();
    printProgress(epoch, step_in_epoch, nb, st, run.job_loss, lr, t1);
    // What every rank must act on at the same step, agreed once per step (GradientSync::voteFlags:
    // at most 2 steps after any rank raised it): a stop request, and --checkpoint-every by time
    // (rank 0's clock decides, once per interval).
    const int ab = run.vote_ab.block;
    run.voted = step_vote && (ab == 0 || (pos.step - 1) / ab % 2 == 0);
    uint8_t mine = 0;
    const int wanted = stopWanted();
    if (wanted != 0) mine |= kFlagStop;
    if (run.voted && isRank0() && cfg.checkpoint_every_s > 0 && !run.checkpoint_asked &&
        now() - run.last_checkpoint_s >= cfg.checkpoint_every_s) {
      mine |= kFlagCheckpoint;
      run.checkpoint_asked = true;
    }
    if (run.voted && elastic && isRank0() && !run.regroup_asked && elastic->joinersWaiting()) {  // one store request
      mine |= kFlagRegroup;
      run.regroup_asked = true;
    }
    StepFacts at;
    at.agreed = run.voted ? sync().voteFlags(mine) : 0;
    at.checkpoint_dir = !cfg.checkpoint_dir.empty();
    at.step = pos.step;
    at.checkpoint_every_steps = cfg.checkpoint_every_steps;
    at.last_of_epoch = step_in_epoch >= nb;
    at.eval_every = cfg.eval_every;
    at.max_steps = cfg.max_steps;
    const StepPlan plan = planStep(at);  // (app/run_phase.h: what to do here, in order)
    if (plan.stop) {
      run.preempted = run.stop = true;
      run.stop_signal = wanted;
      break;
    }
    if (at.agreed & kFlagCheckpoint) run.checkpoint_asked = false;
    if (plan.checkpoint) {
      writeCheckpoint(CheckpointWait::kSkipIfBusy);
      run.last_checkpoint_s = now();
    }
    if (plan.evaluate) evaluateAndRecord();
    if (plan.end_run || run.stop) {  // (run.stop: a target that evaluation, or an earlier one, reached)
      run.stop = true;
      break;
    }
    if (plan.regroup != StepPlan::Regroup::kNo) {  // every rank at this same step
      run.regroup_asked = false;
      if (plan.regroup == StepPlan::Regroup::kNow) return std::nullopt;
      run.regroup_after_epoch = true;  // at the epoch's last step: the epoch ends first (trainEpochs)
    }
  }
  return step_in_epoch == nb;
}

// One optimizer step on `batch` (begun at t0, the forward span's start): beforeForward, forward
// and loss, backward, finishBackward (the gradient sync), the loss scaler's unscale and update,
// the optimizer step.
StepResult Trainer::State::trainStep(const data::Batch& batch, const Stage& st, Clock::time_point t0) {
  StepResult result;
  // Images decoded for this step; skipped (undecodable) ones are missing from the batch.
  const int64_t n = batch.labels.numel();
  const double weight = meanLossWeight(n, globalBatch(st), world);
  // A rank whose batch decoded to nothing still takes part in the step (the others wait for
  // its buckets): zero contribution, then the same averaged update as everyone. Alone, there
  // is nothing to learn from.
  if (n == 0 && world == 1) return result;
  sync().beforeForward();
  // Gradients set to none, not zeroed: backward then hands each parameter its new gradient
  // tensor instead of adding it into a zeroed one (a write and a read-add pass saved).
  for (auto& p : params) p.mutable_grad() = torch::Tensor();
  torch::Tensor loss;
  if (n > 0) {
    const torch::Tensor images = data::imagesOnDevice(batch.images, device, cfg.channels_last);
    const torch::Tensor labels = data::labelsOnDevice(batch.labels, device);
    AutocastGuard autocast(cfg.amp, device.type(), ampDtype());
    const torch::Tensor logits = model->forward(images);
    loss = torch::nn::functional::cross_entropy(logits.to(at::kFloat), labels, loss_opts);
    // Every decoded image weighs 1 / global batch in the step's gradient, on every rank: a
    // partial batch's mean counts for its share of a full one (skipped images count as zero
    // gradient, not as a larger weight on the rest of their rank's batch), and so does an
    // uneven share of the global batch (--elastic-batch keep-global).
    if (weight != 1.0) loss = loss * weight;
  }
  const auto t_fwd = Clock::now();
  if (loss.defined()) scaler->scaleLoss(loss).backward();
  const auto t_bwd = Clock::now();
  // The sync's wait ends where the optimizer step begins (or where the step is refused).
  Clock::time_point t_sync{};
  const bool step_ok = finishStep(sync(), *scaler, sync_unscales, params, [&] {
    t_sync = Clock::now();
    optimizer->step();
  });
  if (!step_ok) t_sync = Clock::now();
  if (!step_ok) ++pos.skipped_steps;
  result.applied = step_ok;
  // Also the point where this step's input copy has certainly finished (it reads the
  // stream that copied it): only after it may the loader reuse the pinned batch buffer.
  if (loss.defined()) {
    // The host waits for the step here anyway (item() waits for the queued optimizer kernels):
    // over NCCL a failed reduction raises now, not at the next step's first collective.
    sync().synchronize();
    result.loss = loss.item<double>() / weight;
  }
  if (timeline) {
    const auto t_end = Clock::now();
    timeline->span("forward", 0, t0, t_fwd);
    timeline->span("backward", 0, t_fwd, t_bwd);
    timeline->span(step_ok ? "gradient sync wait" : "gradient sync wait (step skipped)", 0, t_bwd, t_sync);
    timeline->span("optimizer", 0, t_sync, t_end);
  }
  return result;
}

void Trainer::State::finishEpoch(int epoch) {
  flushLog();  // the epoch's last steps belong to its row
  pos.epoch_train.push_back(EpochTrain{static_cast<double>(epoch + 1), epochLoss(), pos.epoch_lr});
  pos.epoch_loss_sum = 0;
  pos.epoch_images = 0;
  pos.epochs_done = epoch + 1;
  pos.batches_in_epoch = 0;
  pos.segment_offset = 0;  // the next epoch is shared out by the current world from its start
  pos.segment_batch = 0;
  run.epoch_pos = epoch + 1;
  const data::JpegIndexCache* ix = train->jpegIndex();
  if (isRank0() && ix && !run.index_logged) {
    LOG(INFO) << "JPEG indexes (--jpeg-index-mb): " << ix->indexedFiles() << " train files indexed, "
              << (ix->bytes() + 1023) / 1024 << " KiB; " << ix->refusedFiles()
              << " not indexable (progressive, restart markers, "
              << "not baseline JPEG); later epochs decode only each crop's MCUs";
    run.index_logged = true;
  }
}

}  // namespace aiacc::app
