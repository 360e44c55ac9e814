// The run's state machine (app/run_phase.h) as tables: every phase x event x facts, the
// impossible pairs named with why; and the step-boundary plan over what the ranks agreed.
#include "app/run_phase.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>

namespace aiacc::app {
namespace {

using P = Phase;
using E = Event;

// One cell: the phase that follows, or why none can ("" where one does).
struct Cell {
  std::optional<Phase> to;
  const char* impossible = "";
};
Cell to(Phase p) { return Cell{p, ""}; }
Cell none(const char* why) { return Cell{std::nullopt, why}; }
constexpr const char* kLostOnlyInARegroup = "only a regroup finds too few ranks (elsewhere a lost rank is kCommFailed)";
constexpr const char* kEndedOnlyInARegroup =
    "only a regroup waits to be let in, and so learns the job ended without it";

// The expected table for a job (elastic or not) with work left or none: written out cell by cell
// from the design (docs/elastic.md), not computed like next() computes it.
Cell expected(Phase p, Event e, bool elastic, bool work_left) {
  const Cell onward = to(work_left ? P::kTraining : P::kRunEnd);
  const Cell failure = to(elastic ? P::kRegrouping : P::kSurvivorStop);
  const Cell regroup = elastic ? to(P::kRegrouping) : none("only an elastic job votes to let a newcomer in");
  switch (p) {
    case P::kCatchUp:
      switch (e) {
        case E::kDone: return onward;
        case E::kStopAgreed: return to(P::kStopping);  // (the pending evaluation was cut by a stop)
        case E::kCommFailed: return failure;
        case E::kEpochDone: return none("no step is trained in catch-up");
        case E::kEndWithinEpoch: return none("no step is trained in catch-up");
        case E::kEvaluated: return none("the run's final evaluation is kRunEnd's");
        case E::kRegroupAgreed: return none("no vote is taken in catch-up");
        case E::kRanksLost: return none(kLostOnlyInARegroup);
        case E::kJobEnded: return none(kEndedOnlyInARegroup);
      }
      break;
    case P::kTraining:
      switch (e) {
        case E::kEpochDone: return to(P::kEpochEnd);
        case E::kEndWithinEpoch: return to(P::kEpochEnd);
        case E::kStopAgreed: return to(P::kStopping);
        case E::kRegroupAgreed: return regroup;
        case E::kCommFailed: return failure;
        case E::kDone: return none("a segment ends at the epoch's end, a stop, or a regroup");
        case E::kEvaluated: return none("the run's final evaluation is kRunEnd's");
        case E::kRanksLost: return none(kLostOnlyInARegroup);
        case E::kJobEnded: return none(kEndedOnlyInARegroup);
      }
      break;
    case P::kEpochEnd:
      switch (e) {
        case E::kDone: return onward;
        case E::kEndWithinEpoch: return to(P::kRunEnd);
        case E::kStopAgreed: return to(P::kStopping);  // (its evaluation was cut by a stop)
        case E::kRegroupAgreed: return regroup;        // (agreed at the epoch's last step)
        case E::kCommFailed: return failure;
        case E::kEpochDone: return none("no step is trained at an epoch's end");
        case E::kEvaluated: return none("the run's final evaluation is kRunEnd's");
        case E::kRanksLost: return none(kLostOnlyInARegroup);
        case E::kJobEnded: return none(kEndedOnlyInARegroup);
      }
      break;
    case P::kRunEnd:
      switch (e) {
        case E::kEvaluated: return to(P::kRunEnd);
        case E::kDone: return to(P::kFinished);
        case E::kStopAgreed: return to(P::kStopping);  // (the final evaluation was cut by a stop)
        case E::kCommFailed: return failure;
        case E::kEpochDone: return none("no step is trained at the run's end");
        case E::kEndWithinEpoch: return none("no step is trained at the run's end");
        case E::kRegroupAgreed: return none("no vote is taken at the run's end");
        case E::kRanksLost: return none(kLostOnlyInARegroup);
        case E::kJobEnded: return none(kEndedOnlyInARegroup);
      }
      break;
    case P::kRegrouping:
      switch (e) {
        case E::kDone: return work_left ? to(P::kCatchUp) : to(P::kRunEnd);
        case E::kCommFailed: return none("a regroup's failures are errors, or kRanksLost");
        case E::kRanksLost: return to(P::kSurvivorStop);
        case E::kJobEnded: return to(P::kLeftOut);  // (it ends as the job did: app/command_train.cc)
        case E::kStopAgreed: return none("no vote is taken in a regroup");
        case E::kEpochDone: return none("no step is trained in a regroup");
        case E::kEndWithinEpoch: return none("no step is trained in a regroup");
        case E::kEvaluated: return none("no evaluation runs in a regroup");
        case E::kRegroupAgreed: return none("no vote is taken in a regroup");
      }
      break;
    case P::kStopping:
    case P::kSurvivorStop:
    case P::kFinished:
    case P::kLeftOut: return none("a terminal phase has no work");
  }
  return none("?");
}

TEST(RunPhase, EveryPhaseAndEventFollowTheTable) {
  int cells = 0, possible = 0;
  for (int pi = 0; pi < kPhases; ++pi) {
    for (int ei = 0; ei < kEvents; ++ei) {
      for (const bool elastic : {false, true}) {
        for (const bool work_left : {false, true}) {
          const auto p = static_cast<Phase>(pi);
          const auto e = static_cast<Event>(ei);
          const Cell want = expected(p, e, elastic, work_left);
          const std::optional<Phase> got = next(p, e, RunFacts{elastic, work_left});
          const std::string where = std::string(phaseName(p)) + " x " + eventName(e) +
                                    (elastic ? ", elastic" : ", fixed size") +
                                    (work_left ? ", work left" : ", no work left");
          ASSERT_EQ(got.has_value(), want.to.has_value())
              << where << (want.to ? "" : std::string(": ") + want.impossible);
          if (got) {
            EXPECT_EQ(phaseName(*got), std::string(phaseName(*want.to))) << where;
          }
          EXPECT_EQ(got.has_value(), *want.impossible == 0) << where << ": an impossible cell says why";
          ++cells;
          possible += got ? 1 : 0;
        }
      }
    }
  }
  EXPECT_EQ(cells, kPhases * kEvents * 4);
  EXPECT_GT(possible, 0);
}

TEST(RunPhase, OnlyTheStopsAndTheEndAreTerminal) {
  for (int pi = 0; pi < kPhases; ++pi) {
    const auto p = static_cast<Phase>(pi);
    const bool terminal = p == P::kStopping || p == P::kSurvivorStop || p == P::kFinished || p == P::kLeftOut;
    EXPECT_EQ(isTerminal(p), terminal) << phaseName(p);
  }
}

// Every phase is reached from the start (kCatchUp, or kRunEnd for a run resumed at its end), and
// every non-terminal phase reaches kFinished: no phase is a dead end.
TEST(RunPhase, EveryPhaseIsReachedAndEveryOneCanFinish) {
  std::map<Phase, bool> reached{{P::kCatchUp, true}, {P::kRunEnd, true}};
  for (bool grew = true; grew;) {
    grew = false;
    for (int pi = 0; pi < kPhases; ++pi) {
      for (int ei = 0; ei < kEvents; ++ei) {
        for (const int f : {0, 1, 2, 3}) {
          const auto p = static_cast<Phase>(pi);
          if (!reached[p]) continue;
          const auto to = next(p, static_cast<Event>(ei), RunFacts{(f & 1) != 0, (f & 2) != 0});
          if (to && !reached[*to]) reached[*to] = grew = true;
        }
      }
    }
  }
  for (int pi = 0; pi < kPhases; ++pi)
    EXPECT_TRUE(reached[static_cast<Phase>(pi)]) << phaseName(static_cast<Phase>(pi));
  for (int pi = 0; pi < kPhases; ++pi) {
    const auto start = static_cast<Phase>(pi);
    if (isTerminal(start)) continue;
    std::map<Phase, bool> seen{{start, true}};
    for (bool grew = true; grew;) {
      grew = false;
      for (const auto& [p, yes] : std::map<Phase, bool>(seen)) {
        for (int ei = 0; ei < kEvents; ++ei) {
          for (const int f : {0, 1, 2, 3}) {
            const auto to = next(p, static_cast<Event>(ei), RunFacts{(f & 1) != 0, (f & 2) != 0});
            if (to && !seen[*to]) seen[*to] = grew = true;
          }
        }
      }
    }
    EXPECT_TRUE(seen[P::kFinished]) << phaseName(start);
  }
}

TEST(RunPhase, AStepBoundaryPlansInOrder) {
  StepFacts f;
  f.step = 12;
  EXPECT_FALSE(planStep(f).stop || planStep(f).checkpoint || planStep(f).evaluate || planStep(f).end_run);
  EXPECT_EQ(planStep(f).regroup, StepPlan::Regroup::kNo);
  // A stop agreed: nothing else, whatever else was due.
  StepFacts all = f;
  all.agreed = kFlagStop | kFlagCheckpoint | kFlagRegroup;
  all.checkpoint_dir = true;
  all.checkpoint_every_steps = 4;
  all.eval_every = 3;
  all.max_steps = 12;
  const StepPlan stop = planStep(all);
  EXPECT_TRUE(stop.stop);
  EXPECT_FALSE(stop.checkpoint || stop.evaluate || stop.end_run);
  EXPECT_EQ(stop.regroup, StepPlan::Regroup::kNo);
  // The same without the stop: each thing due, in one plan.
  all.agreed = kFlagCheckpoint | kFlagRegroup;
  const StepPlan rest = planStep(all);
  EXPECT_TRUE(rest.checkpoint && rest.evaluate && rest.end_run);
  EXPECT_EQ(rest.regroup, StepPlan::Regroup::kNow);
  all.last_of_epoch = true;  // the epoch's end checkpoints anyway; a newcomer comes in after it
  EXPECT_FALSE(planStep(all).checkpoint);
  EXPECT_EQ(planStep(all).regroup, StepPlan::Regroup::kAfterEpoch);
}

TEST(RunPhase, CheckpointsAtEveryNStepsOrWhenTheTimeWasAgreed) {
  StepFacts f;
  f.checkpoint_every_steps = 7;
  f.checkpoint_dir = true;
  std::vector<int64_t> at;
  for (int64_t s = 1; s <= 30; ++s) {
    f.step = s;
    f.last_of_epoch = s % 10 == 0;  // epochs of 10 steps
    if (planStep(f).checkpoint) at.push_back(s);
  }
  EXPECT_EQ(at, (std::vector<int64_t>{7, 14, 21, 28})) << "(the epochs' ends, 10, 20 and 30, checkpoint anyway)";
  f.checkpoint_every_steps = 0;
  f.step = 5;
  f.last_of_epoch = false;
  EXPECT_FALSE(planStep(f).checkpoint);
  f.agreed = kFlagCheckpoint;  // --checkpoint-every 10m: rank 0's clock, agreed
  EXPECT_TRUE(planStep(f).checkpoint);
  f.checkpoint_dir = false;
  EXPECT_FALSE(planStep(f).checkpoint) << "nowhere to write";
}

TEST(RunPhase, EvaluatesEveryNStepsAndEndsAtMaxSteps) {
  StepFacts f;
  f.eval_every = 4;
  f.max_steps = 10;
  std::vector<int64_t> evals, ends;
  for (int64_t s = 1; s <= 12; ++s) {
    f.step = s;
    if (planStep(f).evaluate) evals.push_back(s);
    if (planStep(f).end_run) ends.push_back(s);
  }
  EXPECT_EQ(evals, (std::vector<int64_t>{4, 8, 12}));
  EXPECT_EQ(ends, (std::vector<int64_t>{10, 11, 12})) << "at --max-steps and past it (a resumed run)";
}

}  // namespace
}  // namespace aiacc::app
