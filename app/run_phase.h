// The training run as one state machine: its phases, the events each phase's work ends with, and
// the one pure function that says which phase comes next (docs/elastic.md draws it). The trainer
// (Trainer::State::trainEpochs, app/trainer.cc) is the driver: it runs the current phase's work,
// which reports an event, asks next() for the phase that follows, and stops at a terminal one.
// Exceptions stay for errors: an error in a phase's work ends the process (app/exit_code.h),
// except a failure of the communication (comm::CommError), which is the event kCommFailed. A
// survivor's stop is a value (app/survivor_stop.h) the driver returns from kSurvivorStop, and so
// is the job's end that a regroup met (comm::JobEnded), from kLeftOut.
//
//              start, resume, newcomer
//                        |
//                        v
//   +---------------> kCatchUp ------------------------------+   (an evaluation the state holds
//   |                    | kDone [work left]                 |    pending runs first)
//   |                    v                                   | kDone [no work left]
//   |   +----------> kTraining --kEndWithinEpoch--+          |
//   |   |                | kEpochDone            |          |
//   |   | kDone          v                       v          v
//   |   +-[work left]- kEpochEnd --kEndWithinEpoch / kDone [no work left]--> kRunEnd --kDone--> kFinished
//   |                                                                  (kEvaluated: again)
//   | kDone [work left]
//   |
//  kRegrouping <---- kRegroupAgreed (kTraining: mid-epoch; kEpochEnd: a newcomer agreed at the
//                    epoch's last step), kCommFailed [elastic] (any phase but kRegrouping)
//
//   kStopAgreed (a stop request, in steps or an evaluation) --> kStopping: the stop's checkpoint
//   kCommFailed [fixed size]                                 --> kSurvivorStop: a survivor saves
//   kRegrouping --kRanksLost (below MIN, set-up failed twice, store gone)--> kSurvivorStop
//   kRegrouping --kJobEnded (it ended while this rank, left out, waited)--> kLeftOut
//
// An elastic job's protocol state lives in its rendezvous store, under the job's key prefix
// (comm/membership.h writes them; `elastic/g<T>/...` is generation T's):
//   run_id                  the run's id (first start, compare-and-set)
//   elastic/current         the newest closed generation
//   elastic/ended           how the job ended: finished, stopped, failed (the launchers read it)
//   elastic/g<T>/arrivals   tickets of the processes that arrived for T (a counter)
//   elastic/g<T>/m<i>       ticket i's member record: generation it held, rank, step, node
//   elastic/g<T>/survivors  survivors among them (a counter); .../lost<r>, .../lost: ranks reported lost
//   elastic/g<T>/closed     the size T closed at; elastic/g<T>/roster: its ranks
//   elastic/g<T>/gone       waiters that left unadmitted; .../failed: ranks of T that failed
//   elastic/g<T>/beat       T's heartbeat counter
//   elastic/g<T>/saver      the one election of the survivor that saves T's state (comm::claimSave;
//                           a job of fixed size is generation 0; no store: a lock in the folder)
//   <prefix>/g<T>/...       T's transports' and agreement's keys, and keys/<rank> to delete them
#pragma once

#include <cstdint>
#include <optional>

namespace aiacc::app {

enum class Phase {
  kCatchUp,       // after the start or a regroup: the evaluation the state holds pending, if any
  kTraining,      // the steps of the current epoch's segment in the current world
  kEpochEnd,      // the epoch's row, its evaluation, its checkpoint (also after a stop within it)
  kRunEnd,        // the final evaluation (unless one at this step), the end's checkpoint, the last collective
  kRegrouping,    // an elastic job's next generation: leave, rendezvous, set up, restore
  kStopping,      // terminal: the stop's checkpoint and report (Trainer::State::finishPreempted)
  kSurvivorStop,  // terminal: ranks lost; a survivor saves (fixed size: stopAfterLostRank; elastic: the regroup)
  kFinished,      // terminal: the report
  kLeftOut,       // terminal: the job ended while this rank waited to regroup (comm::JobEnded): it ends as the job did
};
constexpr int kPhases = 9;

// What a phase's work ended with.
enum class Event {
  kDone,            // the work ended as planned
  kEpochDone,       // kTraining: the epoch's last step was trained
  kEndWithinEpoch,  // kTraining: --max-steps or the target within the epoch; kEpochEnd: its evaluation then ran
  kEvaluated,       // kRunEnd: the final evaluation ran (the phase runs again to finish)
  kStopAgreed,      // the ranks agreed on a stop request (a signal on some rank)
  kRegroupAgreed,   // the ranks agreed to let a newcomer in
  kCommFailed,      // a collective or a store request failed: a rank lost, or the store
  kRanksLost,       // kRegrouping: too few ranks came back, its set-up failed twice, or the store is
                    // gone; this rank's survivor stop is decided (and its state saved, if its turn)
  kJobEnded,        // kRegrouping: the job ended (finished, stopped, failed) before this rank was let in
};
constexpr int kEvents = 9;

// What the transition depends on besides the phase and the event.
struct RunFacts {
  bool elastic = false;    // an elastic job (--nnodes MIN:MAX): a failure regroups
  bool work_left = false;  // steps are left: no stop, epochs to go
};

// next(): the phase after `phase` whose work ended with `event`, or nullopt where that event
// cannot end that phase (a terminal phase has no work; kRegrouping's failures are errors or
// kRanksLost; each such pair is named in tests/run_phase_test.cc).
std::optional<Phase> next(Phase phase, Event event, const RunFacts& facts);
bool isTerminal(Phase phase);
const char* phaseName(Phase phase);
const char* eventName(Event event);

// The flags the ranks agree on each step (comm::GradientSync::voteFlags).
constexpr uint8_t kFlagStop = 1;        // a stop request (signal) on some rank
constexpr uint8_t kFlagCheckpoint = 2;  // rank 0: --checkpoint-every's time has come
constexpr uint8_t kFlagRegroup = 4;     // rank 0: a process waits to join the elastic job

// The decision at a step boundary (Trainer::State::trainSegment), from what the ranks agreed
// (the vote's flags, app/trainer_state.h) and where the step is. The trainer does, in this
// order: stop with the stop's save; the periodic checkpoint; the --eval-every evaluation; end
// the run within the epoch (--max-steps, or a target that evaluation or an earlier one reached);
// regroup now, or after the epoch's end when this was its last step.
struct StepFacts {
  uint8_t agreed = 0;                  // the flags the ranks agreed on at this step (0: no vote)
  bool checkpoint_dir = false;         // --checkpoint-dir is set
  int64_t step = 0;                    // steps done, this one included
  int64_t checkpoint_every_steps = 0;  // --checkpoint-every N (0: none)
  bool last_of_epoch = false;          // this step was the epoch's last (its end checkpoints anyway)
  int64_t eval_every = 0;              // --eval-every N (0: at epochs' ends)
  int64_t max_steps = 0;               // --max-steps (0: none)
};
struct StepPlan {
  bool stop = false;        // stop with the stop's save (kStopAgreed); nothing else is done
  bool checkpoint = false;  // write a checkpoint, not waiting for one in flight
  bool evaluate = false;    // evaluate now (--eval-every)
  bool end_run = false;     // --max-steps reached (a target reached ends the run too: the trainer's run.stop)
  enum class Regroup { kNo, kNow, kAfterEpoch } regroup = Regroup::kNo;
};
StepPlan planStep(const StepFacts& f);

}  // namespace aiacc::app
