// The exit-code contract of aiacc_train: one table for a single process, each worker of a job,
// and the launcher (`aiacc_train --nproc N`), shown by --help and README.md.
//
//   code     meaning                                                what to do
//   0        finished: the schedule ran to its end, or to           nothing (the report says whether
//            --max-steps, or to the target accuracy                 a target was reached)
//   75       stopped, and this run's training state is on disk      run the same command with
//            (EX_TEMPFAIL): a stop signal, or ranks lost where a    --resume auto
//            survivor saved (a job of fixed size, an elastic one
//            below MIN); --resume auto continues from it
//   128+N    stopped by signal N with nothing saved (no             add --checkpoint-dir to keep
//            --checkpoint-dir, or its write failed)                 the steps of the next stop
//   1        an error, or a stop without a signal that saved        read the one-line error
//            nothing (ranks lost, no --checkpoint-dir)
//   2        usage: an unknown flag, a flag value its type or the   read `aiacc_train --help`
//            options' own checks refuse, a stray argument, launcher
//            variables that are incomplete or contradict the flags
//            (found before anything starts; a --flagfile's own
//            problems are gflags' and exit 1)
//
// Every way a process ends is an Ending, and exitCode() its one mapping. A worker of an elastic
// job started after the job ended, or left out of its last generation and waiting when it
// ended, ends as the job did (endingOf: finished 0, stopped with its state saved 75, stopped
// unsaved or failed 1): its launcher does not start it again once the job's end is
// recorded in the rendezvous store. A survivor of a lost rank that another survivor was chosen
// to save for counts on that save (75) without seeing it written.
// The launcher's own code sums its workers' (launcherExitCode).
#pragma once

#include <string>
#include <vector>

#include "aiacc/comm/job_end.h"

namespace aiacc::app {

constexpr int kExitFinished = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
// Stopped with this run's state on disk, resumable (EX_TEMPFAIL). Slurm counts it as FAILED
// (RequeueExit=75 requeues such a job; afterok dependencies do not fire).
constexpr int kExitPreempted = 75;

// How a process ended.
struct Ending {
  enum class How {
    kFinished,  // the run's end (schedule, --max-steps, target), or a job that had finished
    kStopped,   // a stop: a signal (`signal`), or ranks lost (signal 0)
    kError,     // an error (its line says which)
    kUsage,     // the command line is wrong
  };
  How how = How::kFinished;
  // kStopped: this run's training state is on disk, and --resume auto continues from it (the
  // stop's checkpoint, written by this process or, as it knows, by another rank of the job).
  bool saved = false;
  int signal = 0;  // kStopped: the signal that asked for the stop; 0 for a stop without one
};

// The exit code of `e` (the table above): 0, 75, 128 + signal, 1 or 2.
int exitCode(const Ending& e);

// A process of an elastic job that ended before it was let in (comm::JobEnded: started again too
// late, or left out of the last generation) ends as the job did: finished; stopped with its state
// saved (resumable) or not; a job that failed on every rank is an error to it too.
Ending endingOf(comm::JobEnd how);

// The table above as --help prints it (each line ends with '\n').
std::string exitCodeHelp();

// A worker as its launcher saw it end: its exit code, or the signal that killed it.
struct WorkerExit {
  int code = 0;    // (when signal == 0)
  int signal = 0;  // killed by this signal
};

// The launcher's code and its one line on stderr ("" for 0), from its workers' ends. `failed`: a
// worker failed (not while the job was being stopped, and not one an elastic job went on
// without and started again); `first_signal`: the first stop signal the launcher forwarded (0:
// none). 75 when every worker ended 0 or 75 and at least one 75; 1 when one failed; 128 +
// first_signal when a forwarded stop ended some worker otherwise; 0 when every one finished.
struct LauncherEnd {
  int code = 0;
  std::string line;
};
LauncherEnd launcherExitCode(const std::vector<WorkerExit>& workers, bool failed, int first_signal);

}  // namespace aiacc::app
