#include "app/run_phase.h"

namespace aiacc::app {

bool isTerminal(Phase phase) {
  return phase == Phase::kStopping || phase == Phase::kSurvivorStop || phase == Phase::kFinished ||
         phase == Phase::kLeftOut;
}

std::optional<Phase> next(Phase phase, Event event, const RunFacts& facts) {
  if (isTerminal(phase)) return std::nullopt;
  // Shared by every phase with work: a stop agreed stops; a failure of the communication regroups
  // an elastic job and stops a job of fixed size (a survivor saves).
  if (event == Event::kStopAgreed) return phase == Phase::kRegrouping ? std::nullopt : std::optional(Phase::kStopping);
  if (event == Event::kCommFailed) {
    if (phase == Phase::kRegrouping) return std::nullopt;  // (its failures are errors, or kRanksLost)
    return facts.elastic ? Phase::kRegrouping : Phase::kSurvivorStop;
  }
  // After the work: the steps left, or the run's end.
  const Phase onward = facts.work_left ? Phase::kTraining : Phase::kRunEnd;
  switch (phase) {
    case Phase::kCatchUp:
      if (event == Event::kDone) return onward;
      return std::nullopt;
    case Phase::kTraining:
      if (event == Event::kEpochDone || event == Event::kEndWithinEpoch) return Phase::kEpochEnd;
      if (event == Event::kRegroupAgreed) return facts.elastic ? std::optional(Phase::kRegrouping) : std::nullopt;
      return std::nullopt;
    case Phase::kEpochEnd:
      if (event == Event::kDone) return onward;
      if (event == Event::kEndWithinEpoch) return Phase::kRunEnd;
      if (event == Event::kRegroupAgreed) return facts.elastic ? std::optional(Phase::kRegrouping) : std::nullopt;
      return std::nullopt;
    case Phase::kRunEnd:
      if (event == Event::kEvaluated) return Phase::kRunEnd;
      if (event == Event::kDone) return Phase::kFinished;
      return std::nullopt;
    case Phase::kRegrouping:
      if (event == Event::kDone) return facts.work_left ? Phase::kCatchUp : Phase::kRunEnd;
      if (event == Event::kRanksLost) return Phase::kSurvivorStop;
      if (event == Event::kJobEnded) return Phase::kLeftOut;
      return std::nullopt;
    default: return std::nullopt;
  }
}

StepPlan planStep(const StepFacts& f) {
  StepPlan p;
  if (f.agreed & kFlagStop) {
    p.stop = true;
    return p;
  }
  const bool every_steps = f.checkpoint_every_steps > 0 && f.step % f.checkpoint_every_steps == 0;
  // (At an epoch's last step the epoch end's checkpoint follows anyway.)
  p.checkpoint = f.checkpoint_dir && ((f.agreed & kFlagCheckpoint) || every_steps) && !f.last_of_epoch;
  p.evaluate = f.eval_every > 0 && f.step % f.eval_every == 0;
  p.end_run = f.max_steps > 0 && f.step >= f.max_steps;
  if (f.agreed & kFlagRegroup) p.regroup = f.last_of_epoch ? StepPlan::Regroup::kAfterEpoch : StepPlan::Regroup::kNow;
  return p;
}

const char* phaseName(Phase phase) {
  switch (phase) {
    case Phase::kCatchUp: return "catch-up";
    case Phase::kTraining: return "training";
    case Phase::kEpochEnd: return "epoch end";
    case Phase::kRunEnd: return "run end";
    case Phase::kRegrouping: return "regrouping";
    case Phase::kStopping: return "stopping";
    case Phase::kSurvivorStop: return "survivor stop";
    case Phase::kFinished: return "finished";
    case Phase::kLeftOut: return "left out";
  }
  return "?";
}

const char* eventName(Event event) {
  switch (event) {
    case Event::kDone: return "done";
    case Event::kEpochDone: return "epoch done";
    case Event::kEndWithinEpoch: return "end within the epoch";
    case Event::kEvaluated: return "evaluated";
    case Event::kStopAgreed: return "stop agreed";
    case Event::kRegroupAgreed: return "regroup agreed";
    case Event::kRanksLost: return "ranks lost";
    case Event::kCommFailed: return "communication failed";
    case Event::kJobEnded: return "job ended";
  }
  return "?";
}

}  // namespace aiacc::app
