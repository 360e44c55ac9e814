// Faults a real aiacc_train_hooked process takes from its environment, for tests of real
// processes that need one on cue (tests/preempted_job_test.cc), and the benchmark scripts'
// switches; in-process tests call Trainer's setters directly. Only aiacc_train_hooked reads them
// (app/binary_hooks.h: the production aiacc_train links no parser of them), and a set variable is
// said on rank 0's log.
// The worker (runWorker, app/command_train.cc) reads them once (hooksOfThisBinary) and hands them
// to the Trainer (Trainer::setTestHooks).
//
//   AIACC_TEST_HOLD_CHECKPOINT=STEP:FILE   half way through writing step STEP's checkpoint
//       payload (rank 0's writer thread), create FILE.held and wait until FILE exists (at most
//       10 minutes), as a disk that stalls would: the training thread goes on meanwhile.
//   AIACC_BENCH_NO_STEP_VOTE=1   no per-step vote (GradientSync::voteFlags) at all: the baseline
//       scripts/bench_preempt.sh measures the vote's cost against, in the same build. Stop signals
//       and --checkpoint-every by time then do nothing.
//   AIACC_BENCH_STEP_VOTE_AB=K   the vote after K steps in turn, then none after the next K, and so
//       on (every rank at the same steps): the report's "step_vote_ab" has the steady steps that
//       followed a vote and those that followed none, so that one run compares the two
//       step by step (scripts/bench_preempt.sh). A flag raised while the vote is off waits for
//       the next vote; nothing else changes.
//   AIACC_BENCH_NO_SURVIVOR_SAVE=1   a job of fixed size that loses a rank stops without the
//       survivor's checkpoint of the step it reached (app/trainer_state.h, stopAfterLostRank): a
//       restart then resumes from the newest periodic checkpoint, as a job under torchrun does
//       (the baseline of scripts/bench_elastic.sh).
//   AIACC_TEST_HOLD_EPOCH_EVAL=FILE   before each epoch's end evaluation, create FILE.held.<pid> and
//       wait until FILE exists (at most 10 minutes): a test then knows every rank is there, and
//       can take one away before the evaluation's collectives (tests/elastic_test.cc).
//   AIACC_TEST_SKEW_AT_REGROUP=1   at each elastic regroup, a survivor that is not the new rank 0
//       adds 1 to its first parameter before the ranks compare their states: one whose state
//       differs, which must then receive rank 0's whole state (tests/elastic_test.cc).
//   AIACC_TEST_LATE_TO_REGROUP_MS=MS   at each elastic regroup, every process but the rank 0 of the
//       generation it leaves waits MS milliseconds before it arrives for the next: survivors whose
//       --rdzv-timeout then runs out apart; each says "rank R arrives for the next generation
//       now" on its log as it goes on (tests/elastic_test.cc).
//   AIACC_TEST_FAIL_AT_STEP=RANK:STEP   the process that is rank RANK when step STEP ends throws
//       an error of its own (app/command_train.cc: exit 1, the job told a rank failed), as one rank's out
//       of memory or full disk would (tests/elastic_test.cc); RANK `*`: every rank, as an error
//       that is everyone's would (settings, data; tests/elastic_failure_test.cc).
//   AIACC_TEST_HOLD_AT_STEP=STEP:FILE[,STEP:FILE...]   every process, when step STEP ends (before
//       the step's vote and rank 0's look for newcomers), creates FILE.held.<pid> and waits until
//       FILE exists (at most 10 minutes); each pair of the list is a hold of its own. A test
//       signals a job held there and then lets it go, so that the stop is agreed within the
//       vote's 2 steps of STEP however fast the steps are (tests/preempted_job_test.cc,
//       tests/slurm_test.cc); or lets it go once a newcomer waits, so that rank 0 sees it at STEP
//       and the vote lets it in at the next step (tests/elastic_rejoin_test.cc).
//   AIACC_TEST_DIE_JOINING=settings|restore   a process that joins a running elastic job (started
//       later, or started again by its launcher) SIGKILLs itself during its set-up in the new
//       generation: before it gives its settings to the agreement (the others wait for them
//       until --comm-timeout), or in the state transfer from rank 0, after the ranks compared
//       their states (the others see it die there), as a spot node taken back while it joins
//       would (tests/elastic_test.cc).
//   AIACC_TEST_FAIL_SETUP=N   a process that held the training state fails its set-up of an
//       elastic generation with no newcomer in it, N times in all, with a communication error
//       (every such process: none of them waits for another), as a rank lost in the state
//       transfer would make it fail (tests/elastic_failure_test.cc).
//   AIACC_TEST_HOLD_RUN_END=FILE   once training has ended (not stopped by a signal): before the
//       final evaluation if one is due, else just before the report's sums over the ranks
//       (after the end of training's collective), create FILE.held.<pid> and wait until FILE
//       exists (at most 10 minutes), once (tests/elastic_test.cc).
//   AIACC_TEST_SAMPLE_LOG=PATH    each process appends, to PATH.<pid>, one line per step with its
//       samples, written before the step (a step the others kept was trained however soon after
//       this rank died), one per step it applied, and one per restore; each names the run and
//       the generation (tests/elastic_job.cc reads them).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "aiacc/common/checkpoint_dir.h"

namespace aiacc::app {

// Where AIACC_TEST_DIE_JOINING kills a joining process.
enum class JoinDeath { kNone, kSettings, kRestore };

using CheckpointFaultHook = std::function<void(CheckpointPhase, int64_t step)>;

// The hook AIACC_TEST_HOLD_CHECKPOINT's value asks for; InputError when it is not STEP:FILE.
CheckpointFaultHook checkpointHoldHook(const std::string& value);

// What the variables above ask for; all unset: none of it.
struct TestHooks {
  CheckpointFaultHook checkpoint;    // AIACC_TEST_HOLD_CHECKPOINT (empty: none)
  bool step_vote = true;             // false with AIACC_BENCH_NO_STEP_VOTE=1
  bool survivor_save = true;         // false with AIACC_BENCH_NO_SURVIVOR_SAVE=1
  int step_vote_ab = 0;              // AIACC_BENCH_STEP_VOTE_AB's K (0: a vote after every step)
  std::string sample_log;            // AIACC_TEST_SAMPLE_LOG's PATH (empty: no log)
  std::function<void()> epoch_eval;  // AIACC_TEST_HOLD_EPOCH_EVAL (empty: none)
  std::function<void()> run_end;     // AIACC_TEST_HOLD_RUN_END (empty: none)
  bool skew_at_regroup = false;      // AIACC_TEST_SKEW_AT_REGROUP=1
  int late_to_regroup_ms = 0;        // AIACC_TEST_LATE_TO_REGROUP_MS
  // AIACC_TEST_FAIL_AT_STEP and AIACC_TEST_HOLD_AT_STEP: called with the process's rank and the
  // step number as each step ends (empty: neither is set); the fault throws aiacc::Error.
  std::function<void(int rank, int64_t step)> step_end;
  JoinDeath die_joining = JoinDeath::kNone;  // AIACC_TEST_DIE_JOINING
  int fail_setups = 0;                       // AIACC_TEST_FAIL_SETUP
  std::vector<std::string> notes;            // one line for each variable set, for rank 0's log
};

// Reads the variables (through `get`; default: the process's environment); InputError for a
// malformed value.
TestHooks testHooksFromEnvironment(const std::function<const char*(const char*)>& get = [](const char* name) {
  return std::getenv(name);
});

}  // namespace aiacc::app
